//! The L2ARC: a second-level block cache on cache devices (`zpool add
//! POOL cache DEV`), in front of slow pool disks.
//!
//! # What goes there, and when
//!
//! OpenZFS's feed thread scans the tails of the MRU and MFU lists for
//! blocks about to be evicted and writes them at a bounded rate
//! (`l2arc_write_max`). Here the lists hand every block they let go to
//! [`L2Device::feed`] (the same blocks, one step later: the value is an
//! `Arc`, so queueing it copies nothing); a feed queue of at most
//! [`FEED_QUEUE_MAX`] bytes holds them until the device's feed thread
//! writes a slot, no faster than `write_max` bytes per second. What does
//! not fit in the queue is dropped (`l2_feed_dropped`): the cache device
//! is best effort, like OpenZFS's. Unused prefetches are not fed
//! (`l2arc_noprefetch`), nor blocks dropped because the media changed.
//!
//! # Layout on the device
//!
//! The device keeps the pool's labels at both ends, as every leaf does,
//! so that import finds it. Between them, the cache is a ring of
//! [`SLOT_SIZE`] slots, written in turn. Each slot is a [`HEADER_SIZE`]
//! header and the blocks' bytes (as the ARC holds them: file data as it is
//! on disk, compressed or not; metadata decompressed):
//!
//! ```text
//!   header   magic "UZL2SLOT", version, entry count, pool guid,
//!            device guid, sequence number, BLAKE3 of the header
//!            entries  (key: vdev, offset, checksum prefix; class;
//!                      offset and length in the slot; Fletcher-4 of the bytes)
//!   payload  the blocks, back to back
//! ```
//!
//! The payload is written first and the header last. At import (and at
//! every daemon start) the index is rebuilt from the headers alone, by
//! the feed thread before it writes anything (import does not wait): one
//! read per slot, no block read (OpenZFS's persistent L2ARC keeps log
//! blocks for the same purpose). A header that fails its checksum, names
//! another pool or device, or has a sequence number older than a slot it
//! was overwritten by, contributes nothing.
//!
//! # Why a read from it can never be wrong
//!
//! A block's key is its address and the first half of its checksum
//! (`arc::Key`), so a block freed and rewritten elsewhere is another key:
//! the cache needs no invalidation when the pool frees. Every read from
//! the device is checked against the Fletcher-4 sum its (checksummed) header
//! recorded; a mismatch (the device was overwritten, torn in a crash,
//! bit-rotted) or an I/O error drops the entry, counts it
//! (`l2_cksum_bad`, `l2_io_error`) and the caller reads the pool as if
//! the block had never been cached. A vanished device is an I/O error on
//! every read: each entry is dropped on first use.

use super::{Block, Class, Key};
use crate::vdev::leaf::{Leaf, VdevStats};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// The unit the feed thread writes, and the ring's step.
pub const SLOT_SIZE: u64 = 4 << 20;
/// Bytes at the start of each slot for its header.
pub const HEADER_SIZE: usize = 64 << 10;
const PAYLOAD: usize = SLOT_SIZE as usize - HEADER_SIZE;
const MAGIC: u64 = u64::from_le_bytes(*b"UZL2SLOT");
const VERSION: u32 = 1;
/// Header fields before the entries: magic 8, version 4, count 4, pool
/// guid 8, device guid 8, sequence 8, BLAKE3 32.
const FIXED: usize = 72;
/// One entry: vdev 4, offset 8, checksum prefix 16, class 1, pad 3,
/// offset in the payload 4, length 4, Fletcher-4 32 (the pool's own
/// default data checksum: a hit costs what a pool read's check costs;
/// BLAKE3 made hits slower than reads of the pool in `bench/arc.sh`).
const ENTRY: usize = 72;
/// Entries one header holds.
pub const MAX_ENTRIES: usize = (HEADER_SIZE - FIXED) / ENTRY;
/// Bytes waiting to be written, at most (more are dropped).
pub const FEED_QUEUE_MAX: usize = 4 * PAYLOAD;
/// Default feed rate: bytes per second written to each cache device
/// (OpenZFS's `l2arc_write_max` is 8 MiB/s, often raised; a file or SSD
/// here takes this without slowing the pool). `UZFS_L2ARC_WRITE_MAX`.
pub const WRITE_MAX: u64 = 64 << 20;

static FEED_RATE: AtomicU64 = AtomicU64::new(WRITE_MAX);

/// The feed rate of cache devices this process opens from now on (bytes
/// per second, 0 ignored). The binary maps `UZFS_L2ARC_WRITE_MAX` here;
/// the engine reads no environment.
pub fn set_write_max(bytes_per_sec: u64) {
    if bytes_per_sec > 0 {
        FEED_RATE.store(bytes_per_sec, Ordering::Relaxed);
    }
}

/// Where a cached block lies: slot, offset in its payload, length, hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    slot: u32,
    off: u32,
    len: u32,
    sum: [u8; 32],
}

#[derive(Default)]
struct Index {
    map: HashMap<Key, Loc>,
    /// Keys per slot, to drop them when the slot is overwritten.
    slots: Vec<Vec<Key>>,
    /// The next slot to write, and its sequence number.
    hand: u32,
    seq: u64,
    bytes: u64,
}

impl Index {
    fn drop_slot(&mut self, slot: u32) {
        let keys = std::mem::take(&mut self.slots[slot as usize]);
        for k in keys {
            if let Some(l) = self.map.get(&k) {
                if l.slot == slot {
                    self.bytes -= l.len as u64;
                    self.map.remove(&k);
                }
            }
        }
    }

    fn forget(&mut self, k: &Key, loc: Loc) {
        if self.map.get(k) == Some(&loc) {
            self.map.remove(k);
            self.bytes -= loc.len as u64;
        }
    }
}

/// The counters OpenZFS's `arcstats` has for the L2ARC (per device here;
/// [`L2Stats::add`] sums them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct L2Stats {
    pub hits: u64,
    pub misses: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub writes_sent: u64,
    pub writes_error: u64,
    pub cksum_bad: u64,
    pub io_error: u64,
    /// A read met its slot being rewritten (`l2_rw_clash`).
    pub rw_clash: u64,
    pub feed_dropped: u64,
    /// Bytes held (`l2_size`, `l2_asize`: stored as they are held).
    pub size: u64,
    pub entries: u64,
    /// Slots and blocks the last rebuild found.
    pub rebuild_slots: u64,
    pub rebuild_bufs: u64,
    pub rebuild_errors: u64,
}

impl L2Stats {
    pub fn add(&mut self, o: &L2Stats) {
        let a = [
            &mut self.hits,
            &mut self.misses,
            &mut self.read_bytes,
            &mut self.write_bytes,
            &mut self.writes_sent,
            &mut self.writes_error,
            &mut self.cksum_bad,
            &mut self.io_error,
            &mut self.rw_clash,
            &mut self.feed_dropped,
            &mut self.size,
            &mut self.entries,
            &mut self.rebuild_slots,
            &mut self.rebuild_bufs,
            &mut self.rebuild_errors,
        ];
        let b = [
            o.hits,
            o.misses,
            o.read_bytes,
            o.write_bytes,
            o.writes_sent,
            o.writes_error,
            o.cksum_bad,
            o.io_error,
            o.rw_clash,
            o.feed_dropped,
            o.size,
            o.entries,
            o.rebuild_slots,
            o.rebuild_bufs,
            o.rebuild_errors,
        ];
        for (x, y) in a.into_iter().zip(b) {
            *x += y;
        }
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    writes_sent: AtomicU64,
    writes_error: AtomicU64,
    cksum_bad: AtomicU64,
    io_error: AtomicU64,
    rw_clash: AtomicU64,
    feed_dropped: AtomicU64,
    rebuild_slots: AtomicU64,
    rebuild_bufs: AtomicU64,
    rebuild_errors: AtomicU64,
}

#[derive(Default)]
struct Feed {
    queue: VecDeque<(Key, Block, Class)>,
    bytes: usize,
}

/// The feed queue, shared by the device and its thread: the thread waits
/// here holding no reference to the device, so dropping the pool (and
/// with it the device's file) is never held up by the thread.
#[derive(Default)]
struct FeedShared {
    feed: Mutex<Feed>,
    wake: Condvar,
    stop: AtomicBool,
}

impl FeedShared {
    /// Wait up to `wait` for a slot's worth of blocks, then take what is
    /// queued (at most a slot).
    fn take_batch(&self, wait: Duration) -> Vec<(Key, Block, Class)> {
        let mut f = lock(&self.feed);
        if f.bytes < PAYLOAD && !self.stop.load(Ordering::Relaxed) && !wait.is_zero() {
            f = self
                .wake
                .wait_timeout(f, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        while let Some((_, v, _)) = f.queue.front() {
            if bytes + v.len() > PAYLOAD || out.len() == MAX_ENTRIES {
                break;
            }
            bytes += v.len();
            if let Some(e) = f.queue.pop_front() {
                out.push(e);
            }
        }
        f.bytes -= bytes;
        out
    }
}

/// One cache device: its leaf (labels, state, I/O counters), the index of
/// what it holds, and the feed queue its thread drains.
pub struct L2Device {
    pub leaf: Arc<Leaf>,
    pool_guid: u64,
    /// Byte offset of slot 0, and how many slots fit.
    start: u64,
    nslots: u32,
    write_max: u64,
    index: Mutex<Index>,
    shared: Arc<FeedShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The slot the feed thread is rewriting (`u32::MAX`: none).
    writing: AtomicU32,
    c: Counters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl L2Device {
    /// Open `leaf` as a cache device of the pool `pool_guid`. `rebuild`:
    /// read back what it held (import, daemon start); a device just added
    /// starts empty (headers of an earlier use name another device guid).
    /// Starts the feed thread, which ends when the device is dropped or
    /// [`L2Device::stop`]ped.
    pub fn open(leaf: Arc<Leaf>, pool_guid: u64, rebuild: bool) -> Arc<L2Device> {
        let write_max = FEED_RATE.load(Ordering::Relaxed);
        Self::open_with(leaf, pool_guid, rebuild, Some(write_max))
    }

    /// [`L2Device::open`] with the feed rate given; `None`: no feed thread
    /// (the caller writes the queue out with [`L2Device::flush_feed`]).
    pub fn open_with(
        leaf: Arc<Leaf>,
        pool_guid: u64,
        rebuild: bool,
        write_max: Option<u64>,
    ) -> Arc<L2Device> {
        let size = crate::vdev::label::aligned_size(leaf.dev.size());
        let start = crate::vdev::LABEL_START_SIZE;
        let end = size.saturating_sub(crate::vdev::LABEL_END_SIZE);
        let nslots = (end.saturating_sub(start) / SLOT_SIZE).min(u32::MAX as u64 - 1) as u32;
        let d = Arc::new(L2Device {
            leaf,
            pool_guid,
            start,
            nslots,
            write_max: write_max.unwrap_or(u64::MAX),
            index: Mutex::new(Index {
                slots: vec![Vec::new(); nslots as usize],
                ..Default::default()
            }),
            shared: Arc::new(FeedShared::default()),
            thread: Mutex::new(None),
            writing: AtomicU32::new(u32::MAX),
            c: Counters::default(),
        });
        let rebuild = rebuild && nslots > 0 && !d.leaf.is_missing();
        if nslots > 0 && !d.leaf.is_missing() && write_max.is_some() {
            // The rebuild reads a 64th of the device: in the feed thread,
            // before it writes anything, so import does not wait for it
            // (OpenZFS rebuilds in the background too). Until it is done
            // lookups miss.
            let (w, shared) = (Arc::downgrade(&d), d.shared.clone());
            match std::thread::Builder::new()
                .name("l2arc_feed".into())
                .spawn(move || feed_thread(w, shared, rebuild))
            {
                Ok(h) => *lock(&d.thread) = Some(h),
                Err(e) => {
                    log::warn!("{}: no L2ARC feed thread: {e}", d.leaf.path);
                    if rebuild {
                        d.rebuild();
                    }
                }
            }
        } else if rebuild {
            d.rebuild();
        }
        d
    }

    /// Slots the device holds (0: too small, or missing).
    pub fn slots(&self) -> u32 {
        self.nslots
    }

    /// Bytes the ring can hold.
    pub fn capacity(&self) -> u64 {
        self.nslots as u64 * PAYLOAD as u64
    }

    /// End the feed thread (without waiting for it); queued blocks are
    /// dropped.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let mut f = lock(&self.shared.feed);
        f.queue.clear();
        f.bytes = 0;
        self.shared.wake.notify_all();
    }

    /// [`L2Device::stop`], and wait until the thread has ended (export:
    /// no write to the device after the pool let it go).
    pub fn close(&self) {
        self.stop();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }

    fn slot_offset(&self, slot: u32) -> u64 {
        self.start + slot as u64 * SLOT_SIZE
    }

    /// Read every slot's header and index what it names.
    fn rebuild(&self) {
        // (sequence, slot, entries) of every slot that is ours.
        let mut found: Vec<(u64, u32, Entries)> = Vec::new();
        let mut buf = vec![0u8; HEADER_SIZE];
        for slot in 0..self.nslots {
            if let Err(e) = self.leaf.dev.read_at(&mut buf, self.slot_offset(slot)) {
                log::warn!(
                    "{}: L2ARC slot {slot} header unreadable: {e}",
                    self.leaf.path
                );
                self.c.rebuild_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match parse_header(&buf, self.pool_guid, self.leaf.guid, slot) {
                Ok(Some((seq, entries))) => found.push((seq, slot, entries)),
                Ok(None) => {}
                Err(()) => {
                    self.c.rebuild_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Oldest first, so a block cached twice ends at its newer copy.
        found.sort_by_key(|(seq, _, _)| *seq);
        let mut ix = lock(&self.index);
        for (seq, slot, entries) in found {
            self.c.rebuild_slots.fetch_add(1, Ordering::Relaxed);
            for (k, loc) in entries {
                if let Some(old) = ix.map.insert(k, loc) {
                    ix.bytes -= old.len as u64;
                }
                ix.bytes += loc.len as u64;
                ix.slots[slot as usize].push(k);
                self.c.rebuild_bufs.fetch_add(1, Ordering::Relaxed);
            }
            ix.seq = seq;
            ix.hand = (slot + 1) % self.nslots;
        }
    }

    /// Whether `k` is cached here.
    pub fn contains(&self, k: &Key) -> bool {
        lock(&self.index).map.contains_key(k)
    }

    /// Queue a block the ARC let go, unless it is here already or the
    /// queue is full.
    pub fn feed(&self, k: Key, v: &Block, class: Class) {
        if self.nslots == 0 || self.shared.stop.load(Ordering::Relaxed) || v.len() > PAYLOAD {
            return;
        }
        if self.contains(&k) {
            return;
        }
        let mut f = lock(&self.shared.feed);
        if f.bytes + v.len() > FEED_QUEUE_MAX {
            self.c.feed_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        f.bytes += v.len();
        f.queue.push_back((k, v.clone(), class));
        if f.bytes >= PAYLOAD {
            self.shared.wake.notify_one();
        }
    }

    /// The block `k`, if cached here and its bytes are what were written.
    /// A miss, a mismatch and an I/O error all give `None` (the caller
    /// reads the pool); the last two drop the entry and are counted.
    pub fn read(&self, k: &Key) -> Option<Vec<u8>> {
        let loc = lock(&self.index).map.get(k).copied()?;
        let mut buf = vec![0u8; loc.len as usize];
        let at = self.slot_offset(loc.slot) + HEADER_SIZE as u64 + loc.off as u64;
        let t0 = Instant::now();
        let r = self.leaf.dev.read_at(&mut buf, at);
        let s = &self.leaf.stats;
        VdevStats::bump(&s.reads, 1);
        VdevStats::bump(&s.read_ns, t0.elapsed().as_nanos() as u64);
        match r {
            Err(e) => {
                log::debug!("{}: L2ARC read failed: {e}", self.leaf.path);
                VdevStats::bump(&s.read_errors, 1);
                self.c.io_error.fetch_add(1, Ordering::Relaxed);
                lock(&self.index).forget(k, loc);
                None
            }
            Ok(()) if crate::dmu::checksum::fletcher4(&buf) != loc.sum => {
                if self.writing.load(Ordering::Relaxed) == loc.slot {
                    self.c.rw_clash.fetch_add(1, Ordering::Relaxed);
                } else {
                    VdevStats::bump(&s.cksum_errors, 1);
                    self.c.cksum_bad.fetch_add(1, Ordering::Relaxed);
                }
                lock(&self.index).forget(k, loc);
                None
            }
            Ok(()) => {
                VdevStats::bump(&s.bytes_read, buf.len() as u64);
                self.c
                    .read_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                Some(buf)
            }
        }
    }

    /// Count a lookup of the second level (made after an ARC miss).
    pub fn count(&self, hit: bool) {
        let c = if hit { &self.c.hits } else { &self.c.misses };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Write `batch` into the next slot of the ring (dropping what that
    /// slot held); returns the bytes written.
    pub fn write_slot(&self, batch: Vec<(Key, Block, Class)>) -> usize {
        if self.nslots == 0 {
            return 0;
        }
        // What is not there yet, each key once.
        let mut seen = std::collections::HashSet::with_capacity(batch.len());
        let fresh: Vec<_> = batch
            .iter()
            .filter(|(k, _, _)| seen.insert(*k) && !self.contains(k))
            .collect();
        if fresh.is_empty() {
            return 0;
        }
        let (slot, seq) = {
            let mut ix = lock(&self.index);
            let slot = ix.hand;
            ix.drop_slot(slot);
            ix.hand = (slot + 1) % self.nslots;
            ix.seq += 1;
            (slot, ix.seq)
        };
        self.writing.store(slot, Ordering::Relaxed);
        let mut payload = Vec::with_capacity(PAYLOAD);
        let mut entries = Vec::with_capacity(fresh.len());
        for (k, v, class) in fresh {
            let loc = Loc {
                slot,
                off: payload.len() as u32,
                len: v.len() as u32,
                sum: crate::dmu::checksum::fletcher4(v),
            };
            payload.extend_from_slice(v);
            entries.push((*k, loc, *class));
        }
        let header = encode_header(self.pool_guid, self.leaf.guid, seq, &entries);
        let base = self.slot_offset(slot);
        let t0 = Instant::now();
        // Payload first, header last: a header on the device names only
        // bytes written before it (and reads check them anyway).
        let r = self
            .leaf
            .dev
            .write_at(&payload, base + HEADER_SIZE as u64)
            .and_then(|_| self.leaf.dev.write_at(&header, base));
        let s = &self.leaf.stats;
        VdevStats::bump(&s.writes, 2);
        VdevStats::bump(&s.write_ns, t0.elapsed().as_nanos() as u64);
        self.writing.store(u32::MAX, Ordering::Relaxed);
        let written = payload.len() + header.len();
        if let Err(e) = r {
            log::debug!("{}: L2ARC write failed: {e}", self.leaf.path);
            VdevStats::bump(&s.write_errors, 1);
            self.c.writes_error.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        VdevStats::bump(&s.bytes_written, written as u64);
        self.c.writes_sent.fetch_add(1, Ordering::Relaxed);
        self.c
            .write_bytes
            .fetch_add(written as u64, Ordering::Relaxed);
        let mut ix = lock(&self.index);
        for (k, loc, _) in entries {
            if let Some(old) = ix.map.insert(k, loc) {
                ix.bytes -= old.len as u64;
            }
            ix.bytes += loc.len as u64;
            ix.slots[slot as usize].push(k);
        }
        written
    }

    /// Write whatever is queued now (tests, and `zpool sync`-like waits).
    pub fn flush_feed(&self) {
        loop {
            let batch = self.shared.take_batch(Duration::ZERO);
            if batch.is_empty() {
                return;
            }
            self.write_slot(batch);
        }
    }

    pub fn stats(&self) -> L2Stats {
        let c = &self.c;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ix = lock(&self.index);
        L2Stats {
            hits: g(&c.hits),
            misses: g(&c.misses),
            read_bytes: g(&c.read_bytes),
            write_bytes: g(&c.write_bytes),
            writes_sent: g(&c.writes_sent),
            writes_error: g(&c.writes_error),
            cksum_bad: g(&c.cksum_bad),
            io_error: g(&c.io_error),
            rw_clash: g(&c.rw_clash),
            feed_dropped: g(&c.feed_dropped),
            size: ix.bytes,
            entries: ix.map.len() as u64,
            rebuild_slots: g(&c.rebuild_slots),
            rebuild_bufs: g(&c.rebuild_bufs),
            rebuild_errors: g(&c.rebuild_errors),
        }
    }
}

/// The feed thread of one device: write a slot whenever one is full (or
/// half a second has passed with something queued), no faster than the
/// device's `write_max`. It holds the device only while it writes.
fn feed_thread(w: Weak<L2Device>, shared: Arc<FeedShared>, rebuild: bool) {
    if rebuild {
        let Some(d) = w.upgrade() else { return };
        d.rebuild();
    }
    loop {
        let batch = shared.take_batch(Duration::from_millis(500));
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let pause = {
            let Some(d) = w.upgrade() else { return };
            let t0 = Instant::now();
            let n = d.write_slot(batch);
            // Keep to the rate: a slot of n bytes earns n / write_max s.
            let due = Duration::from_secs_f64(n as f64 / d.write_max as f64);
            due.saturating_sub(t0.elapsed())
        };
        // On the queue's condvar, so that `stop` ends the wait (a full
        // queue does not: the rate holds).
        let until = Instant::now() + pause;
        let mut f = lock(&shared.feed);
        while !shared.stop.load(Ordering::Relaxed) {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break;
            };
            if left.is_zero() {
                break;
            }
            f = shared
                .wake
                .wait_timeout(f, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

fn encode_header(pool: u64, dev: u64, seq: u64, entries: &[(Key, Loc, Class)]) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_SIZE];
    h[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&pool.to_le_bytes());
    h[24..32].copy_from_slice(&dev.to_le_bytes());
    h[32..40].copy_from_slice(&seq.to_le_bytes());
    for (i, ((vdev, offset, ck), loc, class)) in entries.iter().enumerate() {
        let e = &mut h[FIXED + i * ENTRY..FIXED + (i + 1) * ENTRY];
        e[0..4].copy_from_slice(&vdev.to_le_bytes());
        e[4..12].copy_from_slice(&offset.to_le_bytes());
        e[12..28].copy_from_slice(ck);
        e[28] = u8::from(*class == Class::Metadata);
        e[32..36].copy_from_slice(&loc.off.to_le_bytes());
        e[36..40].copy_from_slice(&loc.len.to_le_bytes());
        e[40..72].copy_from_slice(&loc.sum);
    }
    let sum = header_sum(&h, entries.len());
    h[40..72].copy_from_slice(&sum);
    h
}

/// BLAKE3 of the fixed fields before it and of the entries.
fn header_sum(h: &[u8], n: usize) -> [u8; 32] {
    let mut s = blake3::Hasher::new();
    s.update(&h[0..40]);
    s.update(&h[FIXED..FIXED + n * ENTRY]);
    *s.finalize().as_bytes()
}

type Entries = Vec<(Key, Loc)>;
type Parsed = Option<(u64, Entries)>;

/// A slot's header: `Ok(None)` for one never written (or another pool's,
/// another device's), `Err` for one damaged.
fn parse_header(h: &[u8], pool: u64, dev: u64, slot: u32) -> Result<Parsed, ()> {
    let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[o..o + 8]);
        u64::from_le_bytes(b)
    };
    if h.len() < HEADER_SIZE || u64_at(0) != MAGIC {
        return Ok(None);
    }
    let n = u32_at(12) as usize;
    if u32_at(8) != VERSION || n > MAX_ENTRIES || h[40..72] != header_sum(h, n) {
        return Err(());
    }
    if u64_at(16) != pool || u64_at(24) != dev {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let e = &h[FIXED + i * ENTRY..FIXED + (i + 1) * ENTRY];
        let mut ck = [0u8; 16];
        ck.copy_from_slice(&e[12..28]);
        let mut sum = [0u8; 32];
        sum.copy_from_slice(&e[40..72]);
        let off = u32::from_le_bytes([e[32], e[33], e[34], e[35]]);
        let len = u32::from_le_bytes([e[36], e[37], e[38], e[39]]);
        if off as usize + len as usize > PAYLOAD {
            return Err(());
        }
        let key = (
            u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            u64::from_le_bytes([e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11]]),
            ck,
        );
        out.push((
            key,
            Loc {
                slot,
                off,
                len,
                sum,
            },
        ));
    }
    Ok(Some((u64_at(32), out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::device::{BlockDevice, FileDevice};

    const MIB: u64 = 1 << 20;
    const POOL: u64 = 0xfeed;

    /// A cache device on a file of `mib` MiB: (its directory, the file).
    fn file(mib: u64) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("cache");
        std::fs::File::create(&p)
            .and_then(|f| f.set_len(mib * MIB))
            .expect("create");
        (dir, p)
    }

    /// Open the file as cache device `guid`, with no feed thread to race
    /// the test's own writes.
    fn open(p: &std::path::Path, guid: u64, pool: u64, rebuild: bool) -> Arc<L2Device> {
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(p).expect("open"));
        let leaf = Arc::new(Leaf::new(guid, p.display().to_string(), dev));
        L2Device::open_with(leaf, pool, rebuild, None)
    }

    fn key(i: u64) -> Key {
        let mut ck = [0u8; 16];
        ck[..8].copy_from_slice(&(i * 7919).to_le_bytes());
        (0, i << 17, ck)
    }

    fn block(i: u64, len: usize) -> Block {
        Arc::new((0..len).map(|j| (i as usize * 31 + j) as u8).collect())
    }

    fn fill(d: &L2Device, range: std::ops::Range<u64>, len: usize) {
        for i in range {
            d.feed(key(i), &block(i, len), Class::Data);
            if i % 16 == 15 {
                d.flush_feed();
            }
        }
        d.flush_feed();
    }

    #[test]
    fn blocks_come_back_verified_and_survive_a_reopen() {
        let (_dir, p) = file(64);
        let d = open(&p, 7, POOL, false);
        assert_eq!(d.slots(), 14, "64 MiB less the labels, in 4 MiB slots");
        fill(&d, 0..100, 128 << 10);
        for i in 0..100 {
            assert_eq!(d.read(&key(i)).as_deref(), Some(&block(i, 128 << 10)[..]));
        }
        assert_eq!(d.read(&key(1000)), None);
        let before = d.stats();
        assert_eq!((before.entries, before.size), (100, 100 * (128 << 10)));
        d.stop();
        drop(d);
        // A daemon restart, an import: the headers give the index back.
        let d = open(&p, 7, POOL, true);
        let s = d.stats();
        assert_eq!((s.rebuild_bufs, s.entries, s.size), (100, 100, before.size));
        for i in 0..100 {
            assert_eq!(d.read(&key(i)).as_deref(), Some(&block(i, 128 << 10)[..]));
        }
        // New blocks go after the old ones, not over them.
        fill(&d, 100..110, 128 << 10);
        assert!(d.contains(&key(0)) && d.contains(&key(105)));
        d.stop();
        drop(d);
        // Another pool's (or another device's) headers are not ours.
        for (guid, pool) in [(7, POOL + 1), (8, POOL)] {
            let other = open(&p, guid, pool, true);
            assert_eq!(other.stats().entries, 0);
            other.stop();
        }
    }

    #[test]
    fn the_ring_wraps_and_forgets_what_it_overwrites() {
        let (_dir, p) = file(64);
        let d = open(&p, 7, POOL, false);
        // 4 MiB less the header per slot: 31 blocks of 128 KiB; 14 slots
        // hold 434. Write 1,000.
        fill(&d, 0..1000, 128 << 10);
        let s = d.stats();
        assert!(s.size <= d.capacity(), "{} > {}", s.size, d.capacity());
        assert!(!d.contains(&key(0)) && d.contains(&key(999)));
        let held: Vec<u64> = (0..1000).filter(|&i| d.contains(&key(i))).collect();
        assert_eq!(held.len() as u64, s.entries);
        for &i in &held {
            assert_eq!(d.read(&key(i)).as_deref(), Some(&block(i, 128 << 10)[..]));
        }
        d.stop();
        drop(d);
        let d = open(&p, 7, POOL, true);
        let again: Vec<u64> = (0..1000).filter(|&i| d.contains(&key(i))).collect();
        assert_eq!(again, held, "the rebuild finds exactly what was held");
        d.stop();
    }

    /// Whatever happens to the device, a read gives the block that was
    /// cached or nothing: damage in blocks, in headers, a torn slot, a
    /// device that shrank away.
    #[test]
    fn a_damaged_device_never_changes_what_a_read_returns() {
        let (_dir, p) = file(64);
        let d = open(&p, 7, POOL, false);
        fill(&d, 0..300, 64 << 10);
        d.stop();
        drop(d);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open");
        use std::os::unix::fs::FileExt;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let region = crate::vdev::LABEL_START_SIZE;
        for _ in 0..200 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let at = region + rng % (14 * SLOT_SIZE);
            f.write_all_at(&[0xA5; 512], at).expect("damage");
        }
        // One header wholly overwritten.
        f.write_all_at(&[0x5A; 4096], region + 2 * SLOT_SIZE + 100)
            .expect("damage a header");
        let d = open(&p, 7, POOL, true);
        let s = d.stats();
        assert!(s.rebuild_errors >= 1, "the damaged header counted: {s:?}");
        let mut good = 0;
        for i in 0..300 {
            match d.read(&key(i)) {
                Some(v) => {
                    assert_eq!(&v[..], &block(i, 64 << 10)[..], "block {i}");
                    good += 1;
                }
                None => assert!(!d.contains(&key(i)), "a bad entry is dropped"),
            }
        }
        let s = d.stats();
        assert!(s.cksum_bad > 0, "damage was found: {s:?}");
        assert!(good > 0 && good < 300, "{good}");
        assert_eq!(
            d.leaf.stats.cksum_errors.load(Ordering::Relaxed),
            s.cksum_bad
        );
        // The device goes away (shrinks to nothing): every read misses.
        f.set_len(0).expect("truncate");
        for i in 0..300 {
            if d.contains(&key(i)) {
                assert_eq!(d.read(&key(i)), None);
            }
        }
        assert_eq!(d.stats().entries, 0);
        assert!(d.stats().io_error > 0);
        d.stop();
    }

    #[test]
    fn a_device_too_small_for_a_slot_caches_nothing() {
        let (_dir, p) = file(6);
        let d = open(&p, 7, POOL, true);
        assert_eq!(d.slots(), 0);
        d.feed(key(1), &block(1, 4096), Class::Data);
        d.flush_feed();
        assert_eq!(d.read(&key(1)), None);
    }
}
