//! The ARC: the block cache beside the DMU. Verified, decompressed blocks
//! held under the adaptive replacement policy of [`lists`] (MRU and MFU
//! with ghost lists, a metadata floor, unused prefetches first), bounded
//! in bytes. Keys include the checksum, so a block rewritten in place
//! within its birth txg can never be served stale. Blocks enter it when
//! read and when a sync writes them (the data is the dirty buffer itself,
//! no copy), so the next txg's read-modify-write of a record finds it
//! here. `zinject -a` empties it. A block reached through several datasets
//! (a clone and its origin) has one key, its address, so it is one entry.
//!
//! # Size under memory pressure
//!
//! The cache may grow to `max_bytes` (`arc_max`; by default a quarter of
//! the memory the daemon may use), but like OpenZFS's ARC it gives memory
//! back when the machine runs short: at most every [`PRESSURE_CHECK`] an
//! insert reads the kernel's MemAvailable (and the memory cgroup's room),
//! and while it is below the reserve (1/8 of RAM, at least 256 MiB) the
//! target `c` drops by the shortfall and blocks are evicted by the policy;
//! once memory is free again `c` climbs back towards `max_bytes`, never
//! below `min_bytes` (`arc_min`). Pressure stall information counts too:
//! while tasks stalled on memory for more than [`STALL_SHRINK_PCT`] of the
//! last ten seconds (PSI `some avg10`, the cgroup's `memory.pressure` under
//! cgroup v2, else `/proc/pressure/memory`), each check gives back an
//! eighth of what is held. A daemon in user space has no shrinker
//! callback, so this polling is the substitute.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often an insert may look at the machine's free memory.
pub const PRESSURE_CHECK: Duration = Duration::from_millis(250);
/// The cache never shrinks below this for memory pressure (`arc_min`,
/// unless set otherwise).
pub const FLOOR_BYTES: u64 = 32 << 20;
/// Memory stalls (PSI `some avg10`, percent) above which the cache gives
/// back an eighth of what it holds per check, however much MemAvailable
/// says is free: reclaim is already hurting someone (a cgroup at its
/// `memory.high`, a machine swapping page cache in and out).
pub const STALL_SHRINK_PCT: f64 = 10.0;

pub mod inflight;
pub mod l2;
pub mod lists;
pub mod memory;
pub use lists::{Class, Counters, Evicted, Sizes};
pub use memory::{cgroup_path, cgroup_value, Cgroup, MemoryProbe, ProcMeminfo, SystemMemory};

pub type Key = (u32, u64, [u8; 16]);

type Block = Arc<Vec<u8>>;

thread_local! {
    static PREFETCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` as read-ahead: the reads it makes are prefetches to the cache
/// (they do not count as accesses, and the blocks they bring in are the
/// first evicted if nothing reads them).
/// Their device reads go in the async-read class (`vdev/queue.rs`).
pub fn prefetching<R>(f: impl FnOnce() -> R) -> R {
    let _c = crate::vdev::queue::with_class(Some(crate::vdev::queue::IoClass::AsyncRead));
    crate::with_flag(&PREFETCHING, f)
}

/// Whether this thread is reading ahead ([`prefetching`]).
pub fn is_prefetch() -> bool {
    PREFETCHING.with(|p| p.get())
}

pub struct BlockCache {
    max_bytes: u64,
    /// Memory pressure never takes it below this (`arc_min`).
    min_bytes: u64,
    /// What the cache may hold now: `max_bytes` unless memory is short.
    target: AtomicU64,
    probe: Box<dyn MemoryProbe>,
    /// Memory's reserve (1/8 of RAM, at least 256 MiB), read once.
    reserve: u64,
    check_every: Duration,
    last_check: Mutex<Option<Instant>>,
    /// The policy's clock starts here (milliseconds since).
    born: Instant,
    lists: Mutex<lists::Lists<Block>>,
    /// Cache devices (the L2ARC, `l2.rs`): fed what the lists let go,
    /// asked on a miss.
    l2: std::sync::RwLock<Vec<Arc<l2::L2Device>>>,
    /// Round robin of the feed over several cache devices.
    l2_turn: AtomicU64,
    /// Blocks being read after a miss, so a second miss waits for the
    /// first read instead of reading again (`inflight.rs`).
    inflight: inflight::InFlight<Key, Block>,
    /// Misses that waited for a read in flight instead of reading
    /// (OpenZFS's `iohits`; each is also counted as a miss).
    iohits: AtomicU64,
}

/// Everything `uzfs arcstat` and the `arcstats` file show.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArcStats {
    pub counters: Counters,
    pub sizes: Sizes,
    pub c_min: u64,
    pub c_max: u64,
    /// The cache devices', summed.
    pub l2: l2::L2Stats,
    /// Misses that waited for a read in flight (OpenZFS's `iohits`).
    pub iohits: u64,
}

impl ArcStats {
    /// Counts since the cache was made, by their OpenZFS `arcstats` names
    /// (uzfs's own, with no OpenZFS counterpart, start with `uzfs_`).
    pub fn counter_fields(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        vec![
            ("hits", c.hits),
            ("misses", c.misses),
            ("iohits", self.iohits),
            ("demand_data_hits", c.demand_data_hits),
            ("demand_data_misses", c.demand_data_misses),
            ("demand_metadata_hits", c.demand_metadata_hits),
            ("demand_metadata_misses", c.demand_metadata_misses),
            ("prefetch_data_hits", c.prefetch_data_hits),
            ("prefetch_data_misses", c.prefetch_data_misses),
            ("prefetch_metadata_hits", c.prefetch_metadata_hits),
            ("prefetch_metadata_misses", c.prefetch_metadata_misses),
            ("mru_hits", c.mru_hits),
            ("mru_ghost_hits", c.mru_ghost_hits),
            ("mfu_hits", c.mfu_hits),
            ("mfu_ghost_hits", c.mfu_ghost_hits),
            ("uzfs_evict_mru", c.evict_mru),
            ("uzfs_evict_mfu", c.evict_mfu),
            ("uzfs_evict_prefetch_unused", c.evict_prefetch_unused),
            ("uzfs_handed_off", c.handed_off),
            ("uzfs_freed", c.freed),
            ("l2_hits", self.l2.hits),
            ("l2_misses", self.l2.misses),
            ("l2_read_bytes", self.l2.read_bytes),
            ("l2_write_bytes", self.l2.write_bytes),
            ("l2_writes_sent", self.l2.writes_sent),
            ("l2_writes_error", self.l2.writes_error),
            ("l2_cksum_bad", self.l2.cksum_bad),
            ("l2_io_error", self.l2.io_error),
            ("l2_rw_clash", self.l2.rw_clash),
            ("l2_rebuild_bufs", self.l2.rebuild_bufs),
            ("uzfs_l2_rebuild_slots", self.l2.rebuild_slots),
            ("uzfs_l2_rebuild_errors", self.l2.rebuild_errors),
            ("uzfs_l2_feed_dropped", self.l2.feed_dropped),
        ]
    }

    /// Sizes as they are now (an interval shows them, not their change).
    pub fn gauge_fields(&self) -> Vec<(&'static str, u64)> {
        let z = &self.sizes;
        vec![
            ("p", z.p),
            ("c", z.c),
            ("c_min", self.c_min),
            ("c_max", self.c_max),
            ("size", z.size),
            ("data_size", z.data),
            ("metadata_size", z.metadata),
            ("mru_size", z.mru),
            ("mru_ghost_size", z.mru_ghost),
            ("mfu_size", z.mfu),
            ("mfu_ghost_size", z.mfu_ghost),
            ("uzfs_meta_floor", z.meta_floor),
            ("uzfs_prefetch_unused_size", z.prefetch_unused),
            ("uzfs_entries", z.entries),
            ("uzfs_ghost_entries", z.ghost_entries),
            // Blocks are stored on the cache device as they are held.
            ("l2_size", self.l2.size),
            ("l2_asize", self.l2.size),
            ("uzfs_l2_entries", self.l2.entries),
        ]
    }

    /// Every figure: the counters, then the sizes.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.counter_fields();
        v.extend(self.gauge_fields());
        v
    }
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> Self {
        Self::with_probe(max_bytes, Box::new(SystemMemory::detect()), PRESSURE_CHECK)
    }

    /// A cache that asks `probe` about memory at most every `check_every`.
    pub fn with_probe(max_bytes: u64, probe: Box<dyn MemoryProbe>, check_every: Duration) -> Self {
        BlockCache {
            max_bytes,
            min_bytes: FLOOR_BYTES.min(max_bytes),
            l2: std::sync::RwLock::new(Vec::new()),
            l2_turn: AtomicU64::new(0),
            target: AtomicU64::new(max_bytes),
            reserve: (probe.total() / 8).max(256 << 20),
            probe,
            check_every,
            last_check: Mutex::new(None),
            born: Instant::now(),
            lists: Mutex::new(lists::Lists::new(max_bytes)),
            inflight: inflight::InFlight::default(),
            iohits: AtomicU64::new(0),
        }
    }

    /// After a miss on `k`: read it (and publish the bytes through the
    /// guard once cached), or wait for the read already under way.
    pub fn begin_read(&self, k: Key) -> inflight::Begun<'_, Key, Block> {
        self.inflight.begin(k)
    }

    /// A miss was served by a read in flight.
    pub fn count_iohit(&self) {
        self.iohits.fetch_add(1, Ordering::Relaxed);
    }

    /// Misses served by a read in flight, since the cache was made.
    pub fn iohits(&self) -> u64 {
        self.iohits.load(Ordering::Relaxed)
    }

    /// The floor memory pressure cannot push it below (`arc_min`; at most
    /// `max_bytes`).
    pub fn with_min(mut self, min_bytes: u64) -> Self {
        self.min_bytes = min_bytes.min(self.max_bytes);
        self
    }

    /// The least the cache is held to under memory pressure (`arc_min`).
    pub fn min_bytes(&self) -> u64 {
        self.min_bytes
    }

    /// The size the cache is held to now (`c`).
    pub fn target_bytes(&self) -> u64 {
        self.target.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lists::Lists<Block>> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Re-read free memory if `check_every` has passed; returns the target
    /// if it changed. Between checks this is one mutex taken briefly; the
    /// lists are locked (to learn what is held) only when a check is due.
    fn adjust_target(&self) -> Option<u64> {
        let due = {
            let mut last = self.last_check.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let due = last.is_none_or(|t| now.duration_since(t) >= self.check_every);
            if due {
                *last = Some(now);
            }
            due
        };
        if !due {
            return None;
        }
        let target = self.target.load(Ordering::Relaxed);
        let stalled = self.probe.stall_pct().is_some_and(|p| p > STALL_SHRINK_PCT);
        let avail = self.probe.available();
        if avail.is_none() && !stalled {
            return None;
        }
        let avail = avail.unwrap_or(u64::MAX);
        let held = self.lock().sizes().size;
        let reserve = self.reserve;
        let floor = self.min_bytes;
        let new = if stalled {
            // Tasks wait for memory: give back an eighth of what is held.
            let h = held.min(target);
            (h - h / 8).max(floor)
        } else if avail < reserve {
            // Short: give back the shortfall from what is held now.
            held.min(target).saturating_sub(reserve - avail).max(floor)
        } else {
            // Room again: grow by half of what is free above the reserve.
            target
                .saturating_add((avail - reserve) / 2)
                .min(self.max_bytes)
        };
        self.target.store(new, Ordering::Relaxed);
        (new != target).then_some(new)
    }

    /// A demand read of the block `k` (of `class`), or a prefetch's lookup
    /// when this thread runs [`prefetching`].
    pub fn get(&self, k: &Key, class: Class) -> Option<Block> {
        let now = self.now_ms();
        self.lock()
            .lookup(k, lists::Access::new(class, !is_prefetch(), now))
    }

    /// [`BlockCache::get`] of a block that is cached; a block that is not
    /// is no miss (nothing will be read for it).
    pub fn get_cached(&self, k: &Key, class: Class) -> Option<Block> {
        let now = self.now_ms();
        let mut l = self.lock();
        if !l.contains(k) {
            return None;
        }
        l.lookup(k, lists::Access::new(class, !is_prefetch(), now))
    }

    /// Whether block `k` is held (no access counted: nothing reads it).
    pub fn contains(&self, k: &Key) -> bool {
        self.lock().contains(k)
    }

    /// Block `k` was delivered whole to the kernel's page cache above a
    /// mount, which now holds it: take it out, so its bytes are held once
    /// (docs/ARCHITECTURE.md, "one copy"). It goes as an evicted block
    /// does (to a cache device's feed, if any, since the kernel may drop
    /// its pages before the next read), but leaves no ghost.
    pub fn hand_off(&self, k: &Key) {
        let gone = self.take_out(k, |c| &mut c.handed_off);
        self.let_go(gone.into_iter().collect());
    }

    /// Remove block `k` (no ghost), counted in the counter `which` picks.
    fn take_out(
        &self,
        k: &Key,
        which: impl FnOnce(&mut lists::Counters) -> &mut u64,
    ) -> Option<Evicted<Block>> {
        let mut l = self.lock();
        let gone = l.remove(k);
        *which(&mut l.counters) += gone.is_some() as u64;
        gone
    }

    /// Block `k` was freed (OpenZFS's `arc_freed`): nothing can ask for it
    /// again, so it leaves at once, with no ghost and nothing for a cache
    /// device. Without this a record rewritten in every txg kept each dead
    /// version until it aged out, and a cache of twice the live records
    /// held them once alive and once dead, reading the live ones back from
    /// the devices at every sync (bench/RESULTS.md, "freed blocks").
    pub fn freed(&self, k: &Key) {
        // Dropped here, outside the lock.
        drop(self.take_out(k, |c| &mut c.freed));
    }

    /// Drop every cached block (after the media changed under the pool).
    pub fn clear(&self) {
        let mut gone = Vec::new();
        self.lock().clear(&mut gone);
        drop(gone);
    }

    /// Block `k` was read (or written by a sync): keep it. A prefetching
    /// thread's blocks enter as prefetched.
    pub fn insert(&self, k: Key, v: Block, class: Class) {
        if self.max_bytes == 0 || v.len() as u64 > self.max_bytes / 4 {
            return;
        }
        let changed = self.adjust_target();
        let now = self.now_ms();
        let size = v.len() as u64;
        let mut gone = Vec::new();
        {
            let mut l = self.lock();
            if let Some(c) = changed {
                l.set_target(c, &mut gone);
            }
            l.insert(
                k,
                v,
                size,
                lists::Access::new(class, !is_prefetch(), now),
                &mut gone,
            );
        }
        // Freed outside the lock: returning big buffers to the allocator
        // (or the kernel) should not stall other readers.
        self.let_go(gone);
    }

    /// The most the cache may hold (`arc_max`).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// (bytes held, hits, misses)
    pub fn stats(&self) -> (u64, u64, u64) {
        let l = self.lock();
        (l.sizes().size, l.counters.hits, l.counters.misses)
    }

    /// Every counter and size.
    pub fn arcstats(&self) -> ArcStats {
        let l = self.lock();
        ArcStats {
            counters: l.counters,
            sizes: l.sizes(),
            c_min: self.min_bytes,
            c_max: self.max_bytes,
            l2: self.l2_stats(),
            iohits: self.iohits(),
        }
    }

    /// Cache devices in use.
    pub fn l2_devices(&self) -> Vec<Arc<l2::L2Device>> {
        self.l2.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A cache device joins (added, or opened at import).
    pub fn add_l2(&self, d: Arc<l2::L2Device>) {
        self.l2.write().unwrap_or_else(|e| e.into_inner()).push(d);
    }

    /// A cache device leaves: its feed stops, what it held is forgotten.
    pub fn remove_l2(&self, guid: u64) {
        self.l2
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| {
                let keep = d.leaf.guid != guid;
                if !keep {
                    d.stop();
                }
                keep
            });
    }

    /// The pool closes: every feed thread ends before this returns.
    pub fn close_l2(&self) {
        for d in self.l2_devices() {
            d.close();
        }
    }

    fn l2_stats(&self) -> l2::L2Stats {
        let mut s = l2::L2Stats::default();
        for d in self.l2_devices() {
            s.add(&d.stats());
        }
        s
    }

    /// After a miss: the block `k` from a cache device, verified, or
    /// `None` (none holds it, or what one held was bad: counted there).
    pub fn l2_read(&self, k: &Key) -> Option<Vec<u8>> {
        let devs = self.l2.read().unwrap_or_else(|e| e.into_inner());
        let first = devs.first()?;
        // One lookup, one count: a hit on the device that served it, a
        // miss (nothing held it, or what was held was bad) on the first.
        for d in devs.iter().filter(|d| d.contains(k)) {
            if let Some(v) = d.read(k) {
                d.count(true);
                return Some(v);
            }
        }
        first.count(false);
        None
    }

    /// Hand what the lists let go to the cache devices (round robin), then
    /// drop it, outside the lists' lock.
    fn let_go(&self, gone: Vec<Evicted<Block>>) {
        if gone.is_empty() {
            return;
        }
        let devs = self.l2.read().unwrap_or_else(|e| e.into_inner());
        if !devs.is_empty() {
            for e in gone.iter().filter(|e| e.used) {
                let i = self.l2_turn.fetch_add(1, Ordering::Relaxed) as usize % devs.len();
                devs[i].feed(e.key, &e.v, e.class);
            }
        }
        drop(devs);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine of 8 GiB whose free memory the test sets.
    struct Fake(Arc<AtomicU64>);
    impl MemoryProbe for Fake {
        fn total(&self) -> u64 {
            8 << 30
        }
        fn available(&self) -> Option<u64> {
            Some(self.0.load(Ordering::Relaxed))
        }
    }

    fn key(i: u64) -> Key {
        (0, i, [0; 16])
    }

    #[test]
    fn shrinks_under_memory_pressure_and_grows_back() {
        const MIB: u64 = 1 << 20;
        let avail = Arc::new(AtomicU64::new(6 << 30));
        let c = BlockCache::with_probe(512 * MIB, Box::new(Fake(avail.clone())), Duration::ZERO);
        let block = Arc::new(vec![7u8; MIB as usize]);
        for i in 0..600 {
            c.insert(key(i), block.clone(), Class::Data);
        }
        assert_eq!(c.stats().0, 512 * MIB, "full to max_bytes with memory free");
        // The machine runs short: 300 MiB below the 1 GiB reserve.
        avail.store((1 << 30) - 300 * MIB, Ordering::Relaxed);
        c.insert(key(1000), block.clone(), Class::Data);
        let held = c.stats().0;
        assert!(held <= 213 * MIB, "gave back the shortfall, holds {held}");
        assert_eq!(c.target_bytes(), held);
        // The newest blocks stayed, the coldest went.
        assert!(
            c.get(&key(1000), Class::Data).is_some() && c.get(&key(599), Class::Data).is_some()
        );
        assert!(c.get(&key(0), Class::Data).is_none());
        // Pressure cannot push it below the floor.
        avail.store(0, Ordering::Relaxed);
        for i in 0..10 {
            c.insert(key(2000 + i), block.clone(), Class::Data);
        }
        assert_eq!(c.stats().0, FLOOR_BYTES);
        // Memory free again: the target climbs back to max_bytes.
        avail.store(6 << 30, Ordering::Relaxed);
        for i in 0..600 {
            c.insert(key(3000 + i), block.clone(), Class::Data);
        }
        assert_eq!(c.target_bytes(), 512 * MIB);
        assert_eq!(c.stats().0, 512 * MIB);
    }

    /// `arc_min` holds under any pressure, and cannot exceed `arc_max`.
    #[test]
    fn pressure_stops_at_arc_min() {
        const MIB: u64 = 1 << 20;
        let avail = Arc::new(AtomicU64::new(6 << 30));
        let c = BlockCache::with_probe(512 * MIB, Box::new(Fake(avail.clone())), Duration::ZERO)
            .with_min(100 * MIB);
        assert_eq!(c.min_bytes(), 100 * MIB);
        let block = Arc::new(vec![7u8; MIB as usize]);
        for i in 0..600 {
            c.insert(key(i), block.clone(), Class::Data);
        }
        avail.store(0, Ordering::Relaxed);
        for i in 0..10 {
            c.insert(key(1000 + i), block.clone(), Class::Data);
        }
        assert_eq!(c.stats().0, 100 * MIB);
        assert_eq!(c.target_bytes(), 100 * MIB);
        let small = BlockCache::with_probe(8 * MIB, Box::new(Fake(avail)), Duration::ZERO)
            .with_min(100 * MIB);
        assert_eq!(small.min_bytes(), 8 * MIB);
    }

    /// Memory stalls shrink the cache by an eighth per check even while
    /// MemAvailable looks fine; without stalls it grows back.
    #[test]
    fn memory_stalls_shrink_the_cache() {
        struct Stalling(Arc<AtomicU64>);
        impl MemoryProbe for Stalling {
            fn total(&self) -> u64 {
                8 << 30
            }
            fn available(&self) -> Option<u64> {
                Some(6 << 30)
            }
            fn stall_pct(&self) -> Option<f64> {
                Some(self.0.load(Ordering::Relaxed) as f64)
            }
        }
        const MIB: u64 = 1 << 20;
        let stall = Arc::new(AtomicU64::new(0));
        let c =
            BlockCache::with_probe(512 * MIB, Box::new(Stalling(stall.clone())), Duration::ZERO);
        let block = Arc::new(vec![7u8; MIB as usize]);
        for i in 0..600 {
            c.insert(key(i), block.clone(), Class::Data);
        }
        assert_eq!(c.stats().0, 512 * MIB);
        stall.store(25, Ordering::Relaxed);
        c.insert(key(1000), block.clone(), Class::Data);
        assert_eq!(c.target_bytes(), 448 * MIB, "an eighth given back");
        assert!(c.stats().0 <= 448 * MIB);
        for i in 0..40 {
            c.insert(key(2000 + i), block.clone(), Class::Data);
        }
        assert_eq!(c.target_bytes(), FLOOR_BYTES, "down to arc_min, no further");
        stall.store(0, Ordering::Relaxed);
        for i in 0..10 {
            c.insert(key(3000 + i), block.clone(), Class::Data);
        }
        assert_eq!(
            c.target_bytes(),
            512 * MIB,
            "grows back once the stalls end"
        );
    }

    #[test]
    fn unknown_free_memory_keeps_the_size() {
        struct Blind;
        impl MemoryProbe for Blind {
            fn total(&self) -> u64 {
                1 << 30
            }
            fn available(&self) -> Option<u64> {
                None
            }
        }
        let c = BlockCache::with_probe(8 << 20, Box::new(Blind), Duration::ZERO);
        for i in 0..20 {
            c.insert(key(i), Arc::new(vec![0u8; 1 << 20]), Class::Data);
        }
        assert_eq!(c.stats().0, 8 << 20);
        assert_eq!(c.target_bytes(), 8 << 20);
    }
}
