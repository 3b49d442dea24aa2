//! Allocation policy: dynamic striping weighted by free space, ditto copies
//! of metadata on different vdevs, the flush policy, and the write throttle
//! keeping dirty data bounded.

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::{CreateOptions, Pool, Tunables};
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::{FlushPolicy, TopKind, VdevStats};

fn bytes_written(pool: &Pool, vdev: usize) -> u64 {
    pool.io.tops()[vdev]
        .children
        .iter()
        .map(|c| VdevStats::get(&c.stats.bytes_written))
        .sum()
}

#[test]
fn added_empty_vdev_takes_more_new_writes() {
    let w = SimWorld::new();
    let a = w.disk("a", 256 << 20);
    let b = w.disk("b", 256 << 20);
    let pool = Pool::create(
        "stripe",
        vec![spec(TopKind::Disk, std::slice::from_ref(&a))],
        opts(11),
    )
    .expect("create");
    let o = pool
        .create_object(131072, &ObjProps::default())
        .expect("obj");
    let chunk = pattern(1, 8 << 20);
    for i in 0..16u64 {
        pool.write(o, i * chunk.len() as u64, &chunk).expect("fill");
        pool.sync().expect("sync");
    }
    pool.add_vdev(spec(TopKind::Disk, std::slice::from_ref(&b)), None, false)
        .expect("add");
    let before = (bytes_written(&pool, 0), bytes_written(&pool, 1));
    let o2 = pool
        .create_object(131072, &ObjProps::default())
        .expect("obj");
    for i in 0..8u64 {
        pool.write(o2, i * chunk.len() as u64, &chunk)
            .expect("write");
        pool.sync().expect("sync");
    }
    let old = bytes_written(&pool, 0) - before.0;
    let new = bytes_written(&pool, 1) - before.1;
    // vdev 0 is about half full, so the empty vdev should take roughly twice
    // as much; demand clearly more than an even split.
    assert!(
        new > old * 3 / 2,
        "new vdev took {new} bytes, old took {old}"
    );
    assert!(
        old > 0,
        "old vdev took nothing: the split should be weighted, not exclusive"
    );
    pool.close().expect("close");
    let r = uzfs_core::zdb::verify(devs(&[a, b])).expect("zdb");
    assert!(r.is_clean(), "{}", uzfs_core::zdb::format_report(&r));
}

#[test]
fn metadata_copies_land_on_different_vdevs() {
    let w = SimWorld::new();
    let disks = [w.disk("a", DISK), w.disk("b", DISK)];
    let pool = Pool::create(
        "ditto",
        vec![
            spec(TopKind::Disk, &disks[..1]),
            spec(TopKind::Disk, &disks[1..]),
        ],
        opts(12),
    )
    .expect("create");
    let ub = pool.uberblock().expect("uberblock");
    let bp = ub.rootbp;
    assert_eq!(bp.ndvas(), 3, "the MOS root gets three copies");
    assert_ne!(
        bp.dva[0].vdev, bp.dva[1].vdev,
        "ditto copies share a vdev: {bp}"
    );
    // A single-vdev pool still keeps its copies apart (different metaslabs).
    let w = SimWorld::new();
    let one = [w.disk("a", DISK)];
    let pool = Pool::create("one", vec![spec(TopKind::Disk, &one)], opts(13)).expect("create");
    let bp = pool.uberblock().expect("ub").rootbp;
    let ms = |o: u64| o >> 24;
    assert_ne!(
        ms(bp.dva[0].offset),
        ms(bp.dva[1].offset),
        "copies in one metaslab: {bp}"
    );
}

#[test]
fn flush_policy_decides_durability() {
    for (policy, want_pending) in [(FlushPolicy::Honor, false), (FlushPolicy::Ignore, true)] {
        let w = SimWorld::new();
        let d = [w.disk("a", DISK)];
        let o = CreateOptions {
            flush: policy,
            ..opts(14)
        };
        let pool = Pool::create("f", vec![spec(TopKind::Disk, &d)], o).expect("create");
        let obj = pool.create_object(4096, &ObjProps::default()).expect("obj");
        pool.write(obj, 0, b"x").expect("write");
        pool.sync().expect("sync");
        assert_eq!(d[0].pending_writes() > 0, want_pending, "{policy:?}");
    }
}

#[test]
fn write_throttle_bounds_dirty_data() {
    let w = SimWorld::new();
    let d = [w.disk("a", 512 << 20)];
    let dirty_max = 8u64 << 20;
    let o = CreateOptions {
        tunables: Tunables {
            sync_thread: true,
            dirty_max,
            cache_bytes: 1 << 20,
            ..Tunables::default()
        },
        ..opts(15)
    };
    let pool = Pool::create("thr", vec![spec(TopKind::Disk, &d)], o).expect("create");
    let obj = pool
        .create_object(131072, &ObjProps::default())
        .expect("obj");
    let chunk = pattern(2, 1 << 20);
    let pool2: Arc<Pool> = pool.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(pool2.dirty_bytes());
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        peak
    });
    for i in 0..200u64 {
        pool.write(obj, i * chunk.len() as u64, &chunk)
            .expect("write");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    assert!(
        peak <= dirty_max + chunk.len() as u64,
        "dirty peaked at {peak}, limit {dirty_max}"
    );
    assert!(
        peak > dirty_max / 4,
        "throttle never let dirty data build up ({peak})"
    );
    pool.txg_wait_synced().expect("sync");
    let mut buf = vec![0u8; chunk.len()];
    pool.read(obj, 199 << 20, &mut buf).expect("read");
    assert!(buf == chunk);
    pool.close().expect("close");
}

fn sm_objects(pool: &Pool) -> Vec<u64> {
    let t = &pool.config().vdev_tree[0];
    let n = (t.asize >> t.ms_shift) as usize;
    let mut raw = vec![0u8; n * 8];
    pool.mos.read(t.ms_array, 0, &mut raw).expect("ms_array");
    raw.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

#[test]
fn space_maps_are_condensed() {
    let w = SimWorld::new();
    let d = [w.disk("a", DISK)];
    let pool = Pool::create("cond", vec![spec(TopKind::Disk, &d)], opts(16)).expect("create");
    let before = sm_objects(&pool);
    let mut prev = None;
    for i in 0..80u64 {
        let o = pool.create_object(4096, &ObjProps::default()).expect("obj");
        pool.write(o, 0, &pattern(i, 40_000)).expect("write");
        if let Some(p) = prev.replace(o) {
            pool.free_object(p).expect("free");
        }
        pool.sync().expect("sync");
    }
    let after = sm_objects(&pool);
    assert_ne!(before, after, "no space map was ever condensed");
    // Every map is short: at most the threshold plus one txg of appends,
    // where without condensing the busiest would hold hundreds of entries.
    for sm in &after {
        let entries = pool.mos.stat(*sm).expect("sm").size / 16;
        assert!(
            entries < 16 * 4 + 64,
            "space map {sm} holds {entries} entries"
        );
    }
    pool.close().expect("close");
    let r = uzfs_core::zdb::verify(devs(&d)).expect("zdb");
    assert!(r.is_clean(), "{}", uzfs_core::zdb::format_report(&r));
    let pool = reimport(&SimWorld::new(), images(&d)).expect("import");
    let mut buf = vec![0u8; 40_000];
    pool.read(prev.expect("last object"), 0, &mut buf)
        .expect("read");
    assert!(buf == pattern(79, 40_000));
}
