//! Every option a command takes works or is refused (issue #13).
//!
//! Each subcommand lists OpenZFS's whole option string; the options uzfs
//! does not do yet are marked and refused with "option not supported yet:
//! -X" and exit 2, never accepted and ignored. The table below runs each
//! refused option and checks the refusal, and that the refusal changed
//! nothing; the dry runs (`zfs destroy -n`, `zpool add -n`, `zpool create
//! -n`) are checked to act on nothing, by the device files' contents before
//! and after; `zpool import -N` imports without mounting.

mod common;
use common::Env;

/// SHA-256 of a file (coreutils), for "nothing was written".
fn digest(path: &str) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// (command line, the refused option) for every option OpenZFS has that
/// uzfs does not do yet. `P` is the pool, `D` a spare device file, `F` a
/// filesystem.
const REFUSED: &[(&str, &str)] = &[
    ("zpool create -d N D", "-d"),
    ("zpool create -t tmp N D", "-t"),
    ("zpool add -g P D", "-g"),
    ("zpool add -L P D", "-L"),
    ("zpool status -c x P", "-c"),
    ("zpool import -F P", "-F"),
    ("zpool import -l P", "-l"),
    ("zpool import -n P", "-n"),
    ("zpool import -t P", "-t"),
    ("zpool import -T 5 P", "-T"),
    ("zpool import -X P", "-X"),
    ("zpool scrub -e P", "-e"),
    ("zpool wait -p P", "-p"),
    ("zpool wait -T d P", "-T"),
    ("zpool iostat -c x", "-c"),
    ("zpool iostat -g", "-g"),
    ("zpool iostat -r", "-r"),
    ("zpool upgrade -V 5 P", "-V"),
    ("zfs create -b 8k F/x", "-b"),
    ("zfs create -s F/x", "-s"),
    ("zfs create -V 1M F/x", "-V"),
    ("zfs inherit -S atime F", "-S"),
    ("zfs mount -f F", "-f"),
    ("zfs mount -l F", "-l"),
    ("zfs rename -r F F2", "-r"),
    ("zfs rename -u F F2", "-u"),
    ("zpool list -j", "-j"),
    ("zpool status -j P", "-j"),
    ("zpool get -j all P", "-j"),
    ("zpool history -l P", "-l"),
    ("zpool clear -F P", "-F"),
    ("zpool clear -n P", "-n"),
    ("zpool remove -n P D", "-n"),
    ("zpool remove -p P", "-p"),
    ("zpool remove -s P", "-s"),
    ("zpool remove -w P D", "-w"),
];

#[test]
fn unsupported_options_are_refused_and_change_nothing() {
    let e = Env::new();
    let (a, spare) = (e.disk("a", 96), e.disk("spare", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    e.ok(&["zfs", "create", "tank/fs"]);
    // Exported: any refused command that acted anyway (an import, a
    // create, an add) would change a device file.
    e.ok(&["zpool", "export", "tank"]);
    let before = (digest(&a), digest(&spare));
    for (line, opt) in REFUSED {
        let args: Vec<String> = line
            .split(' ')
            .map(|w| match w {
                "P" => "tank".to_string(),
                "N" => "newpool".to_string(),
                "D" => spare.clone(),
                "F" => "tank/fs".to_string(),
                "F2" => "tank/fs2".to_string(),
                w => w.to_string(),
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        e.fails(&args, 2, &format!("option not supported yet: {opt}"));
    }
    // An option OpenZFS does not have at all is a usage error.
    e.fails(&["zpool", "status", "-Q"], 2, "invalid option 'Q'");
    e.fails(&["zfs", "list", "-Q"], 2, "invalid option 'Q'");
    assert_eq!(
        (digest(&a), digest(&spare)),
        before,
        "a refused command wrote to a device"
    );
    assert!(e.ok(&["zpool", "list"]).contains("no pools available"));
    e.ok(&["zpool", "import", "-d", ".", "tank"]);
    assert!(e
        .ok(&["zfs", "list", "-H", "-o", "name"])
        .contains("tank/fs"));
    // An argument OpenZFS takes and uzfs does not do yet: refused too.
    e.fails(&["zpool", "wait", "tank", "5"], 2, "not supported yet");
}

#[test]
fn dry_runs_change_nothing() {
    let e = Env::new();
    let (a, b, c) = (e.disk("a", 96), e.disk("b", 96), e.disk("c", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    for fs in ["tank/fs", "tank/fs/kid"] {
        e.ok(&["zfs", "create", fs]);
    }
    e.ok(&["zpool", "sync"]);
    e.ok(&["zpool", "export", "tank"]);
    let before: Vec<String> = [&a, &b, &c].iter().map(|p| digest(p)).collect();
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);

    // zfs destroy -n: nothing goes; -v lists what would, -p in machine form.
    assert_eq!(e.ok(&["zfs", "destroy", "-n", "-r", "tank/fs"]), "");
    let v = e.ok(&["zfs", "destroy", "-nv", "-r", "tank/fs"]);
    assert!(
        v.contains("would destroy tank/fs/kid\n")
            && v.contains("would destroy tank/fs\n")
            && v.contains("would reclaim "),
        "{v}"
    );
    let p = e.ok(&["zfs", "destroy", "-nvp", "-r", "tank/fs"]);
    let reclaim = p
        .lines()
        .find_map(|l| l.strip_prefix("reclaim\t"))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        p.contains("destroy\ttank/fs\n") && reclaim.is_some_and(|n| n > 0),
        "{p}"
    );
    // Without -r a parent still refuses, dry run or not.
    e.fails(&["zfs", "destroy", "-n", "tank/fs"], 1, "has children");

    // zpool add -n / create -n: the layout they would make, nothing more.
    let add = e.ok(&["zpool", "add", "-n", "tank", "mirror", &b, &c]);
    assert!(
        add.contains("would update 'tank'") && add.contains("mirror") && add.contains(&b),
        "{add}"
    );
    let create = e.ok(&["zpool", "create", "-n", "other", "mirror", &b, &c]);
    assert!(
        create.contains("would create 'other'") && create.contains(&c),
        "{create}"
    );
    // A live pool's disk is refused even for a dry run.
    e.fails(&["zpool", "create", "-n", "-f", "other", &a], 1, "tank");

    let names = e.ok(&["zfs", "list", "-H", "-o", "name"]);
    assert!(
        names.contains("tank/fs\n") && names.contains("tank/fs/kid\n"),
        "{names}"
    );
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(!st.contains(&b) && !st.contains(&c), "{st}");
    assert!(!e.ok(&["zpool", "list"]).contains("other"));
    // -N: imported, nothing mounted.
    let mounted = e.ok(&["zfs", "get", "-H", "-o", "value", "mounted", "tank/fs"]);
    assert_eq!(mounted.trim(), "no", "zpool import -N mounted tank/fs");
    e.ok(&["zpool", "export", "tank"]);
    let after: Vec<String> = [&a, &b, &c].iter().map(|p| digest(p)).collect();
    // The import and export rewrite tank's labels and uberblocks; the
    // other two devices must be untouched.
    assert_eq!(after[1..], before[1..], "a dry run wrote to a device");
}

/// A disk of a live pool is refused by every command that would write a
/// label on it, `-f` or not, whether this daemon or another one (another
/// run directory) holds the pool; the refusal names the pool.
#[test]
fn disks_of_live_pools_are_refused_even_with_force() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    // This daemon: a second pool, and attach/replace into it.
    let c = e.disk("c", 96);
    e.ok(&["zpool", "create", "-m", "none", "mine", &c]);
    // Another daemon with a pool of its own.
    let e2 = Env::new();
    let d = e2.disk("d", 96);
    e2.ok(&["zpool", "create", "-m", "none", "theirs", &d]);
    for (env, pool, dev) in [(&e, "mine", &c), (&e2, "theirs", &d)] {
        for args in [
            vec!["zpool", "create", "-f", "new", a.as_str()],
            vec!["zpool", "create", "-n", "-f", "new", a.as_str()],
            vec!["zpool", "add", "-f", pool, a.as_str()],
            vec!["zpool", "attach", "-f", pool, dev.as_str(), a.as_str()],
            vec!["zpool", "replace", "-f", pool, dev.as_str(), a.as_str()],
            vec!["zpool", "labelclear", "-f", a.as_str()],
        ] {
            let o = env.run(&args);
            let msg = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?} was not refused: {msg}");
            assert!(
                msg.contains("tank"),
                "{args:?}: the refusal does not name tank: {msg}"
            );
        }
    }
    e.ok(&["zpool", "sync", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("state: ONLINE") && st.contains("errors: No known data errors"));
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("with 0 errors"), "{st}");
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    e.ok(&["zpool", "export", "tank"]);
    e2.ok(&["zpool", "export", "theirs"]);
}

#[test]
fn ashift_given_at_create_is_the_pool_property() {
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&[
        "zpool", "create", "-m", "none", "-o", "ashift=9", "tank", &a,
    ]);
    let got = e.ok(&["zpool", "get", "-H", "-o", "value,source", "ashift", "tank"]);
    assert_eq!(got.trim(), "9\tlocal");
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    let got = e.ok(&["zpool", "get", "-H", "-o", "value", "ashift", "tank"]);
    assert_eq!(got.trim(), "9");
    e.ok(&["zpool", "export", "tank"]);
}

/// raidz1/2/3 take the smallest widths OpenZFS takes: 2, 3 and 4 disks.
#[test]
fn smallest_raidz_widths_as_openzfs() {
    let e = Env::new();
    for (np, width) in [(1, 2), (2, 3), (3, 4)] {
        let disks: Vec<String> = (0..width)
            .map(|i| e.disk(&format!("r{np}-{i}"), 96))
            .collect();
        let pool = format!("rz{np}");
        let mut args = vec!["zpool", "create", "-m", "none", pool.as_str()];
        let kind = format!("raidz{np}");
        args.push(&kind);
        args.extend(disks.iter().map(String::as_str));
        e.ok(&args);
        std::fs::write(e.dir.path().join("data"), vec![7u8; 3 << 20]).expect("data");
        let obj = e.ok(&["object", "put", &pool, "data"]).trim().to_string();
        e.ok(&["zpool", "export", &pool]);
        // The import listing shows the real layout.
        let listing = e.ok(&["zpool", "import", "-d", "."]);
        assert!(
            listing.contains(&format!("{kind}-0"))
                && (0..width).all(|i| listing.contains(&format!("/r{np}-{i} "))),
            "{listing}"
        );
        let z = e.ok(&["zdb", "-e", "-p", ".", "-b", &pool]);
        assert!(z.contains("No errors"), "{kind} x{width}: {z}");
        e.ok(&["zpool", "import", "-d", ".", "-N", &pool]);
        e.ok(&["object", "get", &pool, &obj, "back"]);
        let back = std::fs::read(e.dir.path().join("back")).expect("back");
        assert_eq!(back, vec![7u8; 3 << 20], "{kind} x{width}");
        e.ok(&["zpool", "destroy", &pool]);
    }
    // One fewer is refused.
    let (a, b) = (e.disk("x0", 96), e.disk("x1", 96));
    e.fails(
        &["zpool", "create", "rz", "raidz2", &a, &b],
        1,
        "at least 3",
    );
}

/// `zpool help` lists every command the daemon answers.
#[test]
fn zpool_help_lists_every_command() {
    let e = Env::new();
    let help = e.ok(&["zpool", "help"]);
    for cmd in [
        "create",
        "destroy",
        "add",
        "remove",
        "labelclear",
        "list",
        "iostat",
        "status",
        "online",
        "offline",
        "clear",
        "attach",
        "detach",
        "replace",
        "scrub",
        "wait",
        "import",
        "export",
        "upgrade",
        "history",
        "sync",
        "get",
        "set",
    ] {
        assert!(
            help.contains(&format!("\t{cmd} ")),
            "zpool help lacks {cmd}:\n{help}"
        );
    }
}

/// `zfs list -d`/`-s`/`-S` and `zfs get -d`/`-s`: depth, sorting and
/// source filters do what zfs-list(8) and zfs-get(8) say.
#[test]
fn zfs_list_and_get_depth_sort_and_source() {
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    for fs in ["tank/b", "tank/b/deep", "tank/a"] {
        e.ok(&["zfs", "create", fs]);
    }
    e.ok(&["zfs", "set", "quota=1G", "tank/b"]);
    e.ok(&["zfs", "set", "atime=off", "tank/b"]);
    let names = |args: &[&str]| -> Vec<String> { e.ok(args).lines().map(str::to_string).collect() };
    assert_eq!(
        names(&["zfs", "list", "-H", "-o", "name", "-d", "1", "tank"]),
        ["tank", "tank/a", "tank/b"]
    );
    assert_eq!(
        names(&["zfs", "list", "-H", "-o", "name", "-d", "0", "tank/b"]),
        ["tank/b"]
    );
    assert_eq!(
        names(&["zfs", "list", "-H", "-o", "name", "-r", "-d", "1", "tank/b"]),
        ["tank/b", "tank/b/deep"]
    );
    assert_eq!(
        names(&["zfs", "list", "-H", "-o", "name", "-s", "name"]),
        ["tank", "tank/a", "tank/b", "tank/b/deep"]
    );
    assert_eq!(
        names(&["zfs", "list", "-H", "-o", "name", "-S", "name"]),
        ["tank/b/deep", "tank/b", "tank/a", "tank"]
    );
    // Sorted by a number: tank holds everything, so it sorts last.
    let by_used = names(&["zfs", "list", "-H", "-o", "name", "-s", "used"]);
    assert_eq!(
        by_used.last().map(String::as_str),
        Some("tank"),
        "{by_used:?}"
    );
    e.fails(&["zfs", "list", "-d", "x"], 2, "invalid depth");
    e.fails(&["zfs", "list", "-s", "bogus"], 2, "invalid property");
    // Only locally set properties, every dataset (`-m none` set tank's
    // mountpoint); only inherited ones.
    let get = |src: &str| {
        let mut v = names(&["zfs", "get", "-H", "-o", "name,property", "-s", src, "all"]);
        v.sort();
        v
    };
    assert_eq!(
        get("local"),
        ["tank\tmountpoint", "tank/b\tatime", "tank/b\tquota"]
    );
    let inherited = get("inherited");
    assert!(
        inherited.contains(&"tank/b/deep\tatime".to_string())
            && !inherited
                .iter()
                .any(|l| l.starts_with("tank/a\t") && l.ends_with("atime")),
        "{inherited:?}"
    );
    assert_eq!(
        names(&["zfs", "get", "-H", "-o", "name", "-d", "1", "atime", "tank"]),
        ["tank", "tank/a", "tank/b"]
    );
    e.fails(&["zfs", "get", "-s", "bogus", "all"], 2, "invalid source");
    e.ok(&["zpool", "export", "tank"]);
}

/// `zpool import -o readonly=on`: the pool is readable, every change is
/// refused with a clear error, and not one byte of any device changes,
/// through reads, refused writes, a refused scrub and export.
#[test]
fn readonly_import_writes_nothing() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    e.ok(&["zfs", "create", "tank/fs"]);
    let payload: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(e.dir.path().join("data"), &payload).expect("data");
    let obj = e.ok(&["object", "put", "tank", "data"]).trim().to_string();
    e.ok(&["zpool", "export", "tank"]);
    let before = (digest(&a), digest(&b));

    e.fails(
        &["zpool", "import", "-d", ".", "-o", "bogus=1", "tank"],
        1,
        "property 'bogus' is not a valid pool property",
    );
    e.ok(&[
        "zpool",
        "import",
        "-d",
        ".",
        "-N",
        "-o",
        "readonly=on",
        "tank",
    ]);
    let ro = e.ok(&["zpool", "get", "-H", "-o", "value", "readonly", "tank"]);
    assert_eq!(ro.trim(), "on");
    assert!(e.ok(&["zpool", "status", "tank"]).contains("ONLINE"));
    assert!(e
        .ok(&["zfs", "list", "-H", "-o", "name"])
        .contains("tank/fs"));
    e.ok(&["object", "get", "tank", &obj, "back"]);
    assert_eq!(
        std::fs::read(e.dir.path().join("back")).expect("back"),
        payload
    );
    for args in [
        vec!["object", "put", "tank", "data"],
        vec!["zfs", "create", "tank/new"],
        vec!["zfs", "set", "atime=off", "tank/fs"],
        vec!["zfs", "destroy", "tank/fs"],
        vec!["zpool", "set", "comment=x", "tank"],
        vec!["zpool", "scrub", "tank"],
        vec!["zpool", "sync", "tank"],
        vec!["zpool", "destroy", "tank"],
    ] {
        let o = e.run(&args);
        let msg = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{args:?} succeeded on a read-only pool"
        );
        assert!(msg.contains("read-only"), "{args:?}: {msg}");
    }
    // The refused set left nothing behind in memory either.
    assert_ne!(
        e.ok(&["zpool", "get", "-H", "-o", "value", "comment", "tank"])
            .trim(),
        "x"
    );
    e.ok(&["zpool", "export", "tank"]);
    assert_eq!(
        (digest(&a), digest(&b)),
        before,
        "a read-only import wrote to a device"
    );
    // And the pool imports read-write as before.
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    e.ok(&["zfs", "create", "tank/new"]);
    e.ok(&["zpool", "export", "tank"]);
}

/// A read-only import mounts its filesystems read-only: files read back,
/// writes get EROFS, and the devices do not change.
#[test]
fn readonly_import_mounts_read_only() {
    if !common::can_mount() {
        return;
    }
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&["zpool", "create", "tank", &a]);
    let mnt = e.dir.path().join("mnt/tank");
    std::fs::write(mnt.join("f"), b"hello").expect("write before");
    e.ok(&["zpool", "export", "tank"]);
    let before = digest(&a);
    e.ok(&["zpool", "import", "-d", ".", "-o", "readonly=on", "tank"]);
    assert_eq!(std::fs::read(mnt.join("f")).expect("read"), b"hello");
    let w = std::fs::write(mnt.join("g"), b"x");
    assert_eq!(
        w.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EROFS),
        "{w:?}"
    );
    let r = std::fs::remove_file(mnt.join("f"));
    assert_eq!(
        r.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EROFS)
    );
    e.ok(&["zpool", "export", "tank"]);
    assert_eq!(digest(&a), before, "a read-only mount wrote to the device");
}

/// `zfs mount -o ro|rw`: a temporary readonly for that mount only, shown
/// as "temporary" by `zfs get`, gone at the next mount; other mount
/// options are refused.
#[test]
fn zfs_mount_ro_and_rw_are_temporary() {
    if !common::can_mount() {
        return;
    }
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&["zpool", "create", "tank", &a]);
    e.ok(&["zfs", "create", "tank/fs"]);
    let mnt = e.dir.path().join("mnt/tank/fs");
    let ro = |want: &str| {
        let got = e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "readonly",
            "tank/fs",
        ]);
        assert_eq!(got.trim(), want);
    };
    let write_errno = || {
        std::fs::write(mnt.join("f"), b"x")
            .err()
            .and_then(|e| e.raw_os_error())
    };
    e.ok(&["zfs", "unmount", "tank/fs"]);
    e.fails(
        &["zfs", "mount", "-o", "noexec", "tank/fs"],
        2,
        "mount option 'noexec'",
    );
    e.ok(&["zfs", "mount", "-o", "ro", "tank/fs"]);
    ro("on\ttemporary");
    assert_eq!(write_errno(), Some(libc::EROFS));
    e.ok(&["zfs", "unmount", "tank/fs"]);
    e.ok(&["zfs", "mount", "tank/fs"]);
    ro("off\tdefault");
    assert_eq!(write_errno(), None);
    // The other way round: readonly=on, mounted rw for once.
    e.ok(&["zfs", "set", "readonly=on", "tank/fs"]);
    e.ok(&["zfs", "unmount", "tank/fs"]);
    e.ok(&["zfs", "mount", "-o", "rw", "tank/fs"]);
    ro("off\ttemporary");
    assert_eq!(write_errno(), None);
    e.ok(&["zfs", "unmount", "tank/fs"]);
    e.ok(&["zfs", "mount", "tank/fs"]);
    ro("on\tlocal");
    assert_eq!(write_errno(), Some(libc::EROFS));
    e.export_and_zdb("tank");
}

/// `zpool list -v`: a row per top-level vdev with its own space, and per
/// device beneath it with its health.
#[test]
fn zpool_list_verbose_shows_every_vdev() {
    let e = Env::new();
    let (a, b, c) = (e.disk("a", 96), e.disk("b", 96), e.disk("c", 128));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    e.ok(&["zpool", "add", "tank", &c]);
    let out = e.ok(&["zpool", "list", "-v", "-H", "-p", "-o", "name,size,health"]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0].trim()).collect();
    assert_eq!(
        names,
        ["tank", "mirror-0", a.as_str(), b.as_str(), c.as_str()],
        "{out}"
    );
    let size = |i: usize| rows[i][1].parse::<u64>().unwrap_or(0);
    assert!(size(1) > 0 && size(4) > size(1), "{out}");
    assert_eq!(
        size(0),
        size(1) + size(4),
        "pool size is its vdevs' sum:\n{out}"
    );
    assert_eq!(rows[2][1], "-");
    assert!(rows.iter().all(|r| r[2] == "ONLINE"), "{out}");
    // -p: CAP is a bare number on vdev rows as on the pool's.
    let cap = e.ok(&["zpool", "list", "-v", "-H", "-p", "-o", "name,cap"]);
    let caps: Vec<&str> = cap.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    assert!(
        caps[..2]
            .iter()
            .chain(&caps[4..])
            .all(|c| c.parse::<u64>().is_ok()),
        "{cap}"
    );
    e.ok(&["zpool", "export", "tank"]);
}

/// `zpool import -D`: destroyed pools are listed only with -D and come
/// back whole with it.
#[test]
fn destroyed_pools_import_with_dash_d() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    let payload: Vec<u8> = (0..1_500_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(e.dir.path().join("data"), &payload).expect("data");
    let obj = e.ok(&["object", "put", "tank", "data"]).trim().to_string();
    e.ok(&["zpool", "destroy", "tank"]);
    e.fails(&["zpool", "import", "-d", ".", "tank"], 1, "no such pool");
    let listing = e.ok(&["zpool", "import", "-D", "-d", "."]);
    assert!(
        listing.contains("pool: tank") && listing.contains("destroyed"),
        "{listing}"
    );
    e.ok(&["zpool", "import", "-D", "-d", ".", "-N", "tank"]);
    assert!(e.ok(&["zpool", "status", "tank"]).contains("state: ONLINE"));
    e.ok(&["object", "get", "tank", &obj, "back"]);
    assert_eq!(
        std::fs::read(e.dir.path().join("back")).expect("back"),
        payload
    );
    e.ok(&["zpool", "export", "tank"]);
    // Active again: a plain import finds it.
    e.ok(&["zpool", "import", "-d", ".", "-N", "tank"]);
    e.export_and_zdb("tank");
}

/// `zfs create -n/-v/-P/-u`: a dry run says what would be created and
/// creates nothing; -v/-P say it for a real create; -u creates without
/// mounting.
#[test]
fn zfs_create_dry_run_verbose_and_unmounted() {
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    let names = || e.ok(&["zfs", "list", "-H", "-o", "name"]);
    let out = e.ok(&[
        "zfs",
        "create",
        "-n",
        "-v",
        "-p",
        "-o",
        "atime=off",
        "tank/a/b",
    ]);
    assert_eq!(
        out,
        "would create 'tank/a'\nwould create 'tank/a/b'\n\tatime=off\n"
    );
    let out = e.ok(&["zfs", "create", "-n", "-P", "-o", "atime=off", "tank/c"]);
    assert_eq!(out, "create\ttank/c\nproperty\tatime\toff\n");
    assert_eq!(e.ok(&["zfs", "create", "-n", "tank/c"]), "");
    assert_eq!(names(), "tank\n", "a dry run created something");
    // A dry run checks what the real one checks.
    e.fails(&["zfs", "create", "-n", "tank/x/y"], 1, "use -p");
    e.fails(
        &["zfs", "create", "-n", "-o", "atime=maybe", "tank/c"],
        1,
        "must be 'on' or 'off'",
    );
    // -v on a real create; -u leaves it unmounted.
    let out = e.ok(&["zfs", "create", "-v", "-u", "tank/c"]);
    assert_eq!(out, "create 'tank/c'\n");
    let m = e.ok(&["zfs", "get", "-H", "-o", "value", "mounted", "tank/c"]);
    assert_eq!(m.trim(), "no");
    e.fails(&["zfs", "create", "-n", "tank/c"], 1, "already exists");
    e.export_and_zdb("tank");
}

/// RAID-Z space as OpenZFS shows it: `zfs list` (and so `df`) charges a
/// dataset its data without parity (the vdev's deflate ratio), so a 20 MiB
/// file shows about 20M used on raidz1 and raidz2, while `zpool list`
/// counts the raw bytes, parity included. AVAIL is deflated the same way.
#[test]
fn raidz_space_in_zfs_list_is_deflated() {
    for (kind, width) in [("raidz1", 3usize), ("raidz2", 4)] {
        let e = Env::new();
        let d: Vec<String> = (0..width).map(|i| e.disk(&format!("r{i}"), 256)).collect();
        let mut args = vec!["zpool", "create", "-m", "none", "tank", kind];
        args.extend(d.iter().map(String::as_str));
        e.ok(&args);
        let blob = e.dir.path().join("blob");
        // Incompressible: compression must not hide the parity.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..20u32 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(&blob, &data).expect("blob");
        e.ok(&["object", "put", "tank", &blob.display().to_string()]);
        e.ok(&["zpool", "sync", "tank"]);
        let zfs: Vec<u64> = e
            .ok(&["zfs", "list", "-Hp", "-o", "used,avail", "tank"])
            .split_whitespace()
            .map(|v| v.parse().expect("number"))
            .collect();
        let zpool: Vec<u64> = e
            .ok(&["zpool", "list", "-Hp", "-o", "alloc,size", "tank"])
            .split_whitespace()
            .map(|v| v.parse().expect("number"))
            .collect();
        let (used, avail, alloc, size) = (zfs[0], zfs[1], zpool[0], zpool[1]);
        let mib = |v: u64| v as f64 / (1 << 20) as f64;
        assert!(
            (20 << 20..22 << 20).contains(&used),
            "{kind}: 20 MiB shows {:.1} MiB used",
            mib(used)
        );
        // Raw: the parity is there (1/3 of raidz1-3, 1/2 of raidz2-4).
        let parity = if kind == "raidz1" { 1.4 } else { 1.9 };
        assert!(
            alloc as f64 > used as f64 * parity,
            "{kind}: zpool list ALLOC {:.1} MiB vs used {:.1} MiB",
            mib(alloc),
            mib(used)
        );
        // AVAIL is in the same (deflated) units: below the deflated size.
        let data_frac = (width - kind[5..].parse::<usize>().expect("parity")) as f64 / width as f64;
        assert!(
            (avail + used) as f64 <= size as f64 * data_frac * 1.01
                && (avail + used) as f64 > size as f64 * data_frac * 0.85,
            "{kind}: used+avail {:.1} MiB of size {:.1} MiB",
            mib(avail + used),
            mib(size)
        );
        e.export_and_zdb("tank");
    }
}

/// Every settable pool property: each value zpoolprops(7) allows is taken
/// by `zpool set`, by `zpool create -o` and by `zpool import -o`, and
/// `zpool get` shows it; a bad value is refused and changes nothing (a
/// create with it makes no pool). Read-only properties refuse `set`;
/// unknown ones are refused everywhere. (value set, value shown)
/// (property, its good values as (set, shown), a bad value).
type PropCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

const POOL_PROPS: &[PropCase] = &[
    (
        "comment",
        &[("hello", "hello"), ("", "-")],
        "more-than-thirty-two-characters-long",
    ),
    ("multihost", &[("off", "off")], "maybe"),
    ("ashift", &[("9", "9"), ("16", "16"), ("0", "0")], "17"),
    ("autoexpand", &[("on", "on"), ("off", "off")], "yes"),
    ("autoreplace", &[("on", "on"), ("off", "off")], "1"),
    (
        "failmode",
        &[
            ("continue", "continue"),
            ("panic", "panic"),
            ("wait", "wait"),
        ],
        "sometimes",
    ),
    ("listsnapshots", &[("on", "on"), ("off", "off")], "true"),
    (
        "cachefile",
        &[("none", "none"), ("", "-")],
        "relative.cache",
    ),
];

const POOL_READONLY: &[&str] = &[
    "size",
    "capacity",
    "health",
    "guid",
    "version",
    "dedupratio",
    "free",
    "allocated",
    "readonly",
    "expandsize",
    "fragmentation",
    "checkpoint",
    "altroot",
];

#[test]
fn every_pool_property_works_or_is_refused() {
    let e = Env::new();
    let get = |k: &str, p: &str| {
        e.ok(&["zpool", "get", "-H", "-o", "value", k, p])
            .trim_end_matches('\n')
            .to_string()
    };
    for (i, (k, goods, bad)) in POOL_PROPS.iter().enumerate() {
        let name = format!("p{i}");
        let disk = e.disk(&format!("d{i}"), 96);
        let (v0, shown0) = goods[0];
        let kv = format!("{k}={v0}");
        e.ok(&["zpool", "create", "-m", "none", "-o", &kv, &name, &disk]);
        assert_eq!(get(k, &name), shown0, "create -o {kv}");
        for (v, shown) in goods.iter() {
            e.ok(&["zpool", "set", &format!("{k}={v}"), &name]);
            assert_eq!(get(k, &name), *shown, "set {k}={v}");
        }
        let before = get(k, &name);
        let badkv = format!("{k}={bad}");
        let o = e.run(&["zpool", "set", &badkv, &name]);
        assert_eq!(o.status.code(), Some(1), "set {badkv} was taken");
        assert_eq!(get(k, &name), before, "a refused set {badkv} changed it");
        let other = e.disk(&format!("x{i}"), 96);
        let o = e.run(&["zpool", "create", "-o", &badkv, "nopool", &other]);
        assert_eq!(o.status.code(), Some(1), "create -o {badkv} was taken");
        assert!(e
            .ok(&["zpool", "list", "-H", "-o", "name"])
            .lines()
            .all(|l| l != "nopool"));
        e.ok(&["zpool", "export", &name]);
        let (vl, shownl) = goods[goods.len() - 1];
        let kv = format!("{k}={vl}");
        e.ok(&["zpool", "import", "-d", ".", "-o", &kv, &name]);
        assert_eq!(get(k, &name), shownl, "import -o {kv}");
        e.ok(&["zpool", "export", &name]);
    }
    let disk = e.disk("ro", 96);
    e.ok(&["zpool", "create", "-m", "none", "tank", &disk]);
    for k in POOL_READONLY {
        let o = e.run(&["zpool", "set", &format!("{k}=1"), "tank"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "set {k}: {err}");
        assert!(
            err.contains("readonly") || err.contains("only be set"),
            "set {k}: {err}"
        );
        // And get knows it.
        e.ok(&["zpool", "get", k, "tank"]);
    }
    e.fails(
        &["zpool", "set", "bogus=1", "tank"],
        1,
        "not a valid pool property",
    );
    e.fails(
        &["zpool", "get", "bogus", "tank"],
        1,
        "invalid property 'bogus'",
    );
    e.fails(
        &["zpool", "list", "-o", "bogus"],
        1,
        "invalid property 'bogus'",
    );
    e.export_and_zdb("tank");
}

/// Every dataset property: each allowed value is taken by `zfs set` and
/// `zfs create -o` and shown by `zfs get`; a bad value is refused and
/// changes nothing; properties zfsprops(7) has that uzfs does not are
/// refused as "not supported yet", unknown ones as invalid.
const ZFS_PROPS: &[PropCase] = &[
    (
        "mountpoint",
        &[("none", "none"), ("legacy", "legacy")],
        "relative/path",
    ),
    (
        "canmount",
        &[("off", "off"), ("noauto", "noauto"), ("on", "on")],
        "sometimes",
    ),
    ("readonly", &[("on", "on"), ("off", "off")], "yes"),
    ("atime", &[("off", "off"), ("on", "on")], "2"),
    (
        "acltype",
        &[("posix", "posix"), ("posixacl", "posix"), ("off", "off")],
        "nfsv4",
    ),
    (
        "recordsize",
        &[("4K", "4K"), ("1M", "1M"), ("128K", "128K")],
        "3000",
    ),
    (
        "compression",
        &[
            ("lz4", "lz4"),
            ("zstd", "zstd"),
            ("off", "off"),
            ("on", "on"),
        ],
        "brotli",
    ),
    (
        "checksum",
        &[
            ("sha256", "sha256"),
            ("fletcher4", "fletcher4"),
            ("on", "on"),
        ],
        "md5",
    ),
    ("copies", &[("2", "2"), ("3", "3"), ("1", "1")], "4"),
    (
        "quota",
        &[("64M", "64M"), ("100000000", "95.4M"), ("none", "none")],
        "lots",
    ),
    ("reservation", &[("8M", "8M"), ("none", "none")], "-1"),
    (
        "sync",
        &[
            ("always", "always"),
            ("disabled", "disabled"),
            ("standard", "standard"),
        ],
        "on",
    ),
    (
        "logbias",
        &[("throughput", "throughput"), ("latency", "latency")],
        "fast",
    ),
];

#[test]
fn every_dataset_property_works_or_is_refused() {
    let e = Env::new();
    let disk = e.disk("a", 256);
    e.ok(&["zpool", "create", "-m", "none", "tank", &disk]);
    let get = |k: &str, ds: &str| {
        e.ok(&["zfs", "get", "-H", "-o", "value", k, ds])
            .trim_end_matches('\n')
            .to_string()
    };
    for (i, (k, goods, bad)) in ZFS_PROPS.iter().enumerate() {
        let ds = format!("tank/d{i}");
        let (v0, shown0) = goods[0];
        let kv = format!("{k}={v0}");
        e.ok(&["zfs", "create", "-o", &kv, &ds]);
        assert_eq!(get(k, &ds), shown0, "create -o {kv}");
        for (v, shown) in goods.iter() {
            e.ok(&["zfs", "set", &format!("{k}={v}"), &ds]);
            assert_eq!(get(k, &ds), *shown, "set {k}={v}");
        }
        let before = get(k, &ds);
        let badkv = format!("{k}={bad}");
        let o = e.run(&["zfs", "set", &badkv, &ds]);
        assert_ne!(o.status.code(), Some(0), "set {badkv} was taken");
        assert_eq!(get(k, &ds), before, "a refused set {badkv} changed it");
        let o = e.run(&["zfs", "create", "-o", &badkv, "tank/nods"]);
        assert_ne!(o.status.code(), Some(0), "create -o {badkv} was taken");
        let l = e.ok(&["zfs", "list", "-H", "-o", "name"]);
        assert!(!l.contains("tank/nods"), "{l}");
    }
    for k in ["sharenfs", "xattr", "volsize", "dedup"] {
        e.fails(
            &["zfs", "set", &format!("{k}=on"), "tank"],
            1,
            "not supported yet",
        );
        e.fails(&["zfs", "get", k, "tank"], 2, "not supported yet");
        let o = e.run(&["zfs", "create", "-o", &format!("{k}=on"), "tank/nods"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not supported yet"), "create -o {k}: {err}");
    }
    e.fails(&["zfs", "set", "bogus=1", "tank"], 1, "invalid property");
    e.fails(
        &["zfs", "get", "bogus", "tank"],
        2,
        "invalid property 'bogus'",
    );
    for c in ["allow", "share", "userspace", "load-key"] {
        e.fails(&["zfs", c, "tank"], 2, "not supported yet");
    }
    for c in ["trim", "checkpoint", "initialize", "split"] {
        e.fails(&["zpool", c, "tank"], 2, "not supported yet");
    }
    e.export_and_zdb("tank");
}

/// Display options of `zpool status`, `list` and `iostat`: `-g` names
/// vdevs by guid, `-L` resolves symbolic links, `-P` (full paths) is what
/// uzfs prints anyway, `-T u|d` puts a timestamp first, `status -e` shows
/// only unhealthy vdevs and the vdevs above them.
#[test]
fn status_list_and_iostat_display_options() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    let link = e.dir.path().join("link-to-b");
    std::os::unix::fs::symlink(&b, &link).expect("symlink");
    let link = link.display().to_string();
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &link]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains(&link), "{st}");
    let st = e.ok(&["zpool", "status", "-L", "tank"]);
    assert!(
        st.contains(&format!("{b} ")) && !st.contains(&link),
        "-L:\n{st}"
    );
    let lv = e.ok(&["zpool", "list", "-v", "-L", "-H", "-o", "name", "tank"]);
    assert!(lv.contains(&b) && !lv.contains(&link), "list -vL:\n{lv}");
    let io = e.ok(&["zpool", "iostat", "-v", "-L", "tank"]);
    assert!(io.contains(&b) && !io.contains(&link), "iostat -vL:\n{io}");
    let st = e.ok(&["zpool", "status", "-g", "tank"]);
    assert!(!st.contains(&a) && !st.contains("mirror-0"), "-g:\n{st}");
    let guid_rows = st
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.len() > 5 && w.bytes().all(|c| c.is_ascii_digit()))
        })
        .count();
    assert_eq!(
        guid_rows, 3,
        "-g: the mirror and its two devices by guid:\n{st}"
    );
    let lv = e.ok(&["zpool", "list", "-vgH", "-o", "name", "tank"]);
    assert!(
        !lv.contains(&a) && lv.lines().count() == 4,
        "list -vg:\n{lv}"
    );
    for args in [
        ["zpool", "status", "-P", "tank"],
        ["zpool", "list", "-vP", "tank"],
        ["zpool", "iostat", "-vP", "tank"],
    ] {
        assert!(e.ok(&args).contains(&a), "{args:?}");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    for cmd in [
        &["zpool", "status", "-T", "u", "tank"][..],
        &["zpool", "list", "-T", "u"],
        &["zpool", "iostat", "-T", "u"],
    ] {
        let out = e.ok(cmd);
        let first: u64 = out.lines().next().and_then(|l| l.parse().ok()).unwrap_or(0);
        assert!(first.abs_diff(now) < 60, "{cmd:?}: {out}");
    }
    let out = e.ok(&["zpool", "status", "-T", "d", "tank"]);
    let year = 1970 + now / 31_556_952;
    assert!(
        out.lines()
            .next()
            .is_some_and(|l| l.contains(&year.to_string())),
        "{out}"
    );
    e.fails(
        &["zpool", "status", "-T", "x", "tank"],
        2,
        "invalid timestamp format",
    );
    // -e: a healthy pool shows its pool row only; a device offline shows
    // it and the mirror above it, not the healthy side.
    let st = e.ok(&["zpool", "status", "-e", "tank"]);
    assert!(
        !st.contains("mirror-0") && !st.contains(&a),
        "-e healthy:\n{st}"
    );
    e.ok(&["zpool", "offline", "tank", &a]);
    let st = e.ok(&["zpool", "status", "-e", "tank"]);
    assert!(
        st.contains("mirror-0") && st.contains(&a) && !st.contains(&link),
        "-e degraded:\n{st}"
    );
    e.ok(&["zpool", "online", "tank", &a]);
    e.ok(&["zpool", "wait", "tank"]);
    e.export_and_zdb("tank");
}

/// `zpool offline -t` lasts until the pool is imported again (then the
/// device is back and resilvered); `-f` faults the device instead of
/// taking it offline, and that lasts until `zpool clear` (with `-t`: until
/// the next import).
#[test]
fn offline_temporary_and_fault() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    let state = |dev: &str| {
        let st = e.ok(&["zpool", "status", "tank"]);
        st.lines()
            .find(|l| l.split_whitespace().next() == Some(dev))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    let reimport = || {
        e.ok(&["zpool", "export", "tank"]);
        e.ok(&["zpool", "import", "-d", ".", "tank"]);
        e.ok(&["zpool", "wait", "tank"]);
    };
    e.ok(&["zpool", "offline", "-t", "tank", &b]);
    assert_eq!(state(&b), "OFFLINE");
    let blob = e.dir.path().join("blob");
    std::fs::write(&blob, vec![7u8; 3 << 20]).expect("blob");
    let obj = e.ok(&["object", "put", "tank", &blob.display().to_string()]);
    reimport();
    assert_eq!(state(&b), "ONLINE", "offline -t lasts for one import");
    e.ok(&["zpool", "offline", "-f", "tank", &b]);
    assert_eq!(state(&b), "FAULTED");
    reimport();
    assert_eq!(state(&b), "FAULTED", "offline -f persists");
    e.ok(&["zpool", "clear", "tank", &b]);
    e.ok(&["zpool", "wait", "tank"]);
    assert_eq!(state(&b), "ONLINE");
    e.ok(&["zpool", "offline", "-ft", "tank", &a]);
    assert_eq!(state(&a), "FAULTED");
    reimport();
    assert_eq!(state(&a), "ONLINE", "offline -ft lasts for one import");
    // b was resilvered: it alone serves the data.
    e.ok(&["zpool", "offline", "tank", &a]);
    let back = e.dir.path().join("back");
    e.ok(&[
        "object",
        "get",
        "tank",
        obj.trim(),
        &back.display().to_string(),
    ]);
    assert_eq!(std::fs::read(&back).expect("back"), vec![7u8; 3 << 20]);
    e.ok(&["zpool", "online", "tank", &a]);
    e.ok(&["zpool", "wait", "tank"]);
    e.export_and_zdb("tank");
}

/// `zpool status -s` adds a SLOW column (I/Os over 30 s: none here),
/// `-i`/`-t` say each device is uninitialized and without TRIM (uzfs has
/// neither), `-D` that there is no dedup table, `-p` prints the scan's
/// sizes exactly; `zpool iostat -n` prints its headers once; `zpool import
/// -m` (no log devices to miss) and `-s` (no blkid cache) import as usual.
#[test]
fn status_columns_and_notes_and_import_no_ops() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    let blob = e.dir.path().join("blob");
    std::fs::write(&blob, vec![3u8; 5_000_000]).expect("blob");
    e.ok(&["object", "put", "tank", &blob.display().to_string()]);
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = e.ok(&["zpool", "status", "-s", "tank"]);
    assert!(
        st.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["NAME", "STATE", "READ", "WRITE", "CKSUM", "SLOW"]),
        "{st}"
    );
    assert!(
        st.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == [a.as_str(), "ONLINE", "0", "0", "0", "0"]),
        "{st}"
    );
    let st = e.ok(&["zpool", "status", "-it", "tank"]);
    let leaf = st.lines().find(|l| l.contains(&a)).expect("leaf row");
    assert!(leaf.ends_with("(uninitialized) (trim unsupported)"), "{st}");
    assert!(e
        .ok(&["zpool", "status", "-D", "tank"])
        .contains("dedup: no DDT entries"));
    let human = e.ok(&["zpool", "status", "tank"]);
    let exact = e.ok(&["zpool", "status", "-p", "tank"]);
    let repaired = |s: &str| {
        s.lines()
            .find(|l| l.contains("scan: scrub repaired"))
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap_or("?")
            .to_string()
    };
    assert_eq!(repaired(&human), "0B", "{human}");
    assert_eq!(repaired(&exact), "0", "{exact}");
    let io = e.ok(&["zpool", "iostat", "-n", "tank", "0.2", "3"]);
    assert_eq!(io.matches("capacity").count(), 1, "-n:\n{io}");
    assert_eq!(
        io.lines().filter(|l| l.starts_with("tank")).count(),
        3,
        "{io}"
    );
    let io = e.ok(&["zpool", "iostat", "tank", "0.2", "2"]);
    assert_eq!(io.matches("capacity").count(), 2, "without -n:\n{io}");
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-m", "-s", "-d", ".", "tank"]);
    e.export_and_zdb("tank");
}

/// `zfs list -j` / `zfs get -j` (`--json`, `--json-int`): OpenZFS's JSON
/// document, each dataset with its properties' values and sources.
#[test]
fn zfs_list_and_get_json() {
    let e = Env::new();
    let a = e.disk("a", 96);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    e.ok(&["zfs", "create", "tank/fs"]);
    e.ok(&["zfs", "set", "atime=off", "tank"]);
    let parse = |s: String| -> serde_json::Value { serde_json::from_str(&s).expect("JSON") };
    let l = parse(e.ok(&["zfs", "list", "-j"]));
    assert_eq!(l["output_version"]["command"], "zfs list");
    assert_eq!(l["datasets"]["tank/fs"]["pool"], "tank");
    assert_eq!(l["datasets"]["tank/fs"]["type"], "FILESYSTEM");
    assert!(l["datasets"]["tank"]["properties"]["used"]["value"].is_string());
    let l = parse(e.ok(&[
        "zfs",
        "list",
        "--json",
        "--json-int",
        "-o",
        "name,used",
        "tank",
    ]));
    let used = &l["datasets"]["tank"]["properties"]["used"];
    assert!(used["value"].as_u64().is_some_and(|v| v > 0), "{l}");
    assert_eq!(used["source"]["type"], "NONE");
    let g = parse(e.ok(&["zfs", "get", "-j", "atime,compression", "tank/fs"]));
    let atime = &g["datasets"]["tank/fs"]["properties"]["atime"];
    assert_eq!(atime["value"], "off");
    assert_eq!(atime["source"]["type"], "INHERITED");
    assert_eq!(atime["source"]["data"], "tank");
    let g = parse(e.ok(&["zfs", "get", "-j", "-s", "local", "all", "tank"]));
    let props = g["datasets"]["tank"]["properties"]
        .as_object()
        .expect("props");
    assert!(props.contains_key("atime") && props.values().all(|p| p["source"]["type"] == "LOCAL"));
    e.export_and_zdb("tank");
}

/// `-o` everywhere else: `zpool get -o` and `zfs get -o` take only their
/// fields; `zpool attach/replace -o ashift=N` takes a sector size no larger
/// than the vdev's (its leaves share it) and no other property.
#[test]
fn get_fields_and_attach_ashift() {
    let e = Env::new();
    let (a, b, c) = (e.disk("a", 96), e.disk("b", 96), e.disk("c", 96));
    e.ok(&[
        "zpool",
        "create",
        "-m",
        "none",
        "-o",
        "ashift=12",
        "tank",
        &a,
    ]);
    e.fails(
        &["zpool", "get", "-o", "name,bogus", "size", "tank"],
        2,
        "invalid field 'bogus'",
    );
    e.fails(
        &["zfs", "get", "-o", "bogus", "used", "tank"],
        2,
        "invalid field 'bogus'",
    );
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "property,received",
            "atime",
            "tank"
        ]),
        "atime\t-\n"
    );
    e.fails(
        &["zpool", "attach", "-o", "ashift=13", "tank", &a, &b],
        1,
        "larger sectors",
    );
    e.fails(
        &["zpool", "attach", "-o", "copies=2", "tank", &a, &b],
        1,
        "only ashift",
    );
    e.fails(
        &["zpool", "attach", "-o", "ashift=8", "tank", &a, &b],
        1,
        "invalid ashift",
    );
    e.ok(&["zpool", "attach", "-w", "-o", "ashift=9", "tank", &a, &b]);
    e.ok(&["zpool", "replace", "-w", "-o", "ashift=12", "tank", &b, &c]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains(&c) && !st.contains(&format!("{b} ")), "{st}");
    e.export_and_zdb("tank");
}

/// OpenZFS's option letters per subcommand (zpool(8), zfs(8), 2.3 man
/// pages). Every one must be accepted (and listed in ACCEPTED, with the
/// tests that show its effect) or refused as not supported yet (and listed
/// in REFUSED); every other letter is an invalid option.
const OPENZFS: &[(&str, &str)] = &[
    ("zpool create", "dfmnoORt"),
    ("zpool add", "fgLnoP"),
    ("zpool list", "gHjLopPTv"),
    ("zpool iostat", "cgHlLnpPqrTvwy"),
    ("zpool status", "cDegijLpPstTvx"),
    ("zpool import", "acDdfFlmNnoRstTX"),
    ("zpool export", "af"),
    ("zpool destroy", "f"),
    ("zpool get", "Hjop"),
    ("zpool set", ""),
    ("zpool history", "il"),
    ("zpool sync", ""),
    ("zpool labelclear", "f"),
    ("zpool scrub", "epsw"),
    ("zpool offline", "ft"),
    ("zpool online", "e"),
    ("zpool clear", "Fn"),
    ("zpool attach", "fosw"),
    ("zpool detach", ""),
    ("zpool replace", "fosw"),
    ("zpool remove", "npsw"),
    ("zpool wait", "HpTt"),
    ("zpool upgrade", "avV"),
    ("zfs create", "bnoPpsuvV"),
    ("zfs destroy", "dfnpRrv"),
    ("zfs list", "dHjopSstr"),
    ("zfs get", "dHjoprst"),
    ("zfs set", "u"),
    ("zfs inherit", "rS"),
    ("zfs mount", "afloOv"),
    ("zfs unmount", "afu"),
    ("zfs rename", "fpru"),
    ("zfs snapshot", "or"),
    ("zfs rollback", "fRr"),
    ("zfs clone", "op"),
    ("zfs promote", ""),
    ("zfs hold", "r"),
    ("zfs holds", "Hpr"),
    ("zfs release", "r"),
    ("zfs diff", "FHt"),
];

/// The options uzfs does, and the tests that show each one's effect.
const ACCEPTED: &[(&str, &str, &str)] = &[
    ("zpool create", "fmnoOR", "cli.rs, options.rs (dry_runs, every_pool_property, disks_of_live_pools), fs.rs"),
    ("zpool add", "fnoP", "options.rs (dry_runs, disks_of_live_pools), cli.rs"),
    ("zpool list", "gHLopPTv", "options.rs (zpool_list_verbose, status_list_and_iostat_display_options), pool_props.rs"),
    ("zpool iostat", "HlLnpPqTvwy", "redundancy_cli.rs (iostat), options.rs (status_list_and_iostat_display_options, status_columns_and_notes)"),
    ("zpool status", "DegiLpPstTvx", "options.rs (status_list_and_iostat_display_options, status_columns_and_notes), redundancy_cli.rs"),
    ("zpool import", "acDdfmNoRs", "options.rs (readonly_import, destroyed_pools_import, dry_runs -N, status_columns -m -s), pool_props.rs (-c, -o), cli.rs"),
    ("zpool export", "af", "options.rs (zpool_export_all), cli.rs"),
    ("zpool destroy", "f", "cli.rs"),
    ("zpool get", "Hop", "options.rs (every_pool_property, get_fields), cli.rs"),
    ("zpool history", "i", "options.rs (history_internal_events), redundancy_cli.rs"),
    ("zpool labelclear", "f", "options.rs (disks_of_live_pools)"),
    ("zpool scrub", "psw", "redundancy_cli.rs, core tests/scan.rs"),
    ("zpool offline", "ft", "options.rs (offline_temporary_and_fault)"),
    ("zpool online", "e", "pool_props.rs (online_e_grows_a_mirror)"),
    ("zpool attach", "fosw", "redundancy_cli.rs, options.rs (get_fields_and_attach_ashift)"),
    ("zpool replace", "fosw", "redundancy_cli.rs, pool_props.rs, options.rs (get_fields_and_attach_ashift)"),
    ("zpool wait", "Ht", "redundancy_cli.rs"),
    ("zpool upgrade", "av", "cli.rs"),
    ("zfs create", "nopPuv", "options.rs (zfs_create_dry_run_verbose_and_unmounted, every_dataset_property), fs.rs"),
    ("zfs destroy", "dfnpRrv", "options.rs (dry_runs), fs.rs, snapshots.rs (holds_renames_and_ranges, clones)"),
    ("zfs list", "dHjopSstr", "options.rs (zfs_list_and_get_depth_sort_and_source, zfs_list_and_get_json)"),
    ("zfs get", "dHjoprst", "options.rs (zfs_list_and_get_depth_sort_and_source, zfs_list_and_get_json, get_fields)"),
    ("zfs set", "u", "fs.rs (zfs_set_u_leaves_mounts_as_they_are)"),
    ("zfs inherit", "r", "fs.rs"),
    ("zfs mount", "aoOv", "options.rs (zfs_mount_ro_and_rw_are_temporary), fs.rs"),
    ("zfs unmount", "afu", "fs.rs"),
    ("zfs rename", "fp", "fs.rs"),
    ("zfs snapshot", "or", "snapshots.rs (user_properties), core tests/snapshot.rs"),
    ("zfs rollback", "fRr", "snapshots.rs (rollback_through_the_command_line, clones)"),
    ("zfs clone", "op", "snapshots.rs (clones_through_the_command_line)"),
    ("zfs promote", "", "snapshots.rs (promote_through_the_command_line)"),
    ("zfs hold", "r", "snapshots.rs (holds_renames_and_ranges)"),
    ("zfs holds", "Hpr", "snapshots.rs (holds_renames_and_ranges)"),
    ("zfs release", "r", "snapshots.rs (holds_renames_and_ranges)"),
    ("zfs diff", "FHt", "snapshots.rs (diff_through_the_command_line), core tests/snapshot.rs"),
];

/// Every letter of every subcommand, run: OpenZFS's options are accepted
/// (ACCEPTED) or refused with "option not supported yet" and exit 2
/// (REFUSED); any other letter is "invalid option", exit 2. Nothing is
/// left to be silently ignored, and a new option cannot slip in untested.
#[test]
fn every_option_of_every_subcommand_is_accepted_or_refused() {
    let e = Env::new();
    let empty = e.dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let empty = empty.display().to_string();
    let refused: Vec<(String, char)> = REFUSED
        .iter()
        .map(|(line, opt)| {
            let w: Vec<&str> = line.split(' ').collect();
            (
                format!("{} {}", w[0], w[1]),
                opt.chars().nth(1).unwrap_or('?'),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for (cmd, theirs) in OPENZFS {
        let accepted = ACCEPTED
            .iter()
            .find(|(c, _, _)| c == cmd)
            .map_or("", |a| a.1);
        for l in ('a'..='z').chain('A'..='Z') {
            let mut args: Vec<String> = cmd.split(' ').map(String::from).collect();
            if *cmd == "zpool import" {
                // Never scan /dev: only an empty directory.
                args.extend(["-d".to_string(), empty.clone()]);
            }
            args.push(format!("-{l}"));
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = e.run(&argv);
            let stderr = String::from_utf8_lossy(&o.stderr).to_string();
            let invalid = stderr.contains(&format!("invalid option '{l}'"));
            let not_yet = stderr.contains(&format!("option not supported yet: -{l}"));
            let is_refused = refused.iter().any(|(c, r)| c == cmd && *r == l);
            let is_accepted = accepted.contains(l);
            let ok = if theirs.contains(l) {
                if not_yet {
                    o.status.code() == Some(2) && is_refused && !is_accepted
                } else {
                    !invalid && is_accepted && !is_refused
                }
            } else {
                invalid && o.status.code() == Some(2)
            };
            if !ok {
                problems.push(format!(
                    "{cmd} -{l}: exit {:?}, listed accepted={is_accepted} refused={is_refused}: {}",
                    o.status.code(),
                    stderr.lines().next().unwrap_or("")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `zpool export -a` exports every imported pool.
#[test]
fn zpool_export_all() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "one", &a]);
    e.ok(&["zpool", "create", "-m", "none", "two", &b]);
    e.fails(
        &["zpool", "export", "-a", "one"],
        2,
        "cannot be used together",
    );
    e.ok(&["zpool", "export", "-a"]);
    assert!(e.ok(&["zpool", "list"]).contains("no pools available"));
    e.fails(&["zpool", "destroy", "-a"], 2, "invalid option 'a'");
    let found = e.ok(&["zpool", "import", "-d", "."]);
    assert!(
        found.contains("pool: one") && found.contains("pool: two"),
        "{found}"
    );
}

/// `zpool history` lists the commands; `-i` adds the pool's own events
/// (device changes, scans), as OpenZFS's internal events.
#[test]
fn history_internal_events() {
    let e = Env::new();
    let (a, b) = (e.disk("a", 96), e.disk("b", 96));
    e.ok(&["zpool", "create", "-m", "none", "tank", "mirror", &a, &b]);
    e.ok(&["zpool", "offline", "tank", &b]);
    e.ok(&["zpool", "online", "tank", &b]);
    e.ok(&["zpool", "wait", "tank"]);
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let plain = e.ok(&["zpool", "history", "tank"]);
    assert!(
        plain.contains(&format!("zpool offline tank {b}")),
        "{plain}"
    );
    assert!(
        plain.contains("zpool scrub -w tank") && !plain.contains("[internal]"),
        "{plain}"
    );
    let all = e.ok(&["zpool", "history", "-i", "tank"]);
    assert!(all.contains(&format!("[internal] offline {b}")), "{all}");
    assert!(all.contains("[internal] scrub started"), "{all}");
    assert!(all.contains(&format!("zpool offline tank {b}")), "{all}");
    e.export_and_zdb("tank");
}
