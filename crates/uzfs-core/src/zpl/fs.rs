//! File system operations over one dataset's object set, in the terms the
//! kernel's VFS (through FUSE) asks for them: every function returns an
//! errno on failure. See the module docs of [`crate::zpl`] for the layout
//! and the locking rules.

use super::acl;
use super::znode::Znode;
use crate::dmu::changelog::OpScope;
use crate::dmu::dnode::{ot, DnodePhys, ObjProps};
use crate::dmu::objset::{Objset, RecordPart};
use crate::dmu::tx;
use crate::dmu::zap::{self, Zap};
use crate::error::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub type Errno = i32;
pub type ZResult<T> = std::result::Result<T, Errno>;

const MASTER_MAGIC: u64 = 0x4c50_5a55_7a66_7321; // "!sfzUZPL"
const MASTER_OBJ: u64 = 1;
const STRIPES: usize = 64;
/// Largest extended attribute value (as Linux's XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
const XATTR_TOTAL_MAX: usize = 1 << 20;
/// Largest file: what eight levels of 128 KiB indirect blocks address at
/// the smallest block size stays beyond 2^63, so the limit is the offset type.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// What a filesystem needs from the dataset and pool it lives in.
pub trait DatasetCtx: Send + Sync {
    /// Admit `bytes` of new dirty data (throttle, pool space, quota).
    fn admit(&self, bytes: u64) -> ZResult<()>;
    /// Make everything this filesystem has written durable before returning.
    /// This is where the intent log plugs in: today it commits the open txg.
    fn commit(&self, obj: u64) -> ZResult<()>;
    fn props(&self) -> ZplProps;
    /// (total bytes, available bytes) as `statfs` should report them.
    fn space(&self) -> (u64, u64);
    /// The open txg (stamped into new znodes as their generation).
    fn txg(&self) -> u64;
    /// Whether the pool still takes changes: a suspended pool (a failed
    /// sync, an operation that broke off half done) refuses them with EIO,
    /// or holds them until it resumes (`failmode=wait`).
    fn live(&self) -> bool {
        true
    }
    /// Blocks born at or before this txg may be read through another
    /// dataset (a snapshot of this one, or this clone's origin): the
    /// dataset's latest snapshot's txg (OpenZFS's `ds_prev_snap_txg`).
    /// Reads hand only younger blocks to the kernel's page cache
    /// ([`Zpl::read_for_kernel`]). The default shares everything.
    fn shared_below(&self) -> u64 {
        u64::MAX
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ZplProps {
    pub recordsize: u32,
    pub obj: ObjProps,
    pub atime: bool,
    pub readonly: bool,
    pub sync: SyncMode,
    /// `logbias=throughput`: the intent log logs whole blocks by pointer.
    pub throughput: bool,
    /// `snapdir=visible`: the root directory lists `.zfs`.
    pub snapdir_visible: bool,
}

/// The `sync` property: when a change is on stable storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// fsync, fdatasync, O_SYNC/O_DSYNC and syncfs wait for stable storage.
    #[default]
    Standard,
    /// Every change is on stable storage before it returns (the front end
    /// commits after each one and writes around the kernel's page cache).
    Always,
    /// fsync returns at once: the pool stays consistent, but the last
    /// seconds of acknowledged writes can be lost in a crash.
    Disabled,
}

impl SyncMode {
    pub fn parse(v: &str) -> SyncMode {
        match v {
            "always" => SyncMode::Always,
            "disabled" => SyncMode::Disabled,
            _ => SyncMode::Standard,
        }
    }
}

impl Default for ZplProps {
    fn default() -> Self {
        ZplProps {
            recordsize: 128 << 10,
            obj: ObjProps::default(),
            atime: true,
            readonly: false,
            sync: SyncMode::Standard,
            throughput: false,
            snapdir_visible: false,
        }
    }
}

/// One `readdir` entry: (cookie of the next entry, object, dirent type, name).
pub type DirEntry = (u64, u64, u8, Vec<u8>);

/// What `stat` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte units allocated (compressed, all copies).
    pub blocks: u64,
    pub blksize: u32,
    pub z: Znode,
}

/// A `setattr` request; `None` leaves the attribute alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
    /// Drop S_ISUID, and S_ISGID if group-executable (see `kill_suid`).
    pub kill_suid: bool,
}

/// The set-id bits a write or owner change by an unprivileged process
/// removes (S_ISGID without group-execute is mandatory locking; kept).
fn kill_suid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub fn errno(e: Error) -> Errno {
    match e {
        Error::NoSpace => libc::ENOSPC,
        Error::NotFound(_) => libc::ENOENT,
        Error::TooBig(_) => libc::EFBIG,
        Error::Busy(_) => libc::EBUSY,
        Error::Invalid(_) => libc::EINVAL,
        Error::Unsupported(_) => libc::EOPNOTSUPP,
        Error::ReadOnly(_) => libc::EROFS,
        // Suspended, internal, corrupt, checksum, device errors.
        Error::Suspended { .. }
        | Error::Internal(_)
        | Error::Io { .. }
        | Error::PowerLost
        | Error::Corrupt { .. }
        | Error::Checksum(_) => libc::EIO,
    }
}

fn io<T>(r: crate::Result<T>) -> ZResult<T> {
    r.map_err(errno)
}

/// An object's name in the unlinked set.
fn unlinked_key(obj: u64) -> Vec<u8> {
    format!("{obj:x}").into_bytes()
}

fn dtype(mode: u32) -> u8 {
    ((mode & libc::S_IFMT) >> 12) as u8
}

fn check_name(name: &[u8]) -> ZResult<()> {
    if name.len() > zap::MAX_NAME {
        return Err(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Sequential-read detection and prefetch (OpenZFS dmu_zfetch, reduced to
/// one stream per file): a read that starts where the previous one ended
/// grows a window of blocks read ahead into the ARC by background threads.
struct Prefetch {
    streams: Arc<Streams>,
    tx: Mutex<Option<std::sync::mpsc::Sender<FetchJob>>>,
}

/// (object, first block, end block, block size) to read ahead.
type FetchJob = (u64, u64, u64, u64);

/// obj -> (end of the last read, first block not yet prefetched, window)
type Streams = Mutex<HashMap<u64, (u64, u64, u64)>>;

/// Whether the reader of `obj`'s stream has read past block `blk` (of
/// `bs` bytes): reading it ahead now is a wasted device read, since the
/// records a reader takes whole into the kernel's page cache leave the
/// ARC (`Zpl::read_for_kernel`).
fn passed(streams: &Streams, obj: u64, blk: u64, bs: u64) -> bool {
    lock(streams)
        .get(&obj)
        .is_some_and(|&(end, _, _)| end != u64::MAX && end >= (blk + 1) * bs)
}

const PREFETCH_MAX: u64 = 16 << 20;

/// Threads reading ahead for a mounted dataset. Each reads its job's
/// records one after another, so they are the read-ahead's depth: with
/// two, a cold sequential read caught up with them and read records
/// itself. Four against two (bench/RESULTS.md): a raidz2 of six 1.50x the
/// speed at 0.57x the daemon CPU per GiB, a mirror 1.30x at 0.76x.
const PREFETCH_THREADS: usize = 4;

impl Prefetch {
    fn start(os: &Arc<Objset>) -> Prefetch {
        let (tx, rx) = std::sync::mpsc::channel::<FetchJob>();
        let rx = Arc::new(Mutex::new(rx));
        let streams: Arc<Streams> = Arc::default();
        for i in 0..PREFETCH_THREADS {
            let rx = rx.clone();
            let os = Arc::downgrade(os);
            let streams = streams.clone();
            let _ = std::thread::Builder::new()
                .name(format!("zfetch-{i}"))
                .spawn(move || loop {
                    let job = lock(&rx).recv();
                    let Ok((obj, from, to, bs)) = job else { return };
                    let Some(os) = os.upgrade() else { return };
                    crate::arc::prefetching(|| {
                        for blk in from..to {
                            if passed(&streams, obj, blk, bs) {
                                continue;
                            }
                            if os.read_block(obj, blk).is_err() {
                                break;
                            }
                        }
                    });
                });
        }
        Prefetch {
            streams,
            tx: Mutex::new(Some(tx)),
        }
    }

    /// A read of `[offset, end)` of `obj` (block size `bs`, file size
    /// `size`) happened: maybe read further ahead. Whether it continues
    /// a sequential stream.
    fn note(&self, obj: u64, offset: u64, end: u64, bs: u64, size: u64) -> bool {
        let job = {
            let mut st = lock(&self.streams);
            if st.len() > 4096 {
                st.clear();
            }
            let e = st.entry(obj).or_insert((u64::MAX, 0, 0));
            if e.0 != offset {
                // Not sequential: restart the stream here.
                *e = (end, 0, 0);
                return false;
            }
            let window = (e.2 * 2).clamp(1 << 20, PREFETCH_MAX);
            let from = e.1.max(end.div_ceil(bs));
            let to = (end + window).min(size).div_ceil(bs);
            *e = (end, to.max(e.1), window);
            (from < to).then_some((obj, from, to, bs))
        };
        if let Some(j) = job {
            if let Some(tx) = lock(&self.tx).as_ref() {
                let _ = tx.send(j);
            }
        }
        true
    }
}

pub struct Zpl {
    pub os: Arc<Objset>,
    prefetch: Prefetch,
    ctx: Arc<dyn DatasetCtx>,
    pub root: u64,
    unlinked: u64,
    ns: Mutex<()>,
    stripes: Vec<Mutex<()>>,
    /// Open handles per object (unlinked files live until the last close).
    opens: Mutex<HashMap<u64, u64>>,
    /// POSIX ACLs are stored and enforced on this mount (`acl.rs`); set
    /// once the kernel agreed to check them, off otherwise.
    posix_acl: AtomicBool,
    /// The page cache of the kernel above the mount, asked for the rest
    /// of a record a write patches (`pagecache.rs`); none outside a mount.
    page_cache: std::sync::OnceLock<Arc<dyn super::pagecache::PageCache>>,
    /// Records asked of the kernel: (object, block) -> (the request's
    /// number, the txg its partial block was made in). Only the answer
    /// to the latest request of a record fills it, in that txg.
    asked: Mutex<HashMap<(u64, u64), (u64, u64)>>,
}

/// A txg hold taken by [`Zpl::hold`], with the operation's intent-log
/// scope (its changes become one record, `dmu/changelog.rs`) and the
/// warm-up scope that pins what the operation read before it. Fields drop
/// in order: the record is handed over, then the hold is released.
#[must_use = "the txg is held only while this lives"]
struct Held<'a> {
    _scope: OpScope<'a>,
    _tx: tx::Tx<'a>,
    _warm: tx::Warm,
}

/// Lock guards of an operation (namespace, object stripes). Dropping them
/// first hands the operation's changes to the intent log, so two
/// operations on one object are logged in the order they made them.
struct Locked<'a, G> {
    os: &'a Objset,
    _g: G,
}

impl<G> Drop for Locked<'_, G> {
    fn drop(&mut self) {
        self.os.flush_op();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Zpl {
    /// Lay out an empty filesystem in `os` (a new dataset): master node,
    /// root directory owned by `uid:gid` with `mode`, unlinked set.
    pub fn format(os: &Objset, txg: u64, uid: u32, gid: u32, mode: u32) -> crate::Result<()> {
        let _tx = os.tx();
        let meta = ObjProps::METADATA;
        let master = os.create_object(ot::MASTER_NODE, 512, &meta)?;
        if master != MASTER_OBJ {
            return Err(Error::invalid("filesystem objset is not empty"));
        }
        let root = Zap::create(os, ot::DIRECTORY, &meta, zap::new_salt(2))?.obj;
        let t = now_ns();
        let z = Znode {
            mode: libc::S_IFDIR | (mode & 0o7777),
            uid,
            gid,
            nlink: 2,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            parent: root,
            gen: txg,
            ..Default::default()
        };
        os.set_bonus(root, &z.encode())?;
        let unlinked = Zap::create(os, ot::UNLINKED_SET, &meta, zap::new_salt(3))?.obj;
        let mut b = vec![0u8; 32];
        b[0..8].copy_from_slice(&MASTER_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&1u64.to_le_bytes());
        b[16..24].copy_from_slice(&root.to_le_bytes());
        b[24..32].copy_from_slice(&unlinked.to_le_bytes());
        os.write(master, 0, &b)?;
        Ok(())
    }

    /// Open the filesystem in `os`; frees what the unlinked set holds (files
    /// unlinked while open when the pool last went down).
    pub fn mount(os: Arc<Objset>, ctx: Arc<dyn DatasetCtx>) -> crate::Result<Zpl> {
        Self::mount_open(os, ctx, HashMap::new())
    }

    /// Open handles per object, as [`Zpl::mount_open`] takes them.
    pub fn opens(&self) -> HashMap<u64, u64> {
        lock(&self.opens).clone()
    }

    /// Mount with `opens` already open (a rollback's new tree under a
    /// mount whose kernel still holds them): an unlinked file among them
    /// lives until its last close instead of being reaped here.
    pub fn mount_open(
        os: Arc<Objset>,
        ctx: Arc<dyn DatasetCtx>,
        opens: HashMap<u64, u64>,
    ) -> crate::Result<Zpl> {
        let mut b = [0u8; 32];
        os.read(MASTER_OBJ, 0, &mut b)?;
        let word = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        if word(0) != MASTER_MAGIC || word(1) != 1 {
            return Err(Error::corrupt("master node", "bad magic or version"));
        }
        // The root must be a directory and the unlinked set an unlinked
        // set: a master node naming, say, the root as the unlinked set would
        // make the reaping below free every file in it.
        if word(2) == word(3) {
            return Err(Error::corrupt(
                "master node",
                "root directory and unlinked set are one object",
            ));
        }
        for (obj, want, what) in [
            (word(2), ot::DIRECTORY, "root directory"),
            (word(3), ot::UNLINKED_SET, "unlinked set"),
        ] {
            let ok = obj != MASTER_OBJ && os.dnode(obj)?.is_some_and(|dn| dn.obj_type == want);
            if !ok {
                return Err(Error::corrupt(
                    "master node",
                    format!("{what} is object {obj}, which is not one"),
                ));
            }
        }
        let zpl = Zpl {
            prefetch: Prefetch::start(&os),
            os,
            ctx,
            root: word(2),
            unlinked: word(3),
            ns: Mutex::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            opens: Mutex::new(opens),
            posix_acl: AtomicBool::new(false),
            page_cache: std::sync::OnceLock::new(),
            asked: Mutex::new(HashMap::new()),
        };
        zpl.getattr(zpl.root)
            .map_err(|_| Error::corrupt("master node", "root directory missing"))?;
        if !zpl.ctx.props().readonly {
            for e in Zap::open(&zpl.os, zpl.unlinked).all()? {
                if lock(&zpl.opens).contains_key(&e.value) {
                    continue;
                }
                let _tx = zpl.hold(|| zpl.warm_doomed(e.value));
                let _ = zpl.destroy(e.value);
            }
        }
        Ok(zpl)
    }

    pub fn ctx(&self) -> &Arc<dyn DatasetCtx> {
        &self.ctx
    }

    /// Store and apply POSIX ACLs (`acltype=posix`). Only for a mount
    /// whose kernel checks them: an ACL stored where nothing enforces it
    /// would be a restriction users believe in and do not have.
    pub fn set_posix_acl(&self, on: bool) {
        self.posix_acl.store(on, Ordering::Relaxed);
    }

    pub fn posix_acl(&self) -> bool {
        self.posix_acl.load(Ordering::Relaxed)
    }

    /// The namespace lock. Taken under a txg hold, never before one: an
    /// operation that waited for a hold while holding it would deadlock
    /// against the freeze (dmu/tx.rs).
    fn lock_ns(&self) -> Locked<'_, MutexGuard<'_, ()>> {
        debug_assert!(self.os.gate().held(), "namespace lock without a txg hold");
        Locked {
            os: &self.os,
            _g: lock(&self.ns),
        }
    }

    fn lock_objs(&self, objs: &[u64]) -> Locked<'_, Vec<MutexGuard<'_, ()>>> {
        debug_assert!(self.os.gate().held(), "object lock without a txg hold");
        let mut idx: Vec<usize> = objs.iter().map(|o| (*o as usize) % STRIPES).collect();
        idx.sort_unstable();
        idx.dedup();
        Locked {
            os: &self.os,
            _g: idx.into_iter().map(|i| lock(&self.stripes[i])).collect(),
        }
    }

    fn load(&self, obj: u64) -> ZResult<(DnodePhys, Znode)> {
        if obj == MASTER_OBJ || obj == self.unlinked {
            return Err(libc::ENOENT);
        }
        let dn = io(self.os.dnode(obj))?.ok_or(libc::ENOENT)?;
        if !matches!(dn.obj_type, ot::PLAIN_FILE | ot::DIRECTORY | ot::SYMLINK) {
            return Err(libc::ENOENT);
        }
        Ok((dn.clone(), Znode::decode(&dn.bonus)))
    }

    fn store(&self, obj: u64, z: &Znode) -> ZResult<()> {
        io(self.os.set_bonus(obj, &z.encode()))
    }

    // ---- warming up before the hold ---------------------------------------
    //
    // An operation reads, before it takes its txg hold and inside a
    // `tx::warm` scope, every block it will read under the hold: the scope
    // pins them, so the operation's reads under the hold never go to a
    // device, and the sync's freeze never waits for one (dmu/tx.rs, "What
    // bounds a hold"). Errors are ignored here: the operation meets them
    // again under its hold and answers them there.

    /// Hold the open txg for an operation, after `warm` read (inside a
    /// warm-up scope that lives as long as the hold) what it will read
    /// under it: when a freeze or a sync's publication landed between the
    /// warm-up and the hold, what was read may have moved, so warm up
    /// again. Neither can land while the hold lives.
    fn hold(&self, warm: impl Fn()) -> Held<'_> {
        let warm_scope = tx::warm();
        loop {
            let seen = self.os.generation();
            warm();
            let t = self.os.tx();
            if self.os.generation() == seen {
                return Held {
                    _scope: self.os.op_scope(),
                    _tx: t,
                    _warm: warm_scope,
                };
            }
        }
    }

    /// What an operation on `obj` may read: its dnode, a directory's
    /// header and its xattr object (`xattr_data`: the whole list, else only
    /// the dnode a free needs).
    fn warm_obj(&self, obj: u64, xattr_data: bool) {
        let Ok((_, z)) = self.load(obj) else { return };
        if z.is_dir() {
            let _ = Zap::open(&self.os, obj).count();
        }
        if z.xattr != 0 {
            if xattr_data {
                let _ = self.xattrs(&z);
            } else {
                let _ = self.os.stat(z.xattr);
            }
        }
    }

    /// [`warm_obj`](Self::warm_obj) for an object that may lose its last
    /// link or be freed: its slot in the unlinked set too.
    fn warm_doomed(&self, obj: u64) {
        self.warm_obj(obj, false);
        Zap::open(&self.os, self.unlinked).warm(&unlinked_key(obj));
    }

    /// Directory `dir` (its default ACL too), the leaf where `name` lives
    /// or would go, and the object it names.
    fn warm_name(&self, dir: u64, name: &[u8]) {
        self.warm_obj(dir, self.posix_acl());
        let zap = Zap::open(&self.os, dir);
        zap.warm(name);
        if let Ok(Some(e)) = zap.lookup(name) {
            self.warm_doomed(e.value);
        }
    }

    /// The parent chain from `obj` to the root (a rename's loop check).
    fn warm_ancestors(&self, mut obj: u64) {
        for _ in 0..100_000 {
            if obj == self.root {
                return;
            }
            match self.load(obj) {
                Ok((_, z)) => obj = z.parent,
                Err(_) => return,
            }
        }
    }

    /// What a write of part of block `blk` of `obj` (dnode `dn`) reads:
    /// the block (by default), or only the indirect blocks down to it
    /// when a block not in memory is filled in by the sync
    /// (dmu/partial.rs). Also what a truncate or punch inside it asks.
    fn warm_patch(&self, obj: u64, dn: &DnodePhys, blk: u64) {
        if blk * (dn.datablksz as u64) < dn.size {
            if crate::dmu::partial::fill_at_sync() {
                let _ = self.os.holds_data(obj, blk);
            } else {
                let _ = self.os.read_block(obj, blk);
            }
        }
    }

    /// The kernel above the mount holds its pages (`pagecache.rs`).
    pub fn set_page_cache(&self, pc: Arc<dyn super::pagecache::PageCache>) {
        let _ = self.page_cache.set(pc);
    }

    /// Of the records a write of `[offset, end)` covers in part, those it
    /// leaves partial without reading them, if the kernel above the mount
    /// can be asked (`pagecache.rs`): `(ask, deferred)`. `ask`: on disk
    /// and not in memory, to be asked of the kernel, whose answer fills
    /// them. `deferred`: those and any an earlier write left partial in
    /// this txg, awaiting its answer, which is patched, not read.
    fn records_to_ask(
        &self,
        obj: u64,
        dn: &DnodePhys,
        offset: u64,
        end: u64,
    ) -> (Vec<u64>, Vec<u64>) {
        let (mut ask, mut deferred) = (Vec::new(), Vec::new());
        if self.page_cache.get().is_none() {
            return (ask, deferred);
        }
        let bs = dn.datablksz as u64;
        for (cut, blk) in [(offset, offset / bs), (end, end / bs)] {
            if cut.is_multiple_of(bs) || blk * bs >= dn.size || deferred.contains(&blk) {
                continue;
            }
            if self.os.is_partial(obj, blk) {
                deferred.push(blk);
            } else if matches!(self.os.uncached_block(obj, blk), Ok(Some(_))) {
                ask.push(blk);
                deferred.push(blk);
            }
        }
        (ask, deferred)
    }

    /// Ask the kernel for records `blks` of `obj` (block size `bs`), up to
    /// the size the daemon knows (past it a record is zeros), which this
    /// thread's write left partial in `txg`.
    fn request_pages(&self, obj: u64, bs: u64, size: u64, blks: &[u64], txg: u64) {
        let Some(pc) = self.page_cache.get() else {
            return;
        };
        for &blk in blks {
            let off = blk * bs;
            let want = size.saturating_sub(off).min(bs) as usize;
            if want == 0 {
                continue;
            }
            // Recorded before the answer can arrive: under this lock.
            let mut asked = lock(&self.asked);
            if asked.len() > 65_536 {
                // Answers that never came (the kernel drops a retrieval
                // of an inode it no longer holds): forget them.
                asked.clear();
            }
            let n = pc.request(obj, off, want);
            if n != 0 {
                asked.insert((obj, blk), (n, txg));
            }
        }
    }

    /// The kernel's answer to [`PageCache::request`](super::pagecache::PageCache::request):
    /// `data`, the bytes of `obj` from `offset` it holds. Fills the open
    /// txg's partial record there if the answer covers it up to the
    /// file's size; otherwise the sync reads the record as before.
    ///
    /// `answer`: the number [`PageCache::request`](super::pagecache::PageCache::request)
    /// returned. Answers to anything but a record's latest request are
    /// dropped.
    pub fn fill_from_page_cache(&self, obj: u64, offset: u64, data: &[u8], answer: u64) {
        if self.page_cache.get().is_none() {
            return;
        }
        let Ok(dn) = self.os.stat(obj) else { return };
        let bs = dn.datablksz as u64;
        if bs == 0 || !offset.is_multiple_of(bs) {
            return;
        }
        let txg = {
            let mut asked = lock(&self.asked);
            match asked.get(&(obj, offset / bs)) {
                Some(&(n, txg)) if n == answer => {
                    asked.remove(&(obj, offset / bs));
                    txg
                }
                _ => return,
            }
        };
        let want = dn.size.saturating_sub(offset).min(bs) as usize;
        if data.len() < want {
            self.os
                .partial_event(crate::dmu::partial::Event::RetrieveMissed);
            return;
        }
        let mut base = data[..want].to_vec();
        base.resize(bs as usize, 0);
        let _ = self.os.fill_partial(obj, offset / bs, base, txg);
    }

    /// Block 0 of a single-block file, which a growth of its block size
    /// reads whole (`Objset::grow_blocksize`).
    fn warm_grow(&self, obj: u64, dn: &DnodePhys) {
        if dn.size > 0 && dn.size <= dn.datablksz as u64 {
            let _ = self.os.read_block(obj, 0);
        }
    }

    fn attr_of(&self, obj: u64, dn: &DnodePhys, z: Znode) -> Attr {
        let size = if z.is_dir() {
            Zap::open(&self.os, obj).count().unwrap_or(0) + 2
        } else {
            dn.size
        };
        Attr {
            ino: obj,
            size,
            blocks: dn.used_bytes.div_ceil(512),
            // An empty file has no block size yet: suggest the record
            // size, as OpenZFS does, so stdio writes a new file in
            // records rather than 4 KiB pieces.
            blksize: if z.is_dir() {
                512
            } else if size == 0 {
                self.ctx.props().recordsize.max(4096)
            } else {
                dn.datablksz.max(4096)
            },
            z,
        }
    }

    pub fn getattr(&self, obj: u64) -> ZResult<Attr> {
        let (dn, z) = self.load(obj)?;
        Ok(self.attr_of(obj, &dn, z))
    }

    /// Whether `obj`'s attributes will stay as [`Zpl::getattr`] gives them
    /// until the next change through this filesystem: false while a sync
    /// still has to write it (its `blocks` change then).
    pub fn settled(&self, obj: u64) -> bool {
        !self.os.has_pending(obj)
    }

    fn writable(&self) -> ZResult<()> {
        if self.ctx.props().readonly {
            return Err(libc::EROFS);
        }
        if !self.ctx.live() || self.os.gate().poisoned().is_some() {
            return Err(libc::EIO);
        }
        Ok(())
    }

    fn dir(&self, obj: u64) -> ZResult<Znode> {
        let (_, z) = self.load(obj)?;
        if !z.is_dir() {
            return Err(libc::ENOTDIR);
        }
        Ok(z)
    }

    pub fn lookup(&self, dir: u64, name: &[u8]) -> ZResult<Attr> {
        let z = self.dir(dir)?;
        if name.len() > zap::MAX_NAME {
            return Err(libc::ENAMETOOLONG);
        }
        let obj = match name {
            b"." => dir,
            b".." => z.parent,
            _ => {
                io(Zap::open(&self.os, dir).lookup(name))?
                    .ok_or(libc::ENOENT)?
                    .value
            }
        };
        self.getattr(obj)
    }

    /// Create a file, directory, symlink (`target`) or device node in `dir`
    /// with exactly `mode` (as [`Zpl::mknod_umask`] with no umask).
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        dir: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
        target: Option<&[u8]>,
    ) -> ZResult<Attr> {
        self.mknod_umask(dir, name, mode, 0, rdev, uid, gid, target)
    }

    /// [`Zpl::mknod`] as the creating process asked: `umask` applies unless
    /// the directory has a default ACL, which gives the new node its ACL
    /// and limits its mode instead (acl.rs).
    #[allow(clippy::too_many_arguments)]
    pub fn mknod_umask(
        &self,
        dir: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
        target: Option<&[u8]>,
    ) -> ZResult<Attr> {
        check_name(name)?;
        self.writable()?;
        if name == b"." || name == b".." {
            return Err(libc::EEXIST);
        }
        let kind = mode & libc::S_IFMT;
        let kind = if kind == 0 { libc::S_IFREG } else { kind };
        if let Some(t) = target {
            if t.is_empty() {
                return Err(libc::ENOENT);
            }
            if t.len() >= 4096 {
                return Err(libc::ENAMETOOLONG);
            }
        }
        // Admission may wait for syncs: before the txg hold (dmu/tx.rs).
        // An inherited ACL is one more small object.
        self.ctx.admit(if self.posix_acl() { 8192 } else { 4096 })?;
        // The node, and the object of an inherited ACL.
        let numbers = io(self.os.reserve_objects(1 + self.posix_acl() as usize))?;
        let _tx = self.hold(|| self.warm_name(dir, name));
        let _ns = self.lock_ns();
        // The new objects too: a lookup finds the name (without a lock) as
        // soon as it is inserted, and a write to the new file must reach
        // the intent log after its creation, not before.
        let mut objs = numbers.numbers();
        objs.push(dir);
        let _g = self.lock_objs(&objs);
        let mut pz = self.dir(dir)?;
        if pz.nlink == 0 {
            return Err(libc::ENOENT);
        }
        let zdir = Zap::open(&self.os, dir);
        if io(zdir.lookup(name))?.is_some() {
            return Err(libc::EEXIST);
        }
        let props = self.ctx.props();
        let obj = match kind {
            libc::S_IFDIR => {
                io(Zap::create(
                    &self.os,
                    ot::DIRECTORY,
                    &ObjProps::METADATA,
                    zap::new_salt(dir),
                ))?
                .obj
            }
            libc::S_IFLNK => io(self.os.create_object(ot::SYMLINK, 512, &props.obj))?,
            _ => io(self.os.create_object(ot::PLAIN_FILE, 512, &props.obj))?,
        };
        let t = now_ns();
        let mut perm = mode & 0o7777;
        let mut acls = Vec::new();
        if kind != libc::S_IFLNK {
            let default = match self.posix_acl() {
                true => self.xattr_get(&pz, acl::DEFAULT)?,
                false => None,
            };
            match default {
                Some(v) => {
                    let d = acl::Acl::parse(&v).map_err(|_| libc::EIO)?;
                    let mut access = d.clone();
                    let (m, store) = access.create_masq(perm);
                    perm = m;
                    if store {
                        acls.push((acl::ACCESS.to_vec(), access.encode()));
                    }
                    if kind == libc::S_IFDIR {
                        acls.push((acl::DEFAULT.to_vec(), v));
                    }
                }
                None => perm &= !(umask & 0o777),
            }
        }
        let mut gid = gid;
        if pz.mode & libc::S_ISGID != 0 {
            gid = pz.gid;
            if kind == libc::S_IFDIR {
                perm |= libc::S_ISGID;
            }
        }
        let mut z = Znode {
            mode: kind | if kind == libc::S_IFLNK { 0o777 } else { perm },
            uid,
            gid,
            nlink: if kind == libc::S_IFDIR { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            rdev,
            parent: dir,
            gen: self.ctx.txg(),
            ..Default::default()
        };
        if !acls.is_empty() {
            self.put_xattrs(&mut z, &acls)?;
        }
        self.store(obj, &z)?;
        if let Some(target) = target {
            io(self
                .os
                .grow_blocksize(obj, (target.len() as u32).div_ceil(512) * 512))?;
            io(self.os.write(obj, 0, target))?;
        }
        if let Err(e) = zdir.insert(name, obj, dtype(z.mode)) {
            if z.xattr != 0 {
                let _ = self.os.free_object(z.xattr);
            }
            let _ = self.os.free_object(obj);
            return Err(errno(e));
        }
        if kind == libc::S_IFDIR {
            pz.nlink += 1;
        }
        pz.mtime = t;
        pz.ctime = t;
        self.store(dir, &pz)?;
        self.getattr(obj)
    }

    pub fn readlink(&self, obj: u64) -> ZResult<Vec<u8>> {
        let (dn, z) = self.load(obj)?;
        if z.kind() != libc::S_IFLNK {
            return Err(libc::EINVAL);
        }
        let mut b = vec![0u8; dn.size as usize];
        io(self.os.read(obj, 0, &mut b))?;
        Ok(b)
    }

    /// Drop one link of `obj` (its znode already loaded in `z`); frees the
    /// object or parks it in the unlinked set when the count reaches zero.
    fn drop_link(&self, obj: u64, mut z: Znode, t: i64) -> ZResult<()> {
        z.nlink = if z.is_dir() {
            0
        } else {
            z.nlink.saturating_sub(1)
        };
        z.ctime = t;
        self.store(obj, &z)?;
        if z.nlink == 0 {
            let open = lock(&self.opens).get(&obj).copied().unwrap_or(0) > 0;
            if open {
                io(Zap::open(&self.os, self.unlinked)
                    .insert(&unlinked_key(obj), obj, 0)
                    .map(|_| ()))?;
            } else {
                self.destroy(obj)?;
            }
        }
        Ok(())
    }

    /// Free an object with no links (and its xattrs).
    fn destroy(&self, obj: u64) -> ZResult<()> {
        if let Ok((_, z)) = self.load(obj) {
            if z.xattr != 0 {
                let _ = self.os.free_object(z.xattr);
            }
            io(self.os.free_object(obj))?;
        }
        let _ = Zap::open(&self.os, self.unlinked).remove(&unlinked_key(obj));
        Ok(())
    }

    pub fn unlink(&self, dir: u64, name: &[u8]) -> ZResult<()> {
        self.remove(dir, name, false)
    }

    pub fn rmdir(&self, dir: u64, name: &[u8]) -> ZResult<()> {
        match name {
            b"." => return Err(libc::EINVAL),
            b".." => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.remove(dir, name, true)
    }

    fn remove(&self, dir: u64, name: &[u8], want_dir: bool) -> ZResult<()> {
        if name.len() > zap::MAX_NAME {
            return Err(libc::ENAMETOOLONG);
        }
        self.writable()?;
        let _tx = self.hold(|| self.warm_name(dir, name));
        let _ns = self.lock_ns();
        self.dir(dir)?;
        let zdir = Zap::open(&self.os, dir);
        let e = io(zdir.lookup(name))?.ok_or(libc::ENOENT)?;
        let _g = self.lock_objs(&[dir, e.value]);
        let (_, z) = self.load(e.value)?;
        match (want_dir, z.is_dir()) {
            (false, true) => return Err(libc::EISDIR),
            (true, false) => return Err(libc::ENOTDIR),
            (true, true) if io(Zap::open(&self.os, e.value).count())? > 0 => {
                return Err(libc::ENOTEMPTY)
            }
            _ => {}
        }
        io(zdir.remove(name))?;
        let t = now_ns();
        let mut pz = self.dir(dir)?;
        if z.is_dir() {
            pz.nlink = pz.nlink.saturating_sub(1);
        }
        pz.mtime = t;
        pz.ctime = t;
        self.store(dir, &pz)?;
        self.drop_link(e.value, z, t)
    }

    /// Is `obj` the directory `anc` or beneath it?
    fn is_descendant(&self, mut obj: u64, anc: u64) -> ZResult<bool> {
        for _ in 0..100_000 {
            if obj == anc {
                return Ok(true);
            }
            if obj == self.root {
                return Ok(false);
            }
            obj = self.load(obj)?.1.parent;
        }
        Err(libc::ELOOP)
    }

    /// rename(2) and renameat2's RENAME_NOREPLACE / RENAME_EXCHANGE.
    pub fn rename(
        &self,
        sdir: u64,
        sname: &[u8],
        ddir: u64,
        dname: &[u8],
        flags: u32,
    ) -> ZResult<()> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        if flags & !(NOREPLACE | EXCHANGE) != 0 || flags == NOREPLACE | EXCHANGE {
            return Err(libc::EINVAL);
        }
        check_name(dname)?;
        if sname.len() > zap::MAX_NAME {
            return Err(libc::ENAMETOOLONG);
        }
        for n in [sname, dname] {
            if n == b"." || n == b".." {
                return Err(libc::EBUSY);
            }
        }
        self.writable()?;
        let _tx = self.hold(|| {
            self.warm_name(sdir, sname);
            self.warm_name(ddir, dname);
            self.warm_ancestors(sdir);
            self.warm_ancestors(ddir);
        });
        let _ns = self.lock_ns();
        self.dir(sdir)?;
        let dz = self.dir(ddir)?;
        if dz.nlink == 0 {
            return Err(libc::ENOENT);
        }
        let szap = Zap::open(&self.os, sdir);
        let dzap = Zap::open(&self.os, ddir);
        let src = io(szap.lookup(sname))?.ok_or(libc::ENOENT)?;
        let dst = io(dzap.lookup(dname))?;
        let mut objs = vec![sdir, ddir, src.value];
        if let Some(d) = &dst {
            objs.push(d.value);
        }
        let _g = self.lock_objs(&objs);
        let (_, sz) = self.load(src.value)?;
        if sz.is_dir() && sdir != ddir && self.is_descendant(ddir, src.value)? {
            return Err(libc::EINVAL);
        }
        let t = now_ns();
        if flags & EXCHANGE != 0 {
            let dst = dst.ok_or(libc::ENOENT)?;
            let (_, mut dzn) = self.load(dst.value)?;
            if dzn.is_dir() && sdir != ddir && self.is_descendant(sdir, dst.value)? {
                return Err(libc::EINVAL);
            }
            let mut szn = sz;
            io(szap.update(sname, dst.value, dst.vtype))?;
            io(dzap.update(dname, src.value, src.vtype))?;
            if sdir != ddir {
                if szn.is_dir() {
                    szn.parent = ddir;
                }
                if dzn.is_dir() {
                    dzn.parent = sdir;
                }
                let delta = szn.is_dir() as i64 - dzn.is_dir() as i64;
                self.adjust_dir(sdir, -delta, t)?;
                self.adjust_dir(ddir, delta, t)?;
            } else {
                self.adjust_dir(sdir, 0, t)?;
            }
            szn.ctime = t;
            dzn.ctime = t;
            self.store(src.value, &szn)?;
            self.store(dst.value, &dzn)?;
            return Ok(());
        }
        if let Some(d) = &dst {
            if flags & NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            if d.value == src.value {
                return Ok(());
            }
            let (_, dzn) = self.load(d.value)?;
            match (sz.is_dir(), dzn.is_dir()) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if io(Zap::open(&self.os, d.value).count())? > 0 => {
                    return Err(libc::ENOTEMPTY)
                }
                _ => {}
            }
            io(dzap.remove(dname))?;
            if dzn.is_dir() {
                self.adjust_dir(ddir, -1, t)?;
            }
            self.drop_link(d.value, dzn, t)?;
        }
        io(szap.remove(sname))?;
        io(dzap.insert(dname, src.value, src.vtype).map(|_| ()))?;
        let mut sz = self.load(src.value)?.1;
        sz.ctime = t;
        if sz.is_dir() && sdir != ddir {
            sz.parent = ddir;
            self.adjust_dir(sdir, -1, t)?;
            self.adjust_dir(ddir, 1, t)?;
        } else {
            self.adjust_dir(sdir, 0, t)?;
            if sdir != ddir {
                self.adjust_dir(ddir, 0, t)?;
            }
        }
        self.store(src.value, &sz)
    }

    fn adjust_dir(&self, dir: u64, links: i64, t: i64) -> ZResult<()> {
        let mut z = self.dir(dir)?;
        z.nlink = (z.nlink as i64 + links).max(0) as u32;
        z.mtime = t;
        z.ctime = t;
        self.store(dir, &z)
    }

    pub fn link(&self, obj: u64, ddir: u64, dname: &[u8]) -> ZResult<Attr> {
        check_name(dname)?;
        self.writable()?;
        self.ctx.admit(512)?;
        let _tx = self.hold(|| {
            self.warm_obj(obj, false);
            self.warm_name(ddir, dname);
        });
        let _ns = self.lock_ns();
        let mut dz = self.dir(ddir)?;
        if dz.nlink == 0 {
            return Err(libc::ENOENT);
        }
        let _g = self.lock_objs(&[obj, ddir]);
        let (_, mut z) = self.load(obj)?;
        if z.is_dir() {
            return Err(libc::EPERM);
        }
        if z.nlink == 0 {
            return Err(libc::ENOENT);
        }
        if z.nlink >= u32::MAX - 1 {
            return Err(libc::EMLINK);
        }
        let dzap = Zap::open(&self.os, ddir);
        if io(dzap.lookup(dname))?.is_some() {
            return Err(libc::EEXIST);
        }
        io(dzap.insert(dname, obj, dtype(z.mode)).map(|_| ()))?;
        let t = now_ns();
        z.nlink += 1;
        z.ctime = t;
        self.store(obj, &z)?;
        dz.mtime = t;
        dz.ctime = t;
        self.store(ddir, &dz)?;
        self.getattr(obj)
    }

    /// Up to `max` entries after `cookie` (0 = from the start): (next
    /// cookie, object, dirent type, name), starting with "." and "..".
    pub fn readdir(&self, dir: u64, cookie: u64, max: usize) -> ZResult<Vec<DirEntry>> {
        let z = self.dir(dir)?;
        let mut out = Vec::new();
        if cookie == 0 {
            out.push((1, dir, dtype(libc::S_IFDIR), b".".to_vec()));
        }
        if cookie <= 1 {
            out.push((2, z.parent, dtype(libc::S_IFDIR), b"..".to_vec()));
        }
        let from = if cookie <= 2 { 0 } else { cookie };
        let want = max.saturating_sub(out.len());
        for e in io(Zap::open(&self.os, dir).list_from(from, want))? {
            out.push((e.key + 1, e.value, e.vtype, e.name));
        }
        Ok(out)
    }

    pub fn setattr(&self, obj: u64, a: &SetAttr) -> ZResult<Attr> {
        self.writable()?;
        if let Some(size) = a.size {
            // A truncate rewrites at most the block its new end falls in,
            // or grows a small file's block towards the record size; one
            // to a block boundary or zero needs no space (it frees).
            let dn = io(self.os.stat(obj))?;
            let bs = dn.datablksz as u64;
            let need = if size < dn.size {
                if size % bs != 0 {
                    bs
                } else {
                    0
                }
            } else if size > bs && dn.size <= bs {
                self.ctx.props().recordsize as u64
            } else {
                0
            };
            if need > 0 {
                self.ctx.admit(need)?;
            }
        }
        if a.mode.is_some() && self.posix_acl() {
            self.ctx.admit(4096)?;
        }
        let acl = a.mode.is_some() && self.posix_acl();
        // chmod may rewrite the ACL into a new xattr object.
        let _numbers = io(self.os.reserve_objects(acl as usize))?;
        let _tx = self.hold(|| {
            self.warm_obj(obj, acl);
            if let (Some(size), Ok(dn)) = (a.size, self.os.stat(obj)) {
                // The block the new end falls in; block 0 of a file that
                // grows its block size.
                self.warm_grow(obj, &dn);
                self.warm_patch(obj, &dn, size / dn.datablksz as u64);
            }
        });
        let _g = self.lock_objs(&[obj]);
        let (_, mut z) = self.load(obj)?;
        let t = now_ns();
        if let Some(size) = a.size {
            if z.is_dir() {
                return Err(libc::EISDIR);
            }
            if z.kind() != libc::S_IFREG {
                return Err(libc::EINVAL);
            }
            self.truncate_locked(obj, size)?;
            z.mtime = t;
        }
        if a.kill_suid && !z.is_dir() {
            z.mode = kill_suid(z.mode);
        }
        if let Some(m) = a.mode {
            z.mode = (z.mode & libc::S_IFMT) | (m & 0o7777);
            // chmod rewrites the entries of the access ACL that the mode
            // stands for (acl.rs).
            if self.posix_acl() {
                if let Some(v) = self.xattr_get(&z, acl::ACCESS)? {
                    let mut acl = acl::Acl::parse(&v).map_err(|_| libc::EIO)?;
                    acl.chmod(z.mode);
                    let mut all = self.xattrs(&z)?;
                    for (n, v) in all.iter_mut() {
                        if n == acl::ACCESS {
                            *v = acl.encode();
                        }
                    }
                    self.put_xattrs(&mut z, &all)?;
                }
            }
        }
        if let Some(u) = a.uid {
            z.uid = u;
        }
        if let Some(g) = a.gid {
            z.gid = g;
        }
        if let Some(at) = a.atime {
            z.atime = at;
        }
        if let Some(mt) = a.mtime {
            z.mtime = mt;
        }
        z.ctime = t;
        self.store(obj, &z)?;
        self.getattr(obj)
    }

    fn truncate_locked(&self, obj: u64, size: u64) -> ZResult<()> {
        if size > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        let dn = io(self.os.stat(obj))?;
        let bs = dn.datablksz as u64;
        if size < dn.size {
            // Zero the tail of the block the new end falls in, punch the rest.
            let tail = size % bs;
            let first_free = size.div_ceil(bs);
            if tail != 0 && io(self.os.holds_data(obj, size / bs))? {
                let zeros = vec![0u8; (bs - tail) as usize];
                io(self.os.write(obj, size, &zeros))?;
            }
            let last = dn.size.div_ceil(bs);
            io(self.os.free_range(obj, first_free, last.max(first_free)))?;
        } else if size > bs && dn.size <= bs && bs < self.ctx.props().recordsize as u64 {
            self.grow(obj, &dn, size)?;
        }
        io(self.os.set_size(obj, size))
    }

    /// Grow a single-block file's block size towards the record size.
    fn grow(&self, obj: u64, dn: &DnodePhys, end: u64) -> ZResult<()> {
        let rs = self.ctx.props().recordsize.max(512) as u64;
        if dn.size > dn.datablksz as u64 || dn.datablksz as u64 >= rs {
            return Ok(());
        }
        let want = if end >= rs {
            rs
        } else {
            end.div_ceil(512) * 512
        };
        if want > dn.datablksz as u64 {
            io(self.os.grow_blocksize(obj, want as u32))?;
        }
        Ok(())
    }

    pub fn open(&self, obj: u64) -> ZResult<()> {
        self.load(obj)?;
        *lock(&self.opens).entry(obj).or_insert(0) += 1;
        Ok(())
    }

    /// The last close of an unlinked file frees it.
    pub fn release(&self, obj: u64) -> ZResult<()> {
        // No namespace lock on the common path. The count drops before the
        // link count is read, and unlink stores the link count before it
        // reads the open count, so one of the two always sees the other:
        // either unlink frees the file at once or this last close does.
        let last = {
            let mut o = lock(&self.opens);
            match o.get_mut(&obj) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    o.remove(&obj);
                    true
                }
                None => false,
            }
        };
        if last && !self.ctx.props().readonly {
            if let Ok((_, z)) = self.load(obj) {
                if z.nlink == 0 {
                    let _tx = self.hold(|| self.warm_doomed(obj));
                    let _ns = self.lock_ns();
                    let still_closed = !lock(&self.opens).contains_key(&obj);
                    let _g = self.lock_objs(&[obj]);
                    if still_closed && self.load(obj).is_ok_and(|(_, z)| z.nlink == 0) {
                        self.destroy(obj)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub fn read(&self, obj: u64, offset: u64, len: usize) -> ZResult<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(obj, offset, len, &mut buf)?;
        Ok(buf)
    }

    /// [`read`](Self::read) into `buf` (its length becomes the bytes read).
    /// A request thread keeps one buffer for every read: a fresh 1 MiB
    /// buffer per request cost page faults and zeroing on each (measured in
    /// the cold sequential read).
    pub fn read_into(&self, obj: u64, offset: u64, len: usize, buf: &mut Vec<u8>) -> ZResult<()> {
        self.read_to(obj, offset, len, buf, None)
    }

    /// [`read_into`](Self::read_into) for the kernel's page cache above a
    /// mount, which keeps what it gets: the records the read takes whole
    /// from disk leave the block cache ([`Objset::read_for_kernel`]), so
    /// file data is held once (docs/ARCHITECTURE.md, "one copy"). Records
    /// a snapshot or clone shares stay ([`DatasetCtx::shared_below`]).
    pub fn read_for_kernel(
        &self,
        obj: u64,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> ZResult<()> {
        self.read_to(obj, offset, len, buf, Some(None))
    }

    /// [`read_for_kernel`](Self::read_for_kernel) that also notes in
    /// `parts` the records it covers only in part (cut at the file's
    /// size), unless the file is being read
    /// sequentially (the next reads cover the rest): the mount may give
    /// the kernel the rest of each, then let the cache's copy go
    /// ([`Zpl::kernel_holds`]).
    pub fn read_for_kernel_noting(
        &self,
        obj: u64,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
        parts: &mut Vec<RecordPart>,
    ) -> ZResult<()> {
        self.read_to(obj, offset, len, buf, Some(Some(parts)))
    }

    /// The kernel's page cache holds all of record `part` of a file of
    /// this filesystem ([`Objset::kernel_holds`]; nothing for a version
    /// in memory).
    pub fn kernel_holds(&self, part: &RecordPart) {
        if let Some(bp) = &part.bp {
            self.os.kernel_holds(bp, self.ctx.shared_below());
        }
    }

    /// `for_kernel`: `None` for a plain read; `Some(parts)` for the
    /// kernel's page cache, noting partly covered records in `parts`.
    fn read_to(
        &self,
        obj: u64,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
        for_kernel: Option<Option<&mut Vec<RecordPart>>>,
    ) -> ZResult<()> {
        let (dn, z) = self.load(obj)?;
        if z.is_dir() {
            return Err(libc::EISDIR);
        }
        if offset >= dn.size {
            buf.clear();
            return Ok(());
        }
        let n = (dn.size - offset).min(len as u64) as usize;
        let sequential =
            self.prefetch
                .note(obj, offset, offset + n as u64, dn.datablksz as u64, dn.size);
        // Every byte is overwritten below (holes as zeros), so old contents
        // may stay.
        if buf.len() < n {
            buf.resize(n, 0);
        }
        buf.truncate(n);
        match for_kernel {
            Some(parts) => {
                let mut parts = parts.filter(|_| !sequential);
                let noted = parts.as_ref().map_or(0, |p| p.len());
                let below = self.ctx.shared_below();
                io(self
                    .os
                    .read_for_kernel(obj, offset, buf, below, parts.as_deref_mut()))?;
                for p in parts.into_iter().flat_map(|p| &mut p[noted..]) {
                    p.len = p.len.min(dn.size.saturating_sub(p.offset) as usize);
                }
            }
            None => io(self.os.read(obj, offset, buf))?,
        }
        let props = self.ctx.props();
        if props.atime && !props.readonly {
            // relatime: only when the access time is older than the last
            // change or a day old, so reads do not dirty every txg.
            let t = now_ns();
            if z.atime <= z.mtime || z.atime <= z.ctime || t - z.atime > 86_400_000_000_000 {
                let _tx = self.os.tx();
                let _g = self.lock_objs(&[obj]);
                if let Ok((_, mut z)) = self.load(obj) {
                    z.atime = t;
                    let _ = self.store(obj, &z);
                }
            }
        }
        Ok(())
    }

    pub fn write(&self, obj: u64, offset: u64, data: &[u8]) -> ZResult<usize> {
        self.write_kill(obj, offset, data, false).map(|(n, _)| n)
    }

    /// `write`, also clearing the set-id bits when `kill` (the kernel asks
    /// for that when an unprivileged process writes). Returns the bytes
    /// written and whether the mode changed: a front end that lets its
    /// clients cache attributes must tell them before it answers, or a
    /// cached S_ISUID outlives the write (a local root: write a program
    /// into a set-user-ID file, run it).
    pub fn write_kill(
        &self,
        obj: u64,
        offset: u64,
        data: &[u8],
        kill: bool,
    ) -> ZResult<(usize, bool)> {
        self.writable()?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(libc::EFBIG)?;
        if data.is_empty() {
            return Ok((0, false));
        }
        // The write throttle may sleep: not while holding the object, or
        // every writer of the file would queue behind one writer's delay.
        self.ctx.admit(data.len() as u64)?;
        // Partial-block writes read the old block, and so does a
        // single-block file about to grow its block: before the hold and
        // the object's lock (so concurrent writers to one file wait on each
        // other's memcpy, not on each other's disk reads).
        // Records the kernel above the mount holds are asked of it, not
        // read (`pagecache.rs`).
        let asked = std::cell::RefCell::new((Vec::new(), Vec::new()));
        let _tx = self.hold(|| {
            if let Ok(dn) = self.os.stat(obj) {
                let bs = dn.datablksz as u64;
                let (ask, deferred) = self.records_to_ask(obj, &dn, offset, end);
                if !offset.is_multiple_of(bs) && !deferred.contains(&(offset / bs)) {
                    self.warm_patch(obj, &dn, offset / bs);
                }
                if !end.is_multiple_of(bs)
                    && end / bs != offset / bs
                    && !deferred.contains(&(end / bs))
                {
                    self.warm_patch(obj, &dn, end / bs);
                }
                if end > bs {
                    self.warm_grow(obj, &dn);
                }
                *asked.borrow_mut() = (ask, deferred);
            }
        });
        let (asked, _) = asked.into_inner();
        let mut txg = 0;
        let (r, dn) = {
            let _g = self.lock_objs(&[obj]);
            let (dn, mut z) = self.load(obj)?;
            if z.is_dir() {
                return Err(libc::EISDIR);
            }
            self.grow(obj, &dn, end)?;
            // Under a mount every write of part of a record leaves a
            // partial block unless the record is dirty already: the
            // kernel's pages answer for what is not cached, the cache for
            // what is, at the sync (dmu/partial.rs).
            if self.page_cache.get().is_none() {
                io(self.os.write(obj, offset, data))?;
            } else {
                io(crate::dmu::partial::deferring(|| {
                    self.os.write(obj, offset, data)
                }))?;
                txg = self.os.open_txg();
            }
            let t = now_ns();
            z.mtime = t;
            z.ctime = t;
            let old_mode = z.mode;
            if kill {
                z.mode = kill_suid(z.mode);
            }
            self.store(obj, &z)?;
            ((data.len(), z.mode != old_mode), dn)
        };
        // Asked once the partial records exist, and with the object's
        // lock released: the answer fills them under that lock's peers.
        if !asked.is_empty() {
            self.request_pages(obj, dn.datablksz as u64, dn.size.max(end), &asked, txg);
        }
        Ok(r)
    }

    /// fallocate(2): mode 0 (extend), KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE,
    /// ZERO_RANGE. Space is not reserved (copy-on-write cannot promise it).
    pub fn fallocate(&self, obj: u64, mode: i32, offset: u64, len: u64) -> ZResult<()> {
        self.writable()?;
        let end = offset.checked_add(len).ok_or(libc::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        // At most the two partial blocks at the ends are rewritten, or a
        // small file's block grows towards the record size.
        let bs = io(self.os.stat(obj))?.datablksz as u64;
        let partial = !offset.is_multiple_of(bs) || !end.is_multiple_of(bs);
        let extends = mode & libc::FALLOC_FL_KEEP_SIZE == 0;
        if partial || extends {
            self.ctx
                .admit((2 * bs).max(self.ctx.props().recordsize as u64))?;
        }
        // Only the dnode and the blocks at both ends (and block 0 of a
        // growing file): fallocate touches no xattr.
        let _tx = self.hold(|| {
            if let Ok(dn) = self.os.stat(obj) {
                self.warm_grow(obj, &dn);
                for blk in [offset / bs, end / bs] {
                    self.warm_patch(obj, &dn, blk);
                }
            }
        });
        let _g = self.lock_objs(&[obj]);
        let (dn, mut z) = self.load(obj)?;
        if z.kind() != libc::S_IFREG {
            return Err(libc::ENODEV);
        }
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        if mode
            & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE)
            != 0
            || (punch && !keep)
        {
            return Err(libc::EOPNOTSUPP);
        }
        let t = now_ns();
        if punch || zero {
            let stop = end.min(dn.size);
            if offset < stop {
                self.punch(obj, &dn, offset, stop)?;
            }
            z.mtime = t;
        }
        if !keep && end > dn.size {
            if dn.size <= dn.datablksz as u64 {
                self.grow(obj, &dn, end)?;
            }
            io(self.os.set_size(obj, end))?;
        }
        z.ctime = t;
        self.store(obj, &z)
    }

    /// Zero `[start, end)`: partial blocks by writing zeros, whole blocks by
    /// punching them out (they become holes).
    fn punch(&self, obj: u64, dn: &DnodePhys, start: u64, end: u64) -> ZResult<()> {
        let bs = dn.datablksz as u64;
        let mut at = start;
        while at < end {
            let blk = at / bs;
            let (bstart, bend) = (blk * bs, (blk + 1) * bs);
            if at == bstart && bend <= end {
                // Whole blocks from here: punch them all at once.
                let last = end / bs;
                io(self.os.free_range(obj, blk, last))?;
                at = last * bs;
                continue;
            }
            let to = bend.min(end);
            if io(self.os.holds_data(obj, blk))? {
                io(self.os.write(obj, at, &vec![0u8; (to - at) as usize]))?;
            }
            at = to;
        }
        Ok(())
    }

    /// lseek(2) SEEK_DATA / SEEK_HOLE at block granularity.
    pub fn seek_data(&self, obj: u64, offset: u64, data: bool) -> ZResult<u64> {
        let (dn, _) = self.load(obj)?;
        if offset >= dn.size {
            return Err(libc::ENXIO);
        }
        let bs = dn.datablksz as u64;
        let mut blk = offset / bs;
        let last = dn.size.div_ceil(bs);
        while blk < last {
            let present = io(self.os.read_block(obj, blk))?.is_some();
            if present == data {
                return Ok((blk * bs).max(offset));
            }
            blk += 1;
        }
        if data {
            Err(libc::ENXIO)
        } else {
            Ok(dn.size)
        }
    }

    pub fn fsync(&self, obj: u64) -> ZResult<()> {
        self.ctx.commit(obj)
    }

    /// (total, free, available) bytes and (files, free files).
    pub fn statfs(&self) -> (u64, u64, u64, u64) {
        let (total, avail) = self.ctx.space();
        let files = self.os.dnode_count_estimate();
        (total, avail, files, avail / 512)
    }

    // ---- extended attributes ----------------------------------------------

    fn xattrs(&self, z: &Znode) -> ZResult<Vec<(Vec<u8>, Vec<u8>)>> {
        if z.xattr == 0 {
            return Ok(Vec::new());
        }
        let dn = io(self.os.stat(z.xattr))?;
        // Whatever the znode names must be an xattr object of a size the
        // setters could have written (every name and value at their limits
        // would not reach 64 MiB).
        if dn.obj_type != ot::XATTR || dn.size > 64 << 20 {
            return Err(libc::EIO);
        }
        let mut b = vec![0u8; dn.size as usize];
        io(self.os.read(z.xattr, 0, &mut b))?;
        decode_xattrs(&b).ok_or(libc::EIO)
    }

    pub fn getxattr(&self, obj: u64, name: &[u8]) -> ZResult<Vec<u8>> {
        if acl::is_acl(name) && !self.posix_acl() {
            return Err(libc::EOPNOTSUPP);
        }
        let (_, z) = self.load(obj)?;
        self.xattr_get(&z, name)?.ok_or(libc::ENODATA)
    }

    fn xattr_get(&self, z: &Znode, name: &[u8]) -> ZResult<Option<Vec<u8>>> {
        if z.xattr == 0 {
            return Ok(None);
        }
        Ok(self
            .xattrs(z)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v))
    }

    pub fn listxattr(&self, obj: u64) -> ZResult<Vec<Vec<u8>>> {
        let (_, z) = self.load(obj)?;
        let acls = self.posix_acl();
        Ok(self
            .xattrs(&z)?
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| acls || !acl::is_acl(n))
            .collect())
    }

    /// `flags`: XATTR_CREATE / XATTR_REPLACE. `value` `None` removes.
    pub fn setxattr(&self, obj: u64, name: &[u8], value: Option<&[u8]>, flags: i32) -> ZResult<()> {
        self.setxattr_kill(obj, name, value, flags, false)
    }

    /// [`Zpl::setxattr`]; `kill_sgid`: the caller may not keep the file's
    /// set-group-ID bit when it sets an access ACL (not in the owning group
    /// and without CAP_FSETID; the kernel says so with
    /// FUSE_SETXATTR_ACL_KILL_SGID).
    pub fn setxattr_kill(
        &self,
        obj: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: i32,
        kill_sgid: bool,
    ) -> ZResult<()> {
        let is_acl = acl::is_acl(name);
        if is_acl && !self.posix_acl() {
            return Err(libc::EOPNOTSUPP);
        }
        self.writable()?;
        if name.is_empty() || name.len() > 255 {
            return Err(if name.is_empty() {
                libc::EINVAL
            } else {
                libc::ERANGE
            });
        }
        if value.is_some_and(|v| v.len() > XATTR_SIZE_MAX) {
            return Err(libc::E2BIG);
        }
        let parsed = match value {
            Some(v) if is_acl => Some(acl::Acl::parse(v)?),
            _ => None,
        };
        // The whole list is rewritten: admit what it holds now plus the new
        // value before the txg hold.
        let (_, z0) = self.load(obj)?;
        let cur = if z0.xattr == 0 {
            0
        } else {
            io(self.os.stat(z0.xattr))?.size
        };
        self.ctx
            .admit(cur + name.len() as u64 + value.map_or(0, |v| v.len() as u64) + 5)?;
        // The list is rewritten into a new object.
        let _numbers = io(self.os.reserve_objects(1))?;
        let _tx = self.hold(|| self.warm_obj(obj, true));
        let _g = self.lock_objs(&[obj]);
        let (_, mut z) = self.load(obj)?;
        let mut all = self.xattrs(&z)?;
        let pos = all.iter().position(|(n, _)| n == name);
        // An ACL: the mode follows an access ACL, and one the mode says
        // all of is not stored (acl.rs).
        let value = match (parsed, name == acl::DEFAULT) {
            (Some(a), true) if !z.is_dir() && !a.is_empty() => return Err(libc::EACCES),
            (Some(a), true) => (!a.is_empty()).then(|| a.encode()),
            (Some(a), false) => {
                let (mode, equiv) = a.mode();
                z.mode = (z.mode & !0o777) | mode;
                if kill_sgid {
                    z.mode &= !libc::S_ISGID;
                }
                (!equiv).then(|| a.encode())
            }
            (None, _) => value.map(<[u8]>::to_vec),
        };
        match (value, pos) {
            (None, None) if is_acl => {}
            (None, None) => return Err(libc::ENODATA),
            (None, Some(i)) => {
                all.remove(i);
            }
            (Some(_), Some(_)) if flags & libc::XATTR_CREATE != 0 => return Err(libc::EEXIST),
            (Some(_), None) if flags & libc::XATTR_REPLACE != 0 => return Err(libc::ENODATA),
            (Some(v), Some(i)) => all[i].1 = v,
            (Some(v), None) => all.push((name.to_vec(), v)),
        }
        self.put_xattrs(&mut z, &all)?;
        z.ctime = now_ns();
        self.store(obj, &z)
    }

    /// Write `all` as `z`'s extended attributes (the caller holds the txg
    /// and the object's lock, and stores `z`): a fresh object sized for
    /// the list, or none for an empty one.
    fn put_xattrs(&self, z: &mut Znode, all: &[(Vec<u8>, Vec<u8>)]) -> ZResult<()> {
        let b = encode_xattrs(all);
        if b.len() > XATTR_TOTAL_MAX {
            return Err(libc::ENOSPC);
        }
        if z.xattr != 0 {
            let _ = self.os.free_object(z.xattr);
            z.xattr = 0;
        }
        if all.is_empty() {
            return Ok(());
        }
        z.xattr = io(self.os.create_object(ot::XATTR, 512, &ObjProps::METADATA))?;
        let bs = if b.len() <= 128 << 10 {
            (b.len().max(1) as u32).div_ceil(512) * 512
        } else {
            128 << 10
        };
        io(self.os.grow_blocksize(z.xattr, bs))?;
        io(self.os.write(z.xattr, 0, &b))?;
        io(self.os.set_size(z.xattr, b.len() as u64))?;
        Ok(())
    }
}

fn encode_xattrs(all: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in all {
        b.push(n.len() as u8);
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        b.extend_from_slice(n);
        b.extend_from_slice(v);
    }
    b
}

fn decode_xattrs(b: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let nl = *b.get(at)? as usize;
        let vl = u32::from_le_bytes(b.get(at + 1..at + 5)?.try_into().ok()?) as usize;
        let n = b.get(at + 5..at + 5 + nl)?;
        let v = b.get(at + 5 + nl..at + 5 + nl + vl)?;
        out.push((n.to_vec(), v.to_vec()));
        at += 5 + nl + vl;
    }
    Some(out)
}
