//! Claim and replay at import (see the theory comment in `zil/mod.rs`).

use super::{read_chain, LogHeader};
use crate::dmu::changelog;
use crate::error::{Error, Result};
use crate::spa::log_space::LogLoc;
use crate::spa::Pool;

/// What replay found and did, per pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayReport {
    pub datasets: usize,
    pub blocks: usize,
    pub records: usize,
}

impl Pool {
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
        for ds in self.datasets() {
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
            let name = self.ds_name(&ds.rel());
            let todo: Vec<_> = chain
                .records
                .into_iter()
                .filter(|(txg, _)| *txg > committed)
                .collect();
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
            for (i, (txg, rec)) in todo.iter().enumerate() {
                changelog::apply(&ds.os, rec).map_err(|e| {
                    Error::corrupt(
                        "intent log",
                        format!(
                            "'{name}': record {} of {n} (txg {txg}) does not apply: {e}",
                            i + 1
                        ),
                    )
                })?;
            }
            log::info!(
                "'{name}': replayed {n} intent log records from {} log blocks",
                chain.blocks.len()
            );
            report.datasets += 1;
            report.blocks += chain.blocks.len();
            report.records += n;
        }
        if self.tun.readonly {
            return Ok(report);
        }
        for ds in self.datasets() {
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
