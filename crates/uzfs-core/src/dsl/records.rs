//! The dataset layer on disk: one MOS object per dataset and per snapshot
//! (OpenZFS keeps a `dsl_dataset_phys_t` in each dataset's bonus buffer).
//!
//! Each dataset's and each snapshot's MOS object (type `DSL_DATASET`)
//! holds its object-set block pointer in its first 128 bytes and its
//! record (JSON [`DsPhys`] or [`SnapPhys`]) from byte 128 on. The DSL
//! directory object (`ObjectDirectory::dsl`) is an index: which objects
//! hold dataset records and which hold snapshot records ([`DslIndex`]).
//!
//! A sync writes only the records that changed since the last one it
//! wrote (it keeps their bytes), and the index only when datasets or
//! snapshots came or went. Before, one JSON document held every record
//! and was rewritten whole whenever any of them changed: with a thousand
//! snapshots, every txg that let go of a snapshotted block (its dataset's
//! dead-list size changed) rewrote all thousand. A pool written by a
//! build before this (records inline in the directory object) is read as
//! it is and rewritten in this layout by its first sync
//! (`com.uzfs:dsl_records`).
//!
//! The index is still one list of object numbers (8 bytes or so a
//! snapshot), rewritten when a snapshot is taken or destroyed; OpenZFS
//! keeps ZAPs of each dataset's children and snapshots, the next step if
//! that list grows to matter.

use super::snapshot::SnapPhys;
use super::{DsPhys, DslDirPhys};
use crate::dmu::objset::{BlockWriter, Objset, TxgDirty};
use crate::error::{Error, Result};
use crate::spa::{lock, Pool};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Where a record starts in its object (after the object-set pointer).
pub const RECORD_OFF: u64 = 128;
/// Largest record read back (a record is a few hundred bytes; user
/// properties make it grow).
const RECORD_MAX: u64 = 1 << 20;

/// The DSL directory object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DslIndex {
    /// Objects holding dataset records (this layout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dataset_ids: Vec<u64>,
    /// Objects holding snapshot records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot_ids: Vec<u64>,
    /// The layout before: every record inline (read, never written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DsPhys>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapPhys>,
}

/// What the last sync wrote, so the next writes only what differs.
#[derive(Default)]
pub struct Written {
    records: HashMap<u64, Vec<u8>>,
    index: Option<DslIndex>,
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

/// Every record as committed in `mos` (either layout), and whether it was
/// the old inline one.
pub fn read_dsl(mos: &Objset, dsl_obj: u64) -> Result<(DslDirPhys, bool)> {
    if dsl_obj == 0 || !mos.exists(dsl_obj)? {
        return Ok((DslDirPhys::default(), false));
    }
    let ix: DslIndex = Pool::read_json(mos, dsl_obj, "DSL directory")?;
    let inline = !ix.datasets.is_empty() || !ix.snapshots.is_empty();
    if inline && (!ix.dataset_ids.is_empty() || !ix.snapshot_ids.is_empty()) {
        return Err(Error::corrupt(
            "DSL directory",
            "both record layouts at once",
        ));
    }
    if inline {
        return Ok((
            DslDirPhys {
                datasets: ix.datasets,
                snapshots: ix.snapshots,
            },
            true,
        ));
    }
    let out = DslDirPhys {
        datasets: read_records(mos, &ix.dataset_ids, "dataset record", |d: &DsPhys| d.id)?,
        snapshots: read_records(mos, &ix.snapshot_ids, "snapshot record", |s: &SnapPhys| {
            s.id
        })?,
    };
    Ok((out, false))
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

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::invalid(e.to_string()))
}

impl Pool {
    /// Import: what was read is what is on disk (an inline-layout pool
    /// has nothing in this layout yet: its first sync writes it all).
    pub(crate) fn note_records_read(&self, dsl: &DslDirPhys, inline: bool) -> Result<()> {
        let mut w = lock(&self.dsl.written);
        if inline {
            *w = Written::default();
            *lock(&self.dsl.dirty) = true;
            return Ok(());
        }
        for d in &dsl.datasets {
            w.records.insert(d.id, json(d)?);
        }
        for s in &dsl.snapshots {
            w.records.insert(s.id, json(s)?);
        }
        w.index = Some(index_of(dsl));
        Ok(())
    }

    /// Sync context: write each record that changed and, if datasets or
    /// snapshots came or went, the index. On a pool where the feature is
    /// not enabled (made by a build before it, not upgraded), every record
    /// inline, as that build wrote them.
    pub(crate) fn sync_dsl_records(
        &self,
        w: &mut dyn BlockWriter,
        extra: &mut TxgDirty,
        dsl_obj: u64,
        enabled: bool,
    ) -> Result<()> {
        let Some(all) = self.dsl_record() else {
            return Ok(());
        };
        let mut written = lock(&self.dsl.written);
        if !enabled {
            let inline = DslIndex {
                datasets: all.datasets,
                snapshots: all.snapshots,
                ..Default::default()
            };
            self.mos
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
                self.mos.replace_in_sync(extra, id, RECORD_OFF, &bytes)?;
            }
            keep.insert(id, bytes);
        }
        written.records = keep;
        if written.index.as_ref() != Some(&ix) {
            self.mos.replace_in_sync(extra, dsl_obj, 0, &json(&ix)?)?;
            w.note_feature(crate::spa::feature::DSL_RECORDS);
            written.index = Some(ix);
        }
        Ok(())
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
    use crate::vdev::sim::SimWorld;

    /// The txg a MOS object was last written in.
    fn written_in(p: &Pool, obj: u64) -> u64 {
        let dn = p.mos.synced_dnode(obj).expect("dnode");
        dn.blkptr.iter().map(|b| b.birth).max().unwrap_or(0)
    }

    /// With 40 snapshots, a txg that lets go of snapshotted blocks (the
    /// dataset's dead list grows) rewrites the dataset's record and
    /// nothing of the snapshots' or the index. A pool with the records
    /// inline (the layout before) imports, and its first sync moves them
    /// out with nothing lost.
    #[test]
    fn a_txg_rewrites_only_the_records_that_changed() {
        let world = SimWorld::new();
        let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(3)).expect("pool");
        p.format_root_fs().expect("format");
        let obj = p.create_object(4096, &ObjProps::default()).expect("object");
        for i in 0..40u8 {
            p.write(obj, 0, &vec![i | 1; 64 << 10]).expect("write");
            p.create_snapshots(&[format!("t@s{i}")]).expect("snapshot");
        }
        let (dsl_obj, root) = {
            let st = lock(&p.st);
            (st.dir.dsl, st.dir.root_dataset)
        };
        let snap_ids: Vec<u64> = p.snapshots().iter().map(|(_, s)| s.phys().id).collect();
        assert_eq!(snap_ids.len(), 40);
        let before = p.sync().expect("sync");
        p.write(obj, 0, &vec![0x77; 64 << 10]).expect("overwrite");
        let txg = p.sync().expect("sync");
        assert!(txg > before);
        assert!(
            p.dataset("t")
                .expect("root")
                .phys
                .read()
                .expect("phys")
                .dead_bytes
                > 0
        );
        assert_eq!(written_in(&p, root), txg, "the dataset's record");
        assert!(written_in(&p, dsl_obj) < txg, "the index was rewritten");
        for id in &snap_ids {
            assert!(
                written_in(&p, *id) < txg,
                "snapshot record {id} was rewritten"
            );
        }
        // The layout before: every record inline in the directory object.
        let all = p.dsl_record_now();
        let dead = all.datasets.iter().map(|d| d.dead_bytes).sum::<u64>();
        let inline = DslIndex {
            datasets: all.datasets.clone(),
            snapshots: all.snapshots.clone(),
            ..Default::default()
        };
        p.write_json(dsl_obj, &inline).expect("inline record");
        p.sync().expect("sync");
        p.close().expect("close");
        drop(p);
        let p = sim_reimport(&world, &d, sim_tunables()).expect("import inline");
        assert_eq!(p.snapshots().len(), 40);
        let (_, was_inline) = read_dsl(&p.mos, dsl_obj).expect("read");
        assert!(was_inline);
        p.sync().expect("sync");
        let (now, was_inline) = read_dsl(&p.mos, dsl_obj).expect("read");
        assert!(!was_inline, "the first sync did not move the records out");
        assert_eq!(now.snapshots.len(), 40);
        assert_eq!(now.datasets.iter().map(|d| d.dead_bytes).sum::<u64>(), dead);
        let feature = p
            .config()
            .features
            .get(crate::spa::feature::DSL_RECORDS)
            .map(|e| e.state);
        assert_eq!(feature, Some(crate::spa::config::FeatureState::Active));
        // A pool that does not list the feature (made before it, not
        // upgraded) keeps them inline.
        {
            let mut st = lock(&p.st);
            st.config.features.remove(crate::spa::feature::DSL_RECORDS);
            st.config_dirty = true;
        }
        *lock(&p.dsl.dirty) = true;
        p.sync().expect("sync");
        let (back, inline) = read_dsl(&p.mos, dsl_obj).expect("read");
        assert!(
            inline,
            "records left their objects on a pool without the feature"
        );
        assert_eq!(back.snapshots.len(), 40);
        p.close().expect("close");
    }
}
