//! Mirrors and single disks (OpenZFS vdev_mirror.c; a single disk is a
//! mirror of one here, as its reads and writes are a mirror's with one
//! side).
//!
//! Every column holds the whole block at the block's own offset, padded
//! to its allocation. A read tries the columns in turn until a copy
//! verifies, then rewrites the copies that failed; a thorough read (scrub,
//! zdb) reads every copy, attached leaves included, and repairs each one
//! that does not verify.

use super::leaf::column_source;
use super::ops::{Columns, Extent, Geometry, ReadOutcome, ReadReq, VdevOps};
use super::top::{is_power_lost, TopVdev};
use super::{Leaf, VdevStats};
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::sync::Arc;

/// An N-way mirror, or (`single`) one disk.
pub struct Mirror {
    pub single: bool,
}

pub static MIRROR: Mirror = Mirror { single: false };
pub static DISK: Mirror = Mirror { single: true };

/// `phys` padded with zeros to `len` (copied only when it is shorter).
pub fn padded(phys: &[u8], len: u64) -> Cow<'_, [u8]> {
    if phys.len() as u64 >= len {
        return Cow::Borrowed(phys);
    }
    let mut p = phys.to_vec();
    p.resize(len as usize, 0);
    Cow::Owned(p)
}

impl VdevOps for Mirror {
    fn redundancy(&self, width: usize) -> usize {
        width.saturating_sub(1)
    }

    fn check_width(&self, width: usize) -> std::result::Result<(), String> {
        match (self.single, width) {
            (true, 1) => Ok(()),
            (true, _) => Err("a disk vdev has exactly one device".into()),
            (false, 0 | 1) => Err("a mirror needs at least two devices".into()),
            (false, _) => Ok(()),
        }
    }

    fn space(&self, _g: &Geometry, raw: u64) -> u64 {
        raw
    }

    fn child_need(&self, _g: &Geometry, asize: u64) -> u64 {
        asize
    }

    fn asize(&self, g: &Geometry, psize: u64) -> u64 {
        let a = 1u64 << g.ashift;
        psize.div_ceil(a) * a
    }

    fn extents(&self, g: &Geometry, offset: u64, psize: u64) -> Vec<Extent> {
        (0..g.width)
            .map(|child| Extent {
                child,
                offset,
                size: psize,
            })
            .collect()
    }

    fn columns<'a>(&self, top: &TopVdev, offset: u64, phys: &'a [u8], asize: u64) -> Columns<'a> {
        Columns {
            bufs: vec![padded(phys, asize)],
            cols: (0..top.children.len()).map(|c| (c, offset, 0)).collect(),
        }
    }

    fn read(&self, top: &TopVdev, req: &ReadReq<'_>) -> Result<ReadOutcome> {
        let mut bad: Vec<(Arc<Leaf>, &'static str)> = Vec::new();
        let mut good: Option<Vec<u8>> = None;
        let mut last_err = None;
        let sources: Vec<Arc<Leaf>> = if req.thorough {
            top.leaves()
                .into_iter()
                .filter(|l| l.is_usable() && !l.dtl_covers(req.birth))
                .collect()
        } else {
            top.children
                .iter()
                .filter_map(|c| column_source(c, req.birth))
                .collect()
        };
        for src in sources {
            let mut buf = vec![0u8; req.psize as usize];
            match src.read(&mut buf, req.offset) {
                Err(e) if is_power_lost(&e) => return Err(e),
                Err(e) => {
                    last_err = Some(e);
                    bad.push((src, "I/O error"));
                }
                Ok(()) if (req.verify)(&buf) => {
                    good.get_or_insert(buf);
                    if !req.thorough {
                        break;
                    }
                }
                Ok(()) => {
                    if req.repair {
                        VdevStats::bump(&src.stats.cksum_errors, 1);
                    }
                    bad.push((src, "checksum mismatch"));
                }
            }
        }
        let Some(g) = good else {
            return Err(Error::Checksum(format!(
                "no valid copy on {}{}",
                top.name(),
                last_err
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            )));
        };
        let mut repaired = 0;
        if req.repair {
            let p = padded(&g, top.geometry().asize(g.len() as u64));
            for (l, _) in &bad {
                // Best effort: a failed repair leaves the copy bad, counted.
                if l.write(&p, req.offset).is_ok() {
                    repaired += p.len() as u64;
                }
            }
        }
        Ok(ReadOutcome {
            data: g,
            repaired,
            bad,
        })
    }

    fn replicated(&self) -> bool {
        true
    }
}
