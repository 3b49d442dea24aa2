//! The daemon in a memory cgroup limited to 1 GiB, with a 4 GiB working
//! set written and read back through the mount: it sizes its cache and
//! dirty data from the cgroup's limit (`arc::SystemMemory`), so it is
//! never OOM-killed, every byte reads back as written, and `uzfs arcstat`
//! reports the sizes and the limit.

mod common;
use common::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const LIMIT: u64 = 1 << 30;
const FILE: u64 = 4 << 30;
const CHUNK: usize = 1 << 20;

/// A memory cgroup of its own, removed when dropped (after the daemon in
/// it has exited).
struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// Beside this process's own memory cgroup (v1, or v2 at the root of
    /// the hierarchy, where a child may have the controller).
    fn new(limit: u64) -> MemCgroup {
        let text = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let (path, v2) = uzfs_core::arc::cgroup_path(&text).expect("no memory cgroup line");
        let name = format!("uzfs-mem-{}", std::process::id());
        let dir = if v2 {
            let root = Path::new("/sys/fs/cgroup");
            // The memory controller must be on for the root's children.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            root.join(name)
        } else {
            Path::new("/sys/fs/cgroup/memory")
                .join(path.trim_start_matches('/'))
                .join(name)
        };
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create memory cgroup {}: {e}", dir.display()));
        let limit_file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(dir.join(limit_file), limit.to_string()).expect("set the limit");
        MemCgroup { dir, v2 }
    }

    fn enter(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .expect("move the daemon into the cgroup");
    }

    /// OOM kills in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).expect("oom counter");
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The file's contents at MiB `i`: xorshift from a per-MiB seed, so any
/// misplaced or stale MiB shows.
fn mib(i: u64) -> Vec<u8> {
    Rng(0x9e37_79b9_7f4a_7c15 ^ (i + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9)).bytes(CHUNK)
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// What the daemon may use besides the cache and dirty data (README,
/// "In a container or under a memory limit").
const ALLOWANCE_MIB: u64 = 384;

fn peak_rss_mib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb >> 10)
}

#[test]
fn a_daemon_limited_to_1_gib_serves_a_4_gib_working_set() {
    if !can_mount() {
        return;
    }
    // Made before the environment, so dropped after its daemon stopped.
    let cg = MemCgroup::new(LIMIT);
    let mut e = Env::new();
    if let Ok(v) = std::env::var("UZFS_TEST_DAEMON_ENV") {
        // By hand: "UZFS_ARC_MAX=6442450944,UZFS_DIRTY_MAX=2576980377"
        // (the sizes of a 24 GiB machine) shows the test failing.
        for kv in v.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                e.envs.push((k.to_string(), v.to_string()));
            }
        }
    }
    // The daemon starts with the first command; it joins the cgroup
    // before the pool exists, so the pool's sizes come from the limit.
    e.ok(&["zpool", "list"]);
    let pid = e.daemon_pid();
    cg.enter(pid);
    let d = e.disk("d", (FILE >> 20) + 2048);
    e.ok(&["zpool", "create", "mtank", &d]);
    let m = e.dir.path().join("mnt/mtank");
    let path = m.join("big");
    {
        let mut f = std::fs::File::create(&path).expect("create");
        for i in 0..FILE / CHUNK as u64 {
            f.write_all(&mib(i)).expect("write");
            assert!(alive(pid), "the daemon died after {i} MiB written");
        }
        f.sync_all().expect("fsync");
    }
    // Reads come from the daemon, not the kernel's cache of the mount.
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
    {
        let mut f = std::fs::File::open(&path).expect("open");
        let mut buf = vec![0u8; CHUNK];
        for i in 0..FILE / CHUNK as u64 {
            f.read_exact(&mut buf).expect("read");
            assert!(buf == mib(i), "MiB {i} reads back wrong");
        }
    }
    assert!(alive(pid), "the daemon died");
    assert_eq!(cg.oom_kills(), 0, "OOM kills in the daemon's cgroup");
    let health = e.ok(&["zpool", "get", "-H", "-o", "value", "health", "mtank"]);
    assert_eq!(health.trim(), "ONLINE");
    // `uzfs arcstat` shows the sizes the limit gave and the limit itself.
    let stat = e.ok(&[
        "arcstat",
        "-f",
        "time,pool,read,hit%,size,c,c_min,c_max,rss,limit",
        "-p",
        "mtank",
    ]);
    let row: Vec<&str> = stat
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("mtank"))
        .unwrap_or_else(|| panic!("no mtank row in arcstat:\n{stat}"))
        .split_whitespace()
        .collect();
    // time pool read hit% size c c_min c_max rss limit
    assert_eq!(row.len(), 10, "{stat}");
    assert_eq!(row[6], "32M", "c_min is not the default:\n{stat}");
    assert_eq!(
        row[7], "256M",
        "c_max is not a quarter of the limit:\n{stat}"
    );
    assert_eq!(row[9], "1G", "the limit is not shown:\n{stat}");
    assert!(
        row[2].parse::<u64>().is_ok_and(|r| r > 0),
        "no reads counted:\n{stat}"
    );
    // The bound the README states: arc_max + dirty data + a fixed
    // allowance (I/O staging, FUSE buffers, metadata, allocator slack).
    let (arc_max, dirty) = (LIMIT / 4, (LIMIT / 10).min(LIMIT / 8));
    let bound = (arc_max + dirty) / (1 << 20) + ALLOWANCE_MIB;
    let peak = peak_rss_mib(pid);
    eprintln!(
        "daemon peak RSS {peak} MiB under a {} MiB limit (bound {bound} MiB)",
        LIMIT >> 20
    );
    assert!(
        peak <= bound,
        "daemon peak RSS {peak} MiB over arc_max + dirty + {ALLOWANCE_MIB} MiB = {bound} MiB"
    );
    e.ok(&["zpool", "export", "mtank"]);
}
