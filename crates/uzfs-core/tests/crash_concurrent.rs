//! Crash safety under concurrency, as production runs: the sync thread on,
//! several worker threads doing random POSIX operations on two datasets at
//! once (sharing directories and names, so they race), and the power cut at
//! a random I/O.
//!
//! After the crash the pool is imported and checked:
//!
//! * zdb is clean, namespace included (`zpl/verify.rs`): every entry names
//!   a live object of its type, link counts and directory entry counts are
//!   exact, parent pointers right, every object reachable or in the
//!   unlinked set (files held open across the crash are there);
//! * operations are whole: the token files, which are only ever renamed
//!   (plain, no-replace and exchange, across directories), each exist
//!   exactly once; every 4 KiB record a single write call put in a file is
//!   there entirely or not at all; xattr values are whole;
//! * every fsync that returned is durable: each worker's progress record is
//!   at least the one it last fsynced;
//! * the filesystems keep working and zdb stays clean after more changes.
//!
//! A failing seed prints itself; `UZFS_CONC_CRASH_SEEDS=N` (default 12),
//! `UZFS_CONC_CRASH_BASE=B` pick the seeds. Thread interleaving is not
//! replayable (the OS schedules), so a seed reproduces the operation mix
//! and the cut point, not always the failure: run many.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uzfs_core::dsl::DsCtx;
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::zdb;
use uzfs_core::zpl::{SetAttr, Zpl};

const DIRS: [&[u8]; 3] = [b"a", b"b", b"c"];
const TOKENS: u64 = 8;
const REC: usize = 4096;
const WORKERS: u64 = 3;

/// The dnode cache bound is process-wide: the tests that set it take turns.
static DNODE_LIMIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn mount(p: &Arc<Pool>, name: &str) -> Zpl {
    mount_fs(p, name)
}

/// A self-describing 4 KiB record: (file tag, sequence) and a fill derived
/// from both, so a torn or mixed record is recognised.
fn record(tag: u64, seq: u64) -> Vec<u8> {
    let mut r = pattern(tag.wrapping_mul(1_000_003) ^ seq, REC);
    r[0..8].copy_from_slice(&tag.to_le_bytes());
    r[8..16].copy_from_slice(&seq.to_le_bytes());
    r
}

fn record_ok(r: &[u8]) -> bool {
    if r.iter().all(|&b| b == 0) {
        return true;
    }
    let w = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    r == record(w(0), w(1)).as_slice()
}

fn dir(fs: &Zpl, d: &[u8]) -> Option<u64> {
    fs.lookup(fs.root, d).ok().map(|a| a.ino)
}

/// Errors a racing operation may legitimately get; anything else (EINVAL
/// above all) is a bug, unless the power is out (EIO).
fn allowed(e: i32) -> bool {
    [
        libc::ENOENT,
        libc::EEXIST,
        libc::ENOTEMPTY,
        libc::ENOTDIR,
        libc::EISDIR,
        libc::ENOSPC,
        libc::ENODATA,
    ]
    .contains(&e)
}

struct Worker {
    id: u64,
    rng: SimRng,
    /// Open handles: (fs index, object) held across the crash.
    open: Vec<(usize, u64)>,
    seq: u64,
    /// The kind of the last operation (for a failure's message).
    op: u64,
}

impl Worker {
    fn step(&mut self, fss: &[Zpl], fsynced: &AtomicU64) -> Result<(), i32> {
        let rng = &mut self.rng;
        let fi = rng.below(fss.len() as u64) as usize;
        let fs = &fss[fi];
        let d = DIRS[rng.below(3) as usize];
        let dino = dir(fs, d).ok_or(libc::EIO)?;
        let name = format!("s{}", rng.below(6));
        let reg = libc::S_IFREG | 0o644;
        self.seq += 1;
        let tag = self.id << 48 | self.seq;
        self.op = rng.below(100);
        match self.op {
            0..=11 => {
                fs.mknod(dino, name.as_bytes(), reg, 0, 0, 0, None)?;
            }
            12..=31 => {
                let a = fs.lookup(dino, name.as_bytes())?;
                if a.z.is_dir() {
                    return Ok(());
                }
                let n = 1 + rng.below(8) as usize;
                let at = rng.below(24) * REC as u64;
                let mut buf = Vec::with_capacity(n * REC);
                for k in 0..n {
                    buf.extend(record(tag, k as u64));
                }
                fs.write(a.ino, at, &buf)?;
            }
            32..=37 => {
                let a = fs.lookup(dino, name.as_bytes())?;
                if a.z.is_dir() {
                    return Ok(());
                }
                let size = rng.below(30) * REC as u64;
                fs.setattr(
                    a.ino,
                    &SetAttr {
                        size: Some(size),
                        ..Default::default()
                    },
                )?;
            }
            38..=43 => {
                let a = fs.lookup(dino, name.as_bytes())?;
                fs.setattr(
                    a.ino,
                    &SetAttr {
                        mode: Some(0o600 | rng.below(0o100) as u32),
                        mtime: Some(rng.below(1 << 40) as i64),
                        ..Default::default()
                    },
                )?;
            }
            44..=51 => {
                fs.unlink(dino, name.as_bytes())?;
            }
            52..=55 => {
                // Open, then unlink: the file lives on in the unlinked set.
                let a = fs.lookup(dino, name.as_bytes())?;
                if a.z.is_dir() {
                    return Ok(());
                }
                fs.open(a.ino)?;
                self.open.push((fi, a.ino));
                fs.unlink(dino, name.as_bytes())?;
            }
            56..=58 => {
                if let Some((f, ino)) = self.open.pop() {
                    fss[f].release(ino)?;
                }
            }
            59..=64 => {
                let a = fs.lookup(dino, name.as_bytes())?;
                let d2 = dir(fs, DIRS[rng.below(3) as usize]).ok_or(libc::EIO)?;
                let n2 = format!("s{}", rng.below(6));
                fs.link(a.ino, d2, n2.as_bytes())?;
            }
            65..=70 => {
                let d2 = dir(fs, DIRS[rng.below(3) as usize]).ok_or(libc::EIO)?;
                let n2 = format!("s{}", rng.below(6));
                fs.rename(dino, name.as_bytes(), d2, n2.as_bytes(), 0)?;
            }
            71..=80 => {
                // Tokens: only ever moved, never replaced.
                let t = format!("t{}", rng.below(TOKENS));
                let t2 = format!("t{}", rng.below(TOKENS));
                let d2 = dir(fs, DIRS[rng.below(3) as usize]).ok_or(libc::EIO)?;
                let flags = if rng.chance(1, 2) {
                    libc::RENAME_EXCHANGE
                } else {
                    libc::RENAME_NOREPLACE
                };
                fs.rename(dino, t.as_bytes(), d2, t2.as_bytes(), flags)?;
            }
            81..=85 => {
                let a = fs.lookup(dino, name.as_bytes())?;
                let v = record(tag, 0);
                let len = 16 + rng.below(200) as usize;
                fs.setxattr(a.ino, b"user.rec", Some(&v[..len]), 0)?;
            }
            86..=90 => {
                fs.mknod(dino, b"sub", libc::S_IFDIR | 0o755, 0, 0, 0, None)?;
                let sub = fs.lookup(dino, b"sub")?.ino;
                fs.mknod(sub, name.as_bytes(), reg, 0, 0, 0, None)?;
            }
            91..=94 => {
                let sub = fs.lookup(dino, b"sub")?.ino;
                for e in fs.readdir(sub, 0, 100)? {
                    if e.3 != b"." && e.3 != b".." {
                        fs.unlink(sub, &e.3)?;
                    }
                }
                fs.rmdir(dino, b"sub")?;
            }
            _ => {
                // Progress record, then fsync: must survive the crash.
                let p = format!("p{}", self.id);
                let a = fs
                    .lookup(fss[0].root, p.as_bytes())
                    .or_else(|_| fss[0].mknod(fss[0].root, p.as_bytes(), reg, 0, 0, 0, None))?;
                let seq = self.seq;
                fss[0].write(a.ino, 0, &record(self.id << 48, seq))?;
                fss[0].fsync(a.ino)?;
                fsynced.fetch_max(seq, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

fn live_tunables() -> Tunables {
    Tunables {
        sync_thread: true,
        txg_timeout: Duration::from_millis(15),
        ..tunables()
    }
}

/// Import after the crash with the power failing again at a random I/O of
/// the recovery; returns the images the second cut leaves.
fn second_crash(images: Vec<(String, Vec<u8>)>, rng: &mut SimRng) -> Vec<(String, Vec<u8>)> {
    let w = SimWorld::new();
    let (_disks, found) = find(&w, images);
    w.cut_power_after(rng.below(400));
    if let Ok(pool) = Pool::import(&found, None, live_tunables()) {
        for name in ["cc", "cc/two"] {
            if let Ok(ds) = pool.dsl_pool().dataset(name) {
                if let Ok(fs) = Zpl::mount(ds.os.clone(), DsCtx::new(pool.clone(), ds)) {
                    let _ = fs.mknod(fs.root, b"x", libc::S_IFREG | 0o644, 0, 0, 0, None);
                    let _ = fs.fsync(fs.root);
                }
            }
        }
    }
    w.crash(rng)
}

/// Everything checked after a crash; returns (the power went while the
/// workers ran, it went in the middle of a sync, files seen) for the
/// test's statistics.
fn run_seed(seed: u64) -> (bool, bool, u64) {
    let mut rng = SimRng::new(seed);
    let world = SimWorld::new();
    let (_disks, top) = disk_or_mirror(&world, &mut rng);
    let mut o = opts(seed);
    o.tunables = live_tunables();
    let pool =
        Pool::create("cc", vec![top], o).unwrap_or_else(|e| panic!("seed {seed}: create: {e}"));
    pool.dsl_pool().format_root_fs().expect("format");
    // logbias=throughput: its whole 16 KiB blocks are logged by pointer
    // (written early and adopted by the txg), the other dataset's large
    // blocks too, its small ones copied.
    pool.dsl_pool()
        .create_dataset(
            "cc/two",
            &[
                ("recordsize".into(), "16K".into()),
                ("logbias".into(), "throughput".into()),
            ],
            false,
        )
        .expect("dataset");
    let names = ["cc", "cc/two"];
    let fss: Arc<Vec<Zpl>> = Arc::new(names.iter().map(|n| mount(&pool, n)).collect());
    for fs in fss.iter() {
        for d in DIRS {
            fs.mknod(fs.root, d, libc::S_IFDIR | 0o755, 0, 0, 0, None)
                .expect("mkdir");
        }
        let a = dir(fs, b"a").expect("a");
        for t in 0..TOKENS {
            let f = fs
                .mknod(
                    a,
                    format!("t{t}").as_bytes(),
                    libc::S_IFREG | 0o644,
                    0,
                    0,
                    0,
                    None,
                )
                .expect("token");
            fs.write(f.ino, 0, &t.to_le_bytes()).expect("token data");
        }
    }
    pool.txg_wait_synced().expect("sync");
    world.cut_power_after(10 + rng.below(400));
    let fsynced: Arc<Vec<AtomicU64>> = Arc::new((0..WORKERS).map(|_| AtomicU64::new(0)).collect());
    let handles: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (fss, fsynced, world) = (fss.clone(), fsynced.clone(), world.clone());
            let mut w = Worker {
                id,
                rng: SimRng::new(seed * 31 + id),
                open: Vec::new(),
                seq: 0,
                op: 0,
            };
            // As a mount's writes: through the kernel's page cache, so
            // that `Never` leaves streamed records uncached.
            std::thread::spawn(move || {
                uzfs_core::dmu::objset::through_page_cache(|| {
                    let mut done = 0;
                    for _ in 0..400 {
                        match w.step(&fss, &fsynced[id as usize]) {
                            Ok(()) => done += 1,
                            Err(_) if world.power_lost() => break,
                            Err(e) => assert!(
                                allowed(e),
                                "seed {seed}: worker {id}: errno {e} from operation kind {}",
                                w.op
                            ),
                        }
                    }
                    (w.open.len(), done)
                })
            })
        })
        .collect();
    let (mut held_open, mut done) = (0, 0);
    for h in handles {
        let (o, d) = h
            .join()
            .unwrap_or_else(|_| panic!("seed {seed}: a worker failed"));
        held_open += o;
        done += d;
    }
    let txg_at_cut = pool.last_txg();
    let crashed_in_run = world.power_lost();
    world.cut_power_after(0);
    // Writes issued and not flushed when the power went: a sync was in
    // the middle of its work (the sync thread issues every write here).
    let mid_sync = world.volatile_writes() > 0;
    let fsynced: Vec<u64> = fsynced.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    let images = world.crash(&mut rng);
    drop(fss);
    drop(pool);
    // Every third seed: the power fails again during the recovery (the
    // import, the mount that reaps the unlinked set, the first syncs).
    let images = if seed.is_multiple_of(3) {
        second_crash(images, &mut rng)
    } else {
        images
    };

    let w2 = SimWorld::new();
    let (disks2, found) = find(&w2, images);
    // Before anything mounts (which reaps the unlinked set).
    let report = zdb::verify(devs(&disks2)).unwrap_or_else(|e| panic!("seed {seed}: zdb: {e}"));
    assert!(
        report.is_clean(),
        "seed {seed}: zdb after the crash:\n{}",
        zdb::format_report(&report)
    );
    let pool = Pool::import(&found, None, tunables())
        .unwrap_or_else(|e| panic!("seed {seed}: import: {e}"));
    eprintln!(
        "seed {seed}: {done} operations, {held_open} files held open, cut {}{} at txg {txg_at_cut}, imported txg {}, {} unlinked, {} files",
        if crashed_in_run { "during the run" } else { "after it" },
        if mid_sync { " in the middle of a sync" } else { "" },
        pool.last_txg(),
        report.ns_stats.unlinked,
        report.ns_stats.files
    );
    let fss: Vec<Zpl> = names.iter().map(|n| mount(&pool, n)).collect();
    let mut files = 0;
    for (fi, fs) in fss.iter().enumerate() {
        let mut tokens: BTreeMap<u64, u32> = BTreeMap::new();
        for d in DIRS {
            let dino = dir(fs, d).expect("dir");
            for e in fs.readdir(dino, 0, 10_000).expect("readdir") {
                if e.3 == b"." || e.3 == b".." {
                    continue;
                }
                let a = fs.getattr(e.1).expect("getattr");
                if a.z.is_dir() {
                    continue;
                }
                files += 1;
                let data = fs.read(e.1, 0, a.size as usize).expect("read");
                if e.3.starts_with(b"t") {
                    let id = u64::from_le_bytes(
                        data.get(..8)
                            .and_then(|b| b.try_into().ok())
                            .unwrap_or([0xff; 8]),
                    );
                    *tokens.entry(id).or_default() += 1;
                    continue;
                }
                for (k, r) in data.chunks(REC).enumerate() {
                    assert!(
                        r.len() < REC || record_ok(r),
                        "seed {seed}: fs {fi} {}: record {k} is torn",
                        String::from_utf8_lossy(&e.3)
                    );
                }
                if let Ok(v) = fs.getxattr(e.1, b"user.rec") {
                    let whole = record(u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8])), 0);
                    assert!(
                        whole.starts_with(&v),
                        "seed {seed}: fs {fi}: xattr value torn"
                    );
                }
            }
        }
        let want: BTreeMap<u64, u32> = (0..TOKENS).map(|t| (t, 1)).collect();
        assert_eq!(
            tokens, want,
            "seed {seed}: fs {fi}: token files lost or doubled (a rename was split)"
        );
    }
    for (id, &seq) in fsynced.iter().enumerate() {
        if seq == 0 {
            continue;
        }
        let fs = &fss[0];
        let a = fs
            .lookup(fs.root, format!("p{id}").as_bytes())
            .unwrap_or_else(|_| panic!("seed {seed}: progress file {id} lost"));
        let r = fs.read(a.ino, 0, REC).expect("read progress");
        assert!(record_ok(&r), "seed {seed}: progress record torn");
        let got = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
        assert!(
            got >= seq,
            "seed {seed}: worker {id} fsynced record {seq}, found {got}"
        );
    }
    // Keeps working, and stays consistent.
    let fs = &fss[1];
    let f = fs
        .mknod(fs.root, b"after", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("create after import");
    fs.write(f.ino, 0, &pattern(seed, 50_000)).expect("write");
    fs.fsync(f.ino).expect("fsync");
    drop(fss);
    pool.close().expect("close");
    assert_zdb_clean(&disks2, &format!("seed {seed}: after more changes"));
    (crashed_in_run, mid_sync, files)
}

#[test]
fn concurrent_operations_survive_power_cuts() {
    let n: u64 = env_u64("UZFS_CONC_CRASH_SEEDS", 12);
    let base: u64 = env_u64("UZFS_CONC_CRASH_BASE", 0);
    let (mut during, mut mid) = (0, 0);
    let _limit = DNODE_LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    for seed in base..base + n {
        // Odd seeds keep four dnodes per object set: eviction then races
        // with every publication (`Objset::synced_dnode`).
        uzfs_core::dmu::objset::set_dnode_cache_max(if seed % 2 == 1 {
            4
        } else {
            uzfs_core::dmu::objset::DNODE_CACHE_MAX
        });
        // Seeds 4k+2 and 4k+3 keep no streamed data in the cache, so its
        // record buffers are recycled into the next writes
        // (`dmu/bufpool.rs`) while the workers and the sync run.
        uzfs_core::spa::io::set_cache_written(if seed % 4 >= 2 {
            uzfs_core::spa::io::CacheWritten::Never
        } else {
            uzfs_core::spa::io::CacheWritten::Always
        });
        // Odd seeds leave partly written records to the sync
        // (`dmu/partial.rs`, off by default).
        uzfs_core::dmu::partial::set_fill_at_sync(seed % 2 == 1);
        let (crashed, in_sync, _files) = run_seed(seed);
        during += crashed as u64;
        mid += in_sync as u64;
    }
    eprintln!("{n} seeds: {during} cut while the workers ran, {mid} in the middle of a sync");
    assert!(
        during * 2 >= n,
        "only {during} of {n} seeds cut the power while the workers ran"
    );
    assert!(
        mid * 3 >= n,
        "only {mid} of {n} seeds cut the power in the middle of a sync"
    );
}

/// A dnode cache of eight entries under three writers and the sync thread:
/// every file reads back with the size and bytes written (a dnode read from
/// a tree replaced meanwhile is never cached over the newer one), and the
/// cache stays within its bound.
#[test]
fn a_tiny_dnode_cache_stays_bounded_and_right() {
    let world = SimWorld::new();
    let mut rng = SimRng::new(7);
    let (disks, top) = disk_or_mirror(&world, &mut rng);
    let mut o = opts(7);
    o.tunables = live_tunables();
    let pool = Pool::create("dc", vec![top], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = Arc::new(mount(&pool, "dc"));
    let (ds, ino_count) = (pool.dsl_pool().dataset("dc").expect("dataset"), 60u64);
    let _limit = DNODE_LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    uzfs_core::dmu::objset::set_dnode_cache_max(8);
    let handles: Vec<_> = (0..3u64)
        .map(|w| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut inos = Vec::new();
                for i in 0..ino_count {
                    let name = format!("w{w}f{i}");
                    let f = fs
                        .mknod(
                            fs.root,
                            name.as_bytes(),
                            libc::S_IFREG | 0o644,
                            0,
                            0,
                            0,
                            None,
                        )
                        .expect("create");
                    inos.push(f.ino);
                    // Rewrite the earlier files: their dnodes change every txg.
                    for (j, &ino) in inos.iter().enumerate() {
                        if j % 7 == i as usize % 7 {
                            let len = (i as usize + 1) * 100 + j;
                            fs.write(ino, 0, &vec![w as u8 + 1; len]).expect("write");
                        }
                    }
                    let _ = fs.getattr(inos[i as usize / 2]).expect("stat");
                }
                inos
            })
        })
        .collect();
    let all: Vec<Vec<u64>> = handles
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    pool.txg_wait_synced().expect("sync");
    for (w, inos) in all.iter().enumerate() {
        for (j, &ino) in inos.iter().enumerate() {
            // The last write to file j came at the last i >= j with
            // j % 7 == i % 7.
            let last_i = (j as u64..ino_count)
                .rev()
                .find(|i| j % 7 == *i as usize % 7);
            let want = last_i.map_or(0, |i| (i as usize + 1) * 100 + j);
            let attr = fs.getattr(ino).expect("stat");
            assert_eq!(attr.size, want as u64, "worker {w} file {j}");
            let data = fs.read(ino, 0, want).expect("read");
            assert!(
                data.iter().all(|&b| b == w as u8 + 1),
                "worker {w} file {j} bytes"
            );
        }
    }
    assert!(
        ds.os.cached_dnodes() <= 8,
        "dnode cache holds {}",
        ds.os.cached_dnodes()
    );
    uzfs_core::dmu::objset::set_dnode_cache_max(uzfs_core::dmu::objset::DNODE_CACHE_MAX);
    drop((fs, ds));
    pool.export().expect("export");
    let report = zdb::verify(devs(&disks)).expect("zdb");
    assert!(report.is_clean(), "{}", zdb::format_report(&report));
}
