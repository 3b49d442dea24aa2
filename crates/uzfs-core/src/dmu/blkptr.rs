//! Block pointers and DVAs: the one structure every block is reached through.
//!
//! ```text
//! blkptr_t, 128 bytes, little-endian
//!
//!      0        8        16
//!   0  +--------+--------+   DVA[0]  word0: vdev(32) | asize_sectors(24) | dva_flags(8)
//!      | word0  | offset |           word1: byte offset into the vdev's allocatable area
//!  16  +--------+--------+   DVA[1]  (ditto copy; all-zero when absent)
//!  32  +--------+--------+   DVA[2]
//!  48  | lsize u32 | psize u32 |
//!  56  | comp u8 | cksum u8 | type u8 | level u8 | flags u8 | pad u8 | pad u16 |
//!  64  | logical birth txg u64 |
//!  72  | physical birth txg u64 |
//!  80  | fill count u64 |
//!  88  | checksum[32] (of the physical bytes)                     |
//! 120  | reserved u64 (zero) |
//! 128
//! ```
//!
//! A hole is a pointer whose logical birth is zero (all other fields zero).
//! `asize` may exceed `psize` (sector rounding today, RAID-Z parity and skip
//! sectors later); readers use `psize` for the checksum and `asize` only for
//! space accounting. `dva_flags` bit 0 (`DVA_REMAPPED`) is reserved for the
//! relocation table described in docs/ON_DISK_FORMAT.md: a reader that finds
//! it set must look the DVA up in the pool's remap table. This build never
//! sets it and refuses to read a pointer that has it (feature
//! `com.uzfs:block_remap` guards pools that would). Bit 1 (`DVA_GANG`):
//! the DVA addresses a gang header, the block is stored in pieces and
//! `asize` counts the whole gang tree (`spa/gang.rs`, feature
//! `com.uzfs:gang_block`).

use super::checksum::ChecksumType;
use super::compress::Compression;
use crate::error::{Error, Result};

pub const BLKPTR_SIZE: usize = 128;
pub const DVA_REMAPPED: u8 = 1;
/// The DVA addresses a gang header (`spa/gang.rs`).
pub const DVA_GANG: u8 = 2;
pub const SECTOR_SHIFT: u32 = 9;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dva {
    pub vdev: u32,
    /// Allocated bytes (a multiple of 512).
    pub asize: u64,
    /// Byte offset within the vdev's allocatable area (after the front labels).
    pub offset: u64,
    pub flags: u8,
}

impl Dva {
    pub fn is_valid(&self) -> bool {
        self.asize != 0
    }
    fn encode(&self, out: &mut [u8]) {
        let sectors = self.asize >> SECTOR_SHIFT;
        let w0 = self.vdev as u64 | (sectors & 0xff_ffff) << 32 | (self.flags as u64) << 56;
        out[0..8].copy_from_slice(&w0.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Dva {
        let w0 = le64(b, 0);
        Dva {
            vdev: w0 as u32,
            asize: ((w0 >> 32) & 0xff_ffff) << SECTOR_SHIFT,
            flags: (w0 >> 56) as u8,
            offset: le64(b, 8),
        }
    }
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlkPtr {
    pub dva: [Dva; 3],
    pub lsize: u32,
    pub psize: u32,
    pub compress: Compression,
    pub checksum_type: ChecksumType,
    pub obj_type: u8,
    pub level: u8,
    pub birth: u64,
    pub phys_birth: u64,
    /// Number of non-hole level-0 blocks beneath this pointer.
    pub fill: u64,
    pub checksum: [u8; 32],
}

impl Default for BlkPtr {
    fn default() -> Self {
        BlkPtr::HOLE
    }
}

impl BlkPtr {
    pub const HOLE: BlkPtr = BlkPtr {
        dva: [Dva {
            vdev: 0,
            asize: 0,
            offset: 0,
            flags: 0,
        }; 3],
        lsize: 0,
        psize: 0,
        compress: Compression::Off,
        checksum_type: ChecksumType::Fletcher4,
        obj_type: 0,
        level: 0,
        birth: 0,
        phys_birth: 0,
        fill: 0,
        checksum: [0; 32],
    };

    pub fn is_hole(&self) -> bool {
        self.birth == 0
    }

    pub fn ndvas(&self) -> usize {
        self.dva.iter().filter(|d| d.is_valid()).count()
    }

    pub fn asize(&self) -> u64 {
        self.dva.iter().map(|d| d.asize).sum()
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[..BLKPTR_SIZE].fill(0);
        if self.is_hole() {
            return;
        }
        for (i, d) in self.dva.iter().enumerate() {
            d.encode(&mut out[i * 16..i * 16 + 16]);
        }
        out[48..52].copy_from_slice(&self.lsize.to_le_bytes());
        out[52..56].copy_from_slice(&self.psize.to_le_bytes());
        out[56] = self.compress as u8;
        out[57] = self.checksum_type as u8;
        out[58] = self.obj_type;
        out[59] = self.level;
        out[64..72].copy_from_slice(&self.birth.to_le_bytes());
        out[72..80].copy_from_slice(&self.phys_birth.to_le_bytes());
        out[80..88].copy_from_slice(&self.fill.to_le_bytes());
        out[88..120].copy_from_slice(&self.checksum);
    }

    pub fn to_bytes(&self) -> [u8; BLKPTR_SIZE] {
        let mut b = [0u8; BLKPTR_SIZE];
        self.encode(&mut b);
        b
    }

    /// Decode defensively: a hostile pointer yields an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<BlkPtr> {
        if b.len() < BLKPTR_SIZE {
            return Err(Error::corrupt("block pointer", "truncated"));
        }
        let birth = le64(b, 64);
        if birth == 0 {
            if b[..BLKPTR_SIZE].iter().any(|&x| x != 0) {
                return Err(Error::corrupt("block pointer", "hole with non-zero fields"));
            }
            return Ok(BlkPtr::HOLE);
        }
        let bad = |why: String| Err(Error::corrupt("block pointer", why));
        let dva = [
            Dva::decode(&b[0..16]),
            Dva::decode(&b[16..32]),
            Dva::decode(&b[32..48]),
        ];
        let lsize = le32(b, 48);
        let psize = le32(b, 52);
        let bp = BlkPtr {
            dva,
            lsize,
            psize,
            compress: Compression::from_u8(b[56])?,
            checksum_type: ChecksumType::from_u8(b[57])?,
            obj_type: b[58],
            level: b[59],
            birth,
            phys_birth: le64(b, 72),
            fill: le64(b, 80),
            checksum: b[88..120]
                .try_into()
                .map_err(|_| Error::corrupt("block pointer", "checksum"))?,
        };
        if !dva[0].is_valid() {
            return bad("first DVA is empty".into());
        }
        if lsize == 0 || lsize > MAX_BLOCK_SIZE || psize == 0 || psize > lsize.max(512) + 512 {
            return bad(format!("impossible sizes lsize={lsize} psize={psize}"));
        }
        if !psize.is_multiple_of(512) {
            return bad(format!("psize {psize} not a multiple of 512"));
        }
        for d in dva.iter().filter(|d| d.is_valid()) {
            if d.asize < psize as u64 || d.offset % 512 != 0 {
                return bad(format!(
                    "DVA {}:{:#x}:{:#x} cannot hold psize {psize}",
                    d.vdev, d.offset, d.asize
                ));
            }
        }
        if bp.level > 8 {
            return bad(format!("level {} too deep", bp.level));
        }
        if le64(b, 120) != 0 || b[60..64].iter().any(|&x| x != 0) {
            return bad("reserved bits set".into());
        }
        Ok(bp)
    }
}

/// Largest logical block: 16 MiB, as OpenZFS's large_blocks limit.
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;

impl std::fmt::Display for BlkPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_hole() {
            return write!(f, "<hole>");
        }
        for d in self.dva.iter().filter(|d| d.is_valid()) {
            write!(f, "{}:{:x}:{:x} ", d.vdev, d.offset, d.asize)?;
        }
        write!(
            f,
            "L{} type={} {}L/{}P {} {} birth={} fill={} cksum={}",
            self.level,
            self.obj_type,
            self.lsize,
            self.psize,
            self.compress.name(),
            self.checksum_type.name(),
            self.birth,
            self.fill,
            hex(&self.checksum[..8])
        )
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
