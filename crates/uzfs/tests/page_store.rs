//! A read of part of a record gives the kernel the whole record
//! (FUSE_NOTIFY_STORE, `fuse/store.rs`), and never over bytes a writer
//! or a truncate changed.

mod common;

use common::{arcstat, can_mount, drop_pages, noise, wait_for, Env, Rng};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const REC: usize = 128 << 10;

/// Which pages of `path` the kernel holds (mincore of a read-only map).
fn resident(path: &Path) -> Vec<bool> {
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().expect("stat").len() as usize;
    if len == 0 {
        return Vec::new();
    }
    let pages = len.div_ceil(PAGE);
    let mut vec = vec![0u8; pages];
    // SAFETY: a fresh read-only shared map of an open file of `len`
    // bytes; mincore writes one byte per page into `vec`, which has
    // room for all of them; the map is unmapped before returning and
    // never read through.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert!(p != libc::MAP_FAILED, "mmap");
        let rc = libc::mincore(p, len, vec.as_mut_ptr());
        libc::munmap(p, len);
        assert_eq!(rc, 0, "mincore");
    }
    vec.iter().map(|b| b & 1 == 1).collect()
}

/// A read-only descriptor that tells the kernel not to read ahead, as
/// fio's random jobs do.
fn open_random(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::File::open(path)?;
    // SAFETY: posix_fadvise on an open descriptor, whole file.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(rc, 0, "posix_fadvise");
    Ok(f)
}

/// A pool with a file of `mb` MiB of noise written and synced to disk,
/// its pages dropped: (env, file, its bytes).
fn setup(envs: &[(&str, &str)], mb: usize) -> (Env, std::path::PathBuf, Vec<u8>) {
    let mut e = Env::new();
    e.envs = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let f = e.tank().join("f");
    let data = noise(7, mb << 20);
    on_disk(&e, &f, &data);
    (e, f, data)
}

/// `data` is `f`'s, on disk (written, fsynced, its txg synced), and the
/// kernel holds none of its pages.
fn on_disk(e: &Env, f: &Path, data: &[u8]) {
    std::fs::write(f, data).expect("write");
    std::fs::File::open(f)
        .expect("open")
        .sync_all()
        .expect("fsync");
    e.ok(&["zpool", "sync", "tank"]);
    drop_pages(f);
}

#[test]
fn a_small_read_leaves_its_whole_record_in_the_kernel() {
    if !can_mount() {
        return;
    }
    let (e, f, data) = setup(&[], 1);
    assert!(
        resident(&f).iter().all(|r| !r),
        "pages left after dropping them"
    );
    let h = open_random(&f).expect("open");
    let mut b = vec![0u8; PAGE];
    h.read_exact_at(&mut b, 2 * REC as u64 + 8192)
        .expect("read");
    assert!(b[..] == data[2 * REC + 8192..2 * REC + 8192 + PAGE]);
    wait_for(&e, "one record stored", |e| {
        arcstat(e, "uzfs_kernel_stores") >= 1
    });
    let r = resident(&f);
    let rec = 2 * REC / PAGE..3 * REC / PAGE;
    assert!(
        r[rec.clone()].iter().all(|&x| x),
        "record 2 not all in the kernel: {:?}",
        &r[rec.clone()]
    );
    assert_eq!(
        r.iter().filter(|&&x| x).count(),
        REC / PAGE,
        "other records stored"
    );
    // What the kernel holds is the record's bytes.
    let mut whole = vec![0u8; REC];
    h.read_exact_at(&mut whole, 2 * REC as u64).expect("read");
    assert!(whole[..] == data[2 * REC..3 * REC], "stored bytes differ");
    // And the cache let its copy go: the kernel holds it.
    wait_for(&e, "record handed off", |e| {
        arcstat(e, "uzfs_handed_off") >= 1
    });
}

/// The same read with stores off leaves one page: the test above can
/// fail.
#[test]
fn without_stores_a_small_read_leaves_one_page() {
    if !can_mount() {
        return;
    }
    let (_e, f, _) = setup(&[("UZFS_FUSE_STORE", "0")], 1);
    let h = open_random(&f).expect("open");
    let mut b = vec![0u8; PAGE];
    h.read_exact_at(&mut b, 2 * REC as u64 + 8192)
        .expect("read");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(resident(&f).iter().filter(|&&x| x).count(), 1);
}

/// Readers read 4 KiB at random (each read of a record the kernel does
/// not hold queues a store of the rest of it) while a writer opens the
/// file, writes and closes, truncates it by name (a SETATTR without a
/// handle), and drops its clean pages now and then. Whatever the
/// interleaving, the file as the kernel shows it, and as the pool holds
/// it once the kernel's pages are dropped, is the model's: no store
/// lands over a write or past a truncate.
#[test]
fn stores_never_land_over_writes_or_truncates() {
    if !can_mount() {
        return;
    }
    let seed: u64 = std::env::var("UZFS_STORE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_5707);
    // Each store waits before it is sent: a writer's open meets one
    // being sent, and one queued before it was (dropped at the check).
    let (e, f, data) = setup(&[("UZFS_FUSE_STORE_DELAY_MS", "3")], 16);
    let model = Arc::new(std::sync::Mutex::new(data));
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for t in 0..3u64 {
        let (f, stop, model) = (f.clone(), stop.clone(), model.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = Rng(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut b = vec![0u8; PAGE];
            while !stop.load(Ordering::Relaxed) {
                let h = open_random(&f).expect("open");
                for _ in 0..64 {
                    let len = model.lock().map(|m| m.len()).unwrap_or(0);
                    let at = rng.below((len / PAGE).max(1) as u64) * PAGE as u64;
                    let _ = h.read_at(&mut b, at);
                }
            }
        }));
    }
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let mut rounds = 0u32;
    while t0.elapsed() < Duration::from_secs(4) {
        rounds += 1;
        let mut m = model.lock().expect("model");
        if rounds.is_multiple_of(16) {
            // The kernel lets the clean pages go: the readers' next reads
            // ask the daemon again and queue stores.
            drop_pages(&f);
        } else if rng.below(4) == 0 {
            // Truncate by name: shorter or longer, off page boundaries.
            let len = (8 << 20) + rng.below(16 << 20) as usize;
            let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: truncate(2) of a NUL-terminated path.
            let rc = unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) };
            assert_eq!(rc, 0, "truncate (seed {seed:#x})");
            m.resize(len, 0);
        } else {
            let h = std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .expect("open for writing");
            for _ in 0..1 + rng.below(4) {
                let n = 1 + rng.below(16 << 10) as usize;
                let at = rng.below(m.len() as u64 + 4096) as usize;
                let bytes = rng.bytes(n);
                h.write_all_at(&bytes, at as u64).expect("write");
                if m.len() < at + n {
                    m.resize(at + n, 0);
                }
                m[at..at + n].copy_from_slice(&bytes);
            }
        }
        drop(m);
        // Let the readers in: each round's records get read (and stored).
        std::thread::sleep(Duration::from_millis(rng.below(20)));
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    let want = model.lock().expect("model").clone();
    let check = |when: &str| {
        let got = std::fs::read(&f).expect("read back");
        assert_eq!(got.len(), want.len(), "size {when} (seed {seed:#x})");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("byte {i} differs {when} (seed {seed:#x}, {rounds} rounds)");
        }
    };
    std::thread::sleep(Duration::from_millis(1500));
    eprintln!(
        "{rounds} rounds, {} stores, {} dropped",
        arcstat(&e, "uzfs_kernel_stores"),
        arcstat(&e, "uzfs_kernel_stores_dropped")
    );
    check("through the kernel's pages");
    std::fs::File::open(&f)
        .expect("open")
        .sync_all()
        .expect("fsync");
    drop_pages(&f);
    check("from the pool");
    assert!(
        arcstat(&e, "uzfs_kernel_stores") > 0 || {
            std::thread::sleep(Duration::from_millis(1500));
            arcstat(&e, "uzfs_kernel_stores") > 0
        },
        "no store happened: the test exercised nothing"
    );
    e.export_and_zdb("tank");
}

/// A rollback while readers run: stores of the bytes they read before it
/// (queued, or held between their check and their copy) never land after
/// the rollback dropped the kernel's pages of the file, so the file reads
/// as the snapshot's, through the kernel's pages and from the pool.
#[test]
fn no_store_outlives_a_rollback() {
    if !can_mount() {
        return;
    }
    let (e, f, before) = setup(&[("UZFS_FUSE_STORE_DELAY_MS", "3")], 16);
    e.ok(&["zfs", "snapshot", "tank@a"]);
    let after = noise(8, before.len());
    on_disk(&e, &f, &after);
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for t in 0..3u64 {
        let (f, stop) = (f.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = Rng(0x2011_bac4 ^ (t + 1));
            let mut b = vec![0u8; PAGE];
            while !stop.load(Ordering::Relaxed) {
                // A descriptor may go stale across the rollback: errors
                // are expected here, only the final contents count.
                let Ok(h) = open_random(&f) else {
                    continue;
                };
                for _ in 0..64 {
                    let at = rng.below((16 << 20) / PAGE as u64) * PAGE as u64;
                    let _ = h.read_at(&mut b, at);
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(400));
    e.ok(&["zfs", "rollback", "tank@a"]);
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(arcstat(&e, "uzfs_kernel_stores") > 0, "no store happened");
    let check = |when: &str| {
        let got = std::fs::read(&f).expect("read back");
        assert_eq!(got.len(), before.len(), "size {when}");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != before[i]) {
            let which = if got[i] == after[i] {
                "the rewrite's"
            } else {
                "neither version's"
            };
            panic!("byte {i} is {which} {when}");
        }
    };
    check("through the kernel's pages");
    drop_pages(&f);
    check("from the pool");
    e.export_and_zdb("tank");
}
