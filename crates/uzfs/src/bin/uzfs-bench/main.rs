//! uzfs-bench: engine-level benchmarks (no daemon, no FUSE). Each prints one
//! JSON object per measurement on stdout; bench/run.sh turns them into the
//! tables in bench/RESULTS.md beside fio on a plain file and on ext4-on-loop.
//!
//!   uzfs-bench seqwrite DIR BYTES   4 GiB incompressible sequential write
//!                                   through the object layer to one file vdev
//!   uzfs-bench checksum BYTES       per-core throughput of each checksum
//!   uzfs-bench compress BYTES       lz4/zstd on a mixed corpus
//!   uzfs-bench txg DIR ROUNDS       txg commit latency for 1/64/1024 dirty blocks
//!   uzfs-bench parity SIZE          RAID-Z parity generation / rebuild per core
//!   uzfs-bench layouts DIR SIZE     seq write + cold read: disk, mirror, raidz1, raidz2
//!   uzfs-bench resilver DIR SIZE ORDER [hdd]  fragmented mirror resilver (sorted|birth|logical)
//!   uzfs-bench scrub DIR SIZE       raidz1 x4 scrub vs the devices' read bandwidth
//!   uzfs-bench scrubload DIR SIZE [ROUNDS]  foreground read/write latency during a scrub
//!   uzfs-bench devbw DIR SIZE       sequential write bandwidth of a fresh file

mod redundancy;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::{compress, decompress, Compression};
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::SimRng;
use uzfs_core::vdev::{BlockDevice, FileDevice, TopKind};

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn make_pool(dir: &Path, name: &str, size: u64, tun: Tunables) -> Result<Arc<Pool>, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let p = dir.join(format!("{name}.vdev"));
    let _ = std::fs::remove_file(&p);
    let f = std::fs::File::create(&p).map_err(|e| e.to_string())?;
    f.set_len(size).map_err(|e| e.to_string())?;
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&p).map_err(|e| e.to_string())?);
    let opts = CreateOptions {
        tunables: tun,
        force: true,
        ..Default::default()
    };
    Pool::create(
        name,
        vec![TopSpec {
            kind: TopKind::Disk,
            leaves: vec![(p.display().to_string(), dev)],
        }],
        opts,
    )
    .map_err(|e| e.to_string())
}

fn seqwrite(dir: &Path, bytes: u64) -> Result<(), String> {
    let pool = make_pool(
        dir,
        "benchseq",
        bytes + bytes / 4 + (256 << 20),
        Tunables::default(),
    )?;
    let obj = pool
        .create_object(
            128 << 10,
            &ObjProps {
                checksum: ChecksumType::Fletcher4,
                compress: Compression::Off,
                copies: 1,
            },
        )
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64 << 20];
    SimRng::new(42).fill(&mut buf);
    let chunk = 1 << 20;
    let pool2 = pool.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = 0;
        while !done2.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(pool2.dirty_bytes());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        peak
    });
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < bytes {
        let at = (off as usize) % buf.len();
        pool.write(obj, off, &buf[at..at + chunk])
            .map_err(|e| e.to_string())?;
        off += chunk as u64;
    }
    let write_secs = t0.elapsed().as_secs_f64();
    pool.txg_wait_synced().map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_dirty = sampler.join().unwrap_or(0);
    println!(
        "{{\"bench\":\"seqwrite\",\"bytes\":{bytes},\"seconds\":{secs:.3},\"write_phase_s\":{write_secs:.3},\"mib_s\":{:.1},\"peak_rss_mib\":{},\"peak_dirty_mib\":{},\"dirty_max_mib\":{}}}",
        bytes as f64 / secs / 1048576.0,
        status_kb("VmHWM:") / 1024,
        peak_dirty >> 20,
        pool.tun.dirty_max >> 20
    );
    pool.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(dir.join("benchseq.vdev"));
    Ok(())
}

fn checksum(bytes: u64) {
    let mut buf = vec![0u8; 128 << 10];
    SimRng::new(1).fill(&mut buf);
    for t in [
        ChecksumType::Fletcher4,
        ChecksumType::Sha256,
        ChecksumType::Blake3,
    ] {
        let n = bytes / buf.len() as u64;
        let t0 = Instant::now();
        let mut acc = 0u8;
        for _ in 0..n {
            acc ^= t.compute(&buf)[0];
        }
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(acc);
        println!(
            "{{\"bench\":\"checksum\",\"alg\":\"{}\",\"gb_s\":{:.2}}}",
            t.name(),
            (n * buf.len() as u64) as f64 / secs / 1e9
        );
    }
}

/// A mixed corpus: this program's own binary, source-like text, structured
/// integers and random bytes, in equal parts.
fn corpus(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::read(p).ok())
        .unwrap_or_default();
    let words = [
        "pool",
        "vdev",
        "txg",
        "uberblock",
        "metaslab",
        "block",
        "pointer",
        "checksum",
        "fn",
        "let",
        "mut",
        "{",
        "}",
        "=",
        ";",
        "\n",
        "return",
        "Result<()>",
        "    ",
    ];
    let mut rng = SimRng::new(7);
    let q = bytes / 4;
    out.extend(exe.iter().cycle().take(if exe.is_empty() { 0 } else { q }));
    while out.len() < 2 * q {
        out.extend_from_slice(words[rng.below(words.len() as u64) as usize].as_bytes());
        out.push(b' ');
    }
    let mut i = 0u32;
    while out.len() < 3 * q {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&(i / 7).to_le_bytes());
        i += 1;
    }
    let start = out.len();
    out.resize(bytes, 0);
    rng.fill(&mut out[start..]);
    out
}

fn compression(bytes: usize) {
    let data = corpus(bytes);
    let bs = 128 << 10;
    for alg in [Compression::Lz4, Compression::Zstd] {
        let t0 = Instant::now();
        let blocks: Vec<(Compression, Vec<u8>)> = data
            .chunks(bs)
            .map(|c| {
                let (a, p) = compress(alg, c);
                (a, p.into_owned())
            })
            .collect();
        let c_secs = t0.elapsed().as_secs_f64();
        let phys: usize = blocks.iter().map(|b| b.1.len()).sum();
        let t1 = Instant::now();
        for (b, orig) in blocks.iter().zip(data.chunks(bs)) {
            let d = decompress(b.0, &b.1, orig.len()).unwrap_or_default();
            std::hint::black_box(d);
        }
        let d_secs = t1.elapsed().as_secs_f64();
        println!(
            "{{\"bench\":\"compress\",\"alg\":\"{}\",\"compress_mb_s\":{:.0},\"decompress_mb_s\":{:.0},\"ratio\":{:.2}}}",
            alg.name(),
            data.len() as f64 / c_secs / 1e6,
            data.len() as f64 / d_secs / 1e6,
            data.len() as f64 / phys as f64
        );
    }
}

fn txg_latency(dir: &Path, rounds: usize) -> Result<(), String> {
    let tun = Tunables {
        sync_thread: false,
        ..Tunables::default()
    };
    let pool = make_pool(dir, "benchtxg", 2 << 30, tun)?;
    let obj = pool
        .create_object(128 << 10, &ObjProps::default())
        .map_err(|e| e.to_string())?;
    pool.sync().map_err(|e| e.to_string())?;
    let mut data = vec![0u8; 128 << 10];
    let mut rng = SimRng::new(3);
    rng.fill(&mut data);
    for n in [1usize, 64, 1024] {
        let mut lat = Vec::new();
        for _ in 0..rounds {
            for _ in 0..n {
                let blk = rng.below(4096);
                pool.write(obj, blk * (128 << 10), &data)
                    .map_err(|e| e.to_string())?;
            }
            let t0 = Instant::now();
            pool.sync().map_err(|e| e.to_string())?;
            lat.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{{\"bench\":\"txg\",\"dirty_blocks\":{n},\"p50_ms\":{:.2},\"p99_ms\":{:.2}}}",
            lat[lat.len() / 2],
            lat[(lat.len() * 99 / 100).min(lat.len() - 1)]
        );
    }
    pool.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(dir.join("benchtxg.vdev"));
    Ok(())
}

fn parse_size(s: &str) -> Option<u64> {
    let (n, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().ok().map(|v| v * mult)
}

fn main() {
    // The engine's log on stderr when asked (`UZFS_LOG=debug`), as the daemon's.
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("UZFS_LOG", "off"))
        .format_timestamp_millis()
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let r = match a(0) {
        "seqwrite" => match parse_size(a(2)) {
            Some(n) => seqwrite(Path::new(a(1)), n),
            None => Err("usage: uzfs-bench seqwrite DIR SIZE".into()),
        },
        "checksum" => {
            checksum(parse_size(a(1)).unwrap_or(1 << 30));
            Ok(())
        }
        "compress" => {
            compression(parse_size(a(1)).unwrap_or(256 << 20) as usize);
            Ok(())
        }
        "txg" => txg_latency(Path::new(a(1)), a(2).parse().unwrap_or(20)),
        "parity" => {
            redundancy::parity(parse_size(a(1)).unwrap_or(1 << 30));
            Ok(())
        }
        "layouts" => match parse_size(a(2)) {
            Some(n) => redundancy::layouts(Path::new(a(1)), n),
            None => Err("usage: uzfs-bench layouts DIR SIZE".into()),
        },
        "resilver" => match parse_size(a(2)) {
            Some(n) => redundancy::resilver(Path::new(a(1)), n, a(3), a(4) == "hdd"),
            None => Err("usage: uzfs-bench resilver DIR SIZE sorted|birth|logical [hdd]".into()),
        },
        "scrub" => match parse_size(a(2)) {
            Some(n) => redundancy::scrub(Path::new(a(1)), n),
            None => Err("usage: uzfs-bench scrub DIR SIZE".into()),
        },
        "scrubload" => match parse_size(a(2)) {
            Some(n) => redundancy::scrub_load(Path::new(a(1)), n, a(3).parse().unwrap_or(1)),
            None => Err("usage: uzfs-bench scrubload DIR SIZE [ROUNDS]".into()),
        },
        "devbw" => match parse_size(a(2)) {
            Some(n) => redundancy::device_write_bw(Path::new(a(1)), n).and_then(|bw| {
                let cp = redundancy::copy_bw(Path::new(a(1)), n)?;
                println!("{{\"bench\":\"devbw\",\"mib_s\":{bw:.0},\"copy_mib_s\":{cp:.0}}}");
                Ok(())
            }),
            None => Err("usage: uzfs-bench devbw DIR SIZE".into()),
        },
        _ => Err(
            "usage: uzfs-bench seqwrite DIR SIZE | checksum SIZE | compress SIZE | txg DIR ROUNDS"
                .into(),
        ),
    };
    if let Err(e) = r {
        eprintln!("uzfs-bench: {e}");
        std::process::exit(1);
    }
}
