//! A self-healing read must never write its repair over space that was
//! freed and reused while the read was in flight.
//!
//! A read that finds one side of a mirror bad writes the good bytes back
//! over it once the other side answered (`spa/io.rs`, self-healing read).
//! If meanwhile the file was deleted, its frees became allocatable and new
//! data landed in that space, the repair would overwrite the new data with
//! the old block: silent corruption of a block that has nothing to do with
//! the read. The staging: a read whose good copy arrived is held before it
//! returns (the simulated disk's read hook) while another thread deletes
//! the file, syncs and fills the pool; then the read completes.

mod common;
use common::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;

const REG: u32 = libc::S_IFREG | 0o644;
const REC: usize = 128 << 10;

#[test]
fn a_repair_never_lands_on_space_reused_during_the_read() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK), world.disk("d1", DISK)];
    let p = uzfs_core::spa::Pool::create("tank", vec![spec(TopKind::Mirror, &disks)], opts(41))
        .expect("create");
    p.dsl_pool().format_root_fs().expect("format");
    let fs = Arc::new(mount_fs(&p, "tank"));
    let f = fs
        .mknod(fs.root, b"old", REG, 0, 0, 0, None)
        .expect("create");
    let old = pattern(1, REC);
    fs.write(f.ino, 0, &old).expect("write");
    p.sync().expect("sync");

    // Where the record lives: the 128 KiB read of it (both sides of a
    // mirror use the same offset).
    let seen: Arc<Mutex<Vec<(String, u64, usize)>>> = Arc::default();
    let s2 = seen.clone();
    world.set_read_hook(Some(Arc::new(move |d: &str, off: u64, len: usize| {
        s2.lock().expect("seen").push((d.to_string(), off, len));
    })));
    p.io.cache.clear();
    assert!(fs.read(f.ino, 0, REC).expect("read") == old);
    let at = seen
        .lock()
        .expect("seen")
        .iter()
        .find(|(_, _, len)| *len == REC)
        .map(|(_, off, _)| *off)
        .expect("the record's read");
    // Side d0 goes bad; side d1's read of the record is held once it has
    // its (good) bytes: 0 armed, 1 held, 2 let go.
    disks[0].corrupt(at, 4096, &mut SimRng::new(5));
    p.io.cache.clear();
    let gate: Arc<(Mutex<u8>, Condvar)> = Arc::default();
    let g2 = gate.clone();
    world.set_read_hook(Some(Arc::new(move |d: &str, off: u64, len: usize| {
        if d != "d1" || off != at || len != REC {
            return;
        }
        let (m, cv) = &*g2;
        let mut s = m.lock().expect("gate");
        if *s != 0 {
            return;
        }
        *s = 1;
        cv.notify_all();
        while *s != 2 {
            s = cv.wait(s).expect("gate");
        }
    })));
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.read(f.ino, 0, REC))
    };
    {
        let (m, cv) = &*gate;
        let mut s = m.lock().expect("gate");
        while *s == 0 {
            s = cv.wait(s).expect("gate");
        }
    }
    // The read has its good copy and has not repaired yet. Delete the
    // file, let its frees become allocatable, fill the pool.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (fs, p, done) = (fs.clone(), p.clone(), done.clone());
        std::thread::spawn(move || {
            fs.unlink(fs.root, b"old").expect("unlink");
            for _ in 0..3 {
                p.sync().expect("sync");
            }
            let chunk = pattern(2, 1 << 20);
            for i in 0..200u32 {
                let name = format!("fill{i}");
                let Ok(g) = fs.mknod(fs.root, name.as_bytes(), REG, 0, 0, 0, None) else {
                    break;
                };
                if fs.write(g.ino, 0, &chunk).is_err() {
                    break;
                }
                if i % 8 == 7 && p.sync().is_err() {
                    break;
                }
            }
            let _ = p.sync();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    // Give the writer time to reuse the space if nothing stops it (with
    // the fence its first sync waits for the read instead).
    let t0 = Instant::now();
    while !done.load(std::sync::atomic::Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    {
        let (m, cv) = &*gate;
        *m.lock().expect("gate") = 2;
        cv.notify_all();
    }
    let got = reader.join().expect("reader").expect("read");
    assert!(got == old, "the read returned other bytes");
    writer.join().expect("writer");
    world.set_read_hook(None);
    drop(fs);
    p.export().expect("export");
    // Every copy of every block verifies: no repair landed on the fill.
    assert_zdb_clean(&disks, "after a repair raced with reuse");
}
