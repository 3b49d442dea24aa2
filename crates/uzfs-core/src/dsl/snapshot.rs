//! Snapshots: a dataset's object set as a txg left it, kept while the
//! dataset moves on (OpenZFS `dsl_dataset.c`, `dsl_deadlist.c`,
//! `dsl_destroy.c`).
//!
//! # Theory of operation
//!
//! * **Taking one.** A snapshot is the dataset's object-set block pointer
//!   as the txg that takes it left it, stored in a MOS object of its own
//!   (`SnapPhys::id`, 128 bytes, like a dataset's). Nothing is copied: the
//!   snapshot shares every block with the dataset until the dataset lets
//!   go of it. `zfs snapshot` queues a task (`Dsl::tasks`) and waits for a
//!   sync; the sync takes the tasks queued before it froze its txg and
//!   carries them out after the datasets' own writes of that txg, so a
//!   snapshot holds every write that returned before the command, and
//!   every snapshot of one command (`-r`) lands in the same txg.
//!
//! * **Birth times decide frees.** Every block pointer carries the txg the
//!   block was born in. When a dataset lets go of a block (an overwrite, a
//!   truncate, an unlink), one born after the dataset's latest snapshot
//!   (`DsPhys::prev_snap_txg`) belongs to nothing else and is freed; an
//!   older one is still held by that snapshot and goes to the dataset's
//!   *dead list* instead (`SyncWriter::dead`, one check per free).
//!
//! * **Dead lists.** When a snapshot is taken, the dataset's dead list
//!   becomes the snapshot's (the blocks its previous snapshot held that
//!   died before it) and the dataset starts an empty one. So every block a
//!   snapshot holds and the dataset no longer does is in exactly one dead
//!   list of that dataset's line, and `usedbysnapshots` is the sum of their
//!   sizes, kept in each record (`dead_bytes`) without a walk.
//!
//! * **Destroying snapshot S**, with P the snapshot before it (or none) and
//!   N the one after it (or the dataset itself): a block only S held was
//!   born after P and died before N, which are exactly the entries of N's
//!   dead list born after P. Each list is split by birth-time key
//!   (`deadlist.rs`), so those are N's sub-lists keyed P's txg or later:
//!   they go to the free queue whole, and S's sub-lists (blocks P holds
//!   that died before S, so before N too) join N's. The cost is the
//!   number of sub-lists, never the number of blocks nor the size of the
//!   dataset, and the same headers give a snapshot's `used` (what
//!   destroying it would free) and `written`.
//!
//! * **Clones.** A clone is a new dataset whose object set starts as a
//!   snapshot's (under an object-set block of its own). Every block born
//!   at or before the origin's txg is the origin's: the clone's
//!   `prev_snap_txg` starts there, so such a block the clone lets go of
//!   goes to the clone's dead list (kept for `promote`) and is never
//!   freed by the clone, while what the clone writes is its own. The
//!   clone's `used` is what it references less what it still shares with
//!   the origin (the origin's referenced bytes less the origin's blocks in
//!   the clone's dead lists, `DsPhys::origin_dead`); destroying it frees
//!   its blocks born after the origin (one walk that skips older
//!   subtrees). The origin cannot be destroyed while it has clones. A
//!   clone never lists its origin's object-set block (the origin's line
//!   does, once its dataset lets go of it).
//!
//! * **Promote** moves the origin and the snapshots before it to the
//!   clone and makes their old dataset a clone of the origin. No dead
//!   list is rewritten but one: every list keeps describing the same
//!   history in its new line (the clone's list after the origin holds the
//!   origin's blocks the clone let go of, which is what the origin's next
//!   list must hold), and the origin's object-set block moves from the old
//!   line's next list to the new one's. `origin_dead` is recounted.
//!
//! * **On disk** (docs/ON_DISK_FORMAT.md, "Snapshots"): each snapshot's
//!   `SnapPhys` in the DSL record; a dead list is a header of sub-lists by
//!   key, each a MOS object of block pointers appended by each sync
//!   (`deadlist.rs`). Feature `com.uzfs:snapshots`, active from
//!   the first snapshot on: a build that does not know it would free blocks
//!   a snapshot still holds.

use super::deadlist::{Born, DlSync, SubList};
use super::DslPool;
use super::{rlock, wlock, Dataset};
use crate::dmu::blkptr::BlkPtr;
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{BlockReader, BlockWriter, Objset, TxgDirty};
use crate::error::{Error, Result};
use crate::spa::{lock, Pool};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One snapshot's record in the DSL directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapPhys {
    /// MOS object holding its object-set pointer; also its id.
    pub id: u64,
    /// The dataset it is a snapshot of.
    pub ds: u64,
    /// The part after '@'.
    pub name: String,
    /// The txg that took it (`createtxg`).
    pub txg: u64,
    /// Seconds since the epoch.
    pub creation: u64,
    pub guid: u64,
    /// MOS object of its dead list (0: empty).
    pub deadlist: u64,
    /// Bytes (as charged to `used`) in its dead list.
    pub dead_bytes: u64,
    /// The dataset's `used` and `logicalused` of its own blocks then.
    pub referenced: u64,
    pub logical: u64,
    /// User holds (`zfs hold`): tag -> seconds since the epoch. A held
    /// snapshot is not destroyed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holds: BTreeMap<String, u64>,
    /// `zfs destroy -d` of a held or cloned snapshot: destroyed when the
    /// last hold is released or the last clone destroyed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defer_destroy: bool,
    /// User properties set on the snapshot (`module:name` -> value); the
    /// others it inherits from its dataset.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub props: BTreeMap<String, String>,
}

/// A snapshot in memory.
pub struct Snapshot {
    pub phys: super::Record<SnapPhys>,
    /// Its object set's block pointer (never changes).
    pub root: BlkPtr,
}

impl Snapshot {
    pub fn phys(&self) -> SnapPhys {
        self.phys.read().clone()
    }

    /// Whether `b` is this snapshot's object-set block.
    pub fn is_root(&self, b: &BlkPtr) -> bool {
        b.dva[0] == self.root.dva[0] && b.birth == self.root.birth
    }
}

/// Each dataset's snapshots, oldest first, and every snapshot by dataset
/// and name and by its place in its line (`DslPool::snap_index`).
#[derive(Default)]
pub struct SnapIndex {
    /// The generation it was built at (`Dsl::snap_gen`).
    built: Option<u64>,
    by_ds: HashMap<u64, Vec<Arc<Snapshot>>>,
    by_name: HashMap<(u64, String), Arc<Snapshot>>,
    pos: HashMap<u64, usize>,
}

impl SnapIndex {
    /// The places of dataset `ds`'s snapshots from `at` on, after one
    /// came or went there.
    fn renumber(&mut self, ds: u64, at: usize) {
        let Some(line) = self.by_ds.get(&ds) else {
            return;
        };
        for (i, x) in line.iter().enumerate().skip(at) {
            self.pos.insert(x.phys.read().id, i);
        }
    }
}

/// A change the next sync carries out (`Dsl::tasks`).
pub enum SnapTask {
    Create {
        task: u64,
        ds: u64,
        name: String,
        /// User properties it is born with (`zfs snapshot -o`).
        props: BTreeMap<String, String>,
    },
    Destroy {
        task: u64,
        snap: u64,
    },
    /// Dataset `ds` became its latest snapshot again (`DslPool::rollback`):
    /// its dead list keeps only what this txg added.
    Rollback {
        task: u64,
        ds: u64,
    },
    /// `DslPool::promote` moved snapshot `snap` (and those before it) from
    /// dataset `from` to its clone: the snapshot's object-set block moves
    /// from `from`'s dead lists to the one after it in its new line.
    Promote {
        task: u64,
        snap: u64,
        from: u64,
    },
}

/// What the datasets' pass of a sync leaves for the snapshot work.
#[derive(Default)]
pub(crate) struct SnapSync {
    pub tasks: Vec<SnapTask>,
    /// Each dataset's object-set pointer as this txg leaves it.
    pub roots: BTreeMap<u64, BlkPtr>,
    /// Blocks each dead list (by object) gained in this txg, with their
    /// keys (`deadlist.rs`).
    pub appends: BTreeMap<u64, Vec<(u64, BlkPtr)>>,
}

impl SnapSync {
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.appends.is_empty()
    }
}

/// What [`DslPool::neighbours`] finds around a snapshot.
struct Neighbours {
    prev_txg: u64,
    next: Option<Arc<Snapshot>>,
    head: Option<Arc<Dataset>>,
    next_dl: u64,
}

/// A hold's tag: 1-255 bytes, no NUL (OpenZFS allows any other).
fn check_tag(tag: &str) -> Result<()> {
    if tag.is_empty() || tag.len() > 255 || tag.contains('\0') {
        return Err(Error::invalid(format!(
            "invalid tag '{tag}': 1 to 255 bytes, no NUL"
        )));
    }
    Ok(())
}

/// Split `name` ("pool/ds@snap") into the dataset's name and the
/// snapshot's, checking the latter (zfs(8): the same characters as a
/// dataset name component).
pub fn split_name(name: &str) -> Result<(&str, &str)> {
    let (ds, snap) = name
        .split_once('@')
        .ok_or_else(|| Error::invalid(format!("'{name}' is not a snapshot name (DATASET@NAME)")))?;
    if snap.contains('@') || snap.contains('/') {
        return Err(Error::invalid(format!(
            "invalid snapshot name '{name}': one '@', no '/' after it"
        )));
    }
    super::check_component(snap).map_err(|_| {
        Error::invalid(format!(
            "invalid snapshot name '{name}': letters, digits and _-.: only"
        ))
    })?;
    Ok((ds, snap))
}

impl DslPool<'_> {
    /// A clone's origin snapshot.
    pub fn origin_snap(&self, d: &Dataset) -> Option<Arc<Snapshot>> {
        let origin = d.phys.read().origin;
        rlock(&self.dsl().snaps).get(&origin).cloned()
    }

    /// The txg of dataset `ds`'s origin (0: not a clone, or no dataset).
    fn origin_txg(&self, ds: u64) -> u64 {
        rlock(&self.dsl().list)
            .get(&ds)
            .and_then(|h| self.origin_snap(h))
            .map_or(0, |o| o.phys.read().txg)
    }

    /// A clone's origin snapshot, with its full name.
    pub fn origin_of(&self, d: &Dataset) -> Option<(String, Arc<Snapshot>)> {
        let s = self.origin_snap(d)?;
        let sp = s.phys();
        let ds = rlock(&self.dsl().list).get(&sp.ds).cloned()?;
        Some((format!("{}@{}", self.ds_name(&ds.rel()), sp.name), s))
    }

    /// The clones of snapshot `id`, by name.
    pub fn clones_of(&self, id: u64) -> Vec<Arc<Dataset>> {
        let mut v: Vec<Arc<Dataset>> = self
            .datasets()
            .into_iter()
            .filter(|d| d.phys.read().origin == id)
            .collect();
        v.sort_by_key(|d| d.rel());
        v
    }

    /// `zfs clone SNAP NAME`: a new filesystem sharing every block with
    /// the snapshot, in one txg (`parents`: `-p`, create missing parents;
    /// `props`: `-o`). Returns once that txg is on disk.
    pub fn clone_snapshot(
        &self,
        snap: &str,
        name: &str,
        props: &[(String, String)],
        parents: bool,
    ) -> Result<()> {
        let (_, s) = self.snapshot(snap)?;
        let (src_pool, _) = split_name(snap)?;
        if src_pool.split('/').next() != name.split('/').next() {
            return Err(Error::invalid(
                "source and target pools differ (a clone lives in its origin's pool)",
            ));
        }
        let sp = s.phys();
        self.create_dataset_from(name, props, parents, Some((sp.id, sp.guid)))?;
        self.spa.sync()?;
        Ok(())
    }

    /// The snapshot index, rebuilt if a snapshot came, went, moved or was
    /// renamed since it was built. The generation is read before the
    /// list, and changes bump it after changing the list, so an index
    /// built beside a change is rebuilt on the next use.
    fn snap_index(&self) -> std::sync::MutexGuard<'_, SnapIndex> {
        let mut ix = lock(&self.dsl().snap_index);
        let gen = self.dsl().snap_gen.load(Ordering::Acquire);
        if ix.built != Some(gen) {
            *ix = SnapIndex {
                built: Some(gen),
                ..Default::default()
            };
            for s in rlock(&self.dsl().snaps).values() {
                let p = s.phys.read();
                ix.by_ds.entry(p.ds).or_default().push(s.clone());
                ix.by_name.insert((p.ds, p.name.clone()), s.clone());
            }
            let lines: Vec<u64> = ix.by_ds.keys().copied().collect();
            for ds in lines {
                if let Some(line) = ix.by_ds.get_mut(&ds) {
                    line.sort_by_key(|s| s.phys.read().txg);
                }
                ix.renumber(ds, 0);
            }
        }
        ix
    }

    /// A snapshot is taken: into the list, and into the index in place
    /// if the index is current (both under the index's lock, so no reader
    /// sees one without the other).
    fn snap_add(&self, s: Arc<Snapshot>) {
        let mut ix = lock(&self.dsl().snap_index);
        let p = s.phys();
        wlock(&self.dsl().snaps).insert(p.id, s.clone());
        if !self.index_current(&ix) {
            return;
        }
        let line = ix.by_ds.entry(p.ds).or_default();
        let at = line.partition_point(|x| x.phys.read().txg <= p.txg);
        line.insert(at, s.clone());
        ix.renumber(p.ds, at);
        ix.by_name.insert((p.ds, p.name), s);
    }

    /// A snapshot is destroyed: out of the list and the index.
    fn snap_remove(&self, sp: &SnapPhys) {
        let mut ix = lock(&self.dsl().snap_index);
        wlock(&self.dsl().snaps).remove(&sp.id);
        if !self.index_current(&ix) {
            return;
        }
        let Some(line) = ix.by_ds.get_mut(&sp.ds) else {
            return;
        };
        let Some(at) = line.iter().position(|x| x.phys.read().id == sp.id) else {
            return;
        };
        line.remove(at);
        ix.pos.remove(&sp.id);
        ix.renumber(sp.ds, at);
        ix.by_name.remove(&(sp.ds, sp.name.clone()));
    }

    /// Whether the index was built at the current generation (a stale one
    /// is rebuilt whole on its next use, so changes skip it).
    fn index_current(&self, ix: &SnapIndex) -> bool {
        ix.built == Some(self.dsl().snap_gen.load(Ordering::Acquire))
    }

    /// Snapshots of dataset `ds` (by id), oldest first.
    pub fn snapshots_of(&self, ds: u64) -> Vec<Arc<Snapshot>> {
        self.snap_index()
            .by_ds
            .get(&ds)
            .cloned()
            .unwrap_or_default()
    }

    /// How many snapshots dataset `ds` has.
    pub fn snapshots_count(&self, ds: u64) -> usize {
        self.snap_index().by_ds.get(&ds).map_or(0, |v| v.len())
    }

    /// Every snapshot, as (full name, snapshot), by dataset name then txg.
    pub fn snapshots(&self) -> Vec<(String, Arc<Snapshot>)> {
        let mut out = Vec::new();
        for d in self.datasets() {
            let ds = self.ds_name(&d.rel());
            for s in self.snapshots_of(d.id()) {
                out.push((format!("{ds}@{}", s.phys.read().name), s));
            }
        }
        out
    }

    /// Dataset `ds`'s snapshot called `name` (the part after '@').
    fn snapshot_named(&self, ds: u64, name: &str) -> Option<Arc<Snapshot>> {
        self.snap_index()
            .by_name
            .get(&(ds, name.to_string()))
            .cloned()
    }

    /// Full names of the snapshots of `d`'s descendants (deepest first)
    /// and of `d`, each dataset's oldest first: what `zfs destroy -r d`
    /// takes with it.
    pub fn snapshot_names_under(&self, d: &Arc<Dataset>) -> Vec<String> {
        self.descendants(d)
            .iter()
            .chain(std::iter::once(d))
            .flat_map(|x| {
                let ds = self.ds_name(&x.rel());
                self.snapshots_of(x.id())
                    .into_iter()
                    .map(move |s| format!("{ds}@{}", s.phys.read().name))
            })
            .collect()
    }

    /// The snapshot called `name` ("pool/ds@snap") and its dataset.
    pub fn snapshot(&self, name: &str) -> Result<(Arc<Dataset>, Arc<Snapshot>)> {
        let (ds, snap) = split_name(name)?;
        let d = self.dataset(ds)?;
        let s = self
            .snapshot_named(d.id(), snap)
            .ok_or_else(|| Error::invalid(format!("snapshot '{name}' does not exist")))?;
        Ok((d, s))
    }

    /// Where snapshot `sp` sits in its dataset's line: the txg of the
    /// snapshot before it (0: none), the snapshot after it (none: the
    /// dataset is next), the dataset (none if it is gone), and the dead
    /// list of whichever is next (0: empty).
    fn neighbours(&self, sp: &SnapPhys) -> Neighbours {
        let (prev, next) = {
            let ix = self.snap_index();
            let chain = ix.by_ds.get(&sp.ds).map_or(&[][..], |v| v.as_slice());
            let at = ix
                .pos
                .get(&sp.id)
                .copied()
                .filter(|&i| chain.get(i).is_some_and(|x| x.phys.read().id == sp.id));
            let prev = at
                .and_then(|i| i.checked_sub(1))
                .map(|i| chain[i].phys.read().txg);
            (prev, at.and_then(|i| chain.get(i + 1)).cloned())
        };
        let head = rlock(&self.dsl().list).get(&sp.ds).cloned();
        // A clone's first snapshot follows its origin.
        let prev_txg = prev.unwrap_or_else(|| self.origin_txg(sp.ds));
        let next_dl = match (&next, &head) {
            (Some(n), _) => n.phys.read().deadlist,
            (None, Some(h)) => h.phys.read().deadlist,
            (None, None) => 0,
        };
        Neighbours {
            prev_txg,
            next,
            head,
            next_dl,
        }
    }

    /// A snapshot's object set, read-only (its contents as it was taken).
    pub fn snapshot_objset(&self, s: &Snapshot) -> Result<Arc<Objset>> {
        let reader: Arc<dyn BlockReader> = self.spa.io.clone();
        Ok(Arc::new(Objset::open(
            &s.root,
            reader,
            Default::default(),
            self.spa.open_txg(),
        )?))
    }

    /// `snapshot_count`: the snapshots of `d` and of every dataset below it.
    pub fn snapshot_count(&self, d: &Arc<Dataset>) -> u64 {
        std::iter::once(d.clone())
            .chain(self.descendants(d))
            .map(|x| self.snapshots_count(x.id()) as u64)
            .sum()
    }

    /// `snapshot_limit` on a dataset or any ancestor: what is there plus
    /// what `plan` adds below it must not pass it. (OpenZFS does not hold
    /// a user who may change the limit to it, root included; uzfs has no
    /// delegation, so it always holds: a documented departure.)
    fn check_snapshot_limits(&self, plan: &[(Arc<Dataset>, String)]) -> Result<()> {
        let mut limited: BTreeMap<u64, (Arc<Dataset>, u64)> = BTreeMap::new();
        for (d, _) in plan {
            for a in std::iter::once(d.clone()).chain(self.ancestors(d)) {
                if let Some(l) = self.size_prop(&a, "snapshot_limit") {
                    limited.insert(a.id(), (a, l));
                }
            }
        }
        for (a, limit) in limited.into_values() {
            let below: BTreeSet<u64> = std::iter::once(a.id())
                .chain(self.descendants(&a).iter().map(|x| x.id()))
                .collect();
            let adding = plan.iter().filter(|(x, _)| below.contains(&x.id())).count() as u64;
            let have = self.snapshot_count(&a);
            if have + adding > limit {
                return Err(Error::invalid(format!(
                    "cannot create snapshot: '{}' has snapshot_limit={limit} and {have} snapshots",
                    self.ds_name(&a.rel()),
                )));
            }
        }
        Ok(())
    }

    /// `zfs snapshot NAME...`: every snapshot in the same txg, or none
    /// (all names are checked first). Returns once that txg is on disk.
    pub fn create_snapshots(&self, names: &[String]) -> Result<()> {
        self.create_snapshots_with(names, &[])
    }

    /// `zfs snapshot -o module:name=value NAME...`: the snapshots and
    /// their user properties in the same txg.
    pub fn create_snapshots_with(
        &self,
        names: &[String],
        props: &[(String, String)],
    ) -> Result<()> {
        let props = props
            .iter()
            .map(|(k, v)| {
                let v = super::props::snapshot_prop(k, Some(v))?.unwrap_or_default();
                Ok((k.clone(), v))
            })
            .collect::<Result<BTreeMap<String, String>>>()?;
        if names.is_empty() {
            return Err(Error::invalid("no snapshot named"));
        }
        let ids = {
            let _g = self.spa.sync_guard()?;
            let mut seen = BTreeSet::new();
            let mut plan = Vec::new();
            for n in names {
                let (ds, snap) = split_name(n)?;
                let d = self.dataset(ds)?;
                if !seen.insert((d.id(), snap.to_string()))
                    || self.snapshot_named(d.id(), snap).is_some()
                {
                    return Err(Error::invalid(format!(
                        "cannot create snapshot '{n}': dataset already exists"
                    )));
                }
                plan.push((d, snap.to_string()));
            }
            self.check_snapshot_limits(&plan)?;
            let mut tasks = lock(&self.dsl().tasks);
            plan.into_iter()
                .map(|(d, name)| {
                    let ds = d.id();
                    let task = self.dsl().next_task.fetch_add(1, Ordering::Relaxed);
                    tasks.push(SnapTask::Create {
                        task,
                        ds,
                        name,
                        props: props.clone(),
                    });
                    task
                })
                .collect::<Vec<u64>>()
        };
        self.finish_tasks(&ids)
    }

    /// `zfs destroy DS@SNAP`: frees what only it held (see the module
    /// docs). Returns once the txg that did it is on disk.
    pub fn destroy_snapshot(&self, name: &str) -> Result<()> {
        self.spa.check_rw()?;
        self.ensure_free_queue()?;
        let task = {
            let _g = self.spa.sync_guard()?;
            let (_, s) = self.snapshot(name)?;
            if !s.phys.read().holds.is_empty() {
                return Err(Error::Busy(format!(
                    "cannot destroy snapshot {name}: dataset is busy (it has user holds: see 'zfs holds')"
                )));
            }
            let clones = self.clones_of(s.phys.read().id);
            if !clones.is_empty() {
                return Err(Error::Busy(format!(
                    "cannot destroy '{name}': snapshot has dependent clones\n\
                     use '-R' to destroy the following datasets:\n{}",
                    clones
                        .iter()
                        .map(|c| self.ds_name(&c.rel()))
                        .collect::<Vec<_>>()
                        .join("\n")
                )));
            }
            let task = self.dsl().next_task.fetch_add(1, Ordering::Relaxed);
            lock(&self.dsl().tasks).push(SnapTask::Destroy {
                task,
                snap: s.phys.read().id,
            });
            task
        };
        self.finish_tasks(&[task])
    }

    /// `zfs rollback DS@SNAP`: the dataset becomes snapshot SNAP again,
    /// in one txg, and what it wrote since is freed. SNAP must be its
    /// latest snapshot (`zfs rollback -r` destroys the later ones first).
    /// The dataset must not be mounted: its new head is a new object set
    /// (opened from the snapshot's block), and a mount holds the old one.
    /// Returns once the txg that did it is on disk.
    ///
    /// The old head's blocks born after SNAP are freed by one walk that
    /// skips every subtree born before it (`Objset::free_born_after`): work
    /// in proportion to what changed. Its dead list (blocks SNAP holds and
    /// the old head did not) is emptied without freeing: the new head
    /// holds them all again.
    pub fn rollback(&self, name: &str) -> Result<()> {
        self.spa.check_rw()?;
        self.ensure_free_queue()?;
        let later = |d: u64, txg: u64| -> Vec<String> {
            self.snapshots_of(d)
                .iter()
                .map(|s| s.phys())
                .filter(|p| p.txg > txg)
                .map(|p| p.name)
                .collect()
        };
        let (d, s) = self.snapshot(name)?;
        let sp = s.phys();
        let newer = later(d.id(), sp.txg);
        if !newer.is_empty() {
            let ds = self.ds_name(&d.rel());
            return Err(Error::invalid(format!(
                "cannot rollback to '{name}': more recent snapshots or bookmarks exist\n\
                 use '-r' to force deletion of the following snapshots and bookmarks:\n{}",
                newer
                    .iter()
                    .map(|n| format!("{ds}@{n}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )));
        }
        // The old head's changes land first: whatever it still has dirty
        // would otherwise be dropped with its object set, its space
        // still counted as dirty.
        self.spa.sync()?;
        let task = {
            let _g = self.spa.sync_guard()?;
            let id = d.id();
            let cur = rlock(&self.dsl().list).get(&id).cloned();
            if !cur.is_some_and(|c| Arc::ptr_eq(&c, &d))
                || self.live_snapshot(sp.id, sp.guid).is_none()
                || !later(id, sp.txg).is_empty()
            {
                return Err(Error::invalid(format!(
                    "cannot rollback to '{name}': the dataset or its snapshots changed meanwhile"
                )));
            }
            if !d.os.open_is_empty() {
                return Err(Error::invalid(format!(
                    "cannot rollback to '{name}': the dataset is still being written (unmount it first)"
                )));
            }
            let reader: Arc<dyn BlockReader> = self.spa.io.clone();
            let os = Arc::new(Objset::open(
                &s.root,
                reader,
                self.spa.mos.gate().clone(),
                self.spa.open_txg(),
            )?);
            os.rewrite_root();
            let mut phys = d.phys.read().clone();
            phys.dead_bytes = 0;
            phys.prev_snap_txg = sp.txg;
            let head = Arc::new(Dataset {
                phys: super::Record::new(phys),
                os: os.clone(),
                zil: Default::default(),
            });
            self.spa.attach_zil(&head)?;
            // The old head's log is void: its records are changes after
            // the snapshot (its blocks go back to the log class).
            if let Some(z) = d.zil.get() {
                z.close();
            }
            if lock(&self.spa.st).dir.root_dataset == id {
                self.spa.set_root(os);
            }
            let bytes = self.written_since(&d, &s)?;
            lock(&self.dsl().doomed).push((d.os.clone(), sp.txg, bytes));
            wlock(&self.dsl().list).insert(id, head);
            *lock(&self.dsl().dirty) = true;
            let task = self.dsl().next_task.fetch_add(1, Ordering::Relaxed);
            lock(&self.dsl().tasks).push(SnapTask::Rollback { task, ds: id });
            task
        };
        self.finish_tasks(&[task])
    }

    /// `zfs destroy -d`: destroy `name` now, or, while it is held or
    /// cloned, mark it to be destroyed when the last hold or clone goes.
    /// Returns whether it was destroyed now.
    pub fn destroy_snapshot_deferred(&self, name: &str) -> Result<bool> {
        {
            let _g = self.spa.sync_guard()?;
            let (_, s) = self.snapshot(name)?;
            let id = s.phys.read().id;
            if !s.phys.read().holds.is_empty() || !self.clones_of(id).is_empty() {
                s.phys.write().defer_destroy = true;
                *lock(&self.dsl().dirty) = true;
                drop(_g);
                self.spa.sync()?;
                return Ok(false);
            }
        }
        self.destroy_snapshot(name)?;
        Ok(true)
    }

    /// `zfs hold TAG SNAP...`: every snapshot gets the hold, or none does
    /// (a tag already on one refuses all). Committed before returning.
    pub fn hold(&self, tag: &str, names: &[String]) -> Result<()> {
        check_tag(tag)?;
        {
            let _g = self.spa.sync_guard()?;
            let mut found = Vec::new();
            for n in names {
                let (_, s) = self.snapshot(n)?;
                if s.phys.read().holds.contains_key(tag) {
                    return Err(Error::invalid(format!(
                        "cannot hold snapshot '{n}': tag already exists on this dataset"
                    )));
                }
                found.push(s);
            }
            let now = crate::spa::scan::now_secs();
            for s in found {
                s.phys.write().holds.insert(tag.to_string(), now);
            }
            *lock(&self.dsl().dirty) = true;
        }
        self.spa.sync()?;
        Ok(())
    }

    /// `zfs release TAG SNAP...`: the hold leaves every snapshot, or none
    /// (a snapshot without it refuses all). A snapshot marked by `destroy
    /// -d` goes with its last hold (and no clone). Committed before
    /// returning.
    pub fn release(&self, tag: &str, names: &[String]) -> Result<()> {
        let mut doomed = Vec::new();
        {
            let _g = self.spa.sync_guard()?;
            let mut found = Vec::new();
            for n in names {
                let (_, s) = self.snapshot(n)?;
                if !s.phys.read().holds.contains_key(tag) {
                    return Err(Error::invalid(format!(
                        "cannot release hold from snapshot '{n}': no such tag on this dataset"
                    )));
                }
                found.push((n.clone(), s));
            }
            for (n, s) in found {
                let mut p = s.phys.write();
                p.holds.remove(tag);
                if p.defer_destroy && p.holds.is_empty() && self.clones_of(p.id).is_empty() {
                    doomed.push(n);
                }
            }
            *lock(&self.dsl().dirty) = true;
        }
        self.spa.sync()?;
        for n in doomed {
            self.destroy_snapshot(&n)?;
        }
        Ok(())
    }

    /// After a clone is destroyed: its origin, if `destroy -d` marked it
    /// and nothing else keeps it, goes too.
    pub(crate) fn reap_deferred(&self, origin: u64) -> Result<()> {
        let Some(s) = rlock(&self.dsl().snaps).get(&origin).cloned() else {
            return Ok(());
        };
        let p = s.phys();
        if !p.defer_destroy || !p.holds.is_empty() || !self.clones_of(p.id).is_empty() {
            return Ok(());
        }
        let Some(d) = rlock(&self.dsl().list).get(&p.ds).cloned() else {
            return Ok(());
        };
        self.destroy_snapshot(&format!("{}@{}", self.ds_name(&d.rel()), p.name))
    }

    /// `zfs set module:name=value DS@SNAP` (`None`: `zfs inherit`): a user
    /// property of a snapshot; native properties of a snapshot are fixed.
    /// Committed before returning.
    pub fn set_snapshot_prop(&self, snap: &str, name: &str, value: Option<&str>) -> Result<()> {
        let v = super::props::snapshot_prop(name, value)?;
        {
            let _g = self.spa.sync_guard()?;
            let (_, s) = self.snapshot(snap)?;
            let mut p = s.phys.write();
            match v {
                Some(v) => p.props.insert(name.to_string(), v),
                None => p.props.remove(name),
            };
            *lock(&self.dsl().dirty) = true;
        }
        self.spa.sync()?;
        Ok(())
    }

    /// A user property of snapshot `s` of `d`: its own, or its dataset's.
    pub fn snapshot_user_prop(
        &self,
        d: &Arc<Dataset>,
        s: &Snapshot,
        name: &str,
    ) -> (String, super::Source) {
        if let Some(v) = s.phys.read().props.get(name) {
            return (v.clone(), super::Source::Local);
        }
        match self.user_prop(d, name) {
            (v, super::Source::Local) => (v, super::Source::Inherited(self.ds_name(&d.rel()))),
            x => x,
        }
    }

    /// `zfs rename DS@OLD DS@NEW`: the snapshot's name only (its data,
    /// guid and clones stay). Committed before returning.
    pub fn rename_snapshot(&self, from: &str, to: &str) -> Result<()> {
        let (fds, _) = split_name(from)?;
        let (tds, new) = split_name(to)?;
        if fds != tds {
            return Err(Error::invalid(format!(
                "cannot rename to '{to}': snapshots must be part of same dataset"
            )));
        }
        {
            let _g = self.spa.sync_guard()?;
            let (d, s) = self.snapshot(from)?;
            if self.snapshot_named(d.id(), new).is_some() {
                return Err(Error::invalid(format!(
                    "cannot rename to '{to}': dataset already exists"
                )));
            }
            s.phys.write().name = new.to_string();
            self.dsl().snaps_changed();
            *lock(&self.dsl().dirty) = true;
        }
        self.spa.sync()?;
        Ok(())
    }

    /// `zfs promote CLONE`: the clone takes over its origin snapshot and
    /// every snapshot before it in the origin's dataset, and that dataset
    /// becomes a clone of the origin (which now belongs to CLONE), in one
    /// txg. Space moves with the snapshots: what they hold is charged to
    /// CLONE from then on. Returns once committed.
    ///
    /// Dead lists stay as they are: the lists of the snapshots that move
    /// describe the same history in their new line, the clone's next list
    /// after the origin holds exactly the origin's blocks the clone let go
    /// of, and the old dataset's next list now holds its origin's blocks.
    /// Only the origin's object-set block moves from one line's lists to
    /// the other's (`SnapTask::Promote`), and each dataset's `origin_dead`
    /// is recounted from its line's lists.
    pub fn promote(&self, clone: &str) -> Result<()> {
        self.spa.sync()?;
        let task = {
            let _g = self.spa.sync_guard()?;
            let c = self.dataset(clone)?;
            let Some((oname, s)) = self.origin_of(&c) else {
                return Err(Error::invalid(format!(
                    "cannot promote '{clone}': not a cloned filesystem"
                )));
            };
            let sp = s.phys();
            let o = rlock(&self.dsl().list)
                .get(&sp.ds)
                .cloned()
                .ok_or_else(|| Error::invalid(format!("{oname}: its dataset is gone")))?;
            let moving: Vec<Arc<Snapshot>> = self
                .snapshots_of(o.id())
                .into_iter()
                .filter(|x| x.phys.read().txg <= sp.txg)
                .collect();
            for m in &moving {
                let n = m.phys().name;
                if self.snapshot_named(c.id(), &n).is_some() {
                    return Err(Error::invalid(format!(
                        "cannot promote '{clone}': snapshot name '@{n}' conflicts with one of its own"
                    )));
                }
            }
            // The moved snapshots change place in a scan's walk order.
            let root = lock(&self.spa.st).dir.root_dataset;
            let key = |id: u64| if id == root { 1 } else { id };
            self.spa.scan_rewind(key(o.id()).min(key(c.id())))?;
            let grand = o.phys.read().origin;
            for m in &moving {
                m.phys.write().ds = c.id();
            }
            self.dsl().snaps_changed();
            c.phys.write().origin = grand;
            o.phys.write().origin = sp.id;
            // Recount what each line holds of its (new) origin.
            let grand_txg = rlock(&self.dsl().snaps)
                .get(&grand)
                .map_or(0, |g| g.phys.read().txg);
            // (Object-set blocks count too: the origin's own is in the old
            // line's list until the promote task moves it out.)
            let c_dead = match grand {
                0 => 0,
                _ => self.dead_bytes(&self.line_lists(&c, 0), Born::By(grand_txg), true)?,
            };
            let o_dead = self.dead_bytes(&self.line_lists(&o, 0), Born::By(sp.txg), true)?;
            c.phys.write().origin_dead = c_dead;
            o.phys.write().origin_dead = o_dead;
            *lock(&self.dsl().dirty) = true;
            let task = self.dsl().next_task.fetch_add(1, Ordering::Relaxed);
            lock(&self.dsl().tasks).push(SnapTask::Promote {
                task,
                snap: sp.id,
                from: o.id(),
            });
            task
        };
        self.finish_tasks(&[task])
    }

    /// `written@S` of dataset `d`: the bytes `d` references that were
    /// written after snapshot `s` (one of its line, or its origin). What
    /// it references, less what `s` referenced, plus what of `s`'s blocks
    /// it no longer references: the entries born by `s`'s txg in the dead
    /// lists after `s` in `d`'s line (object-set blocks left out: they
    /// are in no `referenced`). Reads those lists; walks no tree.
    pub fn written_since(&self, d: &Dataset, s: &Snapshot) -> Result<u64> {
        let sp = s.phys();
        let killed = self.dead_bytes(&self.line_lists(d, sp.txg), Born::By(sp.txg), false)?;
        Ok((d.os.space().used + killed).saturating_sub(sp.referenced))
    }

    /// `written` of snapshot `s`: the bytes written between the snapshot
    /// before it (or the dataset's origin) and it; all it references if it
    /// is the first of a dataset that is not a clone.
    pub fn snapshot_written(&self, s: &Snapshot) -> Result<u64> {
        let sp = s.phys();
        let chain = self.snapshots_of(sp.ds);
        let at = chain.iter().position(|x| x.phys.read().id == sp.id);
        let prev = match at.and_then(|i| i.checked_sub(1)) {
            Some(i) => Some(chain[i].clone()),
            None => rlock(&self.dsl().list)
                .get(&sp.ds)
                .and_then(|d| self.origin_snap(d)),
        };
        let Some(prev) = prev else {
            return Ok(sp.referenced);
        };
        let pp = prev.phys();
        let killed = self.dead_bytes(&[sp.deadlist], Born::By(pp.txg), false)?;
        Ok((sp.referenced + killed).saturating_sub(pp.referenced))
    }

    /// The dead lists of `d`'s line after `txg`: its snapshots' taken
    /// after it, then its own.
    fn line_lists(&self, d: &Dataset, txg: u64) -> Vec<u64> {
        let mut lists: Vec<u64> = self
            .snapshots_of(d.id())
            .iter()
            .map(|x| x.phys())
            .filter(|x| x.txg > txg)
            .map(|x| x.deadlist)
            .collect();
        lists.push(d.phys.read().deadlist);
        lists
    }

    /// Sync until the tasks are carried out; their errors, if any.
    fn finish_tasks(&self, ids: &[u64]) -> Result<()> {
        self.spa.sync()?;
        let mut errs = lock(&self.dsl().task_errors);
        let mine: Vec<String> = ids.iter().filter_map(|i| errs.remove(i)).collect();
        if mine.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(mine.join("; ")))
        }
    }

    /// What destroying `s` would free: the entries of the next dead list
    /// (the next snapshot's, or the dataset's) born after the previous
    /// snapshot. Reads that list's header.
    pub fn snapshot_unique(&self, s: &Snapshot) -> Result<u64> {
        let n = self.neighbours(&s.phys());
        self.dead_bytes(&[n.next_dl], Born::After(n.prev_txg), true)
    }

    /// What destroying the snapshots of dataset `ds` named in `names`
    /// together would free: for each run of consecutive ones (P before
    /// the run, N after it or the dataset), the entries born after P of
    /// the dead lists from the run's second snapshot through N's, which is
    /// what `snapshot_unique` gives for a run of one.
    pub fn snapshots_wouldfree(&self, ds: u64, names: &BTreeSet<String>) -> Result<u64> {
        let chain = self.snapshots_of(ds);
        let head_dl = rlock(&self.dsl().list)
            .get(&ds)
            .map_or(0, |h| h.phys.read().deadlist);
        let origin_txg = self.origin_txg(ds);
        let mut total = 0;
        let mut i = 0;
        while i < chain.len() {
            if !names.contains(&chain[i].phys().name) {
                i += 1;
                continue;
            }
            let start = i;
            while i < chain.len() && names.contains(&chain[i].phys().name) {
                i += 1;
            }
            let prev = match start.checked_sub(1) {
                Some(p) => chain[p].phys().txg,
                None => origin_txg,
            };
            let mut lists: Vec<u64> = chain[start + 1..i]
                .iter()
                .map(|s| s.phys().deadlist)
                .collect();
            lists.push(chain.get(i).map_or(head_dl, |n| n.phys().deadlist));
            total += self.dead_bytes(&lists, Born::After(prev), true)?;
        }
        Ok(total)
    }

    /// Sync context, after every dataset's pass: carry out the snapshot
    /// tasks and write the dead lists' changes into `extra`. A task that
    /// cannot be carried out (its dataset or snapshot went away, a name
    /// taken meanwhile) is recorded in `Dsl::task_errors`. A destroy
    /// frees this txg's entries within `budget`; returns what it leaves
    /// to free: entries past the budget, and whole sub-lists (both queued
    /// by the caller, `async_destroy.rs`).
    pub(crate) fn sync_snapshots(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        txg: u64,
        mut ss: SnapSync,
        budget: &mut crate::dsl::async_destroy::Budget,
    ) -> Result<(Vec<BlkPtr>, Vec<SubList>)> {
        let mut spill = Vec::new();
        let mut sublists = Vec::new();
        let mut dls = DlSync::new(&self.spa.mos, extra);
        if !self.dsl().deadlists_keyed.load(Ordering::Relaxed) {
            for (old, new) in self.convert_flat_deadlists(&mut dls)? {
                if let Some(v) = ss.appends.remove(&old) {
                    ss.appends.insert(new, v);
                }
            }
            self.dsl().deadlists_keyed.store(true, Ordering::Relaxed);
        }
        if ss.is_empty() && dls.is_empty() {
            return Ok((spill, sublists));
        }
        for (obj, bps) in std::mem::take(&mut ss.appends) {
            for (key, bp) in bps {
                dls.append(obj, key, bp)?;
            }
        }
        let fail = |task: u64, why: String| {
            lock(&self.dsl().task_errors).insert(task, why);
        };
        for t in ss.tasks {
            match t {
                SnapTask::Create {
                    task,
                    ds,
                    name,
                    props,
                } => {
                    let Some(d) = rlock(&self.dsl().list).get(&ds).cloned() else {
                        fail(
                            task,
                            format!("cannot create snapshot '@{name}': its dataset was destroyed"),
                        );
                        continue;
                    };
                    let full = format!("{}@{name}", self.ds_name(&d.rel()));
                    if self.snapshot_named(ds, &name).is_some() {
                        fail(
                            task,
                            format!("cannot create snapshot '{full}': dataset already exists"),
                        );
                        continue;
                    }
                    let root = ss.roots.get(&ds).copied().unwrap_or_else(|| d.os.root_bp());
                    let id = self.spa.mos.create_in_sync(
                        dls.extra(),
                        ot::DSL_DATASET,
                        512,
                        &ObjProps::METADATA,
                    )?;
                    self.spa
                        .mos
                        .write_in_sync(dls.extra(), id, 0, &root.to_bytes())?;
                    let new_dl = dls.create()?;
                    let space = d.os.synced_space();
                    let mut p = d.phys.write();
                    let snap = SnapPhys {
                        id,
                        ds,
                        name,
                        txg,
                        creation: crate::spa::scan::now_secs(),
                        guid: crate::spa::os_entropy(),
                        deadlist: p.deadlist,
                        dead_bytes: p.dead_bytes,
                        referenced: space.used,
                        logical: space.logical,
                        props,
                        ..Default::default()
                    };
                    p.deadlist = new_dl;
                    p.dead_bytes = 0;
                    p.prev_snap_txg = txg;
                    drop(p);
                    w.note_feature(crate::spa::feature::SNAPSHOTS);
                    self.snap_add(Arc::new(Snapshot {
                        phys: super::Record::new(snap),
                        root,
                    }));
                    log::info!(
                        "pool '{}': snapshot '{full}' taken in txg {txg}",
                        self.spa.name
                    );
                }
                SnapTask::Destroy { task, snap } => {
                    let Some(s) = rlock(&self.dsl().snaps).get(&snap).cloned() else {
                        fail(task, "snapshot already destroyed".to_string());
                        continue;
                    };
                    let sp = s.phys();
                    let Neighbours {
                        prev_txg,
                        next,
                        head,
                        next_dl,
                    } = self.neighbours(&sp);
                    // What only S held: N's entries born after P, whole
                    // sub-lists (queued) and this txg's (freed now, within
                    // the budget). Then S's list joins N's.
                    let (subs, entries) = dls.take_from(next_dl, prev_txg)?;
                    let mut freed: u64 = subs.iter().map(|s| s.bytes).sum();
                    for bp in entries {
                        freed += w.dsize(&bp);
                        if budget.take() {
                            w.free_bp(&bp);
                        } else {
                            spill.push(bp);
                        }
                    }
                    sublists.extend(subs);
                    let n_obj = dls.merge(sp.deadlist, next_dl)?;
                    let set = |deadlist: &mut u64, dead_bytes: &mut u64| {
                        *deadlist = n_obj;
                        *dead_bytes = dead_bytes.saturating_sub(freed) + sp.dead_bytes;
                    };
                    match (&next, &head) {
                        (Some(n), _) => {
                            let mut np = n.phys.write();
                            let np = &mut *np;
                            set(&mut np.deadlist, &mut np.dead_bytes);
                        }
                        (None, Some(h)) => {
                            let mut hp = h.phys.write();
                            let hp = &mut *hp;
                            set(&mut hp.deadlist, &mut hp.dead_bytes);
                            hp.prev_snap_txg = prev_txg;
                        }
                        (None, None) => {}
                    }
                    dls.free_object(sp.id);
                    self.snap_remove(&sp);
                    log::info!(
                        "pool '{}': snapshot '{}@{}' destroyed in txg {txg}",
                        self.spa.name,
                        head.map_or_else(|| "?".to_string(), |h| self.ds_name(&h.rel())),
                        sp.name
                    );
                }
                SnapTask::Promote { task, snap, from } => {
                    let Some(s) = rlock(&self.dsl().snaps).get(&snap).cloned() else {
                        fail(task, "cannot promote: the origin was destroyed".to_string());
                        continue;
                    };
                    let sp = s.phys();
                    let dsize = w.dsize(&s.root);
                    // Out of the old line: the first dead list after the
                    // snapshot there (the next snapshot's, or the
                    // dataset's), if the old dataset let go of it yet.
                    let old_next = self
                        .snapshots_of(from)
                        .into_iter()
                        .find(|x| x.phys.read().txg > sp.txg);
                    let old_head = rlock(&self.dsl().list).get(&from).cloned();
                    let old_dl = match (&old_next, &old_head) {
                        (Some(n), _) => n.phys.read().deadlist,
                        (None, Some(h)) => h.phys.read().deadlist,
                        (None, None) => 0,
                    };
                    if dls.remove(old_dl, s.root.birth, |b| s.is_root(b))? {
                        match (&old_next, &old_head) {
                            (Some(n), _) => {
                                let mut np = n.phys.write();
                                np.dead_bytes = np.dead_bytes.saturating_sub(dsize);
                            }
                            (None, Some(h)) => {
                                let mut hp = h.phys.write();
                                hp.dead_bytes = hp.dead_bytes.saturating_sub(dsize);
                            }
                            (None, None) => {}
                        }
                        if let Some(h) = &old_head {
                            let mut hp = h.phys.write();
                            hp.origin_dead = hp.origin_dead.saturating_sub(dsize);
                        }
                    }
                    // Into the new line: the snapshot's next there holds it
                    // (its new line never let go of it: a clone never lists
                    // its origin's object-set block).
                    let n = self.neighbours(&sp);
                    let mut new_dl = n.next_dl;
                    if new_dl == 0 {
                        new_dl = dls.create()?;
                    }
                    let key = super::deadlist::key_for(&self.line_txgs(sp.ds), s.root.birth);
                    dls.append(new_dl, key, s.root)?;
                    match (&n.next, &n.head) {
                        (Some(x), _) => {
                            let mut xp = x.phys.write();
                            xp.deadlist = new_dl;
                            xp.dead_bytes += dsize;
                        }
                        (None, Some(h)) => {
                            let mut hp = h.phys.write();
                            hp.deadlist = new_dl;
                            hp.dead_bytes += dsize;
                        }
                        (None, None) => {}
                    }
                    log::info!(
                        "pool '{}': snapshots through '@{}' promoted in txg {txg}",
                        self.spa.name,
                        sp.name
                    );
                }
                SnapTask::Rollback { task, ds } => {
                    let Some(h) = rlock(&self.dsl().list).get(&ds).cloned() else {
                        fail(
                            task,
                            "cannot rollback: its dataset was destroyed".to_string(),
                        );
                        continue;
                    };
                    // What the list held, the head holds again (it is the
                    // snapshot's tree); this txg's entries are the new
                    // head's first kills (the snapshot's object-set block).
                    let dl = h.phys.read().deadlist;
                    // A clone's entries that were its origin's leave its
                    // charge with them.
                    if let Some(o) = self.origin_snap(&h) {
                        let gone = dls.bytes(dl, Born::By(o.phys().txg))?;
                        let mut hp = h.phys.write();
                        hp.origin_dead = hp.origin_dead.saturating_sub(gone);
                    }
                    dls.clear(dl)?;
                    log::info!(
                        "pool '{}': '{}' rolled back in txg {txg}",
                        self.spa.name,
                        self.ds_name(&h.rel())
                    );
                }
            }
        }
        dls.write(w)?;
        *lock(&self.dsl().dirty) = true;
        Ok((spill, sublists))
    }
}

/// What a snapshot's read-only filesystem asks of its pool: every change
/// is refused (EROFS), a commit has nothing to do.
pub struct SnapCtx {
    pub pool: Arc<Pool>,
    pub ds: Arc<Dataset>,
}

impl crate::zpl::DatasetCtx for SnapCtx {
    fn admit(&self, _bytes: u64) -> crate::zpl::fs::ZResult<()> {
        Err(libc::EROFS)
    }
    fn commit(&self, _obj: u64) -> crate::zpl::fs::ZResult<()> {
        Ok(())
    }
    fn props(&self) -> crate::zpl::ZplProps {
        let mut p = self.pool.dsl_pool().zpl_props(&self.ds);
        p.readonly = true;
        p
    }
    fn space(&self) -> (u64, u64) {
        let (_, used, _) = self.pool.dsl_pool().ds_space(&self.ds);
        (used, 0)
    }
    fn txg(&self) -> u64 {
        self.pool.open_txg()
    }
}

impl DslPool<'_> {
    /// A snapshot's files, read-only (`.zfs/snapshot/NAME`).
    pub fn mount_snapshot(&self, name: &str) -> Result<crate::zpl::Zpl> {
        let (d, s) = self.snapshot(name)?;
        self.mount_snapshot_of(&d, &s)
    }

    /// `zfs diff FROM [TO]`: what changed from snapshot FROM to TO (a
    /// later snapshot of the same dataset, or the dataset itself; `None`:
    /// the dataset). Syncs first when TO is the dataset, so every change
    /// that returned is seen. See `zpl/diff.rs`.
    pub fn diff(&self, from: &str, to: Option<&str>) -> Result<Vec<crate::zpl::diff::DiffEntry>> {
        let (d, a) = self.snapshot(from)?;
        let atxg = a.phys().txg;
        let old = self.mount_snapshot_of(&d, &a)?;
        let same = |other: &Dataset| -> Result<()> {
            if other.id() != d.id() {
                return Err(Error::invalid(format!(
                    "cannot diff '{from}' with '{}': not a snapshot of the same filesystem, or the filesystem",
                    to.unwrap_or("")
                )));
            }
            Ok(())
        };
        let (new, objects) = match to {
            Some(t) if t.contains('@') => {
                let (d2, b) = self.snapshot(t)?;
                same(&d2)?;
                if b.phys().txg < atxg {
                    return Err(Error::invalid(format!(
                        "cannot diff '{from}' with '{t}': '{t}' is the earlier snapshot"
                    )));
                }
                let os = self.snapshot_objset(&b)?;
                let objects = os.objects_changed_after(atxg)?;
                (self.mount_snapshot_of(&d, &b)?, objects)
            }
            _ => {
                if let Some(t) = to {
                    same(&*self.dataset(t)?)?;
                }
                self.spa.sync()?;
                let objects = d.os.objects_changed_after(atxg)?;
                let zpl = crate::zpl::Zpl::mount(
                    d.os.clone(),
                    Arc::new(SnapCtx {
                        pool: self.spa.arc()?,
                        ds: d.clone(),
                    }),
                )?;
                (zpl, objects)
            }
        };
        crate::zpl::diff::diff(&old, &new, &objects)
            .map_err(|e| Error::invalid(format!("cannot diff '{from}': errno {e}")))
    }

    /// Snapshot `s` of dataset `d`'s files, read-only.
    pub fn mount_snapshot_of(&self, d: &Arc<Dataset>, s: &Snapshot) -> Result<crate::zpl::Zpl> {
        let os = self.snapshot_objset(s)?;
        crate::zpl::Zpl::mount(
            os,
            Arc::new(SnapCtx {
                pool: self.spa.arc()?,
                ds: d.clone(),
            }),
        )
    }

    /// Snapshot `id`, if it still exists and is the one with `guid` (an
    /// id is an object number, which a later snapshot may reuse).
    pub fn live_snapshot(&self, id: u64, guid: u64) -> Option<Arc<Snapshot>> {
        rlock(&self.dsl().snaps)
            .get(&id)
            .filter(|s| s.phys.read().guid == guid)
            .cloned()
    }
}
