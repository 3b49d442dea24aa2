//! Giving the kernel the rest of a record a read covered in part
//! (FUSE_NOTIFY_STORE).
//!
//! # Why
//!
//! The kernel's page cache above the mount holds file data; the ARC holds
//! what the kernel does not (docs/ARCHITECTURE.md, "one copy"). A read
//! of a whole record hands it to the kernel and the ARC lets it go. A 4
//! KiB random read cannot: the daemon reads the 128 KiB record, sends 4
//! KiB, and must keep the record, or the next 4 KiB read of it costs
//! another device read. So a random reader's working set lived in the
//! ARC, bounded by `arc_max`, every read a FUSE round trip, while the
//! kernel, which could hold it all, held 4 KiB pages here and there
//! (bench/RESULTS.md: a 2 GiB file through a 512 MiB ARC read 0.35x of
//! the same file at the default sizes).
//!
//! Here, after answering such a read, the mount gives the kernel the rest
//! of the record with FUSE_NOTIFY_STORE, from a thread of its own, and
//! once the kernel holds it all the ARC lets it go
//! ([`Zpl::kernel_holds`]). The next read of any part of the record is
//! answered by the kernel without asking the daemon.
//!
//! # The hazards, and the rules that answer them
//!
//! A store copies over whatever the kernel holds, without looking:
//!
//! 1. **Dirty pages.** With the writeback cache, a write(2) leaves its
//!    bytes in the kernel's pages; the daemon sees them only at writeback.
//!    A store of the record as the daemon read it would overwrite them
//!    with older bytes. Only a file open for writing (or mapped by one:
//!    the kernel releases a handle only once its mappings are gone) can
//!    have dirty pages, and the kernel writes them back before it
//!    releases the last such handle (`fuse_release`). So: **no store
//!    reaches a file with a writer**. An OPEN or CREATE for writing counts
//!    a writer and, before it is answered (before the writer can write),
//!    cancels stores queued for the file and waits for the one being sent.
//! 2. **Stale bytes.** A store carries bytes read before it is sent. Every
//!    change to a file's bytes comes through a writer, a truncate
//!    (SETATTR of the size, possibly without a handle), or a rollback.
//!    Each file counts its changes; a store carries the count seen before
//!    its bytes were read and is dropped if the count moved. A truncate
//!    is a writer while it runs. A rollback moves an epoch every store
//!    carries ([`Stores::rolled_back`]) and waits for the store being
//!    sent before the kernel's pages of changed files are dropped.
//! 3. **Size.** The kernel grows its size of the file to the end of a
//!    store: stores stop at the file's size as read, and a truncate since
//!    then is a change (2).
//!
//! A store waits for the page locks of reads the kernel has in flight on
//! the same pages, which request threads answer; a request thread waits
//! for a store only in an OPEN or truncate of the same file, so the store
//! can wait forever only if every request thread of a queue sits in one
//! of those at once while a read of the same pages waits in that queue:
//! a hang, never a wrong byte, and not seen; those waits log every
//! second, naming the file. Removing it needs replies that can be
//! deferred without holding a thread.
//!
//! Off under a memory cgroup limit (the pages a store creates are charged
//! to the daemon's cgroup, not the reader's) and with `UZFS_FUSE_STORE=0`.
//! Counted in `uzfs_kernel_stores` (records given) and
//! `uzfs_kernel_stores_dropped` (dropped by a change or a full queue).

use super::Notifier;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use uzfs_core::dmu::objset::RecordPart;
use uzfs_core::zpl::Zpl;

/// Records waiting to be stored, and their bytes (a queued record's
/// buffer lives on even if the ARC evicts it, outside the ARC's bound);
/// past either a read's record is not stored (its next read asks the
/// daemon, as without stores).
const QUEUE: usize = 256;
const QUEUE_BYTES: usize = 16 << 20;

/// Records given to the kernel, and stores dropped.
pub static STORED: AtomicU64 = AtomicU64::new(0);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// `UZFS_FUSE_STORE=0`, or a memory cgroup limit, turns stores off.
pub fn wanted() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("UZFS_FUSE_STORE").map_or(true, |v| v != "0")
            && uzfs_core::arc::memory::SystemMemory::detect()
                .cgroup_limit()
                .is_none()
    })
}

#[derive(Default)]
struct FileState {
    /// Handles open for writing, and truncates running.
    writers: u32,
    /// Changes to the file's bytes (writers opened, truncates) so far.
    changes: u64,
    /// Reads between their ticket and their queueing, and queued or
    /// sending stores: the state lives while any holds a ticket.
    holds: u32,
    /// Stores being sent now.
    sending: u32,
}

#[derive(Default)]
struct State {
    files: HashMap<u64, FileState>,
    /// Moved by a rollback: every store queued before is dropped.
    epoch: u64,
    /// Stores being sent, all files (a rollback waits for none).
    sending: u32,
    /// (node id, record offset) queued, so a record is queued once.
    queued: HashSet<(u64, u64)>,
    /// Bytes of the records queued.
    queued_bytes: usize,
}

impl State {
    /// A ticket or store of `ino` is done with.
    fn release(&mut self, ino: u64) {
        if let Some(f) = self.files.get_mut(&ino) {
            f.holds -= 1;
        }
        self.prune(ino);
    }

    /// Forget `ino` if nothing refers to it any more.
    fn prune(&mut self, ino: u64) {
        if self
            .files
            .get(&ino)
            .is_some_and(|f| f.writers == 0 && f.holds == 0 && f.sending == 0)
        {
            self.files.remove(&ino);
        }
    }
}

/// What a read may queue once it has its bytes: taken before it reads.
#[derive(Clone, Copy)]
pub struct Ticket {
    ino: u64,
    changes: u64,
    epoch: u64,
}

struct Job {
    ticket: Ticket,
    /// What the reader was sent (the kernel has those pages, locked until
    /// our reply lands): not stored again.
    sent: (u64, u64),
    part: RecordPart,
    zpl: Arc<Zpl>,
}

/// The stores of one mount (shared by the trees a rollback swaps).
#[derive(Default)]
pub struct Stores {
    state: Mutex<State>,
    idle: Condvar,
    tx: Mutex<Option<SyncSender<Job>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stores {
    /// Start the thread that sends stores through `notifier`.
    pub fn start(self: &Arc<Self>, notifier: Notifier) {
        if !wanted() {
            return;
        }
        let (tx, rx) = sync_channel(QUEUE);
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("fuse-store".into())
            .spawn(move || sender(me, rx, notifier));
        if spawned.is_ok() {
            *lock(&self.tx) = Some(tx);
        }
    }

    /// Whether stores are being sent at all.
    pub fn on(&self) -> bool {
        lock(&self.tx).is_some()
    }

    /// A read of node `ino` for the kernel's page cache is about to read
    /// the file's bytes: a ticket to queue stores with, unless the file
    /// has a writer.
    pub fn ticket(&self, ino: u64) -> Option<Ticket> {
        if !self.on() {
            return None;
        }
        let mut st = lock(&self.state);
        let epoch = st.epoch;
        let f = st.files.entry(ino).or_default();
        if f.writers > 0 {
            return None;
        }
        f.holds += 1;
        Some(Ticket {
            ino,
            changes: f.changes,
            epoch,
        })
    }

    /// The read with `ticket` sent the kernel `sent` (file offsets) and
    /// covered `parts` only in part: queue the rest of each. A record
    /// whose rest is empty (the read reached the end of the file) is the
    /// kernel's already.
    pub fn queue(
        &self,
        ticket: Ticket,
        sent: (u64, u64),
        parts: &mut Vec<RecordPart>,
        zpl: &Arc<Zpl>,
    ) {
        let ino = ticket.ino;
        let mut st = lock(&self.state);
        for part in parts.drain(..) {
            let (from, to) = (part.offset, part.offset + part.len as u64);
            if sent.0 <= from && to <= sent.1 {
                zpl.kernel_holds(&part);
                continue;
            }
            let bytes = part.data.len();
            if st.queued_bytes + bytes > QUEUE_BYTES {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if !st.queued.insert((ino, part.offset)) {
                continue;
            }
            let job = Job {
                ticket,
                sent,
                part,
                zpl: zpl.clone(),
            };
            let tx = lock(&self.tx);
            let r = match tx.as_ref() {
                Some(tx) => tx.try_send(job),
                None => Err(TrySendError::Disconnected(job)),
            };
            match r {
                Ok(()) => {
                    st.queued_bytes += bytes;
                    if let Some(f) = st.files.get_mut(&ino) {
                        f.holds += 1;
                    }
                }
                Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => {
                    st.queued.remove(&(ino, j.part.offset));
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The ticket's own hold.
        st.release(ino);
    }

    /// Give back a ticket that queued nothing (the read failed).
    pub fn drop_ticket(&self, ticket: Ticket) {
        lock(&self.state).release(ticket.ino);
    }

    /// Node `ino` gets a writer (an OPEN or CREATE for writing, answered
    /// after this returns; or a truncate, which calls [`Stores::done`]
    /// when it is over): stores queued for it are dropped, and this waits
    /// for the one being sent.
    pub fn writer(&self, ino: u64) {
        if !self.on() {
            return;
        }
        let mut st = lock(&self.state);
        let f = st.files.entry(ino).or_default();
        f.writers += 1;
        f.changes += 1;
        let mut waited = 0u32;
        while st.files.get(&ino).is_some_and(|f| f.sending > 0) {
            let (g, t) = self
                .idle
                .wait_timeout(st, Duration::from_secs(1))
                .unwrap_or_else(|e| e.into_inner());
            st = g;
            if t.timed_out() {
                waited += 1;
                log::warn!(
                    "node {ino}: an open or truncate waited {waited} s for a page-cache store"
                );
            }
        }
    }

    /// A writer of node `ino` is gone (a RELEASE of a handle opened for
    /// writing, or a truncate finished).
    pub fn done(&self, ino: u64) {
        if !self.on() {
            return;
        }
        let mut st = lock(&self.state);
        if let Some(f) = st.files.get_mut(&ino) {
            f.writers = f.writers.saturating_sub(1);
        }
        st.prune(ino);
    }

    /// A rollback swapped the tree: every queued store is stale. Waits for
    /// the ones being sent, so that the kernel's pages the rollback drops
    /// next include whatever they stored. Never with the mount suspended
    /// (a store may wait for a read in flight).
    pub fn rolled_back(&self) {
        let mut st = lock(&self.state);
        st.epoch += 1;
        while st.sending > 0 {
            st = self.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Under the lock: may `j` be sent now? If so, it is marked sending.
    fn claim(&self, j: &Job) -> bool {
        let mut st = lock(&self.state);
        st.queued.remove(&(j.ticket.ino, j.part.offset));
        st.queued_bytes -= j.part.data.len();
        let epoch = st.epoch;
        let ok = match st.files.get_mut(&j.ticket.ino) {
            Some(f)
                if f.writers == 0 && f.changes == j.ticket.changes && epoch == j.ticket.epoch =>
            {
                f.sending += 1;
                true
            }
            _ => false,
        };
        if ok {
            st.sending += 1;
        } else {
            st.release(j.ticket.ino);
        }
        ok
    }

    /// `j`, claimed, was sent (or failed).
    fn sent(&self, j: &Job) {
        let mut st = lock(&self.state);
        st.sending -= 1;
        if let Some(f) = st.files.get_mut(&j.ticket.ino) {
            f.sending -= 1;
        }
        st.release(j.ticket.ino);
        drop(st);
        self.idle.notify_all();
    }
}

/// The store thread: sends each queued record's rest, then lets the ARC's
/// copy go. Ends with the mount.
fn sender(stores: std::sync::Weak<Stores>, rx: Receiver<Job>, notifier: Notifier) {
    while let Ok(j) = rx.recv() {
        let Some(stores) = stores.upgrade() else {
            return;
        };
        if !stores.claim(&j) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Tests widen the window between the check and the copy
        // (tests/page_store.rs), where a writer's open must wait.
        if let Some(d) = delay() {
            std::thread::sleep(d);
        }
        let ok = send(&notifier, &j);
        stores.sent(&j);
        if ok {
            STORED.fetch_add(1, Ordering::Relaxed);
            j.zpl.kernel_holds(&j.part);
        }
    }
}

/// `UZFS_FUSE_STORE_DELAY_MS`: fault injection for tests, a pause
/// before each store is sent.
fn delay() -> Option<Duration> {
    static D: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("UZFS_FUSE_STORE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
    })
}

const PAGE: u64 = 4096;

/// The pieces of record `p` outside what the reader was `sent` (widened
/// to whole pages), as (file offset, bytes).
fn pieces(p: &RecordPart, sent: (u64, u64)) -> [(u64, &[u8]); 2] {
    let (from, to) = (p.offset, p.offset + p.len as u64);
    let sent_from = (sent.0 / PAGE * PAGE).clamp(from, to);
    let sent_to = sent
        .1
        .div_ceil(PAGE)
        .saturating_mul(PAGE)
        .clamp(sent_from, to);
    let bytes = |a: u64, b: u64| {
        p.data
            .get((a - from) as usize..(b - from) as usize)
            .unwrap_or(&[])
    };
    [
        (from, bytes(from, sent_from)),
        (sent_to, bytes(sent_to, to)),
    ]
}

fn send(notifier: &Notifier, j: &Job) -> bool {
    pieces(&j.part, j.sent)
        .iter()
        .filter(|(_, b)| !b.is_empty())
        .all(|&(at, b)| notifier.store(j.ticket.ino, at, b).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_skip_the_pages_sent_and_stop_at_the_record() {
        let data = Arc::new(
            (0..131072u32)
                .map(|i| (i / 4096) as u8)
                .collect::<Vec<u8>>(),
        );
        let rec = 131072u64;
        let part = |len: usize| RecordPart {
            offset: rec,
            len,
            bp: None,
            data: data.clone(),
        };
        let p = part(131072);
        let [a, b] = pieces(&p, (rec + 8192, rec + 12288));
        assert_eq!((a.0, a.1.len()), (rec, 8192));
        assert_eq!((b.0, b.1.len()), (rec + 12288, 131072 - 12288));
        assert_eq!(b.1.first(), Some(&3));
        // A read not on page boundaries: the pages it touched are skipped.
        let [a, b] = pieces(&p, (rec + 100, rec + 5000));
        assert_eq!(a.1.len(), 0);
        assert_eq!((b.0, b.1.len()), (rec + 8192, 131072 - 8192));
        // A read of the record's start, and one running past its end.
        let [a, b] = pieces(&p, (rec - 4096, rec + 4096));
        assert_eq!((a.1.len(), b.0, b.1.len()), (0, rec + 4096, 131072 - 4096));
        let [a, b] = pieces(&p, (rec + 65536, rec + 200000));
        assert_eq!((a.0, a.1.len(), b.1.len()), (rec, 65536, 0));
        // The last record of a file, cut at its size.
        let p = part(10000);
        let [a, b] = pieces(&p, (rec, rec + 4096));
        assert_eq!(a.1.len(), 0);
        assert_eq!((b.0, b.1.len()), (rec + 4096, 10000 - 4096));
    }
}
