//! A transaction hold never waits on a device read (issue #12, point 1).
//!
//! The sync's freeze waits for every hold on the open txg (`dmu/tx.rs`), so
//! an operation that read a cold block while holding the txg would stall
//! the whole pool's sync for as long as that read takes: on a device that
//! hangs, indefinitely. Each POSIX operation therefore reads what it will
//! need before it takes its hold, and pins those blocks for its length
//! (`dmu::tx::warm`).
//!
//! The test builds a tree (directories of several ZAP leaves, files with
//! data, xattrs, a default ACL), exports and imports it with a block cache
//! far smaller than the tree, so almost every block starts cold and blocks
//! are evicted all along. Then three threads, with the sync thread on, run
//! every kind of operation on it (create, mkdir, write inside and past the
//! last block, truncate, chmod with ACLs, chown, link, unlink of closed and
//! open files, rename in all three forms, rmdir, setxattr, fallocate, the
//! last close of an unlinked file). The pool counts device reads made by a
//! thread holding the txg: it must stay zero while the operations miss the
//! cache hundreds of times. zdb is clean afterwards.
//!
//! `UZFS_HOLD_OPS=N` (default 1500 per thread) runs longer.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::{SetAttr, Zpl};

const DIRS: u64 = 4;
const FILES: u64 = 250;
const THREADS: u64 = 3;

fn cold_tunables() -> Tunables {
    Tunables {
        sync_thread: true,
        txg_timeout: std::time::Duration::from_millis(50),
        cache_bytes: 512 << 10,
        ..tunables()
    }
}

/// A POSIX ACL xattr value (Linux's layout): owner rw, user `uid` r, group
/// r, mask r, other none.
fn acl_value(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, uid),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn dir_name(d: u64) -> Vec<u8> {
    format!("d{d}").into_bytes()
}

fn file_name(i: u64) -> Vec<u8> {
    format!("file-with-a-longish-name-{i:05}").into_bytes()
}

fn mount(p: &Arc<Pool>) -> Zpl {
    let fs = mount_fs(p, "hold");
    fs.set_posix_acl(true);
    fs
}

fn build(fs: &Zpl) {
    for d in 0..DIRS {
        let dir = fs
            .mknod(fs.root, &dir_name(d), libc::S_IFDIR | 0o755, 0, 0, 0, None)
            .expect("mkdir")
            .ino;
        if d == 0 {
            fs.setxattr(dir, uzfs_core::zpl::acl::DEFAULT, Some(&acl_value(1000)), 0)
                .expect("default acl");
        }
        for i in 0..FILES {
            let f = fs
                .mknod(dir, &file_name(i), libc::S_IFREG | 0o644, 0, 0, 0, None)
                .expect("create")
                .ino;
            let len = 1000 + (i * 7919) % 40_000;
            fs.write(f, 0, &pattern(d * FILES + i, len as usize))
                .expect("write");
            if i % 5 == 0 {
                fs.setxattr(f, b"user.tag", Some(&pattern(i, 200)), 0)
                    .expect("setxattr");
            }
        }
    }
}

/// One random operation; errors a race may give are fine, the test is
/// about where the reads happen.
fn op(fs: &Zpl, rng: &mut SimRng, me: u64, n: u64) {
    let dir = |rng: &mut SimRng| {
        fs.lookup(fs.root, &dir_name(rng.below(DIRS)))
            .map(|a| a.ino)
    };
    let Ok(d) = dir(rng) else { return };
    let name = file_name(rng.below(FILES + 50));
    let ino = fs.lookup(d, &name).map(|a| a.ino);
    match rng.below(15) {
        0 => {
            let _ = fs.mknod(d, &name, libc::S_IFREG | 0o640, 0, 0, 0, None);
        }
        1 => {
            let _ = fs.mknod(
                d,
                format!("sub-{me}-{n}").as_bytes(),
                libc::S_IFDIR | 0o755,
                0,
                0,
                0,
                None,
            );
        }
        2 | 3 => {
            if let Ok(f) = ino {
                let size = fs.getattr(f).map(|a| a.size).unwrap_or(0);
                // Inside a block, at the end (appending into the last
                // block), or past it.
                let at = match rng.below(3) {
                    0 => rng.below(size.max(1)),
                    1 => size,
                    _ => size + rng.below(200_000),
                };
                let _ = fs.write(f, at, &pattern(n, 1 + rng.below(9000) as usize));
            }
        }
        4 => {
            if let Ok(f) = ino {
                let size = fs.getattr(f).map(|a| a.size).unwrap_or(0);
                let a = SetAttr {
                    size: Some(rng.below(size + 5000)),
                    ..Default::default()
                };
                let _ = fs.setattr(f, &a);
            }
        }
        5 => {
            if let Ok(f) = ino {
                let a = SetAttr {
                    mode: Some(0o600 | rng.below(0o100) as u32),
                    uid: Some(rng.below(3) as u32),
                    ..Default::default()
                };
                let _ = fs.setattr(f, &a);
            }
        }
        6 => {
            if let Ok(f) = ino {
                let _ = fs.setxattr(
                    f,
                    b"user.tag",
                    Some(&pattern(n, rng.below(300) as usize)),
                    0,
                );
            }
        }
        7 => {
            if let Ok(f) = ino {
                let _ = fs.setxattr(f, uzfs_core::zpl::acl::ACCESS, Some(&acl_value(7)), 0);
            }
        }
        8 => {
            if let (Ok(f), Ok(d2)) = (ino, dir(rng)) {
                let _ = fs.link(f, d2, format!("link-{me}-{n}").as_bytes());
            }
        }
        9 => {
            let _ = fs.unlink(d, &name);
        }
        10 => {
            // Unlinked while open: parked in the unlinked set, freed by the
            // last close.
            if let Ok(f) = ino {
                if fs.open(f).is_ok() {
                    let _ = fs.unlink(d, &name);
                    let _ = fs.read(f, 0, 4096);
                    let _ = fs.release(f);
                }
            }
        }
        11 | 12 => {
            if let Ok(d2) = dir(rng) {
                let dname = file_name(rng.below(FILES + 50));
                let flags = match rng.below(3) {
                    0 => 0,
                    1 => libc::RENAME_NOREPLACE,
                    _ => libc::RENAME_EXCHANGE,
                };
                let _ = fs.rename(d, &name, d2, &dname, flags);
            }
        }
        13 => {
            // Remove a subdirectory some thread made, or fail on a file.
            let sub = format!("sub-{}-{}", rng.below(THREADS), rng.below(n + 1));
            let _ = fs.rmdir(d, sub.as_bytes());
            let _ = fs.rmdir(d, &name);
        }
        _ => {
            if let Ok(f) = ino {
                let size = fs.getattr(f).map(|a| a.size).unwrap_or(0);
                let at = rng.below(size + 1);
                let mode = if rng.chance(1, 2) {
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                } else {
                    0
                };
                let _ = fs.fallocate(f, mode, at, 1 + rng.below(20_000));
            }
        }
    }
}

#[test]
fn holds_never_wait_on_device_reads() {
    let ops = env_u64("UZFS_HOLD_OPS", 1500);
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", 160 << 20), world.disk("d1", 160 << 20)];
    let pool = Pool::create("hold", vec![spec(TopKind::Mirror, &disks)], opts(7)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    {
        let fs = mount(&pool);
        build(&fs);
    }
    pool.export().expect("export");
    drop(pool);

    let (disks, found) = find(&world, images(&disks));
    let pool = Pool::import(&found, None, cold_tunables()).expect("import");
    let fs = Arc::new(mount(&pool));
    let under0 = pool.io.reads_under_hold.load(Ordering::Relaxed);
    let misses0 = pool.io.cache.stats().2;
    let workers: Vec<_> = (0..THREADS)
        .map(|me| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = SimRng::new(0x401d ^ me);
                for n in 0..ops {
                    op(&fs, &mut rng, me, n);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let under = pool.io.reads_under_hold.load(Ordering::Relaxed) - under0;
    let misses = pool.io.cache.stats().2 - misses0;
    assert!(
        misses >= 200,
        "only {misses} cache misses: the test did not run cold"
    );
    assert_eq!(
        under, 0,
        "{under} of {misses} device reads were made holding the open txg"
    );
    assert!(pool.suspended().is_none(), "{:?}", pool.suspended());
    drop(fs);
    pool.export().expect("export");
    drop(pool);
    assert_zdb_clean(&disks, "after the cold operations");
}
