//! Create a pool, write objects over several txgs, re-import from the device
//! images, read everything back.

mod common;
use common::*;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::{BlockDevice, TopKind};
use uzfs_core::zdb;

#[test]
fn write_sync_reimport_read() {
    let w = SimWorld::new();
    let disks = [w.disk("a", DISK), w.disk("b", DISK)];
    let pool = uzfs_core::spa::Pool::create("tank", vec![spec(TopKind::Mirror, &disks)], opts(1))
        .expect("create");
    let props = ObjProps::default();
    let mut objs = Vec::new();
    for i in 0..5u64 {
        let o = pool.create_object(16384, &props).expect("create object");
        let data = pattern(i, 100_000 + i as usize * 7777);
        pool.write(o, 3, &data).expect("write");
        objs.push((o, data));
        pool.sync().expect("sync");
    }
    // A large sparse object forces a multi-level tree.
    let big = pool.create_object(4096, &props).expect("create");
    pool.write(big, 50 << 20, b"far away").expect("write far");
    pool.sync().expect("sync");
    pool.close().expect("close");
    let report = zdb::verify(devs(&disks)).expect("zdb");
    eprintln!("{}", zdb::format_report(&report));
    assert!(report.is_clean(), "zdb: {report:?}");
    assert!(report.blocks > 50 && report.allocated_bytes > 500_000);

    let w2 = SimWorld::new();
    let pool =
        reimport(&w2, disks.iter().map(|d| (d.name(), d.image())).collect()).expect("import");
    for (o, data) in &objs {
        let mut buf = vec![0u8; data.len()];
        pool.read(*o, 3, &mut buf).expect("read");
        assert!(buf == *data, "object {o} differs");
        assert_eq!(pool.object_size(*o).expect("size"), 3 + data.len() as u64);
    }
    let mut b = [0u8; 8];
    pool.read(big, 50 << 20, &mut b).expect("read far");
    assert_eq!(&b, b"far away");
}

/// Blocks a sync wrote stay in the block cache, as OpenZFS's ARC keeps a
/// written buffer: patching every record of a file in the next txg (the
/// read-modify-write of small random writes) reads nothing from the devices,
/// and what it reads is the new data.
#[test]
fn written_blocks_are_cached_for_the_next_txg() {
    let w = SimWorld::new();
    let disks = [w.disk("a", DISK), w.disk("b", DISK)];
    let pool = uzfs_core::spa::Pool::create("tank", vec![spec(TopKind::Mirror, &disks)], opts(7))
        .expect("create");
    let rec = 128 << 10;
    let o = pool
        .create_object(rec as u32, &ObjProps::default())
        .expect("create object");
    let mut data = pattern(3, 16 * rec); // half the tests' 4 MiB cache
    pool.write(o, 0, &data).expect("write");
    pool.sync().expect("sync");
    let (_, _, misses) = pool.io.cache.stats();
    for i in 0..16 {
        let at = i * rec + 1000 + i;
        pool.write(o, at as u64, b"patch").expect("patch");
        data[at..at + 5].copy_from_slice(b"patch");
    }
    assert_eq!(
        pool.io.cache.stats().2,
        misses,
        "the patches read their records from the devices"
    );
    pool.sync().expect("sync");
    let mut buf = vec![0u8; data.len()];
    pool.read(o, 0, &mut buf).expect("read");
    assert!(buf == data, "contents differ after the patches");
    pool.close().expect("close");
    let report = zdb::verify(devs(&disks)).expect("zdb");
    assert!(report.is_clean(), "zdb: {report:?}");
    // And from the devices alone.
    let pool = reimport(&SimWorld::new(), images(&disks)).expect("import");
    pool.read(o, 0, &mut buf).expect("read after import");
    assert!(buf == data, "contents differ after import");
}
