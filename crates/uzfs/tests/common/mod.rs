#![allow(dead_code)]
//! The `uzfs` binary driven as a user would: its own run directory per test,
//! the daemon auto-started on first use and stopped at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Env {
    pub dir: tempfile::TempDir,
    pub rundir: PathBuf,
    /// More environment for the commands (and so for the daemon they start).
    pub envs: Vec<(String, String)>,
}

impl Env {
    pub fn new() -> Env {
        // Fixed-length paths (/tmp/uzgXXXXXX), so golden outputs align.
        let dir = tempfile::Builder::new()
            .prefix("uzg")
            .rand_bytes(6)
            .tempdir_in("/tmp")
            .expect("tempdir");
        let rundir = dir.path().join("run");
        Env {
            dir,
            rundir,
            envs: Vec::new(),
        }
    }
    pub fn disk(&self, name: &str, mb: u64) -> String {
        let p = self.dir.path().join(name);
        let f = std::fs::File::create(&p).expect("create");
        f.set_len(mb << 20).expect("size");
        p.display().to_string()
    }
    /// `uzfs ARGS` in this environment, not started yet (for a command
    /// that runs while the test does something else).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_uzfs"));
        c.args(args)
            .env("UZFS_RUNDIR", &self.rundir)
            .env("UZFS_TXG_TIMEOUT", "1")
            .env("UZFS_ALTROOT", self.dir.path().join("mnt"))
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path());
        c
    }
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run uzfs")
    }
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "uzfs {args:?} failed ({:?}):\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    }
    /// This environment's daemon's pid.
    pub fn daemon_pid(&self) -> i32 {
        std::fs::read_to_string(self.rundir.join("uzfsd.pid"))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid")
    }
    /// `kill -9` of this environment's daemon (a crash).
    pub fn kill_daemon(&self) {
        let pid = self.daemon_pid();
        // SAFETY: kill(2) with a pid read from the daemon's pid file.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    }
    /// A pool "tank" on one 256 MiB file, mounted: returns its mount point.
    pub fn tank(&self) -> PathBuf {
        let a = self.disk("a", 256);
        self.ok(&["zpool", "create", "tank", &a]);
        self.dir.path().join("mnt/tank")
    }
    /// A pool "small" on one 160 MiB file (ashift 12), mounted: returns
    /// its mount point. For the tests that fill a pool.
    pub fn small_pool(&self) -> PathBuf {
        let a = self.disk("small", 160);
        self.ok(&["zpool", "create", "-o", "ashift=12", "small", &a]);
        self.dir.path().join("mnt/small")
    }
    /// Export `pool` and check it with `zdb -b` (checksums of every copy,
    /// space, and the namespace of every filesystem): no errors.
    pub fn export_and_zdb(&self, pool: &str) {
        self.ok(&["zpool", "export", pool]);
        let z = self.ok(&["zdb", "-e", "-p", ".", "-b", pool]);
        assert!(z.contains("No errors"), "zdb after the test:\n{z}");
    }
    /// `zpool export` then `zpool import -d` of the test's directory.
    pub fn reimport(&self, pool: &str) {
        self.ok(&["zpool", "export", pool]);
        let dir = self.dir.path().to_str().expect("path");
        self.ok(&["zpool", "import", "-d", dir, pool]);
    }
    pub fn fails(&self, args: &[&str], code: i32, needle: &str) {
        let o = self.run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "uzfs {args:?}: {err}");
        assert!(
            err.contains(needle),
            "uzfs {args:?}: stderr lacks {needle:?}:\n{err}"
        );
    }
}

/// Store `data` as an object of `pool` (`uzfs object put`), kept in the
/// file `blob{seed}` for [`get_matches`]; returns the object number.
pub fn put_bytes(e: &Env, pool: &str, seed: u8, data: &[u8]) -> String {
    let p = e.dir.path().join(format!("blob{seed}"));
    std::fs::write(&p, data).expect("write blob");
    let obj = e.ok(&["object", "put", pool, &p.display().to_string()]);
    obj.trim().to_string()
}

/// `mb` MiB of a patterned (compressible) blob as an object of `pool`.
pub fn put(e: &Env, pool: &str, mb: usize, seed: u8) -> String {
    let data: Vec<u8> = (0..mb << 20)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed as u32) as u8
                ^ (i >> 13) as u8
        })
        .collect();
    put_bytes(e, pool, seed, &data)
}

/// `len` incompressible bytes (xorshift64), for data that must take its
/// space on disk whatever the compression.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Object `obj` of `pool` reads back as the blob `put` stored.
pub fn get_matches(e: &Env, pool: &str, obj: &str, seed: u8) {
    let out = e.dir.path().join(format!("back{seed}"));
    e.ok(&["object", "get", pool, obj, &out.display().to_string()]);
    let a = std::fs::read(e.dir.path().join(format!("blob{seed}"))).expect("blob");
    let b = std::fs::read(&out).expect("back");
    assert!(a == b, "object {obj} of {pool} differs");
}

/// Whether this process can mount (root and /dev/fuse). Elsewhere a mount
/// test says it is skipped and why, unless `UZFS_REQUIRE_FUSE=1` (set by
/// scripts/test.sh, so by CI), which turns that into a failure.
pub fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        // scripts/test.sh (and so CI) sets UZFS_REQUIRE_FUSE=1: there a
        // missing mount capability is a failure, never a silent pass.
        assert!(
            std::env::var("UZFS_REQUIRE_FUSE").map_or(true, |v| v != "1"),
            "UZFS_REQUIRE_FUSE=1 but this test cannot mount (needs root and /dev/fuse)"
        );
        eprintln!("skipped: needs root and /dev/fuse");
        return false;
    }
    true
}

/// Write `data` to `path` through the mount and fsync it: any error the
/// write or its commit meets (ENOSPC, EDQUOT, EIO).
pub fn write_synced(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, data)?;
    std::fs::File::open(path)?.sync_all()
}

/// xorshift64: the mount tests' seeded randomness (a failure names its
/// seed).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.run(&["daemon", "--stop"]);
    }
}

/// One figure of the daemon's `arcstats` file.
pub fn arcstat(e: &Env, name: &str) -> u64 {
    let text = std::fs::read_to_string(e.rundir.join("arcstats")).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(name)).then(|| f.nth(1).and_then(|v| v.parse().ok()))?
        })
        .unwrap_or(0)
}

/// Wait (up to 20 s) until `ok` holds of the arcstats file, which the
/// daemon rewrites every second.
pub fn wait_for(e: &Env, what: &str, ok: impl Fn(&Env) -> bool) {
    let t = std::time::Instant::now();
    while !ok(e) {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{what}: arcstats\n{}",
            std::fs::read_to_string(e.rundir.join("arcstats")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Drop the kernel's pages of `path` (clean ones: after a sync).
pub fn drop_pages(path: &Path) {
    let f = std::fs::File::open(path).expect("open");
    // SAFETY: posix_fadvise on an open descriptor, whole file.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0, "posix_fadvise");
}
