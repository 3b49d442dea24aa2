//! Namespace verification of a filesystem (the ZPL half of `zdb -b`).
//!
//! Walks the directory tree of one object set from the root and checks what
//! every committed txg must satisfy, whatever crashed when:
//!
//! * every directory entry names a live file, directory or symlink whose
//!   type matches the entry's type;
//! * every directory is reached by exactly one entry (no cycles, no
//!   directory hard links) and its parent pointer names that entry's
//!   directory (the root's names itself);
//! * a file's link count equals the entries that name it; a directory's is
//!   2 plus its subdirectories;
//! * a directory's stored entry count (what `stat` reports as its size)
//!   equals the entries it holds;
//! * every object is the master node, the unlinked set, reachable, an
//!   extended-attribute object of one of those, in the unlinked set with
//!   no links left, or a raw object of the engine's object API (a plain
//!   object with no znode, which no POSIX operation creates).
//!
//! Reads only: it runs on an object set opened at a committed txg.

use super::znode::Znode;
use crate::dmu::dnode::ot;
use crate::dmu::objset::Objset;
use crate::dmu::zap::Zap;
use crate::error::Result;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

const MASTER_OBJ: u64 = 1;
/// Stop listing after this many violations (the first ones say enough).
const MAX_REPORTED: usize = 100;

/// Counts of what the walk saw, for reports and for tests to check the
/// walk was not trivially empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    pub directories: u64,
    pub files: u64,
    pub unlinked: u64,
    /// Objects of the engine's object API (`uzfs object put`): plain
    /// objects with no znode (mode 0), outside the namespace by design.
    pub raw_objects: u64,
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut x = [0u8; 8];
    if let Some(s) = b.get(i * 8..i * 8 + 8) {
        x.copy_from_slice(s);
    }
    u64::from_le_bytes(x)
}

fn dtype(mode: u32) -> u8 {
    ((mode & libc::S_IFMT) >> 12) as u8
}

/// Verify the namespace of the filesystem in `os`; returns what the walk
/// counted and every violation found (empty: consistent). Errors only when
/// the object set cannot be read at all.
pub fn check_namespace(os: &Objset) -> Result<(NamespaceStats, Vec<String>)> {
    let mut bad: Vec<String> = Vec::new();
    let mut stats = NamespaceStats::default();
    let mut b = [0u8; 32];
    os.read(MASTER_OBJ, 0, &mut b)?;
    let (root, unlinked) = (word(&b, 2), word(&b, 3));
    let znode = |obj: u64| -> Option<(u8, Znode)> {
        let dn = os.dnode(obj).ok()??;
        Some((dn.obj_type, Znode::decode(&dn.bonus)))
    };
    // Entries naming each object, and subdirectories of each directory.
    let mut refs: BTreeMap<u64, u32> = BTreeMap::new();
    let mut subdirs: BTreeMap<u64, u32> = BTreeMap::new();
    let mut reached: BTreeSet<u64> = BTreeSet::new();
    let mut queue = VecDeque::new();
    match znode(root) {
        Some((ot::DIRECTORY, z)) if z.is_dir() => {
            if z.parent != root {
                bad.push(format!("root directory {root}: parent is {}", z.parent));
            }
            reached.insert(root);
            queue.push_back(root);
        }
        _ => bad.push(format!(
            "root directory {root} is missing or not a directory"
        )),
    }
    while let Some(dir) = queue.pop_front() {
        stats.directories += 1;
        let zap = Zap::open(os, dir);
        let entries = match zap.all() {
            Ok(e) => e,
            Err(e) => {
                bad.push(format!("directory {dir}: unreadable: {e}"));
                continue;
            }
        };
        match zap.count() {
            Ok(n) if n == entries.len() as u64 => {}
            Ok(n) => bad.push(format!(
                "directory {dir}: stored entry count {n}, holds {}",
                entries.len()
            )),
            Err(e) => bad.push(format!("directory {dir}: header unreadable: {e}")),
        }
        for e in entries {
            let name = String::from_utf8_lossy(&e.name);
            let Some((t, z)) = znode(e.value) else {
                bad.push(format!(
                    "directory {dir}: entry '{name}' names object {}, which is free",
                    e.value
                ));
                continue;
            };
            if !matches!(t, ot::PLAIN_FILE | ot::DIRECTORY | ot::SYMLINK)
                || e.value == MASTER_OBJ
                || e.value == unlinked
            {
                bad.push(format!(
                    "directory {dir}: entry '{name}' names object {} of type {}",
                    e.value,
                    ot::name(t)
                ));
                continue;
            }
            if (t == ot::DIRECTORY) != z.is_dir() || dtype(z.mode) != e.vtype {
                bad.push(format!(
                    "directory {dir}: entry '{name}' has type {} but object {} has mode {:o}",
                    e.vtype, e.value, z.mode
                ));
            }
            *refs.entry(e.value).or_default() += 1;
            if z.is_dir() {
                *subdirs.entry(dir).or_default() += 1;
                if z.parent != dir {
                    bad.push(format!(
                        "directory {} ('{name}' in {dir}): parent pointer is {}",
                        e.value, z.parent
                    ));
                }
                if !reached.insert(e.value) {
                    bad.push(format!(
                        "directory {} is reached twice (again as '{name}' in {dir})",
                        e.value
                    ));
                    continue;
                }
                queue.push_back(e.value);
            } else if reached.insert(e.value) {
                stats.files += 1;
            }
        }
        if bad.len() > MAX_REPORTED {
            break;
        }
    }
    for &obj in &reached {
        let Some((_, z)) = znode(obj) else { continue };
        let want = if z.is_dir() {
            2 + subdirs.get(&obj).copied().unwrap_or(0)
        } else {
            refs.get(&obj).copied().unwrap_or(0)
        };
        if z.nlink != want {
            bad.push(format!(
                "object {obj}: link count {} but {want} expected from the names reaching it",
                z.nlink
            ));
        }
    }
    // The unlinked set: files unlinked while open, waiting for the last
    // close (or the next mount, after a crash).
    let mut parked: BTreeSet<u64> = BTreeSet::new();
    match znode(unlinked) {
        Some((ot::UNLINKED_SET, _)) => match Zap::open(os, unlinked).all() {
            Ok(entries) => {
                for e in entries {
                    stats.unlinked += 1;
                    match znode(e.value) {
                        Some((ot::PLAIN_FILE | ot::DIRECTORY | ot::SYMLINK, z)) => {
                            if z.nlink != 0 {
                                bad.push(format!(
                                    "object {} is in the unlinked set with {} links",
                                    e.value, z.nlink
                                ));
                            }
                            if reached.contains(&e.value) {
                                bad.push(format!(
                                    "object {} is in the unlinked set and reachable",
                                    e.value
                                ));
                            }
                            parked.insert(e.value);
                        }
                        _ => bad.push(format!(
                            "the unlinked set names object {}, which is not a file",
                            e.value
                        )),
                    }
                }
            }
            Err(e) => bad.push(format!("unlinked set {unlinked}: unreadable: {e}")),
        },
        _ => bad.push(format!("unlinked set {unlinked} is missing")),
    }
    // Every allocated object accounted for.
    let mut xattrs: BTreeSet<u64> = BTreeSet::new();
    for &obj in reached.iter().chain(&parked) {
        if let Some((_, z)) = znode(obj) {
            if z.xattr != 0 && !xattrs.insert(z.xattr) {
                bad.push(format!("xattr object {} is shared", z.xattr));
            }
        }
    }
    for obj in 1..os.dnode_count_estimate() {
        let Some(dn) = os.dnode(obj)? else { continue };
        let ok = match dn.obj_type {
            ot::MASTER_NODE => obj == MASTER_OBJ,
            ot::UNLINKED_SET => obj == unlinked,
            ot::PLAIN_FILE | ot::DIRECTORY | ot::SYMLINK => {
                let known = reached.contains(&obj) || parked.contains(&obj);
                // No POSIX file has mode 0: this is a raw object.
                let raw = dn.obj_type == ot::PLAIN_FILE && Znode::decode(&dn.bonus).mode == 0;
                if !known && raw {
                    stats.raw_objects += 1;
                }
                known || raw
            }
            ot::XATTR => xattrs.contains(&obj),
            _ => false,
        };
        if !ok {
            bad.push(format!(
                "object {obj} ({}) is allocated but unreachable",
                ot::name(dn.obj_type)
            ));
        }
        if bad.len() > MAX_REPORTED {
            break;
        }
    }
    for x in &xattrs {
        if os.dnode(*x)?.is_none_or(|d| d.obj_type != ot::XATTR) {
            bad.push(format!("xattr object {x} is missing"));
        }
    }
    Ok((stats, bad))
}
