//! Leaf vdevs: one device, its health state, its dirty time log, its error
//! and latency counters, and the fault-injection hooks tests and `zinject`
//! use.
//!
//! # States (as `zpool status` names them)
//!
//! ```text
//!   ONLINE   usable
//!   OFFLINE  taken out by `zpool offline`; persistent until `zpool online`
//!   FAULTED  too many I/O errors (FAULT_AFTER_ERRORS); persistent until
//!            `zpool clear` or `zpool online`
//!   REMOVED  the device went away while the pool was open
//!   UNAVAIL  the device was not found at import (a MissingDevice)
//! ```
//!
//! A leaf that is not ONLINE takes no I/O. Every txg synced while a leaf is
//! down is recorded in its DTL ("dirty time log", OpenZFS vdev_dtl): a list
//! of inclusive txg ranges whose blocks the leaf lacks. A range whose end is
//! `u64::MAX` is still open (the leaf is still down). A read of a block born
//! in a DTL range never asks that leaf; resilver copies exactly the blocks
//! born in those ranges and then clears them.

use super::device::BlockDevice;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Per-thread I/O context of a scan worker (see `spa/scan.rs`): block reads
/// are served from large reads made for the whole run of blocks, and writes
/// are collected so the run's writes go out merged. Thread-local, so no
/// other reader or writer of the same leaf ever sees it.
#[derive(Default)]
pub struct ScanIo {
    /// (leaf address, allocatable offset, bytes read there).
    pub prefetch: Vec<(usize, u64, Arc<Vec<u8>>)>,
    /// (leaf address, allocatable offset, bytes) to write after the run.
    pub staged: Vec<(usize, u64, Vec<u8>)>,
}

thread_local! {
    static SCAN_IO: RefCell<Option<ScanIo>> = const { RefCell::new(None) };
}

/// Install (or with `None` remove) this thread's scan I/O context,
/// returning the previous one.
pub fn set_scan_io(ctx: Option<ScanIo>) -> Option<ScanIo> {
    SCAN_IO.with(|c| std::mem::replace(&mut *c.borrow_mut(), ctx))
}

/// The address a leaf is known by in a `ScanIo`.
pub fn leaf_key(l: &Leaf) -> usize {
    l as *const Leaf as usize
}

/// I/O errors after which a leaf is FAULTED (zfs-diagnosis uses 10 in 10 min).
pub const FAULT_AFTER_ERRORS: u64 = 10;

/// Latency histogram buckets: bucket i counts I/Os of [2^i, 2^(i+1)) ns.
pub const LAT_BUCKETS: usize = 37;

#[derive(Debug)]
pub struct VdevStats {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Total nanoseconds spent in reads / writes.
    pub read_ns: AtomicU64,
    pub write_ns: AtomicU64,
    pub read_hist: [AtomicU64; LAT_BUCKETS],
    pub write_hist: [AtomicU64; LAT_BUCKETS],
    /// I/Os that took longer than [`SLOW_IO`] (`zpool status -s`).
    pub slow_ios: AtomicU64,
}

/// An I/O slower than this counts as slow (OpenZFS zio_slow_io_ms).
pub const SLOW_IO: Duration = Duration::from_secs(30);

impl Default for VdevStats {
    fn default() -> Self {
        VdevStats {
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            cksum_errors: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            read_ns: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            read_hist: std::array::from_fn(|_| AtomicU64::new(0)),
            write_hist: std::array::from_fn(|_| AtomicU64::new(0)),
            slow_ios: AtomicU64::new(0),
        }
    }
}

impl VdevStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn record(&self, hist: &[AtomicU64; LAT_BUCKETS], total: &AtomicU64, d: Duration) {
        if d >= SLOW_IO {
            self.slow_ios.fetch_add(1, Ordering::Relaxed);
        }
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let b = (63 - ns.max(1).leading_zeros() as usize).min(LAT_BUCKETS - 1);
        hist[b].fetch_add(1, Ordering::Relaxed);
        total.fetch_add(ns, Ordering::Relaxed);
    }
    pub fn clear_errors(&self) {
        for c in [
            &self.read_errors,
            &self.write_errors,
            &self.cksum_errors,
            &self.slow_ios,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafState {
    Online = 0,
    Offline = 1,
    Faulted = 2,
    Removed = 3,
}

impl LeafState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => LeafState::Offline,
            2 => LeafState::Faulted,
            3 => LeafState::Removed,
            _ => LeafState::Online,
        }
    }
}

/// Faults a test or `zinject` has armed on a leaf.
#[derive(Default, Debug)]
pub struct Inject {
    pub read_errors: AtomicBool,
    pub write_errors: AtomicBool,
    /// Every I/O fails as if the device were unplugged.
    pub vanished: AtomicBool,
    /// Added to every I/O, microseconds.
    pub delay_us: AtomicU64,
    /// Emulate a rotating disk: an I/O waits `hdd_seek_us * distance /
    /// device size` plus half a rotation (4 ms at 7200 rpm) when it does not
    /// continue where the previous one ended, one I/O at a time. For
    /// benchmarks of access order on media that are not seek-free.
    pub hdd_seek_us: AtomicU64,
    head: AtomicU64,
    arm: Mutex<()>,
}

impl Inject {
    pub fn clear(&self) {
        self.read_errors.store(false, Ordering::Relaxed);
        self.write_errors.store(false, Ordering::Relaxed);
        self.vanished.store(false, Ordering::Relaxed);
        self.delay_us.store(0, Ordering::Relaxed);
        self.hdd_seek_us.store(0, Ordering::Relaxed);
    }
    pub fn is_armed(&self) -> bool {
        self.read_errors.load(Ordering::Relaxed)
            || self.write_errors.load(Ordering::Relaxed)
            || self.vanished.load(Ordering::Relaxed)
            || self.delay_us.load(Ordering::Relaxed) > 0
            || self.hdd_seek_us.load(Ordering::Relaxed) > 0
    }
}

/// Why a leaf sits under another in the same column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachKind {
    /// `zpool replace`: the new device, detached old one when resilvered.
    Replacing,
    /// A hot spare standing in for a faulted device.
    Spare,
}

pub struct Leaf {
    pub guid: u64,
    pub path: String,
    pub dev: Arc<dyn BlockDevice>,
    pub stats: VdevStats,
    state: AtomicU8,
    /// Inclusive txg ranges this leaf lacks; end u64::MAX = still open.
    dtl: Mutex<Vec<(u64, u64)>>,
    has_dtl: AtomicBool,
    /// Set when the DTL or state changed and the config should be rewritten.
    pub config_dirty: AtomicBool,
    /// Errors since the last clear, for the FAULTED decision.
    recent_errors: AtomicU64,
    pub inject: Inject,
    /// Leaves standing in the same column (replacing or spare).
    pub attached: RwLock<Vec<(AttachKind, Arc<Leaf>)>>,
    /// Is a hot spare (shows as INUSE/AVAIL under "spares").
    pub is_spare: bool,
    /// The state lasts for this import only (`zpool offline -t`): the
    /// config records the leaf as online, and the next import resilvers
    /// what it missed.
    pub temporary: AtomicBool,
    /// Admission by priority class (`vdev/queue.rs`).
    pub queue: super::queue::IoQueue,
}

impl Leaf {
    pub fn new(guid: u64, path: String, dev: Arc<dyn BlockDevice>) -> Self {
        Leaf {
            guid,
            path,
            dev,
            stats: VdevStats::default(),
            state: AtomicU8::new(LeafState::Online as u8),
            dtl: Mutex::new(Vec::new()),
            has_dtl: AtomicBool::new(false),
            config_dirty: AtomicBool::new(false),
            temporary: AtomicBool::new(false),
            recent_errors: AtomicU64::new(0),
            inject: Inject::default(),
            attached: RwLock::new(Vec::new()),
            is_spare: false,
            queue: Default::default(),
        }
    }

    pub fn spare(guid: u64, path: String, dev: Arc<dyn BlockDevice>) -> Self {
        Leaf {
            is_spare: true,
            ..Leaf::new(guid, path, dev)
        }
    }

    /// Not found at import (a `MissingDevice`): UNAVAIL.
    pub fn is_missing(&self) -> bool {
        self.dev.size() == 0
    }

    pub fn state(&self) -> LeafState {
        LeafState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Change the state; a leaf going down opens a DTL range at `txg`.
    pub fn set_state(&self, s: LeafState, txg: u64) {
        let old = LeafState::from_u8(self.state.swap(s as u8, Ordering::Relaxed));
        if old == s {
            return;
        }
        if s != LeafState::Online {
            self.dtl_open(txg);
        } else {
            self.temporary.store(false, Ordering::Relaxed);
        }
        self.config_dirty.store(true, Ordering::Relaxed);
    }

    /// Usable for I/O at all.
    pub fn is_usable(&self) -> bool {
        !self.is_missing() && self.state() == LeafState::Online
    }

    /// Out of service by no choice of the operator's (faulted, removed or
    /// not found): what a hot spare or autoreplace stands in for.
    pub fn is_lost(&self) -> bool {
        matches!(self.state(), LeafState::Faulted | LeafState::Removed) || self.is_missing()
    }

    pub fn attached(&self) -> Vec<(AttachKind, Arc<Leaf>)> {
        self.attached
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    // ------------------------------------------------------------ DTL

    pub fn dtl(&self) -> Vec<(u64, u64)> {
        self.dtl.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_dtl(&self, d: Vec<(u64, u64)>) {
        self.has_dtl.store(!d.is_empty(), Ordering::Relaxed);
        *self.dtl.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Whether this leaf lacks blocks born in `txg`.
    pub fn dtl_covers(&self, txg: u64) -> bool {
        if !self.has_dtl.load(Ordering::Relaxed) {
            return false;
        }
        self.dtl().iter().any(|&(a, b)| (a..=b).contains(&txg))
    }

    /// Open a range at `txg` unless one is open already.
    pub fn dtl_open(&self, txg: u64) {
        let mut d = self.dtl.lock().unwrap_or_else(|e| e.into_inner());
        if !d.iter().any(|r| r.1 == u64::MAX) {
            d.push((txg, u64::MAX));
            self.config_dirty.store(true, Ordering::Relaxed);
        }
        self.has_dtl.store(true, Ordering::Relaxed);
    }

    /// Close the open range at `txg` (the leaf takes writes again after it).
    pub fn dtl_close(&self, txg: u64) {
        let mut d = self.dtl.lock().unwrap_or_else(|e| e.into_inner());
        for r in d.iter_mut().filter(|r| r.1 == u64::MAX) {
            r.1 = txg.max(r.0);
        }
        self.config_dirty.store(true, Ordering::Relaxed);
    }

    /// Record one txg whose write to this leaf failed.
    pub fn dtl_add(&self, txg: u64) {
        let mut d = self.dtl.lock().unwrap_or_else(|e| e.into_inner());
        if !d.iter().any(|&(a, b)| (a..=b).contains(&txg)) {
            d.push((txg, txg));
            self.config_dirty.store(true, Ordering::Relaxed);
        }
        self.has_dtl.store(true, Ordering::Relaxed);
    }

    /// Resilver copied every block born up to `upto`: closed ranges ending
    /// there or earlier are gone.
    pub fn dtl_resilvered(&self, upto: u64) {
        let mut d = self.dtl.lock().unwrap_or_else(|e| e.into_inner());
        d.retain(|r| r.1 > upto);
        self.has_dtl.store(!d.is_empty(), Ordering::Relaxed);
        self.config_dirty.store(true, Ordering::Relaxed);
    }

    /// The smallest and largest txg the DTL covers (open end: `cap`).
    pub fn dtl_bounds(&self, cap: u64) -> Option<(u64, u64)> {
        let d = self.dtl();
        let lo = d.iter().map(|r| r.0).min()?;
        let hi = d.iter().map(|r| r.1.min(cap)).max()?;
        Some((lo, hi))
    }

    // ------------------------------------------------------------ I/O

    fn injected(&self, write: bool, at: u64, len: u64) -> Result<()> {
        if !self.inject.is_armed() {
            return Ok(());
        }
        let seek = self.inject.hdd_seek_us.load(Ordering::Relaxed);
        if seek > 0 {
            let _arm = self.inject.arm.lock().unwrap_or_else(|e| e.into_inner());
            let head = self.inject.head.swap(at + len, Ordering::Relaxed);
            let dist = head.abs_diff(at);
            if dist > 0 {
                let size = self.dev.size().max(1);
                let us = (seek as u128 * dist as u128 / size as u128) as u64 + 4000;
                std::thread::sleep(Duration::from_micros(us));
            }
        }
        // Injected latency, in slices: clearing it (`zinject -c`) ends a
        // long delay within 50 ms.
        let t0 = std::time::Instant::now();
        loop {
            let us = self.inject.delay_us.load(Ordering::Relaxed);
            let left = Duration::from_micros(us).saturating_sub(t0.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        if self.inject.vanished.load(Ordering::Relaxed) {
            return Err(Error::Io {
                path: self.path.clone(),
                source: std::io::Error::from_raw_os_error(libc::ENXIO),
            });
        }
        let flag = if write {
            &self.inject.write_errors
        } else {
            &self.inject.read_errors
        };
        if flag.load(Ordering::Relaxed) {
            return Err(Error::Io {
                path: self.path.clone(),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }

    fn note_error(&self, e: &Error, counter: &AtomicU64) {
        if matches!(e, Error::PowerLost) {
            return;
        }
        VdevStats::bump(counter, 1);
        let vanished =
            matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENXIO));
        if vanished {
            self.state
                .store(LeafState::Removed as u8, Ordering::Relaxed);
            self.config_dirty.store(true, Ordering::Relaxed);
        } else if self.recent_errors.fetch_add(1, Ordering::Relaxed) + 1 >= FAULT_AFTER_ERRORS {
            self.state
                .store(LeafState::Faulted as u8, Ordering::Relaxed);
            self.config_dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Forget error history (zpool clear).
    pub fn clear_errors(&self) {
        self.stats.clear_errors();
        self.recent_errors.store(0, Ordering::Relaxed);
    }

    /// Read at `offset` into the allocatable area.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let key = leaf_key(self);
        let hit = SCAN_IO.with(|c| {
            let c = c.borrow();
            let ctx = c.as_ref()?;
            let (_, start, data) = ctx.prefetch.iter().find(|(k, s, d)| {
                *k == key && *s <= offset && offset + buf.len() as u64 <= s + d.len() as u64
            })?;
            let at = (offset - start) as usize;
            buf.copy_from_slice(&data[at..at + buf.len()]);
            Some(())
        });
        if hit.is_some() {
            return Ok(());
        }
        self.read_raw(buf, super::LABEL_START_SIZE + offset)
    }

    /// Read at an absolute device offset (labels), admitted by the queue
    /// in this thread's class; a scan's read goes in `SCAN_CHUNK` pieces
    /// (smaller while applications read or write), each admitted on its
    /// own, so it never holds the disk for long.
    pub fn read_raw(&self, buf: &mut [u8], at: u64) -> Result<()> {
        use super::queue::{class_of, interactive_now, IoClass, SCAN_CHUNK, SCAN_CHUNK_BUSY};
        let class = class_of(false);
        if class != IoClass::Scan || buf.len() <= SCAN_CHUNK_BUSY {
            return self.read_admitted(buf, at, class);
        }
        let mut done = 0;
        while done < buf.len() {
            let n = if interactive_now() {
                SCAN_CHUNK_BUSY
            } else {
                SCAN_CHUNK
            };
            let end = (done + n).min(buf.len());
            self.read_admitted(&mut buf[done..end], at + done as u64, class)?;
            done = end;
        }
        Ok(())
    }

    fn read_admitted(&self, buf: &mut [u8], at: u64, class: super::queue::IoClass) -> Result<()> {
        let _slot = self.queue.admit(class);
        let t = Instant::now();
        VdevStats::bump(&self.stats.reads, 1);
        VdevStats::bump(&self.stats.bytes_read, buf.len() as u64);
        let r = self.injected(false, at, buf.len() as u64).and_then(|_| {
            if class == super::queue::IoClass::Scan {
                self.dev.read_uncached_at(buf, at)
            } else {
                self.dev.read_at(buf, at)
            }
        });
        self.stats
            .record(&self.stats.read_hist, &self.stats.read_ns, t.elapsed());
        if let Err(e) = &r {
            self.note_error(e, &self.stats.read_errors);
        }
        r
    }

    pub fn write(&self, buf: &[u8], offset: u64) -> Result<()> {
        let key = leaf_key(self);
        let staged = SCAN_IO.with(|c| match c.borrow_mut().as_mut() {
            Some(ctx) => {
                ctx.staged.push((key, offset, buf.to_vec()));
                true
            }
            None => false,
        });
        if staged {
            return Ok(());
        }
        self.write_raw(buf, super::LABEL_START_SIZE + offset)
    }

    pub fn write_raw(&self, buf: &[u8], at: u64) -> Result<()> {
        self.write_counted(buf, at, false)
    }

    /// [`write`](Self::write) of `pieces` laid one after another from
    /// `offset`, as one device write (`BlockDevice::write_pieces_at`).
    pub fn write_pieces(&self, pieces: &[&[u8]], offset: u64) -> Result<()> {
        if let [one] = pieces {
            return self.write(one, offset);
        }
        if SCAN_IO.with(|c| c.borrow().is_some()) {
            return self.write(&pieces.concat(), offset);
        }
        let at = super::LABEL_START_SIZE + offset;
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        self.counted_write(at, len, || self.dev.write_pieces_at(pieces, at))
    }

    /// A write at an absolute offset, counted, timed and fault-injected;
    /// durable on return if `sync`.
    fn write_counted(&self, buf: &[u8], at: u64, sync: bool) -> Result<()> {
        self.counted_write(at, buf.len(), || {
            if sync {
                self.dev.write_sync(buf, at)
            } else {
                self.dev.write_at(buf, at)
            }
        })
    }

    /// Run `write` (of `len` bytes at absolute offset `at`) in the leaf's
    /// write class, unless a fault is injected there, and count and time it.
    fn counted_write(&self, at: u64, len: usize, write: impl FnOnce() -> Result<()>) -> Result<()> {
        let _slot = self.queue.admit(super::queue::class_of(true));
        let t = Instant::now();
        let r = self.injected(true, at, len as u64).and_then(|_| write());
        self.count_write(len, t.elapsed(), r)
    }

    /// Count and time one write of `len` bytes that took `took` and ended
    /// with `r` (its error counted too), and pass `r` on.
    fn count_write(&self, len: usize, took: Duration, r: Result<()>) -> Result<()> {
        VdevStats::bump(&self.stats.writes, 1);
        VdevStats::bump(&self.stats.bytes_written, len as u64);
        self.stats
            .record(&self.stats.write_hist, &self.stats.write_ns, took);
        if let Err(e) = &r {
            self.note_error(e, &self.stats.write_errors);
        }
        r
    }

    /// Write and make durable in one step (an intent-log block): a file
    /// makes only this range durable (`BlockDevice::write_sync`).
    pub fn write_sync(&self, buf: &[u8], offset: u64) -> Result<()> {
        if SCAN_IO.with(|c| c.borrow().is_some()) {
            self.write(buf, offset)?;
            return self.flush();
        }
        self.write_counted(buf, super::LABEL_START_SIZE + offset, true)
    }

    /// Where a durable write of `len` bytes at `offset` may be issued by
    /// the caller (`vdev/uring.rs`): (descriptor, device offset), when it
    /// would be nothing more than the device's own `write_sync` (no fault
    /// injected, no scan I/O to count).
    pub fn dsync_target(&self, offset: u64, len: usize) -> Option<(std::os::fd::RawFd, u64)> {
        if self.inject.is_armed() || SCAN_IO.with(|c| c.borrow().is_some()) {
            return None;
        }
        let at = super::LABEL_START_SIZE + offset;
        // Around the queue (one io_uring submission for every leaf): the
        // caller counts it in the sync-write class (`IoQueue::account`).
        self.dev.dsync_fd(at, len).map(|fd| (fd, at))
    }

    /// Account a durable write issued at [`dsync_target`](Self::dsync_target)
    /// of the bytes of `pieces` (one after the other), which ended with
    /// `res` (bytes written or a negative errno) after `took`, as
    /// `write_sync` would have: counted and timed; a short or failed write
    /// is finished (or fails with its error) through the device's
    /// `write_sync`.
    pub fn dsync_done(
        &self,
        pieces: &[&[u8]],
        offset: u64,
        res: i32,
        took: Duration,
    ) -> Result<()> {
        let t = Instant::now();
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        let done = usize::try_from(res).unwrap_or(0).min(len);
        if res == -libc::EINVAL {
            self.dev.direct_refused();
        }
        let r = if done == len {
            Ok(())
        } else {
            let at = super::LABEL_START_SIZE + offset + done as u64;
            self.dev.write_sync(&pieces.concat()[done..], at)
        };
        self.count_write(len, took + t.elapsed(), r)
    }

    pub fn flush(&self) -> Result<()> {
        // A commit waits on it: scans keep off the disk meanwhile (a
        // scan's flushes never reach here while it stages its writes).
        let _fg = (super::queue::class_of(true) != super::queue::IoClass::Scan)
            .then(super::queue::foreground_io);
        if self.inject.vanished.load(Ordering::Relaxed)
            || self.inject.write_errors.load(Ordering::Relaxed)
        {
            self.injected(true, 0, 0)?;
        }
        self.dev.flush()
    }
}

/// One column of a top-level vdev: its leaf and whatever stands in with it.
/// Reads come from the first leaf that is usable and has the block's txg;
/// writes go to every usable leaf.
pub fn column_source(primary: &Arc<Leaf>, birth: u64) -> Option<Arc<Leaf>> {
    if primary.is_usable() && !primary.dtl_covers(birth) {
        return Some(primary.clone());
    }
    primary
        .attached()
        .into_iter()
        .map(|(_, l)| l)
        .find(|l| l.is_usable() && !l.dtl_covers(birth))
}

/// Every leaf of a column (primary first).
pub fn column_leaves(primary: &Arc<Leaf>) -> Vec<Arc<Leaf>> {
    let mut v = vec![primary.clone()];
    v.extend(primary.attached().into_iter().map(|(_, l)| l));
    v
}
