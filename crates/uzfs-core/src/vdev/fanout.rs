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
//! I/O error), as a panicking scoped thread did.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// Most threads the pool starts: a few 8-wide RAID-Z writes at once.
const MAX_THREADS: usize = 16;

/// A queued job. Its real lifetime is the `fan_out` call that queued it.
type Job = Box<dyn FnOnce() + Send + 'static>;

struct Workers {
    st: Mutex<State>,
    cv: Condvar,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// This thread is one of the pool's: its fan-outs run inline.
    static WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn workers() -> &'static Workers {
    static W: OnceLock<Workers> = OnceLock::new();
    W.get_or_init(|| Workers {
        st: Mutex::new(State {
            queue: VecDeque::new(),
            threads: 0,
            idle: 0,
        }),
        cv: Condvar::new(),
    })
}

impl Workers {
    /// Queue `jobs`, starting threads while too few are idle. Hands back
    /// the jobs for the caller to run itself if no thread could be started.
    fn submit(&'static self, jobs: Vec<Job>) -> Vec<Job> {
        let mut st = lock(&self.st);
        let mut back = Vec::new();
        let mut queued = 0;
        for job in jobs {
            if st.idle <= st.queue.len() && st.threads < MAX_THREADS {
                let spawned = std::thread::Builder::new()
                    .name("uzfs-io".into())
                    .spawn(move || self.serve());
                match spawned {
                    Ok(_) => st.threads += 1,
                    Err(e) if st.threads == 0 => {
                        log::warn!("no I/O thread ({e}); running device jobs in turn");
                        back.push(job);
                        continue;
                    }
                    Err(_) => {}
                }
            }
            st.queue.push_back(job);
            queued += 1;
        }
        drop(st);
        // One thread per job: waking every idle thread for each commit's
        // two writes would make the rest find nothing and sleep again.
        for _ in 0..queued {
            self.cv.notify_one();
        }
        back
    }

    fn serve(&self) {
        WORKER.with(|w| w.set(true));
        let mut st = lock(&self.st);
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                job();
                st = lock(&self.st);
                continue;
            }
            st.idle += 1;
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            st.idle -= 1;
        }
    }
}

/// Counts a call's jobs still out; waits for them when dropped, so the
/// borrows the jobs hold end before `fan_out` returns or unwinds.
struct Latch {
    left: Mutex<usize>,
    cv: Condvar,
}

impl Latch {
    fn done(&self) {
        let mut n = lock(&self.left);
        *n -= 1;
        if *n == 0 {
            self.cv.notify_all();
        }
    }
}

impl Drop for Latch {
    fn drop(&mut self) {
        let mut n = lock(&self.left);
        while *n > 0 {
            n = self.cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Run `f` on every item concurrently (item 0 on the calling thread) and
/// return each result in item order; `Err(())` where the job panicked.
pub fn fan_out<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<std::result::Result<R, ()>> {
    // Jobs issue their I/O in the caller's priority class (`queue.rs`).
    let class = super::queue::current();
    let run = |item: &T| {
        let _c = super::queue::with_class(class);
        catch_unwind(AssertUnwindSafe(|| f(item))).map_err(|_| ())
    };
    if items.len() <= 1 || WORKER.with(|w| w.get()) {
        return items.iter().map(run).collect();
    }
    let slots: Vec<Mutex<Option<std::result::Result<R, ()>>>> =
        items.iter().map(|_| Mutex::new(None)).collect();
    {
        let latch = Latch {
            left: Mutex::new(items.len() - 1),
            cv: Condvar::new(),
        };
        let jobs: Vec<Job> = items
            .iter()
            .zip(&slots)
            .skip(1)
            .map(|(item, slot)| {
                let (run, latch) = (&run, &latch);
                let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                    *lock(slot) = Some(run(item));
                    latch.done();
                });
                // SAFETY: the job borrows `run`, `item`, `slot` and `latch`,
                // all of which outlive `latch`'s drop at the end of this
                // block; that drop waits until every job has called
                // `done` (after its last use of a borrow), on return and on
                // unwind alike, and a job always gets to `done` because
                // `run` catches panics. The lifetime is erased only so the
                // job can sit in the queue of threads that outlive it.
                unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Job>(job) }
            })
            .collect();
        for job in workers().submit(jobs) {
            job();
        }
        *lock(&slots[0]) = Some(run(&items[0]));
    }
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or(Err(()))
        })
        .collect()
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
