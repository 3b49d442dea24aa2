//! A scrub that a suspension stops is shown as stopped, never as finished,
//! and goes on once `zpool clear` resumes the pool. Its disks stop taking
//! writes mid-scrub: the scrub cannot commit its bookmark, its thread
//! ends; `scan_status` must still say scanning (with the reason it
//! stopped), and after the disks are back and the pool resumed the scrub
//! runs to its real end, having examined everything.

mod common;
use common::*;
use std::time::{Duration, Instant};
use uzfs_core::spa::scan::{ScanFunc, ScanState};
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what}: timed out"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_scrub_stopped_by_a_suspension_is_not_finished_and_resumes() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK), world.disk("d1", DISK)];
    let mut o = opts(9);
    o.tunables = Tunables {
        sync_thread: true,
        txg_timeout: Duration::from_millis(100),
        // Many small batches, each committing its bookmark.
        scan_batch_blocks: 4,
        ..tunables()
    };
    let pool = Pool::create("s", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = mount_fs(&pool, "s");
    for i in 0..16u64 {
        let f = fs
            .mknod(
                fs.root,
                format!("f{i}").as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                0,
                0,
                None,
            )
            .expect("create")
            .ino;
        fs.write(f, 0, &pattern(i, 1 << 20)).expect("write");
    }
    pool.txg_wait_synced().expect("sync");
    let to_examine = pool.space().1;
    pool.scrub().expect("scrub");
    wait_for("scrub under way", 10, || {
        pool.scan_status().is_some_and(|s| s.examined > 0)
    });
    for d in &disks {
        d.fail_writes(true);
    }
    wait_for("suspension", 10, || pool.suspended().is_some());
    wait_for("scan thread stopped", 10, || pool.scan_stopped().is_some());
    let s = pool.scan_status().expect("scan");
    assert_eq!(s.state, ScanState::Scanning, "{s:?}");
    assert!(s.examined < to_examine, "{s:?} of {to_examine}");
    let (_, why) = pool.scan_stopped().expect("why");
    assert!(why.contains("suspended"), "{why}");

    for d in &disks {
        d.fail_writes(false);
    }
    pool.clear(None).expect("clear");
    let done = |pool: &Pool| {
        pool.scan_status()
            .is_some_and(|s| s.state == ScanState::Finished)
    };
    wait_for("scan finished", 60, || done(&pool));
    // A side that missed a failed txg is resilvered first, which replaces
    // the scrub (as in OpenZFS); then scrub again.
    if pool
        .scan_status()
        .is_some_and(|s| s.func == ScanFunc::Resilver)
    {
        pool.scrub().expect("scrub after the resilver");
        wait_for("scrub finished", 60, || {
            done(&pool)
                && pool
                    .scan_status()
                    .is_some_and(|s| s.func == ScanFunc::Scrub)
        });
    }
    assert!(pool.scan_stopped().is_none());
    let s = pool.scan_status().expect("scan");
    assert!(s.examined >= to_examine * 9 / 10, "{s:?} of {to_examine}");
    assert_eq!(s.errors, 0, "{s:?}");
    drop(fs);
    pool.export().expect("export");
    assert_zdb_clean(&disks, "after the resumed scrub");
}
