//! The process's allocator: glibc's malloc, with every allocation of at
//! least [`ALIGN_FROM`] bytes starting on a [`DIRECT_ALIGN`] boundary.
//!
//! # Why
//!
//! The sync writes a txg's data blocks with `O_DIRECT` (`vdev/device.rs`),
//! which takes a buffer only if its address and length are multiples of
//! the device's block size. glibc returns large blocks 16 bytes past a
//! page boundary, so every record was copied into an aligned staging
//! buffer before its write: one pass over every byte written, a fifth of
//! the sync's CPU in a txg of 128 KiB records (`perf`, bench/RESULTS.md).
//! With record buffers aligned here, a run of whole blocks is written
//! straight from them, one `pwritev` of their pieces
//! (`TopVdev::write_blocks`), and the copy is left to blocks the layout
//! changes (RAID-Z columns, padding, a compressed block's tail).
//!
//! # Rules
//!
//! * The extra alignment is a hint, never part of an allocation's
//!   contract: callers check it (`vdev/top.rs` stages what is not
//!   aligned), so a buffer that lost it (a `realloc`, another allocator in
//!   a test) is written correctly, only with the copy.
//! * Every block comes from and goes back to glibc (`posix_memalign`,
//!   `malloc`, `realloc`, `free` accept each other's pointers), so the
//!   daemon's tuning of glibc (`M_ARENA_MAX`, `malloc_trim`) still applies.
//! * Small allocations, the vast majority, and any whose size is not a
//!   whole number of pages (it could never be written as one) take
//!   glibc's fast path unchanged. The cost on a large block is at most one page of address
//!   space (an `mmap`ed 128 KiB block takes 34 pages instead of 33).

use std::alloc::{GlobalAlloc, Layout};

/// Allocations of whole pages this large or larger are page-aligned:
/// record buffers and RAID-Z columns, not the small objects that make up
/// most allocations.
pub const ALIGN_FROM: usize = 16 << 10;

/// The alignment large blocks get: what direct I/O asks of any device.
pub const DIRECT_ALIGN: usize = crate::vdev::device::DIRECT_ALIGN;

/// glibc's malloc guarantees this alignment by itself on x86-64 and
/// aarch64.
const MALLOC_ALIGN: usize = 16;

/// See the module documentation.
pub struct PageAlignedLarge;

impl PageAlignedLarge {
    fn want_align(layout: &Layout) -> usize {
        // Only a block of whole pages can be written as one (a record, a
        // RAID-Z column); others keep malloc's cheaper path.
        if layout.size() >= ALIGN_FROM && layout.size().is_multiple_of(DIRECT_ALIGN) {
            layout.align().max(DIRECT_ALIGN)
        } else {
            layout.align()
        }
    }
}

// SAFETY: every method returns null or a block from glibc of at least the
// layout's size at (at least) its alignment, and `dealloc` frees only
// blocks glibc gave out (it frees any of `malloc`, `posix_memalign` and
// `realloc`'s blocks).
unsafe impl GlobalAlloc for PageAlignedLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let align = Self::want_align(&layout);
        if align <= MALLOC_ALIGN {
            return libc::malloc(layout.size()) as *mut u8;
        }
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // posix_memalign wants a power of two multiple of the pointer size.
        let align = align.max(std::mem::size_of::<usize>());
        if libc::posix_memalign(&mut p, align, layout.size()) != 0 {
            return std::ptr::null_mut();
        }
        p as *mut u8
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::want_align(&layout) <= MALLOC_ALIGN {
            return libc::calloc(layout.size(), 1) as *mut u8;
        }
        let p = self.alloc(layout);
        if !p.is_null() {
            std::ptr::write_bytes(p, 0, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        libc::free(ptr as *mut libc::c_void);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The layout's own alignment is what the contract asks; glibc's
        // realloc keeps 16. A grown buffer may lose the page alignment
        // (a hint only, see the module docs).
        if layout.align() <= MALLOC_ALIGN {
            return libc::realloc(ptr as *mut libc::c_void, new_size) as *mut u8;
        }
        // SAFETY: the caller guarantees `new_size`, rounded up to the
        // layout's alignment, does not overflow isize.
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        let p = self.alloc(new);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process runs on this allocator (`lib.rs`): large vectors start
    /// page-aligned however they are made, small ones are untouched, and
    /// growing one keeps its contents.
    #[test]
    fn large_blocks_start_page_aligned() {
        let aligned = |p: *const u8| (p as usize).is_multiple_of(DIRECT_ALIGN);
        for size in [ALIGN_FROM, 128 << 10, 1 << 20, (128 << 10) + 4096] {
            let a = vec![7u8; size];
            let b = vec![0u8; size];
            assert!(b.iter().all(|&x| x == 0));
            let c = a.as_slice().to_vec();
            let d: Vec<u8> = Vec::with_capacity(size);
            for v in [a.as_ptr(), b.as_ptr(), c.as_ptr(), d.as_ptr()] {
                assert!(aligned(v), "{size} bytes at {v:p}");
            }
        }
        let mut grown = vec![1u8; 100];
        grown.resize(256 << 10, 2);
        assert_eq!(grown[99], 1);
        assert_eq!(grown[100], 2);
        assert_eq!(grown.len(), 256 << 10);
        // Alignments above a page are honoured too.
        let big = Layout::from_size_align(64 << 10, 1 << 16).expect("layout");
        // SAFETY: a non-zero-sized layout; freed with the same layout.
        unsafe {
            let p = PageAlignedLarge.alloc(big);
            assert!(!p.is_null() && (p as usize).is_multiple_of(1 << 16));
            PageAlignedLarge.dealloc(p, big);
        }
    }
}
