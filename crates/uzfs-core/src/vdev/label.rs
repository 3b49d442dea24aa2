//! Vdev labels.
//!
//! Each leaf carries four 256 KiB labels, two at the front and two at the end
//! (so a device overwritten from either end keeps a copy):
//!
//! ```text
//! 0      256K     512K       4M                        N-512K   N-256K   N
//! | L0    | L1     | boot     | allocatable area ...    | L2     | L3     |
//! ```
//!
//! (`N` is the device size rounded down to 256 KiB.) One label:
//!
//! ```text
//! 0        16K                                   128K                  256K
//! | blank  | config header (64) | config JSON ... | uberblock ring ...   |
//!
//! config header:  0 magic u64 "UZFSLABL" | 8 version u64 | 16 payload_len u64
//!                 24 reserved u64 | 32 sha256(header[0..32] ++ payload ++ label offset u64)
//! ```
//!
//! The uberblock ring holds `nslots = 128K / slot` slots, `slot = clamp(2^ashift,
//! 1K, 8K)`. The last slot is reserved for multihost activity stamps
//! (`spa/mmp.rs`, as OpenZFS reserves `MMP_BLOCKS_PER_LABEL`); txg `t` goes
//! to slot `t % (nslots - 1)`, so writing txg `t` never touches the slot of
//! txg `t-1`. See `spa/uberblock.rs` for the slot layout.
//!
//! # Update order (why a crash is safe)
//!
//! Config changes are written to L0 and L2 first, flushed, then L1 and L3 and
//! flushed: a torn config write can damage at most one half, and the other
//! half holds a complete config (old or new). Uberblocks go to every label of
//! every leaf after all the txg's blocks are flushed; import takes the newest
//! uberblock that verifies on any label.

use super::device::BlockDevice;
use crate::error::{Error, Result};
use sha2::Digest;

pub const LABEL_SIZE: u64 = 256 << 10;
pub const CONFIG_OFFSET: u64 = 16 << 10;
pub const CONFIG_SIZE: u64 = (128 << 10) - CONFIG_OFFSET;
pub const CONFIG_HEADER: usize = 64;
pub const UB_RING_OFFSET: u64 = 128 << 10;
pub const UB_RING_SIZE: u64 = 128 << 10;
pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"UZFSLABL");
pub const LABEL_VERSION: u64 = 1;

pub fn aligned_size(dev_size: u64) -> u64 {
    dev_size & !(LABEL_SIZE - 1)
}

/// Byte offsets of the four labels on a device of `dev_size` bytes. (On a
/// device too small for four labels the offsets overlap; callers check the
/// size first, and nothing here can underflow.)
pub fn label_offsets(dev_size: u64) -> [u64; 4] {
    let n = aligned_size(dev_size).max(2 * LABEL_SIZE);
    [0, LABEL_SIZE, n - 2 * LABEL_SIZE, n - LABEL_SIZE]
}

pub fn ub_slot_size(ashift: u8) -> u64 {
    (1u64 << ashift.clamp(10, 13)).clamp(1024, 8192)
}

/// Byte offset, within a label, of the ring slot txg `txg`'s uberblock
/// goes to (slots of `slot` bytes; the last is the multihost slot).
pub fn ub_txg_slot(txg: u64, slot: u64) -> u64 {
    let nslots = UB_RING_SIZE / slot;
    UB_RING_OFFSET + (txg % (nslots - 1)) * slot
}

/// Byte offset, within a label, of the multihost activity stamp's slot.
pub fn ub_mmp_slot(slot: u64) -> u64 {
    UB_RING_OFFSET + UB_RING_SIZE - slot
}

fn config_checksum(header: &[u8], payload: &[u8], label_off: u64) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    h.update(&header[..32]);
    h.update(payload);
    h.update(label_off.to_le_bytes());
    h.finalize().into()
}

/// Encode a config region (header + payload) for the label at `label_off`.
pub fn encode_config(payload: &[u8], label_off: u64) -> Result<Vec<u8>> {
    if payload.len() as u64 > CONFIG_SIZE - CONFIG_HEADER as u64 {
        return Err(Error::invalid("pool configuration too large for a label"));
    }
    let mut buf = vec![0u8; CONFIG_SIZE as usize];
    buf[0..8].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
    buf[8..16].copy_from_slice(&LABEL_VERSION.to_le_bytes());
    buf[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let ck = config_checksum(&buf[..CONFIG_HEADER], payload, label_off);
    buf[32..64].copy_from_slice(&ck);
    buf[CONFIG_HEADER..CONFIG_HEADER + payload.len()].copy_from_slice(payload);
    Ok(buf)
}

/// Decode a config region; returns the payload.
pub fn decode_config(buf: &[u8], label_off: u64) -> Result<Vec<u8>> {
    use crate::dmu::blkptr::le64;
    let bad = |why: &str| Error::corrupt("label", why.to_string());
    if buf.len() < CONFIG_HEADER {
        return Err(bad("truncated"));
    }
    if le64(buf, 0) != LABEL_MAGIC {
        return Err(bad("no uzfs label magic"));
    }
    if le64(buf, 8) != LABEL_VERSION {
        return Err(Error::Unsupported(format!(
            "label version {} is not supported by this build",
            le64(buf, 8)
        )));
    }
    let len = le64(buf, 16);
    if len > CONFIG_SIZE - CONFIG_HEADER as u64 || CONFIG_HEADER as u64 + len > buf.len() as u64 {
        return Err(bad("config length out of range"));
    }
    let payload = &buf[CONFIG_HEADER..CONFIG_HEADER + len as usize];
    if config_checksum(&buf[..CONFIG_HEADER], payload, label_off)[..] != buf[32..64] {
        return Err(bad("config checksum mismatch"));
    }
    Ok(payload.to_vec())
}

/// Read the config payloads of every label that verifies: (label index, payload).
pub fn read_configs(dev: &dyn BlockDevice) -> Vec<(usize, Result<Vec<u8>>)> {
    let size = dev.size();
    if size < super::MIN_DEVICE_SIZE.min(4 * LABEL_SIZE) {
        return vec![(
            0,
            Err(Error::invalid(format!(
                "{}: device too small to hold labels",
                dev.name()
            ))),
        )];
    }
    let mut out = Vec::new();
    for (i, off) in label_offsets(size).into_iter().enumerate() {
        let mut buf = vec![0u8; CONFIG_SIZE as usize];
        let r = dev
            .read_at(&mut buf, off + CONFIG_OFFSET)
            .and_then(|_| decode_config(&buf, off));
        out.push((i, r));
    }
    out
}

/// Write the config payload to labels `which` (indices 0..4).
pub fn write_config(dev: &dyn BlockDevice, payload: &[u8], which: &[usize]) -> Result<()> {
    let offs = label_offsets(dev.size());
    for &i in which {
        let buf = encode_config(payload, offs[i])?;
        dev.write_at(&buf, offs[i] + CONFIG_OFFSET)?;
    }
    Ok(())
}

/// Zero all four labels (config and uberblock ring).
pub fn clear(dev: &dyn BlockDevice) -> Result<()> {
    let zero = vec![0u8; LABEL_SIZE as usize];
    for off in label_offsets(dev.size()) {
        dev.write_at(&zero, off)?;
    }
    dev.flush()
}
