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
/// was, also when `f` panics (a FUSE request thread catches a handler's
/// panic and serves the next request): the per-thread modes
/// (`arc::prefetching`, `dmu::partial::deferring`,
/// `dmu::objset::through_page_cache`) are each one such flag.
pub(crate) fn with_flag<R>(
    flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore(&'static std::thread::LocalKey<std::cell::Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let was = self.1;
            self.0.with(|d| d.set(was));
        }
    }
    let _restore = Restore(flag, flag.with(|d| d.replace(true)));
    f()
}

#[cfg(test)]
mod tests {
    thread_local! {
        static FLAG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[test]
    fn a_flag_is_put_back_even_after_a_panic() {
        assert!(super::with_flag(&FLAG, || FLAG.with(|f| f.get())));
        assert!(!FLAG.with(|f| f.get()));
        let r = std::panic::catch_unwind(|| super::with_flag(&FLAG, || panic!("handler")));
        assert!(r.is_err());
        assert!(!FLAG.with(|f| f.get()), "the flag outlived a panic");
        // Nested: the inner call leaves the outer's setting.
        super::with_flag(&FLAG, || {
            super::with_flag(&FLAG, || ());
            assert!(FLAG.with(|f| f.get()));
        });
    }
}
