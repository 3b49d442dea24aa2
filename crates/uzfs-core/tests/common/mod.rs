#![allow(dead_code)]
//! Shared helpers for the engine's integration tests.

use std::sync::Arc;
use uzfs_core::spa::import::{discover, FoundPool};
use uzfs_core::spa::{CreateOptions, Pool, TopSpec, Tunables};
use uzfs_core::vdev::sim::{SimDevice, SimWorld};
use uzfs_core::vdev::{BlockDevice, TopKind};

pub const DISK: u64 = 96 << 20;

pub fn tunables() -> Tunables {
    Tunables {
        sync_thread: false,
        cache_bytes: 4 << 20,
        dirty_max: 256 << 20,
        // Condense often, so the crash tests exercise it.
        condense_min_entries: 16,
        ..Tunables::default()
    }
}

pub fn opts(seed: u64) -> CreateOptions {
    CreateOptions {
        tunables: tunables(),
        guid_seed: Some(seed),
        ..CreateOptions::default()
    }
}

pub fn spec(kind: TopKind, disks: &[SimDevice]) -> TopSpec {
    TopSpec {
        kind,
        leaves: disks
            .iter()
            .map(|d| (d.name(), Arc::new(d.clone()) as Arc<dyn BlockDevice>))
            .collect(),
    }
}

pub fn devs(disks: &[SimDevice]) -> Vec<(String, Arc<dyn BlockDevice>)> {
    disks
        .iter()
        .map(|d| (d.name(), Arc::new(d.clone()) as Arc<dyn BlockDevice>))
        .collect()
}

/// Find the one pool on a set of device images.
pub fn find(world: &SimWorld, images: Vec<(String, Vec<u8>)>) -> (Vec<SimDevice>, FoundPool) {
    let disks: Vec<SimDevice> = images
        .into_iter()
        .map(|(n, img)| world.disk_from_image(&n, img))
        .collect();
    let mut found = discover(devs(&disks));
    assert_eq!(found.len(), 1, "expected exactly one pool");
    (disks, found.remove(0))
}

pub fn reimport(world: &SimWorld, images: Vec<(String, Vec<u8>)>) -> uzfs_core::Result<Arc<Pool>> {
    let (_d, f) = find(world, images);
    Pool::import(&f, None, tunables())
}

/// Import the pool found on what the disks kept after a crash
/// (`SimWorld::crash`), on fresh simulated disks.
pub fn import_images(images: Vec<(String, Vec<u8>)>, seed: u64) -> (Vec<SimDevice>, Arc<Pool>) {
    let (disks, found) = find(&SimWorld::new(), images);
    let pool = Pool::import(&found, None, tunables())
        .unwrap_or_else(|e| panic!("seed {seed}: import: {e}"));
    (disks, pool)
}

pub fn images(disks: &[SimDevice]) -> Vec<(String, Vec<u8>)> {
    disks.iter().map(|d| (d.name(), d.image())).collect()
}

/// A regular file `name` (mode 0644) in the root directory of `fs`.
pub fn create_file(fs: &uzfs_core::zpl::Zpl, name: &[u8]) -> u64 {
    try_create_file(fs, name).expect("create")
}

/// Create a regular file in the root: its inode, or the errno (a full
/// pool, a lost power supply).
pub fn try_create_file(fs: &uzfs_core::zpl::Zpl, name: &[u8]) -> Result<u64, i32> {
    fs.mknod(fs.root, name, libc::S_IFREG | 0o644, 0, 0, 0, None)
        .map(|a| a.ino)
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = uzfs_core::vdev::sim::SimRng::new(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

/// A count from the environment (seeds, seconds), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// zdb over the devices finds every checksum good, space exact and every
/// namespace consistent; `what` names the check in the failure.
pub fn assert_zdb_clean(disks: &[SimDevice], what: &str) {
    let r = uzfs_core::zdb::verify(devs(disks)).unwrap_or_else(|e| panic!("{what}: zdb: {e}"));
    assert!(
        r.is_clean(),
        "{what}: zdb:\n{}",
        uzfs_core::zdb::format_report(&r)
    );
}

/// A pool on one 96 MiB disk with its root filesystem formatted.
pub fn one_disk_fs(world: &SimWorld, seed: u64) -> (Vec<SimDevice>, Arc<Pool>) {
    one_disk_fs_with(world, opts(seed))
}

/// [`one_disk_fs`] created with options `o` (tunables of its own).
pub fn one_disk_fs_with(world: &SimWorld, o: CreateOptions) -> (Vec<SimDevice>, Arc<Pool>) {
    let disks = vec![world.disk("d0", DISK)];
    let p = Pool::create("tank", vec![spec(TopKind::Disk, &disks)], o).expect("create");
    p.dsl_pool().format_root_fs().expect("format");
    (disks, p)
}

/// Mount dataset `name` of `p` as a filesystem (the engine's POSIX layer).
pub fn mount_fs(p: &Arc<Pool>, name: &str) -> uzfs_core::zpl::Zpl {
    let ds = p.dsl_pool().dataset(name).expect("dataset");
    uzfs_core::zpl::Zpl::mount(ds.os.clone(), uzfs_core::dsl::DsCtx::new(p.clone(), ds))
        .expect("mount")
}

/// One 96 MiB disk or a two-way mirror of them, picked by `rng`.
pub fn disk_or_mirror(
    world: &SimWorld,
    rng: &mut uzfs_core::vdev::sim::SimRng,
) -> (Vec<SimDevice>, TopSpec) {
    let mirror = rng.chance(1, 2);
    let disks: Vec<_> = (0..if mirror { 2 } else { 1 })
        .map(|i| world.disk(&format!("d{i}"), 96 << 20))
        .collect();
    let kind = if mirror {
        TopKind::Mirror
    } else {
        TopKind::Disk
    };
    let s = spec(kind, &disks);
    (disks, s)
}

/// A pool "s" on a mirror of two 96 MiB disks, sync thread on, with a
/// file "big" of `mib` MiB of `pattern(seed)` written and committed
/// (40 MiB: over 40% full). Returns the disks, the pool, its mounted
/// filesystem, the file's object and its contents.
pub fn mirror_with_file(
    seed: u64,
    mib: usize,
    t: Tunables,
) -> (Vec<SimDevice>, Arc<Pool>, uzfs_core::zpl::Zpl, u64, Vec<u8>) {
    let world = SimWorld::new();
    let disks = vec![world.disk("d0", DISK), world.disk("d1", DISK)];
    let mut o = opts(seed);
    o.tunables = Tunables {
        sync_thread: true,
        dirty_max: 32 << 20,
        ..t
    };
    let pool = Pool::create("s", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = mount_fs(&pool, "s");
    let big = fs
        .mknod(fs.root, b"big", libc::S_IFREG | 0o644, 0, 0, 0, None)
        .expect("create")
        .ino;
    let data = pattern(seed, mib << 20);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        fs.write(big, (i as u64) << 20, c).expect("fill");
    }
    pool.txg_wait_synced().expect("sync");
    (disks, pool, fs, big, data)
}
