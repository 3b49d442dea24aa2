//! A streaming writer's records are checksummed as they are copied in
//! (`dmu/dirty_block.rs`), and the sync uses that sum only where it is of
//! the bytes it writes: a record changed after it was written whole, or
//! stored compressed, or in a dataset with another checksum, gets the
//! sync's own. Debug builds (these tests) also check every sum used
//! against the bytes. One test in this binary: the counter is process-wide.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use uzfs_core::dmu::objset::through_page_cache;
use uzfs_core::spa::txg::PRESUMMED;
use uzfs_core::vdev::sim::SimWorld;

const REG: u32 = libc::S_IFREG | 0o644;
const REC: usize = 128 << 10;

fn presummed() -> u64 {
    PRESUMMED.load(Ordering::Relaxed)
}

/// A new file in the root holding `data`, written as the kernel's page
/// cache would: its object number.
fn stream(fs: &uzfs_core::zpl::Zpl, name: &[u8], data: &[u8]) -> u64 {
    let f = fs.mknod(fs.root, name, REG, 0, 0, 0, None).expect("create");
    through_page_cache(|| fs.write(f.ino, 0, data)).expect("write");
    f.ino
}

#[test]
fn sums_taken_at_write_serve_only_records_unchanged_and_stored_raw() {
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 41);
    let ds = p.dsl_pool().dataset("tank").expect("dataset");
    p.dsl_pool()
        .set_prop(&ds, "compression", "lz4")
        .expect("compression");
    let fs = mount_fs(&p, "tank");
    let mut files = Vec::new();

    // Incompressible records written whole: every one uses its sum.
    let noise = pattern(1, 8 * REC);
    let before = presummed();
    files.push((stream(&fs, b"noise", &noise), noise.clone()));
    p.sync().expect("sync");
    assert_eq!(presummed() - before, 8, "whole raw records");

    // Changed after being written whole, in the same txg: in part, and
    // whole again. Neither may keep the first write's sum.
    let mut changed = pattern(2, 4 * REC);
    let f = stream(&fs, b"changed", &changed);
    let patch = pattern(3, 4096);
    fs.write(f, 100, &patch).expect("patch");
    changed[100..100 + 4096].copy_from_slice(&patch);
    let again = pattern(4, REC);
    fs.write(f, 2 * REC as u64, &again).expect("rewrite");
    changed[2 * REC..3 * REC].copy_from_slice(&again);
    let before = presummed();
    p.sync().expect("sync");
    assert_eq!(
        presummed() - before,
        2,
        "only the two records left as written use their sums"
    );
    files.push((f, changed));

    // Compressible records: stored compressed, checksummed by the sync.
    let text: Vec<u8> = (0..4 * REC)
        .map(|i| b"a compressible stream of text "[i % 30])
        .collect();
    let before = presummed();
    files.push((stream(&fs, b"text", &text), text.clone()));
    p.sync().expect("sync");
    assert_eq!(presummed() - before, 0, "compressed records");

    // Another checksum: no sum is taken at all.
    p.dsl_pool()
        .set_prop(&ds, "checksum", "sha256")
        .expect("checksum");
    // (A mount takes its dataset's properties as it mounts.)
    drop(fs);
    let fs = mount_fs(&p, "tank");
    let sha = pattern(5, 4 * REC);
    let before = presummed();
    files.push((stream(&fs, b"sha", &sha), sha.clone()));
    p.sync().expect("sync");
    assert_eq!(presummed() - before, 0, "sha256 records");

    // Everything reads back from disk, and every checksum on it is good.
    p.io.cache.clear();
    for (f, want) in &files {
        assert!(
            fs.read(*f, 0, want.len()).expect("read") == *want,
            "object {f}"
        );
    }
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the streams");
}
