//! Partly written records: filled at the sync, not at the write.
//!
//! # Theory
//!
//! A write that covers part of a record (a 16 KiB database page in a 128
//! KiB record) needs the rest of the record before the record can be
//! written out whole, checksummed and compressed. OpenZFS reads it at the
//! write (`dmu_buf_will_dirty` → `dbuf_read`): when the record is not in
//! the ARC, the writer waits for a device read, one record at a time. Here
//! the writer does not wait. If the record's current contents are in
//! memory (the open or syncing txg holds it, or the ARC does) the write
//! copies them as before; otherwise the open txg holds a *partial* block:
//! the bytes written, and the [`Ranges`] they cover
//! (`DirtyObj::partial`). Everything else of the record is whatever lies
//! below the open txg: the syncing txg's version of it, else the last
//! synced tree.
//!
//! **What a partial block holds.** Only the bytes written, one range
//! after the other in a compact buffer ([`Ranges::patch`]), and the dirty
//! bound is charged for those bytes. Under a mount (`deferring`) this
//! holds also for a record the ARC has: a 4 KiB page the kernel writes
//! back into a cached 128 KiB record costs 4 KiB of the bound, and the
//! sync copies the rest from the cache. Before, the write copied the
//! record and charged all of it, so 4 KiB writes with an fsync each over
//! a 256 MiB file filled the 256 MiB bound of a 512 MiB `arc_max` at
//! 2,000 pages: a sync every half second rewrote a record per page, 3.6
//! GB written to the devices in 10 s against 0.9 GB with a bound ten
//! times larger (bench/RESULTS.md, "cached records patched in place").
//! The sync fills and writes partial blocks in batches of 32 MiB of
//! whole records (`apply_blocks`), so what it holds whole at once stays
//! bounded however many records a txg patched.
//!
//! - **More writes** to the record in the same txg patch the buffer and
//!   grow the ranges; once the ranges cover the record it is an ordinary
//!   whole block, and nothing is ever read (a file rewritten in small
//!   sequential pieces).
//! - **A read** of the record (`Objset::read_block`) resolves what lies
//!   below, lays the ranges over it ([`merge`]) and, for the open txg,
//!   puts the whole block in place of the partial one, so the next read
//!   is a memory copy again.
//! - **The sync** (`apply_blocks`) reads the record's old version for
//!   every partial block of the txg at once (on the `uzfs-zio-read`
//!   threads), lays the ranges over each, and writes the results with the
//!   other dirty blocks. Below a txg being synced lies exactly the tree
//!   the sync started from, so the record it reads is the one the writer
//!   would have read.
//! - **A punch, a free, a new block size** after a partial write drops
//!   it as it drops a whole block; before it, the write finds zeros in
//!   memory and writes a whole block.
//!
//! Why it is right: a partial block's meaning ("these bytes over what
//! lies below") never changes while it waits. What lies below the open
//! txg changes only when the syncing txg is published, and publication
//! replaces the syncing version with the tree it wrote, which holds the
//! same bytes. A whole write over a partial block, or a read that fills
//! it, makes it an ordinary block under the object set's lock, checked by
//! buffer identity, so a fill never overwrites a newer write.
//!
//! What it costs, measured (bench/RESULTS.md, "partly written records"):
//! the reads are not saved, only moved, and moved reads cost more. The old
//! version read ahead of the sync is often evicted again before it (a
//! second read), the sync's reads lengthen the txg and so the write
//! throttle's waits. bench/fs.sh with a 512 MiB `arc_max`: 16 KiB random
//! writes 0.83x, 4 KiB writes with fsync 0.85x, daemon CPU +20%; with
//! `UZFS_ARC_CACHE_WRITES=never` the 16 KiB random writes still ran at
//! 0.49x of keeping written data cached. So it is off by default
//! ([`set_fill_at_sync`]): a write of part of a record reads the record
//! first, before its txg hold (`zpl/fs.rs` warms it), as OpenZFS does.
//! Where it wins is a writer that bypasses the kernel's page cache (direct
//! I/O) into records not in the ARC: each FUSE write no longer waits for a
//! device read, and the sync's reads go out together (16 KiB O_DIRECT
//! random writes 1.36x, `bench/fill_at_sync.sh`).
//!
//! A base read the sync cannot do (every copy bad, or the
//! devices gone) fails the sync as a failed write does: the sync parks
//! until `zpool clear` issues the read again (`spa/suspend.rs`). Before,
//! the same read failed the write.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

static FILL_AT_SYNC: AtomicBool = AtomicBool::new(false);

/// Whether writes of part of a record that is not in memory leave a
/// partial block (fill at the sync) or read the record at once (the
/// default, as OpenZFS). The binary maps `UZFS_FILL_AT_SYNC=1` here; the
/// engine reads no environment. Off by default: on this VM it cost more
/// than it saved (bench/RESULTS.md, "partly written records").
pub fn set_fill_at_sync(on: bool) {
    FILL_AT_SYNC.store(on, Ordering::Relaxed);
}

pub fn fill_at_sync() -> bool {
    FILL_AT_SYNC.load(Ordering::Relaxed) || deferring_here()
}

thread_local! {
    static DEFER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread runs [`deferring`].
pub fn deferring_here() -> bool {
    DEFER.with(|d| d.get())
}

/// Run `f` with writes of part of a record that is not in memory leaving
/// a partial block, whatever [`set_fill_at_sync`] says: the POSIX layer's
/// writes under a mount whose kernel will send the record's other bytes
/// (`zpl/pagecache.rs`).
///
/// Such a partial block's old version is not read ahead into the cache
/// (as it is for fill-at-sync): the kernel's answer is expected to fill
/// it, and the sync reads it only if that answer falls short.
pub fn deferring<R>(f: impl FnOnce() -> R) -> R {
    crate::with_flag(&DEFER, f)
}

/// What happened to partly written records (a pool's, `SpaIo::partial`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Writes that left a partial block (no read at the write).
    pub deferred: u64,
    /// Partial blocks that later writes covered whole (never read).
    pub covered: u64,
    /// Partial blocks a read filled in.
    pub filled_by_read: u64,
    /// Partial blocks the sync filled in.
    pub filled_by_sync: u64,
    /// Writes of part of an uncached record whose other bytes came from
    /// the kernel's page cache above the mount (`zpl::PageCache`), not
    /// from a device.
    pub retrieved: u64,
    /// Writes that asked the kernel and did not get the whole record (it
    /// no longer held every page, or did not answer in time): read from
    /// a device instead.
    pub retrieve_missed: u64,
}

#[derive(Clone, Copy, Debug)]
pub enum Event {
    Deferred,
    Covered,
    FilledByRead,
    FilledBySync,
    Retrieved,
    RetrieveMissed,
}

/// The counters behind [`Stats`].
#[derive(Debug, Default)]
pub struct Counters([AtomicU64; 6]);

impl Counters {
    pub fn count(&self, e: Event) {
        self.0[e as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> Stats {
        let v = |i: usize| self.0[i].load(Ordering::Relaxed);
        Stats {
            deferred: v(0),
            covered: v(1),
            filled_by_read: v(2),
            filled_by_sync: v(3),
            retrieved: v(4),
            retrieve_missed: v(5),
        }
    }
}

/// Byte ranges `[start, end)` of a record that writes of the open txg
/// filled: sorted, disjoint and never touching (touching ranges merge).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges(Vec<(u32, u32)>);

impl Ranges {
    /// One range.
    pub fn new(start: usize, end: usize) -> Ranges {
        let mut r = Ranges::default();
        r.add(start, end);
        r
    }

    /// Add `[start, end)`, merging it with every range it touches.
    pub fn add(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start as u32, end as u32);
        // First range that ends at or after `s` (may touch it).
        let i = self.0.partition_point(|&(_, re)| re < s);
        let mut j = i;
        while j < self.0.len() && self.0[j].0 <= e {
            s = s.min(self.0[j].0);
            e = e.max(self.0[j].1);
            j += 1;
        }
        self.0.splice(i..j, [(s, e)]);
    }

    /// Whether the ranges cover all of `[0, len)`.
    pub fn covers(&self, len: usize) -> bool {
        self.0 == [(0, len as u32)] || len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.0.iter().map(|&(s, e)| (s as usize, e as usize))
    }

    /// Bytes the ranges cover: the length of their compact buffer.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|&(s, e)| (e - s) as usize).sum()
    }

    /// Write `src` at record offset `off` into a partial block held
    /// compactly: `data` holds the bytes of these ranges one after the
    /// other (nothing of the rest of the record), and both grow to take
    /// in `[off, off + src.len())`. Only the new range that absorbs the
    /// write is rebuilt; the ranges around it keep their bytes in place.
    pub fn patch(&mut self, data: &mut Vec<u8>, off: usize, src: &[u8]) {
        debug_assert_eq!(data.len(), self.bytes(), "compact buffer out of step");
        let (start, end) = (off, off + src.len());
        if start >= end {
            return;
        }
        // Ranges [i, j) touch the write and merge with it; `at` is where
        // range i's bytes start in `data`.
        let i = self.0.partition_point(|&(_, e)| (e as usize) < start);
        let at: usize = self.0[..i].iter().map(|&(s, e)| (e - s) as usize).sum();
        let mut j = i;
        let (mut s, mut e) = (start, end);
        while j < self.0.len() && (self.0[j].0 as usize) <= end {
            s = s.min(self.0[j].0 as usize);
            e = e.max(self.0[j].1 as usize);
            j += 1;
        }
        // One range absorbs the write and starts at or before it (a
        // record filled in order, a page rewritten): change it in place.
        if j == i + 1 && self.0[i].0 as usize == s {
            let re = self.0[i].1 as usize;
            let from = at + (start - s);
            if end <= re {
                data[from..from + src.len()].copy_from_slice(src);
            } else {
                data.splice(from..at + (re - s), src.iter().copied());
                self.0[i].1 = end as u32;
            }
            return;
        }
        let mut seg = vec![0u8; e - s];
        let mut pos = at;
        for &(rs, re) in &self.0[i..j] {
            let (rs, re) = (rs as usize, re as usize);
            seg[rs - s..re - s].copy_from_slice(&data[pos..pos + (re - rs)]);
            pos += re - rs;
        }
        seg[start - s..end - s].copy_from_slice(src);
        data.splice(at..pos, seg);
        self.0.splice(i..j, [(s as u32, e as u32)]);
    }
}

/// The whole record of `len` bytes: `base` (its contents below the
/// partial block; `None` is a hole, zeros) with the bytes of `ranges`
/// taken from `data`, their compact buffer ([`Ranges::patch`]). A base of
/// the wrong size is a damaged block, not a record to patch.
pub fn merge(
    base: Option<Arc<Vec<u8>>>,
    data: &[u8],
    ranges: &Ranges,
    len: usize,
) -> Result<Vec<u8>> {
    let mut out = match base {
        None => vec![0u8; len],
        Some(b) if b.len() == len => Arc::try_unwrap(b).unwrap_or_else(|b| b.to_vec()),
        Some(b) => {
            return Err(Error::corrupt(
                "data block",
                format!("{} bytes under a partly written block of {len}", b.len()),
            ))
        }
    };
    if data.len() != ranges.bytes() {
        return Err(Error::Internal(format!(
            "a partly written block holds {} bytes for ranges of {}",
            data.len(),
            ranges.bytes()
        )));
    }
    let mut pos = 0;
    for (s, e) in ranges.iter() {
        let Some(dst) = out.get_mut(s..e) else {
            return Err(Error::Internal(format!(
                "range {s}..{e} outside a block of {len}"
            )));
        };
        dst.copy_from_slice(&data[pos..pos + (e - s)]);
        pos += e - s;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::sim::SimRng;

    /// Ranges and their compact buffer against a byte map: after any
    /// sequence of patches, the ranges are sorted, disjoint, never
    /// touching, and cover exactly the bytes written; the compact buffer
    /// holds the latest byte written at each of them, in order; `covers`
    /// and `merge` agree with the map.
    #[test]
    fn patches_match_a_byte_map() {
        for seed in 0..500 {
            let mut rng = SimRng::new(seed);
            let len = 1 + rng.below(64) as usize;
            let mut r = Ranges::default();
            let mut data = Vec::new();
            // What each byte of the record holds if written.
            let mut map: Vec<Option<u8>> = vec![None; len];
            for step in 0..rng.below(12) {
                let s = rng.below(len as u64) as usize;
                let e = (s + rng.below(len as u64 + 1 - s as u64) as usize).min(len);
                let src: Vec<u8> = (s..e).map(|i| (i as u8 ^ step as u8) | 0x80).collect();
                r.patch(&mut data, s, &src);
                for i in s..e {
                    map[i] = Some(src[i - s]);
                }
                let mut last_end = None;
                for (s, e) in r.iter() {
                    assert!(s < e, "seed {seed}: empty range");
                    if let Some(le) = last_end {
                        assert!(s > le, "seed {seed}: ranges touch or overlap: {r:?}");
                    }
                    last_end = Some(e);
                }
                let want: Vec<u8> = map.iter().flatten().copied().collect();
                assert_eq!(data, want, "seed {seed}: compact buffer {r:?}");
                assert_eq!(r.bytes(), data.len(), "seed {seed}");
                let mut got = vec![false; len];
                for (s, e) in r.iter() {
                    got[s..e].iter_mut().for_each(|b| *b = true);
                }
                let written: Vec<bool> = map.iter().map(|b| b.is_some()).collect();
                assert_eq!(got, written, "seed {seed}: {r:?}");
                assert_eq!(
                    r.covers(len),
                    map.iter().all(|b| b.is_some()),
                    "seed {seed}"
                );
            }
            let base: Vec<u8> = (0..len).map(|i| i as u8 & 0x7f).collect();
            let m = merge(Some(Arc::new(base.clone())), &data, &r, len).expect("merge");
            let z = merge(None, &data, &r, len).expect("merge");
            for i in 0..len {
                assert_eq!(m[i], map[i].unwrap_or(base[i]), "seed {seed}");
                assert_eq!(z[i], map[i].unwrap_or(0), "seed {seed}");
            }
        }
    }

    /// `add` (ranges alone) and `patch` (ranges with their bytes) make
    /// the same ranges.
    #[test]
    fn add_and_patch_agree() {
        for seed in 0..200 {
            let mut rng = SimRng::new(seed);
            let len = 1 + rng.below(40) as usize;
            let (mut a, mut p, mut data) = (Ranges::default(), Ranges::default(), Vec::new());
            for _ in 0..rng.below(10) {
                let s = rng.below(len as u64) as usize;
                let e = (s + rng.below(len as u64 + 1 - s as u64) as usize).min(len);
                a.add(s, e);
                p.patch(&mut data, s, &vec![7u8; e - s]);
                assert_eq!(a, p, "seed {seed}");
            }
        }
    }

    #[test]
    fn a_base_of_the_wrong_size_is_refused() {
        let r = Ranges::new(0, 4);
        assert!(merge(Some(Arc::new(vec![0u8; 8])), &[1u8; 4], &r, 16).is_err());
        assert!(
            merge(None, &[1u8; 3], &r, 16).is_err(),
            "buffer out of step"
        );
    }
}
