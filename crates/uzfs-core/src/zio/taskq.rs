//! Fixed pools of threads that run a scope's jobs (OpenZFS's taskqs).
//!
//! A [`Taskq`] starts a thread when a job finds none idle, up to its size,
//! and keeps it for the life of the process: once a load has run, a sync
//! that hands a batch to the pipeline creates no thread. Jobs borrow the caller's data: [`Taskq::scope`] does
//! not return, or unwind, before every job spawned in it has finished, as
//! `std::thread::scope` guarantees for its threads.
//!
//! A job must never wait for another job of the same taskq (it may be
//! queued behind it): the pipeline's jobs wait only for device I/O, which
//! runs on other threads (`vdev/fanout.rs`).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A queued job. Its real lifetime is the scope that spawned it.
type Job = Box<dyn FnOnce() + Send + 'static>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A named pool of at most `max` threads, started as jobs find none idle
/// and kept for the life of the process.
pub struct Taskq {
    name: &'static str,
    max: usize,
    /// Run first on each of the pool's threads (a scan thread's class and
    /// nice level).
    init: fn(),
    st: Mutex<State>,
    cv: Condvar,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

fn no_init() {}

impl Taskq {
    pub const fn new(name: &'static str, max: usize) -> Taskq {
        Taskq::with_init(name, max, no_init)
    }

    pub const fn with_init(name: &'static str, max: usize, init: fn()) -> Taskq {
        Taskq {
            name,
            max,
            init,
            st: Mutex::new(State {
                queue: VecDeque::new(),
                threads: 0,
                idle: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Threads started so far.
    pub fn threads(&self) -> usize {
        lock(&self.st).threads
    }

    /// Queue `job`, starting a thread if none is idle and the pool is not
    /// at its size. Hands the job back if the pool has no thread at all
    /// and cannot start one: the caller runs it.
    fn submit(&'static self, job: Job) -> Option<Job> {
        let mut st = lock(&self.st);
        if st.idle <= st.queue.len() && st.threads < self.max.max(1) {
            let spawned = std::thread::Builder::new()
                .name(format!("{}-{}", self.name, st.threads))
                .spawn(move || self.serve());
            match spawned {
                Ok(_) => st.threads += 1,
                Err(e) if st.threads == 0 => {
                    log::warn!("{}: no thread ({e}); running jobs in turn", self.name);
                    return Some(job);
                }
                Err(_) => {}
            }
        }
        st.queue.push_back(job);
        drop(st);
        self.cv.notify_one();
        None
    }

    fn serve(&self) {
        (self.init)();
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

    /// Queue `job` and return at once (a read-ahead nobody waits for). A
    /// panic in it is caught and dropped. With no thread to run it, it
    /// runs here.
    pub fn dispatch(&'static self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(move || {
            let _ = catch_unwind(AssertUnwindSafe(job));
        });
        if let Some(job) = self.submit(job) {
            job();
        }
    }

    /// Run `f` with a [`Scope`] whose jobs run on this taskq's threads and
    /// may borrow anything that outlives the call. Returns once every job
    /// has finished, `f`'s result or not.
    pub fn scope<'env, R>(&'static self, f: impl FnOnce(&Scope<'_, 'env>) -> R) -> R {
        let scope = Scope {
            taskq: self,
            out: Arc::new(Outstanding {
                n: Mutex::new(0),
                cv: Condvar::new(),
            }),
            _env: PhantomData,
        };
        // Waits for the jobs when `f` returns and when it unwinds alike.
        let _wait = WaitAll(&scope.out);
        f(&scope)
    }
}

/// Jobs of a scope not yet finished.
struct Outstanding {
    n: Mutex<usize>,
    cv: Condvar,
}

struct WaitAll<'a>(&'a Outstanding);

impl Drop for WaitAll<'_> {
    fn drop(&mut self) {
        let mut n = lock(&self.0.n);
        while *n > 0 {
            n = self.0.cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Spawns jobs that borrow data living for `'env`.
pub struct Scope<'scope, 'env: 'scope> {
    taskq: &'static Taskq,
    out: Arc<Outstanding>,
    _env: PhantomData<(&'scope (), &'env mut &'env ())>,
}

/// A job's result, once it has run.
struct Slot<T> {
    val: Mutex<Option<std::thread::Result<T>>>,
    cv: Condvar,
}

/// A job spawned in a scope.
pub struct Task<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Task<T> {
    /// Wait for the job; `None` if it panicked.
    pub fn join(self) -> Option<T> {
        let mut v = lock(&self.slot.val);
        loop {
            if let Some(r) = v.take() {
                return r.ok();
            }
            v = self.slot.cv.wait(v).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Queue `f` on the taskq. Jobs start in the order they are spawned;
    /// they issue device I/O in the spawner's priority class.
    pub fn spawn<T: Send + 'env>(&'scope self, f: impl FnOnce() -> T + Send + 'env) -> Task<T> {
        let slot = Arc::new(Slot {
            val: Mutex::new(None),
            cv: Condvar::new(),
        });
        let class = crate::vdev::queue::current();
        let (s, out) = (slot.clone(), self.out.clone());
        let job = move || {
            let r = {
                let _c = crate::vdev::queue::with_class(class);
                catch_unwind(AssertUnwindSafe(f))
            };
            *lock(&s.val) = Some(r);
            s.cv.notify_all();
            // The result is dropped here if its task was (it may borrow
            // what the scope's end frees), before the count says done.
            drop(s);
            let mut n = lock(&out.n);
            *n -= 1;
            if *n == 0 {
                out.cv.notify_all();
            }
        };
        *lock(&self.out.n) += 1;
        let job: Box<dyn FnOnce() + Send + 'env> = Box::new(job);
        // SAFETY: the job borrows only data that outlives 'env, which
        // outlives the `Taskq::scope` call that made this scope; that call
        // does not return or unwind before `WaitAll` sees every job's
        // count released, which each job does after its last use of a
        // borrow (its result is stored, or dropped, first; `f` cannot skip
        // that, as panics are caught). The lifetime is erased only so the job can
        // sit in the queue of threads that outlive it.
        let job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'env>, Job>(job) };
        if let Some(job) = self.taskq.submit(job) {
            job();
        }
        Task { slot }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static TQ: Taskq = Taskq::new("test-tq", 3);

    #[test]
    fn jobs_borrow_return_in_any_order_and_a_panic_is_an_error() {
        let data: Vec<u64> = (0..100).collect();
        let out: Vec<Option<u64>> = TQ.scope(|s| {
            let tasks: Vec<Task<u64>> = data
                .iter()
                .map(|x| {
                    s.spawn(move || {
                        assert!(*x != 42, "job 42 fails");
                        x * 3
                    })
                })
                .collect();
            tasks.into_iter().rev().map(Task::join).collect()
        });
        for (i, r) in out.into_iter().rev().enumerate() {
            if i == 42 {
                assert!(r.is_none());
            } else {
                assert_eq!(r, Some(i as u64 * 3));
            }
        }
    }

    #[test]
    fn a_scope_waits_for_jobs_nobody_joined() {
        let done = AtomicUsize::new(0);
        TQ.scope(|s| {
            for _ in 0..20 {
                s.spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 20);
    }

    #[test]
    fn scopes_start_no_threads_after_the_first() {
        static SMALL: Taskq = Taskq::new("test-tq-small", 3);
        let load = || {
            SMALL.scope(|s| {
                let t: Vec<_> = (0..8).map(|i| s.spawn(move || i * 2)).collect();
                for (i, t) in t.into_iter().enumerate() {
                    assert_eq!(t.join(), Some(i * 2));
                }
            })
        };
        load();
        let n = SMALL.threads();
        assert!((1..=3).contains(&n), "{n} threads");
        for _ in 0..50 {
            load();
        }
        assert!(SMALL.threads() <= 3, "beyond the pool's size");
        // A thread names itself when it starts running: wait for the
        // newest to have.
        let running = || {
            std::fs::read_dir("/proc/self/task")
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                        .filter(|c| c.starts_with("test-tq-small"))
                        .count()
                })
                .unwrap_or(0)
        };
        let t0 = std::time::Instant::now();
        while running() != SMALL.threads() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            running(),
            SMALL.threads(),
            "threads exited or were never counted"
        );
    }

    /// Each thread runs the taskq's init before its first job.
    #[test]
    fn threads_run_their_init_first() {
        thread_local! {
            static READY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        fn init() {
            READY.with(|r| r.set(true));
        }
        static INIT: Taskq = Taskq::with_init("test-tq-init", 2, init);
        let all = INIT.scope(|s| {
            let t: Vec<_> = (0..6)
                .map(|_| s.spawn(|| READY.with(|r| r.get())))
                .collect();
            t.into_iter().all(|t| t.join() == Some(true))
        });
        assert!(all);
    }
}
