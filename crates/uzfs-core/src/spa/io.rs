//! The SPA's block I/O: reading a block pointer with verification and
//! self-healing, writing a block's physical bytes to its DVAs.
//!
//! # Self-healing read
//!
//! For each DVA (ditto copy) in turn, and for each side of a mirror in turn,
//! read `psize` bytes and verify the checksum from the block pointer. An I/O
//! error counts a READ error on that leaf, a mismatch a CKSUM error. The first
//! copy that verifies is returned, after it has been written back over every
//! copy that failed (on this DVA and on earlier DVAs), so the next read finds
//! them repaired. Only when no copy verifies does the read fail, and the error
//! names the block. Writing a repair is safe although it is an overwrite:
//! it restores the exact bytes the block pointer already vouches for.

use crate::arc::BlockCache;
use crate::dmu::blkptr::{BlkPtr, Dva, DVA_REMAPPED};
use crate::dmu::compress;
use crate::dmu::objset::BlockReader;
use crate::error::{Error, Result};
use crate::vdev::{TopVdev, VdevStats};
use std::sync::{Arc, RwLock};

pub struct SpaIo {
    pub vdevs: RwLock<Vec<Arc<TopVdev>>>,
    pub cache: BlockCache,
}

/// Outcome of checking one copy of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyStatus {
    Good,
    IoError(String),
    BadChecksum,
}

impl SpaIo {
    pub fn new(vdevs: Vec<Arc<TopVdev>>, cache_bytes: u64) -> Self {
        SpaIo {
            vdevs: RwLock::new(vdevs),
            cache: BlockCache::new(cache_bytes),
        }
    }

    pub fn top(&self, id: u32) -> Result<Arc<TopVdev>> {
        self.vdevs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id as usize)
            .cloned()
            .ok_or_else(|| {
                Error::corrupt(
                    "block pointer",
                    format!("DVA names vdev {id}, which does not exist"),
                )
            })
    }

    pub fn tops(&self) -> Vec<Arc<TopVdev>> {
        self.vdevs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn check_dva(&self, dva: &Dva, psize: u32) -> Result<Arc<TopVdev>> {
        if dva.flags & DVA_REMAPPED != 0 {
            return Err(Error::Unsupported(
                "block is remapped (feature com.uzfs:block_remap), which this build cannot read"
                    .into(),
            ));
        }
        let top = self.top(dva.vdev)?;
        if dva
            .offset
            .checked_add(psize as u64)
            .is_none_or(|e| e > top.asize)
        {
            return Err(Error::corrupt(
                "block pointer",
                format!(
                    "DVA {}:{:#x} lies past the end of the vdev",
                    dva.vdev, dva.offset
                ),
            ));
        }
        Ok(top)
    }

    /// Read one child's copy of one DVA and report whether it verifies.
    pub fn check_copy(
        &self,
        bp: &BlkPtr,
        dva_idx: usize,
        child: usize,
    ) -> (CopyStatus, Option<Vec<u8>>) {
        let dva = bp.dva[dva_idx];
        let top = match self.check_dva(&dva, bp.psize) {
            Ok(t) => t,
            Err(e) => return (CopyStatus::IoError(e.to_string()), None),
        };
        let Some(leaf) = top.children.get(child) else {
            return (CopyStatus::IoError("no such child".into()), None);
        };
        let mut buf = vec![0u8; bp.psize as usize];
        match leaf.read(&mut buf, dva.offset) {
            Err(e) => (CopyStatus::IoError(e.to_string()), None),
            Ok(()) if bp.checksum_type.compute(&buf) == bp.checksum => {
                (CopyStatus::Good, Some(buf))
            }
            Ok(()) => (CopyStatus::BadChecksum, None),
        }
    }

    /// Read the physical bytes of `bp`, verified, healing bad copies.
    pub fn read_phys(&self, bp: &BlkPtr) -> Result<Vec<u8>> {
        if bp.is_hole() {
            return Err(Error::invalid("read of a hole"));
        }
        let mut bad: Vec<(Arc<TopVdev>, usize, u64)> = Vec::new();
        let mut last_err = None;
        for (i, dva) in bp.dva.iter().enumerate().filter(|(_, d)| d.is_valid()) {
            let top = match self.check_dva(dva, bp.psize) {
                Ok(t) => t,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            for c in 0..top.children.len() {
                if top.children[c].is_missing() {
                    continue;
                }
                match self.check_copy(bp, i, c) {
                    (CopyStatus::Good, Some(buf)) => {
                        for (t, child, off) in &bad {
                            if let Some(leaf) = t.children.get(*child) {
                                // Best effort: a failed repair leaves the copy bad, counted.
                                let _ = leaf.write(&buf, *off);
                            }
                        }
                        return Ok(buf);
                    }
                    (CopyStatus::BadChecksum, _) => {
                        VdevStats::bump(&top.children[c].stats.cksum_errors, 1);
                        bad.push((top.clone(), c, dva.offset));
                    }
                    (CopyStatus::IoError(e), _) => {
                        if e.contains("lost power") {
                            return Err(Error::PowerLost);
                        }
                        last_err = Some(Error::invalid(e));
                        bad.push((top.clone(), c, dva.offset));
                    }
                    (CopyStatus::Good, None) => {}
                }
            }
        }
        Err(Error::Checksum(format!(
            "no valid copy of block [{bp}]{}",
            last_err
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        )))
    }

    /// Write physical bytes to every DVA.
    pub fn write_phys(&self, dvas: &[Dva], phys: &[u8]) -> Result<()> {
        for d in dvas.iter().filter(|d| d.is_valid()) {
            let top = self.top(d.vdev)?;
            if (phys.len() as u64) < d.asize {
                // Pad to the allocated size so the whole sector range is defined.
                let mut padded = phys.to_vec();
                padded.resize(d.asize as usize, 0);
                top.write(&padded, d.offset)?;
            } else {
                top.write(phys, d.offset)?;
            }
        }
        Ok(())
    }
}

impl BlockReader for SpaIo {
    fn read_bp(&self, bp: &BlkPtr) -> Result<Arc<Vec<u8>>> {
        let mut ck = [0u8; 16];
        ck.copy_from_slice(&bp.checksum[..16]);
        let key = (bp.dva[0].vdev, bp.dva[0].offset, ck);
        if let Some(v) = self.cache.get(&key) {
            return Ok(v);
        }
        let phys = self.read_phys(bp)?;
        let data = Arc::new(compress::decompress(bp.compress, &phys, bp.lsize as usize)?);
        self.cache.insert(key, data.clone());
        Ok(data)
    }
}
