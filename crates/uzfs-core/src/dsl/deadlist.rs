//! Dead lists: the blocks a dataset or snapshot let go of that the
//! snapshot before it still holds, kept in sub-lists by birth-time key
//! (OpenZFS `dsl_deadlist.c`).
//!
//! # Theory of operation
//!
//! A dataset's *line* is the txgs of the snapshots its history passes
//! through: its own snapshots and, for a clone, its origin and the
//! snapshots before the origin in the origin's own line. Promote moves
//! snapshots between datasets but changes no line: what was a clone's
//! line through its origin becomes its own.
//!
//! Every entry of a dead list sits in a sub-list whose *key* is the
//! greatest txg of the line, at the time the entry was added, that is
//! below the entry's birth (0 if none). The invariant, checked by zdb:
//!
//! > key < birth, and no snapshot now in the line was taken in a txg t
//! > with key < t < birth.
//!
//! It holds when the entry is added, a new snapshot is taken after every
//! birth already listed, and destroying snapshots only removes txgs from
//! the line. So for a snapshot P of the line, "born after P" is exactly
//! "key ≥ P.txg", and "born by P" is "key < P.txg": the questions a
//! destroy, `used`, `written` and rollback ask are answered from the
//! sub-lists' headers alone, without reading an entry.
//!
//! * **Destroying snapshot S** (P before it, N after it) frees N's
//!   sub-lists keyed P.txg or later whole (their objects go to the free
//!   queue, `async_destroy.rs`, which frees their blocks within each txg's
//!   budget), and hands S's sub-lists to N (every key of S is below P.txg:
//!   S's entries were held by P). Cost: the number of sub-lists, never
//!   the number of blocks.
//! * **Rollback** gives the head every block of its list back: the
//!   sub-list objects are freed, their blocks are not.
//! * **Promote** moves one entry (the origin's object-set block) from one
//!   list to another: the sub-list holding it is read and rewritten.
//!
//! The number of sub-lists of a list is at most the number of snapshots
//! ever in its line, and a merge concatenates headers, so several
//! sub-lists may share a key (appends go to the last one).
//!
//! # On disk (docs/ON_DISK_FORMAT.md, "Dead lists")
//!
//! A dead list is a MOS object of type `DEADLIST_MAP`: an array of
//! 40-byte headers, sorted by key:
//!
//! ```text
//!  0       8       16      24      32      40
//!  +-------+-------+-------+-------+-------+
//!  |  key  |  obj  | count | bytes | osbyt |   little-endian u64 each
//!  +-------+-------+-------+-------+-------+
//! ```
//!
//! `obj` is a MOS object of type `DEADLIST`: `count` block pointers of 128
//! bytes each; `bytes` their size as charged to `used`, `osbyt` the part
//! of it that is object-set blocks (no `referenced` counts those). Lists
//! written before keys (feature `com.uzfs:deadlist_keys`) are a bare
//! `DEADLIST` object; they are read as they are and converted by the
//! first sync of a writable import.

use super::rlock;
use super::DslPool;
use crate::dmu::blkptr::{BlkPtr, BLKPTR_SIZE};
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{BlockWriter, Objset, TxgDirty};
use crate::error::{Error, Result};
use crate::spa::lock;
use std::collections::BTreeMap;

/// Data block size of dead-list objects (headers and sub-lists).
pub(crate) const DEADLIST_BLOCK: u32 = 16 << 10;

/// Bytes of one header entry.
pub const SUBLIST_SIZE: usize = 40;

/// One sub-list's header entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubList {
    pub key: u64,
    pub obj: u64,
    pub count: u64,
    pub bytes: u64,
    pub objset_bytes: u64,
}

impl SubList {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.key,
            self.obj,
            self.count,
            self.bytes,
            self.objset_bytes,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> SubList {
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        SubList {
            key: w(0),
            obj: w(1),
            count: w(2),
            bytes: w(3),
            objset_bytes: w(4),
        }
    }
}

/// Which entries a question is about, by birth relative to the txg of a
/// snapshot of the list's line.
#[derive(Clone, Copy, Debug)]
pub enum Born {
    /// birth > txg (key ≥ txg).
    After(u64),
    /// birth ≤ txg (key < txg).
    By(u64),
}

impl Born {
    fn key(self, key: u64) -> bool {
        match self {
            Born::After(t) => key >= t,
            Born::By(t) => key < t,
        }
    }
    fn birth(self, birth: u64) -> bool {
        match self {
            Born::After(t) => birth > t,
            Born::By(t) => birth <= t,
        }
    }
}

/// The key of an entry born in `birth` in a list of line `line` (the
/// line's snapshot txgs, ascending).
pub fn key_for(line: &[u64], birth: u64) -> u64 {
    let i = line.partition_point(|t| *t < birth);
    i.checked_sub(1).map_or(0, |i| line[i])
}

/// Encode block pointers as a sub-list's contents.
pub(crate) fn encode_bps(bps: &[BlkPtr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bps.len() * BLKPTR_SIZE);
    for bp in bps {
        out.extend_from_slice(&bp.to_bytes());
    }
    out
}

/// The synced dnode of `obj`, which must be a flat list of block pointers
/// (a sub-list, a legacy list, a free-queue `blocks` object).
pub fn list_dnode(mos: &Objset, obj: u64) -> Result<crate::dmu::dnode::DnodePhys> {
    let dn = mos.synced_dnode(obj)?;
    if dn.obj_type != ot::DEADLIST {
        return Err(Error::corrupt(
            "dead list",
            format!("object {obj} is a {} object", ot::name(dn.obj_type)),
        ));
    }
    Ok(dn)
}

/// Bytes of the sub-lists born as `born` says, object-set blocks included
/// or not.
fn born_bytes(subs: &[SubList], born: Born, objsets: bool) -> u64 {
    subs.iter()
        .filter(|s| born.key(s.key))
        .map(|s| s.bytes - if objsets { 0 } else { s.objset_bytes })
        .sum()
}

/// A header's bytes.
fn encode_header(subs: &[SubList]) -> Vec<u8> {
    let mut hdr = Vec::with_capacity(subs.len() * SUBLIST_SIZE);
    for s in subs {
        s.encode(&mut hdr);
    }
    hdr
}

/// The block pointers of flat object `obj` (a sub-list, a legacy list, a
/// free-queue `blocks` object) as the last sync left them.
pub fn read_bps(mos: &Objset, obj: u64) -> Result<Vec<BlkPtr>> {
    let size = list_dnode(mos, obj)?.size as usize;
    if !size.is_multiple_of(BLKPTR_SIZE) {
        return Err(Error::corrupt(
            "dead list",
            format!("object {obj}: {size} bytes"),
        ));
    }
    let mut buf = vec![0u8; size];
    mos.read(obj, 0, &mut buf)?;
    buf.chunks_exact(BLKPTR_SIZE).map(BlkPtr::decode).collect()
}

/// Dead list `obj`'s sub-lists as the last sync left them; `None` for a
/// list written before keys (one flat object).
pub fn read_header(mos: &Objset, obj: u64) -> Result<Option<Vec<SubList>>> {
    if obj == 0 {
        return Ok(Some(Vec::new()));
    }
    let dn = mos.synced_dnode(obj)?;
    match dn.obj_type {
        ot::DEADLIST => return Ok(None),
        ot::DEADLIST_MAP => {}
        t => {
            return Err(Error::corrupt(
                "dead list",
                format!("object {obj} is a {} object", ot::name(t)),
            ))
        }
    }
    let size = dn.size as usize;
    if !size.is_multiple_of(SUBLIST_SIZE) {
        return Err(Error::corrupt(
            "dead list",
            format!("header {obj}: {size} bytes"),
        ));
    }
    let mut buf = vec![0u8; size];
    mos.read(obj, 0, &mut buf)?;
    decode_header(obj, &buf).map(Some)
}

/// A header's bytes, checked: whole entries, keys in order, no empty or
/// unnamed sub-list.
pub fn decode_header(obj: u64, buf: &[u8]) -> Result<Vec<SubList>> {
    if !buf.len().is_multiple_of(SUBLIST_SIZE) {
        return Err(Error::corrupt(
            "dead list",
            format!("header {obj}: {} bytes", buf.len()),
        ));
    }
    let subs: Vec<SubList> = buf
        .chunks_exact(SUBLIST_SIZE)
        .map(SubList::decode)
        .collect();
    if let Some(w) = subs.windows(2).find(|w| w[0].key > w[1].key) {
        return Err(Error::corrupt(
            "dead list",
            format!("header {obj}: key {} after key {}", w[1].key, w[0].key),
        ));
    }
    if let Some(s) = subs
        .iter()
        .find(|s| s.obj == 0 || s.count == 0 || s.objset_bytes > s.bytes)
    {
        return Err(Error::corrupt(
            "dead list",
            format!("header {obj}: impossible sub-list {s:?}"),
        ));
    }
    Ok(subs)
}

/// Every entry of dead list `obj` (either layout), as the last sync left
/// it, with its key (`None`: a list written before keys).
pub fn read_keyed(mos: &Objset, obj: u64) -> Result<Vec<(Option<u64>, BlkPtr)>> {
    if obj == 0 {
        return Ok(Vec::new());
    }
    match read_header(mos, obj)? {
        None => Ok(read_bps(mos, obj)?.into_iter().map(|b| (None, b)).collect()),
        Some(subs) => {
            let mut out = Vec::new();
            for s in subs {
                let bps = read_bps(mos, s.obj)?;
                if bps.len() as u64 != s.count {
                    return Err(Error::corrupt(
                        "dead list",
                        format!(
                            "sub-list {} of {obj}: {} entries, the header says {}",
                            s.obj,
                            bps.len(),
                            s.count
                        ),
                    ));
                }
                out.extend(bps.into_iter().map(|b| (Some(s.key), b)));
            }
            Ok(out)
        }
    }
}

/// Every entry of dead list `obj`, as the last sync left it.
pub fn read_all(mos: &Objset, obj: u64) -> Result<Vec<BlkPtr>> {
    Ok(read_keyed(mos, obj)?.into_iter().map(|(_, b)| b).collect())
}

/// The line of `ds` as (txg) ascending, given each dataset's snapshot
/// txgs and each dataset's origin (its dataset and txg).
pub(crate) fn line_of(
    ds: u64,
    snap_txgs: impl Fn(u64) -> Vec<u64>,
    origin: impl Fn(u64) -> Option<(u64, u64)>,
    depth: usize,
) -> Vec<u64> {
    let mut out = Vec::new();
    let (mut cur, mut upto) = (ds, u64::MAX);
    // A cycle of origins is corrupt; stop after as many steps as there
    // are datasets rather than loop.
    for _ in 0..=depth {
        out.extend(snap_txgs(cur).into_iter().filter(|t| *t <= upto));
        match origin(cur) {
            Some((o, t)) => (cur, upto) = (o, t),
            None => break,
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl DslPool<'_> {
    /// The line of dataset `ds` (see the module docs).
    pub(crate) fn line_txgs(&self, ds: u64) -> Vec<u64> {
        let depth = rlock(&self.dsl().list).len();
        line_of(
            ds,
            |d| {
                self.snapshots_of(d)
                    .iter()
                    .map(|s| s.phys.read().txg)
                    .collect()
            },
            |d| {
                let h = rlock(&self.dsl().list).get(&d).cloned()?;
                let o = self.origin_snap(&h)?;
                let op = o.phys.read();
                Some((op.ds, op.txg))
            },
            depth,
        )
    }

    /// Bytes (as charged to `used`) of the entries of dead lists `lists`
    /// born as `born` says, object-set blocks included or not, as the
    /// last txg left them. Reads headers only (a list written before keys
    /// is read whole).
    pub(crate) fn dead_bytes(&self, lists: &[u64], born: Born, objsets: bool) -> Result<u64> {
        let mut total = 0;
        for &dl in lists.iter().filter(|dl| **dl != 0) {
            match read_header(&self.spa.mos, dl)? {
                Some(subs) => total += born_bytes(&subs, born, objsets),
                None => {
                    let entries = read_bps(&self.spa.mos, dl)?;
                    let st = lock(&self.spa.st);
                    total += entries
                        .iter()
                        .filter(|b| born.birth(b.birth) && (objsets || b.obj_type != ot::OBJSET))
                        .map(|b| st.alloc.dsize(b))
                        .sum::<u64>();
                }
            }
        }
        Ok(total)
    }

    /// Sync context, once per import: rewrite every list written before
    /// keys (one flat object) as a keyed one. Returns the objects
    /// replaced (old, new), so this txg's appends follow them.
    pub(crate) fn convert_flat_deadlists(&self, dls: &mut DlSync<'_>) -> Result<Vec<(u64, u64)>> {
        let mut moved = Vec::new();
        let heads: Vec<_> = rlock(&self.dsl().list).values().cloned().collect();
        let snaps: Vec<_> = rlock(&self.dsl().snaps).values().cloned().collect();
        let mut convert = |old: u64, ds: u64| -> Result<Option<u64>> {
            if old == 0 || read_header(&self.spa.mos, old)?.is_some() {
                return Ok(None);
            }
            let line = self.line_txgs(ds);
            let new = dls.create()?;
            for bp in read_bps(&self.spa.mos, old)? {
                dls.append(new, key_for(&line, bp.birth), bp)?;
            }
            dls.free_object(old);
            moved.push((old, new));
            Ok(Some(new))
        };
        for h in heads {
            let old = h.phys.read().deadlist;
            if let Some(new) = convert(old, h.id())? {
                h.phys.write().deadlist = new;
            }
        }
        for s in snaps {
            let (old, ds) = {
                let p = s.phys.read();
                (p.deadlist, p.ds)
            };
            if let Some(new) = convert(old, ds)? {
                s.phys.write().deadlist = new;
            }
        }
        if !moved.is_empty() {
            log::info!(
                "pool '{}': {} dead lists rewritten with birth-time keys",
                self.spa.name,
                moved.len()
            );
        }
        Ok(moved)
    }
}

/// One dead list's state in a sync.
#[derive(Default)]
struct Dl {
    /// Its header (loaded on first use).
    subs: Option<Vec<SubList>>,
    /// Entries this txg adds, by key, not yet in any sub-list.
    pending: BTreeMap<u64, Vec<BlkPtr>>,
    /// Created in this txg.
    created: bool,
    /// The header must be written.
    changed: bool,
}

/// The dead lists a sync changes. Sub-list objects are written only by
/// [`DlSync::write`], at the end of the sync's DSL pass, so every
/// sub-list an operation hands out (to the free queue) holds exactly what
/// the last txg left in it.
pub(crate) struct DlSync<'a> {
    mos: &'a Objset,
    extra: &'a mut TxgDirty,
    lists: BTreeMap<u64, Dl>,
    /// MOS objects to free when the txg commits (headers of merged lists,
    /// sub-lists rolled back or rewritten).
    freed: Vec<u64>,
}

impl<'a> DlSync<'a> {
    pub fn new(mos: &'a Objset, extra: &'a mut TxgDirty) -> Self {
        DlSync {
            mos,
            extra,
            lists: BTreeMap::new(),
            freed: Vec::new(),
        }
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty() && self.freed.is_empty()
    }

    /// The sync's MOS changes, for the operations beside dead lists.
    pub fn extra(&mut self) -> &mut TxgDirty {
        self.extra
    }

    /// A new, empty dead list.
    pub fn create(&mut self) -> Result<u64> {
        let obj = self.mos.create_in_sync(
            self.extra,
            ot::DEADLIST_MAP,
            DEADLIST_BLOCK,
            &ObjProps::METADATA,
        )?;
        self.lists.insert(
            obj,
            Dl {
                subs: Some(Vec::new()),
                created: true,
                ..Default::default()
            },
        );
        Ok(obj)
    }

    /// Free MOS object `obj` when the txg commits.
    pub fn free_object(&mut self, obj: u64) {
        self.lists.remove(&obj);
        self.freed.push(obj);
    }

    fn load(&mut self, obj: u64) -> Result<&mut Dl> {
        let mos = self.mos;
        let dl = self.lists.entry(obj).or_default();
        if dl.subs.is_none() {
            dl.subs = Some(read_header(mos, obj)?.ok_or_else(|| {
                Error::invalid(format!("dead list {obj} has no keys (not converted)"))
            })?);
        }
        Ok(dl)
    }

    /// Add `bp` to list `obj` under `key`.
    pub fn append(&mut self, obj: u64, key: u64, bp: BlkPtr) -> Result<()> {
        self.load(obj)?.pending.entry(key).or_default().push(bp);
        Ok(())
    }

    /// Take out of list `obj` every entry keyed `min_key` or later: whole
    /// sub-lists (their objects now the caller's) and this txg's entries.
    pub fn take_from(&mut self, obj: u64, min_key: u64) -> Result<(Vec<SubList>, Vec<BlkPtr>)> {
        if obj == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let dl = self.load(obj)?;
        let subs = dl.subs.get_or_insert_with(Vec::new);
        let at = subs.partition_point(|s| s.key < min_key);
        let taken: Vec<SubList> = subs.split_off(at);
        dl.changed |= !taken.is_empty();
        let later = dl.pending.split_off(&min_key);
        Ok((taken, later.into_values().flatten().collect()))
    }

    /// Move everything of list `from` into list `into` (0: a new list is
    /// made if `from` holds anything); `from`'s header object is freed.
    /// Returns `into`'s object.
    pub fn merge(&mut self, from: u64, mut into: u64) -> Result<u64> {
        if from == 0 {
            return Ok(into);
        }
        let f = self.load(from)?;
        let subs = f.subs.take().unwrap_or_default();
        let pending = std::mem::take(&mut f.pending);
        self.free_object(from);
        if into == 0 {
            if subs.is_empty() && pending.is_empty() {
                return Ok(0);
            }
            into = self.create()?;
        }
        let t = self.load(into)?;
        let all = t.subs.get_or_insert_with(Vec::new);
        if !subs.is_empty() {
            all.extend(subs);
            // Stable: sub-lists of one key keep their order, the last
            // still the one appends go to.
            all.sort_by_key(|s| s.key);
            t.changed = true;
        }
        for (k, mut v) in pending {
            t.pending.entry(k).or_default().append(&mut v);
        }
        Ok(into)
    }

    /// Rollback: every block of list `obj` is its dataset's again. Its
    /// sub-lists are dropped (their objects freed, not their blocks);
    /// this txg's entries stay.
    pub fn clear(&mut self, obj: u64) -> Result<()> {
        if obj == 0 {
            return Ok(());
        }
        let dl = self.load(obj)?;
        let subs = std::mem::take(dl.subs.get_or_insert_with(Vec::new));
        dl.changed |= !subs.is_empty();
        self.freed.extend(subs.iter().map(|s| s.obj));
        Ok(())
    }

    /// Bytes of list `obj`'s sub-lists born as `born` says (this txg's
    /// entries aside).
    pub fn bytes(&mut self, obj: u64, born: Born) -> Result<u64> {
        if obj == 0 {
            return Ok(0);
        }
        let dl = self.load(obj)?;
        Ok(born_bytes(
            dl.subs.as_deref().unwrap_or_default(),
            born,
            true,
        ))
    }

    /// Remove the entry `is` picks (one born in `birth`) from list `obj`:
    /// the sub-list that holds it becomes this txg's entries (its object
    /// freed), so nothing handed out later reads a rewritten object.
    /// Returns whether it was there.
    pub fn remove(&mut self, obj: u64, birth: u64, is: impl Fn(&BlkPtr) -> bool) -> Result<bool> {
        if obj == 0 {
            return Ok(false);
        }
        let mos = self.mos;
        let dl = self.load(obj)?;
        for v in dl.pending.values_mut() {
            if let Some(i) = v.iter().position(&is) {
                v.remove(i);
                return Ok(true);
            }
        }
        let subs = dl.subs.get_or_insert_with(Vec::new);
        // Only sub-lists keyed below its birth can hold it; the nearest
        // key first.
        let below = subs.partition_point(|s| s.key < birth);
        let mut found = None;
        for i in (0..below).rev() {
            let s = subs[i];
            let mut bps = read_bps(mos, s.obj)?;
            if let Some(at) = bps.iter().position(&is) {
                bps.remove(at);
                subs.remove(i);
                dl.changed = true;
                dl.pending.entry(s.key).or_default().extend(bps);
                found = Some(s.obj);
                break;
            }
        }
        self.freed.extend(found);
        Ok(found.is_some())
    }

    /// Write every change: this txg's entries appended to the last
    /// sub-list of their key (a new one if none), then the headers that
    /// changed. Returns the objects to free with the txg.
    pub fn write(mut self, w: &mut dyn BlockWriter) -> Result<Vec<u64>> {
        for (obj, mut dl) in std::mem::take(&mut self.lists) {
            let Some(mut subs) = dl.subs.take() else {
                continue;
            };
            for (key, bps) in std::mem::take(&mut dl.pending) {
                if bps.is_empty() {
                    continue;
                }
                let bytes: u64 = bps.iter().map(|b| w.dsize(b)).sum();
                let objset_bytes: u64 = bps
                    .iter()
                    .filter(|b| b.obj_type == ot::OBJSET)
                    .map(|b| w.dsize(b))
                    .sum();
                let at = subs.partition_point(|s| s.key <= key);
                let s = match at.checked_sub(1).filter(|i| subs[*i].key == key) {
                    Some(i) => &mut subs[i],
                    None => {
                        let o = self.mos.create_in_sync(
                            self.extra,
                            ot::DEADLIST,
                            DEADLIST_BLOCK,
                            &ObjProps::METADATA,
                        )?;
                        subs.insert(
                            at,
                            SubList {
                                key,
                                obj: o,
                                ..Default::default()
                            },
                        );
                        &mut subs[at]
                    }
                };
                self.mos.write_in_sync(
                    self.extra,
                    s.obj,
                    s.count * BLKPTR_SIZE as u64,
                    &encode_bps(&bps),
                )?;
                s.count += bps.len() as u64;
                s.bytes += bytes;
                s.objset_bytes += objset_bytes;
                dl.changed = true;
            }
            if dl.changed || dl.created {
                self.mos
                    .replace_in_sync(self.extra, obj, 0, &encode_header(&subs))?;
                if !subs.is_empty() {
                    w.note_feature(crate::spa::feature::DEADLIST_KEYS);
                }
            }
        }
        for obj in &self.freed {
            self.extra.free_object(*obj);
        }
        Ok(std::mem::take(&mut self.freed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::{sim_pool, sim_reimport, sim_tunables, Pool};
    use crate::vdev::sim::{SimDevice, SimWorld};
    use crate::vdev::BlockDevice;
    use std::sync::Arc;

    /// Every snapshot's `used` and `written`, and the dataset's
    /// `written@` each: what the keys answer.
    fn figures(p: &Pool) -> Vec<u64> {
        let d = p.dsl_pool().dataset("t").expect("dataset");
        let mut out = Vec::new();
        for (_, s) in p.dsl_pool().snapshots() {
            out.push(p.dsl_pool().snapshot_unique(&s).expect("used"));
            out.push(p.dsl_pool().snapshot_written(&s).expect("written"));
            out.push(p.dsl_pool().written_since(&d, &s).expect("written@"));
        }
        out
    }

    fn zdb_clean(world: &SimWorld, d: &SimDevice, what: &str) {
        let img: Arc<dyn BlockDevice> = Arc::new(world.disk_from_image("d0", d.image()));
        let r = crate::zdb::verify(vec![("d0".into(), img)]).expect("zdb");
        assert!(r.is_clean(), "{what}:\n{}", crate::zdb::format_report(&r));
    }

    /// Lists in the layout before keys (one flat object each) are read
    /// as they are, the first sync of an import gives them keys with the
    /// same figures, and a destroy afterwards frees what only it held.
    #[test]
    fn flat_lists_read_as_they_are_and_the_first_sync_adds_keys() {
        let world = SimWorld::new();
        let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(5)).expect("pool");
        p.dsl_pool().format_root_fs().expect("format");
        let obj = p.create_object(4096, &ObjProps::default()).expect("object");
        for i in 0..4u8 {
            p.write(obj, (i as u64 % 2) << 16, &vec![i | 1; 64 << 10])
                .expect("write");
            p.dsl_pool()
                .create_snapshots(&[format!("t@s{i}")])
                .expect("snapshot");
        }
        p.write(obj, 0, &vec![0x55; 64 << 10]).expect("overwrite");
        p.sync().expect("sync");
        let want = figures(&p);
        assert!(want.iter().any(|x| *x > 0));
        // Rewrite every list flat, as a build before keys wrote it.
        let flatten = |old: u64| -> u64 {
            let entries = read_all(&p.mos, old).expect("read");
            for s in read_header(&p.mos, old).expect("header").expect("keyed") {
                p.mos.free_object(s.obj).expect("free sub-list");
            }
            p.mos.free_object(old).expect("free header");
            let new = p
                .mos
                .create_object(ot::DEADLIST, DEADLIST_BLOCK, &ObjProps::METADATA)
                .expect("flat list");
            if !entries.is_empty() {
                p.mos.write(new, 0, &encode_bps(&entries)).expect("write");
            }
            new
        };
        for (_, s) in p.dsl_pool().snapshots() {
            let old = s.phys.read().deadlist;
            if old != 0 {
                s.phys.write().deadlist = flatten(old);
            }
        }
        let h = p.dsl_pool().dataset("t").expect("dataset");
        let old = h.phys.read().deadlist;
        h.phys.write().deadlist = flatten(old);
        *lock(&p.dsl.dirty) = true;
        p.sync().expect("sync");
        assert!(read_header(&p.mos, h.phys.read().deadlist)
            .expect("header")
            .is_none());
        assert_eq!(figures(&p), want, "flat lists read differently");
        zdb_clean(&world, &d, "flat lists");
        p.close().expect("close");
        drop(p);

        let p = sim_reimport(&world, &d, sim_tunables()).expect("import");
        assert_eq!(figures(&p), want, "after import, before the first sync");
        p.sync().expect("sync");
        let h = p.dsl_pool().dataset("t").expect("dataset");
        let mut lists = vec![h.phys.read().deadlist];
        lists.extend(
            p.dsl_pool()
                .snapshots()
                .iter()
                .map(|(_, s)| s.phys().deadlist),
        );
        for l in lists.into_iter().filter(|l| *l != 0) {
            assert!(
                read_header(&p.mos, l).expect("header").is_some(),
                "list {l} still flat after the first sync"
            );
        }
        assert_eq!(figures(&p), want, "keys changed the figures");
        zdb_clean(&world, &d, "converted");
        let (_, s1) = p.dsl_pool().snapshot("t@s1").expect("s1");
        let freed = p.dsl_pool().snapshot_unique(&s1).expect("used");
        assert!(freed > 0);
        let before = p.space().1;
        p.dsl_pool().destroy_snapshot("t@s1").expect("destroy");
        p.dsl_pool().wait_freed().expect("freed");
        assert!(p.space().1 < before, "nothing freed");
        zdb_clean(&world, &d, "after a destroy");
        p.close().expect("close");
    }

    /// Damaged headers are errors with the object named, never a panic
    /// nor a list read wrong; so is a header whose counts disagree with
    /// its sub-lists, or that names an object that is no sub-list.
    #[test]
    fn a_damaged_dead_list_is_an_error_not_a_panic() {
        let entry = |key: u64, obj: u64, count: u64, bytes: u64, os: u64| {
            let mut b = Vec::new();
            SubList {
                key,
                obj,
                count,
                bytes,
                objset_bytes: os,
            }
            .encode(&mut b);
            b
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("a torn entry", vec![7u8; SUBLIST_SIZE - 1]),
            (
                "keys out of order",
                [entry(9, 5, 1, 1, 0), entry(3, 6, 1, 1, 0)].concat(),
            ),
            ("no object", entry(1, 0, 1, 1, 0)),
            ("no entries", entry(1, 5, 0, 0, 0)),
            ("more object-set bytes than bytes", entry(1, 5, 1, 1, 9)),
        ];
        for (what, bytes) in cases {
            let e = decode_header(42, &bytes).expect_err(what);
            assert!(e.to_string().contains("42"), "{what}: {e}");
        }
        let two = decode_header(42, &[entry(3, 5, 2, 8, 0), entry(3, 6, 1, 4, 4)].concat())
            .expect("two sub-lists of one key");
        assert_eq!(two.len(), 2);
        assert_eq!((two[1].key, two[1].obj, two[1].objset_bytes), (3, 6, 4));

        // On disk: a header whose count disagrees with its sub-list.
        let world = SimWorld::new();
        let (d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(6)).expect("pool");
        p.dsl_pool().format_root_fs().expect("format");
        let obj = p.create_object(4096, &ObjProps::default()).expect("object");
        p.write(obj, 0, &vec![1u8; 64 << 10]).expect("write");
        p.dsl_pool()
            .create_snapshots(&["t@a".to_string()])
            .expect("snapshot");
        p.write(obj, 0, &vec![2u8; 64 << 10]).expect("overwrite");
        p.sync().expect("sync");
        let h = p.dsl_pool().dataset("t").expect("dataset");
        let dl = h.phys.read().deadlist;
        let mut subs = read_header(&p.mos, dl).expect("header").expect("keyed");
        assert!(!subs.is_empty());
        let damage = |subs: &[SubList]| {
            p.mos.write(dl, 0, &encode_header(subs)).expect("damage");
            p.sync().expect("sync");
        };
        subs[0].count += 1000;
        damage(&subs);
        let e = read_all(&p.mos, dl).expect_err("count mismatch");
        assert!(e.to_string().contains("entries"), "{e}");
        let img: Arc<dyn BlockDevice> = Arc::new(world.disk_from_image("d0", d.image()));
        let r = crate::zdb::verify(vec![("d0".into(), img)]).expect("zdb runs");
        assert!(!r.deadlists.is_empty(), "zdb missed the damaged dead list");
        // A header naming an object that is no sub-list.
        subs[0].count -= 1000;
        subs[0].obj = h.id();
        damage(&subs);
        let e = read_all(&p.mos, dl).expect_err("wrong type");
        assert!(e.to_string().contains("DSL dataset"), "{e}");
        p.close().expect("close");
    }

    /// Destroying a clone frees its dead list's sub-list objects too (what
    /// they list, the origin's blocks, stays allocated).
    #[test]
    fn destroying_a_clone_frees_its_sub_lists() {
        let world = SimWorld::new();
        let (_d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(9)).expect("pool");
        let (o, obj) = crate::spa::sim_snapshotted_file(&p, 1u8);
        p.dsl_pool()
            .clone_snapshot("t/o@s", "t/c", &[], false)
            .expect("clone");
        let c = p.dsl_pool().dataset("t/c").expect("c");
        // The clone lets go of its origin's blocks: its dead list.
        c.os.write(obj, 0, &vec![2u8; 256 << 10])
            .expect("overwrite");
        p.sync().expect("sync");
        let dl = c.phys.read().deadlist;
        let subs = read_header(&p.mos, dl).expect("header").expect("keyed");
        assert!(!subs.is_empty(), "the clone's dead list is empty");
        p.dsl_pool().destroy_dataset("t/c", false).expect("destroy");
        p.sync().expect("sync");
        for s in subs {
            assert!(
                !p.mos.exists(s.obj).expect("exists"),
                "sub-list {} outlived its clone",
                s.obj
            );
        }
        assert!(!p.mos.exists(dl).expect("exists"));
        // The origin's data is intact.
        let mut buf = vec![0u8; 256 << 10];
        o.os.read(obj, 0, &mut buf).expect("read");
        assert!(buf.iter().all(|b| *b == 1));
        p.close().expect("close");
    }

    #[test]
    fn key_is_the_greatest_line_txg_below_birth() {
        let line = [5, 9, 14];
        assert_eq!(key_for(&line, 3), 0);
        assert_eq!(key_for(&line, 5), 0);
        assert_eq!(key_for(&line, 6), 5);
        assert_eq!(key_for(&line, 9), 5);
        assert_eq!(key_for(&line, 10), 9);
        assert_eq!(key_for(&line, 100), 14);
        assert_eq!(key_for(&[], 7), 0);
    }

    #[test]
    fn header_round_trips() {
        let s = SubList {
            key: 7,
            obj: 99,
            count: 3,
            bytes: 12288,
            objset_bytes: 4096,
        };
        let mut b = Vec::new();
        s.encode(&mut b);
        assert_eq!(b.len(), SUBLIST_SIZE);
        assert_eq!(SubList::decode(&b), s);
    }

    #[test]
    fn line_follows_origins_and_stops_on_a_cycle() {
        // 3 is a clone of 2's snapshot at txg 20; 2 is a clone of 1's at 8.
        let snaps = |d: u64| match d {
            1 => vec![4, 8, 12],
            2 => vec![15, 20, 25],
            3 => vec![30],
            _ => vec![],
        };
        let origin = |d: u64| match d {
            3 => Some((2, 20)),
            2 => Some((1, 8)),
            _ => None,
        };
        assert_eq!(line_of(3, snaps, origin, 3), vec![4, 8, 15, 20, 30]);
        let cyc = |d: u64| Some((d, 100));
        assert_eq!(line_of(1, |_| vec![1, 2], cyc, 2), vec![1, 2]);
    }
}
