//! The mount's share of the kernel's dirty pages.
//!
//! With the writeback cache a write(2) into a FUSE file dirties the
//! kernel's pages and returns; the kernel writes them back to the daemon
//! later, as it does for a local filesystem. But the kernel gives each
//! FUSE mount a backing device (bdi) with `strict_limit` set and
//! `max_ratio` 1: the mount may hold 1% of the dirty threshold (48 MB on
//! this 24 GiB machine), and a writer past that waits for the daemon even
//! while the machine has gigabytes of dirty headroom. The kernel does so
//! because an unprivileged FUSE server may be slow or hostile, and only it
//! can clean its pages.
//!
//! What that costs uzfs: random 16 KiB writes over a 1 GiB file of 128
//! KiB records. Throttled at 48 MB, each record reaches the daemon with
//! one or two 16 KiB pieces written, and a txg writes it whole for them
//! (eight times the bytes). With a 512 MiB `arc_max` (dirty data held to
//! 256 MiB) that ran at 53-65 MiB/s where ext4 runs at 900; at the default
//! sizes the daemon's own dirty records held the whole file instead, at
//! the price of a gigabyte of daemon memory. Let the kernel hold those
//! pages as it would for ext4, and the same records reach the daemon
//! whole or nearly: the page cache is the write buffer, as it is the read
//! cache (one copy, docs/ARCHITECTURE.md).
//!
//! Lifting the limit (`strict_limit` 0 in `/sys/class/bdi/MAJ:MIN/`,
//! `max_ratio` kept at 1; the daemon is root: it mounted) makes a writer
//! throttled as a local filesystem's is, by the global `vm.dirty_ratio`,
//! and pages it rewrites while they wait are sent once: fs.sh's 16 KiB
//! random writes ran 7-8x faster with a 512 MiB `arc_max` (bench/RESULTS.md,
//! "the kernel as the write buffer"). But without the limit the kernel
//! starts writing a mount's pages back only when the whole machine
//! passes `vm.dirty_background_ratio` (or at an fsync, or the flusher's
//! 5 s round): a 1 GiB sequential write sat in the page cache whole (915
//! MB dirty, none under writeback) until its end fsync while the daemon
//! idled, and ran at 0.76-0.84x. With the limit, writeback starts at half
//! of it (so a larger `max_ratio` under the strict limit, tried at 25%,
//! delayed it the same way: 0.76x).
//!
//! So the limit follows what the kernel writes back ([`DirtyLimit`]):
//! pieces of records (writes starting inside a record) mean a writer the
//! kernel should gather for, whole records mean a stream that should flow
//! at once. Every 64 records seen, the limit is lifted if at least half
//! were pieces and restored if at most one in eight were. A stream that
//! starts while the limit is lifted waits for the flusher's round (at most
//! 5 s) before its first whole records restore it. `UZFS_FUSE_STRICT_LIMIT=1`
//! keeps the kernel's limit, `0` lifts it for good.
//!
//! The pages count against the machine's dirty limits, not the daemon's
//! RSS, and reach the pool within `vm.dirty_expire_centisecs` plus a txg
//! unless an fsync, a close, a snapshot or an export sends them first.
//!
//! The daemon's own buffered writes (labels, uberblocks, small blocks to
//! file vdevs) go to another device, whose pages its own flusher cleans.
//! When the global count passes the limit, the kernel still lets a writer
//! through whose device holds next to no dirty pages (`balance_dirty_pages`:
//! "give the other good wb's a pipe"), so the daemon is slowed, never
//! stopped, by pages only it can clean. Where it is allowed
//! (CAP_SYS_RESOURCE, which containers often drop) the daemon also marks
//! itself an I/O flusher (`PR_SET_IO_FLUSHER`, [`mark_io_flusher`]), as
//! the kernel documents for user-space block and filesystem servers: then
//! its writes are throttled only against their own device, and its
//! allocations never wait on I/O in reclaim. Where /sys is read-only
//! (some containers) the limit stays and the log says so.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `prctl(PR_SET_IO_FLUSHER)` (Linux 5.6; libc lacks the constant for
/// glibc targets).
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// Mark the calling thread, and every thread it creates afterwards, an
/// I/O flusher. Call before any thread is spawned. Best effort: needs
/// CAP_SYS_RESOURCE (a refusal is logged at debug level).
pub fn mark_io_flusher() {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let r = unsafe {
        libc::prctl(
            PR_SET_IO_FLUSHER,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        log::debug!(
            "PR_SET_IO_FLUSHER refused ({})",
            std::io::Error::last_os_error()
        );
    }
}

/// How a mount's strict limit is set (`UZFS_FUSE_STRICT_LIMIT`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// `1`: the kernel's limit, always.
    Kept,
    /// `0`: lifted, always.
    Lifted,
    /// Otherwise: lifted while the writes written back start inside
    /// records, restored while they start on record boundaries.
    Adaptive,
}

pub fn mode() -> Mode {
    match std::env::var("UZFS_FUSE_STRICT_LIMIT").as_deref() {
        Ok("1") => Mode::Kept,
        Ok("0") => Mode::Lifted,
        _ => Mode::Adaptive,
    }
}

/// Records judged at a time.
const WINDOW: u32 = 64;

/// One mount's strict limit.
#[derive(Default)]
pub struct DirtyLimit {
    /// `/sys/class/bdi/MAJ:MIN/strict_limit`, once the mount is up and
    /// the mode lets the daemon change it.
    knob: std::sync::OnceLock<(PathBuf, Mode)>,
    /// The current window and whether the limit is lifted; a window is
    /// judged and the knob written under the lock, so two windows ending
    /// at once cannot write it out of order.
    state: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// Pieces of records seen in this window.
    pieces: u32,
    /// Pieces and whole records seen in this window.
    seen: u32,
    lifted: bool,
}

impl DirtyLimit {
    /// The mount is up on device `dev` (its `MAJ:MIN` in
    /// /proc/self/mountinfo, which names its bdi): lift the limit for
    /// [`Mode::Lifted`].
    pub fn attach(&self, dev: Option<&str>) {
        let mode = mode();
        if mode == Mode::Kept {
            return;
        }
        let Some(bdi) = dev else {
            return;
        };
        let knob = Path::new("/sys/class/bdi").join(bdi).join("strict_limit");
        if mode == Mode::Lifted && !set(&knob, false, &mut self.state()) {
            return;
        }
        let _ = self.knob.set((knob, mode));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Window> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write of `len` bytes at `offset` that the kernel wrote back from
    /// its page cache, into a file of `recordsize()` records (asked only
    /// when the limit is adaptive). It counts as a piece if it starts
    /// inside a record (the daemon must merge it with the rest), and as
    /// one whole record per record it covers whole; its tail counts for
    /// nothing (the end of a small file or a stream is no sign either
    /// way). Every [`WINDOW`] counted, the limit is lifted if at least
    /// half were pieces, and restored if at most one in eight.
    pub fn note(&self, offset: u64, len: u64, recordsize: impl FnOnce() -> u64) {
        let Some((knob, Mode::Adaptive)) = self.knob.get() else {
            return;
        };
        let rs = recordsize().max(512);
        let piece = !offset.is_multiple_of(rs);
        let first_whole = offset.div_ceil(rs);
        let whole = ((offset + len) / rs).saturating_sub(first_whole) as u32;
        let mut w = self.state();
        w.pieces += piece as u32;
        w.seen += piece as u32 + whole;
        if w.seen < WINDOW {
            return;
        }
        let (pieces, seen) = (w.pieces, w.seen);
        (w.pieces, w.seen) = (0, 0);
        if !w.lifted && pieces * 2 >= seen {
            set(knob, false, &mut w);
        } else if w.lifted && pieces * 8 <= seen {
            set(knob, true, &mut w);
        }
    }
}

/// Write `strict` to `knob`; `w.lifted` follows when it took.
fn set(knob: &Path, strict: bool, w: &mut Window) -> bool {
    match std::fs::write(knob, if strict { "1" } else { "0" }) {
        Ok(()) => {
            w.lifted = !strict;
            log::debug!("{}: strict_limit {}", knob.display(), strict as u8);
            true
        }
        Err(e) => {
            log::info!(
                "the kernel's dirty-page limit for FUSE stays ({}: {e})",
                knob.display()
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy on a stand-in knob: lifted after a window of pieces,
    /// kept through a mixed one, restored after a window of whole records.
    #[test]
    fn flips_with_the_writes_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let knob = dir.path().join("strict_limit");
        std::fs::write(&knob, "1").expect("knob");
        let d = DirtyLimit::default();
        let _ = d.knob.set((knob.clone(), Mode::Adaptive));
        let read = || std::fs::read_to_string(&knob).expect("read");
        const R: u64 = 128 << 10;
        let piece = |d: &DirtyLimit| d.note(R + 4096, 16 << 10, || R);
        let whole = |d: &DirtyLimit| d.note(0, R, || R);
        for i in 0..WINDOW - 1 {
            if i % 2 == 0 {
                piece(&d)
            } else {
                whole(&d)
            }
        }
        assert_eq!(read(), "1", "judged only at the window's end");
        piece(&d);
        assert_eq!(read(), "0", "half were pieces");
        for i in 0..WINDOW {
            if i % 4 == 0 {
                piece(&d)
            } else {
                whole(&d)
            }
        }
        assert_eq!(read(), "0", "a quarter pieces: stays lifted");
        // One 1 MiB write starting inside a record: one piece, seven
        // whole records; eight of them make a window.
        for _ in 0..WINDOW / 8 {
            d.note(R / 2, 1 << 20, || R);
        }
        assert_eq!(read(), "1", "one in eight: restored");
        // A small file's only write, at 0: neither.
        for _ in 0..4 * WINDOW {
            d.note(0, 1024, || R);
        }
        assert_eq!(read(), "1");
        for _ in 0..WINDOW {
            whole(&d);
        }
        assert_eq!(read(), "1");

        let fixed = DirtyLimit::default();
        let _ = fixed.knob.set((knob.clone(), Mode::Lifted));
        std::fs::write(&knob, "0").expect("knob");
        for _ in 0..2 * WINDOW {
            fixed.note(0, 1 << 20, || 128 << 10);
        }
        assert_eq!(read(), "0", "UZFS_FUSE_STRICT_LIMIT=0 never restores");
    }
}
