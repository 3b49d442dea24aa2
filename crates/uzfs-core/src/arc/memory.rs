//! How much memory the daemon may use and how much is free: the machine's
//! (`/proc/meminfo`) and, under a memory cgroup, the cgroup's limit and
//! working set. The cache sizes itself from these and polls them for
//! pressure (`arc/mod.rs`).

/// Where the cache learns how much memory the machine has and has free.
pub trait MemoryProbe: Send + Sync {
    /// Bytes of RAM.
    fn total(&self) -> u64;
    /// Bytes the kernel could hand out without swapping (MemAvailable), or
    /// `None` when unknown (the cache then keeps its size).
    fn available(&self) -> Option<u64>;
    /// The share of the last ten seconds (percent) in which some task
    /// stalled waiting for memory (PSI `some avg10`), or `None` when the
    /// kernel does not report it.
    fn stall_pct(&self) -> Option<f64> {
        None
    }
}

/// `some avg10` of a PSI file's text (`/proc/pressure/memory`, a cgroup's
/// `memory.pressure`).
pub fn psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
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
    /// The cgroup's own pressure (v2 `memory.pressure`) when the daemon
    /// runs in one, else the machine's (`/proc/pressure/memory`).
    fn stall_pct(&self) -> Option<f64> {
        let cg = self
            .cg
            .as_ref()
            .filter(|c| c.v2)
            .and_then(|c| c.read(&c.dir, "memory.pressure"));
        cg.or_else(|| std::fs::read_to_string("/proc/pressure/memory").ok())
            .and_then(|t| psi_some_avg10(&t))
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let psi = "some avg10=12.50 avg60=3.00 avg300=0.10 total=123\nfull avg10=1.00 avg60=0 avg300=0 total=9\n";
        assert_eq!(psi_some_avg10(psi), Some(12.5));
        assert_eq!(psi_some_avg10("full avg10=1.00\n"), None);
        assert_eq!(psi_some_avg10("some avg10=nan\n"), None);
        assert_eq!(psi_some_avg10(""), None);
    }
}
