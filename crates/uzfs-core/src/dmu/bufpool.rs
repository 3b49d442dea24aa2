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
//! The pool holds at most `cap` bytes. Each sync sets it to what the
//! dirty data leaves of the dirty limit as it starts, which is about the
//! txg it is about to write: the buffers it frees wait here, while the
//! open txg draws on them, and dirty data and recycled buffers together
//! stay within the dirty limit the daemon's memory budget already counts,
//! however long a stream lasts. Past the cap a buffer is dropped. Buffers
//! are dropped at a sync when no writer asked for one since the previous
//! ([`BufPool::synced`]): an idle daemon gives them back within two txgs.
//! Asked, not got: a writer faster than the disk asks while every buffer
//! is still held by the txg being written, and the next sync starts the
//! moment that one ends; counting only buffers handed out dropped each
//! txg's buffers just as they came free (a 2 GiB stream reused none).

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
    /// A writer asked since the last `synced` (whether or not a buffer
    /// was free: one faster than the disk asks while all are still held
    /// by the txg being written, and needs them the moment it ends).
    used: AtomicBool,
    /// Buffers handed out (counters for tests and `arcstats`).
    pub reused: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// By length (datasets differ in record size).
    lists: HashMap<usize, VecDeque<Arc<Vec<u8>>>>,
    bytes: u64,
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
        g.lists.entry(len).or_default().push_back(b);
    }

    /// A buffer of exactly `len` bytes with arbitrary contents, if one is
    /// free. The caller overwrites all of it.
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        self.used.store(true, Ordering::Relaxed);
        let mut g = self.lock();
        let list = g.lists.get_mut(&len)?;
        for _ in 0..TRIES.min(list.len()) {
            let b = list.pop_front()?;
            match Arc::try_unwrap(b) {
                Ok(v) => {
                    g.bytes -= len as u64;
                    self.reused.fetch_add(1, Ordering::Relaxed);
                    return Some(v);
                }
                Err(b) => list.push_back(b),
            }
        }
        None
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
}
