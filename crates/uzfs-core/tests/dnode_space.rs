//! Dnode blocks of freed objects are freed: a filesystem that created and
//! deleted many files takes back the space of their dnodes. Before, every
//! meta-dnode block stayed allocated (as 16 KiB of zeros) once written:
//! 1,000,000 files created and deleted left 257 MB of dnode blocks for 778
//! live objects, across export and import.

mod common;
use common::*;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;

const DIRS: usize = 40;
const FILES: usize = 250;

#[test]
fn emptied_dnode_blocks_are_freed() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let p = Pool::create("tank", vec![spec(TopKind::Disk, &disks)], opts(3)).expect("create");
    p.dsl_pool().format_root_fs().expect("format");
    let fs = mount_fs(&p, "tank");
    p.txg_wait_synced().expect("sync");
    let base = p.root().space().used;
    let r = fs.root;
    for round in 0..2 {
        for d in 0..DIRS {
            let dname = format!("d{d}");
            let dir = fs
                .mknod(r, dname.as_bytes(), libc::S_IFDIR | 0o755, 0, 0, 0, None)
                .expect("mkdir");
            for f in 0..FILES {
                fs.mknod(
                    dir.ino,
                    format!("f{f}").as_bytes(),
                    libc::S_IFREG | 0o644,
                    0,
                    0,
                    0,
                    None,
                )
                .expect("create");
            }
        }
        p.txg_wait_synced().expect("sync");
        let full = p.root().space().used;
        assert!(full > base + 1_000_000, "round {round}: {full} vs {base}");
        for d in 0..DIRS {
            let dname = format!("d{d}");
            let dir = fs.lookup(r, dname.as_bytes()).expect("lookup");
            for f in 0..FILES {
                fs.unlink(dir.ino, format!("f{f}").as_bytes())
                    .expect("unlink");
            }
            fs.rmdir(r, dname.as_bytes()).expect("rmdir");
        }
        // Unlinked objects are freed by the sync after their last close.
        for _ in 0..3 {
            p.txg_wait_synced().expect("sync");
        }
        let after = p.root().space().used;
        assert!(
            after <= base + (64 << 10),
            "round {round}: {} objects created and deleted leave {after} bytes used (empty: {base})",
            DIRS * (FILES + 1)
        );
    }
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the deletes");
}
