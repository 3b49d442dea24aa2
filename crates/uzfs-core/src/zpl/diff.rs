//! `zfs diff`: what changed in a filesystem between a snapshot and a later
//! snapshot (or the filesystem itself), from birth times.
//!
//! Every change to a file rewrites its dnode, so the dnode blocks of the
//! later tree born after the earlier snapshot's txg hold every object that
//! may have changed (`Objset::objects_changed_after`); the rest of the
//! tree is never read. Each such object is looked up on both sides:
//!
//! * on one side only (or with another generation: the number was reused)
//!   it was created (`+`) or removed (`-`);
//! * on both, under other paths: renamed (`R`, old path and new);
//! * on both, with another ctime: modified (`M`), which includes a
//!   directory whose entries changed.
//!
//! Paths come from each file's parent pointer and the parent directory's
//! entries (a hard-linked file is listed under one of its names). Objects
//! no path reaches (the master node, the unlinked set, extended-attribute
//! objects, files unlinked while open) are not listed.

use super::fs::{ZResult, Zpl};
use std::collections::HashMap;

/// One line of `zfs diff`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffEntry {
    /// `+`, `-`, `M` or `R`.
    pub change: char,
    /// Below the filesystem's root, starting with `/` ("/" is the root).
    pub path: String,
    /// `R`: the new path.
    pub new_path: Option<String>,
    /// The file's type as `-F` shows it: `F`, `/`, `@`, `|`, `=`, `B`, `C`.
    pub kind: char,
    /// The change time (nanoseconds): the later side's, or the earlier
    /// side's for a removal.
    pub ctime: i64,
}

fn kind_of(mode: u32) -> char {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => '/',
        libc::S_IFLNK => '@',
        libc::S_IFIFO => '|',
        libc::S_IFSOCK => '=',
        libc::S_IFBLK => 'B',
        libc::S_IFCHR => 'C',
        _ => 'F',
    }
}

/// Paths of one side, with the directory listings read so far.
struct Paths<'a> {
    zpl: &'a Zpl,
    dirs: HashMap<u64, HashMap<u64, String>>,
}

impl Paths<'_> {
    /// `obj`'s path, or `None` if no directory reaches it.
    fn of(&mut self, obj: u64) -> ZResult<Option<String>> {
        let mut parts = Vec::new();
        let mut cur = obj;
        // Deeper than any real tree: a parent loop on a damaged disk.
        for _ in 0..4096 {
            if cur == self.zpl.root {
                parts.reverse();
                return Ok(Some(format!("/{}", parts.join("/"))));
            }
            let Ok(a) = self.zpl.getattr(cur) else {
                return Ok(None);
            };
            if a.z.nlink == 0 || a.z.parent == cur {
                return Ok(None);
            }
            let parent = a.z.parent;
            if !self.dirs.contains_key(&parent) {
                let mut names = HashMap::new();
                if let Ok(list) = self.zpl.readdir(parent, 0, usize::MAX) {
                    for (_, child, _, name) in list {
                        if name != b"." && name != b".." {
                            names
                                .entry(child)
                                .or_insert_with(|| String::from_utf8_lossy(&name).into_owned());
                        }
                    }
                }
                self.dirs.insert(parent, names);
            }
            match self.dirs.get(&parent).and_then(|d| d.get(&cur)) {
                Some(n) => parts.push(n.clone()),
                None => return Ok(None),
            }
            cur = parent;
        }
        Ok(None)
    }
}

/// The changes from `old` to `new` among `objects` (the object numbers
/// whose dnodes may differ), sorted by path.
pub fn diff(old: &Zpl, new: &Zpl, objects: &[u64]) -> ZResult<Vec<DiffEntry>> {
    let mut po = Paths {
        zpl: old,
        dirs: HashMap::new(),
    };
    let mut pn = Paths {
        zpl: new,
        dirs: HashMap::new(),
    };
    let mut out = Vec::new();
    for &obj in objects {
        let a = old.getattr(obj).ok();
        let b = new.getattr(obj).ok();
        if a.is_none() && b.is_none() {
            continue;
        }
        let pa = match &a {
            Some(_) => po.of(obj)?,
            None => None,
        };
        let pb = match &b {
            Some(_) => pn.of(obj)?,
            None => None,
        };
        let entry =
            |change: char, path: String, new_path: Option<String>, z: &super::Znode| DiffEntry {
                change,
                path,
                new_path,
                kind: kind_of(z.mode),
                ctime: z.ctime,
            };
        match (a, pa, b, pb) {
            (Some(a), Some(pa), Some(b), Some(pb)) if a.z.gen == b.z.gen => {
                if pa != pb {
                    out.push(entry('R', pa, Some(pb), &b.z));
                } else if a.z.ctime != b.z.ctime || a.z.mtime != b.z.mtime {
                    out.push(entry('M', pb, None, &b.z));
                }
            }
            (a, pa, b, pb) => {
                if let (Some(a), Some(pa)) = (a, pa) {
                    out.push(entry('-', pa, None, &a.z));
                }
                if let (Some(b), Some(pb)) = (b, pb) {
                    out.push(entry('+', pb, None, &b.z));
                }
            }
        }
    }
    out.sort_by(|x, y| x.path.cmp(&y.path).then(x.change.cmp(&y.change)));
    Ok(out)
}

/// What a cache of `old`'s files must forget to show `new` in its place,
/// when `new` is `old`'s snapshot taken at `snap_txg` (a rollback of a
/// mounted filesystem: the kernel above the mount caches `old`).
///
/// Found the way `zfs diff` finds changes: only objects whose dnodes were
/// rewritten after the snapshot can differ, and each is compared on both
/// sides. A handle is an object number the kernel was given with a
/// generation; the same number with the same generation on both sides is
/// the same file (a number freed and reused after the snapshot gets a
/// later generation).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Turnover {
    /// Objects of `old` that are not the same file in `new` (created
    /// after the snapshot, or their number reused since): a handle to one
    /// is stale.
    pub gone: Vec<u64>,
    /// Objects that are the same file on both sides, with other
    /// attributes or contents: regular files in `rewritten`, the rest
    /// here.
    pub changed: Vec<u64>,
    pub rewritten: Vec<u64>,
    /// `(directory, name)` pairs of `old` that `new` maps to another
    /// object or to none, in the directories of `gone` and `changed`.
    pub names: Vec<(u64, Vec<u8>)>,
}

pub fn turnover(old: &Zpl, new: &Zpl, snap_txg: u64) -> crate::Result<Turnover> {
    let mut t = Turnover::default();
    for obj in old.os.objects_changed_after(snap_txg)? {
        // Not a file in `old` (a free slot, the master node, the
        // unlinked set): nothing cached can name it.
        let Ok(a) = old.getattr(obj) else { continue };
        let b = new.getattr(obj).ok();
        let same = b.is_some_and(|b| b.z.gen == a.z.gen);
        if !same {
            t.gone.push(obj);
        } else if b == Some(a) {
            continue;
        } else if a.z.mode & libc::S_IFMT == libc::S_IFREG {
            t.rewritten.push(obj);
        } else {
            t.changed.push(obj);
        }
        if a.z.mode & libc::S_IFMT != libc::S_IFDIR {
            continue;
        }
        let list = old
            .readdir(obj, 0, usize::MAX)
            .map_err(|e| crate::Error::invalid(format!("directory {obj}: errno {e}")))?;
        for (_, child, _, name) in list {
            if name == b"." || name == b".." {
                continue;
            }
            let kept = same && new.lookup(obj, &name).is_ok_and(|c| c.ino == child);
            if !kept {
                t.names.push((obj, name));
            }
        }
    }
    Ok(t)
}
