//! A rollback under a mounted filesystem: the mount stays, its files
//! become the snapshot's (OpenZFS's `zfs_suspend_fs`/`zfs_resume_fs`).
//!
//! The kernel above a FUSE mount caches what it was told: names (a
//! directory's entry to a node id), attributes, file pages, and node ids
//! it holds open. A rollback replaces the tree under all of that, so:
//!
//! 1. **Suspend.** Every request holds the mount's read lock while it runs
//!    ([`FuseMount::handle`]); the rollback takes the write lock, so it
//!    waits for the requests in flight and holds back new ones (the
//!    kernel queues them). The caller first asks the kernel to write back
//!    its dirty pages (`syncfs`), outside the lock, since that writeback
//!    is made of requests.
//! 2. **Compare** the head with the snapshot (`zpl::diff::turnover`): only
//!    objects whose dnodes were rewritten after the snapshot can differ.
//!    Each is the same file (same number and generation), a changed one,
//!    or gone; directories among them list the names that now lead
//!    elsewhere.
//! 3. **Swap** in the new tree's [`Zpl`] (open counts carried over, so an
//!    unlinked file still open lives until its last close) and release
//!    the lock.
//! 4. **Invalidate**, from the rollback's thread with requests flowing
//!    again (dropping a dirty page writes it back through a WRITE request
//!    that a request thread must answer): each changed name expires
//!    (`FUSE_EXPIRE_ONLY`, so a filesystem mounted on a name is never
//!    detached by it), each changed or gone file drops its attributes and
//!    pages.
//!
//! **Stale handles.** FUSE requests carry a node id, not its generation.
//! A descriptor the kernel holds on a gone file would otherwise reach
//! whatever the new tree keeps under that number. Gone node ids answer
//! ESTALE ([`Stale`]) until a reply hands the number out again (then the
//! kernel sees the new generation and retires its old inode itself);
//! releasing one answers at once. A path walk that meets ESTALE retries
//! with a fresh lookup, so names resolve; only descriptors opened before
//! the rollback on files it removed see the error, where OpenZFS answers
//! EIO.

use super::abi::{InHeader, Op, Out};
use super::session::Handler;
use super::{FuseFs, Notifier};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};
use uzfs_core::zpl::diff::Turnover;
use uzfs_core::zpl::fs::ZResult;
use uzfs_core::zpl::Zpl;

/// Node ids a rollback left the kernel holding that it must not use
/// (stale), and the generations replies give files it turned into other
/// inodes.
#[derive(Default)]
pub struct Handles {
    /// Whether `stale` is not empty (the common case asks no lock).
    any_stale: AtomicBool,
    /// Whether `gens` is not empty.
    any_gens: AtomicBool,
    inner: Mutex<HandleSets>,
}

#[derive(Clone, Default)]
struct HandleSets {
    /// Stale objects, and whether the tree still has the file (its open
    /// count was carried over, so a release still counts).
    stale: HashMap<u64, bool>,
    /// Rewritten files: (generation of the file, generation replies give).
    gens: HashMap<u64, (u64, u64)>,
}

impl Handles {
    fn inner(&self) -> std::sync::MutexGuard<'_, HandleSets> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn from_sets(h: HandleSets) -> Handles {
        Handles {
            any_stale: AtomicBool::new(!h.stale.is_empty()),
            any_gens: AtomicBool::new(!h.gens.is_empty()),
            inner: Mutex::new(h),
        }
    }

    /// A reply hands `obj` (generation `gen` on disk) to the kernel: it is
    /// no longer stale; the generation the reply carries.
    pub fn hand_out(&self, obj: u64, gen: u64) -> u64 {
        if !self.any_stale.load(Ordering::Acquire) && !self.any_gens.load(Ordering::Acquire) {
            return gen;
        }
        let mut h = self.inner();
        if h.stale.remove(&obj).is_some() {
            self.any_stale.store(!h.stale.is_empty(), Ordering::Release);
        }
        match h.gens.get(&obj) {
            Some(&(disk, given)) if disk == gen => given,
            _ => gen,
        }
    }

    /// Whether request `op` on `obj` (and `other`, its second node's
    /// object) may run: `Err(ESTALE)` if it names a stale one, `Ok(true)`
    /// if it is a release of a file the tree no longer has (answered at
    /// once), `Ok(false)` otherwise.
    pub fn check(&self, obj: u64, other: Option<u64>, op: &Op<'_>) -> ZResult<bool> {
        if !self.any_stale.load(Ordering::Acquire) {
            return Ok(false);
        }
        let h = self.inner();
        if let Some(&kept) = h.stale.get(&obj) {
            return match op {
                Op::Release { .. } | Op::Releasedir if !kept => Ok(true),
                Op::Release { .. } | Op::Releasedir => Ok(false),
                _ => Err(libc::ESTALE),
            };
        }
        match other {
            Some(o) if h.stale.contains_key(&o) => Err(libc::ESTALE),
            _ => Ok(false),
        }
    }
}

/// Another generation than `given` for the same file. The kernel keeps
/// and compares generations as 32-bit values (`fuse_stale_inode`), so the
/// change is in the low half: 4,096 rollbacks that each rewrite the file
/// before one comes back to a value the kernel might still hold.
fn bump(given: u64) -> u64 {
    (given as u32).wrapping_add(1 << 20) as u64
}

/// What the kernel holds a session to: the mounted tree, swapped whole by
/// a rollback.
pub struct FuseMount {
    cur: RwLock<Arc<FuseFs>>,
}

/// A mount with its requests held (step 1); dropping it lets them run on
/// whatever tree it holds.
pub struct Suspended<'a> {
    cur: RwLockWriteGuard<'a, Arc<FuseFs>>,
}

impl FuseMount {
    pub fn new(fs: FuseFs) -> FuseMount {
        FuseMount {
            cur: RwLock::new(Arc::new(fs)),
        }
    }

    fn cur(&self) -> Arc<FuseFs> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The head tree served now.
    pub fn zpl(&self) -> Arc<Zpl> {
        self.cur().zpl.clone()
    }

    /// Properties changed: the root's kept listing goes (it shows `.zfs`
    /// or not by `snapdir`). Not from a request thread.
    pub fn properties_changed(&self) {
        if let Some(n) = self.cur().notifier.get() {
            n.inval_inode(super::ROOT);
        }
    }

    /// The dataset's snapshots changed: `.zfs/snapshot` as the kernel
    /// keeps it goes. Not from a request thread.
    pub fn snapshots_changed(&self) {
        let fs = self.cur();
        if let (Some(n), Some(ctl)) = (fs.notifier.get(), &fs.ctl) {
            ctl.snapshots_changed(n);
        }
    }

    /// Step 1: wait for the requests in flight, hold back the rest.
    pub fn suspend(&self) -> Suspended<'_> {
        Suspended {
            cur: self.cur.write().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

impl Suspended<'_> {
    pub fn zpl(&self) -> &Arc<Zpl> {
        &self.cur.zpl
    }

    /// Step 3: serve `zpl` from now on; `t` is what changed. Returns what
    /// step 4 needs (call [`Invalidation::send`] once this is dropped).
    pub fn swap(
        &mut self,
        zpl: Arc<Zpl>,
        ds: Arc<uzfs_core::dsl::Dataset>,
        t: Turnover,
    ) -> Invalidation {
        let old = self.cur.clone();
        zpl.set_posix_acl(old.zpl.posix_acl());
        if let Some(ctl) = &old.ctl {
            ctl.set_dataset(ds);
        }
        // Rewritten files become new inodes: the kernel keeps a regular
        // file's size and times itself (writeback cache) and would never
        // take the snapshot's. Their node ids go stale until a lookup
        // hands them out with another generation; the kernel then
        // retires the old inode (a descriptor opened before gets EIO).
        let mut sets = old.handles.inner().clone();
        for &o in &t.gone {
            sets.stale.insert(o, false);
            sets.gens.remove(&o);
        }
        for &o in &t.rewritten {
            let Ok(a) = zpl.getattr(o) else { continue };
            let given = match sets.gens.get(&o) {
                Some(&(disk, given)) if disk == a.z.gen => given,
                _ => a.z.gen,
            };
            sets.stale.insert(o, true);
            sets.gens.insert(o, (a.z.gen, bump(given)));
        }
        let handles = Handles::from_sets(sets);
        let tree = super::Tree {
            zpl: &zpl,
            tag: 0,
            handles: None,
            stores: None,
        };
        let inodes = t
            .gone
            .iter()
            .chain(&t.changed)
            .chain(&t.rewritten)
            .map(|&o| tree.ino(o))
            .collect();
        let names = t
            .names
            .into_iter()
            .map(|(dir, name)| (tree.ino(dir), name))
            .collect();
        let new = Arc::new(FuseFs {
            zpl: zpl.clone(),
            handles,
            ctl: old.ctl.clone(),
            notifier: old.notifier.clone(),
            writeback: old.writeback.clone(),
            stores: old.stores.clone(),
            dirty: old.dirty.clone(),
            // Retrievals sent from now on are this tree's.
            first_retrieval: super::session::next_retrieve_unique(),
        });
        // The kernel's pages of changed files are the old tree's until
        // step 4 drops them: writes read records from the devices until
        // then (`Invalidation::send` hands the new tree the kernel's
        // pages).
        let pages = new.kernel_pages();
        *self.cur = new;
        Invalidation {
            stores: old.stores.clone(),
            notifier: old.notifier.get().cloned(),
            inodes,
            names,
            pages: pages.map(|p| (zpl, p)),
        }
    }
}

/// Step 4: the kernel caches to drop after a swap.
pub struct Invalidation {
    /// Stores of the old tree's bytes, stale from now on (`store.rs`).
    stores: Arc<super::store::Stores>,
    notifier: Option<Notifier>,
    /// Node ids whose attributes and pages go.
    inodes: Vec<u64>,
    /// (directory node id, name) lookups that expire.
    names: Vec<(u64, Vec<u8>)>,
    /// The new tree, and the kernel's pages it may use once the old
    /// tree's are dropped.
    pages: Option<(Arc<Zpl>, Arc<dyn uzfs_core::zpl::pagecache::PageCache>)>,
}

impl Invalidation {
    /// Send them (never with the mount suspended). Names first: a walk
    /// that starts meanwhile looks names up again before it reaches an
    /// inode whose attributes are still the old tree's.
    pub fn send(self) -> (usize, usize) {
        // Before the pages go: what a store sends after this is dropped.
        self.stores.rolled_back();
        if let Some(n) = &self.notifier {
            for (dir, name) in &self.names {
                n.inval_entry(*dir, name);
            }
            for &ino in &self.inodes {
                n.inval_inode(ino);
            }
        }
        if let Some((zpl, pc)) = self.pages {
            zpl.set_page_cache(pc);
        }
        (self.names.len(), self.inodes.len())
    }
}

impl Handler for FuseMount {
    fn handle(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> ZResult<()> {
        // Held for the whole request: a rollback waits for it.
        let cur = self.cur.read().unwrap_or_else(|e| e.into_inner());
        cur.handle(h, op, out)
    }

    fn negotiated(&self, posix_acl: bool, notifier: Notifier) {
        self.cur().negotiated(posix_acl, notifier)
    }

    fn retrieved(&self, unique: u64, nodeid: u64, offset: u64, data: &[u8]) {
        // Held like a request: a rollback waits for it.
        let cur = self.cur.read().unwrap_or_else(|e| e.into_inner());
        cur.retrieved(unique, nodeid, offset, data)
    }

    fn destroy(&self) {
        self.cur().destroy()
    }
}
