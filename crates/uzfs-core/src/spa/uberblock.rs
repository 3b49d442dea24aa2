//! The uberblock: the root of everything. One per committed txg, written into
//! a ring in every label (see `vdev/label.rs`).
//!
//! ```text
//! uberblock_t (one ring slot, 1K..8K, little-endian)
//!    0  magic u64 (UB_MAGIC)
//!    8  version u64
//!   16  txg u64
//!   24  guid_sum u64        sum of every vdev guid: detects a missing device
//!   32  timestamp u64       seconds since the epoch
//!   40  rootbp[128]         the MOS object-set block
//!  168  pool_guid u64
//!  176  mmp_magic u64       MMP_MAGIC when the writer runs multihost, else 0
//!  184  mmp_interval_ms u64 how often the writer stamps (multihost)
//!  192  mmp_seq u64         bumped by every activity stamp of one txg
//!  200  hostid u64          the writer's host id
//!  208  ... zero ...
//!  slot-32  sha256(slot[0..slot-32] ++ slot byte offset u64)
//! ```
//!
//! The `mmp_*` fields are OpenZFS's multihost protection (`spa/mmp.rs`):
//! a pool imported with `multihost=on` rewrites its last uberblock with a
//! new `mmp_seq` every interval into the ring's reserved last slot, so
//! another host about to import sees that the pool is alive. Uberblocks
//! written before these fields existed have zeros there (no multihost).
//!
//! The uberblock is the one structure whose checksum is embedded (it has no
//! parent). Folding the slot's device offset into the checksum makes a
//! misdirected write (a good uberblock in the wrong slot) fail to verify.

use crate::dmu::blkptr::{le64, BlkPtr};
use crate::error::{Error, Result};
use sha2::Digest;

pub const UB_MAGIC: u64 = 0x00ba_b10c_75a7_f500;
pub const UB_VERSION: u64 = 1;
/// Marks the multihost fields of an uberblock as present.
pub const MMP_MAGIC: u64 = 0x00a1_1cea_3a9a_7e00;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uberblock {
    pub txg: u64,
    pub guid_sum: u64,
    pub timestamp: u64,
    pub rootbp: BlkPtr,
    pub pool_guid: u64,
    /// Multihost stamp: present while the writer runs `multihost=on`.
    pub mmp: Option<MmpStamp>,
}

/// What a multihost writer puts in each uberblock it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmpStamp {
    pub interval_ms: u64,
    pub seq: u64,
    pub hostid: u64,
}

impl Uberblock {
    /// Import's order: the newest txg, then (the same txg, restamped by a
    /// multihost writer) the newest stamp.
    pub fn newer_than(&self, other: &Uberblock) -> bool {
        let key = |u: &Uberblock| (u.txg, u.mmp.map_or(0, |m| m.seq), u.timestamp);
        key(self) > key(other)
    }
}

fn checksum(body: &[u8], at: u64) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    h.update(body);
    h.update(at.to_le_bytes());
    h.finalize().into()
}

impl Uberblock {
    /// Encode into a slot of `slot` bytes that lives at device offset `at`.
    pub fn encode(&self, slot: usize, at: u64) -> Vec<u8> {
        let mut b = vec![0u8; slot];
        b[0..8].copy_from_slice(&UB_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&UB_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.txg.to_le_bytes());
        b[24..32].copy_from_slice(&self.guid_sum.to_le_bytes());
        b[32..40].copy_from_slice(&self.timestamp.to_le_bytes());
        self.rootbp.encode(&mut b[40..168]);
        b[168..176].copy_from_slice(&self.pool_guid.to_le_bytes());
        if let Some(m) = self.mmp {
            b[176..184].copy_from_slice(&MMP_MAGIC.to_le_bytes());
            b[184..192].copy_from_slice(&m.interval_ms.to_le_bytes());
            b[192..200].copy_from_slice(&m.seq.to_le_bytes());
            b[200..208].copy_from_slice(&m.hostid.to_le_bytes());
        }
        let ck = checksum(&b[..slot - 32], at);
        b[slot - 32..].copy_from_slice(&ck);
        b
    }

    /// Decode a slot; `Ok(None)` for an empty (all-zero) slot.
    pub fn decode(b: &[u8], at: u64) -> Result<Option<Uberblock>> {
        let bad = |why: String| Err(Error::corrupt("uberblock", why));
        if b.len() < 1024 {
            return bad("slot too small".into());
        }
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if le64(b, 0) != UB_MAGIC {
            return bad("bad magic".into());
        }
        if checksum(&b[..b.len() - 32], at)[..] != b[b.len() - 32..] {
            return bad("checksum mismatch".into());
        }
        if le64(b, 8) != UB_VERSION {
            return Err(Error::Unsupported(format!(
                "uberblock version {} is newer than this build supports",
                le64(b, 8)
            )));
        }
        let rootbp = BlkPtr::decode(&b[40..168])?;
        if rootbp.is_hole() {
            return bad("root block pointer is a hole".into());
        }
        Ok(Some(Uberblock {
            txg: le64(b, 16),
            guid_sum: le64(b, 24),
            timestamp: le64(b, 32),
            rootbp,
            pool_guid: le64(b, 168),
            mmp: (le64(b, 176) == MMP_MAGIC).then(|| MmpStamp {
                interval_ms: le64(b, 184),
                seq: le64(b, 192),
                hostid: le64(b, 200),
            }),
        }))
    }
}
