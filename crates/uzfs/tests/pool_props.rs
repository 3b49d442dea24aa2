//! Pool properties that change what a pool does with its devices (issue
//! #13 point 5): `autoexpand` and `zpool online -e` (growing a pool whose
//! devices grew, `EXPANDSZ`), `autoreplace`, `failmode`, `cachefile`
//! (`zpool import -c`) and `listsnapshots`, as zpoolprops(7).

mod common;
use common::*;

/// `zpool list -Hp -o NAME,...`: the pool row's fields.
fn list(e: &Env, pool: &str, cols: &str) -> Vec<String> {
    e.ok(&["zpool", "list", "-Hp", "-o", cols, pool])
        .trim()
        .split('\t')
        .map(String::from)
        .collect()
}

fn grow(path: &str, mb: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    f.set_len(mb << 20).expect("grow");
}

fn zdb_clean(e: &Env, pool: &str) {
    e.export_and_zdb(pool);
    e.ok(&["zpool", "import", "-d", ".", pool]);
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The test: a mirror of two 512 MiB files, the files grown to 1
/// GiB: `EXPANDSZ` shows what waits, `zpool online -e` grows the pool
/// (new metaslabs after the old ones), the data is intact, zdb is clean,
/// and the new size survives export and import; new data lands in the
/// new space.
#[test]
fn online_e_grows_a_mirror_whose_files_grew() {
    let e = Env::new();
    let a = e.disk("a", 512);
    let b = e.disk("b", 512);
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    let obj = put(&e, "tank", 40, 1);
    let before: u64 = list(&e, "tank", "size")[0].parse().expect("size");
    assert_eq!(list(&e, "tank", "expandsize")[0], "-");
    grow(&a, 1024);
    // One side grown: a mirror is as big as its smallest side.
    assert_eq!(list(&e, "tank", "expandsize")[0], "-");
    grow(&b, 1024);
    let waiting: u64 = list(&e, "tank", "expandsize")[0].parse().expect("expandsz");
    assert_eq!(waiting, 512 << 20, "EXPANDSZ");
    let v = e.ok(&["zpool", "list", "-v", "tank"]);
    assert!(
        v.lines()
            .any(|l| l.trim_start().starts_with("mirror-0") && l.contains("512M")),
        "zpool list -v shows the vdev's EXPANDSZ:\n{v}"
    );
    // Not grown by itself (autoexpand is off).
    assert_eq!(
        list(&e, "tank", "size")[0].parse::<u64>().ok(),
        Some(before)
    );
    e.ok(&["zpool", "online", "-e", "tank", &a]);
    let after: u64 = list(&e, "tank", "size")[0].parse().expect("size");
    assert_eq!(after, before + (512 << 20), "size after online -e");
    assert_eq!(list(&e, "tank", "expandsize")[0], "-");
    get_matches(&e, "tank", &obj, 1);
    // Fill past the old size: the new metaslabs take data.
    // Incompressible, or compression would keep it in the old space.
    let more = put_bytes(&e, "tank", 2, &noise(2, 500 << 20));
    e.ok(&["zpool", "sync", "tank"]);
    zdb_clean(&e, "tank");
    assert_eq!(list(&e, "tank", "size")[0].parse::<u64>().ok(), Some(after));
    get_matches(&e, "tank", &obj, 1);
    get_matches(&e, "tank", &more, 2);
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("with 0 errors"), "{st}");
    e.ok(&["zpool", "export", "tank"]);
}

/// `autoexpand=on` and bigger disks replaced in, one side at a time: the
/// pool grows by itself once the second replace has finished.
#[test]
fn autoexpand_grows_a_mirror_after_bigger_disks_are_replaced_in() {
    let e = Env::new();
    let a = e.disk("a", 512);
    let b = e.disk("b", 512);
    let c = e.disk("c", 1024);
    let d = e.disk("d", 1024);
    e.ok(&[
        "zpool",
        "create",
        "-m",
        "none",
        "-o",
        "autoexpand=on",
        "tank",
        "mirror",
        &a,
        &b,
    ]);
    assert_eq!(
        e.ok(&[
            "zpool",
            "get",
            "-H",
            "-o",
            "value,source",
            "autoexpand",
            "tank"
        ]),
        "on\tlocal\n"
    );
    let obj = put(&e, "tank", 30, 3);
    let before: u64 = list(&e, "tank", "size")[0].parse().expect("size");
    e.ok(&["zpool", "replace", "-w", "tank", &a, &c]);
    assert_eq!(
        list(&e, "tank", "size")[0].parse::<u64>().ok(),
        Some(before)
    );
    e.ok(&["zpool", "replace", "-w", "tank", &b, &d]);
    wait_for("autoexpand after the second replace", || {
        list(&e, "tank", "size")[0].parse::<u64>().ok() == Some(before + (512 << 20))
    });
    get_matches(&e, "tank", &obj, 3);
    zdb_clean(&e, "tank");
    get_matches(&e, "tank", &obj, 3);
    e.ok(&["zpool", "export", "tank"]);
}

/// RAID-Z: the files grown while the pool was exported; `zpool import -o
/// autoexpand=on` grows it at import (every child must have grown).
#[test]
fn autoexpand_at_import_grows_a_raidz() {
    let e = Env::new();
    let d: Vec<String> = (0..3).map(|i| e.disk(&format!("r{i}"), 256)).collect();
    e.ok(&[
        "zpool", "create", "-m", "none", "tank", "raidz1", &d[0], &d[1], &d[2],
    ]);
    let obj = put(&e, "tank", 60, 4);
    let before: u64 = list(&e, "tank", "size")[0].parse().expect("size");
    e.ok(&["zpool", "export", "tank"]);
    for p in &d {
        grow(p, 512);
    }
    e.ok(&["zpool", "import", "-d", ".", "-o", "autoexpand=on", "tank"]);
    let after: u64 = list(&e, "tank", "size")[0].parse().expect("size");
    assert!(
        after > before + (700 << 20),
        "raidz1 of 3 x 256M -> 3 x 512M: {before} -> {after}"
    );
    assert_eq!(list(&e, "tank", "expandsize")[0], "-");
    get_matches(&e, "tank", &obj, 4);
    // More than the pool held before it grew.
    let more = put_bytes(&e, "tank", 5, &noise(5, 520 << 20));
    zdb_clean(&e, "tank");
    get_matches(&e, "tank", &obj, 4);
    get_matches(&e, "tank", &more, 5);
    e.ok(&["zpool", "export", "tank"]);
}

/// `autoreplace=on`: a disk lost while exported, a new blank one put at
/// its path: the pool replaces and resilvers by itself. With
/// `autoreplace=off` the new disk is left alone.
#[test]
fn autoreplace_takes_a_new_disk_at_a_lost_disks_path() {
    for on in [false, true] {
        let e = Env::new();
        let a = e.disk("a", 256);
        let b = e.disk("b", 256);
        e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
        if on {
            e.ok(&["zpool", "set", "autoreplace=on", "tank"]);
        }
        let obj = put(&e, "tank", 20, 6);
        e.ok(&["zpool", "export", "tank"]);
        std::fs::remove_file(&b).expect("remove b");
        e.ok(&["zpool", "import", "-d", ".", "tank"]);
        let st = e.ok(&["zpool", "status", "tank"]);
        assert!(st.contains("DEGRADED"), "{st}");
        // A new, blank disk where b was.
        e.disk("b", 256);
        if on {
            wait_for("autoreplace and its resilver", || {
                let st = e.ok(&["zpool", "status", "tank"]);
                !st.contains("DEGRADED") && !st.contains("replacing") && st.contains("ONLINE")
            });
            zdb_clean(&e, "tank");
            // The new disk holds a whole copy: the pool survives losing a.
            e.ok(&["zpool", "offline", "tank", &a]);
            get_matches(&e, "tank", &obj, 6);
        } else {
            std::thread::sleep(std::time::Duration::from_secs(4));
            let st = e.ok(&["zpool", "status", "tank"]);
            assert!(st.contains("DEGRADED") && !st.contains("replacing"), "{st}");
            get_matches(&e, "tank", &obj, 6);
        }
        e.ok(&["zpool", "export", "tank"]);
    }
}

/// `failmode`: wait (default), continue and panic are accepted, others
/// refused; `panic` aborts the daemon when a sync cannot write, and the
/// pool comes back (from the cache, at its last committed txg) with the
/// next command.
#[test]
fn failmode_panic_aborts_the_daemon_and_the_pool_comes_back() {
    let e = Env::new();
    let a = e.disk("a", 256);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    assert_eq!(
        e.ok(&[
            "zpool",
            "get",
            "-H",
            "-o",
            "value,source",
            "failmode",
            "tank"
        ]),
        "wait\tdefault\n"
    );
    e.fails(
        &["zpool", "set", "failmode=sometimes", "tank"],
        1,
        "wait | continue | panic",
    );
    e.ok(&["zpool", "set", "failmode=continue", "tank"]);
    e.ok(&["zpool", "set", "failmode=panic", "tank"]);
    let obj = put(&e, "tank", 4, 7);
    e.ok(&["zpool", "sync", "tank"]);
    let pid = std::fs::read_to_string(e.rundir.join("uzfsd.pid")).expect("pid");
    e.ok(&["zinject", "-d", &a, "-e", "io", "-T", "write", "tank"]);
    let _ = e.run(&["zpool", "set", "comment=doomed", "tank"]);
    let alive = || std::path::Path::new(&format!("/proc/{}", pid.trim())).exists();
    wait_for("the daemon to abort", || !alive());
    let log = std::fs::read_to_string(e.rundir.join("uzfsd.log")).unwrap_or_default();
    assert!(log.contains("failmode=panic"), "{log}");
    // The next command starts a daemon, which imports the pool again.
    assert_eq!(
        e.ok(&["zpool", "get", "-H", "-o", "value", "failmode", "tank"]),
        "panic\n"
    );
    get_matches(&e, "tank", &obj, 7);
    e.ok(&["zpool", "set", "failmode=wait", "tank"]);
    e.export_and_zdb("tank");
}

/// `cachefile`: `none` keeps a pool out of the daemon's cache (not
/// imported again when the daemon restarts), a path caches it there
/// instead, where `zpool import -c` finds it; the default cache keeps
/// the others. Not stored in the pool: it lasts for one import.
#[test]
fn cachefile_none_or_a_path_and_import_c() {
    let e = Env::new();
    let a = e.disk("a", 128);
    let b = e.disk("b", 128);
    let c = e.disk("c", 128);
    e.ok(&[
        "zpool",
        "create",
        "-m",
        "none",
        "-o",
        "cachefile=none",
        "nocache",
        &a,
    ]);
    let alt = e.dir.path().join("alt.cache").display().to_string();
    let kv = format!("cachefile={alt}");
    e.ok(&["zpool", "create", "-m", "none", "-o", &kv, "alt", &b]);
    e.ok(&["zpool", "create", "-m", "none", "plain", &c]);
    let get = |p: &str| e.ok(&["zpool", "get", "-H", "-o", "value,source", "cachefile", p]);
    assert_eq!(get("nocache"), "none\tlocal\n");
    assert_eq!(get("alt"), format!("{alt}\tlocal\n"));
    assert_eq!(get("plain"), "-\tdefault\n");
    let cache = std::fs::read_to_string(e.rundir.join("zpool.cache")).expect("cache");
    assert!(
        cache.contains("\"plain\"") && !cache.contains("nocache") && !cache.contains("\"alt\"")
    );
    let altc = std::fs::read_to_string(&alt).expect("alt.cache");
    assert!(
        altc.contains("\"alt\"") && !altc.contains("plain"),
        "{altc}"
    );

    // A daemon restart imports only what the default cache lists.
    e.kill_daemon();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let l = e.ok(&["zpool", "list", "-H", "-o", "name"]);
    assert_eq!(l, "plain\n");
    e.ok(&["zpool", "import", "-c", &alt, "alt"]);
    assert_eq!(
        get("alt"),
        format!("{alt}\tlocal\n"),
        "import -c keeps the cache file"
    );
    e.ok(&["zpool", "import", "-d", ".", "nocache"]);
    assert_eq!(
        get("nocache"),
        "-\tdefault\n",
        "cachefile lasts for one import"
    );
    e.ok(&["zpool", "set", "cachefile=none", "plain"]);
    let cache = std::fs::read_to_string(e.rundir.join("zpool.cache")).expect("cache");
    assert!(!cache.contains("\"plain\""), "{cache}");
    e.ok(&["zpool", "set", "cachefile=", "plain"]);
    assert_eq!(get("plain"), "-\tdefault\n");
    e.fails(
        &["zpool", "import", "-c", "nonexistent.cache", "x"],
        1,
        "cannot read",
    );
    e.fails(
        &[
            "zpool",
            "set",
            "cachefile=/nonexistent/dir/x.cache",
            "plain",
        ],
        1,
        "does not exist",
    );
    std::fs::write(e.dir.path().join("junk.cache"), b"{not json").expect("junk");
    e.fails(
        &["zpool", "import", "-c", "junk.cache", "x"],
        1,
        "not a cache file",
    );
    for p in ["nocache", "alt", "plain"] {
        e.ok(&["zpool", "export", p]);
    }
    // The last pool of a cache file exported: the file lists none.
    let altc = std::fs::read_to_string(&alt).expect("alt.cache");
    assert_eq!(altc.trim(), "[]");
}

/// `listsnapshots` is stored and shown; `zfs list` without `-t` then lists
/// snapshots too (`tests/snapshots.rs`).
#[test]
fn listsnapshots_is_a_persistent_on_off_property() {
    let e = Env::new();
    let a = e.disk("a", 128);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    let get = || {
        e.ok(&[
            "zpool",
            "get",
            "-H",
            "-o",
            "value,source",
            "listsnapshots",
            "tank",
        ])
    };
    assert_eq!(get(), "off\tdefault\n");
    e.ok(&["zpool", "set", "listsnaps=on", "tank"]);
    e.fails(
        &["zpool", "set", "listsnapshots=yes", "tank"],
        1,
        "on | off",
    );
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-d", ".", "tank"]);
    assert_eq!(get(), "on\tlocal\n");
    e.ok(&["zpool", "export", "tank"]);
}
