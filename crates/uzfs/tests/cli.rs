//! The `uzfs` binary driven as a user would: its own run directory per test,
//! the daemon auto-started on first use and stopped at the end.

mod common;
use common::Env;
use std::path::Path;
use std::process::Command;

#[test]
fn pool_lifecycle() {
    let e = Env::new();
    let (a, b, c) = (e.disk("a", 128), e.disk("b", 128), e.disk("c", 128));
    e.ok(&[
        "zpool",
        "create",
        "-o",
        "comment=hello",
        "tank",
        "mirror",
        &a,
        &b,
    ]);
    let st = e.ok(&["zpool", "status", "tank"]);
    for want in [
        "  pool: tank",
        " state: ONLINE",
        "mirror-0",
        &a,
        &b,
        "READ WRITE CKSUM".split(' ').next().unwrap_or("READ"),
        "errors: No known data errors",
    ] {
        assert!(st.contains(want), "status lacks {want:?}:\n{st}");
    }
    let list = e.ok(&["zpool", "list", "-H", "-p", "-o", "name,size,health"]);
    let cols: Vec<&str> = list.trim().split('\t').collect();
    assert_eq!(cols[0], "tank");
    assert!(cols[1].parse::<u64>().expect("parsable size") > 100 << 20);
    assert_eq!(cols[2], "ONLINE");
    assert!(
        e.ok(&["zpool", "get", "-H", "-o", "value", "comment", "tank"])
            .trim()
            == "hello"
    );
    e.ok(&["zpool", "set", "comment=bye", "tank"]);
    e.ok(&["zpool", "add", "tank", &c]);
    assert!(e.ok(&["zpool", "status"]).contains(&c));
    let data = e.dir.path().join("data");
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, &payload).expect("write data");
    let obj = e.ok(&["object", "put", "tank", "data"]).trim().to_string();
    let hist = e.ok(&["zpool", "history", "tank"]);
    assert!(
        hist.contains("zpool create -o comment=hello tank mirror")
            && hist.contains("zpool set comment=bye tank"),
        "{hist}"
    );
    assert!(e
        .ok(&["zpool", "get", "feature@lz4_compress", "tank"])
        .contains("active"));
    assert!(e.ok(&["zdb", "-b", "tank"]).contains("No errors"));
    e.ok(&["zpool", "export", "tank"]);
    assert!(e.ok(&["zpool", "list"]).contains("no pools available"));
    e.fails(&["zpool", "labelclear", &a], 1, "exported pool");

    // Move the devices; import by scanning the new directory, by guid.
    let moved = e.dir.path().join("moved");
    std::fs::create_dir(&moved).expect("mkdir");
    for n in ["a", "b", "c"] {
        std::fs::rename(e.dir.path().join(n), moved.join(n)).expect("move");
    }
    let listing = e.ok(&["zpool", "import", "-d", "moved"]);
    assert!(
        listing.contains("pool: tank") && listing.contains("mirror-0"),
        "{listing}"
    );
    let guid = listing
        .lines()
        .find_map(|l| l.trim().strip_prefix("id: "))
        .expect("id line")
        .to_string();
    e.ok(&["zpool", "import", "-d", "moved", &guid]);
    assert!(e
        .ok(&["zpool", "status", "tank"])
        .contains(&moved.join("a").display().to_string()));
    e.ok(&["object", "get", "tank", &obj, "back"]);
    assert!(std::fs::read(e.dir.path().join("back")).expect("read back") == payload);

    // The daemon re-imports its pools when it starts again.
    e.ok(&["daemon", "--stop"]);
    assert!(e
        .ok(&["zpool", "list", "-H", "-o", "name"])
        .contains("tank"));
    e.ok(&["zpool", "destroy", "tank"]);
    e.fails(
        &["zpool", "import", "-d", "moved", "tank"],
        1,
        "no such pool",
    );
    e.ok(&[
        "zpool",
        "create",
        "again",
        &moved.join("a").display().to_string(),
    ]);
}

#[test]
fn bad_command_lines_get_clear_errors() {
    let e = Env::new();
    let a = e.disk("a", 128);
    e.fails(&["zpool", "frobnicate"], 2, "unrecognized command");
    e.fails(&["zpool", "create", "tank"], 1, "missing vdev");
    e.fails(
        &["zpool", "create", "tank", "nonexistent"],
        1,
        "cannot open 'nonexistent'",
    );
    e.fails(
        &["zpool", "create", "tank", "mirror", &a],
        1,
        "mirror requires at least 2",
    );
    e.fails(
        &["zpool", "create", "tank", "raidz", &a],
        1,
        "raidz requires at least 2 devices",
    );
    e.fails(
        &["zpool", "create", "-o", "ashift=99", "tank", &a],
        1,
        "ashift",
    );
    e.fails(
        &["zpool", "create", "-o", "bogus=1", "tank", &a],
        1,
        "not a valid pool property",
    );
    e.fails(&["zpool", "create", "-Z", "tank", &a], 2, "invalid option");
    e.fails(
        &["zpool", "create", "1tank", &a],
        1,
        "must begin with a letter",
    );
    let tiny = e.disk("tiny", 16);
    e.fails(&["zpool", "create", "tank", &tiny], 1, "too small");
    e.ok(&["zpool", "create", "tank", &a]);
    let b = e.disk("b", 128);
    e.fails(&["zpool", "create", "tank", &b], 1, "pool already exists");
    e.fails(
        &["zpool", "create", "other", &a],
        1,
        "is part of active pool 'tank'",
    );
    e.fails(&["zpool", "status", "nope"], 1, "no such pool");
    e.fails(&["zpool", "get", "bogus", "tank"], 1, "invalid property");
    e.fails(&["zpool", "set", "size=1", "tank"], 1, "readonly");
    e.fails(
        &["zpool", "import", "-d", "/nonexistent"],
        1,
        "cannot search",
    );
    e.fails(
        &["zpool", "labelclear", &a],
        1,
        "member of the imported pool",
    );
    e.fails(&["zdb", "-Q"], 2, "invalid option");
    e.fails(&["zfs", "create", "tank/x/y"], 1, "does not exist (use -p");
    e.fails(&["zfs", "create", "nopool/x"], 1, "no such pool");
    e.fails(
        &["zfs", "create", "-o", "recordsize=3K", "tank/x"],
        1,
        "power of 2",
    );
    e.fails(
        &["zfs", "create", "-o", "bogus=1", "tank/x"],
        1,
        "invalid property",
    );
    e.fails(
        &["zfs", "create", "tank/bad@name"],
        1,
        "invalid dataset name",
    );
    e.fails(&["zfs", "set", "used=5", "tank"], 1, "read-only");
    e.fails(&["zfs", "get", "nosuch", "tank"], 2, "invalid property");
    e.fails(&["zfs", "destroy", "tank"], 1, "root dataset");
    e.fails(&["zfs", "frobnicate"], 2, "unrecognized command");
    e.fails(&["zfs", "rollback", "tank@a"], 1, "does not exist");
    e.fails(&["zfs", "send", "tank@a"], 2, "not implemented yet");
    e.fails(
        &["zfs", "snapshot", "tank@a", "nope@b"],
        1,
        "dataset does not exist",
    );
    e.fails(
        &["zfs", "snapshot", "-o", "atime=off", "tank@a"],
        1,
        "cannot be set on a snapshot",
    );
    // Garbage where a device should be: no pool, and a clear message.
    let g = e.dir.path().join("g");
    std::fs::create_dir(&g).expect("mkdir");
    std::fs::write(g.join("junk"), vec![0x5a; 70 << 20]).expect("junk");
    e.fails(&["zpool", "import", "-d", "g"], 1, "no pools available");
}

#[test]
fn multicall_links_and_upgrade() {
    let e = Env::new();
    let bin = e.dir.path().join("bin");
    e.ok(&["link", bin.to_str().expect("utf8")]);
    let zpool = |args: &[&str]| {
        Command::new(bin.join("zpool"))
            .args(args)
            .env("UZFS_RUNDIR", &e.rundir)
            .output()
            .expect("zpool link")
    };
    let o = zpool(&["upgrade", "-v"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("lz4_compress") && out.contains("block_remap"),
        "{out}"
    );
    let a = e.disk("a", 128);
    assert!(zpool(&["create", "viaLink", &a]).status.success());
    // A pool made by this build lacks nothing: listed as such, and an
    // upgrade of it or of all says so (a pool made before a feature gets
    // it enabled: `dsl/records.rs`, every_layout_reads_and_converts).
    let text = |o: std::process::Output| {
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = text(zpool(&["upgrade"]));
    assert!(out.contains("Every feature flags pool has all"), "{out}");
    for args in [&["upgrade", "viaLink"][..], &["upgrade", "-a"][..]] {
        let out = text(zpool(args));
        assert!(
            out.contains("Pool 'viaLink' already has all supported"),
            "{out}"
        );
    }
    let o = zpool(&["upgrade", "-a", "viaLink"]);
    assert!(!o.status.success());
    let o = zpool(&["upgrade", "nosuch"]);
    assert!(!o.status.success());
    let zdb = Command::new(bin.join("zdb"))
        .args(["-l", &a])
        .output()
        .expect("zdb");
    assert!(String::from_utf8_lossy(&zdb.stdout).contains("viaLink"));
    let zdb = Command::new(bin.join("zdb"))
        .args(["-u", "viaLink"])
        .env("UZFS_RUNDIR", &e.rundir)
        .output()
        .expect("zdb");
    assert!(String::from_utf8_lossy(&zdb.stdout).contains("Uberblock:"));
}

#[test]
fn socket_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let e = Env::new();
    e.ok(&["daemon"]);
    let sock = Path::new(&e.rundir).join("uzfsd.sock");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let dmode = std::fs::metadata(&e.rundir)
        .expect("rundir")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dmode, 0o700);
}

#[test]
fn degraded_mirror_status() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 128), e.disk("b", 128));
    e.ok(&["zpool", "create", "tank", "mirror", &a, &b]);
    e.ok(&["zpool", "export", "tank"]);
    std::fs::remove_file(&b).expect("remove one side");
    let listing = e.ok(&["zpool", "import", "-d", "."]);
    assert!(
        listing.contains("DEGRADED") && listing.contains("UNAVAIL"),
        "{listing}"
    );
    e.ok(&["zpool", "import", "-d", ".", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(
        st.contains(" state: DEGRADED")
            && st.contains("UNAVAIL")
            && st.contains("could not be opened"),
        "{st}"
    );
    assert!(e.ok(&["zpool", "status", "-x"]).contains("pool: tank"));
    assert!(e
        .ok(&["zpool", "list", "-H", "-o", "health"])
        .contains("DEGRADED"));
}

#[test]
fn zdb_on_a_busy_pool_is_clean() {
    let e = Env::new();
    let a = e.disk("a", 256);
    e.ok(&["zpool", "create", "busy", &a]);
    std::fs::write(e.dir.path().join("blob"), vec![0x42u8; 2 << 20]).expect("blob");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let (dir, rundir) = (e.dir.path().to_path_buf(), e.rundir.clone());
        std::thread::spawn(move || {
            let uzfs = |args: &[&str]| {
                Command::new(env!("CARGO_BIN_EXE_uzfs"))
                    .args(args)
                    .env("UZFS_RUNDIR", &rundir)
                    .current_dir(&dir)
                    .output()
                    .expect("run uzfs")
            };
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Write and free objects, so blocks are freed and reused.
                let o = uzfs(&["object", "put", "busy", "blob"]);
                let obj = String::from_utf8_lossy(&o.stdout).trim().to_string();
                if n % 2 == 1 && !obj.is_empty() {
                    uzfs(&["object", "free", "busy", &obj]);
                }
                n += 1;
            }
            n
        })
    };
    for _ in 0..6 {
        let out = e.ok(&["zdb", "-b", "busy"]);
        assert!(out.contains("No errors"), "{out}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.join().expect("writer") > 0);
}

#[test]
fn closed_stdout_is_not_a_panic() {
    let e = Env::new();
    // `uzfs zpool help | true`: stdout closed before anything is written.
    let mut child = Command::new(env!("CARGO_BIN_EXE_uzfs"))
        .args(["zpool", "help"])
        .env("UZFS_RUNDIR", &e.rundir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn cache_keeps_a_pool_whose_devices_are_away() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 128), e.disk("b", 128));
    e.ok(&["zpool", "create", "here", &a]);
    e.ok(&["zpool", "create", "away", &b]);
    e.ok(&["daemon", "--stop"]);
    let parked = e.dir.path().join("b.parked");
    std::fs::rename(&b, &parked).expect("park");
    // The daemon starts, re-imports 'here', cannot find 'away'.
    let names = e.ok(&["zpool", "list", "-H", "-o", "name"]);
    assert!(names.contains("here") && !names.contains("away"), "{names}");
    e.ok(&["daemon", "--stop"]);
    std::fs::rename(&parked, &b).expect("unpark");
    let names = e.ok(&["zpool", "list", "-H", "-o", "name"]);
    assert!(
        names.contains("away"),
        "'away' fell out of the pool cache: {names}"
    );
}

/// Admin commands read a published snapshot of the pool's config and
/// properties: they answer at once while a sync waits on a device that
/// takes 30 s per I/O (they would hang for minutes if they waited for it).
/// The bound here is generous; it separates "answers" from "waits for the
/// sync", it is not a performance target.
#[test]
fn admin_commands_answer_during_a_hung_sync() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 128), e.disk("b", 128));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    let data = e.dir.path().join("data");
    std::fs::write(&data, vec![7u8; 3 << 20]).expect("data");
    e.ok(&["zinject", "-d", &a, "-D", "30000", "tank"]);
    // Dirty data, and a command waiting for its sync (which hangs on `a`).
    let mut sync = Command::new(env!("CARGO_BIN_EXE_uzfs"))
        .args(["object", "put", "tank", "data"])
        .env("UZFS_RUNDIR", &e.rundir)
        .current_dir(e.dir.path())
        .spawn()
        .expect("object put");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    for args in [
        &["zpool", "status", "tank"][..],
        &["zpool", "list"],
        &["zpool", "get", "all", "tank"],
        &["zfs", "list"],
        &["zfs", "get", "all", "tank"],
        &["zpool", "iostat", "tank"],
    ] {
        let t = std::time::Instant::now();
        e.ok(args);
        let took = t.elapsed();
        assert!(
            took < std::time::Duration::from_secs(3),
            "{args:?} took {took:?} while a sync hung on a device"
        );
    }
    assert!(
        sync.try_wait().expect("wait").is_none(),
        "the sync did not hang"
    );
    e.ok(&["zinject", "-c", "all", "tank"]);
    assert!(sync.wait().expect("sync").success());
    e.ok(&["zpool", "export", "tank"]);
}

/// A daemon killed with `kill -9` holds the run directory's lock until
/// the kernel has finished its I/O, which on a loaded machine can take
/// longer than a new daemon waits for the lock (10 s). The next command
/// starts daemons until one gets the lock: it answers, late, not "did not
/// answer". The test holds the lock itself for 12 s after a kill.
#[test]
fn a_killed_daemon_that_holds_its_lock_long() {
    let e = Env::new();
    e.ok(&["zpool", "list"]);
    let pid = e.daemon_pid();
    e.kill_daemon();
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(e.rundir.join("uzfsd.lock"))
        .expect("lock file");
    lock.lock().expect("lock");
    let held = std::time::Duration::from_secs(12);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(held);
        drop(lock);
    });
    let t = std::time::Instant::now();
    let o = e.run(&["zpool", "list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() >= held, "answered while the lock was held");
    releaser.join().expect("releaser");
    assert_eq!(daemons_of(&e.rundir), 1);
    e.ok(&["daemon", "--stop"]);
}

fn daemons_of(rundir: &Path) -> usize {
    let want = format!("--rundir\0{}\0daemon", rundir.display());
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&want))
        })
        .count()
}

/// One owner per pool: concurrent auto-starts make one daemon; a second
/// daemon (another run directory) cannot import a pool the first holds and
/// is told who holds it; `zpool create -f` cannot take a live pool's disk;
/// after `kill -9` the next command restarts the daemon, which re-imports.
#[test]
fn one_daemon_and_one_owner_per_pool() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 128), e.disk("b", 128));
    // Eight commands at once against a run directory with no daemon.
    let kids: Vec<_> = (0..8)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_uzfs"))
                .args(["zpool", "list"])
                .env("UZFS_RUNDIR", &e.rundir)
                .output_async()
        })
        .collect();
    for k in kids {
        let o = k.wait_with_output().expect("zpool list");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // A daemon that lost the race for the run directory's lock exits on
    // its own; on a loaded machine it may not have got that far yet.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while daemons_of(&e.rundir) > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        daemons_of(&e.rundir),
        1,
        "concurrent auto-starts made several daemons"
    );
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);

    // Another daemon, another run directory, the same devices.
    let e2 = Env::new();
    let dir = e.dir.path().display().to_string();
    let o = e2.run(&["zpool", "import", "-d", &dir, "tank"]);
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a second daemon imported a live pool");
    assert!(msg.contains("in use by process"), "{msg}");
    // And the same daemon will not build a new pool on a live pool's disk.
    e.fails(&["zpool", "create", "-f", "other", &a], 1, "in use");
    assert!(e.ok(&["zpool", "status", "tank"]).contains("ONLINE"));

    // A crash of the daemon: the next command restarts it and the pool
    // comes back from the cache.
    e.kill_daemon();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("state: ONLINE"), "{st}");
    assert_eq!(daemons_of(&e.rundir), 1);
    e.ok(&["zpool", "export", "tank"]);
    // Exported: now the other daemon may have it.
    e2.ok(&["zpool", "import", "-d", &dir, "tank"]);
    e2.ok(&["zpool", "export", "tank"]);
}

trait SpawnOut {
    fn output_async(&mut self) -> std::process::Child;
}
impl SpawnOut for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    }
}

/// `multihost` (spa/mmp.rs) and pools left imported by another host. Two
/// hosts are two daemons with different `UZFS_HOSTID`s, one after the
/// other on the same files (at once, the device locks would stop the
/// second before the labels are even read; across machines only the
/// labels can).
#[test]
fn multihost_and_pools_in_use_by_another_host() {
    let mut e = Env::new();
    let as_host = |e: &mut Env, id: &str| {
        e.envs = vec![
            ("UZFS_HOSTID".into(), id.into()),
            ("UZFS_MMP_INTERVAL_MS".into(), "100".into()),
        ];
    };
    as_host(&mut e, "0");
    let a = e.disk("a", 128);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    let get = |e: &Env| {
        e.ok(&[
            "zpool",
            "get",
            "-H",
            "-o",
            "value,source",
            "multihost",
            "tank",
        ])
    };
    assert_eq!(get(&e), "off\tdefault\n");
    e.fails(
        &["zpool", "set", "multihost=on", "tank"],
        1,
        "non-zero system hostid",
    );
    e.fails(
        &["zpool", "set", "multihost=maybe", "tank"],
        1,
        "invalid value",
    );
    e.ok(&["daemon", "--stop"]);

    // Host 1234 takes over the cached pool and turns multihost on.
    as_host(&mut e, "1234");
    e.ok(&["zpool", "set", "multihost=on", "tank"]);
    assert_eq!(get(&e), "on\tlocal\n");
    // It dies; its cache is not this host's.
    e.kill_daemon();
    std::fs::remove_file(e.rundir.join("zpool.cache")).expect("cache");

    // Host 5678: the labels say host 1234 has the pool.
    as_host(&mut e, "5678");
    let o = e.run(&["zpool", "import", "-d", ".", "tank"]);
    let msg = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{msg}");
    assert!(
        msg.contains("previously in use from another system") && msg.contains("hostid=00001234"),
        "{msg}"
    );
    // Forced: the multihost check watches the pool, nothing moves (1234
    // is dead), it is imported.
    e.ok(&["zpool", "import", "-f", "-d", ".", "tank"]);
    let log = std::fs::read_to_string(e.rundir.join("uzfsd.log")).unwrap_or_default();
    assert!(
        log.contains("last written by hostid 00001234 with multihost=on: watching it"),
        "{log}"
    );
    assert_eq!(get(&e), "on\tlocal\n");
    e.ok(&["zpool", "export", "tank"]);
    let z = e.ok(&["zdb", "-e", "-p", ".", "-b", "tank"]);
    assert!(z.contains("No errors"), "{z}");
}
