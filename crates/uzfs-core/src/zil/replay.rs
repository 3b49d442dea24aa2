//! Claim and replay at import (see the theory comment in `zil/mod.rs`).

use super::{read_chain, LogHeader};
use crate::dmu::blkptr::BlkPtr;
use crate::dmu::changelog;
use crate::error::{Error, Result};
use crate::spa::log_space::LogLoc;
use crate::spa::Pool;
use std::cell::RefCell;
use std::collections::HashMap;

/// What replay found and did, per pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayReport {
    pub datasets: usize,
    pub blocks: usize,
    pub records: usize,
    /// Data blocks the replayed records named by pointer.
    pub indirect: usize,
}

/// Blocks named by pointer, read and verified at claim: by (vdev, offset
/// of the first copy, checksum).
type LoggedBlocks = HashMap<(u32, u64, [u8; 32]), Vec<u8>>;

fn logged_key(bp: &BlkPtr) -> (u32, u64, [u8; 32]) {
    (bp.dva[0].vdev, bp.dva[0].offset, bp.checksum)
}

impl Pool {
    /// Claim the data blocks the records name by pointer (written early
    /// for a txg that never committed, so in no space map) and read each
    /// back (verified; replay uses these bytes, so each is read once).
    /// Returns how many records lead the log with all theirs in place: a
    /// block not written whole belongs to a commit that never returned
    /// (its log block and data were written together), so the log ends
    /// before that record.
    fn claim_indirect(&self, todo: &[(u64, Vec<u8>)]) -> (usize, LoggedBlocks) {
        let mut st = crate::spa::lock(&self.st);
        let mut got = LoggedBlocks::new();
        for (i, (_, rec)) in todo.iter().enumerate() {
            // A record that does not decode fails replay with its error.
            let Ok(bps) = changelog::indirect_blocks(rec) else {
                return (todo.len(), got);
            };
            for bp in &bps {
                let dvas: Vec<_> = bp.dva.iter().filter(|d| d.is_valid()).collect();
                let claimed = !dvas.is_empty()
                    && dvas.iter().all(|d| {
                        self.log_space.claim(
                            &mut st.alloc,
                            &LogLoc {
                                vdev: d.vdev,
                                offset: d.offset,
                                asize: d.asize,
                                psize: bp.psize,
                            },
                        )
                    });
                let phys = if claimed {
                    self.read_logged_phys(bp)
                } else {
                    None
                };
                let Some(phys) = phys else {
                    return (i, got);
                };
                got.insert(logged_key(bp), phys);
            }
        }
        (todo.len(), got)
    }

    /// The stored bytes of a block a log record names, from the first copy
    /// that verifies. Read quietly (a block never written is expected at
    /// the end of a log) and from every leaf: the block's birth is a txg
    /// that never committed, which a leaf's DTL knows nothing about.
    fn read_logged_phys(&self, bp: &BlkPtr) -> Option<Vec<u8>> {
        let psize = bp.psize as usize;
        let verify =
            |b: &[u8]| b.len() >= psize && bp.checksum_type.compute(&b[..psize]) == bp.checksum;
        bp.dva.iter().filter(|d| d.is_valid()).find_map(|d| {
            let top = self.io.top(d.vdev).ok()?;
            if d.offset.checked_add(d.asize).is_none_or(|e| e > top.asize) {
                return None;
            }
            let mut b = top.read_quiet(d.offset, psize as u64, 0, &verify).ok()?;
            b.truncate(psize);
            Some(b)
        })
    }

    /// A `WRITE_INDIRECT` block's logical bytes (replay): as
    /// `claim_indirect` read them.
    fn read_logged_block(&self, bp: &BlkPtr, got: &RefCell<LoggedBlocks>) -> Result<Vec<u8>> {
        let phys = match got.borrow_mut().remove(&logged_key(bp)) {
            Some(p) => Some(p),
            None => self.read_logged_phys(bp),
        };
        let phys = phys.ok_or_else(|| {
            Error::corrupt("intent log", "a data block the log names does not verify")
        })?;
        crate::dmu::compress::decompress_owned(bp.compress, phys, bp.lsize as usize)
    }

    /// Walk every dataset's log chain, claiming its blocks; apply the
    /// records of txgs after `committed` to the object sets; attach the
    /// intent logs; commit the replay (its txg writes headers that name no
    /// old chain); give the claimed blocks back. A read-only import only
    /// counts what it leaves unreplayed.
    pub(crate) fn replay_logs(&self, committed: u64) -> Result<ReplayReport> {
        let mut report = ReplayReport::default();
        // A log device that is not there: its part of the log cannot be
        // read. OpenZFS refuses such an import unless `-m`. (One that was
        // faulted before the last txg holds nothing needed: commits moved
        // to the pool's space and a txg carried what it had.)
        let logs = self.log_vdevs();
        for t in self.io.tops().iter().filter(|t| logs.contains(&t.id)) {
            if !t.is_functional() {
                self.log_space.set_avoid(t.id, true, None);
            }
        }
        let missing: Vec<(u32, String)> = self
            .io
            .tops()
            .iter()
            .filter(|t| logs.contains(&t.id) && t.leaves().iter().all(|l| l.is_missing()))
            .map(|t| {
                (
                    t.id,
                    t.leaves()
                        .iter()
                        .map(|l| l.path.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })
            .collect();
        if !missing.is_empty() {
            let list: Vec<&str> = missing.iter().map(|m| m.1.as_str()).collect();
            if !self.tun.missing_log_ok && !self.tun.readonly {
                return Err(Error::invalid(format!(
                    "cannot import '{}': log device missing ({}): the last synchronous writes may be on it; 'zpool import -m' imports without it and discards what it held",
                    self.name,
                    list.join("; ")
                )));
            }
            for (v, _) in &missing {
                self.log_space.set_avoid(*v, true, None);
            }
            log::warn!(
                "pool '{}': log device missing ({}): intent log records on it are discarded",
                self.name,
                list.join("; ")
            );
        }
        for ds in self.dsl_pool().datasets() {
            let Some(h) = LogHeader::decode(ds.os.opened_log_header()) else {
                continue;
            };
            let read = |loc: &LogLoc, verify: &dyn Fn(&[u8]) -> bool| {
                let top = self.io.top(loc.vdev).ok()?;
                if loc
                    .offset
                    .checked_add(loc.asize)
                    .is_none_or(|e| e > top.asize)
                {
                    return None;
                }
                top.read_quiet(loc.offset, loc.psize as u64, 0, verify).ok()
            };
            let chain = {
                let mut st = crate::spa::lock(&self.st);
                let readonly = self.tun.readonly;
                read_chain(&h, &read, &mut |loc| {
                    if readonly {
                        return true;
                    }
                    self.log_space.claim(&mut st.alloc, loc)
                })
            };
            let name = self.dsl_pool().ds_name(&ds.rel());
            let mut todo: Vec<_> = chain
                .records
                .into_iter()
                .filter(|(txg, _)| *txg > committed)
                .collect();
            let mut got = LoggedBlocks::new();
            if !self.tun.readonly {
                let ok;
                (ok, got) = self.claim_indirect(&todo);
                if ok < todo.len() {
                    log::warn!(
                        "'{name}': intent log record {} of {} names a data block that was never written whole; the log ends there",
                        ok + 1,
                        todo.len()
                    );
                    todo.truncate(ok);
                }
            }
            if todo.is_empty() {
                continue;
            }
            if self.tun.readonly {
                log::warn!(
                    "'{name}': {} intent log records not replayed (read-only import): the last synchronous writes before the crash are not visible",
                    todo.len()
                );
                continue;
            }
            let n = todo.len();
            let got = RefCell::new(got);
            for (i, (txg, rec)) in todo.iter().enumerate() {
                changelog::apply(&ds.os, rec, &|bp| self.read_logged_block(bp, &got)).map_err(
                    |e| {
                        Error::corrupt(
                            "intent log",
                            format!(
                                "'{name}': record {} of {n} (txg {txg}) does not apply: {e}",
                                i + 1
                            ),
                        )
                    },
                )?;
            }
            log::info!(
                "'{name}': replayed {n} intent log records from {} log blocks",
                chain.blocks.len()
            );
            report.datasets += 1;
            report.blocks += chain.blocks.len();
            report.records += n;
            report.indirect += todo
                .iter()
                .map(|(_, r)| changelog::indirect_blocks(r).map_or(0, |b| b.len()))
                .sum::<usize>();
        }
        if self.tun.readonly {
            return Ok(report);
        }
        for ds in self.dsl_pool().datasets() {
            self.attach_zil(&ds)?;
        }
        if report.records > 0 {
            self.sync()?;
        }
        let mut st = crate::spa::lock(&self.st);
        self.log_space.release_claims(&mut st.alloc);
        Ok(report)
    }
}
