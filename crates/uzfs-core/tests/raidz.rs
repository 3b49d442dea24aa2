//! RAID-Z end to end on simulated disks: for widths 3..12, parity 1..3,
//! ashift 9 and 12 and a spread of block sizes, write random data, destroy
//! (I/O errors) or silently corrupt up to parity-many devices, and read every
//! byte back. Silent damage must be pinned on the right device (its CKSUM
//! counter), repaired on read, and `zdb` must then find the pool clean.

mod common;
use common::{devs, pattern};
use proptest::prelude::*;
use std::sync::Arc;
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::Compression;
use uzfs_core::dmu::dnode::ObjProps;
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::{SimDevice, SimRng, SimWorld};
use uzfs_core::vdev::{TopKind, VdevStats, LABEL_START_SIZE};
use uzfs_core::zdb;

const DISK: u64 = 64 << 20;

fn tun() -> Tunables {
    Tunables {
        sync_thread: false,
        cache_bytes: 0,
        ..common::tunables()
    }
}

fn raidz_pool(
    world: &SimWorld,
    width: usize,
    np: usize,
    ashift: u8,
    seed: u64,
) -> (Vec<SimDevice>, Arc<Pool>) {
    let disks: Vec<SimDevice> = (0..width)
        .map(|i| world.disk(&format!("rz{i}"), DISK))
        .collect();
    let spec = TopSpec {
        kind: TopKind::raidz(np).expect("parity"),
        leaves: devs(&disks),
    };
    let opts = CreateOptions {
        ashift,
        tunables: tun(),
        guid_seed: Some(seed),
        ..CreateOptions::default()
    };
    let pool = Pool::create("rz", vec![spec], opts).expect("create raidz");
    (disks, pool)
}

/// Objects of assorted block sizes and lengths, compressed or not.
fn fill(pool: &Pool, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = SimRng::new(seed);
    let mut out = Vec::new();
    for i in 0..6u64 {
        let blksz = [512u32, 4096, 16384, 131072][rng.below(4) as usize];
        let len = 1 + rng.below(300_000) as usize;
        let compress = if i % 2 == 0 {
            Compression::Off
        } else {
            Compression::Lz4
        };
        let props = ObjProps {
            checksum: ChecksumType::Fletcher4,
            compress,
            copies: 1,
        };
        let obj = pool.create_object(blksz, &props).expect("create object");
        let mut data = pattern(seed * 100 + i, len);
        if compress == Compression::Lz4 {
            // Half compressible, so psize varies.
            for b in data.iter_mut().skip(len / 2) {
                *b &= 0x3;
            }
        }
        pool.write(obj, 0, &data).expect("write");
        out.push((obj, data));
    }
    pool.sync().expect("sync");
    out
}

fn check_all(pool: &Pool, objs: &[(u64, Vec<u8>)]) {
    for (obj, data) in objs {
        let mut buf = vec![0u8; data.len()];
        pool.read(*obj, 0, &mut buf).expect("read back");
        assert!(buf == *data, "object {obj} differs");
    }
}

/// Silent corruption of `dev`: random 4 KiB smears over its first 24 MiB
/// of allocatable space, where this test's blocks live.
fn smear(dev: &SimDevice, rng: &mut SimRng) {
    for _ in 0..400 {
        let off = LABEL_START_SIZE + rng.below(24 << 20);
        dev.corrupt(off, 4096, rng);
    }
}

fn cksum(pool: &Pool, child: usize) -> u64 {
    VdevStats::get(&pool.io.tops()[0].children[child].stats.cksum_errors)
}

fn run_case(
    width: usize,
    np: usize,
    ashift: u8,
    seed: u64,
    victims: Vec<usize>,
    silent: Vec<bool>,
) {
    let world = SimWorld::new();
    let (disks, pool) = raidz_pool(&world, width, np, ashift, seed);
    let objs = fill(&pool, seed);
    check_all(&pool, &objs);
    let mut rng = SimRng::new(seed ^ 0x5eed);
    for (v, s) in victims.iter().zip(&silent) {
        if *s {
            smear(&disks[*v], &mut rng);
        } else {
            disks[*v].fail_reads(true);
        }
    }
    check_all(&pool, &objs);
    // Silent damage is pinned on the corrupted devices only.
    for c in 0..width {
        let hit = victims.iter().zip(&silent).any(|(v, s)| *v == c && *s);
        if !hit {
            assert_eq!(cksum(&pool, c), 0, "CKSUM charged to healthy child {c}");
        }
    }
    // Reading does not touch parity or unread metadata; a scrub repairs
    // everything that is left, and zdb then finds every copy good.
    pool.scrub().expect("scrub");
    pool.wait_scan();
    let st = pool.scan_status().expect("scan");
    assert_eq!(st.errors, 0, "{st:?}");
    check_all(&pool, &objs);
    for d in &disks {
        d.fail_reads(false);
    }
    pool.close().expect("close");
    let report = zdb::verify(devs(&disks)).expect("zdb");
    assert!(report.is_clean(), "{}", zdb::format_report(&report));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn raidz_survives_parity_many_failures(
        np in 1usize..=3,
        extra in 1usize..=9,
        big_sectors in any::<bool>(),
        seed in 1u64..1_000_000,
        picks in proptest::collection::vec((0usize..12, any::<bool>()), 3),
    ) {
        let width = (np + extra).clamp(np + 1, 12);
        let ashift = if big_sectors { 12 } else { 9 };
        let mut victims = Vec::new();
        let mut silent = Vec::new();
        for (p, s) in picks.into_iter().take(np) {
            let v = p % width;
            if !victims.contains(&v) {
                victims.push(v);
                silent.push(s);
            }
        }
        run_case(width, np, ashift, seed, victims, silent);
    }
}

#[test]
fn every_width_and_parity_reads_back_with_parity_many_destroyed() {
    for np in 1..=3 {
        for width in np + 1..=12 {
            let victims: Vec<usize> = (0..np).map(|i| (i * 5 + width) % width).collect();
            let mut v = victims.clone();
            v.dedup();
            let silent = vec![false; v.len()];
            run_case(width, np, 12, width as u64 * 7 + np as u64, v, silent);
        }
    }
}

#[test]
fn all_silent_at_full_parity() {
    // The hardest case: no device reports an error, parity-many lie.
    run_case(7, 3, 9, 42, vec![1, 3, 6], vec![true, true, true]);
    run_case(5, 2, 12, 43, vec![0, 4], vec![true, true]);
    run_case(3, 1, 9, 44, vec![2], vec![true]);
}

#[test]
fn healthy_reads_touch_no_parity() {
    let world = SimWorld::new();
    let (_disks, pool) = raidz_pool(&world, 6, 2, 12, 9);
    let props = ObjProps::default();
    let obj = pool.create_object(131072, &props).expect("obj");
    let data = pattern(9, 8 << 20);
    pool.write(obj, 0, &data).expect("write");
    pool.sync().expect("sync");
    let read_bytes = |p: &Pool| -> u64 {
        p.io.tops()[0]
            .leaves()
            .iter()
            .map(|l| VdevStats::get(&l.stats.bytes_read))
            .sum()
    };
    let mut buf = vec![0u8; data.len()];
    // Warm the metadata path, then measure a second read of the data.
    pool.read(obj, 0, &mut buf).expect("read");
    let before = read_bytes(&pool);
    pool.read(obj, 0, &mut buf).expect("read");
    let delta = read_bytes(&pool) - before;
    assert!(buf == data);
    // 8 MiB of data plus its indirect blocks; parity would add half again.
    assert!(
        delta < data.len() as u64 + (1 << 20),
        "read {delta} bytes for {} of data",
        data.len()
    );
}

#[test]
fn more_failures_than_parity_is_an_error_not_wrong_data() {
    let world = SimWorld::new();
    let (disks, pool) = raidz_pool(&world, 5, 1, 12, 77);
    let objs = fill(&pool, 77);
    let mut rng = SimRng::new(1);
    disks[0].corrupt(LABEL_START_SIZE, 24 << 20, &mut rng);
    disks[2].corrupt(LABEL_START_SIZE, 24 << 20, &mut rng);
    let mut any_err = false;
    for (obj, data) in &objs {
        let mut buf = vec![0u8; data.len()];
        match pool.read(*obj, 0, &mut buf) {
            Ok(()) => assert!(buf == *data, "wrong data returned for object {obj}"),
            Err(e) => {
                any_err = true;
                assert!(
                    e.to_string().contains("checksum") || e.to_string().contains("valid"),
                    "{e}"
                );
            }
        }
    }
    assert!(any_err, "two ruined devices under raidz1 must lose data");
}

/// The same on real files: raidz1 x3, raidz2 x7, raidz3 x12.
#[test]
fn raidz_on_file_vdevs() {
    use std::os::unix::fs::FileExt;
    use uzfs_core::spa::import::{discover, scan_dir};
    use uzfs_core::vdev::{BlockDevice, FileDevice};
    for (np, width) in [(1usize, 3usize), (2, 7), (3, 12)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let leaves: Vec<(String, Arc<dyn BlockDevice>)> = (0..width)
            .map(|i| {
                let p = dir.path().join(format!("f{i:02}"));
                std::fs::File::create(&p)
                    .and_then(|f| f.set_len(DISK))
                    .expect("file");
                (
                    p.display().to_string(),
                    Arc::new(FileDevice::open(&p).expect("open")) as Arc<dyn BlockDevice>,
                )
            })
            .collect();
        let paths: Vec<String> = leaves.iter().map(|l| l.0.clone()).collect();
        let opts = CreateOptions {
            tunables: tun(),
            ..CreateOptions::default()
        };
        let spec = TopSpec {
            kind: TopKind::raidz(np).expect("parity"),
            leaves,
        };
        let pool = Pool::create("rzf", vec![spec], opts).expect("create");
        let objs = fill(&pool, np as u64 * 100 + width as u64);
        pool.close().expect("close");
        // Damage parity-many files: the first is zeroed (destroyed), the
        // rest get random garbage over their data region (silent).
        let mut rng = SimRng::new(width as u64);
        for (k, p) in paths.iter().take(np).enumerate() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .expect("open");
            let mut junk = vec![0u8; 8 << 20];
            if k > 0 {
                rng.fill(&mut junk);
            }
            f.write_all_at(&junk, LABEL_START_SIZE).expect("damage");
        }
        let mut found = discover(scan_dir(dir.path()).expect("scan"));
        assert_eq!(found.len(), 1);
        let pool = Pool::import(&found.remove(0), None, tun()).expect("import");
        check_all(&pool, &objs);
        pool.scrub().expect("scrub");
        pool.wait_scan();
        let st = pool.scan_status().expect("scan");
        assert!(st.errors == 0 && st.repaired > 0, "{st:?}");
        pool.close().expect("close");
        let devs = scan_dir(dir.path()).expect("scan");
        let r = zdb::verify(devs).expect("zdb");
        assert!(
            r.is_clean(),
            "raidz{np} x{width}: {}",
            zdb::format_report(&r)
        );
    }
}
