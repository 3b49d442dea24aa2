//! Reads in flight: one device read per block however many threads miss
//! on it at once.
//!
//! OpenZFS's ARC keeps a header for a block whose read is in progress
//! (`HDR_IO_IN_PROGRESS`); a second `arc_read` of it waits for that read
//! instead of issuing its own, and counts an `iohit`. Without it an
//! application's sequential read and the read-ahead running just in front
//! of it both miss on the block they meet at, and both read it: a cold
//! 2 GiB read made the daemon read 2.6-2.8 GiB (bench/RESULTS.md).
//!
//! [`InFlight::begin`] either makes the caller the block's reader (a
//! [`Reading`] guard, which publishes the bytes when the read ends) or
//! returns the [`Waiter`] of the read already under way. A reader whose
//! read fails, or that unwinds, publishes nothing: its waiters then read
//! for themselves, so each gets its own error and no one waits forever.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One read's outcome, once known: `Some(bytes)`, or `None` (it failed).
struct Slot<V> {
    done: Mutex<Option<Option<V>>>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks being read, by key.
pub struct InFlight<K, V> {
    reads: Mutex<HashMap<K, Arc<Slot<V>>>>,
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Default for InFlight<K, V> {
    fn default() -> Self {
        InFlight {
            reads: Mutex::new(HashMap::new()),
        }
    }
}

/// What [`InFlight::begin`] makes of a miss.
pub enum Begun<'a, K: std::hash::Hash + Eq + Copy, V: Clone> {
    /// No one reads `key`: the caller does, and publishes through this.
    Read(Reading<'a, K, V>),
    /// Someone does: wait for its bytes.
    Wait(Waiter<V>),
}

/// The caller reads the block; dropping this without
/// [`Reading::done`] tells the waiters the read failed.
pub struct Reading<'a, K: std::hash::Hash + Eq + Copy, V: Clone> {
    table: &'a InFlight<K, V>,
    key: K,
    slot: Arc<Slot<V>>,
}

pub struct Waiter<V> {
    slot: Arc<Slot<V>>,
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> InFlight<K, V> {
    /// A miss on `key`: read it, or wait for the read under way.
    pub fn begin(&self, key: K) -> Begun<'_, K, V> {
        let mut reads = lock(&self.reads);
        if let Some(slot) = reads.get(&key) {
            return Begun::Wait(Waiter { slot: slot.clone() });
        }
        let slot = Arc::new(Slot {
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        reads.insert(key, slot.clone());
        Begun::Read(Reading {
            table: self,
            key,
            slot,
        })
    }

    /// Whether no read is under way.
    pub fn is_empty(&self) -> bool {
        lock(&self.reads).is_empty()
    }
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Reading<'_, K, V> {
    /// The read brought `v`: hand it to every waiter.
    pub fn done(self, v: V) {
        self.publish(Some(v));
    }

    fn publish(&self, v: Option<V>) {
        // Out of the table first: a miss from now on finds the block
        // cached (the caller inserted it before) or reads it anew.
        lock(&self.table.reads).remove(&self.key);
        let mut d = lock(&self.slot.done);
        if d.is_none() {
            *d = Some(v);
        }
        drop(d);
        self.slot.cv.notify_all();
    }
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Drop for Reading<'_, K, V> {
    fn drop(&mut self) {
        // After `done` this finds the slot filled and only wakes no one;
        // otherwise the read failed (or unwound): waiters read themselves.
        self.publish(None);
    }
}

impl<V: Clone> Waiter<V> {
    /// The reader's bytes, or `None` if its read failed.
    pub fn wait(self) -> Option<V> {
        let mut d = lock(&self.slot.done);
        loop {
            if let Some(v) = d.as_ref() {
                return v.clone();
            }
            d = self.slot.cv.wait(d).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn one_reader_many_waiters_and_failure_frees_them() {
        let t: InFlight<u64, Arc<Vec<u8>>> = InFlight::default();
        let reads = AtomicU64::new(0);
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    barrier.wait();
                    let v = match t.begin(7) {
                        Begun::Read(r) => {
                            reads.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            let v = Arc::new(vec![7u8; 16]);
                            r.done(v.clone());
                            v
                        }
                        Begun::Wait(w) => w.wait().expect("the read succeeded"),
                    };
                    assert_eq!(*v, vec![7u8; 16]);
                });
            }
        });
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        assert!(t.is_empty());
        // A reader that gives up (drops its guard) wakes its waiters with
        // nothing, and the key can be read again.
        let Begun::Read(r) = t.begin(9) else {
            panic!("nobody reads 9")
        };
        let Begun::Wait(w) = t.begin(9) else {
            panic!("9 is being read")
        };
        let waited = std::thread::spawn(move || w.wait());
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(r);
        assert!(waited.join().expect("waiter").is_none());
        assert!(matches!(t.begin(9), Begun::Read(_)));
    }
}
