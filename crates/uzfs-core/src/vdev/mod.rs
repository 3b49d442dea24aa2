//! Virtual devices: leaves (a file or block device, see `leaf.rs`),
//! top-level vdevs (`top.rs`; each kind implements `ops.rs`'s trait: a
//! single disk or an N-way mirror in `mirror.rs`, a RAID-Z group in
//! `raidz.rs`), and labels. The SPA addresses a top-level vdev by
//! its id and a byte offset into its allocatable address space; each leaf's
//! allocatable area starts after its two front labels and the boot region
//! (`LABEL_START_SIZE`).
//!
//! A top-level vdev has columns: one per mirror side, one per RAID-Z child,
//! one for a disk. A column is a leaf plus the leaves attached to it while it
//! is being replaced or stood in for by a spare (`leaf::column_source`).

pub mod device;
pub mod fanout;
pub mod label;
pub mod leaf;
pub mod mirror;
pub mod ops;
pub mod queue;
pub mod raidz;
pub mod sim;
mod top;
pub mod uring;

pub use device::{BlockDevice, FileDevice, FlushPolicy};
pub use leaf::{AttachKind, Leaf, LeafState, VdevStats};
pub use ops::{Extent, Geometry, VdevOps};
pub use top::{BlockWrite, DurableRun, ScanRepair, TopKind, TopVdev, STAGED_BYTES};

/// Bytes before the allocatable area: labels L0, L1 and a 3.5 MiB boot region.
pub const LABEL_START_SIZE: u64 = 4 << 20;
/// Bytes after it: labels L2, L3.
pub const LABEL_END_SIZE: u64 = 512 << 10;
/// Smallest device a pool accepts (as OpenZFS's SPA_MINDEVSIZE).
pub const MIN_DEVICE_SIZE: u64 = 64 << 20;

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
