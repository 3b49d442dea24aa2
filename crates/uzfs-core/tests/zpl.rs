//! The POSIX layer and the dataset layer through the engine (no FUSE):
//! directories at scale, holes, unlinked-while-open, datasets, properties,
//! quotas, and everything surviving export/import with a clean zdb.

mod common;
use common::*;
use std::sync::Arc;
use uzfs_core::dsl::DsCtx;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;
use uzfs_core::zdb;
use uzfs_core::zpl::{SetAttr, Zpl};

fn pool(world: &SimWorld, size: u64) -> (Vec<uzfs_core::vdev::sim::SimDevice>, Arc<Pool>) {
    let disks = vec![world.disk("d0", size)];
    let p = Pool::create("tank", vec![spec(TopKind::Disk, &disks)], opts(7)).expect("create");
    p.dsl_pool().format_root_fs().expect("format");
    (disks, p)
}

fn mount(p: &Arc<Pool>, name: &str) -> Zpl {
    mount_fs(p, name)
}

fn zdb_clean(world: &SimWorld, disks: &[uzfs_core::vdev::sim::SimDevice]) {
    let (d, _f) = find(world, images(disks));
    let r = zdb::verify(devs(&d)).expect("zdb");
    assert!(r.is_clean(), "zdb: {}", zdb::format_report(&r));
}

const REG: u32 = libc::S_IFREG | 0o644;
const DIR: u32 = libc::S_IFDIR | 0o755;

#[test]
fn files_dirs_and_links_survive_import() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    let r = fs.root;
    let d = fs.mknod(r, b"dir", DIR, 0, 0, 0, None).expect("mkdir");
    let f = fs
        .mknod(d.ino, b"file", REG, 0, 1000, 1000, None)
        .expect("create");
    let data = pattern(1, 300_000);
    fs.write(f.ino, 0, &data).expect("write");
    fs.link(f.ino, r, b"hard").expect("link");
    fs.mknod(r, b"sym", libc::S_IFLNK, 0, 0, 0, Some(b"dir/file"))
        .expect("symlink");
    assert_eq!(
        fs.mknod(r, b"dir", DIR, 0, 0, 0, None).err(),
        Some(libc::EEXIST)
    );
    assert_eq!(fs.rmdir(r, b"dir").err(), Some(libc::ENOTEMPTY));
    assert_eq!(fs.unlink(r, b"dir").err(), Some(libc::EISDIR));
    assert_eq!(fs.lookup(r, &[b'x'; 256]).err(), Some(libc::ENAMETOOLONG));
    assert_eq!(fs.getattr(d.ino).expect("attr").z.nlink, 2);
    assert_eq!(fs.getattr(r).expect("attr").z.nlink, 3);
    assert_eq!(fs.getattr(f.ino).expect("attr").z.nlink, 2);
    fs.setxattr(f.ino, b"user.k", Some(b"v1"), 0)
        .expect("setxattr");
    assert_eq!(
        fs.setxattr(f.ino, b"user.k", Some(b"v2"), libc::XATTR_CREATE)
            .err(),
        Some(libc::EEXIST)
    );
    p.sync().expect("sync");
    p.close().expect("close");
    drop(fs);
    drop(p);
    let p = reimport(&world, images(&disks)).expect("import");
    let fs = mount(&p, "tank");
    let f2 = fs.lookup(fs.root, b"hard").expect("lookup");
    assert_eq!(f2.ino, f.ino);
    assert_eq!(f2.size, data.len() as u64);
    assert_eq!(fs.read(f.ino, 0, data.len()).expect("read"), data);
    assert_eq!(
        fs.readlink(fs.lookup(fs.root, b"sym").expect("l").ino)
            .expect("rl"),
        b"dir/file"
    );
    assert_eq!(fs.getxattr(f.ino, b"user.k").expect("x"), b"v1");
    p.close().expect("close");
    zdb_clean(&world, &disks);
}

#[test]
fn holes_read_zero_and_take_no_space() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    let f = fs
        .mknod(fs.root, b"sparse", REG, 0, 0, 0, None)
        .expect("create");
    fs.write(f.ino, 10 << 20, b"end").expect("write");
    p.sync().expect("sync");
    let a = fs.getattr(f.ino).expect("attr");
    assert_eq!(a.size, (10 << 20) + 3);
    assert!(
        a.blocks * 512 < 1 << 20,
        "sparse file uses {} blocks",
        a.blocks
    );
    assert_eq!(
        fs.read(f.ino, 5 << 20, 4096).expect("read"),
        vec![0u8; 4096]
    );
    // Fill, then punch a hole in the middle: space goes back.
    fs.write(f.ino, 0, &pattern(3, 4 << 20)).expect("fill");
    p.sync().expect("sync");
    let full = fs.getattr(f.ino).expect("attr").blocks;
    fs.fallocate(
        f.ino,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        1000,
        3 << 20,
    )
    .expect("punch");
    p.sync().expect("sync");
    let punched = fs.getattr(f.ino).expect("attr").blocks;
    assert!(
        punched * 512 + (2 << 20) < full * 512,
        "{punched} vs {full}"
    );
    let back = fs.read(f.ino, 0, 4 << 20).expect("read");
    let orig = pattern(3, 4 << 20);
    assert_eq!(&back[..1000], &orig[..1000]);
    assert!(back[1000..1000 + (3 << 20)].iter().all(|&b| b == 0));
    assert_eq!(&back[1000 + (3 << 20)..], &orig[1000 + (3 << 20)..]);
    // A punch that starts in a hole block and ends inside a data block
    // zeroes the data part (found by the mount exerciser).
    let g = fs.mknod(fs.root, b"g", REG, 0, 0, 0, None).expect("create");
    fs.write(g.ino, 200 << 10, &pattern(5, 10 << 10))
        .expect("write");
    fs.fallocate(
        g.ino,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        100 << 10,
        110 << 10,
    )
    .expect("punch");
    let b = fs.read(g.ino, 0, 210 << 10).expect("read");
    assert!(b.iter().all(|&x| x == 0), "punch across a hole left data");
    // Truncate down then up: the tail reads as zeros.
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(10),
            ..Default::default()
        },
    )
    .expect("trunc");
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(5000),
            ..Default::default()
        },
    )
    .expect("grow");
    let b = fs.read(f.ino, 0, 5000).expect("read");
    assert_eq!(&b[..10], &orig[..10]);
    assert!(b[10..].iter().all(|&x| x == 0));
    p.close().expect("close");
    zdb_clean(&world, &disks);
}

#[test]
fn unlinked_open_file_lives_until_close_and_is_reaped_after_crash() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    let f = fs
        .mknod(fs.root, b"tmp", REG, 0, 0, 0, None)
        .expect("create");
    fs.write(f.ino, 0, &pattern(4, 1 << 20)).expect("write");
    fs.open(f.ino).expect("open");
    fs.unlink(fs.root, b"tmp").expect("unlink");
    assert_eq!(fs.lookup(fs.root, b"tmp").err(), Some(libc::ENOENT));
    assert_eq!(fs.read(f.ino, 0, 16).expect("read"), pattern(4, 16));
    p.sync().expect("sync");
    // "Crash" with the file still open: import must free it.
    let imgs = images(&disks);
    let p2 = reimport(&world, imgs.clone()).expect("import");
    let fs2 = mount(&p2, "tank");
    assert_eq!(fs2.getattr(f.ino).err(), Some(libc::ENOENT));
    p2.close().expect("close");
    drop(fs2);
    // And on the live pool, the last close frees it.
    fs.release(f.ino).expect("release");
    assert_eq!(fs.getattr(f.ino).err(), Some(libc::ENOENT));
    p.close().expect("close");
}

#[test]
fn rename_forms() {
    let world = SimWorld::new();
    let (_disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    let r = fs.root;
    let a = fs.mknod(r, b"a", DIR, 0, 0, 0, None).expect("a");
    let b = fs.mknod(a.ino, b"b", DIR, 0, 0, 0, None).expect("b");
    let f = fs.mknod(r, b"f", REG, 0, 0, 0, None).expect("f");
    let g = fs.mknod(r, b"g", REG, 0, 0, 0, None).expect("g");
    assert_eq!(fs.rename(r, b"a", b.ino, b"x", 0).err(), Some(libc::EINVAL));
    assert_eq!(fs.rename(r, b"a", a.ino, b"x", 0).err(), Some(libc::EINVAL));
    assert_eq!(fs.rename(r, b"f", r, b"a", 0).err(), Some(libc::EISDIR));
    assert_eq!(fs.rename(r, b"a", r, b"f", 0).err(), Some(libc::ENOTDIR));
    assert_eq!(
        fs.rename(r, b"f", r, b"g", libc::RENAME_NOREPLACE).err(),
        Some(libc::EEXIST)
    );
    fs.rename(r, b"f", r, b"g", 0).expect("over file");
    assert_eq!(fs.getattr(g.ino).err(), Some(libc::ENOENT));
    assert_eq!(fs.lookup(r, b"g").expect("g").ino, f.ino);
    // Directory across directories: link counts follow.
    fs.rename(a.ino, b"b", r, b"b2", 0).expect("dir move");
    assert_eq!(fs.getattr(a.ino).expect("a").z.nlink, 2);
    assert_eq!(fs.getattr(r).expect("r").z.nlink, 4);
    assert_eq!(fs.lookup(b.ino, b"..").expect("..").ino, r);
    // Over an empty directory.
    fs.rename(r, b"b2", r, b"a", 0).expect("over empty dir");
    assert_eq!(fs.getattr(r).expect("r").z.nlink, 3);
    // Exchange.
    let h = fs.mknod(b.ino, b"h", REG, 0, 0, 0, None).expect("h");
    fs.rename(r, b"g", b.ino, b"h", libc::RENAME_EXCHANGE)
        .expect("exchange");
    assert_eq!(fs.lookup(r, b"g").expect("g").ino, h.ino);
    assert_eq!(fs.lookup(b.ino, b"h").expect("h").ino, f.ino);
    p.close().expect("close");
}

#[test]
fn big_directory_lists_every_name_once() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, 256 << 20);
    let fs = mount(&p, "tank");
    let n: usize = std::env::var("UZFS_BIGDIR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let d = fs
        .mknod(fs.root, b"big", DIR, 0, 0, 0, None)
        .expect("mkdir");
    let f = fs.mknod(fs.root, b"target", REG, 0, 0, 0, None).expect("f");
    for i in 0..n {
        fs.link(f.ino, d.ino, format!("entry-{i:08}").as_bytes())
            .unwrap_or_else(|e| panic!("link {i}: errno {e}"));
        if i % 50_000 == 49_999 {
            p.sync().expect("sync");
        }
    }
    p.sync().expect("sync");
    let mut seen = std::collections::BTreeSet::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(d.ino, cookie, 500).expect("readdir");
        if batch.is_empty() {
            break;
        }
        for (next, _, _, name) in &batch {
            assert!(seen.insert(name.clone()), "duplicate {name:?}");
            cookie = *next;
        }
    }
    assert_eq!(seen.len(), n + 2);
    for i in (0..n).step_by(997) {
        fs.lookup(d.ino, format!("entry-{i:08}").as_bytes())
            .expect("lookup");
        fs.unlink(d.ino, format!("entry-{i:08}").as_bytes())
            .expect("unlink");
    }
    p.close().expect("close");
    zdb_clean(&world, &disks);
}

#[test]
fn datasets_properties_quota_and_destroy() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, 256 << 20);
    p.dsl_pool()
        .create_dataset("tank/a/b", &[], false)
        .expect_err("parent missing");
    p.dsl_pool()
        .create_dataset("tank/a/b", &[("compression".into(), "off".into())], true)
        .expect("create -p");
    let a = p.dsl_pool().dataset("tank/a").expect("a");
    let b = p.dsl_pool().dataset("tank/a/b").expect("b");
    p.dsl_pool().set_prop(&a, "recordsize", "16K").expect("set");
    p.dsl_pool()
        .set_prop(&a, "mountpoint", "/mnt/x")
        .expect("set");
    let (v, src) = p.dsl_pool().get_prop(&b, "recordsize").expect("get");
    assert_eq!(
        (v.as_str(), src.to_string().as_str()),
        ("16K", "inherited from tank/a")
    );
    let (v, _) = p.dsl_pool().get_prop(&b, "mountpoint").expect("get");
    assert_eq!(v, "/mnt/x/b");
    let (v, src) = p.dsl_pool().get_prop(&b, "compression").expect("get");
    assert_eq!((v.as_str(), src.to_string().as_str()), ("off", "local"));
    assert!(p.dsl_pool().set_prop(&b, "used", "1").is_err());
    assert!(p.dsl_pool().set_prop(&b, "recordsize", "3000").is_err());
    p.dsl_pool().set_prop(&b, "quota", "2M").expect("quota");
    let root = p.dsl_pool().dataset("tank").expect("root");
    p.dsl_pool()
        .set_prop(&root, "mountpoint", "/srv/tank")
        .expect("root prop");
    let fs = mount(&p, "tank/a/b");
    let f = fs.mknod(fs.root, b"f", REG, 0, 0, 0, None).expect("f");
    // An empty file suggests whole records for I/O (st_blksize), as OpenZFS.
    assert_eq!(fs.getattr(f.ino).expect("attr").blksize, 16 << 10);
    let mut off = 0u64;
    let err = loop {
        match fs.write(f.ino, off, &pattern(off, 256 << 10)) {
            Ok(_) => off += 256 << 10,
            Err(e) => break e,
        }
        if off > 64 << 20 {
            panic!("quota never enforced");
        }
        p.sync().expect("sync");
    };
    assert_eq!(err, libc::EDQUOT);
    assert!(off <= 3 << 20, "wrote {off} bytes into a 2M quota");
    p.sync().expect("sync");
    // Recordsize 16K applies to new files.
    assert_eq!(fs.getattr(f.ino).expect("attr").blksize, 16 << 10);
    drop(fs);
    p.dsl_pool()
        .rename_dataset("tank/a/b", "tank/c")
        .expect("rename");
    assert!(p.dsl_pool().dataset("tank/c").is_ok());
    p.close().expect("close");
    drop(p);
    let p = reimport(&world, images(&disks)).expect("import");
    let c = p.dsl_pool().dataset("tank/c").expect("c after import");
    assert_eq!(
        p.dsl_pool().get_prop(&c, "quota").expect("q").0,
        (2u64 << 20).to_string()
    );
    let root = p.dsl_pool().dataset("tank").expect("root");
    assert_eq!(
        p.dsl_pool().get_prop(&root, "mountpoint").expect("mp"),
        ("/srv/tank".to_string(), uzfs_core::dsl::Source::Local),
        "the root dataset's properties survive import"
    );
    let fs = mount(&p, "tank/c");
    assert!(fs.lookup(fs.root, b"f").is_ok());
    drop(fs);
    let used_before = p.space().1;
    p.dsl_pool()
        .destroy_dataset("tank", false)
        .expect_err("root dataset");
    p.dsl_pool()
        .destroy_dataset("tank/c", false)
        .expect("destroy");
    p.sync().expect("sync");
    p.sync().expect("sync");
    p.sync().expect("sync");
    assert!(p.space().1 < used_before, "destroy freed nothing");
    p.close().expect("close");
    zdb_clean(&world, &disks);
}

/// Master nodes and xattr objects written with valid checksums but hostile
/// contents: mounting or reading them is an error, never a panic, and a
/// master node that names the root directory as its unlinked set does not
/// get the root's files reaped.
#[test]
fn hostile_master_node_and_xattr_object_are_errors() {
    let world = SimWorld::new();
    let (_disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    let r = fs.root;
    let f = fs.mknod(r, b"keep", REG, 0, 0, 0, None).expect("create");
    fs.write(f.ino, 0, b"precious").expect("write");
    fs.setxattr(f.ino, b"user.k", Some(b"v"), 0)
        .expect("setxattr");
    let xobj = fs.getattr(f.ino).expect("attr").z.xattr;
    assert_ne!(xobj, 0);
    p.sync().expect("sync");
    let os = p.dsl_pool().dataset("tank").expect("dataset").os.clone();
    let mut good = [0u8; 32];
    os.read(1, 0, &mut good).expect("master node");
    let word = |i: usize| u64::from_le_bytes(good[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    let (root, unlinked) = (word(2), word(3));
    drop(fs);

    let with = |root: u64, unlinked: u64| {
        let mut b = good;
        b[16..24].copy_from_slice(&root.to_le_bytes());
        b[24..32].copy_from_slice(&unlinked.to_le_bytes());
        b
    };
    let mut bad_magic = good;
    bad_magic[0] ^= 0xff;
    let cases: Vec<(&str, [u8; 32])> = vec![
        ("bad magic", bad_magic),
        ("root is the unlinked set", with(unlinked, unlinked)),
        ("unlinked set is the root", with(root, root)),
        ("root is a file", with(f.ino, unlinked)),
        ("unlinked set is a file", with(root, f.ino)),
        ("root is the master node", with(1, unlinked)),
        ("root does not exist", with(1 << 40, unlinked)),
        ("unlinked set does not exist", with(root, 777_777)),
        ("all zero", [0u8; 32]),
    ];
    for (what, bytes) in cases {
        os.write(1, 0, &bytes).expect("write master node");
        p.sync().expect("sync");
        let ds = p.dsl_pool().dataset("tank").expect("dataset");
        assert!(
            Zpl::mount(ds.os.clone(), DsCtx::new(p.clone(), ds)).is_err(),
            "{what}: mounted"
        );
    }
    os.write(1, 0, &good).expect("restore master node");
    p.sync().expect("sync");
    let fs = mount(&p, "tank");
    assert_eq!(
        fs.read(f.ino, 0, 8).expect("read"),
        b"precious",
        "root's files survived"
    );

    // A garbage xattr object (a name length and a value length running past
    // its end, or a truncated entry header): every xattr call is EIO.
    for garbage in [vec![0xffu8; 300], vec![7u8, 9, 9, 9]] {
        os.write(xobj, 0, &garbage).expect("write xattr object");
        os.set_size(xobj, garbage.len() as u64).expect("size");
        assert_eq!(fs.getxattr(f.ino, b"user.k").err(), Some(libc::EIO));
        assert_eq!(fs.listxattr(f.ino).err(), Some(libc::EIO));
        assert_eq!(
            fs.setxattr(f.ino, b"user.j", Some(b"w"), 0).err(),
            Some(libc::EIO)
        );
    }
    assert_eq!(fs.read(f.ino, 0, 8).expect("read"), b"precious");
    p.sync().expect("sync");
}

/// `rm big; create new` on a dataset at its quota works at once, without a
/// sync in between: a refused write waits for the syncs that free the
/// unlinked file's space (OpenZFS's ERESTART), and only a quota that is
/// still full after them answers EDQUOT.
#[test]
fn space_freed_by_unlink_is_waited_for_not_refused() {
    let world = SimWorld::new();
    let (disks, p) = pool(&world, 256 << 20);
    p.dsl_pool()
        .create_dataset("tank/q", &[("quota".into(), "4M".into())], false)
        .expect("create");
    let fs = mount(&p, "tank/q");
    let big = fs.mknod(fs.root, b"big", REG, 0, 0, 0, None).expect("big");
    let mut off = 0u64;
    let err = loop {
        match fs.write(big.ino, off, &pattern(off, 256 << 10)) {
            Ok(n) => off += n as u64,
            Err(e) => break e,
        }
        assert!(off <= 64 << 20, "quota never enforced");
    };
    assert_eq!(err, libc::EDQUOT);
    p.sync().expect("sync");
    // Still full: refused again after the syncs it waits for.
    let x = fs.mknod(fs.root, b"x", REG, 0, 0, 0, None).expect("x");
    assert_eq!(fs.write(x.ino, 0, &pattern(1, 1 << 20)), Err(libc::EDQUOT));
    fs.unlink(fs.root, b"big").expect("unlink");
    fs.release(big.ino).expect("release");
    // No sync here: the write waits for the one that frees `big`.
    let new = fs
        .mknod(fs.root, b"new", REG, 0, 0, 0, None)
        .expect("new after unlink");
    let data = pattern(3, 1 << 20);
    fs.write(new.ino, 0, &data).expect("write after unlink");
    p.sync().expect("sync");
    let back = fs.read(new.ino, 0, 1 << 20).expect("read");
    assert!(back == data);
    drop(fs);
    p.close().expect("close");
    zdb_clean(&world, &disks);
}

/// An object number freed in the open txg is not handed out again in that
/// txg, and a number reused later carries a different generation, so the
/// kernel never takes a new file for an old one.
#[test]
fn freed_object_numbers_wait_a_txg_and_get_a_new_generation() {
    let world = SimWorld::new();
    let (_disks, p) = pool(&world, DISK);
    let fs = mount(&p, "tank");
    p.sync().expect("sync");
    let a = fs.mknod(fs.root, b"a", REG, 0, 0, 0, None).expect("a");
    p.sync().expect("sync");
    fs.unlink(fs.root, b"a").expect("rm a");
    let b = fs.mknod(fs.root, b"b", REG, 0, 0, 0, None).expect("b");
    assert_ne!(b.ino, a.ino, "number freed in this txg reused in it");
    fs.unlink(fs.root, b"b").expect("rm b");
    p.sync().expect("sync");
    let c = fs.mknod(fs.root, b"c", REG, 0, 0, 0, None).expect("c");
    assert_eq!(c.ino, b.ino, "the number is free again after the sync");
    assert_ne!(c.z.gen, b.z.gen, "a reused number keeps its generation");
    // Freed and recreated within one txg, twice over: still distinct.
    fs.unlink(fs.root, b"c").expect("rm c");
    let d = fs.mknod(fs.root, b"d", REG, 0, 0, 0, None).expect("d");
    assert_ne!(d.ino, c.ino);
}
