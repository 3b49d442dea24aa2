//! Fail-stop: an operation that breaks off half done under a txg hold (a
//! panic, a broken invariant) poisons the open txg. The pool suspends
//! before anything more is committed: the half change never reaches the
//! disk, reads continue, changes get EIO, the reason is reported.

mod common;
use common::*;
use uzfs_core::spa::config::FailMode;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;
use uzfs_core::zdb;

#[test]
fn a_panic_under_a_hold_suspends_the_pool_before_the_half_change_commits() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let pool = Pool::create("fs", vec![spec(TopKind::Disk, &disks)], opts(5)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = std::sync::Arc::new(mount_fs(&pool, "fs"));
    let f = fs
        .mknod(fs.root, b"f", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("create");
    fs.write(f.ino, 0, b"committed").expect("write");
    let committed = pool.sync().expect("sync");

    // Half an operation: the first of its changes, then a panic.
    let fs2 = fs.clone();
    let r = std::thread::spawn(move || {
        let _tx = fs2.os.tx();
        fs2.os.write(f.ino, 0, b"half-done").expect("write");
        panic!("invariant broken in the middle of an operation");
    })
    .join();
    assert!(r.is_err());

    let why = pool.suspended().expect("the pool is suspended");
    assert!(why.contains("panicked"), "{why}");
    assert!(pool.sync().is_err(), "a poisoned txg was committed");
    assert_eq!(pool.last_txg(), committed);
    // Changes are refused with EIO; reads continue.
    assert_eq!(
        fs.mknod(fs.root, b"g", libc::S_IFREG | 0o644, 0, 0, 0, None)
            .err(),
        Some(libc::EIO)
    );
    assert_eq!(fs.write(f.ino, 0, b"x").err(), Some(libc::EIO));
    assert_eq!(fs.fsync(f.ino).err(), Some(libc::EIO));
    assert!(fs.lookup(fs.root, b"f").is_ok());

    // What is on disk is the last committed txg, without the half change.
    let (d2, found) = find(&SimWorld::new(), images(&disks));
    let p2 = Pool::import(&found, None, tunables()).expect("import");
    assert_eq!(p2.last_txg(), committed);
    let fs3 = mount_fs(&p2, "fs");
    let a = fs3.lookup(fs3.root, b"f").expect("f");
    assert_eq!(fs3.read(a.ino, 0, 9).expect("read"), b"committed");
    drop(fs3);
    p2.close().expect("close");
    let r = zdb::verify(devs(&d2)).expect("zdb");
    assert!(r.is_clean(), "{}", zdb::format_report(&r));
}

/// A pool whose disks stop taking writes (`failmode=continue`): the sync
/// thread parks on the failed write and the pool suspends (fsync and
/// changes get EIO, reads go on). `zpool clear` while the disks still fail suspends it again; once
/// they are back it resumes the parked sync, and everything acknowledged
/// before, and the fsync'd files, are on disk after export and import.
/// Cases: a single disk; a mirror losing both sides at once; a mirror
/// losing one side first (its writes absorbed, then resilvered) and the
/// other later.
#[test]
fn zpool_clear_resumes_a_sync_parked_on_a_failed_write() {
    for case in ["disk", "mirror", "mirror-staggered"] {
        resume_case(case);
    }
}

fn resume_case(case: &str) {
    let world = SimWorld::new();
    let n = if case == "disk" { 1 } else { 2 };
    let disks: Vec<_> = (0..n).map(|i| world.disk(&format!("d{i}"), DISK)).collect();
    let kind = if n == 1 {
        TopKind::Disk
    } else {
        TopKind::Mirror
    };
    let mut o = opts(6);
    o.tunables.sync_thread = true;
    let pool = Pool::create("fs", vec![spec(kind, &disks)], o).expect("create");
    pool.set_failmode(FailMode::Continue).expect("failmode");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = mount_fs(&pool, "fs");
    let mk = |name: &[u8]| {
        fs.mknod(fs.root, name, libc::S_IFREG | 0o644, 0, 0, 0, None)
            .map(|a| a.ino)
    };
    let a = mk(b"a").expect("create a");
    fs.write(a, 0, &pattern(1, 200_000)).expect("write a");
    fs.fsync(a).expect("fsync a");
    if case == "mirror-staggered" {
        disks[0].fail_writes(true);
        let s = mk(b"s").expect("create s");
        fs.write(s, 0, &pattern(3, 100_000)).expect("write s");
        fs.fsync(s).expect("fsync s on one side");
    }
    for d in &disks {
        d.fail_writes(true);
    }
    let b = mk(b"b").expect("create b");
    fs.write(b, 0, &pattern(2, 300_000)).expect("write b");
    assert_eq!(fs.fsync(b).err(), Some(libc::EIO), "{case}");
    let why = pool.suspended().expect("suspended");
    assert!(why.contains("failed"), "{case}: {why}");
    assert!(pool.io.suspension.parked(), "{case}");
    assert_eq!(mk(b"c").err(), Some(libc::EIO), "{case}");
    assert_eq!(fs.read(a, 0, 10).expect("read"), pattern(1, 200_000)[..10]);

    // The disks still fail: the retry fails, the pool suspends again.
    let e = pool.clear(None).expect_err("the disks still fail");
    assert!(e.to_string().contains("suspended"), "{case}: {e}");
    assert!(pool.io.suspension.parked(), "{case}");

    for d in &disks {
        d.fail_writes(false);
    }
    pool.clear(None).expect("clear resumes");
    assert_eq!(pool.suspended(), None, "{case}");
    fs.fsync(b).expect("fsync b after the resume");
    let c = mk(b"c").expect("create c");
    fs.write(c, 0, b"after").expect("write c");
    fs.fsync(c).expect("fsync c");
    // A side that missed writes is resilvered from the other.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pool
        .io
        .tops()
        .iter()
        .flat_map(|t| t.leaves())
        .any(|l| !l.dtl().is_empty())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{case}: resilver never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(fs);
    pool.close().expect("close");

    let p2 = reimport(&SimWorld::new(), images(&disks)).expect("import");
    let fs = mount_fs(&p2, "fs");
    let mut want = vec![
        (&b"a"[..], pattern(1, 200_000)),
        (b"b", pattern(2, 300_000)),
        (b"c", b"after".to_vec()),
    ];
    if case == "mirror-staggered" {
        want.push((b"s", pattern(3, 100_000)));
    }
    for (name, want) in want {
        let at = fs.lookup(fs.root, name).expect("lookup");
        assert_eq!(
            fs.read(at.ino, 0, want.len()).expect("read"),
            want,
            "{case}"
        );
    }
    drop(fs);
    p2.close().expect("close");
    assert_zdb_clean(&disks, case);
}

/// Export while the sync is parked: it gives up, an fsync waiting for the
/// pool (`failmode=wait`) gets EIO, and the pool imports at its last
/// committed txg, consistent.
#[test]
fn export_of_a_parked_pool_gives_up_the_stuck_txg() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let mut o = opts(7);
    o.tunables.sync_thread = true;
    let pool = Pool::create("fs", vec![spec(TopKind::Disk, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = std::sync::Arc::new(mount_fs(&pool, "fs"));
    let a = fs
        .mknod(fs.root, b"a", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("a")
        .ino;
    fs.write(a, 0, b"kept").expect("write");
    fs.fsync(a).expect("fsync");
    disks[0].fail_writes(true);
    let b = fs
        .mknod(fs.root, b"b", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("b")
        .ino;
    let fsync = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(b))
    };
    wait_parked(&pool);
    // DSL and vdev changes are refused, not stuck behind the parked sync.
    let root = pool.dsl_pool().dataset("fs").expect("root dataset");
    assert!(pool.dsl_pool().set_prop(&root, "atime", "off").is_err());
    pool.close().expect("close gives up");
    assert_eq!(fsync.join().expect("join"), Err(libc::EIO));
    drop(fs);
    disks[0].fail_writes(false);
    let p2 = reimport(&SimWorld::new(), images(&disks)).expect("import");
    let fs = mount_fs(&p2, "fs");
    assert!(fs.lookup(fs.root, b"a").is_ok());
    assert_eq!(fs.lookup(fs.root, b"b").err(), Some(libc::ENOENT));
    drop(fs);
    p2.close().expect("close");
    assert_zdb_clean(&disks, "after export of a parked pool");
}

/// `failmode=wait` (the default): while the sync is parked on a failed
/// write, an fsync and a new change wait (neither fails nor returns);
/// `zpool clear` once the disk is back lets both finish, and what they
/// wrote is on disk after export and import. Export instead of clear
/// would end the wait with EIO.
#[test]
fn failmode_wait_holds_writers_until_zpool_clear() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let mut o = opts(7);
    o.tunables.sync_thread = true;
    let pool = Pool::create("fs", vec![spec(TopKind::Disk, &disks)], o).expect("create");
    assert_eq!(pool.props().failmode, FailMode::Wait);
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = std::sync::Arc::new(mount_fs(&pool, "fs"));
    let a = fs
        .mknod(fs.root, b"a", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("create a")
        .ino;
    fs.fsync(a).expect("fsync a");
    disks[0].fail_writes(true);
    fs.write(a, 0, &pattern(4, 100_000)).expect("write a");
    let fsync = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(a))
    };
    wait_parked(&pool);
    let create = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            fs.mknod(fs.root, b"b", libc::S_IFREG | 0o644, 0, 0, 0, None)
                .map(|x| x.ino)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(!fsync.is_finished(), "fsync returned on a suspended pool");
    assert!(
        !create.is_finished(),
        "a change returned on a suspended pool"
    );
    // Reads go on meanwhile.
    assert!(fs.lookup(fs.root, b"a").is_ok());

    disks[0].fail_writes(false);
    pool.clear(None).expect("clear resumes");
    fsync.join().expect("join").expect("fsync after the resume");
    let b = create
        .join()
        .expect("join")
        .expect("create after the resume");
    fs.write(b, 0, b"after").expect("write b");
    fs.fsync(b).expect("fsync b");
    drop(fs);
    pool.close().expect("close");

    let p2 = reimport(&SimWorld::new(), images(&disks)).expect("import");
    let fs = mount_fs(&p2, "fs");
    let at = fs.lookup(fs.root, b"a").expect("a");
    assert_eq!(
        fs.read(at.ino, 0, 100_000).expect("read"),
        pattern(4, 100_000)
    );
    let bt = fs.lookup(fs.root, b"b").expect("b");
    assert_eq!(fs.read(bt.ino, 0, 5).expect("read"), b"after");
    drop(fs);
    p2.close().expect("close");
    assert_zdb_clean(&disks, "wait");
}

fn wait_parked(pool: &Pool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !pool.io.suspension.parked() {
        assert!(std::time::Instant::now() < deadline, "never suspended");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
