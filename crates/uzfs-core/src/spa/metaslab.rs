//! Metaslabs and the allocator (OpenZFS metaslab.c).
//!
//! Each top-level vdev's allocatable area is cut into equal metaslabs
//! (`2^ms_shift` bytes, ~200 per vdev). A metaslab's free space lives in
//! memory as a range tree, rebuilt at import by replaying its space map.
//!
//! # Lifetime of a block's space
//!
//! ```text
//!   free --alloc(txg T)--> allocated --free(txg F)--> freeing(F) --sync F+1 done--> free
//! ```
//!
//! A block freed in txg F is still referenced by txg F-1, which import may
//! fall back to if F's uberblock is lost, so its space is not handed out again
//! until txg F+1 has committed (OpenZFS TXG_DEFER_SIZE = 2). The exception is
//! a block born in the txg being synced: no committed txg can refer to it, so
//! its space returns to the free tree at once.
//!
//! Every ALLOC and FREE is also queued as a space-map entry (`pending`) and
//! appended to the metaslab's space map in the same txg (see `spa/txg.rs`).
//!
//! # Choosing a vdev (dynamic striping)
//!
//! A rotor walks the top-level vdevs. Each stays current until it has taken
//! its quota of bytes, `ALIQUOT * free(v) / mean free`: a vdev with twice the
//! mean free space takes twice the new writes, so an added empty vdev catches
//! up, as OpenZFS's `mg_bias` does.

use super::range_tree::RangeTree;
use super::space_map::{SmEntry, SmKind};
use crate::dmu::blkptr::Dva;
use crate::error::{Error, Result};
use crate::vdev::{Geometry, TopKind};

/// Bytes a vdev takes before the rotor moves on, at mean free space
/// (OpenZFS metaslab_aliquot: 512 KiB; larger means longer sequential runs
/// per vdev, smaller means finer spreading).
pub const ALIQUOT: u64 = 1 << 20;

pub struct Metaslab {
    pub id: u64,
    pub start: u64,
    pub size: u64,
    /// Space map object in the MOS.
    pub sm_obj: u64,
    pub free: RangeTree,
    /// Entries not yet appended to the space map.
    pub pending: Vec<SmEntry>,
    /// Frees of the syncing txg (deferred).
    pub freeing: Vec<(u64, u64)>,
    /// Frees of the previous txg, released when the current sync completes.
    pub defer: Vec<(u64, u64)>,
    /// Frees whose reuse waits for a scan batch to finish (see `scan.rs`).
    pub held: Vec<(u64, u64)>,
    pub cursor: u64,
}

impl Metaslab {
    pub fn deferred_space(&self) -> u64 {
        self.freeing
            .iter()
            .chain(&self.defer)
            .chain(&self.held)
            .map(|f| f.1)
            .sum()
    }

    /// Every free not yet back in the free tree.
    pub fn pending_frees(&self) -> impl Iterator<Item = &(u64, u64)> {
        self.freeing.iter().chain(&self.defer).chain(&self.held)
    }
}

pub struct VdevAlloc {
    pub id: u32,
    pub ashift: u8,
    /// Kind, width and sector size: how large a block's allocation is.
    pub geom: Geometry,
    pub asize: u64,
    pub ms_shift: u8,
    pub metaslabs: Vec<Metaslab>,
    pub active: usize,
    /// A log device: only the log class takes space here (`log_space.rs`);
    /// not counted in the pool's space.
    pub log: bool,
}

impl VdevAlloc {
    pub fn new(id: u32, ashift: u8, asize: u64, ms_shift: u8, sm_objs: &[u64]) -> Self {
        let mut v = VdevAlloc {
            id,
            ashift,
            geom: Geometry {
                kind: TopKind::Disk,
                width: 1,
                ashift,
            },
            asize: 0,
            ms_shift,
            metaslabs: Vec::new(),
            active: 0,
            log: false,
        };
        v.grow(asize, sm_objs);
        v
    }

    /// Grow the address space to `asize` (`spa/expand.rs`): new, empty
    /// metaslabs after the existing ones, whose space maps are `sm_objs`
    /// in order (missing ones are 0).
    pub fn grow(&mut self, asize: u64, sm_objs: &[u64]) {
        let from = self.metaslabs.len() as u64;
        for i in from..asize >> self.ms_shift {
            let start = i << self.ms_shift;
            let size = 1u64 << self.ms_shift;
            let mut free = RangeTree::new();
            free.add(start, size);
            self.metaslabs.push(Metaslab {
                id: i,
                start,
                size,
                sm_obj: sm_objs.get((i - from) as usize).copied().unwrap_or(0),
                free,
                pending: Vec::new(),
                freeing: Vec::new(),
                defer: Vec::new(),
                held: Vec::new(),
                cursor: start,
            });
        }
        self.asize = self.asize.max(asize);
    }

    /// Free bytes, counting deferred frees as free (they are, on disk).
    pub fn free_space(&self) -> u64 {
        self.metaslabs
            .iter()
            .map(|m| m.free.space() + m.deferred_space())
            .sum()
    }

    /// Bytes that can be allocated right now.
    pub fn allocatable_space(&self) -> u64 {
        self.metaslabs.iter().map(|m| m.free.space()).sum()
    }

    /// OpenZFS `vdev_deflate_ratio`: bytes of data per 512 bytes this vdev
    /// allocates for a 128 KiB block. 512 on a disk or mirror; less on
    /// RAID-Z, by its parity and padding.
    pub fn deflate_ratio(&self) -> u64 {
        (1u64 << 17) / (self.round(1 << 17) >> 9).max(1)
    }

    /// `asize` bytes allocated here as datasets are charged for them
    /// (`used`, `available`): without RAID-Z parity, so a 20 MiB file
    /// shows about 20M, as OpenZFS.
    pub fn deflate(&self, asize: u64) -> u64 {
        (asize >> 9) * self.deflate_ratio()
    }

    /// The allocator for a vdev described by `c`.
    pub fn for_top(c: &super::config::TopConfig, sm_objs: &[u64]) -> Self {
        let mut v = VdevAlloc::new(c.id, c.ashift, c.asize, c.ms_shift, sm_objs);
        v.geom = Geometry {
            kind: c.kind,
            width: c.children.len(),
            ashift: c.ashift,
        };
        v.log = c.log;
        v
    }

    /// Bytes to allocate for a block of `psize` (RAID-Z adds its parity).
    pub fn round(&self, psize: u64) -> u64 {
        self.geom.asize(psize)
    }

    fn alloc(&mut self, asize: u64, avoid_ms: Option<usize>) -> Option<(u64, usize)> {
        self.take(asize, avoid_ms, true)
    }

    /// Take `asize` bytes from a free tree; `record`: queue the space-map
    /// entry (everything but the log class's loans, `spa/log_space.rs`).
    fn take(&mut self, asize: u64, avoid_ms: Option<usize>, record: bool) -> Option<(u64, usize)> {
        let n = self.metaslabs.len();
        for k in 0..n {
            let i = (self.active + k) % n;
            if Some(i) == avoid_ms && n > 1 {
                continue;
            }
            let ms = &mut self.metaslabs[i];
            if ms.free.space() < asize {
                continue;
            }
            if let Some(off) = ms.free.find_fit(asize, ms.cursor) {
                let removed = ms.free.remove(off, asize);
                debug_assert!(removed);
                ms.cursor = off + asize;
                if record {
                    ms.pending.push(SmEntry {
                        kind: SmKind::Alloc,
                        offset: off,
                        len: asize,
                    });
                }
                if avoid_ms.is_none() {
                    self.active = i;
                }
                return Some((off, i));
            }
        }
        None
    }

    fn ms_index(&self, offset: u64) -> Option<usize> {
        let i = (offset >> self.ms_shift) as usize;
        (i < self.metaslabs.len()).then_some(i)
    }
}

/// Keeps freed space from being reused under a read that may repair in
/// place.
///
/// A self-healing read (`SpaIo::read_phys`, and the mirror and RAID-Z
/// repairs inside it) writes the good bytes back over a bad copy after the
/// read. Its block pointer was current when the read began; if the block
/// is freed meanwhile, its space may only be handed out again once no such
/// read is in flight, or the repair lands on whatever was written there
/// next (`tests/repair_race.rs`). Reads hold the fence for reading from
/// their start to their last repair; the allocator holds it for writing
/// only while it moves freed ranges into the allocatable trees (no I/O,
/// no read under it), so a sync waits at most for the reads in flight.
/// Scans have their own guard against reuse (`spa/scan.rs`).
#[derive(Default)]
pub struct ReuseFence {
    lock: std::sync::RwLock<()>,
}

impl ReuseFence {
    /// Held by a read for as long as it may repair what it read. Never
    /// taken twice by one thread (a waiting writer would deadlock it).
    pub fn reading(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn releasing(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Allocator {
    pub vdevs: Vec<VdevAlloc>,
    /// Shared with the pool's reads (`SpaIo::reuse_fence`): freed space
    /// becomes allocatable only while no repairing read is in flight.
    pub fence: std::sync::Arc<ReuseFence>,
    /// Shared with the scan (`SpaIo::scan_queue`): while a batch is being
    /// issued, a free lying in none of its blocks being read is reusable
    /// at once instead of parked (`spa/scan_queue.rs`).
    pub scan_queue: std::sync::Arc<super::scan_queue::ScanQueue>,
    /// Scans (or walkers) reading blocks by pointers gathered earlier: while
    /// non-zero, freed space is not reused (and overwritten).
    pub scan_hold: u32,
    /// The sync took the held frees back (`break_scan_hold`): until the
    /// last hold is dropped, frees are not parked (the scan gathers again).
    hold_broken: bool,
    rotor: usize,
    rotor_bytes: u64,
}

impl Allocator {
    pub fn new(vdevs: Vec<VdevAlloc>) -> Self {
        Allocator {
            vdevs,
            fence: Default::default(),
            scan_queue: Default::default(),
            scan_hold: 0,
            hold_broken: false,
            rotor: 0,
            rotor_bytes: 0,
        }
    }

    /// The vdevs that take ordinary blocks (not log devices).
    fn normal(&self) -> impl Iterator<Item = &VdevAlloc> {
        self.vdevs.iter().filter(|v| !v.log)
    }

    pub fn free_space(&self) -> u64 {
        self.normal().map(|v| v.free_space()).sum()
    }
    /// Bytes the allocator can hand out now (deferred frees excluded).
    pub fn allocatable_space(&self) -> u64 {
        self.normal().map(|v| v.allocatable_space()).sum()
    }
    pub fn total_space(&self) -> u64 {
        self.normal().map(|v| v.asize).sum()
    }

    /// `total_space` deflated (`VdevAlloc::deflate`).
    pub fn deflated_space(&self) -> u64 {
        self.normal().map(|v| v.deflate(v.asize)).sum()
    }

    /// What a block is charged to its dataset: each copy's allocated
    /// bytes, deflated by its vdev's ratio (OpenZFS bp_get_dsize).
    pub fn dsize(&self, bp: &crate::dmu::blkptr::BlkPtr) -> u64 {
        bp.dva
            .iter()
            .filter(|d| d.is_valid())
            .map(|d| {
                self.vdevs
                    .get(d.vdev as usize)
                    .map_or(d.asize, |v| v.deflate(d.asize))
            })
            .sum()
    }

    /// One extent for `psize` bytes on vdev `v` only (a gang block's
    /// header or piece, `spa/gang.rs`).
    pub fn alloc_on(&mut self, v: usize, psize: u64) -> Option<Dva> {
        let vd = self.vdevs.get_mut(v)?;
        let asize = vd.round(psize);
        let (offset, _) = vd.alloc(asize, None)?;
        Some(Dva {
            vdev: v as u32,
            asize,
            offset,
            flags: 0,
        })
    }

    /// Lend `asize` bytes of vdev `v` to the log class: out of the free
    /// tree in memory, with no space-map entry (`spa/log_space.rs`).
    pub fn lend(&mut self, v: usize, asize: u64) -> Option<u64> {
        let vd = self.vdevs.get_mut(v)?;
        vd.take(asize, None, false).map(|(off, _)| off)
    }

    /// A loan comes back: free in memory again, as it always was on disk.
    pub fn give_back(&mut self, v: usize, offset: u64, asize: u64) {
        let Some(vd) = self.vdevs.get_mut(v) else {
            debug_assert!(false, "loan on unknown vdev {v}");
            return;
        };
        if let Some(i) = vd.ms_index(offset) {
            let ok = vd.metaslabs[i].free.add(offset, asize);
            debug_assert!(ok, "returned loan overlaps free space");
        }
    }

    /// Import: take an intent-log block the chain reaches out of the free
    /// tree (in memory only) until replay has committed. False if the
    /// extent is not wholly free (then it is not a live log block).
    pub fn claim(&mut self, v: usize, offset: u64, asize: u64) -> bool {
        let Some(vd) = self.vdevs.get_mut(v) else {
            return false;
        };
        let Some(i) = vd.ms_index(offset) else {
            return false;
        };
        let ms = &mut vd.metaslabs[i];
        if offset + asize > ms.start + ms.size {
            return false;
        }
        ms.free.remove(offset, asize)
    }

    /// The longest free extent on any vdev (fragmentation, for errors).
    pub fn largest_free(&self) -> u64 {
        self.normal()
            .flat_map(|v| &v.metaslabs)
            .flat_map(|m| m.free.iter().map(|(_, len)| len))
            .max()
            .unwrap_or(0)
    }

    fn quota(&self, v: usize) -> u64 {
        let n = self.normal().count() as u64;
        let total: u64 = self.allocatable_space();
        if total == 0 {
            return ALIQUOT;
        }
        let mine = self.vdevs[v].allocatable_space() as u128;
        ((ALIQUOT as u128 * mine * n as u128 / total as u128) as u64).max(ALIQUOT / 16)
    }

    /// Allocate `copies` DVAs for a block of `psize` physical bytes, each on a
    /// different vdev where there are several.
    pub fn alloc(&mut self, psize: u64, copies: usize) -> Result<Vec<Dva>> {
        // Positions walk the vdevs that take ordinary blocks (log devices
        // are the log class's, `log_space.rs`).
        let normal: Vec<usize> = (0..self.vdevs.len())
            .filter(|&v| !self.vdevs[v].log)
            .collect();
        let n = normal.len();
        if n == 0 {
            return Err(Error::NoSpace);
        }
        let pos = |v: usize| normal.iter().position(|&x| x >= v).unwrap_or(0);
        let mut out: Vec<(Dva, usize)> = Vec::with_capacity(copies);
        for copy in 0..copies {
            let start = match out.last() {
                None => pos(self.rotor),
                Some((d, _)) => (pos(d.vdev as usize) + 1) % n,
            };
            let mut got = None;
            for k in 0..n {
                let v = normal[(start + k) % n];
                // Prefer a vdev no earlier copy uses; fall back to any.
                let prev_same = out.iter().find(|(d, _)| d.vdev as usize == v);
                if prev_same.is_some() && k + 1 < n && out.len() < n {
                    continue;
                }
                let avoid = prev_same.map(|(_, ms)| {
                    let m = self.vdevs[v].metaslabs.len();
                    (ms + m / 2) % m.max(1)
                });
                let vd = &mut self.vdevs[v];
                let asize = vd.round(psize);
                // A ditto copy on the same vdev starts half the vdev away.
                let r = match avoid {
                    Some(target) => {
                        let saved = vd.active;
                        vd.active = target;
                        let r = vd.alloc(asize, prev_same.map(|p| p.1));
                        vd.active = saved;
                        r
                    }
                    None => vd.alloc(asize, None),
                };
                if let Some((offset, ms)) = r {
                    got = Some((
                        Dva {
                            vdev: v as u32,
                            asize,
                            offset,
                            flags: 0,
                        },
                        ms,
                    ));
                    break;
                }
            }
            match got {
                Some(g) => {
                    if copy == 0 {
                        self.rotor_bytes += g.0.asize;
                        if self.rotor_bytes >= self.quota(self.rotor) {
                            self.rotor = normal[(pos(self.rotor) + 1) % n];
                            self.rotor_bytes = 0;
                        } else if g.0.vdev as usize != self.rotor {
                            self.rotor = g.0.vdev as usize;
                            self.rotor_bytes = 0;
                        }
                    }
                    out.push(g);
                }
                None => {
                    for (d, _) in &out {
                        self.free(d, true);
                    }
                    log::debug!(
                        "cannot allocate {psize} bytes (copy {} of {copies}): {} bytes allocatable, {} free, largest free extent {} bytes",
                        copy + 1,
                        self.allocatable_space(),
                        self.free_space(),
                        self.largest_free()
                    );
                    return Err(Error::NoSpace);
                }
            }
        }
        Ok(out.into_iter().map(|(d, _)| d).collect())
    }

    /// Free a DVA. `immediate` for a block born in the syncing txg.
    pub fn free(&mut self, dva: &Dva, immediate: bool) {
        let Some(vd) = self.vdevs.get_mut(dva.vdev as usize) else {
            debug_assert!(false, "free of DVA on unknown vdev {}", dva.vdev);
            return;
        };
        let Some(i) = vd.ms_index(dva.offset) else {
            debug_assert!(false, "free of DVA past end of vdev");
            return;
        };
        let ms = &mut vd.metaslabs[i];
        ms.pending.push(SmEntry {
            kind: SmKind::Free,
            offset: dva.offset,
            len: dva.asize,
        });
        if immediate {
            let ok = ms.free.add(dva.offset, dva.asize);
            debug_assert!(ok, "double free of {:?}", dva);
        } else {
            ms.freeing.push((dva.offset, dva.asize));
        }
    }

    /// A txg committed: the previous txg's frees become allocatable and this
    /// txg's frees start their wait.
    pub fn sync_done(&mut self) {
        let fence = self.fence.clone();
        let _reuse = fence.releasing();
        let parking = self.holding_for_scan();
        let queue = self.scan_queue.clone();
        let mut q = queue.lock();
        for (v, vd) in self.vdevs.iter_mut().enumerate() {
            for ms in &mut vd.metaslabs {
                let mut released = std::mem::take(&mut ms.defer);
                if parking {
                    // A batch being issued: what it parked before may be
                    // free now (its run finished, or it was dropped).
                    if q.active() {
                        released.append(&mut ms.held);
                    }
                    for (off, len) in released {
                        if q.releases(v as u32, off, len) {
                            let ok = ms.free.add(off, len);
                            debug_assert!(ok, "deferred free overlaps free space");
                        } else {
                            ms.held.push((off, len));
                        }
                    }
                } else {
                    for (off, len) in released {
                        let ok = ms.free.add(off, len);
                        debug_assert!(ok, "deferred free overlaps free space");
                    }
                }
                ms.defer = std::mem::take(&mut ms.freeing);
            }
        }
    }

    /// The sync is out of space: make the previous txg's frees
    /// allocatable now instead of when this txg commits. Safe for the
    /// committed state (the previous txg, already on disk, no longer
    /// references them); what it costs is the fallback to the txg before
    /// that if the previous txg's uberblocks were all lost. Not while a
    /// scan may still read those blocks (it is gathering, or they lie in
    /// its run in flight, `scan_queue.rs`). Returns the bytes released.
    pub fn release_deferred_early(&mut self) -> u64 {
        let parking = self.holding_for_scan();
        let queue = self.scan_queue.clone();
        let mut q = queue.lock();
        if parking && !q.active() {
            return 0;
        }
        let fence = self.fence.clone();
        let _reuse = fence.releasing();
        let mut n = 0;
        for (v, vd) in self.vdevs.iter_mut().enumerate() {
            for ms in &mut vd.metaslabs {
                for (off, len) in std::mem::take(&mut ms.defer) {
                    if parking && !q.releases(v as u32, off, len) {
                        ms.defer.push((off, len));
                        continue;
                    }
                    let ok = ms.free.add(off, len);
                    debug_assert!(ok, "deferred free overlaps free space");
                    n += len;
                }
            }
        }
        n
    }

    /// Take or drop a scan hold; dropping the last releases what was held.
    pub fn set_scan_hold(&mut self, on: bool) {
        if on {
            self.scan_hold += 1;
            return;
        }
        self.scan_hold = self.scan_hold.saturating_sub(1);
        if self.scan_hold > 0 {
            return;
        }
        self.hold_broken = false;
        self.release_held();
    }

    /// The sync is out of space while frees are parked: release them all
    /// and park no more until the holders have dropped their holds. The
    /// caller has first made sure no scan issues another block it gathered
    /// under the hold (`ScanFence::break_hold`). Returns the bytes
    /// released.
    pub fn break_scan_hold(&mut self) -> u64 {
        if !self.holding_for_scan() {
            return 0;
        }
        self.hold_broken = true;
        self.release_held()
    }

    /// Whether a scan hold is in force: frees that become reusable are
    /// parked for the scan.
    pub fn holding_for_scan(&self) -> bool {
        self.scan_hold > 0 && !self.hold_broken
    }

    fn release_held(&mut self) -> u64 {
        let fence = self.fence.clone();
        let _reuse = fence.releasing();
        let mut n = 0;
        for v in &mut self.vdevs {
            for ms in &mut v.metaslabs {
                for (off, len) in std::mem::take(&mut ms.held) {
                    let ok = ms.free.add(off, len);
                    debug_assert!(ok, "held free overlaps free space");
                    n += len;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While any scan hold is taken, frees never return to the free tree;
    /// dropping the last hold releases them.
    #[test]
    fn scan_holds_park_frees_until_the_last_is_dropped() {
        let mut a = Allocator::new(vec![VdevAlloc::new(0, 12, 64 << 20, 24, &[])]);
        let d = a.alloc(1 << 20, 1).expect("alloc");
        let free0 = a.vdevs[0].allocatable_space();
        a.set_scan_hold(true);
        a.set_scan_hold(true);
        a.free(&d[0], false);
        for _ in 0..3 {
            a.sync_done();
        }
        assert_eq!(a.vdevs[0].allocatable_space(), free0, "reused under a hold");
        a.set_scan_hold(false);
        assert_eq!(
            a.vdevs[0].allocatable_space(),
            free0,
            "released with a hold left"
        );
        a.set_scan_hold(false);
        assert_eq!(a.vdevs[0].allocatable_space(), free0 + (1 << 20));
    }

    /// Early reuse takes only the previous txg's frees (committed), never
    /// the syncing txg's (still referenced by the committed state), and
    /// nothing while a scan holds frees.
    #[test]
    fn early_reuse_takes_only_the_previous_txgs_frees() {
        let mut a = Allocator::new(vec![VdevAlloc::new(0, 12, 64 << 20, 24, &[])]);
        let d = a.alloc(2 << 20, 1).expect("alloc");
        let e = a.alloc(1 << 20, 1).expect("alloc");
        let base = a.vdevs[0].allocatable_space();
        a.free(&d[0], false);
        a.sync_done(); // d's txg committed: d is deferred
        a.free(&e[0], false); // e: freed by the syncing txg
        a.set_scan_hold(true);
        assert_eq!(a.release_deferred_early(), 0, "reused under a scan hold");
        a.set_scan_hold(false);
        assert_eq!(a.release_deferred_early(), 2 << 20);
        assert_eq!(a.vdevs[0].allocatable_space(), base + (2 << 20));
        assert_eq!(a.release_deferred_early(), 0);
        a.sync_done();
        a.sync_done();
        assert_eq!(a.vdevs[0].allocatable_space(), base + (3 << 20));
    }

    /// A broken hold gives back what it parked and parks nothing more
    /// (early reuse allowed again) until the last hold is dropped; the
    /// next hold parks again.
    #[test]
    fn a_broken_scan_hold_releases_and_stops_parking_until_dropped() {
        let mut a = Allocator::new(vec![VdevAlloc::new(0, 12, 64 << 20, 24, &[])]);
        let d = a.alloc(1 << 20, 1).expect("alloc");
        let e = a.alloc(2 << 20, 1).expect("alloc");
        let f = a.alloc(4 << 20, 1).expect("alloc");
        let base = a.vdevs[0].allocatable_space();
        a.set_scan_hold(true);
        a.free(&d[0], false);
        a.sync_done();
        a.sync_done();
        assert_eq!(a.vdevs[0].allocatable_space(), base, "parked");
        assert_eq!(a.break_scan_hold(), 1 << 20);
        assert_eq!(a.break_scan_hold(), 0, "released twice");
        assert!(!a.holding_for_scan());
        a.free(&e[0], false);
        a.sync_done();
        assert_eq!(a.release_deferred_early(), 2 << 20);
        assert_eq!(a.vdevs[0].allocatable_space(), base + (3 << 20));
        a.set_scan_hold(false);
        a.set_scan_hold(true);
        assert!(a.holding_for_scan());
        a.free(&f[0], false);
        a.sync_done();
        a.sync_done();
        assert_eq!(a.vdevs[0].allocatable_space(), base + (3 << 20), "parked");
        a.set_scan_hold(false);
        assert_eq!(a.vdevs[0].allocatable_space(), base + (7 << 20));
    }
}
