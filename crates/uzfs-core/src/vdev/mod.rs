//! Virtual devices: leaves (a file or block device), top-level vdevs (a
//! single disk or an N-way mirror of leaves), labels, and per-device error
//! counters. The SPA addresses a top-level vdev by its id and a byte offset
//! into its allocatable area, which starts after the two front labels and the
//! boot region (`LABEL_START_SIZE`).

pub mod device;
pub mod label;
pub mod raidz;
pub mod sim;

use crate::error::{Error, Result};
pub use device::{BlockDevice, FileDevice, FlushPolicy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes before the allocatable area: labels L0, L1 and a 3.5 MiB boot region.
pub const LABEL_START_SIZE: u64 = 4 << 20;
/// Bytes after it: labels L2, L3.
pub const LABEL_END_SIZE: u64 = 512 << 10;
/// Smallest device a pool accepts (as OpenZFS's SPA_MINDEVSIZE).
pub const MIN_DEVICE_SIZE: u64 = 64 << 20;

#[derive(Default, Debug)]
pub struct VdevStats {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl VdevStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

pub struct Leaf {
    pub guid: u64,
    pub path: String,
    pub dev: Arc<dyn BlockDevice>,
    pub stats: VdevStats,
}

impl Leaf {
    /// Not found at import (a `MissingDevice`): UNAVAIL, skipped by I/O.
    pub fn is_missing(&self) -> bool {
        self.dev.size() == 0
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        VdevStats::bump(&self.stats.reads, 1);
        VdevStats::bump(&self.stats.bytes_read, buf.len() as u64);
        let r = self.dev.read_at(buf, LABEL_START_SIZE + offset);
        if r.is_err() {
            VdevStats::bump(&self.stats.read_errors, 1);
        }
        r
    }
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<()> {
        VdevStats::bump(&self.stats.writes, 1);
        VdevStats::bump(&self.stats.bytes_written, buf.len() as u64);
        let r = self.dev.write_at(buf, LABEL_START_SIZE + offset);
        if r.is_err() {
            VdevStats::bump(&self.stats.write_errors, 1);
        }
        r
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopKind {
    Disk,
    Mirror,
}

pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub kind: TopKind,
    pub ashift: u8,
    /// Allocatable bytes (a whole number of metaslabs).
    pub asize: u64,
    pub ms_shift: u8,
    pub flush: FlushPolicy,
    pub children: Vec<Arc<Leaf>>,
}

impl TopVdev {
    /// Write to every child; succeeds if at least one child took the write
    /// (a mirror keeps going on a failed side, whose WRITE count rises).
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<()> {
        debug_assert!(offset.is_multiple_of(1 << self.ashift));
        debug_assert!(offset + buf.len() as u64 <= self.asize);
        let mut first_err = None;
        let mut ok = 0;
        for c in self.children.iter().filter(|c| !c.is_missing()) {
            match c.write(buf, offset) {
                Ok(()) => ok += 1,
                Err(e) => {
                    if matches!(e, Error::PowerLost) {
                        return Err(e);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        match (ok, first_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Flush every child, unless the flush policy says the cache is safe.
    pub fn flush(&self) -> Result<()> {
        if self.flush == FlushPolicy::Ignore {
            return Ok(());
        }
        for c in self.children.iter().filter(|c| !c.is_missing()) {
            c.dev.flush()?;
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        match self.kind {
            TopKind::Disk => self
                .children
                .first()
                .map(|c| c.path.clone())
                .unwrap_or_default(),
            TopKind::Mirror => format!("mirror-{}", self.id),
        }
    }
}

/// Metaslab shift for a vdev of `asize` bytes: about 200 metaslabs, each at
/// least 16 MiB (OpenZFS: metaslab_shift from vdev_metaslab_set_size).
pub fn metaslab_shift(asize: u64) -> u8 {
    let mut shift = 24u8;
    while (asize >> shift) > 200 {
        shift += 1;
    }
    shift
}

/// Allocatable size of a device of `dev_size` bytes, rounded down to whole
/// metaslabs. `None` if it is too small to hold a pool.
pub fn allocatable(dev_size: u64) -> Option<(u64, u8)> {
    if dev_size < MIN_DEVICE_SIZE {
        return None;
    }
    let raw = label::aligned_size(dev_size) - LABEL_START_SIZE - LABEL_END_SIZE;
    let shift = metaslab_shift(raw);
    let asize = raw >> shift << shift;
    if asize == 0 {
        // Smaller than one 16 MiB metaslab: use one metaslab of what is there.
        let shift = 63 - raw.leading_zeros() as u8;
        return Some((1u64 << shift, shift));
    }
    Some((asize, shift))
}
