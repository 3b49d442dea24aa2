//! Transactions: an operation holds the open txg for as long as it changes
//! things, so all its changes land in one txg (OpenZFS `dmu_tx_assign`,
//! `txg_hold_open`, `txg_rele_to_sync`).
//!
//! # Theory of operation
//!
//! Every object set of a pool keeps the open txg's changes in one dirty set
//! (`Objset::open`). The sync closes the txg by *freezing* every object set
//! at once: each open dirty set becomes the syncing one and a new, empty one
//! opens. An operation that changes several things (a rename removes one
//! directory entry, inserts another and updates three znodes) must not have
//! a freeze land between its changes, or the first half commits in txg T and
//! the rest in T+1: a power cut between the two commits loses a file.
//!
//! So a pool has one [`TxgGate`]. An operation takes a [`Tx`] (a shared hold
//! on the gate) before its first change and drops it after its last; the
//! sync takes the gate exclusively (`quiesce`) for the instant it freezes the
//! object sets and opens the next txg. The freeze therefore waits for the
//! holds of the txg it closes, and a new hold waits for the freeze (the gate
//! is writer-preferring, so a stream of operations cannot starve the sync).
//! Freezing is a few pointer swaps: no I/O happens with the gate closed.
//!
//! ```text
//!   op A:  tx_begin ─ change ─ change ─ change ─ commit
//!   sync:                 quiesce (waits for A) ───────┤ freeze all ├ open T+1
//!   op B:                     tx_begin (waits) ───────────────────────┤ changes → T+1
//! ```
//!
//! # What bounds a hold
//!
//! A hold is taken after admission (`DatasetCtx::admit`: the write throttle
//! and the space check, which may wait for syncs) and never waits for a sync,
//! a throttle or a device: taking a hold while waiting for any of those
//! would stall the freeze, and with it every writer of the pool, for as long
//! as the wait (a device that hangs: indefinitely). Under a hold an
//! operation takes the POSIX layer's locks (namespace, object stripes) and
//! does memory work only. So a hold lasts for the operation's memory work:
//! microseconds, plus the time it queues for those locks behind other holds.
//!
//! What makes "never waits for a device" true is the warm-up (OpenZFS's
//! `dmu_tx_hold_*` read what a transaction will touch before
//! `dmu_tx_assign` for the same reason):
//!
//! * Inside a [`warm`] scope, an operation first reads everything it will
//!   read under the hold (the directory leaves a name lives in, the dnodes
//!   and xattr objects of the objects it names, the partial data blocks it
//!   rewrites, the unlinked set's leaf). Every block the thread reads while
//!   the scope lives is pinned to the scope, so the block cache can evict
//!   it without the operation noticing.
//! * Object numbers are found before the hold (`Objset::reserve_objects`):
//!   the search for a free number reads dnode blocks.
//! * The layers and the tree it read can change before the hold only by a
//!   freeze or by a sync publishing the tree it wrote, and both happen with
//!   the gate shut: the operation compares the object set's generation
//!   before its warm-up and after its hold, and warms up again if it moved
//!   (`Zpl::hold`). Changes other operations make meanwhile live in the
//!   open txg's memory; a directory split by another operation is covered
//!   by warming the name's leaves two depths deeper than the directory's.
//!
//! `SpaIo::reads_under_hold` counts device reads made by a thread holding a
//! txg; `tests/hold_io.rs` runs every POSIX operation from three threads on
//! a cold, evicting cache with the sync thread on and requires it to stay
//! zero. DSL and MOS changes hold `sync_lock` as well, which excludes the
//! sync altogether, so their reads under the hold cannot stall a freeze.
//!
//! # Rules
//!
//! * Lock order: `Tx` before every lock of the POSIX layer and of the object
//!   sets. A thread holding `Pool::sync_lock` may take a `Tx` (the sync is
//!   not running then); a thread holding a `Tx` must never take `sync_lock`,
//!   wait for a sync, or be throttled.
//! * Holds nest: a thread that already holds a pool's gate takes no second
//!   shared lock (which a waiting freeze would block forever); the inner
//!   `Tx` is free. Every mutating `Objset` call takes one itself, so a single
//!   change is always whole; operations of several changes take one around
//!   all of them.

use std::cell::RefCell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The pool's txg gate; see the module docs.
#[derive(Debug, Default)]
pub struct TxgGate {
    lock: RwLock<()>,
    /// Why the open txg may hold half an operation (a panic under a hold,
    /// a broken invariant): the sync must not commit it (fail-stop).
    poisoned: std::sync::Mutex<Option<String>>,
}

thread_local! {
    /// Gates this thread holds (by address) and how deeply.
    static HELD: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
}

/// A hold on the open txg: every change made while it lives lands in the
/// same txg. Dropping it releases the txg to the sync.
#[must_use = "a transaction holds the txg only while it lives"]
pub struct Tx<'a> {
    gate: &'a TxgGate,
    _guard: Option<RwLockReadGuard<'a, ()>>,
}

impl TxgGate {
    pub fn new() -> Self {
        Self::default()
    }

    fn key(&self) -> usize {
        self as *const TxgGate as usize
    }

    /// Hold the open txg (`tx_begin`). Nested holds of the same gate on one
    /// thread are free.
    pub fn hold(&self) -> Tx<'_> {
        let key = self.key();
        let nested = HELD.with(|h| {
            let mut h = h.borrow_mut();
            match h.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => {
                    *n += 1;
                    true
                }
                None => false,
            }
        });
        let guard = if nested {
            None
        } else {
            let g = self.lock.read().unwrap_or_else(|e| e.into_inner());
            HELD.with(|h| h.borrow_mut().push((key, 1)));
            Some(g)
        };
        Tx {
            gate: self,
            _guard: guard,
        }
    }

    /// The open txg must never commit: an operation broke off half done
    /// (`why` says how). The next sync suspends the pool instead.
    pub fn poison(&self, why: &str) {
        let mut p = self.poisoned.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_none() {
            *p = Some(why.to_string());
        }
    }

    /// Why the open txg must not commit, if it must not.
    pub fn poisoned(&self) -> Option<String> {
        self.poisoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Does this thread hold this gate?
    pub fn held(&self) -> bool {
        let key = self.key();
        HELD.with(|h| h.borrow().iter().any(|(k, _)| *k == key))
    }

    /// Close the gate: wait until no operation holds the open txg and keep
    /// new ones out while the guard lives (the sync's freeze). Must not be
    /// called by a thread that holds the gate.
    pub fn quiesce(&self) -> RwLockWriteGuard<'_, ()> {
        debug_assert!(!self.held(), "quiesce while holding the txg");
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Does this thread hold any pool's txg? Waiting for a sync or a throttle
/// then would deadlock.
pub fn held_any() -> bool {
    HELD.with(|h| !h.borrow().is_empty())
}

type Pinned = Vec<(crate::arc::Key, std::sync::Arc<Vec<u8>>)>;

thread_local! {
    /// Blocks this thread's operation read while a [`Warm`] scope lives.
    static PINS: RefCell<Option<Pinned>> = const { RefCell::new(None) };
}

/// An operation's warm-up scope (OpenZFS reads what a `dmu_tx_hold_*`
/// names before `dmu_tx_assign` for the same reason): while it lives,
/// every block the thread reads is pinned to it, and later reads of the
/// same block (by address and checksum) are served from the pin. An
/// operation opens one, reads before its hold what it will read under
/// it, then takes the hold; the block cache may evict meanwhile, the pin
/// keeps the bytes. Scopes nest (the inner one is free).
#[must_use = "blocks stay pinned only while the scope lives"]
pub struct Warm {
    outer: bool,
}

/// Open a warm-up scope on this thread.
pub fn warm() -> Warm {
    let outer = PINS.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_some() {
            return false;
        }
        *p = Some(Vec::new());
        true
    });
    Warm { outer }
}

impl Drop for Warm {
    fn drop(&mut self) {
        if self.outer {
            PINS.with(|p| *p.borrow_mut() = None);
        }
    }
}

/// The block pinned under `key` by this thread's warm-up scope.
pub fn pinned(key: &crate::arc::Key) -> Option<std::sync::Arc<Vec<u8>>> {
    PINS.with(|p| {
        p.borrow()
            .as_ref()
            .and_then(|v| v.iter().find(|(k, _)| k == key).map(|(_, d)| d.clone()))
    })
}

/// Pin a block just read, if this thread is in a warm-up scope.
pub fn pin(key: crate::arc::Key, data: &std::sync::Arc<Vec<u8>>) {
    PINS.with(|p| {
        if let Some(v) = p.borrow_mut().as_mut() {
            if !v.iter().any(|(k, _)| *k == key) {
                v.push((key, data.clone()));
            }
        }
    });
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // A panic unwinding through a hold leaves whatever the operation
        // had changed so far in the open txg: poison it before the hold is
        // released, so the freeze that may follow at once sees it.
        if std::thread::panicking() {
            self.gate
                .poison("an operation panicked while it held the open txg");
        }
        let key = self.gate.key();
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().position(|(k, _)| *k == key) {
                if h[i].1 > 1 {
                    h[i].1 -= 1;
                } else {
                    h.swap_remove(i);
                }
            }
        });
        // The read guard (outermost hold only) drops after this.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn quiesce_waits_for_holds_and_holds_nest() {
        let gate = Arc::new(TxgGate::new());
        let frozen = Arc::new(AtomicBool::new(false));
        let tx = gate.hold();
        let inner = gate.hold();
        assert!(gate.held() && held_any());
        let h = {
            let (gate, frozen) = (gate.clone(), frozen.clone());
            std::thread::spawn(move || {
                let _q = gate.quiesce();
                frozen.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // A nested hold while a freeze waits must not block.
        let again = gate.hold();
        drop(again);
        drop(inner);
        assert!(!frozen.load(Ordering::SeqCst), "froze inside a hold");
        drop(tx);
        h.join().expect("quiesce thread");
        assert!(frozen.load(Ordering::SeqCst));
        assert!(!gate.held() && !held_any());
    }

    #[test]
    fn a_panic_under_a_hold_poisons_the_gate() {
        let gate = Arc::new(TxgGate::new());
        let g = gate.clone();
        let r = std::thread::spawn(move || {
            let _tx = g.hold();
            panic!("broken invariant");
        })
        .join();
        assert!(r.is_err());
        assert!(gate.poisoned().is_some_and(|w| w.contains("panicked")));
        // The gate itself still works (reads may continue).
        drop(gate.hold());
        drop(gate.quiesce());
    }

    #[test]
    fn two_gates_are_independent() {
        let (a, b) = (TxgGate::new(), TxgGate::new());
        let _ta = a.hold();
        assert!(a.held() && !b.held());
        let _tb = b.hold();
        assert!(b.held());
    }
}
