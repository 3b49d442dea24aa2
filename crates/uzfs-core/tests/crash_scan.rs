//! Crash in the middle of a scrub or a resilver (simulated power cut at a
//! random I/O, unflushed writes dropped or torn). After import the scan
//! record says where it was; running it again completes it, every byte
//! written before is intact, and zdb finds the pool clean with the new disk
//! holding its column.
//!
//! Every branch an operator can meet after the crash is taken and must end
//! with the damage repaired: a scan recorded in progress resumes from its
//! bookmark; one that had finished stays finished; one never recorded is
//! started again; a replacement that never committed is made again with
//! the same new disk. The test asserts that enough seeds crash inside a
//! scan and with writes in flight.
//!
//! `UZFS_SCAN_CRASH_SEEDS=N` (default 60) from `UZFS_SCAN_CRASH_BASE`,
//! `UZFS_SCAN_CRASH_SEED=S` replays one.

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::scan::ScanState;
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::{BlockDevice, TopKind, LABEL_START_SIZE};
use uzfs_core::zdb;

const DISK: u64 = 64 << 20;

fn tun() -> Tunables {
    Tunables {
        sync_thread: false,
        cache_bytes: 0,
        scan_delay_us: 0,
        // Small batches: crashes land between and inside them.
        scan_batch_blocks: 8,
        ..tunables()
    }
}

fn run_seed(seed: u64) -> Outcome {
    let mut rng = SimRng::new(seed);
    let world = SimWorld::new();
    let raidz = rng.chance(1, 2);
    let (kind, n) = if raidz {
        (TopKind::Raidz1, 4)
    } else {
        (TopKind::Mirror, 2)
    };
    let mut disks: Vec<_> = (0..n).map(|i| world.disk(&format!("d{i}"), DISK)).collect();
    let spec = TopSpec {
        kind,
        leaves: devs(&disks),
    };
    let opts = CreateOptions {
        tunables: tun(),
        guid_seed: Some(seed),
        ..CreateOptions::default()
    };
    let pool = Pool::create("cs", vec![spec], opts).expect("create");
    let mut objs = Vec::new();
    for i in 0..6u64 {
        let obj = pool
            .create_object(131072, &ObjProps::default())
            .expect("obj");
        let data = pattern(seed * 10 + i, 200_000 + rng.below(400_000) as usize);
        pool.write(obj, 0, &data).expect("write");
        objs.push((obj, data));
    }
    pool.sync().expect("sync");
    // Half the seeds keep the first contents only in a snapshot: the scan
    // walks it (by its own bookmark position) and must repair and copy
    // those blocks too; zdb checks every copy of them below.
    let snapped = rng.chance(1, 2);
    let mut new = Vec::new();
    if snapped {
        pool.dsl_pool()
            .create_snapshots(&["cs@old".to_string()])
            .expect("snapshot");
        for (obj, data) in &objs {
            let d2: Vec<u8> = data.iter().map(|b| b ^ 0xa5).collect();
            pool.write(*obj, 0, &d2).expect("overwrite");
            new.push((*obj, d2));
        }
        pool.sync().expect("sync");
    }
    let resilver = rng.chance(1, 2);
    let victim = rng.below(n as u64) as usize;
    let fresh = world.disk("fresh", DISK);
    world.cut_power_after(rng.below(1500));
    let started = if resilver {
        disks[victim].fail_reads(true);
        pool.replace(
            &disks[victim].name(),
            &fresh.name(),
            Arc::new(fresh.clone()) as Arc<dyn BlockDevice>,
            false,
        )
    } else {
        disks[victim].corrupt(LABEL_START_SIZE, 4 << 20, &mut rng);
        pool.scrub()
    };
    pool.wait_scan();
    let mid_writes = world.power_lost() && world.volatile_writes() > 0;
    let images = world.crash(&mut rng);
    drop(pool);
    // The victim of a resilver stays dead; the fresh disk joins the set.
    let mut images: Vec<(String, Vec<u8>)> = images;
    if resilver {
        images.retain(|(name, _)| *name != disks[victim].name());
    }
    let w2 = SimWorld::new();
    let (disks2, found) = find(&w2, images);
    let pool = Pool::import(&found, None, tun())
        .unwrap_or_else(|e| panic!("seed {seed}: import: {e} (scan start: {started:?})"));
    let record = pool.scan_status().map(|s| (s.func, s.state));
    if std::env::var("UZFS_CRASH_VERBOSE").is_ok() {
        eprintln!(
            "seed {seed}: resilver {resilver} mid-writes {mid_writes} record at import: {:?}",
            pool.scan_status().map(|s| (s.func, s.state, s.bookmark))
        );
    }
    let inside = matches!(record, Some((_, ScanState::Scanning)));
    // What an operator does next, in each branch; every branch must end
    // with the damage repaired (zdb reads every copy and column, below).
    let branch = match record {
        Some((_, ScanState::Scanning)) => {
            // Crashed inside the scan: it resumes from its bookmark.
            pool.run_scan()
                .unwrap_or_else(|e| panic!("seed {seed}: resume: {e}"));
            let s = pool.scan_status().expect("scan");
            assert_eq!(s.state, ScanState::Finished, "seed {seed}: {s:?}");
            assert_eq!(s.errors, 0, "seed {seed}: {s:?}");
            Branch::Resumed
        }
        Some((_, ScanState::Finished)) => Branch::Finished,
        _ if resilver && pool.find_leaf("fresh").is_some() => {
            // The replacement committed, its resilver did not start.
            pool.restart_resilver().expect("resilver");
            pool.wait_scan();
            Branch::Restarted
        }
        _ if resilver => {
            // The replacement never committed: the pool runs degraded,
            // and the operator replaces the dead disk again, with the
            // same new disk (its label may be half written: -f).
            let fresh = disks2
                .iter()
                .find(|d| d.name() == "fresh")
                .expect("fresh disk image");
            pool.replace(
                &disks[victim].name(),
                "fresh",
                Arc::new(fresh.clone()) as Arc<dyn BlockDevice>,
                true,
            )
            .unwrap_or_else(|e| panic!("seed {seed}: replace again: {e}"));
            pool.wait_scan();
            Branch::Replaced
        }
        _ => {
            // The scrub was never recorded: the operator runs it again.
            pool.scrub()
                .unwrap_or_else(|e| panic!("seed {seed}: scrub: {e}"));
            pool.wait_scan();
            Branch::Restarted
        }
    };
    let s = pool.scan_status().expect("a scan ran");
    assert_eq!(
        (s.state, s.errors),
        (ScanState::Finished, 0),
        "seed {seed} ({branch:?}): {s:?}"
    );
    let (head, old) = if snapped {
        (&new, Some(&objs))
    } else {
        (&objs, None)
    };
    for (obj, data) in head {
        let mut buf = vec![0u8; data.len()];
        pool.read(*obj, 0, &mut buf)
            .unwrap_or_else(|e| panic!("seed {seed}: read {obj}: {e}"));
        assert!(
            buf == *data,
            "seed {seed} ({branch:?}): object {obj} differs"
        );
    }
    if let Some(old) = old {
        let (_, s) = pool.dsl_pool().snapshot("cs@old").expect("snapshot");
        let os = pool
            .dsl_pool()
            .snapshot_objset(&s)
            .expect("snapshot objset");
        for (obj, data) in old {
            let mut buf = vec![0u8; data.len()];
            os.read(*obj, 0, &mut buf)
                .unwrap_or_else(|e| panic!("seed {seed}: read cs@old {obj}: {e}"));
            assert!(
                buf == *data,
                "seed {seed} ({branch:?}): cs@old {obj} differs"
            );
        }
    }
    if resilver {
        let pos = pool
            .find_leaf("fresh")
            .unwrap_or_else(|| panic!("seed {seed} ({branch:?}): the new disk is not in the pool"));
        assert!(
            pos.leaf.dtl().is_empty(),
            "seed {seed} ({branch:?}): new disk still lacks {:?}",
            pos.leaf.dtl()
        );
        assert!(
            pool.find_leaf(&disks[victim].name()).is_none(),
            "seed {seed} ({branch:?}): the replaced disk is still in the pool"
        );
    }
    pool.close()
        .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
    // Every copy and column on the disks present verifies: the scrubbed
    // victim's damage and the new disk's columns included.
    let r = zdb::verify(devs(&disks2)).unwrap_or_else(|e| panic!("seed {seed}: zdb: {e}"));
    assert!(
        r.is_clean(),
        "seed {seed} ({branch:?}):\n{}",
        zdb::format_report(&r)
    );
    assert!(
        r.bad_copies.is_empty(),
        "seed {seed} ({branch:?}): {:?}",
        r.bad_copies
    );
    if !resilver {
        disks.clear();
    }
    Outcome {
        branch,
        inside,
        mid_writes,
    }
}

/// How the scan was finished after the crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Branch {
    /// The record said scanning: resumed from its bookmark.
    Resumed,
    /// It had finished (and committed) before the power went.
    Finished,
    /// Never recorded: started again.
    Restarted,
    /// A resilver whose replacement never committed: replaced again.
    Replaced,
}

struct Outcome {
    branch: Branch,
    /// The import found the scan in progress.
    inside: bool,
    /// The power went out with writes in flight (a sync or a repair).
    mid_writes: bool,
}

#[test]
fn crash_during_scrub_or_resilver() {
    if let Ok(s) = std::env::var("UZFS_SCAN_CRASH_SEED") {
        let o = run_seed(s.parse().expect("number"));
        eprintln!(
            "{:?} inside {} mid-writes {}",
            o.branch, o.inside, o.mid_writes
        );
        return;
    }
    let n = env_u64("UZFS_SCAN_CRASH_SEEDS", 60);
    let base = env_u64("UZFS_SCAN_CRASH_BASE", 0);
    let mut branches = std::collections::BTreeMap::new();
    let (mut inside, mut mid) = (0, 0);
    for seed in base..base + n {
        let o = run_seed(seed);
        *branches.entry(format!("{:?}", o.branch)).or_insert(0u64) += 1;
        inside += o.inside as u64;
        mid += o.mid_writes as u64;
    }
    eprintln!(
        "{n} seeds: {branches:?}; {inside} crashed inside a scan, {mid} with writes in flight"
    );
    // The cuts land inside scans and inside syncs, not only around them.
    assert!(
        inside * 4 >= n,
        "only {inside} of {n} seeds crashed inside a scan"
    );
    assert!(
        mid * 4 >= n,
        "only {mid} of {n} seeds lost power with writes in flight"
    );
}
