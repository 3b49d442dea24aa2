//! The narrow I/O trait every leaf vdev sits on.
//!
//! Five methods, after redb's `StorageBackend`: read, write, flush, size and a
//! name for messages. What the trait promises about durability:
//!
//! * `write_at` returning `Ok` means later reads on this handle see the bytes.
//!   It does NOT mean they survive a power cut.
//! * `flush` returning `Ok` means every write that returned `Ok` before the
//!   flush was called is durable: a crash after this point keeps it.
//! * A crash may drop any subset of writes not covered by a flush and may tear
//!   a write that was in flight (some sectors new, some old).
//!
//! The pool's commit protocol (see `spa/txg.rs`) is argued against exactly this
//! contract, and `vdev/sim.rs` implements exactly these faults.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub trait BlockDevice: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Read bypassing any cache below (a file's page cache and its
    /// read-ahead) where the device can: a scan's reads, which would
    /// otherwise fill the host's cache with the whole pool and, through
    /// read-ahead the queues never see, keep the disk busy ahead of an
    /// application's reads. The default is `read_at`.
    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Write `pieces` one after another from `offset`: what `write_at` of
    /// their concatenation does, which is the default. A file writes them
    /// with `pwritev` straight from the caller's buffers when they suit
    /// direct I/O (`TopVdev::write_blocks`: a run of whole blocks, no copy).
    fn write_pieces_at(&self, pieces: &[&[u8]], offset: u64) -> Result<()> {
        match pieces {
            [one] => self.write_at(one, offset),
            _ => self.write_at(&pieces.concat(), offset),
        }
    }
    fn flush(&self) -> Result<()>;
    /// Write `buf` and make it durable: what `write_at` then `flush` give,
    /// which is the default. A file does it in one `pwritev2(RWF_DSYNC)`,
    /// which makes only this range durable (an intent-log block), not
    /// every dirty page of the file as `fdatasync` does.
    fn write_sync(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// A descriptor that takes `pwritev2(RWF_DSYNC)` for `len` bytes at
    /// `offset`, for a caller that issues several durable writes at once
    /// (`vdev/uring.rs`); it may be a direct-I/O one, so the caller's
    /// buffer starts on a [`DIRECT_ALIGN`] boundary. `None` (the default)
    /// if the caller must use `write_sync`.
    fn dsync_fd(&self, offset: u64, len: usize) -> Option<std::os::fd::RawFd> {
        let _ = (offset, len);
        None
    }
    /// A write issued at `dsync_fd`'s direct descriptor was refused for its
    /// alignment (EINVAL): offer the buffered one from now on.
    fn direct_refused(&self) {}
    /// The unit, 512 to [`DIRECT_ALIGN`] bytes, of the pieces
    /// `write_pieces_at` takes straight from their buffers: each piece
    /// starts on a page and is a whole number of these long. A compressed
    /// block (a multiple of 512) and the zeros up to its allocation go out
    /// from their own buffers where it is 512 (`TopVdev::write_blocks`).
    /// The default is [`DIRECT_ALIGN`].
    fn direct_granule(&self) -> usize {
        DIRECT_ALIGN
    }
    fn size(&self) -> u64;
    fn name(&self) -> String;
    /// Hold the device exclusively for a pool this process imports or
    /// creates, so no second process (another daemon, another run
    /// directory) can import it at the same time. Released when the device
    /// is closed. The default (simulated devices) holds nothing.
    fn claim(&self) -> Result<()> {
        Ok(())
    }
    /// Refuses every write (a read-only import's [`ReadOnlyDevice`]):
    /// reads must not try to repair it.
    fn read_only(&self) -> bool {
        false
    }
    /// The device's size as it is now, which may exceed `size()` if the
    /// device grew since it was opened (a file enlarged, a LUN resized).
    fn current_size(&self) -> u64 {
        self.size()
    }
    /// Take a grown device's new size as `size()` (`zpool online -e`,
    /// autoexpand; labels L2 and L3 move to the new end with it). A size
    /// never shrinks. Returns the size in force.
    fn adopt_size(&self) -> u64 {
        self.size()
    }
}

/// Whether `path` lives in memory that a power failure empties: a file on
/// tmpfs or ramfs, or a RAM disk (`/dev/ram*`, `/dev/zram*`, `/dev/pmem*`
/// is persistent and not counted). A log device there acknowledges
/// synchronous writes it cannot keep.
pub fn is_volatile(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6_u32 as i64;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if path.starts_with("/dev") && (name.starts_with("ram") || name.starts_with("zram")) {
        return true;
    }
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) reads the NUL-terminated path and writes only into
    // `s`, a zeroed struct of the right type owned here.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return false;
    }
    let t = s.f_type as i64;
    t == TMPFS_MAGIC || t == RAMFS_MAGIC
}

/// Processes other than this one that have `path` open (from /proc), for
/// the message when a device is held elsewhere.
pub fn holders(path: &Path) -> Vec<u32> {
    let Ok(target) = std::fs::canonicalize(path) else {
        return Vec::new();
    };
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l == target))
        {
            out.push(pid);
        }
    }
    out
}

/// Whether `flush` reaches the device. `Ignore` is for devices whose write
/// cache is battery backed; on anything else it trades durability for speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushPolicy {
    Honor,
    Ignore,
}

impl FlushPolicy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "honor" => Ok(FlushPolicy::Honor),
            "ignore" => Ok(FlushPolicy::Ignore),
            _ => Err(Error::invalid(format!(
                "invalid flush policy '{s}': expected 'honor' or 'ignore'"
            ))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            FlushPolicy::Honor => "honor",
            FlushPolicy::Ignore => "ignore",
        }
    }
}

/// Writes at least this large start their writeback at once (see `write_at`).
pub const WRITEBACK_HINT_MIN: usize = 64 << 10;

/// Alignment (memory address, offset and length) a write needs to bypass
/// the host page cache (`O_DIRECT`). 4 KiB satisfies every device and
/// filesystem that supports direct I/O at all.
pub const DIRECT_ALIGN: usize = 4096;

/// Reads up to this long reuse the calling thread's bounce buffer.
const BOUNCE_KEEP: usize = 1 << 20;

thread_local! {
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on a `len`-byte buffer aligned to [`DIRECT_ALIGN`] (contents
/// arbitrary): the thread's kept one when `len` is at most
/// [`BOUNCE_KEEP`], else a fresh one.
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let run = |v: &mut Vec<u8>| {
        if v.len() < len + DIRECT_ALIGN {
            v.resize(len + DIRECT_ALIGN, 0);
        }
        let at = v.as_ptr().align_offset(DIRECT_ALIGN);
        f(&mut v[at..at + len])
    };
    if len > BOUNCE_KEEP {
        return run(&mut Vec::new());
    }
    BOUNCE.with(|b| match b.try_borrow_mut() {
        Ok(mut v) => run(&mut v),
        Err(_) => run(&mut Vec::new()),
    })
}

/// Whether data writes may bypass the host page cache (on by default;
/// `UZFS_DIRECT_IO=0` in the daemon's environment turns it off). Direct
/// writes save a copy into the host's page cache per mirror side, which was
/// a third of the daemon's CPU in 16 KiB random writes, and a second cache
/// of data the block cache already holds: blocks a sync writes stay in the
/// block cache (`BlockReader::written`), so the next txg's
/// read-modify-write does not need the host's copy. Before that cache
/// existed, buffered writes were faster on the benchmark VMs, because the
/// page cache served those reads (bench/RESULTS.md).
pub fn direct_io_enabled() -> bool {
    DIRECT_IO.load(std::sync::atomic::Ordering::Relaxed)
}

static DIRECT_IO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Switch direct I/O for runs of data blocks on or off for the devices this
/// process opens from now on (default on). The binary maps
/// `UZFS_DIRECT_IO=0` here; the library reads no environment.
pub fn set_direct_io(on: bool) {
    DIRECT_IO.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// A regular file or a block device.
///
/// With [`direct_io_enabled`], large aligned writes (the sync thread's runs
/// of data blocks, see `TopVdev::write_blocks`) go through a second
/// descriptor opened with `O_DIRECT`: copying a txg's data into the host's
/// page cache, once per mirror side, was a quarter of the daemon's CPU in a
/// sequential write. Everything
/// else (labels, uberblocks, small or unaligned blocks) stays buffered. A
/// direct write makes the kernel flush and drop any cached pages of its
/// range, so the buffered descriptor's reads stay coherent. Where direct
/// I/O is refused (tmpfs, some filesystems) the device stays buffered.
pub struct FileDevice {
    file: File,
    /// A block device opened with O_EXCL by `claim` (the kernel's own
    /// exclusive hold: no mount, no second O_EXCL opener).
    excl: std::sync::OnceLock<File>,
    direct: Option<File>,
    direct_ok: std::sync::atomic::AtomicBool,
    /// `pwritev2(RWF_DSYNC)` works here (`write_sync`).
    dsync_ok: std::sync::atomic::AtomicBool,
    path: PathBuf,
    /// Size when opened, or as adopted since (`adopt_size`).
    size: std::sync::atomic::AtomicU64,
    /// Contiguous span of small writes not yet handed to writeback.
    span: std::sync::Mutex<(u64, u64)>,
    /// [`BlockDevice::direct_granule`]: the length unit the filesystem
    /// says direct I/O takes (`statx` `STATX_DIOALIGN`), raised to
    /// [`DIRECT_ALIGN`] if a write of that unit is refused.
    granule: std::sync::atomic::AtomicUsize,
}

/// What direct I/O on `f` asks of the length of each piece, from the
/// filesystem (`statx` with `STATX_DIOALIGN`, Linux 6.1): its offset and
/// length unit when that is 512 to [`DIRECT_ALIGN`] bytes and the memory
/// alignment it asks is at most a page. Else [`DIRECT_ALIGN`], which every
/// filesystem that has direct I/O takes.
fn direct_unit(f: &File) -> usize {
    use std::os::fd::AsRawFd;
    // SAFETY: statx only writes the struct it is given, which is plain
    // integers (zero is a valid value); the path is an empty C string
    // with AT_EMPTY_PATH, so the call is about the open descriptor.
    let (r, stx) = unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        );
        (r, stx)
    };
    let (mem, unit) = (
        stx.stx_dio_mem_align as usize,
        stx.stx_dio_offset_align as usize,
    );
    let told = r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0;
    if told && mem > 0 && mem <= DIRECT_ALIGN && unit.is_power_of_two() && unit <= DIRECT_ALIGN {
        unit.max(512)
    } else {
        DIRECT_ALIGN
    }
}

/// Whether `bytes` can be handed to a direct-I/O descriptor as it is: it
/// starts on a [`DIRECT_ALIGN`] boundary and is whole units of it long.
pub fn fits_direct(bytes: &[u8]) -> bool {
    fits_granule(bytes, DIRECT_ALIGN)
}

/// Whether `bytes` can be one piece of a direct write to a device whose
/// [`BlockDevice::direct_granule`] is `unit`: it starts on a page and is
/// whole units long.
pub fn fits_granule(bytes: &[u8], unit: usize) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) && bytes.len().is_multiple_of(unit)
}

/// Reads this large or larger, of whole pages into a page-aligned buffer,
/// go around the host's page cache (`FileDevice::read_at`): a mirror's
/// records, RAID-Z columns of 16 KiB and up, 16 KiB metadata blocks.
/// Smaller ones keep the host's read-ahead. At 64 KiB (before), a cold
/// read of a raidz2 of six (32 KiB columns) spent half its CPU in the
/// kernel copying columns out of the host's page cache; at 16 KiB it took
/// 0.6x the CPU but ran at 0.73-0.91x the speed while the reader and the
/// read-ahead read the same records twice. Since a miss waits for a read
/// in flight (`arc/inflight.rs`), 16 KiB runs at the same speed (556-558
/// against 558-578 MiB/s) at 0.60x the CPU (bench/RESULTS.md).
pub const DIRECT_READ_MIN: usize = 16 << 10;

/// Small writes that continue each other (RAID-Z columns of consecutive
/// blocks) are handed to writeback once their span reaches this size.
pub const WRITEBACK_SPAN: u64 = 1 << 20;

impl FileDevice {
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, direct_io_enabled())
    }

    /// Open, with a direct-I/O descriptor beside the buffered one if
    /// `direct` (and the filesystem allows it).
    pub fn open_with(path: &Path, direct: bool) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let size = measure(&file).map_err(io)?;
        let direct = if !direct {
            None
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        };
        let granule = direct.as_ref().map_or(DIRECT_ALIGN, direct_unit);
        Ok(FileDevice {
            granule: std::sync::atomic::AtomicUsize::new(granule),
            excl: std::sync::OnceLock::new(),
            direct_ok: std::sync::atomic::AtomicBool::new(direct.is_some()),
            dsync_ok: std::sync::atomic::AtomicBool::new(true),
            direct,
            file,
            path: path.to_path_buf(),
            size: std::sync::atomic::AtomicU64::new(size),
            span: std::sync::Mutex::new((0, 0)),
        })
    }

    fn len(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The direct-I/O descriptor, if a read into `buf` at `offset` can go
    /// through it straight: large, and buffer, offset and length whole
    /// pages (a record read into a buffer from `alloc.rs`).
    fn direct_for(&self, buf: &[u8], offset: u64) -> Option<&File> {
        let fit = buf.len() >= DIRECT_READ_MIN
            && fits_direct(buf)
            && (offset as usize).is_multiple_of(DIRECT_ALIGN);
        self.direct
            .as_ref()
            .filter(|_| fit && self.direct_ok.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn writeback(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: sync_file_range only reads its integer arguments; the fd
        // is owned by `self.file` and open for the whole call. Errors (e.g.
        // EINVAL on a pipe) are ignored: this is a hint.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }

    /// A write of `len` bytes at `offset` must end inside the device.
    fn check_inside(&self, offset: u64, len: usize) -> Result<()> {
        if offset + len as u64 > self.len() {
            return Err(Error::invalid(format!(
                "{}: write past end of device",
                self.path.display()
            )));
        }
        Ok(())
    }

    fn io_err(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.display().to_string(),
            source,
        }
    }
}

impl BlockDevice for FileDevice {
    fn claim(&self) -> Result<()> {
        let busy = || {
            let who = holders(&self.path);
            let by = if who.is_empty() {
                "a pool of this process".to_string()
            } else {
                format!(
                    "process {}",
                    who.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            Error::invalid(format!("{} is in use by {by}", self.path.display()))
        };
        match self.file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(busy()),
            Err(std::fs::TryLockError::Error(e)) => return Err(self.io_err(e)),
        }
        let is_block = self
            .file
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
        if is_block && self.excl.get().is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            let f = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(&self.path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::EBUSY) {
                        busy()
                    } else {
                        self.io_err(e)
                    }
                })?;
            let _ = self.excl.set(f);
        }
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if let Some(d) = self.direct_for(buf, offset) {
            match d.read_exact_at(buf, offset) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_err(e))
    }
    /// Through the direct-I/O descriptor into an aligned bounce buffer
    /// (one copy, cheap beside the read), when the range is aligned. The
    /// bounce buffer is the thread's own, kept between reads (a scan
    /// thread reads 1 MiB chunks, `vdev/queue.rs`): a fresh one per read
    /// cost a zeroed allocation and its page faults every time.
    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.direct_for(buf, offset).is_some() {
            // `read_at` goes around the cache by itself.
            return self.read_at(buf, offset);
        }
        let aligned = (offset as usize | buf.len()).is_multiple_of(DIRECT_ALIGN);
        if let Some(d) = self.direct.as_ref().filter(|_| {
            aligned && !buf.is_empty() && self.direct_ok.load(std::sync::atomic::Ordering::Relaxed)
        }) {
            let r: std::io::Result<()> = with_bounce(buf.len(), |b| {
                d.read_exact_at(b, offset)?;
                buf.copy_from_slice(b);
                Ok(())
            });
            match r {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        self.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_inside(offset, buf.len())?;
        let len = buf.len() as u64;
        if len >= WRITEBACK_HINT_MIN as u64
            && fits_direct(buf)
            && (offset as usize).is_multiple_of(DIRECT_ALIGN)
            && self.direct_ok.load(std::sync::atomic::Ordering::Relaxed)
        {
            if let Some(d) = &self.direct {
                match d.write_all_at(buf, offset) {
                    Ok(()) => return Ok(()),
                    // The filesystem wants another alignment (or none):
                    // stay buffered from now on.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.direct_ok
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => return Err(self.io_err(e)),
                }
            }
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io_err(e))?;
        // Start writeback of large writes (or of a run of small contiguous
        // ones) now, so the device works while the sync thread computes the
        // next checksums and the txg's final flush has little left to do. A
        // hint only: durability still comes from `flush` (fdatasync).
        // Measured on the 4 GiB sequential and the RAID-Z layout benchmarks.
        if len >= WRITEBACK_HINT_MIN as u64 {
            self.writeback(offset, len);
            return Ok(());
        }
        let mut span = self.span.lock().unwrap_or_else(|e| e.into_inner());
        if span.1 == offset && span.1 > span.0 {
            span.1 = offset + len;
        } else {
            *span = (offset, offset + len);
        }
        if span.1 - span.0 >= WRITEBACK_SPAN {
            let (s, e) = *span;
            *span = (e, e);
            drop(span);
            self.writeback(s, e - s);
        }
        Ok(())
    }
    fn write_pieces_at(&self, pieces: &[&[u8]], offset: u64) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        self.check_inside(offset, len)?;
        let unit = self.granule.load(Relaxed);
        let direct = pieces.len() > 1
            && len >= WRITEBACK_HINT_MIN
            && (offset as usize | len).is_multiple_of(unit)
            && pieces.iter().all(|p| fits_granule(p, unit))
            && self.direct_ok.load(Relaxed);
        if let (true, Some(d)) = (direct, &self.direct) {
            match pwritev_all(d, pieces, offset) {
                Ok(()) => return Ok(()),
                // Refused pieces finer than a page: the filesystem told
                // us wrong; whole pages from now on. Refused at that: as
                // `write_at`, stay buffered from now on. (Whatever part
                // went out is written again below.)
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    if unit < DIRECT_ALIGN && !pieces.iter().all(|p| fits_direct(p)) {
                        log::warn!(
                            "{}: direct writes of {unit}-byte units refused; whole pages from now on",
                            self.path.display()
                        );
                        self.granule.store(DIRECT_ALIGN, Relaxed);
                    } else {
                        self.direct_ok.store(false, Relaxed);
                    }
                }
                Err(e) => return Err(self.io_err(e)),
            }
        }
        let mut at = offset;
        for p in pieces {
            self.write_at(p, at)?;
            at += p.len() as u64;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io_err(e))
    }
    fn write_sync(&self, buf: &[u8], offset: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        self.check_inside(offset, buf.len())?;
        if !self.dsync_ok.load(std::sync::atomic::Ordering::Relaxed) {
            self.write_at(buf, offset)?;
            return self.flush();
        }
        let mut done = 0usize;
        while done < buf.len() {
            let iov = libc::iovec {
                iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                iov_len: buf.len() - done,
            };
            // SAFETY: `iov` points into `buf`, which outlives the call and
            // is only read; the fd is owned by `self.file` and open.
            let n = unsafe {
                libc::pwritev2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    (offset + done as u64) as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // A kernel or file without per-write flags: write,
                    // then flush the file, from now on.
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOSYS)
                        if done == 0 =>
                    {
                        self.dsync_ok
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        self.write_at(buf, offset)?;
                        return self.flush();
                    }
                    _ => return Err(self.io_err(e)),
                }
            }
            if n == 0 {
                return Err(self.io_err(std::io::ErrorKind::WriteZero.into()));
            }
            done += n as usize;
        }
        Ok(())
    }
    fn dsync_fd(&self, offset: u64, len: usize) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::Ordering::Relaxed;
        if !self.dsync_ok.load(Relaxed) || self.check_inside(offset, len).is_err() {
            return None;
        }
        // Direct when it can be: a buffered `RWF_DSYNC` write issued
        // through io_uring goes to the kernel's worker threads (it may
        // block on the page cache), a direct one is issued at once. 4 KiB
        // fsyncs on a mirror: 331 us buffered against 273 us through
        // `fanout`'s threads.
        match &self.direct {
            Some(d)
                if self.direct_ok.load(Relaxed)
                    && (offset as usize | len).is_multiple_of(DIRECT_ALIGN) =>
            {
                Some(d.as_raw_fd())
            }
            _ => Some(self.file.as_raw_fd()),
        }
    }
    fn direct_refused(&self) {
        self.direct_ok
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
    fn direct_granule(&self) -> usize {
        self.granule.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn size(&self) -> u64 {
        self.len()
    }
    fn name(&self) -> String {
        self.path.display().to_string()
    }
    fn current_size(&self) -> u64 {
        measure(&self.file).unwrap_or(0).max(self.len())
    }
    fn adopt_size(&self) -> u64 {
        let now = self.current_size();
        self.size
            .fetch_max(now, std::sync::atomic::Ordering::AcqRel)
            .max(now)
    }
}

/// Write every byte of `pieces`, one after another from `offset`, with
/// `pwritev` (as many calls as short writes and `IOV_MAX` need).
fn pwritev_all(file: &File, pieces: &[&[u8]], offset: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const IOV_MAX: usize = 1024;
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    while done < total {
        // The pieces not yet written, the first one cut where it stopped.
        let mut skip = done;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(pieces.len().min(IOV_MAX));
        for p in pieces {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let rest = &p[skip..];
            skip = 0;
            iov.push(libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            });
            if iov.len() == IOV_MAX {
                break;
            }
        }
        // SAFETY: every iovec points into a slice borrowed for this call
        // and the kernel only reads them; the descriptor is open.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}

/// Size of an open file or block device.
fn measure(file: &File) -> std::io::Result<u64> {
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        Ok(meta.len())
    } else {
        // Block devices report 0 in metadata; seeking to the end gives the size.
        use std::io::{Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::End(0))
    }
}

/// Stand-in for a leaf that was not found at import: every I/O fails, so a
/// mirror reads from its other sides and `zpool status` shows it UNAVAIL.
pub struct MissingDevice {
    pub path: String,
    pub size: u64,
}

impl BlockDevice for MissingDevice {
    fn read_at(&self, _: &mut [u8], _: u64) -> Result<()> {
        Err(Error::Io {
            path: self.path.clone(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }
    fn write_at(&self, _: &[u8], _: u64) -> Result<()> {
        self.read_at(&mut [], 0)
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.path.clone()
    }
}

/// A device a read-only import sits on: reads pass through, a write is an
/// error and never reaches the device, a flush has nothing to do. The pool
/// above does not write (`Tunables::readonly`); this makes sure of it.
pub struct ReadOnlyDevice(pub std::sync::Arc<dyn BlockDevice>);

impl BlockDevice for ReadOnlyDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn read_uncached_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_uncached_at(buf, offset)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(Error::Io {
            path: self.0.name(),
            source: std::io::Error::from_raw_os_error(libc::EROFS),
        })
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn name(&self) -> String {
        self.0.name()
    }
    fn claim(&self) -> Result<()> {
        self.0.claim()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn current_size(&self) -> u64 {
        self.0.current_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device file of `size` bytes in a fresh directory (kept alive by
    /// the first half), opened with direct I/O where allowed.
    fn scratch(size: u64) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.img");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(size))
            .expect("create");
        let dev = FileDevice::open_with(&path, true).expect("open");
        (dir, dev)
    }

    /// Uncached reads (a scan's) return what buffered reads do, through
    /// the thread's kept bounce buffer and through a fresh one, aligned
    /// or not, one after another of different sizes.
    #[test]
    fn uncached_reads_match_buffered_reads() {
        let (_dir, dev) = scratch(4 << 20);
        let data: Vec<u8> = (0..4u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        dev.write_at(&data, 0).expect("write");
        for (off, len) in [
            (0usize, 4096usize),
            (8192, 1 << 20),
            (4096, 65536),
            (0, 3 << 20),
            (12_288, 4096),
            (100, 5000),
        ] {
            let mut got = vec![0xa5u8; len];
            dev.read_uncached_at(&mut got, off as u64).expect("read");
            assert!(got == data[off..off + len], "{len} bytes at {off}");
        }
    }

    /// One `pwritev2(RWF_DSYNC)` per durable write: the bytes land where
    /// asked, whatever the alignment, and a write past the end is refused
    /// before anything is written.
    #[test]
    fn a_durable_write_lands_and_stays_inside_the_device() {
        let (_dir, dev) = scratch(1 << 20);
        let data: Vec<u8> = (0..12_345u32).map(|i| (i % 253) as u8).collect();
        dev.write_sync(&data, 4096 + 7).expect("durable write");
        assert!(dev.dsync_ok.load(std::sync::atomic::Ordering::Relaxed));
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, 4096 + 7).expect("read");
        assert_eq!(back, data);
        let err = dev
            .write_sync(&data, (1 << 20) - 100)
            .expect_err("past the end");
        assert!(err.to_string().contains("past end"), "{err}");
        let mut tail = vec![1u8; 100];
        dev.read_at(&mut tail, (1 << 20) - 100).expect("read");
        assert!(tail.iter().all(|&b| b == 0), "a refused write wrote");
    }

    /// Large page-aligned reads go around the host's page cache and still
    /// see every write before them: buffered ones not yet written back
    /// (the kernel writes a direct read's range back first), direct ones,
    /// and a small buffered write over a direct one.
    #[test]
    fn direct_reads_see_every_write() {
        let (_dir, dev) = scratch(8 << 20);
        let len = 256 << 10;
        let mut want: Vec<u8> = (0..len as u32).map(|i| (i % 241) as u8).collect();
        dev.write_at(&want[..1000], 1 << 20)
            .expect("buffered write");
        dev.write_at(&want[1000..], (1 << 20) + 1000)
            .expect("buffered write");
        let mut back = vec![0u8; len];
        assert!((back.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
        assert!(dev.direct_for(&back, 1 << 20).is_some() == dev.direct.is_some());
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert!(back == want, "buffered, then read direct");
        want.iter_mut().for_each(|b| *b = b.wrapping_add(7));
        dev.write_at(&want, 1 << 20).expect("direct write");
        want[5000..5100].fill(3);
        dev.write_at(&want[5000..5100], (1 << 20) + 5000)
            .expect("small write");
        back.fill(0);
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert!(back == want, "direct and buffered writes, then read direct");
        back.fill(0);
        dev.read_uncached_at(&mut back, 1 << 20)
            .expect("uncached read");
        assert!(back == want, "uncached read");
    }

    /// A write of pieces lands as their concatenation would: page-aligned
    /// pieces in one `pwritev` (more of them than `IOV_MAX` takes in one
    /// call), unaligned ones one by one, and nothing past the end.
    #[test]
    fn pieces_land_as_their_concatenation() {
        let (_dir, dev) = scratch(16 << 20);
        // 1,100 aligned 4 KiB pieces (the allocator aligns 16 KiB and up:
        // cut them from one large buffer) and a run of odd lengths.
        let big: Vec<u8> = (0..1100u32 * 4096)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        assert!((big.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
        let aligned: Vec<&[u8]> = big.chunks(4096).collect();
        let odd: Vec<&[u8]> = [1000usize, 4096, 3, 70_000]
            .iter()
            .scan(0usize, |at, &n| {
                *at += n;
                Some(&big[*at - n..*at])
            })
            .collect();
        for (pieces, at) in [(aligned, 1u64 << 20), (odd, (8 << 20) + 512)] {
            dev.write_pieces_at(&pieces, at).expect("write pieces");
            let want = pieces.concat();
            let mut back = vec![0u8; want.len()];
            dev.read_at(&mut back, at).expect("read");
            assert!(back == want, "{} pieces at {at}", pieces.len());
        }
        if dev.direct.is_some() {
            assert!(dev.direct_ok.load(std::sync::atomic::Ordering::Relaxed));
        }
        let err = dev
            .write_pieces_at(&[&big[..8192], &big[..8192]], (16 << 20) - 8192)
            .expect_err("past the end");
        assert!(err.to_string().contains("past end"), "{err}");
    }

    /// Pieces of whole sectors starting on pages (a compressed block and
    /// the zeros up to its allocation) land as their concatenation:
    /// straight from their
    /// buffers where the filesystem says it takes 512-byte units, and the
    /// unit it said is kept, so the kernel took them.
    #[test]
    fn sector_pieces_land_as_their_concatenation() {
        let (_dir, dev) = scratch(4 << 20);
        let unit = dev.direct_granule();
        assert!(unit.is_power_of_two() && (512..=DIRECT_ALIGN).contains(&unit));
        let a: Vec<u8> = (0..40u32 << 10).map(|i| (i % 253) as u8).collect();
        let b: Vec<u8> = (0..32u32 << 10).map(|i| (i % 241) as u8).collect();
        let zeros = vec![0u8; 16 << 10];
        assert!(fits_direct(&a) && fits_direct(&b) && fits_direct(&zeros));
        // 39.5 KiB, 0.5 KiB of zeros, 32 KiB, 8 KiB of zeros: 80 KiB.
        let pieces: [&[u8]; 4] = [&a[..79 * 512], &zeros[..512], &b, &zeros[..8 << 10]];
        dev.write_pieces_at(&pieces, 1 << 20).expect("write pieces");
        let want = pieces.concat();
        let mut back = vec![0u8; want.len()];
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert!(back == want, "pieces read back different");
        assert_eq!(
            dev.direct_granule(),
            unit,
            "the kernel refused {unit}-byte units"
        );
        if dev.direct.is_some() {
            assert!(dev.direct_ok.load(std::sync::atomic::Ordering::Relaxed));
        }
    }

    /// A large aligned write takes the direct path (where the filesystem
    /// allows it) and buffered reads see it at once, over older buffered
    /// bytes of the same range; unaligned writes stay buffered.
    #[test]
    fn direct_writes_stay_coherent_with_buffered_reads() {
        let (dir, dev) = scratch(8 << 20);
        // Older bytes, cached in the page cache.
        dev.write_at(&vec![1u8; 1 << 20], 1 << 20)
            .expect("buffered write");
        let mut back = vec![0u8; 1 << 20];
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert!(back.iter().all(|&b| b == 1));
        // An aligned 512 KiB write inside that range.
        let mut raw = vec![0u8; (512 << 10) + DIRECT_ALIGN];
        let at = raw.as_ptr().align_offset(DIRECT_ALIGN);
        let buf = &mut raw[at..at + (512 << 10)];
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        dev.write_at(buf, (1 << 20) + (256 << 10))
            .expect("direct write");
        // An unaligned one next to it.
        dev.write_at(&[9u8; 1000], (1 << 20) + 100)
            .expect("small write");
        dev.read_at(&mut back, 1 << 20).expect("read");
        assert!(back[..100].iter().all(|&b| b == 1));
        assert!(back[100..1100].iter().all(|&b| b == 9));
        assert!(back[1100..256 << 10].iter().all(|&b| b == 1));
        assert_eq!(&back[256 << 10..768 << 10], &buf[..]);
        assert!(back[768 << 10..].iter().all(|&b| b == 1));
        dev.flush().expect("flush");
        drop(dev);
        // And a fresh open (no shared cache state in the process) agrees.
        let dev = FileDevice::open_with(&dir.path().join("disk.img"), false).expect("reopen");
        let mut again = vec![0u8; 1 << 20];
        dev.read_at(&mut again, 1 << 20).expect("read");
        assert_eq!(again, back);
    }
}
