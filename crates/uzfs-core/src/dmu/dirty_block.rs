//! A dirty level-0 block of the open txg, with the Fletcher-4 of its bytes
//! when it was computed as they were written.
//!
//! # Why
//!
//! A streaming writer's record is copied into its buffer by `Objset::write`
//! and checksummed by the sync a txg later, by then long out of the CPU's
//! caches: the sync's `fletcher4` over a 64 MiB txg ran at the speed of
//! memory (7-8 GB/s on this project's VM, 13-14% of a sequential write's
//! daemon CPU). Summed straight after the copy, while the record is still
//! in L2, it costs a third of that (`bench/RESULTS.md`). The sync uses the
//! sum when it stores the block as written (not compressed) with
//! Fletcher-4; otherwise it computes its own as before.
//!
//! # The invariant
//!
//! `sum`, when set, is the Fletcher-4 of `data`'s bytes. It holds by
//! construction, not by every caller remembering: the only way to change
//! the bytes, or to replace the buffer, is through `DerefMut`, which drops
//! the sum first; the fields are private to this module. (A buffer shared
//! with someone else, an intent-log record or the cache, is never written
//! in place: `Arc::make_mut` copies it, also through `DerefMut`.) Debug
//! builds check the sum against the bytes again where the sync uses it
//! (`spa/txg.rs`), so every test that writes through a mount would catch
//! a path that broke it.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyBlock {
    data: Arc<Vec<u8>>,
    sum: Option<[u8; 32]>,
}

impl DirtyBlock {
    /// `data`, whose Fletcher-4 is computed now (call it while the bytes
    /// are still in the cache, right after they were copied in).
    pub fn summed(data: Vec<u8>) -> Self {
        let sum = Some(super::checksum::fletcher4(&data));
        DirtyBlock {
            data: Arc::new(data),
            sum,
        }
    }

    /// The Fletcher-4 of the bytes, if it was computed when they were
    /// written and they have not changed since.
    pub fn fletcher4(&self) -> Option<&[u8; 32]> {
        self.sum.as_ref()
    }
}

impl From<Arc<Vec<u8>>> for DirtyBlock {
    fn from(data: Arc<Vec<u8>>) -> Self {
        DirtyBlock { data, sum: None }
    }
}

impl From<Vec<u8>> for DirtyBlock {
    fn from(data: Vec<u8>) -> Self {
        Arc::new(data).into()
    }
}

impl Deref for DirtyBlock {
    type Target = Arc<Vec<u8>>;
    fn deref(&self) -> &Arc<Vec<u8>> {
        &self.data
    }
}

impl DerefMut for DirtyBlock {
    /// Any change to the bytes, or a new buffer: the sum no longer holds.
    fn deref_mut(&mut self) -> &mut Arc<Vec<u8>> {
        self.sum = None;
        &mut self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_is_of_the_bytes_and_goes_with_any_change() {
        let b = DirtyBlock::summed(vec![5u8; 4096]);
        assert_eq!(
            b.fletcher4(),
            Some(&crate::dmu::checksum::fletcher4(&[5u8; 4096]))
        );
        // Reading leaves it.
        let shared = Arc::clone(&b);
        assert_eq!(shared.len(), 4096);
        assert!(b.fletcher4().is_some());
        // Writing in place (or a copy on write) drops it.
        let mut w = b.clone();
        Arc::make_mut(&mut w)[0] = 1;
        assert!(w.fletcher4().is_none());
        assert!(b.fletcher4().is_some(), "the original is unchanged");
        // So does a new buffer.
        let mut r = b.clone();
        *r = Arc::new(vec![0u8; 4096]);
        assert!(r.fletcher4().is_none());
        // A block made from bytes alone has none.
        assert!(DirtyBlock::from(vec![0u8; 16]).fletcher4().is_none());
    }
}
