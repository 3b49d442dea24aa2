//! The blocks of the scan batch being issued, by device address, so that a
//! block freed meanwhile leaves the queue instead of its space being
//! parked (OpenZFS `dsl_scan_freed`).
//!
//! # Why
//!
//! A scan reads blocks by pointers it gathered earlier. If one of them is
//! freed and its space handed out again before the scan reads it, the scan
//! reads somebody else's data under the old checksum, and a mirror or
//! RAID-Z "repair" would write the old contents over the new. Until this
//! queue, every free that became reusable while a batch was held was
//! parked until the batch ended (`Metaslab::held`): on a pool rewritten
//! one small commit at a time that was hundreds of MiB a second of space
//! writers could not have, which forced the scan either to use every gap
//! in the foreground's I/O (commits 2.7x slower under a scrub) or to give
//! its batch up and gather it again (a scrub 5-10x slower), see
//! bench/RESULTS.md, "commit latency under a scrub".
//!
//! # How
//!
//! While a batch is *gathered* every free is still parked: the walk reads
//! indirect blocks and dnodes of the committed tree that are not known in
//! advance. Once gathering ends the batch is *queued* here (`start`), and
//! from then on a free about to become reusable is checked against it
//! (`releases`, called by the allocator under the pool's state lock):
//!
//! * no queued block lies in the freed range: the space is reusable now;
//! * queued blocks lie in it, none of them being read: they are dropped
//!   from the batch (the scan will not read them; they are no longer part
//!   of the pool) and the space is reusable now;
//! * a block lying in it is being read (its run was claimed by a worker,
//!   `claim`, and not yet `finish`ed, repairs and resilver writes
//!   included): the free stays parked, and the allocator asks again at the
//!   next txg's commit.
//!
//! A gang block's pieces lie elsewhere than its header, which is all the
//! queue knows of it: while one is being read, nothing is released.
//!
//! What stays parked is bounded by the runs in flight (a few workers, each
//! at most `RUN_SPAN` of address space), for at most one txg after their
//! run ends, instead of by the batch. Extents of a damaged pool may
//! overlap one another: when a batch's do, a free is checked against every
//! extent that could reach it (those starting less than the batch's
//! longest extent before it), so an overlap never hides a block being
//! read; when they do not (any consistent pool), the walk stops at the
//! first extent that ends before the freed range, as cheap as before.

use crate::dmu::blkptr::{BlkPtr, DVA_GANG};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    Reading,
    /// Freed before it was read: skipped.
    Freed,
    Done,
}

#[derive(Default)]
pub struct ScanQueue {
    inner: Mutex<Queue>,
}

#[derive(Default)]
pub struct Queue {
    /// A batch is queued: frees are checked against it. Off while gathering
    /// (everything parks) and between batches (nothing is held).
    active: bool,
    /// (vdev, offset, block) -> end of the extent, for every DVA of every
    /// block still to be read or being read.
    extents: BTreeMap<(u32, u64, usize), u64>,
    state: Vec<State>,
    /// The batch's pointers (for dropping every DVA of a freed block).
    bps: Vec<BlkPtr>,
    /// How far before a freed range an extent may start and still reach
    /// into it, past extents that end before the range: 0 when the
    /// batch's extents do not overlap (the first such extent ends the
    /// walk), else the batch's longest extent.
    reach: u64,
    /// Gang blocks being read.
    gangs_reading: usize,
    /// Blocks dropped because they were freed, for the log and tests.
    pub freed: u64,
}

fn gang(bp: &BlkPtr) -> bool {
    bp.dva.iter().any(|d| d.flags & DVA_GANG != 0)
}

impl ScanQueue {
    pub fn lock(&self) -> MutexGuard<'_, Queue> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gathering ended: queue the batch. The caller still holds its scan
    /// hold, so none of these blocks' space has been reused.
    pub fn start(&self, bps: &[BlkPtr]) {
        let mut q = self.lock();
        q.extents.clear();
        let mut max_len = 0;
        for (i, bp) in bps.iter().enumerate() {
            for d in bp.dva.iter().filter(|d| d.is_valid()) {
                q.extents.insert((d.vdev, d.offset, i), d.offset + d.asize);
                max_len = max_len.max(d.asize);
            }
        }
        // In address order, an extent starting before the furthest end so
        // far on its vdev overlaps an earlier one.
        let mut furthest: Option<(u32, u64)> = None;
        let mut overlap = false;
        for (&(vdev, start, _), &end) in &q.extents {
            furthest = match furthest {
                Some((v, f)) if v == vdev => {
                    overlap |= start < f;
                    Some((v, f.max(end)))
                }
                _ => Some((vdev, end)),
            };
        }
        q.reach = if overlap { max_len } else { 0 };
        q.state = vec![State::Queued; bps.len()];
        q.bps = bps.to_vec();
        q.gangs_reading = 0;
        q.freed = 0;
        q.active = true;
    }

    /// The batch ended (issued, abandoned or failed): frees park again
    /// until the next batch is queued.
    pub fn end(&self) -> u64 {
        let mut q = self.lock();
        q.active = false;
        q.extents.clear();
        q.state.clear();
        q.bps.clear();
        q.reach = 0;
        q.gangs_reading = 0;
        q.freed
    }

    /// A worker takes a run: the blocks of it not freed meanwhile, now
    /// being read until `finish`.
    pub fn claim(&self, run: &[usize]) -> Vec<usize> {
        let mut q = self.lock();
        if !q.active {
            return run.to_vec();
        }
        let mut out = Vec::with_capacity(run.len());
        for &i in run {
            if q.state.get(i) == Some(&State::Queued) {
                q.state[i] = State::Reading;
                if gang(&q.bps[i]) {
                    q.gangs_reading += 1;
                }
                out.push(i);
            }
        }
        out
    }

    /// A claimed run is done, its repairs written.
    pub fn finish(&self, run: &[usize]) {
        let mut q = self.lock();
        if !q.active {
            return;
        }
        for &i in run {
            if q.state.get(i) != Some(&State::Reading) {
                debug_assert!(false, "finish of block {i} not being read");
                continue;
            }
            q.state[i] = State::Done;
            if gang(&q.bps[i]) {
                q.gangs_reading -= 1;
            }
            q.drop_extents(i);
        }
    }
}

impl Queue {
    pub fn active(&self) -> bool {
        self.active
    }

    /// A free of `[offset, offset + len)` on `vdev` is about to become
    /// reusable: may it (queued blocks in it are dropped from the batch),
    /// or must it stay parked (a block in it is being read, or no batch is
    /// queued, so the scan may be gathering)?
    pub fn releases(&mut self, vdev: u32, offset: u64, len: u64) -> bool {
        if !self.active || self.gangs_reading > 0 {
            return false;
        }
        let end = offset + len;
        let mut hit: Vec<usize> = Vec::new();
        // Walk back from the range's end. Without overlaps the first
        // extent ending at or before `offset` ends the walk (`reach` 0);
        // with them, go on while an earlier extent could still reach the
        // range.
        for (&(_, start, i), &e) in self.extents.range((vdev, 0, 0)..(vdev, end, 0)).rev() {
            if e <= offset {
                if start.saturating_add(self.reach) <= offset {
                    break;
                }
                continue;
            }
            debug_assert!(start < end);
            match self.state[i] {
                State::Reading => return false,
                State::Queued => hit.push(i),
                State::Freed | State::Done => {}
            }
        }
        for i in hit {
            self.state[i] = State::Freed;
            self.freed += 1;
            self.drop_extents(i);
        }
        true
    }

    fn drop_extents(&mut self, i: usize) {
        let bp = self.bps[i];
        for d in bp.dva.iter().filter(|d| d.is_valid()) {
            self.extents.remove(&(d.vdev, d.offset, i));
        }
    }

    /// Whether block `i` of the batch was dropped as freed.
    #[cfg(test)]
    fn was_freed(&self, i: usize) -> bool {
        self.state.get(i) == Some(&State::Freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dmu::blkptr::Dva;

    fn bp(dvas: &[(u32, u64, u64)]) -> BlkPtr {
        let mut b = BlkPtr::default();
        for (k, &(vdev, offset, asize)) in dvas.iter().enumerate() {
            b.dva[k] = Dva {
                vdev,
                asize,
                offset,
                flags: 0,
            };
        }
        b
    }

    /// Gathering (no batch queued) parks every free; a queued batch lets
    /// frees outside it through at once.
    #[test]
    fn frees_park_only_while_gathering() {
        let q = ScanQueue::default();
        assert!(!q.lock().releases(0, 0, 4096), "gathering parks");
        q.start(&[bp(&[(0, 1 << 20, 8192)])]);
        assert!(q.lock().releases(0, 0, 4096), "below the block");
        assert!(q.lock().releases(0, (1 << 20) + 8192, 4096), "after it");
        assert!(q.lock().releases(1, 1 << 20, 8192), "other vdev");
        assert_eq!(q.lock().freed, 0);
        q.end();
        assert!(!q.lock().releases(0, 0, 4096), "between batches");
    }

    /// A queued block whose space is freed leaves the batch (every copy),
    /// and a worker's claim of its run no longer includes it.
    #[test]
    fn a_freed_queued_block_is_dropped_with_all_its_copies() {
        let q = ScanQueue::default();
        let a = bp(&[(0, 0, 8192), (1, 65536, 8192)]);
        let b = bp(&[(0, 8192, 8192)]);
        q.start(&[a, b]);
        assert_eq!(q.lock().reach, 0, "copies on two vdevs do not overlap");
        // A free covering the middle of block a's first copy.
        assert!(q.lock().releases(0, 4096, 512));
        assert!(q.lock().was_freed(0) && !q.lock().was_freed(1));
        // Its second copy is no longer queued either.
        assert!(q.lock().releases(1, 65536, 8192));
        assert_eq!(q.lock().freed, 1);
        assert_eq!(q.claim(&[0, 1]), vec![1]);
    }

    /// A block being read keeps its space parked until its run is
    /// finished, and only then.
    #[test]
    fn a_block_being_read_keeps_its_space_parked_until_finished() {
        let q = ScanQueue::default();
        q.start(&[bp(&[(0, 0, 8192)]), bp(&[(0, 8192, 8192)])]);
        assert_eq!(q.lock().reach, 0, "adjacent extents do not overlap");
        assert_eq!(q.claim(&[0, 1]), vec![0, 1]);
        assert!(!q.lock().releases(0, 0, 8192), "block 0 being read");
        assert!(!q.lock().releases(0, 12288, 512), "block 1 being read");
        assert!(q.lock().releases(0, 16384, 512), "past both");
        q.finish(&[0, 1]);
        assert!(q.lock().releases(0, 0, 8192));
        assert!(q.lock().releases(0, 8192, 8192));
        assert_eq!(q.lock().freed, 0, "read blocks are not counted as freed");
    }

    /// While a gang block is read, its pieces (elsewhere, unknown to the
    /// queue) must not be reused: nothing is released.
    #[test]
    fn a_gang_block_being_read_parks_everything() {
        let q = ScanQueue::default();
        let mut g = bp(&[(0, 0, 512)]);
        g.dva[0].flags |= DVA_GANG;
        q.start(&[g, bp(&[(0, 1 << 20, 8192)])]);
        assert_eq!(q.claim(&[0]), vec![0]);
        assert!(!q.lock().releases(0, 5 << 20, 4096), "a piece may be here");
        q.finish(&[0]);
        assert!(q.lock().releases(0, 5 << 20, 4096));
    }

    /// On a damaged pool two blocks' extents may overlap. A long extent
    /// that starts before a short one and ends past it is still found by
    /// a free that touches only its tail: a block being read there keeps
    /// the space parked, a queued one is dropped.
    #[test]
    fn overlapping_extents_of_a_damaged_pool_are_all_seen() {
        let q = ScanQueue::default();
        // Block 0 covers [0, 64 KiB); block 1 sits inside it at [4, 8) KiB.
        q.start(&[bp(&[(0, 0, 65536)]), bp(&[(0, 4096, 4096)])]);
        assert_eq!(q.lock().reach, 65536, "the batch overlaps");
        assert_eq!(q.claim(&[0]), vec![0]);
        assert!(
            !q.lock().releases(0, 32768, 4096),
            "block 0 is being read there"
        );
        q.finish(&[0]);
        let q = ScanQueue::default();
        q.start(&[bp(&[(0, 0, 65536)]), bp(&[(0, 4096, 4096)])]);
        assert!(q.lock().releases(0, 32768, 4096));
        assert!(q.lock().was_freed(0) && !q.lock().was_freed(1));
    }
}
