//! Fan-out of short device jobs (a mirror's sides, a RAID-Z group's
//! columns, an intent-log commit's blocks and flushes) onto a fixed set of
//! I/O threads, the caller taking the first job itself.
//!
//! Each of those used to spawn a scoped thread per call. An intent-log
//! commit on a mirror writes and flushes both sides in parallel, so every
//! fsync paid a thread creation: `strace -c` of the daemon under 4 KiB
//! fsyncs counted one `clone3` per commit, with its `mmap`, `mprotect`,
//! `sigaltstack`, `madvise` and `munmap` (about 0.4 ms of system time per
//! commit, more than the log block's write). rayon's pool removed the
//! spawns but its idle workers spin in `sched_yield` (135,000 calls in 4 s
//! of the same load), so the workers here sleep on a condvar instead.
//!
//! Jobs block in `pwrite` and `fdatasync`, so threads are added while every
//! existing one is busy, up to [`MAX_THREADS`] (beyond that a job queues),
//! and they live as long as the process. A job never waits for a queued
//! job: a fan-out made by a job (a commit's per-vdev job writing a
//! mirror's sides) runs its items in turn on that thread. Without that
//! rule a commit of 16 log blocks took all 16 threads, each waiting for
//! its mirror's second side queued behind them (found by CI: the POSIX
//! suite hung). Jobs must not take locks their callers may hold while
//! they wait (callers resolve vdevs before fanning out).
//!
//! A job that panics yields `Err` for its slot (the caller maps it to an
//! I/O error), as a panicking scoped thread did. The threads are a taskq
//! (`zio/taskq.rs`) whose threads mark themselves as the pool's.

use crate::zio::taskq::{Task, Taskq};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Most threads the pool starts: a few 8-wide RAID-Z writes at once.
const MAX_THREADS: usize = 16;

thread_local! {
    /// This thread is one of the pool's: its fan-outs run inline.
    static WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn mark_worker() {
    WORKER.with(|w| w.set(true));
}

/// The device threads (a taskq, `zio/taskq.rs`).
static IO: Taskq = Taskq::with_init("uzfs-io", MAX_THREADS, mark_worker);

/// Run `f` on every item concurrently (item 0 on the calling thread) and
/// return each result in item order; `Err(())` where the job panicked.
/// Jobs issue their I/O in the caller's priority class (`queue.rs`).
pub fn fan_out<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<std::result::Result<R, ()>> {
    let run = |item: &T| catch_unwind(AssertUnwindSafe(|| f(item))).map_err(|_| ());
    if items.len() <= 1 || WORKER.with(|w| w.get()) {
        return items.iter().map(run).collect();
    }
    let f = &f;
    IO.scope(|s| {
        let rest: Vec<Task<R>> = items[1..]
            .iter()
            .map(|item| s.spawn(move || f(item)))
            .collect();
        let first = run(&items[0]);
        std::iter::once(first)
            .chain(rest.into_iter().map(|t| t.join().ok_or(())))
            .collect()
    })
}

/// [`fan_out`] for jobs that return a `Result`: a job that panicked is an
/// internal error naming `what`.
pub fn try_fan_out<T: Sync, R: Send>(
    items: &[T],
    what: &str,
    f: impl Fn(&T) -> crate::error::Result<R> + Sync,
) -> Vec<crate::error::Result<R>> {
    fan_out(items, f)
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|()| Err(crate::error::Error::Internal(format!("{what} panicked"))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_and_a_panic_is_an_error() {
        let items: Vec<u32> = (0..40).collect();
        let out = fan_out(&items, |&i| {
            assert!(i != 7, "job 7 fails");
            i * 2
        });
        assert_eq!(out.len(), 40);
        for (i, r) in out.iter().enumerate() {
            if i == 7 {
                assert!(r.is_err());
            } else {
                assert_eq!(*r, Ok(i as u32 * 2));
            }
        }
    }

    /// Jobs that fan out themselves, more of them than the pool has
    /// threads: the nested fan-outs run inline, so all finish.
    #[test]
    fn nested_fan_outs_wider_than_the_pool_finish() {
        let outer: Vec<usize> = (0..3 * MAX_THREADS).collect();
        let out = fan_out(&outer, |&i| {
            let inner = [i, i + 1, i + 2];
            fan_out(&inner, |&j| j * 2)
                .into_iter()
                .map(|r| r.unwrap_or(0))
                .sum::<usize>()
        });
        for (i, r) in out.into_iter().enumerate() {
            assert_eq!(r, Ok(6 * i + 6));
        }
    }

    #[test]
    fn jobs_borrow_the_callers_data_and_run_concurrently() {
        // Four jobs that each wait for all the others finish only if they
        // run at the same time; many callers at once share the threads.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let b = std::sync::Barrier::new(4);
                        let local = vec![1u64; 4];
                        let out = fan_out(&local, |x| {
                            b.wait();
                            *x + 1
                        });
                        assert_eq!(out, vec![Ok(2); 4]);
                    }
                });
            }
        });
    }
}
