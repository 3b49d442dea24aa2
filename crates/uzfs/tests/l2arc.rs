//! L2ARC cache devices through the CLI and the mount: `zpool create ...
//! cache DEV`, reads served from the device once the ARC (made small here)
//! lets blocks go, the cache kept across export/import and a daemon
//! restart, and a cache device that is overwritten or vanishes never
//! changing what a read returns. Needs root and /dev/fuse.

mod common;
use common::{arcstat, can_mount, wait_for, Env, Rng};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Read `path` cold: the kernel's pages of it dropped, the ARC emptied
/// (`zinject -a`), so every block comes from the cache device or the pool.
fn read_cold(e: &Env, path: &Path) -> Vec<u8> {
    common::drop_pages(path);
    e.ok(&["zinject", "-a", "tank"]);
    std::fs::read(path).expect("read")
}

fn cache_section(e: &Env) -> String {
    let s = e.ok(&["zpool", "status", "tank"]);
    s.split_once("\tcache\n")
        .map_or(String::new(), |(_, c)| c.to_string())
}

#[test]
fn reads_come_from_the_cache_device_which_persists_and_never_lies() {
    if !can_mount() {
        return;
    }
    let mut e = Env::new();
    e.envs
        .push(("UZFS_ARC_MAX".into(), (48u64 << 20).to_string()));
    e.envs.push(("UZFS_L2ARC_WRITE_MAX".into(), "1G".into()));
    let (a, b) = (e.disk("a", 768), e.disk("b", 768));
    let c = e.disk("c", 256);
    e.ok(&["zpool", "create", "tank", "mirror", &a, &b, "cache", &c]);
    let m: PathBuf = e.dir.path().join("mnt/tank");
    assert!(
        cache_section(&e).contains(&c),
        "{}",
        e.ok(&["zpool", "status", "tank"])
    );
    let data = Rng(7).bytes(160 << 20);
    std::fs::write(m.join("f"), &data).expect("write");
    e.ok(&["zpool", "sync", "tank"]);

    // Two cold reads: the first lets the ARC's blocks go to the device,
    // the second finds them there.
    assert!(read_cold(&e, &m.join("f")) == data);
    wait_for(&e, "the feed wrote", |e| arcstat(e, "l2_size") > 64 << 20);
    assert!(read_cold(&e, &m.join("f")) == data);
    wait_for(&e, "reads hit the device", |e| arcstat(e, "l2_hits") > 100);
    let iostat = e.ok(&["zpool", "iostat", "-v", "tank"]);
    assert!(iostat.contains("cache") && iostat.contains(&c), "{iostat}");
    let list = e.ok(&["zpool", "list", "-v", "tank"]);
    assert!(list.contains("cache") && list.contains(&c), "{list}");

    // Export and import: the index comes back from the device.
    e.reimport("tank");
    wait_for(&e, "rebuilt at import", |e| {
        arcstat(e, "l2_rebuild_bufs") > 100 && arcstat(e, "l2_size") > 64 << 20
    });
    assert!(read_cold(&e, &m.join("f")) == data);
    wait_for(&e, "hits after import", |e| arcstat(e, "l2_hits") > 100);

    // A daemon killed and started again (by the next command).
    e.kill_daemon();
    e.ok(&["zpool", "list", "tank"]);
    wait_for(&e, "rebuilt after a restart", |e| {
        arcstat(e, "l2_rebuild_bufs") > 100
    });
    assert!(read_cold(&e, &m.join("f")) == data);
    wait_for(&e, "hits after a restart", |e| arcstat(e, "l2_hits") > 100);

    // The device overwritten behind the pool's back (its labels spared):
    // every read still returns the file, the damage is counted.
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&c)
        .expect("open cache device");
    let junk = Rng(99).bytes(1 << 20);
    let mut at = 4u64 << 20;
    while at + (1 << 20) <= (256 << 20) - (1 << 20) {
        dev.write_all_at(&junk, at).expect("overwrite");
        at += 1 << 20;
    }
    dev.sync_all().expect("sync");
    // The daemon reads the device through the host's page cache.
    std::fs::write("/proc/sys/vm/drop_caches", "1").expect("drop_caches");
    assert!(
        read_cold(&e, &m.join("f")) == data,
        "a damaged cache device changed a read"
    );
    wait_for(&e, "damage counted", |e| arcstat(e, "l2_cksum_bad") > 0);
    let cache = cache_section(&e);
    let cksum: u64 = cache
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        cksum > 0,
        "status shows no checksum errors on the cache device:\n{cache}"
    );

    // The device vanishes (shrinks to nothing): reads go to the pool.
    std::fs::write(m.join("g"), Rng(8).bytes(64 << 20)).expect("write g");
    dev.set_len(0).expect("truncate");
    assert!(read_cold(&e, &m.join("f")) == data);

    // And leaves the pool.
    e.ok(&["zpool", "remove", "tank", &c]);
    assert_eq!(
        cache_section(&e),
        "",
        "{}",
        e.ok(&["zpool", "status", "tank"])
    );
    assert!(read_cold(&e, &m.join("f")) == data);
    e.export_and_zdb("tank");
}

#[test]
fn cache_devices_are_parsed_added_and_refused_as_openzfs_does() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let a = e.disk("a", 256);
    let (c1, c2) = (e.disk("c1", 64), e.disk("c2", 64));
    let tiny = e.disk("tiny", 5);
    e.fails(
        &["zpool", "create", "tank", &a, "cache"],
        1,
        "cache requires at least 1 device",
    );
    let dry = e.ok(&["zpool", "create", "-n", "tank", &a, "cache", &c1]);
    assert!(dry.contains("\tcache\n\t  ") && dry.contains(&c1), "{dry}");
    e.ok(&["zpool", "create", "tank", &a]);
    let dry = e.ok(&["zpool", "add", "-n", "tank", "cache", &c1]);
    assert!(dry.contains("\tcache\n") && dry.contains(&c1), "{dry}");
    assert_eq!(cache_section(&e), "", "a dry run added nothing");
    e.fails(
        &["zpool", "add", "tank", "cache", &tiny],
        1,
        "cache device must hold",
    );
    e.ok(&["zpool", "add", "tank", "cache", &c1, &c2]);
    let s = cache_section(&e);
    assert!(s.contains(&c1) && s.contains(&c2), "{s}");
    e.fails(
        &["zpool", "add", "tank", "cache", &c1],
        1,
        "part of active pool",
    );
    e.ok(&["zpool", "remove", "tank", &c2]);
    let s = cache_section(&e);
    assert!(s.contains(&c1) && !s.contains(&c2), "{s}");
    e.export_and_zdb("tank");
}
