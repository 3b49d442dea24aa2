//! Object sets: a meta-dnode whose data is an array of dnodes, and the
//! copy-on-write machinery that turns a transaction group's dirty buffers into
//! new block trees.
//!
//! # Theory of operation
//!
//! An object set has three layers of state, searched top-down by readers:
//!
//! 1. `open`: the dirty buffers of the open txg. Writers land here.
//! 2. `syncing`: the frozen dirty buffers of the txg being written out
//!    (shared read-only with the sync thread through an `Arc`).
//! 3. the synced tree: `meta` (the meta-dnode) and the dnodes and block trees
//!    it reaches on disk. A dataset's object set publishes the tree its
//!    sync pass wrote only when the txg is committed (`sync_done`), with
//!    the pool's txg gate shut, in the same instant the syncing layer goes:
//!    so the tree and the layers an operation warmed up from before its
//!    hold are the ones it reads under the hold (`dmu/tx.rs`, "What bounds
//!    a hold"), and [`Objset::generation`] tells it when they changed. The
//!    MOS, synced in several passes that each build on the last, publishes
//!    each pass at once (its changes are made under `sync_lock`).
//!
//! Syncing a txg (`sync_pass`) walks every dirty object, writes its dirty
//! level-0 blocks through the [`BlockWriter`], rewrites every indirect block on
//! the path to the root, rewrites the dnode blocks of the meta-dnode that hold
//! changed dnodes, and finally writes the object-set block. Nothing already
//! referenced by a committed txg is overwritten: the writer allocates a new
//! location for every block whose old version was born in an earlier txg and
//! frees (defers) the old one. Only blocks born in the txg being synced may be
//! rewritten in place, which is how the MOS converges in a few passes (see
//! `spa/txg.rs`).
//!
//! Invariants (asserted in debug builds, checked on decode in all builds):
//! a non-hole child of an indirect block at level L has level L-1; the top
//! pointers of a dnode have level nlevels-1; fill counts sum up the tree.

use super::blkptr::{BlkPtr, BLKPTR_SIZE};
use super::changelog::{self, Change, ChangeLog, OpScope, LOG_HEADER_SIZE};
use super::checksum::ChecksumType;
use super::compress::Compression;
use super::dirty_block::DirtyBlock;
use super::dnode::{ot, DnodePhys, ObjProps, BONUS_SIZE, DNODE_SIZE};
use super::early_write::{EarlyWrite, Overrides};
use super::partial::{self, Ranges};
use super::traverse::{self, At, Kind, Next, Position, Visitor};
use super::tx::{Tx, TxgGate};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// Reads a block: verifies its checksum (trying every copy and repairing bad
/// ones below this layer) and returns the logical (decompressed) bytes.
pub trait BlockReader: Send + Sync {
    fn read_bp(&self, bp: &BlkPtr) -> Result<Arc<Vec<u8>>>;
    /// A block was just written as `bp` with these logical contents (the
    /// sync offers every data block here, and the SPA its indirect and
    /// object-set blocks). A reader with a cache keeps them (OpenZFS's ARC
    /// keeps a written buffer as the cached copy of its new block pointer),
    /// so the next txg's read-modify-write of the block costs no device
    /// read. `streamed`: file data written whole by the writes of its txg
    /// (`DirtyObj::streamed`), which a reader may leave uncached and
    /// recycle ([`BlockReader::spare_buffer`]). The default has no cache.
    fn written(&self, _bp: &BlkPtr, _data: &Arc<Vec<u8>>, _streamed: bool) {}
    /// A buffer of `len` bytes, contents arbitrary, that an earlier sync
    /// wrote and nothing holds any more (`dmu/bufpool.rs`), for a write
    /// about to fill a whole block; `None`: allocate.
    fn spare_buffer(&self, _len: usize) -> Option<Vec<u8>> {
        None
    }
    /// `bp`'s logical bytes if they are in memory now (no device read);
    /// `None` otherwise. A write of part of a record that is not in
    /// memory leaves the rest to the sync (`dmu/partial.rs`).
    fn cached(&self, _bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        None
    }
    /// Something happened to a partly written record (counted by a pool).
    fn partial_event(&self, _e: partial::Event) {}

    /// Whether `bp`'s block is in memory (the cache, or pinned by this
    /// thread): a read of it would touch no device.
    fn holds(&self, _bp: &BlkPtr) -> bool {
        false
    }
    /// `bp`'s block was just read whole into the kernel's page cache above
    /// a mount, which will hold it from now on: a reader with a cache may
    /// let its own copy go ([`Objset::read_for_kernel`]).
    fn handed_off(&self, _bp: &BlkPtr) {}
}

thread_local! {
    static PAGE_CACHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f`, whose writes come through the kernel's page cache above a
/// mount (a FUSE write of a file not opened for direct I/O), which holds
/// what they write: records they write whole are [`DirtyObj::streamed`],
/// and the cache may leave them to the kernel (`CacheWritten`,
/// `spa/io.rs`). Other writes (O_DIRECT, a direct-I/O mount, `uzfs object
/// put`, the engine used as a library) have no other copy and are kept.
pub fn through_page_cache<R>(f: impl FnOnce() -> R) -> R {
    crate::with_flag(&PAGE_CACHED, f)
}

#[derive(Clone, Copy, Debug)]
pub struct WriteParams {
    pub obj_type: u8,
    pub level: u8,
    pub checksum: ChecksumType,
    pub compress: Compression,
    pub copies: u8,
    pub fill: u64,
}

impl WriteParams {
    /// The pointer to a block written with these parameters in `txg`.
    pub fn bp(
        &self,
        dva: [crate::dmu::blkptr::Dva; 3],
        lsize: usize,
        psize: usize,
        comp: Compression,
        checksum: [u8; 32],
        txg: u64,
    ) -> BlkPtr {
        BlkPtr {
            dva,
            lsize: lsize as u32,
            psize: psize as u32,
            compress: comp,
            checksum_type: self.checksum,
            obj_type: self.obj_type,
            level: self.level,
            birth: txg,
            phys_birth: txg,
            fill: self.fill,
            checksum,
        }
    }
}

/// Allocates and writes blocks during sync. Implemented by the SPA.
pub trait BlockWriter {
    fn txg(&self) -> u64;
    /// Write `data` as the new version of `old` (a hole for a new block).
    /// The old version is freed, or rewritten in place if it was born in
    /// this txg and the new one fits.
    fn write_bp(&mut self, old: &BlkPtr, data: &[u8], wp: WriteParams) -> Result<BlkPtr>;
    fn free_bp(&mut self, bp: &BlkPtr);
    /// `new`, already written (by the intent log, for this txg), replaces
    /// `old` (a hole for a new block), which is freed.
    fn adopt(&mut self, old: &BlkPtr, _new: &BlkPtr) {
        if !old.is_hole() {
            self.free_bp(old);
        }
    }
    /// Free a block the intent log wrote early and the txg did not adopt
    /// (never charged to the object set; deferred like every free).
    fn free_unadopted(&mut self, bp: &BlkPtr) {
        self.free_bp(bp);
    }
    /// Something on disk now needs pool feature `name` (`spa/feature.rs`).
    fn note_feature(&mut self, _name: &'static str) {}
    /// A read the sync needs (the old version of a partly written record,
    /// `dmu/partial.rs`) failed with `err`: the SPA may park the sync and
    /// run `read` again once the devices are back (`spa/suspend.rs`), as
    /// for a failed write. The default gives up.
    fn read_again(
        &mut self,
        err: Error,
        _read: &mut dyn FnMut() -> Result<Arc<Vec<u8>>>,
    ) -> Result<Arc<Vec<u8>>> {
        Err(err)
    }
    /// The sync is waiting on something other than its own writes (the
    /// reads of partly written records): a moment to answer requests it
    /// would otherwise answer at its next allocation (space lent to the
    /// intent log, `spa/log_space.rs`). The default has none.
    fn waiting(&mut self) {}
    /// What `bp` is charged to its object set's `used`: its allocated
    /// bytes, deflated by the pool's RAID-Z ratio (`VdevAlloc::deflate`).
    fn dsize(&self, bp: &BlkPtr) -> u64 {
        bp.asize()
    }
    /// Write many level-0 blocks at once (the I/O pipeline may compress,
    /// checksum and issue them in parallel). Same semantics as `write_bp`
    /// applied to each `(old, data)` in order, except that the blocks are
    /// not offered to a cache: the caller holds them shared and offers them
    /// itself (`BlockReader::written`), without a copy.
    fn write_batch(&mut self, items: &[BatchBlock<'_>], wp: WriteParams) -> Result<Vec<BlkPtr>> {
        items
            .iter()
            .map(|b| self.write_bp(&b.old, b.data, wp))
            .collect()
    }
}

/// A level-0 block for [`BlockWriter::write_batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchBlock<'a> {
    /// The pointer it replaces (a hole for a new block).
    pub old: BlkPtr,
    pub data: &'a [u8],
    /// The Fletcher-4 of `data`, if known (`dmu/dirty_block.rs`).
    pub fletcher4: Option<&'a [u8; 32]>,
}

pub const OBJSET_MAGIC: u64 = 0x5355_4a42_4f53_465a; // "ZFSOBJUS" little-endian
pub const OBJSET_VERSION: u64 = 1;
pub const OBJSET_PHYS_SIZE: usize = 1024;
/// Where the intent log's header lives in the object-set block (after the
/// meta-dnode; zeros in blocks written before the log existed).
pub const LOG_HEADER_OFF: usize = 64 + DNODE_SIZE;
pub const OS_TYPE_META: u64 = 1;
pub const OS_TYPE_DATASET: u64 = 2;
/// Meta-dnode data blocks: 16 KiB, 32 dnodes each.
pub const DNODE_BLOCK_SIZE: u32 = 16 << 10;
const DNODES_PER_BLOCK: u64 = DNODE_BLOCK_SIZE as u64 / DNODE_SIZE as u64;

#[derive(Clone, Debug, Default)]
pub struct DirtyObj {
    /// Set when the object was (re)created in this txg: the new dnode.
    pub create: Option<DnodePhys>,
    /// Freed in this txg (after any earlier incarnation's changes).
    pub freed: bool,
    /// Whole level-0 blocks, `datablksz` long (a streaming writer's with
    /// their checksum: `dmu/dirty_block.rs`).
    pub blocks: BTreeMap<u64, DirtyBlock>,
    /// New logical size, if it changed.
    pub size: Option<u64>,
    /// New bonus buffer, if it changed.
    pub bonus: Option<[u8; BONUS_SIZE]>,
    /// Level-0 block ranges `[start, end)` punched out in this txg, before
    /// the blocks in `blocks` (a block written after a punch is in `blocks`).
    pub frees: Vec<(u64, u64)>,
    /// New data block size (a single-block object growing; see
    /// [`Objset::grow_blocksize`]). Applied before everything else.
    pub blksz: Option<u32>,
    /// Blocks of `blocks` that writes of this txg filled whole, never
    /// patched in part: a streaming writer's records. Their buffers are
    /// not kept by the cache once written (`BlockReader::written`), and
    /// their memory is reused (`dmu/bufpool.rs`). A block read and
    /// modified in part stays cached: it is likely modified again.
    pub streamed: BTreeSet<u64>,
    /// Blocks of `blocks` that writes of this txg filled only in part,
    /// over a record that was not in memory: the byte ranges written. The
    /// rest is whatever lies below this txg; reads and the sync fill it
    /// in (`dmu/partial.rs`).
    pub partial: BTreeMap<u64, Ranges>,
}

impl DirtyObj {
    fn punched(&self, blkid: u64) -> bool {
        self.frees.iter().any(|&(s, e)| s <= blkid && blkid < e)
    }

    /// Write `src` at `off` into block `blkid` of `bs` bytes, which
    /// `blocks` holds: whole, or partial (its compact buffer, the bytes
    /// of its ranges only: `dmu/partial.rs`). Returns the bytes the
    /// buffer grew by; a partial block the write made whole is counted
    /// by `reader`.
    fn patch(
        &mut self,
        blkid: u64,
        off: usize,
        src: &[u8],
        bs: usize,
        reader: &dyn BlockReader,
    ) -> u64 {
        let Some(b) = self.blocks.get_mut(&blkid) else {
            return 0;
        };
        let before = b.len();
        let covered = match self.partial.get_mut(&blkid) {
            None => {
                patch_block(b, off, src, reader);
                false
            }
            Some(_) if src.len() == bs => {
                *b = filled(reader, src).into();
                true
            }
            Some(r) => {
                r.patch(Arc::make_mut(b), off, src);
                r.covers(bs)
            }
        };
        let grew = b.len().saturating_sub(before) as u64;
        if src.len() != bs {
            self.streamed.remove(&blkid);
        }
        if covered {
            self.partial.remove(&blkid);
            reader.partial_event(partial::Event::Covered);
        }
        grew
    }

    /// Bytes of dirty buffers held for blocks `blkids` (a partial
    /// block's compact buffer is what it holds).
    fn held<'a>(&self, blkids: impl IntoIterator<Item = &'a u64>) -> u64 {
        blkids
            .into_iter()
            .filter_map(|k| self.blocks.get(k))
            .map(|b| b.len() as u64)
            .sum()
    }

    /// Block `blkid` is gone from `blocks`.
    fn dropped(&mut self, blkid: u64) {
        self.streamed.remove(&blkid);
        self.partial.remove(&blkid);
    }
}

#[derive(Debug, Default)]
pub struct TxgDirty {
    pub txg: u64,
    pub objs: BTreeMap<u64, DirtyObj>,
    /// Bytes of dirty buffers held (for the write throttle).
    pub bytes: u64,
    /// Of those, bytes of records that entered this txg written whole (a
    /// stream). Nothing is gained by holding them longer (no rewrite
    /// needs their old version), so they start a sync sooner than records
    /// written in part (`Tunables::dirty_whole_sync`).
    pub whole: u64,
}

impl TxgDirty {
    pub fn new(txg: u64) -> Self {
        TxgDirty {
            txg,
            ..Default::default()
        }
    }
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    /// Dirty buffers of `less` bytes left the txg and `more` entered it
    /// (not written whole); `whole` never counts more than is held.
    fn resize(&mut self, less: u64, more: u64) {
        self.bytes = self.bytes - less.min(self.bytes) + more;
        self.whole = self.whole.min(self.bytes);
    }

    /// Sync context: object `obj` is freed in this txg (whatever was
    /// changed in it here is dropped).
    pub fn free_object(&mut self, obj: u64) {
        self.objs.insert(
            obj,
            DirtyObj {
                freed: true,
                ..Default::default()
            },
        );
    }
}

struct OsState {
    /// Object-set block pointer as of the last sync pass.
    bp: BlkPtr,
    meta: DnodePhys,
    /// Dnodes of the synced tree read or written lately, at most
    /// [`DNODE_CACHE_MAX`] (their blocks stay in the ARC when trimmed).
    dnodes: HashMap<u64, DnodePhys>,
    /// Bumped by every publication of a new `meta`: a dnode read from an
    /// older `meta` must not be cached after it (`synced_dnode`).
    meta_gen: u64,
    open: TxgDirty,
    syncing: Option<Arc<TxgDirty>>,
    /// The tree the syncing txg's pass wrote, published by `sync_done`.
    pending: Option<SyncedTree>,
    /// Bumped by every freeze and publication (see [`Objset::generation`]).
    generation: u64,
    next_obj: u64,
    /// Allocated and logical bytes of every block under the object set,
    /// as of the last sync pass (stored in the object-set block).
    space: ObjsetSpace,
}

/// What a sync pass wrote: the object set's new tree.
struct SyncedTree {
    space: ObjsetSpace,
    bp: BlkPtr,
    meta: DnodePhys,
    changed: BTreeMap<u64, DnodePhys>,
}

/// Space charged to an object set: `used` counts allocated bytes (every
/// copy) deflated by RAID-Z's parity ratio (`BlockWriter::dsize`),
/// `logical` the uncompressed size of the blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjsetSpace {
    pub used: u64,
    pub logical: u64,
}

pub struct Objset {
    pub os_type: u64,
    reader: Arc<dyn BlockReader>,
    /// The pool's txg gate (shared by every object set of the pool): the
    /// freeze waits for the holds on it (see `dmu/tx.rs`).
    gate: Arc<TxgGate>,
    st: Mutex<OsState>,
    /// Serializes object-number allocation; holds the numbers reserved by
    /// operations that have not created their objects yet.
    create_lock: Mutex<BTreeSet<u64>>,
    /// The intent log every change is recorded for (`dmu/changelog.rs`);
    /// attached after replay, never to the MOS.
    log: std::sync::OnceLock<Arc<dyn ChangeLog>>,
    /// The log header of the object-set block this set was opened from.
    opened_log_header: [u8; LOG_HEADER_SIZE],
    /// Dirty blocks the intent log already wrote as ordinary blocks, by
    /// (txg, object, block id): the sync of that txg adopts them instead
    /// of writing them again (OpenZFS's `dmu_sync` override).
    overrides: Overrides,
    /// Write the object-set block at the next sync even if nothing else
    /// changed (a rollback's new head: `rewrite_root`).
    rewrite: std::sync::atomic::AtomicBool,
}

/// Write `src` into the dirty block `b` at `off`. A buffer someone else
/// still holds (a log record not yet written, a block the log is writing
/// early) is copied first (`Arc::make_mut`), unless `src` covers all of it:
/// then a new buffer replaces it, one copy instead of two (1 MiB fsyncs on
/// a small file spent 9% of the daemon's CPU copying blocks they were
/// about to overwrite whole).
fn patch_block(b: &mut Arc<Vec<u8>>, off: usize, src: &[u8], reader: &dyn BlockReader) {
    // (A strong count read under the object set's lock can only fall
    // meanwhile: at worst one needless copy.)
    if off == 0 && src.len() == b.len() && Arc::strong_count(b) > 1 {
        *b = Arc::new(filled(reader, src));
        return;
    }
    // Only weak references left (an override): `make_mut` moves the
    // buffer to a new allocation without copying its bytes.
    Arc::make_mut(b)[off..off + src.len()].copy_from_slice(src);
}

/// A private copy of block `blkid` of `obj` for a read-modify-write:
/// `b`'s bytes, zeros for a hole (`None`); a block not `bs` long is
/// damaged. In a recycled buffer when the reader has one: a stream's
/// writes split at a txg boundary start records this way (the kernel's
/// writeback does not cut its requests at record edges), and fresh
/// zeroed memory was a tenth of a 1 GiB write's page faults.
fn private_copy(
    reader: &dyn BlockReader,
    obj: u64,
    blkid: u64,
    bs: u64,
    b: Option<&[u8]>,
) -> Result<Vec<u8>> {
    match b {
        Some(old) if old.len() == bs as usize => Ok(filled(reader, old)),
        Some(_) => Err(Error::corrupt(
            "data block",
            format!("object {obj} block {blkid} has the wrong size"),
        )),
        None => Ok(match spare(reader, bs as usize) {
            Some(mut v) => {
                v.fill(0);
                v
            }
            None => vec![0u8; bs as usize],
        }),
    }
}

/// A new buffer holding `src`: a recycled one if the reader has one
/// (no fresh pages to fault in), else a fresh copy.
fn filled(reader: &dyn BlockReader, src: &[u8]) -> Vec<u8> {
    match spare(reader, src.len()) {
        Some(mut b) => {
            b.copy_from_slice(src);
            b
        }
        None => src.to_vec(),
    }
}

/// A recycled buffer of exactly `len` bytes (arbitrary contents), if the
/// reader has one.
fn spare(reader: &dyn BlockReader, len: usize) -> Option<Vec<u8>> {
    reader.spare_buffer(len).filter(|b| b.len() == len)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Dnodes an object set keeps decoded. Past it a quarter (arbitrary ones)
/// go; their dnode blocks are metadata in the ARC, so reading one again
/// is a cache hit and a decode. Without a bound, a walk of a million files
/// kept a million dnodes (about 600 MiB) for the life of the mount.
pub const DNODE_CACHE_MAX: usize = 1 << 16;

static DNODE_CACHE_LIMIT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DNODE_CACHE_MAX);

/// Set the dnode cache bound of every object set in this process (tests
/// run the concurrency and crash simulations with a tiny one, so that
/// eviction races with publication all the time).
pub fn set_dnode_cache_max(n: usize) {
    DNODE_CACHE_LIMIT.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
}

fn dnode_cache_max() -> usize {
    DNODE_CACHE_LIMIT.load(std::sync::atomic::Ordering::Relaxed)
}

impl OsState {
    /// Whether the open or the syncing txg changes `obj`.
    fn pending(&self, obj: u64) -> bool {
        self.open.objs.contains_key(&obj)
            || self
                .syncing
                .as_ref()
                .is_some_and(|s| s.objs.contains_key(&obj))
    }

    fn publish(&mut self, t: SyncedTree) {
        self.space = t.space;
        self.bp = t.bp;
        self.meta = t.meta;
        self.meta_gen += 1;
        self.dnodes.extend(t.changed);
        self.trim_dnodes();
    }

    fn trim_dnodes(&mut self) {
        let max = dnode_cache_max();
        if self.dnodes.len() > max {
            let mut drop = self.dnodes.len() - max * 3 / 4;
            self.dnodes.retain(|_, _| {
                if drop > 0 {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
    }
}

thread_local! {
    /// Object numbers this thread reserved: (object set address, number).
    static RESERVED: std::cell::RefCell<Vec<(usize, u64)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// This thread's next reserved number in `os`.
fn take_reserved(os: &Objset) -> Option<u64> {
    let key = os.key();
    RESERVED.with(|r| {
        let mut r = r.borrow_mut();
        let i = r.iter().position(|(k, _)| *k == key)?;
        Some(r.remove(i).1)
    })
}

/// Object numbers reserved by [`Objset::reserve_objects`]; dropping it
/// gives back the ones no create took.
#[must_use = "the numbers are reserved only while the guard lives"]
pub struct Reserved<'a> {
    os: &'a Objset,
}

impl Reserved<'_> {
    /// The numbers reserved and not yet taken by a create.
    pub fn numbers(&self) -> Vec<u64> {
        let key = self.os.key();
        RESERVED.with(|r| {
            r.borrow()
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, n)| *n)
                .collect()
        })
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut left = Vec::new();
        while let Some(n) = take_reserved(self.os) {
            left.push(n);
        }
        if let Some(&low) = left.iter().min() {
            let mut reserved = lock(&self.os.create_lock);
            for n in &left {
                reserved.remove(n);
            }
            let mut st = lock(&self.os.st);
            st.next_obj = st.next_obj.min(low);
        }
    }
}

/// What a write of part of a block patches (`Objset::patch_base`).
enum PatchBase {
    /// The block's current contents, a private copy.
    Copy(Vec<u8>),
    /// Not in memory: a partial block, over the old version `bp` on disk
    /// (`None`: over another txg's partial block).
    Sparse(Option<BlkPtr>),
}

/// Where the current contents of one block live.
/// What filled a partial block in (`Objset::promote`).
#[derive(Clone, Copy)]
enum Fill {
    /// A read of it, which resolved what lies below.
    Read,
    /// The kernel's pages above a mount (`zpl/pagecache.rs`): good only
    /// while `txg`, the txg the partial block was made in, is open.
    Kernel { txg: u64 },
}

/// A level-0 block's bytes, `None` for a hole.
type Block = Option<Arc<Vec<u8>>>;

/// A record a read for the kernel's page cache covered only in part: the
/// mount may give the kernel the rest
/// (FUSE_NOTIFY_STORE, `uzfs/src/fuse/store.rs`), after which the cache
/// need not keep it ([`Objset::kernel_holds`]).
#[derive(Clone)]
pub struct RecordPart {
    /// The record's offset in the file.
    pub offset: u64,
    /// Bytes of it that are the file's (the ZPL cuts the last record
    /// at the file's size).
    pub len: usize,
    /// Where a device holds it; none for a version in memory (dirty or
    /// being synced), which the cache does not hold.
    pub bp: Option<BlkPtr>,
    pub data: Arc<Vec<u8>>,
}

enum BlockSource {
    Data(Arc<Vec<u8>>),
    Zero,
    Tree(Box<DnodePhys>),
    /// A partly written block (`dmu/partial.rs`): the bytes of `ranges`
    /// are `data`'s, the rest `below`'s. `open`: it is the open txg's.
    Partial {
        data: Arc<Vec<u8>>,
        ranges: Ranges,
        below: Box<BlockSource>,
        open: bool,
    },
}

impl Objset {
    /// A new, empty object set; its first sync writes it.
    pub fn create(
        os_type: u64,
        reader: Arc<dyn BlockReader>,
        gate: Arc<TxgGate>,
        open_txg: u64,
    ) -> Self {
        let meta = DnodePhys::new(ot::DNODE, DNODE_BLOCK_SIZE, &ObjProps::METADATA);
        Self::with_root(os_type, reader, gate, open_txg, BlkPtr::HOLE, meta)
    }

    /// Open the object set rooted at `bp`.
    pub fn open(
        bp: &BlkPtr,
        reader: Arc<dyn BlockReader>,
        gate: Arc<TxgGate>,
        open_txg: u64,
    ) -> Result<Self> {
        let data = reader.read_bp(bp)?;
        let (os_type, meta) = decode_objset_phys(&data)?;
        let mut os = Self::with_root(os_type, reader, gate, open_txg, *bp, meta);
        lock(&os.st).space = decode_objset_space(&data);
        os.opened_log_header
            .copy_from_slice(&data[LOG_HEADER_OFF..LOG_HEADER_OFF + LOG_HEADER_SIZE]);
        Ok(os)
    }

    fn with_root(
        os_type: u64,
        reader: Arc<dyn BlockReader>,
        gate: Arc<TxgGate>,
        open_txg: u64,
        bp: BlkPtr,
        meta: DnodePhys,
    ) -> Self {
        Objset {
            os_type,
            reader,
            gate,
            st: Mutex::new(OsState {
                bp,
                meta,
                dnodes: HashMap::new(),
                meta_gen: 0,
                open: TxgDirty::new(open_txg),
                syncing: None,
                pending: None,
                generation: 0,
                next_obj: 1,
                space: ObjsetSpace::default(),
            }),
            create_lock: Mutex::new(BTreeSet::new()),
            log: std::sync::OnceLock::new(),
            opened_log_header: [0; LOG_HEADER_SIZE],
            overrides: Overrides::default(),
            rewrite: Default::default(),
        }
    }

    /// Attach the intent log: from now on every change is recorded for it
    /// and the object-set block carries its header. Once only.
    pub fn attach_log(&self, log: Arc<dyn ChangeLog>) -> Result<()> {
        self.log
            .set(log)
            .map_err(|_| Error::invalid("object set already has an intent log"))
    }

    pub fn change_log(&self) -> Option<&Arc<dyn ChangeLog>> {
        self.log.get()
    }

    /// The log header stored in the object-set block this set was opened
    /// from (all zeros: no log).
    pub fn opened_log_header(&self) -> &[u8; LOG_HEADER_SIZE] {
        &self.opened_log_header
    }

    /// Buffer this thread's changes to this object set as one operation's
    /// record until the scope is flushed or dropped (`dmu/changelog.rs`).
    pub fn op_scope(&self) -> OpScope<'_> {
        OpScope::open(self)
    }

    /// Hand what this thread's op scope buffered to the log now (called
    /// by the POSIX layer before it releases an operation's locks).
    pub fn flush_op(&self) {
        changelog::flush(self)
    }

    fn note(&self, c: Change<'_>) {
        if self.log.get().is_some() {
            let txg = lock(&self.st).open.txg;
            changelog::note(self, txg, c);
        }
    }

    /// Hold the open txg (`tx_begin`): every change made while the `Tx`
    /// lives lands in one txg. See `dmu/tx.rs` for what may and may not be
    /// done while holding it.
    pub fn tx(&self) -> Tx<'_> {
        self.gate.hold()
    }

    pub fn gate(&self) -> &Arc<TxgGate> {
        &self.gate
    }

    pub fn root_bp(&self) -> BlkPtr {
        lock(&self.st).bp
    }

    /// Object slots the meta-dnode spans (an upper bound on live objects).
    pub fn dnode_count_estimate(&self) -> u64 {
        lock(&self.st).meta.size / DNODE_SIZE as u64
    }

    /// Space under this object set as of the last sync.
    /// The space this txg's sync leaves (sync context, after this object
    /// set's pass), or the last committed.
    pub fn synced_space(&self) -> ObjsetSpace {
        let st = lock(&self.st);
        st.pending.as_ref().map_or(st.space, |t| t.space)
    }

    pub fn space(&self) -> ObjsetSpace {
        lock(&self.st).space
    }

    /// Bytes of dirty data in the open txg (not yet charged to `space`).
    pub fn open_dirty_bytes(&self) -> u64 {
        lock(&self.st).open.bytes
    }

    /// [`Objset::dirty_bytes`], and of the open txg's the bytes of records
    /// it took written whole ([`TxgDirty::whole`]), under one lock (the
    /// write throttle asks for both on every write).
    pub fn dirty_and_whole_bytes(&self) -> (u64, u64) {
        let st = lock(&self.st);
        (
            st.open.bytes + st.syncing.as_ref().map_or(0, |s| s.bytes),
            st.open.whole,
        )
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_and_whole_bytes().0
    }

    pub fn open_is_empty(&self) -> bool {
        lock(&self.st).open.is_empty()
    }

    /// Close the open txg: its dirty set becomes the syncing set. The
    /// caller has quiesced the pool's gate, so no operation is half done.
    pub fn freeze(&self, next_txg: u64) -> Arc<TxgDirty> {
        let mut st = lock(&self.st);
        debug_assert!(st.syncing.is_none(), "freeze while a txg is syncing");
        let d = Arc::new(std::mem::replace(&mut st.open, TxgDirty::new(next_txg)));
        st.syncing = Some(d.clone());
        st.generation += 1;
        d
    }

    /// The syncing txg is on disk: publish the tree its pass wrote and drop
    /// its buffers, in one step. For a dataset's object set the caller has
    /// shut the pool's txg gate (no operation holds the txg meanwhile).
    pub fn sync_done(&self) {
        let mut st = lock(&self.st);
        if let Some(t) = st.pending.take() {
            st.publish(t);
        }
        let synced = st.syncing.take().map(|s| s.txg);
        st.generation += 1;
        drop(st);
        if let (Some(log), Some(txg)) = (self.log.get(), synced) {
            log.synced(txg);
        }
    }

    /// Changes with every freeze and every publication of a synced tree,
    /// which happen only while no operation holds the txg: an operation
    /// that warmed up its blocks before its hold and finds the generation
    /// unchanged once it holds reads exactly what it warmed up.
    pub fn generation(&self) -> u64 {
        lock(&self.st).generation
    }

    // ---- reading -------------------------------------------------------

    /// How many dnodes this object set keeps decoded (at most about
    /// [`DNODE_CACHE_MAX`]).
    pub fn cached_dnodes(&self) -> usize {
        lock(&self.st).dnodes.len()
    }

    /// The synced dnode of `obj` (free if none).
    pub fn synced_dnode(&self, obj: u64) -> Result<DnodePhys> {
        loop {
            let (meta, gen) = {
                let st = lock(&self.st);
                if let Some(d) = st.dnodes.get(&obj) {
                    return Ok(d.clone());
                }
                (st.meta.clone(), st.meta_gen)
            };
            let blkid = obj / DNODES_PER_BLOCK;
            let dn = match read_tree_block(&*self.reader, &meta, blkid)? {
                None => DnodePhys::free(),
                Some(block) => {
                    let at = (obj % DNODES_PER_BLOCK) as usize * DNODE_SIZE;
                    DnodePhys::decode(block.get(at..at + DNODE_SIZE).ok_or_else(|| {
                        Error::corrupt("dnode block", format!("short block for object {obj}"))
                    })?)?
                }
            };
            let mut st = lock(&self.st);
            if st.meta_gen == gen {
                let dn = st.dnodes.entry(obj).or_insert(dn).clone();
                st.trim_dnodes();
                return Ok(dn);
            }
            // A publication landed since `meta` was read: its dnode, if it
            // is still cached, is the newer one; if the cache let it go,
            // read again from the new tree (caching `dn` could keep a
            // stale dnode for good).
            if let Some(d) = st.dnodes.get(&obj) {
                return Ok(d.clone());
            }
        }
    }

    /// The current dnode of `obj` (type, block size, logical size), or `None`.
    pub fn dnode(&self, obj: u64) -> Result<Option<DnodePhys>> {
        let mut size = None;
        let mut bonus = None;
        let mut blksz = None;
        {
            let st = lock(&self.st);
            let layers = [Some(&st.open), st.syncing.as_deref()];
            for d in layers.into_iter().flatten() {
                if let Some(o) = d.objs.get(&obj) {
                    if o.freed {
                        return Ok(None);
                    }
                    size = size.or(o.size);
                    bonus = bonus.or(o.bonus);
                    blksz = blksz.or(o.blksz);
                    if let Some(c) = &o.create {
                        let mut dn = c.clone();
                        dn.size = size.unwrap_or(0);
                        if let Some(b) = bonus {
                            dn.bonus = b;
                        }
                        if let Some(b) = blksz {
                            dn.datablksz = b;
                        }
                        return Ok(Some(dn));
                    }
                }
            }
        }
        let mut dn = self.synced_dnode(obj)?;
        if dn.is_free() {
            return Ok(None);
        }
        if let Some(s) = size {
            dn.size = s;
        }
        if let Some(b) = bonus {
            dn.bonus = b;
        }
        if let Some(b) = blksz {
            dn.datablksz = b;
        }
        Ok(Some(dn))
    }

    pub fn exists(&self, obj: u64) -> Result<bool> {
        Ok(self.dnode(obj)?.is_some())
    }

    /// Whether `obj` has changes no sync has finished writing (in the
    /// open or the syncing txg): until then its space figures are the
    /// last sync's.
    pub fn has_pending(&self, obj: u64) -> bool {
        lock(&self.st).pending(obj)
    }

    /// Type, block size and logical size of an existing object.
    pub fn stat(&self, obj: u64) -> Result<DnodePhys> {
        self.dnode(obj)?
            .ok_or_else(|| Error::NotFound(format!("object {obj} does not exist")))
    }

    fn block_source(&self, obj: u64, blkid: u64) -> Result<BlockSource> {
        // Partly written versions met on the way down, newest first.
        let mut over: Vec<(Arc<Vec<u8>>, Ranges, bool)> = Vec::new();
        let found = 'found: {
            let st = lock(&self.st);
            let layers = [(Some(&st.open), true), (st.syncing.as_deref(), false)];
            for (d, open) in layers {
                let Some(o) = d.and_then(|d| d.objs.get(&obj)) else {
                    continue;
                };
                if o.freed {
                    if over.is_empty() {
                        return Err(Error::NotFound(format!("object {obj} does not exist")));
                    }
                    break 'found Some(BlockSource::Zero);
                }
                if let Some(b) = o.blocks.get(&blkid) {
                    match o.partial.get(&blkid) {
                        None => break 'found Some(BlockSource::Data(Arc::clone(b))),
                        Some(r) => over.push((Arc::clone(b), r.clone(), open)),
                    }
                }
                // A txg's punches and re-creation come before its blocks.
                if o.create.is_some() || o.punched(blkid) {
                    break 'found Some(BlockSource::Zero);
                }
            }
            None
        };
        let mut src = match found {
            Some(s) => s,
            None => BlockSource::Tree(Box::new(self.synced_dnode(obj)?)),
        };
        while let Some((data, ranges, open)) = over.pop() {
            src = BlockSource::Partial {
                data,
                ranges,
                below: Box::new(src),
                open,
            };
        }
        Ok(src)
    }

    /// The whole contents of a block from where they live (`None`: a hole).
    fn resolve(&self, obj: u64, blkid: u64, src: BlockSource) -> Result<Option<Arc<Vec<u8>>>> {
        match src {
            BlockSource::Data(d) => Ok(Some(d)),
            BlockSource::Zero => Ok(None),
            BlockSource::Tree(dn) => Ok(self.read_tree(obj, blkid, &dn)?.map(|(_, d)| d)),
            BlockSource::Partial {
                data,
                ranges,
                below,
                open,
            } => {
                let base = self.resolve(obj, blkid, *below)?;
                let bs = self.stat(obj)?.datablksz as usize;
                let whole = Arc::new(partial::merge(base, &data, &ranges, bs)?);
                if open {
                    self.promote(obj, blkid, &data, &whole, Fill::Read);
                }
                Ok(Some(whole))
            }
        }
    }

    /// The open txg's partial block `blkid` of `obj`, whose buffer was
    /// `data`, was filled in as `whole`: put it in its place unless a
    /// write changed it meanwhile (then a later read fills it again).
    /// Whether it did (counted by `fill`'s event).
    fn promote(
        &self,
        obj: u64,
        blkid: u64,
        data: &Arc<Vec<u8>>,
        whole: &Arc<Vec<u8>>,
        fill: Fill,
    ) -> bool {
        let mut st = lock(&self.st);
        let how = match fill {
            Fill::Read => partial::Event::FilledByRead,
            Fill::Kernel { txg } if txg == st.open.txg => partial::Event::Retrieved,
            Fill::Kernel { .. } => return false,
        };
        let Some(d) = st.open.objs.get_mut(&obj) else {
            return false;
        };
        if !d.partial.contains_key(&blkid) {
            return false;
        }
        if let Some(b) = d.blocks.get_mut(&blkid) {
            if Arc::ptr_eq(b, data) {
                *b = whole.clone().into();
                d.partial.remove(&blkid);
                self.reader.partial_event(how);
                st.open.resize(data.len() as u64, whole.len() as u64);
                return true;
            }
        }
        false
    }

    /// Current contents of one level-0 block (`None` = hole, reads as zeros).
    pub fn read_block(&self, obj: u64, blkid: u64) -> Result<Option<Arc<Vec<u8>>>> {
        let src = self.block_source(obj, blkid)?;
        self.resolve(obj, blkid, src)
    }

    /// [`read_block`](Self::read_block), with the block's pointer when a
    /// device holds it as read (not a version in memory: dirty, being
    /// synced, or partly written).
    fn read_block_bp(&self, obj: u64, blkid: u64) -> Result<(Option<BlkPtr>, Block)> {
        Ok(match self.block_source(obj, blkid)? {
            BlockSource::Tree(dn) => match self.read_tree(obj, blkid, &dn)? {
                Some((bp, data)) => (Some(bp), Some(data)),
                None => (None, None),
            },
            src => (None, self.resolve(obj, blkid, src)?),
        })
    }

    /// The kernel's page cache now holds all of record `bp`: the cache
    /// may let its copy go ([`BlockReader::handed_off`]), unless a
    /// snapshot or clone shares it (born at or before `shared_below`). A
    /// version in memory has no `bp`: it is not the cache's to give up.
    pub fn kernel_holds(&self, bp: &BlkPtr, shared_below: u64) {
        if bp.birth > shared_below {
            self.reader.handed_off(bp);
        }
    }

    /// Level-0 block `blkid` of `obj` from the tree under `dn`: its
    /// pointer and bytes, or `None` for a hole; a checksum error names
    /// the object and offset.
    fn read_tree(
        &self,
        obj: u64,
        blkid: u64,
        dn: &DnodePhys,
    ) -> Result<Option<(BlkPtr, Arc<Vec<u8>>)>> {
        read_tree_block_bp(&*self.reader, dn, blkid).map_err(|e| match e {
            Error::Checksum(m) => Error::Checksum(format!(
                "object {obj} offset {}: {m}",
                blkid * dn.datablksz as u64
            )),
            e => e,
        })
    }

    /// Block `blkid` of `obj` as a write of part of it would have to read
    /// it from a device: its pointer, when no txg in memory holds a newer
    /// version and the block is not in memory. `None` otherwise (a hole,
    /// a dirty or cached block: nothing to read).
    pub fn uncached_block(&self, obj: u64, blkid: u64) -> Result<Option<BlkPtr>> {
        let BlockSource::Tree(dn) = self.block_source(obj, blkid)? else {
            return Ok(None);
        };
        Ok(find_l0_bp(&*self.reader, &dn, blkid)?.filter(|bp| !self.reader.holds(bp)))
    }

    /// Whether block `blkid` of `obj` is a partial block of the open txg
    /// (`dmu/partial.rs`): a write of part of it patches it, reading
    /// nothing, if this thread is [`partial::deferring`].
    pub fn is_partial(&self, obj: u64, blkid: u64) -> bool {
        lock(&self.st)
            .open
            .objs
            .get(&obj)
            .is_some_and(|d| d.partial.contains_key(&blkid))
    }

    /// Count what became of a partly written record (`dmu/partial.rs`).
    pub fn partial_event(&self, e: partial::Event) {
        self.reader.partial_event(e);
    }

    /// The open txg's partial block `blkid` of `obj` (`dmu/partial.rs`)
    /// filled in from `base`, the whole record as the kernel's page cache
    /// above the mount holds it (`zpl/pagecache.rs`; bytes past the
    /// file's size already zero): the bytes written in this txg laid over
    /// it, in place of the partial block. False if there is no such
    /// partial block now (a later write or a punch replaced it, or the
    /// sync took it): nothing changes, and the sync fills it as before.
    ///
    /// `txg`: the open txg the partial block was made in. A fill that
    /// arrives after that txg closed is dropped: the bytes below the
    /// partial block may have changed since the base was taken.
    pub fn fill_partial(&self, obj: u64, blkid: u64, base: Vec<u8>, txg: u64) -> Result<bool> {
        let BlockSource::Partial {
            data,
            ranges,
            open: true,
            ..
        } = self.block_source(obj, blkid)?
        else {
            return Ok(false);
        };
        let bs = self.stat(obj)?.datablksz as usize;
        if base.len() != bs {
            return Ok(false);
        }
        let whole = Arc::new(partial::merge(Some(Arc::new(base)), &data, &ranges, bs)?);
        Ok(self.promote(obj, blkid, &data, &whole, Fill::Kernel { txg }))
    }

    /// The txg this object set's changes go into now.
    pub fn open_txg(&self) -> u64 {
        lock(&self.st).open.txg
    }

    /// Whether block `blkid` of `obj` holds data (is not a hole): what
    /// `read_block(..).is_some()` says, without reading the data.
    pub fn holds_data(&self, obj: u64, blkid: u64) -> Result<bool> {
        Ok(match self.block_source(obj, blkid)? {
            BlockSource::Data(_) | BlockSource::Partial { .. } => true,
            BlockSource::Zero => false,
            BlockSource::Tree(dn) => find_l0_bp(&*self.reader, &dn, blkid)?.is_some(),
        })
    }

    /// What a write of part of block `blkid` patches: a private copy of
    /// the block's contents when they are in memory (zeros for a hole),
    /// else a partial block, whose old version (if on disk, its pointer)
    /// the sync reads (`dmu/partial.rs`).
    fn patch_base(&self, obj: u64, blkid: u64, bs: u64) -> Result<PatchBase> {
        if !partial::fill_at_sync() {
            return Ok(PatchBase::Copy(self.block_copy(obj, blkid, bs)?));
        }
        let in_memory = match self.block_source(obj, blkid)? {
            BlockSource::Data(d) => Some(d),
            BlockSource::Zero => None,
            BlockSource::Partial { .. } => return Ok(PatchBase::Sparse(None)),
            BlockSource::Tree(dn) => match find_l0_bp(&*self.reader, &dn, blkid)? {
                None => None,
                Some(bp) => match self.reader.cached(&bp) {
                    // Under a mount the open txg holds only the bytes
                    // written, and the sync copies the rest from the
                    // cache: a 4 KiB page written back into a cached 128
                    // KiB record holds and charges 4 KiB, not 128.
                    Some(_) if partial::deferring_here() => return Ok(PatchBase::Sparse(None)),
                    Some(b) => Some(b),
                    None => return Ok(PatchBase::Sparse(Some(bp))),
                },
            },
        };
        private_copy(
            &*self.reader,
            obj,
            blkid,
            bs,
            in_memory.as_deref().map(|b| b.as_slice()),
        )
        .map(PatchBase::Copy)
    }

    /// Read `buf.len()` bytes at `offset`. Holes and bytes past the end of
    /// the object read as zeros; the caller clips to the object size.
    pub fn read(&self, obj: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_handing_off(obj, offset, buf, None, None)
    }

    /// [`read`](Self::read) for the kernel's page cache above a mount,
    /// which keeps what it is sent: each block the read covers whole and
    /// takes from disk is offered back to the reader
    /// ([`BlockReader::handed_off`]) so that its bytes are held once,
    /// by the kernel. Not a block born at or before `shared_below`: a
    /// snapshot or a clone shares it, and a read through one of those is
    /// a different file to the kernel, which the cache should still serve
    /// (docs/ARCHITECTURE.md, "one copy").
    pub fn read_for_kernel(
        &self,
        obj: u64,
        offset: u64,
        buf: &mut [u8],
        shared_below: u64,
        parts: Option<&mut Vec<RecordPart>>,
    ) -> Result<()> {
        self.read_handing_off(obj, offset, buf, Some(shared_below), parts)
    }

    fn read_handing_off(
        &self,
        obj: u64,
        offset: u64,
        buf: &mut [u8],
        shared_below: Option<u64>,
        mut parts: Option<&mut Vec<RecordPart>>,
    ) -> Result<()> {
        let bs = self.stat(obj)?.datablksz as u64;
        let mut pos = 0usize;
        while pos < buf.len() {
            let off = offset + pos as u64;
            let (blkid, boff) = (off / bs, (off % bs) as usize);
            let n = (bs as usize - boff).min(buf.len() - pos);
            let block = match (shared_below, parts.as_deref_mut()) {
                // Read whole for the kernel, which keeps it.
                (Some(below), _) if n == bs as usize => {
                    let (bp, data) = self.read_block_bp(obj, blkid)?;
                    if let Some(bp) = &bp {
                        self.kernel_holds(bp, below);
                    }
                    data
                }
                // Read in part for the kernel: the mount may give it the
                // rest ([`RecordPart`]).
                (Some(_), Some(parts)) => {
                    let (bp, data) = self.read_block_bp(obj, blkid)?;
                    if let Some(data) = &data {
                        parts.push(RecordPart {
                            offset: blkid * bs,
                            len: data.len(),
                            bp,
                            data: Arc::clone(data),
                        });
                    }
                    data
                }
                _ => self.read_block(obj, blkid)?,
            };
            match block {
                Some(b) => {
                    buf[pos..pos + n].copy_from_slice(b.get(boff..boff + n).ok_or_else(|| {
                        Error::corrupt("data block", format!("object {obj} block {blkid} short"))
                    })?)
                }
                None => buf[pos..pos + n].fill(0),
            }
            pos += n;
        }
        Ok(())
    }

    // ---- writing (open context) -----------------------------------------

    /// Create an object; returns its number.
    pub fn create_object(&self, obj_type: u8, blksz: u32, props: &ObjProps) -> Result<u64> {
        let _tx = self.tx();
        if blksz < 512 || !blksz.is_multiple_of(512) || blksz > super::blkptr::MAX_BLOCK_SIZE {
            return Err(Error::invalid(format!("invalid block size {blksz}")));
        }
        let mut reserved = lock(&self.create_lock);
        let cand = match take_reserved(self) {
            // Checked free when reserved, and nobody else may take it.
            Some(n) => {
                reserved.remove(&n);
                n
            }
            None => {
                let c = self.first_free(&reserved)?;
                lock(&self.st).next_obj = c + 1;
                c
            }
        };
        // Still under `create_lock`: the number is taken before another
        // search can see it free.
        let mut st = lock(&self.st);
        let d = st.open.objs.entry(cand).or_default();
        *d = DirtyObj {
            create: Some(DnodePhys::new(obj_type, blksz, props)),
            size: Some(0),
            ..Default::default()
        };
        drop(st);
        drop(reserved);
        self.note(Change::Create {
            obj: cand,
            obj_type,
            blksz,
            props: *props,
        });
        Ok(cand)
    }

    /// Create object `obj` (intent-log replay: the number it had). Whatever
    /// the open txg held for the number is replaced, as `create_object`
    /// replaces a number freed earlier.
    pub fn create_object_at(
        &self,
        obj: u64,
        obj_type: u8,
        blksz: u32,
        props: &ObjProps,
    ) -> Result<()> {
        let _tx = self.tx();
        if obj == 0
            || blksz < 512
            || !blksz.is_multiple_of(512)
            || blksz > super::blkptr::MAX_BLOCK_SIZE
        {
            return Err(Error::invalid(format!(
                "invalid object {obj} or block size {blksz}"
            )));
        }
        let _c = lock(&self.create_lock);
        let mut st = lock(&self.st);
        let st = &mut *st;
        let d = st.open.objs.entry(obj).or_default();
        let released = d.held(d.blocks.keys());
        *d = DirtyObj {
            create: Some(DnodePhys::new(obj_type, blksz, props)),
            size: Some(0),
            ..Default::default()
        };
        st.open.resize(released, 0);
        st.next_obj = st.next_obj.max(obj + 1);
        Ok(())
    }

    /// The first object number from the cursor that is free, not freed in
    /// the open txg and not reserved. A number freed in the open txg stays
    /// unused until the next one: its new incarnation gets a later creation
    /// txg, so the generation the POSIX layer stamps (and FUSE hands the
    /// kernel) always differs.
    fn first_free(&self, reserved: &BTreeSet<u64>) -> Result<u64> {
        let mut cand = lock(&self.st).next_obj;
        let freed_now = |o: u64| lock(&self.st).open.objs.get(&o).is_some_and(|d| d.freed);
        while reserved.contains(&cand) || freed_now(cand) || self.exists(cand)? {
            cand += 1;
        }
        Ok(cand)
    }

    /// This object set's identity in thread-local tables (its address).
    pub(crate) fn key(&self) -> usize {
        self as *const Objset as usize
    }

    /// Reserve `n` object numbers for the creates of an operation about to
    /// hold the txg: the search for free numbers reads dnode blocks, so it
    /// happens here, before the hold (dmu/tx.rs, "What bounds a hold").
    /// [`create_object`](Self::create_object) on this thread takes them
    /// first, with no read; the guard gives back the ones not used.
    pub fn reserve_objects(&self, n: usize) -> Result<Reserved<'_>> {
        let mut reserved = lock(&self.create_lock);
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            let c = self.first_free(&reserved)?;
            reserved.insert(c);
            lock(&self.st).next_obj = c + 1;
            got.push(c);
        }
        RESERVED.with(|r| r.borrow_mut().extend(got.iter().map(|&o| (self.key(), o))));
        Ok(Reserved { os: self })
    }

    /// Create an object in sync context (MOS passes after the first), into
    /// `into`. The number must be unused in every layer, including the open
    /// txg, whose later changes would otherwise land on it.
    pub fn create_in_sync(
        &self,
        into: &mut TxgDirty,
        obj_type: u8,
        blksz: u32,
        props: &ObjProps,
    ) -> Result<u64> {
        let reserved = lock(&self.create_lock);
        let mut cand = lock(&self.st).next_obj;
        loop {
            let touched = reserved.contains(&cand) || {
                lock(&self.st).pending(cand) || into.objs.contains_key(&cand)
            };
            if !touched && !self.exists(cand)? {
                break;
            }
            cand += 1;
        }
        lock(&self.st).next_obj = cand + 1;
        into.objs.insert(
            cand,
            DirtyObj {
                create: Some(DnodePhys::new(obj_type, blksz, props)),
                size: Some(0),
                ..Default::default()
            },
        );
        Ok(cand)
    }

    /// Free an object and all its blocks.
    pub fn free_object(&self, obj: u64) -> Result<()> {
        let _tx = self.tx();
        self.stat(obj)?;
        let mut st = lock(&self.st);
        let d = st.open.objs.entry(obj).or_default();
        let released = d.held(d.blocks.keys());
        *d = DirtyObj {
            freed: true,
            ..Default::default()
        };
        st.open.resize(released, 0);
        if obj < st.next_obj {
            st.next_obj = obj;
        }
        drop(st);
        self.note(Change::Free { obj });
        Ok(())
    }

    /// Set the logical size of an object (bytes beyond it read as zeros).
    pub fn set_size(&self, obj: u64, size: u64) -> Result<()> {
        let _tx = self.tx();
        self.stat(obj)?;
        lock(&self.st).open.objs.entry(obj).or_default().size = Some(size);
        self.note(Change::SetSize { obj, size });
        Ok(())
    }

    /// Replace the bonus buffer of an object.
    pub fn set_bonus(&self, obj: u64, bonus: &[u8; BONUS_SIZE]) -> Result<()> {
        let _tx = self.tx();
        self.stat(obj)?;
        lock(&self.st).open.objs.entry(obj).or_default().bonus = Some(*bonus);
        self.note(Change::SetBonus { obj, bonus });
        Ok(())
    }

    /// Grow the data block size of an object that has at most one block
    /// (OpenZFS dnode_set_blksz): small files start with a small block and
    /// grow up to the record size, so a 100-byte file costs 512 bytes.
    pub fn grow_blocksize(&self, obj: u64, new_bs: u32) -> Result<()> {
        let _tx = self.tx();
        let dn = self.stat(obj)?;
        if new_bs <= dn.datablksz {
            return Ok(());
        }
        if new_bs > super::blkptr::MAX_BLOCK_SIZE || !new_bs.is_multiple_of(512) {
            return Err(Error::invalid(format!("invalid block size {new_bs}")));
        }
        if dn.size > dn.datablksz as u64 {
            return Err(Error::invalid("block size change of a multi-block object"));
        }
        // Block 0 carries over at the new size; a hole stays a hole.
        let block = self.read_block(obj, 0)?.map(|old| {
            let mut b = vec![0u8; new_bs as usize];
            let n = old.len().min(b.len());
            b[..n].copy_from_slice(&old[..n]);
            b
        });
        let mut st = lock(&self.st);
        let d = st.open.objs.entry(obj).or_default();
        let had = d.held(d.blocks.keys());
        d.blocks.clear();
        d.streamed.clear();
        d.partial.clear();
        d.blksz = Some(new_bs);
        let added = match block {
            Some(b) => {
                d.blocks.insert(0, b.into());
                new_bs as u64
            }
            None => {
                // Older layers must not show their block 0 through the hole.
                d.frees.push((0, 1));
                0
            }
        };
        st.open.resize(had, added);
        drop(st);
        self.note(Change::Grow { obj, blksz: new_bs });
        Ok(())
    }

    /// Punch level-0 blocks `[start, end)` out of an object: they read as
    /// zeros and, once synced, are holes that take no space (indirect blocks
    /// left with only holes are freed too). The logical size is unchanged.
    pub fn free_range(&self, obj: u64, start: u64, end: u64) -> Result<()> {
        let _tx = self.tx();
        self.stat(obj)?;
        if start >= end {
            return Ok(());
        }
        let mut st = lock(&self.st);
        let d = st.open.objs.entry(obj).or_default();
        let doomed: Vec<u64> = d.blocks.range(start..end).map(|(&k, _)| k).collect();
        let released = d.held(&doomed);
        for k in &doomed {
            d.blocks.remove(k);
            d.dropped(*k);
        }
        d.frees.push((start, end));
        st.open.resize(released, 0);
        drop(st);
        self.note(Change::FreeRange { obj, start, end });
        Ok(())
    }

    /// A private copy of a block's current contents (zeros for a hole),
    /// for a read-modify-write in the open txg.
    fn block_copy(&self, obj: u64, blkid: u64, bs: u64) -> Result<Vec<u8>> {
        let b = self.read_block(obj, blkid)?;
        private_copy(
            &*self.reader,
            obj,
            blkid,
            bs,
            b.as_ref().map(|b| b.as_slice()),
        )
    }

    /// Change one whole block of an object in place in the open txg: `f`
    /// gets the block's current contents (zeros for a hole) and edits them.
    /// The object's size grows to cover the block. For structures that
    /// live in blocks (directories): no copy in, no copy out.
    pub fn modify_block<R>(
        &self,
        obj: u64,
        blkid: u64,
        f: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> Result<R> {
        // The hold keeps the open txg open from the check to the change, so
        // the block read below is still the open txg's when it goes in.
        let _tx = self.tx();
        let dn = self.stat(obj)?;
        let bs = dn.datablksz as u64;
        if blkid >= dn.capacity(8) {
            return Err(Error::TooBig("write beyond the largest object size".into()));
        }
        let have = {
            let st = lock(&self.st);
            st.open
                .objs
                .get(&obj)
                .is_some_and(|d| d.blocks.contains_key(&blkid) && !d.partial.contains_key(&blkid))
        };
        // A copy of the current block (maybe a device read) without the
        // object set's lock; another writer may put the block in first, in
        // which case its version is the one to edit. (A partly written
        // block is filled in by the copy's read.)
        let copy = if have {
            None
        } else {
            Some(self.block_copy(obj, blkid, bs)?)
        };
        let mut guard = lock(&self.st);
        let st = &mut *guard;
        let d = st.open.objs.entry(obj).or_default();
        if d.partial.contains_key(&blkid) {
            // Only a write of part of the block races a change of it
            // here; the caller's locks exclude it.
            let why = format!("object {obj} block {blkid} was written in part during a change");
            self.gate.poison(&why);
            return Err(Error::Internal(why));
        }
        let block = match d.blocks.entry(blkid) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let Some(copy) = copy else {
                    // Only a free of the object or a punch in this txg
                    // removes an open block; the caller's locks exclude both.
                    let why =
                        format!("object {obj} block {blkid} left the open txg during a change");
                    self.gate.poison(&why);
                    return Err(Error::Internal(why));
                };
                st.open.bytes += bs;
                e.insert(copy.into())
            }
        };
        let r = f(Arc::make_mut(block));
        d.streamed.remove(&blkid);
        // The whole block as changed, for the intent log (a directory leaf).
        let logged = self.log.get().map(|_| Arc::clone(block));
        let end = (blkid + 1) * bs;
        let cur = d.size.unwrap_or(dn.size);
        d.size = Some(cur.max(end));
        drop(guard);
        if let Some(b) = logged {
            self.note(Change::Write {
                obj,
                offset: blkid * bs,
                data: &b,
            });
        }
        Ok(r)
    }

    /// Write `data` at `offset`; returns the dirty bytes this added.
    pub fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<u64> {
        let _tx = self.tx();
        let dn = self.stat(obj)?;
        let bs = dn.datablksz as u64;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| e / bs < dn.capacity(8))
            .ok_or_else(|| Error::TooBig("write beyond the largest object size".into()))?;
        let mut added = 0;
        // The intent log keeps a whole block by reference (no copy now;
        // written by pointer if large), a part by its bytes. Replaying
        // either grows the object to the write's end, as this write does.
        let logging = self.log.get().is_some();
        let mut whole: Vec<(u64, Arc<Vec<u8>>)> = Vec::new();
        let mut parts: Vec<(u64, &[u8])> = Vec::new();
        let mut pos = 0usize;
        while pos < data.len() {
            let off = offset + pos as u64;
            let (blkid, boff) = (off / bs, (off % bs) as usize);
            let n = (bs as usize - boff).min(data.len() - pos);
            let src = &data[pos..pos + n];
            let keep = logging && n == bs as usize;
            let mut kept = None;
            // Patch in place when the open txg already holds the block.
            let patched = {
                let mut st = lock(&self.st);
                let st = &mut *st;
                let d = st.open.objs.entry(obj).or_default();
                if d.blocks.contains_key(&blkid) {
                    let grew = d.patch(blkid, boff, src, bs as usize, &*self.reader);
                    if keep {
                        kept = d.blocks.get(&blkid).map(|b| Arc::clone(b));
                    }
                    st.open.bytes += grew;
                    added += grew;
                    true
                } else {
                    false
                }
            };
            if !patched {
                // `sparse`: a partial block, holding only the bytes
                // written; the sync fills in the rest (dmu/partial.rs).
                // A stream's record is checksummed now, while it is in
                // the cache from the copy (`dmu/dirty_block.rs`).
                let (block, sparse): (DirtyBlock, _) = if n == bs as usize {
                    let b = filled(&*self.reader, src);
                    if dn.checksum == ChecksumType::Fletcher4 && PAGE_CACHED.with(|d| d.get()) {
                        (DirtyBlock::summed(b), None)
                    } else {
                        (b.into(), None)
                    }
                } else {
                    match self.patch_base(obj, blkid, bs)? {
                        PatchBase::Copy(mut b) => {
                            b[boff..boff + n].copy_from_slice(src);
                            (b.into(), None)
                        }
                        PatchBase::Sparse(old) => (src.to_vec().into(), Some(old)),
                    }
                };
                let mut st = lock(&self.st);
                let st = &mut *st;
                let d = st.open.objs.entry(obj).or_default();
                match d.blocks.entry(blkid) {
                    // Another writer of this block got in first: apply this
                    // write on top of its version, not over it.
                    std::collections::btree_map::Entry::Occupied(_) => {
                        let grew = d.patch(blkid, boff, src, bs as usize, &*self.reader);
                        if keep {
                            kept = d.blocks.get(&blkid).map(|b| Arc::clone(b));
                        }
                        st.open.bytes += grew;
                        added += grew;
                    }
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let held = block.len() as u64;
                        let b = e.insert(block);
                        if keep {
                            kept = Some(Arc::clone(b));
                        }
                        if n == bs as usize && PAGE_CACHED.with(|d| d.get()) {
                            d.streamed.insert(blkid);
                        }
                        if let Some(old) = sparse {
                            d.partial.insert(blkid, Ranges::new(boff, boff + n));
                            self.reader.partial_event(partial::Event::Deferred);
                            // Its old version starts on its way to the
                            // cache now; nobody waits for it. Unless the
                            // kernel above a mount is to send it
                            // (`zpl/pagecache.rs`).
                            if let Some(bp) = old.filter(|_| !partial::deferring_here()) {
                                let reader = Arc::clone(&self.reader);
                                crate::zio::fill_taskq().dispatch(move || {
                                    let _ = crate::arc::prefetching(|| reader.read_bp(&bp));
                                });
                            }
                        }
                        st.open.bytes += held;
                        if n == bs as usize {
                            st.open.whole += bs;
                        }
                        added += held;
                    }
                }
            }
            if let Some(b) = kept {
                whole.push((blkid, b));
            } else if logging {
                parts.push((off, src));
            }
            pos += n;
        }
        let mut st = lock(&self.st);
        let txg = st.open.txg;
        let d = st.open.objs.entry(obj).or_default();
        let cur = d.size.unwrap_or(dn.size);
        d.size = Some(cur.max(end));
        drop(st);
        for (off, src) in parts {
            self.note(Change::Write {
                obj,
                offset: off,
                data: src,
            });
        }
        for (blkid, b) in whole {
            changelog::note_block(self, txg, obj, blkid, b);
        }
        Ok(added)
    }

    /// The intent log is about to write block `blkid` of `obj` early as an
    /// ordinary block: is `data` still that block's dirty buffer in `txg`
    /// (open, or frozen and not yet synced)? Returns the parameters the
    /// sync would write it with (so the block it adopts is the one it
    /// would have written). The caller holds the pool's allocator lock, so
    /// no sync runs meanwhile.
    pub fn prewrite_params(
        &self,
        txg: u64,
        obj: u64,
        blkid: u64,
        data: &Arc<Vec<u8>>,
    ) -> Option<WriteParams> {
        if !self.dirty_block_is(txg, obj, blkid, data) {
            return None;
        }
        let dn = self.stat(obj).ok()?;
        (dn.datablksz as usize == data.len()).then(|| l0_params(&dn))
    }

    fn dirty_block_is(&self, txg: u64, obj: u64, blkid: u64, data: &Arc<Vec<u8>>) -> bool {
        let st = lock(&self.st);
        let same = [Some(&st.open), st.syncing.as_deref()]
            .into_iter()
            .flatten()
            .find(|d| d.txg == txg)
            .and_then(|d| d.objs.get(&obj))
            .filter(|o| !o.freed && !o.partial.contains_key(&blkid))
            .and_then(|o| o.blocks.get(&blkid))
            .is_some_and(|b| Arc::ptr_eq(b, data));
        same
    }

    /// Register a block the intent log allocated for (`prewrite_params`,
    /// same lock held): the sync of `txg` adopts it if its write is durable
    /// by then and `data` is still the dirty buffer, and frees it otherwise
    /// once the write settled (`dmu/early_write.rs`).
    pub fn add_override(
        &self,
        txg: u64,
        obj: u64,
        blkid: u64,
        data: &Arc<Vec<u8>>,
        bp: BlkPtr,
        state: Arc<EarlyWrite>,
    ) {
        self.overrides.add((txg, obj, blkid), data, bp, state);
    }

    // ---- syncing --------------------------------------------------------

    /// Write out `dirty` (the syncing txg, or a later sync pass's changes) and
    /// the object-set block. Returns the new object-set block pointer.
    pub fn sync_pass(&self, w: &mut dyn BlockWriter, dirty: &TxgDirty) -> Result<BlkPtr> {
        let (mut meta, os_bp, space) = {
            let st = lock(&self.st);
            (st.meta.clone(), st.bp, st.space)
        };
        // An idle dataset whose last header still names log blocks that
        // are no longer needed is rewritten (its header only), or those
        // blocks stay lent until it changes again (found by the POSIX
        // suite: 49 MiB of log blocks held by an idle dataset).
        let log_wants = self.log.get().is_some_and(|l| l.wants_header(dirty.txg));
        let rewrite = self
            .rewrite
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        if dirty.is_empty()
            && !os_bp.is_hole()
            && !log_wants
            && !rewrite
            && !self.overrides.any_up_to(dirty.txg)
        {
            return Ok(os_bp);
        }
        let reader = &*self.reader;
        let mut counting = Counting {
            inner: w,
            used: 0,
            logical: 0,
        };
        let w = &mut counting;
        let mut changed = BTreeMap::new();
        for (&obj, d) in &dirty.objs {
            let old = self.synced_dnode(obj)?;
            let adopt = self.overrides.adoptable(dirty.txg, obj, &d.blocks);
            let new = sync_object(reader, w, old, d, &adopt)?;
            changed.insert(obj, new);
        }
        for bp in self.overrides.take_leftovers(dirty.txg) {
            w.free_unadopted(&bp);
        }
        let mut blocks: BTreeMap<u64, DirtyBlock> = BTreeMap::new();
        for (&obj, dn) in &changed {
            let blkid = obj / DNODES_PER_BLOCK;
            if let std::collections::btree_map::Entry::Vacant(e) = blocks.entry(blkid) {
                let cur = match read_tree_block(reader, &meta, blkid)? {
                    Some(b) => b,
                    None => Arc::new(vec![0u8; DNODE_BLOCK_SIZE as usize]),
                };
                e.insert(cur.into());
            }
            if let Some(b) = blocks.get_mut(&blkid) {
                let at = (obj % DNODES_PER_BLOCK) as usize * DNODE_SIZE;
                dn.encode(&mut Arc::make_mut(b)[at..at + DNODE_SIZE]);
            }
        }
        // A dnode block whose every dnode is free (all zero) is punched out
        // of the meta-dnode instead of written: a hole takes no space and
        // reads as zeros, which is what free dnodes are (OpenZFS gets the
        // same from compressing an all-zero block to a hole). Written, a
        // filesystem that created and deleted a million files kept 257 MB
        // of empty dnode blocks.
        let empty: Vec<u64> = blocks
            .iter()
            .filter(|(_, b)| b.iter().all(|&x| x == 0))
            .map(|(&k, _)| k)
            .collect();
        for k in &empty {
            blocks.remove(k);
        }
        if let Some((&last, _)) = blocks.last_key_value() {
            let end = (last + 1) * DNODE_BLOCK_SIZE as u64;
            meta.size = meta.size.max(end);
            let dnodes = DirtyObj {
                blocks,
                ..Default::default()
            };
            apply_blocks(reader, w, &mut meta, &dnodes, &BTreeMap::new())?;
        }
        for k in empty {
            free_range_tree(reader, w, &mut meta, k, k + 1)?;
        }
        // Everything beneath the object-set block is charged to it; the
        // block itself (1 KiB, written every txg) is not.
        let new_space = ObjsetSpace {
            used: (space.used as i64 + w.used).max(0) as u64,
            logical: (space.logical as i64 + w.logical).max(0) as u64,
        };
        let mut phys = encode_objset_phys(self.os_type, &meta, new_space);
        if let Some(log) = self.log.get() {
            let h = log.header(dirty.txg);
            phys[LOG_HEADER_OFF..LOG_HEADER_OFF + LOG_HEADER_SIZE].copy_from_slice(&h);
            if h.iter().any(|&x| x != 0) {
                w.note_feature(crate::spa::feature::INTENT_LOG);
            }
        }
        let new_bp = w.write_bp(
            &os_bp,
            &phys,
            WriteParams {
                obj_type: ot::OBJSET,
                level: 0,
                checksum: ChecksumType::Fletcher4,
                compress: Compression::Lz4,
                copies: if self.os_type == OS_TYPE_META { 3 } else { 2 },
                fill: meta.used_bytes.max(1),
            },
        )?;
        let tree = SyncedTree {
            space: new_space,
            bp: new_bp,
            meta,
            changed,
        };
        let mut st = lock(&self.st);
        if self.os_type == OS_TYPE_META {
            st.publish(tree);
        } else {
            debug_assert!(st.pending.is_none(), "two sync passes of a dataset");
            st.pending = Some(tree);
        }
        Ok(new_bp)
    }

    /// Free every block of this object set born after `min_txg` (0:
    /// every block), from its last synced state, in one go. A subtree born
    /// at or before `min_txg` is skipped whole. (The pool frees destroyed
    /// sets in the background, a budget per txg: `dsl/async_destroy.rs`.)
    pub fn free_born_after(&self, w: &mut dyn BlockWriter, min_txg: u64) -> Result<()> {
        let bp = lock(&self.st).bp;
        let mut all = crate::dsl::async_destroy::Budget::ALL;
        let mut f = crate::dsl::async_destroy::Freer::new(w, &mut all);
        traverse::walk_objset(&*self.reader, &bp, min_txg + 1, Position::START, &mut f);
        f.result()
    }

    /// Object numbers whose dnodes may differ from the set as of `min_txg`:
    /// every slot of each dnode block born after it (the rest of the
    /// meta-dnode's tree, born by then, is skipped whole). From the last
    /// synced state. `zfs diff` (`zpl/diff.rs`).
    pub fn objects_changed_after(&self, min_txg: u64) -> Result<Vec<u64>> {
        struct Changed {
            out: Vec<u64>,
            err: Option<Error>,
        }
        impl Visitor for Changed {
            fn pre(&mut self, bp: &BlkPtr, at: &At) -> Next {
                if at.kind == Kind::Dnodes && bp.level == 0 {
                    let per = DNODES_PER_BLOCK;
                    self.out.extend(at.blkid * per..(at.blkid + 1) * per);
                    return Next::Skip;
                }
                Next::Descend
            }
            fn error(&mut self, _at: &At, e: Error) {
                self.err.get_or_insert(e);
            }
        }
        let bp = lock(&self.st).bp;
        let mut v = Changed {
            out: Vec::new(),
            err: None,
        };
        traverse::walk_objset(&*self.reader, &bp, min_txg + 1, Position::START, &mut v);
        match v.err {
            Some(e) => Err(e),
            None => Ok(v.out),
        }
    }

    /// The next sync writes this set's object-set block even if nothing
    /// changed: a head rolled back to a snapshot must get a block of its
    /// own (the snapshot keeps its) and an empty log header.
    pub fn rewrite_root(&self) {
        self.rewrite
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A sync-context rewrite: object `obj` holds `data` from `offset` to
    /// its end (a JSON document, a record, a whole list), whatever it held
    /// there before.
    pub fn replace_in_sync(
        &self,
        into: &mut TxgDirty,
        obj: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        if !data.is_empty() {
            self.write_in_sync(into, obj, offset, data)?;
        }
        into.objs.entry(obj).or_default().size = Some(offset + data.len() as u64);
        Ok(())
    }

    /// A sync-context read (MOS passes after the first): block `blkid` of
    /// `obj` as the synced tree holds it under what `into` changed.
    pub fn read_in_sync(
        &self,
        into: &TxgDirty,
        obj: u64,
        blkid: u64,
    ) -> Result<Option<Arc<Vec<u8>>>> {
        let d = into.objs.get(&obj);
        if let Some(b) = d.and_then(|o| o.blocks.get(&blkid)) {
            return Ok(Some(Arc::clone(b)));
        }
        if d.is_some_and(|o| o.freed || o.punched(blkid)) {
            return Ok(None);
        }
        let dn = match d.and_then(|o| o.create.clone()) {
            Some(_) => return Ok(None),
            None => self.synced_dnode(obj)?,
        };
        if dn.is_free() {
            return Err(Error::invalid(format!("sync read of free object {obj}")));
        }
        read_tree_block(&*self.reader, &dn, blkid)
    }

    /// A sync-context punch of level-0 blocks `[start, end)` into `into`.
    pub fn free_range_in_sync(&self, into: &mut TxgDirty, obj: u64, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let d = into.objs.entry(obj).or_default();
        let doomed: Vec<u64> = d.blocks.range(start..end).map(|(&k, _)| k).collect();
        for k in doomed {
            d.blocks.remove(&k);
        }
        d.frees.push((start, end));
    }

    /// A sync-context write (MOS passes after the first): read-modify-write
    /// against the synced tree into `into`, which the caller syncs next.
    pub fn write_in_sync(
        &self,
        into: &mut TxgDirty,
        obj: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let dn = match into.objs.get(&obj).and_then(|o| o.create.clone()) {
            Some(c) => c,
            None => self.synced_dnode(obj)?,
        };
        if dn.is_free() {
            return Err(Error::invalid(format!("sync write to free object {obj}")));
        }
        let bs = dn.datablksz as u64;
        let mut pos = 0usize;
        let mut size = into.objs.get(&obj).and_then(|o| o.size).unwrap_or(dn.size);
        while pos < data.len() {
            let off = offset + pos as u64;
            let (blkid, boff) = (off / bs, (off % bs) as usize);
            let n = (bs as usize - boff).min(data.len() - pos);
            let have = into
                .objs
                .get(&obj)
                .and_then(|o| o.blocks.get(&blkid))
                .map(|b| Arc::clone(b));
            // A write that covers the block whole needs nothing of it.
            let mut block = match have {
                Some(b) => b,
                None if n == bs as usize => Arc::new(vec![0u8; bs as usize]),
                None => match read_tree_block(&*self.reader, &dn, blkid)? {
                    Some(b) => b,
                    None => Arc::new(vec![0u8; bs as usize]),
                },
            };
            Arc::make_mut(&mut block)[boff..boff + n].copy_from_slice(&data[pos..pos + n]);
            into.objs
                .entry(obj)
                .or_default()
                .blocks
                .insert(blkid, block.into());
            pos += n;
            size = size.max(off + n as u64);
        }
        into.objs.entry(obj).or_default().size = Some(size);
        Ok(())
    }
}

/// Counts the space a sync pass allocates and frees under one object set.
struct Counting<'a> {
    inner: &'a mut dyn BlockWriter,
    used: i64,
    logical: i64,
}

impl Counting<'_> {
    fn charge(&mut self, old: &BlkPtr, new: &BlkPtr) {
        self.used += self.inner.dsize(new) as i64 - self.inner.dsize(old) as i64;
        self.logical += new.lsize as i64 - old.lsize as i64;
    }
}

impl BlockWriter for Counting<'_> {
    fn txg(&self) -> u64 {
        self.inner.txg()
    }
    fn note_feature(&mut self, name: &'static str) {
        self.inner.note_feature(name)
    }
    fn read_again(
        &mut self,
        err: Error,
        read: &mut dyn FnMut() -> Result<Arc<Vec<u8>>>,
    ) -> Result<Arc<Vec<u8>>> {
        self.inner.read_again(err, read)
    }
    fn dsize(&self, bp: &BlkPtr) -> u64 {
        self.inner.dsize(bp)
    }
    fn waiting(&mut self) {
        self.inner.waiting()
    }
    fn write_bp(&mut self, old: &BlkPtr, data: &[u8], wp: WriteParams) -> Result<BlkPtr> {
        let new = self.inner.write_bp(old, data, wp)?;
        self.charge(old, &new);
        Ok(new)
    }
    fn free_bp(&mut self, bp: &BlkPtr) {
        self.used -= self.inner.dsize(bp) as i64;
        self.logical -= bp.lsize as i64;
        self.inner.free_bp(bp)
    }
    fn adopt(&mut self, old: &BlkPtr, new: &BlkPtr) {
        self.charge(old, new);
        self.inner.adopt(old, new)
    }
    fn free_unadopted(&mut self, bp: &BlkPtr) {
        self.inner.free_unadopted(bp)
    }
    fn write_batch(&mut self, items: &[BatchBlock<'_>], wp: WriteParams) -> Result<Vec<BlkPtr>> {
        let new = self.inner.write_batch(items, wp)?;
        for (b, n) in items.iter().zip(&new) {
            self.charge(&b.old, n);
        }
        Ok(new)
    }
}

fn l0_params(dn: &DnodePhys) -> WriteParams {
    WriteParams {
        obj_type: dn.obj_type,
        level: 0,
        checksum: dn.checksum,
        compress: dn.compress,
        copies: dn.copies,
        fill: 1,
    }
}

fn indirect_params(dn: &DnodePhys, level: u8, fill: u64) -> WriteParams {
    WriteParams {
        obj_type: dn.obj_type,
        level,
        checksum: dn.checksum,
        compress: Compression::Lz4,
        copies: (dn.copies + 1).min(3),
        fill,
    }
}

/// Apply one txg's changes to one object; returns its new dnode.
fn sync_object(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    old: DnodePhys,
    d: &DirtyObj,
    adopt: &BTreeMap<u64, BlkPtr>,
) -> Result<DnodePhys> {
    let mut dn = old;
    if let Some(c) = &d.create {
        if !dn.is_free() {
            free_tree(reader, w, &dn)?;
        }
        dn = c.clone();
    }
    if d.freed {
        if !dn.is_free() {
            free_tree(reader, w, &dn)?;
        }
        return Ok(DnodePhys::free());
    }
    if dn.is_free() {
        return Err(Error::invalid("sync of changes to a free object"));
    }
    if let Some(bs) = d.blksz {
        // The one old block (if any) is replaced by block 0 in `blocks`.
        free_tree(reader, w, &dn)?;
        dn.blkptr = [BlkPtr::HOLE; 3];
        dn.nlevels = 1;
        dn.used_bytes = 0;
        dn.maxblkid = 0;
        dn.datablksz = bs;
    }
    for &(start, end) in &d.frees {
        free_range_tree(reader, w, &mut dn, start, end)?;
    }
    if !d.blocks.is_empty() {
        apply_blocks(reader, w, &mut dn, d, adopt)?;
    }
    if let Some(s) = d.size {
        dn.size = s;
    }
    if let Some(b) = d.bonus {
        dn.bonus = b;
    }
    Ok(dn)
}

/// The most bytes of partly written records one batch of a sync fills in
/// and holds whole at once (`apply_blocks`).
const FILL_BATCH_BYTES: usize = 32 << 20;

/// Write changed level-0 blocks and every indirect block above them.
fn apply_blocks(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    dn: &mut DnodePhys,
    d: &DirtyObj,
    adopt: &BTreeMap<u64, BlkPtr>,
) -> Result<()> {
    let (blocks, streamed) = (&d.blocks, &d.streamed);
    let max = match blocks.last_key_value() {
        Some((&k, _)) => k,
        None => return Ok(()),
    };
    let mut used = dn.used_bytes as i64;
    // Grow the tree until it can address `max`: the old top pointers become
    // the first entries of a new indirect block one level up.
    while dn.capacity(dn.nlevels) <= max {
        if dn.nlevels >= 8 {
            return Err(Error::invalid("object too large"));
        }
        if dn.blkptr.iter().all(|b| b.is_hole()) {
            dn.nlevels += 1;
            continue;
        }
        let mut children = vec![BlkPtr::HOLE; dn.epb() as usize];
        children[..3].copy_from_slice(&dn.blkptr);
        let fill = children.iter().map(|c| c.fill).sum();
        let bp = w.write_bp(
            &BlkPtr::HOLE,
            &encode_indirect(&children),
            indirect_params(dn, dn.nlevels, fill),
        )?;
        used += w.dsize(&bp) as i64;
        dn.blkptr = [bp, BlkPtr::HOLE, BlkPtr::HOLE];
        dn.nlevels += 1;
    }
    // Level 0 through the I/O pipeline: blocks the intent log already
    // wrote are adopted as they are. Partly written records get the rest
    // of their bytes from their old versions, read together
    // (dmu/partial.rs), in batches of at most `FILL_BATCH_BYTES` of
    // filled records: a txg of 4 KiB patches in thousands of records
    // holds only the patches, and the sync must not hold every record
    // whole at once either. Without partial blocks, one batch.
    let keys: Vec<u64> = blocks.keys().copied().collect();
    let per_batch = (FILL_BATCH_BYTES / (dn.datablksz as usize).max(1)).max(1);
    let mut items: Vec<(u64, BlkPtr)> = Vec::with_capacity(keys.len());
    let mut rest = &keys[..];
    while !rest.is_empty() {
        let mut end = 0;
        let mut partials = 0;
        while end < rest.len() && partials < per_batch {
            partials += usize::from(d.partial.contains_key(&rest[end]));
            end += 1;
        }
        let (chunk, more) = rest.split_at(end);
        rest = more;
        let whole = fill_partial(reader, w, dn, d, chunk)?;
        let mut olds = Vec::with_capacity(chunk.len());
        // `chunk` is a non-empty run of `blocks`' keys, in order.
        for (&blkid, block) in blocks.range(chunk[0]..=chunk[chunk.len() - 1]) {
            // A partly written record filled in has no sum (it was never
            // written whole).
            let (data, sum) = match whole.get(&blkid) {
                Some(w) => (w, None),
                None => (&**block, block.fletcher4()),
            };
            if data.len() != dn.datablksz as usize {
                return Err(Error::invalid("dirty block of the wrong size"));
            }
            let old = find_l0_bp(reader, dn, blkid)?.unwrap_or(BlkPtr::HOLE);
            match adopt
                .get(&blkid)
                .filter(|_| !d.partial.contains_key(&blkid))
            {
                Some(bp) if bp.lsize as usize == data.len() => {
                    w.adopt(&old, bp);
                    used += w.dsize(bp) as i64 - w.dsize(&old) as i64;
                    reader.written(bp, data, streamed.contains(&blkid));
                    items.push((blkid, *bp));
                }
                _ => olds.push((blkid, old, data, sum)),
            }
        }
        let batch: Vec<BatchBlock<'_>> = olds
            .iter()
            .map(|&(_, old, data, fletcher4)| BatchBlock {
                old,
                data,
                fletcher4,
            })
            .collect();
        let new_l0 = w.write_batch(&batch, l0_params(dn))?;
        for ((blkid, old, data, _), new) in olds.iter().zip(new_l0) {
            used += w.dsize(&new) as i64 - w.dsize(old) as i64;
            if !new.is_hole() {
                reader.written(&new, data, streamed.contains(blkid));
            }
            items.push((*blkid, new));
        }
    }
    items.sort_by_key(|i| i.0);
    let span = dn.capacity(dn.nlevels) / 3;
    let top_level = dn.nlevels - 1;
    let snapshot = dn.clone();
    let mut i = 0;
    while i < items.len() {
        let slot = (items[i].0 / span) as usize;
        let mut j = i;
        while j < items.len() && (items[j].0 / span) as usize == slot {
            j += 1;
        }
        let old = dn.blkptr[slot];
        let new = sync_node(
            reader,
            w,
            &snapshot,
            &old,
            top_level,
            slot as u64 * span,
            span,
            &items[i..j],
            &mut used,
        )?;
        dn.blkptr[slot] = new;
        i = j;
    }
    dn.maxblkid = dn.maxblkid.max(max);
    dn.used_bytes = used.max(0) as u64;
    Ok(())
}

/// The whole contents of every partly written block of `d` among
/// `blkids`: its old
/// version under `dn` (as the sync found it, after the txg's punches)
/// with the written ranges laid over it. The old versions are read at
/// once on the `uzfs-zio-read` threads; a read that fails is tried again
/// through the writer, which may park the sync until the devices are
/// back (`BlockWriter::read_again`).
fn fill_partial(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    dn: &DnodePhys,
    d: &DirtyObj,
    blkids: &[u64],
) -> Result<BTreeMap<u64, Arc<Vec<u8>>>> {
    // (block, its old version, what was written, where)
    type Todo<'a> = (u64, Option<BlkPtr>, &'a Arc<Vec<u8>>, &'a Ranges);
    let bs = dn.datablksz as usize;
    let mut todo: Vec<Todo> = Vec::new();
    for (&blkid, ranges) in blkids.iter().filter_map(|k| d.partial.get_key_value(k)) {
        let Some(data) = d.blocks.get(&blkid) else {
            return Err(Error::Internal(format!(
                "partly written block {blkid} has no buffer"
            )));
        };
        todo.push((blkid, find_l0_bp(reader, dn, blkid)?, data, ranges));
    }
    if todo.is_empty() {
        return Ok(BTreeMap::new());
    }
    // Per block: `None` if its read panicked.
    type Read = Option<Result<Option<Arc<Vec<u8>>>>>;
    let reads: Vec<Read> = crate::zio::read_taskq().scope(|q| {
        let tasks: Vec<_> = todo
            .iter()
            .map(|(_, old, _, _)| {
                let old = *old;
                // As read-ahead: the async-read class, and the old
                // version enters the cache as prefetched, the first to go
                // (the sync is about to replace it).
                q.spawn(move || {
                    crate::arc::prefetching(|| old.map(|bp| reader.read_bp(&bp)).transpose())
                })
            })
            .collect();
        // Joined one at a time, answering the intent log between them:
        // hundreds of records read here take a second, and an fsync that
        // needs log space meanwhile would otherwise wait for the whole
        // sync (its request is answered only at an allocation).
        tasks
            .into_iter()
            .map(|t| {
                let r = t.join();
                w.waiting();
                r
            })
            .collect()
    });
    let mut out = BTreeMap::new();
    for ((blkid, old, data, ranges), read) in todo.into_iter().zip(reads) {
        let base = match (old, read) {
            (_, Some(Ok(b))) => b,
            (Some(bp), Some(Err(e))) => Some(w.read_again(e, &mut || reader.read_bp(&bp))?),
            (None, Some(Err(e))) => return Err(e),
            (_, None) => {
                return Err(Error::Internal(
                    "a partly written block's read panicked".into(),
                ))
            }
        };
        out.insert(blkid, Arc::new(partial::merge(base, data, ranges, bs)?));
        reader.partial_event(partial::Event::FilledBySync);
    }
    Ok(out)
}

/// Rewrite the subtree under `old` (at `level`, covering `span` level-0 blocks
/// from `base`) with `changes` applied; returns its new pointer.
#[allow(clippy::too_many_arguments)]
fn sync_node(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    dn: &DnodePhys,
    old: &BlkPtr,
    level: u8,
    base: u64,
    span: u64,
    changes: &[(u64, BlkPtr)],
    used: &mut i64,
) -> Result<BlkPtr> {
    if level == 0 {
        // Already written by the batch in `apply_blocks`.
        debug_assert_eq!(changes.len(), 1);
        return Ok(changes[0].1);
    }
    let mut children = if old.is_hole() {
        vec![BlkPtr::HOLE; dn.epb() as usize]
    } else {
        decode_indirect(&reader.read_bp(old)?, level)?
    };
    let child_span = span / dn.epb();
    let mut i = 0;
    while i < changes.len() {
        let idx = ((changes[i].0 - base) / child_span) as usize;
        let mut j = i;
        while j < changes.len() && ((changes[j].0 - base) / child_span) as usize == idx {
            j += 1;
        }
        let child = children[idx];
        children[idx] = sync_node(
            reader,
            w,
            dn,
            &child,
            level - 1,
            base + idx as u64 * child_span,
            child_span,
            &changes[i..j],
            used,
        )?;
        i = j;
    }
    rewrite_indirect(w, dn, old, level, &children, used)
}

/// Write the new version of indirect block `old` (at `level`) holding
/// `children`, charging the size change to `used`.
fn rewrite_indirect(
    w: &mut dyn BlockWriter,
    dn: &DnodePhys,
    old: &BlkPtr,
    level: u8,
    children: &[BlkPtr],
    used: &mut i64,
) -> Result<BlkPtr> {
    let fill = children.iter().map(|c| c.fill).sum();
    let new = w.write_bp(
        old,
        &encode_indirect(children),
        indirect_params(dn, level, fill),
    )?;
    *used += w.dsize(&new) as i64 - w.dsize(old) as i64;
    Ok(new)
}

/// Punch level-0 blocks `[start, end)` out of the tree under `dn`.
fn free_range_tree(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    dn: &mut DnodePhys,
    start: u64,
    end: u64,
) -> Result<()> {
    let span = dn.capacity(dn.nlevels) / 3;
    let snapshot = dn.clone();
    let mut used = dn.used_bytes as i64;
    for slot in 0..3u64 {
        let base = slot * span;
        if base >= end || base.saturating_add(span) <= start {
            continue;
        }
        let old = dn.blkptr[slot as usize];
        dn.blkptr[slot as usize] = free_node(
            reader,
            w,
            &snapshot,
            &old,
            dn.nlevels - 1,
            (base, span),
            (start, end),
            &mut used,
        )?;
    }
    dn.used_bytes = used.max(0) as u64;
    Ok(())
}

/// The subtree under `old` (covering `span` level-0 blocks from `base`) with
/// the blocks in `range` punched out; a subtree left empty becomes a hole.
#[allow(clippy::too_many_arguments)]
fn free_node(
    reader: &dyn BlockReader,
    w: &mut dyn BlockWriter,
    dn: &DnodePhys,
    old: &BlkPtr,
    level: u8,
    (base, span): (u64, u64),
    (start, end): (u64, u64),
    used: &mut i64,
) -> Result<BlkPtr> {
    if old.is_hole() {
        return Ok(BlkPtr::HOLE);
    }
    if start <= base && base.saturating_add(span) <= end {
        *used -= free_subtree(reader, w, old)? as i64;
        return Ok(BlkPtr::HOLE);
    }
    debug_assert!(
        level > 0,
        "a level-0 block is either inside the range or not"
    );
    let mut children = decode_indirect(&reader.read_bp(old)?, level)?;
    let child_span = span / dn.epb();
    for (idx, child) in children.iter_mut().enumerate() {
        let cbase = base + idx as u64 * child_span;
        if cbase >= end || cbase + child_span <= start || child.is_hole() {
            continue;
        }
        *child = free_node(
            reader,
            w,
            dn,
            child,
            level - 1,
            (cbase, child_span),
            (start, end),
            used,
        )?;
    }
    if children.iter().all(|c| c.is_hole()) {
        *used -= w.dsize(old) as i64;
        w.free_bp(old);
        return Ok(BlkPtr::HOLE);
    }
    rewrite_indirect(w, dn, old, level, &children, used)
}

/// Free every block of an object.
pub fn free_tree(reader: &dyn BlockReader, w: &mut dyn BlockWriter, dn: &DnodePhys) -> Result<()> {
    for bp in dn.blkptr.iter().filter(|b| !b.is_hole()) {
        free_subtree(reader, w, bp)?;
    }
    Ok(())
}

/// Free `bp` and everything beneath it; returns the allocated bytes freed.
fn free_subtree(reader: &dyn BlockReader, w: &mut dyn BlockWriter, bp: &BlkPtr) -> Result<u64> {
    let mut freed = 0;
    if bp.level > 0 {
        for c in decode_indirect(&reader.read_bp(bp)?, bp.level)? {
            if !c.is_hole() {
                freed += free_subtree(reader, w, &c)?;
            }
        }
    }
    let d = w.dsize(bp);
    w.free_bp(bp);
    Ok(freed + d)
}

pub fn encode_indirect(children: &[BlkPtr]) -> Vec<u8> {
    let mut out = vec![0u8; children.len() * BLKPTR_SIZE];
    for (i, c) in children.iter().enumerate() {
        c.encode(&mut out[i * BLKPTR_SIZE..(i + 1) * BLKPTR_SIZE]);
    }
    out
}

/// Decode an indirect block at `level`; every child must be one level down.
pub fn decode_indirect(b: &[u8], level: u8) -> Result<Vec<BlkPtr>> {
    let mut out = Vec::with_capacity(b.len() / BLKPTR_SIZE);
    for chunk in b.chunks_exact(BLKPTR_SIZE) {
        let bp = BlkPtr::decode(chunk)?;
        if !bp.is_hole() && bp.level + 1 != level {
            return Err(Error::corrupt(
                "indirect block",
                format!("child level {} under level {level}", bp.level),
            ));
        }
        out.push(bp);
    }
    Ok(out)
}

/// Read level-0 block `blkid` of the tree under `dn`, or `None` for a hole.
pub fn read_tree_block(
    reader: &dyn BlockReader,
    dn: &DnodePhys,
    blkid: u64,
) -> Result<Option<Arc<Vec<u8>>>> {
    Ok(read_tree_block_bp(reader, dn, blkid)?.map(|(_, d)| d))
}

/// [`read_tree_block`], with the block's pointer.
fn read_tree_block_bp(
    reader: &dyn BlockReader,
    dn: &DnodePhys,
    blkid: u64,
) -> Result<Option<(BlkPtr, Arc<Vec<u8>>)>> {
    let bp = match find_l0_bp(reader, dn, blkid)? {
        Some(bp) => bp,
        None => return Ok(None),
    };
    let data = reader.read_bp(&bp)?;
    if data.len() != dn.datablksz as usize {
        return Err(Error::corrupt(
            "data block",
            format!("size {} != object block size {}", data.len(), dn.datablksz),
        ));
    }
    Ok(Some((bp, data)))
}

/// The level-0 block pointer of `blkid`, or `None` for a hole.
pub fn find_l0_bp(reader: &dyn BlockReader, dn: &DnodePhys, blkid: u64) -> Result<Option<BlkPtr>> {
    if dn.is_free() || blkid >= dn.capacity(dn.nlevels) {
        return Ok(None);
    }
    let epb = dn.epb();
    let mut span = dn.capacity(dn.nlevels) / 3; // L0 blocks under each top pointer
    let mut bp = dn.blkptr[(blkid / span) as usize];
    let mut rel = blkid % span;
    let mut level = dn.nlevels - 1;
    while level > 0 {
        if bp.is_hole() {
            return Ok(None);
        }
        if bp.level != level {
            return Err(Error::corrupt(
                "indirect block",
                format!("level {} where {level} expected", bp.level),
            ));
        }
        let ind = reader.read_bp(&bp)?;
        span /= epb;
        let idx = (rel / span) as usize;
        rel %= span;
        bp = BlkPtr::decode(
            ind.get(idx * BLKPTR_SIZE..(idx + 1) * BLKPTR_SIZE)
                .ok_or_else(|| Error::corrupt("indirect block", "short indirect block"))?,
        )?;
        level -= 1;
    }
    Ok(if bp.is_hole() { None } else { Some(bp) })
}

pub fn decode_objset_phys(b: &[u8]) -> Result<(u64, DnodePhys)> {
    use super::blkptr::le64;
    if b.len() < OBJSET_PHYS_SIZE {
        return Err(Error::corrupt("objset", "truncated"));
    }
    if le64(b, 0) != OBJSET_MAGIC {
        return Err(Error::corrupt("objset", "bad magic"));
    }
    if le64(b, 8) != OBJSET_VERSION {
        return Err(Error::corrupt(
            "objset",
            format!("unknown version {}", le64(b, 8)),
        ));
    }
    let t = le64(b, 16);
    if t != OS_TYPE_META && t != OS_TYPE_DATASET {
        return Err(Error::corrupt("objset", format!("unknown type {t}")));
    }
    let meta = DnodePhys::decode(&b[64..64 + DNODE_SIZE])?;
    if meta.obj_type != ot::DNODE {
        return Err(Error::corrupt("objset", "meta-dnode has wrong type"));
    }
    Ok((t, meta))
}

/// The space counters of an object-set block (bytes 24..40).
pub fn decode_objset_space(b: &[u8]) -> ObjsetSpace {
    use super::blkptr::le64;
    if b.len() < 40 {
        return ObjsetSpace::default();
    }
    ObjsetSpace {
        used: le64(b, 24),
        logical: le64(b, 32),
    }
}

pub fn encode_objset_phys(os_type: u64, meta: &DnodePhys, space: ObjsetSpace) -> Vec<u8> {
    let mut b = vec![0u8; OBJSET_PHYS_SIZE];
    b[0..8].copy_from_slice(&OBJSET_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&OBJSET_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&os_type.to_le_bytes());
    b[24..32].copy_from_slice(&space.used.to_le_bytes());
    b[32..40].copy_from_slice(&space.logical.to_le_bytes());
    meta.encode(&mut b[64..64 + DNODE_SIZE]);
    b
}

#[cfg(test)]
mod patch_tests {
    use super::{patch_block, BlockReader};
    use crate::dmu::blkptr::BlkPtr;
    use std::sync::Arc;

    /// No cache, no recycled buffers.
    struct NoCache;
    impl BlockReader for NoCache {
        fn read_bp(&self, _bp: &BlkPtr) -> crate::error::Result<Arc<Vec<u8>>> {
            Err(crate::error::Error::invalid("no reads here"))
        }
    }

    /// A holder of the old buffer (a log record) keeps its bytes; a weak
    /// holder (an override) sees the buffer change identity; the block
    /// reads the new bytes in every case.
    #[test]
    fn a_patched_block_never_changes_what_another_holder_sees() {
        // Whole rewrite of a shared buffer: replaced.
        let mut b = Arc::new(vec![1u8; 64]);
        let record = Arc::clone(&b);
        patch_block(&mut b, 0, &[2u8; 64], &NoCache);
        assert_eq!(*record, vec![1u8; 64]);
        assert_eq!(*b, vec![2u8; 64]);
        // Part of a shared buffer: copied, then patched.
        let record = Arc::clone(&b);
        patch_block(&mut b, 8, &[3u8; 8], &NoCache);
        assert_eq!(*record, vec![2u8; 64]);
        assert_eq!(&b[8..16], &[3u8; 8]);
        assert_eq!(b[16], 2);
        // Only a weak holder: patched in a new allocation, so the weak
        // one no longer names the block's buffer.
        let weak = Arc::downgrade(&b);
        let before = Arc::as_ptr(&b);
        patch_block(&mut b, 0, &[4u8; 64], &NoCache);
        assert!(weak.upgrade().is_none());
        assert!(!std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&b)));
        assert!(!std::ptr::eq(before, Arc::as_ptr(&b)));
        assert_eq!(*b, vec![4u8; 64]);
        // Nobody else: patched in place.
        let here = Arc::as_ptr(&b);
        patch_block(&mut b, 60, &[5u8; 4], &NoCache);
        assert!(std::ptr::eq(here, Arc::as_ptr(&b)));
        assert_eq!(&b[56..], &[4, 4, 4, 4, 5, 5, 5, 5]);
    }
}
