//! Record buffers the sync wrote and nothing keeps, filled again by the
//! next txg's writes instead of fresh memory.
//!
//! # Why
//!
//! A sequential write through a mount fills a new record-sized buffer for
//! every record (`Objset::write`). Fresh memory costs the kernel a page
//! fault and a cleared page for every 4 KiB touched: `perf` of a 2 GiB
//! write showed 40% of the daemon's samples in `clear_page_erms` and the
//! fault path, more than checksums and compression together. While the
//! ARC keeps every written block, that memory is not given back, so every
//! write is to fresh memory until the cache is full (then the allocator
//! reuses what the cache evicts).
//!
//! File data written whole (a streaming writer's records, `DirtyObj::
//! streamed`) is not kept by the ARC with `CacheWritten::Never` (the
//! kernel's page cache above FUSE holds those bytes; `spa/io.rs`): once
//! its txg is synced, its buffer comes here, and the open txg's next
//! whole-record write takes it (`take`), pages already faulted in.
//!
//! # Ownership
//!
//! A buffer is handed out only when this pool holds its last strong
//! reference (`Arc::try_unwrap`): the intent log's records and the sync's
//! dirty state keep theirs until their txg is done, and until then the
//! buffer waits here. Weak references (an early-written block's
//! override) never see it again: they fail to upgrade once it is taken.
//!
//! # Bound
//!
//! Dirty data and the buffers held here that no txg still charges stay
//! within the dirty limit the daemon's memory budget counts, however long
//! a stream lasts. A buffer given while its txg is being written is
//! charged to that txg's dirty bytes until the sync ends
//! ([`BufPool::released`]); from then on it is loose, memory the dirty
//! figure no longer counts. Each sync sets a cap on what may be held to
//! what the dirty data leaves of the limit as it starts (about the txg it
//! is about to write, whose buffers come here while the open txg draws on
//! them), and every write the throttle lets through drops loose buffers
//! past what the dirty data leaves of the limit then ([`BufPool::fit`]):
//! a random writer takes no buffers, and before that, buffers a stream
//! left here stayed beside a full dirty limit of its patches (fs.sh with a
//! 512 MiB `arc_max`: 133 MiB of them over 219 MiB dirty, the daemon 90
//! MiB past its budget). Buffers are dropped at a sync when no writer
//! asked for one since the previous ([`BufPool::synced`]): an idle daemon
//! gives them back within two txgs. Asked, not got: a writer faster than
//! the disk asks while every buffer is still held by the txg being
//! written, and the next sync starts the moment that one ends; counting
//! only buffers handed out dropped each txg's buffers just as they came
//! free (a 2 GiB stream reused none).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Tries per `take` at a buffer someone still holds before giving up
/// (those are rotated to the back: buffers become free in the order their
/// txgs synced).
const TRIES: usize = 4;

#[derive(Default)]
pub struct BufPool {
    inner: Mutex<Inner>,
    cap: AtomicU64,
    /// Bytes held that no txg charges (`Inner::bytes - Inner::charged`),
    /// read by the throttle without the lock.
    loose: AtomicU64,
    /// A writer asked since the last `synced` (whether or not a buffer
    /// was free: one faster than the disk asks while all are still held
    /// by the txg being written, and needs them the moment it ends).
    used: AtomicBool,
    /// Buffers handed out (counters for tests and `arcstats`).
    pub reused: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// By length (datasets differ in record size), oldest first, each
    /// with the epoch it was given in.
    lists: HashMap<usize, VecDeque<Given>>,
    bytes: u64,
    /// Bytes of buffers given in the current epoch: the txg being
    /// written still charges them.
    charged: u64,
    /// Bumped when a sync ends ([`BufPool::released`]).
    epoch: u64,
}

/// A buffer held here, with the epoch it was given in.
type Given = (u64, Arc<Vec<u8>>);

impl Inner {
    /// Forget buffer (`epoch`, `len`) in the byte counts.
    fn remove(&mut self, epoch: u64, len: u64) {
        self.bytes -= len;
        if epoch == self.epoch {
            self.charged -= len;
        }
    }

    fn loose(&self) -> u64 {
        self.bytes - self.charged
    }
}

impl BufPool {
    pub fn new(cap: u64) -> Self {
        let p = BufPool::default();
        p.cap.store(cap, Ordering::Relaxed);
        p
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Set the bound in bytes (0: keep nothing).
    pub fn set_cap(&self, cap: u64) {
        self.cap.store(cap, Ordering::Relaxed);
        if cap == 0 {
            self.clear();
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Bytes held that no txg charges any more.
    pub fn loose_bytes(&self) -> u64 {
        self.loose.load(Ordering::Relaxed)
    }

    fn publish(&self, g: &Inner) {
        self.loose.store(g.loose(), Ordering::Relaxed);
    }

    /// A buffer the sync wrote and no cache keeps: keep it for reuse once
    /// everyone else lets go of it.
    pub fn give(&self, b: Arc<Vec<u8>>) {
        let len = b.len();
        if len == 0 {
            return;
        }
        let cap = self.cap.load(Ordering::Relaxed);
        let mut g = self.lock();
        if g.bytes + len as u64 > cap {
            return;
        }
        g.bytes += len as u64;
        g.charged += len as u64;
        let epoch = g.epoch;
        g.lists.entry(len).or_default().push_back((epoch, b));
    }

    /// A buffer of exactly `len` bytes with arbitrary contents, if one is
    /// free. The caller overwrites all of it.
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        self.used.store(true, Ordering::Relaxed);
        let mut g = self.lock();
        let list = g.lists.get_mut(&len)?;
        for _ in 0..TRIES.min(list.len()) {
            let (epoch, b) = list.pop_front()?;
            match Arc::try_unwrap(b) {
                Ok(v) => {
                    g.remove(epoch, len as u64);
                    self.publish(&g);
                    self.reused.fetch_add(1, Ordering::Relaxed);
                    return Some(v);
                }
                Err(b) => list.push_back((epoch, b)),
            }
        }
        None
    }

    /// The txg being written is on disk and no longer charges the buffers
    /// it gave: they are loose from now on.
    pub fn released(&self) {
        let mut g = self.lock();
        g.epoch += 1;
        g.charged = 0;
        self.publish(&g);
    }

    /// Dirty data leaves `room` bytes of the dirty limit: drop loose
    /// buffers past it (oldest first). Buffers the txg being written
    /// gives meanwhile are its own dirty bytes, not more memory: they are
    /// still taken (a stream at the limit needs them the moment the sync
    /// ends), and the first write after it fits them.
    pub fn fit(&self, room: u64) {
        if self.loose.load(Ordering::Relaxed) <= room {
            return;
        }
        let mut dropped = Vec::new();
        {
            let mut g = self.lock();
            let g = &mut *g;
            let mut excess = g.loose().saturating_sub(room);
            let mut freed = 0;
            for (&len, list) in g.lists.iter_mut() {
                // Oldest first; buffers a `take` found still held were
                // moved to the back, so charged ones are skipped, not a
                // stop.
                list.retain(|(epoch, b)| {
                    if excess == 0 || *epoch == g.epoch {
                        return true;
                    }
                    excess = excess.saturating_sub(len as u64);
                    freed += len as u64;
                    dropped.push(b.clone());
                    false
                });
            }
            g.bytes -= freed;
            self.publish(g);
        }
        // Freed with no lock held (a large buffer is an munmap).
        drop(dropped);
    }

    /// A txg finished syncing: if no writer asked since the previous
    /// one, the writer has stopped, and the buffers go back to the
    /// allocator.
    pub fn synced(&self) {
        if !self.used.swap(false, Ordering::Relaxed) {
            self.clear();
        }
    }

    pub fn clear(&self) {
        let mut g = self.lock();
        g.lists.clear();
        g.bytes = 0;
        g.charged = 0;
        self.publish(&g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_handed_out_only_once_nobody_else_holds_it() {
        let p = BufPool::new(1 << 20);
        let b = Arc::new(vec![7u8; 4096]);
        let held = b.clone();
        p.give(b);
        assert!(p.take(4096).is_none(), "still held by someone");
        drop(held);
        let v = p.take(4096).expect("free now");
        assert_eq!(v.len(), 4096);
        assert!(p.take(4096).is_none(), "handed out once");
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn a_weak_reference_never_sees_a_reused_buffer() {
        let p = BufPool::new(1 << 20);
        let b = Arc::new(vec![1u8; 512]);
        let w = Arc::downgrade(&b);
        p.give(b);
        let mut v = p.take(512).expect("only a weak reference left");
        v.fill(9);
        assert!(w.upgrade().is_none());
    }

    #[test]
    fn lengths_are_kept_apart_and_the_cap_holds() {
        let p = BufPool::new(3 * 4096);
        for _ in 0..5 {
            p.give(Arc::new(vec![0u8; 4096]));
        }
        assert_eq!(p.bytes(), 3 * 4096, "past the cap buffers are dropped");
        assert!(p.take(8192).is_none());
        assert!(p.take(4096).is_some());
    }

    #[test]
    fn buffers_nobody_asked_for_go_at_the_second_sync() {
        let p = BufPool::new(1 << 20);
        p.give(Arc::new(vec![0u8; 4096]));
        p.give(Arc::new(vec![0u8; 4096]));
        assert!(p.take(4096).is_some());
        p.synced();
        assert_eq!(p.bytes(), 4096, "a writer was active: kept");
        p.synced();
        assert_eq!(p.bytes(), 0, "idle for a txg: given back");
    }

    /// A writer faster than the disk asks while every buffer is still
    /// held by the txg being written, and the next sync starts the moment
    /// that one ends: the buffers it frees must still be there for it.
    #[test]
    fn a_writer_that_asked_while_all_were_held_keeps_them() {
        let p = BufPool::new(1 << 20);
        let b = Arc::new(vec![0u8; 4096]);
        let held = b.clone();
        p.give(b);
        assert!(p.take(4096).is_none(), "still held by the syncing txg");
        p.synced();
        drop(held);
        assert!(p.take(4096).is_some(), "dropped though a writer asked");
    }

    /// Buffers the txg being written still charges are never dropped to
    /// make room; once it is on disk they are loose, and a writer that
    /// takes none finds them dropped down to what its dirty data leaves.
    #[test]
    fn loose_buffers_are_dropped_to_fit_the_dirty_limit() {
        let p = BufPool::new(1 << 20);
        for _ in 0..4 {
            p.give(Arc::new(vec![0u8; 4096]));
        }
        assert_eq!(p.loose_bytes(), 0, "the syncing txg charges them");
        p.fit(0);
        assert_eq!(p.bytes(), 4 * 4096, "charged buffers are not dropped");
        p.released();
        assert_eq!(p.loose_bytes(), 4 * 4096);
        // The next txg's buffer is charged, beside the loose ones.
        p.give(Arc::new(vec![0u8; 8192]));
        p.fit(4096 + 100);
        assert_eq!(p.loose_bytes(), 4096, "loose bytes past the room dropped");
        assert_eq!(p.bytes(), 4096 + 8192, "the charged one stays");
        assert!(p.take(4096).is_some(), "the loose one left is still reused");
        p.released();
        p.fit(0);
        assert_eq!(p.bytes(), 0);
        // A full limit does not refuse what the syncing txg gives.
        p.give(Arc::new(vec![0u8; 4096]));
        assert_eq!(p.bytes(), 4096);
    }

    /// A buffer a `take` found still held goes to the back, behind newer
    /// ones: `fit` still finds it once it is loose.
    #[test]
    fn fit_finds_loose_buffers_behind_charged_ones() {
        let p = BufPool::new(1 << 20);
        let b = Arc::new(vec![0u8; 4096]);
        let held = b.clone();
        p.give(b);
        p.released();
        p.give(Arc::new(vec![0u8; 4096]));
        drop(held);
        assert_eq!(p.loose_bytes(), 4096);
        p.fit(0);
        assert_eq!(p.loose_bytes(), 0);
        assert_eq!(p.bytes(), 4096, "only the loose one went");
    }
}
