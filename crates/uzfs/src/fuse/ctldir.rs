//! `.zfs`: the control directory every mounted filesystem shows at its
//! root (OpenZFS's `zfs_ctldir.c`), and under `.zfs/snapshot/NAME` the
//! read-only files of each of the dataset's snapshots.
//!
//! One FUSE mount serves the head filesystem and all its snapshots, so
//! their node ids must not collide. A node id is `view << 48 | object`:
//! view 0 is the head (its object numbers stay below 2^48), view
//! [`CTL_VIEW`] holds the two synthetic directories, and views 1.. are
//! snapshots, numbered in the order this mount first meets them. A view
//! belongs to one snapshot guid for the life of the mount and is never
//! given to another, so a node id the kernel still holds can never name a
//! different snapshot's file.
//!
//! A snapshot's files are opened on first use (a ZPL over the snapshot's
//! object set, reading through the pool's cache) and at most [`OPEN_MAX`]
//! stay open; one closed again reopens on its next request with the same
//! node ids (object numbers are the snapshot's own). Every request checks
//! that the snapshot still exists: one destroyed while the kernel still
//! caches its entries answers ENOENT. `.zfs/snapshot` lists the dataset's
//! snapshots as they are: the kernel keeps the listing (it opens every
//! directory of the mount by itself, see `fuse::no_opendir`), and each
//! `zfs` command that may change snapshots drops it and the names looked
//! up in it before it answers (`CtlDir::snapshots_changed`), so snapshots
//! created, renamed or destroyed while mounted appear, move and vanish at
//! once.
//!
//! A snapshot destroyed between that check and a read: its blocks may be
//! freed and reused under the read, which then fails its checksum (EIO).
//! Never another file's data: every block is read through the pointer and
//! checksum its parent holds.
//!
//! Everything under `.zfs` is read-only; changes answer EROFS. (OpenZFS
//! also takes and destroys snapshots by mkdir and rmdir in `.zfs/snapshot`;
//! uzfs does not: use `zfs snapshot` and `zfs destroy`.)

use super::abi::{self, FAttr, InHeader, Op, Out};
use super::{FuseFs, Tree, SHORT};
use crate::fuse::abi::Ttl;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use uzfs_core::dsl::Dataset;
use uzfs_core::spa::Pool;
use uzfs_core::zpl::fs::ZResult;
use uzfs_core::zpl::Zpl;

pub const VIEW_SHIFT: u32 = 48;
/// The object number part of a node id.
pub const OBJ_MASK: u64 = (1 << VIEW_SHIFT) - 1;
pub const CTL_VIEW: u64 = 0xFFFF;
/// `.zfs`
pub const CTL_DIR: u64 = (CTL_VIEW << VIEW_SHIFT) | 1;
/// `.zfs/snapshot`
pub const SNAP_DIR: u64 = (CTL_VIEW << VIEW_SHIFT) | 2;
pub const NAME: &[u8] = b".zfs";
/// A directory entry's type for a directory (`DT_DIR`).
pub const DT_DIR: u32 = libc::S_IFDIR >> 12;
/// Snapshots kept open at once (each holds its object set's caches and
/// two prefetch threads).
pub const OPEN_MAX: usize = 32;

pub fn view_of(nodeid: u64) -> u64 {
    nodeid >> VIEW_SHIFT
}

#[derive(Default)]
struct Views {
    /// View n's snapshot (id, guid), at index n - 1.
    slots: Vec<(u64, u64)>,
    by_guid: HashMap<u64, u64>,
    /// Open snapshots by view, with the clock of their last use.
    open: HashMap<u64, (Arc<Zpl>, u64)>,
    clock: u64,
    /// Names looked up in `.zfs/snapshot` since the snapshots last
    /// changed: the kernel may hold them.
    looked_up: HashSet<Vec<u8>>,
}

pub struct CtlDir {
    pool: Arc<Pool>,
    /// The head dataset (a rollback replaces it).
    ds: std::sync::RwLock<Arc<Dataset>>,
    views: Mutex<Views>,
    /// The synthetic directories' times: when the mount began.
    born: i64,
}

impl CtlDir {
    pub fn new(pool: Arc<Pool>, ds: Arc<Dataset>) -> CtlDir {
        CtlDir {
            pool,
            ds: std::sync::RwLock::new(ds),
            views: Mutex::default(),
            born: uzfs_core::zpl::fs::now_ns(),
        }
    }

    fn ds(&self) -> Arc<Dataset> {
        self.ds.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A rollback made `ds` the head.
    pub fn set_dataset(&self, ds: Arc<Dataset>) {
        *self.ds.write().unwrap_or_else(|p| p.into_inner()) = ds;
    }

    fn views(&self) -> MutexGuard<'_, Views> {
        self.views.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The view of snapshot (id, guid), given one if it has none.
    fn view_for(v: &mut Views, id: u64, guid: u64) -> ZResult<u64> {
        if let Some(&n) = v.by_guid.get(&guid) {
            return Ok(n);
        }
        let n = v.slots.len() as u64 + 1;
        if n >= CTL_VIEW {
            // 65,534 snapshots met by one mount: remount to see more.
            return Err(libc::ENFILE);
        }
        v.slots.push((id, guid));
        v.by_guid.insert(guid, n);
        Ok(n)
    }

    /// The dataset's snapshots as (id, name, view), by id.
    fn listing(&self) -> ZResult<Vec<(u64, String, u64)>> {
        let snaps = self.pool.dsl_pool().snapshots_of(self.ds().id());
        let mut v = self.views();
        let mut out = Vec::with_capacity(snaps.len());
        for s in snaps {
            let p = s.phys();
            let view = Self::view_for(&mut v, p.id, p.guid)?;
            out.push((p.id, p.name, view));
        }
        out.sort_unstable_by_key(|e| e.0);
        Ok(out)
    }

    /// The dataset's snapshots changed (taken, destroyed, renamed,
    /// promoted away): the kernel keeps `.zfs/snapshot`'s listing (it
    /// opens directories by itself, see `fuse::no_opendir`) and the names
    /// it looked up there, so both go now, before the command that
    /// changed them is answered.
    pub fn snapshots_changed(&self, n: &super::Notifier) {
        let names = std::mem::take(&mut self.views().looked_up);
        for name in &names {
            n.inval_entry(SNAP_DIR, name);
        }
        n.inval_inode(SNAP_DIR);
    }

    /// The view of the snapshot called `name`.
    fn lookup(&self, name: &[u8]) -> ZResult<u64> {
        let name = std::str::from_utf8(name).map_err(|_| libc::ENOENT)?;
        let s = self
            .pool
            .dsl_pool()
            .snapshots_of(self.ds().id())
            .into_iter()
            .find(|s| s.phys().name == name)
            .ok_or(libc::ENOENT)?;
        let p = s.phys();
        let mut v = self.views();
        v.looked_up.insert(name.as_bytes().to_vec());
        Self::view_for(&mut v, p.id, p.guid)
    }

    /// View `view`'s files, opened if they are not; ENOENT once its
    /// snapshot is gone.
    fn tree(&self, view: u64) -> ZResult<Arc<Zpl>> {
        let snap = {
            let mut v = self.views();
            let &(id, guid) = v
                .slots
                .get((view as usize).wrapping_sub(1))
                .ok_or(libc::ENOENT)?;
            let Some(snap) = self.pool.dsl_pool().live_snapshot(id, guid) else {
                v.open.remove(&view);
                return Err(libc::ENOENT);
            };
            v.clock += 1;
            let now = v.clock;
            if let Some((zpl, used)) = v.open.get_mut(&view) {
                *used = now;
                return Ok(zpl.clone());
            }
            snap
        };
        // Opened outside the lock (it reads the master node and root).
        let zpl = self
            .pool
            .dsl_pool()
            .mount_snapshot_of(&self.ds(), &snap)
            .map(Arc::new)
            .map_err(|e| {
                log::warn!("opening snapshot {}: {e}", snap.phys().name);
                libc::EIO
            })?;
        let mut v = self.views();
        v.clock += 1;
        let now = v.clock;
        if v.open.len() >= OPEN_MAX && !v.open.contains_key(&view) {
            if let Some(&old) = v.open.iter().min_by_key(|e| e.1 .1).map(|e| e.0) {
                v.open.remove(&old);
            }
        }
        Ok(v.open.entry(view).or_insert((zpl, now)).0.clone())
    }

    /// The entry of `.zfs` in the root.
    pub fn attr_entry(&self, out: &mut Out<'_>) {
        out.entry(&self.attr(CTL_DIR), 0, Ttl::both(SHORT));
    }

    fn attr(&self, nodeid: u64) -> FAttr {
        FAttr {
            ino: nodeid,
            mode: libc::S_IFDIR | 0o555,
            nlink: 2,
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            blksize: 4096,
            ..Default::default()
        }
    }
}

impl FuseFs {
    /// A request on `.zfs` or `.zfs/snapshot`.
    pub(super) fn ctl_dispatch(
        &self,
        ctl: &CtlDir,
        h: &InHeader,
        op: Op<'_>,
        out: &mut Out<'_>,
    ) -> ZResult<()> {
        let dir = h.nodeid;
        if dir != CTL_DIR && dir != SNAP_DIR {
            return Err(libc::ENOENT);
        }
        if op.is_change() {
            return Err(libc::EROFS);
        }
        match op {
            Op::Getattr => {
                out.attr_out(&ctl.attr(dir), SHORT);
                Ok(())
            }
            Op::Lookup { name } if dir == CTL_DIR => {
                if name != b"snapshot" {
                    return Err(libc::ENOENT);
                }
                out.entry(&ctl.attr(SNAP_DIR), 0, Ttl::both(SHORT));
                Ok(())
            }
            Op::Lookup { name } => {
                let view = ctl.lookup(name)?;
                let zpl = ctl.tree(view)?;
                let t = Tree::snapshot(&zpl, view);
                // The name briefly: it may come to mean another snapshot.
                let a = zpl.getattr(zpl.root)?;
                let ttl = Ttl {
                    entry: SHORT,
                    ..t.ttl(&a)
                };
                out.entry(&t.fattr(&a), a.z.gen, ttl);
                Ok(())
            }
            // Listings not kept, unless the kernel opens directories by
            // itself (then it keeps them all, and `snapshots_changed`
            // drops `.zfs/snapshot`'s).
            Op::Opendir if super::no_opendir() => Err(libc::ENOSYS),
            Op::Opendir => {
                out.open(0, 0);
                Ok(())
            }
            Op::Readdir { offset, size, plus } => {
                let dt = DT_DIR;
                let size = size as usize;
                // READDIRPLUS: no attributes here (node id 0), the kernel
                // looks each entry up when it is used.
                let mut dirent = |ino: u64, next: u64, name: &[u8]| {
                    if plus {
                        out.direntplus(size, ino, None, Ttl::both(SHORT), next, dt, name)
                    } else {
                        out.dirent(size, ino, next, dt, name)
                    }
                };
                let parent = if dir == CTL_DIR { super::ROOT } else { CTL_DIR };
                let mut fixed = vec![(dir, 1, &b"."[..]), (parent, 2, &b".."[..])];
                if dir == CTL_DIR {
                    fixed.push((SNAP_DIR, 3, b"snapshot"));
                }
                for (ino, next, name) in fixed {
                    if next > offset && !dirent(ino, next, name) {
                        return Ok(());
                    }
                }
                if dir == SNAP_DIR {
                    let root = self.zpl.root;
                    for (id, name, view) in ctl.listing()? {
                        let ino = (view << VIEW_SHIFT) | root;
                        let next = id + 3;
                        if next > offset && !dirent(ino, next, name.as_bytes()) {
                            break;
                        }
                    }
                }
                Ok(())
            }
            Op::Releasedir | Op::Fsyncdir => Ok(()),
            Op::Statfs => {
                self.statfs(out);
                Ok(())
            }
            Op::Getxattr { name, .. } => Err(super::absent_xattr(name)),
            Op::Listxattr { size } => super::xattr_reply(&[], size, out),
            Op::Open { .. } => Err(libc::EISDIR),
            _ => Err(libc::ENOSYS),
        }
    }

    /// A request on a snapshot's files (view `view`).
    pub(super) fn snap_dispatch(
        &self,
        ctl: &CtlDir,
        view: u64,
        h: &InHeader,
        op: Op<'_>,
        out: &mut Out<'_>,
    ) -> ZResult<()> {
        if op.is_change() {
            return Err(libc::EROFS);
        }
        let zpl = ctl.tree(view)?;
        let t = Tree::snapshot(&zpl, view);
        match op {
            // Nothing to count: a snapshot's files are never freed under
            // an open descriptor (the snapshot itself answers ENOENT once
            // destroyed).
            Op::Open { flags } => {
                let flags = flags as i32;
                if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
                    return Err(libc::EROFS);
                }
                zpl.getattr(t.obj(h.nodeid))?;
                out.open(0, abi::FOPEN_KEEP_CACHE);
                Ok(())
            }
            Op::Release { .. } | Op::Fsync | Op::Fsyncdir => Ok(()),
            Op::Statfs => {
                self.statfs(out);
                Ok(())
            }
            op => t.query(h, op, out),
        }
    }
}
