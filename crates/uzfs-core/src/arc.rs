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
/// The cache never shrinks below this for memory pressure (`arc_min`,
/// unless set otherwise).
pub const FLOOR_BYTES: u64 = 32 << 20;

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

/// A memory cgroup: the process's own, v2 (`memory.max`, `memory.high`,
/// `memory.current`) or v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`).
pub struct Cgroup {
    dir: std::path::PathBuf,
    v2: bool,
}

/// Limits at or above this mean "none" (v1 writes 2^63 rounded down to a
/// page).
const NO_LIMIT: u64 = 1 << 60;

/// The memory cgroup path in `/proc/self/cgroup`'s text: the v1 line that
/// names the memory controller (hybrid hosts mount both), else the v2
/// line (`0::/path`), with whether it is v2.
pub fn cgroup_path(proc_self_cgroup: &str) -> Option<(String, bool)> {
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctl.split(',').any(|c| c == "memory") {
            return Some((path.to_string(), false));
        }
        if id == "0" && ctl.is_empty() {
            v2 = Some((path.to_string(), true));
        }
    }
    v2
}

/// A number from a cgroup file: `max` (v2's "no limit") and absurdly large
/// values are `None`.
pub fn cgroup_value(text: &str) -> Option<u64> {
    let v = text.trim().parse::<u64>().ok()?;
    (v < NO_LIMIT).then_some(v)
}

/// Field `key` of a `memory.stat` text.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Cgroup {
    /// This process's memory cgroup, if the host exposes one under
    /// `/sys/fs/cgroup`.
    pub fn of_self() -> Option<Cgroup> {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let (path, v2) = cgroup_path(&text)?;
        let root = if v2 {
            std::path::PathBuf::from("/sys/fs/cgroup")
        } else {
            std::path::PathBuf::from("/sys/fs/cgroup/memory")
        };
        let dir = root.join(path.trim_start_matches('/'));
        let probe = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        // The root cgroup of v2 has no memory.max; nothing to bound then.
        dir.join(probe).exists().then_some(Cgroup { dir, v2 })
    }

    fn read(&self, dir: &std::path::Path, file: &str) -> Option<String> {
        std::fs::read_to_string(dir.join(file)).ok()
    }

    /// The tightest limit on this cgroup and its ancestors, if any.
    pub fn limit(&self) -> Option<u64> {
        if !self.v2 {
            let stat = self.read(&self.dir, "memory.stat");
            let hier = stat.and_then(|s| stat_field(&s, "hierarchical_memory_limit"));
            let own = self
                .read(&self.dir, "memory.limit_in_bytes")
                .and_then(|t| cgroup_value(&t));
            return [hier.filter(|v| *v < NO_LIMIT), own]
                .into_iter()
                .flatten()
                .min();
        }
        let mut best: Option<u64> = None;
        let mut dir = Some(self.dir.as_path());
        while let Some(d) = dir.filter(|d| d.starts_with("/sys/fs/cgroup")) {
            for f in ["memory.max", "memory.high"] {
                if let Some(v) = self.read(d, f).and_then(|t| cgroup_value(&t)) {
                    best = Some(best.map_or(v, |b| b.min(v)));
                }
            }
            dir = d.parent();
        }
        best
    }

    /// What the cgroup uses that it cannot give back at once: its usage
    /// less the page cache it could drop (inactive files), as the
    /// kubelet counts a working set.
    pub fn working_set(&self) -> Option<u64> {
        let (usage, inactive) = if self.v2 {
            ("memory.current", "inactive_file")
        } else {
            ("memory.usage_in_bytes", "total_inactive_file")
        };
        let used = self.read(&self.dir, usage)?.trim().parse::<u64>().ok()?;
        let idle = self
            .read(&self.dir, "memory.stat")
            .and_then(|s| stat_field(&s, inactive))
            .unwrap_or(0);
        Some(used.saturating_sub(idle))
    }
}

/// The memory this process may use: the machine's (`/proc/meminfo`) or,
/// under a memory cgroup with a limit, the cgroup's, whichever is
/// tighter. Sizes the cache and dirty data by default and feeds the
/// cache's pressure check, so a daemon in a container with a memory
/// limit stays inside it instead of being killed.
pub struct SystemMemory {
    cg: Option<Cgroup>,
}

impl SystemMemory {
    pub fn detect() -> SystemMemory {
        SystemMemory {
            cg: Cgroup::of_self(),
        }
    }

    /// The cgroup's limit, if one binds.
    pub fn cgroup_limit(&self) -> Option<u64> {
        self.cg.as_ref().and_then(Cgroup::limit)
    }
}

impl MemoryProbe for SystemMemory {
    fn total(&self) -> u64 {
        let ram = ProcMeminfo.total();
        self.cgroup_limit().map_or(ram, |l| l.min(ram))
    }
    fn available(&self) -> Option<u64> {
        let sys = ProcMeminfo.available();
        let cg = self
            .cg
            .as_ref()
            .and_then(|c| Some(c.limit()?.saturating_sub(c.working_set()?)));
        match (sys, cg) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
    /// Memory pressure never takes it below this (`arc_min`).
    min_bytes: u64,
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
        Self::with_probe(max_bytes, Box::new(SystemMemory::detect()), PRESSURE_CHECK)
    }

    /// A cache that asks `probe` about memory at most every `check_every`.
    pub fn with_probe(max_bytes: u64, probe: Box<dyn MemoryProbe>, check_every: Duration) -> Self {
        BlockCache {
            max_bytes,
            min_bytes: FLOOR_BYTES.min(max_bytes),
            target: AtomicU64::new(max_bytes),
            reserve: (probe.total() / 8).max(256 << 20),
            probe,
            check_every,
            last_check: Mutex::new(None),
            lru: Mutex::new(Lru::default()),
        }
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
        let floor = self.min_bytes;
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

    /// The most the cache may hold (`arc_max`).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
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
            c.insert(key(i), block.clone());
        }
        avail.store(0, Ordering::Relaxed);
        for i in 0..10 {
            c.insert(key(1000 + i), block.clone());
        }
        assert_eq!(c.stats().0, 100 * MIB);
        assert_eq!(c.target_bytes(), 100 * MIB);
        let small = BlockCache::with_probe(8 * MIB, Box::new(Fake(avail)), Duration::ZERO)
            .with_min(100 * MIB);
        assert_eq!(small.min_bytes(), 8 * MIB);
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

    /// Which cgroup holds the memory controller, v1 beside v2 (hybrid
    /// hosts) or v2 alone, and what counts as a limit.
    #[test]
    fn cgroup_paths_and_limits_parse() {
        let hybrid = "9:name=systemd:/\n4:memory:/jobs/a1\n1:cpu:/\n0::/\n";
        assert_eq!(cgroup_path(hybrid), Some(("/jobs/a1".to_string(), false)));
        let v2 = "0::/system.slice/uzfs.service\n";
        assert_eq!(
            cgroup_path(v2),
            Some(("/system.slice/uzfs.service".to_string(), true))
        );
        let merged = "5:cpu,memory,pids:/box\n";
        assert_eq!(cgroup_path(merged), Some(("/box".to_string(), false)));
        assert_eq!(cgroup_path("garbage\n\n7:cpu:/x\n"), None);
        assert_eq!(cgroup_value("1073741824\n"), Some(1 << 30));
        assert_eq!(cgroup_value("max\n"), None);
        assert_eq!(cgroup_value("9223372036854771712"), None);
        assert_eq!(cgroup_value(""), None);
        let stat = "cache 10\ntotal_inactive_file 4096\nhierarchical_memory_limit 1073741824\n";
        assert_eq!(stat_field(stat, "total_inactive_file"), Some(4096));
        assert_eq!(stat_field(stat, "inactive_file"), None);
    }
}
