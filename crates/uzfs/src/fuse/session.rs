//! A mounted FUSE session and the two ways requests reach it.
//!
//! # Why uzfs has its own transport
//!
//! A small-file create costs the application six synchronous round trips
//! through the kernel (GETATTR of the parent, LOOKUP, CREATE, GETXATTR,
//! and WRITE and SETATTR at close). With requests read from /dev/fuse,
//! each round trip wakes a server thread on whichever CPU it last ran, and
//! the reply wakes the application back: on a VM every cross-CPU wake-up
//! is an inter-processor interrupt, and the round trips, not the
//! filesystem, set the pace (measured: 20,000 creates take 2.1 s on an
//! in-memory filesystem, 0.9 s with everything pinned to one CPU).
//!
//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, module
//! parameter `fuse.enable_uring=1`) gives the kernel one queue per CPU: a
//! request is queued on the queue of the CPU that made it and handed, as an
//! io_uring completion, to a server thread pinned to that CPU, which answers
//! by committing the reply and fetching the next request in one SQE
//! (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`). The round trip stays on one CPU.
//!
//! fuser (the FUSE crate) mounts and performs the INIT handshake; uzfs then
//! serves the connection itself with [`abi`]'s decoder:
//!
//! * **io_uring** when the kernel offers `FUSE_OVER_IO_URING` and
//!   `UZFS_FUSE_URING` is not `0`: for each online CPU's queue
//!   `UZFS_FUSE_THREADS` (default 4, fewer past 16 CPUs) threads pinned to
//!   that CPU (one for an offline CPU's), each with its own ring and one
//!   ring entry (a 4 KiB header buffer and a 1 MiB payload buffer, touched
//!   only as far as requests fill it). One entry per thread means a thread
//!   busy with a slow request (an fsync committing a txg) holds no idle
//!   entries the kernel could hand more requests to, so the queue's other
//!   threads take them. FORGET and INTERRUPT still arrive on
//!   /dev/fuse; one classic thread reads them.
//! * **/dev/fuse** otherwise (or if registering the ring fails, in which
//!   case the kernel itself falls back): `threads` threads, each reading
//!   its own cloned descriptor.
//!
//! Either way a request becomes `(InHeader, op header, payload)` and one
//! [`Handler::handle`] call fills the reply.

use super::abi::{self, InHeader, Op, Out};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A filesystem served over FUSE.
pub trait Handler: Send + Sync + 'static {
    /// Answer `op`: write the reply payload into `out` and return `Ok`, or
    /// return the errno. Never called for one-way requests.
    fn handle(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> Result<(), i32>;

    /// The INIT handshake is done, before the first request: `posix_acl`
    /// says whether the kernel checks POSIX ACLs (FUSE_POSIX_ACL) and
    /// leaves the umask to the filesystem (FUSE_DONT_MASK); `notifier`
    /// reaches the kernel's caches of this mount.
    fn negotiated(&self, _posix_acl: bool, _notifier: Notifier) {}

    /// The kernel's answer to [`Notifier::retrieve`] number `unique`: the
    /// bytes of `nodeid` from `offset` it holds.
    fn retrieved(&self, _unique: u64, _nodeid: u64, _offset: u64, _data: &[u8]) {}

    /// The session ends (the mount went away).
    fn destroy(&self) {}
}

/// Tells the kernel about changes it did not ask for, on the mount's
/// /dev/fuse descriptor (notifications go there under io_uring too).
#[derive(Clone)]
pub struct Notifier(Arc<File>);

impl Notifier {
    /// Drop the cached attributes of inode `ino`, so that the next
    /// permission check or exec asks the daemon again. Call it before
    /// answering the request that changed them: the kernel holds the
    /// caller until the answer, so nothing it caches meanwhile survives.
    /// An error means the inode is not cached (ENOENT) or the mount is
    /// gone: nothing stale is left either way.
    pub fn inval_attr(&self, ino: u64) {
        let _ = (&mut &*self.0).write_all(&abi::notify_inval_attr(ino));
    }

    /// Drop the cached attributes and pages of inode `ino` (dirty pages
    /// are written back first, through a WRITE request: never call this
    /// from a request thread or while requests are held).
    pub fn inval_inode(&self, ino: u64) {
        let _ = (&mut &*self.0).write_all(&abi::notify_inval_inode(ino));
    }

    /// Expire the kernel's cached lookup of `name` in directory `parent`.
    pub fn inval_entry(&self, parent: u64, name: &[u8]) {
        let _ = (&mut &*self.0).write_all(&abi::notify_inval_entry(parent, name));
    }

    /// Put `data` into inode `ino`'s page cache at `offset`, over any
    /// page it holds there (`fuse/store.rs` says when that is safe). The
    /// kernel takes each page's lock in turn, so this waits for reads in
    /// flight on those pages: never call it from a request thread.
    pub fn store(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let size =
            u32::try_from(data.len()).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let head = abi::notify_store_head(ino, offset, size);
        // One message, one write(2): the device takes it whole or not at all.
        let n = (&*self.0).write_vectored(&[io::IoSlice::new(&head), io::IoSlice::new(data)])?;
        if n != head.len() + data.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    /// Ask the kernel for the bytes of inode `ino` it holds in its page
    /// cache from `offset` (at most `len`, up to the first page it does
    /// not hold). Returns at once: the answer is a NOTIFY_REPLY request,
    /// handed to [`Handler::retrieved`] by whichever request thread takes
    /// it. Returns the `unique` the answer will carry (0: not sent).
    pub fn retrieve(&self, ino: u64, offset: u64, len: usize) -> u64 {
        let unique = next_retrieve_unique();
        let msg = abi::notify_retrieve(unique, ino, offset, len.min(u32::MAX as usize) as u32);
        match (&mut &*self.0).write_all(&msg) {
            Ok(()) => unique,
            Err(_) => 0,
        }
    }
}

static RETRIEVE_UNIQUE: AtomicU64 = AtomicU64::new(1);
/// Set in every `unique` a retrieval sends: the kernel numbers its own
/// requests from 1 up, so an answer can never be taken for one of them
/// (and, on /dev/fuse, is never replied to).
pub const RETRIEVE_BIT: u64 = 1 << 63;

/// The `unique` of the next retrieval: increasing, so a tree that must
/// ignore answers to retrievals sent before it was installed (a
/// rollback's) compares against this.
pub fn next_retrieve_unique() -> u64 {
    RETRIEVE_UNIQUE.fetch_add(1, Ordering::Relaxed) | RETRIEVE_BIT
}

/// A NOTIFY_REPLY request arrived (`body`: after the in-header): hand its
/// bytes to the filesystem.
fn deliver_retrieved(h: &InHeader, body: &[u8], fs: &dyn Handler) {
    OPCODES[abi::NOTIFY_REPLY as usize].fetch_add(1, Ordering::Relaxed);
    if h.unique & RETRIEVE_BIT == 0 {
        return;
    }
    if let Some((offset, data)) = abi::retrieved(body) {
        // A bug in the handler must not take the request thread down.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fs.retrieved(h.unique, h.nodeid, offset, data)
        }));
    }
}

/// Largest request payload: `max_write` (1 MiB) is negotiated in `negotiate`.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// The transport a session ended up with (for logs and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    DevFuse,
    IoUring,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::DevFuse => "/dev/fuse",
            Transport::IoUring => "FUSE over io_uring",
        })
    }
}

/// The kernel's switch for FUSE over io_uring (Linux 6.14+).
const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Say once, in the daemon's log, how to turn io_uring on where the kernel
/// has it but it is off.
fn hint_uring_off() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let off = std::fs::read_to_string(URING_PARAM).is_ok_and(|v| v.trim() == "N");
    if off && uring_wanted() {
        ONCE.call_once(|| {
            log::warn!(
                "FUSE over io_uring is off in this kernel (echo Y > {URING_PARAM}, \
                 as root, makes small-file work 2-3x faster); mounts use /dev/fuse"
            )
        });
    }
}

/// Answer one request held in `(h, ophdr, payload)`; the reply payload goes
/// to `out_buf`. Returns (errno or 0, payload length).
fn serve(
    h: &InHeader,
    ophdr: &[u8],
    payload: &[u8],
    fs: &dyn Handler,
    out_buf: &mut [u8],
) -> (i32, usize) {
    if let Some(c) = OPCODES.get(h.opcode as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if let Some((op, pause)) = delayed_op() {
        if op == h.opcode {
            std::thread::sleep(pause);
        }
    }
    let Some(op) = abi::parse(h.opcode, ophdr, payload) else {
        return (libc::EINVAL, 0);
    };
    let mut out = Out::new(out_buf);
    // A bug that panics in a handler must not leave the request unanswered
    // (the application would hang in the kernel): it gets EIO.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.handle(h, op, &mut out)));
    let res = match r {
        Ok(Ok(())) => (0, out.len()),
        Ok(Err(e)) => (e, 0),
        Err(_) => (libc::EIO, 0),
    };
    trace(h, ophdr, payload, res.0);
    res
}

/// `UZFS_FUSE_TRACE=FILE`: one line per request answered (opcode, node,
/// the payload's printable start, errno), for chasing what a client did
/// just before a crash. Slow; a debugging aid, off by default.
fn trace(h: &InHeader, ophdr: &[u8], payload: &[u8], errno: i32) {
    static FILE: std::sync::OnceLock<Option<std::sync::Mutex<std::fs::File>>> =
        std::sync::OnceLock::new();
    let Some(f) = FILE.get_or_init(|| {
        let p = std::env::var_os("UZFS_FUSE_TRACE")?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()?;
        Some(std::sync::Mutex::new(f))
    }) else {
        return;
    };
    let text: String = payload
        .iter()
        .take(48)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
        .collect();
    let head: String = ophdr
        .chunks(8)
        .take(3)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            format!("{:x} ", u64::from_le_bytes(w))
        })
        .collect();
    let line = format!(
        "{} {} node {} {}[{}] -> {}\n",
        h.unique,
        abi::name(h.opcode),
        h.nodeid,
        head,
        text,
        errno
    );
    use std::io::Write;
    let _ = f
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .write_all(line.as_bytes());
}

/// Requests served by opcode, every session of this process
/// (`UZFS_FUSE_STATS=1` logs them when a session ends): how many round
/// trips a workload costs is the first question when tuning a FUSE
/// filesystem.
static OPCODES: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// "opcode=count" for every opcode seen.
pub fn opcode_counts() -> String {
    OPCODES
        .iter()
        .enumerate()
        .filter_map(|(op, c)| {
            let n = c.load(Ordering::Relaxed);
            (n > 0).then(|| format!("{}={n} ", abi::name(op as u32)))
        })
        .collect()
}

/// `UZFS_FUSE_DELAY_OP=OPCODE=MS` (`mkdir=3000`): fault injection for
/// tests, a pause before each request of that opcode is handled (a
/// daemon killed while it serves a request it sent itself: `wedge.rs`).
fn delayed_op() -> Option<(u32, std::time::Duration)> {
    static D: std::sync::OnceLock<Option<(u32, std::time::Duration)>> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        let v = std::env::var("UZFS_FUSE_DELAY_OP").ok()?;
        let (name, ms) = v.split_once('=')?;
        let op = (0..64).find(|&op| abi::name(op) == name)?;
        Some((op, std::time::Duration::from_millis(ms.parse().ok()?)))
    })
}

/// Mount FUSE's control filesystem where it belongs, if it is not (a
/// system without systemd, a container): it is how a connection is aborted.
fn mount_fusectl() {
    let (src, dir, fs) = (c"fusectl", c"/sys/fs/fuse/connections", c"fusectl");
    // SAFETY: mount(2) with NUL-terminated constant strings and no data.
    let r = unsafe { libc::mount(src.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        log::warn!(
            "cannot mount fusectl on /sys/fs/fuse/connections: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Abort FUSE connection `c` (its minor): every request in flight ends
/// with ECONNABORTED, the mount answers ENOTCONN from then on, and the
/// server's /dev/fuse reads end.
pub fn abort_connection(c: u32) -> std::io::Result<()> {
    let p = format!("/sys/fs/fuse/connections/{c}/abort");
    if !std::path::Path::new(&p).exists() {
        mount_fusectl();
    }
    std::fs::write(&p, "1").map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot abort FUSE connection {c} ({p}: {e})"),
        )
    })
}

/// The running session of one mount. Dropping the fuser session unmounts
/// (if nobody did); [`Session::join`] waits for the request threads, which
/// end when the kernel tears the connection down at unmount.
pub struct Session {
    mount: Option<fuser::Session<Negotiator>>,
    threads: Vec<JoinHandle<()>>,
    fs: Arc<dyn Handler>,
    pub transport: Transport,
    /// The connection's name under `/sys/fs/fuse/connections` (the
    /// mount's device minor, found in mountinfo once mounted: what an
    /// abort writes to) and the mountpoint as mountinfo lists it.
    pub conn: Option<(u32, std::path::PathBuf)>,
}

impl Session {
    /// After the unmount: the connection normally ends at once. A copy of
    /// the mount in another mount namespace (a container, `unshare -m`,
    /// made while it was mounted) keeps it alive, and the request threads
    /// with it; after `grace`, abort the connection (FUSE's control
    /// filesystem) so the unmount ends. The copy then answers ENOTCONN, as
    /// after a daemon crash.
    pub fn join_or_abort(self, grace: std::time::Duration) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < grace && !self.threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if !self.threads.iter().all(|t| t.is_finished()) {
            match self.conn {
                Some((c, _)) => {
                    log::warn!(
                        "a FUSE mount still held after unmount (a copy in another mount namespace?): aborting connection {c}"
                    );
                    if let Err(e) = abort_connection(c) {
                        log::warn!("{e}; waiting for it");
                    }
                }
                None => log::warn!(
                    "a FUSE mount still held after unmount (a copy in another mount namespace?); waiting for it"
                ),
            }
        }
        self.join();
    }

    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.fs.destroy();
        if std::env::var_os("UZFS_FUSE_STATS").is_some() {
            log::info!(
                "fuse requests over {:?}: {}",
                self.transport,
                opcode_counts()
            );
        }
        self.mount.take();
    }
}

/// The fuser filesystem used only for the INIT handshake: it asks for the
/// kernel features uzfs wants (`negotiate`) and for FUSE over io_uring.
pub struct Negotiator {
    pub negotiate: fn(&mut fuser::KernelConfig),
    pub want_uring: bool,
    /// Set when INIT granted FUSE over io_uring.
    pub got_uring: Arc<AtomicBool>,
    pub want_acl: bool,
    /// Set when INIT granted POSIX ACLs (with DONT_MASK).
    pub got_acl: Arc<AtomicBool>,
}

impl fuser::Filesystem for Negotiator {
    fn init(&mut self, _req: &fuser::Request, config: &mut fuser::KernelConfig) -> io::Result<()> {
        (self.negotiate)(config);
        // Both or neither: ACLs without DONT_MASK would have the kernel
        // apply the umask where a default ACL says not to.
        if self.want_acl
            && config
                .add_capabilities(
                    fuser::InitFlags::FUSE_POSIX_ACL | fuser::InitFlags::FUSE_DONT_MASK,
                )
                .is_ok()
        {
            self.got_acl.store(true, Ordering::Relaxed);
        }
        if self.want_uring
            && config
                .add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING)
                .is_ok()
        {
            self.got_uring.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// `UZFS_FUSE_URING`: `0` keeps /dev/fuse even where io_uring is offered.
pub fn uring_wanted() -> bool {
    std::env::var("UZFS_FUSE_URING").map_or(true, |v| v != "0")
}

/// Mount `fs` at `mountpoint` and start serving it.
pub fn mount(
    fs: Arc<dyn Handler>,
    mountpoint: &std::path::Path,
    config: &fuser::Config,
    negotiate: fn(&mut fuser::KernelConfig),
    threads: usize,
    posix_acl: bool,
) -> io::Result<Session> {
    let got_uring = Arc::new(AtomicBool::new(false));
    let got_acl = Arc::new(AtomicBool::new(false));
    let neg = Negotiator {
        negotiate,
        want_uring: uring_wanted(),
        got_uring: got_uring.clone(),
        want_acl: posix_acl,
        got_acl: got_acl.clone(),
    };
    let fsess = fuser::Session::new(neg, mountpoint, config)?;
    let dev = Arc::new(File::from(fsess.as_fd().try_clone_to_owned()?));
    fs.negotiated(got_acl.load(Ordering::Relaxed), Notifier(dev.clone()));
    if posix_acl && !got_acl.load(Ordering::Relaxed) {
        log::warn!(
            "{}: the kernel does not offer POSIX ACLs over FUSE; ACLs are refused on this mount",
            mountpoint.display()
        );
    }
    let mut session = Session {
        mount: Some(fsess),
        threads: Vec::new(),
        fs: fs.clone(),
        transport: Transport::DevFuse,
        conn: None,
    };
    let mut classic = threads.max(1);
    if !got_uring.load(Ordering::Relaxed) {
        hint_uring_off();
    } else {
        // Threads that registered before a failure stay in the session:
        // they end at unmount like the rest.
        let (ts, r) = uring::start(&dev, &fs, threads);
        session.threads.extend(ts);
        match r {
            Ok(()) => {
                session.transport = Transport::IoUring;
                classic = 1;
            }
            // A failed REGISTER makes the kernel route requests to
            // /dev/fuse again.
            Err(e) => log::warn!("FUSE over io_uring unavailable ({e}); using /dev/fuse"),
        }
    }
    for i in 0..classic {
        let dev = match i {
            0 => dev.clone(),
            _ => clone_dev(&dev).map_or_else(|_| dev.clone(), Arc::new),
        };
        let fs = fs.clone();
        session.threads.push(
            std::thread::Builder::new()
                .name("uzfs-fuse".into())
                .spawn(move || classic_loop(&dev, &*fs))?,
        );
    }
    Ok(session)
}

/// A second /dev/fuse descriptor attached to the same connection
/// (`FUSE_DEV_IOC_CLONE`): each reader gets its own list of requests in
/// flight instead of contending on one.
fn clone_dev(src: &File) -> io::Result<File> {
    const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let id = src.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 through a valid pointer to `id`,
    // which lives across the call; `f` is an open descriptor.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &id as *const u32) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Serve requests read from /dev/fuse until the connection goes away.
fn classic_loop(dev: &File, fs: &dyn Handler) {
    let mut inbuf = vec![0u8; MAX_PAYLOAD + 64 * 1024];
    let mut outbuf = vec![0u8; abi::OUT_HEADER_LEN + MAX_PAYLOAD];
    loop {
        let n = match (&mut &*dev).read(&mut inbuf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before it was read.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                _ => return, // ENODEV: unmounted
            },
        };
        let req = &inbuf[..n];
        let Some(h) = InHeader::parse(req) else {
            continue;
        };
        if abi::is_one_way(h.opcode) {
            continue;
        }
        let body = &req[abi::IN_HEADER_LEN..];
        if h.opcode == abi::NOTIFY_REPLY {
            // The kernel ended this request when it was read: no reply.
            deliver_retrieved(&h, body, fs);
            continue;
        }
        let (ophdr, payload) = body.split_at(abi::op_header_len(h.opcode).min(body.len()));
        let (err, len) = serve(&h, ophdr, payload, fs, &mut outbuf[abi::OUT_HEADER_LEN..]);
        let total = abi::OUT_HEADER_LEN + len;
        abi::out_header(&mut outbuf, total as u32, -err, h.unique);
        // An error here is ENOENT: the request was interrupted meanwhile.
        let _ = (&mut &*dev).write_all(&outbuf[..total]);
    }
}

/// A kernel CPU list ("0-3,8,10-11") as the set of CPUs it names.
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        if b < a || b > 1 << 16 {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

fn sys_cpus(which: &str) -> Option<Vec<usize>> {
    cpu_list(&std::fs::read_to_string(format!("/sys/devices/system/cpu/{which}")).ok()?)
        .filter(|c| !c.is_empty())
}

/// (number of possible CPUs, online CPUs): the kernel makes one FUSE ring
/// queue per possible CPU and routes requests to the ring only once every
/// queue has an entry; only online CPUs make requests.
pub fn cpus() -> (usize, Vec<usize>) {
    let fallback = std::thread::available_parallelism().map_or(1, |n| n.get());
    let possible = sys_cpus("possible").map_or(fallback, |c| c.iter().max().map_or(1, |m| m + 1));
    let online = sys_cpus("online").unwrap_or_else(|| (0..possible).collect());
    (possible, online)
}

mod uring {
    //! FUSE over io_uring: one ring per server thread, one ring entry per
    //! ring (see the module doc above for why).
    use super::*;
    use io_uring::{cqueue, opcode, squeue, types, IoUring};

    const CMD_REGISTER: u32 = 1;
    const CMD_COMMIT_AND_FETCH: u32 = 2;
    /// `struct fuse_uring_req_header`: in_out[128] (the in header of a
    /// request, the out header of its reply), op_in[128] (the op header),
    /// then `struct fuse_uring_ent_in_out` {flags u64, commit_id u64,
    /// payload_sz u32, padding u32, reserved u64}.
    const OP_IN: usize = 128;
    const COMMIT_ID: usize = 256 + 8;
    const PAYLOAD_SZ: usize = 256 + 16;
    const HEADER_BUF: usize = 4096;
    /// Requests whose payload is at most this are copied out of the entry
    /// so the reply (maybe 1 MiB of READ data) is built in place; larger
    /// ones (WRITE data) have replies of a few bytes, built aside.
    const SMALL: usize = 64 * 1024;

    type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

    /// One ring entry's buffers. The kernel keeps their addresses from
    /// REGISTER on, so they are boxes that never move or shrink, owned by
    /// the serving thread for longer than its ring exists.
    struct Entry {
        header: Box<[u8]>,
        payload: Box<[u8]>,
        iov: Box<[libc::iovec; 2]>,
    }

    impl Entry {
        fn new() -> Entry {
            let mut header = vec![0u8; HEADER_BUF].into_boxed_slice();
            let mut payload = vec![0u8; MAX_PAYLOAD].into_boxed_slice();
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: header.len(),
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                },
            ]);
            Entry {
                header,
                payload,
                iov,
            }
        }
    }

    /// The 80-byte command area holds `struct fuse_uring_cmd_req`
    /// {flags u64, commit_id u64, qid u16, padding}.
    fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
        let mut c = [0u8; 80];
        c[8..16].copy_from_slice(&commit_id.to_le_bytes());
        c[16..18].copy_from_slice(&qid.to_le_bytes());
        c
    }

    /// The SQE of `cmd`: REGISTER hands the kernel the entry's buffers,
    /// COMMIT_AND_FETCH the reply to request `commit_id`.
    fn sqe(fd: RawFd, qid: u16, cmd: u32, commit_id: u64, ent: &Entry) -> squeue::Entry128 {
        let mut b = opcode::UringCmd80::new(types::Fd(fd), cmd).cmd(cmd_req(qid, commit_id));
        if cmd == CMD_REGISTER {
            b = b.addr(Some(ent.iov.as_ptr() as u64));
        }
        let sqe = b.build();
        if cmd != CMD_REGISTER {
            return sqe;
        }
        // REGISTER wants sqe->len = 2 (two iovecs), which UringCmd80 has
        // no setter for.
        // SAFETY: Entry128 is #[repr(C)]: a 64-byte io_uring_sqe followed
        // by 64 bytes, all plain integers, so any 128 bytes are a valid
        // value; `len` is the u32 at byte 24 of io_uring_sqe.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_le_bytes());
        // SAFETY: as above.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }

    fn push(ring: &mut Ring, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the buffers the command names (the entry's header,
        // payload and iovecs) outlive the ring: both belong to the serving
        // thread, which drops the ring first.
        unsafe {
            ring.submission()
                .push(sqe)
                .map_err(|_| io::Error::other("io_uring submission queue full"))
        }
    }

    fn pin_to(cpu: usize) {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        // SAFETY: cpu_set_t is plain data and all zeroes is the empty set;
        // CPU_SET writes one bit inside it (cpu < CPU_SETSIZE); `set` is a
        // valid cpu_set_t of the size given and pid 0 is the calling
        // thread. A failure leaves the thread unpinned.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }

    /// (threads that have reported, the first error), and its condvar.
    type Ready = (Mutex<(usize, Option<io::Error>)>, std::sync::Condvar);

    fn report(ready: &Ready, r: io::Result<()>) {
        let (lock, cv) = ready;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        if let Err(e) = r {
            g.1.get_or_insert(e);
        }
        cv.notify_all();
    }

    /// Start the ring threads; returns once every one has registered its
    /// entry, or with the first error.
    pub fn start(
        dev: &Arc<File>,
        fs: &Arc<dyn Handler>,
        threads: usize,
    ) -> (Vec<JoinHandle<()>>, io::Result<()>) {
        let (queues, online) = cpus();
        // Threads per queue: a WRITE that must read its record's old
        // contents from disk blocks its thread, and every request of that
        // CPU then goes to the queue's other threads. Measured on 2 CPUs
        // (16 KiB random writes into 128 KiB records): 2 per queue 94-112
        // MiB/s, 4 per queue 194-222 (/dev/fuse with 4 threads: 145-210).
        // Fewer on big machines so a mount stays near 32-64 threads.
        let per_queue = threads.clamp(1, 16).min((64 / online.len().max(1)).max(2));
        let ready: Arc<Ready> = Arc::default();
        let mut handles = Vec::new();
        let mut spawn_err = None;
        'queues: for qid in 0..queues {
            // An offline CPU makes no requests, but its queue needs an
            // entry before the kernel uses the ring at all.
            let n = if online.contains(&qid) { per_queue } else { 1 };
            for _ in 0..n {
                let (dev, fs, ready) = (dev.clone(), fs.clone(), ready.clone());
                let t = std::thread::Builder::new()
                    .name(format!("uzfs-ring-{qid}"))
                    .spawn(move || serve_queue(qid, &dev, &*fs, &ready));
                match t {
                    Ok(t) => handles.push(t),
                    Err(e) => {
                        spawn_err = Some(e);
                        break 'queues;
                    }
                }
            }
        }
        let (lock, cv) = &*ready;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        // Every thread reports once, right after it has submitted its
        // REGISTER (or failed before): wait for all, so none registers
        // after a give_up below.
        while g.0 < handles.len() {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        let r = spawn_err.or(g.1.take()).map_or(Ok(()), Err);
        drop(g);
        if r.is_err() {
            give_up(dev);
        }
        (handles, r)
    }

    /// Make the kernel stop waiting for the ring. Once INIT has granted
    /// FUSE_OVER_IO_URING, requests wait until every queue has an entry;
    /// if some queue never gets one (a thread could not start or set up
    /// its ring), they would wait forever. A REGISTER the kernel refuses
    /// (a queue number past the last) clears the connection's io_uring
    /// flag and wakes them, and they go to /dev/fuse.
    fn give_up(dev: &File) {
        let ent = Entry::new();
        let Ok(mut ring) = Ring::builder().build(2) else {
            return;
        };
        let sqe = sqe(dev.as_raw_fd(), u16::MAX, CMD_REGISTER, 0, &ent);
        if push(&mut ring, &sqe).is_ok() {
            let _ = ring.submit_and_wait(1);
        }
        // The refusal has completed (or the ring is gone); `ent` may go.
        drop(ring);
    }

    fn serve_queue(qid: usize, dev: &File, fs: &dyn Handler, ready: &Ready) {
        // Pinned: the point of a per-CPU queue is that the request, its
        // handling and the reply stay on one CPU (unpinned, the floor's
        // 20k creates took 8 s instead of 3.2 s). COOP_TASKRUN and
        // DEFER_TASKRUN were measured too and were slower.
        pin_to(qid);
        // Fault injection for the tests: this queue's thread fails to start.
        if std::env::var("UZFS_FUSE_URING_FAIL_QUEUE").is_ok_and(|v| v == qid.to_string()) {
            return report(
                ready,
                Err(io::Error::other(format!("queue {qid}: injected failure"))),
            );
        }
        let mut ent = Entry::new();
        let mut ring: Ring = match IoUring::builder().build(4) {
            Ok(r) => r,
            Err(e) => return report(ready, Err(e)),
        };
        let (fd, q) = (dev.as_raw_fd(), qid as u16);
        let mut last = (CMD_REGISTER, 0u64);
        let r = push(&mut ring, &sqe(fd, q, CMD_REGISTER, 0, &ent)).and_then(|_| ring.submit());
        if let Err(e) = r {
            return report(ready, Err(e));
        }
        // REGISTER completes when the entry gets its first request; a
        // refusal completes at once, during the submit above.
        let mut first = ring.completion().next();
        if let Some(c) = &first {
            if c.result() < 0 {
                return report(ready, Err(io::Error::from_raw_os_error(-c.result())));
            }
        }
        report(ready, Ok(()));
        let mut small_in = vec![0u8; SMALL];
        let mut small_out = vec![0u8; SMALL];
        loop {
            let cqe = match first.take() {
                Some(c) => c,
                None => {
                    match ring.submit_and_wait(1) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        Err(_) => break,
                    }
                    match ring.completion().next() {
                        Some(c) => c,
                        None => continue,
                    }
                }
            };
            let res = cqe.result();
            if res == -libc::EINTR || res == -libc::EAGAIN {
                if push(&mut ring, &sqe(fd, q, last.0, last.1, &ent)).is_err() {
                    break;
                }
                continue;
            }
            if res < 0 {
                break; // ENOTCONN: unmounted
            }
            let hdr = abi::Rd(&ent.header);
            let commit_id = hdr.u64(COMMIT_ID).unwrap_or(0);
            let plen = (hdr.u32(PAYLOAD_SZ).unwrap_or(0) as usize).min(ent.payload.len());
            let Some(h) = InHeader::parse(&ent.header[..abi::IN_HEADER_LEN]) else {
                break;
            };
            let oplen = abi::op_header_len(h.opcode);
            let mut ophdr = [0u8; 128];
            ophdr[..oplen].copy_from_slice(&ent.header[OP_IN..OP_IN + oplen]);
            let (err, len) = if h.opcode == abi::NOTIFY_REPLY {
                // Over io_uring the entry is committed (with no payload)
                // to be used again.
                deliver_retrieved(&h, &ent.payload[..plen], fs);
                (0, 0)
            } else if plen <= SMALL {
                small_in[..plen].copy_from_slice(&ent.payload[..plen]);
                serve(&h, &ophdr[..oplen], &small_in[..plen], fs, &mut ent.payload)
            } else {
                let (err, len) = serve(
                    &h,
                    &ophdr[..oplen],
                    &ent.payload[..plen],
                    fs,
                    &mut small_out,
                );
                ent.payload[..len].copy_from_slice(&small_out[..len]);
                (err, len)
            };
            let total = (abi::OUT_HEADER_LEN + len) as u32;
            abi::out_header(&mut ent.header, total, -err, h.unique);
            ent.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(len as u32).to_le_bytes());
            last = (CMD_COMMIT_AND_FETCH, commit_id);
            if push(&mut ring, &sqe(fd, q, last.0, last.1, &ent)).is_err() {
                break;
            }
        }
        drop(ring);
        drop(ent);
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_list;

    #[test]
    fn cpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(cpu_list(""), Some(vec![]));
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("x"), None);
        assert_eq!(cpu_list("0-99999999"), None);
    }
}
