//! Benchmarks of issue #3 (RAID-Z, scrub, resilver), driven by
//! bench/redundancy.sh. Each prints JSON lines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::Compression;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::import::{discover, scan_dir};
use uzfs_core::spa::scan::{IssueOrder, ScanState};
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::raidz;
use uzfs_core::vdev::sim::SimRng;
use uzfs_core::vdev::{BlockDevice, FileDevice, TopKind};

type R<T> = Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

const DATA: ObjProps = ObjProps {
    checksum: ChecksumType::Fletcher4,
    compress: Compression::Off,
    copies: 1,
};

/// Drop the page cache so reads come from the device (root only; a no-op
/// otherwise, which the JSON records).
pub fn drop_caches() -> bool {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn files(dir: &Path, prefix: &str, n: usize, size: u64) -> R<Vec<(String, Arc<dyn BlockDevice>)>> {
    std::fs::create_dir_all(dir).map_err(s)?;
    (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}"));
            let _ = std::fs::remove_file(&p);
            let f = std::fs::File::create(&p).map_err(s)?;
            f.set_len(size).map_err(s)?;
            let d: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&p).map_err(s)?);
            Ok((p.display().to_string(), d))
        })
        .collect()
}

fn create(
    dir: &Path,
    name: &str,
    kind: TopKind,
    n: usize,
    size: u64,
    tun: Tunables,
) -> R<Arc<Pool>> {
    let leaves = files(dir, &format!("{name}-"), n, size)?;
    let opts = CreateOptions {
        tunables: tun,
        force: true,
        ..Default::default()
    };
    Pool::create(name, vec![TopSpec { kind, leaves }], opts).map_err(s)
}

fn reimport(dir: &Path, name: &str, tun: Tunables) -> R<Arc<Pool>> {
    let devs: Vec<_> = scan_dir(dir)
        .map_err(s)?
        .into_iter()
        .filter(|(p, _)| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{name}-")))
        })
        .collect();
    let found = discover(devs)
        .into_iter()
        .find(|f| f.config.name == name)
        .ok_or("pool not found")?;
    Pool::import(&found, None, tun).map_err(s)
}

fn cleanup(dir: &Path, name: &str) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{name}-"))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Parity generation and reconstruction, GB/s of data per core.
pub fn parity(bytes: u64) {
    let psize = 128u64 << 10;
    let mut data = vec![0u8; psize as usize];
    SimRng::new(9).fill(&mut data);
    for (np, dcols) in [(1usize, 5usize), (2, 6), (3, 7)] {
        let m = raidz::map(0, psize, 12, dcols, np);
        let n = (bytes / psize).max(1);
        let t0 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(raidz::encode(&m, &data));
        }
        let gen = (n * psize) as f64 / t0.elapsed().as_secs_f64() / 1e9;
        let good = raidz::encode(&m, &data);
        let mut rec = Vec::new();
        for k in 1..=np {
            // The worst case: k data columns lost.
            let missing: Vec<usize> = (np..np + k).collect();
            let t0 = Instant::now();
            for _ in 0..n {
                let mut cols = good.clone();
                if raidz::reconstruct(&m, &mut cols, &missing).is_err() {
                    eprintln!("reconstruct failed");
                }
                std::hint::black_box(&cols);
            }
            rec.push((n * psize) as f64 / t0.elapsed().as_secs_f64() / 1e9);
        }
        println!(
            "{{\"bench\":\"parity\",\"layout\":\"raidz{np} {}+{np}\",\"generate_gb_s\":{gen:.2},\"rebuild_gb_s\":[{}]}}",
            dcols - np,
            rec.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(",")
        );
    }
}

fn write_seq(pool: &Pool, bytes: u64) -> R<(u64, f64)> {
    let obj = pool.create_object(128 << 10, &DATA).map_err(s)?;
    let mut buf = vec![0u8; 64 << 20];
    SimRng::new(42).fill(&mut buf);
    let chunk = 1 << 20;
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < bytes {
        let at = (off as usize) % buf.len();
        pool.write(obj, off, &buf[at..at + chunk]).map_err(s)?;
        off += chunk as u64;
    }
    pool.txg_wait_synced().map_err(s)?;
    Ok((obj, t0.elapsed().as_secs_f64()))
}

/// Sequential write then cold read of `bytes` on disk, mirror, raidz1 x4,
/// raidz2 x6 pools of file vdevs.
pub fn layouts(dir: &Path, bytes: u64) -> R<()> {
    for (label, kind, n) in [
        ("single disk", TopKind::Disk, 1usize),
        ("mirror x2", TopKind::Mirror, 2),
        ("raidz1 x4", TopKind::Raidz1, 4),
        ("raidz2 x6", TopKind::Raidz2, 6),
    ] {
        let per_dev = bytes * 2 / (n as u64 - kind.ops().redundancy(n) as u64).max(1) + (512 << 20);
        let per_dev = if kind == TopKind::Mirror {
            bytes + bytes / 2 + (512 << 20)
        } else {
            per_dev
        };
        let pool = create(dir, "benchlay", kind, n, per_dev, Tunables::default())?;
        let (obj, wsecs) = write_seq(&pool, bytes)?;
        pool.close().map_err(s)?;
        let dropped = drop_caches();
        let pool = reimport(dir, "benchlay", Tunables::default())?;
        let mut buf = vec![0u8; 1 << 20];
        let t0 = Instant::now();
        let mut off = 0;
        while off < bytes {
            pool.read(obj, off, &mut buf).map_err(s)?;
            off += buf.len() as u64;
        }
        let rsecs = t0.elapsed().as_secs_f64();
        pool.close().map_err(s)?;
        cleanup(dir, "benchlay");
        println!(
            "{{\"bench\":\"layout\",\"layout\":\"{label}\",\"bytes\":{bytes},\"write_mib_s\":{:.0},\"read_mib_s\":{:.0},\"cold\":{dropped}}}",
            bytes as f64 / wsecs / 1048576.0,
            bytes as f64 / rsecs / 1048576.0
        );
    }
    Ok(())
}

/// Sequential write bandwidth of a fresh file on `dir`'s filesystem (what a
/// new device can absorb), MiB/s.
pub fn device_write_bw(dir: &Path, bytes: u64) -> R<f64> {
    use std::io::Write;
    let p = dir.join("bw-probe");
    let mut f = std::fs::File::create(&p).map_err(s)?;
    let mut buf = vec![0u8; 1 << 20];
    SimRng::new(5).fill(&mut buf);
    let t0 = Instant::now();
    let mut done = 0;
    while done < bytes {
        f.write_all(&buf).map_err(s)?;
        done += buf.len() as u64;
    }
    f.sync_all().map_err(s)?;
    let secs = t0.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&p);
    Ok(bytes as f64 / secs / 1048576.0)
}

/// Sequential copy bandwidth on `dir`'s filesystem: a cold file read while
/// a new file is written and fsynced, 1 MiB at a time (what a resilver that
/// reads and writes the same disk can at best do), MiB/s.
pub fn copy_bw(dir: &Path, bytes: u64) -> R<f64> {
    use std::io::{Read, Write};
    let src = dir.join("bw-src");
    let dst = dir.join("bw-dst");
    {
        let mut f = std::fs::File::create(&src).map_err(s)?;
        let mut buf = vec![0u8; 1 << 20];
        SimRng::new(6).fill(&mut buf);
        for _ in 0..bytes >> 20 {
            f.write_all(&buf).map_err(s)?;
        }
        f.sync_all().map_err(s)?;
    }
    drop_caches();
    let t0 = Instant::now();
    let mut r = std::fs::File::open(&src).map_err(s)?;
    let mut w = std::fs::File::create(&dst).map_err(s)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = r.read(&mut buf).map_err(s)?;
        if k == 0 {
            break;
        }
        w.write_all(&buf[..k]).map_err(s)?;
    }
    w.sync_all().map_err(s)?;
    let secs = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
    Ok(bytes as f64 / secs / 1048576.0)
}

/// Cold sequential read bandwidth of the given files read one after the
/// other (each alone) and all at once, MiB/s.
fn read_bw(paths: &[PathBuf]) -> R<(f64, f64)> {
    use std::io::Read;
    let one = |p: &PathBuf| -> R<(u64, f64)> {
        let mut f = std::fs::File::open(p).map_err(s)?;
        let mut buf = vec![0u8; 1 << 20];
        let t0 = Instant::now();
        let mut n = 0u64;
        loop {
            let k = f.read(&mut buf).map_err(s)?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        Ok((n, t0.elapsed().as_secs_f64()))
    };
    let mut sum = 0.0;
    for p in paths {
        drop_caches();
        let (n, t) = one(p)?;
        sum += n as f64 / t / 1048576.0;
    }
    drop_caches();
    let t0 = Instant::now();
    let total: u64 = std::thread::scope(|sc| {
        let hs: Vec<_> = paths.iter().map(|p| sc.spawn(move || one(p))).collect();
        hs.into_iter()
            .map(|h| h.join().ok().and_then(|r| r.ok()).map_or(0, |x| x.0))
            .sum()
    });
    let together = total as f64 / t0.elapsed().as_secs_f64() / 1048576.0;
    Ok((sum, together))
}

/// Fill a pool so its data is fragmented: the blocks of all objects are
/// written in one random order, a txg every 64 blocks (so physical order is
/// unrelated to logical order), then half the objects are freed and new
/// ones written the same way into the holes.
fn fragment(pool: &Pool, bytes: u64, seed: u64) -> R<()> {
    let mut rng = SimRng::new(seed);
    let nobj = 16u64;
    let blocks_per = (bytes / nobj / (128 << 10)).max(1);
    let mut block = vec![0u8; 128 << 10];
    rng.fill(&mut block);
    let fill = |rng: &mut SimRng, count: u64, block: &mut Vec<u8>| -> R<Vec<u64>> {
        let objs: Vec<u64> = (0..count)
            .map(|_| pool.create_object(128 << 10, &DATA).map_err(s))
            .collect::<R<_>>()?;
        let mut order: Vec<(u64, u64)> = objs
            .iter()
            .flat_map(|&o| (0..blocks_per).map(move |b| (o, b)))
            .collect();
        for i in (1..order.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for (k, (o, b)) in order.into_iter().enumerate() {
            rng.fill(&mut block[..64]);
            pool.write(o, b * (128 << 10), block).map_err(s)?;
            if k % 64 == 63 {
                pool.txg_wait_synced().map_err(s)?;
            }
        }
        Ok(objs)
    };
    let objs = fill(&mut rng, nobj, &mut block)?;
    for o in objs.iter().step_by(2) {
        pool.free_object(*o).map_err(s)?;
    }
    pool.txg_wait_synced().map_err(s)?;
    pool.txg_wait_synced().map_err(s)?;
    fill(&mut rng, nobj / 2, &mut block)?;
    pool.txg_wait_synced().map(|_| ()).map_err(s)
}

/// Resilver of a fragmented mirror onto a replaced device, issued in `order`.
/// `hdd`: every device emulates a rotating disk (8 ms full-stroke seek plus
/// half a rotation per discontiguous I/O, see `Inject::hdd_seek_us`).
pub fn resilver(dir: &Path, bytes: u64, order: &str, hdd: bool) -> R<()> {
    let order = match order {
        "sorted" => IssueOrder::Sorted,
        "birth" => IssueOrder::Birth,
        "logical" => IssueOrder::Logical,
        o => return Err(format!("unknown order {o}")),
    };
    let tun = Tunables {
        scan_order: order,
        ..Tunables::default()
    };
    let size = bytes * 2 + (1 << 30);
    let pool = create(dir, "benchrs", TopKind::Mirror, 2, size, tun.clone())?;
    fragment(&pool, bytes, 11)?;
    pool.close().map_err(s)?;
    let dropped = drop_caches();
    let pool = reimport(dir, "benchrs", tun)?;
    let newp = dir.join("benchrs-new");
    let _ = std::fs::remove_file(&newp);
    std::fs::File::create(&newp)
        .and_then(|f| f.set_len(size))
        .map_err(s)?;
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&newp).map_err(s)?);
    let old = pool.io.tops()[0].children[1].path.clone();
    let seek_us = if hdd { 8000 } else { 0 };
    for l in pool.io.tops()[0].leaves() {
        l.inject
            .hdd_seek_us
            .store(seek_us, std::sync::atomic::Ordering::Relaxed);
    }
    let t0 = Instant::now();
    pool.replace(&old, &newp.display().to_string(), dev, true)
        .map_err(s)?;
    if let Some(pos) = pool.find_leaf(&newp.display().to_string()) {
        pos.leaf
            .inject
            .hdd_seek_us
            .store(seek_us, std::sync::atomic::Ordering::Relaxed);
    }
    pool.wait_scan();
    pool.txg_wait_synced().map_err(s)?;
    let secs = t0.elapsed().as_secs_f64();
    let st = pool.scan_status().ok_or("no scan")?;
    if st.state != ScanState::Finished || st.errors != 0 {
        return Err(format!("resilver did not finish cleanly: {st:?}"));
    }
    pool.close().map_err(s)?;
    cleanup(dir, "benchrs");
    println!(
        "{{\"bench\":\"resilver\",\"order\":\"{order:?}\",\"hdd\":{hdd},\"resilvered\":{},\"seconds\":{secs:.2},\"mib_s\":{:.0},\"cold\":{dropped}}}",
        st.repaired,
        st.repaired as f64 / secs / 1048576.0
    );
    Ok(())
}

/// Scrub of a raidz1 x4 pool holding `bytes` of data.
pub fn scrub(dir: &Path, bytes: u64) -> R<()> {
    let size = bytes / 2 + (1 << 30);
    let pool = create(
        dir,
        "benchsc",
        TopKind::Raidz1,
        4,
        size,
        Tunables::default(),
    )?;
    write_seq(&pool, bytes)?;
    let paths: Vec<PathBuf> = pool.io.tops()[0]
        .children
        .iter()
        .map(|c| PathBuf::from(&c.path))
        .collect();
    let (_, alloc, _) = pool.space();
    let _ = paths;
    pool.close().map_err(s)?;
    let dropped = drop_caches();
    let pool = reimport(dir, "benchsc", Tunables::default())?;
    let t0 = Instant::now();
    pool.scrub().map_err(s)?;
    pool.wait_scan();
    let secs = t0.elapsed().as_secs_f64();
    let st = pool.scan_status().ok_or("no scan")?;
    pool.close().map_err(s)?;
    cleanup(dir, "benchsc");
    // What the devices can deliver: dense files holding as much as each
    // device holds of the pool, read cold one at a time (summed) and all at
    // once (the pool's devices share one disk here).
    let probes: Vec<PathBuf> = (0..4)
        .map(|i| dir.join(format!("benchsc-probe{i}")))
        .collect();
    {
        use std::io::Write;
        let mut buf = vec![0u8; 1 << 20];
        SimRng::new(8).fill(&mut buf);
        for p in &probes {
            let mut f = std::fs::File::create(p).map_err(s)?;
            for _ in 0..(alloc / 4) >> 20 {
                f.write_all(&buf).map_err(s)?;
            }
            f.sync_all().map_err(s)?;
        }
    }
    let (sum, together) = read_bw(&probes)?;
    cleanup(dir, "benchsc");
    println!(
        "{{\"bench\":\"scrub\",\"data\":{bytes},\"raw_alloc\":{alloc},\"issued\":{},\"seconds\":{secs:.2},\"raw_mib_s\":{:.0},\"dev_sum_mib_s\":{sum:.0},\"dev_together_mib_s\":{together:.0},\"cold\":{dropped}}}",
        st.issued,
        st.issued as f64 / secs / 1048576.0
    );
    Ok(())
}

/// Foreground latency while a scrub runs: random 128 KiB reads back to
/// back, or 128 KiB writes each committed (`pool.sync`), idle and during a
/// scrub under three regimes, interleaved: no queues (every I/O at once;
/// only one scan worker issues while foreground I/O is seen), the
/// sleep-based throttle on top (`scan_delay_us` 500: the default before
/// the leaf queues), and the leaf queues' priority classes
/// (`vdev/queue.rs`, today's default). Scan reads bypass the page cache
/// in all three. Each case runs
/// `rounds` times; one JSON line per run.
pub fn scrub_load(dir: &Path, bytes: u64, rounds: u32) -> R<()> {
    let pool = create(
        dir,
        "benchsl",
        TopKind::Raidz1,
        4,
        bytes / 2 + (1 << 30),
        Tunables::default(),
    )?;
    let (obj, _) = write_seq(&pool, bytes)?;
    pool.close().map_err(s)?;
    let blocks = bytes / (128 << 10);
    // (label, scrub?, queue priorities, scan_delay_us)
    let cases = [
        ("idle", false, true, 0u64),
        ("scrub, no queues (one worker while busy)", true, false, 0),
        ("scrub, sleep throttle (500 us)", true, false, 500),
        ("scrub, leaf queue classes", true, true, 0),
    ];
    // SL_LOAD=read|write runs one load; SL_CASES=queues keeps only idle
    // and today's default (the comparisons a change to the queues needs).
    let only_load = std::env::var("SL_LOAD").ok();
    let short = std::env::var("SL_CASES").is_ok_and(|v| v == "queues");
    for load in ["read", "write"] {
        if only_load.as_deref().is_some_and(|l| l != load) {
            continue;
        }
        for round in 0..rounds {
            for (label, scrub, queue, delay) in cases {
                if short && scrub && (!queue || delay > 0) {
                    continue;
                }
                drop_caches();
                uzfs_core::vdev::queue::set_enabled(queue);
                let tun = Tunables {
                    cache_bytes: 0,
                    scan_delay_us: delay,
                    ..Tunables::default()
                };
                let pool = reimport(dir, "benchsl", tun)?;
                let t0 = Instant::now();
                if scrub {
                    pool.scrub().map_err(s)?;
                }
                let mut rng = SimRng::new(77 + round as u64);
                let mut lat = Vec::new();
                let mut buf = vec![0u8; 128 << 10];
                loop {
                    let b = rng.below(blocks);
                    let t = Instant::now();
                    if load == "read" {
                        pool.read(obj, b * (128 << 10), &mut buf).map_err(s)?;
                    } else {
                        rng.fill(&mut buf);
                        // A scan parking frees answers a write it holds the
                        // space of with ENOSPC and gives the frees back; the
                        // retry after the next sync finds them (as the
                        // POSIX layer's does).
                        let mut tries = 0;
                        while let Err(e) = pool.write(obj, b * (128 << 10), &buf) {
                            tries += 1;
                            if !matches!(e, uzfs_core::error::Error::NoSpace) || tries > 50 {
                                return Err(s(e));
                            }
                            pool.sync().map_err(s)?;
                        }
                        pool.sync().map_err(s)?;
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    let running = pool
                        .scan_status()
                        .is_some_and(|st| st.state == ScanState::Scanning);
                    if (scrub && !running) || (!scrub && t0.elapsed().as_secs() >= 5) {
                        break;
                    }
                }
                pool.wait_scan();
                let secs = t0.elapsed().as_secs_f64();
                pool.close().map_err(s)?;
                uzfs_core::vdev::queue::set_enabled(true);
                lat.sort_by(|a, b| a.total_cmp(b));
                println!(
                    "{{\"bench\":\"scrubload\",\"load\":\"{load}\",\"case\":\"{label}\",\"round\":{round},\"ops\":{},\"p50_ms\":{:.2},\"p99_ms\":{:.2},\"scrub_s\":{}}}",
                    lat.len(),
                    lat[lat.len() / 2],
                    lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
                    if scrub { format!("{secs:.2}") } else { "null".into() }
                );
            }
        }
    }
    cleanup(dir, "benchsl");
    Ok(())
}
