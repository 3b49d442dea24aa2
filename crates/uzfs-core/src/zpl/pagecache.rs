//! The kernel's page cache above a mount, as a source of record bytes.
//!
//! # Why ask the kernel
//!
//! A write of part of a record needs the rest of it: copy-on-write writes
//! whole records. When the record is neither dirty nor in the ARC, the
//! daemon used to read it from a device. But a file written or read
//! through a FUSE mount with the writeback cache is held in the kernel's
//! page cache above the mount (`FOPEN_KEEP_CACHE`), and FUSE's WRITE
//! request carries only the pages being written back. The kernel will
//! hand over the pages it holds (`FUSE_NOTIFY_RETRIEVE`, answered by a
//! `FUSE_NOTIFY_REPLY` request): a copy of memory instead of a device
//! read. This is what lets the ARC leave written data to the kernel (one
//! copy, `UZFS_ARC_CACHE_WRITES=never`) without every first patch of a
//! record costing a device read.
//!
//! # What the pages are
//!
//! Every change to a mounted file passes through the kernel, so the page
//! cache is never older than the daemon: a clean page holds what the
//! daemon has, a dirty one something newer that the kernel will write
//! back later (a writeback that lands it in this txg instead of a later
//! one changes nothing a crash may observe beyond what the writeback
//! cache already allows: write(2) there promises nothing until fsync).
//! The exceptions are changes the daemon makes behind the kernel's back:
//! a rollback, which turns this off until it has invalidated the
//! kernel's pages, and a cut after a lost writeback, which truncates
//! (the bytes past a file's size are never asked for).
//!
//! # How the answer is used
//!
//! The write does not wait for it. FUSE's request threads are few (four
//! per CPU queue), and the kernel's writeback sends a burst of WRITEs at
//! once: writers that each waited for an answer only another request
//! thread could take in left none to take it (tried first: 31 of 32
//! patches timed out). So a write of part of a record that is on disk
//! and not in memory leaves a partial block (`dmu/partial.rs`, as with
//! `UZFS_FILL_AT_SYNC=1`), then asks the kernel for the record up to the
//! file's size. The answer arrives as a request on whichever thread is
//! free; [`Zpl::fill_from_page_cache`](super::fs::Zpl::fill_from_page_cache)
//! clips it to the file's size as the daemon knows it then (zeros past
//! it, as on disk) and lays the txg's written bytes over it in place of
//! the partial block (`Objset::fill_partial`, checked by buffer identity
//! under the object set's lock, so a newer write is never undone). A
//! short answer (the kernel did not hold every page) or none before the
//! sync leaves the partial block to the sync, which reads the record
//! from a device as before. A read of a partial record in between
//! resolves it from the devices too. Unlike fill-at-sync, the record's
//! old version is not read ahead into the ARC meanwhile: that read-ahead
//! is the device read this saves (`partial::deferring`).
//!
//! Two guards keep an answer from undoing anything. Only the answer to a
//! record's latest request is used (`Zpl::asked`), so a slow answer to an
//! earlier request cannot fill a later partial block. And only in the txg
//! the partial block was made in: once that txg closes, what lies below
//! the next one may hold changes (a punch, say) that an answer prepared
//! earlier lacks. The model test (`tests/partial_records.rs`) catches
//! the loss of the first guard at 30 seeds; the loss of the second only
//! in some runs (one of two at 60 seeds): it takes a slow answer, a sync
//! and a punch of the same record in between.
//!
//! # What it buys
//!
//! `bench/retrieve_ab.sh` (bench/RESULTS.md): 16 KiB random writes into
//! a file whose pages the kernel holds, with written records not cached,
//! read nothing from the devices (7,203 records before) and ran 1.17x as
//! fast, as fast as keeping written records in the ARC. fio drops the
//! pages of a file it lays out, so bench/fs.sh's random writes cannot
//! show it, and `UZFS_ARC_CACHE_WRITES` stays `always` by default.

/// Pages a mount's kernel holds for a file.
pub trait PageCache: Send + Sync {
    /// Ask the kernel for the bytes of object `obj` from `offset`, up to
    /// `len`, and return at once: its answer (a prefix of the range,
    /// the pages it holds up to the first it does not) arrives later on
    /// another thread, which hands it to
    /// [`Zpl::fill_from_page_cache`](super::fs::Zpl::fill_from_page_cache).
    ///
    /// Returns the number the answer will carry (never 0), or 0 if the
    /// kernel could not be asked.
    fn request(&self, obj: u64, offset: u64, len: usize) -> u64;
}
