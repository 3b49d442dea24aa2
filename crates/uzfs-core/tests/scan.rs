//! Scrub, resilver, replace, offline/online and spares on simulated disks.

mod common;
use common::{devs, pattern};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::scan::{ScanFunc, ScanState};
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::{SimDevice, SimRng, SimWorld};
use uzfs_core::vdev::{BlockDevice, LeafState, TopKind, VdevStats, LABEL_START_SIZE};
use uzfs_core::zdb;

const DISK: u64 = 64 << 20;

fn tun(thread: bool) -> Tunables {
    Tunables {
        sync_thread: thread,
        cache_bytes: 0,
        scan_delay_us: 0,
        ..common::tunables()
    }
}

fn make(world: &SimWorld, kind: TopKind, n: usize, thread: bool) -> (Vec<SimDevice>, Arc<Pool>) {
    let disks: Vec<SimDevice> = (0..n).map(|i| world.disk(&format!("d{i}"), DISK)).collect();
    let spec = TopSpec {
        kind,
        leaves: devs(&disks),
    };
    let opts = CreateOptions {
        tunables: tun(thread),
        guid_seed: Some(n as u64 * 31 + 7),
        ..CreateOptions::default()
    };
    let pool = Pool::create("scan", vec![spec], opts).expect("create");
    (disks, pool)
}

fn write_objs(pool: &Pool, seed: u64, n: u64, len: usize) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..n {
        let obj = pool
            .create_object(131072, &ObjProps::default())
            .expect("create");
        let data = pattern(seed * 1000 + i, len);
        pool.write(obj, 0, &data).expect("write");
        out.push((obj, data));
    }
    pool.txg_wait_synced().expect("sync");
    out
}

fn check(pool: &Pool, objs: &[(u64, Vec<u8>)]) {
    for (obj, data) in objs {
        let mut buf = vec![0u8; data.len()];
        pool.read(*obj, 0, &mut buf).expect("read");
        assert!(buf == *data, "object {obj} differs");
    }
}

fn run_to_end(pool: &Arc<Pool>) -> uzfs_core::spa::scan::ScanPhys {
    pool.wait_scan();
    let s = pool.scan_status().expect("scan record");
    assert_eq!(s.state, ScanState::Finished, "{s:?}");
    s
}

/// `dead` fails every read and write; a new disk `name` replaces it.
fn replace_dead(world: &SimWorld, pool: &Arc<Pool>, dead: &SimDevice, name: &str) -> SimDevice {
    dead.fail_reads(true);
    dead.fail_writes(true);
    let fresh = world.disk(name, DISK);
    pool.replace(
        &dead.name(),
        &fresh.name(),
        Arc::new(fresh.clone()) as Arc<dyn BlockDevice>,
        false,
    )
    .expect("replace");
    fresh
}

fn clean(disks: &[SimDevice]) {
    let r = zdb::verify(devs(disks)).expect("zdb");
    assert!(r.is_clean(), "{}", zdb::format_report(&r));
}

#[test]
fn scrub_repairs_silent_damage_on_raidz2() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Raidz2, 6, false);
    let objs = write_objs(&pool, 1, 8, 700_000);
    let mut rng = SimRng::new(5);
    for v in [1usize, 4] {
        for _ in 0..300 {
            disks[v].corrupt(LABEL_START_SIZE + rng.below(16 << 20), 4096, &mut rng);
        }
    }
    pool.scrub().expect("scrub");
    let s = run_to_end(&pool);
    assert_eq!(s.func, ScanFunc::Scrub);
    assert!(s.repaired > 0, "scrub repaired nothing: {s:?}");
    assert_eq!(s.errors, 0);
    for c in 0..6 {
        let ck = VdevStats::get(&pool.io.tops()[0].children[c].stats.cksum_errors);
        assert_eq!(ck > 0, c == 1 || c == 4, "child {c} has {ck} CKSUM errors");
    }
    check(&pool, &objs);
    pool.close().expect("close");
    clean(&disks);
}

#[test]
fn scrub_repairs_a_mirror_side() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, false);
    let objs = write_objs(&pool, 2, 4, 500_000);
    let mut rng = SimRng::new(6);
    disks[0].corrupt(LABEL_START_SIZE, 8 << 20, &mut rng);
    pool.scrub().expect("scrub");
    let s = run_to_end(&pool);
    assert!(s.repaired > 0 && s.errors == 0, "{s:?}");
    check(&pool, &objs);
    pool.close().expect("close");
    clean(&disks);
}

#[test]
fn replace_a_destroyed_raidz_disk_and_resilver() {
    let world = SimWorld::new();
    let (mut disks, pool) = make(&world, TopKind::Raidz1, 4, false);
    let objs = write_objs(&pool, 3, 10, 600_000);
    // d2 dies completely.
    let fresh = replace_dead(&world, &pool, &disks[2], "new2");
    let s = run_to_end(&pool);
    assert_eq!(s.func, ScanFunc::Resilver);
    assert_eq!(s.errors, 0);
    assert!(s.repaired > 0);
    // The new disk took the column; the old one is gone from the pool.
    let t = pool.io.tops()[0].clone();
    assert_eq!(t.children[2].path, fresh.name());
    assert!(t.children[2].attached().is_empty());
    assert!(pool.find_leaf(&disks[2].name()).is_none());
    // The new disk holds real data: lose another disk, everything reads.
    disks[0].fail_reads(true);
    check(&pool, &objs);
    disks[0].fail_reads(false);
    pool.close().expect("close");
    disks[2] = fresh;
    clean(&disks);
}

#[test]
fn offline_then_online_resilvers_only_what_was_missed() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, false);
    let old = write_objs(&pool, 4, 16, 1 << 20);
    pool.offline(&disks[1].name()).expect("offline");
    assert_eq!(pool.io.tops()[0].children[1].state(), LeafState::Offline);
    assert_eq!(pool.io.tops()[0].health(), "DEGRADED");
    let new = write_objs(&pool, 5, 2, 1 << 20);
    pool.online(&disks[1].name()).expect("online");
    let s = run_to_end(&pool);
    assert_eq!(s.func, ScanFunc::Resilver);
    assert!(s.min_txg > 1, "resilver not pruned by birth txg: {s:?}");
    // 16 MiB written before the offline, 2 MiB after: only the latter (and
    // metadata) is copied.
    assert!(s.issued < 8 << 20, "issued {} bytes", s.issued);
    assert!(pool.io.tops()[0].children[1].dtl().is_empty());
    // Side 0 gone: side 1 alone has everything.
    disks[0].fail_reads(true);
    check(&pool, &old);
    check(&pool, &new);
    disks[0].fail_reads(false);
    pool.close().expect("close");
    clean(&disks);
}

#[test]
fn offline_refuses_to_leave_no_replica() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Raidz1, 3, false);
    pool.offline(&disks[0].name()).expect("first offline");
    let e = pool
        .offline(&disks[1].name())
        .expect_err("second must fail");
    assert!(e.to_string().contains("no valid replicas"), "{e}");
    pool.close().expect("close");
}

#[test]
fn attach_turns_a_disk_into_a_mirror_and_detach_back() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Disk, 1, false);
    let objs = write_objs(&pool, 6, 4, 300_000);
    let side = world.disk("side", DISK);
    pool.attach(
        &disks[0].name(),
        &side.name(),
        Arc::new(side.clone()) as Arc<dyn BlockDevice>,
        false,
    )
    .expect("attach");
    run_to_end(&pool);
    assert_eq!(pool.io.tops()[0].kind, TopKind::Mirror);
    disks[0].fail_reads(true);
    check(&pool, &objs);
    disks[0].fail_reads(false);
    pool.detach(&disks[0].name()).expect("detach");
    assert_eq!(pool.io.tops()[0].kind, TopKind::Disk);
    check(&pool, &objs);
    pool.close().expect("close");
    clean(&[side]);
}

#[test]
fn a_spare_takes_over_a_faulted_disk_without_operator_action() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Raidz1, 4, true);
    let spare = world.disk("spare", DISK);
    pool.add_spares(
        vec![(
            spare.name(),
            Arc::new(spare.clone()) as Arc<dyn BlockDevice>,
        )],
        false,
    )
    .expect("add spare");
    let objs = write_objs(&pool, 7, 6, 400_000);
    // d1 starts failing every I/O: reads error until the leaf is FAULTED.
    pool.io.tops()[0].children[1]
        .inject
        .read_errors
        .store(true, std::sync::atomic::Ordering::Relaxed);
    pool.io.tops()[0].children[1]
        .inject
        .write_errors
        .store(true, std::sync::atomic::Ordering::Relaxed);
    for _ in 0..3 {
        check(&pool, &objs);
    }
    // Writes fail too; the sync thread's zed check attaches the spare.
    let _more = write_objs(&pool, 8, 2, 100_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = pool.scan_status();
        let attached = pool.io.tops()[0].children[1].attached();
        if attached.iter().any(|(_, l)| l.path == spare.name())
            && s.as_ref()
                .is_some_and(|s| s.func == ScanFunc::Resilver && s.state == ScanState::Finished)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spare never took over: {s:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(pool.io.tops()[0].children[1].state(), LeafState::Faulted);
    check(&pool, &objs);
    // Replace the faulted disk: the pool returns to ONLINE, the spare to AVAIL.
    let fresh = world.disk("fresh", DISK);
    pool.replace(
        &disks[1].name(),
        &fresh.name(),
        Arc::new(fresh.clone()) as Arc<dyn BlockDevice>,
        false,
    )
    .expect("replace");
    pool.wait_scan();
    let t = pool.io.tops()[0].clone();
    assert_eq!(
        t.children[1].path,
        fresh.name(),
        "replacement did not take the column"
    );
    assert_eq!(t.health(), "ONLINE");
    assert!(
        !pool.spare_in_use(&pool.io.spares()[0]),
        "spare still in use"
    );
    check(&pool, &objs);
    pool.close().expect("close");
}

#[test]
fn scrub_pause_and_resume_across_export() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, false);
    write_objs(&pool, 9, 4, 200_000);
    pool.scrub().expect("scrub");
    pool.scrub_pause().expect("pause");
    let s = pool.scan_status().expect("status");
    assert!(s.paused || s.state == ScanState::Finished);
    pool.close().expect("close");
    let (_d, found) = common::find(&world, common::images(&disks));
    let pool = Pool::import(&found, None, tun(false)).expect("import");
    let s = pool.scan_status().expect("scan state survives export");
    if s.state == ScanState::Scanning {
        assert!(s.paused);
        pool.scrub().expect("resume");
        run_to_end(&pool);
    }
    pool.close().expect("close");
}

#[test]
fn two_replacements_share_one_resilver() {
    let world = SimWorld::new();
    let (mut disks, pool) = make(&world, TopKind::Raidz2, 6, false);
    let objs = write_objs(&pool, 10, 6, 500_000);
    let (n1, n2) = (world.disk("n1", DISK), world.disk("n2", DISK));
    // Slow a surviving disk, so the resilver the first replace starts is
    // still running when the second one joins it, however the threads of
    // a loaded machine are scheduled.
    let slow = pool.io.tops()[0].children[0].clone();
    slow.inject.delay_us.store(2_000, Ordering::Relaxed);
    for (i, n) in [(1usize, &n1), (4, &n2)] {
        disks[i].fail_reads(true);
        pool.replace(
            &disks[i].name(),
            &n.name(),
            Arc::new(n.clone()) as Arc<dyn BlockDevice>,
            false,
        )
        .expect("replace");
    }
    slow.inject.delay_us.store(0, Ordering::Relaxed);
    let s = run_to_end(&pool);
    assert_eq!(s.targets.len(), 2, "one scan for both new disks: {s:?}");
    let t = pool.io.tops()[0].clone();
    assert_eq!(t.children[1].path, n1.name());
    assert_eq!(t.children[4].path, n2.name());
    // Both new disks hold their columns: lose two others, all reads work.
    disks[0].fail_reads(true);
    disks[2].fail_reads(true);
    check(&pool, &objs);
    disks[0].fail_reads(false);
    disks[2].fail_reads(false);
    pool.close().expect("close");
    disks[1] = n1;
    disks[4] = n2;
    clean(&disks);
}

#[test]
fn a_vanished_disk_that_comes_back_catches_up() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, false);
    let old = write_objs(&pool, 11, 8, 1 << 20);
    let leaf = pool.io.tops()[0].children[1].clone();
    leaf.inject
        .vanished
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let new = write_objs(&pool, 12, 2, 1 << 20);
    assert_eq!(leaf.state(), LeafState::Removed);
    assert_eq!(pool.io.tops()[0].health(), "DEGRADED");
    // It comes back (zinject -c does exactly this).
    pool.online(&leaf.path).expect("online");
    let s = run_to_end(&pool);
    assert!(s.min_txg > 1 && s.issued < 6 << 20, "not pruned: {s:?}");
    disks[0].fail_reads(true);
    check(&pool, &old);
    check(&pool, &new);
    disks[0].fail_reads(false);
    pool.close().expect("close");
    clean(&disks);
}

/// A scrub yielding to a foreground reader that never stops still ends
/// (regression: idle workers waited for the foreground to go quiet while the
/// foreground waited for the scrub).
#[test]
fn a_yielding_scrub_finishes_under_constant_foreground_reads() {
    let world = SimWorld::new();
    let disks: Vec<SimDevice> = (0..4).map(|i| world.disk(&format!("y{i}"), DISK)).collect();
    let spec = TopSpec {
        kind: TopKind::Raidz1,
        leaves: devs(&disks),
    };
    let opts = CreateOptions {
        tunables: Tunables {
            scan_delay_us: 200,
            ..tun(false)
        },
        guid_seed: Some(99),
        ..CreateOptions::default()
    };
    let pool = Pool::create("yield", vec![spec], opts).expect("create");
    let objs = write_objs(&pool, 13, 8, 1 << 20);
    pool.scrub().expect("scrub");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut reads = 0u64;
    while pool
        .scan_status()
        .is_some_and(|s| s.state == ScanState::Scanning)
    {
        assert!(std::time::Instant::now() < deadline, "scrub never finished");
        let (obj, data) = &objs[(reads % objs.len() as u64) as usize];
        let mut buf = vec![0u8; 4096];
        pool.read(*obj, 8192, &mut buf).expect("read");
        assert!(buf[..] == data[8192..8192 + 4096]);
        reads += 1;
    }
    let s = run_to_end(&pool);
    assert_eq!(s.errors, 0);
    pool.close().expect("close");
}

/// A resilver that can never finish (here: a leaf whose missing-txg range
/// is open although it takes writes, the import bug of issue #13) does not
/// start resilvers forever: after `MAX_AUTO_RESILVERS` in a row the pool
/// stops and says why; an operator's `online` starts the chain afresh.
#[test]
fn an_endless_resilver_chain_stops_and_says_why() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, true);
    let objs = write_objs(&pool, 41, 4, 300_000);
    let leaf = pool.io.tops()[0].leaves()[1].clone();
    leaf.dtl_open(pool.last_txg());
    pool.maybe_resilver().expect("resilver");
    pool.wait_scan();
    let why = pool.resilver_halted().expect("the chain was not stopped");
    assert!(
        why.contains("automatic resilvers stopped") && why.contains(&leaf.path),
        "{why}"
    );
    let runs = pool
        .history()
        .expect("history")
        .iter()
        .filter(|(_, h)| h.contains("resilver started"))
        .count() as u32;
    assert_eq!(
        runs,
        uzfs_core::spa::scan::MAX_AUTO_RESILVERS,
        "resilvers started"
    );
    // Nothing starts by itself any more.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(pool
        .scan_status()
        .is_some_and(|s| s.state != ScanState::Scanning));
    check(&pool, &objs);
    // The operator fixes the cause and asks again: the chain starts afresh.
    leaf.dtl_close(pool.last_txg());
    pool.online(&leaf.path).expect("online");
    assert!(pool.resilver_halted().is_none());
    pool.close().expect("close");
    clean(&disks);
}

/// Objects whose only copy of their old contents is a snapshot: written,
/// snapshotted as `scan@old`, then overwritten and synced.
fn snapshot_only(pool: &Arc<Pool>) -> Vec<(u64, Vec<u8>)> {
    let objs = write_objs(pool, 9, 6, 600_000);
    pool.dsl_pool()
        .create_snapshots(&["scan@old".to_string()])
        .expect("snapshot");
    for (obj, data) in &objs {
        let new: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
        pool.write(*obj, 0, &new).expect("overwrite");
    }
    pool.txg_wait_synced().expect("sync");
    objs
}

fn check_snapshot(pool: &Arc<Pool>, objs: &[(u64, Vec<u8>)]) {
    let (_, s) = pool.dsl_pool().snapshot("scan@old").expect("snapshot");
    let os = pool
        .dsl_pool()
        .snapshot_objset(&s)
        .expect("snapshot objset");
    for (obj, data) in objs {
        let mut buf = vec![0u8; data.len()];
        os.read(*obj, 0, &mut buf).expect("read snapshot");
        assert!(buf == *data, "snapshot object {obj} differs");
    }
}

/// Blocks that only a snapshot holds are scrubbed and repaired like any
/// other: a scan walks every snapshot, not just the datasets' heads.
#[test]
fn scrub_repairs_blocks_only_a_snapshot_holds() {
    let world = SimWorld::new();
    let (disks, pool) = make(&world, TopKind::Mirror, 2, false);
    pool.dsl_pool().format_root_fs().expect("format");
    let objs = snapshot_only(&pool);
    let mut rng = SimRng::new(7);
    disks[0].corrupt(
        LABEL_START_SIZE,
        (DISK - 2 * LABEL_START_SIZE) as usize,
        &mut rng,
    );
    pool.scrub().expect("scrub");
    let s = run_to_end(&pool);
    assert!(s.repaired >= 6 * 600_000, "{s:?}");
    disks[1].fail_reads(true);
    check_snapshot(&pool, &objs);
    disks[1].fail_reads(false);
    pool.close().expect("close");
    clean(&disks);
}

/// A resilver copies snapshot-only blocks to the new disk.
#[test]
fn resilver_copies_blocks_only_a_snapshot_holds() {
    let world = SimWorld::new();
    let (mut disks, pool) = make(&world, TopKind::Mirror, 2, false);
    pool.dsl_pool().format_root_fs().expect("format");
    let objs = snapshot_only(&pool);
    let fresh = replace_dead(&world, &pool, &disks[1], "new1");
    let s = run_to_end(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    disks[0].fail_reads(true);
    check_snapshot(&pool, &objs);
    disks[0].fail_reads(false);
    pool.close().expect("close");
    disks[1] = fresh;
    clean(&disks);
}

/// Every device I/O goes through its leaf's queue in the class of what
/// issued it (`vdev/queue.rs`): the txg's writes as async writes, an
/// application's cold reads as sync reads, and a scrub's reads, its
/// traversal's included, as scan I/O and nothing else (a scan that
/// counted as foreground would yield to itself).
#[test]
fn device_io_is_admitted_in_the_class_of_its_issuer() {
    use uzfs_core::vdev::queue::{IoClass, CLASSES};
    let world = SimWorld::new();
    let (_disks, pool) = make(&world, TopKind::Mirror, 2, false);
    let per_class = |pool: &Pool| {
        let mut sum = [0u64; CLASSES];
        for t in pool.io.tops() {
            for l in t.leaves() {
                for (s, n) in sum.iter_mut().zip(l.queue.admitted()) {
                    *s += n;
                }
            }
        }
        sum
    };
    let delta = |a: [u64; CLASSES], b: [u64; CLASSES], c: IoClass| b[c as usize] - a[c as usize];
    let a = per_class(&pool);
    let objs = write_objs(&pool, 3, 12, 300_000);
    let b = per_class(&pool);
    assert!(delta(a, b, IoClass::AsyncWrite) > 0, "txg writes: {b:?}");
    assert_eq!(delta(a, b, IoClass::Scan), 0);
    check(&pool, &objs);
    let c = per_class(&pool);
    assert!(delta(b, c, IoClass::SyncRead) > 0, "cold reads: {c:?}");
    {
        // What this thread does to start the scrub (a txg, with no sync
        // thread) is told apart from the scan's own I/O.
        let _c = uzfs_core::vdev::queue::with_class(Some(IoClass::AsyncRead));
        pool.scrub().expect("scrub");
        run_to_end(&pool);
    }
    let d = per_class(&pool);
    assert!(delta(c, d, IoClass::Scan) > 0, "scrub: {d:?}");
    assert_eq!(
        delta(c, d, IoClass::SyncRead),
        0,
        "a scrub read as an application: {c:?} -> {d:?}"
    );
    for t in pool.io.tops() {
        for l in t.leaves() {
            assert_eq!(l.queue.active(), [0; CLASSES], "{}: left in flight", l.path);
        }
    }
}
