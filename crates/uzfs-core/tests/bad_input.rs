//! Bad input: every case gives a clear error (or falls back safely), never a
//! panic and never silently wrong data.

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::import::discover;
use uzfs_core::spa::{CreateOptions, Pool};
use uzfs_core::vdev::label::{label_offsets, LABEL_SIZE, UB_RING_OFFSET, UB_RING_SIZE};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::{BlockDevice, TopKind};

fn pool_with_data(w: &SimWorld) -> (Vec<uzfs_core::vdev::sim::SimDevice>, u64, Vec<u8>) {
    let disks = vec![w.disk("a", DISK)];
    let pool = Pool::create("tank", vec![spec(TopKind::Disk, &disks)], opts(3)).expect("create");
    let o = pool.create_object(4096, &ObjProps::default()).expect("obj");
    let d = pattern(1, 50_000);
    pool.write(o, 0, &d).expect("write");
    pool.close().expect("close");
    (disks, o, d)
}

#[test]
fn zeroed_front_labels_import_from_the_back() {
    let w = SimWorld::new();
    let (disks, o, d) = pool_with_data(&w);
    let mut img = disks[0].image();
    img[..2 * LABEL_SIZE as usize].fill(0);
    let pool = reimport(&SimWorld::new(), vec![("a".into(), img)]).expect("L2/L3 suffice");
    let mut buf = vec![0u8; d.len()];
    pool.read(o, 0, &mut buf).expect("read");
    assert!(buf == d);
}

#[test]
fn all_labels_zeroed_is_no_pool() {
    let w = SimWorld::new();
    let (disks, _, _) = pool_with_data(&w);
    let mut img = disks[0].image();
    let n = img.len() as u64;
    for off in label_offsets(n) {
        img[off as usize..(off + LABEL_SIZE) as usize].fill(0);
    }
    let w2 = SimWorld::new();
    let dev = w2.disk_from_image("a", img);
    assert!(discover(vec![("a".into(), Arc::new(dev) as Arc<dyn BlockDevice>)]).is_empty());
}

#[test]
fn corrupt_newest_uberblock_falls_back_to_the_previous_txg() {
    let w = SimWorld::new();
    let disks = vec![w.disk("a", DISK)];
    let pool = Pool::create("tank", vec![spec(TopKind::Disk, &disks)], opts(4)).expect("create");
    let o = pool.create_object(4096, &ObjProps::default()).expect("obj");
    let old = pattern(1, 40_000);
    pool.write(o, 0, &old).expect("write");
    let t1 = pool.sync().expect("sync");
    // Overwrite everything in the next txg: its frees must not be reused yet.
    pool.write(o, 0, &pattern(2, 40_000)).expect("write");
    let t2 = pool.sync().expect("sync");
    assert_eq!(t2, t1 + 1);
    drop(pool);
    let mut img = disks[0].image();
    let slot = 4096u64;
    for off in label_offsets(img.len() as u64) {
        let at = (off + UB_RING_OFFSET + (t2 % (UB_RING_SIZE / slot)) * slot) as usize;
        img[at + 200] ^= 0xff;
    }
    let pool = reimport(&SimWorld::new(), vec![("a".into(), img)]).expect("import older txg");
    assert_eq!(pool.last_txg(), t1);
    let mut buf = vec![0u8; old.len()];
    pool.read(o, 0, &mut buf).expect("read");
    assert!(buf == old, "txg {t1} contents were damaged by txg {t2}");
}

#[test]
fn garbage_device_is_not_a_pool_and_can_be_used() {
    let w = SimWorld::new();
    let mut img = vec![0u8; DISK as usize];
    SimRng::new(9).fill(&mut img);
    let dev = w.disk_from_image("junk", img);
    assert!(discover(vec![(
        "junk".into(),
        Arc::new(dev.clone()) as Arc<dyn BlockDevice>
    )])
    .is_empty());
    Pool::create("fresh", vec![spec(TopKind::Disk, &[dev])], opts(5)).expect("create over garbage");
}

#[test]
fn device_of_another_pool_needs_force() {
    let w = SimWorld::new();
    let (disks, _, _) = pool_with_data(&w);
    let err = Pool::create("other", vec![spec(TopKind::Disk, &disks)], opts(6))
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("is part of") && msg.contains("'tank'") && msg.contains("-f"),
        "{msg}"
    );
    let forced = CreateOptions {
        force: true,
        ..opts(6)
    };
    Pool::create("other", vec![spec(TopKind::Disk, &disks)], forced).expect("-f overrides");
}

#[test]
fn device_too_small() {
    let w = SimWorld::new();
    let d = w.disk("tiny", 8 << 20);
    let msg = Pool::create("t", vec![spec(TopKind::Disk, &[d])], opts(7))
        .err()
        .expect("refused")
        .to_string();
    assert!(msg.contains("too small"), "{msg}");
}

#[test]
fn truncated_device_is_reported() {
    let w = SimWorld::new();
    let (disks, _, _) = pool_with_data(&w);
    let mut img = disks[0].image();
    img.truncate(80 << 20);
    // The front labels survive truncation, so the pool is found ...
    let w2 = SimWorld::new();
    let dev = w2.disk_from_image("a", img);
    let mut found = discover(vec![("a".into(), Arc::new(dev) as Arc<dyn BlockDevice>)]);
    assert_eq!(found.len(), 1);
    // ... but import refuses to read past the end of the device.
    let msg = Pool::import(&found.remove(0), None, tunables())
        .err()
        .expect("refused")
        .to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn bad_pool_names() {
    for n in ["", "1abc", "mirror1", "a/b", "c0", "log", "tank space"] {
        assert!(
            uzfs_core::spa::check_pool_name(n).is_err(),
            "{n:?} accepted"
        );
    }
    for n in ["tank", "a_b-c.d:e", "c"] {
        assert!(uzfs_core::spa::check_pool_name(n).is_ok(), "{n:?} refused");
    }
}

#[test]
fn unknown_active_feature_refuses_import() {
    use uzfs_core::spa::config::{FeatureEntry, FeatureState};
    let w = SimWorld::new();
    let (disks, _, _) = pool_with_data(&w);
    let (_d, mut found) = find(&SimWorld::new(), vec![("a".into(), disks[0].image())]);
    found.config.features.insert(
        "org.example:future_thing".into(),
        FeatureEntry {
            state: FeatureState::Active,
            read_only_compatible: false,
        },
    );
    let msg = Pool::import(&found, None, tunables())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        msg.contains("org.example:future_thing") && msg.contains("not supported"),
        "{msg}"
    );
    // Enabled but not active is harmless.
    if let Some(e) = found.config.features.get_mut("org.example:future_thing") {
        e.state = FeatureState::Enabled;
    }
    Pool::import(&found, None, tunables()).expect("enabled-only feature imports");
}

#[test]
fn full_pool_says_no_space_and_keeps_data() {
    let w = SimWorld::new();
    let disks = vec![w.disk("a", 64 << 20)];
    let pool = Pool::create("full", vec![spec(TopKind::Disk, &disks)], opts(8)).expect("create");
    let o = pool
        .create_object(131072, &ObjProps::default())
        .expect("obj");
    let chunk = pattern(3, 1 << 20);
    let mut written = 0u64;
    let err = loop {
        match pool.write(o, written, &chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        if written.is_multiple_of(8 << 20) {
            pool.sync().expect("sync never fails for lack of space");
        }
        assert!(written < 1 << 30, "never ran out of space");
    };
    assert!(matches!(err, uzfs_core::Error::NoSpace), "{err}");
    pool.sync().expect("sync after ENOSPC");
    pool.close().expect("close");
    let pool = reimport(&SimWorld::new(), images(&disks)).expect("import");
    let mut buf = vec![0u8; chunk.len()];
    for i in 0..written / chunk.len() as u64 {
        pool.read(o, i * chunk.len() as u64, &mut buf)
            .expect("read");
        assert!(buf == chunk, "chunk {i} lost after ENOSPC");
    }
    let r = uzfs_core::zdb::verify(devs(&disks)).expect("zdb");
    assert!(r.is_clean(), "{}", uzfs_core::zdb::format_report(&r));
}

/// A label whose (checksum-valid) config describes an impossible RAID-Z
/// (fewer children than parity + 2, an absurd ashift) is refused at import
/// with a clear error, never a panic in the geometry arithmetic.
#[test]
fn crafted_label_with_impossible_raidz_is_refused() {
    for (keep, ashift) in [(1usize, 12u8), (0, 12), (3, 70)] {
        let w = SimWorld::new();
        let disks: Vec<_> = (0..3).map(|i| w.disk(&format!("z{i}"), 64 << 20)).collect();
        let pool =
            Pool::create("rz", vec![spec(TopKind::Raidz1, &disks)], opts(11)).expect("create");
        pool.export().expect("export");
        for d in &disks {
            let mut lc = uzfs_core::spa::probe_label(d).expect("label");
            lc.pool.vdev_tree[0].children.truncate(keep);
            lc.pool.vdev_tree[0].ashift = ashift;
            lc.pool.txg += 1;
            let payload = serde_json::to_vec(&lc).expect("json");
            uzfs_core::vdev::label::write_config(d, &payload, &[0, 1, 2, 3]).expect("write label");
        }
        let found = discover(devs(&disks));
        assert_eq!(found.len(), 1);
        let Err(e) = Pool::import(&found[0], None, tunables()) else {
            panic!("an impossible raidz ({keep} children, ashift {ashift}) was imported");
        };
        eprintln!("case {keep}/{ashift}: {e}");
        assert!(
            e.to_string().contains("impossible geometry")
                || e.to_string().contains("no valid uberblock"),
            "{e}"
        );
    }
}
