//! Scrub and resilver: the pool scan (OpenZFS dsl_scan.c, "sequential
//! scrub", Solaris pool version 35).
//!
//! # Two phases per batch
//!
//! A scan walks every block pointer of the pool in logical order (the MOS,
//! then the root dataset; within an objset the meta-dnode, then each object
//! in number order, each tree depth first). Walking touches only metadata.
//! Pointers are *gathered* until a batch is full (`Tunables::scan_batch_blocks`
//! or `BATCH_BYTES`), then the batch is sorted by device address and *issued*:
//! every block read (every copy and column for a scrub), verified, repaired
//! where redundancy allows, and written to each leaf whose DTL lacks it (the
//! resilver). Sorting turns a fragmented pool's random reads into a sweep
//! across each device.
//!
//! # Persistence and resume
//!
//! Progress is a bookmark `(objset, object, blkid)`: everything in walk order
//! before it has been issued. It is saved in the MOS (object
//! `ObjectDirectory::scan`, JSON `ScanPhys`) after each batch has been fully
//! issued, so a crash, an export or a daemon restart redoes at most one batch.
//! Import restarts a scan whose state is `scanning`.
//!
//! # Safety against reuse
//!
//! Gathered pointers may be freed while the batch waits to be issued; if the
//! space were reallocated, a scrub would "repair" new data with old. So from
//! the moment a batch starts gathering (from the pool's latest committed
//! tree) until it is gathered, the allocator parks frees that become
//! reusable (`Allocator::scan_hold`). Once the batch is gathered it is
//! queued by address (`scan_queue.rs`, OpenZFS's `dsl_scan_freed`): a free
//! of a block not yet read drops it from the batch and is reusable at once;
//! only a free of a block whose run a worker is reading stays parked, until
//! the first txg commit after that run ends. What was parked during the
//! gather is looked at again at the next commit the same way.
//!
//! Parked frees are space writers cannot have: on a pool being overwritten
//! (copy-on-write frees the old blocks) a batch parking everything let a
//! half-full pool refuse almost every write, or run a sync out of space.
//! So when admission refuses a write while a scan parks frees, it raises
//! `ScanSignals::yield_hold`, and a gather in progress ends its batch
//! there (at least `MIN_YIELD_BATCH` blocks); the refused writer's retry
//! after the next sync finds the space.
//!
//! Admission cannot see everything: changes never refused for space
//! (attribute changes, deletes, property changes live on the slop) keep
//! rewriting metadata, and nothing of theirs asks the scan to yield. So
//! the sync itself, out of space while frees are parked, takes them back
//! (`SyncWriter::place`): `ScanFence::break_hold` waits for the run being
//! issued to end and makes every later read of the batch fail, the
//! allocator releases what it parked and parks no more
//! (`Allocator::break_scan_hold`), and the scan gathers its batch again.
//! Every read of a block gathered under the hold (the gather's own
//! metadata reads, each issued run) happens inside the fence, so none
//! reads space the sync reused. Before, a scrub with 4,000 files being
//! chmod'ed suspended a half-empty pool "out of space" within 4 s
//! (`tests/scrub_full.rs`).
//!
//! # Pruning
//!
//! A resilver copies only blocks born in the DTLs of the leaves it rebuilds
//! (`min_txg..=max_txg`); since an indirect block is always born no earlier
//! than anything below it, whole subtrees born before `min_txg` are skipped.
//! Blocks born after `max_txg` (the last txg committed when the scan began)
//! were written with every leaf present and are not issued.

use super::io::SpaIo;
use super::{lock, Pool};
use crate::dmu::blkptr::BlkPtr;
use crate::dmu::objset::{BlockReader, Objset};
use crate::dmu::traverse::{self, At, Next, Position, Visitor};
use crate::error::{Error, Result};
use crate::vdev::leaf::{leaf_key, set_scan_io, ScanIo};
use crate::vdev::queue::scan_thread;
use crate::vdev::{AttachKind, BlockDevice, Leaf};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest stretch of a vdev's address space one issued run covers.
pub const RUN_SPAN: u64 = 8 << 20;
/// Largest gap between blocks inside one run (read through and discarded).
pub const RUN_GAP: u64 = 256 << 10;
/// Most bytes (allocated) gathered before a batch is issued.
pub const BATCH_BYTES: u64 = 4 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanFunc {
    Scrub,
    Resilver,
}

impl ScanFunc {
    /// "scrub" or "resilver", as status, history and the record spell it.
    pub fn name(self) -> &'static str {
        match self {
            ScanFunc::Scrub => "scrub",
            ScanFunc::Resilver => "resilver",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanState {
    Scanning,
    Finished,
    Canceled,
}

/// Walk position: everything before it has been issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bookmark {
    /// The dataset (0: the MOS, 1: the root dataset, else its MOS object).
    pub objset: u64,
    /// Which of its object sets: a snapshot's txg, `u64::MAX` for the
    /// head (see `Pool::walk_sets`). Records written before snapshots
    /// were scanned lack it: 0 walks that dataset's snapshots again.
    #[serde(default)]
    pub txg: u64,
    pub object: u64,
    pub blkid: u64,
}

/// Issue order of a batch. `Birth` and `Logical` (walk order, what scans
/// did before sorting) exist to measure what sorting buys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IssueOrder {
    #[default]
    Sorted,
    Birth,
    Logical,
}

/// The persistent scan record (OpenZFS dsl_scan_phys_t).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanPhys {
    pub func: ScanFunc,
    pub state: ScanState,
    /// Blocks born in `min_txg..=max_txg` are issued.
    pub min_txg: u64,
    pub max_txg: u64,
    pub start_time: u64,
    pub end_time: u64,
    /// Allocated bytes when the scan started.
    pub to_examine: u64,
    /// Bytes of block pointers gathered (walked).
    pub examined: u64,
    /// Bytes read and verified.
    pub issued: u64,
    /// Bytes written by repairs and resilvering.
    pub repaired: u64,
    /// Blocks with no good copy.
    pub errors: u64,
    pub bookmark: Bookmark,
    #[serde(default)]
    pub paused: bool,
    /// When the current pause began (0 if running).
    #[serde(default)]
    pub pause_time: u64,
    /// Leaves being resilvered (guids), for completion.
    #[serde(default)]
    pub targets: Vec<u64>,
    #[serde(default)]
    pub order: IssueOrder,
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ScanPhys {
    /// A scrub of every block from `bookmark` on, with nothing counted
    /// yet: what a walk that only gathers needs.
    pub(crate) fn walk_from(bookmark: Bookmark) -> ScanPhys {
        ScanPhys {
            func: ScanFunc::Scrub,
            state: ScanState::Scanning,
            min_txg: 0,
            max_txg: u64::MAX,
            start_time: 0,
            end_time: 0,
            to_examine: 0,
            examined: 0,
            issued: 0,
            repaired: 0,
            errors: 0,
            bookmark,
            paused: false,
            pause_time: 0,
            targets: Vec::new(),
            order: IssueOrder::Sorted,
        }
    }
}

/// In-memory scan control, one per pool.
#[derive(Default)]
pub struct ScanCtl {
    pub phys: Option<ScanPhys>,
    /// Time the current run (since start or resume) began, and what had been
    /// issued then: the rate shown is of this run.
    pub run_start: Option<(Instant, u64)>,
    pub thread: Option<std::thread::JoinHandle<()>>,
    /// Progress of the batch in flight (not yet in `phys`).
    pub batch_examined: u64,
    pub batch_issued: u64,
    /// Why the scan thread ended with the scan still running (the pool was
    /// suspended, a read of its tree failed): `zpool status` says so
    /// instead of showing progress that is not being made; `zpool clear`
    /// or the next import starts it again.
    pub stopped: Option<(u64, String)>,
    /// A promote moved object sets in the walk order (`Pool::scan_rewind`):
    /// the next bookmark recorded is at most this.
    pub rewind: Option<Bookmark>,
}

/// The fewest blocks a gather ends with when writers ask for the frees it
/// parks, and the smallest batch a scan shrinks to after the sync took
/// them back: small enough to gather between two refused writes' syncs,
/// large enough that each batch still makes progress.
const MIN_YIELD_BATCH: usize = 256;

/// How the sync takes back the frees a scan parks without the scan then
/// reading a block whose space was reused: every read of a block gathered
/// under the hold (the gather's metadata reads, each issued run) happens
/// inside `enter`, and `break_hold` waits for those in progress to end and
/// makes every later `enter` fail until the next batch starts its hold
/// (`reset`, with the allocator's lock held, as the hold is taken).
#[derive(Default)]
pub struct ScanFence {
    reading: std::sync::RwLock<()>,
    broken: AtomicBool,
}

impl ScanFence {
    /// Read blocks gathered under the current hold, or `None` if the hold
    /// was broken (the batch must be abandoned and gathered again).
    pub fn enter(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        let g = self.reading.read().unwrap_or_else(|e| e.into_inner());
        (!self.broken.load(Ordering::SeqCst)).then_some(g)
    }

    /// The sync is out of space: once this returns, no scan reads a block
    /// it gathered under the hold until it gathers again. Blocks for at
    /// most one issued run (`RUN_SPAN` of reads and its repairs).
    pub fn break_hold(&self) {
        self.broken.store(true, Ordering::SeqCst);
        let _hurry = crate::vdev::queue::hurry_scans();
        drop(self.reading.write().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    /// A new hold is taken (the caller holds the allocator's lock).
    pub fn reset(&self) {
        self.broken.store(false, Ordering::SeqCst);
    }
}

/// Flags the scan thread polls.
#[derive(Default)]
pub struct ScanSignals {
    /// Stop issuing (pause, cancel, restart or close).
    pub stop: AtomicBool,
    /// A write was refused for space while this scan parks frees: a
    /// gather in progress ends its batch early (see "Safety against
    /// reuse").
    pub yield_hold: AtomicBool,
    /// Foreground I/O counter, bumped by the object API; the scan yields
    /// while it moves (OpenZFS zfs_scan_idle).
    pub fg_ops: AtomicU64,
    /// Microseconds the scan sleeps per block while foreground I/O is active.
    pub delay_us: AtomicU64,
    /// A spare activation is under way (see `zed_check`).
    pub zed_busy: AtomicBool,
    /// When `zed_check` last looked for grown or replaced devices
    /// (milliseconds since the pool opened).
    pub zed_polled_ms: AtomicU64,
    /// When `zed_check` last read the leaves' labels (`label_check.rs`).
    pub labels_checked_ms: AtomicU64,
    /// The leaves' read and checksum errors at that check: new ones bring
    /// the next check forward.
    pub labels_errors_seen: AtomicU64,
    /// Resilvers started one after another by finished resilvers that
    /// left some leaf still lacking txgs (see `resilver_again`).
    pub auto_restarts: std::sync::atomic::AtomicU32,
    /// Why automatic resilvers stopped, for `zpool status`; cleared by an
    /// operator's attach, replace, online or clear.
    pub halted: std::sync::Mutex<Option<String>>,
}

/// Resilvers a finished resilver may start in a row before the pool stops
/// starting them and says why: each should leave nothing to do, so a
/// chain this long means one that can never finish (issue #13 saw 29,032).
pub const MAX_AUTO_RESILVERS: u32 = 8;

/// The scan's visitor: gathers the pointers of one batch.
struct Gather<'a> {
    io: &'a SpaIo,
    /// Writers were refused space while this gather parks frees
    /// (`ScanSignals::yield_hold`): end the batch early.
    yield_hold: &'a AtomicBool,
    min_txg: u64,
    max_txg: u64,
    cap: usize,
    out: Vec<BlkPtr>,
    out_bytes: u64,
    examined: u64,
    errors: u64,
    /// The sync broke the hold (`ScanFence`): the batch is abandoned.
    broken: bool,
}

impl Gather<'_> {
    fn full(&self) -> bool {
        self.out.len() >= self.cap
            || self.out_bytes >= BATCH_BYTES
            || (self.out.len() >= MIN_YIELD_BATCH && self.yield_hold.load(Ordering::Relaxed))
    }
}

impl Visitor for Gather<'_> {
    fn pre(&mut self, bp: &BlkPtr, _at: &At) -> Next {
        if self.broken || self.full() {
            return Next::Stop;
        }
        if bp.phys_birth <= self.max_txg && bp.phys_birth >= self.min_txg {
            self.examined += bp.asize();
            self.out_bytes += bp.asize();
            self.out.push(*bp);
        }
        Next::Descend
    }

    /// Read a block of the tree being walked, inside the scan fence. A
    /// broken hold ends the walk: what is read now may be reused space.
    fn read(&mut self, _r: &dyn BlockReader, bp: &BlkPtr) -> Result<Arc<Vec<u8>>> {
        let Some(_g) = self.io.scan_fence.enter() else {
            self.broken = true;
            return Err(Error::invalid("scan hold broken"));
        };
        self.io.read_bp(bp)
    }

    fn error(&mut self, _at: &At, _e: Error) {
        if !self.broken {
            self.errors += 1;
        }
    }
}

/// What one batch found.
struct Batch {
    bps: Vec<BlkPtr>,
    examined: u64,
    next: Option<Bookmark>,
    errors: u64,
    /// The sync broke the hold while it was gathered: not to be issued.
    broken: bool,
}

impl Pool {
    /// When (seconds since the epoch) and why the scan thread stopped with
    /// the scan still running, if it did.
    pub fn scan_stopped(&self) -> Option<(u64, String)> {
        lock(&self.scan).stopped.clone()
    }

    /// Start the scan thread again if the recorded scan is running and
    /// nothing runs it (after `zpool clear` resumed a suspended pool).
    pub(crate) fn resume_stopped_scan(self: &Arc<Self>) {
        let running = lock(&self.scan)
            .phys
            .as_ref()
            .is_some_and(|p| p.state == ScanState::Scanning && !p.paused);
        if running && self.tun.sync_thread {
            self.start_scan_thread();
        }
    }

    /// The scan record with the batch in flight counted in.
    pub fn scan_status(&self) -> Option<ScanPhys> {
        let c = lock(&self.scan);
        let mut p = c.phys.clone()?;
        if p.state == ScanState::Scanning {
            p.examined += c.batch_examined;
            p.issued += c.batch_issued;
        }
        Some(p)
    }

    fn scan_record(&self) -> Option<ScanPhys> {
        lock(&self.scan).phys.clone()
    }

    /// Bytes issued per second in the current run of the scan.
    pub fn scan_rate(&self) -> Option<f64> {
        let c = lock(&self.scan);
        let (t, base) = c.run_start?;
        let issued = c.phys.as_ref()?.issued + c.batch_issued;
        let secs = t.elapsed().as_secs_f64().max(0.001);
        Some(issued.saturating_sub(base) as f64 / secs)
    }

    fn save_scan(&self, phys: &ScanPhys) -> Result<()> {
        let obj = {
            let mut st = lock(&self.st);
            if st.dir.scan == 0 {
                let o = self.mos.create_object(
                    crate::dmu::dnode::ot::POOL_PROPS,
                    4096,
                    &crate::dmu::dnode::ObjProps::METADATA,
                )?;
                st.dir.scan = o;
                let dir = st.dir.clone();
                drop(st);
                self.write_json(1, &dir)?;
                o
            } else {
                st.dir.scan
            }
        };
        self.write_json(obj, phys)
    }

    /// A promote moves snapshots from one dataset to another, so from one
    /// place in a scan's walk order (`walk_sets`: by dataset, then txg) to
    /// another, possibly behind the bookmark of a running scan that has
    /// not visited them yet. So it walks the scan back to `objset` (the
    /// walk key of the first of the two datasets): what it visits twice
    /// is verified or copied twice, nothing is missed (OpenZFS
    /// `dsl_scan_ds_clone_swapped`). Called with the promote's sync guard
    /// held, so the rewound record commits with the promote.
    pub(crate) fn scan_rewind(&self, objset: u64) -> Result<()> {
        let to = Bookmark {
            objset,
            ..Bookmark::default()
        };
        let mut c = lock(&self.scan);
        let ScanCtl { phys, rewind, .. } = &mut *c;
        let Some(p) = phys.as_mut().filter(|p| p.state == ScanState::Scanning) else {
            return Ok(());
        };
        *rewind = Some(rewind.map_or(to, |r| r.min(to)));
        if p.bookmark <= to {
            return Ok(());
        }
        log::info!(
            "pool '{}': a promote moved snapshots behind the scan; it walks again from object set {objset}",
            self.name
        );
        p.bookmark = to;
        let p = p.clone();
        drop(c);
        self.save_scan(&p)
    }

    /// Level-0 blocks of the root dataset's files as of the last commit
    /// (fault injection picks its victims here).
    pub fn root_data_blocks(&self) -> Result<Vec<BlkPtr>> {
        let phys = ScanPhys::walk_from(Bookmark {
            objset: 1,
            ..Bookmark::default()
        });
        let r = self.gather_with(&phys, usize::MAX);
        lock(&self.st).alloc.set_scan_hold(false);
        Ok(r?
            .bps
            .into_iter()
            .filter(|b| b.level == 0 && b.obj_type == crate::dmu::dnode::ot::PLAIN_FILE)
            .collect())
    }

    /// `zpool scrub`: start (or resume a paused) scrub.
    pub fn scrub(self: &Arc<Self>) -> Result<()> {
        // A scrub repairs what it finds: not on a read-only pool.
        self.check_rw()?;
        let mut c = lock(&self.scan);
        if let Some(p) = &c.phys {
            if p.state == ScanState::Scanning {
                if p.func == ScanFunc::Resilver {
                    return Err(Error::invalid(format!(
                        "cannot scrub {}: currently resilvering",
                        self.name
                    )));
                }
                if !p.paused {
                    return Err(Error::invalid(format!(
                        "cannot scrub {}: currently scrubbing; use 'zpool scrub -s' to cancel the current scrub",
                        self.name
                    )));
                }
                let mut p = p.clone();
                p.paused = false;
                p.pause_time = 0;
                c.phys = Some(p.clone());
                drop(c);
                self.save_scan(&p)?;
                self.start_scan_thread();
                return Ok(());
            }
        }
        drop(c);
        self.begin_scan(ScanFunc::Scrub, 0, Vec::new(), self.tun.scan_order)
    }

    /// Start a fresh scan, replacing whatever scan there was.
    pub fn begin_scan(
        self: &Arc<Self>,
        func: ScanFunc,
        min_txg: u64,
        targets: Vec<u64>,
        order: IssueOrder,
    ) -> Result<()> {
        self.check_rw()?;
        self.stop_scan_thread();
        let max_txg = self.txg_wait_synced()?;
        if func == ScanFunc::Scrub {
            self.io.data_errors.scrub_started();
        }
        let (_, allocated, _) = self.space();
        let phys = ScanPhys {
            func,
            state: ScanState::Scanning,
            min_txg,
            max_txg,
            start_time: now_secs(),
            end_time: 0,
            to_examine: allocated,
            examined: 0,
            issued: 0,
            repaired: 0,
            errors: 0,
            bookmark: Bookmark::default(),
            paused: false,
            pause_time: 0,
            targets,
            order,
        };
        {
            let mut c = lock(&self.scan);
            c.phys = Some(phys.clone());
            c.run_start = Some((Instant::now(), 0));
        }
        self.save_scan(&phys)?;
        // The scan is on disk before it issues anything.
        self.txg_wait_synced()?;
        self.log_internal(&format!("{} started", func.name()));
        self.start_scan_thread();
        Ok(())
    }

    /// Wait until the scan thread (if any) has stopped: the scan finished,
    /// was paused or canceled (`zpool wait -t scrub,resilver`).
    pub fn wait_scan(&self) {
        loop {
            let h = lock(&self.scan).thread.take();
            match h {
                Some(h) => {
                    let _ = h.join();
                }
                None => return,
            }
        }
    }

    /// `zpool scrub -p`: pause; `scrub` resumes.
    pub fn scrub_pause(&self) -> Result<()> {
        self.check_rw()?;
        self.stop_scan_thread();
        let mut c = lock(&self.scan);
        match &mut c.phys {
            Some(p) if p.state == ScanState::Scanning && p.func == ScanFunc::Scrub => {
                p.paused = true;
                p.pause_time = now_secs();
                let p = p.clone();
                drop(c);
                self.save_scan(&p)
            }
            _ => Err(Error::invalid(format!(
                "cannot pause scrubbing {}: there is no active scrub",
                self.name
            ))),
        }
    }

    /// `zpool scrub -s`: cancel.
    pub fn scrub_cancel(&self) -> Result<()> {
        self.check_rw()?;
        self.stop_scan_thread();
        let mut c = lock(&self.scan);
        match &mut c.phys {
            Some(p) if p.state == ScanState::Scanning && p.func == ScanFunc::Scrub => {
                p.state = ScanState::Canceled;
                p.end_time = now_secs();
                let p = p.clone();
                drop(c);
                self.log_internal("scrub canceled");
                self.save_scan(&p)
            }
            _ => Err(Error::invalid(format!(
                "cannot cancel scrubbing {}: there is no active scrub",
                self.name
            ))),
        }
    }

    /// Stop the scan thread (keeping the persisted state) and wait for it.
    pub(crate) fn stop_scan_thread(&self) {
        // Taking the handle and raising `stop` happen under the scan lock,
        // where `start_scan_thread` looks at both: a scan thread that,
        // while being stopped, finishes and starts the next scan must not
        // spawn a thread that sees `stop` and exits at once, leaving the
        // new scan recorded as running with nothing running it (two quick
        // `zpool replace`s did that).
        let h = {
            let mut c = lock(&self.scan);
            // The scan thread itself starting the next scan: it returns
            // right after. Its handle stays until `start_scan_thread`
            // swaps in the next thread's under the same lock, so
            // `wait_scan` never finds no thread between two scans of a
            // chain (it once returned there, mid-chain).
            if c.thread
                .as_ref()
                .is_some_and(|h| h.thread().id() == std::thread::current().id())
            {
                return;
            }
            let Some(h) = c.thread.take() else { return };
            self.scan_sig.stop.store(true, Ordering::Relaxed);
            h
        };
        let _ = h.join();
        let _c = lock(&self.scan);
        self.scan_sig.stop.store(false, Ordering::Relaxed);
    }

    /// Resume a scan recorded as running (at import).
    pub(crate) fn resume_scan(self: &Arc<Self>, phys: Option<ScanPhys>) {
        let running = phys
            .as_ref()
            .is_some_and(|p| p.state == ScanState::Scanning && !p.paused);
        lock(&self.scan).phys = phys;
        if running && self.tun.sync_thread {
            self.start_scan_thread();
        }
    }

    pub(crate) fn start_scan_thread(self: &Arc<Self>) {
        let mut c = lock(&self.scan);
        // A thread that ended by itself (an error) is replaced, and so is
        // the scan thread starting the next scan of a chain (it returns
        // right after; its handle is let go, see `stop_scan_thread`).
        if c.thread
            .as_ref()
            .is_some_and(|h| h.is_finished() || h.thread().id() == std::thread::current().id())
        {
            c.thread = None;
        }
        // A stop under way: whoever stops the thread starts the next one.
        if c.thread.is_some() || self.scan_sig.stop.load(Ordering::Relaxed) {
            return;
        }
        c.stopped = None;
        if let Some(p) = &c.phys {
            c.run_start = Some((Instant::now(), p.issued));
        }
        let weak = Arc::downgrade(self);
        c.thread = std::thread::Builder::new()
            .name(format!("scan:{}", self.name))
            .spawn(move || {
                let Some(p) = weak.upgrade() else { return };
                // Its traversal's reads are the scan's too: they must not
                // count as interactive I/O the workers then yield to.
                let _class = scan_thread();
                if let Err(e) = p.run_scan() {
                    if !matches!(e, Error::PowerLost) {
                        log::error!("scan of pool '{}' stopped: {e}", p.name);
                        let mut c = lock(&p.scan);
                        if c.phys
                            .as_ref()
                            .is_some_and(|s| s.state == ScanState::Scanning)
                        {
                            c.stopped = Some((now_secs(), e.to_string()));
                        }
                    }
                }
            })
            .ok();
    }

    /// Run the scan to completion (or until stopped), batch after batch.
    /// Also callable directly (tests without threads).
    pub fn run_scan(self: &Arc<Self>) -> Result<()> {
        // Blocks per batch: halved each time writers need the frees the
        // batch parks, grown back after each batch issued whole.
        let full = self.tun.scan_batch_blocks.max(1);
        let mut cap = full;
        loop {
            let Some(mut phys) = self.scan_record() else {
                return Ok(());
            };
            if phys.state != ScanState::Scanning || phys.paused {
                return Ok(());
            }
            if self.scan_sig.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let t0 = Instant::now();
            let res = self.gather_with(&phys, cap).and_then(|b| {
                lock(&self.scan).batch_examined = b.examined;
                let t1 = Instant::now();
                let r = if b.broken {
                    (0, 0, 0, false)
                } else {
                    // From here a free of a block not being read drops it
                    // from the batch instead of parking (`scan_queue.rs`).
                    self.io.scan_queue.start(&b.bps);
                    self.issue_batch(&b.bps, phys.func, phys.order)?
                };
                log::debug!(
                    "scan batch: {} blocks, {} MiB: gather {:?}, issue {:?}",
                    b.bps.len(),
                    r.0 >> 20,
                    t1 - t0,
                    t1.elapsed()
                );
                Ok((b, r))
            });
            let dropped = self.io.scan_queue.end();
            if dropped > 0 {
                log::debug!("scan batch: {dropped} blocks freed before they were read");
            }
            lock(&self.st).alloc.set_scan_hold(false);
            {
                let mut c = lock(&self.scan);
                c.batch_examined = 0;
                c.batch_issued = 0;
            }
            // A writer's request for parked frees ended this batch's gather
            // early, or came while it was issued (when it parks only its
            // runs in flight): either way it is answered.
            self.scan_sig.yield_hold.store(false, Ordering::Relaxed);
            let (batch, (issued, repaired, errors, complete)) = res?;
            if !complete {
                // The sync took the parked frees back (`ScanFence`).
                let yielded = self.io.scan_fence.is_broken();
                if yielded && !self.scan_sig.stop.load(Ordering::Relaxed) {
                    // The bookmark stays, and the batch is gathered again
                    // smaller, so it parks less for less long.
                    cap = (cap / 2).max(MIN_YIELD_BATCH.min(full));
                    log::debug!("scan yielded its parked frees; batch now {cap} blocks");
                    continue;
                }
                // Stopped mid-batch: the bookmark stays, the batch is redone.
                return Ok(());
            }
            cap = (cap * 2).min(full);
            if let Some(p) = self.scan_record() {
                // Paused or canceled meanwhile: keep what they recorded.
                if p.state != ScanState::Scanning || p.paused {
                    return Ok(());
                }
            }
            phys.examined += batch.examined;
            phys.issued += issued;
            phys.repaired += repaired;
            phys.errors += errors + batch.errors;
            // Recorded first, published after: a scan whose record cannot
            // be written (the pool suspended) is not shown as finished.
            // A promote meanwhile walks it back (`scan_rewind`); one that
            // comes while the record is written has it written again.
            loop {
                let floor = lock(&self.scan).rewind;
                match (batch.next, floor) {
                    (Some(b), Some(f)) => phys.bookmark = b.min(f),
                    (None, Some(f)) => phys.bookmark = f,
                    (Some(b), None) => phys.bookmark = b,
                    (None, None) => {
                        phys.state = ScanState::Finished;
                        phys.end_time = now_secs();
                        phys.examined = phys.examined.max(phys.issued);
                    }
                }
                self.save_scan(&phys)?;
                let mut c = lock(&self.scan);
                if c.rewind == floor {
                    c.rewind = None;
                    c.phys = Some(phys.clone());
                    break;
                }
            }
            if phys.state == ScanState::Finished {
                self.scan_done(&phys)?;
                return Ok(());
            }
            // Commit the bookmark before gathering the next batch.
            self.txg_wait_synced()?;
        }
    }

    fn gather_with(&self, phys: &ScanPhys, cap: usize) -> Result<Batch> {
        // Hold frees from the tree we are about to read (see module docs).
        let (ub, dir) = {
            let mut st = lock(&self.st);
            st.alloc.set_scan_hold(true);
            if st.alloc.holding_for_scan() {
                self.io.scan_fence.reset();
            }
            (st.ub, st.dir.clone())
        };
        let ub = ub.ok_or_else(|| Error::invalid("pool has no committed txg"))?;
        let broken = Batch {
            bps: Vec::new(),
            examined: 0,
            next: Some(phys.bookmark),
            errors: 0,
            broken: true,
        };
        let sets = {
            let Some(_g) = self.io.scan_fence.enter() else {
                return Ok(broken);
            };
            let reader: Arc<dyn BlockReader> = self.io.clone();
            let mos = Objset::open(&ub.rootbp, reader, Default::default(), ub.txg + 1)?;
            super::walk_sets(&mos, &dir, Some(phys.max_txg))?
        };
        let mut g = Gather {
            io: &self.io,
            yield_hold: &self.scan_sig.yield_hold,
            min_txg: phys.min_txg,
            max_txg: phys.max_txg,
            cap,
            out: Vec::new(),
            out_bytes: 0,
            examined: 0,
            errors: 0,
            broken: false,
        };
        let start = phys.bookmark;
        let mut next = None;
        let mos = (0, 0, ub.rootbp, 0);
        let all = std::iter::once(mos)
            .chain(sets.iter().map(|s| (s.key.0, s.key.1, s.root, s.min_birth)));
        for (ds, txg, root, min_birth) in all {
            if (ds, txg) < (start.objset, start.txg) {
                continue;
            }
            let from = if (ds, txg) == (start.objset, start.txg) {
                Position {
                    object: start.object,
                    blkid: start.blkid,
                }
            } else {
                Position::START
            };
            let min = min_birth.max(phys.min_txg);
            if let Some(p) = traverse::walk_objset(&*self.io, &root, min, from, &mut g) {
                next = Some(Bookmark {
                    objset: ds,
                    txg,
                    object: p.object,
                    blkid: p.blkid,
                });
                break;
            }
        }
        if g.broken {
            return Ok(broken);
        }
        Ok(Batch {
            bps: g.out,
            examined: g.examined,
            next,
            errors: g.errors,
            broken: false,
        })
    }

    /// Issue a batch: returns (issued bytes, repaired bytes, unrecoverable
    /// blocks, completed).
    ///
    /// The ordered blocks are cut into runs: consecutive blocks on one vdev
    /// lying within `RUN_SPAN` of address space with gaps under `RUN_GAP`.
    /// A worker takes a run, reads each leaf's share of it in one large
    /// read (in parallel across leaves), verifies and repairs the blocks
    /// from those buffers, and writes what the run repaired or resilvered
    /// merged into large writes. A few workers take runs concurrently.
    fn issue_batch(
        &self,
        bps: &[BlkPtr],
        func: ScanFunc,
        order: IssueOrder,
    ) -> Result<(u64, u64, u64, bool)> {
        let mut order_idx: Vec<usize> = (0..bps.len()).collect();
        match order {
            IssueOrder::Sorted => {
                order_idx.sort_by_key(|&i| (bps[i].dva[0].vdev, bps[i].dva[0].offset))
            }
            IssueOrder::Birth => order_idx.sort_by_key(|&i| bps[i].phys_birth),
            IssueOrder::Logical => {}
        }
        let mut runs: Vec<Vec<usize>> = Vec::new();
        // A gang block is not one extent: it runs alone (no prefetch).
        let gang = |b: &BlkPtr| b.dva.iter().any(|d| d.flags & super::gang::DVA_GANG != 0);
        for &i in &order_idx {
            let d = bps[i].dva[0];
            let joins = !gang(&bps[i])
                && runs.last().is_some_and(|r| {
                    !gang(&bps[r[0]]) && {
                        let first = bps[r[0]].dva[0];
                        let last = bps[r[r.len() - 1]].dva[0];
                        d.vdev == first.vdev
                            && d.offset >= last.offset
                            && d.offset <= last.offset + last.asize + RUN_GAP
                            && d.offset + d.asize <= first.offset + RUN_SPAN
                    }
                });
            match runs.last_mut() {
                Some(r) if joins => r.push(i),
                _ => runs.push(vec![i]),
            }
        }
        let scrub = func == ScanFunc::Scrub;
        let issued = AtomicU64::new(0);
        let repaired = AtomicU64::new(0);
        let errors = AtomicU64::new(0);
        let next = AtomicU64::new(0);
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        let fg_seen = AtomicU64::new(self.scan_sig.fg_ops.load(Ordering::Relaxed));
        let workers = 4.min(runs.len()).max(1);
        // Scan I/O is the leaf queues' lowest class (`vdev/queue.rs`): while
        // foreground I/O is about it goes in gaps, one 256 KiB read at a time
        // in the whole daemon. While foreground I/O was seen within this
        // window only worker 0 issues, so the others' CPU stays free too;
        // with `delay_us` set (0 by default) it also pauses `delay_us` per
        // block after each run.
        let busy_window = Duration::from_millis(100);
        let t_start = Instant::now();
        let last_fg_ms = AtomicU64::new(u64::MAX);
        let fg_busy = || {
            let fg = self.scan_sig.fg_ops.load(Ordering::Relaxed);
            let now = t_start.elapsed().as_millis() as u64;
            if fg != fg_seen.swap(fg, Ordering::Relaxed) {
                last_fg_ms.store(now, Ordering::Relaxed);
            }
            let last = last_fg_ms.load(Ordering::Relaxed);
            last != u64::MAX && now.saturating_sub(last) < busy_window.as_millis() as u64
        };
        // Stopped, or the hold on frees taken back (the sync out of
        // space): no run more of this batch. A writer refused space does
        // not end it: what the batch parks now is only what its runs in
        // flight are reading (`scan_queue.rs`).
        let interrupted =
            || self.scan_sig.stop.load(Ordering::Relaxed) || self.io.scan_fence.is_broken();
        // The workers are a taskq's (no thread started per batch); its
        // threads run at the scan's class and nice level.
        crate::zio::scan_issue_taskq().scope(|s| {
            for w in 0..workers {
                let (fg_busy, interrupted) = (&fg_busy, &interrupted);
                let (next, runs, failed) = (&next, &runs, &failed);
                let (issued, repaired, errors) = (&issued, &repaired, &errors);
                s.spawn(move || {
                    loop {
                        if interrupted() || lock(failed).is_some() {
                            return;
                        }
                        let us = self.scan_sig.delay_us.load(Ordering::Relaxed);
                        if w > 0 && fg_busy() {
                            if next.load(Ordering::Relaxed) as usize >= runs.len() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(run) = runs.get(k) else { return };
                        let r = {
                            // Outside the fence, the sync may have reused
                            // space these blocks were in.
                            let Some(_g) = self.io.scan_fence.enter() else {
                                return;
                            };
                            // Blocks freed since the gather are not read;
                            // the rest keep their space until finished.
                            let run = self.io.scan_queue.claim(run);
                            if run.is_empty() {
                                continue;
                            }
                            let r = self.issue_run(bps, &run, scrub);
                            self.io.scan_queue.finish(&run);
                            r
                        };
                        match r {
                            Ok((i, r, e)) => {
                                issued.fetch_add(i, Ordering::Relaxed);
                                repaired.fetch_add(r, Ordering::Relaxed);
                                errors.fetch_add(e, Ordering::Relaxed);
                            }
                            Err(e) => {
                                *lock(failed) = Some(e);
                                return;
                            }
                        }
                        lock(&self.scan).batch_issued = issued.load(Ordering::Relaxed);
                        if us > 0 && fg_busy() {
                            // In slices: a stop or a yield is not kept waiting.
                            let until =
                                Instant::now() + Duration::from_micros(us * run.len() as u64);
                            while Instant::now() < until
                                && !interrupted()
                                && self.scan_sig.delay_us.load(Ordering::Relaxed) > 0
                            {
                                std::thread::sleep(
                                    (until - Instant::now()).min(Duration::from_millis(10)),
                                );
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = lock(&failed).take() {
            return Err(e);
        }
        let complete = !interrupted();
        Ok((
            issued.load(Ordering::Relaxed),
            repaired.load(Ordering::Relaxed),
            errors.load(Ordering::Relaxed),
            complete,
        ))
    }

    /// One run: large reads, per-block verification and repair, merged
    /// writes. Returns (issued, repaired, unrecoverable).
    fn issue_run(&self, bps: &[BlkPtr], run: &[usize], scrub: bool) -> Result<(u64, u64, u64)> {
        let top = self.io.top(bps[run[0]].dva[0].vdev)?;
        let prefetch = if run.len() > 1 {
            self.prefetch_run(&top, bps, run, scrub)
        } else {
            Vec::new()
        };
        let prev = set_scan_io(Some(ScanIo {
            prefetch,
            staged: Vec::new(),
        }));
        let mut out = (0u64, 0u64, 0u64);
        let mut err = None;
        for &i in run {
            let bp = &bps[i];
            match self.io.scan_bp(bp, scrub) {
                Ok(r) => {
                    out.0 += bp.asize();
                    out.1 += r.repaired;
                    if r.unrecoverable {
                        out.2 += 1;
                    }
                }
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let ctx = set_scan_io(prev).unwrap_or_default();
        if let Some(e) = err {
            return Err(e);
        }
        // Merged writes: contiguous pieces per leaf become one write.
        let mut staged = ctx.staged;
        staged.sort_by_key(|(k, off, _)| (*k, *off));
        let leaves = top.leaves();
        let mut i = 0;
        while i < staged.len() {
            let (key, start, _) = staged[i];
            let mut buf = std::mem::take(&mut staged[i].2);
            let mut j = i + 1;
            while j < staged.len()
                && staged[j].0 == key
                && staged[j].1 == start + buf.len() as u64
                && buf.len() < RUN_SPAN as usize
            {
                buf.extend_from_slice(&staged[j].2);
                j += 1;
            }
            if let Some(l) = leaves.iter().find(|l| leaf_key(l) == key) {
                match l.write(&buf, start) {
                    Ok(()) => {}
                    Err(Error::PowerLost) => return Err(Error::PowerLost),
                    // The blocks stay missing on that leaf: the scan reports
                    // errors, so its DTL is kept.
                    Err(_) => out.2 += 1,
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Read, in one I/O per leaf and in parallel across leaves, the part of
    /// each leaf a run of blocks will need.
    fn prefetch_run(
        &self,
        top: &crate::vdev::TopVdev,
        bps: &[BlkPtr],
        run: &[usize],
        scrub: bool,
    ) -> Vec<(usize, u64, Arc<Vec<u8>>)> {
        let n = top.children.len();
        let geom = top.geometry();
        let mut ranges: Vec<Option<(u64, u64)>> = vec![None; n];
        let mut widen = |c: usize, lo: u64, hi: u64| {
            let r = ranges[c].get_or_insert((lo, hi));
            r.0 = r.0.min(lo);
            r.1 = r.1.max(hi);
        };
        for &i in run {
            let d = bps[i].dva[0];
            let psize = bps[i].psize as u64;
            for e in geom.extents(d.offset, psize) {
                widen(e.child, e.offset, e.offset + e.size);
            }
        }
        let births: Vec<u64> = run.iter().map(|&i| bps[i].phys_birth).collect();
        // A leaf is worth reading if it holds some block of the run.
        let useful = |l: &Arc<Leaf>| l.is_usable() && births.iter().any(|b| !l.dtl_covers(*b));
        let mut jobs: Vec<(Arc<Leaf>, u64, u64)> = Vec::new();
        for (c, r) in ranges.iter().enumerate() {
            let Some((lo, hi)) = *r else { continue };
            let col = crate::vdev::leaf::column_leaves(&top.children[c]);
            let mut pick: Vec<Arc<Leaf>> = col.into_iter().filter(|l| useful(l)).collect();
            if !scrub {
                pick.truncate(1);
            }
            for l in pick {
                jobs.push((l, lo, hi));
            }
            // A mirror read needs one side; a scrub reads every side.
            if !scrub && top.ops().replicated() && !jobs.is_empty() {
                break;
            }
        }
        crate::zio::scan_taskq().scope(|s| {
            let hs: Vec<_> = jobs
                .iter()
                .map(|(l, lo, hi)| {
                    s.spawn(move || {
                        let mut buf = vec![0u8; (hi - lo) as usize];
                        l.read_raw(&mut buf, crate::vdev::LABEL_START_SIZE + lo)
                            .ok()
                            .map(|_| (leaf_key(l), *lo, Arc::new(buf)))
                    })
                })
                .collect();
            hs.into_iter().filter_map(|h| h.join().flatten()).collect()
        })
    }

    /// A scan finished: resilvered leaves lose their DTLs, finished
    /// replacements drop the old device, spares no longer needed return.
    fn scan_done(self: &Arc<Self>, phys: &ScanPhys) -> Result<()> {
        if phys.func == ScanFunc::Scrub {
            self.io.data_errors.scrub_completed();
        }
        self.log_internal(&format!(
            "{} done: {} repaired, {} errors",
            phys.func.name(),
            phys.repaired,
            phys.errors
        ));
        if phys.errors == 0 {
            let _g = lock(&self.sync_lock);
            for t in self.io.tops() {
                for l in t.leaves() {
                    if l.is_usable() {
                        l.dtl_resilvered(phys.max_txg);
                    }
                }
            }
            self.finish_replacements()?;
        }
        self.txg_wait_synced()?;
        // Something still needs a resilver (a leaf came back meanwhile)?
        self.resilver_again()
    }

    /// After a finished resilver: start another if a leaf still lacks
    /// txgs, but never an endless chain of them. A resilver that leaves
    /// nothing behind ends the chain; the [`MAX_AUTO_RESILVERS`]th in a
    /// row stops it, with the reason logged and shown by `zpool status`.
    fn resilver_again(self: &Arc<Self>) -> Result<()> {
        let left = self.leaves_to_resilver();
        if left.is_empty() {
            self.scan_sig.auto_restarts.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let n = self.scan_sig.auto_restarts.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= MAX_AUTO_RESILVERS {
            let synced = self.last_txg();
            let what: Vec<String> = left
                .iter()
                .map(|l| match l.dtl_bounds(synced) {
                    Some((a, b)) => format!("{} (txgs {a}-{b})", l.path),
                    None => l.path.clone(),
                })
                .collect();
            let why = format!(
                "{n} resilvers in a row left {} lacking data; automatic resilvers \
                 stopped. 'zpool clear' or 'zpool online' starts one again",
                what.join(", ")
            );
            log::error!("pool '{}': {why}", self.name);
            *lock(&self.scan_sig.halted) = Some(why);
            return Ok(());
        }
        self.maybe_resilver()
    }

    /// Why automatic resilvers stopped, if they did.
    pub fn resilver_halted(&self) -> Option<String> {
        lock(&self.scan_sig.halted).clone()
    }

    /// An operator asked for a resilver (attach, replace, online, clear):
    /// the automatic chain starts afresh.
    pub(crate) fn resilver_unhalt(&self) {
        self.scan_sig.auto_restarts.store(0, Ordering::Relaxed);
        *lock(&self.scan_sig.halted) = None;
    }

    /// Promote resilvered replacements and release spares no longer needed.
    /// Caller holds `sync_lock`.
    pub(crate) fn finish_replacements(&self) -> Result<()> {
        let mut changed = false;
        let mut tops = self.io.tops();
        for t in tops.iter_mut() {
            let mut children = t.children.clone();
            for col in children.iter_mut() {
                let att = col.attached();
                // A finished replacement takes the column.
                if let Some((_, new)) = att.iter().find(|(k, l)| {
                    *k == AttachKind::Replacing && l.is_usable() && l.dtl().is_empty()
                }) {
                    let rest: Vec<(AttachKind, Arc<Leaf>)> = att
                        .iter()
                        .filter(|(_, l)| !Arc::ptr_eq(l, new))
                        .cloned()
                        .collect();
                    *new.attached.write().unwrap_or_else(|e| e.into_inner()) = rest;
                    col.attached
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    let _ = crate::vdev::label::clear(&*col.dev);
                    *col = new.clone();
                    changed = true;
                }
                // A healthy, complete primary needs no spare.
                if col.is_usable() && col.dtl().is_empty() {
                    let mut a = col.attached.write().unwrap_or_else(|e| e.into_inner());
                    let before = a.len();
                    a.retain(|(k, _)| *k != AttachKind::Spare);
                    changed |= a.len() != before;
                }
            }
            if changed {
                *t = t.with_children(t.kind, children);
            }
        }
        if changed {
            *self.io.vdevs.write().unwrap_or_else(|e| e.into_inner()) = tops;
            lock(&self.st).config_dirty = true;
        }
        Ok(())
    }

    /// Start a resilver if some usable leaf lacks txgs and none is running.
    pub fn maybe_resilver(self: &Arc<Self>) -> Result<()> {
        if let Some(p) = self.scan_status() {
            if p.state == ScanState::Scanning && p.func == ScanFunc::Resilver {
                return Ok(());
            }
        }
        if self.leaves_to_resilver().is_empty() {
            return Ok(());
        }
        self.restart_resilver()
    }

    /// Usable leaves that lack some committed txg.
    fn leaves_to_resilver(&self) -> Vec<Arc<Leaf>> {
        let synced = self.last_txg();
        self.io
            .tops()
            .iter()
            .flat_map(|t| t.leaves())
            .filter(|l| l.is_usable() && l.dtl_bounds(synced).is_some())
            .collect()
    }

    /// (Re)start a resilver covering every leaf that lacks txgs: several
    /// replacements share one scan.
    pub fn restart_resilver(self: &Arc<Self>) -> Result<()> {
        let synced = self.last_txg();
        let leaves = self.leaves_to_resilver();
        let min = leaves
            .iter()
            .filter_map(|l| l.dtl_bounds(synced).map(|b| b.0))
            .min()
            .unwrap_or(0);
        let targets = leaves.iter().map(|l| l.guid).collect();
        self.begin_scan(ScanFunc::Resilver, min, targets, self.tun.scan_order)
    }

    /// Called by the sync thread after each txg: if a leaf has left service
    /// and a spare is free, activate it from a helper thread (the sync
    /// thread cannot wait for its own txgs), as OpenZFS's zed does.
    pub(crate) fn zed_check(self: &Arc<Self>) {
        // autoreplace and autoexpand look at the devices at most once a
        // second: a stat and, for a lost leaf, an open of its path.
        let props = self.props();
        let now_ms = self.opened.elapsed().as_millis() as u64;
        let poll = (props.autoreplace || props.autoexpand)
            && now_ms.saturating_sub(self.scan_sig.zed_polled_ms.load(Ordering::Relaxed)) >= 1000;
        // Labels of every usable leaf (spa/label_check.rs), on a pool that
        // can write them back: now and then, and after new read or
        // checksum errors (a blanked device shows itself by them first).
        let errors: u64 = self
            .io
            .tops()
            .iter()
            .flat_map(|t| t.leaves())
            .map(|l| {
                l.stats.read_errors.load(Ordering::Relaxed)
                    + l.stats.cksum_errors.load(Ordering::Relaxed)
            })
            .sum();
        let since = now_ms.saturating_sub(self.scan_sig.labels_checked_ms.load(Ordering::Relaxed));
        let labels = !self.tun.readonly
            && (since >= self.tun.label_check_ms
                // At most five times a second while errors keep coming.
                || (since >= 200
                    && errors != self.scan_sig.labels_errors_seen.load(Ordering::Relaxed)));
        let spares = self.io.spares();
        let spare_free = spares
            .iter()
            .any(|s| s.is_usable() && !self.spare_in_use(s));
        let needs = spare_free
            && self.io.tops().iter().any(|t| {
                t.children
                    .iter()
                    .any(|c| c.is_lost() && !c.attached().iter().any(|(_, l)| l.is_usable()))
            });
        if !(needs || poll || labels) || self.scan_sig.zed_busy.swap(true, Ordering::Relaxed) {
            return;
        }
        if poll {
            self.scan_sig.zed_polled_ms.store(now_ms, Ordering::Relaxed);
        }
        if labels {
            self.scan_sig
                .labels_checked_ms
                .store(now_ms, Ordering::Relaxed);
            self.scan_sig
                .labels_errors_seen
                .store(errors, Ordering::Relaxed);
        }
        let weak = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name(format!("zed:{}", self.name))
            .spawn(move || {
                if let Some(p) = weak.upgrade() {
                    // First: a faulted leaf is what spares and autoreplace
                    // below act on.
                    let lost = labels && !p.label_check().is_empty();
                    if poll && props.autoreplace {
                        if let Err(e) = p.autoreplace_check() {
                            log::warn!("pool '{}': autoreplace failed: {e}", p.name);
                        }
                    }
                    if needs || lost {
                        if let Err(e) = p.activate_spares() {
                            eprintln!("uzfs: pool '{}': spare activation failed: {e}", p.name);
                        }
                    }
                    if poll && props.autoexpand {
                        p.autoexpand();
                    }
                    p.scan_sig.zed_busy.store(false, Ordering::Relaxed);
                }
            });
    }

    /// `autoreplace=on` (what zed does for OpenZFS): a lost leaf (missing,
    /// faulted or removed) whose path now holds a device carrying no pool
    /// label, a new disk put where the old one was, is replaced by it and
    /// resilvered. A device that still carries a label is the old one back,
    /// or another pool's: `zpool online`/`clear` or the operator decide.
    /// Returns whether a replace started.
    pub fn autoreplace_check(self: &Arc<Self>) -> Result<bool> {
        if !self.props().autoreplace || self.readonly() || self.suspended().is_some() {
            return Ok(false);
        }
        let mut started = false;
        for t in self.io.tops() {
            for col in &t.children {
                if !col.is_lost()
                    || col
                        .attached()
                        .iter()
                        .any(|(k, _)| *k == AttachKind::Replacing)
                {
                    continue;
                }
                let Ok(dev) = crate::vdev::FileDevice::open(std::path::Path::new(&col.path)) else {
                    continue;
                };
                if super::probe_label(&dev).is_some() || dev.claim().is_err() {
                    continue;
                }
                log::info!(
                    "pool '{}': autoreplace: a new device at {} replaces the lost one",
                    self.name,
                    col.path
                );
                self.replace(&col.guid.to_string(), &col.path, Arc::new(dev), false)?;
                started = true;
            }
        }
        Ok(started)
    }

    /// A leaf left service (faulted or removed) with a spare available:
    /// attach the spare and resilver onto it (what zed does).
    pub fn activate_spares(self: &Arc<Self>) -> Result<bool> {
        let spares = self.io.spares();
        if spares.is_empty() {
            return Ok(false);
        }
        let mut started = false;
        {
            let _g = lock(&self.sync_lock);
            let synced = self.last_txg();
            for t in self.io.tops() {
                for col in &t.children {
                    if !col.is_lost() || col.attached().iter().any(|(_, l)| l.is_usable()) {
                        continue;
                    }
                    let in_use = |s: &Arc<Leaf>| {
                        self.io
                            .tops()
                            .iter()
                            .flat_map(|t| t.leaves())
                            .any(|l| Arc::ptr_eq(&l, s))
                    };
                    let Some(sp) = spares.iter().find(|s| s.is_usable() && !in_use(s)) else {
                        continue;
                    };
                    sp.set_dtl(vec![(1, synced)]);
                    col.attached
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((AttachKind::Spare, sp.clone()));
                    lock(&self.st).config_dirty = true;
                    started = true;
                }
            }
        }
        if started {
            self.txg_wait_synced()?;
            self.restart_resilver()?;
        }
        Ok(started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::{sim_pool, sim_tunables};
    use crate::vdev::sim::SimWorld;
    use std::collections::BTreeSet;

    /// What a scan from its recorded bookmark to the end gathers, by
    /// address.
    fn rest_of_scan(p: &Pool) -> BTreeSet<(u32, u64)> {
        let phys = p.scan_record().expect("scan record");
        let b = p.gather_with(&phys, usize::MAX);
        lock(&p.st).alloc.set_scan_hold(false);
        let b = b.expect("gather");
        assert!(b.next.is_none() && !b.broken);
        b.bps
            .iter()
            .map(|bp| (bp.dva[0].vdev, bp.dva[0].offset))
            .collect()
    }

    /// Incompressible bytes.
    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Bytes parked for scans across the pool (`Metaslab::held`).
    fn parked(p: &Pool) -> u64 {
        let st = lock(&p.st);
        st.alloc
            .vdevs
            .iter()
            .flat_map(|v| &v.metaslabs)
            .flat_map(|m| &m.held)
            .map(|h| h.1)
            .sum()
    }

    /// Blocks of a gathered batch overwritten before the scan reads them
    /// leave the batch and their space is reusable at once: parked
    /// before, it was space writers could not have until the batch ended.
    /// The rest of the batch is issued and verifies clean.
    #[test]
    fn blocks_freed_before_the_scan_reads_them_leave_the_batch() {
        use crate::dmu::dnode::{ot, ObjProps};
        let world = SimWorld::new();
        let (_d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(7)).expect("pool");
        let os = p.root();
        let obj = os
            .create_object(ot::PLAIN_FILE, 128 << 10, &ObjProps::default())
            .expect("object");
        os.write(obj, 0, &noise(1, 4 << 20)).expect("write");
        p.sync().expect("sync");
        let phys = ScanPhys::walk_from(Bookmark::default());
        let b = p.gather_with(&phys, usize::MAX).expect("gather");
        assert!(!b.broken && b.next.is_none());
        p.io.scan_queue.start(&b.bps);
        // Overwrite the first half; its old blocks are freed in this txg
        // and reusable once the next one has committed.
        let new = noise(2, 2 << 20);
        os.write(obj, 0, &new).expect("overwrite");
        for _ in 0..3 {
            p.want_frees();
            p.sync().expect("sync");
        }
        let freed = p.io.scan_queue.lock().freed;
        assert!(freed >= 16, "{freed} blocks dropped from the batch");
        assert_eq!(parked(&p), 0, "frees parked under a queued batch");
        let (issued, _, errors, complete) = p
            .issue_batch(&b.bps, ScanFunc::Scrub, IssueOrder::Sorted)
            .expect("issue");
        assert!(complete);
        assert_eq!(errors, 0, "a block read after its space was reused");
        let total: u64 = b.bps.iter().map(|bp| bp.asize()).sum();
        assert!(issued < total - (2 << 20), "{issued} of {total} issued");
        p.io.scan_queue.end();
        lock(&p.st).alloc.set_scan_hold(false);
        let mut back = vec![0u8; 2 << 20];
        os.read(obj, 0, &mut back).expect("read");
        assert!(back == new, "overwritten data reads back");
        p.close().expect("close");
    }

    /// Without a queued batch (while it is gathered) every free parks.
    #[test]
    fn frees_park_while_a_batch_is_gathered() {
        use crate::dmu::dnode::{ot, ObjProps};
        let world = SimWorld::new();
        let (_d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(8)).expect("pool");
        let os = p.root();
        let obj = os
            .create_object(ot::PLAIN_FILE, 128 << 10, &ObjProps::default())
            .expect("object");
        os.write(obj, 0, &noise(3, 1 << 20)).expect("write");
        p.sync().expect("sync");
        let phys = ScanPhys::walk_from(Bookmark::default());
        let b = p.gather_with(&phys, usize::MAX).expect("gather");
        os.write(obj, 0, &noise(4, 1 << 20)).expect("overwrite");
        for _ in 0..3 {
            p.want_frees();
            p.sync().expect("sync");
        }
        assert!(parked(&p) >= 1 << 20, "{} parked", parked(&p));
        // Queued now: the next commit looks at what was parked again.
        p.io.scan_queue.start(&b.bps);
        p.want_frees();
        p.sync().expect("sync");
        assert_eq!(parked(&p), 0);
        p.io.scan_queue.end();
        lock(&p.st).alloc.set_scan_hold(false);
        p.close().expect("close");
    }

    /// A promote moves snapshots from one dataset to another, so from
    /// one place in a scan's walk order to another. Moved behind a
    /// running scan's bookmark, their blocks would never be scrubbed nor
    /// resilvered in that scan: the promote walks the scan back to where
    /// they now are (OpenZFS `dsl_scan_ds_clone_swapped`).
    #[test]
    fn a_promote_during_a_scan_does_not_hide_moved_snapshots() {
        let world = SimWorld::new();
        let (_d, p) = sim_pool(&world, "t", 96 << 20, sim_tunables(), Some(11)).expect("pool");
        let (o, obj) = crate::spa::sim_snapshotted_file(&p, 0x11);
        // The snapshot alone holds the first contents.
        o.os.write(obj, 0, &vec![0x22; 256 << 10])
            .expect("overwrite");
        p.sync().expect("sync");
        p.dsl_pool()
            .clone_snapshot("t/o@s", "t/c", &[], false)
            .expect("clone");
        p.dsl_pool().promote("t/c").expect("promote");
        // Now t/o is a clone of t/c@s; promoting it back moves @s from
        // t/c to t/o, which the walk visits first.
        let (o_id, c_id) = (o.id(), p.dsl_pool().dataset("t/c").expect("c").id());
        assert!(o_id < c_id, "the test needs the origin first in walk order");
        p.sync().expect("sync");
        lock(&p.scan).phys = Some(ScanPhys::walk_from(Bookmark {
            objset: c_id,
            ..Bookmark::default()
        }));
        let before = rest_of_scan(&p);
        p.dsl_pool().promote("t/o").expect("promote back");
        let after = rest_of_scan(&p);
        let missed: Vec<_> = before.difference(&after).collect();
        assert!(
            missed.is_empty(),
            "{} blocks the scan had still to visit are now behind it: {missed:?}",
            missed.len()
        );
        p.close().expect("close");
    }
}
