//! Fail-stop: an operation that breaks off half done under a txg hold (a
//! panic, a broken invariant) poisons the open txg. The pool suspends
//! before anything more is committed: the half change never reaches the
//! disk, reads continue, changes get EIO, the reason is reported.

mod common;
use common::*;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;
use uzfs_core::zdb;

#[test]
fn a_panic_under_a_hold_suspends_the_pool_before_the_half_change_commits() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let pool = Pool::create("fs", vec![spec(TopKind::Disk, &disks)], opts(5)).expect("create");
    pool.format_root_fs().expect("format");
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
