//! The FUSE wire protocol (`include/uapi/linux/fuse.h`), decoded and encoded
//! by hand so that one request parser serves both transports: `read(2)` on
//! /dev/fuse and FUSE over io_uring (see `session.rs`).
//!
//! A request is three byte strings:
//!
//! ```text
//!   in header (40 bytes)   len opcode unique nodeid uid gid pid extlen pad
//!   op header              the opcode's fixed struct (fuse_write_in, ...), maybe empty
//!   payload                names (NUL-terminated), xattr values, write data
//! ```
//!
//! On /dev/fuse they arrive back to back in one read; over io_uring the
//! kernel puts the in header and the op header in the ring entry's header
//! buffer and the rest in its payload buffer. [`op_header_len`] says where
//! to cut the former so that [`parse`] sees the same three pieces either way.
//!
//! A reply is a 16-byte out header (len, -errno, unique) and a payload that
//! the `put_*` functions below lay out. Everything is little-endian and
//! every read is bounds-checked: a malformed request is an EINVAL reply,
//! never a panic.

pub const IN_HEADER_LEN: usize = 40;
pub const OUT_HEADER_LEN: usize = 16;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const SETXATTR: u32 = 21;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const REMOVEXATTR: u32 = 24;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const CREATE: u32 = 35;
pub const INTERRUPT: u32 = 36;
/// The kernel's answer to a FUSE_NOTIFY_RETRIEVE: pages it holds.
pub const NOTIFY_REPLY: u32 = 41;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;
pub const LSEEK: u32 = 46;

/// `fuse_setattr_in.valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;
/// `fuse_write_in.write_flags`: a delayed write from the page cache
/// (writeback), not a write(2) the application waits on.
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: the writer is not privileged to keep set-id bits.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_open_out.open_flags`: keep the page cache across opens.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// `fuse_open_out.open_flags`: reads and writes bypass the page cache
/// (each write(2) reaches the daemon before it returns).
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// `FOPEN_CACHE_DIR`: the kernel may keep this directory's listing
/// (invalidated by its own changes to it, and by INVAL_INODE).
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;

/// The opcode's name, for statistics.
pub fn name(opcode: u32) -> String {
    let n = match opcode {
        LOOKUP => "lookup",
        FORGET => "forget",
        GETATTR => "getattr",
        SETATTR => "setattr",
        READLINK => "readlink",
        SYMLINK => "symlink",
        MKNOD => "mknod",
        MKDIR => "mkdir",
        UNLINK => "unlink",
        RMDIR => "rmdir",
        RENAME => "rename",
        LINK => "link",
        OPEN => "open",
        READ => "read",
        WRITE => "write",
        STATFS => "statfs",
        RELEASE => "release",
        FSYNC => "fsync",
        SETXATTR => "setxattr",
        GETXATTR => "getxattr",
        LISTXATTR => "listxattr",
        REMOVEXATTR => "removexattr",
        FLUSH => "flush",
        OPENDIR => "opendir",
        READDIR => "readdir",
        READDIRPLUS => "readdirplus",
        RELEASEDIR => "releasedir",
        FSYNCDIR => "fsyncdir",
        ACCESS => "access",
        CREATE => "create",
        INTERRUPT => "interrupt",
        NOTIFY_REPLY => "notify_reply",
        BATCH_FORGET => "batch_forget",
        FALLOCATE => "fallocate",
        RENAME2 => "rename2",
        LSEEK => "lseek",
        other => return format!("op{other}"),
    };
    n.to_string()
}

/// Requests the kernel expects no reply to.
pub fn is_one_way(opcode: u32) -> bool {
    matches!(opcode, FORGET | BATCH_FORGET | INTERRUPT)
}

/// Whether the kernel granted FUSE_SETXATTR_EXT (`fuse::negotiate` asks
/// every mount for it, so it is the same for all sessions of a process):
/// SETXATTR then carries `setxattr_flags`, and its header is 16 bytes.
pub static SETXATTR_EXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the kernel offered FUSE_NO_OPENDIR_SUPPORT: an OPENDIR
/// answered ENOSYS opens that directory and every later one without a
/// round trip, with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, and no
/// RELEASEDIR at close (`fuse_do_open`).
pub static NO_OPENDIR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// In `setxattr_flags`: the caller may not keep the set-group-ID bit when
/// setting an access ACL.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1;

/// Size of the fixed struct that precedes the payload of `opcode`, as the
/// kernel sends it at protocol 7.40 without the security-context extension
/// (not negotiated).
pub fn op_header_len(opcode: u32) -> usize {
    match opcode {
        SETXATTR if SETXATTR_EXT.load(std::sync::atomic::Ordering::Relaxed) => 16,
        FORGET | MKDIR | RENAME | LINK | OPEN | OPENDIR | SETXATTR | GETXATTR | LISTXATTR
        | ACCESS | INTERRUPT | BATCH_FORGET => 8,
        GETATTR | MKNOD | CREATE | FSYNC | FSYNCDIR | RENAME2 => 16,
        RELEASE | RELEASEDIR | FLUSH | LSEEK => 24,
        FALLOCATE => 32,
        READ | READDIR | READDIRPLUS | WRITE => 40,
        SETATTR => 88,
        INIT => 64,
        _ => 0,
    }
}

/// Bounds-checked little-endian reads at fixed offsets (requests, and the
/// io_uring entry header in `session.rs`).
pub struct Rd<'a>(pub &'a [u8]);

impl Rd<'_> {
    pub fn u32(&self, at: usize) -> Option<u32> {
        let b = self.0.get(at..at + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    pub fn u64(&self, at: usize) -> Option<u64> {
        let b = self.0.get(at..at + 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        if b.len() < IN_HEADER_LEN {
            return None;
        }
        let r = Rd(b);
        Some(InHeader {
            opcode: r.u32(4)?,
            unique: r.u64(8)?,
            nodeid: r.u64(16)?,
            uid: r.u32(24)?,
            gid: r.u32(28)?,
        })
    }
}

/// `fuse_setattr_in`, the fields uzfs uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetattrIn {
    pub valid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A decoded request; names and data borrow from the request buffers.
#[derive(Debug)]
pub enum Op<'a> {
    Lookup {
        name: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        /// open(2)'s flags (`O_ACCMODE`, `O_TRUNC`, ...).
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
        /// The file's open flags (`O_DIRECT`: the kernel caches nothing).
        flags: u32,
    },
    Write {
        offset: u64,
        write_flags: u32,
        /// The file's open flags (`O_DIRECT`: the kernel caches nothing).
        flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release {
        /// The open(2) flags the file was opened with.
        flags: u32,
    },
    Fsync,
    Setxattr {
        flags: u32,
        /// `SETXATTR_ACL_KILL_SGID` (0 without SETXATTR_EXT).
        setxattr_flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush,
    Opendir,
    /// READDIR, or READDIRPLUS (`plus`): each entry with its attributes,
    /// as if looked up (`Out::direntplus`).
    Readdir {
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir,
    Fsyncdir,
    Create {
        /// open(2)'s flags.
        flags: u32,
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    /// FORGET, BATCH_FORGET, INTERRUPT: nothing to do, no reply. uzfs keeps
    /// no per-lookup state (inode numbers are object numbers).
    OneWay,
    /// Anything else (locks, ioctl, poll, copy_file_range, ...): ENOSYS, so
    /// the kernel stops asking or does it itself.
    Unsupported,
}

impl Op<'_> {
    /// Whether the request changes the filesystem (what `sync=always`
    /// commits before answering).
    pub fn is_change(&self) -> bool {
        matches!(
            self,
            Op::Setattr(_)
                | Op::Symlink { .. }
                | Op::Mknod { .. }
                | Op::Mkdir { .. }
                | Op::Unlink { .. }
                | Op::Rmdir { .. }
                | Op::Rename { .. }
                | Op::Link { .. }
                | Op::Write { .. }
                | Op::Setxattr { .. }
                | Op::Removexattr { .. }
                | Op::Create { .. }
                | Op::Fallocate { .. }
        )
    }
}

/// A NUL-terminated string at the front of `b`, and what follows it.
fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = b.iter().position(|&c| c == 0)?;
    Some((&b[..n], &b[n + 1..]))
}

fn name_only(b: &[u8]) -> Option<&[u8]> {
    cstr(b).map(|(n, _)| n)
}

/// Decode `opcode` from its op header `h` and `payload`. `None`: the
/// request is malformed (too short, a name without its NUL).
pub fn parse<'a>(opcode: u32, h: &[u8], payload: &'a [u8]) -> Option<Op<'a>> {
    let r = Rd(h);
    Some(match opcode {
        LOOKUP => Op::Lookup {
            name: name_only(payload)?,
        },
        GETATTR => Op::Getattr,
        SETATTR => Op::Setattr(SetattrIn {
            valid: r.u32(0)?,
            size: r.u64(16)?,
            atime: r.u64(32)? as i64,
            mtime: r.u64(40)? as i64,
            atimensec: r.u32(56)?,
            mtimensec: r.u32(60)?,
            mode: r.u32(68)?,
            uid: r.u32(76)?,
            gid: r.u32(80)?,
        }),
        READLINK => Op::Readlink,
        SYMLINK => {
            let (name, rest) = cstr(payload)?;
            Op::Symlink {
                name,
                target: name_only(rest)?,
            }
        }
        MKNOD => Op::Mknod {
            mode: r.u32(0)?,
            rdev: r.u32(4)?,
            umask: r.u32(8)?,
            name: name_only(payload)?,
        },
        MKDIR => Op::Mkdir {
            mode: r.u32(0)?,
            umask: r.u32(4)?,
            name: name_only(payload)?,
        },
        UNLINK => Op::Unlink {
            name: name_only(payload)?,
        },
        RMDIR => Op::Rmdir {
            name: name_only(payload)?,
        },
        RENAME | RENAME2 => {
            let (name, rest) = cstr(payload)?;
            Op::Rename {
                newdir: r.u64(0)?,
                flags: if opcode == RENAME2 { r.u32(8)? } else { 0 },
                name,
                newname: name_only(rest)?,
            }
        }
        LINK => Op::Link {
            oldnodeid: r.u64(0)?,
            newname: name_only(payload)?,
        },
        OPEN => Op::Open { flags: r.u32(0)? },
        READ => Op::Read {
            offset: r.u64(8)?,
            size: r.u32(16)?,
            // fuse_read_in.flags (protocol 7.9 and later).
            flags: r.u32(32).unwrap_or(0),
        },
        WRITE => {
            let size = r.u32(16)? as usize;
            Op::Write {
                offset: r.u64(8)?,
                write_flags: r.u32(20)?,
                // fuse_write_in.flags (protocol 7.9 and later).
                flags: r.u32(32).unwrap_or(0),
                data: payload.get(..size)?,
            }
        }
        STATFS => Op::Statfs,
        RELEASE => Op::Release { flags: r.u32(8)? },
        FSYNC => Op::Fsync,
        SETXATTR => {
            let size = r.u32(0)? as usize;
            let (name, rest) = cstr(payload)?;
            Op::Setxattr {
                flags: r.u32(4)?,
                setxattr_flags: if h.len() >= 16 { r.u32(8)? } else { 0 },
                name,
                value: rest.get(..size)?,
            }
        }
        GETXATTR => Op::Getxattr {
            size: r.u32(0)?,
            name: name_only(payload)?,
        },
        LISTXATTR => Op::Listxattr { size: r.u32(0)? },
        REMOVEXATTR => Op::Removexattr {
            name: name_only(payload)?,
        },
        FLUSH => Op::Flush,
        OPENDIR => Op::Opendir,
        READDIR | READDIRPLUS => Op::Readdir {
            offset: r.u64(8)?,
            size: r.u32(16)?,
            plus: opcode == READDIRPLUS,
        },
        RELEASEDIR => Op::Releasedir,
        FSYNCDIR => Op::Fsyncdir,
        CREATE => Op::Create {
            flags: r.u32(0)?,
            mode: r.u32(4)?,
            umask: r.u32(8)?,
            name: name_only(payload)?,
        },
        FALLOCATE => Op::Fallocate {
            offset: r.u64(8)?,
            length: r.u64(16)?,
            mode: r.u32(24)?,
        },
        LSEEK => Op::Lseek {
            offset: r.u64(8)?,
            whence: r.u32(16)?,
        },
        FORGET | BATCH_FORGET | INTERRUPT => Op::OneWay,
        _ => Op::Unsupported,
    })
}

/// Attributes as `struct fuse_attr` carries them.
#[derive(Clone, Copy, Debug, Default)]
pub struct FAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// Nanoseconds since the epoch (negative: before it).
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// The reply payload under construction: a cursor over a buffer the
/// transport owns (an io_uring payload buffer or a /dev/fuse write buffer).
pub struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Out<'a> {
    pub fn new(buf: &'a mut [u8]) -> Out<'a> {
        Out { buf, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Room left.
    pub fn room(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Append `b`; false (and nothing written) if it does not fit.
    pub fn put(&mut self, b: &[u8]) -> bool {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.len += b.len();
                true
            }
            None => false,
        }
    }

    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// `struct fuse_attr` (88 bytes).
    fn attr(&mut self, a: &FAttr) {
        let split = |ns: i64| {
            (
                ns.div_euclid(1_000_000_000) as u64,
                ns.rem_euclid(1_000_000_000) as u32,
            )
        };
        let (at, atn) = split(a.atime);
        let (mt, mtn) = split(a.mtime);
        let (ct, ctn) = split(a.ctime);
        for v in [a.ino, a.size, a.blocks, at, mt, ct] {
            self.u64(v);
        }
        for v in [
            atn, mtn, ctn, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0,
        ] {
            self.u32(v);
        }
    }

    /// `fuse_entry_out`: the answer to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
    pub fn entry(&mut self, a: &FAttr, generation: u64, ttl: Ttl) {
        self.u64(a.ino);
        self.u64(generation);
        self.u64(ttl.entry);
        self.u64(ttl.attr);
        self.u32(0);
        self.u32(0);
        self.attr(a);
    }

    /// `fuse_attr_out`: the answer to GETATTR and SETATTR.
    pub fn attr_out(&mut self, a: &FAttr, ttl_secs: u64) {
        self.u64(ttl_secs);
        self.u32(0);
        self.u32(0);
        self.attr(a);
    }

    /// `fuse_open_out`: OPEN, OPENDIR, and the second half of CREATE.
    pub fn open(&mut self, fh: u64, open_flags: u32) {
        self.u64(fh);
        self.u32(open_flags);
        self.u32(0);
    }

    /// `fuse_write_out`.
    pub fn written(&mut self, n: u32) {
        self.u32(n);
        self.u32(0);
    }

    /// `fuse_getxattr_out`: the size a GETXATTR/LISTXATTR with size 0 asks for.
    pub fn xattr_size(&mut self, n: u32) {
        self.u32(n);
        self.u32(0);
    }

    /// `fuse_lseek_out`.
    pub fn offset(&mut self, off: u64) {
        self.u64(off);
    }

    /// `fuse_statfs_out` (`struct fuse_kstatfs`, 80 bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        &mut self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        for v in [blocks, bfree, bavail, files, ffree] {
            self.u64(v);
        }
        for v in [bsize, namelen, frsize, 0, 0, 0, 0, 0, 0, 0] {
            self.u32(v);
        }
    }

    /// One `fuse_dirent` (padded to 8 bytes); false if it does not fit in
    /// `limit` bytes of reply (the READDIR size), and nothing is written.
    pub fn dirent(&mut self, limit: usize, ino: u64, next: u64, dtype: u32, name: &[u8]) -> bool {
        let len = 24 + name.len();
        let padded = (len + 7) & !7;
        if self.len + padded > limit.min(self.buf.len()) {
            return false;
        }
        self.u64(ino);
        self.u64(next);
        self.u32(name.len() as u32);
        self.u32(dtype);
        self.put(name);
        self.put(&[0u8; 8][..padded - len]);
        true
    }

    /// One `fuse_direntplus`: a `fuse_entry_out` (the entry's attributes,
    /// as LOOKUP would answer, or all zero for an entry the kernel should
    /// look up itself: node id 0) and then the `fuse_dirent`; false, and
    /// nothing written, if it does not fit in `limit` bytes. `ino` is the
    /// inode number readdir(3) reports either way.
    #[allow(clippy::too_many_arguments)]
    pub fn direntplus(
        &mut self,
        limit: usize,
        ino: u64,
        entry: Option<(&FAttr, u64)>,
        ttl: Ttl,
        next: u64,
        dtype: u32,
        name: &[u8],
    ) -> bool {
        let padded = (24 + name.len() + 7) & !7;
        if self.len + ENTRY_OUT_LEN + padded > limit.min(self.buf.len()) {
            return false;
        }
        match entry {
            Some((a, generation)) => self.entry(a, generation, ttl),
            None => {
                self.put(&[0u8; ENTRY_OUT_LEN]);
            }
        }
        self.dirent(limit, ino, next, dtype, name)
    }
}

/// How long (seconds) the kernel may keep a name's lookup (`entry`) and
/// the file's attributes (`attr`) without asking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl {
    pub entry: u64,
    pub attr: u64,
}

impl Ttl {
    pub fn both(secs: u64) -> Ttl {
        Ttl {
            entry: secs,
            attr: secs,
        }
    }
}

/// `sizeof(struct fuse_entry_out)`: 40 bytes of ids and timeouts and the
/// 88-byte `fuse_attr`.
pub const ENTRY_OUT_LEN: usize = 128;

/// `fuse_notify_code`: drop an inode's cached attributes (and pages).
pub const NOTIFY_INVAL_INODE: i32 = 2;

/// A FUSE_NOTIFY_INVAL_INODE message for `ino` that drops its cached
/// attributes only (offset -1: no pages, so it cannot wait on a page the
/// kernel holds locked while it waits for our reply to a WRITE).
pub fn notify_inval_attr(ino: u64) -> [u8; OUT_HEADER_LEN + 24] {
    let mut m = [0u8; OUT_HEADER_LEN + 24];
    out_header(&mut m, (OUT_HEADER_LEN + 24) as u32, NOTIFY_INVAL_INODE, 0);
    m[16..24].copy_from_slice(&ino.to_le_bytes());
    m[24..32].copy_from_slice(&(-1i64).to_le_bytes());
    m[32..40].copy_from_slice(&0i64.to_le_bytes());
    m
}

/// `fuse_notify_code`: put bytes into a file's page cache.
pub const NOTIFY_STORE: i32 = 4;

/// The head of a FUSE_NOTIFY_STORE message (its `fuse_notify_store_out`),
/// to be followed by the `size` bytes of node `ino` from `offset`. The
/// kernel copies them over whatever pages it holds there and grows its
/// idea of the file's size to `offset + size`.
pub fn notify_store_head(ino: u64, offset: u64, size: u32) -> [u8; OUT_HEADER_LEN + 24] {
    let mut m = [0u8; OUT_HEADER_LEN + 24];
    out_header(&mut m, OUT_HEADER_LEN as u32 + 24 + size, NOTIFY_STORE, 0);
    m[16..24].copy_from_slice(&ino.to_le_bytes());
    m[24..32].copy_from_slice(&offset.to_le_bytes());
    m[32..36].copy_from_slice(&size.to_le_bytes());
    m
}

/// `fuse_notify_code`: send back the file pages the kernel holds.
pub const NOTIFY_RETRIEVE: i32 = 5;

/// A FUSE_NOTIFY_RETRIEVE message: the kernel answers with a
/// FUSE_NOTIFY_REPLY request (header `unique` = `unique`) carrying the
/// pages of `ino` it holds up to date from `offset`, at most `size` bytes,
/// stopping at the first page it does not hold.
pub fn notify_retrieve(unique: u64, ino: u64, offset: u64, size: u32) -> [u8; OUT_HEADER_LEN + 32] {
    let mut m = [0u8; OUT_HEADER_LEN + 32];
    out_header(&mut m, (OUT_HEADER_LEN + 32) as u32, NOTIFY_RETRIEVE, 0);
    m[16..24].copy_from_slice(&unique.to_le_bytes());
    m[24..32].copy_from_slice(&ino.to_le_bytes());
    m[32..40].copy_from_slice(&offset.to_le_bytes());
    m[40..44].copy_from_slice(&size.to_le_bytes());
    m
}

/// `sizeof(struct fuse_notify_retrieve_in)`, ahead of a NOTIFY_REPLY's data.
pub const RETRIEVE_IN_LEN: usize = 40;

/// A NOTIFY_REPLY's body (its `fuse_notify_retrieve_in`, then the bytes):
/// (offset, the bytes). Kernels since 6.14 send the struct after a
/// zero-length first argument, so it is at the start of the body on
/// either transport.
pub fn retrieved(body: &[u8]) -> Option<(u64, &[u8])> {
    let r = Rd(body);
    let offset = r.u64(8)?;
    let size = r.u32(16)? as usize;
    let data = body.get(RETRIEVE_IN_LEN..RETRIEVE_IN_LEN + size)?;
    Some((offset, data))
}

/// A FUSE_NOTIFY_INVAL_INODE message for `ino` that drops its cached
/// attributes and every cached page (a dirty page is written back
/// first). Never from a request thread: the writeback waits for a reply.
pub fn notify_inval_inode(ino: u64) -> [u8; OUT_HEADER_LEN + 24] {
    let mut m = notify_inval_attr(ino);
    m[24..32].copy_from_slice(&0i64.to_le_bytes());
    m
}

/// `fuse_notify_code`: a cached name lookup is no longer valid.
pub const NOTIFY_INVAL_ENTRY: i32 = 3;
/// `fuse_notify_inval_entry_out.flags`: expire the name (the next walk
/// asks again) instead of unhashing it, which would detach a filesystem
/// mounted on it (kernels before 6.2 ignore the flag and unhash).
pub const FUSE_EXPIRE_ONLY: u32 = 1;

/// A FUSE_NOTIFY_INVAL_ENTRY message: the kernel's cached lookup of
/// `name` in directory `parent` expires.
pub fn notify_inval_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let len = OUT_HEADER_LEN + 16 + name.len() + 1;
    let mut m = vec![0u8; len];
    out_header(&mut m, len as u32, NOTIFY_INVAL_ENTRY, 0);
    m[16..24].copy_from_slice(&parent.to_le_bytes());
    m[24..28].copy_from_slice(&(name.len() as u32).to_le_bytes());
    m[28..32].copy_from_slice(&FUSE_EXPIRE_ONLY.to_le_bytes());
    m[32..32 + name.len()].copy_from_slice(name);
    m
}

/// Write a `fuse_out_header` into `h` (16 bytes).
pub fn out_header(h: &mut [u8], len: u32, error: i32, unique: u64) {
    if let Some(h) = h.get_mut(..OUT_HEADER_LEN) {
        h[0..4].copy_from_slice(&len.to_le_bytes());
        h[4..8].copy_from_slice(&error.to_le_bytes());
        h[8..16].copy_from_slice(&unique.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NOTIFY_REPLY body comes from the kernel, but is checked like any
    /// input: short, truncated or overlong ones give nothing.
    #[test]
    fn retrieved_bodies_are_checked() {
        let mut body = vec![0u8; RETRIEVE_IN_LEN];
        body[8..16].copy_from_slice(&(128u64 << 10).to_le_bytes());
        body[16..20].copy_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(b"hello");
        assert_eq!(retrieved(&body), Some((128 << 10, &b"hello"[..])));
        // The data shorter than its size says, the struct cut short, none.
        assert_eq!(retrieved(&body[..body.len() - 1]), None);
        assert_eq!(retrieved(&body[..19]), None);
        assert_eq!(retrieved(&[]), None);
        // A size past anything a body can hold.
        body[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(retrieved(&body), None);
        // An empty answer (the kernel holds no page there) is an answer.
        body[16..20].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(retrieved(&body), Some((128 << 10, &b""[..])));
    }

    fn hdr(opcode: u32) -> Vec<u8> {
        let mut h = vec![0u8; IN_HEADER_LEN];
        h[4..8].copy_from_slice(&opcode.to_le_bytes());
        h[8..16].copy_from_slice(&7u64.to_le_bytes());
        h
    }

    /// READ and WRITE carry the file's open flags at byte 32
    /// (`fuse_read_in`/`fuse_write_in` since protocol 7.9), which decide
    /// whether the kernel caches what moves (`fuse/mod.rs`,
    /// `kernel_caches`). An op header from before 7.9 ends before them: no
    /// flags, not a refusal.
    #[test]
    fn read_and_write_carry_the_open_flags() {
        let o_direct = libc::O_DIRECT as u32;
        let mut h = vec![0u8; 40];
        h[16..20].copy_from_slice(&4u32.to_le_bytes());
        h[32..36].copy_from_slice(&o_direct.to_le_bytes());
        match parse(READ, &h, &[]) {
            Some(Op::Read { size: 4, flags, .. }) => assert_eq!(flags, o_direct),
            o => panic!("{o:?}"),
        }
        match parse(WRITE, &h, b"data") {
            Some(Op::Write { flags, data, .. }) => {
                assert_eq!((flags, data), (o_direct, &b"data"[..]))
            }
            o => panic!("{o:?}"),
        }
        for old in [&h[..24], &h[..32]] {
            match parse(READ, old, &[]) {
                Some(Op::Read {
                    size: 4, flags: 0, ..
                }) => {}
                o => panic!("{o:?}"),
            }
        }
        assert!(parse(READ, &h[..16], &[]).is_none(), "no size: refused");
    }

    #[test]
    fn requests_decode_and_malformed_ones_are_refused() {
        let h = InHeader::parse(&hdr(LOOKUP)).expect("header");
        assert_eq!((h.opcode, h.unique), (LOOKUP, 7));
        assert!(InHeader::parse(&[0u8; 39]).is_none());
        match parse(LOOKUP, &[], b"abc\0") {
            Some(Op::Lookup { name }) => assert_eq!(name, b"abc"),
            o => panic!("{o:?}"),
        }
        // A name without its NUL, a short op header, write data shorter
        // than announced: refused, not read past.
        assert!(parse(LOOKUP, &[], b"abc").is_none());
        assert!(parse(MKDIR, &[0u8; 4], b"d\0").is_none());
        let mut w = vec![0u8; 40];
        w[16..20].copy_from_slice(&10u32.to_le_bytes());
        assert!(parse(WRITE, &w, b"short").is_none());
        match parse(WRITE, &w, b"0123456789tail") {
            Some(Op::Write { data, .. }) => assert_eq!(data, b"0123456789"),
            o => panic!("{o:?}"),
        }
        let mut r2 = vec![0u8; 16];
        r2[0..8].copy_from_slice(&5u64.to_le_bytes());
        r2[8..12].copy_from_slice(&2u32.to_le_bytes());
        match parse(RENAME2, &r2, b"a\0b\0") {
            Some(Op::Rename {
                newdir: 5,
                flags: 2,
                name,
                newname,
            }) => assert_eq!((name, newname), (&b"a"[..], &b"b"[..])),
            o => panic!("{o:?}"),
        }
        assert!(matches!(parse(99, &[], &[]), Some(Op::Unsupported)));
        // Every op header length is within what io_uring's 128-byte op_in holds.
        for op in 0..64 {
            assert!(op_header_len(op) <= 128);
        }
    }

    #[test]
    fn replies_have_the_kernel_layouts() {
        let mut b = vec![0u8; 4096];
        let mut o = Out::new(&mut b);
        let a = FAttr {
            ino: 9,
            atime: -1,
            mode: 0o100644,
            ..Default::default()
        };
        o.entry(&a, 3, Ttl::both(1));
        assert_eq!(o.len(), 128);
        o.attr_out(&a, 1);
        assert_eq!(o.len(), 128 + 104);
        o.open(0, FOPEN_KEEP_CACHE);
        o.statfs(1, 2, 3, 4, 5, 4096, 255, 4096);
        assert_eq!(o.len(), 128 + 104 + 16 + 80);
        // A time before the epoch: seconds round down, nanoseconds positive.
        assert_eq!(&b[40 + 24..40 + 32], &u64::MAX.to_le_bytes());
        assert_eq!(&b[40 + 48..40 + 52], &999_999_999u32.to_le_bytes());
        let mut small = vec![0u8; 40];
        let mut o = Out::new(&mut small);
        assert!(o.dirent(40, 1, 1, 8, b"abcdefg"));
        assert!(!o.dirent(40, 2, 2, 8, b"x"), "does not fit in the limit");
        assert_eq!(o.len(), 32);
    }

    #[test]
    fn readdirplus_entries_have_the_kernel_layout() {
        let mut h = vec![0u8; 40];
        h[8..16].copy_from_slice(&5u64.to_le_bytes());
        h[16..20].copy_from_slice(&4096u32.to_le_bytes());
        match parse(READDIRPLUS, &h, &[]) {
            Some(Op::Readdir {
                offset: 5,
                size: 4096,
                plus: true,
            }) => {}
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            parse(READDIR, &h, &[]),
            Some(Op::Readdir { plus: false, .. })
        ));
        let a = FAttr {
            ino: 77,
            mode: 0o100644,
            ..Default::default()
        };
        let mut b = vec![0u8; 4096];
        let mut o = Out::new(&mut b);
        // fuse_entry_out (128) + fuse_dirent (24 + "file" padded to 32).
        assert!(o.direntplus(4096, 77, Some((&a, 3)), Ttl::both(1), 9, 8, b"file"));
        assert_eq!(o.len(), 160);
        // An entry the kernel must look up itself: node id 0, but the
        // dirent still carries the inode number readdir(3) shows.
        assert!(o.direntplus(4096, 1, None, Ttl::both(1), 10, 4, b"."));
        assert_eq!(o.len(), 160 + 128 + 32);
        assert!(!o.direntplus(400, 78, Some((&a, 3)), Ttl::both(1), 11, 8, b"x"));
        assert_eq!(o.len(), 320, "nothing written past the limit");
        let u64_at =
            |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        assert_eq!(u64_at(&b, 0), 77, "entry_out.nodeid");
        assert_eq!(u64_at(&b, 8), 3, "entry_out.generation");
        assert_eq!(u64_at(&b, 40), 77, "entry_out.attr.ino");
        assert_eq!(u64_at(&b, 128), 77, "dirent.ino");
        assert_eq!(u64_at(&b, 136), 9, "dirent.off");
        assert_eq!(&b[152..156], b"file");
        assert_eq!(u64_at(&b, 160), 0, "node id 0");
        assert_eq!(u64_at(&b, 160 + 128), 1, "dirent.ino of '.'");
    }
}
