//! The ZFS Intent Log: synchronous semantics without waiting for a txg.
//!
//! # Theory of operation
//!
//! A txg commit writes every dirty block of the pool and two rounds of
//! flushes; an `fsync` that waited for one (as uzfs did before this module)
//! paid that for 4 KiB. The intent log makes an `fsync` cost one log write
//! and one flush, as OpenZFS's `zil.c` does:
//!
//! * **Records.** Every change an operation makes to its dataset's object
//!   set is encoded as it is made (`dmu/changelog.rs`) and handed to the
//!   dataset's `Zil` as one record, tagged with the txg the operation held,
//!   while the operation still holds its locks (so the log's order is the
//!   order in which operations on one object happened). Records live in
//!   memory (`ZilState::queue`) until their txg commits, when they are
//!   dropped: the txg made them durable. The memory they take is bounded
//!   (`Tunables::zil_mem_max` per dataset): past it the log stops recording
//!   the open txg and an `fsync` that needs it waits for the txg instead.
//!
//! * **Commit** (`Zil::commit`). Everything recorded before the call must
//!   be on stable storage when it returns. The log is written as a prefix:
//!   a commit writes *every* record queued, in order, not only the caller's
//!   file's, so a replayed log is always the whole sequence of changes
//!   after the last committed txg up to some point (a file fsynced after a
//!   rename is found under its new name; nothing is applied without what
//!   came before it). OpenZFS keeps writes of other files out of an fsync
//!   (per-object async lists); uzfs's records are changes of blocks and
//!   bonus buffers, where leaving one out could put a size without its
//!   data, so it does not, and bounds the cost instead with the memory
//!   bound above.
//!
//! * **Group commit**, pipelined. One commit at a time lays a batch out:
//!   it takes everything queued by then and places it in the chain's next
//!   blocks, so one log write and one flush serve every waiter whose
//!   records it carries. It then writes the batch while the next commit
//!   lays out the next one (up to `Tunables::zil_inflight` batches in
//!   flight). Writes end in any order; a batch counts as durable only once
//!   every older one is written (replay stops at the first missing
//!   block), and a failed one sends itself and every later batch back to
//!   the queue (`ZilState::settle`). The next block's size is the size the
//!   last batch needed.
//!
//! * **On disk** (docs/ON_DISK_FORMAT.md, "Intent log"). A dataset's log is
//!   a chain of blocks. Each block carries the chain's guid, its sequence
//!   number, an embedded checksum, and the location of the next block,
//!   allocated before this one is written. The object-set block's log
//!   header names the first block still needed. Replay reads a block only
//!   if its guid and sequence number are the ones the previous link
//!   promised and its checksum matches, so it stops exactly at the first
//!   block that was never written (a torn block, or a stale one from an
//!   earlier use of the space, never passes). Records are framed in a byte
//!   stream across blocks (length, txg, bytes); a record whose tail block
//!   is missing was never acknowledged and is dropped whole.
//!
//! * **Which blocks are needed.** The header written with txg T points at
//!   the first block holding a record of a txg after T (or the next block
//!   to be written). Blocks before it are freed when T commits: only then
//!   does no committed header reach them. A dataset whose object set is
//!   not rewritten in a txg keeps its older header; no block at or after
//!   that header's head is freed until a newer header commits.
//!
//! * **The first commit** of a chain waits for a txg: the header must be on
//!   disk before a commit can rely on the chain it names (OpenZFS's
//!   `zil_create` does the same). Later commits only write log blocks.
//!
//! * **Space** comes from the log allocation class (`spa/log_space.rs`);
//!   when it has none (a full pool, a sync holding the allocator), a commit
//!   falls back to waiting for the txg, which is always correct.
//!
//! * **Replay** (`replay_chain`, at import before anything is allocated or
//!   served): the chain is walked, every block it reaches is claimed from
//!   the free space, the records of txgs after the committed one are
//!   applied to the object set, and the next txg commits them together with
//!   a header that no longer names the old chain: replayed once, or (a
//!   crash during replay) again from the same start to the same result.

mod replay;

pub use replay::ReplayReport;

use crate::dmu::blkptr::{le32, le64, BlkPtr, Dva};
use crate::dmu::changelog::{self, ChangeLog, LOG_HEADER_SIZE};
use crate::dmu::checksum::fletcher4;
use crate::dmu::early_write::EarlyWrite;
use crate::dmu::objset::Objset;
use crate::error::{Error, Result};
use crate::spa::log_space::{LogLoc, MAX_BLOCK};
use crate::spa::Pool;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How long a commit that found no log space waits for a running sync to
/// lend some (`LogSpace::request`) before it waits for the txg instead.
const LEND_WAIT: Duration = Duration::from_millis(100);

/// "UZFSZIL1" little-endian.
const BLOCK_MAGIC: u64 = 0x314c_495a_5346_5a55;
/// Bytes of a log block's header (see ON_DISK_FORMAT.md).
pub const BLOCK_HDR: usize = 96;
/// Bytes of a record's frame header: length (u32), txg (u64).
const FRAME_HDR: usize = 12;
/// Log blocks are written in units of this many bytes.
const BLOCK_ALIGN: u32 = 4096;
const NO_FRAME: u32 = u32::MAX;

/// One operation's record, waiting to be written or dropped.
struct Itx {
    seq: u64,
    txg: u64,
    /// In memory form: may name whole blocks of `blocks` (`BLOCK_REF`),
    /// turned into copies or pointers when written (`changelog::resolve`).
    rec: Vec<u8>,
    blocks: Vec<Arc<Vec<u8>>>,
}

impl Itx {
    /// Memory the record holds (the blocks are shared with the dirty data,
    /// but a later write of one in the same txg copies it).
    fn bytes(&self) -> u64 {
        self.rec.len() as u64 + self.blocks.iter().map(|b| b.len() as u64).sum::<u64>()
    }
}

/// Whole blocks at least this large are written once as ordinary blocks
/// and logged by pointer (OpenZFS's `zfs_immediate_write_sz`), unless the
/// pool has log devices (then they are copied to the log device, which
/// exists to take them) or `logbias=throughput` (then every whole block is).
pub const INDIRECT_MIN: usize = 32 << 10;

/// A data block the log writes early, as an ordinary block of its txg.
struct Prewrite {
    bp: BlkPtr,
    /// Its bytes as written: the dirty buffer itself when stored
    /// uncompressed (no copy), else the compressed form.
    phys: Arc<Vec<u8>>,
    /// Shared with the object set's override (`dmu/early_write.rs`):
    /// durable once written; settled when dropped either way, so the sync
    /// frees an unadopted block only when no write of it can still land.
    state: Arc<EarlyWrite>,
}

impl Drop for Prewrite {
    fn drop(&mut self) {
        // Written by now, or never will be: the batch is done with it.
        self.state.set_settled();
    }
}

/// A block of the chain: written (or being written), not yet freed.
struct LogBlk {
    seq: u64,
    loc: LogLoc,
    /// Newest txg of a record with bytes in this block.
    max_txg: u64,
    done: bool,
}

/// A batch of records laid out in log blocks, in flight.
struct Flight {
    id: u64,
    /// Sequence number of its first record.
    first: u64,
    /// Its records (back to the queue if it or an older batch fails).
    itxs: Vec<Itx>,
    /// Sequence numbers of its first and last log block.
    blocks: (u64, u64),
    state: Flying,
}

/// A commit waiting for its records (`ZilState::wake`).
struct Sleeper {
    id: u64,
    /// It waits until every record before this one is durable.
    target: u64,
    thread: std::thread::Thread,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flying {
    Writing,
    Written,
    Failed,
}

#[derive(Default)]
struct ZilState {
    /// Sequence number of the next record.
    next_itx: u64,
    queue: VecDeque<Itx>,
    queue_bytes: u64,
    /// Records of txgs up to this one were given up (memory bound).
    overflow_txg: u64,
    /// Lowest record sequence number of the batch being laid out. One at
    /// a time: the chain holds records in the order they were made.
    preparing: Option<u64>,
    /// Batches laid out and being written (or written, waiting for an
    /// older one), oldest first. A batch's records are durable once it and
    /// every batch before it are written: replay stops at the first block
    /// that is missing.
    inflight: VecDeque<Flight>,
    next_batch: u64,
    /// Writes still out for batches dropped with a chain given up: the
    /// chain's blocks are not freed before they end.
    stale_writes: usize,
    /// Commits waiting (parked), and the pipeline depth they were given.
    sleepers: Vec<Sleeper>,
    next_sleeper: u64,
    max_inflight: usize,
    /// The chain's guid (0: no chain yet).
    guid: u64,
    /// A commit asked for a chain: the next header starts one.
    want_chain: bool,
    chain: VecDeque<LogBlk>,
    /// The next block to write: (sequence number, where).
    tail: Option<(u64, LogLoc)>,
    next_blk: u64,
    /// Heads of headers written by txgs not yet committed: (txg, chain
    /// guid, seq).
    pending_heads: Vec<(u64, u64, u64)>,
    /// Head of the newest committed header that names this chain.
    committed_head: Option<u64>,
    /// Size for the next tail block.
    next_size: u32,
    /// Blocks of a chain given up after a failed write: freed once a
    /// header of the new chain has committed.
    retired: Vec<LogLoc>,
    /// The newest txg `synced` was told of: records of it and before are
    /// dropped, including ones taken for a write that then put them back.
    synced_txg: u64,
}

impl ZilState {
    /// The oldest record not yet durable: queued, being laid out or in
    /// flight (`u64::MAX`: none).
    fn lowest_pending(&self) -> u64 {
        [
            self.queue.front().map(|i| i.seq),
            self.preparing,
            self.inflight.front().map(|f| f.first),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(u64::MAX)
    }

    fn pending_below(&self, target: u64) -> bool {
        self.lowest_pending() < target
    }

    /// A commit may lay out the next batch now: nobody else is, and the
    /// pipeline has room.
    fn can_lay_out(&self) -> bool {
        self.preparing.is_none() && self.inflight.len() < self.max_inflight
    }

    /// Wake the commits that have something to do now, and only those:
    /// every one whose records are all durable (or dropped by a txg), and
    /// one whose records are queued if the pipeline can take a batch (it
    /// lays the batch out). A condvar's `notify_all` woke every waiting
    /// commit twice per batch, to find most of them still waiting: with 8
    /// jobs of 4 KiB fsyncs, about half of the machine's context switches.
    fn wake(&mut self) {
        let low = self.lowest_pending();
        let mut lead = self
            .queue
            .front()
            .filter(|_| self.can_lay_out())
            .map(|i| i.seq);
        self.sleepers.retain(|s| {
            let go = if s.target <= low {
                true
            } else if lead.is_some_and(|q| s.target > q) {
                lead = None;
                true
            } else {
                false
            };
            if go {
                s.thread.unpark();
            }
            !go
        });
    }

    /// Records taken for a write that did not happen go back to the queue,
    /// in their in-memory form and in sequence order (batches given up
    /// together, or a batch being laid out while older ones are put back,
    /// return out of order), except those of txgs that committed
    /// meanwhile: `synced` could not drop them while they were out, and
    /// nothing else would (on a full pool no later txg comes, and every
    /// commit spun on a record only a txg could retire: found by the fill
    /// test in CI, the daemon at 100% CPU).
    fn requeue(&mut self, itxs: Vec<Itx>) {
        let done = self.synced_txg;
        let Some(first) = itxs.first().map(|i| i.seq) else {
            return;
        };
        let at = self.queue.partition_point(|i| i.seq < first);
        let rest = self.queue.split_off(at);
        for itx in itxs.into_iter().filter(|i| i.txg > done) {
            self.queue_bytes += itx.bytes();
            self.queue.push_back(itx);
        }
        self.queue.extend(rest);
    }

    /// The chain `chain` (a guid taken with the queue) was given up since,
    /// or has no committed header yet: records laid out for it now would
    /// go where no replay looks.
    fn chain_lost_since(&self, chain: u64) -> bool {
        self.guid != chain || self.committed_head.is_none()
    }

    /// A batch's write ended: mark it and its blocks (a batch dropped with
    /// its chain meanwhile only ends its count).
    fn complete(&mut self, id: u64, ok: bool) {
        let Some(f) = self.inflight.iter_mut().find(|f| f.id == id) else {
            self.stale_writes = self.stale_writes.saturating_sub(1);
            return;
        };
        f.state = if ok { Flying::Written } else { Flying::Failed };
        let (lo, hi) = f.blocks;
        for b in self.chain.iter_mut().rev() {
            if b.seq < lo {
                break;
            }
            if b.seq <= hi {
                b.done = true;
            }
        }
    }

    /// Retire written batches in chain order. A failed one, once no write
    /// after it is still out, gives the chain up: its records and every
    /// later batch's go back to the queue (a later block past a missing
    /// one is never replayed), so the waiters fall back to the txg.
    fn settle(&mut self) {
        while let Some(f) = self.inflight.front() {
            match f.state {
                Flying::Writing => return,
                Flying::Written => {
                    self.inflight.pop_front();
                }
                Flying::Failed => {
                    if self.inflight.iter().any(|f| f.state == Flying::Writing) {
                        return;
                    }
                    self.restart_chain();
                    self.want_chain = true;
                    return;
                }
            }
        }
    }

    /// Give up the chain (a failed write, a log device leaving): its blocks
    /// are retired and the next header starts a new chain, which commits
    /// must wait for before they lean on it. Batches in flight wrote to it:
    /// their records go back to the queue.
    fn restart_chain(&mut self) {
        for f in std::mem::take(&mut self.inflight).into_iter().rev() {
            if f.state == Flying::Writing {
                self.stale_writes += 1;
            }
            self.requeue(f.itxs);
        }
        self.retired.extend(self.chain.drain(..).map(|b| b.loc));
        self.retired.extend(self.tail.take().map(|t| t.1));
        self.guid = 0;
        self.committed_head = None;
    }
}

/// Counters `uzfs zilstat` shows (OpenZFS's zil kstats).
#[derive(Default)]
pub struct ZilStats {
    pub commits: AtomicU64,
    /// Commits that waited for a txg instead of writing the log.
    pub fallbacks: AtomicU64,
    pub writes: AtomicU64,
    pub records: AtomicU64,
    pub record_bytes: AtomicU64,
    /// Whole blocks logged by pointer (written once, where the txg adopts
    /// them) and their bytes.
    pub indirect: AtomicU64,
    pub indirect_bytes: AtomicU64,
    pub blocks: AtomicU64,
    pub block_bytes: AtomicU64,
    pub flushes: AtomicU64,
    /// Commit latency histogram: bucket i counts commits of [2^i, 2^(i+1)) us.
    pub latency_us: [AtomicU64; 24],
}

impl ZilStats {
    fn note_latency(&self, t0: Instant) {
        let us = t0.elapsed().as_micros().max(1) as u64;
        let b = (63 - us.leading_zeros() as usize).min(self.latency_us.len() - 1);
        self.latency_us[b].fetch_add(1, Ordering::Relaxed);
    }
}

/// One dataset's intent log.
pub struct Zil {
    pool: Weak<Pool>,
    /// The object set it logs (whose sync adopts the blocks written early).
    os: Weak<Objset>,
    /// `logbias=throughput`: every whole block is logged by pointer.
    throughput: AtomicBool,
    st: Mutex<ZilState>,
    mem_max: u64,
    recording: AtomicBool,
    pub stats: ZilStats,
}

fn lock(m: &Mutex<ZilState>) -> MutexGuard<'_, ZilState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The log header of an object-set block: the chain's guid and its first
/// needed block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogHeader {
    pub guid: u64,
    pub seq: u64,
    pub head: LogLoc,
}

impl LogHeader {
    pub fn encode(&self) -> [u8; LOG_HEADER_SIZE] {
        let mut b = [0u8; LOG_HEADER_SIZE];
        b[0..8].copy_from_slice(&self.guid.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.head.vdev.to_le_bytes());
        b[20..24].copy_from_slice(&self.head.psize.to_le_bytes());
        b[24..32].copy_from_slice(&self.head.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.head.asize.to_le_bytes());
        b
    }

    /// `None` for "no log".
    pub fn decode(b: &[u8; LOG_HEADER_SIZE]) -> Option<LogHeader> {
        let guid = le64(b, 0);
        (guid != 0).then(|| LogHeader {
            guid,
            seq: le64(b, 8),
            head: LogLoc {
                vdev: le32(b, 16),
                psize: le32(b, 20),
                offset: le64(b, 24),
                asize: le64(b, 32),
            },
        })
    }
}

/// A block's contents as read back: payload and where the first record
/// starts in it.
struct BlockView {
    next: LogLoc,
    first: u32,
    payload: Vec<u8>,
}

/// Encode a block: header + payload, padded to `psize`.
fn encode_block(
    guid: u64,
    seq: u64,
    next: &LogLoc,
    first: u32,
    payload: &[u8],
    psize: u32,
) -> Vec<u8> {
    let mut b = vec![0u8; psize as usize];
    b[0..8].copy_from_slice(&BLOCK_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&guid.to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[28..32].copy_from_slice(&first.to_le_bytes());
    b[32..36].copy_from_slice(&next.vdev.to_le_bytes());
    b[36..40].copy_from_slice(&next.psize.to_le_bytes());
    b[40..48].copy_from_slice(&next.offset.to_le_bytes());
    b[48..56].copy_from_slice(&next.asize.to_le_bytes());
    b[BLOCK_HDR..BLOCK_HDR + payload.len()].copy_from_slice(payload);
    let ck = fletcher4(&b[..BLOCK_HDR + payload.len()]);
    b[64..96].copy_from_slice(&ck);
    b
}

/// Check a block read back: magic, the guid and sequence number the
/// previous link promised, and the embedded checksum.
fn check_block(b: &[u8], guid: u64, seq: u64) -> Option<BlockView> {
    if b.len() < BLOCK_HDR || le64(b, 0) != BLOCK_MAGIC {
        return None;
    }
    if le64(b, 8) != guid || le64(b, 16) != seq {
        return None;
    }
    let nused = le32(b, 24) as usize;
    if BLOCK_HDR + nused > b.len() {
        return None;
    }
    let mut copy = b[..BLOCK_HDR + nused].to_vec();
    copy[64..96].fill(0);
    if fletcher4(&copy) != b[64..96] {
        return None;
    }
    Some(BlockView {
        next: LogLoc {
            vdev: le32(b, 32),
            psize: le32(b, 36),
            offset: le64(b, 40),
            asize: le64(b, 48),
        },
        first: le32(b, 28),
        payload: b[BLOCK_HDR..BLOCK_HDR + nused].to_vec(),
    })
}

/// What a chain on disk holds.
#[derive(Default)]
pub struct ChainRead {
    /// Every block that verified, in chain order.
    pub blocks: Vec<LogLoc>,
    /// Whole records in order: (txg, record).
    pub records: Vec<(u64, Vec<u8>)>,
}

/// Reads a log block: `(where, verify)` -> bytes some copy verified with.
pub type ReadFn<'a> = dyn Fn(&LogLoc, &dyn Fn(&[u8]) -> bool) -> Option<Vec<u8>> + 'a;

/// Walk the chain `h` names. `read(loc, verify)` returns the block's bytes
/// if some copy passes `verify` (without counting errors: the end of a
/// chain is expected not to verify). `claim(loc)` is asked before a block
/// is used; false ends the chain there.
pub fn read_chain(
    h: &LogHeader,
    read: &ReadFn<'_>,
    claim: &mut dyn FnMut(&LogLoc) -> bool,
) -> ChainRead {
    let mut out = ChainRead::default();
    let mut stream: Vec<u8> = Vec::new();
    let mut started = false;
    let (mut loc, mut seq) = (h.head, h.seq);
    // A chain is at most as long as the space it lives in; the bound only
    // guards against a loop no valid chain can make.
    for _ in 0..(1usize << 24) {
        if loc.psize as usize <= BLOCK_HDR || loc.psize > MAX_BLOCK {
            break;
        }
        // The copy that verified is the one read returns: keep its view
        // rather than check it again.
        let seen = std::cell::RefCell::new(None);
        let verify = |b: &[u8]| match check_block(b, h.guid, seq) {
            Some(v) => {
                *seen.borrow_mut() = Some(v);
                true
            }
            None => false,
        };
        if read(&loc, &verify).is_none() {
            break;
        }
        let Some(v) = seen.into_inner() else {
            break;
        };
        if !claim(&loc) {
            log::warn!(
                "intent log block {seq} at {}:{:#x} overlaps allocated space; the log ends there",
                loc.vdev,
                loc.offset
            );
            break;
        }
        out.blocks.push(loc);
        if started {
            stream.extend_from_slice(&v.payload);
        } else if v.first != NO_FRAME && (v.first as usize) <= v.payload.len() {
            stream.extend_from_slice(&v.payload[v.first as usize..]);
            started = true;
        }
        loc = v.next;
        seq += 1;
    }
    let mut at = 0;
    while at + FRAME_HDR <= stream.len() {
        let len = le32(&stream, at) as usize;
        let txg = le64(&stream, at + 4);
        let end = at + FRAME_HDR + len;
        if end > stream.len() {
            break;
        }
        out.records
            .push((txg, stream[at + FRAME_HDR..end].to_vec()));
        at = end;
    }
    out
}

fn round_block(bytes: usize) -> u32 {
    let b = (bytes as u64).div_ceil(BLOCK_ALIGN as u64) * BLOCK_ALIGN as u64;
    b.clamp(BLOCK_ALIGN as u64, MAX_BLOCK as u64) as u32
}

impl Zil {
    pub fn new(pool: Weak<Pool>, os: Weak<Objset>, mem_max: u64) -> Zil {
        Zil {
            pool,
            os,
            throughput: AtomicBool::new(false),
            st: Mutex::new(ZilState {
                next_itx: 1,
                next_blk: 1,
                next_size: 2 * BLOCK_ALIGN,
                ..Default::default()
            }),
            mem_max,
            recording: AtomicBool::new(true),
            stats: ZilStats::default(),
        }
    }

    /// `logbias`: with `throughput`, every whole-block write is logged by
    /// pointer (written once as an ordinary block), not only large ones.
    pub fn set_throughput(&self, on: bool) {
        self.throughput.store(on, Ordering::Relaxed);
    }

    /// `sync=disabled` stops recording (commits do not use the log). Recording that starts again cannot use the log for
    /// the open txg, whose earlier changes it missed: a commit that needs
    /// that txg waits for it (as after a memory overflow).
    pub fn set_recording(&self, on: bool) {
        let was = self.recording.swap(on, Ordering::SeqCst);
        if on && !was {
            if let Some(pool) = self.pool.upgrade() {
                let open = pool.open_txg();
                let mut g = lock(&self.st);
                g.overflow_txg = g.overflow_txg.max(open);
                g.queue.clear();
                g.queue_bytes = 0;
            }
        }
    }

    /// Make every change recorded before this call durable (see the module
    /// docs: the whole queue, in order, in one log write and one flush).
    pub fn commit(&self) -> Result<()> {
        let Some(pool) = self.pool.upgrade() else {
            return Err(Error::invalid("pool is gone"));
        };
        let t0 = Instant::now();
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let r = self.commit_to(&pool);
        // A commit `wake` picked to lay out the next batch may leave
        // without doing it (its records went out with another batch, or it
        // failed and returns the error): pick again, or a waiter parks for
        // good (found by crash_concurrent: a lead that hit a suspended pool
        // returned, and the commit behind it never woke).
        lock(&self.st).wake();
        if r.is_ok() {
            self.stats.note_latency(t0);
        }
        r
    }

    fn commit_to(&self, pool: &Pool) -> Result<()> {
        let mut g = lock(&self.st);
        g.max_inflight = pool.tun.zil_inflight.max(1);
        let target = g.next_itx;
        loop {
            // Records given up for memory: their txg must commit.
            if g.overflow_txg > pool.last_txg() {
                drop(g);
                self.fallback(pool)?;
                g = lock(&self.st);
                continue;
            }
            if !g.pending_below(target) {
                break;
            }
            // My records are out (laid out or being written by another
            // commit), or the pipeline is busy: wait for it.
            let mine_queued = g.queue.front().is_some_and(|i| i.seq < target);
            if !mine_queued || !g.can_lay_out() {
                // Parked until `wake` picks this commit (an unpark that
                // comes first makes `park` return at once; a spurious
                // return only checks again).
                let id = g.next_sleeper;
                g.next_sleeper += 1;
                g.sleepers.push(Sleeper {
                    id,
                    target,
                    thread: std::thread::current(),
                });
                drop(g);
                std::thread::park();
                g = lock(&self.st);
                g.sleepers.retain(|s| s.id != id);
                continue;
            }
            // No chain on disk yet, or a suspended pool: the txg carries it.
            if g.committed_head.is_none() || g.tail.is_none() || pool.suspended().is_some() {
                g.want_chain = true;
                drop(g);
                self.fallback(pool)?;
                g = lock(&self.st);
                continue;
            }
            // Take the queue; turn its block references into copies or
            // early-written blocks without holding the log's lock (that
            // compresses and allocates; operations keep queueing).
            let itxs: Vec<Itx> = g.queue.drain(..).collect();
            g.queue_bytes = 0;
            g.preparing = itxs.first().map(|i| i.seq);
            let chain = g.guid;
            drop(g);
            let resolved = self.resolve(pool, &itxs);
            g = lock(&self.st);
            g.preparing = None;
            let (recs, prewrites) = match resolved {
                Ok(r) => r,
                Err(e) => {
                    g.requeue(itxs);
                    g.wake();
                    drop(g);
                    return Err(e);
                }
            };
            // The chain was given up meanwhile (an older batch's write
            // failed): a new one may already have a tail, but no committed
            // header names it yet, so nothing written to it would be
            // replayed. Back to the queue; the txg carries it.
            if g.chain_lost_since(chain) {
                g.requeue(itxs);
                g.wake();
                continue;
            }
            match self.plan(pool, &mut g, itxs, recs, prewrites) {
                Ok(mut batch) => {
                    // In flight: the next commit may lay out the next batch
                    // while this one is written (it follows this one in the
                    // chain, whichever write ends first).
                    let id = g.next_batch;
                    g.next_batch += 1;
                    let itxs = std::mem::take(&mut batch.itxs);
                    g.inflight.push_back(Flight {
                        id,
                        first: itxs.first().map_or(target, |i| i.seq),
                        itxs,
                        blocks: (
                            batch.blocks.first().map_or(0, |b| b.0),
                            batch.blocks.last().map_or(0, |b| b.0),
                        ),
                        state: Flying::Writing,
                    });
                    g.wake();
                    drop(g);
                    let r = self.write_batch(pool, &batch);
                    if let Err(e) = &r {
                        // A log device that can no longer take writes is
                        // passed over until it can (pool space serves).
                        for (_, loc, _) in &batch.blocks {
                            if pool.io.top(loc.vdev).is_ok_and(|t| !t.is_functional()) {
                                pool.log_space.set_avoid(loc.vdev, true, None);
                            }
                        }
                        log::warn!(
                            "pool '{}': intent log write failed ({e}); committing the txg instead",
                            pool.name
                        );
                    }
                    // Written or not, the batch's blocks are freed like any
                    // other once a committed header is past them. A failed
                    // batch breaks the chain after it: `settle` starts a new
                    // one (its header is written by the fallback's txg) and
                    // puts its records and every later batch's back in the
                    // queue, so no waiter takes them for durable until that
                    // txg commits.
                    g = lock(&self.st);
                    g.complete(id, r.is_ok());
                    g.settle();
                    g.wake();
                }
                Err(itxs) => {
                    // No log space. While a sync holds the allocator, ask
                    // its thread to lend some (without the log's lock: the
                    // sync takes it to write the log header) and try
                    // again; else the txg carries it (blocks written early
                    // are adopted or freed by its sync as usual).
                    g.requeue(itxs);
                    g.wake();
                    drop(g);
                    let asked = pool.st.try_lock().is_err();
                    if !(asked && pool.log_space.request(LEND_WAIT)) {
                        self.fallback(pool)?;
                    }
                    g = lock(&self.st);
                }
            }
        }
        Ok(())
    }

    /// The on-disk form of each record. Whole blocks of at least the
    /// indirect size are written early as ordinary blocks of their txg and
    /// logged by pointer, when that txg is the next to sync and the
    /// allocator is free (not held by a running sync); all else is copied.
    fn resolve(&self, pool: &Pool, itxs: &[Itx]) -> Result<(Vec<Vec<u8>>, Vec<Prewrite>)> {
        let indirect_min = usize::try_from(pool.tun.zil_indirect_min).unwrap_or(usize::MAX);
        let biggest = itxs
            .iter()
            .flat_map(|i| i.blocks.iter().map(|b| b.len()))
            .max()
            .unwrap_or(0);
        // (`log_vdevs` reads the pool's config: not for a batch of small
        // writes, which is most of them.)
        let min = if self.throughput.load(Ordering::Relaxed) {
            0
        } else if biggest >= indirect_min && pool.log_vdevs().is_empty() {
            indirect_min
        } else {
            usize::MAX
        };
        let os = self.os.upgrade();
        let wanted = os.is_some()
            && itxs
                .iter()
                .any(|i| i.blocks.iter().any(|b| b.len() >= min.max(1)));
        // One allocator hold for the batch, or none: a running sync holds
        // it for its whole length, and a copy is always correct.
        let mut st = if wanted {
            pool.st.try_lock().ok()
        } else {
            None
        };
        let next_txg = pool.last_txg() + 1;
        let mut prewrites = Vec::new();
        let mut recs = Vec::with_capacity(itxs.len());
        for itx in itxs {
            let mut place = |obj: u64, blkid: u64, data: &Arc<Vec<u8>>| -> Option<BlkPtr> {
                if data.len() < min || itx.txg != next_txg {
                    return None;
                }
                let (os, st) = (os.as_ref()?, st.as_mut()?);
                let wp = os.prewrite_params(itx.txg, obj, blkid, data)?;
                let (comp, phys) = crate::dmu::compress::compress(wp.compress, data);
                let checksum = wp.checksum.compute(&phys);
                let got = st
                    .alloc
                    .alloc(phys.len() as u64, wp.copies.max(1) as usize)
                    .ok()?;
                let mut dva = [Dva::default(); 3];
                for (i, d) in got.into_iter().enumerate().take(3) {
                    dva[i] = d;
                }
                let bp = wp.bp(dva, data.len(), phys.len(), comp, checksum, itx.txg);
                let state = EarlyWrite::new();
                os.add_override(itx.txg, obj, blkid, data, bp, state.clone());
                prewrites.push(Prewrite {
                    bp,
                    phys: match phys {
                        std::borrow::Cow::Borrowed(_) => data.clone(),
                        std::borrow::Cow::Owned(v) => Arc::new(v),
                    },
                    state,
                });
                Some(bp)
            };
            let (rec, indirect) = changelog::resolve(&itx.rec, &itx.blocks, &mut place)?;
            if indirect > 0 {
                self.stats
                    .indirect_bytes
                    .fetch_add(indirect, Ordering::Relaxed);
            }
            recs.push(rec);
        }
        drop(st);
        self.stats
            .indirect
            .fetch_add(prewrites.len() as u64, Ordering::Relaxed);
        Ok((recs, prewrites))
    }

    fn fallback(&self, pool: &Pool) -> Result<()> {
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        pool.txg_wait_synced_data().map(|_| ())
    }

    /// Lay the taken records out in blocks: the tail first, more if they do
    /// not fit, and a new tail. The records back (to requeue) if log space
    /// ran out or the chain went away meanwhile.
    fn plan(
        &self,
        pool: &Pool,
        g: &mut ZilState,
        itxs: Vec<Itx>,
        recs: Vec<Vec<u8>>,
        prewrites: Vec<Prewrite>,
    ) -> std::result::Result<Batch, Vec<Itx>> {
        let total: usize = recs.iter().map(|r| FRAME_HDR + r.len()).sum();
        let Some((tail_seq, tail)) = g.tail else {
            return Err(itxs);
        };
        let mut locs = vec![tail];
        let mut room = tail.psize as usize - BLOCK_HDR;
        let mut got = Vec::new();
        while room < total {
            let size = round_block(total - room + BLOCK_HDR);
            let Some(l) = pool.log_alloc(size) else {
                for l in &got {
                    pool.log_space.free(l);
                }
                return Err(itxs);
            };
            got.push(l);
            locs.push(l);
            room += size as usize - BLOCK_HDR;
        }
        let next_size = round_block(total + BLOCK_HDR);
        let Some(new_tail) = pool.log_alloc(next_size) else {
            for l in &got {
                pool.log_space.free(l);
            }
            return Err(itxs);
        };
        locs.push(new_tail);
        // Lay the records out as one stream over the blocks.
        let mut blocks = Vec::new();
        let mut bi = 0;
        let mut payload: Vec<u8> = Vec::new();
        let mut first = NO_FRAME;
        let mut max_txg = 0;
        let cap = |bi: usize| locs[bi].psize as usize - BLOCK_HDR;
        let mut seq = tail_seq;
        let guid = g.guid;
        let mut finish = |bi: usize,
                          next: &LogLoc,
                          payload: &mut Vec<u8>,
                          first: &mut u32,
                          max_txg: &mut u64| {
            let buf = encode_block(guid, seq + bi as u64, next, *first, payload, locs[bi].psize);
            blocks.push((seq + bi as u64, locs[bi], buf, *max_txg));
            payload.clear();
            *first = NO_FRAME;
        };
        for (itx, rec) in itxs.iter().zip(&recs) {
            let mut frame = Vec::with_capacity(FRAME_HDR);
            frame.extend_from_slice(&(rec.len() as u32).to_le_bytes());
            frame.extend_from_slice(&itx.txg.to_le_bytes());
            let mut parts: [&[u8]; 2] = [&frame, rec];
            let mut started = false;
            for part in parts.iter_mut() {
                while !part.is_empty() {
                    if payload.len() == cap(bi) {
                        finish(bi, &locs[bi + 1], &mut payload, &mut first, &mut max_txg);
                        bi += 1;
                        max_txg = 0;
                    }
                    if !started {
                        if first == NO_FRAME {
                            first = payload.len() as u32;
                        }
                        started = true;
                    }
                    max_txg = max_txg.max(itx.txg);
                    let n = (cap(bi) - payload.len()).min(part.len());
                    payload.extend_from_slice(&part[..n]);
                    *part = &part[n..];
                }
            }
        }
        // The last block written points at the new tail; blocks planned
        // but left empty (none, unless the layout needed fewer than
        // planned) go back.
        finish(bi, &new_tail, &mut payload, &mut first, &mut max_txg);
        for l in &locs[bi + 1..locs.len() - 1] {
            pool.log_space.free(l);
        }
        let last_next = new_tail;
        seq += bi as u64 + 1;
        for (s, loc, _, mt) in &blocks {
            g.chain.push_back(LogBlk {
                seq: *s,
                loc: *loc,
                max_txg: *mt,
                done: false,
            });
        }
        g.tail = Some((seq, last_next));
        g.next_blk = seq + 1;
        g.next_size = next_size;
        self.stats
            .records
            .fetch_add(itxs.len() as u64, Ordering::Relaxed);
        self.stats
            .record_bytes
            .fetch_add(recs.iter().map(|r| r.len() as u64).sum(), Ordering::Relaxed);
        Ok(Batch {
            blocks: blocks.into_iter().map(|(s, l, b, _)| (s, l, b)).collect(),
            itxs,
            prewrites,
        })
    }

    /// Write a batch's blocks, and the data blocks it names by pointer,
    /// durably.
    fn write_batch(&self, pool: &Pool, batch: &Batch) -> Result<()> {
        // A waiter is blocked on these writes: they go first (`vdev/queue.rs`).
        let _class = crate::vdev::queue::with_class(Some(crate::vdev::queue::IoClass::SyncWrite));
        let birth = pool.open_txg();
        // Each vdev holding blocks written early first writes them and the
        // log blocks it holds all at once, every side of each (runs of
        // adjacent blocks as one write), each write durable by itself
        // (`TopVdev::write_durable_at_once`). OpenZFS does the same: an
        // lwb's write and its `dmu_sync` writes go out together, and the
        // flush waits for both. The log may thus reach the disk before the
        // data it names; a crash then leaves a record whose block does not
        // verify, where replay ends the log (`claim_indirect`): its commit
        // never returned. Before, the data went first, then the log
        // blocks, then a flush of every leaf: three steps in a row, and a
        // 1 MiB fsync at 0.37x the pool's own sequential rate.
        let data_txg = batch.prewrites.first().map_or(birth, |p| p.bp.birth);
        let mut data_tops: Vec<u32> = batch
            .prewrites
            .iter()
            .flat_map(|p| p.bp.dva.iter().filter(|d| d.is_valid()).map(|d| d.vdev))
            .collect();
        data_tops.sort_unstable();
        data_tops.dedup();
        use crate::vdev::BlockWrite;
        let on_top = |v: u32| -> (Vec<BlockWrite<'_>>, Vec<BlockWrite<'_>>) {
            let mut data: Vec<BlockWrite<'_>> = batch
                .prewrites
                .iter()
                .flat_map(|p| {
                    p.bp.dva
                        .iter()
                        .filter(move |d| d.is_valid() && d.vdev == v)
                        .map(move |d| (d.offset, p.phys.as_slice(), d.asize))
                })
                .collect();
            data.sort_unstable_by_key(|b| b.0);
            let logs = batch
                .blocks
                .iter()
                .filter(|b| b.1.vdev == v)
                .map(|(_, loc, buf)| (loc.offset, buf.as_slice(), loc.asize))
                .collect();
            (data, logs)
        };
        // Vdevs are looked up here, not in the jobs (a job must not take a
        // lock a caller may hold while it waits: `vdev/fanout.rs`).
        let lookup = |tops: Vec<u32>| -> Result<Vec<(u32, Arc<crate::vdev::TopVdev>)>> {
            tops.into_iter()
                .map(|v| pool.io.top(v).map(|t| (v, t)))
                .collect()
        };
        let together = lookup(data_tops.clone())?;
        let done = crate::vdev::fanout::try_fan_out(&together, "log writer", |(v, top)| {
            let (mut all, logs) = on_top(*v);
            all.extend(logs);
            let runs = crate::vdev::DurableRun::of_blocks(&all);
            Ok(top.write_durable_at_once(&runs, data_txg))
        });
        let mut rest_data = Vec::new();
        for ((v, _), r) in together.iter().zip(done) {
            match r? {
                Some(r) => r?,
                None => rest_data.push(*v),
            }
        }
        // What is left: vdevs that cannot (RAID-Z, the simulated devices),
        // and those that hold only log blocks. Blocks written early go
        // first, all in one batch and unflushed. Then one job per vdev, in
        // parallel: a vdev with no early block writes its log blocks
        // durably in one step (`write_durable_all`: a file makes just
        // those ranges durable, `pwritev2(RWF_DSYNC)`, every block and side
        // at once through io_uring; buffered writes then `fdatasync` also
        // wrote back the txg's unrelated dirty pages of the file, 11% of
        // the daemon's samples under 8 jobs of fsyncs); any other writes
        // its log blocks, then flushes, which makes durable everything
        // written to its leaves before (the early blocks included: a
        // range-only durable write would not). One flush per leaf per
        // commit: a flush per data block (16 fdatasyncs for a 1 MiB write
        // on a mirror) ran 1 MiB fsyncs at 0.09x the pool's write rate.
        if !rest_data.is_empty() {
            let items: Vec<([Dva; 3], &[u8])> = batch
                .prewrites
                .iter()
                .map(|p| {
                    let mut dva = p.bp.dva;
                    for d in dva.iter_mut() {
                        if !rest_data.contains(&d.vdev) {
                            *d = Dva::default();
                        }
                    }
                    (dva, p.phys.as_slice())
                })
                .filter(|(dva, _)| dva.iter().any(|d| d.is_valid()))
                .collect();
            pool.io.write_phys_batch(&items, data_txg)?;
        }
        let mut tops: Vec<u32> = batch
            .blocks
            .iter()
            .map(|b| b.1.vdev)
            .filter(|v| !data_tops.contains(v))
            .chain(rest_data.iter().copied())
            .collect();
        tops.sort_unstable();
        tops.dedup();
        let tops = lookup(tops)?;
        crate::vdev::fanout::try_fan_out(&tops, "log writer", |(v, top)| -> Result<()> {
            let (_, blocks) = on_top(*v);
            if rest_data.contains(v) {
                top.write_blocks_then_flush(&blocks, birth)
            } else {
                top.write_durable_all(&blocks, birth)
            }
        })
        .into_iter()
        .collect::<Result<()>>()?;
        for p in &batch.prewrites {
            p.state.set_durable();
        }
        for (_, _, buf) in &batch.blocks {
            self.stats.blocks.fetch_add(1, Ordering::Relaxed);
            self.stats
                .block_bytes
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A log device leaves the pool: the chain starts over elsewhere (the
    /// next commit waits for a txg, which writes a header naming the new
    /// one) and blocks on vdev `v` are forgotten (the log class drops its
    /// chunks there whole).
    pub fn forget_vdev(&self, v: u32) {
        let mut g = lock(&self.st);
        g.restart_chain();
        // Blocks elsewhere go back once the new chain's header commits.
        g.retired.retain(|l| l.vdev != v);
        g.wake();
    }

    /// Start a new chain (a log device's mirror changed): the next commit
    /// waits for a txg, whose header names the new chain; the old chain's
    /// blocks go back once that header has committed.
    pub fn restart(&self) {
        let mut g = lock(&self.st);
        g.restart_chain();
        g.wake();
    }

    /// The dataset goes away (destroy, export): its blocks go back.
    pub fn close(&self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let mut g = lock(&self.st);
        for b in g.chain.drain(..) {
            pool.log_space.free(&b.loc);
        }
        if let Some((_, t)) = g.tail.take() {
            pool.log_space.free(&t);
        }
        for l in std::mem::take(&mut g.retired) {
            pool.log_space.free(&l);
        }
        g.queue.clear();
        g.queue_bytes = 0;
        g.wake();
    }
}

struct Batch {
    /// (sequence number, where, bytes)
    blocks: Vec<(u64, LogLoc, Vec<u8>)>,
    /// The records the blocks carry (back to the queue if the write fails).
    itxs: Vec<Itx>,
    /// Data blocks written early that the records name by pointer.
    prewrites: Vec<Prewrite>,
}

impl ChangeLog for Zil {
    fn recording(&self, txg: u64) -> bool {
        self.recording.load(Ordering::Relaxed) && txg > lock(&self.st).overflow_txg
    }

    fn push(&self, txg: u64, rec: Vec<u8>, blocks: Vec<Arc<Vec<u8>>>) {
        let mut g = lock(&self.st);
        if txg <= g.overflow_txg {
            return;
        }
        let seq = g.next_itx;
        let itx = Itx {
            seq,
            txg,
            rec,
            blocks,
        };
        if g.queue_bytes + itx.bytes() > self.mem_max {
            // Give up on this txg: an fsync that needs it waits for it.
            g.overflow_txg = txg;
            g.queue.clear();
            g.queue_bytes = 0;
            return;
        }
        g.next_itx += 1;
        g.queue_bytes += itx.bytes();
        g.queue.push_back(itx);
    }

    fn header(&self, txg: u64) -> [u8; LOG_HEADER_SIZE] {
        let Some(pool) = self.pool.upgrade() else {
            return [0; LOG_HEADER_SIZE];
        };
        let mut g = lock(&self.st);
        if g.guid == 0 {
            if !g.want_chain {
                return [0; LOG_HEADER_SIZE];
            }
            g.guid = crate::spa::os_entropy() | 1;
        }
        if g.tail.is_none() {
            let Some(loc) = pool.log_space.alloc(g.next_size) else {
                return [0; LOG_HEADER_SIZE];
            };
            let seq = g.next_blk;
            g.next_blk += 1;
            g.tail = Some((seq, loc));
        }
        let (seq, head) = match g.chain.iter().find(|b| !(b.done && b.max_txg <= txg)) {
            Some(b) => (b.seq, b.loc),
            None => g.tail.unwrap_or_default(),
        };
        let guid = g.guid;
        g.pending_heads.push((txg, guid, seq));
        LogHeader {
            guid: g.guid,
            seq,
            head,
        }
        .encode()
    }

    fn wants_header(&self, txg: u64) -> bool {
        // The oldest block is kept only by the committed header (written
        // and holding nothing after `txg`): a new header frees it.
        let g = lock(&self.st);
        g.committed_head.is_some() && g.chain.front().is_some_and(|b| b.done && b.max_txg <= txg)
    }

    fn synced(&self, txg: u64) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let mut g = lock(&self.st);
        g.synced_txg = g.synced_txg.max(txg);
        while g.queue.front().is_some_and(|i| i.txg <= txg) {
            if let Some(i) = g.queue.pop_front() {
                g.queue_bytes -= i.bytes().min(g.queue_bytes);
            }
        }
        if let Some(&(_, guid, head)) = g.pending_heads.iter().rev().find(|(t, _, _)| *t <= txg) {
            // A header of a chain given up since (a failed write) names
            // nothing the log still writes to.
            if guid == g.guid && guid != 0 {
                g.committed_head = Some(head);
            }
        }
        // A committed header names the new chain: the old one's blocks go
        // back (not while a write to one is still out).
        if g.committed_head.is_some() && g.stale_writes == 0 {
            for l in std::mem::take(&mut g.retired) {
                pool.log_space.free(&l);
            }
        }
        g.pending_heads.retain(|(t, _, _)| *t > txg);
        if let Some(head) = g.committed_head {
            while g.chain.front().is_some_and(|b| b.seq < head && b.done) {
                if let Some(b) = g.chain.pop_front() {
                    pool.log_space.free(&b.loc);
                }
            }
        }
        g.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(i: u64) -> LogLoc {
        LogLoc {
            vdev: 0,
            offset: i << 16,
            asize: 8192,
            psize: 8192,
        }
    }

    /// A chain of blocks with the given payloads and first-record offsets,
    /// read back through `read_chain`.
    fn chain(payloads: &[(&[u8], u32)], corrupt: Option<usize>) -> ChainRead {
        let blocks: Vec<Vec<u8>> = payloads
            .iter()
            .enumerate()
            .map(|(i, (p, first))| {
                let mut b = encode_block(7, 1 + i as u64, &loc(i as u64 + 1), *first, p, 8192);
                if corrupt == Some(i) {
                    b[BLOCK_HDR] ^= 1;
                }
                b
            })
            .collect();
        let h = LogHeader {
            guid: 7,
            seq: 1,
            head: loc(0),
        };
        let read = |l: &LogLoc, verify: &dyn Fn(&[u8]) -> bool| {
            let b = blocks.get((l.offset >> 16) as usize)?;
            verify(b).then(|| b.clone())
        };
        read_chain(&h, &read, &mut |_| true)
    }

    fn frame(txg: u64, rec: &[u8]) -> Vec<u8> {
        let mut f = (rec.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&txg.to_le_bytes());
        f.extend_from_slice(rec);
        f
    }

    #[test]
    fn records_span_blocks_and_a_cut_record_is_dropped_whole() {
        let a = frame(5, b"first");
        let b = frame(6, &[9u8; 100]);
        let mut s = a.clone();
        s.extend_from_slice(&b);
        let (p0, p1) = s.split_at(a.len() + 40);
        let r = chain(&[(p0, 0), (p1, NO_FRAME)], None);
        assert_eq!(r.blocks.len(), 2);
        assert_eq!(r.records, vec![(5, b"first".to_vec()), (6, vec![9u8; 100])]);
        // The second block torn: the record it finishes is not replayed.
        let r = chain(&[(p0, 0), (p1, NO_FRAME)], Some(1));
        assert_eq!(r.blocks.len(), 1);
        assert_eq!(r.records, vec![(5, b"first".to_vec())]);
    }

    #[test]
    fn hostile_payloads_end_the_log_without_a_panic() {
        // A frame claiming 4 GiB, a first offset past the payload, a frame
        // header cut short: nothing replayed, nothing panics.
        let huge = [0xffu8, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2];
        assert!(chain(&[(&huge, 0)], None).records.is_empty());
        assert!(chain(&[(b"abc", 50)], None).records.is_empty());
        assert!(chain(&[(&[1, 0, 0], 0)], None).records.is_empty());
        // A stale block (another chain's guid) ends the log.
        let h = LogHeader {
            guid: 8,
            seq: 1,
            head: loc(0),
        };
        let b = encode_block(7, 1, &loc(1), 0, &frame(5, b"x"), 8192);
        let read = |_: &LogLoc, verify: &dyn Fn(&[u8]) -> bool| verify(&b).then(|| b.clone());
        assert!(read_chain(&h, &read, &mut |_| true).blocks.is_empty());
    }
}

/// The commit pipeline's bookkeeping (`ZilState`): batches complete in any
/// order but count as durable only in chain order, and a failed batch
/// takes every later one down with it.
#[cfg(test)]
mod pipeline_tests {
    use super::*;

    fn itx(seq: u64, txg: u64) -> Itx {
        Itx {
            seq,
            txg,
            rec: vec![0; 8],
            blocks: Vec::new(),
        }
    }

    fn blk(seq: u64) -> LogBlk {
        LogBlk {
            seq,
            loc: LogLoc {
                vdev: 0,
                offset: seq << 16,
                asize: 4096,
                psize: 4096,
            },
            max_txg: 5,
            done: false,
        }
    }

    /// Two batches in flight (records 0-2 in blocks 10-11, 3-4 in block
    /// 12), records 5-6 still queued.
    fn two_in_flight() -> ZilState {
        let mut g = ZilState {
            next_itx: 7,
            guid: 9,
            committed_head: Some(10),
            max_inflight: 2,
            ..Default::default()
        };
        g.chain.extend([blk(10), blk(11), blk(12)]);
        g.tail = Some((13, blk(13).loc));
        let flight = |id, recs: std::ops::Range<u64>, blocks| Flight {
            id,
            first: recs.start,
            itxs: recs.map(|s| itx(s, 5)).collect(),
            blocks,
            state: Flying::Writing,
        };
        g.inflight.push_back(flight(0, 0..3, (10, 11)));
        g.inflight.push_back(flight(1, 3..5, (12, 12)));
        g.queue.extend((5..7).map(|s| itx(s, 5)));
        g
    }

    fn queued(g: &ZilState) -> Vec<u64> {
        g.queue.iter().map(|i| i.seq).collect()
    }

    #[test]
    fn a_later_batch_written_first_waits_for_the_older_one() {
        let mut g = two_in_flight();
        g.complete(1, true);
        g.settle();
        assert!(g.chain.iter().find(|b| b.seq == 12).is_some_and(|b| b.done));
        assert!(!g.chain.iter().find(|b| b.seq == 10).is_some_and(|b| b.done));
        // Records 3-4 are written but not durable: block 10 may be missing.
        assert!(
            g.pending_below(4),
            "durable past a block still being written"
        );
        g.complete(0, true);
        g.settle();
        assert!(g.inflight.is_empty());
        assert!(!g.pending_below(5));
        assert!(g.pending_below(6), "queued records are not durable");
    }

    #[test]
    fn a_failed_batch_sends_every_later_one_back_in_order() {
        let mut g = two_in_flight();
        g.complete(0, false);
        g.settle();
        // The later batch is still out: nothing is given up under it.
        assert_eq!(g.inflight.len(), 2);
        assert_eq!(g.guid, 9);
        g.complete(1, true);
        g.settle();
        // Written, but after a missing block: back to the queue with the
        // failed batch, in order, ahead of what was queued.
        assert!(g.inflight.is_empty());
        assert_eq!(queued(&g), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(g.guid, 0, "the chain is given up");
        assert!(g.committed_head.is_none() && g.want_chain);
        assert_eq!(g.retired.len(), 4, "three chain blocks and the tail");
        assert!(g.pending_below(1));
    }

    /// A commit takes the queue and resolves it without the lock; an older
    /// batch's write fails meanwhile and the chain is given up. What it
    /// took must go back in order, not onto the new chain.
    #[test]
    fn records_taken_while_the_chain_is_given_up_go_back_in_order() {
        let mut g = two_in_flight();
        let chain = g.guid;
        let taken: Vec<Itx> = g.queue.drain(..).collect();
        assert!(!g.chain_lost_since(chain));
        g.complete(0, false);
        g.complete(1, true);
        g.settle();
        assert!(g.chain_lost_since(chain));
        // A new chain started meanwhile: still not the one taken for.
        g.guid = 77;
        g.committed_head = Some(40);
        assert!(g.chain_lost_since(chain));
        g.requeue(taken);
        assert_eq!(queued(&g), vec![0, 1, 2, 3, 4, 5, 6]);
        // Only a committed header naming the chain makes it one to write to.
        g.committed_head = None;
        assert!(g.chain_lost_since(77));
    }

    #[test]
    fn a_chain_given_up_under_writes_in_flight_keeps_its_blocks_until_they_end() {
        let mut g = two_in_flight();
        g.restart_chain();
        assert_eq!(queued(&g), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(g.stale_writes, 2);
        // Their writes end: counted down, nothing else changes.
        g.complete(0, true);
        g.complete(1, false);
        g.settle();
        assert_eq!(g.stale_writes, 0);
        assert_eq!(queued(&g), vec![0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn records_put_back_land_in_sequence_order() {
        let mut g = ZilState::default();
        g.queue.extend([itx(0, 5), itx(1, 5), itx(6, 5)]);
        // A batch laid out while older ones went back (3-5), then an older
        // one still (2), and records of a txg that committed meanwhile.
        g.requeue((3..6).map(|s| itx(s, 5)).collect());
        g.requeue(vec![itx(2, 5)]);
        g.synced_txg = 5;
        g.requeue(vec![itx(7, 4), itx(8, 5)]);
        assert_eq!(queued(&g), vec![0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn wake_picks_the_finished_commits_and_one_to_lay_out_the_next_batch() {
        let mut g = two_in_flight();
        let me = std::thread::current();
        for (id, target) in [(0, 2), (1, 4), (2, 6), (3, 7)] {
            g.sleepers.push(Sleeper {
                id,
                target,
                thread: me.clone(),
            });
        }
        let ids = |g: &ZilState| g.sleepers.iter().map(|s| s.id).collect::<Vec<_>>();
        // Pipeline full: nobody can do anything yet.
        g.wake();
        assert_eq!(ids(&g), vec![0, 1, 2, 3]);
        // The first batch is durable: its waiter goes, and one waiter
        // with queued records goes to lay out the next batch.
        g.complete(0, true);
        g.settle();
        g.wake();
        assert_eq!(ids(&g), vec![1, 3]);
    }
}
