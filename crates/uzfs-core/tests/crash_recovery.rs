//! Crash safety on the simulated device (the model test of the testing ladder).
//!
//! Each seed builds a pool (single disk, 2-way mirror, two striped disks,
//! raidz1, or raidz2 beside a mirror),
//! runs random object creates, writes, frees and txg syncs against an
//! in-memory model, and cuts the power at a random I/O. The crash drops a
//! random subset of unflushed writes and may tear one. After re-import:
//!
//! * the pool is exactly a committed txg: the last whose sync completed, or
//!   the one in flight if its uberblock happened to reach the media (its
//!   blocks were flushed before the uberblock was written, so it is whole);
//! * every object matches the model at that txg, and no other object exists;
//! * zdb finds every checksum good and space accounting exact;
//! * the pool keeps working: more writes, a sync, and zdb is still clean.
//!
//! `UZFS_CRASH_SEEDS=N` runs N seeds (default 300); `UZFS_CRASH_SEED=S`
//! replays one. A failure prints the seed.

mod common;
use common::*;
use std::collections::BTreeMap;
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::Compression;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::Error;

type Model = BTreeMap<u64, Vec<u8>>;

const SMALL: u64 = 64 << 20;

/// Every object slot the object set spans (not only those up to the
/// model's highest number): an object the model never made or freed must
/// not exist, and every object of the model must hold its bytes.
fn check_matches(pool: &Pool, model: &Model, seed: u64) {
    let model_max = model.keys().next_back().copied().unwrap_or(0);
    let span = pool.root().dnode_count_estimate().max(model_max + 1);
    for obj in 1..span {
        let exists = pool
            .root()
            .exists(obj)
            .unwrap_or_else(|e| panic!("seed {seed}: exists({obj}): {e}"));
        match model.get(&obj) {
            None => assert!(
                !exists,
                "seed {seed}: object {obj} exists but the model freed or never made it"
            ),
            Some(data) => {
                assert!(exists, "seed {seed}: object {obj} missing");
                let size = pool
                    .object_size(obj)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                assert_eq!(size, data.len() as u64, "seed {seed}: object {obj} size");
                let mut buf = vec![0u8; data.len()];
                pool.read(obj, 0, &mut buf)
                    .unwrap_or_else(|e| panic!("seed {seed}: read {obj}: {e}"));
                assert!(
                    buf == *data,
                    "seed {seed}: object {obj} contents differ from the model"
                );
            }
        }
    }
}

/// One random operation; `Err` only from the pool.
fn step(pool: &Pool, rng: &mut SimRng, model: &mut Model) -> uzfs_core::Result<()> {
    let roll = rng.below(100);
    if roll < 15 || model.is_empty() {
        let blksz = [512u32, 4096, 16384, 131072][rng.below(4) as usize];
        let props = ObjProps {
            checksum: [
                ChecksumType::Fletcher4,
                ChecksumType::Sha256,
                ChecksumType::Blake3,
            ][rng.below(3) as usize],
            compress: [Compression::Off, Compression::Lz4, Compression::Zstd]
                [rng.below(3) as usize],
            copies: 1 + rng.below(2) as u8,
        };
        let obj = pool.create_object(blksz, &props)?;
        model.insert(obj, Vec::new());
    } else if roll < 25 {
        let keys: Vec<u64> = model.keys().copied().collect();
        let obj = keys[rng.below(keys.len() as u64) as usize];
        pool.free_object(obj)?;
        model.remove(&obj);
    } else {
        let keys: Vec<u64> = model.keys().copied().collect();
        let obj = keys[rng.below(keys.len() as u64) as usize];
        let off = rng.below(600_000);
        let cap = if rng.chance(1, 4) { 300_000 } else { 9000 };
        let len = 1 + rng.below(cap) as usize;
        // Half the writes are compressible.
        let data: Vec<u8> = if rng.chance(1, 2) {
            pattern(rng.next_u64(), len)
        } else {
            let b = rng.next_u64() as u8;
            (0..len).map(|i| b.wrapping_add((i / 100) as u8)).collect()
        };
        pool.write(obj, off, &data)?;
        let m = model.get_mut(&obj).expect("object in model");
        let end = off as usize + len;
        if m.len() < end {
            m.resize(end, 0);
        }
        m[off as usize..end].copy_from_slice(&data);
    }
    Ok(())
}

/// Returns whether the power went out in the middle of a sync (writes
/// issued and not yet flushed): the test checks enough seeds do.
fn run_seed(seed: u64) -> bool {
    let mut rng = SimRng::new(seed);
    let world = SimWorld::new();
    let topo = rng.below(5);
    let (kind_specs, ndisks) = match topo {
        0 => (vec![(TopKind::Disk, 1)], 1),
        1 => (vec![(TopKind::Mirror, 2)], 2),
        2 => (vec![(TopKind::Disk, 1), (TopKind::Disk, 1)], 2),
        3 => (vec![(TopKind::Raidz1, 3)], 3),
        _ => (vec![(TopKind::Raidz2, 4), (TopKind::Mirror, 2)], 6),
    };
    let disks: Vec<_> = (0..ndisks)
        .map(|i| world.disk(&format!("d{i}"), SMALL))
        .collect();
    let mut specs = Vec::new();
    let mut at = 0;
    for (k, n) in kind_specs {
        specs.push(spec(k, &disks[at..at + n]));
        at += n;
    }
    let pool = Pool::create("crash", specs, opts(seed))
        .unwrap_or_else(|e| panic!("seed {seed}: create: {e}"));
    let mut model = Model::new();
    let mut committed: BTreeMap<u64, Model> = BTreeMap::new();
    committed.insert(pool.last_txg(), model.clone());
    if rng.chance(1, 3) {
        world.cut_power_at_flush(rng.below(30));
    } else {
        world.cut_power_after(rng.below(3000));
    }
    let mut in_flight: Option<(u64, Model)> = None;
    'work: for _ in 0..80 {
        let r = if rng.chance(1, 6) {
            in_flight = Some((pool.last_txg() + 1, model.clone()));
            pool.sync().map(|t| {
                committed.insert(t, model.clone());
                in_flight = None;
            })
        } else {
            step(&pool, &mut rng, &mut model)
        };
        match r {
            Ok(()) => {}
            Err(Error::NoSpace) => {}
            Err(e) => {
                assert!(
                    world.power_lost(),
                    "seed {seed}: unexpected error without a crash: {e}"
                );
                break 'work;
            }
        }
        if world.power_lost() {
            break;
        }
    }
    let last = *committed
        .keys()
        .next_back()
        .expect("create committed a txg");
    // Every device write here is a sync's (no sync thread, no scan).
    let mid_sync = world.power_lost() && world.volatile_writes() > 0;
    let images = world.crash(&mut rng);
    drop(pool);
    let (disks2, pool) = import_images(images, seed);
    let txg = pool.last_txg();
    let expect = if let Some(m) = committed.get(&txg) {
        assert_eq!(
            txg, last,
            "seed {seed}: imported txg {txg}, but txg {last} had committed"
        );
        m
    } else {
        match &in_flight {
            Some((t, m)) if *t == txg => m,
            _ => panic!("seed {seed}: imported txg {txg} was never committed (last {last})"),
        }
    };
    if std::env::var("UZFS_CRASH_VERBOSE").is_ok() {
        eprintln!(
            "seed {seed}: ops {} last {last} imported {txg} in_flight {:?} objects {}",
            world.ops(),
            in_flight.as_ref().map(|f| f.0),
            expect.len()
        );
    }
    check_matches(&pool, expect, seed);
    assert_zdb_clean(&disks2, &format!("seed {seed}, zdb after crash"));

    // The allocator state rebuilt from the space maps must be usable.
    let mut model = expect.clone();
    for _ in 0..20 {
        match step(&pool, &mut rng, &mut model) {
            Ok(()) | Err(Error::NoSpace) => {}
            Err(e) => panic!("seed {seed}: after import: {e}"),
        }
    }
    pool.sync()
        .unwrap_or_else(|e| panic!("seed {seed}: sync after import: {e}"));
    check_matches(&pool, &model, seed);
    pool.close()
        .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
    assert_zdb_clean(&disks2, &format!("seed {seed}, zdb after more writes"));
    mid_sync
}

#[test]
fn crash_at_random_instants() {
    if let Ok(s) = std::env::var("UZFS_CRASH_SEED") {
        let mid = run_seed(s.parse().expect("UZFS_CRASH_SEED is a number"));
        eprintln!("power lost in the middle of a sync: {mid}");
        return;
    }
    let n: u64 = std::env::var("UZFS_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let base: u64 = std::env::var("UZFS_CRASH_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut mid = 0;
    for seed in base..base + n {
        mid += run_seed(seed) as u64;
    }
    eprintln!("{mid} of {n} seeds lost power in the middle of a sync");
    assert!(
        mid * 3 >= n,
        "only {mid} of {n} seeds lost power in the middle of a sync"
    );
}
