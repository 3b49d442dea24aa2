//! The ZFS POSIX layer: files, directories, symlinks, device nodes and
//! extended attributes as objects of a dataset's object set.
//!
//! # Theory of operation
//!
//! Object 1 of a filesystem dataset is the *master node*: it names the root
//! directory and the *unlinked set* (OpenZFS: the delete queue). Every file
//! is one object whose dnode bonus holds its [`Znode`] (mode, owner, link
//! count, times). Directories are [`zap::Zap`] maps from names to object
//! numbers. Symlinks keep their target as object data. A file's extended
//! attributes live in one object of type `XATTR` named by its znode.
//!
//! Every change a system call makes lands in one txg: the call holds the
//! open txg (`dmu::tx::Tx`) from its first change to its last, and txgs
//! commit atomically, so any crash leaves
//! each call entirely applied or not at all. A file unlinked while open
//! (link count zero) is put in the unlinked set in the same txg; its object
//! is freed at the last close, or at the next mount after a crash.
//!
//! # Locks
//!
//! A `Tx` hold first (taken after admission, which may wait for syncs),
//! then `ns` (one namespace change at a time), then the per-object stripes
//! (`obj_lock`, taken in ascending stripe order). Data writes and attribute
//! updates take only the stripe of their object. Reads take no lock: an
//! object set hands out whole blocks, so a read sees each block before or
//! after a concurrent write to it.

pub mod acl;
pub mod diff;
pub mod fs;
pub mod pagecache;
pub mod verify;
pub mod znode;

pub use fs::{Attr, DatasetCtx, SetAttr, SyncMode, Zpl, ZplProps};
pub use znode::Znode;
