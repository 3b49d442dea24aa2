//! When the sync thread starts a txg on its own: records written whole (a
//! stream) start one at 64 MiB, records written in part only at half of
//! the dirty limit, so random rewrites keep coalescing in one txg while a
//! stream goes to disk as it comes (`Tunables::dirty_whole_sync`,
//! spa/txg.rs).

mod common;
use common::*;
use std::time::{Duration, Instant};
use uzfs_core::vdev::sim::SimWorld;

const REG: u32 = libc::S_IFREG | 0o644;
const REC: usize = 128 << 10;

/// Wait up to `limit` for a txg past `txg` to be synced by the thread.
fn synced_past(p: &uzfs_core::spa::Pool, txg: u64, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if p.last_txg() > txg {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A pool whose dirty limit is 256 MiB (sync at 128 MiB of dirty data,
/// at 64 MiB of whole records), with the sync thread running and a txg
/// timeout no test waits for.
fn pool(
    world: &SimWorld,
    whole_sync: u64,
) -> (
    Vec<uzfs_core::vdev::sim::SimDevice>,
    std::sync::Arc<uzfs_core::spa::Pool>,
) {
    let disks = vec![world.disk("d0", 640 << 20)];
    let mut o = opts(31);
    o.tunables.sync_thread = true;
    o.tunables.txg_timeout = Duration::from_secs(600);
    o.tunables.cache_bytes = 1 << 30;
    o.tunables.dirty_max = 256 << 20;
    o.tunables.dirty_whole_sync = whole_sync;
    let p = uzfs_core::spa::Pool::create(
        "tank",
        vec![spec(uzfs_core::vdev::TopKind::Disk, &disks)],
        o,
    )
    .expect("create");
    p.dsl_pool().format_root_fs().expect("format");
    (disks, p)
}

/// Write `mib` MiB of whole records to a new file `name`; its inode.
fn stream(fs: &uzfs_core::zpl::Zpl, name: &[u8], mib: usize) -> u64 {
    let f = fs.mknod(fs.root, name, REG, 0, 0, 0, None).expect("create");
    for i in 0..mib {
        fs.write(f.ino, (i << 20) as u64, &pattern(i as u64, 1 << 20))
            .expect("write");
    }
    f.ino
}

#[test]
fn a_stream_starts_a_sync_early_and_rewrites_in_part_do_not() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, 64 << 20);
    let fs = mount_fs(&p, "tank");
    p.sync().expect("sync");
    // 80 MiB written whole: past the 64 MiB of whole records, below the
    // 128 MiB that starts a sync for any dirty data.
    let before = p.last_txg();
    let f = stream(&fs, b"stream", 80);
    assert!(
        synced_past(&p, before, Duration::from_secs(20)),
        "80 MiB of whole records did not start a sync"
    );
    p.sync().expect("sync");
    // 4 KiB into each of 640 of its records: 80 MiB of dirty records
    // again, none written whole. Nothing starts a sync.
    let before = p.last_txg();
    for i in 0..640u64 {
        fs.write(f, i * REC as u64 + 512, &pattern(1000 + i, 4096))
            .expect("patch");
    }
    assert!(
        p.dirty_bytes() >= 64 << 20,
        "the patches hold {} bytes dirty",
        p.dirty_bytes()
    );
    assert!(
        !synced_past(&p, before, Duration::from_millis(1500)),
        "records written in part started a sync below the dirty threshold"
    );
    p.sync().expect("sync");
    let mut want = Vec::with_capacity(80 << 20);
    for i in 0..80u64 {
        want.extend_from_slice(&pattern(i, 1 << 20));
    }
    for i in 0..640usize {
        let at = i * REC + 512;
        want[at..at + 4096].copy_from_slice(&pattern(1000 + i as u64, 4096));
    }
    assert!(
        fs.read(f, 0, 80 << 20).expect("read") == want,
        "wrong bytes"
    );
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the stream and the patches");
}

/// With the whole-record threshold past the general one, the same
/// stream waits: what the test above tells apart is the new rule.
#[test]
fn without_the_whole_record_rule_the_stream_waits() {
    let world = SimWorld::new();
    let (_disks, p) = pool(&world, 256 << 20);
    let fs = mount_fs(&p, "tank");
    p.sync().expect("sync");
    let before = p.last_txg();
    stream(&fs, b"stream", 80);
    assert!(
        !synced_past(&p, before, Duration::from_millis(1500)),
        "80 MiB started a sync below the 128 MiB threshold"
    );
    drop(fs);
    p.export().expect("export");
}
