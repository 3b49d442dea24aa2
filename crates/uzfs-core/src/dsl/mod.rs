//! The dataset layer: the tree of filesystems in a pool, their properties
//! and the space they use (OpenZFS dsl_dir / dsl_dataset / dsl_prop).
//!
//! # Theory of operation
//!
//! Every dataset is one object set. Its root block pointer lives in a MOS
//! object of its own (type `DSL_DATASET`: the pointer, then the dataset's
//! record), whose number is the dataset's id. Where it sits in the tree
//! (parent, local properties, children) is a DSL directory object of its
//! own, and ZAPs of children and snapshots tie them together; no record
//! holds a whole name, so a pool renamed at import renames them all
//! (`records.rs`, which also reads the two earlier layouts). A sync
//! rewrites only the records that changed.
//!
//! The layer is [`DslPool`] (OpenZFS's `dsl_pool_t`): its state ([`Dsl`],
//! kept in the pool) and the SPA beneath it, handed out by
//! `Pool::dsl_pool()`. Every operation on datasets and snapshots is a
//! method of it (this file, `snapshot.rs`, `async_destroy.rs`,
//! `deadlist.rs`, `records.rs`), and the SPA's txg sync calls it through
//! one entry (`sync.rs`, OpenZFS's `dsl_pool_sync`).
//!
//! Each txg syncs every dataset's object set and stores each new root
//! pointer in its MOS object, all in the same txg as everything else, so a
//! crash never separates a dataset from its record. A destroyed dataset
//! leaves the list at once; its blocks are freed by the next sync.
//!
//! Space: each object set carries `used` (allocated bytes beneath it) and
//! `logical` (uncompressed bytes) in its object-set block. A dataset's
//! `used` adds its descendants'; `available` is the pool's writable space
//! less other datasets' unused reservations, capped by every quota above.

pub mod async_destroy;
pub mod deadlist;
pub mod props;
pub mod records;
pub mod snapshot;
pub(crate) mod sync;

use crate::dmu::checksum::ChecksumType;
use crate::dmu::compress::Compression;
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{BlockReader, Objset, ObjsetSpace, OS_TYPE_DATASET};
use crate::error::{Error, Result};
use crate::spa::{lock, Pool};
use crate::zpl::{self, DatasetCtx, ZplProps};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

/// One dataset's record in the DSL directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsPhys {
    /// MOS object holding the object-set pointer.
    pub id: u64,
    /// Name below the pool ("" for the root dataset, "a/b" for POOL/a/b).
    pub rel: String,
    pub parent: u64,
    pub props: BTreeMap<String, String>,
    pub creation: u64,
    /// Txg of its latest snapshot (0: none): a block born after it is
    /// freed when the dataset lets go of it, an older one goes to the
    /// dead list (`dsl/snapshot.rs`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prev_snap_txg: u64,
    /// MOS object of its dead list (0: empty).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadlist: u64,
    /// Bytes (as charged to `used`) in its dead list.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dead_bytes: u64,
    /// A clone's origin snapshot (its id; 0: not a clone). The clone's
    /// object set began as that snapshot's: blocks born at or before the
    /// origin's txg are the origin's (`dsl/snapshot.rs`, "Clones").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin: u64,
    /// Bytes of the origin's blocks this clone's line let go of (in its
    /// dead lists, charged to the origin, not to the clone).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin_dead: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DslDirPhys {
    pub datasets: Vec<DsPhys>,
    /// Every snapshot of every dataset (`dsl/snapshot.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<snapshot::SnapPhys>,
}

/// A dataset's or snapshot's in-memory record, which remembers being
/// changed: every write guard marks it as it is dropped (while the lock is
/// still held), and the sync takes the mark ([`Record::take_changed`]), so
/// a txg re-derives only the on-disk records of what changed
/// (`records.rs`). A change made after the sync took the mark leaves it
/// set for the next sync, whichever value the sync read.
pub struct Record<T> {
    lock: RwLock<T>,
    changed: std::sync::atomic::AtomicBool,
}

impl<T> Record<T> {
    /// A new record is a changed one.
    pub fn new(v: T) -> Self {
        Record {
            lock: RwLock::new(v),
            changed: std::sync::atomic::AtomicBool::new(true),
        }
    }
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        rlock(&self.lock)
    }
    pub fn write(&self) -> RecordGuard<'_, T> {
        RecordGuard {
            guard: wlock(&self.lock),
            changed: &self.changed,
        }
    }
    /// Whether it changed since the last call.
    pub fn take_changed(&self) -> bool {
        // Most records of a sync did not change: read before writing.
        self.changed.load(std::sync::atomic::Ordering::Acquire)
            && self
                .changed
                .swap(false, std::sync::atomic::Ordering::AcqRel)
    }
}

/// A write guard of a [`Record`]: marks it changed when dropped.
pub struct RecordGuard<'a, T> {
    guard: std::sync::RwLockWriteGuard<'a, T>,
    changed: &'a std::sync::atomic::AtomicBool,
}

impl<T> std::ops::Deref for RecordGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for RecordGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for RecordGuard<'_, T> {
    fn drop(&mut self) {
        self.changed
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

pub struct Dataset {
    pub phys: Record<DsPhys>,
    pub os: Arc<Objset>,
    /// The intent log (`zil/`); none on a read-only import.
    pub zil: std::sync::OnceLock<Arc<crate::zil::Zil>>,
}

impl Dataset {
    pub fn id(&self) -> u64 {
        self.phys.read().id
    }
    pub fn rel(&self) -> String {
        self.phys.read().rel.clone()
    }
}

/// The dataset layer of one pool (OpenZFS `dsl_pool_t`), as the pool
/// hands it out ([`Pool::dsl_pool`]): the layer's state, kept in the pool,
/// and the SPA beneath it. Every operation on datasets and snapshots is a
/// method here, and reaches the SPA (the MOS, txgs, space, devices) only
/// through `spa`, as OpenZFS's layer does through `dp_spa`.
#[derive(Clone, Copy)]
pub struct DslPool<'p> {
    pub(crate) spa: &'p Pool,
}

impl<'p> DslPool<'p> {
    /// The layer's state (kept in the pool, beside the SPA's).
    fn dsl(&self) -> &'p Dsl {
        &self.spa.dsl
    }
}

/// The dataset layer's state (see [`DslPool`]).
#[derive(Default)]
pub struct Dsl {
    pub list: RwLock<BTreeMap<u64, Arc<Dataset>>>,
    /// The record changed: rewrite it in the next txg.
    pub dirty: Mutex<bool>,
    /// Object sets whose blocks the next sync queues for freeing, each
    /// with the txg its blocks must be born after to go (0: all) and the
    /// bytes it was charged: destroyed datasets, and heads rolled back to
    /// a snapshot of that txg.
    pub doomed: Mutex<Vec<(Arc<Objset>, u64, u64)>>,
    /// Frees in progress, as the last sync left them (`async_destroy.rs`).
    pub freeing: Mutex<async_destroy::FreeQueue>,
    /// The records as the last sync wrote them (`records.rs`).
    pub written: Mutex<records::Written>,
    /// Snapshots of every dataset, by id (`dsl/snapshot.rs`). A snapshot
    /// taken or destroyed goes through `DslPool::snap_add`/`snap_remove`,
    /// which keep the index; whoever else adds or removes one, or changes
    /// one's dataset or name, calls [`Dsl::snaps_changed`] after.
    pub snaps: RwLock<BTreeMap<u64, Arc<snapshot::Snapshot>>>,
    /// Bumped by [`Dsl::snaps_changed`]: the index below is stale.
    pub snap_gen: std::sync::atomic::AtomicU64,
    /// Each dataset's snapshots in order, and by name, built on first use
    /// after a change (`snapshot.rs`, `DslPool::snap_index`): listing a
    /// thousand snapshots looks each one's neighbours up, not the whole
    /// pool's list each time.
    pub snap_index: Mutex<snapshot::SnapIndex>,
    /// Snapshot creations and destructions for the next sync.
    pub tasks: Mutex<Vec<snapshot::SnapTask>>,
    /// Tasks the sync could not carry out, by task id, with why.
    pub task_errors: Mutex<BTreeMap<u64, String>>,
    pub next_task: std::sync::atomic::AtomicU64,
    /// Every dead list has keys (`deadlist.rs`): set by the first sync
    /// of an import, which converts the lists written before them.
    pub deadlists_keyed: std::sync::atomic::AtomicBool,
}

impl Dsl {
    /// A snapshot came or went, or changed dataset or name.
    pub fn snaps_changed(&self) {
        self.snap_gen
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Where a property's value came from (the SOURCE column of `zfs get`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Local,
    Default,
    Inherited(String),
    None,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Local => write!(f, "local"),
            Source::Default => write!(f, "default"),
            Source::Inherited(n) => write!(f, "inherited from {n}"),
            Source::None => write!(f, "-"),
        }
    }
}

/// Check a dataset name's components (zfs(8): alphanumerics and `_-.:`).
pub fn check_component(c: &str) -> Result<()> {
    if c.is_empty()
        || c.len() > 255
        || c == "."
        || c == ".."
        || !c
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "_-.: ".contains(ch))
        || c.contains(' ')
    {
        return Err(Error::invalid(format!(
            "invalid dataset name component '{c}'"
        )));
    }
    Ok(())
}

fn rlock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn wlock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl DslPool<'_> {
    /// Full name of a dataset.
    pub fn ds_name(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.spa.name.clone()
        } else {
            format!("{}/{rel}", self.spa.name)
        }
    }

    fn rel_of(&self, name: &str) -> Result<String> {
        let name = name.trim_end_matches('/');
        if name == self.spa.name {
            return Ok(String::new());
        }
        match name.strip_prefix(&format!("{}/", self.spa.name)) {
            Some(r) => {
                for c in r.split('/') {
                    check_component(c)?;
                }
                Ok(r.to_string())
            }
            None => Err(Error::invalid(format!(
                "dataset '{name}' is not in pool '{}'",
                self.spa.name
            ))),
        }
    }

    /// All datasets, root first then by name.
    pub fn datasets(&self) -> Vec<Arc<Dataset>> {
        let mut v: Vec<Arc<Dataset>> = rlock(&self.dsl().list).values().cloned().collect();
        v.sort_by_key(|d| d.rel());
        v
    }

    pub fn dataset(&self, name: &str) -> Result<Arc<Dataset>> {
        let rel = self.rel_of(name)?;
        self.datasets()
            .into_iter()
            .find(|d| d.rel() == rel)
            .ok_or_else(|| Error::invalid(format!("dataset '{name}' does not exist")))
    }

    fn parent_of(&self, d: &Arc<Dataset>) -> Option<Arc<Dataset>> {
        let p = d.phys.read().parent;
        if p == 0 {
            return None;
        }
        rlock(&self.dsl().list).get(&p).cloned()
    }

    /// `zfs create`: a new filesystem (and with `parents`, its missing
    /// ancestors). Properties are validated before anything changes.
    /// What `create_dataset` would create (the relative names, parents
    /// first) and the validated local properties of the last, without
    /// changing anything (`zfs create -n`): the same checks, in the same
    /// order.
    pub fn plan_create_dataset(
        &self,
        name: &str,
        props: &[(String, String)],
        parents: bool,
    ) -> Result<(Vec<String>, BTreeMap<String, String>)> {
        let rel = self.rel_of(name)?;
        if rel.is_empty() {
            return Err(Error::invalid(format!("dataset '{name}' already exists")));
        }
        let mut local = BTreeMap::new();
        for (k, v) in props {
            local.insert(k.clone(), validate_settable(k, v)?);
        }
        let parts: Vec<&str> = rel.split('/').collect();
        let mut plan = Vec::new();
        for i in 1..=parts.len() {
            let sub = parts[..i].join("/");
            let exists = self.datasets().iter().any(|d| d.rel() == sub);
            let last = i == parts.len();
            if exists {
                if last {
                    return Err(Error::invalid(format!(
                        "dataset '{}' already exists",
                        self.ds_name(&sub)
                    )));
                }
                continue;
            }
            if !last && !parents {
                return Err(Error::invalid(format!(
                    "parent '{}' does not exist (use -p to create it)",
                    self.ds_name(&sub)
                )));
            }
            plan.push(sub);
        }
        let reserve = ["reservation", "refreservation"]
            .iter()
            .filter_map(|p| local.get(*p).and_then(|v| v.parse::<u64>().ok()))
            .max();
        if let Some(r) = reserve {
            // The new dataset writes through its deepest existing ancestor.
            let deepest = self
                .datasets()
                .into_iter()
                .filter(|d| d.rel().is_empty() || rel.starts_with(&format!("{}/", d.rel())))
                .max_by_key(|d| d.rel().len());
            if let Some(a) = deepest {
                if r > self.ds_available(&a) {
                    return Err(reservation_too_big());
                }
            }
        }
        Ok((plan, local))
    }

    /// OpenZFS's rule for a new reservation (dsl_dir_set_reservation_check):
    /// what it adds beyond the space `d` uses already (or its old
    /// reservation) must be available to `d`. A reservation larger than
    /// the pool was accepted before and promised space that did not exist.
    /// A `refreservation` is measured against what `d` itself holds.
    fn check_reservation(&self, d: &Arc<Dataset>, prop: &str, new: u64) -> Result<()> {
        let used = match prop {
            "refreservation" => self.dataset_unique(d),
            _ => self.ds_space(d).1,
        };
        let held = used.max(self.size_prop(d, prop).unwrap_or(0));
        if new > held && new - held > self.ds_available(d) {
            return Err(reservation_too_big());
        }
        Ok(())
    }

    pub fn create_dataset(
        &self,
        name: &str,
        props: &[(String, String)],
        parents: bool,
    ) -> Result<()> {
        self.create_dataset_from(name, props, parents, None)
    }

    /// [`DslPool::create_dataset`]; `origin`: the last one is a clone of that
    /// snapshot (`zfs clone`), its object set the snapshot's.
    pub(crate) fn create_dataset_from(
        &self,
        name: &str,
        props: &[(String, String)],
        parents: bool,
        origin: Option<(u64, u64)>,
    ) -> Result<()> {
        let _g = self.spa.sync_guard()?;
        let origin = match origin {
            Some((id, guid)) => Some(
                self.live_snapshot(id, guid)
                    .ok_or_else(|| Error::invalid("its origin snapshot was destroyed meanwhile"))?,
            ),
            None => None,
        };
        let (plan, local) = self.plan_create_dataset(name, props, parents)?;
        let n = plan.len();
        for (i, sub) in plan.into_iter().enumerate() {
            let parent_rel = sub.rsplit_once('/').map_or("", |(p, _)| p).to_string();
            let parent = self
                .datasets()
                .into_iter()
                .find(|d| d.rel() == parent_rel)
                .ok_or_else(|| Error::invalid("parent vanished"))?;
            let last = i + 1 == n;
            let props = if last { local.clone() } else { BTreeMap::new() };
            let origin = origin.as_deref().filter(|_| last);
            self.add_dataset(&sub, parent.id(), props, origin)?;
        }
        Ok(())
    }

    fn add_dataset(
        &self,
        rel: &str,
        parent: u64,
        props: BTreeMap<String, String>,
        origin: Option<&snapshot::Snapshot>,
    ) -> Result<()> {
        let open = lock(&self.spa.txg).open;
        let id = self
            .spa
            .mos
            .create_object(ot::DSL_DATASET, 512, &ObjProps::METADATA)?;
        self.spa.mos.write(id, 0, &[0u8; 128])?;
        let reader: Arc<dyn BlockReader> = self.spa.io.clone();
        let mut phys = DsPhys {
            id,
            rel: rel.to_string(),
            parent,
            props,
            creation: crate::spa::scan::now_secs(),
            ..Default::default()
        };
        let os = match origin {
            None => {
                let os = Arc::new(Objset::create(
                    OS_TYPE_DATASET,
                    reader,
                    self.spa.mos.gate().clone(),
                    open,
                ));
                zpl::Zpl::format(&os, open, 0, 0, 0o755)?;
                os
            }
            // A clone: the snapshot's object set, under a block of its own
            // (and an empty log header); the origin's blocks it lets go of
            // go to its dead list from the start.
            Some(s) => {
                let sp = s.phys();
                let os = Arc::new(Objset::open(
                    &s.root,
                    reader,
                    self.spa.mos.gate().clone(),
                    open,
                )?);
                os.rewrite_root();
                phys.origin = sp.id;
                phys.prev_snap_txg = sp.txg;
                phys.deadlist = self.spa.mos.create_object(
                    ot::DEADLIST_MAP,
                    deadlist::DEADLIST_BLOCK,
                    &ObjProps::METADATA,
                )?;
                os
            }
        };
        let ds = Arc::new(Dataset {
            phys: Record::new(phys),
            os,
            zil: Default::default(),
        });
        self.spa.attach_zil(&ds)?;
        wlock(&self.dsl().list).insert(id, ds);
        *lock(&self.dsl().dirty) = true;
        Ok(())
    }

    /// Descendants of `d` (not `d`), deepest first.
    pub fn descendants(&self, d: &Arc<Dataset>) -> Vec<Arc<Dataset>> {
        let rel = d.rel();
        let mut v: Vec<Arc<Dataset>> = self
            .datasets()
            .into_iter()
            .filter(|c| {
                let r = c.rel();
                if rel.is_empty() {
                    !r.is_empty()
                } else {
                    r.starts_with(&format!("{rel}/"))
                }
            })
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.rel().len()));
        v
    }

    /// `zfs destroy`: the caller has unmounted it (and its descendants).
    pub fn destroy_dataset(&self, name: &str, recursive: bool) -> Result<Vec<String>> {
        let d = self.dataset(name)?;
        if d.rel().is_empty() {
            return Err(Error::invalid(
                "cannot destroy the pool's root dataset: use 'zpool destroy'",
            ));
        }
        let kids = self.descendants(&d);
        if !kids.is_empty() && !recursive {
            return Err(Error::invalid(format!(
                "cannot destroy '{name}': filesystem has children (use -r to destroy them too)"
            )));
        }
        // Snapshots first (each frees what only it held), newest first.
        let snaps = self.snapshot_names_under(&d);
        if !snaps.is_empty() && !recursive {
            return Err(Error::invalid(format!(
                "cannot destroy '{name}': filesystem has snapshots (use -r to destroy them too)"
            )));
        }
        self.spa.check_rw()?;
        self.ensure_free_queue()?;
        let mut gone = Vec::new();
        for s in snaps.into_iter().rev() {
            self.destroy_snapshot(&s)?;
            gone.push(s);
        }
        let _g = self.spa.sync_guard()?;
        for x in kids.iter().chain(std::iter::once(&d)) {
            if self.snapshots_count(x.id()) > 0 {
                return Err(Error::invalid(format!(
                    "cannot destroy '{name}': a snapshot was taken meanwhile"
                )));
            }
        }
        for x in kids.iter().chain(std::iter::once(&d)) {
            let id = x.id();
            // Its dead list goes, sub-lists and all. What they still list
            // (a clone's entries born by its origin) is the origin's: the
            // blocks stay.
            let dl = x.phys.read().deadlist;
            if dl != 0 {
                if let Some(subs) = deadlist::read_header(&self.spa.mos, dl)? {
                    for s in subs {
                        self.spa.mos.free_object(s.obj)?;
                    }
                }
                self.spa.mos.free_object(dl)?;
            }
            wlock(&self.dsl().list).remove(&id);
            self.spa.mos.free_object(id)?;
            // A clone frees only what it wrote: older blocks are its
            // origin's.
            let min_txg = self.origin_snap(x).map_or(0, |o| o.phys.read().txg);
            let bytes = self.dataset_unique(x);
            lock(&self.dsl().doomed).push((x.os.clone(), min_txg, bytes));
            // Its log blocks go back to the log class (a crash before the
            // destroy commits brings the dataset back as of its last txg).
            if let Some(z) = x.zil.get() {
                z.close();
            }
            gone.push(self.ds_name(&x.rel()));
        }
        *lock(&self.dsl().dirty) = true;
        let origins: Vec<u64> = kids
            .iter()
            .chain(std::iter::once(&d))
            .map(|x| x.phys.read().origin)
            .filter(|o| *o != 0)
            .collect();
        drop(_g);
        // An origin marked by `destroy -d` goes with its last clone.
        if !origins.is_empty() {
            self.spa.sync()?;
            for o in origins {
                self.reap_deferred(o)?;
            }
        }
        Ok(gone)
    }

    /// `zfs rename`: within the pool; the new parent must exist.
    pub fn rename_dataset(&self, from: &str, to: &str) -> Result<()> {
        let d = self.dataset(from)?;
        let old = d.rel();
        let new = self.rel_of(to)?;
        if old.is_empty() || new.is_empty() {
            return Err(Error::invalid("cannot rename the pool's root dataset"));
        }
        if new == old {
            return Ok(());
        }
        if new.starts_with(&format!("{old}/")) {
            return Err(Error::invalid(format!(
                "cannot rename '{from}' to a descendant of itself"
            )));
        }
        if self.dataset(to).is_ok() {
            return Err(Error::invalid(format!("dataset '{to}' already exists")));
        }
        let parent_rel = new.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
        let parent = self.dataset(&self.ds_name(parent_rel)).map_err(|_| {
            Error::invalid(format!(
                "parent '{}' does not exist",
                self.ds_name(parent_rel)
            ))
        })?;
        let _g = self.spa.sync_guard()?;
        for x in self.descendants(&d) {
            let mut p = x.phys.write();
            p.rel = format!("{new}{}", &p.rel[old.len()..]);
        }
        {
            let mut p = d.phys.write();
            p.rel = new;
            p.parent = parent.id();
        }
        *lock(&self.dsl().dirty) = true;
        Ok(())
    }

    /// Property value and source, resolving inheritance and defaults.
    pub fn get_prop(&self, d: &Arc<Dataset>, name: &str) -> Result<(String, Source)> {
        if let Some(v) = self.computed_prop(d, name) {
            return Ok((v, Source::None));
        }
        if props::is_user_prop(name) {
            return Ok(self.user_prop(d, name));
        }
        let def =
            props::def(name).ok_or_else(|| Error::invalid(format!("invalid property '{name}'")))?;
        if let Some(v) = d.phys.read().props.get(name) {
            return Ok((v.clone(), Source::Local));
        }
        if def.inherit {
            let mut cur = self.parent_of(d);
            let mut suffix = vec![d.rel().rsplit('/').next().unwrap_or("").to_string()];
            while let Some(p) = cur {
                if let Some(v) = p.phys.read().props.get(name) {
                    let from = self.ds_name(&p.rel());
                    let v = if name == "mountpoint" && v != "none" && v != "legacy" {
                        suffix.reverse();
                        format!("{}/{}", v.trim_end_matches('/'), suffix.join("/"))
                    } else {
                        v.clone()
                    };
                    return Ok((v, Source::Inherited(from)));
                }
                suffix.push(p.rel().rsplit('/').next().unwrap_or("").to_string());
                cur = self.parent_of(&p);
            }
        }
        if name == "mountpoint" {
            return Ok((format!("/{}", self.ds_name(&d.rel())), Source::Default));
        }
        Ok((def.default.to_string(), Source::Default))
    }

    pub fn set_prop(&self, d: &Arc<Dataset>, name: &str, value: &str) -> Result<()> {
        let v = validate_settable(name, value)?;
        let _g = self.spa.sync_guard()?;
        if name == "reservation" || name == "refreservation" {
            if let Ok(r) = v.parse::<u64>() {
                self.check_reservation(d, name, r)?;
            }
        }
        d.phys.write().props.insert(name.to_string(), v);
        *lock(&self.dsl().dirty) = true;
        Ok(())
    }

    /// A user property of `d`: local, inherited from the nearest ancestor
    /// that sets it, or "-" (source none).
    pub fn user_prop(&self, d: &Arc<Dataset>, name: &str) -> (String, Source) {
        if let Some(v) = d.phys.read().props.get(name) {
            return (v.clone(), Source::Local);
        }
        let mut cur = self.parent_of(d);
        while let Some(p) = cur {
            if let Some(v) = p.phys.read().props.get(name) {
                return (v.clone(), Source::Inherited(self.ds_name(&p.rel())));
            }
            cur = self.parent_of(&p);
        }
        ("-".into(), Source::None)
    }

    /// The user properties `d` has, set on it or inherited, by name.
    pub fn user_props(&self, d: &Arc<Dataset>) -> Vec<(String, String, Source)> {
        let mut names = std::collections::BTreeSet::new();
        let mut cur = Some(d.clone());
        while let Some(x) = cur {
            names.extend(
                x.phys
                    .read()
                    .props
                    .keys()
                    .filter(|k| props::is_user_prop(k))
                    .cloned(),
            );
            cur = self.parent_of(&x);
        }
        names
            .into_iter()
            .map(|n| {
                let (v, s) = self.user_prop(d, &n);
                (n, v, s)
            })
            .collect()
    }

    pub fn inherit_prop(&self, d: &Arc<Dataset>, name: &str) -> Result<()> {
        if props::def(name).is_none() && !props::is_user_prop(name) {
            return Err(Error::invalid(format!(
                "'{name}' is not an inheritable property"
            )));
        }
        let _g = self.spa.sync_guard()?;
        d.phys.write().props.remove(name);
        *lock(&self.dsl().dirty) = true;
        Ok(())
    }

    /// (referenced, used incl. descendants, logical incl. descendants).
    pub fn ds_space(&self, d: &Arc<Dataset>) -> (ObjsetSpace, u64, u64) {
        let own = d.os.space();
        let mut used = self.charged(d);
        let mut logical = own.logical;
        for k in self.descendants(d) {
            used += self.charged(&k);
            logical += k.os.space().logical;
        }
        (own, used, logical)
    }

    /// What `d` itself is charged (its `used` less its children's): what
    /// it holds alone or its refreservation, whichever is larger, and what
    /// its snapshots hold.
    fn charged(&self, d: &Arc<Dataset>) -> u64 {
        let refres = self.size_prop(d, "refreservation").unwrap_or(0);
        self.dataset_unique(d).max(refres) + self.snap_space(d)
    }

    /// `usedbyrefreservation`: the part of `refreservation` that `d` does
    /// not hold yet (what it holds alone counts against it, as OpenZFS's
    /// unique bytes do). Charged to `d` as used, and kept from every
    /// other dataset's writes.
    pub fn refres_unused(&self, d: &Arc<Dataset>) -> u64 {
        match self.size_prop(d, "refreservation") {
            Some(r) => r.saturating_sub(self.dataset_unique(d)),
            None => 0,
        }
    }

    /// `usedbydataset`: what `d` references that nothing else is charged
    /// for. All it references, unless it is a clone: then less what it
    /// still shares with its origin (the origin's referenced bytes less
    /// those of them the clone let go of).
    pub fn dataset_unique(&self, d: &Arc<Dataset>) -> u64 {
        let own = d.os.space().used;
        let origin_dead = d.phys.read().origin_dead;
        match self.origin_snap(d) {
            Some(o) => {
                let shared = o.phys.read().referenced.saturating_sub(origin_dead);
                own.saturating_sub(shared)
            }
            None => own,
        }
    }

    /// `usedbysnapshots`: what `d`'s snapshots hold that `d` no longer
    /// does, the sum of its line's dead lists (`dsl/snapshot.rs`), less a
    /// clone's entries that are its origin's.
    pub fn snap_space(&self, d: &Arc<Dataset>) -> u64 {
        let (dead, origin_dead) = {
            let p = d.phys.read();
            (p.dead_bytes, p.origin_dead)
        };
        (dead
            + self
                .snapshots_of(d.id())
                .iter()
                .map(|s| s.phys.read().dead_bytes)
                .sum::<u64>())
        .saturating_sub(origin_dead)
    }

    fn size_prop(&self, d: &Arc<Dataset>, name: &str) -> Option<u64> {
        let (v, _) = self.get_prop(d, name).ok()?;
        v.parse().ok()
    }

    /// Bytes `d` may still write: pool space less others' unused
    /// reservations, capped by each quota on the way up.
    pub fn ds_available(&self, d: &Arc<Dataset>) -> u64 {
        let mut avail = self.spa.deflate_space(self.spa.writable_space());
        let mine: Vec<u64> = std::iter::once(d.id())
            .chain(self.ancestors(d).iter().map(|a| a.id()))
            .collect();
        for o in self.datasets() {
            // A refreservation is for its own dataset's data: not even a
            // child writes into its parent's.
            if o.id() != d.id() {
                avail = avail.saturating_sub(self.refres_unused(&o));
            }
            if mine.contains(&o.id()) {
                continue;
            }
            if let Some(r) = self.size_prop(&o, "reservation") {
                let (_, used, _) = self.ds_space(&o);
                avail = avail.saturating_sub(r.saturating_sub(used));
            }
        }
        // `refquota`: what this dataset itself references (snapshots and
        // children aside), with what it has in flight.
        if let Some(q) = self.size_prop(d, "refquota") {
            let refd = d.os.space().used + d.os.dirty_bytes();
            avail = avail.min(q.saturating_sub(refd));
        }
        for a in std::iter::once(d.clone()).chain(self.ancestors(d)) {
            if let Some(q) = self.size_prop(&a, "quota") {
                let (_, used, _) = self.ds_space(&a);
                let dirty: u64 = std::iter::once(a.clone())
                    .chain(self.descendants(&a))
                    .map(|x| x.os.dirty_bytes())
                    .sum();
                avail = avail.min(q.saturating_sub(used + dirty));
            }
        }
        avail
    }

    pub fn ancestors(&self, d: &Arc<Dataset>) -> Vec<Arc<Dataset>> {
        let mut v = Vec::new();
        let mut cur = self.parent_of(d);
        while let Some(p) = cur {
            cur = self.parent_of(&p);
            v.push(p);
        }
        v
    }

    fn computed_prop(&self, d: &Arc<Dataset>, name: &str) -> Option<String> {
        let spacey = matches!(
            name,
            "used"
                | "usedbydataset"
                | "usedbychildren"
                | "usedbysnapshots"
                | "usedbyrefreservation"
                | "referenced"
                | "logicalused"
                | "logicalreferenced"
                | "compressratio"
        );
        let (own, used, logical) = if spacey {
            self.ds_space(d)
        } else {
            Default::default()
        };
        Some(match name {
            "name" => self.ds_name(&d.rel()),
            "type" => "filesystem".into(),
            "creation" => d.phys.read().creation.to_string(),
            "used" => used.to_string(),
            "usedbydataset" => self.dataset_unique(d).to_string(),
            "usedbysnapshots" => self.snap_space(d).to_string(),
            "usedbyrefreservation" => self.refres_unused(d).to_string(),
            "usedbychildren" => used.saturating_sub(self.charged(d)).to_string(),
            "written" => {
                // Since the latest snapshot (or the origin); all of it if none.
                let last = self
                    .snapshots_of(d.id())
                    .last()
                    .cloned()
                    .or_else(|| self.origin_snap(d));
                match last {
                    Some(s) => self.written_since(d, &s).ok()?.to_string(),
                    None => d.os.space().used.to_string(),
                }
            }
            w if w.starts_with("written@") => {
                let snap = &w["written@".len()..];
                let full = if snap.contains('@') {
                    snap.to_string()
                } else {
                    format!("{}@{snap}", self.ds_name(&d.rel()))
                };
                let (_, s) = self.snapshot(&full).ok()?;
                let sd = s.phys.read().ds;
                let in_line =
                    sd == d.id() || self.origin_snap(d).is_some_and(|o| Arc::ptr_eq(&o, &s));
                if !in_line {
                    return None;
                }
                self.written_since(d, &s).ok()?.to_string()
            }
            "origin" => match self.origin_of(d) {
                Some((name, _)) => name,
                None => "-".into(),
            },
            "snapshot_count" => self.snapshot_count(d).to_string(),
            "referenced" => own.used.to_string(),
            "available" => self.ds_available(d).to_string(),
            "logicalused" => logical.to_string(),
            "logicalreferenced" => own.logical.to_string(),
            "compressratio" => compressratio(own.logical, own.used),
            _ => return None,
        })
    }

    /// The ZPL properties of `d` now.
    pub fn zpl_props(&self, d: &Arc<Dataset>) -> ZplProps {
        let get = |n: &str| self.get_prop(d, n).map(|(v, _)| v).unwrap_or_default();
        ZplProps {
            recordsize: props::parse_size(&get("recordsize")).unwrap_or(128 << 10) as u32,
            obj: ObjProps {
                checksum: props::checksum_of(&get("checksum")).unwrap_or(ChecksumType::Fletcher4),
                compress: props::compression_of(&get("compression")).unwrap_or(Compression::Lz4),
                copies: get("copies").parse().unwrap_or(1),
            },
            atime: get("atime") == "on",
            readonly: get("readonly") == "on",
            sync: zpl::fs::SyncMode::parse(&get("sync")),
            throughput: get("logbias") == "throughput",
            snapdir_visible: get("snapdir") == "visible",
        }
    }

    /// Lay out a filesystem in the root dataset if it has none (`zpool
    /// create` does this; pools used only through the object interface, as
    /// the engine tests do, never get one).
    pub fn format_root_fs(&self) -> Result<()> {
        if self.spa.root().exists(1)? {
            return Ok(());
        }
        let open = lock(&self.spa.txg).open;
        zpl::Zpl::format(&self.spa.root(), open, 0, 0, 0o755)
    }

    /// Pools made before datasets existed get an empty DSL record.
    pub(crate) fn ensure_dsl_record(&self) -> Result<()> {
        let mut dir = lock(&self.spa.st).dir.clone();
        if dir.dsl != 0 {
            return Ok(());
        }
        dir.dsl = self
            .spa
            .mos
            .create_object(ot::DSL_DIR, 4096, &ObjProps::METADATA)?;
        self.spa.write_json(dir.dsl, &DslDirPhys::default())?;
        self.spa.write_json(1, &dir)?;
        lock(&self.spa.st).dir = dir;
        Ok(())
    }

    /// Every dataset's and snapshot's record as they are now.
    pub(crate) fn dsl_record_now(&self) -> DslDirPhys {
        DslDirPhys {
            // The root dataset is listed too (for its properties); its
            // object-set pointer lives in the object directory's
            // `root_dataset` as always.
            datasets: self
                .datasets()
                .iter()
                .map(|d| d.phys.read().clone())
                .collect(),
            snapshots: rlock(&self.dsl().snaps)
                .values()
                .map(|s| s.phys.read().clone())
                .collect(),
        }
    }
}

/// `compressratio` as zfs(8) shows it: logical over allocated bytes, at
/// least 1.00x.
pub fn compressratio(logical: u64, used: u64) -> String {
    let r = if used == 0 {
        1.0
    } else {
        (logical as f64 / used as f64).max(1.0)
    };
    format!("{r:.2}x")
}

fn validate_settable(name: &str, value: &str) -> Result<String> {
    if props::READONLY.contains(&name) {
        return Err(Error::invalid(format!("property '{name}' is read-only")));
    }
    props::validate(name, value)
}

/// What a mounted filesystem asks of its dataset and pool.
pub struct DsCtx {
    pub pool: Arc<Pool>,
    pub ds: Arc<Dataset>,
    /// Cached properties, refreshed by `zfs set` through `refresh`.
    props: RwLock<ZplProps>,
    /// Whether this dataset or an ancestor has a quota (writes check it).
    quota: std::sync::atomic::AtomicBool,
    /// Whether another dataset has a reservation: writes here must leave
    /// its unused part free (`ds_available`), or they would take space
    /// it was promised.
    reserved_elsewhere: std::sync::atomic::AtomicBool,
    /// `zfs mount -o ro|rw`: a temporary `readonly` for this mount only.
    temp_readonly: std::sync::Mutex<Option<bool>>,
}

/// Whether commits go through the intent log (else they return at once:
/// `sync=disabled`).
fn logs(p: &ZplProps) -> bool {
    p.sync != zpl::fs::SyncMode::Disabled
}

fn reserved_elsewhere(pool: &Pool, ds: &Arc<Dataset>) -> bool {
    let mine: Vec<u64> = std::iter::once(ds.id())
        .chain(pool.dsl_pool().ancestors(ds).iter().map(|a| a.id()))
        .collect();
    pool.dsl_pool().datasets().iter().any(|o| {
        (!mine.contains(&o.id()) && pool.dsl_pool().size_prop(o, "reservation").is_some())
            || (o.id() != ds.id() && pool.dsl_pool().size_prop(o, "refreservation").is_some())
    })
}

fn under_quota(pool: &Pool, ds: &Arc<Dataset>) -> bool {
    pool.dsl_pool().size_prop(ds, "refquota").is_some()
        || std::iter::once(ds.clone())
            .chain(pool.dsl_pool().ancestors(ds))
            .any(|x| pool.dsl_pool().size_prop(&x, "quota").is_some())
}

impl DsCtx {
    pub fn new(pool: Arc<Pool>, ds: Arc<Dataset>) -> Arc<DsCtx> {
        let p = pool.dsl_pool().zpl_props(&ds);
        let q = under_quota(&pool, &ds);
        let r = reserved_elsewhere(&pool, &ds);
        if let Some(z) = ds.zil.get() {
            z.set_recording(logs(&p));
            z.set_throughput(p.throughput);
        }
        Arc::new(DsCtx {
            pool,
            ds,
            props: RwLock::new(p),
            quota: std::sync::atomic::AtomicBool::new(q),
            reserved_elsewhere: std::sync::atomic::AtomicBool::new(r),
            temp_readonly: std::sync::Mutex::new(None),
        })
    }

    /// A temporary `readonly` for this mount (`zfs mount -o ro|rw`), or
    /// `None` for the property's own value.
    pub fn set_temp_readonly(&self, v: Option<bool>) {
        *lock(&self.temp_readonly) = v;
    }

    pub fn temp_readonly(&self) -> Option<bool> {
        *lock(&self.temp_readonly)
    }
    pub fn refresh(&self) {
        let p = self.pool.dsl_pool().zpl_props(&self.ds);
        if let Some(z) = self.ds.zil.get() {
            z.set_recording(logs(&p));
            z.set_throughput(p.throughput);
        }
        *wlock(&self.props) = p;
        self.quota.store(
            under_quota(&self.pool, &self.ds),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.reserved_elsewhere.store(
            reserved_elsewhere(&self.pool, &self.ds),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// One admission attempt (quota on the way up, then the pool); `admit`
    /// retries it across syncs.
    fn try_admit(&self, bytes: u64) -> zpl::fs::ZResult<()> {
        let pool = &self.pool;
        let quota = self.quota.load(std::sync::atomic::Ordering::Relaxed);
        let mut d: Option<Arc<Dataset>> = quota.then(|| self.ds.clone());
        while let Some(x) = d {
            let limited = pool.dsl_pool().size_prop(&x, "quota").is_some()
                || (Arc::ptr_eq(&x, &self.ds)
                    && pool.dsl_pool().size_prop(&x, "refquota").is_some());
            if limited && pool.dsl_pool().ds_available(&x) < bytes {
                return Err(libc::EDQUOT);
            }
            d = pool.dsl_pool().parent_of(&x);
        }
        // Others' unused reservations are not ours to take.
        if self
            .reserved_elsewhere
            .load(std::sync::atomic::Ordering::Relaxed)
            && pool.dsl_pool().ds_available(&self.ds) < bytes.saturating_add(pool.dirty_bytes())
        {
            return Err(libc::ENOSPC);
        }
        // Every copy of `copies=N` takes space.
        let copies = rlock(&self.props).obj.copies.max(1) as u64;
        pool.admit(bytes.saturating_mul(copies))
            .map_err(zpl::fs::errno)
    }
}

/// Txg syncs a write refused for space waits for before the refusal
/// stands.
const SPACE_RETRY_SYNCS: u32 = 3;

impl DatasetCtx for DsCtx {
    /// Admit `bytes` of new data, or refuse it with EDQUOT / ENOSPC. A
    /// refusal first waits for txg syncs, as OpenZFS's
    /// `dsl_dir_tempreserve_space` answers ERESTART while space is in
    /// flight: until a sync, an unlinked file's blocks still count against
    /// the quota and the pool, so without the wait `rm big; touch new` on a
    /// full dataset would fail.
    fn admit(&self, bytes: u64) -> zpl::fs::ZResult<()> {
        let mut syncs = 0;
        loop {
            match self.try_admit(bytes) {
                Err(e) if (e == libc::EDQUOT || e == libc::ENOSPC) && syncs < SPACE_RETRY_SYNCS => {
                    syncs += 1;
                    // Frees waiting out their txgs: make the syncs happen
                    // even if nothing else is dirty.
                    self.pool.want_frees();
                    if self.pool.txg_wait_synced().is_err() {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }
    fn commit(&self, _obj: u64) -> zpl::fs::ZResult<()> {
        // `sync=disabled`: acknowledged at once, committed with the txg.
        if rlock(&self.props).sync == zpl::fs::SyncMode::Disabled {
            return Ok(());
        }
        match self.ds.zil.get() {
            Some(zil) if logs(&rlock(&self.props)) => zil.commit(),
            _ => self.pool.txg_wait_synced_data().map(|_| ()),
        }
        .map_err(zpl::fs::errno)
    }
    fn props(&self) -> ZplProps {
        let mut p = *rlock(&self.props);
        if let Some(t) = *lock(&self.temp_readonly) {
            p.readonly = t;
        }
        // A read-only import mounts every filesystem read-only (EROFS).
        p.readonly |= self.pool.readonly();
        p
    }
    fn space(&self) -> (u64, u64) {
        let avail = self.pool.dsl_pool().ds_available(&self.ds);
        let (_, used, _) = self.pool.dsl_pool().ds_space(&self.ds);
        (used + avail, avail)
    }
    fn txg(&self) -> u64 {
        lock(&self.pool.txg).open
    }
    /// With `failmode=wait`, a change waits here while the pool is
    /// suspended on a parked sync (`spa/suspend.rs`).
    fn live(&self) -> bool {
        self.pool.wait_out_suspension().is_none()
    }
    /// A clone's starts at its origin's txg (`dsl/snapshot.rs`).
    fn shared_below(&self) -> u64 {
        self.ds.phys.read().prev_snap_txg
    }
}

fn reservation_too_big() -> Error {
    Error::invalid("size is greater than available space")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::{sim_pool, sim_reimport, sim_tunables};
    use crate::vdev::sim::SimWorld;

    /// A pool whose DSL record is replaced by `record` (a checksum-valid
    /// but hostile document) must refuse import with an error, never
    /// panic or open a bogus dataset.
    fn import_with_record(record: serde_json::Value) -> Result<Arc<Pool>> {
        let world = SimWorld::new();
        let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(5))?;
        p.dsl_pool().format_root_fs()?;
        p.dsl_pool().create_dataset("t/a", &[], false)?;
        p.sync()?;
        let dsl = lock(&p.st).dir.dsl;
        p.write_json(dsl, &record)?;
        p.sync()?;
        p.close()?;
        drop(p);
        sim_reimport(&world, &d, sim_tunables())
    }

    #[test]
    fn hostile_dsl_records_are_refused() {
        let bad = [
            // a child claiming the MOS object directory as its pointer
            serde_json::json!({"datasets": [{"id": 1, "rel": "x", "parent": 5, "props": {}, "creation": 0}]}),
            // a child with no parent
            serde_json::json!({"datasets": [{"id": 99, "rel": "x", "parent": 0, "props": {}, "creation": 0}]}),
            // a pointer object that does not exist
            serde_json::json!({"datasets": [{"id": 4000, "rel": "x", "parent": 5, "props": {}, "creation": 0}]}),
            // not a DSL record at all
            serde_json::json!({"datasets": "lots"}),
            // an index naming an object that does not exist
            serde_json::json!({"dataset_ids": [4000]}),
            // an index naming the object directory (no record in it)
            serde_json::json!({"dataset_ids": [1]}),
            // both layouts at once
            serde_json::json!({"snapshot_ids": [6], "datasets": [{"id": 99, "rel": "x", "parent": 5, "props": {}, "creation": 0}]}),
        ];
        for r in bad {
            let why = format!("{r}");
            assert!(import_with_record(r).is_err(), "imported with record {why}");
        }
        // And the honest record imports.
        let ok = import_with_record(serde_json::json!({"datasets": []}));
        assert!(ok.is_ok(), "{:?}", ok.err());
    }
}
