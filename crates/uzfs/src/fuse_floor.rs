//! The FUSE floor (`uzfs fuse-floor MOUNTPOINT`, for benchmarks): an
//! in-memory filesystem that answers the requests the small-file create
//! benchmark sends (LOOKUP, GETATTR, CREATE, GETXATTR, WRITE, SETATTR,
//! MKDIR, RELEASE) with no storage work at all, mounted with the same
//! session settings and kernel features as a uzfs dataset (`fuse.rs`
//! `session_config` and `negotiate`). Its score is the cost of the FUSE
//! round trips themselves on the machine: no filesystem served through
//! /dev/fuse with these features creates files faster. `bench/fs.sh` runs
//! it beside uzfs. It serves until stdin closes or the mount goes away.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyEmpty, ReplyEntry, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

const TTL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Tree {
    names: HashMap<(u64, OsString), u64>,
    attrs: HashMap<u64, FileAttr>,
    next: u64,
}

struct Floor(Mutex<Tree>);

fn attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Floor {
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        perm: u16,
    ) -> Result<FileAttr, Errno> {
        let mut t = self.0.lock().map_err(|_| Errno::EIO)?;
        let key = (parent.0, name.to_os_string());
        if t.names.contains_key(&key) {
            return Err(Errno::EEXIST);
        }
        t.next += 1;
        let ino = t.next;
        let a = attr(ino, kind, perm, req.uid(), req.gid());
        t.names.insert(key, ino);
        t.attrs.insert(ino, a);
        Ok(a)
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        crate::fuse::negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = match self.0.lock() {
            Ok(t) => t,
            Err(_) => return reply.error(Errno::EIO),
        };
        match t
            .names
            .get(&(parent.0, name.to_os_string()))
            .and_then(|i| t.attrs.get(i))
        {
            Some(a) => reply.entry(&TTL, a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .0
            .lock()
            .ok()
            .and_then(|t| t.attrs.get(&ino.0).copied())
        {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = match self.0.lock() {
            Ok(t) => t,
            Err(_) => return reply.error(Errno::EIO),
        };
        match t.attrs.get_mut(&ino.0) {
            Some(a) => {
                if let Some(s) = size {
                    a.size = s;
                }
                reply.attr(&TTL, a)
            }
            None => reply.error(Errno::ENOENT),
        }
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
        match self.make(
            req,
            parent,
            name,
            FileType::Directory,
            (mode & !umask & 0o7777) as u16,
        ) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
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
        match self.make(
            req,
            parent,
            name,
            FileType::RegularFile,
            (mode & !umask & 0o7777) as u16,
        ) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Ok(mut t) = self.0.lock() {
            if let Some(a) = t.attrs.get_mut(&ino.0) {
                a.size = a.size.max(offset + data.len() as u64);
            }
        }
        reply.written(data.len() as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA)
    }
}

/// Mount the floor at `mnt` and serve until stdin closes.
pub fn run(mnt: &Path) -> i32 {
    let mut tree = Tree {
        next: 1,
        ..Default::default()
    };
    tree.attrs
        .insert(1, attr(1, FileType::Directory, 0o755, 0, 0));
    let config = crate::fuse::session_config("fuse_floor", false);
    let session = match fuser::Session::new(Floor(Mutex::new(tree)), mnt, &config) {
        Ok(s) => s,
        Err(e) => {
            crate::err(&format!("uzfs fuse-floor: mount {}: {e}\n", mnt.display()));
            return 1;
        }
    };
    let bg = match session.spawn() {
        Ok(b) => b,
        Err(e) => {
            crate::err(&format!("uzfs fuse-floor: {e}\n"));
            return 1;
        }
    };
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    drop(bg);
    0
}
