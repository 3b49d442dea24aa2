//! zdb's namespace verification (`zpl/verify.rs`): a consistent filesystem
//! passes with every kind of object counted; each kind of damage an
//! operation split across txgs could leave is reported and makes the report
//! unclean (`zdb -b` exits 1).

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dmu::zap::Zap;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimDevice, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zdb;
use uzfs_core::zpl::{Znode, Zpl};

fn setup(world: &SimWorld) -> (Arc<Pool>, Vec<SimDevice>, Zpl) {
    let disks = vec![world.disk("d0", DISK)];
    let pool = Pool::create("ns", vec![spec(TopKind::Disk, &disks)], opts(3)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = mount_fs(&pool, "ns");
    let reg = libc::S_IFREG | 0o644;
    let d = fs
        .mknod(fs.root, b"d", libc::S_IFDIR | 0o755, 0, 0, 0, None)
        .expect("mkdir");
    let e = fs
        .mknod(d.ino, b"e", libc::S_IFDIR | 0o755, 0, 0, 0, None)
        .expect("mkdir");
    let f = fs.mknod(d.ino, b"f", reg, 0, 0, 0, None).expect("create");
    fs.write(f.ino, 0, b"hello").expect("write");
    fs.link(f.ino, e.ino, b"f-link").expect("link");
    fs.mknod(fs.root, b"s", libc::S_IFLNK, 0, 0, 0, Some(b"d/f"))
        .expect("symlink");
    fs.setxattr(f.ino, b"user.k", Some(b"v"), 0).expect("xattr");
    // Unlinked while open: parked in the unlinked set.
    let g = fs.mknod(fs.root, b"g", reg, 0, 0, 0, None).expect("create");
    fs.open(g.ino).expect("open");
    fs.unlink(fs.root, b"g").expect("unlink");
    (pool, disks, fs)
}

fn verify(pool: &Arc<Pool>, disks: &[SimDevice]) -> zdb::Report {
    pool.sync().expect("sync");
    zdb::verify(devs(disks)).expect("zdb")
}

#[test]
fn a_consistent_filesystem_passes() {
    let world = SimWorld::new();
    let (pool, disks, _fs) = setup(&world);
    let r = verify(&pool, &disks);
    assert!(r.is_clean(), "{}", zdb::format_report(&r));
    assert_eq!(r.ns_stats.directories, 3, "root, d, e");
    assert_eq!(r.ns_stats.files, 2, "f (twice linked), s");
    assert_eq!(r.ns_stats.unlinked, 1, "g");
}

fn expect_violation(r: &zdb::Report, what: &str) {
    assert!(!r.is_clean(), "damage not reported");
    assert!(
        r.namespace.iter().any(|v| v.contains(what)),
        "no violation mentioning '{what}': {:?}",
        r.namespace
    );
}

fn znode_of(fs: &Zpl, obj: u64) -> Znode {
    fs.getattr(obj).expect("getattr").z
}

#[test]
fn a_wrong_link_count_is_reported() {
    let world = SimWorld::new();
    let (pool, disks, fs) = setup(&world);
    let d = fs.lookup(fs.root, b"d").expect("d").ino;
    let f = fs.lookup(d, b"f").expect("f").ino;
    let mut z = znode_of(&fs, f);
    z.nlink = 1;
    fs.os.set_bonus(f, &z.encode()).expect("bonus");
    expect_violation(&verify(&pool, &disks), "link count 1");
}

#[test]
fn a_dangling_entry_is_reported() {
    let world = SimWorld::new();
    let (pool, disks, fs) = setup(&world);
    Zap::open(&fs.os, fs.root)
        .insert(b"ghost", 5000, 8)
        .expect("insert");
    expect_violation(&verify(&pool, &disks), "which is free");
}

#[test]
fn an_unreachable_object_is_reported() {
    let world = SimWorld::new();
    let (pool, disks, fs) = setup(&world);
    let d = fs.lookup(fs.root, b"d").expect("d").ino;
    // Half a rename: the name is gone, nothing else changed.
    Zap::open(&fs.os, d).remove(b"e").expect("remove");
    expect_violation(&verify(&pool, &disks), "unreachable");
}

#[test]
fn a_wrong_parent_pointer_is_reported() {
    let world = SimWorld::new();
    let (pool, disks, fs) = setup(&world);
    let d = fs.lookup(fs.root, b"d").expect("d").ino;
    let e = fs.lookup(d, b"e").expect("e").ino;
    let mut z = znode_of(&fs, e);
    z.parent = fs.root;
    fs.os.set_bonus(e, &z.encode()).expect("bonus");
    expect_violation(&verify(&pool, &disks), "parent pointer");
}
