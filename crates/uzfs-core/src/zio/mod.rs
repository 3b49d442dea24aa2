//! The I/O pipeline (OpenZFS's zio, for the work a txg sync hands over
//! whole).
//!
//! # Stages
//!
//! A sync writes the dirty blocks of an object set in batches. Each block
//! goes through the same stages as an OpenZFS write zio:
//!
//! 1. **prepare** (compress, checksum): CPU only, any number of blocks at
//!    once, on the fixed `uzfs-zio-cpu` threads (OpenZFS's
//!    `z_wr_iss` taskq);
//! 2. **place** (allocate, or rewrite in place, or gang): on the syncing
//!    thread, in the batch's order, because allocation must be
//!    deterministic and it is cheap;
//! 3. **issue** (write every column of every copy): on the fixed
//!    `uzfs-zio-issue` threads, which hand each leaf's writes to the
//!    device threads (`vdev/fanout.rs`) through the leaf queues
//!    (`vdev/queue.rs`, in the issuer's priority class);
//! 4. **done**: the syncing thread collects each write's outcome in order;
//!    the first error is returned only after every write in flight has
//!    finished (no write outlives the batch's buffers).
//!
//! A batch is cut into chunks (a few MiB each, so small blocks still make
//! large writes); a chunk moves through the stages as one. Chunks overlap:
//! while chunk k's writes are in flight and chunk k+1 is being placed, the
//! CPU threads compress later chunks. At most [`WRITES_IN_FLIGHT`] chunks'
//! writes are outstanding per batch.
//!
//! No stage creates a thread: the taskqs start theirs once (`taskq.rs`).
//! Before this module, every batch spawned its compress helpers and one
//! thread per chunk's writes.
//!
//! # Errors, retries and repair
//!
//! Each stage's error stops the batch at that chunk. A write that fails
//! beyond the vdev's redundancy is retried by the caller's issue closure
//! (`spa/suspend.rs`: a sync parks until `zpool clear`); a leaf that
//! failed within the redundancy records the txg in its DTL (`vdev/top.rs`).
//! Reads verify, rebuild and rewrite bad copies in one place, the vdev
//! kind's `read` (`vdev/ops.rs`).

pub mod taskq;

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::OnceLock;
use taskq::{Task, Taskq};

/// Chunks whose writes are outstanding at once in one batch.
pub const WRITES_IN_FLIGHT: usize = 2;

/// The compress-and-checksum threads: one per core, at most four.
pub fn cpu_taskq() -> &'static Taskq {
    static T: OnceLock<Taskq> = OnceLock::new();
    T.get_or_init(|| {
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4);
        Taskq::new("uzfs-zio-cpu", n)
    })
}

/// The threads that issue chunks' writes: two batches' worth (two pools
/// syncing at once each keep their writes in flight).
pub fn issue_taskq() -> &'static Taskq {
    static T: Taskq = Taskq::new("uzfs-zio-issue", 2 * WRITES_IN_FLIGHT);
    &T
}

/// The threads that read the old versions of partly written records for
/// a sync (`dmu/partial.rs`), many at once: a txg of random 16 KiB writes
/// into uncached 128 KiB records needs one read per record.
pub fn read_taskq() -> &'static Taskq {
    static T: Taskq = Taskq::new("uzfs-zio-read", 8);
    &T
}

/// The threads that read, as soon as a write leaves a partly written
/// record, the record's old version into the cache, so the sync finds it
/// there (`dmu/partial.rs`). Not `read_taskq`: a sync's reads must not
/// queue behind the next txg's.
pub fn fill_taskq() -> &'static Taskq {
    static T: Taskq = Taskq::new("uzfs-zio-fill", 8);
    &T
}

/// The threads that read ahead for a scrub or resilver (`spa/scan.rs`,
/// one read per leaf of a run of blocks): at the scan's class and nice
/// level for good, so a scan's reads never run at a foreground priority.
pub fn scan_taskq() -> &'static Taskq {
    static T: Taskq = Taskq::with_init("uzfs-zio-scan", 16, scan_init);
    &T
}

/// A scan taskq's thread takes the scan's class and nice level for good
/// (the thread is the taskq's for the life of the process).
fn scan_init() {
    std::mem::forget(crate::vdev::queue::scan_thread());
}

/// The threads that issue a scrub's or resilver's runs of blocks (each
/// batch's workers, `spa/scan.rs`; four per scanning pool), at the scan's
/// class and nice level. Not `scan_taskq`: these jobs wait for its reads.
pub fn scan_issue_taskq() -> &'static Taskq {
    static T: Taskq = Taskq::with_init("uzfs-scan-issue", 16, scan_init);
    &T
}

/// Run `chunks` through the stages: `prepare` each on the CPU threads,
/// `place` each in order on this thread (given the chunk's index and what
/// `prepare` made of it), `issue` what `place` returned on the issue
/// threads, and, for a write that failed, `retry` it on this thread with
/// its error (it may park the sync: an issue thread is never held by a
/// suspended pool). Returns the first error of any stage, once no write
/// is in flight; a stage that panicked is an internal error.
pub fn run<C: Sync, P: Send, W: Send>(
    chunks: &[C],
    prepare: impl Fn(&C) -> P + Sync,
    mut place: impl FnMut(usize, P) -> Result<W>,
    issue: impl Fn(&W) -> Result<()> + Sync,
    mut retry: impl FnMut(W, Error) -> Result<()>,
) -> Result<()> {
    let (prepare, issue) = (&prepare, &issue);
    cpu_taskq().scope(|cpu| {
        let prepared: Vec<Task<P>> = chunks
            .iter()
            .map(|c| cpu.spawn(move || prepare(c)))
            .collect();
        issue_taskq().scope(|io| {
            let mut done = |t: Task<(W, Result<()>)>| match t.join() {
                Some((_, Ok(()))) => Ok(()),
                Some((w, Err(e))) => retry(w, e),
                None => Err(Error::Internal("a block write panicked".into())),
            };
            let mut pending: VecDeque<Task<(W, Result<()>)>> = VecDeque::new();
            let place_all = || -> Result<()> {
                for (k, t) in prepared.into_iter().enumerate() {
                    let p = t
                        .join()
                        .ok_or_else(|| Error::Internal("compress or checksum panicked".into()))?;
                    let w = place(k, p)?;
                    if pending.len() >= WRITES_IN_FLIGHT {
                        if let Some(t) = pending.pop_front() {
                            done(t)?;
                        }
                    }
                    pending.push_back(io.spawn(move || {
                        let r = issue(&w);
                        (w, r)
                    }));
                }
                Ok(())
            };
            let mut first = place_all();
            // Every write collected, in order, before the first error.
            for t in pending {
                let r = done(t);
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn chunks_are_placed_in_order_and_every_write_is_issued() {
        let chunks: Vec<Vec<u32>> = (0..50).map(|i| vec![i; 3]).collect();
        let order = Mutex::new(Vec::new());
        let written = AtomicUsize::new(0);
        run(
            &chunks,
            |c| c.iter().map(|x| x * 2).collect::<Vec<_>>(),
            |k, p| {
                assert_eq!(p, vec![k as u32 * 2; 3]);
                order.lock().expect("lock").push(k);
                Ok(p)
            },
            |w| {
                written.fetch_add(w.len(), Ordering::SeqCst);
                Ok(())
            },
            |_, e| Err(e),
        )
        .expect("run");
        assert_eq!(*order.lock().expect("lock"), (0..50).collect::<Vec<_>>());
        assert_eq!(written.load(Ordering::SeqCst), 150);
    }

    /// A failed write ends the batch with its error; no write is still in
    /// flight when `run` returns; no chunk is placed after the failure
    /// is seen (at most WRITES_IN_FLIGHT more were issued before it).
    #[test]
    fn the_first_error_comes_back_after_every_write_in_flight() {
        let chunks: Vec<usize> = (0..40).collect();
        let in_flight = AtomicUsize::new(0);
        let placed = AtomicUsize::new(0);
        let r = run(
            &chunks,
            |c| *c,
            |_, p| {
                placed.fetch_add(1, Ordering::SeqCst);
                Ok(p)
            },
            |w| {
                in_flight.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if *w == 5 {
                    Err(Error::invalid("device gone"))
                } else {
                    Ok(())
                }
            },
            |_, e| Err(e),
        );
        assert!(matches!(r, Err(Error::Invalid(ref m)) if m.contains("device gone")));
        assert_eq!(in_flight.load(Ordering::SeqCst), 0);
        assert!(placed.load(Ordering::SeqCst) <= 5 + WRITES_IN_FLIGHT + 1);
    }

    /// A failed write is retried on the calling thread with its chunk and
    /// error; a retry that succeeds lets the batch succeed.
    #[test]
    fn a_failed_write_is_retried_on_the_calling_thread() {
        let chunks: Vec<usize> = (0..20).collect();
        let caller = std::thread::current().id();
        let retried = Mutex::new(Vec::new());
        run(
            &chunks,
            |c| *c,
            |_, p| Ok(p),
            |w| {
                if w % 7 == 3 {
                    Err(Error::invalid("transient"))
                } else {
                    Ok(())
                }
            },
            |w, e| {
                assert_eq!(std::thread::current().id(), caller);
                assert!(e.to_string().contains("transient"));
                retried.lock().expect("lock").push(w);
                Ok(())
            },
        )
        .expect("the retries succeed");
        assert_eq!(*retried.lock().expect("lock"), vec![3, 10, 17]);
    }

    #[test]
    fn a_panicking_stage_is_an_error() {
        let chunks: Vec<usize> = (0..10).collect();
        let r = run(
            &chunks,
            |c| {
                assert!(*c != 3, "prepare fails");
                *c
            },
            |_, p| Ok(p),
            |_| Ok(()),
            |_, e| Err(e),
        );
        assert!(matches!(r, Err(Error::Internal(_))));
        let r = run(
            &chunks,
            |c| *c,
            |_, p| Ok(p),
            |w| {
                assert!(*w != 7, "issue fails");
                Ok(())
            },
            |_, e| Err(e),
        );
        assert!(matches!(r, Err(Error::Internal(_))));
    }
}
