//! Self-healing on a mirror of real files: flip random bits in one side; every
//! read returns correct data, CKSUM counters rise, a second read finds the
//! copies repaired. Corrupt both sides of one block: a clear error naming the
//! object and offset, no panic.

mod common;
use common::pattern;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::dmu::objset::find_l0_bp;
use uzfs_core::spa::import::{discover, scan_dir};
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::SimRng;
use uzfs_core::vdev::{BlockDevice, FileDevice, TopKind, VdevStats, LABEL_START_SIZE};
use uzfs_core::{zdb, Error};

fn tun() -> Tunables {
    Tunables {
        sync_thread: false,
        cache_bytes: 0,
        ..Tunables::default()
    }
}

fn mk_files(dir: &std::path::Path, n: usize) -> Vec<(String, Arc<dyn BlockDevice>)> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("disk{i}"));
            let f = std::fs::File::create(&p).expect("create file");
            f.set_len(128 << 20).expect("size");
            (
                p.display().to_string(),
                Arc::new(FileDevice::open(&p).expect("open")) as Arc<dyn BlockDevice>,
            )
        })
        .collect()
}

fn import_dir(dir: &std::path::Path) -> Arc<Pool> {
    let mut found = discover(scan_dir(dir).expect("scan"));
    assert_eq!(found.len(), 1);
    Pool::import(&found.remove(0), None, tun()).expect("import")
}

/// A two-way mirror pool on two fresh 128 MiB files in a temporary directory.
fn mirror_on_files(name: &str) -> (tempfile::TempDir, Arc<Pool>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let leaves = mk_files(dir.path(), 2);
    let opts = CreateOptions {
        tunables: tun(),
        ..Default::default()
    };
    let spec = TopSpec {
        kind: TopKind::Mirror,
        leaves,
    };
    let pool = Pool::create(name, vec![spec], opts).expect("create");
    (dir, pool)
}

fn cksum_errors(pool: &Pool, leaf: usize) -> u64 {
    VdevStats::get(&pool.io.tops()[0].children[leaf].stats.cksum_errors)
}

#[test]
fn mirror_heals_random_bit_flips() {
    let (dir, pool) = mirror_on_files("heal");
    let mut objs = Vec::new();
    for i in 0..8u64 {
        let o = pool
            .create_object(16384, &ObjProps::default())
            .expect("obj");
        let d = pattern(100 + i, 1 << 20);
        pool.write(o, 0, &d).expect("write");
        objs.push((o, d));
    }
    pool.sync().expect("sync");
    let (_, alloc, _) = pool.space();
    pool.export().expect("export");
    drop(pool);

    // Flip bits across the allocated region of side 0 only.
    let side0 = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("disk0"))
        .expect("open");
    let mut rng = SimRng::new(7);
    for _ in 0..400 {
        let off = LABEL_START_SIZE + rng.below(alloc);
        let mut b = [0u8; 1];
        side0.read_exact_at(&mut b, off).expect("read");
        b[0] ^= 1 << rng.below(8);
        side0.write_all_at(&b, off).expect("write");
    }
    side0.sync_all().expect("sync");

    let pool = import_dir(dir.path());
    for (o, d) in &objs {
        let mut buf = vec![0u8; d.len()];
        pool.read(*o, 0, &mut buf).expect("read heals");
        assert!(buf == *d, "object {o} returned wrong data");
    }
    let first = cksum_errors(&pool, 0);
    assert!(first > 0, "no CKSUM errors counted on the corrupted side");
    assert_eq!(cksum_errors(&pool, 1), 0, "the clean side was blamed");
    for (o, d) in &objs {
        let mut buf = vec![0u8; d.len()];
        pool.read(*o, 0, &mut buf).expect("second read");
        assert!(buf == *d);
    }
    assert_eq!(
        cksum_errors(&pool, 0),
        first,
        "second read found unrepaired copies"
    );
    pool.close().expect("close");
    let report = zdb::verify(scan_dir(dir.path()).expect("scan")).expect("zdb");
    assert!(
        report.bad_copies.is_empty(),
        "zdb still finds bad copies:\n{}",
        zdb::format_report(&report)
    );
}

#[test]
fn both_sides_bad_is_a_clear_error() {
    let (dir, pool) = mirror_on_files("bad2");
    let o = pool.create_object(4096, &ObjProps::default()).expect("obj");
    pool.write(o, 0, &pattern(5, 64 << 10)).expect("write");
    pool.sync().expect("sync");
    let dn = pool.root().synced_dnode(o).expect("dnode");
    let bp = find_l0_bp(&*pool.io, &dn, 3)
        .expect("walk")
        .expect("block 3 exists");
    pool.export().expect("export");
    drop(pool);
    for i in 0..2 {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(format!("disk{i}")))
            .expect("open");
        f.write_all_at(
            &[0xde, 0xad, 0xbe, 0xef],
            LABEL_START_SIZE + bp.dva[0].offset + 100,
        )
        .expect("corrupt");
    }
    let pool = import_dir(dir.path());
    let mut buf = vec![0u8; 4096];
    pool.read(o, 0, &mut buf).expect("block 0 is fine");
    match pool.read(o, 3 * 4096 + 10, &mut buf) {
        Err(Error::Checksum(msg)) => {
            assert!(
                msg.contains(&format!("object {o} offset 12288")),
                "error does not name the block: {msg}"
            );
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(cksum_errors(&pool, 0) > 0 && cksum_errors(&pool, 1) > 0);
}

#[test]
fn mirror_with_a_missing_side_imports_degraded() {
    let (dir, pool) = mirror_on_files("deg");
    let o = pool
        .create_object(16384, &ObjProps::default())
        .expect("obj");
    let d = pattern(9, 300_000);
    pool.write(o, 0, &d).expect("write");
    pool.export().expect("export");
    drop(pool);
    std::fs::remove_file(dir.path().join("disk1")).expect("remove one side");

    let pool = import_dir(dir.path());
    assert_eq!(
        pool.unavailable_leaves().len(),
        1,
        "the missing side is UNAVAIL"
    );
    let mut buf = vec![0u8; d.len()];
    pool.read(o, 0, &mut buf)
        .expect("read from the surviving side");
    assert!(buf == d);
    pool.write(o, 0, &pattern(10, 1000))
        .expect("a degraded mirror takes writes");
    pool.sync().expect("sync");
    let missing = &pool.io.tops()[0].children[1];
    assert!(missing.is_missing());
    for c in [
        &missing.stats.read_errors,
        &missing.stats.write_errors,
        &missing.stats.cksum_errors,
    ] {
        assert_eq!(
            VdevStats::get(c),
            0,
            "errors counted against a device that is not there"
        );
    }
}

#[test]
fn zdb_on_a_degraded_mirror_is_clean() {
    let (dir, pool) = mirror_on_files("degzdb");
    let o = pool.create_object(4096, &ObjProps::default()).expect("obj");
    pool.write(o, 0, &pattern(11, 50_000)).expect("write");
    pool.export().expect("export");
    drop(pool);
    std::fs::remove_file(dir.path().join("disk0")).expect("remove one side");
    let report = zdb::verify(scan_dir(dir.path()).expect("scan")).expect("zdb");
    assert!(report.is_clean(), "{}", zdb::format_report(&report));
}
