//! The dataset layer's part of a txg sync (OpenZFS `dsl_pool_sync`): the
//! SPA freezes the layer while it closes the txg, then syncs it through
//! one call, [`DslPool::sync`], and tells it when the txg
//! committed. Everything about datasets, snapshots, dead lists, background
//! frees and DSL records happens here; the SPA adds only its own objects
//! (config, space maps, history) to the MOS passes that follow.
//!
//! 1. [`DslPool::freeze`] (with writers quiesced, OpenZFS's quiesce):
//!    every dataset's open txg closes, and the destroyed datasets and
//!    snapshot tasks queued for this txg are taken.
//! 2. [`DslPool::sync`], in three steps:
//!    - pass 1, the data: each dataset's object set is written; what a
//!      dataset with snapshots lets go of that its latest snapshot still
//!      holds (born at or before it) is collected for its dead list
//!      instead of freed (`SyncWriter::dead`);
//!    - pass 1, the MOS: what open context changed in it (new objects,
//!      ZPL-created datasets' objects), as OpenZFS's `dsl_pool_sync_mos`;
//!    - the MOS changes of pass 2, which need the objects of pass 1: new
//!      object-set pointers into the datasets' MOS objects; destroyed
//!      sets queued and a budget of queued frees done
//!      (`async_destroy.rs`); snapshots taken and destroyed and dead lists
//!      grown (`snapshot.rs`); the free queue and the records that changed
//!      written (`records.rs`). They are handed back to the SPA, which
//!      adds its own and writes the MOS until nothing changes.
//! 3. [`DslPool::sync_done`]: the txg committed, the new trees go live.
//!
//! Why the MOS's first pass sits between the data and the layer's own
//! changes: a change made in sync context reads the synced MOS
//! (`Objset::write_in_sync`), where an object created in open context
//! this txg exists only once pass 1 wrote it.

use super::async_destroy::{Budget, FreeEntry};
use super::snapshot::SnapSync;
use super::Dataset;
use super::DslPool;
use crate::dmu::blkptr::BlkPtr;
use crate::dmu::objset::{Objset, TxgDirty};
use crate::error::Result;
use crate::spa::lock;
use crate::spa::txg::SyncWriter;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The dataset layer of one txg, frozen (step 1).
pub(crate) struct DslFrozen {
    /// Each dataset, its object-set pointer before, and its frozen changes.
    sets: Vec<(Arc<Dataset>, BlkPtr, Arc<TxgDirty>)>,
    doomed: Vec<(Arc<Objset>, u64, u64)>,
    snap: SnapSync,
}

/// The pool's features the layer's on-disk choices depend on (enabled or
/// active: a pool made before a feature existed does not list it).
#[derive(Clone, Copy)]
pub(crate) struct DslFeatures {
    /// `com.uzfs:dsl_records`: records in their own objects.
    pub records: bool,
    /// `com.uzfs:dsl_dirs`: directories apart from datasets, ZAPs of
    /// children and snapshots.
    pub dirs: bool,
    /// `com.delphix:async_destroy`: frees may stay queued across txgs.
    pub async_destroy: bool,
}

/// What the SPA hands the layer's sync: the MOS's open-context changes
/// and where the layer's own MOS objects are.
pub(crate) struct DslSyncArgs<'a> {
    pub mos_dirty: &'a TxgDirty,
    /// The free queue's object (`async_destroy.rs`).
    pub queue_obj: u64,
    /// The DSL index object (`records.rs`).
    pub dsl_obj: u64,
    pub features: DslFeatures,
}

/// What the layer's sync hands back (step 2 to 3).
pub(crate) struct DslSynced {
    /// The datasets this txg wrote (their new trees go live at its end).
    datasets: Vec<Arc<Dataset>>,
    /// The MOS root after its first pass.
    pub mos_bp: BlkPtr,
    /// The layer's MOS changes for pass 2 (the SPA adds its own).
    pub extra: TxgDirty,
    /// Dirty data bytes the datasets wrote, and how long that took (the
    /// sync's log line).
    pub data_bytes: u64,
    pub t_data: Duration,
}

/// What the data pass leaves for the layer's MOS changes.
struct DataSynced {
    datasets: Vec<Arc<Dataset>>,
    snap: SnapSync,
    doomed: Vec<(Arc<Objset>, u64, u64)>,
    /// Datasets whose object-set pointer changed.
    new_bps: Vec<(u64, BlkPtr)>,
    data_bytes: u64,
}

impl DslPool<'_> {
    /// Step 1. Every dataset's open txg closes at once (the list cannot
    /// change: dataset creation and destruction hold `sync_lock`).
    pub(crate) fn freeze(&self, txg: u64) -> DslFrozen {
        let sets = self
            .datasets()
            .into_iter()
            .map(|d| {
                let old = d.os.root_bp();
                let dirty = d.os.freeze(txg + 1);
                (d, old, dirty)
            })
            .collect();
        DslFrozen {
            sets,
            doomed: std::mem::take(&mut *lock(&self.dsl().doomed)),
            snap: SnapSync {
                tasks: std::mem::take(&mut *lock(&self.dsl().tasks)),
                ..Default::default()
            },
        }
    }

    /// Step 2, the layer's whole sync (OpenZFS `dsl_pool_sync`): the
    /// datasets, the MOS's first pass, and the layer's changes for the
    /// second (module comment).
    pub(crate) fn sync(
        &self,
        w: &mut SyncWriter<'_>,
        frozen: DslFrozen,
        args: DslSyncArgs<'_>,
    ) -> Result<DslSynced> {
        debug_assert_eq!(w.pass, 1);
        let t_start = Instant::now();
        let mut data = self.sync_datasets(w, frozen)?;
        let t_data = t_start.elapsed();
        let mos_bp = self.spa.mos.sync_pass(w, args.mos_dirty)?;
        w.pass = 2;
        let mut extra = TxgDirty::new(w.txg);
        self.sync_dsl_mos(w, &mut extra, &mut data, &args)?;
        Ok(DslSynced {
            datasets: data.datasets,
            mos_bp,
            extra,
            data_bytes: data.data_bytes,
            t_data,
        })
    }

    /// Pass 1: write every dataset's object set.
    fn sync_datasets(&self, w: &mut SyncWriter<'_>, frozen: DslFrozen) -> Result<DataSynced> {
        let DslFrozen {
            sets,
            doomed,
            mut snap,
        } = frozen;
        let mut new_bps = Vec::new();
        let mut data_bytes = 0;
        for (d, old, dirty) in &sets {
            let (snap_txg, deadlist) = {
                let p = d.phys.read();
                (p.prev_snap_txg, p.deadlist)
            };
            w.dead = (snap_txg > 0).then(|| (snap_txg, Vec::new()));
            let bp = d.os.sync_pass(w, dirty);
            let dead = w.dead.take();
            let bp = bp?;
            if let Some((_, mut dead)) = dead.filter(|(_, l)| !l.is_empty()) {
                // A clone: its origin's object-set block is the origin's
                // alone (never the clone's to list); the origin's other
                // blocks are listed but charged to the origin.
                let mut origin_dead = 0;
                if let Some(o) = self.origin_snap(d) {
                    let otxg = o.phys().txg;
                    dead.retain(|b| !o.is_root(b));
                    origin_dead = dead
                        .iter()
                        .filter(|b| b.birth <= otxg)
                        .map(|b| w.alloc.dsize(b))
                        .sum();
                }
                let bytes: u64 = dead.iter().map(|b| w.alloc.dsize(b)).sum();
                let mut p = d.phys.write();
                p.dead_bytes += bytes;
                p.origin_dead += origin_dead;
                drop(p);
                if !dead.is_empty() {
                    let line = self.line_txgs(d.id());
                    snap.appends.entry(deadlist).or_default().extend(
                        dead.into_iter()
                            .map(|b| (super::deadlist::key_for(&line, b.birth), b)),
                    );
                }
            }
            snap.roots.insert(d.id(), bp);
            data_bytes += dirty.bytes;
            if bp != *old {
                new_bps.push((d.id(), bp));
            }
        }
        Ok(DataSynced {
            datasets: sets.into_iter().map(|(d, _, _)| d).collect(),
            snap,
            doomed,
            new_bps,
            data_bytes,
        })
    }

    /// The layer's MOS changes, for the sync's second pass (`extra` is
    /// what it writes).
    fn sync_dsl_mos(
        &self,
        w: &mut SyncWriter<'_>,
        extra: &mut TxgDirty,
        s: &mut DataSynced,
        args: &DslSyncArgs<'_>,
    ) -> Result<()> {
        let features = args.features;
        let txg = w.txg;
        for (id, bp) in &s.new_bps {
            self.spa.mos.write_in_sync(extra, *id, 0, &bp.to_bytes())?;
        }
        // Destroyed sets queued and a budget of queued frees done, then
        // snapshots taken and destroyed, dead lists grown (frees past the
        // budget queued), then the records, which list the snapshots.
        // A pool without async_destroy enabled frees everything in the
        // destroy's txg: a build that does not know the queue would leak
        // what it held.
        let mut budget = match features.async_destroy {
            true => Budget {
                blocks: self.spa.tun.free_max_blocks.max(1),
                until: Some(Instant::now() + Duration::from_millis(self.spa.tun.free_max_ms)),
            },
            false => Budget::ALL,
        };
        let mut q = self.queue_doomed(std::mem::take(&mut s.doomed));
        self.free_queued(w, extra, &mut q, &mut budget)?;
        let (spill, sublists) =
            self.sync_snapshots(w, extra, txg, std::mem::take(&mut s.snap), &mut budget)?;
        self.queue_spill(w, extra, &mut q, spill)?;
        // Sub-lists a snapshot destroy let go of: freed from the queue,
        // within what is left of the budget.
        q.entries
            .extend(sublists.into_iter().map(|s| FreeEntry::Blocks {
                obj: s.obj,
                next: 0,
                count: s.count,
                bytes: s.bytes,
            }));
        self.free_queued(w, extra, &mut q, &mut budget)?;
        self.save_queue(w, extra, args.queue_obj, q)?;
        self.sync_dsl_records(w, extra, args.dsl_obj, features.records, features.dirs)
    }

    /// Step 3. The txg committed: each dataset's new tree goes live (the
    /// caller holds the gate shut).
    pub(crate) fn sync_done(&self, s: &DslSynced) {
        for d in &s.datasets {
            d.os.sync_done();
        }
    }
}
