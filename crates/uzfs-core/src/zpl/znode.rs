//! Znodes: a file's attributes, kept in its dnode's 88-byte bonus buffer
//! (OpenZFS keeps them in system attributes; one fixed layout is enough
//! here and makes `stat` one dnode read).
//!
//! ```text
//!  0  mode u32   4  uid u32   8  gid u32   12  nlink u32
//! 16  atime i64 (ns since the epoch)      24  mtime i64
//! 32  ctime i64                           40  crtime i64
//! 48  rdev u64                            56  parent u64 (directories: "..")
//! 64  gen u64 (txg the object was created in, for NFS-style handles)
//! 72  xattr u64 (object holding the extended attributes, 0 = none)
//! 80  flags u64 (reserved, zero)
//! ```

use crate::dmu::dnode::BONUS_SIZE;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Znode {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    pub rdev: u64,
    pub parent: u64,
    pub gen: u64,
    pub xattr: u64,
    pub flags: u64,
}

fn get<const N: usize>(b: &[u8; BONUS_SIZE], at: usize) -> [u8; N] {
    let mut x = [0u8; N];
    x.copy_from_slice(&b[at..at + N]);
    x
}

impl Znode {
    pub fn decode(b: &[u8; BONUS_SIZE]) -> Znode {
        Znode {
            mode: u32::from_le_bytes(get(b, 0)),
            uid: u32::from_le_bytes(get(b, 4)),
            gid: u32::from_le_bytes(get(b, 8)),
            nlink: u32::from_le_bytes(get(b, 12)),
            atime: i64::from_le_bytes(get(b, 16)),
            mtime: i64::from_le_bytes(get(b, 24)),
            ctime: i64::from_le_bytes(get(b, 32)),
            crtime: i64::from_le_bytes(get(b, 40)),
            rdev: u64::from_le_bytes(get(b, 48)),
            parent: u64::from_le_bytes(get(b, 56)),
            gen: u64::from_le_bytes(get(b, 64)),
            xattr: u64::from_le_bytes(get(b, 72)),
            flags: u64::from_le_bytes(get(b, 80)),
        }
    }

    pub fn encode(&self) -> [u8; BONUS_SIZE] {
        let mut b = [0u8; BONUS_SIZE];
        b[0..4].copy_from_slice(&self.mode.to_le_bytes());
        b[4..8].copy_from_slice(&self.uid.to_le_bytes());
        b[8..12].copy_from_slice(&self.gid.to_le_bytes());
        b[12..16].copy_from_slice(&self.nlink.to_le_bytes());
        b[16..24].copy_from_slice(&self.atime.to_le_bytes());
        b[24..32].copy_from_slice(&self.mtime.to_le_bytes());
        b[32..40].copy_from_slice(&self.ctime.to_le_bytes());
        b[40..48].copy_from_slice(&self.crtime.to_le_bytes());
        b[48..56].copy_from_slice(&self.rdev.to_le_bytes());
        b[56..64].copy_from_slice(&self.parent.to_le_bytes());
        b[64..72].copy_from_slice(&self.gen.to_le_bytes());
        b[72..80].copy_from_slice(&self.xattr.to_le_bytes());
        b[80..88].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let z = Znode {
            mode: 0o100644,
            uid: 1000,
            gid: 100,
            nlink: 3,
            atime: -5,
            mtime: 1 << 62,
            ctime: 7,
            crtime: 8,
            rdev: 0x0801,
            parent: 34,
            gen: 9,
            xattr: 77,
            flags: 0,
        };
        assert_eq!(Znode::decode(&z.encode()), z);
    }
}
