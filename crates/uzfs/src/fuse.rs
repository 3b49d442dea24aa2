//! The FUSE front end: one session per mounted dataset, translating kernel
//! requests into [`Zpl`] calls.
//!
//! Kernel features used (and why they are safe here): the daemon is the only
//! writer of its datasets, so attributes and entries may be cached (1 s);
//! the writeback cache lets the kernel merge small writes into pages and
//! send them in large requests (up to 1 MiB, `max_write`); several request
//! threads, each with its own cloned /dev/fuse descriptor; parallel
//! directory operations (the ZPL serializes namespace changes itself);
//! `default_permissions`, so the kernel checks modes, ownership, the sticky
//! bit and setattr rights exactly as for a local filesystem.

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uzfs_core::zpl::fs::ZResult;
use uzfs_core::zpl::{Attr, SetAttr, Zpl};

const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

pub struct FuseFs {
    pub zpl: Arc<Zpl>,
}

fn ts(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn dt_kind(dt: u8) -> FileType {
    kind((dt as u32) << 12)
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

/// Answer a request that returns nothing but success or an errno.
fn done(reply: ReplyEmpty, r: ZResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

/// Requests served, by kind, for every mount of this daemon
/// (`UZFS_FUSE_STATS=1` logs them at each unmount): how many round trips a
/// workload costs is the first question when tuning a FUSE filesystem.
static OPS: [AtomicU64; 15] = [const { AtomicU64::new(0) }; 15];
const OP_NAMES: [&str; 15] = [
    "lookup", "getattr", "setattr", "mknod", "mkdir", "unlink", "rmdir", "create", "open", "read",
    "write", "release", "fsync", "readdir", "getxattr",
];

fn op_counts() -> String {
    OP_NAMES
        .iter()
        .zip(OPS.iter())
        .map(|(n, c)| format!("{n}={} ", c.load(Ordering::Relaxed)))
        .collect()
}

fn count(i: usize) {
    OPS[i].fetch_add(1, Ordering::Relaxed);
}

impl FuseFs {
    fn obj(&self, ino: INodeNo) -> u64 {
        if ino.0 == ROOT {
            self.zpl.root
        } else {
            ino.0
        }
    }

    fn ino(&self, obj: u64) -> INodeNo {
        INodeNo(if obj == self.zpl.root { ROOT } else { obj })
    }

    fn fattr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.ino(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: ts(a.z.atime),
            mtime: ts(a.z.mtime),
            ctime: ts(a.z.ctime),
            crtime: ts(a.z.crtime),
            kind: kind(a.z.mode),
            perm: (a.z.mode & 0o7777) as u16,
            nlink: a.z.nlink,
            uid: a.z.uid,
            gid: a.z.gid,
            rdev: a.z.rdev as u32,
            blksize: a.blksize,
            flags: 0,
        }
    }

    /// Create any kind of node in `parent`, owned by the caller.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> ZResult<Attr> {
        self.zpl.mknod(
            self.obj(parent),
            name.as_bytes(),
            mode,
            rdev,
            req.uid(),
            req.gid(),
            target,
        )
    }

    fn entry(&self, r: ZResult<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &self.fattr(&a), Generation(a.z.gen)),
            Err(e) => reply.error(err(e)),
        }
    }
}

fn time_ns(t: Option<TimeOrNow>) -> Option<i64> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(s) => ns_of(s),
        TimeOrNow::Now => uzfs_core::zpl::fs::now_ns(),
    })
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(config);
        Ok(())
    }

    fn destroy(&mut self) {
        if std::env::var_os("UZFS_FUSE_STATS").is_some() {
            eprintln!("uzfsd: fuse requests: {}", op_counts());
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        count(0);
        self.entry(self.zpl.lookup(self.obj(parent), name.as_bytes()), reply)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        count(1);
        match self.zpl.getattr(self.obj(ino)) {
            Ok(a) => reply.attr(&TTL, &self.fattr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        count(2);
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_ns(atime),
            mtime: time_ns(mtime),
            // What the kernel does itself without HANDLE_KILLPRIV_V2: a
            // change of owner, or a truncate by anyone but root, drops the
            // set-id bits (an explicit new mode wins).
            kill_suid: mode.is_none()
                && (uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0)),
        };
        match self.zpl.setattr(self.obj(ino), &a) {
            Ok(a) => reply.attr(&TTL, &self.fattr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.zpl.readlink(self.obj(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        count(3);
        let r = self.make(
            req,
            parent,
            name,
            mode & !(umask & 0o777),
            rdev as u64,
            None,
        );
        self.entry(r, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        count(4);
        let r = self.make(
            req,
            parent,
            name,
            libc::S_IFDIR | (mode & !umask & 0o7777),
            0,
            None,
        );
        self.entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        count(5);
        done(reply, self.zpl.unlink(self.obj(parent), name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        count(6);
        done(reply, self.zpl.rmdir(self.obj(parent), name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.make(
            req,
            parent,
            link_name,
            libc::S_IFLNK | 0o777,
            0,
            Some(target.as_os_str().as_bytes()),
        );
        self.entry(r, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        done(
            reply,
            self.zpl.rename(
                self.obj(parent),
                name.as_bytes(),
                self.obj(newparent),
                newname.as_bytes(),
                flags.bits(),
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self
            .zpl
            .link(self.obj(ino), self.obj(newparent), newname.as_bytes());
        self.entry(r, reply)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        count(8);
        match self.zpl.open(self.obj(ino)) {
            // Keep the page cache across opens: every change to a file
            // comes through this mount, so cached pages are never stale.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        count(9);
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUF.with(|b| {
            let mut b = b.borrow_mut();
            match self
                .zpl
                .read_into(self.obj(ino), offset, size as usize, &mut b)
            {
                Ok(()) => reply.data(&b),
                Err(e) => reply.error(err(e)),
            }
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        count(10);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.zpl.write_kill(self.obj(ino), offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do at close (data reaches the DMU on each write); the
        // kernel stops sending FLUSH after ENOSYS, saving a round trip per
        // close. Dirty pages are still written back before close returns.
        reply.error(Errno::ENOSYS)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        count(11);
        done(reply, self.zpl.release(self.obj(ino)));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        count(12);
        done(reply, self.zpl.fsync(self.obj(ino)));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        count(13);
        match self.zpl.readdir(self.obj(ino), offset, 256) {
            Ok(entries) => {
                for (next, obj, dt, name) in entries {
                    if reply.add(self.ino(obj), next, dt_kind(dt), OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(reply, self.zpl.fsync(self.obj(ino)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (total, avail, files, ffree) = self.zpl.statfs();
        let bs = 4096u64;
        reply.statfs(
            total / bs,
            avail / bs,
            avail / bs,
            files + ffree,
            ffree,
            bs as u32,
            255,
            bs as u32,
        )
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self
            .zpl
            .setxattr(self.obj(ino), name.as_bytes(), Some(value), flags);
        done(reply, r)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        count(14);
        match self.zpl.getxattr(self.obj(ino), name.as_bytes()) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(err(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.zpl.listxattr(self.obj(ino)) {
            Ok(names) => {
                let mut b = Vec::new();
                for n in names {
                    b.extend_from_slice(&n);
                    b.push(0);
                }
                if size == 0 {
                    reply.size(b.len() as u32)
                } else if b.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&b)
                }
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(
            reply,
            self.zpl.setxattr(self.obj(ino), name.as_bytes(), None, 0),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        count(7);
        let r = self.make(
            req,
            parent,
            name,
            libc::S_IFREG | (mode & !umask & 0o7777),
            0,
            None,
        );
        match r.and_then(|a| self.zpl.open(a.ino).map(|_| a)) {
            Ok(a) => reply.created(
                &TTL,
                &self.fattr(&a),
                Generation(a.z.gen),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        done(
            reply,
            self.zpl.fallocate(self.obj(ino), mode, offset, length),
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let r = match whence {
            libc::SEEK_DATA | libc::SEEK_HOLE if offset >= 0 => {
                self.zpl
                    .seek_data(self.obj(ino), offset as u64, whence == libc::SEEK_DATA)
            }
            _ => Err(libc::EINVAL),
        };
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(err(e)),
        }
    }
}

/// The kernel features every uzfs mount asks for (and the FUSE floor, see
/// `fuse_floor.rs`, so that it measures the same transport).
pub fn negotiate(config: &mut KernelConfig) {
    // HANDLE_KILLPRIV_V2: clearing set-id bits on write, truncate and
    // chown is ours to do (below), which spares the kernel a
    // `security.capability` GETXATTR round trip on every write(2).
    let mut want = InitFlags::FUSE_HANDLE_KILLPRIV_V2
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_ASYNC_READ
        | InitFlags::FUSE_BIG_WRITES
        | InitFlags::FUSE_MAX_PAGES;
    if std::env::var("UZFS_FUSE_WRITEBACK").map_or(true, |v| v != "0") {
        want |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    // One at a time: fuser adds none of a set if the kernel lacks one.
    for flag in want.iter() {
        if config.add_capabilities(flag).is_err() && std::env::var_os("UZFS_FUSE_STATS").is_some() {
            eprintln!("uzfsd: kernel lacks FUSE capability {flag:?}");
        }
    }
    let _ = config.set_max_write(1 << 20);
    let _ = config.set_max_readahead(1 << 20);
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
}

/// Session settings of every uzfs mount: options, request threads, cloned
/// descriptors.
pub fn session_config(fsname: &str, readonly: bool) -> Config {
    let mut opts = vec![
        MountOption::FSName(fsname.to_string()),
        MountOption::Subtype("uzfs".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    if readonly {
        opts.push(MountOption::RO);
    }
    let mut config = Config::default();
    config.mount_options = opts;
    config.acl = SessionACL::All;
    config.n_threads = Some(fuse_threads());
    config.clone_fd = true;
    config
}

/// Mount `zpl` at `mountpoint`; returns the running session (dropping it
/// unmounts).
pub fn mount(
    zpl: Arc<Zpl>,
    mountpoint: &Path,
    fsname: &str,
    readonly: bool,
) -> std::io::Result<fuser::BackgroundSession> {
    std::fs::create_dir_all(mountpoint)?;
    let config = session_config(fsname, readonly);
    let session = fuser::Session::new(FuseFs { zpl }, mountpoint, &config)?;
    session.spawn()
}

fn fuse_threads() -> usize {
    std::env::var("UZFS_FUSE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .clamp(1, 64)
}
