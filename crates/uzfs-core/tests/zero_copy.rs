//! A sync writes a mirror's whole data blocks straight from their record
//! buffers (page-aligned by the engine's allocator, `alloc.rs`), with no
//! staging copy, and what it wrote reads back after an import. One test in
//! this binary: the staging counter is process-wide.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::Compression;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;
use uzfs_core::vdev::STAGED_BYTES;

/// Write `data` as a new object of 128 KiB records with `compress`, sync,
/// and return the object and the bytes the sync staged.
fn write_and_sync(pool: &Pool, compress: Compression, data: &[u8]) -> (u64, u64) {
    let props = ObjProps {
        checksum: ChecksumType::Fletcher4,
        compress,
        copies: 1,
    };
    let o = pool.create_object(128 << 10, &props).expect("object");
    pool.write(o, 0, data).expect("write");
    let before = STAGED_BYTES.load(Ordering::Relaxed);
    pool.sync().expect("sync");
    (o, STAGED_BYTES.load(Ordering::Relaxed) - before)
}

#[test]
fn whole_records_are_written_from_their_buffers() {
    let w = SimWorld::new();
    let disks = [w.disk("a", DISK), w.disk("b", DISK)];
    let pool = Pool::create("tank", vec![spec(TopKind::Mirror, &disks)], opts(3)).expect("create");
    const LEN: usize = 16 << 20;
    let mut objs = Vec::new();
    // Raw records, and lz4 records whose data does not compress (stored
    // raw, from the same buffer).
    for (i, compress) in [Compression::Off, Compression::Lz4].into_iter().enumerate() {
        let data = pattern(i as u64, LEN);
        let (o, staged) = write_and_sync(&pool, compress, &data);
        assert!(
            staged < LEN as u64 / 64,
            "{compress:?}: {staged} of {LEN} bytes copied before their write"
        );
        objs.push((o, data));
    }
    // Compressible records: their compressed bytes start on a page
    // (`compress.rs` asks whole pages of room) and are whole sectors, so
    // on a disk of 512-byte sectors (the simulated ones) they go out from
    // their buffers too, zeros after each up to its allocation.
    let text: Vec<u8> = (0..LEN)
        .map(|i| b"uzfs zero copy, compressed "[i % 27] ^ (i / 3000) as u8)
        .collect();
    let (o, staged) = write_and_sync(&pool, Compression::Lz4, &text);
    assert!(
        staged < LEN as u64 / 64,
        "compressed: {staged} bytes copied before their write"
    );
    objs.push((o, text));
    pool.close().expect("close");
    assert_zdb_clean(&disks, "after the writes");

    let w2 = SimWorld::new();
    let pool = reimport(&w2, images(&disks)).expect("import");
    for (o, data) in &objs {
        let mut buf = vec![0u8; data.len()];
        pool.read(*o, 0, &mut buf).expect("read");
        assert!(buf == *data, "object {o} reads back different");
    }
    pool.close().expect("close");

    // RAID-Z2 over six devices: a 128 KiB record is four data columns of
    // 32 KiB and two parity columns, every one whole pages, so each
    // child's run is written from the columns' own buffers too.
    let w = SimWorld::new();
    let disks: Vec<_> = (0..6).map(|i| w.disk(&format!("r{i}"), DISK)).collect();
    let pool =
        Pool::create("rz", vec![spec(TopKind::Raidz2, &disks)], opts(4)).expect("create raidz2");
    let data = pattern(9, LEN);
    let (o, staged) = write_and_sync(&pool, Compression::Off, &data);
    assert!(
        staged < LEN as u64 / 64,
        "raidz2: {staged} of {LEN} bytes copied before their write"
    );
    pool.close().expect("close");
    assert_zdb_clean(&disks, "raidz2");
    let pool = reimport(&SimWorld::new(), images(&disks)).expect("import raidz2");
    let mut buf = vec![0u8; LEN];
    pool.read(o, 0, &mut buf).expect("read");
    assert!(buf == data, "raidz2 object reads back different");
}
