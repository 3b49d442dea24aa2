//! The log allocation class: space for intent-log blocks.
//!
//! # Theory of operation
//!
//! Log blocks are allocated while a txg sync runs (an fsync does not wait
//! for the sync), but the normal allocator lives under `Pool::st`, which
//! the sync holds from start to end. So log blocks come from a class of
//! their own with its own lock: `LogSpace` holds *chunks*, extents lent by
//! the normal class, and carves log blocks out of them next-fit (the first
//! gap between live blocks after a cursor, wrapping); a chunk with no live
//! block goes back to the normal class at the end of a sync unless it is
//! kept as the reserve.
//!
//! Lent chunks are taken out of the allocator's free tree in memory only:
//! no space-map entry is ever written for them, so on disk they stay free.
//! A log block is needed on disk only until the txg of its records commits,
//! and what a crash leaves of the log is found by walking the chain from
//! the object sets' log headers, which import does before anything is
//! allocated, claiming every block it reaches (`Allocator::claim`) until
//! replay has committed. So a crash never leaks log space, and zdb's space
//! cross-check (which reads the space maps) never sees it. Condensing a
//! space map must count lent chunks as free, which it does through
//! [`LogSpace::lent_on`].
//!
//! Chunks are lent on demand: when a log block does not fit, the log takes
//! `Pool::st` if the sync does not hold it (`try_lock`) and borrows another
//! chunk. While a sync holds it, the commit raises a flag and waits (up to
//! `LEND_WAIT` in `Zil::commit`, without the log's lock) for the sync thread, which checks
//! the flag at every block it allocates and lends a few chunks
//! (`LogSpace::serve`). Before that, a commit that found the chunks used up
//! during a sync waited for the txg: under 8 jobs of 4 KiB fsyncs, a sync
//! of 500 MiB of dirty records (4 s) stopped every fsync for its whole
//! length (fio's per-second IOPS fell from 4,300 to 5). If the sync does
//! not answer in time (it is flushing), the commit still falls back to
//! the txg. At the end of every sync the class keeps a reserve of free
//! chunks sized by the last interval's use and gives the rest back.

use super::metaslab::Allocator;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of allocated space per chunk (before RAID-Z rounding).
pub const CHUNK: u64 = 1 << 20;
/// The largest log block (it must fit a chunk with room to spare).
pub const MAX_BLOCK: u32 = 256 << 10;

/// Where a log block lives: one extent on one top-level vdev.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogLoc {
    pub vdev: u32,
    pub offset: u64,
    /// Allocated bytes.
    pub asize: u64,
    /// Bytes written (and read back).
    pub psize: u32,
}

struct Chunk {
    vdev: u32,
    offset: u64,
    size: u64,
    geom: crate::vdev::Geometry,
    /// Next-fit cursor (bytes from `offset`): the next block goes here if
    /// it fits before the next live block, else the cursor wraps.
    used: u64,
    /// Blocks allocated from the chunk and not yet freed: offset in the
    /// chunk -> allocated size.
    blocks: std::collections::BTreeMap<u64, u64>,
    /// Sum of `blocks`' sizes.
    live_bytes: u64,
    on_log_dev: bool,
}

impl Chunk {
    fn live(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Room for `asize` bytes: the first gap between live blocks big
    /// enough, from the cursor on, wrapping to the chunk's start. Chunks
    /// are shared by every dataset's chain and freed in each chain's
    /// order, so a block of an idle dataset (its chain's tail) stays put
    /// while the others cycle around it. A bump pointer reset
    /// only when a chunk was wholly free let one such block pin a whole
    /// chunk: the POSIX suite's three datasets held 50-89 MiB of chunks
    /// for a few live blocks.
    fn fit(&mut self, asize: u64) -> Option<u64> {
        // Gaps between live blocks, from the cursor to the end, then from
        // the start back to the cursor.
        let gap_from = |mut pos: u64, stop: u64| -> Option<u64> {
            for (&o, &len) in self.blocks.range(pos..) {
                if o >= stop {
                    break;
                }
                if o - pos >= asize {
                    return Some(pos);
                }
                pos = pos.max(o + len);
            }
            (stop.saturating_sub(pos) >= asize).then_some(pos)
        };
        // (The cursor is never inside a live block: it moves only to the
        // end of the block just placed.)
        if self.size - self.live_bytes < asize {
            return None;
        }
        let at = gap_from(self.used, self.size).or_else(|| gap_from(0, self.used))?;
        self.blocks.insert(at, asize);
        self.live_bytes += asize;
        self.used = at + asize;
        Some(at)
    }
}

#[derive(Default)]
struct Inner {
    chunks: Vec<Chunk>,
    /// Bytes handed out since the last `rebalance`.
    handed: u64,
    /// Blocks of logs found at import, claimed until replay commits.
    claimed: Vec<LogLoc>,
    /// Vdevs not to lend from or allocate on (a failed log device).
    avoid: Vec<u32>,
    /// Log devices removed from the pool.
    dropped: Vec<u32>,
    /// Requests the sync thread answered (`serve`), for waiters.
    lends: u64,
    /// Most bytes of pool space the class may hold (`lend_cap`), as of
    /// the last borrow.
    cap: u64,
    /// A borrow was refused since the last sync (the cap, a full pool or
    /// a full log device).
    refused: bool,
    /// The chunk of pool space the last block came from: the next looks
    /// there first (full chunks are passed over without a scan).
    hint: usize,
}

/// Most bytes of the normal class the log may hold: enough for a few
/// seconds of log writes between txgs on a small pool (1/8 of it, up to
/// 256 MiB; 1/64 of the pool: 48 MiB on a 3 GiB mirror, ran out in under
/// two seconds of 8 jobs of 4 KiB fsyncs and stalled every commit until
/// the txg), 1/64 of a large one, at least one chunk.
fn lend_cap(total: u64) -> u64 {
    (total / 64).max((total / 8).min(256 << 20)).max(CHUNK)
}

#[derive(Default)]
pub struct LogSpace {
    inner: Mutex<Inner>,
    /// A commit found no room while a sync held the allocator: the sync
    /// thread lends chunks at its next allocation ([`LogSpace::serve`]).
    want: AtomicBool,
    /// Signalled when chunks were lent (or the sync ended).
    served: Condvar,
}

/// Chunks the sync thread lends per request made during a sync.
const LEND_PER_REQUEST: usize = 4;

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LogSpace {
    /// A block of `psize` bytes from the chunks held, if one fits.
    pub fn alloc(&self, psize: u32) -> Option<LogLoc> {
        let mut g = lock(&self.inner);
        let g = &mut *g;
        // Chunks on log devices first (they exist to take the log), then
        // the pool's, from the one that served last.
        let n = g.chunks.len();
        let hint = g.hint.min(n);
        for log_dev in [true, false] {
            for i in (hint..n).chain(0..hint) {
                let c = &mut g.chunks[i];
                if c.on_log_dev != log_dev || g.avoid.contains(&c.vdev) {
                    continue;
                }
                let asize = c.geom.asize(psize as u64);
                if let Some(at) = c.fit(asize) {
                    let loc = LogLoc {
                        vdev: c.vdev,
                        offset: c.offset + at,
                        asize,
                        psize,
                    };
                    g.handed += asize;
                    if !log_dev {
                        g.hint = i;
                    }
                    return Some(loc);
                }
            }
        }
        None
    }

    /// A commit found no room while a sync holds the allocator: ask the
    /// sync thread for chunks and wait up to `timeout` for them. Returns
    /// whether some were lent (the caller tries `alloc` again).
    pub fn request(&self, timeout: Duration) -> bool {
        let t0 = Instant::now();
        let mut g = lock(&self.inner);
        let before = g.lends;
        self.want.store(true, Ordering::Release);
        while g.lends == before {
            let Some(left) = timeout.checked_sub(t0.elapsed()) else {
                return false;
            };
            g = self
                .served
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Whether a commit is waiting for chunks (a cheap check the sync
    /// thread makes at every allocation).
    pub fn wanted(&self) -> bool {
        self.want.load(Ordering::Acquire)
    }

    /// The sync thread (holding the allocator) answers a request: lends a
    /// few chunks, as far as the class's bounds allow, and wakes the
    /// waiters either way (they fall back to the txg if none came).
    pub fn serve(&self, alloc: &mut Allocator) {
        if !self.want.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut lent = 0;
        while lent < LEND_PER_REQUEST && self.borrow(alloc) {
            lent += 1;
        }
        let mut g = lock(&self.inner);
        g.lends += 1;
        drop(g);
        self.served.notify_all();
    }

    /// A log block is no longer needed (its records' txgs committed).
    pub fn free(&self, loc: &LogLoc) {
        let mut g = lock(&self.inner);
        if let Some(c) = g.chunks.iter_mut().find(|c| {
            c.vdev == loc.vdev && c.offset <= loc.offset && loc.offset < c.offset + c.size
        }) {
            let gone = c.blocks.remove(&(loc.offset - c.offset));
            debug_assert!(gone.is_some(), "log block freed twice");
            c.live_bytes -= gone.unwrap_or(0).min(c.live_bytes);
        } else {
            // A block on a log device that left the pool is forgotten with
            // it (`drop_vdev`): nothing to give back.
            debug_assert!(
                g.dropped.contains(&loc.vdev),
                "free of a log block outside every chunk"
            );
        }
    }

    /// Borrow one more chunk from the normal class (caller holds `st`).
    /// Picks the vdev with the most allocatable space. Never more than
    /// `lend_cap` of the pool, and never into the last 1/32 of it (the
    /// slop the sync itself needs): past that, commits wait for the txg
    /// instead.
    pub fn borrow(&self, alloc: &mut Allocator) -> bool {
        // A log device first: all of it is the log class's. (A log device
        // that cannot take writes is not lent from; `set_avoid`.)
        let avoid = lock(&self.inner).avoid.clone();
        let log_dev = (0..alloc.vdevs.len())
            .filter(|&v| alloc.vdevs[v].log && !avoid.contains(&(v as u32)))
            .max_by_key(|&v| alloc.vdevs[v].allocatable_space())
            .filter(|&v| alloc.vdevs[v].allocatable_space() >= 2 * CHUNK);
        let v = match log_dev {
            Some(v) => v,
            None => {
                let total = alloc.total_space();
                let cap = lend_cap(total);
                let lent = {
                    let mut g = lock(&self.inner);
                    g.cap = cap;
                    g.chunks
                        .iter()
                        .filter(|c| !c.on_log_dev)
                        .map(|c| c.size)
                        .sum::<u64>()
                };
                if lent >= cap || alloc.allocatable_space() < total / 32 + 2 * CHUNK {
                    lock(&self.inner).refused = true;
                    return false;
                }
                match (0..alloc.vdevs.len())
                    .filter(|&v| !alloc.vdevs[v].log)
                    .max_by_key(|&v| alloc.vdevs[v].allocatable_space())
                {
                    Some(v) => v,
                    None => return false,
                }
            }
        };
        let vd = &alloc.vdevs[v];
        let geom = vd.geom;
        let size = geom.asize(CHUNK);
        let Some(offset) = alloc.lend(v, size) else {
            lock(&self.inner).refused = true;
            return false;
        };
        let on_log_dev = alloc.vdevs[v].log;
        let mut g = lock(&self.inner);
        g.chunks.push(Chunk {
            vdev: v as u32,
            offset,
            size,
            geom,
            used: 0,
            blocks: Default::default(),
            live_bytes: 0,
            on_log_dev,
        });
        true
    }

    /// End of a sync (caller holds `st`): keep free chunks for about twice
    /// what the last interval used (at least one), give the rest back.
    pub fn rebalance(&self, alloc: &mut Allocator) {
        let mut g = lock(&self.inner);
        let want = ((g.handed.div_ceil(CHUNK) as usize) * 2).clamp(1, 256);
        g.handed = 0;
        g.refused = false;
        let mut free = 0;
        let mut keep = Vec::with_capacity(g.chunks.len());
        // With a log device that takes writes, idle chunks of the pool's
        // own space go back: the log belongs there.
        let log_dev =
            (0..alloc.vdevs.len()).any(|v| alloc.vdevs[v].log && !g.avoid.contains(&(v as u32)));
        for c in std::mem::take(&mut g.chunks) {
            if !c.live() {
                if free >= want || (log_dev && !c.on_log_dev) {
                    alloc.give_back(c.vdev as usize, c.offset, c.size);
                    continue;
                }
                free += 1;
            }
            keep.push(c);
        }
        g.chunks = keep;
        let short = want.saturating_sub(free);
        drop(g);
        for _ in 0..short.min(4) {
            if !self.borrow(alloc) {
                break;
            }
        }
        self.serve(alloc);
    }

    /// Give back every chunk no log block lives in (the sync is short of
    /// space). Returns the bytes given back.
    pub fn release_idle(&self, alloc: &mut Allocator) -> u64 {
        let mut g = lock(&self.inner);
        let mut n = 0;
        g.chunks.retain(|c| {
            if c.live() {
                return true;
            }
            alloc.give_back(c.vdev as usize, c.offset, c.size);
            n += c.size;
            false
        });
        n
    }

    /// Extents lent on vdev `v` (condensing counts them as free: on disk
    /// they are).
    pub fn lent_on(&self, v: u32) -> Vec<(u64, u64)> {
        let g = lock(&self.inner);
        g.chunks
            .iter()
            .filter(|c| c.vdev == v)
            .map(|c| (c.offset, c.size))
            .chain(
                g.claimed
                    .iter()
                    .filter(|l| l.vdev == v)
                    .map(|l| (l.offset, l.asize)),
            )
            .collect()
    }

    /// Import: a log block the chain reaches is taken out of the normal
    /// class (in memory) until replay has committed.
    pub fn claim(&self, alloc: &mut Allocator, loc: &LogLoc) -> bool {
        let ok = alloc.claim(loc.vdev as usize, loc.offset, loc.asize);
        if ok {
            lock(&self.inner).claimed.push(*loc);
        }
        ok
    }

    /// Replay committed: the claimed blocks are free again.
    pub fn release_claims(&self, alloc: &mut Allocator) {
        for l in std::mem::take(&mut lock(&self.inner).claimed) {
            alloc.give_back(l.vdev as usize, l.offset, l.asize);
        }
    }

    /// Stop (or resume) allocating on vdev `v` (a log device whose write
    /// failed, or one being removed); its idle chunks go back.
    pub fn set_avoid(&self, v: u32, on: bool, alloc: Option<&mut Allocator>) {
        let mut g = lock(&self.inner);
        g.avoid.retain(|&x| x != v);
        if on {
            g.avoid.push(v);
            if let Some(alloc) = alloc {
                g.chunks.retain(|c| {
                    if c.vdev != v || c.live() {
                        return true;
                    }
                    alloc.give_back(c.vdev as usize, c.offset, c.size);
                    false
                });
            }
        }
    }

    /// A log device leaves the pool: every chunk on it is dropped (its
    /// blocks are forgotten by the logs first, `Zil::forget_vdev`).
    pub fn drop_vdev(&self, v: u32) {
        let mut g = lock(&self.inner);
        g.chunks.retain(|c| c.vdev != v);
        g.claimed.retain(|c| c.vdev != v);
        g.avoid.retain(|&x| x != v);
        g.dropped.push(v);
    }

    /// The vdevs avoided now.
    pub fn avoided(&self) -> Vec<u32> {
        lock(&self.inner).avoid.clone()
    }

    /// The class is short of space: a borrow was refused since the last
    /// sync, or half of what it may hold of the pool carries live log
    /// blocks. A txg then commits early (its end frees the blocks of the
    /// records it carries), as a txg does when dirty data passes its
    /// threshold: otherwise commits fall back to waiting for it.
    pub fn pressed(&self) -> bool {
        let g = lock(&self.inner);
        if g.refused {
            return true;
        }
        // (Per-chunk counters: summing the blocks themselves here, on
        // every write, was 3% of the FUSE threads' samples.)
        let live: u64 = g
            .chunks
            .iter()
            .filter(|c| !c.on_log_dev)
            .map(|c| c.live_bytes)
            .sum();
        g.cap > 0 && live >= g.cap / 2
    }

    /// A txg came and went (or there was nothing to commit): a refused
    /// borrow no longer asks for one.
    pub fn forget_refusal(&self) {
        lock(&self.inner).refused = false;
    }

    /// Bytes of pool space lent to the class in chunks without a live log
    /// block: free as far as users are told (`Pool::snapshot_space`), since
    /// a sync short of space takes them back (`release_idle`).
    pub fn idle_bytes(&self) -> u64 {
        lock(&self.inner)
            .chunks
            .iter()
            .filter(|c| !c.on_log_dev && !c.live())
            .map(|c| c.size)
            .sum()
    }

    /// Bytes lent to the class.
    pub fn lent_bytes(&self) -> u64 {
        lock(&self.inner).chunks.iter().map(|c| c.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::metaslab::VdevAlloc;

    fn allocator() -> Allocator {
        Allocator::new(vec![VdevAlloc::new(0, 12, 1 << 30, 24, &[])])
    }

    /// A commit that finds the chunks used up while a sync holds the
    /// allocator asks for more and gets them from the sync thread's next
    /// allocation, instead of waiting for the whole txg.
    #[test]
    fn a_sync_in_progress_lends_space_to_a_waiting_commit() {
        let ls = LogSpace::default();
        let alloc = Mutex::new(allocator());
        // The class holds one chunk; use it up.
        assert!(ls.borrow(&mut alloc.lock().expect("allocator")));
        while ls.alloc(64 << 10).is_some() {}
        let st = alloc.lock().expect("allocator"); // the "sync" holds it
        std::thread::scope(|s| {
            let committer = s.spawn(|| ls.request(Duration::from_secs(10)));
            // The sync thread, allocating block after block, sees the
            // request and answers it.
            let mut st = st;
            let t0 = Instant::now();
            while !ls.wanted() {
                assert!(t0.elapsed() < Duration::from_secs(10), "no request came");
                std::thread::sleep(Duration::from_millis(1));
            }
            ls.serve(&mut st);
            assert!(
                committer.join().expect("committer"),
                "the commit was not served"
            );
        });
        assert!(ls.alloc(64 << 10).is_some(), "no space after the loan");
        assert_eq!(ls.lent_bytes(), (1 + LEND_PER_REQUEST as u64) * CHUNK);
    }

    /// Nobody answers (the sync is flushing, or the class is at its
    /// bound): the commit gives up after its wait and falls back.
    #[test]
    fn an_unanswered_request_times_out() {
        let ls = LogSpace::default();
        let t0 = Instant::now();
        assert!(!ls.request(Duration::from_millis(30)));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        // The flag stays up for the sync to see; serving with no room to
        // lend still wakes the waiters.
        assert!(ls.wanted());
        let mut a = Allocator::new(vec![VdevAlloc::new(0, 12, 1 << 20, 24, &[])]);
        ls.serve(&mut a);
        assert!(!ls.wanted());
        assert_eq!(ls.lent_bytes(), 0);
    }

    /// The class holds up to 1/8 of a small pool, and asks for a txg (whose
    /// end frees log blocks) once half of that carries live blocks or a
    /// borrow is refused, not only when it has run out.
    #[test]
    fn a_class_half_full_of_live_blocks_asks_for_a_txg() {
        let ls = LogSpace::default();
        let mut alloc = allocator();
        assert_eq!(lend_cap(1 << 30), 128 << 20);
        assert_eq!(lend_cap(1 << 40), 16 << 30);
        assert!(ls.borrow(&mut alloc));
        assert!(!ls.pressed(), "one chunk in use is no pressure");
        let mut n = 1;
        while ls.borrow(&mut alloc) {
            n += 1;
        }
        assert_eq!(n as u64 * CHUNK, 128 << 20, "lent up to the cap");
        assert!(ls.pressed(), "a refused borrow is pressure");
        ls.rebalance(&mut alloc);
        // Everything idle went back but a reserve; refusal forgotten.
        assert!(!ls.pressed());
        while ls.lent_bytes() < 100 << 20 {
            assert!(ls.borrow(&mut alloc), "under the cap");
        }
        let mut live = 0u64;
        while ls.alloc(1 << 20).is_some() {
            live += CHUNK;
            if ls.pressed() {
                break;
            }
        }
        assert_eq!(live, 64 << 20, "pressed at half the cap of live blocks");
    }

    /// Blocks freed around one that stays (an idle dataset's chain tail)
    /// are reused: the chunk's cursor wraps past it, and no second chunk
    /// is borrowed.
    #[test]
    fn a_block_that_stays_does_not_pin_its_chunk() {
        let ls = LogSpace::default();
        let mut alloc = allocator();
        assert!(ls.borrow(&mut alloc));
        let stays = ls.alloc(8192).expect("first block");
        let mut fifo = std::collections::VecDeque::new();
        for _ in 0..10_000 {
            let l = ls
                .alloc(64 << 10)
                .expect("a chunk with one live 8 KiB block has room");
            fifo.push_back(l);
            if fifo.len() > 8 {
                let old = fifo.pop_front().expect("queued");
                ls.free(&old);
            }
        }
        assert_eq!(ls.lent_bytes(), CHUNK, "borrowed more than the one chunk");
        assert!(fifo
            .iter()
            .all(|l| l.offset + l.asize <= stays.offset || l.offset >= stays.offset + stays.asize));
        assert_eq!(ls.idle_bytes(), 0);
        ls.free(&stays);
        for l in fifo {
            ls.free(&l);
        }
        assert_eq!(ls.idle_bytes(), CHUNK);
    }
}
