//! Block cache beside the DMU. Today a plain LRU of verified, decompressed
//! blocks bounded in bytes; the adaptive (MRU/MFU with ghost lists) policy and
//! L2ARC belong to a later issue. Keys include the checksum, so a block
//! rewritten in place within its birth txg can never be served stale.
//! Blocks enter it when read and when a sync writes them (the data is the
//! dirty buffer itself, no copy), so the next txg's read-modify-write of a
//! record finds it here. `zinject -a` empties it.
//!
//! # Size under memory pressure
//!
//! The cache may grow to `max_bytes` (by default a quarter of RAM), but like
//! OpenZFS's ARC it gives memory back when the machine runs short: at most
//! every [`PRESSURE_CHECK`] an insert reads the kernel's MemAvailable, and
//! while it is below the reserve (1/8 of RAM, at least 256 MiB) the target
//! drops by the shortfall and the coldest blocks are evicted; once memory is
//! free again the target climbs back towards `max_bytes`. A daemon in user
//! space has no shrinker callback, so this polling is the substitute.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often an insert may look at the machine's free memory.
pub const PRESSURE_CHECK: Duration = Duration::from_millis(250);
/// The cache never shrinks below this for memory pressure.
const FLOOR_BYTES: u64 = 32 << 20;

/// Where the cache learns how much memory the machine has and has free.
pub trait MemoryProbe: Send + Sync {
    /// Bytes of RAM.
    fn total(&self) -> u64;
    /// Bytes the kernel could hand out without swapping (MemAvailable), or
    /// `None` when unknown (the cache then keeps its size).
    fn available(&self) -> Option<u64>;
}

/// `/proc/meminfo`.
pub struct ProcMeminfo;

fn meminfo_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
}

impl MemoryProbe for ProcMeminfo {
    fn total(&self) -> u64 {
        meminfo_kb("MemTotal:").map_or(4 << 30, |kb| kb * 1024)
    }
    fn available(&self) -> Option<u64> {
        meminfo_kb("MemAvailable:").map(|kb| kb * 1024)
    }
}

pub type Key = (u32, u64, [u8; 16]);

#[derive(Default)]
struct Lru {
    map: HashMap<Key, (Arc<Vec<u8>>, u64)>,
    order: BTreeMap<u64, Key>,
    bytes: u64,
    tick: u64,
    hits: u64,
    misses: u64,
}

pub struct BlockCache {
    max_bytes: u64,
    /// What the cache may hold now: `max_bytes` unless memory is short.
    target: AtomicU64,
    probe: Box<dyn MemoryProbe>,
    /// Memory's reserve (1/8 of RAM, at least 256 MiB), read once.
    reserve: u64,
    check_every: Duration,
    last_check: Mutex<Option<Instant>>,
    lru: Mutex<Lru>,
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> Self {
        Self::with_probe(max_bytes, Box::new(ProcMeminfo), PRESSURE_CHECK)
    }

    /// A cache that asks `probe` about memory at most every `check_every`.
    pub fn with_probe(max_bytes: u64, probe: Box<dyn MemoryProbe>, check_every: Duration) -> Self {
        BlockCache {
            max_bytes,
            target: AtomicU64::new(max_bytes),
            reserve: (probe.total() / 8).max(256 << 20),
            probe,
            check_every,
            last_check: Mutex::new(None),
            lru: Mutex::new(Lru::default()),
        }
    }

    /// The size the cache is held to now.
    pub fn target_bytes(&self) -> u64 {
        self.target.load(Ordering::Relaxed)
    }

    /// Re-read free memory if `check_every` has passed; returns the target.
    /// Between checks this is one mutex taken briefly; the LRU is locked
    /// (to learn what is held) only when a check is due.
    fn adjust_target(&self) -> u64 {
        let due = {
            let mut last = self.last_check.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let due = last.is_none_or(|t| now.duration_since(t) >= self.check_every);
            if due {
                *last = Some(now);
            }
            due
        };
        let target = self.target.load(Ordering::Relaxed);
        if !due {
            return target;
        }
        let Some(avail) = self.probe.available() else {
            return target;
        };
        let held = self.lru.lock().unwrap_or_else(|e| e.into_inner()).bytes;
        let reserve = self.reserve;
        let floor = FLOOR_BYTES.min(self.max_bytes);
        let new = if avail < reserve {
            // Short: give back the shortfall from what is held now.
            held.min(target).saturating_sub(reserve - avail).max(floor)
        } else {
            // Room again: grow by half of what is free above the reserve.
            target
                .saturating_add((avail - reserve) / 2)
                .min(self.max_bytes)
        };
        self.target.store(new, Ordering::Relaxed);
        new
    }

    pub fn get(&self, k: &Key) -> Option<Arc<Vec<u8>>> {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.tick += 1;
        let t = l.tick;
        match l.map.get_mut(k) {
            Some((v, tick)) => {
                let (v, old) = (v.clone(), *tick);
                *tick = t;
                l.order.remove(&old);
                l.order.insert(t, *k);
                l.hits += 1;
                Some(v)
            }
            None => {
                l.misses += 1;
                None
            }
        }
    }

    /// Drop every cached block (after the media changed under the pool).
    pub fn clear(&self) {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.map.clear();
        l.order.clear();
        l.bytes = 0;
    }

    pub fn insert(&self, k: Key, v: Arc<Vec<u8>>) {
        if self.max_bytes == 0 || v.len() as u64 > self.max_bytes / 4 {
            return;
        }
        let target = self.adjust_target();
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.tick += 1;
        let t = l.tick;
        l.bytes += v.len() as u64;
        if let Some((old, tick)) = l.map.insert(k, (v, t)) {
            l.bytes -= old.len() as u64;
            l.order.remove(&tick);
        }
        l.order.insert(t, k);
        while l.bytes > target {
            let Some((_, victim)) = l.order.pop_first() else {
                break;
            };
            if let Some((v, _)) = l.map.remove(&victim) {
                l.bytes -= v.len() as u64;
            }
        }
    }

    /// (bytes held, hits, misses)
    pub fn stats(&self) -> (u64, u64, u64) {
        let l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        (l.bytes, l.hits, l.misses)
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
            c.insert(key(i), block.clone());
        }
        assert_eq!(c.stats().0, 512 * MIB, "full to max_bytes with memory free");
        // The machine runs short: 300 MiB below the 1 GiB reserve.
        avail.store((1 << 30) - 300 * MIB, Ordering::Relaxed);
        c.insert(key(1000), block.clone());
        let held = c.stats().0;
        assert!(held <= 213 * MIB, "gave back the shortfall, holds {held}");
        assert_eq!(c.target_bytes(), held);
        // The newest blocks stayed, the coldest went.
        assert!(c.get(&key(1000)).is_some() && c.get(&key(599)).is_some());
        assert!(c.get(&key(0)).is_none());
        // Pressure cannot push it below the floor.
        avail.store(0, Ordering::Relaxed);
        for i in 0..10 {
            c.insert(key(2000 + i), block.clone());
        }
        assert_eq!(c.stats().0, FLOOR_BYTES);
        // Memory free again: the target climbs back to max_bytes.
        avail.store(6 << 30, Ordering::Relaxed);
        for i in 0..600 {
            c.insert(key(3000 + i), block.clone());
        }
        assert_eq!(c.target_bytes(), 512 * MIB);
        assert_eq!(c.stats().0, 512 * MIB);
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
            c.insert(key(i), Arc::new(vec![0u8; 1 << 20]));
        }
        assert_eq!(c.stats().0, 8 << 20);
        assert_eq!(c.target_bytes(), 8 << 20);
    }
}
