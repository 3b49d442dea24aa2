//! Crash in the middle of a scrub or a resilver (simulated power cut at a
//! random I/O, unflushed writes dropped or torn). After import the scan
//! record says where it was; running it again completes it, every byte
//! written before is intact, and zdb finds the pool clean with the new disk
//! holding its column.
//!
//! `UZFS_SCAN_CRASH_SEEDS=N` (default 60), `UZFS_SCAN_CRASH_SEED=S` replays.

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::scan::{ScanFunc, ScanState};
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

fn run_seed(seed: u64) {
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
    if std::env::var("UZFS_CRASH_VERBOSE").is_ok() {
        eprintln!(
            "seed {seed}: resilver {resilver} record at import: {:?}",
            pool.scan_status().map(|s| (s.func, s.state, s.bookmark))
        );
    }
    match pool.scan_status() {
        Some(s) if s.state == ScanState::Scanning => {
            pool.run_scan()
                .unwrap_or_else(|e| panic!("seed {seed}: resume: {e}"));
            let s = pool.scan_status().expect("scan");
            assert_eq!(s.state, ScanState::Finished, "seed {seed}: {s:?}");
            assert_eq!(s.errors, 0, "seed {seed}: {s:?}");
        }
        _ => {
            // Crashed before the scan was recorded (or after it finished):
            // the operator runs it again.
            if resilver && pool.find_leaf("fresh").is_some() {
                pool.restart_resilver().expect("resilver");
                pool.wait_scan();
            } else if !resilver && pool.scan_status().is_none() {
                pool.scrub().expect("scrub");
                pool.wait_scan();
            }
        }
    }
    for (obj, data) in &objs {
        let mut buf = vec![0u8; data.len()];
        pool.read(*obj, 0, &mut buf)
            .unwrap_or_else(|e| panic!("seed {seed}: read {obj}: {e}"));
        assert!(buf == *data, "seed {seed}: object {obj} differs");
    }
    if resilver {
        if let Some(pos) = pool.find_leaf("fresh") {
            assert!(
                pos.leaf.dtl().is_empty(),
                "seed {seed}: new disk still lacks {:?}",
                pos.leaf.dtl()
            );
        }
    }
    pool.close()
        .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
    let r = zdb::verify(devs(&disks2)).unwrap_or_else(|e| panic!("seed {seed}: zdb: {e}"));
    // A resilver whose victim is gone leaves that column UNAVAIL (skipped);
    // everything present must verify.
    assert!(r.is_clean(), "seed {seed}:\n{}", zdb::format_report(&r));
    if !resilver {
        disks.clear();
    }
    let _ = ScanFunc::Scrub;
}

#[test]
fn crash_during_scrub_or_resilver() {
    if let Ok(s) = std::env::var("UZFS_SCAN_CRASH_SEED") {
        run_seed(s.parse().expect("number"));
        return;
    }
    let n: u64 = std::env::var("UZFS_SCAN_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    for seed in 0..n {
        run_seed(seed);
    }
}
