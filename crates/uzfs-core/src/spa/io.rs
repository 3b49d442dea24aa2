//! The SPA's block I/O: reading a block pointer with verification and
//! self-healing, writing a block's physical bytes to its DVAs.
//!
//! # Self-healing read
//!
//! For each DVA (ditto copy) in turn, the top-level vdev reads and verifies
//! the block against the checksum in the block pointer, repairing bad
//! columns or mirror sides itself (`vdev/top.rs`). The first DVA that yields
//! a verified block wins, and is written back over the earlier DVAs that
//! could not produce one, so the next read finds them repaired. Only when no
//! DVA verifies does the read fail, and the error names the block. Writing a
//! repair is safe although it is an overwrite: it restores the exact bytes
//! the block pointer already vouches for.

use crate::arc::{BlockCache, Class};
use crate::dmu::blkptr::{BlkPtr, Dva, DVA_GANG, DVA_REMAPPED};
use crate::dmu::bufpool::BufPool;
use crate::dmu::compress;
use crate::dmu::objset::BlockReader;
use crate::dmu::tx;
use crate::error::{Error, Result};
use crate::vdev::{Leaf, ScanRepair, TopVdev};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub struct SpaIo {
    pub vdevs: RwLock<Vec<Arc<TopVdev>>>,
    /// Hot spares; one in use is also attached in some column.
    pub spares: RwLock<Vec<Arc<Leaf>>>,
    pub cache: BlockCache,
    /// Staging buffers for `write_phys_batch`, reused so their pages stay
    /// faulted in (two are in use while the sync thread pipelines).
    run_bufs: std::sync::Mutex<Vec<Vec<u8>>>,
    /// Whether the pool is suspended, and the sync parked on a failed I/O.
    pub suspension: super::suspend::Suspension,
    /// Device reads made by a thread holding a txg (should stay 0 for the
    /// POSIX layer's operations: they warm up before the hold).
    pub reads_under_hold: AtomicU64,
    /// Blocks found with no valid copy (`zpool status` "errors:").
    pub data_errors: DataErrors,
    /// Lets the sync take back the frees a scan parks (`spa/scan.rs`).
    pub scan_fence: super::scan::ScanFence,
    /// Freed space is not reused while a read that may repair in place is
    /// in flight (`metaslab::ReuseFence`; the pool's allocator shares it).
    pub reuse_fence: Arc<super::metaslab::ReuseFence>,
    /// The scan batch being issued, for frees to check against
    /// (`spa/scan_queue.rs`; the pool's allocator shares it).
    pub scan_queue: Arc<super::scan_queue::ScanQueue>,
    /// Written record buffers the cache does not keep, for the next
    /// writes to fill (`dmu/bufpool.rs`); the sync sets its bound.
    pub bufs: BufPool,
    /// Bytes of streamed file data the sync wrote and left uncached
    /// ([`CacheWritten::Never`]).
    pub written_uncached: AtomicU64,
    /// Partly written records: deferred, covered, filled (`dmu/partial.rs`).
    pub partial: crate::dmu::partial::Counters,
}

/// Blocks a read found with no valid copy: OpenZFS's "permanent errors"
/// (its errlog), what `zpool status` counts as data errors and what makes
/// it say applications may be affected. Every read goes through
/// `read_phys`, a scrub's too, so this sees them all. A completed scrub
/// forgets the blocks it did not find bad again (repaired since, or
/// freed). Kept in memory, bounded (`MAX`; the count stays right past it
/// only up to the bound): after an import the last scrub's error count
/// stands in until reads find the blocks again.
#[derive(Default)]
pub struct DataErrors {
    inner: std::sync::Mutex<DataErrorsInner>,
}

#[derive(Default)]
struct DataErrorsInner {
    /// Bumped at each scan start; a block's entry keeps the epoch it was
    /// last seen in.
    epoch: u64,
    scan_epoch: u64,
    /// (vdev, offset) of the block's first DVA -> epoch last seen.
    blocks: std::collections::BTreeMap<(u32, u64), u64>,
}

impl DataErrors {
    /// Entries kept at most.
    pub const MAX: usize = 100_000;

    fn lock(&self) -> std::sync::MutexGuard<'_, DataErrorsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, bp: &BlkPtr) {
        let Some(d) = bp.dva.iter().find(|d| d.is_valid()) else {
            return;
        };
        let mut g = self.lock();
        let epoch = g.epoch;
        if g.blocks.len() < Self::MAX || g.blocks.contains_key(&(d.vdev, d.offset)) {
            g.blocks.insert((d.vdev, d.offset), epoch);
        }
    }

    /// Blocks known to have no valid copy.
    pub fn count(&self) -> u64 {
        self.lock().blocks.len() as u64
    }

    /// A scrub starts (every block it finds bad is recorded from now on;
    /// `zpool clear` forgets none, as in OpenZFS).
    pub fn scrub_started(&self) {
        let mut g = self.lock();
        g.epoch += 1;
        g.scan_epoch = g.epoch;
    }

    /// A scrub completed: what it did not find again is gone.
    pub fn scrub_completed(&self) {
        let mut g = self.lock();
        let since = g.scan_epoch;
        g.blocks.retain(|_, e| *e >= since);
    }
}

impl SpaIo {
    /// Block `bp` was freed by a sync (no snapshot holds it): drop its
    /// cached copy ([`crate::arc::BlockCache::freed`]).
    pub fn block_freed(&self, bp: &BlkPtr) {
        if !bp.is_hole() {
            self.cache.freed(&cache_key(bp));
        }
    }

    pub fn new(vdevs: Vec<Arc<TopVdev>>, cache_bytes: u64, cache_min_bytes: u64) -> Self {
        SpaIo {
            vdevs: RwLock::new(vdevs),
            spares: RwLock::new(Vec::new()),
            cache: BlockCache::new(cache_bytes).with_min(cache_min_bytes),
            run_bufs: std::sync::Mutex::new(Vec::new()),
            data_errors: DataErrors::default(),
            scan_fence: Default::default(),
            suspension: Default::default(),
            reads_under_hold: AtomicU64::new(0),
            bufs: BufPool::new(0),
            reuse_fence: Default::default(),
            scan_queue: Default::default(),
            written_uncached: AtomicU64::new(0),
            partial: Default::default(),
        }
    }

    pub fn top(&self, id: u32) -> Result<Arc<TopVdev>> {
        self.vdevs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id as usize)
            .cloned()
            .ok_or_else(|| {
                Error::corrupt(
                    "block pointer",
                    format!("DVA names vdev {id}, which does not exist"),
                )
            })
    }

    pub fn spares(&self) -> Vec<Arc<Leaf>> {
        self.spares
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The leaves of the cache devices (labels, paths, I/O counters).
    pub fn cache_leaves(&self) -> Vec<Arc<Leaf>> {
        self.cache
            .l2_devices()
            .iter()
            .map(|d| d.leaf.clone())
            .collect()
    }

    pub fn tops(&self) -> Vec<Arc<TopVdev>> {
        self.vdevs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn check_dva(&self, dva: &Dva, psize: u32) -> Result<Arc<TopVdev>> {
        if dva.flags & DVA_REMAPPED != 0 {
            return Err(Error::Unsupported(
                "block is remapped (feature com.uzfs:block_remap), which this build cannot read"
                    .into(),
            ));
        }
        let top = self.top(dva.vdev)?;
        // A gang DVA addresses its header (spa/gang.rs checks the pieces).
        let len = if dva.flags & DVA_GANG != 0 {
            super::gang::HEADER_PSIZE
        } else {
            psize as u64
        };
        if dva.offset.checked_add(len).is_none_or(|e| e > top.asize) {
            return Err(Error::corrupt(
                "block pointer",
                format!(
                    "DVA {}:{:#x} lies past the end of the vdev",
                    dva.vdev, dva.offset
                ),
            ));
        }
        Ok(top)
    }

    /// Read the physical bytes of `bp`, verified, healing bad copies.
    pub fn read_phys(&self, bp: &BlkPtr) -> Result<Vec<u8>> {
        if bp.is_hole() {
            return Err(Error::invalid("read of a hole"));
        }
        let verify = |d: &[u8]| bp.checksum_type.compute(d) == bp.checksum;
        // From the read to its last repair, the space of `bp` cannot be
        // handed out again even if the block is freed meanwhile.
        let _no_reuse = self.reuse_fence.reading();
        let mut failed: Vec<(Arc<TopVdev>, Dva)> = Vec::new();
        let mut last_err = None;
        for dva in bp.dva.iter().filter(|d| d.is_valid()) {
            let top = match self.check_dva(dva, bp.psize) {
                Ok(t) => t,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let r = if dva.flags & DVA_GANG != 0 {
                super::gang::read(&top, dva.offset, bp.phys_birth).and_then(|d| {
                    if verify(&d) {
                        Ok((d, 0))
                    } else {
                        Err(Error::Checksum(
                            "gang block does not match its pointer".into(),
                        ))
                    }
                })
            } else {
                top.read_block(dva.offset, bp.psize as u64, bp.phys_birth, &verify, false)
            };
            match r {
                Ok((data, _)) => {
                    // A gang copy is not one extent: it heals from its own
                    // vdev's redundancy only (spa/gang.rs).
                    for (t, d) in failed
                        .iter()
                        .filter(|(t, d)| d.flags & DVA_GANG == 0 && !t.readonly())
                    {
                        // Best effort: a failed repair leaves the copy bad, counted.
                        let _ = t.write_block(d.offset, &data, d.asize, bp.phys_birth);
                    }
                    return Ok(data);
                }
                Err(Error::PowerLost) => return Err(Error::PowerLost),
                Err(e) => {
                    last_err = Some(e);
                    failed.push((top, *dva));
                }
            }
        }
        self.data_errors.record(bp);
        Err(Error::Checksum(format!(
            "no valid copy of block [{bp}]{}",
            last_err
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        )))
    }

    /// Scrub or resilver every copy of `bp` (see `TopVdev::scan_block`).
    pub fn scan_bp(&self, bp: &BlkPtr, scrub: bool) -> Result<ScanRepair> {
        let verify = |d: &[u8]| bp.checksum_type.compute(d) == bp.checksum;
        let mut total = ScanRepair::default();
        let mut good = false;
        for dva in bp.dva.iter().filter(|d| d.is_valid()) {
            let Ok(top) = self.check_dva(dva, bp.psize) else {
                continue;
            };
            let r = if dva.flags & DVA_GANG != 0 {
                super::gang::scan(&top, dva.offset, bp.phys_birth, scrub)?
            } else {
                top.scan_block(dva.offset, bp.psize as u64, bp.phys_birth, &verify, scrub)?
            };
            total.repaired += r.repaired;
            good |= !r.unrecoverable;
        }
        if !good {
            // One DVA may still be rebuilt from another: the ordinary read
            // path heals whole copies.
            good = self.read_phys(bp).is_ok();
        }
        total.unrecoverable = !good;
        Ok(total)
    }

    /// Write several blocks born in `txg` (each: its DVAs and physical
    /// bytes), grouped per top-level vdev so each vdev writes its children
    /// in parallel ([`TopVdev::write_blocks`]).
    pub fn write_phys_batch(&self, blocks: &[([Dva; 3], &[u8])], txg: u64) -> Result<()> {
        let mut per_top: Vec<(u32, Vec<crate::vdev::BlockWrite>)> = Vec::new();
        for (dvas, phys) in blocks {
            for d in dvas.iter().filter(|d| d.is_valid()) {
                let i = match per_top.iter().position(|(v, _)| *v == d.vdev) {
                    Some(i) => i,
                    None => {
                        per_top.push((d.vdev, Vec::new()));
                        per_top.len() - 1
                    }
                };
                per_top[i].1.push((d.offset, *phys, d.asize));
            }
        }
        let mut buf = self
            .run_bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let r = per_top
            .iter()
            .try_for_each(|(vdev, list)| self.top(*vdev)?.write_blocks(list, txg, &mut buf));
        if buf.len() <= 64 << 20 {
            let mut pool = self.run_bufs.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < 4 {
                pool.push(buf);
            }
        }
        r
    }

    /// Write physical bytes to every DVA of a block born in `txg`.
    pub fn write_phys(&self, dvas: &[Dva], phys: &[u8], txg: u64) -> Result<()> {
        for d in dvas.iter().filter(|d| d.is_valid()) {
            self.top(d.vdev)?
                .write_block(d.offset, phys, d.asize, txg)?;
        }
        Ok(())
    }
}

/// The block cache's key for `bp`: its first copy's address and the first
/// half of its checksum, so a block rewritten in place is a new key.
fn cache_key(bp: &BlkPtr) -> crate::arc::Key {
    let mut ck = [0u8; 16];
    ck.copy_from_slice(&bp.checksum[..16]);
    (bp.dva[0].vdev, bp.dva[0].offset, ck)
}

/// The compressed ARC: file data whose block is compressed on disk is held
/// as it is there (its physical bytes, a fraction of the logical size for
/// compressible data) and decompressed on every use, as OpenZFS's ARC
/// holds `b_pabd`. Metadata (indirect blocks, dnodes, directories) is
/// held decompressed: every lookup walks it, and it is small. A cached
/// value is decompressed exactly when its length is the logical size
/// (a block that did not shrink below it is stored uncompressed).
/// [`set_compressed_arc`]`(false)` holds everything decompressed
/// (OpenZFS's `zfs_compressed_arc_enabled`).
fn held_compressed(bp: &BlkPtr, class: Class) -> bool {
    COMPRESSED_ARC.load(Ordering::Relaxed)
        && class == Class::Data
        && bp.compress != compress::Compression::Off
}

static HAND_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether file data read whole into the kernel's page cache above a
/// mount leaves the cache (default on: one copy, docs/ARCHITECTURE.md).
/// The binary maps `UZFS_ARC_HAND_OFF=0` here.
pub fn set_hand_off(on: bool) {
    HAND_OFF.store(on, Ordering::Relaxed);
}

static COMPRESSED_ARC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether blocks read from now on keep file data compressed in the
/// cache (default on). The binary maps `UZFS_COMPRESSED_ARC=0` here; the
/// engine reads no environment.
pub fn set_compressed_arc(on: bool) {
    COMPRESSED_ARC.store(on, Ordering::Relaxed);
}

thread_local! {
    /// Records this thread decompressed from the compressed ARC (or a
    /// cache device): what its hits cost ([`decompressions_here`]).
    static DECOMPRESSIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Records the calling thread has decompressed from the compressed ARC
/// (read-ahead threads count their own).
pub fn decompressions_here() -> u64 {
    DECOMPRESSIONS.with(|c| c.get())
}

thread_local! {
    /// The record this thread decompressed last. Reads that bypass the
    /// kernel's page cache (O_DIRECT) come in pieces smaller than a record,
    /// one after another on the same request thread: without this, eight
    /// 16 KiB reads of a 128 KiB record decompress it eight times (4 KiB
    /// sequential reads ran at 0.15x). OpenZFS's dbuf cache spares it
    /// that; a shared LRU of decompressed records was tried and cost 20%
    /// of random-read IOPS in locking and eviction (bench/RESULTS.md),
    /// one record per thread costs nothing. Keyed by address and
    /// checksum, so it can never be stale.
    static LAST_INFLATED: std::cell::RefCell<Option<(crate::arc::Key, Arc<Vec<u8>>)>> =
        const { std::cell::RefCell::new(None) };
}

/// A cached value as its reader wants it, the logical bytes.
fn inflate(bp: &BlkPtr, key: crate::arc::Key, v: Arc<Vec<u8>>) -> Result<Arc<Vec<u8>>> {
    let lsize = bp.lsize as usize;
    if v.len() == lsize {
        return Ok(v);
    }
    let last = LAST_INFLATED.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(k, _)| *k == key)
            .map(|(_, d)| d.clone())
    });
    if let Some(d) = last {
        return Ok(d);
    }
    DECOMPRESSIONS.with(|c| c.set(c.get() + 1));
    let d = Arc::new(compress::decompress(bp.compress, &v, lsize)?);
    LAST_INFLATED.with(|l| *l.borrow_mut() = Some((key, d.clone())));
    Ok(d)
}

/// Which file data written whole (a streaming writer's records,
/// `DirtyObj::streamed`) the sync keeps in the ARC.
///
/// The kernel's page cache above the mount holds those bytes and answers
/// re-reads without asking the daemon, so a cached copy is a second one.
/// The default is `Never`: written data is held once, by the kernel, and
/// its buffers are recycled (`dmu/bufpool.rs`). What that once cost, a
/// device read of the rest of a record at its first patch, is gone where
/// the kernel still holds the record (it is asked for it,
/// `zpl/pagecache.rs`) and where later writes cover the record within its
/// txg (the partial block needs nothing, `dmu/partial.rs`); bench/fs.sh,
/// whose fio drops the pages of the files it lays out, runs as fast
/// (bench/RESULTS.md, "one copy by default"). Only writes that come
/// through the kernel's cache are streamed (`objset::through_page_cache`):
/// O_DIRECT, a direct-I/O mount and `uzfs object put` have no other copy,
/// so what they write is kept. Blocks patched in part and all
/// metadata are always kept. `Always` keeps every written block, as
/// OpenZFS's ARC does (`UZFS_ARC_CACHE_WRITES=always`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheWritten {
    /// Keep every written block (OpenZFS's ARC does).
    Always,
    /// Never keep streamed data: one copy, in the kernel's page cache
    /// (default).
    Never,
}

static CACHE_WRITTEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set the policy for streamed writes (the binary maps
/// `UZFS_ARC_CACHE_WRITES=always|never` here).
pub fn set_cache_written(p: CacheWritten) {
    CACHE_WRITTEN.store(p == CacheWritten::Always, Ordering::Relaxed);
}

impl BlockReader for SpaIo {
    fn written(&self, bp: &BlkPtr, data: &Arc<Vec<u8>>, streamed: bool) {
        if bp.lsize as usize != data.len() {
            return;
        }
        let class = Class::of(bp.level, bp.obj_type);
        let kept = !streamed || class != Class::Data || CACHE_WRITTEN.load(Ordering::Relaxed);
        if kept {
            self.cache.insert(cache_key(bp), data.clone(), class);
        } else {
            self.written_uncached
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            self.bufs.give(data.clone());
        }
    }

    fn spare_buffer(&self, len: usize) -> Option<Vec<u8>> {
        // Keeping every written block, the sync gives the pool nothing:
        // the write path does not take its lock for each record.
        if CACHE_WRITTEN.load(Ordering::Relaxed) {
            return None;
        }
        self.bufs.take(len)
    }

    fn partial_event(&self, e: crate::dmu::partial::Event) {
        self.partial.count(e);
    }

    /// File data the kernel now holds whole leaves the cache, unless the
    /// cache holds it compressed (a fraction of the kernel's copy, and a
    /// re-read after the kernel drops its pages costs no device read).
    fn handed_off(&self, bp: &BlkPtr) {
        let class = Class::of(bp.level, bp.obj_type);
        if class == Class::Data && !held_compressed(bp, class) && HAND_OFF.load(Ordering::Relaxed) {
            self.cache.hand_off(&cache_key(bp));
        }
    }

    fn holds(&self, bp: &BlkPtr) -> bool {
        let key = cache_key(bp);
        tx::pinned(&key).is_some() || self.cache.contains(&key)
    }

    fn cached(&self, bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        let key = cache_key(bp);
        if let Some(v) = tx::pinned(&key) {
            return Some(v);
        }
        let v = self
            .cache
            .get_cached(&key, Class::of(bp.level, bp.obj_type))?;
        inflate(bp, key, v).ok()
    }

    fn read_bp(&self, bp: &BlkPtr) -> Result<Arc<Vec<u8>>> {
        let key = cache_key(bp);
        if let Some(v) = tx::pinned(&key) {
            return Ok(v);
        }
        let class = Class::of(bp.level, bp.obj_type);
        if let Some(v) = self.cache.get(&key, class) {
            let v = inflate(bp, key, v)?;
            tx::pin(key, &v);
            return Ok(v);
        }
        // An operation holding the open txg should have read this before
        // its hold (dmu/tx.rs, "What bounds a hold"): count it.
        if tx::held_any() {
            self.reads_under_hold.fetch_add(1, Ordering::Relaxed);
        }
        // Someone may be reading it already (the read-ahead, another
        // reader): wait for those bytes. If that read fails, read anew.
        let reading = match self.cache.begin_read(key) {
            crate::arc::inflight::Begun::Read(r) => r,
            crate::arc::inflight::Begun::Wait(w) => {
                if let Some(v) = w.wait() {
                    self.cache.count_iohit();
                    tx::pin(key, &v);
                    return Ok(v);
                }
                return self.read_bp_uncached(bp, key, class);
            }
        };
        let v = self.read_bp_uncached(bp, key, class)?;
        reading.done(v.clone());
        Ok(v)
    }
}

impl SpaIo {
    /// A block not cached: from a cache device or the pool, then cached.
    fn read_bp_uncached(
        &self,
        bp: &BlkPtr,
        key: crate::arc::Key,
        class: Class,
    ) -> Result<Arc<Vec<u8>>> {
        // A cache device may hold it, as the ARC held it (verified there;
        // anything wrong and the pool is read as if it held nothing).
        if let Some(v) = self.cache.l2_read(&key) {
            let lsize = bp.lsize as usize;
            if v.len() == lsize || (held_compressed(bp, class) && v.len() < lsize) {
                let v = Arc::new(v);
                self.cache.insert(key, v.clone(), class);
                let data = inflate(bp, key, v)?;
                tx::pin(key, &data);
                return Ok(data);
            }
        }
        let phys = self.read_phys(bp)?;
        if held_compressed(bp, class) && phys.len() < bp.lsize as usize {
            let phys = Arc::new(phys);
            let data = inflate(bp, key, phys.clone())?;
            self.cache.insert(key, phys, class);
            tx::pin(key, &data);
            return Ok(data);
        }
        let data = Arc::new(compress::decompress_owned(
            bp.compress,
            phys,
            bp.lsize as usize,
        )?);
        self.cache.insert(key, data.clone(), class);
        tx::pin(key, &data);
        Ok(data)
    }
}
