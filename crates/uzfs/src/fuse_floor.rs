//! The FUSE floor (`uzfs fuse-floor MOUNTPOINT`, for benchmarks): an
//! in-memory filesystem that answers the requests the small-file create
//! benchmark sends (LOOKUP, GETATTR, CREATE, GETXATTR, WRITE, SETATTR,
//! MKDIR, RELEASE) with no storage work at all, mounted with the same
//! session settings, kernel features and transport as a uzfs dataset
//! (`fuse::session_config`, `fuse::negotiate`, `fuse::session::mount`). Its score is the cost of the FUSE
//! round trips themselves on the machine: no filesystem served through
//! /dev/fuse with these features creates files faster. `bench/fs.sh` runs
//! it beside uzfs. It serves until stdin closes or the mount goes away.

use crate::fuse::abi::{FAttr, InHeader, Op, Out, FOPEN_KEEP_CACHE};
use crate::fuse::Handler;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

const TTL: u64 = 1;

#[derive(Default)]
struct Tree {
    names: HashMap<(u64, Vec<u8>), u64>,
    attrs: HashMap<u64, FAttr>,
    next: u64,
}

struct Floor(Mutex<Tree>);

fn attr(ino: u64, mode: u32, uid: u32, gid: u32) -> FAttr {
    let now = uzfs_core::zpl::fs::now_ns();
    FAttr {
        ino,
        atime: now,
        mtime: now,
        ctime: now,
        mode,
        nlink: if mode & libc::S_IFMT == libc::S_IFDIR {
            2
        } else {
            1
        },
        uid,
        gid,
        blksize: 4096,
        ..Default::default()
    }
}

impl Floor {
    fn make(&self, h: &InHeader, name: &[u8], mode: u32) -> Result<FAttr, i32> {
        let mut t = self.0.lock().map_err(|_| libc::EIO)?;
        let key = (h.nodeid, name.to_vec());
        if t.names.contains_key(&key) {
            return Err(libc::EEXIST);
        }
        t.next += 1;
        let ino = t.next;
        let a = attr(ino, mode, h.uid, h.gid);
        t.names.insert(key, ino);
        t.attrs.insert(ino, a);
        Ok(a)
    }
}

impl Handler for Floor {
    fn handle(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> Result<(), i32> {
        match op {
            Op::Lookup { name } => {
                let t = self.0.lock().map_err(|_| libc::EIO)?;
                let a = t
                    .names
                    .get(&(h.nodeid, name.to_vec()))
                    .and_then(|i| t.attrs.get(i))
                    .ok_or(libc::ENOENT)?;
                out.entry(a, 0, crate::fuse::abi::Ttl::both(TTL));
            }
            Op::Getattr => {
                let t = self.0.lock().map_err(|_| libc::EIO)?;
                out.attr_out(t.attrs.get(&h.nodeid).ok_or(libc::ENOENT)?, TTL);
            }
            Op::Setattr(s) => {
                let mut t = self.0.lock().map_err(|_| libc::EIO)?;
                let a = t.attrs.get_mut(&h.nodeid).ok_or(libc::ENOENT)?;
                if s.valid & crate::fuse::abi::FATTR_SIZE != 0 {
                    a.size = s.size;
                }
                out.attr_out(a, TTL);
            }
            Op::Mkdir { mode, umask, name } => {
                let a = self.make(h, name, libc::S_IFDIR | (mode & !umask & 0o7777))?;
                out.entry(&a, 0, crate::fuse::abi::Ttl::both(TTL));
            }
            Op::Create {
                mode, umask, name, ..
            } => {
                let a = self.make(h, name, libc::S_IFREG | (mode & !umask & 0o7777))?;
                out.entry(&a, 0, crate::fuse::abi::Ttl::both(TTL));
                out.open(0, FOPEN_KEEP_CACHE);
            }
            Op::Write { offset, data, .. } => {
                let mut t = self.0.lock().map_err(|_| libc::EIO)?;
                if let Some(a) = t.attrs.get_mut(&h.nodeid) {
                    a.size = a.size.max(offset + data.len() as u64);
                }
                out.written(data.len() as u32);
            }
            Op::Opendir => out.open(0, 0),
            Op::Release { .. } | Op::Releasedir => {}
            Op::Getxattr { .. } => return Err(libc::ENODATA),
            _ => return Err(libc::ENOSYS),
        }
        Ok(())
    }
}

/// Mount the floor at `mnt` and serve until stdin closes.
pub fn run(mnt: &Path) -> i32 {
    let mut tree = Tree {
        next: 1,
        ..Default::default()
    };
    tree.attrs.insert(1, attr(1, libc::S_IFDIR | 0o755, 0, 0));
    let config = crate::fuse::session_config("fuse_floor", false);
    let fs = Arc::new(Floor(Mutex::new(tree)));
    let session = match crate::fuse::session::mount(
        fs,
        mnt,
        &config,
        crate::fuse::negotiate,
        crate::fuse::fuse_threads(),
        false,
    ) {
        Ok(s) => s,
        Err(e) => {
            crate::err(&format!("uzfs fuse-floor: mount {}: {e}\n", mnt.display()));
            return 1;
        }
    };
    eprintln!("uzfs fuse-floor: serving over {:?}", session.transport);
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    crate::mounts::umount_path(mnt);
    session.join();
    0
}
