//! Background freeing (`dsl/async_destroy.rs`): a destroy only queues its
//! frees, each txg frees a budget of them. With a budget of a few dozen
//! blocks a destroy spans many txgs: `freeing` counts down, an export in
//! the middle resumes where the last txg left off, zdb counts what the
//! queue still holds (no leak, no double free at any point), and a power
//! cut at any I/O imports to a state that finishes freeing with nothing
//! leaked, also with the sync thread running and another filesystem
//! being written meanwhile (odd seeds).

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dsl::DsCtx;
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::sim::{SimDevice, SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::Zpl;

const MIB: u64 = 1 << 20;
/// Blocks one txg frees: a 3 MiB dataset takes several txgs.
const BUDGET: u64 = 8;

fn small_budget() -> Tunables {
    Tunables {
        free_max_blocks: BUDGET,
        ..tunables()
    }
}

/// As production runs: the sync thread on, txgs every 20 ms.
fn small_budget_with_sync_thread() -> Tunables {
    Tunables {
        sync_thread: true,
        txg_timeout: std::time::Duration::from_millis(20),
        ..small_budget()
    }
}

fn mirror(world: &SimWorld, seed: u64) -> (Vec<SimDevice>, Arc<Pool>) {
    mirror_with(world, seed, small_budget())
}

fn mirror_with(world: &SimWorld, seed: u64, tunables: Tunables) -> (Vec<SimDevice>, Arc<Pool>) {
    let disks: Vec<_> = (0..2)
        .map(|i| world.disk(&format!("d{i}"), 128 * MIB))
        .collect();
    let o = uzfs_core::spa::CreateOptions {
        tunables,
        guid_seed: Some(seed),
        ..Default::default()
    };
    let pool = Pool::create("z", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    pool.sync().expect("sync");
    (disks, pool)
}

fn reopen(images: Vec<(String, Vec<u8>)>, what: &str) -> (Vec<SimDevice>, Arc<Pool>) {
    let (disks, found) = find(&SimWorld::new(), images);
    let pool = Pool::import(&found, None, small_budget())
        .unwrap_or_else(|e| panic!("{what}: import: {e}"));
    (disks, pool)
}

/// `files` files of `len` bytes in a new filesystem `name`.
fn fill(pool: &Arc<Pool>, name: &str, files: u64, len: usize, seed: u64) -> Zpl {
    pool.dsl_pool()
        .create_dataset(name, &[], false)
        .expect("create dataset");
    let ds = pool.dsl_pool().dataset(name).expect("dataset");
    let fs = Zpl::mount(ds.os.clone(), DsCtx::new(pool.clone(), ds.clone())).expect("mount");
    for i in 0..files {
        let ino = create_file(&fs, format!("f{i}").as_bytes());
        fs.write(ino, 0, &pattern(seed * 1000 + i, len))
            .expect("write");
    }
    pool.sync().expect("sync");
    fs
}

#[test]
fn a_large_destroy_frees_across_txgs_and_resumes_after_export() {
    let world = SimWorld::new();
    let (disks, pool) = mirror(&world, 1);
    let (_, empty, _) = pool.space();
    drop(fill(&pool, "z/big", 24, 300_000, 1));
    // A snapshot that alone holds the old contents of every file.
    let fs = fill(&pool, "z/snapped", 16, 300_000, 2);
    pool.dsl_pool()
        .create_snapshots(&["z/snapped@old".to_string()])
        .expect("snapshot");
    for i in 0..16u64 {
        let e = fs
            .lookup(fs.root, format!("f{i}").as_bytes())
            .expect("lookup");
        fs.write(e.ino, 0, &pattern(3000 + i, 300_000))
            .expect("overwrite");
    }
    pool.sync().expect("sync");
    drop(fs);
    let (_, full, _) = pool.space();
    assert!(full > empty + 15 * MIB, "{full} vs {empty}");

    pool.dsl_pool()
        .destroy_dataset("z/big", false)
        .expect("destroy");
    pool.dsl_pool()
        .destroy_snapshot("z/snapped@old")
        .expect("destroy snapshot");
    pool.sync().expect("sync");
    let left = pool.dsl_pool().freeing();
    assert!(left > 4 * MIB, "freeing {left} after the destroys' txg");
    // An export part way: zdb finds what the queue holds referenced, not
    // leaked; the import resumes with the same work left.
    pool.sync().expect("sync");
    assert!(pool.dsl_pool().freeing() < left, "no progress");
    pool.export().expect("export");
    let before = pool.dsl_pool().freeing();
    assert!(before > 0, "freed by the export");
    assert_zdb_clean(&disks, "exported while freeing");
    let (disks, pool) = reopen(images(&disks), "part way");
    assert_eq!(pool.dsl_pool().freeing(), before, "the queue after import");
    let mut txgs = 0;
    while pool.dsl_pool().freeing() > 0 {
        pool.sync().expect("sync");
        txgs += 1;
        assert!(txgs < 1000, "freeing never ends");
    }
    assert!(txgs >= 3, "freed in {txgs} txgs: the budget did not hold");
    pool.dsl_pool().wait_freed().expect("wait");
    pool.dsl_pool()
        .destroy_dataset("z/snapped", false)
        .expect("destroy the rest");
    pool.dsl_pool().wait_freed().expect("wait");
    let (_, after, _) = pool.space();
    assert!(
        after < empty + MIB,
        "{after} allocated after, {empty} before"
    );
    pool.export().expect("export");
    assert_zdb_clean(&disks, "after freeing");
}

/// A power cut at any I/O while a destroy frees in the background: the
/// import finds the dataset (the destroy's txg never committed) or not,
/// finishes freeing, and zdb finds nothing leaked.
#[test]
fn a_power_cut_during_background_freeing_resumes_and_leaks_nothing() {
    let seeds = env_u64("UZFS_FREE_CRASH_SEEDS", 10);
    let mut resumed = 0;
    for seed in 0..seeds {
        let world = SimWorld::new();
        // Odd seeds as production runs: the sync thread committing on its
        // own and a writer in another filesystem while the frees go on.
        let production = seed % 2 == 1;
        let tun = match production {
            true => small_budget_with_sync_thread(),
            false => small_budget(),
        };
        let (_disks, pool) = mirror_with(&world, seed, tun);
        drop(fill(&pool, "z/big", 24, 300_000, seed));
        let other = production.then(|| fill(&pool, "z/other", 1, 4096, seed + 1));
        let mut rng = SimRng::new(seed ^ 0xf4ee);
        // The destroy and all its freeing take about 640 I/Os.
        world.cut_power_after(rng.below(640));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            if let Some(fs) = &other {
                let stop = &stop;
                s.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // Creates and writes fail once the power is gone.
                        let name = format!("w{i}");
                        let Ok(ino) = try_create_file(fs, name.as_bytes()) else {
                            break;
                        };
                        if fs.write(ino, 0, &pattern(seed ^ i, 20_000)).is_err() {
                            break;
                        }
                        i += 1;
                        if i > 400 {
                            break;
                        }
                    }
                });
            }
            let r = pool
                .dsl_pool()
                .destroy_dataset("z/big", false)
                .and_then(|_| pool.dsl_pool().wait_freed());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        });
        drop(other);
        assert!(r.is_err() == world.power_lost(), "seed {seed}: {r:?}");
        let images = world.crash(&mut SimRng::new(seed));
        drop(pool);
        let (disks, pool) = reopen(images, &format!("seed {seed}"));
        let exists = pool.dsl_pool().dataset("z/big").is_ok();
        if !exists && pool.dsl_pool().freeing() > 0 {
            resumed += 1;
        }
        pool.dsl_pool()
            .wait_freed()
            .unwrap_or_else(|e| panic!("seed {seed}: freeing after import: {e}"));
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("seed {seed}: after the crash"));
    }
    assert!(
        seeds < 6 || resumed > 0,
        "no seed cut power part way through freeing"
    );
}
