//! The intent log (`zil/`): an fsync is one log write, not a txg commit;
//! what it acknowledged is replayed after a power cut; `logbias`; turning
//! logging back on mid-txg never replays a change without the ones before
//! it. (The crash models are `crash_zpl.rs` and `crash_concurrent.rs`.)

mod common;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uzfs_core::dsl::{DsCtx, Source};
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::Zpl;

const MIB: u64 = 1 << 20;

fn mount_with(pool: &Arc<Pool>, name: &str) -> (Zpl, Arc<DsCtx>) {
    let ds = pool.dsl_pool().dataset(name).expect("dataset");
    let ctx = DsCtx::new(pool.clone(), ds.clone());
    (Zpl::mount(ds.os.clone(), ctx.clone()).expect("mount"), ctx)
}

fn read_all(fs: &Zpl, name: &[u8]) -> Option<Vec<u8>> {
    let a = fs.lookup(fs.root, name).ok()?;
    let mut b = Vec::new();
    fs.read_into(a.ino, 0, a.size as usize, &mut b).ok()?;
    Some(b)
}

/// A pool "z" on `n` simulated disks of kind `kind`, its root filesystem
/// mounted and its log's chain started: the first commit of a chain waits
/// for a txg, which writes the header naming it.
#[allow(clippy::type_complexity)]
fn pool_with_a_chain(
    world: &SimWorld,
    seed: u64,
    kind: TopKind,
    n: usize,
) -> (
    Vec<uzfs_core::vdev::sim::SimDevice>,
    Arc<Pool>,
    Zpl,
    Arc<DsCtx>,
    Arc<uzfs_core::zil::Zil>,
) {
    let disks: Vec<_> = (0..n)
        .map(|i| world.disk(&format!("d{i}"), 128 * MIB))
        .collect();
    let pool = Pool::create("z", vec![spec(kind, &disks)], opts(seed)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let (fs, ctx, zil) = start_chain(&pool);
    (disks, pool, fs, ctx, zil)
}

/// Mount "z" of `pool` and start its log's chain: the first commit of a
/// chain waits for a txg, which writes the header naming it.
fn start_chain(pool: &Arc<Pool>) -> (Zpl, Arc<DsCtx>, Arc<uzfs_core::zil::Zil>) {
    let (fs, ctx) = mount_with(pool, "z");
    let f = create_file(&fs, b"first");
    fs.fsync(f).expect("fsync");
    pool.sync().expect("sync");
    let zil = pool
        .dsl_pool()
        .dataset("z")
        .expect("ds")
        .zil
        .get()
        .cloned()
        .expect("zil");
    (fs, ctx, zil)
}

/// Cut the power, import (which must replay something) and mount "z".
fn cut_power_and_replay(
    world: &SimWorld,
    fs: Zpl,
    pool: Arc<Pool>,
    seed: u64,
) -> (
    Vec<uzfs_core::vdev::sim::SimDevice>,
    Arc<Pool>,
    Zpl,
    Arc<DsCtx>,
) {
    let images = world.crash(&mut SimRng::new(seed));
    drop(fs);
    drop(pool);
    let (disks, pool) = import_images(images, seed);
    assert!(
        pool.replay_report().records > 0,
        "seed {seed}: nothing replayed"
    );
    let (fs, ctx) = mount_with(&pool, "z");
    (disks, pool, fs, ctx)
}

#[test]
fn fsync_writes_the_log_not_a_txg_and_a_power_cut_replays_it() {
    for seed in 0..6u64 {
        let world = SimWorld::new();
        let (_disks, pool, fs, _ctx, zil) = pool_with_a_chain(&world, seed, TopKind::Mirror, 2);
        let t0 = pool.last_txg();
        let w0 = zil.stats.writes.load(Ordering::Relaxed);
        let mut want = Vec::new();
        for i in 0..40u64 {
            let name = format!("f{i}");
            let ino = create_file(&fs, name.as_bytes());
            let data = pattern(seed * 100 + i, 1000 + (i as usize * 977) % 20_000);
            fs.write(ino, 0, &data).expect("write");
            if i % 3 == 0 {
                // A rename the log must carry too.
                let to = format!("r{i}");
                fs.rename(fs.root, name.as_bytes(), fs.root, to.as_bytes(), 0)
                    .expect("rename");
                want.push((to, data));
            } else {
                want.push((name, data));
            }
            fs.fsync(ino).expect("fsync");
        }
        assert_eq!(pool.last_txg(), t0, "seed {seed}: an fsync committed a txg");
        assert!(
            zil.stats.writes.load(Ordering::Relaxed) >= w0 + 40,
            "seed {seed}: fsyncs did not write the log"
        );
        // Power cut: nothing of the 40 files was committed by a txg.
        let (disks, pool, fs, _ctx) = cut_power_and_replay(&world, fs, pool, seed);
        for (name, data) in &want {
            assert_eq!(
                read_all(&fs, name.as_bytes()).as_deref(),
                Some(&data[..]),
                "seed {seed}: {name} after replay"
            );
        }
        // Replayed once: a second import finds nothing to replay.
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after replay");
        let pool = reimport(&SimWorld::new(), common::images(&disks)).expect("import again");
        assert_eq!(
            pool.replay_report().records,
            0,
            "seed {seed}: replayed twice"
        );
    }
}

/// Bytes written to every leaf of the pool so far.
fn device_bytes(pool: &Pool) -> u64 {
    pool.io
        .tops()
        .iter()
        .flat_map(|t| t.leaves())
        .map(|l| l.stats.bytes_written.load(Ordering::Relaxed))
        .sum()
}

/// Large whole-block writes are written once, as ordinary blocks, and the
/// log holds only their pointers; the txg adopts those blocks instead of
/// writing them again, frees the ones a later write replaced, and a power
/// cut before the txg replays the data through the pointers.
#[test]
fn large_writes_are_written_once_and_logged_by_pointer() {
    for seed in 0..6u64 {
        let world = SimWorld::new();
        // A mirror, then RAID-Z1 of three (parity written with the block).
        let (kind, raw) = if seed < 4 {
            (TopKind::Mirror, 2.0)
        } else {
            (TopKind::Raidz1, 1.5)
        };
        let n = if seed < 4 { 2 } else { 3 };
        let (disks, pool, fs, _ctx, zil) = pool_with_a_chain(&world, seed, kind, n);
        // 1 MiB in eight whole 128 KiB blocks, fsynced: eight pointers.
        let a = create_file(&fs, b"a");
        let da = pattern(seed, MIB as usize);
        fs.write(a, 0, &da).expect("write");
        let (t0, b0) = (pool.last_txg(), device_bytes(&pool));
        let (i0, r0) = (
            zil.stats.indirect.load(Ordering::Relaxed),
            zil.stats.record_bytes.load(Ordering::Relaxed),
        );
        fs.fsync(a).expect("fsync");
        assert_eq!(
            pool.last_txg(),
            t0,
            "seed {seed}: the fsync committed a txg"
        );
        assert_eq!(zil.stats.indirect.load(Ordering::Relaxed) - i0, 8);
        let logged = zil.stats.record_bytes.load(Ordering::Relaxed) - r0;
        assert!(
            logged < 16 << 10,
            "seed {seed}: {logged} bytes of records for 1 MiB"
        );
        // A second file: logged by pointer, then one block rewritten in
        // part before the txg (that block is not adopted: it is freed).
        let b = create_file(&fs, b"b");
        let mut db = pattern(seed + 50, MIB as usize);
        fs.write(b, 0, &db).expect("write");
        fs.fsync(b).expect("fsync");
        let patch = pattern(seed + 99, 4096);
        fs.write(b, 3 * 131072 + 512, &patch).expect("write");
        db[3 * 131072 + 512..3 * 131072 + 512 + 4096].copy_from_slice(&patch);
        // And one block rewritten whole: its buffer changes identity (the
        // override only holds it weakly), so that block is not adopted
        // either.
        let whole = pattern(seed + 77, 131072);
        fs.write(b, 5 * 131072, &whole).expect("write");
        db[5 * 131072..6 * 131072].copy_from_slice(&whole);
        if seed % 2 == 0 {
            // Power cut before the txg: the fsynced data comes back through
            // the pointers (b as fsynced, without the later patch).
            let (disks, pool, fs, _ctx) = cut_power_and_replay(&world, fs, pool, seed);
            assert_eq!(
                read_all(&fs, b"a").as_deref(),
                Some(&da[..]),
                "seed {seed}: a"
            );
            let got = read_all(&fs, b"b").expect("b");
            let fsynced = pattern(seed + 50, MIB as usize);
            assert!(got == fsynced || got == db, "seed {seed}: b after replay");
            drop(fs);
            pool.export().expect("export");
            assert_zdb_clean(&disks, "after replay of pointers");
            continue;
        }
        // The txg: a's eight blocks and six of b's are adopted, not
        // written again (2 MiB times the layout's raw factor, plus b's
        // two rewritten blocks and metadata; twice that if written twice).
        pool.sync().expect("sync");
        let wrote = device_bytes(&pool) - b0;
        let once = raw * (2 * MIB) as f64;
        assert!(
            (wrote as f64) < 1.75 * once,
            "seed {seed}: {wrote} bytes written for 2 MiB fsynced ({kind:?})"
        );
        assert_eq!(read_all(&fs, b"a").as_deref(), Some(&da[..]));
        assert_eq!(read_all(&fs, b"b").as_deref(), Some(&db[..]));
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after adoption");
        let pool = reimport(&SimWorld::new(), common::images(&disks)).expect("import");
        let (fs, _ctx) = mount_with(&pool, "z");
        assert_eq!(read_all(&fs, b"a").as_deref(), Some(&da[..]));
        assert_eq!(read_all(&fs, b"b").as_deref(), Some(&db[..]));
    }
}

#[test]
fn logbias_is_inherited_and_throughput_logs_every_whole_block_by_pointer() {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", 96 * MIB)];
    let pool = Pool::create("z", vec![spec(TopKind::Disk, &disks)], opts(1)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    pool.dsl_pool()
        .create_dataset("z/c", &[], false)
        .expect("child");
    let root = pool.dsl_pool().dataset("z").expect("root");
    let child = pool.dsl_pool().dataset("z/c").expect("child");
    assert_eq!(
        pool.dsl_pool().get_prop(&child, "logbias").expect("get"),
        ("latency".to_string(), Source::Default)
    );
    pool.dsl_pool()
        .set_prop(&root, "logbias", "throughput")
        .expect("set");
    assert_eq!(
        pool.dsl_pool().get_prop(&child, "logbias").expect("get"),
        ("throughput".to_string(), Source::Inherited("z".into()))
    );
    let e = pool
        .dsl_pool()
        .set_prop(&child, "logbias", "fast")
        .expect_err("a bad value");
    assert!(e.to_string().contains("'latency' or 'throughput'"), "{e}");
    // throughput: every whole block is logged by pointer, however small
    // (16 KiB, below the size latency would copy); a part of one is copied.
    let (fs, _ctx) = mount_with(&pool, "z/c");
    let zil = child.zil.get().cloned().expect("zil");
    let start = create_file(&fs, b"start");
    fs.fsync(start).expect("fsync");
    pool.sync().expect("sync");
    let t = pool.last_txg();
    for i in 0..3u64 {
        let f = create_file(&fs, format!("t{i}").as_bytes());
        fs.write(f, 0, &pattern(i, 16384)).expect("write");
        fs.fsync(f).expect("fsync");
    }
    assert_eq!(pool.last_txg(), t, "throughput: an fsync committed a txg");
    assert_eq!(zil.stats.indirect.load(Ordering::Relaxed), 3);
    let g = create_file(&fs, b"part");
    fs.write(g, 0, &pattern(9, 5000)).expect("write");
    fs.fsync(g).expect("fsync");
    assert_eq!(zil.stats.indirect.load(Ordering::Relaxed), 3);
    // latency: the same 16 KiB block is copied into the log.
    pool.dsl_pool()
        .set_prop(&root, "logbias", "latency")
        .expect("set");
    _ctx.refresh();
    let h = create_file(&fs, b"lat");
    fs.write(h, 0, &pattern(10, 16384)).expect("write");
    fs.fsync(h).expect("fsync");
    assert_eq!(zil.stats.indirect.load(Ordering::Relaxed), 3);
    drop(fs);
    pool.export().expect("export");
}

/// Logging switched off (`sync=disabled`) and on again within one txg: the
/// changes made while it was off are in no log, so a commit must not lean
/// on the log for that txg (replay would apply a write to a file whose
/// creation it never saw: import fails, or worse).
#[test]
fn logging_switched_back_on_mid_txg_waits_for_that_txg() {
    for seed in 0..6u64 {
        let world = SimWorld::new();
        let disks = vec![world.disk("d0", 96 * MIB)];
        let pool =
            Pool::create("z", vec![spec(TopKind::Disk, &disks)], opts(seed)).expect("create");
        pool.dsl_pool().format_root_fs().expect("format");
        let root = pool.dsl_pool().dataset("z").expect("root");
        let (fs, ctx) = mount_with(&pool, "z");
        // A chain on disk already, so later commits could use it.
        let f = create_file(&fs, b"warm");
        fs.fsync(f).expect("fsync");
        pool.sync().expect("sync");
        pool.dsl_pool()
            .set_prop(&root, "sync", "disabled")
            .expect("set");
        ctx.refresh();
        let a = create_file(&fs, b"made-while-off");
        pool.dsl_pool()
            .set_prop(&root, "sync", "standard")
            .expect("set");
        ctx.refresh();
        let data = pattern(seed, 30_000);
        fs.write(a, 0, &data).expect("write");
        fs.fsync(a).expect("fsync");
        let images = world.crash(&mut SimRng::new(seed));
        drop(fs);
        drop(pool);
        let (disks, pool) = import_images(images, seed);
        let (fs, _ctx) = mount_with(&pool, "z");
        assert_eq!(
            read_all(&fs, b"made-while-off").as_deref(),
            Some(&data[..]),
            "seed {seed}"
        );
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after the crash");
    }
}

/// A pool filled to ENOSPC while every write is fsynced: the log class
/// gives way (commits fall back to the txg), nothing suspends, and every
/// acknowledged write survives a power cut.
#[test]
fn fsync_on_a_full_pool_never_fails_or_loses_what_it_acknowledged() {
    for seed in 0..3u64 {
        let world = SimWorld::new();
        let disks = vec![world.disk("d0", 64 * MIB)];
        let pool =
            Pool::create("z", vec![spec(TopKind::Disk, &disks)], opts(seed)).expect("create");
        pool.dsl_pool().format_root_fs().expect("format");
        let (fs, _ctx) = mount_with(&pool, "z");
        let mut acked = Vec::new();
        let mut full = false;
        for i in 0..400u64 {
            let name = format!("f{i}");
            let ino = match fs.mknod(
                fs.root,
                name.as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                0,
                0,
                None,
            ) {
                Ok(a) => a.ino,
                Err(e) => {
                    assert_eq!(e, libc::ENOSPC, "seed {seed}: create {i}: errno {e}");
                    full = true;
                    break;
                }
            };
            let data = pattern(seed * 1000 + i, 300_000);
            if let Err(e) = fs.write(ino, 0, &data) {
                assert_eq!(e, libc::ENOSPC, "seed {seed}: write {i}: errno {e}");
                full = true;
                break;
            }
            fs.fsync(ino)
                .unwrap_or_else(|e| panic!("seed {seed}: fsync {i} failed with errno {e}"));
            acked.push((name, data));
        }
        assert!(full, "seed {seed}: the pool never filled");
        assert!(pool.suspended().is_none(), "seed {seed}: suspended");
        let images = world.crash(&mut SimRng::new(seed));
        drop(fs);
        drop(pool);
        let (disks, pool) = import_images(images, seed);
        let (fs, _ctx) = mount_with(&pool, "z");
        for (name, data) in &acked {
            assert_eq!(
                read_all(&fs, name.as_bytes()).as_deref(),
                Some(&data[..]),
                "seed {seed}: {name}"
            );
        }
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after filling");
    }
}

/// A separate log device: commits write there (not to the data vdevs), a
/// power cut replays from it; missing at import it is refused unless the
/// caller accepts losing its log (`zpool import -m`); failing under load,
/// commits fall back to the pool and lose nothing.
#[test]
fn a_separate_log_device_takes_the_log_and_its_loss_loses_nothing() {
    use uzfs_core::spa::TopSpec;
    use uzfs_core::vdev::BlockDevice;
    for seed in 0..3u64 {
        let world = SimWorld::new();
        let data: Vec<_> = (0..2)
            .map(|i| world.disk(&format!("d{i}"), 96 * MIB))
            .collect();
        let slog = world.disk("slog", 64 * MIB);
        let pool =
            Pool::create("z", vec![spec(TopKind::Mirror, &data)], opts(seed)).expect("create");
        pool.add_log_vdev(
            spec(TopKind::Disk, std::slice::from_ref(&slog)),
            None,
            false,
        )
        .expect("add log");
        let raidz = pool.add_log_vdev(
            TopSpec {
                kind: TopKind::raidz(1).expect("raidz1"),
                leaves: vec![],
            },
            None,
            false,
        );
        assert!(raidz.is_err(), "a raidz log device was taken");
        assert_eq!(pool.log_vdevs(), vec![1]);
        pool.dsl_pool().format_root_fs().expect("format");
        let (fs, _ctx) = mount_with(&pool, "z");
        let f = create_file(&fs, b"first");
        fs.fsync(f).expect("fsync");
        pool.sync().expect("sync");
        let tops = pool.io.tops();
        let writes = |t: usize| -> u64 {
            tops[t]
                .leaves()
                .iter()
                .map(|l| l.stats.writes.load(Ordering::Relaxed))
                .sum()
        };
        let (d0, l0) = (writes(0), writes(1));
        let mut want = Vec::new();
        for i in 0..30u64 {
            let name = format!("f{i}");
            let ino = create_file(&fs, name.as_bytes());
            let bytes = pattern(seed * 100 + i, 3000 + i as usize * 500);
            fs.write(ino, 0, &bytes).expect("write");
            fs.fsync(ino).expect("fsync");
            want.push((name, bytes));
        }
        assert!(
            writes(1) >= l0 + 30,
            "seed {seed}: the log device took no log writes"
        );
        assert_eq!(
            writes(0),
            d0,
            "seed {seed}: log writes went to the data vdev"
        );
        // The log device fails: later commits go to the pool's own space.
        slog.fail_writes(true);
        for i in 30..45u64 {
            let name = format!("f{i}");
            let ino = create_file(&fs, name.as_bytes());
            let bytes = pattern(seed * 100 + i, 2000);
            fs.write(ino, 0, &bytes).expect("write");
            fs.fsync(ino).unwrap_or_else(|e| {
                panic!("seed {seed}: fsync {i} with the log device failing: errno {e}")
            });
            want.push((name, bytes));
        }
        let images = world.crash(&mut SimRng::new(seed));
        drop(fs);
        drop(pool);
        let (disks, pool) = import_images(images.clone(), seed);
        let (fs, _ctx) = mount_with(&pool, "z");
        for (name, bytes) in &want {
            assert_eq!(
                read_all(&fs, name.as_bytes()).as_deref(),
                Some(&bytes[..]),
                "seed {seed}: {name} after the crash"
            );
        }
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "with a log device");
        // Without the log device: refused, unless its log may be lost.
        let w = SimWorld::new();
        let kept: Vec<_> = common::images(&disks)
            .into_iter()
            .filter(|(n, _)| n != "slog")
            .collect();
        let (_d, found) = find(&w, kept);
        let e = Pool::import(&found, None, tunables())
            .err()
            .expect("refused");
        assert!(e.to_string().contains("log device missing"), "{e}");
        let pool = Pool::import(
            &found,
            None,
            uzfs_core::spa::Tunables {
                missing_log_ok: true,
                ..tunables()
            },
        )
        .expect("import -m");
        let (fs, _ctx) = mount_with(&pool, "z");
        assert!(
            read_all(&fs, b"f0").is_some(),
            "seed {seed}: committed data gone"
        );
        // Still takes synchronous writes (through the pool's space).
        let g = create_file(&fs, b"after");
        fs.fsync(g).expect("fsync without the log device");
        let _ = slog.name();
    }
}

/// On a mirror of real files a log block goes to both sides at once from
/// the committing thread (`vdev/uring.rs`), each side counting its write;
/// every fsynced write is found after the pool is dropped without a txg and
/// imported again from the files.
/// A pool "z" on a mirror of two files in `dir`, its root filesystem
/// formatted.
fn pool_on_files(dir: &std::path::Path) -> Arc<Pool> {
    use uzfs_core::vdev::{BlockDevice, FileDevice};
    let leaves: Vec<(String, Arc<dyn BlockDevice>)> = (0..2)
        .map(|i| {
            let p = dir.join(format!("disk{i}"));
            std::fs::File::create(&p)
                .and_then(|f| f.set_len(128 * MIB))
                .expect("file");
            let dev = FileDevice::open(&p).expect("open");
            (
                p.display().to_string(),
                Arc::new(dev) as Arc<dyn BlockDevice>,
            )
        })
        .collect();
    let spec = uzfs_core::spa::TopSpec {
        kind: TopKind::Mirror,
        leaves,
    };
    let pool = Pool::create("z", vec![spec], opts(1)).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    pool
}

/// [`pool_on_files`] mounted, its log's chain started (the first commit
/// of a chain waits for a txg): the pool, the filesystem and its log.
fn files_pool_with_a_chain(
    dir: &std::path::Path,
) -> (Arc<Pool>, Zpl, Arc<DsCtx>, Arc<uzfs_core::zil::Zil>) {
    let pool = pool_on_files(dir);
    let (fs, ctx, zil) = start_chain(&pool);
    (pool, fs, ctx, zil)
}

/// Import the pool in `dir` (replaying its log), check that each named
/// file reads back as given (`None`: absent), export; what replay did.
fn reimport_and_read(
    dir: &std::path::Path,
    want: &[(&[u8], Option<&[u8]>)],
) -> uzfs_core::zil::ReplayReport {
    let pool = import_from(dir);
    let report = pool.replay_report();
    let (fs, _ctx) = mount_with(&pool, "z");
    for (name, data) in want {
        assert_eq!(
            read_all(&fs, name).as_deref(),
            *data,
            "{} after replay",
            String::from_utf8_lossy(name)
        );
    }
    drop(fs);
    pool.export().expect("export");
    report
}

/// Import the one pool found in `dir`.
fn import_from(dir: &std::path::Path) -> Arc<Pool> {
    use uzfs_core::spa::import::{discover, scan_dir};
    let mut found = discover(scan_dir(dir).expect("scan"));
    assert_eq!(found.len(), 1);
    Pool::import(&found.remove(0), None, tunables()).expect("import")
}

#[test]
fn fsyncs_on_a_mirror_of_files_are_replayed_after_a_stop_without_a_txg() {
    use uzfs_core::vdev::VdevStats;
    let dir = tempfile::tempdir().expect("tempdir");
    let (pool, fs, _ctx, _zil) = files_pool_with_a_chain(dir.path());
    let writes = |side: usize| VdevStats::get(&pool.io.tops()[0].children[side].stats.writes);
    let (t0, w0, w1) = (pool.last_txg(), writes(0), writes(1));
    let issued = uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed);
    let ino = create_file(&fs, b"db");
    let mut want = vec![0u8; 64 * 4096];
    for i in 0..64u64 {
        // Out of order, so each record lands in the middle of the file.
        let at = ((i * 37) % 64) as usize * 4096;
        let data = pattern(1000 + i, 4096);
        fs.write(ino, at as u64, &data).expect("write");
        want[at..at + 4096].copy_from_slice(&data);
        fs.fsync(ino).expect("fsync");
    }
    // Records larger than a log block (parts of records, so copied): a
    // commit writes several log blocks, all at once.
    let big = create_file(&fs, b"big");
    let mut want_big = vec![0u8; 8 * 100_000 + 1000];
    let before_big = uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed);
    for i in 0..8u64 {
        let at = 1000 + i as usize * 100_000;
        let data = pattern(2000 + i, 100_000);
        fs.write(big, at as u64, &data).expect("write");
        want_big[at..at + 100_000].copy_from_slice(&data);
        fs.fsync(big).expect("fsync");
    }
    if uzfs_core::vdev::uring::available() {
        let n = uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed) - before_big;
        // (Adjacent log blocks go out as one write per side.)
        assert!(n >= 2 * 8, "{n} writes for 8 commits of several log blocks");
    }
    assert_eq!(pool.last_txg(), t0, "an fsync committed a txg");
    assert!(
        writes(0) >= w0 + 64 && writes(1) >= w1 + 64,
        "each side counts its log writes: {} {}",
        writes(0) - w0,
        writes(1) - w1
    );
    // Both sides of most commits went through this thread's ring (where
    // the kernel offers io_uring; a commit that writes more than one log
    // block writes, then flushes, through the I/O threads).
    if uzfs_core::vdev::uring::available() {
        let n = uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed) - issued;
        assert!(n >= 2 * 48, "{n} log writes through io_uring");
    }
    drop(fs);
    drop(pool);
    let report = reimport_and_read(
        dir.path(),
        &[(b"db", Some(&want)), (b"big", Some(&want_big))],
    );
    assert!(report.records > 0, "nothing replayed");
}

/// Whole blocks fsynced on a mirror of files go out with their log block
/// in one submission (each write durable by itself, no flush after), and
/// are replayed through their pointers after a stop without a txg
/// (adoption by the next txg: `large_writes_are_written_once_...`).
#[test]
fn indirect_writes_on_a_mirror_of_files_go_out_with_their_log_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pool, fs, _ctx, zil) = files_pool_with_a_chain(dir.path());
    let t0 = pool.last_txg();
    let (i0, u0) = (
        zil.stats.indirect.load(Ordering::Relaxed),
        uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed),
    );
    let ino = create_file(&fs, b"db");
    let mut want = Vec::new();
    for i in 0..6u64 {
        let data = pattern(500 + i, MIB as usize);
        fs.write(ino, i * MIB, &data).expect("write");
        want.extend_from_slice(&data);
        fs.fsync(ino).expect("fsync");
    }
    assert_eq!(pool.last_txg(), t0, "an fsync committed a txg");
    assert_eq!(zil.stats.indirect.load(Ordering::Relaxed) - i0, 48);
    if uzfs_core::vdev::uring::available() {
        // Per commit: the data's run and the log block, on each side.
        let n = uzfs_core::vdev::uring::ISSUED.load(Ordering::Relaxed) - u0;
        assert!(n >= 6 * 4, "{n} writes through io_uring for 6 commits");
    }
    drop(fs);
    drop(pool);
    let report = reimport_and_read(dir.path(), &[(b"db", Some(&want))]);
    assert!(report.indirect >= 48, "pointers not replayed");
}

/// A log block can reach the disk before the data it names (they go out
/// together): a crash then leaves a record whose block does not verify.
/// Its commit never returned, so replay ends the log there: what came
/// before is replayed, that record and every later one are not.
#[test]
fn a_log_record_naming_a_block_never_written_ends_the_log_there() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (pool, fs, _ctx, _zil) = files_pool_with_a_chain(dir.path());
    let before = create_file(&fs, b"before");
    fs.write(before, 0, b"acknowledged").expect("write");
    let big = create_file(&fs, b"big");
    fs.fsync(before).expect("fsync");
    let block = pattern(77, 128 << 10);
    fs.write(big, 0, &block).expect("write");
    fs.fsync(big).expect("fsync");
    let after = create_file(&fs, b"after");
    fs.write(after, 0, b"later").expect("write");
    fs.fsync(after).expect("fsync");
    drop(fs);
    drop(pool);
    // The crash the test stands for: the block never reached either side.
    let mut erased = 0;
    for i in 0..2 {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join(format!("disk{i}")))
            .expect("open");
        let mut at = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        while at < 128 * MIB {
            file.read_exact_at(&mut buf, at).expect("read");
            for off in (0..buf.len()).step_by(4096) {
                if buf[off..off + 64] == block[..64] {
                    file.write_all_at(&vec![0u8; block.len()], at + off as u64)
                        .expect("erase");
                    erased += 1;
                }
            }
            at += buf.len() as u64;
        }
    }
    assert_eq!(erased, 2, "the block's two copies");
    // `after` absent: not replayed past the end.
    reimport_and_read(
        dir.path(),
        &[
            (b"before", Some(b"acknowledged")),
            (b"big", Some(b"")),
            (b"after", None),
        ],
    );
}

/// An fsync's early write of a large block (logged by pointer) is held in
/// flight while its txg syncs: the sync writes the block itself and must
/// not free the early one's space before that write lands. The pool is
/// then filled across several txgs (the full pool hands out the previous
/// txg's frees at once), and only then does the early write land. Before
/// the fix the space had been freed and reused, and the late write
/// corrupted whatever the fill had put there (found by the pool-full test
/// of the mount, `crates/uzfs/tests/fill.rs`, in CI).
#[test]
fn an_early_write_that_lands_late_never_overwrites_reused_space() {
    use std::sync::{Condvar, Mutex};
    for seed in 0..2u64 {
        let world = SimWorld::new();
        let disks = vec![world.disk("d0", 64 * MIB)];
        let pool =
            Pool::create("z", vec![spec(TopKind::Disk, &disks)], opts(seed)).expect("create");
        pool.dsl_pool().format_root_fs().expect("format");
        let (fs, _ctx, zil) = start_chain(&pool);
        // The gate: (armed, a write is held, released).
        let gate = Arc::new((Mutex::new((false, false, false)), Condvar::new()));
        let g = gate.clone();
        world.set_write_hook(Some(Arc::new(move |_: &str, _: u64, len: usize| {
            let (m, cv) = &*g;
            let mut s = m.lock().expect("gate");
            if !s.0 || len < 128 << 10 {
                return;
            }
            s.0 = false;
            s.1 = true;
            cv.notify_all();
            while !s.2 {
                s = cv.wait(s).expect("gate");
            }
        })));
        let a = create_file(&fs, b"a");
        let da = pattern(seed, MIB as usize);
        fs.write(a, 0, &da).expect("write");
        let i0 = zil.stats.indirect.load(Ordering::Relaxed);
        gate.0.lock().expect("gate").0 = true;
        let mut kept = Vec::new();
        std::thread::scope(|s| {
            let fsync = s.spawn(|| fs.fsync(a));
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().expect("gate");
                while !st.1 {
                    st = cv.wait(st).expect("gate");
                }
            }
            // The early writes are in flight: their txg syncs, then the
            // pool fills up, a txg at a time.
            pool.sync().expect("sync with the early write in flight");
            for i in 0..200u64 {
                let name = format!("fill{i}");
                let Ok(ino) = try_create_file(&fs, name.as_bytes()) else {
                    break;
                };
                let data = pattern(seed * 1000 + i, 2 * MIB as usize);
                if fs.write(ino, 0, &data).is_err() {
                    let _ = fs.unlink(fs.root, name.as_bytes());
                    break;
                }
                if pool.sync().is_err() {
                    break;
                }
                kept.push((name, data));
            }
            let (m, cv) = &*gate;
            m.lock().expect("gate").2 = true;
            cv.notify_all();
            fsync.join().expect("fsync thread").expect("fsync");
        });
        world.set_write_hook(None);
        assert!(
            zil.stats.indirect.load(Ordering::Relaxed) > i0,
            "seed {seed}: nothing was written early"
        );
        assert!(kept.len() > 10, "seed {seed}: the pool took {}", kept.len());
        pool.sync().expect("sync");
        pool.sync().expect("sync");
        assert_eq!(read_all(&fs, b"a").as_deref(), Some(&da[..]));
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, "after a late early write");
        let pool = reimport(&SimWorld::new(), common::images(&disks)).expect("import");
        let (fs, _ctx) = mount_with(&pool, "z");
        for (name, data) in &kept {
            assert_eq!(
                read_all(&fs, name.as_bytes()).as_deref(),
                Some(&data[..]),
                "seed {seed}: {name}"
            );
        }
    }
}
