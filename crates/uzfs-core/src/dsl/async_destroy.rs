//! Background freeing of destroyed datasets and snapshots (OpenZFS
//! `async_destroy`: the pool's bptree and free bpobj, processed by
//! `dsl_scan_sync`).
//!
//! # Why
//!
//! Destroying a dataset frees every block it alone holds; a snapshot
//! destroy frees what only it held. Done inside the destroy's txg, a large
//! one would stall that sync (and every writer waiting on it) for as long
//! as freeing takes, and a crash part way would have to start over. So a
//! destroy only queues the work, and every txg frees a bounded part
//! (`Tunables::free_max_blocks`, `free_max_ms`), until nothing is left.
//! Small destroys finish in their own txg; `zpool get freeing` says what
//! is left of large ones.
//!
//! # The queue
//!
//! One MOS object (`ObjectDirectory::freeing`, JSON [`FreeQueue`]) lists
//! the work in order:
//!
//! - `tree`: an object set's blocks born from `min_birth` (a destroyed
//!   dataset: all of them, a clone: those after its origin, a head rolled
//!   back: those after the snapshot), freed by a post-order walk
//!   (`dmu/traverse.rs`) from the position `at`. Post-order matters: a
//!   walk resumed in a later txg reads the path down to `at` again, and
//!   every block on it is still allocated, because a parent is freed only
//!   after everything beneath it.
//! - `blocks`: a list of block pointers in a MOS object (a snapshot
//!   destroy's frees beyond the txg's budget), freed from entry `next`.
//!
//! The queue is rewritten in the txg whose sync freed its blocks, so the
//! frees and the new positions commit together: after a crash the queue
//! picks up exactly where the last committed txg left it. zdb counts what
//! the queue still holds as referenced (nothing is leaked while freeing,
//! and nothing freed is still listed).

use super::DslPool;
use crate::dmu::blkptr::{BlkPtr, BLKPTR_SIZE};
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{BlockWriter, Objset, TxgDirty};
use crate::dmu::traverse::{self, At, Next, Position, Visitor};
use crate::error::{Error, Result};
use crate::spa::{lock, Pool};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// The pool's pending frees (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeQueue {
    pub entries: VecDeque<FreeEntry>,
}

impl FreeQueue {
    /// Bytes still to be freed (`zpool get freeing`). A tree's figure is
    /// what its dataset was charged when destroyed, less what was freed.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(FreeEntry::bytes).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FreeEntry {
    Tree {
        /// The object-set block pointer, hex.
        root: String,
        min_birth: u64,
        at: Position,
        bytes: u64,
    },
    Blocks {
        obj: u64,
        next: u64,
        count: u64,
        bytes: u64,
    },
}

impl FreeEntry {
    pub fn tree(root: &BlkPtr, min_birth: u64, bytes: u64) -> FreeEntry {
        FreeEntry::Tree {
            root: crate::dmu::blkptr::hex(&root.to_bytes()),
            min_birth,
            at: Position::START,
            bytes,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            FreeEntry::Tree { bytes, .. } | FreeEntry::Blocks { bytes, .. } => *bytes,
        }
    }
}

/// A `tree` entry's root pointer.
pub fn decode_root(hex: &str) -> Result<BlkPtr> {
    let bad = || Error::corrupt("free queue", format!("bad root pointer '{hex}'"));
    if hex.len() != 2 * BLKPTR_SIZE || !hex.is_ascii() {
        return Err(bad());
    }
    let bytes = (0..BLKPTR_SIZE)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad()))
        .collect::<Result<Vec<u8>>>()?;
    BlkPtr::decode(&bytes)
}

/// A `blocks` entry's object: a list of block pointers holding at least
/// `count` of them.
pub fn check_blocks_object(mos: &Objset, obj: u64, count: u64) -> Result<()> {
    let dn = crate::dsl::deadlist::list_dnode(mos, obj)?;
    if count
        .checked_mul(BLKPTR_SIZE as u64)
        .is_none_or(|n| n > dn.size)
    {
        return Err(Error::corrupt(
            "free queue",
            format!(
                "object {obj} ({} bytes) does not hold {count} block pointers",
                dn.size
            ),
        ));
    }
    Ok(())
}

/// How much one sync may still free.
pub struct Budget {
    pub blocks: u64,
    pub until: Option<Instant>,
}

impl Budget {
    /// No limit (a free that must finish now).
    pub const ALL: Budget = Budget {
        blocks: u64::MAX,
        until: None,
    };

    pub fn spent(&self) -> bool {
        self.blocks == 0 || self.until.is_some_and(|t| Instant::now() >= t)
    }

    /// One block's worth, if any is left.
    pub fn take(&mut self) -> bool {
        if self.spent() {
            return false;
        }
        self.blocks -= 1;
        true
    }
}

/// A walk's visitor that frees post-order, while the budget lasts: it
/// stops before a block once `budget` blocks were freed (so each walk
/// frees at least one block before it can stop).
pub struct Freer<'a> {
    w: &'a mut dyn BlockWriter,
    budget: &'a mut Budget,
    pub bytes: u64,
    /// Blocks whose contents could not be read: what is beneath them
    /// stays allocated (leaked), the rest is freed.
    pub errors: Vec<Error>,
}

impl<'a> Freer<'a> {
    pub fn new(w: &'a mut dyn BlockWriter, budget: &'a mut Budget) -> Self {
        Freer {
            w,
            budget,
            bytes: 0,
            errors: Vec::new(),
        }
    }

    /// The first read error, if any (for walks that must not leak).
    pub fn result(mut self) -> Result<()> {
        match self.errors.is_empty() {
            true => Ok(()),
            false => Err(self.errors.swap_remove(0)),
        }
    }
}

impl Visitor for Freer<'_> {
    fn pre(&mut self, _bp: &BlkPtr, _at: &At) -> Next {
        if self.budget.spent() {
            return Next::Stop;
        }
        Next::Descend
    }

    fn post(&mut self, bp: &BlkPtr, _at: &At) {
        self.bytes += self.w.dsize(bp);
        self.budget.blocks = self.budget.blocks.saturating_sub(1);
        self.w.free_bp(bp);
    }

    fn error(&mut self, _at: &At, e: Error) {
        self.errors.push(e);
    }
}

impl DslPool<'_> {
    /// `zpool get freeing`: bytes destroyed datasets and snapshots still
    /// hold, waiting for background freeing.
    pub fn freeing(&self) -> u64 {
        let queued: u64 = lock(&self.dsl().doomed).iter().map(|d| d.2).sum();
        queued + lock(&self.dsl().freeing).bytes()
    }

    /// Sync until every queued free is done (tests, `zpool wait -t free`).
    pub fn wait_freed(&self) -> Result<()> {
        loop {
            let idle =
                lock(&self.dsl().doomed).is_empty() && lock(&self.dsl().freeing).entries.is_empty();
            if idle {
                return Ok(());
            }
            self.spa.sync()?;
        }
    }

    /// The queue's MOS object, created before the first destroy that may
    /// use it (outside sync: the object directory is rewritten by the
    /// same path as the scan's, under `st`).
    pub(crate) fn ensure_free_queue(&self) -> Result<()> {
        let mut st = lock(&self.spa.st);
        if st.dir.freeing != 0 {
            return Ok(());
        }
        let o = self
            .spa
            .mos
            .create_object(ot::POOL_PROPS, 4096, &ObjProps::METADATA)?;
        st.dir.freeing = o;
        let dir = st.dir.clone();
        drop(st);
        self.spa.write_json(1, &dir)?;
        self.spa.write_json(o, &FreeQueue::default())
    }

    /// Import: the queue as the last committed txg left it.
    pub(crate) fn load_free_queue(&self) -> Result<()> {
        let obj = lock(&self.spa.st).dir.freeing;
        if obj == 0 {
            return Ok(());
        }
        let q: FreeQueue = Pool::read_json(&self.spa.mos, obj, "free queue")?;
        if !q.entries.is_empty() {
            log::info!(
                "pool '{}': resuming background freeing of {} bytes",
                self.spa.name,
                q.bytes()
            );
        }
        *lock(&self.dsl().freeing) = q;
        Ok(())
    }

    /// Sync context: the queue with this txg's destroyed object sets added.
    pub(crate) fn queue_doomed(&self, doomed: Vec<(Arc<Objset>, u64, u64)>) -> FreeQueue {
        let mut q = lock(&self.dsl().freeing).clone();
        for (os, min_txg, bytes) in doomed {
            let root = os.root_bp();
            if !root.is_hole() {
                q.entries
                    .push_back(FreeEntry::tree(&root, min_txg + 1, bytes));
            }
        }
        q
    }

    /// Sync context: free from the front of `q` while `budget` lasts.
    pub(crate) fn free_queued(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        q: &mut FreeQueue,
        budget: &mut Budget,
    ) -> Result<()> {
        while let Some(e) = q.entries.front_mut() {
            if budget.spent() {
                break;
            }
            let done = match e {
                FreeEntry::Tree {
                    root,
                    min_birth,
                    at,
                    bytes,
                } => {
                    let root = match decode_root(root) {
                        Ok(r) => r,
                        Err(err) => {
                            log::error!(
                                "pool '{}': free queue: {err}; entry dropped",
                                self.spa.name
                            );
                            q.entries.pop_front();
                            continue;
                        }
                    };
                    let mut f = Freer::new(w, budget);
                    let r = traverse::walk_objset(&*self.spa.io, &root, *min_birth, *at, &mut f);
                    *bytes = bytes.saturating_sub(f.bytes);
                    for err in &f.errors {
                        log::error!(
                            "pool '{}': freeing a destroyed dataset: {err}; blocks beneath it leak",
                            self.spa.name
                        );
                    }
                    match r {
                        None => true,
                        Some(p) => {
                            *at = p;
                            false
                        }
                    }
                }
                FreeEntry::Blocks {
                    obj,
                    next,
                    count,
                    bytes,
                } => {
                    // A damaged entry leaks its blocks rather than free
                    // what it does not list.
                    if let Err(err) = check_blocks_object(&self.spa.mos, *obj, *count) {
                        log::error!("pool '{}': free queue: {err}; entry dropped", self.spa.name);
                        q.entries.pop_front();
                        continue;
                    }
                    while *next < *count && !budget.spent() {
                        let n = (*count - *next).min(budget.blocks).min(4096);
                        let mut buf = vec![0u8; n as usize * BLKPTR_SIZE];
                        self.spa
                            .mos
                            .read(*obj, *next * BLKPTR_SIZE as u64, &mut buf)?;
                        for raw in buf.chunks_exact(BLKPTR_SIZE) {
                            let bp = BlkPtr::decode(raw)?;
                            *bytes = bytes.saturating_sub(w.dsize(&bp));
                            w.free_bp(&bp);
                        }
                        *next += n;
                        budget.blocks -= n;
                    }
                    if *next >= *count {
                        extra.free_object(*obj);
                        true
                    } else {
                        false
                    }
                }
            };
            if !done {
                break;
            }
            q.entries.pop_front();
        }
        Ok(())
    }

    /// Sync context: a snapshot destroy's frees past the budget become a
    /// `blocks` entry (a new MOS object listing them).
    pub(crate) fn queue_spill(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        q: &mut FreeQueue,
        spill: Vec<BlkPtr>,
    ) -> Result<()> {
        if spill.is_empty() {
            return Ok(());
        }
        let obj = self.spa.mos.create_in_sync(
            extra,
            ot::DEADLIST,
            crate::dsl::deadlist::DEADLIST_BLOCK,
            &ObjProps::METADATA,
        )?;
        self.spa
            .mos
            .write_in_sync(extra, obj, 0, &crate::dsl::deadlist::encode_bps(&spill))?;
        let bytes = spill.iter().map(|b| w.dsize(b)).sum();
        q.entries.push_back(FreeEntry::Blocks {
            obj,
            next: 0,
            count: spill.len() as u64,
            bytes,
        });
        Ok(())
    }

    /// Sync context: write `q` if it changed, and make it the pool's.
    pub(crate) fn save_queue(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        queue_obj: u64,
        q: FreeQueue,
    ) -> Result<()> {
        let mut cur = lock(&self.dsl().freeing);
        if *cur == q {
            return Ok(());
        }
        if queue_obj == 0 {
            // Every destroy creates the object first (`ensure_free_queue`).
            return Err(Error::invalid(
                "free queue changed but the pool has no queue object",
            ));
        }
        if !q.entries.is_empty() {
            w.note_feature(crate::spa::feature::ASYNC_DESTROY);
        }
        let bytes = serde_json::to_vec(&q).map_err(|e| Error::invalid(e.to_string()))?;
        self.spa.mos.replace_in_sync(extra, queue_obj, 0, &bytes)?;
        *cur = q;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsl::DsCtx;
    use crate::spa::{sim_pool, sim_tunables, Tunables};
    use crate::vdev::sim::SimWorld;
    use crate::zpl::Zpl;

    /// A damaged queue entry is refused with a reason, never decoded into
    /// block pointers to free: a root that is not 128 bytes of hex, a
    /// `blocks` object of another type or shorter than its count.
    #[test]
    fn damaged_queue_entries_are_refused() {
        for bad in [
            "",
            "zz",
            &"0".repeat(2 * BLKPTR_SIZE - 1),
            &"é".repeat(BLKPTR_SIZE),
        ] {
            let e = decode_root(bad).expect_err(bad);
            assert!(e.to_string().contains("root pointer"), "{e}");
        }
        let world = SimWorld::new();
        let (_d, p) = sim_pool(&world, "t", 64 << 20, sim_tunables(), Some(8)).expect("pool");
        // Three block pointers' worth of bytes in an object of `t`.
        let three = |t: u8| {
            let o = p
                .mos
                .create_object(t, 16384, &ObjProps::METADATA)
                .expect("object");
            p.mos.write(o, 0, &[0u8; 3 * BLKPTR_SIZE]).expect("write");
            o
        };
        let (list, other) = (three(ot::DEADLIST), three(ot::POOL_PROPS));
        p.sync().expect("sync");
        check_blocks_object(&p.mos, list, 3).expect("a list of three");
        let e = check_blocks_object(&p.mos, list, 4).expect_err("too short");
        assert!(e.to_string().contains("does not hold 4"), "{e}");
        check_blocks_object(&p.mos, list, u64::MAX).expect_err("overflow");
        let e = check_blocks_object(&p.mos, other, 1).expect_err("wrong type");
        assert!(e.to_string().contains("pool properties"), "{e}");
        p.close().expect("close");
    }

    /// Destroy a filesystem holding 2 MiB with a budget of 2 blocks per
    /// txg: what is left to free after the destroy's txg.
    fn left_after_destroy(async_destroy: bool) -> u64 {
        let world = SimWorld::new();
        let tun = Tunables {
            free_max_blocks: 2,
            ..sim_tunables()
        };
        let (_d, p) = sim_pool(&world, "t", 96 << 20, tun, Some(9)).expect("pool");
        p.dsl_pool().format_root_fs().expect("format");
        if !async_destroy {
            // A pool made before the feature existed does not list it.
            lock(&p.st)
                .config
                .features
                .remove(crate::spa::feature::ASYNC_DESTROY);
        }
        p.dsl_pool()
            .create_dataset("t/big", &[], false)
            .expect("create");
        let ds = p.dsl_pool().dataset("t/big").expect("dataset");
        let fs = Zpl::mount(ds.os.clone(), DsCtx::new(p.clone(), ds.clone())).expect("mount");
        let f = fs
            .mknod(fs.root, b"f", libc::S_IFREG | 0o644, 0, 0, 0, None)
            .expect("create");
        let data: Vec<u8> = (0..2u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        fs.write(f.ino, 0, &data).expect("write");
        drop(fs);
        p.sync().expect("sync");
        p.dsl_pool()
            .destroy_dataset("t/big", false)
            .expect("destroy");
        p.sync().expect("sync");
        let left = p.dsl_pool().freeing();
        p.dsl_pool().wait_freed().expect("wait");
        left
    }

    #[test]
    fn frees_stay_queued_only_where_async_destroy_is_enabled() {
        assert!(left_after_destroy(true) > 0, "the budget did not hold");
        assert_eq!(
            left_after_destroy(false),
            0,
            "queued on a pool without the feature"
        );
    }
}
