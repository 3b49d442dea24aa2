//! uzfs-core: the storage engine of uzfs, layered as in OpenZFS.
//!
//! * [`vdev`]: devices, labels, mirrors.
//! * [`spa`]: the pool: config, allocation, txg sync, import.
//! * [`dmu`]: objects, block pointers, checksums, compression.
//! * [`arc`]: the block cache beside the DMU.
//! * [`zdb`]: offline inspection and verification.
//! * [`zpl`]: the POSIX layer: files and directories in a dataset.
//! * [`dsl`]: datasets: the namespace, properties and space accounting.
//! * [`zil`]: the intent log: synchronous writes without a txg commit.
//! * [`zio`]: the write pipeline: compress, checksum, place, issue.
//! * [`alloc`]: the process's allocator (large blocks page-aligned).

/// Large allocations page-aligned, so direct I/O writes records without a
/// copy (`alloc.rs`). Every binary built on the engine (the daemon, the
/// tools, the tests) runs on it.
#[global_allocator]
static ALLOCATOR: alloc::PageAlignedLarge = alloc::PageAlignedLarge;

pub mod alloc;
pub mod arc;
pub mod dmu;
pub mod dsl;
pub mod error;
pub mod spa;
pub mod vdev;
pub mod zdb;
pub mod zil;
pub mod zio;
pub mod zpl;

pub use error::{Error, Result};

/// Run `f` with the calling thread's `flag` set, then put it back as it
/// was: the per-thread modes (`arc::prefetching`, `dmu::partial::deferring`,
/// `dmu::objset::through_page_cache`) are each one such flag.
pub(crate) fn with_flag<R>(
    flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    f: impl FnOnce() -> R,
) -> R {
    let was = flag.with(|d| d.replace(true));
    let r = f();
    flag.with(|d| d.set(was));
    r
}
