//! Space maps: the persistent, append-only log of one metaslab's allocations
//! and frees (OpenZFS space_map.c). Each entry is 16 bytes:
//!
//! ```text
//!   0  offset u64         byte offset within the vdev's allocatable area
//!   8  len<<1 | kind u64  kind 0 = ALLOC, 1 = FREE
//! ```
//!
//! The space map object's logical size is `16 * entries`. Replaying the log
//! in order from an all-free metaslab yields the allocated set as of the txg
//! that wrote the last entry. Entries of one txg are appended in the order the
//! allocations and frees happened; a block born and freed in the same txg
//! appears as an ALLOC followed by a FREE.

use super::range_tree::RangeTree;
use crate::dmu::blkptr::le64;
use crate::error::{Error, Result};

pub const ENTRY_SIZE: usize = 16;
/// Space map data blocks: 4 KiB (256 entries).
pub const SM_BLOCK_SIZE: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmKind {
    Alloc,
    Free,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmEntry {
    pub kind: SmKind,
    pub offset: u64,
    pub len: u64,
}

pub fn encode(entries: &[SmEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_SIZE);
    for e in entries {
        out.extend_from_slice(&e.offset.to_le_bytes());
        let w = e.len << 1 | (e.kind == SmKind::Free) as u64;
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// Replay a space map into the allocated set of the metaslab
/// `[ms_start, ms_start+ms_size)`. Any entry outside the metaslab, an ALLOC
/// of allocated space or a FREE of free space is corruption.
pub fn replay(buf: &[u8], ms_start: u64, ms_size: u64) -> Result<RangeTree> {
    let mut allocated = RangeTree::new();
    if !buf.len().is_multiple_of(ENTRY_SIZE) {
        return Err(Error::corrupt("space map", "length not a multiple of 16"));
    }
    for (i, e) in buf.chunks_exact(ENTRY_SIZE).enumerate() {
        let offset = le64(e, 0);
        let w = le64(e, 8);
        let len = w >> 1;
        let end = offset.checked_add(len);
        if len == 0 || offset < ms_start || end.is_none_or(|x| x > ms_start + ms_size) {
            return Err(Error::corrupt(
                "space map",
                format!("entry {i} [{offset:#x}+{len:#x}] outside metaslab"),
            ));
        }
        let ok = if w & 1 == 0 {
            allocated.add(offset, len)
        } else {
            allocated.remove(offset, len)
        };
        if !ok {
            return Err(Error::corrupt(
                "space map",
                format!(
                    "entry {i}: {} of [{offset:#x}+{len:#x}] conflicts with earlier entries",
                    if w & 1 == 0 { "ALLOC" } else { "FREE" }
                ),
            ));
        }
    }
    Ok(allocated)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn replay_roundtrip_and_conflicts() {
        let e = [
            SmEntry {
                kind: SmKind::Alloc,
                offset: 4096,
                len: 8192,
            },
            SmEntry {
                kind: SmKind::Free,
                offset: 4096,
                len: 4096,
            },
        ];
        let t = replay(&encode(&e), 0, 1 << 20).expect("valid");
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(8192, 4096)]);
        let dbl = [e[0], e[0]];
        assert!(replay(&encode(&dbl), 0, 1 << 20).is_err());
        assert!(replay(&encode(&e), 1 << 20, 1 << 20).is_err());
        assert!(replay(&[1, 2, 3], 0, 1 << 20).is_err());
    }
}
