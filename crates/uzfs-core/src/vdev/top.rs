//! Top-level vdevs: the object every kind shares (its columns, the
//! writes and flushes settled against its redundancy, the scan's per-block
//! work) over what each kind does its own way (`ops.rs`: `mirror.rs` for
//! disks and mirrors, `raidz.rs` for RAID-Z). Nothing here asks which kind
//! a vdev is.
//!
//! A write succeeds while no more columns failed than the vdev survives;
//! a leaf that failed records the txg in its DTL. A read (`read_block`)
//! is the kind's: it verifies, rebuilds and rewrites what it found wrong.
//! `thorough` (scrub) reads every column of every copy, including parity
//! and leaves standing in for each other, and repairs every one that
//! differs from what the verified block implies.

use super::device::{fits_direct, fits_granule, DIRECT_ALIGN};

/// One block for [`TopVdev::write_blocks`]: offset, physical bytes, asize.
pub type BlockWrite<'a> = (u64, &'a [u8], u64);
/// One write of a child in `write_blocks`: the blocks it covers, its
/// device offset and its bytes, in pieces laid one after another (the
/// blocks of a run written from their own buffers, or one staged copy).
type ColumnWrite<'a> = (std::ops::Range<usize>, u64, Vec<&'a [u8]>);
use super::fanout;
use super::leaf::{column_leaves, Leaf, LeafState};
use super::ops::{Columns, Geometry, ReadOutcome, ReadReq, VdevOps, Verify};
use super::FlushPolicy;
use crate::error::{Error, Result};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopKind {
    Disk,
    Mirror,
    Raidz1,
    Raidz2,
    Raidz3,
}

impl TopKind {
    /// What this kind does its own way (`ops.rs`).
    pub fn ops(self) -> &'static dyn VdevOps {
        match self {
            TopKind::Disk => &super::mirror::DISK,
            TopKind::Mirror => &super::mirror::MIRROR,
            TopKind::Raidz1 => &super::raidz::RAIDZ1,
            TopKind::Raidz2 => &super::raidz::RAIDZ2,
            TopKind::Raidz3 => &super::raidz::RAIDZ3,
        }
    }
    pub fn raidz(nparity: usize) -> Option<TopKind> {
        match nparity {
            1 => Some(TopKind::Raidz1),
            2 => Some(TopKind::Raidz2),
            3 => Some(TopKind::Raidz3),
            _ => None,
        }
    }
    /// Name in `zpool status` and on the command line.
    pub fn label(self) -> &'static str {
        match self {
            TopKind::Disk => "disk",
            TopKind::Mirror => "mirror",
            TopKind::Raidz1 => "raidz1",
            TopKind::Raidz2 => "raidz2",
            TopKind::Raidz3 => "raidz3",
        }
    }
}

/// What scanning one block did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanRepair {
    /// Bytes written to repair or resilver leaves.
    pub repaired: u64,
    /// No copy of the block could be made to verify.
    pub unrecoverable: bool,
}

pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub kind: TopKind,
    pub ashift: u8,
    /// Allocatable bytes of the address space (a whole number of metaslabs).
    pub asize: u64,
    pub ms_shift: u8,
    pub flush: FlushPolicy,
    /// One leaf per column.
    pub children: Vec<Arc<Leaf>>,
}

pub(super) fn is_power_lost(e: &Error) -> bool {
    matches!(e, Error::PowerLost)
}

/// Bytes `write_blocks` copied into staging buffers since the process
/// started (blocks or RAID-Z columns not written from their own buffers),
/// for the tests that hold the sync to no copy.
pub static STAGED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Grow the staging buffer to hold `len` bytes from its first
/// `DIRECT_ALIGN`-aligned address, which it returns (runs placed at
/// aligned positions after it stay aligned).
fn aligned_start(run_buf: &mut Vec<u8>, len: usize) -> usize {
    let total = len.next_multiple_of(DIRECT_ALIGN) + DIRECT_ALIGN;
    if run_buf.len() < total {
        run_buf.resize(total, 0);
    }
    run_buf.as_ptr().align_offset(DIRECT_ALIGN)
}

/// The leaves of a column that can take I/O now.
fn usable_leaves(primary: &Arc<Leaf>) -> Vec<Arc<Leaf>> {
    column_leaves(primary)
        .into_iter()
        .filter(|l| l.is_usable())
        .collect()
}

/// Zeros that pad a block to its allocation in a [`DurableRun`] and in a
/// direct run of the sync (a compressed block): page-aligned, so a direct
/// write takes them from here.
#[repr(C, align(4096))]
struct Zeros([u8; ZEROS_LEN]);
const ZEROS_LEN: usize = 64 << 10;
static ZEROS: Zeros = Zeros([0; ZEROS_LEN]);

/// Append pieces of [`ZEROS`] that make `n` bytes.
fn zero_pieces(mut n: usize, out: &mut Vec<&[u8]>) {
    while n > 0 {
        let k = n.min(ZEROS_LEN);
        out.push(&ZEROS.0[..k]);
        n -= k;
    }
}

/// Longest run of adjacent blocks written as one.
const RUN_MAX: u64 = 8 << 20;

/// One write of [`TopVdev::write_durable_at_once`]: blocks that follow each
/// other on a mirror or single disk, each padded to its allocation,
/// gathered from `pieces` and written to every side at `offset`.
pub struct DurableRun<'a> {
    pub offset: u64,
    pub pieces: Vec<&'a [u8]>,
}

impl<'a> DurableRun<'a> {
    /// Bytes the run writes.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(|p| p.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.iter().all(|p| p.is_empty())
    }

    /// Runs of `blocks` (`(offset, phys, asize)` each, as for
    /// [`TopVdev::write_block`]): each block joins the run before it when
    /// it starts where that one ends.
    pub fn of_blocks(blocks: &[(u64, &'a [u8], u64)]) -> Vec<DurableRun<'a>> {
        let mut runs: Vec<(DurableRun<'a>, u64)> = Vec::new();
        for &(offset, phys, asize) in blocks {
            let len = asize.max(phys.len() as u64);
            let run = match runs.last_mut() {
                Some((r, end)) if *end == offset && *end + len - r.offset <= RUN_MAX => {
                    *end += len;
                    r
                }
                _ => {
                    runs.push((
                        DurableRun {
                            offset,
                            pieces: Vec::new(),
                        },
                        offset + len,
                    ));
                    &mut runs.last_mut().expect("just pushed").0
                }
            };
            run.pieces.push(phys);
            zero_pieces((len - phys.len() as u64) as usize, &mut run.pieces);
        }
        runs.into_iter().map(|(r, _)| r).collect()
    }
}

/// What one column made of an operation: whether some leaf took it, the
/// first error, and the leaves that failed.
type ColumnOutcome = (bool, Option<Error>, Vec<Arc<Leaf>>);

/// Run `op` on each of a column's `leaves`; a power loss ends the column at
/// once (the `Err`). The failed leaves lack `txg` only if the operation as
/// a whole succeeds: the caller records them in their DTLs then
/// ([`note_missed`]). An operation that fails beyond the redundancy is
/// issued again whole (a parked sync, spa/suspend.rs) or its txg never
/// commits, so it leaves no DTL behind (a single disk that failed and came
/// back would otherwise lack a txg it has, with no copy to resilver from).
fn on_column(leaves: &[Arc<Leaf>], op: impl Fn(&Leaf) -> Result<()>) -> Result<ColumnOutcome> {
    let mut ok = false;
    let mut first_err = None;
    let mut failed = Vec::new();
    for l in leaves {
        match op(l) {
            Ok(()) => ok = true,
            Err(e) if is_power_lost(&e) => return Err(e),
            Err(e) => {
                failed.push(l.clone());
                first_err.get_or_insert(e);
            }
        }
    }
    Ok((ok, first_err, failed))
}

/// The operation succeeded: leaves that failed it lack `txg`.
fn note_missed(failed: &[Arc<Leaf>], txg: u64) {
    for l in failed {
        l.dtl_add(txg);
    }
}

impl TopVdev {
    /// The same vdev with another kind and other columns (tree changes).
    pub fn with_children(&self, kind: TopKind, children: Vec<Arc<Leaf>>) -> Arc<TopVdev> {
        Arc::new(TopVdev {
            id: self.id,
            guid: self.guid,
            kind,
            ashift: self.ashift,
            asize: self.asize,
            ms_shift: self.ms_shift,
            flush: self.flush,
            children,
        })
    }

    /// The same vdev with a larger address space (`spa/expand.rs`).
    pub fn with_asize(&self, asize: u64) -> Arc<TopVdev> {
        Arc::new(TopVdev {
            asize,
            children: self.children.clone(),
            ..*self
        })
    }

    /// The same vdev with another cache-flush policy.
    pub fn with_flush(&self, flush: FlushPolicy) -> Arc<TopVdev> {
        Arc::new(TopVdev {
            flush,
            children: self.children.clone(),
            ..*self
        })
    }

    /// What this vdev's kind does its own way.
    pub fn ops(&self) -> &'static dyn VdevOps {
        self.kind.ops()
    }

    /// Kind, width and sector size.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            kind: self.kind,
            width: self.children.len(),
            ashift: self.ashift,
        }
    }

    /// Columns whose loss the vdev survives.
    pub fn redundancy(&self) -> usize {
        self.ops().redundancy(self.children.len())
    }

    pub fn name(&self) -> String {
        match self.kind {
            TopKind::Disk => self
                .children
                .first()
                .map(|c| c.path.clone())
                .unwrap_or_default(),
            k => format!("{}-{}", k.label(), self.id),
        }
    }

    /// Every leaf, attached ones included.
    pub fn leaves(&self) -> Vec<Arc<Leaf>> {
        self.children.iter().flat_map(column_leaves).collect()
    }

    /// Bytes each leaf must hold past its front labels.
    pub fn child_need(&self) -> u64 {
        self.geometry().child_need(self.asize)
    }

    /// Columns that cannot serve reads right now.
    pub fn dead_columns(&self) -> usize {
        self.children
            .iter()
            .filter(|c| column_leaves(c).iter().all(|l| !l.is_usable()))
            .count()
    }

    /// Can serve every block (possibly degraded).
    pub fn is_functional(&self) -> bool {
        self.dead_columns() <= self.redundancy()
    }

    /// Expected contents of each column for the verified block `data`
    /// (padded to the sector, as a fresh write of it would be).
    fn expected_columns<'a>(&self, offset: u64, data: &'a [u8]) -> Columns<'a> {
        let asize = self.geometry().asize(data.len() as u64);
        self.ops().columns(self, offset, data, asize)
    }

    /// Read and verify a block of `psize` bytes born in txg `birth`,
    /// repairing what it can. Returns the data and the bytes repaired.
    pub fn read_block(
        &self,
        offset: u64,
        psize: u64,
        birth: u64,
        verify: Verify,
        thorough: bool,
    ) -> Result<(Vec<u8>, u64)> {
        let o = self.read_impl(offset, psize, birth, verify, thorough, !self.readonly())?;
        Ok((o.data, o.repaired))
    }

    /// Read a block without repairing or counting anything: for blocks
    /// that are expected not to verify (the end of an intent-log chain).
    pub fn read_quiet(
        &self,
        offset: u64,
        psize: u64,
        birth: u64,
        verify: Verify,
    ) -> Result<Vec<u8>> {
        Ok(self
            .read_impl(offset, psize, birth, verify, false, false)?
            .data)
    }

    /// Part of a read-only import: nothing is repaired (nothing written).
    pub fn readonly(&self) -> bool {
        self.children.first().is_some_and(|c| c.dev.read_only())
    }

    /// Read every copy and column of a block without writing or counting
    /// anything (zdb). Returns the leaves whose copy is bad and why; fails
    /// if the block cannot be reconstructed at all.
    pub fn check_block(
        &self,
        offset: u64,
        psize: u64,
        birth: u64,
        verify: Verify,
    ) -> Result<Vec<(String, &'static str)>> {
        let o = self.read_impl(offset, psize, birth, verify, true, false)?;
        Ok(o.bad
            .into_iter()
            .map(|(l, why)| (l.path.clone(), why))
            .collect())
    }

    fn read_impl(
        &self,
        offset: u64,
        psize: u64,
        birth: u64,
        verify: Verify,
        thorough: bool,
        repair: bool,
    ) -> Result<ReadOutcome> {
        self.ops().read(
            self,
            &ReadReq {
                offset,
                psize,
                birth,
                verify,
                thorough,
                repair,
            },
        )
    }

    /// Scrub or resilver one block: read it (every copy if `scrub`), repair
    /// what is wrong, and write its columns to every leaf whose DTL lacks it.
    pub fn scan_block(
        &self,
        offset: u64,
        psize: u64,
        birth: u64,
        verify: Verify,
        scrub: bool,
    ) -> Result<ScanRepair> {
        let (data, mut repaired) = match self.read_block(offset, psize, birth, verify, scrub) {
            Ok(r) => r,
            Err(e) if is_power_lost(&e) => return Err(e),
            Err(_) => {
                return Ok(ScanRepair {
                    repaired: 0,
                    unrecoverable: true,
                })
            }
        };
        let needs: Vec<(usize, Vec<Arc<Leaf>>)> = self
            .children
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let ls: Vec<Arc<Leaf>> = column_leaves(c)
                    .into_iter()
                    .filter(|l| l.is_usable() && l.dtl_covers(birth))
                    .collect();
                (i, ls)
            })
            .filter(|(_, ls)| !ls.is_empty())
            .collect();
        if !needs.is_empty() {
            for (child, off, bytes) in self.expected_columns(offset, &data).iter() {
                for (_, ls) in needs.iter().filter(|(i, _)| *i == child) {
                    for l in ls {
                        match l.write(bytes, off) {
                            Ok(()) => repaired += bytes.len() as u64,
                            Err(e) if is_power_lost(&e) => return Err(e),
                            Err(_) => {}
                        }
                    }
                }
            }
        }
        Ok(ScanRepair {
            repaired,
            unrecoverable: false,
        })
    }

    /// Write a block's physical bytes (`asize` allocated) to its columns.
    /// Succeeds while no more columns failed than the vdev's redundancy;
    /// a leaf that failed records `txg` in its DTL.
    pub fn write_block(&self, offset: u64, phys: &[u8], asize: u64, txg: u64) -> Result<()> {
        debug_assert!(offset.is_multiple_of(1 << self.ashift));
        debug_assert!(offset + asize <= self.asize);
        let cols = self.ops().columns(self, offset, phys, asize);
        self.on_columns(
            cols.iter()
                .map(|(child, off, bytes)| (child, move |l: &Leaf| l.write(bytes, off))),
            txg,
            "too many devices unavailable to write",
        )
    }

    /// Write one block and make it durable: each column's leaves write and
    /// flush (the flush policy allowing), the columns in parallel, so a
    /// mirror's intent-log write costs one write and one flush of the
    /// slowest side, not the sum of both. Same success rule as
    /// [`write_block`](Self::write_block).
    pub fn write_durable(&self, offset: u64, phys: &[u8], asize: u64, txg: u64) -> Result<()> {
        debug_assert!(offset.is_multiple_of(1 << self.ashift));
        debug_assert!(offset + asize <= self.asize);
        let runs = DurableRun::of_blocks(&[(offset, phys, asize)]);
        if let Some(r) = self.write_durable_at_once(&runs, txg) {
            return r;
        }
        let layout = self.ops().columns(self, offset, phys, asize);
        let cols: Vec<(usize, u64, &[u8])> = layout.iter().collect();
        let flush = self.flush != FlushPolicy::Ignore;
        let run = |(child, off, bytes): &(usize, u64, &[u8])| {
            on_column(&usable_leaves(&self.children[*child]), |l: &Leaf| {
                if flush {
                    l.write_sync(bytes, *off)
                } else {
                    l.write(bytes, *off)
                }
            })
        };
        let outcomes = fanout::try_fan_out(&cols, "column writer", run);
        self.settle(
            outcomes.into_iter(),
            txg,
            "too many devices unavailable to write",
        )
    }

    /// Write several log blocks born in `txg` (`(offset, phys, asize)`
    /// each) and make them all durable, each by
    /// [`write_durable`](Self::write_durable)'s rule. On a mirror or disk
    /// of files every side of every block goes at once through the
    /// caller's io_uring, each write durable by itself; otherwise each
    /// block is written, then every leaf flushed once.
    pub fn write_durable_all(&self, blocks: &[(u64, &[u8], u64)], txg: u64) -> Result<()> {
        if let [(offset, phys, asize)] = blocks {
            return self.write_durable(*offset, phys, *asize, txg);
        }
        if let Some(r) = self.write_durable_at_once(&DurableRun::of_blocks(blocks), txg) {
            return r;
        }
        self.write_blocks_then_flush(blocks, txg)
    }

    /// Write each block (`(offset, phys, asize)`, as for
    /// [`write_block`](Self::write_block)), then flush every leaf once:
    /// everything written to them before is durable on return.
    pub fn write_blocks_then_flush(&self, blocks: &[(u64, &[u8], u64)], txg: u64) -> Result<()> {
        for &(offset, phys, asize) in blocks {
            self.write_block(offset, phys, asize, txg)?;
        }
        self.flush(txg)
    }

    /// Durable writes of runs of blocks on a mirror or single disk: every
    /// leaf of every run written at once from this thread, each write
    /// durable by itself (`vdev/uring.rs`: a run is copied once, whatever
    /// the number of sides); each run is then settled by `on_column`'s
    /// rules, as [`write_durable`](Self::write_durable) settles a block.
    /// `None` when the vdev is RAID-Z or trusts its caches (no flush), some
    /// leaf cannot take it that way (fault injection, a device that is not
    /// a file), io_uring is unavailable, there are too many writes for one
    /// submission, or only one (a single `pwritev2` already): nothing was
    /// written then.
    pub fn write_durable_at_once(&self, runs: &[DurableRun<'_>], txg: u64) -> Option<Result<()>> {
        if !self.ops().replicated() || self.flush == FlushPolicy::Ignore {
            return None;
        }
        let sources: Vec<&[&[u8]]> = runs.iter().map(|r| r.pieces.as_slice()).collect();
        let mut writes = Vec::new();
        let mut who = Vec::new();
        for (r, run) in runs.iter().enumerate() {
            for c in 0..self.children.len() {
                for l in usable_leaves(&self.children[c]) {
                    let (fd, at) = l.dsync_target(run.offset, run.len())?;
                    writes.push(super::uring::DsyncWrite {
                        fd,
                        offset: at,
                        src: r,
                    });
                    who.push((r, c, l));
                }
            }
        }
        if writes.len() < 2 {
            return None;
        }
        let t = std::time::Instant::now();
        let res = {
            // In flight in each leaf's sync-write class for their length
            // (`zpool iostat -q`; the other classes and scans see them).
            let _inflight: Vec<super::queue::Slot<'_>> = who
                .iter()
                .map(|(_, _, l)| l.queue.account(super::queue::IoClass::SyncWrite))
                .collect();
            super::uring::write_dsync_all(&sources, &writes)?
        };
        let took = t.elapsed();
        let mut outcomes: Vec<Vec<ColumnOutcome>> = runs
            .iter()
            .map(|_| {
                (0..self.children.len())
                    .map(|_| (false, None, Vec::new()))
                    .collect()
            })
            .collect();
        for ((r, c, l), res) in who.into_iter().zip(res) {
            let run = &runs[r];
            let o = &mut outcomes[r][c];
            match l.dsync_done(&run.pieces, run.offset, res, took) {
                Ok(()) => o.0 = true,
                Err(e) if is_power_lost(&e) => return Some(Err(e)),
                Err(e) => {
                    o.2.push(l);
                    o.1.get_or_insert(e);
                }
            }
        }
        // Every run settled (its missed leaves noted) before the first
        // error is returned.
        let mut first = Ok(());
        for o in outcomes {
            let r = self.settle(
                o.into_iter().map(Ok),
                txg,
                "too many devices unavailable to write",
            );
            if first.is_ok() {
                first = r;
            }
        }
        Some(first)
    }

    /// Write several blocks born in `txg` (`(offset, phys, asize)` each, as
    /// for [`write_block`](Self::write_block)) with one thread per child, so
    /// a mirror's sides (or a RAID-Z's columns) are written in parallel: a
    /// sync thread writing a record to each side in turn spent most of a
    /// large txg in `pwrite`. With direct I/O (the default), blocks
    /// that follow each other on a mirror or single disk are copied once
    /// into one aligned buffer and go out as one write per side, which
    /// `FileDevice` sends around the host's page cache. Each block keeps
    /// `write_block`'s rule: it fails only if more of its columns failed than
    /// the vdev survives; a failed leaf records `txg` in its DTL; power loss
    /// stops every writer. `run_buf` is the staging buffer (kept by the
    /// caller so its pages stay faulted in across calls).
    pub fn write_blocks(
        &self,
        blocks: &[BlockWrite],
        txg: u64,
        run_buf: &mut Vec<u8>,
    ) -> Result<()> {
        let stage = super::device::direct_io_enabled();
        self.write_blocks_staged(blocks, txg, run_buf, stage)
    }

    /// [`write_blocks`](Self::write_blocks), staging mirror runs in
    /// `run_buf` when `stage` (direct I/O) or writing each block from its
    /// own buffer otherwise.
    fn write_blocks_staged(
        &self,
        blocks: &[BlockWrite],
        txg: u64,
        run_buf: &mut Vec<u8>,
        stage: bool,
    ) -> Result<()> {
        if blocks.len() < 2 {
            for &(offset, phys, asize) in blocks {
                self.write_block(offset, phys, asize, txg)?;
            }
            return Ok(());
        }
        let mut per_child: Vec<Vec<ColumnWrite>> = vec![Vec::new(); self.children.len()];
        let layouts: Vec<Columns>;
        if !stage || !self.ops().replicated() {
            // Each block laid out by itself (RAID-Z columns; a mirror's
            // blocks straight from the caller's buffers, one padded copy
            // when shorter than the allocation).
            layouts = blocks
                .iter()
                .map(|&(offset, phys, asize)| self.ops().columns(self, offset, phys, asize))
                .collect();
            if stage {
                // RAID-Z with direct I/O: each child's columns of
                // consecutive blocks that follow each other on it, staged
                // once into an aligned run (buffered, every column was
                // copied into the host's page cache: at 4 GiB that copy
                // and the host's writeback were most of the daemon's CPU).
                return self.write_columns_staged(&layouts, blocks.len(), txg, run_buf);
            }
            for (b, cols) in layouts.iter().enumerate() {
                for (child, off, bytes) in cols.iter() {
                    per_child[child].push((b..b + 1, off, vec![bytes]));
                }
            }
        } else {
            // Runs of adjacent blocks. A run whose every block starts on
            // a page (the record buffers and compressed blocks, aligned by
            // `alloc.rs`) and is, like its allocation, whole units of
            // what every leaf takes unstaged (`direct_granule`: a page, or
            // a 512-byte sector where the filesystem says so) is written
            // from those buffers, a compressed block followed by zeros up
            // to its allocation; any other is copied once, starting
            // aligned in `run_buf` (`None` below: where it goes there).
            type Run = (std::ops::Range<usize>, u64, Option<usize>, usize);
            let unit = self
                .leaves()
                .iter()
                .map(|l| l.dev.direct_granule())
                .max()
                .unwrap_or(DIRECT_ALIGN);
            let whole = |phys: &[u8], asize: u64| {
                phys.len() as u64 <= asize
                    && fits_granule(phys, unit)
                    && (asize as usize).is_multiple_of(unit)
            };
            let mut runs: Vec<Run> = Vec::new();
            for (b, &(offset, phys, asize)) in blocks.iter().enumerate() {
                let len = asize.max(phys.len() as u64);
                let direct = whole(phys, asize);
                match runs.last_mut() {
                    Some((r, off, staged, rlen))
                        if *off + *rlen as u64 == offset
                            && *rlen as u64 + len <= RUN_MAX
                            && staged.is_none() == direct =>
                    {
                        r.end = b + 1;
                        *rlen += len as usize;
                    }
                    _ => runs.push((b..b + 1, offset, (!direct).then_some(0), len as usize)),
                }
            }
            let mut pos = 0usize;
            for (_, _, staged, len) in runs.iter_mut() {
                if let Some(at) = staged {
                    pos = pos.next_multiple_of(DIRECT_ALIGN);
                    *at = pos;
                    pos += *len;
                }
            }
            let base = aligned_start(run_buf, pos);
            let buf = &mut run_buf[base..];
            for (r, _, staged, len) in &runs {
                let Some(start) = *staged else { continue };
                let mut at = start;
                for &(_, phys, asize) in &blocks[r.clone()] {
                    buf[at..at + phys.len()].copy_from_slice(phys);
                    let end = at + (asize as usize).max(phys.len());
                    buf[at + phys.len()..end].fill(0);
                    at = end;
                }
                debug_assert_eq!(at, start + len);
            }
            STAGED_BYTES.fetch_add(pos as u64, std::sync::atomic::Ordering::Relaxed);
            let buf = &run_buf[base..];
            for col in per_child.iter_mut() {
                for (r, off, staged, len) in &runs {
                    let pieces = match staged {
                        Some(start) => vec![&buf[*start..*start + *len]],
                        None => {
                            let mut p = Vec::with_capacity(r.len() * 2);
                            for &(_, phys, asize) in &blocks[r.clone()] {
                                p.push(phys);
                                zero_pieces(asize as usize - phys.len(), &mut p);
                            }
                            p
                        }
                    };
                    col.push((r.clone(), *off, pieces));
                }
            }
        }
        self.write_columns(&per_child, blocks.len(), txg)
    }

    /// [`write_blocks`](Self::write_blocks) of blocks laid out apart on
    /// each child (RAID-Z): per child, the columns of consecutive blocks
    /// that follow each other on it become one run (at most `RUN_MAX`),
    /// written from the columns' buffers where each is whole pages, else
    /// copied once into an aligned place in `run_buf`, so `FileDevice`
    /// writes it around the host's page cache.
    fn write_columns_staged(
        &self,
        layouts: &[Columns],
        nblocks: usize,
        txg: u64,
        run_buf: &mut Vec<u8>,
    ) -> Result<()> {
        // Per child: (blocks, offset on the child, length, place in the buffer).
        type Run = (std::ops::Range<usize>, u64, usize, usize);
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); self.children.len()];
        for (b, cols) in layouts.iter().enumerate() {
            for (child, off, bytes) in cols.iter() {
                let len = bytes.len();
                match runs[child].last_mut() {
                    Some((r, roff, rlen, _))
                        if r.end == b
                            && *roff + *rlen as u64 == off
                            && (*rlen + len) as u64 <= RUN_MAX =>
                    {
                        r.end = b + 1;
                        *rlen += len;
                    }
                    _ => runs[child].push((b..b + 1, off, len, 0)),
                }
            }
        }
        // Each run's pieces (one column per block, in order), gathered
        // once. A run whose columns all suit direct I/O (a geometry whose
        // columns are whole pages) is written from the columns' own
        // buffers; the others are copied once into `run_buf`.
        const DIRECT: usize = usize::MAX;
        let mut pieces: Vec<Vec<Vec<&[u8]>>> = Vec::with_capacity(runs.len());
        let mut pos = 0usize;
        for (child, list) in runs.iter_mut().enumerate() {
            let mut of_child = Vec::with_capacity(list.len());
            for run in list.iter_mut() {
                let p: Vec<&[u8]> = layouts[run.0.clone()]
                    .iter()
                    .filter_map(|cols| cols.iter().find(|c| c.0 == child).map(|c| c.2))
                    .collect();
                if p.iter().all(|b| fits_direct(b)) {
                    run.3 = DIRECT;
                } else {
                    pos = pos.next_multiple_of(DIRECT_ALIGN);
                    run.3 = pos;
                    pos += run.2;
                }
                of_child.push(p);
            }
            pieces.push(of_child);
        }
        let base = aligned_start(run_buf, pos);
        let buf = &mut run_buf[base..];
        for (list, of_child) in runs.iter().zip(&pieces) {
            for ((_, _, len, start), p) in list.iter().zip(of_child) {
                if *start == DIRECT {
                    continue;
                }
                let mut at = *start;
                for bytes in p {
                    buf[at..at + bytes.len()].copy_from_slice(bytes);
                    at += bytes.len();
                }
                debug_assert_eq!(at, start + len);
            }
        }
        STAGED_BYTES.fetch_add(pos as u64, std::sync::atomic::Ordering::Relaxed);
        let buf = &run_buf[base..];
        let per_child: Vec<Vec<ColumnWrite>> = runs
            .iter()
            .zip(pieces)
            .map(|(list, of_child)| {
                list.iter()
                    .zip(of_child)
                    .map(|((r, off, len, start), p)| match *start {
                        DIRECT => (r.clone(), *off, p),
                        s => (r.clone(), *off, vec![&buf[s..s + *len]]),
                    })
                    .collect()
            })
            .collect();
        self.write_columns(&per_child, nblocks, txg)
    }

    /// The writers of [`write_blocks`](Self::write_blocks): one thread per
    /// child (this one takes child 0), then the per-block verdict.
    fn write_columns(
        &self,
        per_child: &[Vec<ColumnWrite>],
        nblocks: usize,
        txg: u64,
    ) -> Result<()> {
        let stop = std::sync::atomic::AtomicBool::new(false);
        // Per entry: did some leaf of the column take the write, and the
        // first error seen; or the power-loss error that stopped it.
        type Outcome = (
            Vec<(std::ops::Range<usize>, bool, Option<Error>, Vec<Arc<Leaf>>)>,
            Option<Error>,
        );
        let write_column = |child: usize, list: &[ColumnWrite]| -> Outcome {
            let leaves = usable_leaves(&self.children[child]);
            let mut res = Vec::with_capacity(list.len());
            for (r, off, pieces) in list {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return (res, Some(Error::PowerLost));
                }
                match on_column(&leaves, |l| l.write_pieces(pieces, *off)) {
                    Ok((ok, err, failed)) => res.push((r.clone(), ok, err, failed)),
                    Err(e) => {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        return (res, Some(e));
                    }
                }
            }
            (res, None)
        };
        let children: Vec<(usize, &[ColumnWrite])> = per_child
            .iter()
            .enumerate()
            .map(|(c, l)| (c, l.as_slice()))
            .collect();
        let results: Vec<Outcome> = fanout::fan_out(&children, |&(c, list)| write_column(c, list))
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|()| {
                    (
                        Vec::new(),
                        Some(Error::invalid("vdev writer thread panicked")),
                    )
                })
            })
            .collect();
        let mut failed = vec![0usize; nblocks];
        let mut first_err: Vec<Option<Error>> = (0..nblocks).map(|_| None).collect();
        let mut missed = Vec::new();
        for (res, fatal) in results {
            if let Some(e) = fatal {
                return Err(e);
            }
            for (r, ok, err, leaves) in res {
                missed.extend(leaves);
                let text = err.as_ref().map(|e| e.to_string());
                let mut err = err;
                for b in r {
                    if !ok {
                        failed[b] += 1;
                    }
                    if first_err[b].is_none() {
                        // The error itself for the run's first block, its
                        // text for the others (errors are not Clone).
                        first_err[b] = err.take().or_else(|| text.clone().map(Error::invalid));
                    }
                }
            }
        }
        for (b, f) in failed.iter().enumerate() {
            if *f > self.redundancy() {
                return Err(first_err[b].take().unwrap_or_else(|| {
                    Error::invalid(format!(
                        "{}: too many devices unavailable to write",
                        self.name()
                    ))
                }));
            }
        }
        note_missed(&missed, txg);
        Ok(())
    }

    /// Flush every usable leaf, unless the flush policy says the cache is
    /// safe. A leaf whose flush fails loses txg `txg` (DTL); the flush fails
    /// only if more columns failed than the vdev survives.
    pub fn flush(&self, txg: u64) -> Result<()> {
        if self.flush == FlushPolicy::Ignore {
            return Ok(());
        }
        // The columns' leaves flush in parallel (a mirror's intent-log
        // commit waits for the slower side, not the sum).
        let cols: Vec<usize> = (0..self.children.len()).collect();
        let outcomes = fanout::try_fan_out(&cols, "device flush", |&c| {
            on_column(&usable_leaves(&self.children[c]), |l: &Leaf| l.flush())
        });
        self.settle(outcomes.into_iter(), txg, "no device to flush")
    }

    /// Run `op` on every usable leaf of the given columns. A leaf that fails
    /// records `txg` in its DTL; a column where no leaf succeeded is lost;
    /// more lost columns than the redundancy is an error (power loss always).
    fn on_columns<F: Fn(&Leaf) -> Result<()>>(
        &self,
        cols: impl Iterator<Item = (usize, F)>,
        txg: u64,
        what: &str,
    ) -> Result<()> {
        let outcomes = cols.map(|(child, op)| on_column(&usable_leaves(&self.children[child]), op));
        self.settle(outcomes, txg, what)
    }

    /// Tally the columns' outcomes of one operation: more lost columns than
    /// the redundancy is an error (power loss always); otherwise the leaves
    /// that failed lack `txg` (DTL).
    fn settle(
        &self,
        outcomes: impl Iterator<Item = Result<ColumnOutcome>>,
        txg: u64,
        what: &str,
    ) -> Result<()> {
        let mut failed = 0;
        let mut first_err = None;
        let mut missed = Vec::new();
        for o in outcomes {
            let (ok, err, leaves) = o?;
            missed.extend(leaves);
            if !ok {
                failed += 1;
            }
            if first_err.is_none() {
                first_err = err;
            }
        }
        if failed > self.redundancy() {
            return Err(
                first_err.unwrap_or_else(|| Error::invalid(format!("{}: {what}", self.name())))
            );
        }
        note_missed(&missed, txg);
        Ok(())
    }

    /// Health of the whole vdev as `zpool status` rolls it up.
    pub fn health(&self) -> &'static str {
        let dead = self.dead_columns();
        let degraded = self.leaves().iter().any(|l| !l.is_usable());
        if dead > self.redundancy() {
            if self.children.len() == 1 {
                let l = &self.children[0];
                if l.is_missing() {
                    return "UNAVAIL";
                }
                return match l.state() {
                    LeafState::Offline => "OFFLINE",
                    LeafState::Removed => "REMOVED",
                    _ => "FAULTED",
                };
            }
            "UNAVAIL"
        } else if dead > 0 || degraded {
            "DEGRADED"
        } else {
            "ONLINE"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::device::BlockDevice;
    use crate::vdev::sim::{SimDevice, SimRng, SimWorld};

    const DISK: u64 = 12 << 20;

    fn vdev(kind: TopKind, width: usize) -> (Arc<TopVdev>, Vec<SimDevice>, SimWorld) {
        let world = SimWorld::new();
        let devs: Vec<SimDevice> = (0..width)
            .map(|i| world.disk(&format!("d{i}"), DISK))
            .collect();
        let children = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let dev: Arc<dyn BlockDevice> = Arc::new(d.clone());
                Arc::new(Leaf::new(100 + i as u64, format!("d{i}"), dev))
            })
            .collect();
        let top = Arc::new(TopVdev {
            id: 0,
            guid: 1,
            kind,
            ashift: 9,
            asize: 4 << 20,
            ms_shift: 20,
            flush: FlushPolicy::Honor,
            children,
        });
        (top, devs, world)
    }

    /// Blocks with runs, gaps and short (padded) blocks, laid out for a
    /// vdev of `kind` and `width` columns.
    fn blocks_for(rng: &mut SimRng, kind: TopKind, width: usize) -> Vec<(u64, Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut off = 0u64;
        for i in 0..40u64 {
            let sectors = 1 + rng.below(64);
            let mut data = vec![0u8; (sectors * 512) as usize];
            rng.fill(&mut data);
            // Every fifth mirror block is allocated larger than it is
            // (padding); RAID-Z blocks take their parity and skip sectors.
            let asize = if !kind.ops().replicated() {
                Geometry {
                    kind,
                    width,
                    ashift: 9,
                }
                .asize(sectors * 512)
            } else {
                (sectors + u64::from(i % 5 == 0) * 2) * 512
            };
            out.push((off, data, asize));
            off += asize;
            if rng.chance(1, 4) {
                off += 512 * (1 + rng.below(8));
            }
        }
        out
    }

    #[test]
    fn write_blocks_lays_out_what_write_block_does() {
        let mut rng = SimRng::new(7);
        for (kind, width) in [
            (TopKind::Disk, 1),
            (TopKind::Mirror, 2),
            (TopKind::Mirror, 3),
            (TopKind::Raidz1, 3),
            (TopKind::Raidz2, 5),
        ] {
            let bl = blocks_for(&mut rng, kind, width);
            let (one, one_devs, _w1) = vdev(kind, width);
            let (batch, batch_devs, _w2) = vdev(kind, width);
            for (off, data, asize) in &bl {
                one.write_block(*off, data, *asize, 5).expect("write_block");
            }
            let list: Vec<BlockWrite> = bl.iter().map(|(o, d, a)| (*o, d.as_slice(), *a)).collect();
            let (staged, staged_devs, _w3) = vdev(kind, width);
            let mut buf = Vec::new();
            batch
                .write_blocks_staged(&list, 5, &mut buf, false)
                .expect("write_blocks");
            staged
                .write_blocks_staged(&list, 5, &mut buf, true)
                .expect("write_blocks staged");
            for ((a, b), c) in one_devs.iter().zip(&batch_devs).zip(&staged_devs) {
                assert!(a.image() == b.image(), "{kind:?} x{width}: images differ");
                assert!(
                    a.image() == c.image(),
                    "{kind:?} x{width}: staged images differ"
                );
            }
            // And each block reads back through the vdev.
            for (off, data, _) in &bl {
                let ok = |d: &[u8]| d == data.as_slice();
                let (got, _) = batch
                    .read_block(*off, data.len() as u64, 5, &ok, false)
                    .expect("read back");
                assert_eq!(&got, data);
            }
        }
    }

    #[test]
    fn write_blocks_survives_what_the_redundancy_allows() {
        let mut rng = SimRng::new(11);
        for (kind, width, stage) in [
            (TopKind::Mirror, 2, false),
            (TopKind::Mirror, 2, true),
            (TopKind::Raidz1, 3, false),
            (TopKind::Raidz1, 3, true),
        ] {
            let bl = blocks_for(&mut rng, kind, width);
            let list: Vec<BlockWrite> = bl.iter().map(|(o, d, a)| (*o, d.as_slice(), *a)).collect();
            let (top, devs, _w) = vdev(kind, width);
            devs[1].fail_writes(true);
            let mut buf = Vec::new();
            top.write_blocks_staged(&list, 9, &mut buf, stage)
                .expect("one failed column is within the redundancy");
            assert!(
                top.children[1].dtl_covers(9),
                "{kind:?}: failed leaf records the txg"
            );
            assert!(!top.children[0].dtl_covers(9));
            devs[0].fail_writes(true);
            assert!(
                top.write_blocks_staged(&list, 10, &mut buf, stage).is_err(),
                "{kind:?}: two failed columns are too many"
            );
        }
    }

    #[test]
    fn write_blocks_stops_at_power_loss() {
        let mut rng = SimRng::new(3);
        for (kind, stage) in [
            (TopKind::Mirror, false),
            (TopKind::Mirror, true),
            (TopKind::Raidz1, false),
            (TopKind::Raidz1, true),
        ] {
            let bl = blocks_for(&mut rng, kind, 3);
            let list: Vec<BlockWrite> = bl.iter().map(|(o, d, a)| (*o, d.as_slice(), *a)).collect();
            let (top, _devs, world) = vdev(kind, 3);
            world.cut_power_after(5);
            let mut buf = Vec::new();
            match top.write_blocks_staged(&list, 4, &mut buf, stage) {
                Err(Error::PowerLost) => {}
                other => panic!("{kind:?}: expected power loss, got {:?}", other.err()),
            }
        }
    }
}
