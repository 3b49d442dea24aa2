//! POSIX ACLs (`acltype=posix`): the access and default ACLs of a node and
//! their interplay with its mode, as Linux filesystems implement them
//! (`fs/posix_acl.c`).
//!
//! # Theory
//!
//! An ACL lives in the node's extended attributes under the names the
//! kernel uses, `system.posix_acl_access` and `system.posix_acl_default`,
//! in the kernel's xattr encoding (below); OpenZFS on Linux stores them the
//! same way. The kernel does the permission checks (`default_permissions`
//! with `FUSE_POSIX_ACL`): it asks for the access ACL with GETXATTR and
//! caches it. What the kernel leaves to the filesystem, and this module
//! does, is keeping mode and ACL one truth:
//!
//! - Setting an access ACL sets the mode's permission bits from it (owner
//!   from `USER_OBJ`, group from `MASK` if there is one, else `GROUP_OBJ`,
//!   other from `OTHER`); an ACL with only those three entries says nothing
//!   the mode does not, and is not stored. `chmod` rewrites the same three
//!   entries of a stored ACL from the new mode.
//! - A node created in a directory with a default ACL gets that ACL as its
//!   access ACL, masked by the mode the creator asked for (the umask is not
//!   applied), and a new directory also inherits it as its own default ACL.
//!   Without a default ACL the umask applies as usual.
//!
//! With `acltype=off` nothing here runs and the two names are refused
//! (EOPNOTSUPP), so an ACL is never stored where it would not be enforced.
//!
//! # Encoding
//!
//! `u32` version (2), then entries of 8 bytes: `u16` tag, `u16` permission
//! bits (rwx = 4|2|1), `u32` id (a uid for `USER`, a gid for `GROUP`,
//! unused otherwise), all little-endian, sorted by tag and then id.

use super::fs::ZResult;

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;

/// Whether `name` is one of the two ACL attributes.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A parsed, valid ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

impl Acl {
    /// Parse and validate (`posix_acl_valid`): one each of `USER_OBJ`,
    /// `GROUP_OBJ` and `OTHER`, named entries in ascending id order without
    /// repeats, a `MASK` if there is any named entry, nothing but rwx bits.
    /// An empty list (header only) parses as no entries.
    pub fn parse(b: &[u8]) -> ZResult<Acl> {
        let bad = Err(libc::EINVAL);
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return bad;
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if word(0) != VERSION {
            return bad;
        }
        let entries: Vec<Entry> = b[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        if entries.is_empty() {
            return Ok(Acl(entries));
        }
        let mut last: Option<(u16, u32)> = None;
        let (mut named, mut mask) = (false, false);
        let mut seen = 0u16;
        for e in &entries {
            if e.perm & !7 != 0 {
                return bad;
            }
            let key = match e.tag {
                USER | GROUP => {
                    named = true;
                    (e.tag, e.id)
                }
                USER_OBJ | GROUP_OBJ | MASK | OTHER => {
                    if seen & e.tag != 0 {
                        return bad;
                    }
                    seen |= e.tag;
                    mask |= e.tag == MASK;
                    (e.tag, 0)
                }
                _ => return bad,
            };
            if last.is_some_and(|l| l >= key) {
                return bad;
            }
            last = Some(key);
        }
        if seen & (USER_OBJ | GROUP_OBJ | OTHER) != USER_OBJ | GROUP_OBJ | OTHER || (named && !mask)
        {
            return bad;
        }
        Ok(Acl(entries))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                UNDEFINED_ID
            };
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The permission bits the ACL implies (`posix_acl_equiv_mode`), and
    /// whether the mode says all of it (no named entries, no mask).
    pub fn mode(&self) -> (u32, bool) {
        let (mut mode, mut equiv) = (0u32, true);
        for e in &self.0 {
            let p = e.perm as u32;
            match e.tag {
                USER_OBJ => mode |= p << 6,
                GROUP_OBJ => mode |= p << 3,
                OTHER => mode |= p,
                MASK => {
                    mode = (mode & !0o070) | (p << 3);
                    equiv = false;
                }
                _ => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// Rewrite the entries a mode stands for from `mode`
    /// (`__posix_acl_chmod`): owner, the mask (or the owning group without
    /// one), other.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }

    /// A new node's access ACL from its directory's default ACL
    /// (`posix_acl_create_masq`): each class's entry is limited by the
    /// requested mode and the mode by the entries. Returns the new mode and
    /// whether the ACL says more than it (so must be stored).
    pub fn create_masq(&mut self, mode: u32) -> (u32, bool) {
        let mut mode = mode;
        let mut equiv = true;
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= ((e.perm as u32) << 6) | !0o700;
                }
                USER | GROUP => equiv = false,
                OTHER => {
                    e.perm &= (mode & 7) as u16;
                    mode &= (e.perm as u32) | !0o007;
                }
                MASK | GROUP_OBJ if (e.tag == MASK) == has_mask => {
                    e.perm &= ((mode >> 3) & 7) as u16;
                    mode &= ((e.perm as u32) << 3) | !0o070;
                    equiv &= e.tag != MASK;
                }
                _ => {}
            }
        }
        (mode, !equiv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(es: &[(u16, u16, u32)]) -> Acl {
        Acl(es
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn parse_encode_roundtrip_and_validation() {
        let a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 5, 1001),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 0, 0),
        ]);
        let b = a.encode();
        let mut back = Acl::parse(&b).expect("parse");
        for e in &mut back.0 {
            if !matches!(e.tag, USER | GROUP) {
                e.id = 0;
            }
        }
        assert_eq!(back, a);
        // A named entry without a mask, a repeated owner, entries out of
        // order, stray permission bits, a bad version, a short buffer.
        for bad in [
            acl(&[
                (USER_OBJ, 7, 0),
                (USER, 5, 1),
                (GROUP_OBJ, 5, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[
                (USER_OBJ, 7, 0),
                (USER_OBJ, 7, 0),
                (GROUP_OBJ, 5, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[(GROUP_OBJ, 5, 0), (USER_OBJ, 7, 0), (OTHER, 0, 0)]),
            acl(&[(USER_OBJ, 8, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]),
            acl(&[
                (USER_OBJ, 7, 0),
                (USER, 5, 9),
                (USER, 5, 3),
                (GROUP_OBJ, 5, 0),
                (MASK, 7, 0),
                (OTHER, 0, 0),
            ]),
        ] {
            assert_eq!(Acl::parse(&bad.encode()), Err(libc::EINVAL), "{bad:?}");
        }
        let mut v = a.encode();
        v[0] = 1;
        assert_eq!(Acl::parse(&v), Err(libc::EINVAL));
        assert_eq!(Acl::parse(&v[..7]), Err(libc::EINVAL));
        assert!(Acl::parse(&VERSION.to_le_bytes())
            .expect("empty")
            .is_empty());
    }

    #[test]
    fn mode_chmod_and_create_follow_the_kernel() {
        let base = acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert_eq!(base.mode(), (0o644, true));
        let mut named = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1001),
            (GROUP_OBJ, 5, 0),
            (MASK, 6, 0),
            (OTHER, 1, 0),
        ]);
        // The mask, not the owning group, is the group class.
        assert_eq!(named.mode(), (0o761, false));
        named.chmod(0o750);
        assert_eq!(named.mode(), (0o750, false));
        // The owning group's own entry is kept under a mask.
        assert_eq!(named.0[2].perm, 5);
        // open(O_CREAT, 0666) under a default ACL with a mask of rw-.
        let mut d = named.clone();
        d.0[3].perm = 6;
        let (m, store) = d.create_masq(0o666);
        assert_eq!((m, store), (0o660, true));
        assert_eq!(d.0[0].perm, 6); // owner rwx limited to rw-
        assert_eq!(d.0[3].perm, 6);
        assert_eq!(d.0[4].perm, 0);
        // Only base entries: the mode says it all, nothing to store.
        let mut b = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 5, 0)]);
        assert_eq!(b.create_masq(0o777), (0o755, false));
        // Set-id and sticky bits pass through.
        let mut b = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 7, 0), (OTHER, 7, 0)]);
        assert_eq!(b.create_masq(0o2750).0, 0o2750);
    }
}
