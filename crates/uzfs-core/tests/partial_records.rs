//! Partly written records (`dmu/partial.rs`, `set_fill_at_sync(true)`,
//! off by default): a write of part of a record that is not in memory
//! reads nothing; the rest of the record is filled
//! in by a read or by the sync, from the version below the open txg.
//! Checked against a byte model of every file, with the sync, reads and
//! cache drops racing the writes, and across export and import.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use uzfs_core::spa::config::FailMode;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimDevice, SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::{SetAttr, Zpl};

const REG: u32 = libc::S_IFREG | 0o644;
const REC: usize = 128 << 10;

fn data_misses(p: &Pool) -> u64 {
    p.io.cache.arcstats().counters.demand_data_misses
}

fn check(fs: &Zpl, ino: u64, model: &[u8], what: &str) {
    let got = fs.read(ino, 0, model.len() + 4096).expect("read");
    assert_eq!(got.len(), model.len(), "{what}: size");
    if let Some(i) = (0..model.len()).find(|&i| got[i] != model[i]) {
        panic!(
            "{what}: byte {i} (record {}, offset {}) is {} where {} was written",
            i / REC,
            i % REC,
            got[i],
            model[i]
        );
    }
}

fn write(fs: &Zpl, ino: u64, model: &mut Vec<u8>, off: usize, data: &[u8]) {
    fs.write(ino, off as u64, data).expect("write");
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

fn truncate(fs: &Zpl, ino: u64, model: &mut Vec<u8>, size: usize) {
    let a = SetAttr {
        size: Some(size as u64),
        ..Default::default()
    };
    fs.setattr(ino, &a).expect("truncate");
    model.resize(size, 0);
}

/// A file `name` of `len` bytes of pattern `seed`, synced: its object and
/// model.
fn laid_out(fs: &Zpl, p: &Pool, name: &[u8], seed: u64, len: usize) -> (u64, Vec<u8>) {
    let ino = fs
        .mknod(fs.root, name, REG, 0, 0, 0, None)
        .expect("create")
        .ino;
    let mut model = Vec::new();
    write(fs, ino, &mut model, 0, &pattern(seed, len));
    p.sync().expect("sync");
    (ino, model)
}

/// Close `p` (after `fs` is dropped), import its images, check every file
/// against its model, and zdb the result.
fn reimported_matches(
    p: Arc<Pool>,
    disks: &[SimDevice],
    seed: u64,
    files: &[(u64, Vec<u8>)],
    what: &str,
) {
    let imgs = images(disks);
    p.close().expect("close");
    let (d2, p2) = import_images(imgs, seed);
    let fs = mount_fs(&p2, "tank");
    for (i, (ino, model)) in files.iter().enumerate() {
        check(&fs, *ino, model, &format!("{what}: file {i} imported"));
    }
    drop(fs);
    p2.close().expect("close");
    assert_zdb_clean(&d2, what);
}

/// Writes of part of records that are on disk only: no data read at the
/// write; the sync fills them in; a read before the sync fills them too;
/// a record rewritten whole in pieces is never read; a record written in
/// part in two txgs in a row keeps both.
#[test]
fn partial_writes_read_nothing_and_are_filled_right() {
    uzfs_core::dmu::partial::set_fill_at_sync(true);
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 21);
    let fs = mount_fs(&p, "tank");
    let (ino, mut model) = laid_out(&fs, &p, b"f", 1, 8 * REC);

    // One piece in each record, none of them in memory.
    p.io.cache.clear();
    let m0 = data_misses(&p);
    for r in 0..8 {
        write(
            &fs,
            ino,
            &mut model,
            r * REC + 8192 + r * 100,
            &pattern(10 + r as u64, 4096),
        );
    }
    assert_eq!(data_misses(&p), m0, "a partial write read its record");
    assert_eq!(p.io.partial.stats().deferred, 8);
    p.sync().expect("sync");
    p.io.cache.clear();
    check(&fs, ino, &model, "filled by the sync");

    // Read before the sync: filled by the read, then synced as it is.
    p.io.cache.clear();
    write(&fs, ino, &mut model, 3 * REC + 100, &pattern(30, 5000));
    check(&fs, ino, &model, "filled by a read");
    write(&fs, ino, &mut model, 3 * REC + 60_000, &pattern(31, 700));
    p.sync().expect("sync");
    p.io.cache.clear();
    check(&fs, ino, &model, "read, written again, synced");

    // A record rewritten in 16 KiB pieces: whole once covered, no read.
    p.io.cache.clear();
    let m1 = data_misses(&p);
    for k in 0..8 {
        write(
            &fs,
            ino,
            &mut model,
            5 * REC + k * 16384,
            &pattern(40 + k as u64, 16384),
        );
    }
    p.sync().expect("sync");
    assert_eq!(
        data_misses(&p),
        m1,
        "a record written whole in pieces was read"
    );
    assert!(p.io.partial.stats().covered > 0);
    p.io.cache.clear();
    check(&fs, ino, &model, "rewritten in pieces");

    // A punch after a partial write drops it; a partial write after a
    // punch is over zeros; a truncate inside a partial record.
    p.io.cache.clear();
    write(&fs, ino, &mut model, 6 * REC + 10, &pattern(50, 100));
    fs.fallocate(
        ino,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        6 * REC as u64,
        REC as u64,
    )
    .expect("punch");
    model[6 * REC..7 * REC].fill(0);
    write(&fs, ino, &mut model, 6 * REC + 500, &pattern(51, 100));
    write(&fs, ino, &mut model, 7 * REC + 900, &pattern(52, 100));
    truncate(&fs, ino, &mut model, 7 * REC + 20_000);
    p.sync().expect("sync");
    p.io.cache.clear();
    check(&fs, ino, &model, "punched and truncated");

    // Part of a record in one txg, another part while it syncs (its
    // device reads slowed down): the second lies over the first, which
    // lies over the record on disk.
    p.io.cache.clear();
    write(&fs, ino, &mut model, REC + 1000, &pattern(60, 3000));
    world.set_read_hook(Some(Arc::new(|_: &str, _: u64, len: usize| {
        if len >= REC {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    })));
    let os = fs.os.clone();
    let frozen = os.generation();
    let p2 = p.clone();
    let syncer = std::thread::spawn(move || p2.sync().expect("sync"));
    while os.generation() == frozen {
        std::thread::yield_now();
    }
    write(&fs, ino, &mut model, REC + 2000, &pattern(61, 3000));
    world.set_read_hook(None);
    check(&fs, ino, &model, "over a syncing partial record");
    syncer.join().expect("join");
    p.sync().expect("sync");
    p.io.cache.clear();
    check(&fs, ino, &model, "two txgs in a row");

    drop(fs);
    reimported_matches(p, &disks, 21, &[(ino, model)], "partial records");
}

/// Writers (each owning a file), readers, and a thread syncing and
/// dropping the cache, all at once; every file against its model, at the
/// end and after import. `UZFS_PARTIAL_SEEDS` seeds (default 4).
#[test]
fn partial_records_under_concurrency_match_the_model() {
    uzfs_core::dmu::partial::set_fill_at_sync(true);
    let all = over_seeds(concurrency_case);
    // Every path was taken.
    assert!(all.deferred > 0, "{all:?}");
    assert!(all.filled_by_sync > 0, "{all:?}");
    assert!(all.filled_by_read > 0, "{all:?}");
}

/// `case` for `UZFS_PARTIAL_SEEDS` seeds (default 4): what became of
/// partial records, summed.
fn over_seeds(case: fn(u64) -> uzfs_core::dmu::partial::Stats) -> uzfs_core::dmu::partial::Stats {
    let mut all = uzfs_core::dmu::partial::Stats::default();
    for seed in 0..env_u64("UZFS_PARTIAL_SEEDS", 4) {
        let s = case(seed);
        all.deferred += s.deferred;
        all.covered += s.covered;
        all.filled_by_read += s.filled_by_read;
        all.filled_by_sync += s.filled_by_sync;
        all.retrieved += s.retrieved;
        all.retrieve_missed += s.retrieve_missed;
    }
    all
}

/// A writer per file, at once: 400 random operations each (`random_op`),
/// then the file against its model. `stream` separates the random
/// streams of different tests.
fn run_writers(fs: &Zpl, files: &[(u64, &Mutex<Vec<u8>>)], seed: u64, stream: u64) {
    std::thread::scope(|s| {
        for (w, &(ino, model)) in files.iter().enumerate() {
            s.spawn(move || {
                let mut rng = SimRng::new(seed * 1000 + stream + w as u64);
                for step in 0..400 {
                    let what = format!("seed {seed} writer {w} step {step}");
                    random_op(fs, ino, model, &mut rng, &what);
                }
                let m = model.lock().expect("model");
                check(fs, ino, &m, &format!("seed {seed} writer {w} at the end"));
            });
        }
    });
}

/// The sync in a loop, dropping the cache every other time, until `stop`.
fn syncer(p: &Arc<Pool>, stop: &Arc<AtomicBool>, seed: u64) -> std::thread::JoinHandle<()> {
    let (p, stop) = (p.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut rng = SimRng::new(seed ^ 0x5eed);
        while !stop.load(Ordering::Relaxed) {
            p.sync().expect("sync");
            if rng.chance(1, 2) {
                p.io.cache.clear();
            }
            std::thread::sleep(std::time::Duration::from_millis(rng.below(4)));
        }
    })
}

/// One random operation on file `ino`: a write (mostly), a punch, a
/// truncate or a read checked against `model`. The model changes first,
/// then the ZPL hears of it, as a kernel's page cache changes before its
/// writeback (the model is only read in between by a fake kernel).
fn random_op(fs: &Zpl, ino: u64, model: &Mutex<Vec<u8>>, rng: &mut SimRng, what: &str) {
    let len = model.lock().expect("model").len().max(1);
    match rng.below(20) {
        0..=12 => {
            let off = rng.below(len as u64 + 4096) as usize;
            let most = if rng.chance(1, 4) { 3 * REC } else { 20_000 };
            let n = 1 + rng.below(most as u64) as usize;
            let mut d = vec![0u8; n];
            rng.fill(&mut d);
            {
                let mut m = model.lock().expect("model");
                if m.len() < off + n {
                    m.resize(off + n, 0);
                }
                m[off..off + n].copy_from_slice(&d);
            }
            fs.write(ino, off as u64, &d).expect("write");
        }
        13 => {
            let off = rng.below(len as u64) as usize;
            let n = 1 + rng.below(2 * REC as u64) as usize;
            {
                let mut m = model.lock().expect("model");
                let end = (off + n).min(m.len());
                m[off..end].fill(0);
            }
            fs.fallocate(
                ino,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as u64,
                n as u64,
            )
            .expect("punch");
        }
        14 => {
            let size = rng.below(26 * REC as u64) as usize;
            model.lock().expect("model").resize(size, 0);
            let a = SetAttr {
                size: Some(size as u64),
                ..Default::default()
            };
            fs.setattr(ino, &a).expect("truncate");
        }
        _ => {
            let off = rng.below(len as u64) as usize;
            let n = 1 + rng.below(2 * REC as u64) as usize;
            let got = fs.read(ino, off as u64, n).expect("read");
            let m = model.lock().expect("model");
            let end = (off + n).min(m.len());
            assert!(got == m[off.min(end)..end], "{what}: read {off}+{n}");
        }
    }
}

fn concurrency_case(seed: u64) -> uzfs_core::dmu::partial::Stats {
    const WRITERS: usize = 2;
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 100 + seed);
    let fs = Arc::new(mount_fs(&p, "tank"));
    let mut inos = Vec::new();
    let mut models = Vec::new();
    for w in 0..WRITERS {
        let name = format!("f{w}");
        let ino = fs
            .mknod(fs.root, name.as_bytes(), REG, 0, 0, 0, None)
            .expect("create")
            .ino;
        let mut m = Vec::new();
        write(
            &fs,
            ino,
            &mut m,
            0,
            &pattern(seed * 10 + w as u64, 24 * REC),
        );
        inos.push(ino);
        models.push(m);
    }
    p.sync().expect("sync");
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = syncer(&p, &stop, seed);
    let reader = {
        let (fs, stop, inos) = (fs.clone(), stop.clone(), inos.clone());
        std::thread::spawn(move || {
            let mut rng = SimRng::new(seed ^ 0xbead);
            while !stop.load(Ordering::Relaxed) {
                let ino = inos[rng.below(inos.len() as u64) as usize];
                let off = rng.below(25 * REC as u64);
                let _ = fs.read(ino, off, 1 + rng.below(2 * REC as u64) as usize);
            }
        })
    };
    let models: Vec<Mutex<Vec<u8>>> = models.into_iter().map(Mutex::new).collect();
    let owned: Vec<(u64, &Mutex<Vec<u8>>)> = inos.iter().copied().zip(&models).collect();
    run_writers(&fs, &owned, seed, 0);
    stop.store(true, Ordering::Relaxed);
    syncer.join().expect("syncer");
    reader.join().expect("reader");
    let stats = p.io.partial.stats();
    p.sync().expect("sync");
    p.io.cache.clear();
    for (w, (&ino, m)) in inos.iter().zip(&models).enumerate() {
        check(
            &fs,
            ino,
            &m.lock().expect("model"),
            &format!("seed {seed} file {w} synced"),
        );
    }
    let fs = Arc::try_unwrap(fs).ok().expect("the only mount");
    drop(fs);
    let files: Vec<(u64, Vec<u8>)> = inos
        .iter()
        .zip(models)
        .map(|(&ino, m)| (ino, m.into_inner().expect("model")))
        .collect();
    reimported_matches(p, &disks, 100 + seed, &files, &format!("seed {seed}"));
    stats
}

/// The sync cannot read a partly written record's old version: on a
/// mirror the other side answers; on a single disk the sync parks (the
/// pool suspends), `zpool clear` with the reads still failing parks it
/// again, and once reads work it resumes and the write lands.
#[test]
fn a_failed_read_of_a_partial_record_parks_the_sync_until_clear() {
    uzfs_core::dmu::partial::set_fill_at_sync(true);
    for mirror in [true, false] {
        let world = SimWorld::new();
        let n = if mirror { 2 } else { 1 };
        let disks: Vec<_> = (0..n).map(|i| world.disk(&format!("d{i}"), DISK)).collect();
        let kind = if mirror {
            TopKind::Mirror
        } else {
            TopKind::Disk
        };
        let mut o = opts(31);
        o.tunables.sync_thread = true;
        let p = Pool::create("tank", vec![spec(kind, &disks)], o).expect("create");
        p.set_failmode(FailMode::Continue).expect("failmode");
        p.dsl_pool().format_root_fs().expect("format");
        let fs = mount_fs(&p, "tank");
        let (ino, mut model) = laid_out(&fs, &p, b"f", 7, 4 * REC);
        // Indirect blocks stay cached; the records do not.
        fs.read(ino, 0, 1).expect("read");
        p.io.cache.clear();
        fs.read(ino, 0, 1).expect("read");
        disks[0].fail_reads(true);
        write(&fs, ino, &mut model, 2 * REC + 77, &pattern(8, 1000));
        if mirror {
            p.sync().expect("the other side answers");
        } else {
            // The sync thread's sync (it parks; a sync called by hand
            // would fail for good instead).
            let waiter = {
                let p = p.clone();
                std::thread::spawn(move || p.txg_wait_synced())
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !p.io.suspension.parked() {
                assert!(std::time::Instant::now() < deadline, "never parked");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let why = p.suspended().expect("suspended");
            assert!(why.contains("partly written record"), "{why}");
            p.clear(None).expect_err("reads still fail");
            disks[0].fail_reads(false);
            p.clear(None).expect("clear resumes");
            let _ = waiter.join().expect("join");
            p.txg_wait_synced().expect("the sync after the resume");
        }
        disks[0].fail_reads(false);
        p.io.cache.clear();
        check(&fs, ino, &model, &format!("mirror {mirror}"));
        drop(fs);
        reimported_matches(p, &disks, 31, &[(ino, model)], &format!("mirror {mirror}"));
    }
}

/// A mount's kernel, for the model test below: the pages it holds are the
/// writers' models (updated before each change reaches the ZPL, as the
/// kernel's page cache is before its writeback), and it answers each
/// request later, from another thread: a prefix of the range up to the
/// model's size, sometimes cut short at a page (a page it no longer
/// held), sometimes never; mostly with the model as it is when it
/// answers (the kernel copies the pages then), sometimes as it was when
/// asked (harsher than the kernel: pages a punch or truncate dropped
/// meanwhile).
struct FakeKernel {
    tx: Mutex<std::sync::mpsc::Sender<Asked>>,
    next: std::sync::atomic::AtomicU64,
    files: Vec<(u64, Arc<Mutex<Vec<u8>>>)>,
}

/// (object, offset, length, request number, the model when asked)
type Asked = (u64, u64, usize, u64, Option<Vec<u8>>);

impl uzfs_core::zpl::pagecache::PageCache for FakeKernel {
    fn request(&self, obj: u64, offset: u64, len: usize) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let then = n
            .is_multiple_of(3)
            .then(|| self.files.iter().find(|(i, _)| *i == obj))
            .flatten()
            .map(|(_, m)| m.lock().expect("model").clone());
        let sent = self
            .tx
            .lock()
            .expect("kernel")
            .send((obj, offset, len, n, then))
            .is_ok();
        if sent {
            n
        } else {
            0
        }
    }
}

/// Writes, punches, truncates and reads racing the sync thread and cache
/// drops, as in `partial_records_under_concurrency_match_the_model`, but
/// with the rest of each patched record coming from a kernel's page cache
/// (`zpl/pagecache.rs`) answering late, short or never: every file matches
/// its model throughout, after the sync and after import; zdb is clean.
#[test]
fn records_filled_from_the_kernels_pages_match_the_model() {
    // Also writes the kernel is not asked about leave partial records
    // (as for every test in this file).
    uzfs_core::dmu::partial::set_fill_at_sync(true);
    let all = over_seeds(kernel_case);
    assert!(all.retrieved > 0, "{all:?}");
    assert!(all.retrieve_missed > 0, "{all:?}");
    assert!(all.filled_by_sync > 0, "{all:?}");
}

fn kernel_case(seed: u64) -> uzfs_core::dmu::partial::Stats {
    const WRITERS: usize = 2;
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 300 + seed);
    let fs = Arc::new(mount_fs(&p, "tank"));
    let mut files = Vec::new();
    for w in 0..WRITERS {
        let (ino, m) = laid_out(
            &fs,
            &p,
            format!("k{w}").as_bytes(),
            seed * 10 + w as u64,
            24 * REC,
        );
        files.push((ino, Arc::new(Mutex::new(m))));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Asked>();
    fs.set_page_cache(Arc::new(FakeKernel {
        tx: Mutex::new(tx),
        next: std::sync::atomic::AtomicU64::new(1),
        files: files.clone(),
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let kernel = {
        let (fs, files, done) = (fs.clone(), files.clone(), done.clone());
        std::thread::spawn(move || {
            let mut rng = SimRng::new(seed ^ 0x4e41);
            loop {
                let (obj, off, len, n, then) =
                    match rx.recv_timeout(std::time::Duration::from_millis(5)) {
                        Ok(r) => r,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if done.load(Ordering::Relaxed) {
                                break;
                            }
                            continue;
                        }
                        Err(_) => break,
                    };
                if rng.chance(1, 10) {
                    continue; // never answered
                }
                if rng.chance(1, 3) {
                    std::thread::sleep(std::time::Duration::from_micros(rng.below(3000)));
                }
                let Some((_, m)) = files.iter().find(|(i, _)| *i == obj) else {
                    continue;
                };
                let m = match then {
                    Some(t) => t,
                    None => m.lock().expect("model").clone(),
                };
                let (off, mut end) = (off as usize, (off as usize + len).min(m.len()));
                if rng.chance(1, 8) {
                    end = end.min(off + 4096 * rng.below(32) as usize);
                }
                let data = m[off.min(end)..end].to_vec();
                fs.fill_from_page_cache(obj, off as u64, &data, n);
            }
        })
    };
    let syncer = syncer(&p, &stop, seed);
    let owned: Vec<(u64, &Mutex<Vec<u8>>)> = files.iter().map(|(i, m)| (*i, m.as_ref())).collect();
    run_writers(&fs, &owned, seed, 500);
    stop.store(true, Ordering::Relaxed);
    syncer.join().expect("syncer");
    done.store(true, Ordering::Relaxed);
    kernel.join().expect("kernel");
    let stats = p.io.partial.stats();
    p.sync().expect("sync");
    p.io.cache.clear();
    let files: Vec<(u64, Vec<u8>)> = files
        .iter()
        .map(|(ino, m)| (*ino, m.lock().expect("model").clone()))
        .collect();
    for (w, (ino, m)) in files.iter().enumerate() {
        check(&fs, *ino, m, &format!("seed {seed} file {w} synced"));
    }
    drop(fs);
    reimported_matches(
        p,
        &disks,
        300 + seed,
        &files,
        &format!("kernel seed {seed}"),
    );
    stats
}

/// The kernel's answer for a partial block counts only in the txg the
/// block was made in (`Objset::fill_partial`'s `txg`). The case it
/// guards, set up deterministically: a record patched in txg T is asked
/// for; T syncs (the sync fills the record from the device and writes
/// it); a second patch in T+1 leaves a new partial block over T's
/// version. The answer to T's question holds the record as it was before
/// T's patch: laid over T+1's partial block it would undo T's patch.
/// It is refused, and the record reads back with both patches.
#[test]
fn an_answer_for_a_closed_txg_never_fills_a_later_partial_block() {
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 61);
    let fs = mount_fs(&p, "tank");
    let (ino, mut model) = laid_out(&fs, &p, b"f", 3, 2 * REC);
    let before = model[..REC].to_vec();
    let defer = |off: usize, data: &[u8], model: &mut Vec<u8>| {
        uzfs_core::dmu::partial::deferring(|| fs.os.write(ino, off as u64, data)).expect("write");
        model[off..off + data.len()].copy_from_slice(data);
    };

    // T: a patch of the uncached record leaves a partial block.
    p.io.cache.clear();
    let t = fs.os.open_txg();
    defer(1000, &pattern(4, 3000), &mut model);
    assert!(fs.os.is_partial(ino, 0), "T's patch left no partial block");
    p.sync().expect("sync T");

    // T+1: another patch, over T's version, which is not in memory.
    p.io.cache.clear();
    defer(70_000, &pattern(5, 2000), &mut model);
    assert!(
        fs.os.is_partial(ino, 0),
        "T+1's patch left no partial block"
    );
    assert!(fs.os.open_txg() > t);

    // The kernel's late answer to T's question.
    assert!(
        !fs.os.fill_partial(ino, 0, before.clone(), t).expect("fill"),
        "an answer for txg {t} filled a partial block of txg {}",
        fs.os.open_txg()
    );
    check(&fs, ino, &model, "after the stale answer");
    p.sync().expect("sync T+1");
    p.io.cache.clear();
    check(&fs, ino, &model, "synced");

    // An answer in its own txg, with the record as it is, is taken.
    p.io.cache.clear();
    let now = fs.os.open_txg();
    let base = model[..REC].to_vec();
    defer(100_000, &pattern(6, 1000), &mut model);
    assert!(
        fs.os.fill_partial(ino, 0, base, now).expect("fill"),
        "an answer in its own txg was refused"
    );
    check(&fs, ino, &model, "filled by the kernel");
    p.sync().expect("sync");
    drop(fs);
    reimported_matches(p, &disks, 61, &[(ino, model)], "txg guard");
}

/// Under a mount (`partial::deferring`), a write of part of a record the
/// cache holds leaves a partial block that holds only the bytes written:
/// the open txg's dirty bytes are those bytes, not whole records, so 4
/// KiB pages written back into thousands of records do not fill the
/// dirty bound and force syncs that rewrite each record again and again.
/// The sync fills them from the cache (no device read), in batches
/// (more records here than one batch takes), and a punch gives back
/// exactly what the records it drops held.
#[test]
fn patches_of_cached_records_hold_only_the_bytes_written() {
    const RECORDS: usize = 270;
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 71);
    let fs = mount_fs(&p, "tank");
    let (ino, mut model) = laid_out(&fs, &p, b"f", 7, RECORDS * REC);
    check(&fs, ino, &model, "laid out");
    let d0 = p.io.partial.stats().deferred;
    let f0 = p.io.partial.stats().filled_by_sync;
    let m0 = data_misses(&p);
    assert_eq!(fs.os.open_dirty_bytes(), 0);

    let mut written = 0u64;
    let mut record_bytes = vec![0u64; RECORDS];
    for (r, held) in record_bytes.iter_mut().enumerate() {
        let off = r * REC + ((r * 7) % 31) * 4096;
        let page = pattern(1000 + r as u64, 4096);
        uzfs_core::dmu::partial::deferring(|| fs.os.write(ino, off as u64, &page)).expect("write");
        model[off..off + 4096].copy_from_slice(&page);
        written += 4096;
        *held += 4096;
        if r % 5 == 0 {
            // A second, separate range, and an overwrite inside the first.
            let small = pattern(5000 + r as u64, 100);
            let at = off + 4096 + 50;
            let at = if at + 100 > (r + 1) * REC {
                off - 200
            } else {
                at
            };
            uzfs_core::dmu::partial::deferring(|| fs.os.write(ino, at as u64, &small))
                .expect("write");
            model[at..at + 100].copy_from_slice(&small);
            let again = pattern(9000 + r as u64, 1000);
            uzfs_core::dmu::partial::deferring(|| fs.os.write(ino, off as u64 + 10, &again))
                .expect("write");
            model[off + 10..off + 1010].copy_from_slice(&again);
            written += 100;
            *held += 100;
        }
    }
    assert_eq!(p.io.partial.stats().deferred - d0, RECORDS as u64);
    assert_eq!(
        fs.os.open_dirty_bytes(),
        written,
        "the open txg holds more than the bytes written"
    );
    // A punch of records 1 and 2 gives back what they held.
    fs.os.free_range(ino, 1, 3).expect("punch");
    model[REC..3 * REC].iter_mut().for_each(|b| *b = 0);
    assert_eq!(
        fs.os.open_dirty_bytes(),
        written - record_bytes[1] - record_bytes[2]
    );
    p.sync().expect("sync");
    assert_eq!(fs.os.open_dirty_bytes(), 0);
    assert_eq!(
        p.io.partial.stats().filled_by_sync - f0,
        RECORDS as u64 - 2,
        "records not filled by the sync"
    );
    assert_eq!(data_misses(&p), m0, "the sync read a cached record again");
    check(&fs, ino, &model, "synced");
    p.io.cache.clear();
    check(&fs, ino, &model, "synced, read from disk");
    drop(fs);
    reimported_matches(p, &disks, 71, &[(ino, model)], "cached patches");
}
