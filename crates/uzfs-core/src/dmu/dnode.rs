//! Dnodes: the fixed-size descriptor of one object.
//!
//! ```text
//! dnode_phys_t, 512 bytes, little-endian
//!   0  type u8 | nlevels u8 | nblkptr u8 (=3) | flags u8 | indblkshift u8 | checksum u8 | compress u8 | copies u8
//!   8  datablksz u32 | reserved u32
//!  16  maxblkid u64          highest level-0 block id ever written (0 if none)
//!  24  used_bytes u64        allocated bytes (all DVAs) beneath this dnode, deflated
//!                            by RAID-Z's parity ratio (BlockWriter::dsize)
//!  32  size u64              logical object size in bytes
//!  40  bonus[0..24]          small per-type payload, first part
//!  64  blkptr[3]             top-level block pointers (level nlevels-1)
//! 448  bonus[24..88]         small per-type payload, second part
//! 512
//! ```
//!
//! An object with `nlevels = L` maps level-0 block `blkid` through `L-1`
//! levels of indirect blocks of `2^indblkshift` bytes (1024 pointers each at
//! the default 128 KiB); the dnode's three pointers address the top level, so
//! it holds `3 * 1024^(L-1)` blocks. A free dnode is all zero (type 0).

use super::blkptr::{le32, le64, BlkPtr, BLKPTR_SIZE};
use super::checksum::ChecksumType;
use super::compress::Compression;
use crate::error::{Error, Result};

pub const DNODE_SIZE: usize = 512;
pub const NBLKPTR: usize = 3;
/// 32 KiB indirect blocks (256 pointers): a small synchronous write rewrites
/// one block per level, so smaller indirect blocks cut the bytes each fsync
/// writes (measured: 4 KiB fsync-each writes) at no cost to sequential I/O.
pub const DEFAULT_INDBLKSHIFT: u8 = 15;
/// The bonus buffer: 88 bytes, stored in two pieces (header bytes 40..64
/// and the dnode's last 64 bytes). The ZPL keeps a file's attributes here.
pub const BONUS_SIZE: usize = 88;

/// Object types (dmu_object_type_t). Stored in dnodes and block pointers.
pub mod ot {
    pub const NONE: u8 = 0;
    pub const OBJECT_DIRECTORY: u8 = 1;
    pub const DNODE: u8 = 2;
    pub const OBJSET: u8 = 3;
    pub const SPACE_MAP: u8 = 4;
    pub const PACKED_CONFIG: u8 = 5;
    pub const HISTORY: u8 = 6;
    pub const DSL_DATASET: u8 = 7;
    pub const METASLAB_ARRAY: u8 = 8;
    pub const POOL_PROPS: u8 = 9;
    pub const PLAIN_FILE: u8 = 10;
    pub const UINT64_ARRAY: u8 = 11;
    pub const DSL_DIR: u8 = 12;
    pub const MASTER_NODE: u8 = 13;
    pub const DIRECTORY: u8 = 14;
    pub const SYMLINK: u8 = 15;
    pub const XATTR: u8 = 16;
    pub const UNLINKED_SET: u8 = 17;
    /// A snapshot's or dataset's dead list: block pointers (`dsl/snapshot.rs`).
    pub const DEADLIST: u8 = 18;
    /// A dead list's header: its sub-lists by birth-time key (`dsl/deadlist.rs`).
    pub const DEADLIST_MAP: u8 = 19;
    /// A DSL directory's children: name -> their directory (`dsl/records.rs`).
    pub const DSL_DIR_CHILD_MAP: u8 = 20;
    /// A dataset's snapshots: name -> snapshot object (`dsl/records.rs`).
    pub const DSL_DS_SNAP_MAP: u8 = 21;

    pub fn name(t: u8) -> &'static str {
        match t {
            NONE => "none",
            OBJECT_DIRECTORY => "object directory",
            DNODE => "DMU dnode",
            OBJSET => "DMU objset",
            SPACE_MAP => "SPA space map",
            PACKED_CONFIG => "packed nvlist",
            HISTORY => "SPA history",
            DSL_DATASET => "DSL dataset",
            METASLAB_ARRAY => "object array",
            POOL_PROPS => "pool properties",
            PLAIN_FILE => "plain file contents",
            UINT64_ARRAY => "uint64 array",
            DSL_DIR => "DSL directory",
            MASTER_NODE => "ZFS master node",
            DIRECTORY => "ZFS directory",
            SYMLINK => "ZFS symlink",
            XATTR => "ZFS xattrs",
            UNLINKED_SET => "ZFS delete queue",
            DEADLIST => "DSL deadlist",
            DEADLIST_MAP => "DSL deadlist map",
            DSL_DIR_CHILD_MAP => "DSL directory child map",
            DSL_DS_SNAP_MAP => "DSL dataset snap map",
            _ => "unknown",
        }
    }
    pub fn is_metadata(t: u8) -> bool {
        t != PLAIN_FILE
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnodePhys {
    pub obj_type: u8,
    pub nlevels: u8,
    pub indblkshift: u8,
    pub checksum: ChecksumType,
    pub compress: Compression,
    /// Copies of level-0 blocks (1..=3); indirect blocks get one more.
    pub copies: u8,
    pub datablksz: u32,
    pub maxblkid: u64,
    pub used_bytes: u64,
    pub size: u64,
    pub blkptr: [BlkPtr; NBLKPTR],
    pub bonus: [u8; BONUS_SIZE],
}

impl DnodePhys {
    pub fn free() -> Self {
        DnodePhys {
            obj_type: ot::NONE,
            nlevels: 0,
            indblkshift: 0,
            checksum: ChecksumType::Fletcher4,
            compress: Compression::Off,
            copies: 0,
            datablksz: 0,
            maxblkid: 0,
            used_bytes: 0,
            size: 0,
            blkptr: [BlkPtr::HOLE; NBLKPTR],
            bonus: [0; BONUS_SIZE],
        }
    }

    pub fn new(obj_type: u8, datablksz: u32, props: &ObjProps) -> Self {
        DnodePhys {
            obj_type,
            nlevels: 1,
            indblkshift: DEFAULT_INDBLKSHIFT,
            checksum: props.checksum,
            compress: props.compress,
            copies: props.copies,
            datablksz,
            ..Self::free()
        }
    }

    pub fn is_free(&self) -> bool {
        self.obj_type == ot::NONE
    }

    /// Block pointers per indirect block.
    pub fn epb(&self) -> u64 {
        1u64 << (self.indblkshift as u32 - 7)
    }

    /// Level-0 blocks addressable with `nlevels` levels.
    pub fn capacity(&self, nlevels: u8) -> u64 {
        let mut cap = NBLKPTR as u64;
        for _ in 1..nlevels {
            cap = cap.saturating_mul(self.epb());
        }
        cap
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[..DNODE_SIZE].fill(0);
        if self.is_free() {
            return;
        }
        out[0] = self.obj_type;
        out[1] = self.nlevels;
        out[2] = NBLKPTR as u8;
        out[4] = self.indblkshift;
        out[5] = self.checksum as u8;
        out[6] = self.compress as u8;
        out[7] = self.copies;
        out[8..12].copy_from_slice(&self.datablksz.to_le_bytes());
        out[16..24].copy_from_slice(&self.maxblkid.to_le_bytes());
        out[24..32].copy_from_slice(&self.used_bytes.to_le_bytes());
        out[32..40].copy_from_slice(&self.size.to_le_bytes());
        for (i, bp) in self.blkptr.iter().enumerate() {
            bp.encode(&mut out[64 + i * BLKPTR_SIZE..64 + (i + 1) * BLKPTR_SIZE]);
        }
        out[40..64].copy_from_slice(&self.bonus[..24]);
        out[448..512].copy_from_slice(&self.bonus[24..]);
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let b = b
            .get(..DNODE_SIZE)
            .ok_or_else(|| Error::corrupt("dnode", "truncated"))?;
        if b[0] == ot::NONE {
            return Ok(Self::free());
        }
        let bad = |why: String| Err(Error::corrupt("dnode", why));
        if b[2] as usize != NBLKPTR {
            return bad(format!("nblkptr {} != {NBLKPTR}", b[2]));
        }
        let indblkshift = b[4];
        if !(10..=17).contains(&indblkshift) {
            return bad(format!("indblkshift {indblkshift} out of range"));
        }
        let nlevels = b[1];
        if nlevels == 0 || nlevels > 8 {
            return bad(format!("nlevels {nlevels} out of range"));
        }
        let datablksz = le32(b, 8);
        if !(512..=super::blkptr::MAX_BLOCK_SIZE).contains(&datablksz)
            || !datablksz.is_multiple_of(512)
        {
            return bad(format!("data block size {datablksz} invalid"));
        }
        let copies = b[7];
        if !(1..=3).contains(&copies) {
            return bad(format!("copies {copies} invalid"));
        }
        let mut blkptr = [BlkPtr::HOLE; NBLKPTR];
        for (i, bp) in blkptr.iter_mut().enumerate() {
            *bp = BlkPtr::decode(&b[64 + i * BLKPTR_SIZE..64 + (i + 1) * BLKPTR_SIZE])?;
            if !bp.is_hole() && bp.level + 1 != nlevels {
                return bad(format!(
                    "top pointer level {} with nlevels {nlevels}",
                    bp.level
                ));
            }
        }
        let mut bonus = [0u8; BONUS_SIZE];
        bonus[..24].copy_from_slice(&b[40..64]);
        bonus[24..].copy_from_slice(&b[448..512]);
        Ok(DnodePhys {
            obj_type: b[0],
            nlevels,
            indblkshift,
            checksum: ChecksumType::from_u8(b[5])?,
            compress: Compression::from_u8(b[6])?,
            copies,
            datablksz,
            maxblkid: le64(b, 16),
            used_bytes: le64(b, 24),
            size: le64(b, 32),
            blkptr,
            bonus,
        })
    }
}

/// Write properties an object is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjProps {
    pub checksum: ChecksumType,
    pub compress: Compression,
    pub copies: u8,
}

impl ObjProps {
    /// Pool metadata: lz4, fletcher4, and a ditto copy of everything.
    pub const METADATA: ObjProps = ObjProps {
        checksum: ChecksumType::Fletcher4,
        compress: Compression::Lz4,
        copies: 2,
    };
}

impl Default for ObjProps {
    fn default() -> Self {
        ObjProps {
            checksum: ChecksumType::Fletcher4,
            compress: Compression::Off,
            copies: 1,
        }
    }
}
