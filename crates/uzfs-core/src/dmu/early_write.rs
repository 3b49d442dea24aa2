//! Blocks the intent log writes early, and what their txg's sync does with
//! them (OpenZFS's `dmu_sync` override).
//!
//! # Theory of operation
//!
//! An fsync of whole large blocks writes each as an ordinary block of its
//! txg and logs only its pointer (`zil::Zil::resolve`). The sync of that
//! txg *adopts* the block instead of writing it again if, by then, the
//! early write is durable and the block's dirty buffer is still the one
//! written (a later write in the same txg replaces the buffer). Otherwise
//! the sync writes the block itself, and the early one is a *leftover*:
//! its space is freed, deferred like every free (a log record may name it
//! until its txg commits).
//!
//! A leftover is freed only once its write has *settled*: written, or
//! known never to be written. A write still in flight when its space is
//! freed lands later on whatever that space holds next. Frees wait two
//! txgs before their space is reused, but a full pool makes the previous
//! txg's frees allocatable at once (`Allocator::release_deferred_early`),
//! and a slow device can take longer than two short txgs. Found by the
//! pool-full test (`crates/uzfs/tests/fill.rs`) in CI: four 128 KiB
//! blocks of a file, born in one txg, failed their checksums after the
//! early writes of the txg before landed on them. So the sync passes over
//! an override whose write is in flight, and a later sync frees it.
//! (OpenZFS's `dbuf_sync_leaf` instead waits for a `dmu_sync` in flight;
//! uzfs's sync never waits for the log's I/O.)

use super::blkptr::BlkPtr;
use super::dirty_block::DirtyBlock;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

const IN_FLIGHT: u8 = 0;
const DURABLE: u8 = 1;
const NOT_WRITTEN: u8 = 2;

/// The state of one early write, shared by the log's writer and the
/// object set's override: in flight, then durable or never written.
#[derive(Debug, Default)]
pub struct EarlyWrite(AtomicU8);

impl EarlyWrite {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(AtomicU8::new(IN_FLIGHT)))
    }
    /// The block is on stable storage.
    pub fn set_durable(&self) {
        self.0.store(DURABLE, Ordering::Release);
    }
    /// No write of the block is in flight or will be issued (the batch
    /// carrying it failed or was never written). Keeps `DURABLE`.
    pub fn set_settled(&self) {
        let _ =
            self.0
                .compare_exchange(IN_FLIGHT, NOT_WRITTEN, Ordering::AcqRel, Ordering::Acquire);
    }
    pub fn is_durable(&self) -> bool {
        self.0.load(Ordering::Acquire) == DURABLE
    }
    pub fn in_flight(&self) -> bool {
        self.0.load(Ordering::Acquire) == IN_FLIGHT
    }
}

/// One dirty block written early.
struct Override {
    /// The buffer written: adopted only if it is still the block's dirty
    /// buffer when the txg syncs. Weak: only its identity matters here,
    /// and a strong reference would make the next write to the block copy
    /// it (`Arc::make_mut`). The allocation outlives the buffer while this
    /// points at it, so no later buffer can take its address.
    data: Weak<Vec<u8>>,
    bp: BlkPtr,
    state: Arc<EarlyWrite>,
}

/// An object set's early-written blocks, by (txg, object, block id).
#[derive(Default)]
pub struct Overrides(Mutex<HashMap<(u64, u64, u64), Vec<Override>>>);

impl Overrides {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, u64, u64), Vec<Override>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register block `blkid` of `obj`, written early at `bp` from `data`
    /// for `txg`. The same block may be written early twice in a txg
    /// (logged, rewritten, logged again): the sync adopts the one holding
    /// its last buffer and frees the others.
    pub fn add(
        &self,
        (txg, obj, blkid): (u64, u64, u64),
        data: &Arc<Vec<u8>>,
        bp: BlkPtr,
        state: Arc<EarlyWrite>,
    ) {
        let o = Override {
            data: Arc::downgrade(data),
            bp,
            state,
        };
        self.lock().entry((txg, obj, blkid)).or_default().push(o);
    }

    /// The sync of `txg`: the early-written blocks of `obj` it adopts, by
    /// block id (each still the dirty buffer in `blocks`, and durable).
    pub fn adoptable(
        &self,
        txg: u64,
        obj: u64,
        blocks: &BTreeMap<u64, DirtyBlock>,
    ) -> BTreeMap<u64, BlkPtr> {
        let mut ov = self.lock();
        if ov.is_empty() {
            return BTreeMap::new();
        }
        let mut out = BTreeMap::new();
        for (&blkid, data) in blocks {
            if let Some(list) = ov.get_mut(&(txg, obj, blkid)) {
                let hit = list.iter().position(|o| {
                    std::ptr::eq(o.data.as_ptr(), Arc::as_ptr(data)) && o.state.is_durable()
                });
                if let Some(i) = hit {
                    out.insert(blkid, list.swap_remove(i).bp);
                }
            }
        }
        out
    }

    /// Early-written blocks of txgs up to `txg` that were not adopted and
    /// whose writes have settled: the sync frees them. Those still in
    /// flight stay for a later sync (see the module comment).
    pub fn take_leftovers(&self, txg: u64) -> Vec<BlkPtr> {
        let mut ov = self.lock();
        let mut out = Vec::new();
        ov.retain(|k, list| {
            if k.0 > txg {
                return true;
            }
            list.retain(|o| {
                if o.state.in_flight() {
                    return true;
                }
                out.push(o.bp);
                false
            });
            !list.is_empty()
        });
        out
    }

    /// Anything registered for txgs up to `txg`: that sync must run for
    /// the object set even if nothing else changed, to free it.
    pub fn any_up_to(&self, txg: u64) -> bool {
        self.lock().keys().any(|k| k.0 <= txg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bp(n: u64) -> BlkPtr {
        let mut b = BlkPtr::default();
        b.dva[0].offset = n << 17;
        b.dva[0].asize = 1 << 17;
        b
    }

    /// An early write still in flight when its txg syncs is neither adopted
    /// nor freed; it is freed by the first sync after it settles, written
    /// or not. A durable one whose buffer is current is adopted.
    #[test]
    fn an_early_write_in_flight_is_freed_only_once_it_settled() {
        let ov = Overrides::default();
        let data = Arc::new(vec![7u8; 64]);
        let blocks: BTreeMap<u64, DirtyBlock> = [(3, data.clone().into())].into();
        let (slow, failed, done) = (EarlyWrite::new(), EarlyWrite::new(), EarlyWrite::new());
        ov.add((10, 5, 3), &data, bp(1), slow.clone());
        ov.add((10, 6, 0), &data, bp(2), failed.clone());
        ov.add((11, 5, 3), &data, bp(3), done.clone());
        failed.set_settled();

        // Txg 10 syncs with block 3's write still in flight: not adopted,
        // not freed; the failed one is freed.
        assert!(ov.adoptable(10, 5, &blocks).is_empty());
        assert_eq!(ov.take_leftovers(10), vec![bp(2)]);
        assert!(ov.any_up_to(10), "the write in flight is still held");
        assert!(ov.take_leftovers(10).is_empty());

        // It lands, durable: freed by the next sync (too late to adopt).
        slow.set_durable();
        slow.set_settled();
        assert!(slow.is_durable(), "settling keeps a durable write durable");
        done.set_durable();
        assert_eq!(ov.adoptable(11, 5, &blocks), [(3, bp(3))].into());
        assert_eq!(ov.take_leftovers(11), vec![bp(1)]);
        assert!(!ov.any_up_to(u64::MAX));
    }

    /// A buffer replaced after its early write is not adopted (identity,
    /// not contents, decides).
    #[test]
    fn a_replaced_buffer_is_not_adopted() {
        let ov = Overrides::default();
        let old = Arc::new(vec![1u8; 64]);
        let w = EarlyWrite::new();
        ov.add((4, 1, 0), &old, bp(9), w.clone());
        w.set_durable();
        let new: BTreeMap<u64, DirtyBlock> = [(0, vec![1u8; 64].into())].into();
        assert!(ov.adoptable(4, 1, &new).is_empty());
        assert_eq!(ov.take_leftovers(4), vec![bp(9)]);
    }
}
