//! The dataset layer on disk (OpenZFS `dsl_dir`, `dsl_dataset`): a MOS
//! object per DSL directory, per dataset and per snapshot, and ZAPs that
//! tie them into a tree.
//!
//! # Theory of operation
//!
//! OpenZFS splits what a filesystem is into two records. The *directory*
//! (`dsl_dir_phys_t`) is the place in the tree: its parent, its
//! properties, the ZAP of its children by name. The *dataset*
//! (`dsl_dataset_phys_t`) is the data at that place: the object-set
//! pointer, creation time, latest snapshot txg, dead list, clone origin,
//! and the ZAP of its snapshots by name. A snapshot is a dataset record
//! of its own. A name is never stored whole: `pool/a/b` is the path of
//! ZAP entries from the root directory, so renaming `a` rewrites one
//! directory record and two ZAP entries, not every record beneath it,
//! and taking a snapshot adds one ZAP entry and one record, not a line in
//! a list of every snapshot of the pool.
//!
//! uzfs keeps the same split with JSON records (`com.uzfs:dsl_dirs`):
//!
//! ```text
//! object directory .dsl ─▶ DslIndex { root_dir }
//! DSL_DIR object        ─▶ DirRecord { id, head, parent, props, children }
//!                             children: DSL_DIR_CHILD_MAP  name -> child DSL_DIR
//! DSL_DATASET object    ─▶ bytes 0..128 object-set pointer,
//!                          128.. HeadRecord { id, dir, creation, prev_snap_txg,
//!                                deadlist, dead_bytes, origin, origin_dead, snapshots }
//!                             snapshots: DSL_DS_SNAP_MAP  name -> snapshot object
//! snapshot object       ─▶ bytes 0..128 object-set pointer, 128.. SnapPhys
//! ```
//!
//! In memory nothing changes: each dataset's [`DsPhys`] carries its whole
//! name (`rel`), parent and properties, and the sync derives the records
//! and map entries from them. Every in-memory record remembers being
//! written to ([`Record`](super::Record)), and the sync keeps what it
//! last wrote ([`Written`]: the bytes of every record, where each dataset
//! and snapshot is filed), so a txg looks only at what changed, came or
//! went, writes only the records whose bytes differ, and changes only the
//! map entries that came, went or moved: with a thousand snapshots, a
//! snapshot costs the same work as with none. The ZAPs are changed in
//! sync context, through [`InSync`], in the same pass as the records that
//! name them.
//!
//! Import walks the tree from the root directory: each directory's record,
//! its dataset's record, the snapshots its ZAP names, then its children.
//! Every link is checked both ways (a directory names its dataset and the
//! dataset its directory; a snapshot names its dataset and the name it is
//! filed under); a directory reached twice is corruption.
//!
//! Earlier layouts are read as they are and kept on pools that have not
//! enabled the feature: every record inline in the directory object (the
//! first), then each record in its own object and the directory object a
//! list of their numbers (`com.uzfs:dsl_records`). A pool that enables
//! `com.uzfs:dsl_dirs` (`zpool upgrade`) is rewritten in this layout by
//! its next sync that changes the layer.

use super::snapshot::SnapPhys;
use super::DslPool;
use super::{rlock, Dataset, DsPhys, DslDirPhys};
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{BlockWriter, Objset, TxgDirty};
use crate::dmu::zap::{self, InSync, Zap, ZAP_BLOCK};
use crate::error::{Error, Result};
use crate::spa::{lock, Pool};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Where a record starts in its object (after the object-set pointer).
pub const RECORD_OFF: u64 = 128;
/// Largest record read back (a record is a few hundred bytes; user
/// properties make it grow).
const RECORD_MAX: u64 = 1 << 20;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The DSL directory object (`ObjectDirectory::dsl`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DslIndex {
    /// The root DSL directory (`com.uzfs:dsl_dirs`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub root_dir: u64,
    /// Objects holding dataset records (`com.uzfs:dsl_records`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dataset_ids: Vec<u64>,
    /// Objects holding snapshot records (`com.uzfs:dsl_records`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot_ids: Vec<u64>,
    /// The first layout: every record inline (read, and written only on
    /// pools without the features).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DsPhys>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapPhys>,
}

/// A DSL directory's record: the whole object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirRecord {
    /// Its own object.
    pub id: u64,
    /// The dataset object at this place in the tree.
    pub head: u64,
    /// The parent directory's object (0: the root).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parent: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub props: BTreeMap<String, String>,
    /// Its children's map (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub children: u64,
}

/// A dataset's record, from [`RECORD_OFF`] in its object (the fields of
/// [`DsPhys`] that are the data's, not the place's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadRecord {
    pub id: u64,
    /// Its directory's object.
    pub dir: u64,
    pub creation: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prev_snap_txg: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadlist: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dead_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub origin_dead: u64,
    /// Its snapshots' map (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub snapshots: u64,
}

/// A dataset's objects beside its own in the dirs layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirObjs {
    pub dir: u64,
    /// Child map (0: none).
    pub children: u64,
    /// Snapshot map (0: none).
    pub snaps: u64,
}

/// How the records were found on disk.
pub enum Layout {
    /// Every record inline in the directory object.
    Inline,
    /// Records in their own objects, listed by the directory object.
    Records,
    /// Directories, datasets and ZAPs: each dataset's objects and the
    /// entries of every map.
    Dirs { dirs: HashMap<u64, DirObjs> },
}

/// What the last sync wrote, so the next writes only what differs.
#[derive(Default)]
pub struct Written {
    /// Record bytes by object (directories, datasets, snapshots).
    records: HashMap<u64, Vec<u8>>,
    index: Option<DslIndex>,
    /// Dirs layout: each dataset's directory and maps, by dataset id.
    dirs: HashMap<u64, DirObjs>,
    /// Dirs layout: where each dataset but the root is filed (its
    /// parent dataset and its name there), by dataset id.
    kids: HashMap<u64, (u64, String)>,
    /// Dirs layout: where each snapshot is filed (its dataset and name),
    /// by snapshot id.
    snaps: HashMap<u64, (u64, String)>,
    /// Datasets and snapshots whose records the last sync derived (what
    /// changed, came or moved), for the tests.
    derived: usize,
}

fn read_record<T: serde::de::DeserializeOwned>(mos: &Objset, id: u64, what: &str) -> Result<T> {
    let size = mos.stat(id)?.size;
    if size <= RECORD_OFF || size > RECORD_MAX {
        return Err(Error::corrupt(
            what,
            format!("object {id}: record of {size} bytes"),
        ));
    }
    let mut buf = vec![0u8; (size - RECORD_OFF) as usize];
    mos.read(id, RECORD_OFF, &mut buf)?;
    serde_json::from_slice(&buf).map_err(|e| Error::corrupt(what, format!("object {id}: {e}")))
}

/// Every record as committed in `mos` (any layout), and the layout.
pub fn read_dsl(mos: &Objset, dsl_obj: u64) -> Result<(DslDirPhys, Layout)> {
    if dsl_obj == 0 || !mos.exists(dsl_obj)? {
        return Ok((DslDirPhys::default(), Layout::Inline));
    }
    let ix: DslIndex = Pool::read_json(mos, dsl_obj, "DSL directory")?;
    let inline = !ix.datasets.is_empty() || !ix.snapshots.is_empty();
    let listed = !ix.dataset_ids.is_empty() || !ix.snapshot_ids.is_empty();
    if [inline, listed, ix.root_dir != 0]
        .iter()
        .filter(|x| **x)
        .count()
        > 1
    {
        return Err(Error::corrupt(
            "DSL directory",
            "more than one record layout at once",
        ));
    }
    if ix.root_dir != 0 {
        return read_tree(mos, ix.root_dir);
    }
    if inline {
        return Ok((
            DslDirPhys {
                datasets: ix.datasets,
                snapshots: ix.snapshots,
            },
            Layout::Inline,
        ));
    }
    let out = DslDirPhys {
        datasets: read_records(mos, &ix.dataset_ids, "dataset record", |d: &DsPhys| d.id)?,
        snapshots: read_records(mos, &ix.snapshot_ids, "snapshot record", |s: &SnapPhys| {
            s.id
        })?,
    };
    Ok((out, Layout::Records))
}

/// The records in objects `ids`, each of which must name its own object.
fn read_records<T: serde::de::DeserializeOwned>(
    mos: &Objset,
    ids: &[u64],
    what: &str,
    id_of: impl Fn(&T) -> u64,
) -> Result<Vec<T>> {
    ids.iter()
        .map(|&id| {
            let r: T = read_record(mos, id, what)?;
            match id_of(&r) {
                x if x == id => Ok(r),
                x => Err(Error::corrupt(
                    what,
                    format!("object {id} names object {x}"),
                )),
            }
        })
        .collect()
}

/// The entries of map `obj` as names (each a valid UTF-8 name).
fn read_map(mos: &Objset, obj: u64, what: &str) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for e in Zap::open(mos, obj).all()? {
        let name = String::from_utf8(e.name)
            .map_err(|_| Error::corrupt(what, format!("map {obj}: a name is not UTF-8")))?;
        out.insert(name, e.value);
    }
    Ok(out)
}

/// The dirs layout: walk the tree from the root directory.
fn read_tree(mos: &Objset, root_dir: u64) -> Result<(DslDirPhys, Layout)> {
    let bad = |m: String| Error::corrupt("DSL directory", m);
    let mut out = DslDirPhys::default();
    let mut dirs = HashMap::new();
    let mut seen = HashSet::new();
    // (directory, name below the pool, parent directory, parent dataset)
    let mut queue = vec![(root_dir, String::new(), 0u64, 0u64)];
    while let Some((dir_obj, rel, parent_dir, parent_ds)) = queue.pop() {
        if !seen.insert(dir_obj) {
            return Err(bad(format!("directory {dir_obj} is reached twice")));
        }
        let dr: DirRecord = Pool::read_json(mos, dir_obj, "DSL directory record")?;
        if dr.id != dir_obj || dr.parent != parent_dir {
            return Err(bad(format!(
                "directory {dir_obj} names itself {} under {} (reached under {parent_dir})",
                dr.id, dr.parent
            )));
        }
        let h: HeadRecord = read_record(mos, dr.head, "dataset record")?;
        if h.id != dr.head || h.dir != dir_obj {
            return Err(bad(format!(
                "directory {dir_obj} and dataset {} do not name each other",
                dr.head
            )));
        }
        if h.snapshots != 0 {
            let m = read_map(mos, h.snapshots, "snapshot map")?;
            for (name, &id) in &m {
                let sp: SnapPhys = read_record(mos, id, "snapshot record")?;
                if sp.id != id || sp.ds != h.id || &sp.name != name {
                    return Err(bad(format!(
                        "snapshot {id} filed as '{name}' under dataset {} names itself \
                         '{}' of dataset {} (object {})",
                        h.id, sp.name, sp.ds, sp.id
                    )));
                }
                out.snapshots.push(sp);
            }
        }
        if dr.children != 0 {
            let m = read_map(mos, dr.children, "child map")?;
            for (name, &child) in &m {
                super::check_component(name)
                    .map_err(|_| bad(format!("directory {dir_obj}: child name '{name}'")))?;
                let child_rel = match rel.is_empty() {
                    true => name.clone(),
                    false => format!("{rel}/{name}"),
                };
                queue.push((child, child_rel, dir_obj, h.id));
            }
        }
        dirs.insert(
            h.id,
            DirObjs {
                dir: dir_obj,
                children: dr.children,
                snaps: h.snapshots,
            },
        );
        out.datasets.push(DsPhys {
            id: h.id,
            rel,
            parent: parent_ds,
            props: dr.props,
            creation: h.creation,
            prev_snap_txg: h.prev_snap_txg,
            deadlist: h.deadlist,
            dead_bytes: h.dead_bytes,
            origin: h.origin,
            origin_dead: h.origin_dead,
        });
    }
    Ok((out, Layout::Dirs { dirs }))
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::invalid(e.to_string()))
}

/// The records of dataset `d` in the dirs layout: its directory's, then
/// its own.
fn dir_records(
    d: &DsPhys,
    objs: &HashMap<u64, DirObjs>,
) -> Result<(DirObjs, DirRecord, HeadRecord)> {
    let missing = |id: u64| Error::invalid(format!("dataset {id} has no DSL directory"));
    let o = *objs.get(&d.id).ok_or_else(|| missing(d.id))?;
    let parent = match d.parent {
        0 => 0,
        p => objs.get(&p).ok_or_else(|| missing(p))?.dir,
    };
    let dir = DirRecord {
        id: o.dir,
        head: d.id,
        parent,
        props: d.props.clone(),
        children: o.children,
    };
    let head = HeadRecord {
        id: d.id,
        dir: o.dir,
        creation: d.creation,
        prev_snap_txg: d.prev_snap_txg,
        deadlist: d.deadlist,
        dead_bytes: d.dead_bytes,
        origin: d.origin,
        origin_dead: d.origin_dead,
        snapshots: o.snaps,
    };
    Ok((o, dir, head))
}

/// The name `d` has in its parent's child map.
fn component(d: &DsPhys) -> &str {
    d.rel.rsplit('/').next().unwrap_or(&d.rel)
}

impl DslPool<'_> {
    /// Import: what was read is what is on disk (an inline-layout pool
    /// has nothing in the later layouts yet: its first sync writes it all).
    pub(crate) fn note_records_read(&self, dsl: &DslDirPhys, layout: Layout) -> Result<()> {
        let mut w = lock(&self.dsl().written);
        *w = Written::default();
        match layout {
            Layout::Inline => {
                *lock(&self.dsl().dirty) = true;
                return Ok(());
            }
            Layout::Records => {
                for d in &dsl.datasets {
                    w.records.insert(d.id, json(d)?);
                }
                w.index = Some(index_of(dsl));
            }
            Layout::Dirs { dirs } => {
                for d in &dsl.datasets {
                    let (o, dir, head) = dir_records(d, &dirs)?;
                    w.records.insert(o.dir, json(&dir)?);
                    w.records.insert(d.id, json(&head)?);
                    if d.parent == 0 {
                        w.index = Some(DslIndex {
                            root_dir: o.dir,
                            ..Default::default()
                        });
                    } else {
                        w.kids.insert(d.id, (d.parent, component(d).to_string()));
                    }
                }
                for s in &dsl.snapshots {
                    w.snaps.insert(s.id, (s.ds, s.name.clone()));
                }
                w.dirs = dirs;
            }
        }
        for s in &dsl.snapshots {
            w.records.insert(s.id, json(s)?);
        }
        Ok(())
    }

    /// Sync context: write what changed in the layout the pool's features
    /// allow (`records`: `com.uzfs:dsl_records`, `dirs`:
    /// `com.uzfs:dsl_dirs`; neither: every record inline, as the first
    /// builds wrote them).
    pub(crate) fn sync_dsl_records(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        dsl_obj: u64,
        records: bool,
        dirs: bool,
    ) -> Result<()> {
        {
            let mut dirty = lock(&self.dsl().dirty);
            if !*dirty {
                return Ok(());
            }
            *dirty = false;
        }
        let mut written = lock(&self.dsl().written);
        if dirs {
            return self.sync_dirs(w, extra, dsl_obj, &mut written);
        }
        let all = self.dsl_record_now();
        // A layout given up (only tests turn a feature off): its
        // directories and maps go.
        for o in std::mem::take(&mut written.dirs).into_values() {
            free_dir_objs(extra, &o);
        }
        written.kids.clear();
        written.snaps.clear();
        if !records {
            let inline = DslIndex {
                datasets: all.datasets,
                snapshots: all.snapshots,
                ..Default::default()
            };
            self.spa
                .mos
                .replace_in_sync(extra, dsl_obj, 0, &json(&inline)?)?;
            *written = Written::default();
            return Ok(());
        }
        let ix = index_of(&all);
        let records = all
            .datasets
            .iter()
            .map(|d| (d.id, json(d)))
            .chain(all.snapshots.iter().map(|s| (s.id, json(s))));
        let mut keep = HashMap::new();
        for (id, bytes) in records {
            let bytes = bytes?;
            if written.records.get(&id) != Some(&bytes) {
                self.spa
                    .mos
                    .replace_in_sync(extra, id, RECORD_OFF, &bytes)?;
            }
            keep.insert(id, bytes);
        }
        written.records = keep;
        if written.index.as_ref() != Some(&ix) {
            self.spa
                .mos
                .replace_in_sync(extra, dsl_obj, 0, &json(&ix)?)?;
            w.note_feature(crate::spa::feature::DSL_RECORDS);
            written.index = Some(ix);
        }
        Ok(())
    }

    /// The dirs layout, from what changed since the last sync: a dataset
    /// or snapshot whose [`Record`](super::Record) was written, or that is
    /// new or gone. Directories are made for new datasets and freed with
    /// gone ones; the map entries of what came, went, moved or was renamed
    /// are removed, then added (so two names may trade places in one txg);
    /// the records of what changed are rewritten where their bytes differ,
    /// and the index when the root directory is new. Nothing is cloned,
    /// encoded or compared for what did not change.
    fn sync_dirs(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        dsl_obj: u64,
        written: &mut Written,
    ) -> Result<()> {
        let datasets: HashMap<u64, Arc<Dataset>> = rlock(&self.dsl().list)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let snaps = rlock(&self.dsl().snaps);
        let store = InSync {
            os: &self.spa.mos,
            into: RefCell::new(extra),
        };
        let Written {
            records,
            index,
            dirs,
            kids,
            snaps: filed,
            derived,
        } = written;
        // Gone: a dataset's directory and maps freed, its entry removed
        // from a parent that stays; a snapshot's entry removed.
        let gone: Vec<u64> = dirs
            .keys()
            .filter(|id| !datasets.contains_key(id))
            .copied()
            .collect();
        let mut removals: Vec<(u64, String, bool)> = Vec::new();
        for id in gone {
            if let Some(o) = dirs.remove(&id) {
                free_dir_objs(&mut store.into.borrow_mut(), &o);
                records.remove(&o.dir);
            }
            records.remove(&id);
            if let Some((parent, name)) = kids.remove(&id) {
                removals.push((parent, name, true));
            }
        }
        // Changed: new ones get a directory. The first sync in this layout
        // files everything (records whose marks an earlier layout's syncs
        // left alone or took).
        let mut changed: Vec<DsPhys> = Vec::new();
        let all = index.as_ref().is_none_or(|ix| ix.root_dir == 0);
        for (id, d) in &datasets {
            let new = !dirs.contains_key(id);
            if d.phys.take_changed() || new || all {
                if new {
                    let dir = self.spa.mos.create_in_sync(
                        &mut store.into.borrow_mut(),
                        ot::DSL_DIR,
                        4096,
                        &ObjProps::METADATA,
                    )?;
                    dirs.insert(
                        *id,
                        DirObjs {
                            dir,
                            ..Default::default()
                        },
                    );
                }
                changed.push(d.phys.read().clone());
            }
        }
        let mut changed_snaps: Vec<SnapPhys> = Vec::new();
        for s in snaps.values() {
            if s.phys.take_changed() || all {
                changed_snaps.push(s.phys.read().clone());
            }
        }
        // Snapshots gone: what is filed and no longer listed (looked for
        // only when the counts say some are; new ones are in both).
        let fresh = changed_snaps
            .iter()
            .filter(|sp| !filed.contains_key(&sp.id))
            .count();
        if filed.len() + fresh > snaps.len() {
            filed.retain(|id, (ds, name)| {
                let keep = snaps.contains_key(id);
                if !keep {
                    records.remove(id);
                    removals.push((*ds, std::mem::take(name), false));
                }
                keep
            });
        }
        drop(snaps);
        // Map entries: where each changed one was filed and is filed now.
        let mut inserts: Vec<(u64, String, u64, bool)> = Vec::new();
        for d in changed.iter().filter(|d| d.parent != 0) {
            let now = (d.parent, component(d).to_string());
            if kids.get(&d.id) != Some(&now) {
                if let Some((p, n)) = kids.insert(d.id, now.clone()) {
                    removals.push((p, n, true));
                }
                inserts.push((now.0, now.1, dirs[&d.id].dir, true));
            }
        }
        for sp in &changed_snaps {
            let now = (sp.ds, sp.name.clone());
            if filed.get(&sp.id) != Some(&now) {
                if let Some((ds, n)) = filed.insert(sp.id, now.clone()) {
                    removals.push((ds, n, false));
                }
                inserts.push((now.0, now.1, sp.id, false));
            }
        }
        for (owner, name, kid) in removals {
            // An owner that is gone took its map with it.
            let Some(o) = dirs.get(&owner) else { continue };
            let map = if kid { o.children } else { o.snaps };
            if map != 0 {
                Zap::at(&store, map).remove(name.as_bytes())?;
            }
        }
        let mut new_maps: HashSet<u64> = HashSet::new();
        for (owner, name, value, kid) in inserts {
            let o = dirs.get_mut(&owner).ok_or_else(|| {
                Error::invalid(format!(
                    "'{name}' is filed under dataset {owner}, which is gone"
                ))
            })?;
            let (map, obj_type) = match kid {
                true => (&mut o.children, ot::DSL_DIR_CHILD_MAP),
                false => (&mut o.snaps, ot::DSL_DS_SNAP_MAP),
            };
            if *map == 0 {
                *map = create_map(&store, obj_type)?;
                new_maps.insert(owner);
            }
            Zap::at(&store, *map).insert(name.as_bytes(), value, 0)?;
        }
        let extra = store.into.into_inner();
        // Records: the changed ones, and those naming a map made now.
        for id in new_maps {
            if !changed.iter().any(|d| d.id == id) {
                if let Some(d) = datasets.get(&id) {
                    changed.push(d.phys.read().clone());
                }
            }
        }
        let mut put = |obj: u64, off: u64, bytes: Vec<u8>| -> Result<()> {
            if records.get(&obj) != Some(&bytes) {
                self.spa.mos.replace_in_sync(extra, obj, off, &bytes)?;
                records.insert(obj, bytes);
            }
            Ok(())
        };
        *derived = changed.len() + changed_snaps.len();
        let mut root_dir = None;
        for d in &changed {
            let (o, dir, head) = dir_records(d, dirs)?;
            if d.parent == 0 {
                root_dir = Some(o.dir);
            }
            put(o.dir, 0, json(&dir)?)?;
            put(d.id, RECORD_OFF, json(&head)?)?;
        }
        for sp in &changed_snaps {
            put(sp.id, RECORD_OFF, json(sp)?)?;
        }
        if let Some(root_dir) = root_dir {
            let ix = DslIndex {
                root_dir,
                ..Default::default()
            };
            if index.as_ref() != Some(&ix) {
                self.spa
                    .mos
                    .replace_in_sync(extra, dsl_obj, 0, &json(&ix)?)?;
                w.note_feature(crate::spa::feature::DSL_DIRS);
                *index = Some(ix);
            }
        }
        if index.as_ref().is_none_or(|ix| ix.root_dir == 0) {
            return Err(Error::invalid("the DSL index names no root directory"));
        }
        Ok(())
    }
}

/// A new, empty map in sync context.
fn create_map(store: &InSync<'_, '_>, obj_type: u8) -> Result<u64> {
    let o = store.os.create_in_sync(
        &mut store.into.borrow_mut(),
        obj_type,
        ZAP_BLOCK,
        &ObjProps::METADATA,
    )?;
    Zap::init(store, o, zap::new_salt(o))?;
    Ok(o)
}

/// A gone dataset's directory and maps are freed with the txg.
fn free_dir_objs(extra: &mut TxgDirty, o: &DirObjs) {
    for obj in [o.dir, o.children, o.snaps] {
        if obj != 0 {
            extra.free_object(obj);
        }
    }
}

fn index_of(dsl: &DslDirPhys) -> DslIndex {
    let mut dataset_ids: Vec<u64> = dsl.datasets.iter().map(|d| d.id).collect();
    let mut snapshot_ids: Vec<u64> = dsl.snapshots.iter().map(|s| s.id).collect();
    dataset_ids.sort_unstable();
    snapshot_ids.sort_unstable();
    DslIndex {
        dataset_ids,
        snapshot_ids,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dmu::dnode::ObjProps;
    use crate::spa::{sim_pool, sim_reimport, sim_tunables};
    use crate::vdev::sim::{SimDevice, SimWorld};
    use crate::vdev::BlockDevice;
    use std::sync::Arc;

    /// The txg a MOS object was last written in.
    fn written_in(p: &Pool, obj: u64) -> u64 {
        let dn = p.mos.synced_dnode(obj).expect("dnode");
        dn.blkptr.iter().map(|b| b.birth).max().unwrap_or(0)
    }

    /// Import a copy of `d`'s image, and the copy the pool now writes.
    fn reopen(world: &SimWorld, d: &SimDevice) -> (SimDevice, Arc<Pool>) {
        let img = world.disk_from_image("d0", d.image());
        let found = crate::spa::import::discover(vec![(
            "d0".into(),
            Arc::new(img.clone()) as Arc<dyn BlockDevice>,
        )]);
        let f = found.first().expect("pool found");
        let p = Pool::import(f, None, sim_tunables()).expect("import");
        (img, p)
    }

    fn zdb_clean(world: &SimWorld, d: &SimDevice, what: &str) {
        let img: Arc<dyn BlockDevice> = Arc::new(world.disk_from_image("d0", d.image()));
        let r = crate::zdb::verify(vec![("d0".into(), img)]).expect("zdb");
        assert!(r.is_clean(), "{what}:\n{}", crate::zdb::format_report(&r));
    }

    /// The objects of dataset `name` beside its own (dirs layout).
    fn objs_of(p: &Pool, name: &str) -> DirObjs {
        let id = p.dsl_pool().dataset(name).expect("dataset").id();
        lock(&p.dsl.written).dirs[&id]
    }

    /// Every MOS object of the layer (index, directories, maps, dataset
    /// and snapshot records) with the txg it was last written in.
    fn layer_objects(p: &Pool) -> BTreeMap<u64, u64> {
        let dsl_obj = lock(&p.st).dir.dsl;
        let w = lock(&p.dsl.written);
        let mut objs: Vec<u64> = vec![dsl_obj];
        objs.extend(w.records.keys());
        objs.extend(
            w.dirs
                .values()
                .flat_map(|o| [o.children, o.snaps])
                .filter(|o| *o != 0),
        );
        objs.into_iter().map(|o| (o, written_in(p, o))).collect()
    }

    /// The objects written by the last sync (txg `txg`).
    fn rewritten(before: &BTreeMap<u64, u64>, p: &Pool, txg: u64) -> Vec<u64> {
        let mut v: Vec<u64> = layer_objects(p)
            .into_iter()
            .filter(|(o, t)| *t == txg && before.get(o) != Some(t))
            .map(|(o, _)| o)
            .collect();
        v.sort_unstable();
        v
    }

    /// The dirs layout: each change writes only the records and maps it
    /// touches. A snapshot: its record, its dataset's record and snapshot
    /// map. A dead list that grew: the dataset's record. A rename in
    /// place: the parent's child map alone (the directory records beneath,
    /// whose names changed in memory, stay). A move: the directory's
    /// record and both parents' maps. A destroy frees the directory and
    /// its maps. The tree reads back whole after export.
    #[test]
    fn dirs_layout_writes_only_what_changed() {
        let world = SimWorld::new();
        let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(3)).expect("pool");
        p.dsl_pool().format_root_fs().expect("format");
        p.dsl_pool()
            .create_dataset("t/a/b/c", &[("com.x:tag".into(), "deep".into())], true)
            .expect("create");
        p.dsl_pool()
            .create_dataset("t/other", &[], false)
            .expect("create");
        let obj = p.create_object(4096, &ObjProps::default()).expect("object");
        for i in 0..40u8 {
            p.write(obj, 0, &vec![i | 1; 64 << 10]).expect("write");
            p.dsl_pool()
                .create_snapshots(&[format!("t@s{i}")])
                .expect("snapshot");
        }
        p.dsl_pool()
            .create_snapshots(&["t/a/b@x".to_string()])
            .expect("snapshot");
        p.sync().expect("sync");
        let (dsl_obj, root) = {
            let st = lock(&p.st);
            (st.dir.dsl, st.dir.root_dataset)
        };
        let t = objs_of(&p, "t");
        let (a, b) = (objs_of(&p, "t/a"), objs_of(&p, "t/a/b"));
        assert!(t.children != 0 && t.snaps != 0 && a.children != 0 && b.snaps != 0);
        // A dead list grows: the root dataset's record alone.
        let before = layer_objects(&p);
        p.write(obj, 0, &vec![0x77; 64 << 10]).expect("overwrite");
        let txg = p.sync().expect("sync");
        assert_eq!(rewritten(&before, &p, txg), vec![root]);
        // ... and only its record was derived, of 4 datasets and 41
        // snapshots.
        assert_eq!(lock(&p.dsl.written).derived, 1);

        // A snapshot: its record, its dataset's record and map.
        let before = layer_objects(&p);
        p.write(obj, 0, &vec![0x78; 64 << 10]).expect("write");
        p.dsl_pool()
            .create_snapshots(&["t@new".to_string()])
            .expect("snapshot");
        let txg = p.sync().expect("sync");
        let snap = p.dsl_pool().snapshot("t@new").expect("snap").1.phys().id;
        let mut want = vec![root, t.snaps, snap];
        want.sort_unstable();
        assert_eq!(rewritten(&before, &p, txg), want);
        assert_eq!(
            lock(&p.dsl.written).derived,
            2,
            "the dataset and its snapshot"
        );
        assert!(written_in(&p, dsl_obj) < txg, "the index was rewritten");

        // Renamed in place: t's child map alone.
        let before = layer_objects(&p);
        p.dsl_pool().rename_dataset("t/a", "t/z").expect("rename");
        let txg = p.sync().expect("sync");
        assert_eq!(rewritten(&before, &p, txg), vec![t.children]);

        // Moved to another parent: its directory record (its parent) and
        // both parents' maps; t/other had no child map, so its record
        // (which names the new map) too.
        let before = layer_objects(&p);
        p.dsl_pool()
            .rename_dataset("t/z/b", "t/other/b")
            .expect("move");
        let txg = p.sync().expect("sync");
        let other = objs_of(&p, "t/other");
        assert!(other.children != 0);
        let mut want = vec![b.dir, a.children, other.children, other.dir];
        want.sort_unstable();
        assert_eq!(rewritten(&before, &p, txg), want);

        // Destroyed: its directory and maps are freed.
        let c = objs_of(&p, "t/other/b/c");
        p.dsl_pool()
            .destroy_dataset("t/other/b/c", false)
            .expect("destroy");
        p.sync().expect("sync");
        assert!(!p.mos.exists(c.dir).expect("exists"), "directory not freed");

        // The tree reads back whole.
        p.close().expect("close");
        drop(p);
        let p = sim_reimport(&world, &d, sim_tunables()).expect("import");
        let mut names: Vec<String> = p.dsl_pool().datasets().iter().map(|d| d.rel()).collect();
        names.sort();
        assert_eq!(names, vec!["", "other", "other/b", "z"]);
        assert_eq!(p.dsl_pool().snapshots().len(), 42);
        assert!(
            p.dsl_pool().snapshot("t/other/b@x").is_ok(),
            "a moved dataset's snapshot"
        );
        let (v, _) = p
            .dsl_pool()
            .get_prop(&p.dsl_pool().dataset("t/other/b").expect("b"), "com.x:tag")
            .expect("prop");
        assert_eq!(v, "-", "a property of the destroyed child leaked");
        let (_, layout) = read_dsl(&p.mos, dsl_obj).expect("read");
        assert!(matches!(layout, Layout::Dirs { .. }));
        p.close().expect("close");
        zdb_clean(&world, &d, "dirs");
    }

    /// Every layout reads and converts: a pool with the records inline
    /// (the first layout) imports, and its first sync writes the dirs
    /// layout with nothing lost; without `dsl_dirs` the records layout is
    /// written, without `dsl_records` too the inline one; enabled again
    /// (`zpool upgrade`), the dirs layout, and each reads back after
    /// export.
    #[test]
    fn every_layout_reads_and_converts() {
        let world = SimWorld::new();
        let (mut d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(3)).expect("pool");
        p.dsl_pool().format_root_fs().expect("format");
        p.dsl_pool()
            .create_dataset("t/a/b", &[], true)
            .expect("create");
        let obj = p.create_object(4096, &ObjProps::default()).expect("object");
        for i in 0..10u8 {
            p.write(obj, 0, &vec![i | 1; 64 << 10]).expect("write");
            p.dsl_pool()
                .create_snapshots(&[format!("t@s{i}"), format!("t/a@s{i}")])
                .expect("snapshot");
        }
        p.write(obj, 0, &vec![0x55; 64 << 10]).expect("write");
        p.sync().expect("sync");
        let dsl_obj = lock(&p.st).dir.dsl;
        let all = p.dsl_pool().dsl_record_now();
        let dead = all.datasets.iter().map(|d| d.dead_bytes).sum::<u64>();
        assert!(dead > 0);
        let inline = DslIndex {
            datasets: all.datasets.clone(),
            snapshots: all.snapshots.clone(),
            ..Default::default()
        };
        p.write_json(dsl_obj, &inline).expect("inline record");
        p.sync().expect("sync");
        p.close().expect("close");
        drop(p);
        let (d2, mut p) = reopen(&world, &d);
        d = d2;
        let check = |p: &Pool, want: &str| {
            let (now, layout) = read_dsl(&p.mos, dsl_obj).expect("read");
            let got = match layout {
                Layout::Inline => "inline",
                Layout::Records => "records",
                Layout::Dirs { .. } => "dirs",
            };
            assert_eq!(got, want, "layout");
            assert_eq!(now.snapshots.len(), 20);
            let mut names: Vec<String> = now.datasets.iter().map(|d| d.rel.clone()).collect();
            names.sort();
            assert_eq!(names, vec!["", "a", "a/b"]);
            assert_eq!(now.datasets.iter().map(|d| d.dead_bytes).sum::<u64>(), dead);
        };
        check(&p, "inline");
        p.sync().expect("sync");
        check(&p, "dirs");
        let feature = |p: &Pool, f: &str| p.config().features.get(f).map(|e| e.state);
        assert_eq!(
            feature(&p, crate::spa::feature::DSL_DIRS),
            Some(crate::spa::config::FeatureState::Active)
        );
        for (drop_features, want) in [
            (&[crate::spa::feature::DSL_DIRS][..], "records"),
            (&[crate::spa::feature::DSL_RECORDS][..], "inline"),
            (&[][..], "dirs"),
        ] {
            if drop_features.is_empty() {
                // `zpool upgrade`: what the pool lacks is enabled, and the
                // layer is rewritten in the layout that allows.
                let missing = p.missing_features();
                assert_eq!(
                    missing,
                    vec![
                        crate::spa::feature::DSL_RECORDS,
                        crate::spa::feature::DSL_DIRS
                    ]
                );
                assert_eq!(p.enable_features().expect("upgrade"), missing);
                assert!(p.missing_features().is_empty());
                assert!(p.enable_features().expect("again").is_empty());
            } else {
                let mut st = lock(&p.st);
                for f in drop_features {
                    st.config.features.remove(*f);
                }
                st.config_dirty = true;
            }
            *lock(&p.dsl.dirty) = true;
            p.sync().expect("sync");
            check(&p, want);
            p.close().expect("close");
            drop(p);
            (d, p) = reopen(&world, &d);
            zdb_clean(&world, &d, want);
            check(&p, want);
            assert_eq!(p.dsl_pool().snapshots().len(), 20);
        }
        p.close().expect("close");
    }

    /// A damaged tree is refused with the reason, never walked forever: a
    /// child map that leads back to the root, and a snapshot filed under
    /// another dataset's map.
    #[test]
    fn a_damaged_tree_is_refused() {
        for damage in ["loop", "misfiled"] {
            let world = SimWorld::new();
            let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(3)).expect("pool");
            p.dsl_pool().format_root_fs().expect("format");
            p.dsl_pool()
                .create_dataset("t/a", &[], false)
                .expect("create");
            p.dsl_pool()
                .create_snapshots(&["t@s".to_string(), "t/a@s".to_string()])
                .expect("snapshot");
            p.sync().expect("sync");
            let (t, a) = (objs_of(&p, "t"), objs_of(&p, "t/a"));
            let snap = p.dsl_pool().snapshot("t@s").expect("snap").1.phys().id;
            match damage {
                "loop" => Zap::open(&p.mos, t.children).insert(b"back", t.dir, 0),
                _ => Zap::open(&p.mos, a.snaps).insert(b"other", snap, 0),
            }
            .expect("insert");
            p.sync().expect("sync");
            p.close().expect("close");
            drop(p);
            let err = match sim_reimport(&world, &d, sim_tunables()) {
                Ok(_) => panic!("{damage}: a damaged tree imported"),
                Err(e) => e.to_string(),
            };
            let want = match damage {
                "loop" => "reached twice",
                _ => "filed as 'other'",
            };
            assert!(err.contains(want), "{damage}: {err}");
        }
    }
}
