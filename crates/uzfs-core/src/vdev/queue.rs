//! Per-leaf I/O queues with priority classes (OpenZFS's `vdev_queue.c`).
//!
//! # Theory of operation
//!
//! Every I/O a leaf issues belongs to a class, in priority order: sync
//! reads (an application waits), sync writes (the intent log), async
//! reads (prefetch), async writes (the txg sync), scrub and resilver.
//! Before it reaches the device an I/O is *admitted* by its leaf's queue,
//! which bounds how many of each class are in flight (`Limits`: a minimum
//! each class always gets, so none starves, and a maximum it may reach
//! when no more important class is waiting), as OpenZFS's
//! `zfs_vdev_*_min_active`/`_max_active` do. Callers issue their own I/O
//! (threads block in `pread`/`pwrite`), so the queue is an admission gate,
//! not a dispatcher: a thread waits on the leaf's condition variable until
//! its class may go, then issues, then leaves and wakes the others.
//!
//! A scan's I/O is *non-interactive*, and yields to the foreground I/O
//! (sync reads and writes, and the txg's writes, which applications wait
//! on whenever they wait for a commit) of the whole daemon, not only of
//! its leaf: the leaves
//! of a pool often share one disk (files on one filesystem, partitions),
//! where four leaves each with one scan read in flight still put 4 MiB
//! ahead of every application read. So a scan I/O first passes a gate
//! (`ScanGate`): while interactive I/O is in flight, or was within
//! `INTERACTIVE_WINDOW`, it goes only in a gap (no interactive I/O in
//! flight and no other scan I/O), one at a time, cut to `SCAN_CHUNK_BUSY`;
//! one that has waited `SCAN_STARVE` goes anyway, so a scan under a load
//! that never pauses still progresses. A gap is used only `SCAN_PACE`
//! scan-read lengths after the last scan read ended (`GateState::paced`):
//! a commit leaves a gap after each of its waves of writes, and a read in
//! every one of them made it 2-3x longer. When the daemon is otherwise idle
//! scans run at full speed, in `SCAN_CHUNK` pieces (OpenZFS's
//! `zfs_vdev_nia_delay` and scrub aggregation limit play these parts).
//! This replaced a scan thread that slept 500 us per block while
//! foreground I/O was seen, a fixed pace whatever the disk could take.
//!
//! A thread's class is thread-local (`with_class`); fan-out jobs inherit
//! their caller's (`fanout.rs`). Reads default to sync reads and writes to
//! async writes: the intent log, prefetch and scans say otherwise.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Priority classes, most important first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    SyncRead = 0,
    SyncWrite = 1,
    AsyncRead = 2,
    AsyncWrite = 3,
    Scan = 4,
}

pub const CLASSES: usize = 5;

impl IoClass {
    pub const ALL: [IoClass; CLASSES] = [
        IoClass::SyncRead,
        IoClass::SyncWrite,
        IoClass::AsyncRead,
        IoClass::AsyncWrite,
        IoClass::Scan,
    ];
}

/// A scan's reads are cut to this size...
pub const SCAN_CHUNK: usize = 1 << 20;
/// ...and to this one while interactive I/O is about.
pub const SCAN_CHUNK_BUSY: usize = 256 << 10;
/// Interactive I/O within this long makes scans wait for gaps.
pub const INTERACTIVE_WINDOW: Duration = Duration::from_millis(50);

/// While foreground I/O is about, a scan I/O goes only after this long
/// with none in flight. Zero: in any gap. 200 us kept a back-to-back
/// reader's p99 at its idle figure but made the scrub 4x slower (it went
/// mostly on `SCAN_STARVE`), and the frees a scan parks meanwhile ran a
/// pool rewritten one txg per write out of space (bench/RESULTS.md).
pub const SCAN_GAP: Duration = Duration::ZERO;
/// A scan I/O waiting this long goes at its minimum whatever else waits.
pub const SCAN_STARVE: Duration = Duration::from_millis(10);
/// While foreground I/O is about, a scan I/O goes only this many times a
/// scan I/O's length after the last one ended (`GateState::paced`).
/// 3 took a raidz1 commit's p99 under a scrub from 3.3-3.7x idle to
/// about 2x, with the scrub beside that writer 2.3x longer; 6 and 10 were
/// no better at p99 and slower still (bench/RESULTS.md).
pub const SCAN_PACE: u64 = 3;

/// (min, max) in flight per class, and the leaf's total.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub class: [(u32, u32); CLASSES],
    pub total: u32,
}

impl Default for Limits {
    /// OpenZFS's defaults, but for async writes (the sync issues whole
    /// batches through a few threads; its writes to one leaf are few).
    fn default() -> Self {
        Limits {
            class: [(10, 10), (10, 10), (1, 3), (2, 10), (1, 3)],
            total: 32,
        }
    }
}

/// Whether queues admit by class at all (on by default). Off, every I/O
/// goes at once, as before the queues: for measuring them, and as an
/// escape hatch (`UZFS_VDEV_QUEUE=0`).
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

thread_local! {
    static CLASS: Cell<Option<IoClass>> = const { Cell::new(None) };
}

/// The class this thread's I/O goes in as (`None`: by direction).
pub fn current() -> Option<IoClass> {
    CLASS.with(|c| c.get())
}

/// Set this thread's class until the guard drops.
pub fn with_class(c: Option<IoClass>) -> ClassGuard {
    ClassGuard(CLASS.with(|x| x.replace(c)))
}

pub struct ClassGuard(Option<IoClass>);

impl Drop for ClassGuard {
    fn drop(&mut self) {
        CLASS.with(|x| x.set(self.0));
    }
}

/// Make this thread a scan's: its I/O in the scan class until the guard
/// drops, and its CPU priority the least (nice 19, for the thread's
/// life): a scan's verification and parity math must not take the CPU
/// from an application's requests any more than its I/O takes the disk
/// (on two cores, four scan workers at nice 0 held foreground reads' p99
/// at 30 ms behind their checksums, whatever the queues did). Linux
/// applies nice per thread.
pub fn scan_thread() -> ClassGuard {
    // SAFETY: plain syscalls on the calling thread; no memory is passed.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
    with_class(Some(IoClass::Scan))
}

/// The class of an I/O issued now by this thread.
pub fn class_of(write: bool) -> IoClass {
    current().unwrap_or(if write {
        IoClass::AsyncWrite
    } else {
        IoClass::SyncRead
    })
}

#[derive(Default)]
struct State {
    active: [u32; CLASSES],
    waiting: [u32; CLASSES],
    total: u32,
    /// Admissions, per class.
    admitted: [u64; CLASSES],
    /// Nanoseconds spent waiting to be admitted (the scan gate's wait
    /// included), per class: `zpool iostat -l`'s queue waits.
    wait_ns: [u64; CLASSES],
}

/// One leaf's queue.
pub struct IoQueue {
    st: Mutex<State>,
    cv: Condvar,
    limits: Limits,
    /// Scan I/Os of this leaf waiting at the daemon's `ScanGate` (before
    /// the leaf's own admission): pending, for `zpool iostat -q`.
    gated: AtomicU32,
}

impl Default for IoQueue {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

/// An admitted I/O: leaves the queue when dropped.
pub struct Slot<'a> {
    q: &'a IoQueue,
    class: IoClass,
    _ticket: Ticket,
}

/// What an admitted I/O holds of the daemon-wide gate.
enum Ticket {
    None,
    Scan(#[allow(dead_code)] ScanTicket), // held for its drop
    Interactive(InteractiveTicket),
}

impl Ticket {
    /// What an I/O of class `c` holds when it passes no scan gate: the
    /// foreground classes mark the gate busy. The txg's writes count too:
    /// an application waits on them whenever it waits for a commit (a
    /// full dirty limit, `sync`).
    fn of(c: IoClass) -> Ticket {
        match c {
            IoClass::SyncRead | IoClass::SyncWrite | IoClass::AsyncWrite => {
                Ticket::Interactive(GATE.interactive_begin())
            }
            IoClass::AsyncRead | IoClass::Scan => Ticket::None,
        }
    }
}

/// Interactive and scan I/O in flight in the whole daemon (see the module
/// comment).
#[derive(Default)]
struct GateState {
    interactive: u32,
    last_interactive: Option<Instant>,
    scans: u32,
    /// Callers waiting for a scan's run to end (`hurry_scans`): scans stop
    /// yielding meanwhile.
    hurry: u32,
    hurry_until: Option<Instant>,
    /// When the last scan I/O ended, and how long scan I/Os take (a moving
    /// average of the time from admission to the end, nanoseconds): while
    /// the daemon is busy a scan waits `SCAN_PACE` times that after the
    /// last one before it goes (see `paced`).
    last_scan_end: Option<Instant>,
    scan_ns: u64,
}

/// The gate. What every foreground I/O touches is atomic (a global lock
/// taken twice per I/O would serialize the daemon's reads); the lock and
/// condition variable are for scans, which wait.
pub struct ScanGate {
    interactive: AtomicU32,
    /// When foreground I/O last began or ended: nanoseconds after `epoch`
    /// (0: never).
    last_ns: AtomicU64,
    scans_waiting: AtomicU32,
    epoch: Instant,
    st: Mutex<GateState>,
    cv: Condvar,
}

static GATE: std::sync::LazyLock<ScanGate> = std::sync::LazyLock::new(|| ScanGate {
    interactive: AtomicU32::new(0),
    last_ns: AtomicU64::new(0),
    scans_waiting: AtomicU32::new(0),
    epoch: Instant::now(),
    st: Mutex::new(GateState::default()),
    cv: Condvar::new(),
});

pub struct ScanTicket(Instant);
pub struct InteractiveTicket;

impl Drop for ScanTicket {
    fn drop(&mut self) {
        let mut st = GATE.lock();
        st.scans -= 1;
        st.scan_ended(self.0, Instant::now());
        drop(st);
        if GATE.scans_waiting.load(Ordering::SeqCst) > 0 {
            GATE.cv.notify_all();
        }
    }
}

impl Drop for InteractiveTicket {
    fn drop(&mut self) {
        GATE.touch();
        if GATE.interactive.fetch_sub(1, Ordering::SeqCst) == 1
            && GATE.scans_waiting.load(Ordering::SeqCst) > 0
        {
            // (Under the lock, so a scan between its check and its wait
            // cannot miss it; its timeout bounds any other miss.)
            drop(GATE.lock());
            GATE.cv.notify_all();
        }
    }
}

impl GateState {
    fn busy(&self, now: Instant) -> bool {
        self.interactive > 0
            || self
                .last_interactive
                .is_some_and(|t| now.duration_since(t) < INTERACTIVE_WINDOW)
    }

    /// A scan I/O that started waiting at `t0` may go at `now`.
    fn scan_may_go(&self, now: Instant, t0: Instant) -> bool {
        let quiet = self.interactive == 0
            && self
                .last_interactive
                .is_none_or(|t| now.duration_since(t) >= SCAN_GAP);
        self.hurry > 0
            || self.hurry_until.is_some_and(|t| now < t)
            || !self.busy(now)
            || (self.scans == 0
                && ((quiet && self.paced(now)) || now.duration_since(t0) >= SCAN_STARVE))
    }

    /// Whether the last scan I/O ended long enough ago: `SCAN_PACE` times
    /// a scan I/O's usual length. A foreground job whose I/O comes in
    /// waves with CPU work between them (a txg commit writes data, then
    /// each level of the tree, then the MOS in passes, then the labels)
    /// has a gap after every wave, and a scan read in each delays the next
    /// wave by the read's length: a commit of 2.7 ms on this VM's disk
    /// took 5 ms at the median and 15 ms at p99 with a scrub reading in
    /// its gaps (up to 30 reads in one commit). Paced, a scan takes at most
    /// one read per `SCAN_PACE + 1` read lengths of a busy daemon's time,
    /// however many gaps the foreground leaves. (A read costs a commit
    /// more than its own length, about 0.65 ms against 0.25-0.4 ms here:
    /// the writes behind it wait for it and then for themselves.)
    fn paced(&self, now: Instant) -> bool {
        let pace = Duration::from_nanos(self.scan_ns.saturating_mul(SCAN_PACE));
        self.last_scan_end
            .is_none_or(|t| now.duration_since(t) >= pace)
    }

    /// A scan I/O admitted at `began` ended at `now`.
    fn scan_ended(&mut self, began: Instant, now: Instant) {
        let ns = now.duration_since(began).as_nanos().min(u64::MAX as u128) as u64;
        // An eighth of each new length: a few reads' worth of memory.
        self.scan_ns = if self.scan_ns == 0 {
            ns
        } else {
            self.scan_ns - self.scan_ns / 8 + ns / 8
        };
        self.last_scan_end = Some(now);
    }
}

impl ScanGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        let ns = self.epoch.elapsed().as_nanos().max(1) as u64;
        self.last_ns.store(ns, Ordering::SeqCst);
    }

    /// (Only the end of foreground I/O is timed: a scan looks at the count
    /// while any is in flight, and at the time once none is.)
    fn interactive_begin(&self) -> InteractiveTicket {
        self.interactive.fetch_add(1, Ordering::SeqCst);
        InteractiveTicket
    }

    /// The foreground half of the state, read from the atomics.
    fn observe(&self, st: &mut GateState) {
        st.interactive = self.interactive.load(Ordering::SeqCst);
        let ns = self.last_ns.load(Ordering::SeqCst);
        st.last_interactive = (ns > 0).then(|| self.epoch + Duration::from_nanos(ns));
    }

    /// Wait for the scan's turn: at once when the daemon is idle; in a gap
    /// while it is not; after `SCAN_STARVE` whatever happens.
    fn scan_begin(&self) -> ScanTicket {
        let t0 = Instant::now();
        let mut st = self.lock();
        let mut waiting = false;
        loop {
            self.observe(&mut st);
            if st.scan_may_go(Instant::now(), t0) {
                break;
            }
            if !waiting {
                waiting = true;
                self.scans_waiting.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            // Woken when interactive I/O drains or a scan I/O ends; the
            // timeout sees the window close and starvation arrive.
            st = self
                .cv
                .wait_timeout(st, SCAN_GAP.max(Duration::from_millis(1)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if waiting {
            self.scans_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        st.scans += 1;
        ScanTicket(Instant::now())
    }
}

/// Someone waits for the scan's run in flight to end (the sync taking back
/// the frees a scan parks: `ScanFence::break_hold`): scan I/O stops
/// yielding until the guard drops, so a yielding scan never holds up a
/// sync (priority inversion).
pub fn hurry_scans() -> HurryGuard {
    GATE.lock().hurry += 1;
    GATE.cv.notify_all();
    HurryGuard
}

/// [`hurry_scans`] for a while: a writer refused for the space a scan
/// parks asked it to give the space back, which it does once the runs in
/// flight end (`ScanSignals::yield_hold`, `spa/scan_queue.rs`).
pub fn hurry_scans_for(d: Duration) {
    GATE.lock().hurry_until = Some(Instant::now() + d);
    GATE.cv.notify_all();
}

pub struct HurryGuard;

impl Drop for HurryGuard {
    fn drop(&mut self) {
        GATE.lock().hurry -= 1;
    }
}

/// Mark foreground I/O issued around the queues (a flush) as in flight
/// until the ticket drops: scans wait for it as for any other.
pub fn foreground_io() -> InteractiveTicket {
    GATE.interactive_begin()
}

/// Whether interactive I/O is about now (a scan's reads then go in
/// `SCAN_CHUNK_BUSY` pieces).
pub fn interactive_now() -> bool {
    let mut st = GateState::default();
    GATE.observe(&mut st);
    st.busy(Instant::now())
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut st = self.q.lock();
        st.active[self.class as usize] -= 1;
        st.total -= 1;
        // A notify is a futex syscall even with nobody waiting: only when
        // someone is (the common case is nobody).
        let wake = st.waiting.iter().any(|&w| w > 0);
        drop(st);
        if wake {
            self.q.cv.notify_all();
        }
    }
}

impl IoQueue {
    pub fn new(limits: Limits) -> Self {
        IoQueue {
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
            limits,
            gated: AtomicU32::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an I/O of class `c` may be issued now (OpenZFS's
    /// `vdev_queue_class_to_issue`, asked by the waiter itself).
    fn may_issue(&self, st: &State, c: IoClass) -> bool {
        let i = c as usize;
        let (min, max) = self.limits.class[i];
        if st.total >= self.limits.total {
            return false;
        }
        if st.active[i] < min {
            return true;
        }
        // Up to the maximum, if no more important class below its own
        // maximum is waiting.
        st.active[i] < max
            && (0..i).all(|h| st.waiting[h] == 0 || st.active[h] >= self.limits.class[h].1)
    }

    /// Wait until an I/O of class `c` may go; it is in flight until the
    /// slot drops. A scan I/O passes the daemon's `ScanGate` first.
    pub fn admit(&self, c: IoClass) -> Slot<'_> {
        let t0 = Instant::now();
        let enabled = ENABLED.load(Ordering::Relaxed);
        let ticket = if c == IoClass::Scan && enabled {
            self.gated.fetch_add(1, Ordering::Relaxed);
            let t = GATE.scan_begin();
            self.gated.fetch_sub(1, Ordering::Relaxed);
            Ticket::Scan(t)
        } else {
            Ticket::of(c)
        };
        let i = c as usize;
        let mut st = self.lock();
        if enabled && !self.may_issue(&st, c) {
            st.waiting[i] += 1;
            while !self.may_issue(&st, c) {
                st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.waiting[i] -= 1;
        }
        st.wait_ns[i] += t0.elapsed().as_nanos() as u64;
        self.enter(&mut st, c, ticket)
    }

    /// Put an I/O of class `c` in flight (`st` locked).
    fn enter(&self, st: &mut State, c: IoClass, ticket: Ticket) -> Slot<'_> {
        let i = c as usize;
        st.active[i] += 1;
        st.total += 1;
        st.admitted[i] += 1;
        Slot {
            q: self,
            class: c,
            _ticket: ticket,
        }
    }

    /// Count an I/O of class `c` issued around the queue, now (the intent
    /// log's durable writes, all leaves' in one io_uring submission): in
    /// flight until the slot drops, so the other classes and the scan
    /// gate see it, but never waiting and never refused. Waiting here
    /// while holding other leaves' slots could deadlock two commits; the
    /// sync-write class goes first anyway.
    pub fn account(&self, c: IoClass) -> Slot<'_> {
        let ticket = Ticket::of(c);
        self.enter(&mut self.lock(), c, ticket)
    }

    /// I/Os admitted so far, per class.
    pub fn admitted(&self) -> [u64; CLASSES] {
        self.lock().admitted
    }

    /// Nanoseconds admissions waited, per class.
    pub fn wait_ns(&self) -> [u64; CLASSES] {
        self.lock().wait_ns
    }

    /// In flight now, per class.
    pub fn active(&self) -> [u32; CLASSES] {
        self.lock().active
    }

    /// Waiting to be admitted now, per class (scan I/Os waiting at the
    /// daemon's gate included).
    pub fn waiting(&self) -> [u32; CLASSES] {
        let mut w = self.lock().waiting;
        w[IoClass::Scan as usize] += self.gated.load(Ordering::Relaxed);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// Until one I/O of class `c` waits for admission on `q` (10 s at most).
    fn await_waiting(q: &IoQueue, c: IoClass) {
        let t0 = Instant::now();
        while q.waiting()[c as usize] != 1 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never seen waiting");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// An I/O counted around the queue goes at once, even past every
    /// limit, and holds its place until it ends.
    #[test]
    fn accounted_io_never_waits_and_is_in_flight_until_it_ends() {
        let q = IoQueue::new(Limits {
            class: [(1, 1); CLASSES],
            total: 1,
        });
        let a = q.account(IoClass::SyncWrite);
        let b = q.account(IoClass::SyncWrite);
        assert_eq!(q.active()[IoClass::SyncWrite as usize], 2);
        assert_eq!(q.admitted()[IoClass::SyncWrite as usize], 2);
        // An admitted I/O waits for them: the total is taken.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| drop(q.admit(IoClass::AsyncWrite)));
            await_waiting(&q, IoClass::AsyncWrite);
            drop((a, b));
            waiter.join().expect("waiter");
        });
        assert_eq!(q.active(), [0; CLASSES]);
    }

    /// What `zpool iostat -q` reads: the I/Os in flight and those waiting
    /// for admission at this moment, per class.
    #[test]
    fn waiting_and_active_are_the_queue_now() {
        let q = IoQueue::new(Limits {
            class: [(1, 1); CLASSES],
            total: 8,
        });
        let held = q.admit(IoClass::AsyncWrite);
        assert_eq!(q.active()[IoClass::AsyncWrite as usize], 1);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| drop(q.admit(IoClass::AsyncWrite)));
            await_waiting(&q, IoClass::AsyncWrite);
            assert_eq!(q.waiting().iter().sum::<u32>(), 1);
            drop(held);
            waiter.join().expect("waiter");
        });
        assert_eq!(q.waiting(), [0; CLASSES]);
        assert_eq!(q.active(), [0; CLASSES]);
    }

    /// Limits are never exceeded, whatever the mix: many threads of every
    /// class issue through one queue and record the peak in flight.
    #[test]
    fn no_class_exceeds_its_maximum_and_every_class_progresses() {
        let q = Arc::new(IoQueue::new(Limits {
            class: [(2, 4), (2, 4), (1, 2), (1, 3), (1, 2)],
            total: 8,
        }));
        let inflight: Arc<[AtomicU32; CLASSES]> = Arc::new(Default::default());
        let peak: Arc<[AtomicU32; CLASSES]> = Arc::new(Default::default());
        let total_peak = Arc::new(AtomicU32::new(0));
        let done: Arc<[AtomicU32; CLASSES]> = Arc::new(Default::default());
        std::thread::scope(|s| {
            for t in 0..20 {
                let c = IoClass::ALL[t % CLASSES];
                let (q, inflight, peak, total_peak, done) =
                    (&q, &inflight, &peak, &total_peak, &done);
                s.spawn(move || {
                    for _ in 0..200 {
                        let _slot = q.admit(c);
                        let n = inflight[c as usize].fetch_add(1, Ordering::SeqCst) + 1;
                        peak[c as usize].fetch_max(n, Ordering::SeqCst);
                        let all: u32 = inflight.iter().map(|a| a.load(Ordering::SeqCst)).sum();
                        total_peak.fetch_max(all, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(50));
                        inflight[c as usize].fetch_sub(1, Ordering::SeqCst);
                        done[c as usize].fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        let limits = q.limits;
        for c in IoClass::ALL {
            let p = peak[c as usize].load(Ordering::SeqCst);
            let max = limits.class[c as usize].1;
            assert!(p <= max, "{c:?}: {p} in flight, max {max}");
            assert_eq!(done[c as usize].load(Ordering::SeqCst), 800, "{c:?}");
        }
        assert!(total_peak.load(Ordering::SeqCst) <= limits.total);
        assert_eq!(q.active(), [0; CLASSES]);
    }

    /// The daemon-wide gate: scans run freely while nothing interactive is
    /// about, one at a time in gaps while it is, and one that has waited
    /// `SCAN_STARVE` goes even with interactive I/O in flight.
    #[test]
    fn scans_yield_to_interactive_io() {
        let t0 = Instant::now();
        let later = |d: Duration| t0 + d;
        let mut st = GateState {
            scans: 3,
            ..Default::default()
        };
        assert!(st.scan_may_go(t0, t0), "idle: any number of scans");
        // Interactive I/O in flight: no scan, until it has starved, and
        // then only if no other scan is in flight.
        st.interactive = 1;
        st.last_interactive = Some(t0);
        st.scans = 0;
        assert!(!st.scan_may_go(t0, t0));
        assert!(st.scan_may_go(later(SCAN_STARVE), t0));
        st.scans = 1;
        assert!(!st.scan_may_go(later(SCAN_STARVE), t0));
        // A gap inside the window: one scan I/O at a time, once the gap
        // has lasted SCAN_GAP.
        st.interactive = 0;
        assert!(!st.scan_may_go(later(SCAN_GAP), t0));
        st.scans = 0;
        if SCAN_GAP > Duration::ZERO {
            assert!(!st.scan_may_go(later(SCAN_GAP / 2), later(SCAN_GAP / 2)));
        }
        assert!(st.scan_may_go(later(SCAN_GAP), later(SCAN_GAP)));
        // A sync waits for the scan's run: no yielding at all.
        st.scans = 1;
        st.interactive = 1;
        st.hurry = 1;
        assert!(st.scan_may_go(t0, t0));
        st.hurry = 0;
        st.interactive = 0;
        // The window closes: free again.
        st.scans = 2;
        assert!(st.scan_may_go(later(INTERACTIVE_WINDOW), later(INTERACTIVE_WINDOW)));
    }

    /// While the daemon is busy a scan I/O goes in a gap only `SCAN_PACE`
    /// times a scan I/O's length after the last one ended; idle, or
    /// starved, it goes at once.
    #[test]
    fn busy_scans_are_paced_by_their_own_length() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut st = GateState {
            last_interactive: Some(t0),
            ..Default::default()
        };
        assert!(st.scan_may_go(t0, t0), "no scan has run yet");
        // Two reads of 1 ms and 2 ms: the average moves an eighth.
        st.scan_ended(t0, t0 + ms(1));
        assert_eq!(st.scan_ns, 1_000_000);
        st.scan_ended(t0 + ms(1), t0 + ms(3));
        assert_eq!(st.scan_ns, 1_000_000 - 125_000 + 250_000);
        let end = t0 + ms(3);
        let pace = Duration::from_nanos(st.scan_ns * SCAN_PACE);
        st.last_interactive = Some(end);
        assert!(
            !st.scan_may_go(end + pace / 2, end),
            "too soon after the last"
        );
        assert!(st.scan_may_go(end + pace, end + pace / 2));
        // Starved: goes whatever the pace says (a scan under a load that
        // never pauses progresses).
        st.interactive = 1;
        assert!(st.scan_may_go(end + SCAN_STARVE, end));
        // Idle (the window closed): not paced at all.
        st.interactive = 0;
        st.last_interactive = Some(end - INTERACTIVE_WINDOW);
        assert!(st.scan_may_go(end + pace / 2, end + pace / 2));
    }

    /// More important classes waiting go first: a class past its minimum
    /// waits while one above it waits below its maximum.
    #[test]
    fn a_waiting_higher_class_goes_first() {
        let q = IoQueue::default();
        let mut st = q.lock();
        st.active[IoClass::AsyncWrite as usize] = 2;
        assert!(q.may_issue(&st, IoClass::AsyncWrite));
        st.waiting[IoClass::SyncRead as usize] = 1;
        assert!(!q.may_issue(&st, IoClass::AsyncWrite));
        st.active[IoClass::AsyncWrite as usize] = 1;
        assert!(
            q.may_issue(&st, IoClass::AsyncWrite),
            "its minimum still goes"
        );
        st.total = q.limits.total;
        assert!(!q.may_issue(&st, IoClass::SyncRead), "the leaf's total");
    }

    #[test]
    fn a_thread_class_is_scoped_and_defaults_by_direction() {
        assert_eq!(class_of(false), IoClass::SyncRead);
        assert_eq!(class_of(true), IoClass::AsyncWrite);
        {
            let _g = with_class(Some(IoClass::Scan));
            assert_eq!(class_of(false), IoClass::Scan);
            {
                let _h = with_class(Some(IoClass::SyncWrite));
                assert_eq!(class_of(true), IoClass::SyncWrite);
            }
            assert_eq!(class_of(true), IoClass::Scan);
        }
        assert_eq!(current(), None);
    }
}
