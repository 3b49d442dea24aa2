//! A mount's dirty pages are held to FUSE's strict 1% while the writes
//! written back are whole records, and limited as a local filesystem's
//! while they are pieces of records (`fuse/bdi.rs`); `UZFS_FUSE_STRICT_LIMIT`
//! fixes either. The daemon is an I/O flusher where it may be, and what
//! the kernel holds dirty reaches the pool whole.
mod common;

use common::{can_mount, Env, Rng};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// PF_MEMALLOC_NOIO | PF_LOCAL_THROTTLE (include/linux/sched.h), the
/// flags PR_SET_IO_FLUSHER sets.
const IO_FLUSHER_FLAGS: u64 = 0x0008_0000 | 0x0010_0000;

/// A knob of the bdi behind `mnt` (a FUSE mount's device number names
/// its bdi).
fn bdi_knob(mnt: &Path, knob: &str) -> String {
    let dev = std::fs::metadata(mnt).expect("stat").dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let p = format!("/sys/class/bdi/{maj}:{min}/{knob}");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .to_string()
}

/// Whether this process has CAP_SYS_RESOURCE (which PR_SET_IO_FLUSHER
/// needs; containers often drop it).
fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// The task flags of `pid`'s main thread (/proc/PID/stat, field 9).
fn task_flags(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The command name may hold spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    rest.split(' ')
        .nth(6)
        .and_then(|f| f.parse().ok())
        .expect("flags field")
}

#[test]
fn strict_limit_kept_or_lifted() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    assert_eq!(bdi_knob(&mnt, "strict_limit"), "1", "strict at first");
    let flags = task_flags(e.daemon_pid());
    if has_sys_resource() {
        assert_eq!(
            flags & IO_FLUSHER_FLAGS,
            IO_FLUSHER_FLAGS,
            "the daemon is an I/O flusher (flags {flags:#x})"
        );
    } else {
        eprintln!("no CAP_SYS_RESOURCE here: the I/O flusher mark is not checked");
    }

    let mut lifted = Env::new();
    lifted.envs = vec![("UZFS_FUSE_STRICT_LIMIT".into(), "0".into())];
    let mnt = lifted.tank();
    assert_eq!(
        bdi_knob(&mnt, "strict_limit"),
        "0",
        "UZFS_FUSE_STRICT_LIMIT=0 lifts it"
    );
    assert_eq!(
        bdi_knob(&mnt, "max_ratio"),
        "1",
        "writeback still starts at 1%"
    );
}

/// `len` bytes at `path`, written in 1 MiB writes and fsynced.
fn write_whole(path: &Path, len: usize, seed: u64) {
    let f = std::fs::File::create(path).expect("create");
    let mut rng = Rng(seed);
    for at in (0..len).step_by(1 << 20) {
        f.write_all_at(&rng.bytes(1 << 20), at as u64)
            .expect("write");
    }
    f.sync_all().expect("fsync");
}

/// 16 KiB pieces in every other 16 KiB of a file: none starts on a
/// 128 KiB record boundary, nor do the writes the kernel makes of them.
fn write_pieces(path: &Path, len: usize, seed: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let mut rng = Rng(seed);
    for at in (16 << 10..len).step_by(32 << 10) {
        f.write_all_at(&rng.bytes(16 << 10), at as u64)
            .expect("write");
    }
    f.sync_all().expect("fsync");
}

#[test]
fn adaptive_limit_follows_the_writes() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    let path = mnt.join("f");
    const LEN: usize = 32 << 20;
    write_whole(&path, LEN, 1);
    assert_eq!(bdi_knob(&mnt, "strict_limit"), "1", "whole records: strict");
    write_pieces(&path, LEN, 2);
    assert_eq!(bdi_knob(&mnt, "strict_limit"), "0", "pieces: lifted");
    write_whole(&path, LEN, 3);
    assert_eq!(bdi_knob(&mnt, "strict_limit"), "1", "whole again: restored");

    let mut kept = Env::new();
    kept.envs = vec![("UZFS_FUSE_STRICT_LIMIT".into(), "1".into())];
    let mnt = kept.tank();
    let path = mnt.join("f");
    write_whole(&path, LEN, 1);
    write_pieces(&path, LEN, 2);
    assert_eq!(
        bdi_knob(&mnt, "strict_limit"),
        "1",
        "UZFS_FUSE_STRICT_LIMIT=1: never lifted"
    );
}

/// 16 KiB pieces written at random over a 96 MiB file with no fsync (past
/// the 1% a FUSE mount holds dirty with the strict limit), on a mount
/// without it, the file closed (which writes its pages back) and the pool
/// exported and imported: the file is the model, and zdb is clean.
#[test]
fn dirty_pages_reach_the_pool_whole() {
    if !can_mount() {
        return;
    }
    let mut e = Env::new();
    e.envs = vec![("UZFS_FUSE_STRICT_LIMIT".into(), "0".into())];
    let mnt = e.tank();
    let path = mnt.join("f");
    const LEN: usize = 96 << 20;
    const PIECE: usize = 16 << 10;
    let mut rng = Rng(0x5eed_d1e7);
    let mut model = rng.bytes(LEN);
    std::fs::write(&path, &model).expect("layout");
    std::fs::File::open(&path)
        .expect("open")
        .sync_all()
        .expect("fsync");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    for _ in 0..(2 * LEN / PIECE) {
        let at = rng.below((LEN / PIECE) as u64) as usize * PIECE;
        let piece = rng.bytes(PIECE);
        f.write_all_at(&piece, at as u64).expect("write");
        model[at..at + PIECE].copy_from_slice(&piece);
    }
    drop(f);
    e.reimport("tank");
    let back = std::fs::read(&path).expect("read back");
    assert_eq!(back.len(), LEN);
    let first_diff = back.iter().zip(&model).position(|(a, b)| a != b);
    assert!(
        first_diff.is_none(),
        "byte {first_diff:?} differs after export"
    );
    e.export_and_zdb("tank");
}
