//! RAID-Z, scrub, resilver, replace, spares and fault injection through the
//! command line, with `zpool status` and `zpool iostat` compared against
//! OpenZFS's layout (golden text, paths and times normalized).

mod common;
use common::{get_matches, put, Env};

/// Replace the temp dir with /tmp/uzg###### (same length, so columns keep
/// their alignment), dates with DATE, durations with T.
fn normalize(e: &Env, s: &str) -> String {
    let dir = e.dir.path().display().to_string();
    let mut out = String::new();
    for line in s.replace(&dir, "/tmp/uzg######").lines() {
        let l = if let Some(i) = line.find(" on ").filter(|_| line.contains("scan:")) {
            let head = &line[..i];
            let head = match head.find(" in ") {
                Some(j) if head[j + 4..].len() == 8 => format!("{} in T", &head[..j]),
                _ => head.to_string(),
            };
            format!("{head} on DATE")
        } else {
            line.to_string()
        };
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// Some line of `st` has exactly these whitespace-separated fields.
fn has_row(st: &str, fields: &[&str]) -> bool {
    st.lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == fields)
}

#[test]
fn raidz2_with_spare_status_is_zfs_shaped() {
    let e = Env::new();
    let d: Vec<String> = (0..5).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&[
        "zpool", "create", "tank", "raidz2", &d[0], &d[1], &d[2], &d[3], "spare", &d[4],
    ]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    let want = "  pool: tank
 state: ONLINE
  scan: none requested
config:

\tNAME                   STATE     READ WRITE CKSUM
\ttank                   ONLINE       0     0     0
\t  raidz2-0             ONLINE       0     0     0
\t    /tmp/uzg######/d0  ONLINE       0     0     0
\t    /tmp/uzg######/d1  ONLINE       0     0     0
\t    /tmp/uzg######/d2  ONLINE       0     0     0
\t    /tmp/uzg######/d3  ONLINE       0     0     0
\tspares
\t  /tmp/uzg######/d4    AVAIL

errors: No known data errors
";
    assert_eq!(st, want);
    let obj = put(&e, "tank", 8, 1);
    e.ok(&["zpool", "offline", "tank", &d[1]]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    let want = "  pool: tank
 state: DEGRADED
status: One or more devices has been taken offline by the administrator.
\tSufficient replicas exist for the pool to continue functioning in a
\tdegraded state.
action: Online the device using 'zpool online' or replace the device with
\t'zpool replace'.
  scan: none requested
config:

\tNAME                   STATE     READ WRITE CKSUM
\ttank                   DEGRADED     0     0     0
\t  raidz2-0             DEGRADED     0     0     0
\t    /tmp/uzg######/d0  ONLINE       0     0     0
\t    /tmp/uzg######/d1  OFFLINE      0     0     0
\t    /tmp/uzg######/d2  ONLINE       0     0     0
\t    /tmp/uzg######/d3  ONLINE       0     0     0
\tspares
\t  /tmp/uzg######/d4    AVAIL

errors: No known data errors
";
    assert_eq!(st, want);
    // Offline is not a fault: the spare stays AVAIL. Online resilvers.
    e.ok(&["zpool", "online", "tank", &d[1]]);
    e.ok(&["zpool", "wait", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains(" state: ONLINE\n"), "{st}");
    assert!(st.contains("  scan: resilvered "), "{st}");
    assert!(st.contains(" with 0 errors on DATE"), "{st}");
    get_matches(&e, "tank", &obj, 1);
}

#[test]
fn zinject_corruption_is_found_by_scrub_and_counted_on_the_device() {
    let e = Env::new();
    let d: Vec<String> = (0..4).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&[
        "zpool", "create", "tank", "raidz1", &d[0], &d[1], &d[2], &d[3],
    ]);
    let obj = put(&e, "tank", 16, 2);
    e.ok(&["zpool", "sync", "tank"]);
    let out = e.ok(&["zinject", "-d", &d[2], "-C", "25", "tank"]);
    assert!(out.contains("Corrupted"), "{out}");
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains("  scan: scrub repaired "), "{st}");
    assert!(st.contains(" with 0 errors on DATE"), "{st}");
    assert!(
        st.contains("status: One or more devices has experienced an unrecoverable error."),
        "{st}"
    );
    let line = st
        .lines()
        .find(|l| l.contains("/tmp/uzg######/d2"))
        .expect("d2 row");
    let cksum: u64 = line
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .expect("cksum");
    assert!(cksum > 0, "{line}");
    for other in [
        "/tmp/uzg######/d0",
        "/tmp/uzg######/d1",
        "/tmp/uzg######/d3",
    ] {
        let l = st.lines().find(|l| l.contains(other)).expect("row");
        assert!(l.ends_with(" 0     0     0"), "{l}");
    }
    e.ok(&["zpool", "clear", "tank"]);
    let st = e.ok(&["zpool", "status", "-x"]);
    assert_eq!(st, "all pools are healthy\n");
    get_matches(&e, "tank", &obj, 2);
    e.ok(&["zpool", "export", "tank"]);
    let z = e.ok(&[
        "zdb",
        "-e",
        "-p",
        &e.dir.path().display().to_string(),
        "tank",
    ]);
    assert!(!z.contains("bad copies") && !z.contains("leak"), "{z}");
}

#[test]
fn a_vanished_disk_is_replaced_by_the_spare_then_by_a_new_disk() {
    let e = Env::new();
    let d: Vec<String> = (0..6).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&[
        "zpool", "create", "tank", "mirror", &d[0], &d[1], "spare", &d[2],
    ]);
    let obj = put(&e, "tank", 8, 3);
    e.ok(&["zinject", "-d", &d[1], "-e", "nxio", "tank"]);
    // The next writes find it gone; the spare steps in by itself.
    put(&e, "tank", 1, 4);
    let mut st = String::new();
    for _ in 0..100 {
        st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
        if st.contains("INUSE") && st.contains("resilvered") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        has_row(&st, &["spare-1", "DEGRADED", "0", "0", "0"]),
        "{st}"
    );
    assert!(st.contains("/tmp/uzg######/d1  REMOVED "), "{st}");
    assert!(
        has_row(
            &st,
            &["/tmp/uzg######/d2", "INUSE", "currently", "in", "use"]
        ),
        "{st}"
    );
    get_matches(&e, "tank", &obj, 3);
    e.ok(&["zpool", "replace", "-w", "tank", &d[1], &d[3]]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains(" state: ONLINE\n"), "{st}");
    assert!(
        has_row(&st, &["/tmp/uzg######/d3", "ONLINE", "0", "0", "0"]),
        "{st}"
    );
    assert!(has_row(&st, &["/tmp/uzg######/d2", "AVAIL"]), "{st}");
    assert!(!st.contains("/tmp/uzg######/d1"), "{st}");
    // The pool survives an export and import on its new devices.
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&[
        "zpool",
        "import",
        "-d",
        &e.dir.path().display().to_string(),
        "tank",
    ]);
    get_matches(&e, "tank", &obj, 3);
}

#[test]
fn iostat_prints_zfs_layout_and_intervals() {
    let e = Env::new();
    let d: Vec<String> = (0..3).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&["zpool", "create", "tank", "raidz1", &d[0], &d[1], &d[2]]);
    put(&e, "tank", 4, 5);
    let out = normalize(&e, &e.ok(&["zpool", "iostat", "-v", "tank"]));
    let lines: Vec<&str> = out.lines().collect();
    // The name column is as wide as the longest name (here the paths).
    let namew = "    /tmp/uzg######/d0".len();
    assert_eq!(
        lines[0],
        format!(
            "{}    capacity     operations     bandwidth",
            " ".repeat(namew)
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{:<namew$}  alloc   free   read  write   read  write",
            "pool"
        )
    );
    assert_eq!(
        lines[2],
        format!(
            "{}  -----  -----  -----  -----  -----  -----",
            "-".repeat(namew)
        )
    );
    assert!(lines[3].starts_with("tank  "), "{out}");
    assert!(lines[4].starts_with("  raidz1-0  "), "{out}");
    assert!(
        lines[5].starts_with("    /tmp/uzg######/d0      -      -"),
        "{out}"
    );
    assert_eq!(lines.len(), 9, "{out}");
    // interval 1, count 2: two reports.
    let out = e.ok(&["zpool", "iostat", "tank", "1", "2"]);
    assert_eq!(out.matches("capacity").count(), 2, "{out}");
    let out = e.ok(&["zpool", "iostat", "-w", "tank"]);
    assert!(
        out.contains("latency      read  write   read  write"),
        "{out}"
    );
    assert!(out.contains("\n137s "), "{out}");
    let out = e.ok(&["zpool", "iostat", "-l", "tank"]);
    assert!(
        out.contains("total_wait     disk_wait    syncq_wait    asyncq_wait  scrub   trim"),
        "{out}"
    );
    // The txgs' writes went through the queues' async write class: their
    // wait is measured (a time, not "-"); there is no trim.
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("tank "))
        .expect("tank row")
        .split_whitespace()
        .collect();
    assert_eq!(row.len(), 17, "{out}");
    assert_ne!(row[14], "-", "asyncq_wait write: {out}");
    assert_eq!(row[16], "-", "trim: {out}");
    // -q: each class's pend and activ, numbers (an idle pool: nothing in
    // its queues); with -l the latency groups come first, as OpenZFS.
    let out = e.ok(&["zpool", "iostat", "-q", "-p", "tank"]);
    assert!(out.contains("syncq_read    syncq_write   asyncq_read  asyncq_write   scrubq_read   trimq_write  rebuildq_write"), "{out}");
    let row = |out: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with("tank "))
            .expect("tank row")
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let r = row(&out);
    assert_eq!(r.len(), 7 + 14, "{out}");
    assert!(r[7..].iter().all(|v| v == "0"), "{out}");
    let out = e.ok(&["zpool", "iostat", "-lq", "tank"]);
    assert!(out.find("trim") < out.find("syncq_read"), "{out}");
    assert_eq!(row(&out).len(), 17 + 14, "{out}");
}

#[test]
fn bad_device_commands_get_clear_errors() {
    let e = Env::new();
    let d: Vec<String> = (0..4).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&["zpool", "create", "tank", "raidz1", &d[0], &d[1], &d[2]]);
    e.ok(&["zpool", "offline", "tank", &d[0]]);
    e.fails(&["zpool", "offline", "tank", &d[1]], 1, "no valid replicas");
    e.fails(
        &["zpool", "offline", "tank", "nosuch"],
        1,
        "no such device in pool",
    );
    e.fails(
        &["zpool", "attach", "tank", &d[1], &d[3]],
        1,
        "can only attach to mirrors and top-level disks",
    );
    e.fails(
        &["zpool", "detach", "tank", &d[1]],
        1,
        "only applicable to mirror",
    );
    e.fails(
        &["zpool", "scrub", "-s", "tank"],
        1,
        "there is no active scrub",
    );
    e.fails(
        &["zpool", "replace", "tank", &d[1], &d[2]],
        1,
        "part of this pool already",
    );
    e.fails(
        &["zinject", "-d", &d[1], "-e", "bogus", "tank"],
        1,
        "invalid error type",
    );
    let small = e.disk("small", 64);
    e.fails(&["zpool", "replace", "tank", &d[1], &small], 1, "too small");
}

#[test]
fn scrub_pause_resume_cancel_show_in_status() {
    let e = Env::new();
    let d: Vec<String> = (0..2).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&["zpool", "create", "tank", "mirror", &d[0], &d[1]]);
    put(&e, "tank", 8, 6);
    e.ok(&["zpool", "sync", "tank"]);
    // Slow devices keep the scrub running long enough to be paused.
    e.ok(&["zinject", "-d", &d[0], "-D", "150", "tank"]);
    e.ok(&["zinject", "-d", &d[1], "-D", "150", "tank"]);
    e.ok(&["zpool", "scrub", "tank"]);
    e.ok(&["zpool", "scrub", "-p", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains("  scan: scrub paused since "), "{st}");
    assert!(st.contains("\tscrub started on "), "{st}");
    // Paused survives export and import.
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&[
        "zpool",
        "import",
        "-d",
        &e.dir.path().display().to_string(),
        "tank",
    ]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains("scrub paused since "), "{st}");
    e.ok(&["zinject", "-d", &d[0], "-D", "150", "tank"]);
    e.ok(&["zinject", "-d", &d[1], "-D", "150", "tank"]);
    e.ok(&["zpool", "scrub", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains("  scan: scrub in progress since "), "{st}");
    assert!(
        st.contains(" scanned at ") && st.contains(" issued at "),
        "{st}"
    );
    assert!(st.contains("% done"), "{st}");
    e.ok(&["zpool", "scrub", "-s", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(st.contains("  scan: scrub canceled on "), "{st}");
    e.ok(&["zinject", "-c", "all", "tank"]);
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    assert!(
        st.contains("  scan: scrub repaired 0B in ") && st.contains(" with 0 errors on DATE"),
        "{st}"
    );
}

/// Blocks a sync wrote are served from the block cache; `zinject -a`
/// flushes it, so the next read goes to the devices (here failing them all).
#[test]
fn zinject_a_flushes_the_block_cache() {
    let e = Env::new();
    let d: Vec<String> = (0..2).map(|i| e.disk(&format!("d{i}"), 128)).collect();
    e.ok(&["zpool", "create", "tank", "mirror", &d[0], &d[1]]);
    let obj = put(&e, "tank", 4, 5);
    e.ok(&["zpool", "sync", "tank"]);
    e.ok(&["zinject", "-d", &d[0], "-e", "io", "-T", "read", "tank"]);
    e.ok(&["zinject", "-d", &d[1], "-e", "io", "-T", "read", "tank"]);
    // Written in the last txg, so still cached: no device is read.
    get_matches(&e, "tank", &obj, 5);
    e.ok(&["zinject", "-a", "tank"]);
    let back = e.dir.path().join("back5");
    let r = e.run(&["object", "get", "tank", &obj, &back.display().to_string()]);
    assert!(
        !r.status.success(),
        "read with both sides failing and the cache flushed succeeded"
    );
    e.ok(&["zinject", "-c", "all", "tank"]);
    e.ok(&["zpool", "clear", "tank"]);
    // Every pool's cache when no pool is named.
    e.ok(&["zinject", "-a"]);
    get_matches(&e, "tank", &obj, 5);
    e.fails(&["zinject", "-a", "nosuch"], 1, "no such pool");
}

/// Issue #13's resilver that never ended: raidz2 with a hot spare; export,
/// a disk removed, import (the spare steps in and resilvers), export in the
/// middle of that resilver, the disk put back, import. The resilver must
/// end (a handful of runs at most, not thousands), the spare must show
/// once, and the data must be whole.
#[test]
fn a_resilver_interrupted_by_export_with_the_disk_back_ends() {
    let e = Env::new();
    let d: Vec<String> = (0..6).map(|i| e.disk(&format!("r{i}"), 128)).collect();
    e.ok(&[
        "zpool", "create", "-m", "none", "tank", "raidz2", &d[0], &d[1], &d[2], &d[3], &d[4],
        "spare", &d[5],
    ]);
    let obj = put(&e, "tank", 96, 5);
    e.ok(&["zpool", "export", "tank"]);
    let away = e.dir.path().join("away");
    std::fs::create_dir(&away).expect("mkdir");
    std::fs::rename(&d[2], away.join("r2")).expect("remove a disk");
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    // The spare steps in; export while its resilver runs (or just after).
    for _ in 0..50 {
        let st = e.ok(&["zpool", "status", "tank"]);
        if st.contains("resilver in progress") || st.contains("resilvered") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    e.ok(&["zpool", "export", "tank"]);
    std::fs::rename(away.join("r2"), &d[2]).expect("put the disk back");
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    let t0 = std::time::Instant::now();
    let mut st = String::new();
    while t0.elapsed() < std::time::Duration::from_secs(60) {
        st = e.ok(&["zpool", "status", "tank"]);
        if !st.contains("in progress") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        !st.contains("in progress"),
        "the resilver did not end:\n{st}"
    );
    // A few seconds more: no new resilver starts by itself.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let hist = e.ok(&["zpool", "history", "-i", "tank"]);
    let runs = hist.matches("resilver started").count();
    assert!(runs <= 4, "{runs} resilvers:\n{hist}");
    let st = normalize(&e, &e.ok(&["zpool", "status", "tank"]));
    let spare_rows = st.lines().filter(|l| l.contains("/r5 ")).count();
    assert_eq!(spare_rows, 1, "the spare shows {spare_rows} times:\n{st}");
    get_matches(&e, "tank", &obj, 5);
    e.ok(&["zpool", "export", "tank"]);
    let z = e.ok(&["zdb", "-e", "-p", ".", "-b", "tank"]);
    assert!(z.contains("No errors"), "{z}");
}
