//! The `sync` property (zfsprops(7)): `standard` commits at fsync,
//! `disabled` acknowledges fsync at once (the pool stays consistent; the
//! last seconds of acknowledged writes can be lost), `always` is the front
//! end's (it commits after every change, `tests/sync_always.rs` in the
//! daemon crate). Inherited, with sources, validated.

mod common;
use common::*;
use uzfs_core::dsl::Source;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;

const MIB: u64 = 1 << 20;

fn file_with(fs: &uzfs_core::zpl::Zpl, name: &[u8], data: &[u8]) -> u64 {
    let f = fs
        .mknod(fs.root, name, libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("create")
        .ino;
    fs.write(f, 0, data).expect("write");
    f
}

#[test]
fn sync_disabled_acknowledges_fsync_without_committing() {
    for seed in 0..8u64 {
        let world = SimWorld::new();
        let disks = vec![world.disk("d0", 96 * MIB)];
        let pool =
            Pool::create("s", vec![spec(TopKind::Disk, &disks)], opts(seed)).expect("create");
        pool.dsl_pool().format_root_fs().expect("format");
        let root = pool.dsl_pool().dataset("s").expect("root");

        // standard: fsync commits the txg holding the write.
        let fs = mount_fs(&pool, "s");
        let a = file_with(&fs, b"a", b"committed by fsync");
        let t0 = pool.last_txg();
        fs.fsync(a).expect("fsync");
        assert!(pool.last_txg() > t0, "standard: fsync committed nothing");

        // disabled: fsync returns with nothing committed.
        pool.dsl_pool()
            .set_prop(&root, "sync", "disabled")
            .expect("set");
        pool.txg_wait_synced().expect("sync");
        drop(fs);
        let fs = mount_fs(&pool, "s");
        let b = file_with(&fs, b"b", b"acknowledged, not committed");
        let t1 = pool.last_txg();
        fs.fsync(b).expect("fsync");
        assert_eq!(pool.last_txg(), t1, "disabled: fsync committed a txg");

        // A power cut now: the pool is consistent, `a` is there, `b` is
        // lost whole (its create and write were in the same open txg).
        let mut rng = SimRng::new(seed);
        let images = world.crash(&mut rng);
        drop(fs);
        let (disks, pool) = import_images(images, seed);
        let fs = mount_fs(&pool, "s");
        let a = fs.lookup(fs.root, b"a").expect("a survives");
        let mut back = Vec::new();
        fs.read_into(a.ino, 0, 64, &mut back).expect("read");
        assert_eq!(back, b"committed by fsync");
        assert_eq!(
            fs.lookup(fs.root, b"b").err(),
            Some(libc::ENOENT),
            "seed {seed}: b was never committed"
        );
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after the crash");
    }
}

#[test]
fn sync_is_inherited_validated_and_shown_with_its_source() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", 96 * MIB)];
    let pool = Pool::create("s", vec![spec(TopKind::Disk, &disks)], opts(1)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    pool.dsl_pool()
        .create_dataset("s/c", &[], false)
        .expect("child");
    let root = pool.dsl_pool().dataset("s").expect("root");
    let child = pool.dsl_pool().dataset("s/c").expect("child");
    assert_eq!(
        pool.dsl_pool().get_prop(&child, "sync").expect("get"),
        ("standard".to_string(), Source::Default)
    );
    pool.dsl_pool()
        .set_prop(&root, "sync", "always")
        .expect("set");
    assert_eq!(
        pool.dsl_pool().get_prop(&child, "sync").expect("get"),
        ("always".to_string(), Source::Inherited("s".into()))
    );
    assert_eq!(
        pool.dsl_pool().zpl_props(&child).sync,
        uzfs_core::zpl::SyncMode::Always
    );
    pool.dsl_pool()
        .set_prop(&child, "sync", "disabled")
        .expect("set");
    assert_eq!(
        pool.dsl_pool().get_prop(&child, "sync").expect("get"),
        ("disabled".to_string(), Source::Local)
    );
    let e = pool
        .dsl_pool()
        .set_prop(&child, "sync", "sometimes")
        .expect_err("a bad value");
    assert!(
        e.to_string().contains("'standard', 'always' or 'disabled'"),
        "{e}"
    );
    pool.export().expect("export");
}
