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
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    fn flush(&self) -> Result<()>;
    fn size(&self) -> u64;
    fn name(&self) -> String;
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

/// A regular file or a block device.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
    /// Contiguous span of small writes not yet handed to writeback.
    span: std::sync::Mutex<(u64, u64)>,
}

/// Small writes that continue each other (RAID-Z columns of consecutive
/// blocks) are handed to writeback once their span reaches this size.
pub const WRITEBACK_SPAN: u64 = 1 << 20;

impl FileDevice {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block devices report 0 in metadata; seeking to the end gives the size.
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0)).map_err(io)?
        };
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size,
            span: std::sync::Mutex::new((0, 0)),
        })
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

    fn io_err(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.display().to_string(),
            source,
        }
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_err(e))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if offset + buf.len() as u64 > self.size {
            return Err(Error::invalid(format!(
                "{}: write past end of device",
                self.path.display()
            )));
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io_err(e))?;
        // Start writeback of large writes (or of a run of small contiguous
        // ones) now, so the device works while the sync thread computes the
        // next checksums and the txg's final flush has little left to do. A
        // hint only: durability still comes from `flush` (fdatasync).
        // Measured on the 4 GiB sequential and the RAID-Z layout benchmarks.
        let len = buf.len() as u64;
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
    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io_err(e))
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.path.display().to_string()
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
