//! What one kind of top-level vdev does differently from another
//! (OpenZFS's `vdev_ops_t`): a single disk and a mirror (`mirror.rs`),
//! RAID-Z (`raidz.rs`).
//!
//! A top-level vdev ([`TopVdev`]) is the same object for every kind: an
//! address space, its columns (each a leaf plus the leaves attached to it),
//! the write and flush machinery that settles each column's outcome against
//! the vdev's redundancy, and the scan's per-block work. What a kind decides
//! is geometry and reading:
//!
//! - how many columns it survives losing and how wide it may be;
//! - how large its address space is for children of a given size, and how
//!   much each child must hold for a given address space;
//! - how many bytes a block of `psize` takes, and where those bytes land on
//!   the children ([`VdevOps::extents`], [`VdevOps::columns`]);
//! - how a block is read, verified and rebuilt ([`VdevOps::read`]);
//! - whether every child holds the same bytes at the same offsets
//!   ([`VdevOps::replicated`]): then blocks adjacent in the address space
//!   are adjacent on every child, and a run of them is one write per side.
//!
//! A new kind (dRAID, say) is a new file implementing this trait, a
//! [`TopKind`] variant naming it, and one arm in [`TopKind::ops`]; `top.rs`
//! and the SPA ask the trait, never the kind.

use super::top::{TopKind, TopVdev};
use super::Leaf;
use crate::error::Result;
use std::borrow::Cow;
use std::sync::Arc;

/// A block's verifier: true if the bytes are the block (its checksum).
pub type Verify<'a> = &'a dyn Fn(&[u8]) -> bool;

/// One piece of a block on one child: which column, where on the child
/// (relative to its allocatable area), how many bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub child: usize,
    pub offset: u64,
    pub size: u64,
}

/// A block read: where, how large, born when, and how hard to look.
pub struct ReadReq<'a> {
    pub offset: u64,
    pub psize: u64,
    pub birth: u64,
    pub verify: Verify<'a>,
    /// Read every copy and column (scrub, zdb), not just enough to verify.
    pub thorough: bool,
    /// Rewrite what was found wrong and count it in the leaves' errors.
    pub repair: bool,
}

/// What reading one block found.
pub struct ReadOutcome {
    pub data: Vec<u8>,
    /// Bytes rewritten to repair bad copies or columns.
    pub repaired: u64,
    /// Leaves whose copy or column was wrong, and why.
    pub bad: Vec<(Arc<Leaf>, &'static str)>,
}

/// A block laid out on a vdev's columns: the distinct buffers (a mirror
/// has one, shared by every side; RAID-Z one per column) and, per column,
/// `(child, offset, buffer index)`.
pub struct Columns<'a> {
    pub bufs: Vec<Cow<'a, [u8]>>,
    pub cols: Vec<(usize, u64, usize)>,
}

impl Columns<'_> {
    /// `(child, offset, bytes)` of each column.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64, &[u8])> + '_ {
        self.cols.iter().map(|&(c, o, b)| (c, o, &*self.bufs[b]))
    }
}

/// The shape of a top-level vdev: its kind, its number of columns and its
/// sector size. Enough to size and place blocks without the vdev itself
/// (the allocator keeps one per vdev).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub kind: TopKind,
    pub width: usize,
    pub ashift: u8,
}

impl Geometry {
    /// Bytes allocated for a block of `psize` bytes.
    pub fn asize(&self, psize: u64) -> u64 {
        self.kind.ops().asize(self, psize)
    }

    /// Where a block of `psize` bytes at `offset` lands on the children.
    pub fn extents(&self, offset: u64, psize: u64) -> Vec<Extent> {
        self.kind.ops().extents(self, offset, psize)
    }

    /// Address space for children whose smallest holds `raw` bytes past
    /// its labels (before rounding to whole metaslabs).
    pub fn space(&self, raw: u64) -> u64 {
        self.kind.ops().space(self, raw)
    }

    /// Bytes each child must hold past its front labels for `asize`.
    pub fn child_need(&self, asize: u64) -> u64 {
        self.kind.ops().child_need(self, asize)
    }
}

/// One kind of top-level vdev. Implementations are stateless: the vdev's
/// state is in [`TopVdev`] and its leaves.
pub trait VdevOps: Sync {
    /// Columns whose loss a vdev of `width` columns survives.
    fn redundancy(&self, width: usize) -> usize;

    /// Why a vdev of this kind cannot have `width` columns, if it cannot.
    fn check_width(&self, width: usize) -> std::result::Result<(), String>;

    /// Address space of a vdev whose smallest child holds `raw` bytes
    /// past its labels.
    fn space(&self, g: &Geometry, raw: u64) -> u64;

    /// Bytes each child must hold past its front labels for an address
    /// space of `asize`.
    fn child_need(&self, g: &Geometry, asize: u64) -> u64;

    /// Bytes of address space a block of `psize` bytes takes.
    fn asize(&self, g: &Geometry, psize: u64) -> u64;

    /// Where a block of `psize` bytes at `offset` lands: every byte the
    /// block puts on each child (parity included), one extent per column.
    fn extents(&self, g: &Geometry, offset: u64, psize: u64) -> Vec<Extent>;

    /// The bytes each column holds for a block whose physical bytes are
    /// `phys` (allocated `asize`).
    fn columns<'a>(&self, top: &TopVdev, offset: u64, phys: &'a [u8], asize: u64) -> Columns<'a>;

    /// Read, verify and (if asked) repair one block.
    fn read(&self, top: &TopVdev, req: &ReadReq<'_>) -> Result<ReadOutcome>;

    /// Every child holds the same bytes at the same offset (a mirror or a
    /// single disk): a run of adjacent blocks is one write per child, and
    /// one child's copy is a whole block.
    fn replicated(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::sim::SimRng;

    const KINDS: [(TopKind, usize); 7] = [
        (TopKind::Disk, 1),
        (TopKind::Mirror, 2),
        (TopKind::Mirror, 3),
        (TopKind::Raidz1, 3),
        (TopKind::Raidz1, 5),
        (TopKind::Raidz2, 6),
        (TopKind::Raidz3, 8),
    ];

    /// What every kind promises the SPA: a vdev cut from children of `raw`
    /// bytes needs no more than `raw` of each; a block's allocation covers
    /// its bytes; its extents stay inside what the children hold for the
    /// address space up to its end and never overlap another block's.
    #[test]
    fn every_kind_keeps_its_geometry_promises() {
        let mut rng = SimRng::new(5);
        for (kind, width) in KINDS {
            let ops = kind.ops();
            assert!(ops.check_width(width).is_ok(), "{kind:?} x{width}");
            for ashift in [9u8, 12] {
                let g = Geometry {
                    kind,
                    width,
                    ashift,
                };
                let raw = (64u64 << 20) + rng.below(1 << 20) * 512;
                let space = g.space(raw);
                assert!(
                    g.child_need(space) <= raw,
                    "{kind:?} x{width} ashift {ashift}: needs more than the children hold"
                );
                let mut off = 0u64;
                let mut seen: Vec<Vec<(u64, u64)>> = vec![Vec::new(); width];
                for _ in 0..200 {
                    let psize = 1 + rng.below(256 << 10);
                    let asize = g.asize(psize);
                    assert!(asize >= psize && asize.is_multiple_of(1 << ashift));
                    let ext = g.extents(off, psize);
                    let bytes: u64 = ext.iter().map(|e| e.size).sum();
                    if ops.replicated() {
                        assert_eq!(ext.len(), width);
                        assert!(ext.iter().all(|e| e.offset == off && e.size == psize));
                    } else {
                        // Data and parity, all inside the allocation.
                        assert!(
                            bytes >= psize && bytes <= asize,
                            "{kind:?}: {bytes} of {asize}"
                        );
                    }
                    for e in &ext {
                        assert!(e.child < width);
                        assert!(e.offset + e.size <= g.child_need(off + asize));
                        for &(lo, hi) in &seen[e.child] {
                            assert!(
                                e.offset >= hi || e.offset + e.size <= lo,
                                "{kind:?} x{width}: block at {off} overlaps another on child {}",
                                e.child
                            );
                        }
                    }
                    for e in &ext {
                        seen[e.child].push((e.offset, e.offset + e.size));
                    }
                    off += asize;
                }
            }
        }
    }

    #[test]
    fn widths_a_kind_cannot_have_are_refused() {
        for (kind, width) in [
            (TopKind::Disk, 2),
            (TopKind::Mirror, 1),
            (TopKind::Raidz1, 1),
            (TopKind::Raidz2, 2),
            (TopKind::Raidz3, 256),
        ] {
            assert!(kind.ops().check_width(width).is_err(), "{kind:?} x{width}");
        }
    }
}
