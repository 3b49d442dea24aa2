//! Pool suspension: what happens when the sync cannot write.
//!
//! # Theory
//!
//! A txg's sync writes blocks, flushes caches and writes uberblocks. When
//! one of those fails beyond what the vdevs' redundancy absorbs (a single
//! disk vanished, both sides of a mirror), the txg cannot commit. Two ways
//! out, both OpenZFS's (`zio_suspend` / `zio_resume`, `failmode`):
//!
//! - **Wait** (the sync thread, production): the failed I/O parks the sync
//!   where it stands, the pool is *suspended* (new changes get EIO, reads
//!   go on, admin commands answer from the published copy), and nothing
//!   is rolled back. `zpool clear` (after the device is back) *resumes*
//!   it: the parked I/O is issued again and the sync carries on from
//!   there, so every change of the stuck txg and all acknowledged writes
//!   before it commit as if nothing happened. If the I/O fails again the
//!   pool suspends again. Every I/O the sync issues is idempotent (a block
//!   goes to the DVAs it was allocated, a flush, an uberblock slot), which
//!   is what makes issuing it again correct.
//! - **Fail** (a caller syncing by itself, without a sync thread: tests
//!   and tools that drive txgs by hand, and export giving up on a parked
//!   sync): the error returns, the pool stays suspended for good, and the
//!   half-advanced in-memory state (allocator, object sets) is never
//!   committed. Only export and import recover; the pool comes back at its
//!   last committed txg.
//!
//! What writers see meanwhile is the pool's `failmode` (zpoolprops(7)):
//!
//! - `wait` (the default, as OpenZFS): new changes and `fsync` wait while
//!   the sync is parked, and go on when `zpool clear` resumes it (or fail
//!   with EIO if the pool is exported instead). Reads go on.
//! - `continue`: new changes and `fsync` get EIO at once; reads go on.
//! - `panic`: the process aborts as the pool suspends (the kernel's crash
//!   dump; what was committed is on disk, what was not is lost as in any
//!   crash).
//!
//! A suspension for good (below) gives EIO in every mode: nothing would
//! ever end the wait.
//!
//! A suspension that is not a parked I/O (an operation broke off half done,
//! `dmu/tx.rs`; a read the sync needed failed; the sync ran out of space)
//! is of the second kind: `zpool clear` says so instead of resuming.

use super::config::FailMode;
use crate::error::{Error, Result};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    /// Why changes are refused; `None` while the pool runs.
    why: Option<String>,
    /// The sync is parked on a failed I/O that a resume may retry.
    parked: bool,
    /// Export: the parked I/O returns its error instead of waiting.
    give_up: bool,
    /// Bumped by every resume (what a parked I/O waits for).
    resumes: u64,
    mode: FailMode,
}

#[derive(Default)]
pub struct Suspension {
    st: Mutex<State>,
    cv: Condvar,
}

/// What a suspension allows `zpool clear` to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Resume {
    /// The pool was not suspended.
    NotSuspended,
    /// The parked I/O is being issued again.
    Retrying,
}

impl Suspension {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn why(&self) -> Option<String> {
        self.lock().why.clone()
    }

    /// The sync is parked on a failed I/O (locks it holds stay held).
    pub fn parked(&self) -> bool {
        self.lock().parked
    }

    /// The pool's `failmode`.
    pub fn set_mode(&self, mode: FailMode) {
        self.lock().mode = mode;
    }

    /// `failmode=panic`: abort now.
    fn panic_if_asked(s: &State, pool: &str, why: &str) {
        if s.mode == FailMode::Panic {
            log::error!("pool '{pool}' suspended ({why}) with failmode=panic: aborting");
            eprintln!("uzfs: pool '{pool}' suspended ({why}) with failmode=panic: aborting");
            std::process::abort();
        }
    }

    /// A writer that found the pool suspended: with `failmode=wait` and a
    /// parked sync, wait until it is resumed (true: try again) or given
    /// up; otherwise return false at once (the caller's EIO stands).
    pub fn wait_resumed(&self) -> bool {
        let mut s = self.lock();
        if s.mode != FailMode::Wait || !s.parked {
            return false;
        }
        let seen = s.resumes;
        while s.parked && s.resumes == seen && !s.give_up {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        !s.give_up
    }

    /// Suspend for good (a failed sync that cannot be retried).
    pub fn fail(&self, pool: &str, why: &str) {
        let mut s = self.lock();
        Self::panic_if_asked(&s, pool, why);
        if s.why.is_none() {
            log::error!(
                "pool '{pool}' suspended: {why}; writes get EIO until it is exported and imported again"
            );
            s.why = Some(why.to_string());
        }
    }

    /// Run one I/O of the sync. With `wait`, a failure (other than a
    /// simulated power cut) suspends the pool and parks here until
    /// [`resume`](Self::resume), then issues the I/O again, as often as it
    /// takes; [`give_up`](Self::give_up) makes it return the error.
    pub fn io<T>(
        &self,
        pool: &str,
        what: &str,
        wait: bool,
        mut f: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        loop {
            let e = match f() {
                Ok(v) => return Ok(v),
                Err(Error::PowerLost) => return Err(Error::PowerLost),
                Err(e) if !wait => return Err(e),
                Err(e) => e,
            };
            let mut s = self.lock();
            if s.give_up {
                return Err(e);
            }
            log::error!(
                "pool '{pool}' suspended: {what} failed: {e}; the sync waits, and `zpool clear` retries it once the device is back"
            );
            s.why = Some(format!("{what} failed: {e}"));
            Self::panic_if_asked(&s, pool, &format!("{what} failed: {e}"));
            s.parked = true;
            let seen = s.resumes;
            while s.resumes == seen && !s.give_up {
                s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.parked = false;
            if s.give_up {
                return Err(e);
            }
            log::info!("pool '{pool}' resumed: issuing the {what} again");
        }
    }

    /// `zpool clear`: resume a parked sync. A suspension of the other kind
    /// is an error that says what to do instead.
    pub fn resume(&self, pool: &str) -> Result<Resume> {
        let mut s = self.lock();
        let Some(why) = s.why.clone() else {
            return Ok(Resume::NotSuspended);
        };
        if !s.parked {
            return Err(Error::suspended(
                pool,
                &format!("{why}; it cannot be resumed: export and import the pool"),
            ));
        }
        s.why = None;
        s.resumes += 1;
        self.cv.notify_all();
        Ok(Resume::Retrying)
    }

    /// Export of a suspended pool: the parked sync stops waiting and fails
    /// (its txg is not committed; the pool imports at the one before).
    pub fn give_up(&self) {
        self.lock().give_up = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_parked_io_retries_on_resume_and_fails_on_give_up() {
        let s = Arc::new(Suspension::default());
        let fails = Arc::new(AtomicU32::new(2));
        let t = {
            let (s, fails) = (s.clone(), fails.clone());
            std::thread::spawn(move || {
                s.io("p", "write", true, || {
                    if fails.load(Ordering::SeqCst) > 0 {
                        fails.fetch_sub(1, Ordering::SeqCst);
                        Err(Error::invalid("gone"))
                    } else {
                        Ok(7)
                    }
                })
            })
        };
        // Each failure parks; each resume retries once.
        for _ in 0..2 {
            // Parked again after the previous resume (which cleared `why`).
            while !(s.parked() && s.why().is_some()) {
                std::thread::yield_now();
            }
            assert!(s.why().is_some_and(|w| w.contains("write failed: gone")));
            assert_eq!(s.resume("p").expect("resume"), Resume::Retrying);
        }
        assert_eq!(t.join().expect("join").expect("io"), 7);
        assert_eq!(s.why(), None);
        assert_eq!(s.resume("p").expect("resume"), Resume::NotSuspended);
        // Export gives up on a parked I/O.
        let t = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.io("p", "flush", true, || Err::<(), _>(Error::invalid("x")))
            })
        };
        while !s.parked() {
            std::thread::yield_now();
        }
        s.give_up();
        assert!(t.join().expect("join").is_err());
        // Without waiting the error returns at once; a failed suspension
        // refuses to resume.
        let s = Suspension::default();
        assert!(s
            .io("p", "write", false, || Err::<(), _>(Error::invalid("x")))
            .is_err());
        s.fail("p", "internal error: broken");
        let e = s.resume("p").expect_err("not resumable");
        assert!(e.to_string().contains("cannot be resumed"), "{e}");
    }
}
