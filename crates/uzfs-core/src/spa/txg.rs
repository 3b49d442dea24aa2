//! Transaction groups: the commit protocol, the sync thread and the write
//! throttle (OpenZFS txg.c, spa.c:spa_sync, dsl_pool.c, dmu_tx.c delay).
//!
//! # States
//!
//! Writers add dirty buffers to the *open* txg. A sync closes it (the dirty
//! sets freeze, a new open txg starts at once, so writers are not blocked) and
//! writes it out:
//!
//! 1. Sync the root dataset's object set (new data, indirect and dnode
//!    blocks, then its object-set block).
//! 2. MOS pass 1: the MOS objects dirtied in open context.
//! 3. MOS passes 2..: store the dataset's new root pointer, the config and
//!    history if they changed, and append every queued allocation and free to
//!    the space maps. Appending allocates, which queues more entries, so
//!    repeat until a pass queues nothing. From pass 2 MOS blocks are written
//!    uncompressed, and a block born in this txg is rewritten in place (no
//!    committed txg can see it), so passes stop allocating and converge;
//!    `MAX_SYNC_PASSES` bounds it.
//! 4. Flush every vdev. Now every block of txg T is durable.
//! 5. If the config changed: labels L0/L2, flush, labels L1/L3, flush.
//! 6. Write the uberblock for T into slot `T % (nslots - 1)` of every label of
//!    every leaf, then flush. The flush returning is the commit point.
//!
//! # What a crash leaves
//!
//! * Before step 6's writes reach the media: T-1's uberblock is the newest
//!   valid one; everything T-1 references is intact, because T only wrote to
//!   space that was free in T-1 (frees of T-1 are not reused before T+1) or
//!   rewrote blocks born in T. Import finds T-1.
//! * During step 6: some labels hold T, others not, and a torn slot fails its
//!   checksum. Import takes the newest valid uberblock, T or T-1; both are
//!   complete because step 4 made T's blocks durable first.
//! * After step 6: T.
//!
//! # Locks
//!
//! `sync_lock` (one sync at a time) before `Pool::st` (allocator, config)
//! before `Pool::txg` (txg numbers). Objset locks are leaves.
//!
//! # Write throttle
//!
//! Dirty bytes (open + syncing) are bounded by `dirty_max`. Crossing
//! `dirty_sync_pct` of it wakes the sync thread early. Above `delay_min_pct`
//! each write is delayed by `delay_scale_ns * (dirty - min) / (max - dirty)`,
//! growing smoothly towards the limit; at the limit writers wait for a sync.

use super::metaslab::Allocator;
use super::space_map;
use super::{feature, gang, lock, Pool};
use crate::dmu::blkptr::{BlkPtr, Dva};
use crate::dmu::checksum::ChecksumType;
use crate::dmu::compress::{self, Compression};
use crate::dmu::objset::{BatchBlock, BlockReader, BlockWriter, TxgDirty, WriteParams};
use crate::error::{Error, Result};
use crate::spa::config::FeatureState;
use crate::spa::io::SpaIo;
use crate::spa::uberblock::Uberblock;
use crate::vdev::label;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAX_SYNC_PASSES: u32 = 32;
/// Dirty data is never held below this by a small cache (`Pool::dirty_limit`).
pub const DIRTY_FLOOR: u64 = 32 << 20;
/// Whole-record data that starts a sync early by default
/// (`Tunables::dirty_whole_sync`). Below it a txg's fixed cost (its MOS
/// passes, uberblocks and flushes, 2-7 ms here) would weigh on a stream;
/// above it, the stream's buffers in flight are fresh memory for longer
/// (each txg's are refilled only once it is synced, `dmu/bufpool.rs`).
pub const WHOLE_SYNC_DEFAULT: u64 = 64 << 20;

/// Tunables, each documented with its default and what goes wrong if set badly.
#[derive(Clone, Debug)]
pub struct Tunables {
    /// Seconds between syncs of a pool with dirty data (default 5, as
    /// zfs_txg_timeout). Larger: more data lost on a crash without fsync.
    pub txg_timeout: Duration,
    /// Bound on dirty bytes in memory (default 10% of RAM, or of the memory
    /// cgroup's limit when it is lower, at most 4 GiB, as
    /// zfs_dirty_data_max). Too small throttles writers; too large delays
    /// syncs and risks memory pressure. Dirty data is also held to half
    /// the cache's target `c` ([`Pool::dirty_limit`]), as OpenZFS's
    /// `arc_tempreserve_space` holds anonymous buffers to half of `arc_c`.
    pub dirty_max: u64,
    /// Percent of dirty_max that starts a sync early (default 50;
    /// OpenZFS's is 20: at 50, 16 KiB random rewrites of the same records
    /// coalesce in one txg, `UZFS_DIRTY_SYNC_PCT`).
    pub dirty_sync_pct: u64,
    /// Bytes of records written whole in the open txg (a stream,
    /// [`TxgDirty::whole`]) that start a sync (default
    /// [`WHOLE_SYNC_DEFAULT`], at most the `dirty_sync_pct` threshold,
    /// `UZFS_DIRTY_WHOLE_SYNC`). A stream loses nothing by being written
    /// sooner, and a sync started early overlaps the disk with the
    /// writer, leaves less for its fsync, and frees the record buffers
    /// the stream refills (`dmu/bufpool.rs`). Records written in part
    /// still wait for `dirty_sync_pct`, so random rewrites keep
    /// coalescing. A fixed size, not a share of the dirty limit: a
    /// tenth of this machine's 2.4 GiB held a 1 GiB stream's first 500
    /// MiB in fresh memory (bench/RESULTS.md, twenty-ninth session).
    pub dirty_whole_sync: u64,
    /// Percent of dirty_max at which writers start being delayed (default 60).
    pub delay_min_pct: u64,
    /// Delay scale in ns (default 500,000, as zfs_delay_scale).
    pub delay_scale_ns: u64,
    /// Longest single delay (default 100 ms).
    pub delay_max_ns: u64,
    /// Largest block cache (ARC) in bytes (default a quarter of RAM, or of
    /// the memory cgroup's limit when it is lower, at least 64 MiB); it
    /// gives memory back under pressure (`arc::SystemMemory`).
    pub cache_bytes: u64,
    /// Memory pressure never shrinks the block cache below this (`arc_min`,
    /// default 32 MiB, at most `cache_bytes`).
    pub cache_min_bytes: u64,
    /// Run a background sync thread (tests drive syncs by hand).
    pub sync_thread: bool,
    /// A space map is condensed (rewritten as just its allocated segments)
    /// once it holds more than this many entries and four times as many
    /// entries as segments (default 4096, i.e. 64 KiB of log). Smaller:
    /// more rewriting; larger: longer imports.
    pub condense_min_entries: u64,
    /// Microseconds a scrub or resilver sleeps after a block while
    /// foreground reads or writes are arriving, on top of the leaf queues'
    /// priorities (`vdev/queue.rs`), which already put scan I/O last and
    /// yield it I/O by I/O. Default 0; larger is gentler still (and tests
    /// use it to keep a scan running).
    pub scan_delay_us: u64,
    /// Milliseconds between checks of every leaf's labels (default
    /// `label_check::LABEL_CHECK_MS`); a leaf's new read or checksum
    /// errors bring the next check forward to the next txg.
    pub label_check_ms: u64,
    /// Block pointers a scan gathers before sorting and issuing them
    /// (default 200,000). Larger: longer sorted runs, more memory (~130 bytes
    /// each), more work redone after a crash.
    pub scan_batch_blocks: usize,
    /// Order a scan issues each batch in (default sorted by device
    /// address; the others exist for benchmarks).
    pub scan_order: super::scan::IssueOrder,
    /// This host's id (OpenZFS `hostid`, /etc/hostid): recorded in the
    /// labels and in multihost stamps (default 0: unknown; `multihost=on`
    /// then cannot be set). The library reads nothing itself: the daemon
    /// passes it in.
    pub hostid: u64,
    /// How often a `multihost=on` pool stamps its uberblock (default 1 s,
    /// as zfs_multihost_interval). Smaller: faster imports elsewhere, more
    /// label writes.
    pub mmp_interval: Duration,
    /// Stamp intervals an import watches a multihost pool for activity
    /// before taking it (default 10; OpenZFS zfs_multihost_import_intervals
    /// is 20). Smaller risks importing a pool whose writer only stalled.
    pub mmp_import_intervals: u32,
    /// Import read-only (`zpool import -o readonly=on`): no sync, no
    /// repair, no scan, no stamp; nothing is ever written to the devices
    /// and every change is refused with [`Error::ReadOnly`].
    pub readonly: bool,
    /// Bytes of intent-log records a dataset keeps in memory (`zil/`):
    /// past it the open txg is no longer logged and an fsync that needs it
    /// waits for it to commit. Default 64 MiB.
    pub zil_mem_max: u64,
    /// Whole blocks at least this large are logged by pointer (written
    /// once) rather than copied into the intent log, on pools without log
    /// devices and with `logbias=latency` (OpenZFS's
    /// `zfs_immediate_write_sz`). Default 32 KiB.
    pub zil_indirect_min: u64,
    /// Log writes a dataset keeps in flight at once (`zil/`, default 4;
    /// 1 writes one batch at a time). A commit that arrives while a batch
    /// is being written starts the next one instead of waiting for it;
    /// batches complete in chain order.
    pub zil_inflight: usize,
    /// `zpool import -m`: import even if a log device is missing (what
    /// its intent log held is lost).
    pub missing_log_ok: bool,
    /// Blocks one txg frees of destroyed datasets and snapshots at most
    /// (`dsl/async_destroy.rs`; OpenZFS zfs_async_block_max_blocks).
    /// Default 100,000 (12 GiB of 128 KiB blocks). Smaller: a huge destroy
    /// takes more txgs; larger: longer syncs while one runs.
    pub free_max_blocks: u64,
    /// Milliseconds one txg spends freeing at most (default 500, as
    /// OpenZFS zfs_free_min_time_ms is 1000 with longer txgs).
    pub free_max_ms: u64,
}

fn ram_bytes() -> u64 {
    use crate::arc::MemoryProbe;
    crate::arc::SystemMemory::detect().total()
}

impl Default for Tunables {
    fn default() -> Self {
        // RAM, or the memory cgroup's limit: read once.
        let ram = ram_bytes();
        Tunables {
            txg_timeout: Duration::from_secs(5),
            dirty_max: (ram / 10).min(4 << 30),
            dirty_sync_pct: 50,
            dirty_whole_sync: WHOLE_SYNC_DEFAULT,
            delay_min_pct: 60,
            delay_scale_ns: 500_000,
            delay_max_ns: 100_000_000,
            // The ARC: up to a quarter of RAM (or of the cgroup's limit),
            // at least 64 MiB (OpenZFS: half; the kernel's page cache above
            // FUSE holds file data too). It shrinks while the machine or
            // the cgroup is short of memory (arc.rs).
            cache_bytes: (ram / 4).max(64 << 20),
            cache_min_bytes: crate::arc::FLOOR_BYTES,
            sync_thread: true,
            condense_min_entries: 4096,
            scan_delay_us: 0,
            label_check_ms: super::label_check::LABEL_CHECK_MS,
            scan_batch_blocks: 200_000,
            scan_order: super::scan::IssueOrder::Sorted,
            hostid: 0,
            mmp_interval: Duration::from_secs(1),
            mmp_import_intervals: 10,
            readonly: false,
            zil_mem_max: 64 << 20,
            zil_indirect_min: crate::zil::INDIRECT_MIN as u64,
            zil_inflight: 4,
            missing_log_ok: false,
            free_max_blocks: 100_000,
            free_max_ms: 500,
        }
    }
}

/// The BlockWriter the DMU uses during one txg's sync.
pub(crate) struct SyncWriter<'a> {
    pub io: &'a SpaIo,
    pub alloc: &'a mut Allocator,
    pub log_space: &'a super::log_space::LogSpace,
    pub txg: u64,
    pub pass: u32,
    pub used: BTreeSet<&'static str>,
    /// The pool's name, for the suspension's log.
    pub name: &'a str,
    /// A failed write parks until `zpool clear` (the sync thread) instead
    /// of failing the sync (spa/suspend.rs).
    pub wait: bool,
    /// While a dataset with snapshots syncs: its latest snapshot's txg, and
    /// the blocks it let go of that the snapshot still holds (born at or
    /// before that txg), which go to its dead list instead of being freed
    /// (`dsl/snapshot.rs`).
    pub dead: Option<(u64, Vec<BlkPtr>)>,
}

impl SyncWriter<'_> {
    fn fits_in_place(&self, old: &BlkPtr, psize: u64, copies: u8) -> bool {
        if old.is_hole() || old.birth != self.txg || old.ndvas() != copies as usize {
            return false;
        }
        // A gang block born in this txg is rewritten into its own pieces
        // (`gang_rewrite`), which needs the same size.
        if old.dva.iter().any(|d| d.flags & gang::DVA_GANG != 0) {
            return old.psize as u64 == psize;
        }
        old.dva.iter().filter(|d| d.is_valid()).all(|d| {
            self.alloc
                .vdevs
                .get(d.vdev as usize)
                .is_some_and(|v| v.round(psize) <= d.asize)
        })
    }
}

impl SyncWriter<'_> {
    fn note_features(&mut self, comp: Compression, ck: ChecksumType) {
        match comp {
            Compression::Zstd => {
                self.used.insert(feature::ZSTD);
            }
            Compression::Lz4 => {
                self.used.insert(feature::LZ4);
            }
            Compression::Off => {}
        }
        if ck == ChecksumType::Blake3 {
            self.used.insert(feature::BLAKE3);
        }
    }

    /// Choose the DVAs for a new version of `old` holding `phys`: in place
    /// if allowed, else freshly allocated (freeing `old`), else, when no
    /// free extent is large enough, a gang block (`spa/gang.rs`). Returns
    /// the DVAs and whether the bytes are already written (a gang block is
    /// written piece by piece here).
    fn place(&mut self, old: &BlkPtr, phys: &[u8], copies: u8) -> Result<([Dva; 3], bool)> {
        let psize = phys.len() as u64;
        if self.fits_in_place(old, psize, copies) {
            if old.dva.iter().all(|d| d.flags & gang::DVA_GANG == 0) {
                return Ok((old.dva, false));
            }
            // Later sync passes rewrite in place, or they never converge.
            for d in old.dva.iter().filter(|d| d.is_valid()) {
                if d.flags & gang::DVA_GANG != 0 {
                    self.gang_rewrite(d.vdev, d.offset, phys, 0)?;
                } else {
                    self.write_extent(d, phys)?;
                }
            }
            return Ok((old.dva, true));
        }
        if !old.is_hole() {
            self.free_bp(old);
        }
        if self.log_space.wanted() {
            self.log_space.serve(self.alloc);
        }
        match self.alloc.alloc(psize, copies as usize) {
            Ok(got) => {
                let mut d = [Dva::default(); 3];
                for (i, g) in got.into_iter().enumerate().take(3) {
                    d[i] = g;
                }
                Ok((d, false))
            }
            Err(Error::NoSpace) => match self.write_gang(phys, copies) {
                Ok(d) => Ok((d, true)),
                // Short of space even in pieces (admission keeps this from
                // happening; the slop is its margin): use the previous
                // txg's frees now rather than fail the sync and suspend.
                // First the frees a scan parks (its batch is gathered
                // again), then the previous txg's.
                Err(Error::NoSpace) if self.alloc.holding_for_scan() => {
                    self.io.scan_fence.break_hold();
                    let n = self.alloc.break_scan_hold();
                    log::warn!(
                        "txg {}: out of space; the scan gives back the {} MiB of frees it parked and gathers its batch again",
                        self.txg,
                        n >> 20
                    );
                    self.place(&BlkPtr::default(), phys, copies)
                }
                // The log class's idle chunks come back before anything
                // costs a rewind.
                Err(Error::NoSpace) if self.log_space.release_idle(self.alloc) > 0 => {
                    log::warn!(
                        "txg {}: out of space; the intent log's idle space is taken back",
                        self.txg
                    );
                    self.place(&BlkPtr::default(), phys, copies)
                }
                Err(Error::NoSpace) if self.alloc.release_deferred_early() > 0 => {
                    log::warn!(
                        "txg {}: out of space; the previous txg's frees are reused early (a rewind to the txg before it is no longer possible)",
                        self.txg
                    );
                    self.place(&BlkPtr::default(), phys, copies)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Write `phys` as a gang block, one tree per copy, each copy on a
    /// vdev no other copy uses where there are several.
    fn write_gang(&mut self, phys: &[u8], copies: u8) -> Result<[Dva; 3]> {
        let n = self.alloc.vdevs.len();
        let mut d = [Dva::default(); 3];
        for c in 0..(copies as usize).min(3) {
            let mut order: Vec<usize> = (0..n).filter(|&v| !self.alloc.vdevs[v].log).collect();
            order.sort_by_key(|v| d[..c].iter().any(|x| x.vdev as usize == *v));
            let mut got = None;
            for v in order {
                let mut taken = Vec::new();
                match self.gang_tree(v, phys, 0, &mut taken) {
                    Ok((offset, asize)) => {
                        got = Some(Dva {
                            vdev: v as u32,
                            asize,
                            offset,
                            flags: gang::DVA_GANG,
                        });
                        break;
                    }
                    Err(e) => {
                        for t in &taken {
                            self.alloc.free(t, true);
                        }
                        if !matches!(e, Error::NoSpace) {
                            return Err(e);
                        }
                    }
                }
            }
            let Some(g) = got else {
                for x in &d[..c] {
                    self.free_dva(x, true, self.txg);
                }
                log::warn!(
                    "txg {}: cannot place a {}-byte block even in pieces: {} bytes allocatable, largest free extent {} bytes",
                    self.txg,
                    phys.len(),
                    self.alloc.allocatable_space(),
                    self.alloc.largest_free()
                );
                return Err(Error::NoSpace);
            };
            d[c] = g;
        }
        self.used.insert(feature::GANG_BLOCK);
        Ok(d)
    }

    /// Write `data` as a gang tree on vdev `v`: its pieces, then its header.
    /// Returns (header offset, bytes the whole tree takes); every extent
    /// allocated goes into `taken` (freed by the caller on failure).
    fn gang_tree(
        &mut self,
        v: usize,
        data: &[u8],
        depth: u32,
        taken: &mut Vec<Dva>,
    ) -> Result<(u64, u64)> {
        let hdr = self
            .alloc
            .alloc_on(v, gang::HEADER_PSIZE)
            .ok_or(Error::NoSpace)?;
        taken.push(hdr);
        let sector = 1usize << self.alloc.vdevs[v].ashift;
        let mut pieces = Vec::new();
        let mut total = hdr.asize;
        for part in data.chunks(gang::piece_len(data.len(), sector)) {
            let checksum = gang::piece_checksum(part);
            let (offset, asize, is_gang) = match self.alloc.alloc_on(v, part.len() as u64) {
                Some(p) => {
                    taken.push(p);
                    self.write_extent(&p, part)?;
                    (p.offset, p.asize, false)
                }
                None if part.len() <= sector || depth >= gang::WRITE_DEPTH => {
                    return Err(Error::NoSpace)
                }
                None => {
                    let (o, a) = self.gang_tree(v, part, depth + 1, taken)?;
                    (o, a, true)
                }
            };
            pieces.push(gang::Piece {
                offset,
                asize,
                psize: part.len() as u32,
                gang: is_gang,
                checksum,
            });
            total += asize;
        }
        let h = gang::encode_header(&pieces, hdr.offset);
        self.write_extent(&hdr, &h)?;
        Ok((hdr.offset, total))
    }

    /// Write `data` into the gang tree at `offset` on vdev `vdev` (born in
    /// this txg, the same size): the same pieces, new bytes and checksums.
    fn gang_rewrite(&mut self, vdev: u32, offset: u64, data: &[u8], depth: u32) -> Result<()> {
        let top = self.io.top(vdev)?;
        let mut pieces = gang::read_header(&top, offset, self.txg)?;
        let total: u64 = pieces.iter().map(|p| p.psize as u64).sum();
        if total != data.len() as u64 || depth > gang::WRITE_DEPTH {
            return Err(Error::Internal(format!(
                "gang block {vdev}:{offset:#x} rewritten with {} bytes, holds {total}",
                data.len()
            )));
        }
        let mut at = 0usize;
        for p in &mut pieces {
            let part = &data[at..at + p.psize as usize];
            at += p.psize as usize;
            if p.gang {
                self.gang_rewrite(vdev, p.offset, part, depth + 1)?;
            } else {
                let d = Dva {
                    vdev,
                    asize: p.asize,
                    offset: p.offset,
                    flags: 0,
                };
                self.write_extent(&d, part)?;
            }
            p.checksum = gang::piece_checksum(part);
        }
        let hdr = Dva {
            vdev,
            asize: self
                .alloc
                .vdevs
                .get(vdev as usize)
                .map_or(gang::HEADER_PSIZE, |v| v.round(gang::HEADER_PSIZE)),
            offset,
            flags: 0,
        };
        self.write_extent(&hdr, &gang::encode_header(&pieces, offset))
    }

    fn write_extent(&self, d: &Dva, bytes: &[u8]) -> Result<()> {
        let (io, txg) = (self.io, self.txg);
        io.suspension.io(self.name, "block write", self.wait, || {
            io.write_phys(std::slice::from_ref(d), bytes, txg)
        })
    }

    /// Return one DVA's space: a gang DVA's every extent (read from its
    /// headers).
    fn free_dva(&mut self, d: &Dva, immediate: bool, birth: u64) {
        if d.flags & gang::DVA_GANG == 0 {
            self.alloc.free(d, immediate);
            return;
        }
        match self
            .io
            .top(d.vdev)
            .and_then(|t| gang::extents(&t, d.offset, d.asize, birth))
        {
            Ok(ex) => {
                for (offset, asize) in ex {
                    let e = Dva {
                        vdev: d.vdev,
                        asize,
                        offset,
                        flags: 0,
                    };
                    self.alloc.free(&e, immediate);
                }
            }
            // Its headers cannot be read: the space stays allocated (zdb
            // reports it as leaked) rather than risk freeing live data.
            Err(e) => log::error!(
                "txg {}: cannot free gang block {}:{:#x}: {e}; {} bytes stay allocated",
                self.txg,
                d.vdev,
                d.offset,
                d.asize
            ),
        }
    }

    /// Compress, checksum, place and write one block: `write_bp` without
    /// offering it to the block cache.
    /// `known`: the Fletcher-4 of `data`, if taken as it was written.
    fn write_one(
        &mut self,
        old: &BlkPtr,
        data: &[u8],
        known: Option<&[u8; 32]>,
        wp: WriteParams,
    ) -> Result<BlkPtr> {
        let alg = if self.pass >= 2 {
            Compression::Off
        } else {
            wp.compress
        };
        let (comp, phys) = compress::compress(alg, data);
        self.note_features(comp, wp.checksum);
        let checksum = checksum(wp.checksum, data, &phys, known);
        let (dva, written) = self.place(old, &phys, wp.copies)?;
        let (io, txg) = (self.io, self.txg);
        if !written {
            io.suspension.io(self.name, "block write", self.wait, || {
                io.write_phys(&dva, &phys, txg)
            })?;
        }
        Ok(self.make_bp(dva, data.len(), phys.len(), comp, checksum, &wp))
    }

    fn make_bp(
        &self,
        dva: [Dva; 3],
        lsize: usize,
        psize: usize,
        comp: Compression,
        checksum: [u8; 32],
        wp: &WriteParams,
    ) -> BlkPtr {
        wp.bp(dva, lsize, psize, comp, checksum, self.txg)
    }
}

impl BlockWriter for SyncWriter<'_> {
    fn txg(&self) -> u64 {
        self.txg
    }
    fn waiting(&mut self) {
        if self.log_space.wanted() {
            self.log_space.serve(self.alloc);
        }
    }
    fn read_again(
        &mut self,
        err: Error,
        read: &mut dyn FnMut() -> Result<Arc<Vec<u8>>>,
    ) -> Result<Arc<Vec<u8>>> {
        // The first failure is the one already seen: the suspension parks
        // on it (with `wait`), and every resume reads again.
        let mut failed = Some(err);
        self.io.suspension.io(
            self.name,
            "read of a partly written record",
            self.wait,
            || match failed.take() {
                Some(e) => Err(e),
                None => read(),
            },
        )
    }
    fn note_feature(&mut self, name: &'static str) {
        self.used.insert(name);
    }

    fn dsize(&self, bp: &BlkPtr) -> u64 {
        self.alloc.dsize(bp)
    }

    /// A batch through the write pipeline (`zio/`): the CPU threads
    /// compress and checksum chunks ahead while this thread places them
    /// in order (allocation is cheap and must be deterministic) and the
    /// writes of the two chunks before are in flight, one writer per child
    /// device each (`TopVdev::write_blocks`). Chunks are at least 4 MiB,
    /// so small records still make large writes.
    fn write_batch(&mut self, items: &[BatchBlock<'_>], wp: WriteParams) -> Result<Vec<BlkPtr>> {
        const CHUNK: usize = 32;
        const CHUNK_BYTES: usize = 4 << 20;
        let alg = if self.pass >= 2 {
            Compression::Off
        } else {
            wp.compress
        };
        if items.len() <= CHUNK {
            return items
                .iter()
                .map(|b| self.write_one(&b.old, b.data, b.fletcher4, wp))
                .collect();
        }
        let mut out = Vec::with_capacity(items.len());
        let chunks = chunk_by_bytes(items, CHUNK, CHUNK_BYTES);
        let (io, txg, name, wait) = (self.io, self.txg, self.name, self.wait);
        let write = |placed: &Vec<([Dva; 3], std::borrow::Cow<'_, [u8]>)>| {
            let batch: Vec<([Dva; 3], &[u8])> =
                placed.iter().map(|(d, p)| (*d, p.as_ref())).collect();
            io.write_phys_batch(&batch, txg)
        };
        crate::zio::run(
            &chunks,
            |c| {
                c.iter()
                    .map(|b| {
                        let (comp, phys) = compress::compress(alg, b.data);
                        let ck = checksum(wp.checksum, b.data, &phys, b.fletcher4);
                        (comp, phys, ck)
                    })
                    .collect::<Vec<_>>()
            },
            |k, prepared| {
                let mut placed = Vec::with_capacity(prepared.len());
                for (b, (comp, phys, ck)) in chunks[k].iter().zip(prepared) {
                    self.note_features(comp, wp.checksum);
                    let (dva, written) = self.place(&b.old, &phys, wp.copies)?;
                    out.push(self.make_bp(dva, b.data.len(), phys.len(), comp, ck, &wp));
                    if !written {
                        placed.push((dva, phys));
                    }
                }
                Ok(placed)
            },
            write,
            // On the syncing thread: a failure beyond the redundancy parks
            // the sync here until `zpool clear` (spa/suspend.rs).
            |placed, e| {
                let mut failed = Some(e);
                io.suspension
                    .io(name, "block write", wait, || match failed.take() {
                        Some(e) => Err(e),
                        None => write(&placed),
                    })
            },
        )?;
        Ok(out)
    }

    fn write_bp(&mut self, old: &BlkPtr, data: &[u8], wp: WriteParams) -> Result<BlkPtr> {
        let bp = self.write_one(old, data, None, wp)?;
        // Indirect and object-set blocks: the next txg walks them again.
        // (Batched blocks are offered by their caller, without a copy.)
        self.io.written(&bp, &Arc::new(data.to_vec()), false);
        Ok(bp)
    }

    fn adopt(&mut self, old: &BlkPtr, new: &BlkPtr) {
        self.note_features(new.compress, new.checksum_type);
        if !old.is_hole() {
            self.free_bp(old);
        }
    }

    /// Written early by the intent log for this txg and not adopted: a
    /// log record may name it until this txg commits, so its space is not
    /// reused before (the free is deferred, although born in this txg).
    fn free_unadopted(&mut self, bp: &BlkPtr) {
        for d in bp.dva.iter().filter(|d| d.is_valid()) {
            self.free_dva(d, false, bp.phys_birth);
        }
    }

    fn free_bp(&mut self, bp: &BlkPtr) {
        if let Some((snap_txg, dead)) = &mut self.dead {
            if bp.birth <= *snap_txg {
                dead.push(*bp);
                return;
            }
        }
        let immediate = bp.birth == self.txg;
        for d in bp.dva.iter().filter(|d| d.is_valid()) {
            self.free_dva(d, immediate, bp.phys_birth);
        }
        // No snapshot holds it: its cached copy is dead too.
        self.io.block_freed(bp);
    }
}

/// Flush a top-level vdev for the txg being committed. A separate log
/// device holds nothing of the txg (its labels and uberblocks are copies
/// like any other): its failure must not fail the sync, only the log's own
/// writes, which fall back to the pool (`zil/`).
fn flush_unless_log(
    t: &crate::vdev::TopVdev,
    config: &super::config::PoolConfig,
    txg: u64,
) -> Result<()> {
    let log = config.vdev_tree.get(t.id as usize).is_some_and(|c| c.log);
    match t.flush(txg) {
        Err(e) if log && !matches!(e, Error::PowerLost) => {
            log::warn!("log device {}: flush failed: {e}", t.name());
            Ok(())
        }
        r => r,
    }
}

/// Block checksums computed by the sync, and where the sum taken when the
/// record was written is of these very bytes (stored as written, not
/// compressed), that one (`dmu/dirty_block.rs`).
pub static PRESUMMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The checksum of `phys`, what block `data` is stored as, of type `t`;
/// `known`, the Fletcher-4 of `data` if it was taken as `data` was
/// written, serves when `phys` is `data` itself (stored raw). Debug builds
/// check it again: a path that changed a dirty record and kept its sum
/// would write a block that never reads back.
fn checksum(t: ChecksumType, data: &[u8], phys: &[u8], known: Option<&[u8; 32]>) -> [u8; 32] {
    match known {
        Some(sum) if t == ChecksumType::Fletcher4 && std::ptr::eq(phys, data) => {
            debug_assert_eq!(
                *sum,
                crate::dmu::checksum::fletcher4(data),
                "a dirty record's sum is not of its bytes"
            );
            PRESUMMED.fetch_add(1, Ordering::Relaxed);
            *sum
        }
        _ => t.compute(phys),
    }
}

/// Cut a batch into chunks of at least `min` items and, where the items
/// are small, at least `bytes` bytes: each chunk is compressed by one
/// helper and written as one set of runs, so small blocks still make
/// large writes (32 blocks of 16 KiB were one 512 KiB write at a time).
fn chunk_by_bytes<'a, 'b>(
    items: &'a [BatchBlock<'b>],
    min: usize,
    bytes: usize,
) -> Vec<&'a [BatchBlock<'b>]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, b) in items.iter().enumerate() {
        size += b.data.len();
        if i + 1 - start >= min && size >= bytes {
            out.push(&items[start..=i]);
            (start, size) = (i + 1, 0);
        }
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Mark the features in `used` active in `config` (those enabled and not
/// yet active); returns whether any changed.
fn activate(config: &mut super::config::PoolConfig, used: BTreeSet<&'static str>) -> bool {
    let mut changed = false;
    for f in used {
        if let Some(e) = config.features.get_mut(f) {
            if e.state == FeatureState::Enabled {
                e.state = FeatureState::Active;
                changed = true;
            }
        }
    }
    changed
}

pub(crate) fn start_sync_thread(pool: &Arc<Pool>) {
    let weak = Arc::downgrade(pool);
    let h = std::thread::Builder::new()
        .name(format!("txg_sync:{}", pool.name))
        .spawn(move || loop {
            let Some(p) = weak.upgrade() else { return };
            {
                let mut t = lock(&p.txg);
                let deadline = t.last_sync + p.tun.txg_timeout;
                let now = Instant::now();
                if !t.shutdown && !t.want_sync && now < deadline && !p.over_sync_threshold() {
                    let wait = (deadline - now).min(Duration::from_millis(100));
                    t = p
                        .txg_cv
                        .wait_timeout(t, wait)
                        .map(|r| r.0)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
                if t.shutdown {
                    return;
                }
                let due = t.want_sync || Instant::now() >= t.last_sync + p.tun.txg_timeout;
                drop(t);
                if !(due || p.over_sync_threshold()) {
                    continue;
                }
            }
            if p.suspended().is_some() {
                // Nothing more can be committed; wake waiters so they see the error.
                let mut t = lock(&p.txg);
                t.want_sync = false;
                p.txg_cv.notify_all();
                drop(t);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            // The sync thread parks on a failed write until `zpool clear`
            // (spa/suspend.rs).
            let _ = p.sync_as(true);
            p.zed_check();
        })
        .ok();
    *lock(&pool.thread) = h;
}

impl Pool {
    /// Dirty bytes of the open and syncing txgs, every dataset and the MOS.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_and_whole_bytes().0
    }

    /// The most dirty data the open and syncing txgs may hold now:
    /// `dirty_max`, and at most half the cache's target `c` (at least
    /// [`DIRTY_FLOOR`]), so a small `arc_max` bounds the daemon's memory
    /// whole (cache plus dirty data) and memory pressure that shrinks the
    /// cache shrinks the dirty allowance with it. OpenZFS counts dirty
    /// buffers in the ARC and refuses to let them pass half of `arc_c`.
    pub fn dirty_limit(&self) -> u64 {
        let c = self.io.cache.target_bytes();
        if c == 0 {
            return self.tun.dirty_max.max(1);
        }
        self.tun.dirty_max.min((c / 2).max(DIRTY_FLOOR)).max(1)
    }

    /// Dirty bytes ([`Pool::dirty_bytes`]) and the bytes of records the
    /// open txg took written whole, over all datasets, in one pass.
    fn dirty_and_whole_bytes(&self) -> (u64, u64) {
        let (dirty, whole) = self
            .dsl
            .list
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|d| d.os.dirty_and_whole_bytes())
            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
        (dirty + self.mos.dirty_bytes(), whole)
    }

    /// A txg should start now: dirty data past its threshold, records
    /// written whole past theirs (a stream, `dirty_whole_sync`), or
    /// the intent log short of space (`LogSpace::pressed`).
    fn over_sync_threshold(&self) -> bool {
        let (dirty, whole) = self.dirty_and_whole_bytes();
        self.sync_due(dirty, whole)
    }

    /// [`Pool::over_sync_threshold`] for figures the caller already read.
    fn sync_due(&self, dirty: u64, whole: u64) -> bool {
        let sync_at = self.dirty_limit() * self.tun.dirty_sync_pct / 100;
        let whole_at = self.tun.dirty_whole_sync.min(sync_at);
        dirty > sync_at || whole > whole_at || self.log_space.pressed()
    }

    fn has_pending_changes(&self) -> bool {
        // A sync holds `st` from its start to its end (for good while it
        // is parked on a failed I/O, until `zpool clear`), so the open txg
        // has no config or history changes then: whatever was set before
        // the sync took `st` is that sync's. Only wait for `st` when no
        // sync is running (a short holder).
        let st = match self.st.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if lock(&self.txg).syncing.is_some() => None,
            Err(std::sync::TryLockError::WouldBlock) => Some(lock(&self.st)),
        };
        st.is_some_and(|st| st.config_dirty || !st.history_pending.is_empty())
            || self
                .io
                .tops()
                .iter()
                .flat_map(|t| t.leaves())
                .chain(self.io.spares())
                .any(|l| l.config_dirty.load(Ordering::Relaxed))
            || self
                .dsl_pool()
                .datasets()
                .iter()
                .any(|d| !d.os.open_is_empty())
            || *lock(&self.dsl.dirty)
            || !lock(&self.dsl.doomed).is_empty()
            || !lock(&self.dsl.freeing).entries.is_empty()
            || !lock(&self.dsl.tasks).is_empty()
            || !self.mos.open_is_empty()
            || self.frees_wanted.load(Ordering::Relaxed) > lock(&self.txg).synced
    }

    /// Sync the open txg now and wait for it to commit. Returns the txg.
    /// A write that fails beyond redundancy fails the sync and suspends
    /// the pool for good (the sync thread parks instead, `sync_as`).
    pub fn sync(&self) -> Result<u64> {
        self.sync_as(false)
    }

    /// [`Pool::sync`]; `wait`: a failed write parks the sync until `zpool
    /// clear` resumes it (spa/suspend.rs).
    pub(crate) fn sync_as(&self, wait: bool) -> Result<u64> {
        let _g = self.sync_guard()?;
        // Recycled record buffers count within the dirty limit: the pool
        // may hold what the dirty data leaves of it as this sync starts
        // (about the txg it is about to write, whose buffers it takes),
        // and gives them back once a txg passes without a writer asking
        // (`dmu/bufpool.rs`).
        self.io
            .bufs
            .set_cap(self.dirty_limit().saturating_sub(self.dirty_bytes()));
        self.io.bufs.synced();
        if let Some(why) = self.suspended() {
            return Err(Error::suspended(&self.name, &why));
        }
        let wanted = {
            let t = lock(&self.txg);
            t.synced == 0 || t.wanted > t.synced
        };
        if !wanted && !self.has_pending_changes() {
            // Nothing to commit frees log space either: without this a
            // refused borrow kept `LogSpace::pressed` up and the sync
            // thread spinning on an idle pool.
            self.log_space.forget_refusal();
            let mut t = lock(&self.txg);
            t.want_sync = false;
            t.last_sync = Instant::now();
            self.txg_cv.notify_all();
            return Ok(t.synced);
        }
        let r = self.sync_locked(wait);
        // Suspend before the txg stops being "syncing", so no waiter can
        // see it neither syncing nor failed.
        if let Err(e) = &r {
            self.io
                .suspension
                .fail(&self.name, &format!("the sync failed: {e}"));
        }
        lock(&self.txg).syncing = None;
        self.txg_cv.notify_all();
        // What admin commands see during the next sync.
        let _ = self.published();
        r
    }

    fn sync_locked(&self, wait: bool) -> Result<u64> {
        // Close the open txg: wait for the operations holding it to finish
        // (dmu/tx.rs), then freeze every object set and open the next txg
        // while the gate is shut, so no operation straddles the two.
        let quiesced = self.mos.gate().quiesce();
        // Fail-stop: an operation that broke off half done poisoned the
        // open txg; nothing more may commit (the pool suspends, below).
        if let Some(why) = self.mos.gate().poisoned() {
            return Err(Error::Internal(why));
        }
        let txg = {
            let mut t = lock(&self.txg);
            let txg = t.open;
            t.open += 1;
            t.syncing = Some(txg);
            txg
        };
        let frozen = self.dsl_pool().freeze(txg);
        let mos_dirty = self.mos.freeze(txg + 1);
        drop(quiesced);
        let mut st = lock(&self.st);
        let st = &mut *st;
        // Leaves that cannot take this txg's writes lack it (DTL); changed
        // leaf states and DTLs go into this txg's config.
        let tops_now = self.io.tops();
        let spares_now = self.io.spares();
        let mut leaf_dirty = false;
        for l in tops_now.iter().flat_map(|t| t.leaves()) {
            if !l.is_usable() {
                l.dtl_open(txg);
            }
            leaf_dirty |= l.config_dirty.swap(false, Ordering::Relaxed);
        }
        for l in &spares_now {
            leaf_dirty |= l.config_dirty.swap(false, Ordering::Relaxed);
        }
        if leaf_dirty || st.config_dirty {
            let caches = self.io.cache_leaves();
            super::refresh_vdev_config(&mut st.config, &tops_now, &spares_now, &caches);
            st.config_dirty = true;
        }
        let mut w = SyncWriter {
            io: &self.io,
            alloc: &mut st.alloc,
            log_space: &self.log_space,
            txg,
            pass: 1,
            used: BTreeSet::new(),
            name: &self.name,
            wait,
            dead: None,
        };
        let t_start = Instant::now();
        // The dataset layer: the datasets, the MOS's first pass and the
        // layer's changes for the second (dsl/sync.rs).
        let on = |f: &str| {
            st.config
                .features
                .get(f)
                .is_some_and(|e| e.state != FeatureState::Disabled)
        };
        let args = crate::dsl::sync::DslSyncArgs {
            mos_dirty: &mos_dirty,
            queue_obj: st.dir.freeing,
            dsl_obj: st.dir.dsl,
            features: crate::dsl::sync::DslFeatures {
                records: on(super::feature::DSL_RECORDS),
                dirs: on(super::feature::DSL_DIRS),
                async_destroy: on(super::feature::ASYNC_DESTROY),
            },
        };
        let mut dsl = self.dsl_pool().sync(&mut w, frozen, args)?;
        let (data_bytes, t_data) = (dsl.data_bytes, dsl.t_data);
        let mut mos_bp = dsl.mos_bp;
        // Features first used by this txg become active in its config.
        st.config_dirty |= activate(&mut st.config, std::mem::take(&mut w.used));
        let config_dirty = st.config_dirty;
        if config_dirty {
            st.config.txg = txg;
        }
        let mut pass = 2;
        loop {
            if pass > MAX_SYNC_PASSES {
                return Err(Error::invalid(format!("txg {txg} sync did not converge")));
            }
            w.pass = pass;
            let mut extra = TxgDirty::new(txg);
            if pass == 2 {
                // Pass 2 starts from the dataset layer's changes.
                extra = std::mem::take(&mut dsl.extra);
                if config_dirty {
                    let bytes = serde_json::to_vec(&st.config)
                        .map_err(|e| Error::invalid(e.to_string()))?;
                    self.mos
                        .replace_in_sync(&mut extra, st.dir.config, 0, &bytes)?;
                }
                self.condense_space_maps(&mut w, &mut extra, &st.config)?;
                let hist: String = st.history_pending.drain(..).collect();
                if !hist.is_empty() {
                    let at = self.mos.synced_dnode(st.dir.history)?.size;
                    self.mos
                        .write_in_sync(&mut extra, st.dir.history, at, hist.as_bytes())?;
                }
            }
            for v in &mut w.alloc.vdevs {
                for ms in &mut v.metaslabs {
                    if ms.pending.is_empty() {
                        continue;
                    }
                    let entries = std::mem::take(&mut ms.pending);
                    let at = match extra.objs.get(&ms.sm_obj).and_then(|o| o.size) {
                        Some(s) => s,
                        None => self.mos.synced_dnode(ms.sm_obj)?.size,
                    };
                    self.mos.write_in_sync(
                        &mut extra,
                        ms.sm_obj,
                        at,
                        &space_map::encode(&entries),
                    )?;
                }
            }
            if extra.is_empty() {
                break;
            }
            mos_bp = self.mos.sync_pass(&mut w, &extra)?;
            pass += 1;
        }
        let late_features = std::mem::take(&mut w.used);
        // Step 4: every block of this txg durable before any label points at it.
        let tops = self.io.tops();
        let t_flush0 = Instant::now();
        let sus = &self.io.suspension;
        for t in &tops {
            sus.io(&self.name, "cache flush", wait, || {
                flush_unless_log(t, &st.config, txg)
            })?;
        }
        log::debug!(
            "pool '{}' txg {txg}: {} MiB dirty, data {:?}, mos {:?}, flush {:?}",
            self.name,
            data_bytes >> 20,
            t_data,
            t_flush0 - t_start - t_data,
            t_flush0.elapsed()
        );
        if config_dirty {
            self.write_labels(&st.config, &tops, txg)?;
        }
        let ub = Uberblock {
            txg,
            guid_sum: st.config.guid_sum(),
            timestamp: super::scan::now_secs(),
            rootbp: mos_bp,
            pool_guid: self.guid,
            mmp: self.mmp_stamp(),
        };
        // A leaf that fails here keeps an older uberblock, which import
        // passes over for the newest; the txg needs one good copy.
        sus.io(&self.name, "uberblock write", wait, || {
            let mut ub_written = 0;
            for t in &tops {
                let slot = label::ub_slot_size(t.ashift);
                for c in t.leaves().iter().filter(|c| c.is_usable()) {
                    for off in label::label_offsets(c.dev.size()) {
                        let at = off + label::ub_txg_slot(txg, slot);
                        match c.write_raw(&ub.encode(slot as usize, at), at) {
                            Ok(()) => ub_written += 1,
                            Err(Error::PowerLost) => return Err(Error::PowerLost),
                            Err(_) => {}
                        }
                    }
                }
            }
            if ub_written == 0 {
                return Err(Error::invalid(format!(
                    "txg {txg}: no device took the uberblock"
                )));
            }
            Ok(())
        })?;
        for t in &tops {
            sus.io(&self.name, "cache flush", wait, || {
                flush_unless_log(t, &st.config, txg)
            })?;
        }
        // Committed.
        st.alloc.sync_done();
        self.log_space.rebalance(&mut st.alloc);
        // A log device that came back (zpool clear, online) is used again.
        for v in self.log_space.avoided() {
            if self.io.top(v).is_ok_and(|t| t.is_functional()) {
                self.log_space.set_avoid(v, false, None);
            }
        }
        self.snapshot_space(&st.alloc);

        st.config_dirty = false;
        // A feature first used in a later pass (a gang block of metadata)
        // is recorded by the next txg's config: this one's was written in
        // pass 2.
        st.config_dirty |= activate(&mut st.config, late_features);
        st.ub = Some(ub);
        {
            // The datasets' new trees go live with the gate shut, so no
            // operation holding the txg sees its blocks move (objset.rs).
            let _q = self.mos.gate().quiesce();
            self.dsl_pool().sync_done(&dsl);
        }
        self.mos.sync_done();
        // The buffers this txg gave for reuse are no longer its dirty
        // bytes (`dmu/bufpool.rs`).
        self.io.bufs.released();
        let mut t = lock(&self.txg);
        t.synced = txg;
        t.syncing = None;
        t.want_sync = false;
        t.last_sync = Instant::now();
        self.txg_cv.notify_all();
        Ok(txg)
    }

    /// Condense long space maps (OpenZFS metaslab_condense): a metaslab whose
    /// log has grown far beyond its allocated segments gets a new space map
    /// holding exactly its allocated set as of this txg, the old one is freed
    /// and the metaslab array points at the new one, all in this txg.
    /// "Allocated" excludes deferred frees: they are free on disk already.
    /// Entries still pending for the metaslab are covered by the new map.
    fn condense_space_maps(
        &self,
        w: &mut SyncWriter<'_>,
        extra: &mut TxgDirty,
        config: &crate::spa::config::PoolConfig,
    ) -> Result<()> {
        use crate::dmu::dnode::{ot, ObjProps};
        use crate::spa::range_tree::RangeTree;
        use crate::spa::space_map::{SmEntry, SmKind, ENTRY_SIZE, SM_BLOCK_SIZE};
        for (v, va) in w.alloc.vdevs.iter_mut().enumerate() {
            let Some(tc) = config.vdev_tree.get(v) else {
                continue;
            };
            for (i, ms) in va.metaslabs.iter_mut().enumerate() {
                let on_disk = self.mos.synced_dnode(ms.sm_obj)?.size / ENTRY_SIZE as u64;
                if on_disk <= self.tun.condense_min_entries {
                    continue;
                }
                let mut allocated = RangeTree::new();
                allocated.add(ms.start, ms.size);
                for (o, l) in ms.free.iter() {
                    allocated.remove(o, l);
                }
                // The log class's loans are free on disk (log_space.rs).
                for (o, l) in self.log_space.lent_on(v as u32) {
                    if o >= ms.start && o < ms.start + ms.size {
                        allocated.remove(o, l);
                    }
                }
                for &(o, l) in ms.pending_frees() {
                    if !allocated.remove(o, l) {
                        return Err(Error::invalid(format!(
                            "metaslab {i} of vdev {v}: deferred free [{o:#x}+{l:#x}] is not allocated"
                        )));
                    }
                }
                if on_disk <= 4 * allocated.len() as u64 {
                    continue;
                }
                let entries: Vec<SmEntry> = allocated
                    .iter()
                    .map(|(offset, len)| SmEntry {
                        kind: SmKind::Alloc,
                        offset,
                        len,
                    })
                    .collect();
                let new_sm = self.mos.create_in_sync(
                    extra,
                    ot::SPACE_MAP,
                    SM_BLOCK_SIZE,
                    &ObjProps::METADATA,
                )?;
                if !entries.is_empty() {
                    self.mos
                        .write_in_sync(extra, new_sm, 0, &space_map::encode(&entries))?;
                }
                extra.free_object(ms.sm_obj);
                self.mos
                    .write_in_sync(extra, tc.ms_array, i as u64 * 8, &new_sm.to_le_bytes())?;
                ms.sm_obj = new_sm;
                ms.pending.clear();
            }
        }
        Ok(())
    }

    /// Write the config to every leaf's labels, even half then odd half.
    pub(crate) fn write_labels(
        &self,
        config: &super::config::PoolConfig,
        tops: &[Arc<crate::vdev::TopVdev>],
        txg: u64,
    ) -> Result<()> {
        for half in [[0usize, 2], [1, 3]] {
            for t in tops {
                for c in t.leaves().iter().filter(|c| c.is_usable()) {
                    let lc = super::config::LabelConfig {
                        pool: config.clone(),
                        top_guid: t.guid,
                        guid: c.guid,
                    };
                    let payload =
                        serde_json::to_vec(&lc).map_err(|e| Error::invalid(e.to_string()))?;
                    if let Err(e) = label::write_config(&*c.dev, &payload, &half) {
                        if matches!(e, Error::PowerLost) {
                            return Err(e);
                        }
                        c.dtl_add(txg);
                    }
                }
            }
            // Spares not in use and cache devices carry the config too, so
            // import finds them (a cache device's labels are outside its
            // slot ring).
            let spares = self.io.spares().into_iter().filter(|sp| {
                sp.is_usable()
                    && !tops
                        .iter()
                        .any(|t| t.leaves().iter().any(|l| Arc::ptr_eq(l, sp)))
            });
            let caches = self.io.cache_leaves().into_iter();
            for aux in spares.chain(caches.filter(|c| !c.is_missing())) {
                let lc = super::config::LabelConfig {
                    pool: config.clone(),
                    top_guid: 0,
                    guid: aux.guid,
                };
                let payload = serde_json::to_vec(&lc).map_err(|e| Error::invalid(e.to_string()))?;
                if let Err(Error::PowerLost) = label::write_config(&*aux.dev, &payload, &half) {
                    return Err(Error::PowerLost);
                }
                let _ = aux.flush();
            }
            for t in tops {
                flush_unless_log(t, config, txg)?;
            }
        }
        Ok(())
    }

    /// Ask the sync thread for a sync and wait until the current open txg
    /// has committed (or sync now if there is no thread).
    pub fn txg_wait_synced(&self) -> Result<u64> {
        debug_assert!(
            !crate::dmu::tx::held_any(),
            "waiting for a sync while holding a txg (would deadlock the freeze)"
        );
        if lock(&self.thread).is_none() {
            return self.sync();
        }
        // Everything done before this call is in the open txg or an earlier
        // one: wait for the open txg if it holds changes, else for the one
        // before it (being written out, or already committed). Never for
        // `synced` as read now: a sync that just failed has cleared its
        // `syncing` mark, and its txg is not committed (an fsync returned
        // success for a txg a power cut then lost; found by
        // tests/crash_concurrent.rs).
        // The open txg is read before the check: a txg that opened after
        // it holds nothing of the caller's, and waiting for it would hang
        // when it stays empty (found by tests/crash_concurrent.rs: a wait
        // for space's extra syncs raced with this check).
        let open_before = lock(&self.txg).open;
        let pending = self.has_pending_changes();
        let target = if pending {
            open_before
        } else {
            lock(&self.txg).open - 1
        };
        loop {
            // Lock order is `st` before `txg`: never ask for `st` (inside
            // `suspended`) while holding `txg`.
            if let Some(why) = self.suspended() {
                return Err(Error::suspended(&self.name, &why));
            }
            let mut t = lock(&self.txg);
            if t.synced >= target {
                return Ok(t.synced);
            }
            // Wake the sync thread only with news for it (as in
            // `throttle`): waiters notifying on every turn woke each other.
            let news = !t.want_sync || t.wanted < target;
            t.want_sync = true;
            t.wanted = t.wanted.max(target);
            if news {
                self.txg_cv.notify_all();
            }
            let _ = self.txg_cv.wait_timeout(t, Duration::from_millis(50));
        }
    }

    /// `txg_wait_synced` for a writer (`fsync`): on a suspended pool with
    /// `failmode=wait` it waits for `zpool clear` instead of failing.
    /// (Admin commands use `txg_wait_synced`: they never wait on a
    /// suspension.)
    pub fn txg_wait_synced_data(&self) -> Result<u64> {
        loop {
            match self.txg_wait_synced() {
                Err(e @ Error::Suspended { .. }) => {
                    if self.wait_out_suspension().is_some() {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    /// A writer meets a suspended pool: with `failmode=wait` and the sync
    /// parked, wait until `zpool clear` resumes it. Returns why the pool
    /// is still suspended (the writer's EIO), or `None` once it takes
    /// changes again.
    pub fn wait_out_suspension(&self) -> Option<String> {
        while let Some(why) = self.suspended() {
            if !self.io.suspension.wait_resumed() {
                return Some(why);
            }
        }
        None
    }

    /// The write throttle: delay or block the caller according to dirty data.
    pub fn throttle(&self, incoming: u64) -> Result<()> {
        debug_assert!(
            !crate::dmu::tx::held_any(),
            "throttled while holding a txg (would deadlock the freeze)"
        );
        let max = self.dirty_limit();
        let min = max * self.tun.delay_min_pct / 100;
        loop {
            if let Some(why) = self.suspended() {
                return Err(Error::suspended(&self.name, &why));
            }
            let (dirty, whole) = self.dirty_and_whole_bytes();
            // Only the writer that raises the request wakes the sync
            // thread: the others waiting at the limit below are woken by
            // the same notification, and when each of them notified
            // again, two writers at the limit woke each other back and
            // forth until the sync ended (a 512 MiB `arc_max` spent a
            // fifth of the daemon's CPU in the scheduler).
            if self.sync_due(dirty, whole) {
                let mut t = lock(&self.txg);
                if !t.want_sync {
                    t.want_sync = true;
                    drop(t);
                    self.txg_cv.notify_all();
                }
            }
            if dirty + incoming < max || lock(&self.thread).is_none() {
                // Recycled buffers no txg charges count within the limit
                // too: a writer that takes none (random writes) must not
                // find them beside a full limit of its own.
                self.io.bufs.fit(max.saturating_sub(dirty + incoming));
                if dirty > min {
                    let ns =
                        self.tun.delay_scale_ns.saturating_mul(dirty - min) / (max - dirty).max(1);
                    std::thread::sleep(Duration::from_nanos(ns.min(self.tun.delay_max_ns)));
                }
                return Ok(());
            }
            // At the limit: wait for the syncing txg to drain.
            let t = lock(&self.txg);
            let _ = self.txg_cv.wait_timeout(t, Duration::from_millis(20));
        }
    }

    /// Bytes of space new writes may still claim: what the allocator can
    /// hand out now (frees of the last two txgs are not reusable yet, so
    /// they do not count), less the slop reserve: 1/32 of the pool, at
    /// least 16 MiB or half of a tiny pool (OpenZFS `spa_slop_shift` = 5).
    /// The slop is what the sync itself, deletes, `zfs destroy` and property
    /// changes use on a full pool: they are never refused for space.
    pub fn writable_space(&self) -> u64 {
        let s = *lock(&self.space_snapshot);
        let slop = (s.size / 32).max((16u64 << 20).min(s.size / 2));
        s.allocatable.saturating_sub(slop)
    }

    /// Raw pool bytes as datasets see them (`zfs list`, `df`): deflated by
    /// the vdevs' RAID-Z ratio (`VdevAlloc::deflate`; a pool mixing vdev
    /// kinds uses their size-weighted mean).
    pub fn deflate_space(&self, raw: u64) -> u64 {
        let s = *lock(&self.space_snapshot);
        if s.size == 0 {
            return raw;
        }
        (raw as u128 * s.dsize as u128 / s.size as u128) as u64
    }

    /// A write was refused for space: if frees are waiting out their txgs,
    /// have the next syncs run (even with nothing else to commit) until
    /// they are allocatable. Returns whether any were pending.
    pub fn want_frees(&self) -> bool {
        let pending = self.pending_frees() > 0;
        if pending {
            // Frees of txg T are allocatable once T+1 has committed; the
            // open txg's frees are the newest that can matter.
            let until = lock(&self.txg).open + 1;
            self.frees_wanted.fetch_max(until, Ordering::Relaxed);
        }
        pending
    }

    /// Run `f` with txg commits paused: the on-disk state stays exactly the
    /// last committed txg while `f` runs (writers keep filling the open txg,
    /// throttled as usual). `zdb` on an imported pool uses this.
    pub fn with_syncs_paused<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        let _g = self.sync_guard()?;
        Ok(f())
    }

    /// The sync lock, for a change that must not overlap a sync (DSL and
    /// vdev changes). While the sync is parked on a failed I/O it is held
    /// until `zpool clear`; such a change is refused instead of waiting.
    pub(crate) fn sync_guard(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        // Everything that changes a pool's state or commits goes through
        // here: a read-only pool refuses it before anything changes.
        self.check_rw()?;
        self.lock_unless_parked(&self.sync_lock)
    }

    /// Lock `m`, one of the locks a sync parked on a failed I/O holds
    /// until `zpool clear` (`sync_lock`, `st`): while the sync is parked,
    /// an error saying so instead of waiting.
    pub(crate) fn lock_unless_parked<'a, T>(
        &self,
        m: &'a std::sync::Mutex<T>,
    ) -> Result<std::sync::MutexGuard<'a, T>> {
        loop {
            match m.try_lock() {
                Ok(g) => return Ok(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Ok(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if self.io.suspension.parked() {
                let why = self.suspended().unwrap_or_default();
                return Err(Error::suspended(&self.name, &why));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Export or destroy of a suspended pool is coming: a sync parked on a
    /// failed I/O gives up now (its txg is not committed), and writers
    /// held by `failmode=wait` get EIO, so filesystems can be unmounted.
    pub fn abandon_parked_sync(&self) {
        if self.suspended().is_some() {
            self.io.suspension.give_up();
        }
    }

    /// `close` ran (the sync thread is stopped): the pool serves nothing
    /// more, even when its last sync failed.
    pub fn is_closed(&self) -> bool {
        lock(&self.txg).shutdown
    }

    /// Stop the sync thread (after committing everything dirty). A sync
    /// parked on a failed I/O gives up: its txg is not committed.
    pub fn close(&self) -> Result<()> {
        self.stop_mmp();
        self.abandon_parked_sync();
        self.stop_scan_thread();
        // A read-only pool changed nothing and writes nothing.
        let r = if self.suspended().is_none() && !self.tun.readonly {
            self.sync().map(|_| ())
        } else {
            Ok(())
        };
        lock(&self.txg).shutdown = true;
        self.txg_cv.notify_all();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        self.io.cache.close_l2();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::sim::SimWorld;

    /// Chunks keep the batch's order, cover it exactly, and each but the
    /// last has at least `min` items and `bytes` bytes.
    #[test]
    fn chunks_cover_the_batch_in_order_and_are_large_enough() {
        let small = vec![0u8; 16 << 10];
        let big = vec![0u8; 128 << 10];
        for (n, d) in [
            (0usize, &small),
            (5, &small),
            (300, &small),
            (100, &big),
            (33, &big),
        ] {
            let items: Vec<BatchBlock<'_>> = (0..n)
                .map(|_| BatchBlock {
                    old: BlkPtr::default(),
                    data: d.as_slice(),
                    fletcher4: None,
                })
                .collect();
            let chunks = chunk_by_bytes(&items, 32, 4 << 20);
            assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), n);
            let mut at = items.as_ptr();
            for (k, c) in chunks.iter().enumerate() {
                assert_eq!(c.as_ptr(), at, "out of order");
                at = at.wrapping_add(c.len());
                if k + 1 < chunks.len() {
                    assert!(c.len() >= 32);
                    assert!(c.iter().map(|b| b.data.len()).sum::<usize>() >= 4 << 20);
                }
            }
        }
    }

    /// A waiter that saw changes pending is waiting for the open txg; if
    /// the sync thread then finds nothing pending it must still commit
    /// that txg (empty), or the waiter waits forever. Found as a hang of
    /// four processes filling a pool (`crates/uzfs/tests/fill.rs`): space
    /// admission's waits for syncs spun while the sync thread kept
    /// deciding there was nothing to do.
    #[test]
    fn a_wanted_txg_is_committed_even_when_empty() {
        let world = SimWorld::new();
        let tun = Tunables {
            txg_timeout: Duration::from_secs(3600),
            ..Tunables::default()
        };
        let (_d, pool) = crate::spa::sim_pool(&world, "w", 64 << 20, tun, Some(1)).expect("create");
        pool.txg_wait_synced().expect("settle");
        assert!(!pool.has_pending_changes());
        // The state a waiter leaves when its pending changes vanished
        // before the sync looked: the open txg wanted, nothing dirty.
        let want = {
            let mut t = lock(&pool.txg);
            t.wanted = t.open;
            t.want_sync = true;
            pool.txg_cv.notify_all();
            t.open
        };
        let start = Instant::now();
        while pool.last_txg() < want {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "txg {want} was wanted and never committed (synced {})",
                pool.last_txg()
            );
            {
                let mut t = lock(&pool.txg);
                t.want_sync = true;
                pool.txg_cv.notify_all();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        pool.close().expect("close");
    }
}
