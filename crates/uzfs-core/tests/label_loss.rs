//! A device whose labels vanished is noticed by its read errors, not only
//! by the periodic label check (`spa/label_check.rs`): a mirror side
//! overwritten behind the pool's back returns bad data to the first reads
//! that hit it, and those checksum errors bring the label check forward.
//! The periodic check is set to an hour here, so only the errors can
//! find it.

mod common;
use common::*;
use std::time::{Duration, Instant};
use uzfs_core::spa::Tunables;
use uzfs_core::vdev::sim::SimRng;
use uzfs_core::vdev::{BlockDevice, LeafState};

#[test]
fn read_errors_bring_the_label_check_forward() {
    let (disks, pool, fs, f, data) = mirror_with_file(
        3,
        16,
        Tunables {
            txg_timeout: Duration::from_millis(100),
            label_check_ms: 3_600_000,
            ..tunables()
        },
    );
    // Overwrite d0 whole, labels included (a `dd` over the wrong disk).
    // Mirror reads try the first side first (no load balancing yet), so
    // the blanked side is the one reads meet.
    let mut rng = SimRng::new(3);
    disks[0].corrupt(0, DISK as usize, &mut rng);
    pool.io.cache.clear();
    // Reads hit d0: its copies fail their checksums (and are repaired
    // from d1), which counts errors on it.
    let t0 = Instant::now();
    let leaf = pool
        .io
        .tops()
        .iter()
        .flat_map(|t| t.leaves())
        .find(|l| l.path == disks[0].name())
        .expect("leaf d0");
    while leaf.state() != LeafState::Faulted {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "d0 lost its labels and is still {:?} (reads {}, cksum errors {})",
            leaf.state(),
            leaf.stats.reads.load(std::sync::atomic::Ordering::Relaxed),
            leaf.stats
                .cksum_errors
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        let mut back = Vec::new();
        fs.read_into(f, 0, data.len(), &mut back).expect("read");
        assert!(back == data, "a read returned bad data");
        pool.io.cache.clear();
        // A change, so that txgs (and the checks after them) run.
        fs.write(f, 0, &data[..4096]).expect("write");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(fs);
    pool.export().expect("export");
}
