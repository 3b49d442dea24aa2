//! The FUSE front end: one session per mounted dataset, translating kernel
//! requests into [`Zpl`] calls.
//!
//! Kernel features used (and why they are safe here): the daemon is the only
//! writer of its datasets and every change comes through the mount, so
//! names, attributes and directory listings may be cached for long (an
//! hour, `UZFS_FUSE_TTL`), as the kernel's own ZFS keeps them; what the
//! kernel cannot know is told to it or cached briefly (1 s): the
//! attributes of a file a sync has yet to write (its space changes then;
//! the kernel asks again after its own writeback, whose time update comes
//! here as a SETATTR, and after close), a rollback (`rollback.rs`, told),
//! `.zfs`'s names; access times the kernel drops itself after each read;
//! the writeback cache lets the kernel merge small writes into pages and
//! send them in large requests (up to 1 MiB, `max_write`); FUSE over
//! io_uring with per-CPU queues where the kernel offers it, else several
//! request threads on cloned /dev/fuse descriptors (`session.rs`); parallel
//! directory operations (the ZPL serializes namespace changes itself);
//! `default_permissions`, so the kernel checks modes, ownership, the sticky
//! bit and setattr rights exactly as for a local filesystem.

pub mod abi;
pub mod bdi;
pub mod ctldir;
pub mod mountinfo;
pub mod rollback;
pub mod session;
pub mod store;
pub mod writeback;

use abi::{FAttr, InHeader, Op, Out, Ttl};
use fuser::{Config, InitFlags, KernelConfig, MountOption, SessionACL};
use std::path::Path;
use std::sync::Arc;
use uzfs_core::zpl::fs::ZResult;
use uzfs_core::zpl::{Attr, SetAttr, SyncMode, Znode, Zpl};

pub use session::{Handler, Notifier, Session};

/// Seconds the kernel may keep what may change without its knowing:
/// attributes a sync will still change (`blocks`), names under `.zfs`.
const SHORT: u64 = 1;

/// Seconds it may keep the rest: names, settled attributes, listings
/// (`UZFS_FUSE_TTL`, default an hour; 1 turns directory caching off).
fn long_ttl() -> u64 {
    static T: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("UZFS_FUSE_TTL")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3600)
            .max(SHORT)
    })
}

/// Whether an OPENDIR is answered ENOSYS: the kernel offered
/// FUSE_NO_OPENDIR_SUPPORT and listings are kept, so the kernel may keep
/// every listing of the mount and open directories without asking again.
fn no_opendir() -> bool {
    long_ttl() > SHORT && abi::NO_OPENDIR.load(std::sync::atomic::Ordering::Relaxed)
}

const ROOT: u64 = 1;

/// One tree a mount serves; a rollback swaps in another
/// (`rollback.rs`), which shares the rest.
pub struct FuseFs {
    pub zpl: Arc<Zpl>,
    /// Node ids a rollback made stale, generations it changed.
    handles: rollback::Handles,
    /// `.zfs` and the snapshots under it (`ctldir.rs`); none for a mount
    /// without a dataset behind it.
    ctl: Option<Arc<ctldir::CtlDir>>,
    /// Set once the session is up (`negotiated`).
    notifier: Arc<std::sync::OnceLock<Notifier>>,
    /// Files whose writeback lost data (`writeback.rs`).
    writeback: Arc<writeback::WritebackLatch>,
    /// Records given whole to the kernel after a read of part of them
    /// (`store.rs`).
    stores: Arc<store::Stores>,
    /// The kernel's dirty-page limit of the mount (`bdi.rs`).
    dirty: Arc<bdi::DirtyLimit>,
    /// Answers to page retrievals numbered below this were asked for by
    /// a tree this one replaced (`Handler::retrieved`).
    first_retrieval: u64,
}

/// Nanoseconds of a SETATTR time: given, or now.
fn set_time(s: &abi::SetattrIn, set: u32, now: u32, secs: i64, nsec: u32) -> Option<i64> {
    if s.valid & now != 0 {
        Some(uzfs_core::zpl::fs::now_ns())
    } else if s.valid & set != 0 {
        Some(
            secs.saturating_mul(1_000_000_000)
                .saturating_add(nsec as i64),
        )
    } else {
        None
    }
}

/// What a GETXATTR of an attribute the file does not have answers.
///
/// `security.selinux` answers EOPNOTSUPP, not ENODATA, as zfs-fuse and
/// filesystems without SELinux labels do. A request for it reaches the
/// daemon only when no security module claims it: with SELinux on, the
/// kernel answers from the label it keeps itself (FUSE mounts are labelled
/// by policy, not by attribute), so here a stored label means nothing to
/// the kernel. coreutils' `ls -l` asks for every file's label, but stops
/// asking for a device once told it has none; the FUSE kernel module never
/// caches attribute answers, so ENODATA cost one round trip per file of a
/// warm `ls -lR` (20,221 of the 21,100 requests of a walk of 20,000
/// files). A label set with `setxattr` is still kept, listed and returned.
fn absent_xattr(name: &[u8]) -> i32 {
    if name == b"security.selinux" {
        libc::EOPNOTSUPP
    } else {
        libc::ENODATA
    }
}

/// An xattr value or name list: its size when asked with size 0, ERANGE
/// if it does not fit.
fn xattr_reply(v: &[u8], size: u32, out: &mut Out<'_>) -> ZResult<()> {
    if size == 0 {
        out.xattr_size(v.len() as u32);
    } else if v.len() > size as usize || !out.put(v) {
        return Err(libc::ERANGE);
    }
    Ok(())
}

impl FuseFs {
    /// A cached write was refused for space, or landed past a byte lost
    /// meanwhile: cut the file back to `keep` (`writeback.rs`). A truncate
    /// frees, so it needs no space.
    fn cut_after_lost_writeback(&self, obj: u64, keep: u64) {
        if self.zpl.getattr(obj).is_ok_and(|a| a.size > keep) {
            let cut = SetAttr {
                size: Some(keep),
                ..Default::default()
            };
            if let Err(e) = self.zpl.setattr(obj, &cut) {
                log::warn!("object {obj}: cutting after a lost writeback failed: errno {e}");
            }
        }
    }

    /// The head filesystem's tree.
    fn head(&self) -> Tree<'_> {
        Tree {
            zpl: &self.zpl,
            tag: 0,
            handles: Some(&self.handles),
            stores: Some((&self.stores, &self.zpl)),
        }
    }

    fn obj(&self, nodeid: u64) -> u64 {
        self.head().obj(nodeid)
    }

    /// Create any kind of node in the request's directory, owned by the
    /// caller.
    /// `umask`: the creating process's, applied by the ZPL unless the
    /// directory has a default ACL (with ACLs the kernel leaves it to us,
    /// FUSE_DONT_MASK; without, it has applied it already).
    fn make(
        &self,
        h: &InHeader,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> ZResult<Attr> {
        self.zpl.mknod_umask(
            self.obj(h.nodeid),
            name,
            mode,
            umask,
            rdev,
            h.uid,
            h.gid,
            target,
        )
    }

    fn setattr(&self, h: &InHeader, s: &abi::SetattrIn, out: &mut Out<'_>) -> ZResult<()> {
        let get = |bit: u32, v: u32| (s.valid & bit != 0).then_some(v);
        let mode = get(abi::FATTR_MODE, s.mode);
        let uid = get(abi::FATTR_UID, s.uid);
        let gid = get(abi::FATTR_GID, s.gid);
        let size = (s.valid & abi::FATTR_SIZE != 0).then_some(s.size);
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(
                s,
                abi::FATTR_ATIME,
                abi::FATTR_ATIME_NOW,
                s.atime,
                s.atimensec,
            ),
            mtime: set_time(
                s,
                abi::FATTR_MTIME,
                abi::FATTR_MTIME_NOW,
                s.mtime,
                s.mtimensec,
            ),
            // What the kernel does itself without HANDLE_KILLPRIV_V2: a
            // change of owner, or a truncate by anyone but root, drops the
            // set-id bits (an explicit new mode wins).
            kill_suid: mode.is_none()
                && (uid.is_some()
                    || gid.is_some()
                    || s.valid & abi::FATTR_KILL_SUIDGID != 0
                    || (size.is_some() && h.uid != 0)),
        };
        let obj = self.obj(h.nodeid);
        if let Some(size) = size {
            self.writeback.truncated(h.nodeid, size);
            // A writer while it runs (`store.rs`).
            self.stores.writer(h.nodeid);
        }
        let r = self.zpl.setattr(obj, &a);
        if size.is_some() {
            self.stores.done(h.nodeid);
        }
        let a = match r {
            // With the writeback cache the kernel writes back the times of
            // an inode it still caches after the file was unlinked and
            // freed (at syncfs, or at eviction). Nothing can see that file
            // any more; answer with a dead inode's attributes instead of
            // failing the caller's syncfs(2) with ENOENT.
            Err(e) if e == libc::ENOENT && mode.is_none() && uid.is_none() && gid.is_none() => {
                Attr {
                    ino: obj,
                    size: size.unwrap_or(0),
                    blocks: 0,
                    blksize: 4096,
                    z: Znode {
                        mode: libc::S_IFREG,
                        nlink: 0,
                        atime: a.atime.unwrap_or(0),
                        mtime: a.mtime.unwrap_or(0),
                        ctime: a.mtime.unwrap_or(0),
                        ..Default::default()
                    },
                }
            }
            r => r?,
        };
        let head = self.head();
        out.attr_out(&head.fattr(&a), head.ttl(&a).attr);
        Ok(())
    }
}

/// One tree of files the mount serves: the head filesystem (`tag` 0) or
/// a snapshot's (`tag`: its view in the node id's top bits, `ctldir.rs`).
#[derive(Clone, Copy)]
struct Tree<'a> {
    zpl: &'a Zpl,
    tag: u64,
    /// The head's handles after a rollback (none in a snapshot's tree).
    handles: Option<&'a rollback::Handles>,
    /// The head's stores of whole records (`store.rs`), and its ZPL.
    stores: Option<(&'a store::Stores, &'a Arc<Zpl>)>,
}

impl<'a> Tree<'a> {
    fn snapshot(zpl: &'a Zpl, view: u64) -> Tree<'a> {
        Tree {
            zpl,
            tag: view << ctldir::VIEW_SHIFT,
            handles: None,
            stores: None,
        }
    }

    fn obj(&self, nodeid: u64) -> u64 {
        if nodeid == ROOT {
            self.zpl.root
        } else {
            nodeid & ctldir::OBJ_MASK
        }
    }

    fn ino(&self, obj: u64) -> u64 {
        debug_assert!(obj <= ctldir::OBJ_MASK, "object {obj} beyond node ids");
        if self.tag == 0 && obj == self.zpl.root {
            ROOT
        } else {
            self.tag | obj
        }
    }

    fn fattr(&self, a: &Attr) -> FAttr {
        FAttr {
            ino: self.ino(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: a.z.atime,
            mtime: a.z.mtime,
            ctime: a.z.ctime,
            mode: a.z.mode,
            nlink: a.z.nlink,
            uid: a.z.uid,
            gid: a.z.gid,
            rdev: a.z.rdev as u32,
            blksize: a.blksize,
        }
    }

    fn entry(&self, a: ZResult<Attr>, out: &mut Out<'_>) -> ZResult<()> {
        let a = a?;
        out.entry(&self.fattr(&a), self.hand_out(&a), self.ttl(&a));
        Ok(())
    }

    /// How long the kernel may keep `a`'s name and attributes: long, but
    /// the attributes of a head file a sync has yet to write only briefly
    /// (its `blocks` change then). A snapshot's never change.
    fn ttl(&self, a: &Attr) -> Ttl {
        let long = long_ttl();
        Ttl {
            entry: long,
            attr: if self.tag != 0 || self.zpl.settled(a.ino) {
                long
            } else {
                SHORT
            },
        }
    }

    /// A reply gives the kernel file `a`: the generation it carries.
    fn hand_out(&self, a: &Attr) -> u64 {
        match self.handles {
            Some(h) => h.hand_out(a.ino, a.z.gen),
            None => a.z.gen,
        }
    }

    /// `obj` here and below: the object number, not the FUSE inode.
    /// `flags`: the file's open flags. What the kernel reads into its page
    /// cache it keeps, so the records sent whole leave the ARC
    /// (`Zpl::read_for_kernel`), and the head gives it the rest of those
    /// sent in part (`store.rs`); a direct-I/O read is cached by nobody
    /// else.
    fn read(
        &self,
        nodeid: u64,
        obj: u64,
        offset: u64,
        size: u32,
        flags: u32,
        out: &mut Out<'_>,
    ) -> ZResult<()> {
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
            static PARTS: std::cell::RefCell<Vec<uzfs_core::dmu::objset::RecordPart>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        let kernel_keeps = kernel_caches(self.zpl, flags);
        let stores = self
            .stores
            .filter(|_| kernel_keeps)
            .and_then(|(s, zpl)| Some((s, zpl, s.ticket(nodeid)?)));
        BUF.with(|b| {
            let mut b = b.borrow_mut();
            let want = (size as usize).min(out.room());
            match stores {
                Some((s, zpl, ticket)) => PARTS.with(|p| {
                    let mut p = p.borrow_mut();
                    p.clear();
                    let r = self
                        .zpl
                        .read_for_kernel_noting(obj, offset, want, &mut b, &mut p);
                    match r {
                        Ok(()) => s.queue(ticket, (offset, offset + b.len() as u64), &mut p, zpl),
                        Err(_) => s.drop_ticket(ticket),
                    }
                    r
                }),
                None if kernel_keeps => self.zpl.read_for_kernel(obj, offset, want, &mut b),
                None => self.zpl.read_into(obj, offset, want, &mut b),
            }?;
            out.put(&b);
            Ok(())
        })
    }

    /// `ctl`: the root of a mount with `.zfs`, listed after `..` when
    /// `visible` (a real `.zfs` there is shadowed either way).
    ///
    /// `plus` (READDIRPLUS): every entry carries its attributes, so a
    /// walk that stats what it lists (`ls -l`, `find`, `du`) costs one
    /// round trip per reply instead of one LOOKUP per name. `.`, `..`
    /// and `.zfs` go without (node id 0: the kernel keeps what it has).
    fn readdir(
        &self,
        obj: u64,
        offset: u64,
        size: u32,
        plus: bool,
        ctl: Option<bool>,
        out: &mut Out<'_>,
    ) -> ZResult<()> {
        let size = size as usize;
        // Names listed per reply: what fits, at the smallest entry size,
        // so a READDIRPLUS does not read 256 names to send 20.
        let smallest = if plus { abi::ENTRY_OUT_LEN + 32 } else { 32 };
        let max = (size / smallest).clamp(1, 256);
        // `of`: the object whose attributes go with the entry, if any.
        let dirent = |out: &mut Out<'_>, ino: u64, of: Option<u64>, next, dt, name: &[u8]| {
            if !plus {
                return out.dirent(size, ino, next, dt, name);
            }
            // An entry that vanished since the listing (a racing unlink)
            // goes without attributes, as the name alone would have.
            let a = of.and_then(|o| self.zpl.getattr(o).ok());
            let fa = a.as_ref().map(|a| (self.fattr(a), self.hand_out(a)));
            out.direntplus(
                size,
                ino,
                fa.as_ref().map(|(f, g)| (f, *g)),
                a.as_ref().map_or(Ttl::both(SHORT), |a| self.ttl(a)),
                next,
                dt,
                name,
            )
        };
        for (next, child, dt, name) in self.zpl.readdir(obj, offset, max)? {
            if ctl.is_some() && name == ctldir::NAME {
                continue;
            }
            let dots = name == b"." || name == b"..";
            let of = (!dots).then_some(child);
            if !dirent(out, self.ino(child), of, next, dt as u32, &name) {
                break;
            }
            if next == 2
                && ctl == Some(true)
                && !dirent(out, ctldir::CTL_DIR, None, 2, ctldir::DT_DIR, ctldir::NAME)
            {
                break;
            }
        }
        Ok(())
    }

    /// The requests that only read, for any tree.
    fn query(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> ZResult<()> {
        let zpl = self.zpl;
        let obj = self.obj(h.nodeid);
        match op {
            Op::Lookup { name } => self.entry(zpl.lookup(obj, name), out),
            Op::Getattr => {
                let a = zpl.getattr(obj)?;
                out.attr_out(&self.fattr(&a), self.ttl(&a).attr);
                Ok(())
            }
            Op::Readlink => {
                let t = zpl.readlink(obj)?;
                out.put(&t);
                Ok(())
            }
            Op::Read {
                offset,
                size,
                flags,
            } => self.read(h.nodeid, obj, offset, size, flags, out),
            Op::Getxattr { size, name } => match zpl.getxattr(obj, name) {
                Err(libc::ENODATA) => Err(absent_xattr(name)),
                v => xattr_reply(&v?, size, out),
            },
            Op::Listxattr { size } => {
                let mut b = Vec::new();
                for n in zpl.listxattr(obj)? {
                    b.extend_from_slice(&n);
                    b.push(0);
                }
                xattr_reply(&b, size, out)
            }
            // Listings are kept (the kernel drops one it changes itself;
            // a rollback drops what it changed), unless entries are not.
            // Where the kernel can open directories by itself, the first
            // OPENDIR says so (ENOSYS) and no other comes: a warm walk of
            // 221 directories made 442 round trips for this and RELEASEDIR.
            Op::Opendir => {
                if no_opendir() {
                    return Err(libc::ENOSYS);
                }
                let keep = long_ttl() > SHORT;
                out.open(
                    0,
                    if keep {
                        abi::FOPEN_CACHE_DIR | abi::FOPEN_KEEP_CACHE
                    } else {
                        0
                    },
                );
                Ok(())
            }
            Op::Readdir { offset, size, plus } => self.readdir(obj, offset, size, plus, None, out),
            Op::Releasedir => Ok(()),
            Op::Lseek { offset, whence } => self.lseek(obj, offset, whence, out),
            // Nothing to do at close (data reaches the DMU on each write);
            // the kernel stops sending FLUSH after ENOSYS, saving a round
            // trip per close. Dirty pages are still written back before
            // close returns.
            Op::Flush | Op::OneWay | Op::Unsupported => Err(libc::ENOSYS),
            // Changes (the head answers them before it gets here).
            _ => Err(libc::EROFS),
        }
    }

    fn lseek(&self, obj: u64, offset: u64, whence: u32, out: &mut Out<'_>) -> ZResult<()> {
        let o = match whence as i32 {
            libc::SEEK_DATA | libc::SEEK_HOLE if offset <= i64::MAX as u64 => {
                self.zpl
                    .seek_data(obj, offset, whence as i32 == libc::SEEK_DATA)?
            }
            _ => return Err(libc::EINVAL),
        };
        out.offset(o);
        Ok(())
    }
}

impl FuseFs {
    fn statfs(&self, out: &mut Out<'_>) {
        let (total, avail, files, ffree) = self.zpl.statfs();
        let bs = 4096u64;
        out.statfs(
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
}

impl Handler for FuseFs {
    /// `sync=always`: every change is committed before it is answered
    /// (files are opened with direct I/O there, so each write(2) arrives
    /// here before it returns, see `open_flags`).
    fn handle(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> ZResult<()> {
        let view = ctldir::view_of(h.nodeid);
        if view != 0 {
            let Some(ctl) = &self.ctl else {
                return Err(libc::ENOENT);
            };
            return if view == ctldir::CTL_VIEW {
                self.ctl_dispatch(ctl, h, op, out)
            } else {
                self.snap_dispatch(ctl, view, h, op, out)
            };
        }
        let commit = op.is_change() && self.sync_mode() == SyncMode::Always;
        let obj = self.obj(h.nodeid);
        let other = match op {
            Op::Rename { newdir, .. } => Some(self.obj(newdir)),
            Op::Link { oldnodeid, .. } => Some(self.obj(oldnodeid)),
            _ => None,
        };
        // Counted before a stale release is answered below.
        if let Op::Release { flags } = op {
            if writes(flags) {
                self.stores.done(h.nodeid);
            }
        }
        if self.handles.check(obj, other, &op)? {
            return Ok(());
        }
        self.dispatch(h, op, out)?;
        if commit {
            self.zpl.fsync(obj)?;
        }
        Ok(())
    }

    fn negotiated(&self, posix_acl: bool, notifier: Notifier) {
        self.zpl.set_posix_acl(posix_acl);
        self.stores.start(notifier.clone());
        let _ = self.notifier.set(notifier);
        if let Some(pc) = self.kernel_pages() {
            self.zpl.set_page_cache(pc);
        }
    }

    fn retrieved(&self, unique: u64, nodeid: u64, offset: u64, data: &[u8]) {
        // An answer to a retrieval sent for the tree a rollback replaced
        // carries that tree's pages.
        if unique < self.first_retrieval || ctldir::view_of(nodeid) != 0 {
            return;
        }
        self.zpl
            .fill_from_page_cache(self.obj(nodeid), offset, data, unique);
    }
}

/// `UZFS_FUSE_RETRIEVE=0`: a write of part of an uncached record reads
/// the rest from a device, never from the kernel's page cache
/// (`uzfs_core::zpl::pagecache`). On by default.
fn retrieve_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("UZFS_FUSE_RETRIEVE").map_or(true, |v| v != "0"))
}

/// The kernel's page cache of one mount, for the ZPL (`PageCache`).
struct KernelPages {
    notifier: Arc<std::sync::OnceLock<Notifier>>,
    /// The root directory's object (node id `ROOT`): never a file.
    root: u64,
}

impl uzfs_core::zpl::pagecache::PageCache for KernelPages {
    fn request(&self, obj: u64, offset: u64, len: usize) -> u64 {
        if obj == self.root || obj > ctldir::OBJ_MASK {
            return 0;
        }
        // Head files' node ids are their object numbers (`Tree::ino`).
        self.notifier
            .get()
            .map_or(0, |n| n.retrieve(obj, offset, len))
    }
}

impl FuseFs {
    /// The kernel's pages for this tree's writes, unless turned off.
    fn kernel_pages(&self) -> Option<Arc<dyn uzfs_core::zpl::pagecache::PageCache>> {
        retrieve_on().then(|| {
            Arc::new(KernelPages {
                notifier: self.notifier.clone(),
                root: self.zpl.root,
            }) as Arc<dyn uzfs_core::zpl::pagecache::PageCache>
        })
    }
}

/// `UZFS_FUSE_DIRECT_IO=1`: every file opened with direct I/O, so the
/// kernel's page cache holds no file data and the ARC is the only cache
/// (shared mmap still works through `DIRECT_IO_ALLOW_MMAP`). Off by
/// default; bench/RESULTS.md ("one copy") has what it costs.
fn direct_io_mount() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("UZFS_FUSE_DIRECT_IO").is_ok_and(|v| v == "1"))
}

/// Whether `zpl`'s files are opened with direct I/O (`FuseFs::open_flags`).
fn opened_direct(zpl: &Zpl) -> bool {
    zpl.ctx().props().sync == SyncMode::Always || direct_io_mount()
}

/// Whether a handle opened with `flags` (open(2)'s) may write.
fn writes(flags: u32) -> bool {
    flags as i32 & libc::O_ACCMODE != libc::O_RDONLY
}

/// Whether the kernel's page cache keeps what a read or write of a file
/// opened with `flags` moves: neither O_DIRECT nor a direct-I/O open.
fn kernel_caches(zpl: &Zpl, flags: u32) -> bool {
    flags & libc::O_DIRECT as u32 == 0 && !opened_direct(zpl)
}

impl FuseFs {
    fn sync_mode(&self) -> SyncMode {
        self.zpl.ctx().props().sync
    }

    /// How a file is opened: with the page cache kept across opens (every
    /// change comes through this mount, so cached pages are never stale),
    /// or, on a `sync=always` dataset, with direct I/O: the writeback
    /// cache would acknowledge write(2) before the data reached the pool.
    fn open_flags(&self) -> u32 {
        if opened_direct(&self.zpl) {
            abi::FOPEN_DIRECT_IO
        } else {
            abi::FOPEN_KEEP_CACHE
        }
    }

    /// Whether `op` in directory `dir` names `.zfs` at the root: creating
    /// it answers EEXIST, removing or renaming it EBUSY (it is not there
    /// to change; a real `.zfs` it shadows stays as it is).
    fn touches_ctl(&self, dir: u64, op: &Op<'_>) -> ZResult<()> {
        if self.ctl.is_none() {
            return Ok(());
        }
        let at_root = |d: u64, n: &[u8]| d == ROOT && n == ctldir::NAME;
        match *op {
            Op::Mknod { name, .. }
            | Op::Mkdir { name, .. }
            | Op::Symlink { name, .. }
            | Op::Create { name, .. }
            | Op::Link { newname: name, .. }
                if at_root(dir, name) =>
            {
                Err(libc::EEXIST)
            }
            Op::Unlink { name } | Op::Rmdir { name } if at_root(dir, name) => Err(libc::EBUSY),
            Op::Rename {
                newdir,
                name,
                newname,
                ..
            } if at_root(dir, name) || at_root(newdir, newname) => Err(libc::EBUSY),
            _ => Ok(()),
        }
    }

    fn dispatch(&self, h: &InHeader, op: Op<'_>, out: &mut Out<'_>) -> ZResult<()> {
        let zpl = &self.zpl;
        let head = self.head();
        let obj = self.obj(h.nodeid);
        self.touches_ctl(h.nodeid, &op)?;
        match op {
            Op::Lookup { name } if h.nodeid == ROOT && name == ctldir::NAME => match &self.ctl {
                Some(ctl) => {
                    ctl.attr_entry(out);
                    Ok(())
                }
                None => head.query(h, op, out),
            },
            Op::Setattr(s) => self.setattr(h, &s, out),
            Op::Mknod {
                mode,
                rdev,
                umask,
                name,
            } => {
                let r = self.make(h, name, mode, umask, rdev as u64, None);
                head.entry(r, out)
            }
            Op::Mkdir { mode, umask, name } => {
                let r = self.make(h, name, libc::S_IFDIR | (mode & 0o7777), umask, 0, None);
                head.entry(r, out)
            }
            Op::Unlink { name } => zpl.unlink(obj, name),
            Op::Rmdir { name } => zpl.rmdir(obj, name),
            Op::Symlink { name, target } => {
                let r = self.make(h, name, libc::S_IFLNK | 0o777, 0, 0, Some(target));
                head.entry(r, out)
            }
            // Into or out of `.zfs`: another (read-only) filesystem.
            Op::Rename { newdir, .. }
            | Op::Link {
                oldnodeid: newdir, ..
            } if ctldir::view_of(newdir) != 0 => Err(libc::EXDEV),
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => zpl.rename(obj, name, self.obj(newdir), newname, flags),
            Op::Link { oldnodeid, newname } => {
                head.entry(zpl.link(self.obj(oldnodeid), obj, newname), out)
            }
            Op::Open { flags } => {
                zpl.open(obj)?;
                if writes(flags) {
                    self.stores.writer(h.nodeid);
                }
                out.open(0, self.open_flags());
                Ok(())
            }
            Op::Write {
                offset,
                write_flags,
                flags,
                data,
            } => {
                // The kernel keeps what it wrote back from its page cache,
                // and what a buffered write(2) put there.
                let written_back = write_flags & abi::WRITE_CACHE != 0;
                if written_back {
                    self.dirty.note(offset, data.len() as u64, || {
                        zpl.ctx().props().recordsize as u64
                    });
                }
                if written_back || kernel_caches(zpl, flags) {
                    uzfs_core::dmu::objset::through_page_cache(|| {
                        self.write(h, obj, offset, write_flags, data, out)
                    })
                } else {
                    self.write(h, obj, offset, write_flags, data, out)
                }
            }
            Op::Statfs => {
                self.statfs(out);
                Ok(())
            }
            Op::Release { .. } => {
                self.writeback.settled(h.nodeid);
                zpl.release(obj)
            }
            Op::Fsync => {
                zpl.fsync(obj)?;
                self.writeback.settled(h.nodeid);
                Ok(())
            }
            Op::Fsyncdir => zpl.fsync(obj),
            Op::Setxattr {
                flags,
                setxattr_flags,
                name,
                value,
            } => {
                let kill_sgid = setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0;
                zpl.setxattr_kill(obj, name, Some(value), flags as i32, kill_sgid)
            }
            Op::Removexattr { name } => zpl.setxattr(obj, name, None, 0),
            Op::Readdir { offset, size, plus } if h.nodeid == ROOT && self.ctl.is_some() => {
                let visible = zpl.ctx().props().snapdir_visible;
                head.readdir(obj, offset, size, plus, Some(visible), out)
            }
            Op::Create {
                flags,
                mode,
                umask,
                name,
            } => {
                let a = self.make(h, name, libc::S_IFREG | (mode & 0o7777), umask, 0, None)?;
                zpl.open(a.ino)?;
                if writes(flags) {
                    self.stores.writer(head.ino(a.ino));
                }
                out.entry(&head.fattr(&a), head.hand_out(&a), head.ttl(&a));
                out.open(0, self.open_flags());
                Ok(())
            }
            Op::Fallocate {
                offset,
                length,
                mode,
            } => zpl.fallocate(obj, mode as i32, offset, length),
            op => head.query(h, op, out),
        }
    }

    fn write(
        &self,
        h: &InHeader,
        obj: u64,
        offset: u64,
        write_flags: u32,
        data: &[u8],
        out: &mut Out<'_>,
    ) -> ZResult<()> {
        let zpl = &self.zpl;
        let cached = write_flags & abi::WRITE_CACHE != 0;
        if cached {
            self.writeback.before(h.nodeid, offset, || {
                zpl.getattr(obj).map_or(u64::MAX, |a| a.size)
            })?;
        }
        let kill = write_flags & abi::WRITE_KILL_SUIDGID != 0;
        let (n, mode_changed) = match zpl.write_kill(obj, offset, data, kill) {
            Ok(r) => r,
            Err(e) => {
                if cached && (e == libc::ENOSPC || e == libc::EDQUOT) {
                    let keep = self.writeback.lost(h.nodeid, offset, e);
                    self.cut_after_lost_writeback(obj, keep);
                }
                return Err(e);
            }
        };
        if cached {
            if let Err((keep, e)) = self.writeback.landed(h.nodeid, offset, n as u64) {
                self.cut_after_lost_writeback(obj, keep);
                return Err(e);
            }
        }
        // The kernel still caches the set-id mode (it leaves the clearing
        // to us, HANDLE_KILLPRIV_V2): drop it before the writer can close
        // and exec the file.
        if mode_changed {
            if let Some(n) = self.notifier.get() {
                n.inval_attr(h.nodeid);
            }
        }
        out.written(n as u32);
        Ok(())
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
        | InitFlags::FUSE_MAX_PAGES
        // READDIRPLUS when the kernel sees that names listed get looked
        // up (and always for a listing's first reply).
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        // Shared mmap of files opened with direct I/O (`sync=always`).
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
    if std::env::var("UZFS_FUSE_WRITEBACK").map_or(true, |v| v != "0") {
        want |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    // One at a time: fuser adds none of a set if the kernel lacks one.
    for flag in want.iter() {
        if config.add_capabilities(flag).is_err() && std::env::var_os("UZFS_FUSE_STATS").is_some() {
            log::debug!("kernel lacks FUSE capability {flag:?}");
        }
    }
    // SETXATTR_EXT: the kernel says when setting an ACL must drop the
    // set-group-ID bit (posix_acl_update_mode's rule, which needs the
    // caller's groups and capabilities; only the kernel has them).
    let ext = config
        .add_capabilities(InitFlags::FUSE_SETXATTR_EXT)
        .is_ok();
    abi::SETXATTR_EXT.store(ext, std::sync::atomic::Ordering::Relaxed);
    // Not a feature the answer asks for: the kernel says it can open
    // directories without OPENDIR (`FuseFs` answers ENOSYS then).
    let no_opendir = config
        .add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
        .is_ok();
    abi::NO_OPENDIR.store(no_opendir, std::sync::atomic::Ordering::Relaxed);
    let _ = config.set_max_write(1 << 20);
    let _ = config.set_max_readahead(1 << 20);
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
}

/// Mount options of every uzfs mount (request threads are
/// `session::mount`'s, not fuser's).
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
    config
}

/// Mount `zpl` at `mountpoint`; returns the running session (its `join`
/// waits for the request threads once the mount is gone) and the handle
/// a rollback swaps the tree through.
/// `posix_acl`: the dataset's `acltype` is `posix` (the kernel checks
/// ACLs if it offers to; the mount refuses them otherwise).
pub fn mount(
    zpl: Arc<Zpl>,
    mountpoint: &Path,
    fsname: &str,
    readonly: bool,
    posix_acl: bool,
    ctl: Option<ctldir::CtlDir>,
) -> std::io::Result<(Session, Arc<rollback::FuseMount>)> {
    std::fs::create_dir_all(mountpoint)?;
    // The path as /proc/self/mountinfo will list it (before the mount:
    // resolving it afterwards would ask the mount itself).
    let listed = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let dirty = Arc::new(bdi::DirtyLimit::default());
    let config = session_config(fsname, readonly);
    let fs = Arc::new(rollback::FuseMount::new(FuseFs {
        zpl,
        handles: Default::default(),
        ctl: ctl.map(Arc::new),
        notifier: Default::default(),
        writeback: Default::default(),
        stores: Default::default(),
        dirty: dirty.clone(),
        first_retrieval: 0,
    }));
    let mut s = session::mount(
        fs.clone(),
        mountpoint,
        &config,
        negotiate,
        fuse_threads(),
        posix_acl,
    )?;
    let dev = mountinfo::fuse_dev(&listed);
    s.conn = dev
        .as_deref()
        .and_then(mountinfo::minor_of)
        .map(|m| (m, listed.clone()));
    dirty.attach(dev.as_deref());
    Ok((s, fs))
}

pub fn fuse_threads() -> usize {
    std::env::var("UZFS_FUSE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .clamp(1, 64)
}
