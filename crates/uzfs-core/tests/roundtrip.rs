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
