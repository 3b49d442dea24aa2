//! Crash recovery of a vdev that grows (`spa/expand.rs`): the power is cut
//! at a random instant while a pool whose disks grew is expanded and then
//! written to. After the crash the pool imports at a committed txg, with
//! either its old or its new size (never a mix: the metaslab count, the
//! config and the labels agree), every object committed by then reads
//! back, zdb is clean, and the pool takes new writes (into the new
//! metaslabs when it grew).
//!
//! `UZFS_EXPAND_CRASH_SEEDS=N` (default 40) from `UZFS_EXPAND_CRASH_BASE`.

mod common;
use common::*;
use std::collections::BTreeMap;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::error::Error;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;

const START: u64 = 72 << 20;
const GROWN: u64 = 144 << 20;

/// Object number -> contents.
type Model = BTreeMap<u64, Vec<u8>>;

fn put(pool: &Pool, rng: &mut SimRng, model: &mut Model, len: usize) -> uzfs_core::Result<()> {
    let obj = pool.create_object(128 << 10, &ObjProps::default())?;
    let data = pattern(rng.next_u64(), len);
    pool.write(obj, 0, &data)?;
    model.insert(obj, data);
    Ok(())
}

fn check(pool: &Pool, model: &Model, what: &str) {
    for (obj, want) in model {
        let mut got = vec![0u8; want.len()];
        pool.read(*obj, 0, &mut got)
            .unwrap_or_else(|e| panic!("{what}: object {obj}: {e}"));
        assert!(got == *want, "{what}: object {obj} differs");
    }
}

/// Returns whether the pool had grown by the time of the crash.
fn run_seed(seed: u64) -> bool {
    let mut rng = SimRng::new(seed);
    let world = SimWorld::new();
    let (kind, n) = match rng.below(3) {
        0 => (TopKind::Disk, 1),
        1 => (TopKind::Mirror, 2),
        _ => (TopKind::Raidz1, 3),
    };
    let disks: Vec<_> = (0..n)
        .map(|i| world.disk(&format!("d{i}"), START))
        .collect();
    let pool = Pool::create("grow", vec![spec(kind, &disks)], opts(seed))
        .unwrap_or_else(|e| panic!("seed {seed}: create: {e}"));
    let (old_size, _, _) = pool.space();
    let mut model = Model::new();
    for _ in 0..3 {
        put(&pool, &mut rng, &mut model, 1 << 20).expect("put");
    }
    let mut committed: BTreeMap<u64, Model> = BTreeMap::new();
    committed.insert(pool.sync().expect("sync"), model.clone());
    for d in &disks {
        d.grow(GROWN);
    }
    if rng.chance(1, 2) {
        world.cut_power_at_flush(rng.below(12));
    } else {
        world.cut_power_after(rng.below(600));
    }
    // The expansion's own txg, then writes and syncs after it.
    let mut in_flight = Some((pool.last_txg() + 1, model.clone()));
    let mut r = pool.expand(None).map(|added| {
        assert!(added > 0, "seed {seed}: nothing added");
        committed.insert(pool.last_txg(), model.clone());
        in_flight = None;
    });
    for _ in 0..4 {
        if r.is_err() {
            break;
        }
        r = put(&pool, &mut rng, &mut model, 2 << 20);
        if r.is_ok() {
            in_flight = Some((pool.last_txg() + 1, model.clone()));
            r = pool.sync().map(|t| {
                committed.insert(t, model.clone());
                in_flight = None;
            });
        }
    }
    match r {
        Ok(()) | Err(Error::NoSpace) => {}
        Err(e) => assert!(
            world.power_lost(),
            "seed {seed}: error without a crash: {e}"
        ),
    }
    let last = *committed.keys().next_back().expect("committed");
    let images = world.crash(&mut rng);
    drop(pool);
    let (disks2, pool) = import_images(images, seed);
    let txg = pool.last_txg();
    let expect = match (committed.get(&txg), &in_flight) {
        (Some(m), _) => {
            assert_eq!(
                txg, last,
                "seed {seed}: imported {txg}, {last} had committed"
            );
            m.clone()
        }
        (None, Some((t, m))) if *t == txg => m.clone(),
        _ => panic!("seed {seed}: imported txg {txg} was never committed (last {last})"),
    };
    check(&pool, &expect, &format!("seed {seed} after the crash"));
    let (size, _, _) = pool.space();
    let grown = size > old_size;
    let tops = pool.io.tops();
    let top = tops.first().expect("a vdev");
    assert_eq!(
        pool.vdev_space().iter().map(|(a, f)| a + f).sum::<u64>(),
        top.asize,
        "seed {seed}: allocator and vdev disagree on the size"
    );
    assert_zdb_clean(&disks2, &format!("seed {seed}, zdb after the crash"));
    // Whatever the crash left, the pool can still grow, and takes writes.
    pool.expand(None)
        .unwrap_or_else(|e| panic!("seed {seed}: expand after import: {e}"));
    let (size2, _, _) = pool.space();
    assert!(size2 > old_size, "seed {seed}: never grew");
    let mut model = expect;
    // Past what the pool held before it grew.
    for _ in 0..(old_size >> 20) / 8 + 2 {
        match put(&pool, &mut rng, &mut model, 4 << 20) {
            Ok(()) => {}
            Err(Error::NoSpace) => break,
            Err(e) => panic!("seed {seed}: write after import: {e}"),
        }
        pool.sync()
            .unwrap_or_else(|e| panic!("seed {seed}: sync after import: {e}"));
    }
    check(&pool, &model, &format!("seed {seed} after more writes"));
    pool.close()
        .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
    assert_zdb_clean(&disks2, &format!("seed {seed}, zdb after more writes"));
    // And imports at the grown size.
    let p3 = reimport(&SimWorld::new(), common::images(&disks2)).expect("reimport");
    assert_eq!(p3.space().0, size2, "seed {seed}: size after reimport");
    check(&p3, &model, &format!("seed {seed} after reimport"));
    p3.close().expect("close");
    grown
}

#[test]
fn power_cut_while_a_vdev_grows() {
    let n = env_u64("UZFS_EXPAND_CRASH_SEEDS", 40);
    let base = env_u64("UZFS_EXPAND_CRASH_BASE", 0);
    let grown = (base..base + n).filter(|&seed| run_seed(seed)).count() as u64;
    eprintln!("{grown} of {n} seeds crashed after the growth committed");
    // The cuts land on both sides of the expansion's commit.
    if n >= 20 {
        assert!(grown > 0 && grown < n, "{grown} of {n} seeds grown");
    }
}
