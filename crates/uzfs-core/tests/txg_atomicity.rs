//! Every operation lands whole in one txg, whatever the sync does meanwhile.
//!
//! One thread renames 20 files back and forth between two directories while
//! another commits txgs as fast as it can and imports every committed image
//! (a power cut at that instant would leave exactly it). Each image must hold
//! all 20 files: a rename split across two txgs (the source name removed in
//! one, the target inserted in the next) would show 19. No rename may fail.
//!
//! Before the transaction holds (`dmu::tx`), this failed within seconds: the
//! sync's freeze landed between a rename's ZAP remove and its insert.
//!
//! `UZFS_TX_SECS=N` (default 3) runs longer.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimWorld;
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::Zpl;

const FILES: usize = 20;

fn mount(p: &Arc<Pool>, name: &str) -> Zpl {
    mount_fs(p, name)
}

fn count(fs: &Zpl, dir: &[u8]) -> usize {
    let d = fs.lookup(fs.root, dir).expect("lookup dir").ino;
    fs.readdir(d, 0, 10_000)
        .expect("readdir")
        .iter()
        .filter(|e| e.3 != b"." && e.3 != b"..")
        .count()
}

#[test]
fn rename_is_never_split_across_txgs() {
    let secs: u64 = env_u64("UZFS_TX_SECS", 3);
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK)];
    let pool = Pool::create("tx", vec![spec(TopKind::Disk, &disks)], opts(1)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = Arc::new(mount(&pool, "tx"));
    let a = fs
        .mknod(fs.root, b"a", libc::S_IFDIR | 0o755, 0, 0, 0, None)
        .expect("mkdir a")
        .ino;
    let b = fs
        .mknod(fs.root, b"b", libc::S_IFDIR | 0o755, 0, 0, 0, None)
        .expect("mkdir b")
        .ino;
    for i in 0..FILES {
        fs.mknod(
            a,
            format!("f{i}").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            0,
            0,
            None,
        )
        .expect("create");
    }
    pool.sync().expect("sync");

    let stop = Arc::new(AtomicBool::new(false));
    let renamer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            // Each file moves a -> b, then b -> a, one at a time.
            while !stop.load(Ordering::Relaxed) {
                for i in 0..FILES {
                    let name = format!("f{i}");
                    let (from, to) = if n.is_multiple_of(2) { (a, b) } else { (b, a) };
                    fs.rename(from, name.as_bytes(), to, name.as_bytes(), 0)
                        .unwrap_or_else(|e| panic!("rename {name} failed: errno {e}"));
                }
                n += 1;
            }
            n
        })
    };
    let until = Instant::now() + Duration::from_secs(secs);
    let mut checked = 0;
    let mut bad = Vec::new();
    while Instant::now() < until && !renamer.is_finished() {
        let txg = pool.sync().expect("sync");
        // Nothing writes the devices between syncs: this is exactly the
        // image a power cut now would leave.
        let imgs = images(&disks);
        let w2 = SimWorld::new();
        let (_d2, found) = find(&w2, imgs);
        let p2 = Pool::import(&found, None, tunables()).expect("import");
        let fs2 = mount(&p2, "tx");
        let n = count(&fs2, b"a") + count(&fs2, b"b");
        if n != FILES {
            bad.push((txg, n));
        }
        checked += 1;
        drop(fs2);
        drop(p2);
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = renamer.join().expect("the renamer failed");
    assert!(
        bad.is_empty(),
        "committed txgs without {FILES} files: {bad:?}"
    );
    assert!(checked >= 5, "only {checked} txgs checked");
    assert!(rounds > 0);
    assert_eq!(count(&fs, b"a") + count(&fs, b"b"), FILES);
}
