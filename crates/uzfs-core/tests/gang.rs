//! Gang blocks (`spa/gang.rs`): a pool whose free space lies only in holes
//! smaller than a record still commits 128 KiB blocks, in pieces, instead
//! of failing the sync and suspending.
//!
//! Each case fragments a pool on purpose: 16 KiB blocks fill it until no
//! free extent is as large as 128 KiB, then every other one is freed, so
//! half the pool is free in 16 KiB holes. A 1 MiB object of 128 KiB
//! blocks must then commit (as gang blocks: zdb counts them), read back
//! after export and import, survive a scrub with one side of a mirror or
//! one RAID-Z column damaged, and give all its space back when freed (zdb
//! finds no leak and no double allocation).

mod common;
use common::*;
use uzfs_core::dmu::dnode::{ot, ObjProps};
use uzfs_core::spa::scan::ScanState;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::{TopKind, LABEL_START_SIZE};
use uzfs_core::zdb;

const SMALL: u64 = 64 << 20;

/// Write `n` objects of one 16 KiB block each, through the object layer
/// (below admission), and commit them.
fn fill(pool: &Pool, objs: &mut Vec<u64>, n: u64) {
    let props = ObjProps::default();
    for _ in 0..n {
        let o = pool
            .root()
            .create_object(ot::PLAIN_FILE, 16384, &props)
            .expect("create");
        pool.root().write(o, 0, &pattern(o, 16384)).expect("write");
        objs.push(o);
    }
    pool.sync().expect("sync while filling");
}

/// Leave no free extent of `need` bytes (what a 128 KiB block takes on
/// the vdev, RAID-Z parity included) and half the pool free in 16 KiB
/// holes. Returns the objects kept.
fn fragment(pool: &Pool, need: u64) -> Vec<u64> {
    let mut objs = Vec::new();
    // Fill, leaving the sync room for its own metadata.
    while pool.largest_free_extent() >= need && pool.space().2 > 8 << 20 {
        fill(pool, &mut objs, 64);
    }
    // Free every other one.
    let mut kept = Vec::new();
    for (k, o) in objs.into_iter().enumerate() {
        if k % 2 == 0 {
            pool.free_object(o).expect("free");
        } else {
            kept.push(o);
        }
    }
    for _ in 0..3 {
        pool.want_frees();
        pool.sync().expect("sync frees");
    }
    // Whatever large extents are left (the tail, merged holes) fill up.
    while pool.largest_free_extent() >= need {
        fill(pool, &mut kept, 4);
    }
    kept
}

fn run(kind: TopKind, ndisks: usize, need: u64, seed: u64) {
    let world = SimWorld::new();
    let disks: Vec<_> = (0..ndisks)
        .map(|i| world.disk(&format!("d{i}"), SMALL))
        .collect();
    let pool = Pool::create("gang", vec![spec(kind, &disks)], opts(seed)).expect("create");
    let kept = fragment(&pool, need);
    let (size, _, free) = pool.space();
    eprintln!(
        "fragmented: free {free} of {size}, writable {}",
        pool.writable_space()
    );
    assert!(
        free > size / 4,
        "fragmenting left only {free} of {size} free"
    );

    let big = pool
        .create_object(131072, &ObjProps::default())
        .expect("obj");
    let data = pattern(seed, 1 << 20);
    pool.write(big, 0, &data)
        .expect("write into a fragmented pool");
    pool.sync()
        .unwrap_or_else(|e| panic!("{kind:?}: sync of 128 KiB blocks into 16 KiB holes: {e}"));
    assert!(pool.suspended().is_none());
    pool.sync().expect("sync");
    let gang_feature = pool
        .config()
        .features
        .get("com.uzfs:gang_block")
        .map(|e| e.state);
    assert_eq!(
        gang_feature,
        Some(uzfs_core::spa::config::FeatureState::Active),
        "{kind:?}: gang blocks written, feature not active"
    );
    let mut buf = vec![0u8; data.len()];
    pool.read(big, 0, &mut buf).expect("read");
    assert!(buf == data, "{kind:?}: read back differs");
    pool.close().expect("close");
    let r = zdb::verify(devs(&disks)).expect("zdb");
    assert!(r.is_clean(), "{kind:?}:\n{}", zdb::format_report(&r));
    assert!(
        r.gang_blocks >= 8,
        "{kind:?}: {} gang blocks",
        r.gang_blocks
    );

    // Damage one device's whole allocatable area: reads and a scrub
    // rebuild every gang header and piece from the others.
    let mut rng = SimRng::new(seed);
    disks[ndisks - 1].corrupt(LABEL_START_SIZE, (SMALL / 2) as usize, &mut rng);
    let w2 = SimWorld::new();
    let (disks2, found) = find(&w2, images(&disks));
    let pool = Pool::import(&found, None, tunables()).expect("import");
    let mut buf = vec![0u8; data.len()];
    pool.read(big, 0, &mut buf)
        .expect("read with a damaged device");
    assert!(buf == data, "{kind:?}: read back differs after damage");
    pool.scrub().expect("scrub");
    pool.wait_scan();
    let s = pool.scan_status().expect("scan");
    assert_eq!((s.state, s.errors), (ScanState::Finished, 0), "{s:?}");
    assert!(
        s.repaired > 0,
        "{kind:?}: the scrub repaired nothing: {s:?}"
    );
    for o in kept.iter().take(50) {
        pool.read(*o, 0, &mut [0u8; 16384]).expect("small object");
    }

    // Freed, every extent of every tree comes back.
    pool.free_object(big).expect("free");
    for _ in 0..3 {
        pool.want_frees();
        pool.sync().expect("sync");
    }
    pool.close().expect("close");
    let r = zdb::verify(devs(&disks2)).expect("zdb");
    assert!(
        r.is_clean(),
        "{kind:?} after free:\n{}",
        zdb::format_report(&r)
    );
    assert_eq!(
        r.gang_blocks, 0,
        "{kind:?}: gang blocks left after the free"
    );
}

#[test]
fn a_fragmented_mirror_commits_records_as_gang_blocks() {
    run(TopKind::Mirror, 2, 128 << 10, 1);
}

#[test]
fn a_fragmented_raidz_commits_records_as_gang_blocks() {
    // 128 KiB of data and 64 KiB of parity on three disks.
    run(TopKind::Raidz1, 3, 192 << 10, 2);
}
