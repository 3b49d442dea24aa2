//! Multihost protection (`spa/mmp.rs`): an import refuses a pool another
//! host is writing, and takes one whose writer is gone.
//!
//! Two hosts are two `Pool` instances with different host ids on the same
//! simulated disks (which, like a shared LUN, no lock protects).

mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::import::discover;
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;

fn host(id: u64) -> Tunables {
    Tunables {
        sync_thread: true,
        txg_timeout: Duration::from_millis(200),
        hostid: id,
        mmp_interval: Duration::from_millis(50),
        // A generous watch (1 s) so a loaded CI machine cannot starve
        // the stamping thread past it.
        mmp_import_intervals: 20,
        ..tunables()
    }
}

fn wait_for_stamps(p: &Pool, n: u64) {
    for _ in 0..400 {
        if p.mmp_stamps_written() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("only {} stamps written", p.mmp_stamps_written());
}

#[test]
fn a_pool_another_host_is_writing_is_refused_and_a_dead_hosts_is_taken() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK), world.disk("d1", DISK)];
    let mut o = opts(1);
    o.tunables = host(0xa);
    let a = Pool::create("shared", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    a.set_multihost(true).expect("multihost=on");
    let obj = a.create_object(131072, &ObjProps::default()).expect("obj");
    let data = pattern(1, 300_000);
    a.write(obj, 0, &data).expect("write");
    a.sync().expect("sync");
    wait_for_stamps(&a, 3);

    // Host B, while A runs: refused, naming A.
    let found = discover(devs(&disks)).remove(0);
    let e = match Pool::import(&found, None, host(0xb)) {
        Ok(_) => panic!("imported a pool host A is writing"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("imported on another host") && e.contains("0000000a"),
        "{e}"
    );
    // A never noticed.
    a.write(obj, 0, b"still mine")
        .expect("write after the refused import");
    a.sync().expect("sync after the refused import");
    assert!(a.suspended().is_none());

    // Host A loses power: its stamps stop. B watches, sees nothing move,
    // and takes the pool, with everything A committed.
    wait_for_stamps(&a, a.mmp_stamps_written() + 2);
    let images = world.crash(&mut SimRng::new(1));
    drop(a);
    let w2 = SimWorld::new();
    let (disks2, found) = find(&w2, images);
    let b = Pool::import(&found, None, host(0xb)).expect("import of a dead host's pool");
    let mut buf = vec![0u8; data.len()];
    b.read(obj, 0, &mut buf).expect("read");
    assert_eq!(&buf[..10], b"still mine");
    assert!(buf[10..] == data[10..]);
    // B stamps now (multihost stays on): A coming back is refused.
    wait_for_stamps(&b, 3);
    let found = discover(devs(&disks2)).remove(0);
    let e = match Pool::import(&found, None, host(0xa)) {
        Ok(_) => panic!("host A took the pool back from B"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("0000000b"), "{e}");

    // Exported cleanly: imported at once, by anyone.
    b.close().expect("export");
    let found = discover(devs(&disks2)).remove(0);
    let a = Pool::import(&found, None, host(0xa)).expect("import after export");
    a.read(obj, 0, &mut buf).expect("read");
    a.close().expect("close");
    assert_zdb_clean(&disks2, "after the hand-overs");
}

#[test]
fn multihost_needs_a_host_id_and_stamps_nothing_when_off() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let mut o = opts(2);
    o.tunables = host(0);
    let p = Pool::create("nohost", vec![spec(TopKind::Disk, &disks)], o).expect("create");
    let e = p
        .set_multihost(true)
        .expect_err("multihost without a host id");
    assert!(e.to_string().contains("hostid"), "{e}");
    p.close().expect("close");

    // multihost=off: no stamps, and a pool left imported by another host
    // is taken without watching (the CLI asks for -f, as OpenZFS does).
    let mut o = opts(3);
    o.tunables = host(0xa);
    let disks = vec![world.disk("d1", DISK)];
    let p = Pool::create("off", vec![spec(TopKind::Disk, &disks)], o).expect("create");
    p.sync().expect("sync");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(p.mmp_stamps_written(), 0);
    let found = discover(devs(&disks)).remove(0);
    assert_eq!(found.config.hostid, 0xa);
    let images = world.crash(&mut SimRng::new(2));
    drop(p);
    let w2 = SimWorld::new();
    let (_d, found) = find(&w2, images.into_iter().filter(|(n, _)| n == "d1").collect());
    let p: Arc<Pool> = Pool::import(&found, None, host(0xb)).expect("import");
    p.close().expect("close");
}
