//! Offline inspection and verification (OpenZFS zdb).
//!
//! `verify` opens the pool without ever syncing (nothing is written), walks
//! every block pointer reachable from the newest uberblock (the MOS, every
//! dnode and indirect block, the root dataset and its objects), reads every
//! copy of every block (each DVA, each mirror side) and checks its checksum,
//! and builds the set of referenced space. That set must equal the space the
//! space maps say is allocated: anything allocated but unreferenced is a
//! leak, anything referenced twice a double allocation, anything referenced
//! but free a block the allocator may hand out again (the worst case).

use crate::dmu::blkptr::{hex, BlkPtr};
use crate::dmu::dnode::{ot, DnodePhys};
use crate::dmu::objset::BlockReader;
use crate::dmu::traverse::{self, At, Kind, Next, Position, Visitor};
use crate::error::{Error, Result};
use crate::spa::gang;
use crate::spa::import::{best_uberblock, discover, FoundPool};
use crate::spa::range_tree::RangeTree;
use crate::spa::{Pool, Tunables};
use crate::vdev::{label, BlockDevice};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Report {
    pub txg: u64,
    pub blocks: u64,
    pub objects: u64,
    pub referenced_bytes: u64,
    pub allocated_bytes: u64,
    /// Blocks stored as gang blocks (`spa/gang.rs`): a fragmented pool.
    pub gang_blocks: u64,
    /// Copies that failed their checksum or could not be read.
    pub bad_copies: Vec<String>,
    /// Blocks with no good copy at all.
    pub unreadable: Vec<String>,
    pub double_allocated: Vec<String>,
    pub leaked: Vec<String>,
    pub referenced_but_free: Vec<String>,
    /// Filesystem namespace violations (`zpl/verify.rs`), per dataset.
    pub namespace: Vec<String>,
    /// Dead lists that name a block no snapshot holds, or whose recorded
    /// size is not the sum of their entries (`dsl/snapshot.rs`).
    pub deadlists: Vec<String>,
    /// Object sets whose recorded `referenced` is not what their blocks
    /// add up to: the previous set's in the line, less its dead list,
    /// plus the blocks born since (each walk's own).
    pub accounting: Vec<String>,
    /// Datasets and snapshots whose `referenced` was checked that way.
    pub sets_checked: u64,
    /// Snapshots walked.
    pub snapshots: u64,
    /// Directories, files and unlinked files the namespace walk saw.
    pub ns_stats: crate::zpl::verify::NamespaceStats,
    pub by_type: BTreeMap<&'static str, (u64, u64)>,
}

impl Report {
    /// No damage and exact space accounting.
    pub fn is_clean(&self) -> bool {
        self.bad_copies.is_empty()
            && self.space_exact()
            && self.unreadable.is_empty()
            && self.namespace.is_empty()
            && self.deadlists.is_empty()
            && self.accounting.is_empty()
    }
    pub fn space_exact(&self) -> bool {
        self.double_allocated.is_empty()
            && self.leaked.is_empty()
            && self.referenced_but_free.is_empty()
    }
}

/// zdb's visitor (`dmu/traverse.rs` walks): every block's copies checked
/// and its space marked referenced.
struct Walker<'a> {
    pool: &'a Pool,
    refd: BTreeMap<u32, RangeTree>,
    r: Report,
    /// The object set being walked, for messages.
    name: String,
    /// The block `pre` just read, handed to the walk when it descends.
    last: Option<(BlkPtr, Arc<Vec<u8>>)>,
    /// The walk saw a DSL dataset object (a pool with datasets).
    saw_dsl: bool,
    /// Bytes (as charged to `used`) of the blocks this walk visited
    /// beneath object-set blocks.
    born: u64,
    /// Check blocks in `post`, not `pre`: the remains of a destroyed
    /// dataset being freed, walked from its queue position (the blocks
    /// around that position get only a `post`).
    post_mode: bool,
}

impl Visitor for Walker<'_> {
    fn pre(&mut self, bp: &BlkPtr, at: &At) -> Next {
        if self.post_mode {
            return Next::Descend;
        }
        if at.kind != Kind::Objset {
            self.born += crate::spa::lock(&self.pool.st).alloc.dsize(bp);
        }
        let what = self.what(at);
        self.last = self.visit(bp, &what).map(|d| (*bp, d));
        match self.last {
            Some(_) => Next::Descend,
            None => Next::Skip,
        }
    }

    fn post(&mut self, bp: &BlkPtr, at: &At) {
        if self.post_mode {
            let what = self.what(at);
            self.visit(bp, &what);
        }
    }

    fn read(&mut self, reader: &dyn BlockReader, bp: &BlkPtr) -> Result<Arc<Vec<u8>>> {
        match self.last.take() {
            Some((b, d)) if b == *bp => Ok(d),
            _ => reader.read_bp(bp),
        }
    }

    fn error(&mut self, at: &At, e: Error) {
        let what = self.what(at);
        self.r.unreadable.push(format!("{what}: {e}"));
    }

    fn object(&mut self, _obj: u64, dn: &DnodePhys) -> bool {
        self.r.objects += 1;
        self.saw_dsl |= dn.obj_type == ot::DSL_DATASET;
        true
    }
}

impl Walker<'_> {
    fn visit(&mut self, bp: &BlkPtr, what: &str) -> Option<Arc<Vec<u8>>> {
        self.r.blocks += 1;
        if bp.dva.iter().any(|d| d.flags & gang::DVA_GANG != 0) {
            self.r.gang_blocks += 1;
        }
        let e = self.r.by_type.entry(ot::name(bp.obj_type)).or_default();
        e.0 += 1;
        e.1 += bp.asize();
        for (i, d) in bp.dva.iter().enumerate().filter(|(_, d)| d.is_valid()) {
            self.r.referenced_bytes += d.asize;
            let gang = d.flags & gang::DVA_GANG != 0;
            let top = self.pool.io.top(d.vdev);
            // A gang DVA references its headers and pieces, not one extent.
            let extents = match (&top, gang) {
                (Ok(t), true) => match gang::extents(t, d.offset, d.asize, bp.phys_birth) {
                    Ok(x) => x,
                    Err(e) => {
                        self.r
                            .unreadable
                            .push(format!("{what}: DVA[{i}] gang tree: {e}"));
                        Vec::new()
                    }
                },
                _ => vec![(d.offset, d.asize)],
            };
            for (offset, asize) in extents {
                if !self.refd.entry(d.vdev).or_default().add(offset, asize) {
                    self.r.double_allocated.push(format!(
                        "{what}: DVA {}:{:#x}:{:#x} referenced twice",
                        d.vdev, offset, asize
                    ));
                }
            }
            // Every copy and column on usable leaves; a missing or offline
            // leaf is UNAVAIL or OFFLINE, not damaged.
            let Ok(top) = top else {
                continue;
            };
            let verify = |x: &[u8]| bp.checksum_type.compute(x) == bp.checksum;
            let checked = if gang {
                gang::check(&top, d.offset, bp.phys_birth)
            } else {
                top.check_block(d.offset, bp.psize as u64, bp.phys_birth, &verify)
            };
            match checked {
                Ok(bad) => {
                    for (leaf, why) in bad {
                        self.r.bad_copies.push(format!(
                            "{what}: DVA[{i}] {}:{:#x} on {leaf}: {why}",
                            d.vdev, d.offset
                        ));
                    }
                }
                Err(e) => self
                    .r
                    .bad_copies
                    .push(format!("{what}: DVA[{i}] {}:{:#x}: {e}", d.vdev, d.offset)),
            }
        }
        match self.pool.io.read_bp(bp) {
            Ok(d) => Some(d),
            Err(e) => {
                self.r.unreadable.push(format!("{what}: {e}"));
                None
            }
        }
    }

    fn what(&self, at: &At) -> String {
        match at.kind {
            Kind::Objset => format!("{} objset", self.name),
            Kind::Dnodes => format!("{} meta-dnode", self.name),
            Kind::Data => format!("{} object {}", self.name, at.object),
        }
    }

    /// Walk the object set rooted at `bp` (blocks born from `min_birth`).
    fn walk_objset(&mut self, bp: &BlkPtr, name: &str, min_birth: u64) {
        self.name = name.to_string();
        let reader = self.pool.io.clone();
        traverse::walk_objset(&*reader, bp, min_birth, Position::START, self);
    }
}

/// Open the pool on `devs` read-only and verify it.
pub fn verify(devs: Vec<(String, Arc<dyn BlockDevice>)>) -> Result<Report> {
    let found = one_pool(devs, None)?;
    verify_found(&found)
}

pub fn one_pool(
    devs: Vec<(String, Arc<dyn BlockDevice>)>,
    name: Option<&str>,
) -> Result<FoundPool> {
    let mut found = discover(devs);
    if let Some(n) = name {
        found.retain(|f| f.config.name == n || f.config.pool_guid.to_string() == n);
    }
    match found.len() {
        0 => Err(Error::invalid("no pool found on the given devices")),
        1 => Ok(found.remove(0)),
        _ => Err(Error::invalid("more than one pool found; name one")),
    }
}

pub fn verify_found(found: &FoundPool) -> Result<Report> {
    // Read-only: zdb looks at the committed state and writes nothing (an
    // intent log is not replayed, its blocks are neither claimed nor lent).
    let tun = Tunables {
        sync_thread: false,
        cache_bytes: 0,
        readonly: true,
        ..Tunables::default()
    };
    let pool = Pool::import(found, None, tun)?;
    let ub = pool
        .uberblock()
        .ok_or_else(|| Error::invalid("no uberblock"))?;
    let mut w = Walker {
        pool: &pool,
        name: String::new(),
        last: None,
        saw_dsl: false,
        born: 0,
        post_mode: false,
        refd: BTreeMap::new(),
        r: Report {
            txg: ub.txg,
            ..Default::default()
        },
    };
    w.walk_objset(&ub.rootbp, "MOS", 0);
    if w.saw_dsl {
        let dir = crate::spa::lock(&pool.st).dir.clone();
        let mos = crate::dmu::objset::Objset::open(
            &ub.rootbp,
            pool.io.clone(),
            Default::default(),
            ub.txg + 1,
        )?;
        let mut deadlists = Vec::new();
        // Each dataset's snapshots oldest first, each walked only where it
        // differs from the one before, then the dataset itself.
        for set in crate::spa::walk_sets(&mos, &dir, None)? {
            let id = set.key.0;
            let mut name = if id == 1 {
                pool.name.clone()
            } else {
                format!("{} dataset {id}", pool.name)
            };
            if let Some(s) = &set.snap {
                name = format!("{name}@{s}");
                w.r.snapshots += 1;
            }
            w.born = 0;
            w.walk_objset(&set.root, &name, set.min_birth);
            // Read once: the cross-check below, the dead-list checks after
            // every set is walked.
            let entries = crate::dsl::deadlist::read_keyed(&mos, set.deadlist.0);
            let os = crate::dmu::objset::Objset::open(
                &set.root,
                pool.io.clone(),
                Default::default(),
                ub.txg + 1,
            )?;
            // referenced = the previous set's, less what died since (its
            // dead list, object-set blocks aside: they are never charged),
            // plus what was born since (this walk).
            let recorded = set.referenced.unwrap_or_else(|| os.space().used);
            let dead: u64 = match &entries {
                Ok(e) => {
                    let st = crate::spa::lock(&pool.st);
                    e.iter()
                        .map(|(_, b)| b)
                        .filter(|b| b.obj_type != ot::OBJSET)
                        .map(|b| st.alloc.dsize(b))
                        .sum()
                }
                Err(_) => 0, // reported with the dead-list checks below
            };
            if set.deadlist.0 != 0 {
                deadlists.push((
                    set.deadlist.0,
                    set.deadlist.1,
                    name.clone(),
                    entries,
                    set.line.clone(),
                ));
            }
            let want = (set.prev_referenced + w.born).checked_sub(dead);
            if want != Some(recorded) {
                w.r.accounting.push(format!(
                    "{name}: referenced is {recorded}; the blocks say {} ({} before, {dead} died, {} born)",
                    want.map_or("negative".to_string(), |x| x.to_string()),
                    set.prev_referenced,
                    w.born
                ));
            }
            w.r.sets_checked += 1;
            let fs = os
                .dnode(1)
                .ok()
                .flatten()
                .is_some_and(|d| d.obj_type == ot::MASTER_NODE);
            if !fs {
                continue;
            }
            match crate::zpl::verify::check_namespace(&os) {
                Ok((st, bad)) => {
                    w.r.ns_stats.directories += st.directories;
                    w.r.ns_stats.files += st.files;
                    w.r.ns_stats.unlinked += st.unlinked;
                    w.r.ns_stats.raw_objects += st.raw_objects;
                    w.r.namespace
                        .extend(bad.into_iter().map(|b| format!("{name}: {b}")));
                }
                Err(e) => w.r.namespace.push(format!("{name}: {e}")),
            }
        }
        // What destroyed datasets and snapshots still hold, waiting to be
        // freed in the background, is referenced.
        if dir.freeing != 0 {
            let q: crate::dsl::async_destroy::FreeQueue =
                Pool::read_json(&mos, dir.freeing, "free queue")?;
            for (i, e) in q.entries.iter().enumerate() {
                use crate::dsl::async_destroy::{decode_root, FreeEntry};
                let name = format!("{} free queue entry {i}", pool.name);
                match e {
                    FreeEntry::Tree {
                        root,
                        min_birth,
                        at,
                        ..
                    } => {
                        let root = decode_root(root)?;
                        w.name = name;
                        w.post_mode = true;
                        let reader = pool.io.clone();
                        traverse::walk_objset(&*reader, &root, *min_birth, *at, &mut w);
                        w.post_mode = false;
                    }
                    FreeEntry::Blocks {
                        obj, next, count, ..
                    } => {
                        let all =
                            crate::dsl::async_destroy::check_blocks_object(&mos, *obj, *count)
                                .and_then(|_| crate::dsl::deadlist::read_bps(&mos, *obj));
                        match all {
                            Ok(all) => {
                                let from = (*next).min(*count) as usize;
                                for bp in all.get(from..*count as usize).unwrap_or_default() {
                                    w.visit(bp, &name);
                                }
                            }
                            Err(e) => w.r.deadlists.push(format!("{name}: {e}")),
                        }
                    }
                }
            }
        }
        // Every dead-list entry is a block some snapshot holds, under a
        // key its line allows (`dsl/deadlist.rs`), and the list's recorded
        // size is the sum of its entries and of its sub-lists' headers.
        for (obj, recorded, owner, entries, line) in &deadlists {
            let Ok(entries) = entries else { continue };
            for (key, bp) in entries {
                let Some(key) = *key else { continue };
                let want = crate::dsl::deadlist::key_for(line, bp.birth);
                if key >= bp.birth || want > key {
                    w.r.deadlists.push(format!(
                        "{owner}: dead list {obj}: entry born {} under key {key}, but its line says {want}",
                        bp.birth
                    ));
                }
            }
            if let Ok(Some(subs)) = crate::dsl::deadlist::read_header(&mos, *obj) {
                let sum: u64 = subs.iter().map(|s| s.bytes).sum();
                if sum != *recorded {
                    w.r.deadlists.push(format!(
                        "{owner}: dead list {obj}: its sub-lists say {sum} bytes, the record says {recorded}"
                    ));
                }
            }
        }
        let st = crate::spa::lock(&pool.st);
        for (obj, recorded, owner, entries, _) in deadlists {
            let entries = match entries {
                Ok(e) => e,
                Err(e) => {
                    w.r.deadlists.push(format!("{owner}: dead list {obj}: {e}"));
                    continue;
                }
            };
            let mut sum = 0;
            for (_, bp) in &entries {
                sum += st.alloc.dsize(bp);
                for d in bp.dva.iter().filter(|d| d.is_valid()) {
                    let held = w
                        .refd
                        .get(&d.vdev)
                        .is_some_and(|t| t.contains(d.offset, d.asize.max(1)));
                    if !held {
                        w.r.deadlists.push(format!(
                            "{owner}: dead list names {}:{:#x}:{:#x} (born {}), which no snapshot holds",
                            d.vdev, d.offset, d.asize, bp.birth
                        ));
                    }
                }
            }
            if sum != recorded {
                w.r.deadlists.push(format!(
                    "{owner}: dead list holds {sum} bytes, the record says {recorded}"
                ));
            }
        }
        drop(st);
    }
    // Compare referenced space with the space maps.
    let cfg = pool.config();
    let st = crate::spa::lock(&pool.st);
    for (v, va) in st.alloc.vdevs.iter().enumerate() {
        let refd = w.refd.remove(&(v as u32)).unwrap_or_default();
        for ms in &va.metaslabs {
            let mut allocated = RangeTree::new();
            allocated.add(ms.start, ms.size);
            for (o, l) in ms.free.iter() {
                allocated.remove(o, l);
            }
            w.r.allocated_bytes += allocated.space();
            for (o, l) in allocated.iter() {
                // Allocated but not referenced: walk the gaps.
                let mut pos = o;
                while pos < o + l {
                    if refd.contains(pos, 512) {
                        pos += 512;
                        continue;
                    }
                    let start = pos;
                    while pos < o + l && !refd.overlaps(pos, 512) {
                        pos += 512;
                    }
                    w.r.leaked.push(format!(
                        "vdev {v} ({}): [{start:#x}, {pos:#x}) allocated but unreferenced",
                        cfg.vdev_tree[v].children[0].path
                    ));
                }
            }
        }
        for (o, l) in refd.iter() {
            let ms = (o >> va.ms_shift) as usize;
            let Some(m) = va.metaslabs.get(ms) else {
                w.r.referenced_but_free
                    .push(format!("vdev {v}: [{o:#x}+{l:#x}] past the last metaslab"));
                continue;
            };
            if m.free.overlaps(o, l) {
                w.r.referenced_but_free.push(format!(
                    "vdev {v}: [{o:#x}+{l:#x}] referenced but free in the space map"
                ));
            }
        }
    }
    drop(st);
    Ok(w.r)
}

/// `zdb -l`: the labels of one device, and how many of them are valid
/// (zdb exits 2 when none is, as OpenZFS's).
pub fn dump_labels(dev: &dyn BlockDevice) -> (String, usize) {
    let mut out = String::new();
    let mut valid = 0;
    for (i, r) in label::read_configs(dev) {
        let _ = writeln!(
            out,
            "------------------------------------\nLABEL {i}\n------------------------------------"
        );
        match r.and_then(|p| {
            serde_json::from_slice::<serde_json::Value>(&p)
                .map_err(|e| Error::corrupt("label", e.to_string()))
        }) {
            Ok(v) => {
                valid += 1;
                let _ = writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                );
            }
            Err(e) => {
                let _ = writeln!(out, "    failed to unpack label {i}: {e}");
            }
        }
    }
    (out, valid)
}

/// `zdb -u`: the uberblock ring summary and the active uberblock.
pub fn dump_uberblocks(found: &FoundPool) -> String {
    let mut out = String::new();
    let ashifts: BTreeMap<u64, u8> = found
        .config
        .vdev_tree
        .iter()
        .map(|t| (t.guid, t.ashift))
        .collect();
    for d in &found.devices {
        let slot = label::ub_slot_size(ashifts.get(&d.label.top_guid).copied().unwrap_or(12));
        let _ = writeln!(out, "{}:", d.path);
        for (li, off) in label::label_offsets(d.dev.size()).into_iter().enumerate() {
            let mut ring = vec![0u8; label::UB_RING_SIZE as usize];
            let base = off + label::UB_RING_OFFSET;
            if d.dev.read_at(&mut ring, base).is_err() {
                let _ = writeln!(out, "    label {li}: unreadable");
                continue;
            }
            let mut txgs = Vec::new();
            let mut bad = 0;
            for (i, s) in ring.chunks_exact(slot as usize).enumerate() {
                match crate::spa::uberblock::Uberblock::decode(s, base + i as u64 * slot) {
                    Ok(Some(ub)) => txgs.push(ub.txg),
                    Ok(None) => {}
                    Err(_) => bad += 1,
                }
            }
            txgs.sort_unstable();
            let _ = writeln!(
                out,
                "    label {li}: {} valid uberblocks (txg {}..{}), {bad} damaged slots",
                txgs.len(),
                txgs.first().copied().unwrap_or(0),
                txgs.last().copied().unwrap_or(0)
            );
        }
    }
    if let Some(ub) = best_uberblock(&found.devices, found.config.pool_guid, |g| {
        ashifts.get(&g).copied().unwrap_or(12)
    }) {
        let _ = writeln!(out, "\nUberblock:");
        let _ = writeln!(out, "\tmagic = {:016x}", crate::spa::uberblock::UB_MAGIC);
        let _ = writeln!(out, "\tversion = {}", crate::spa::uberblock::UB_VERSION);
        let _ = writeln!(out, "\ttxg = {}", ub.txg);
        let _ = writeln!(out, "\tguid_sum = {}", ub.guid_sum);
        let _ = writeln!(out, "\ttimestamp = {}", ub.timestamp);
        let _ = writeln!(out, "\trootbp = {}", ub.rootbp);
        let _ = writeln!(out, "\tcksum = {}", hex(&ub.rootbp.checksum));
    }
    out
}

/// Human-readable report, as `zdb -b` / `zdb -c` print it.
pub fn format_report(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Traversing all blocks to verify checksums and space accounting (txg {}) ...\n",
        r.txg
    );
    let _ = writeln!(out, "\t{:>12} blocks, {} objects", r.blocks, r.objects);
    let _ = writeln!(out, "\t{:>12} bytes referenced", r.referenced_bytes);
    let _ = writeln!(
        out,
        "\t{:>12} bytes allocated (space maps)",
        r.allocated_bytes
    );
    if r.gang_blocks > 0 {
        let _ = writeln!(out, "\t{:>12} gang blocks", r.gang_blocks);
    }
    let _ = writeln!(out, "\n\t{:>8} {:>12}  type", "blocks", "asize");
    for (t, (n, a)) in &r.by_type {
        let _ = writeln!(out, "\t{n:>8} {a:>12}  {t}");
    }
    let _ = writeln!(
        out,
        "\t{:>12} directories, {} files, {} unlinked (namespace)",
        r.ns_stats.directories, r.ns_stats.files, r.ns_stats.unlinked
    );
    if r.sets_checked > 0 {
        let _ = writeln!(
            out,
            "\t{:>12} datasets and snapshots: referenced matches their blocks",
            r.sets_checked - r.accounting.len() as u64
        );
    }
    let sections: [(&str, &Vec<String>); 8] = [
        ("bad copies", &r.bad_copies),
        ("unreadable blocks", &r.unreadable),
        ("double allocations", &r.double_allocated),
        ("leaked space", &r.leaked),
        ("referenced but free", &r.referenced_but_free),
        ("namespace violations", &r.namespace),
        ("dead list errors", &r.deadlists),
        ("space accounting errors", &r.accounting),
    ];
    for (name, list) in sections {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{} {name}:", list.len());
            for l in list.iter().take(50) {
                let _ = writeln!(out, "\t{l}");
            }
        }
    }
    if r.is_clean() {
        let _ = writeln!(
            out,
            "\nNo errors: every checksum verified, space maps match referenced blocks exactly."
        );
    }
    out
}
