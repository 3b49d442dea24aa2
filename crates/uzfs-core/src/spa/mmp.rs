//! Multihost protection: refusing to import a pool another host is
//! writing (OpenZFS MMP, `zpool set multihost=on`).
//!
//! # Theory
//!
//! On one machine, one owner per pool is enforced by locks: the daemon's
//! run-directory lock and a lock on every device it imports (`flock`, plus
//! `O_EXCL` on block devices). Locks do not cross machines: two hosts that
//! see the same shared disk (a SAN LUN, an iSCSI or NBD export, a file on
//! a network filesystem) could both import the pool and destroy it within
//! seconds. The only thing both hosts share is the disk, so the disk must
//! say whether the pool is alive.
//!
//! With `multihost=on`, the importing host stamps the pool every
//! `mmp_interval` (1 s): it rewrites its last committed uberblock, with a
//! sequence number bumped and its host id, into a slot reserved for this
//! in every label's uberblock ring (the ring's last; txgs use the others,
//! `vdev/label.rs`). Each stamp goes to one label of one leaf, rotating.
//! Every txg's own uberblocks carry the stamp fields too.
//!
//! A host importing a pool whose newest uberblock carries a stamp, whose
//! labels say it is imported (not exported) and whose stamp is not this
//! host's, first watches it: for `mmp_import_intervals` (10) of the
//! writer's intervals it re-reads the newest uberblock of every label. Any
//! change (a new txg, a new stamp) means another host is writing: the
//! import is refused, naming that host. No change means the writer is gone
//! (crashed, powered off): the import proceeds. `zpool import -f` does not
//! skip this check (OpenZFS does not either): forcing cannot make a live
//! pool safe to share.
//!
//! A stamp written by this host (same `hostid`) is not checked: that is
//! the same host after a crash, where the device locks already decide.
//! Hosts must therefore have distinct host ids (`/etc/hostid`,
//! `zgenhostid`); `multihost=on` is refused while the host id is 0.
//!
//! What this does not do (OpenZFS does): suspend the pool when its own
//! stamps cannot be written for too long, so a host that lost its disks
//! cannot come back and write after another host imported the pool.

use super::config::PoolState;
use super::import::{best_uberblock, FoundPool};
use super::uberblock::{MmpStamp, Uberblock};
use super::{lock, Pool, Tunables};
use crate::error::{Error, Result};
use crate::vdev::label;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The stamping thread of one pool.
#[derive(Default)]
pub(crate) struct MmpCtl {
    /// `multihost=on` (read by the sync without taking `st`).
    on: AtomicBool,
    /// The last stamp's sequence number.
    seq: AtomicU64,
    /// Stamps written (tests and `zpool status` diagnostics).
    written: AtomicU64,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Pool {
    /// The stamp every uberblock the sync writes carries (None while
    /// `multihost=off`).
    pub(crate) fn mmp_stamp(&self) -> Option<MmpStamp> {
        self.mmp
            .on
            .load(Ordering::Relaxed)
            .then(|| self.stamp(self.mmp.seq.load(Ordering::Relaxed)))
    }

    /// This host's stamp with sequence number `seq`.
    fn stamp(&self, seq: u64) -> MmpStamp {
        MmpStamp {
            interval_ms: self.tun.mmp_interval.as_millis() as u64,
            seq,
            hostid: self.tun.hostid,
        }
    }

    /// Activity stamps written since import (0 while `multihost=off`).
    pub fn mmp_stamps_written(&self) -> u64 {
        self.mmp.written.load(Ordering::Relaxed)
    }

    /// `zpool set multihost=on|off`.
    pub fn set_multihost(self: &Arc<Self>, on: bool) -> Result<()> {
        if on && self.tun.hostid == 0 {
            return Err(Error::invalid(
                "cannot set property 'multihost': requires a non-zero system hostid (zgenhostid, or UZFS_HOSTID for the daemon)",
            ));
        }
        self.update_props(|p| p.multihost = on)?;
        if on {
            self.start_mmp();
        } else {
            self.stop_mmp();
        }
        Ok(())
    }

    /// Start stamping at an import, after the newest stamp found (`seq`).
    pub(crate) fn start_mmp_after(self: &Arc<Self>, seq: u64) {
        self.mmp.seq.fetch_max(seq, Ordering::Relaxed);
        self.start_mmp();
    }

    /// Start stamping (`multihost=on`, or an import of such a pool).
    pub(crate) fn start_mmp(self: &Arc<Self>) {
        if self.tun.hostid == 0 || self.mmp.on.swap(true, Ordering::Relaxed) {
            return;
        }
        self.mmp.stop.store(false, Ordering::Relaxed);
        let weak = Arc::downgrade(self);
        let stop = self.mmp.stop.clone();
        let interval = self.tun.mmp_interval.max(Duration::from_millis(10));
        let h = std::thread::Builder::new()
            .name(format!("mmp:{}", self.name))
            .spawn(move || {
                let mut k = 0u64;
                loop {
                    let until = Instant::now() + interval;
                    while Instant::now() < until {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(10).min(interval));
                    }
                    let Some(p) = weak.upgrade() else { return };
                    if let Err(e) = p.mmp_write(k) {
                        log::warn!("pool '{}': multihost stamp not written: {e}", p.name);
                    }
                    k += 1;
                }
            });
        match h {
            Ok(h) => *lock(&self.mmp.thread) = Some(h),
            Err(e) => log::error!(
                "pool '{}': cannot start the multihost thread: {e}",
                self.name
            ),
        }
    }

    /// Stop stamping (export, `multihost=off`).
    pub(crate) fn stop_mmp(&self) {
        self.mmp.on.store(false, Ordering::Relaxed);
        self.mmp.stop.store(true, Ordering::Relaxed);
        if let Some(h) = lock(&self.mmp.thread).take() {
            let _ = h.join();
        }
    }

    /// Stamp `k`: the last committed uberblock, restamped, into the
    /// multihost slot of one label of one leaf (rotating over all).
    fn mmp_write(&self, k: u64) -> Result<()> {
        let Some(ub) = self.published().ub else {
            return Ok(());
        };
        let seq = self.mmp.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let stamp = Uberblock {
            timestamp: super::scan::now_secs(),
            mmp: Some(self.stamp(seq)),
            ..ub
        };
        let leaves: Vec<_> = self
            .io
            .tops()
            .iter()
            .flat_map(|t| {
                let slot = label::ub_slot_size(t.ashift);
                t.leaves()
                    .into_iter()
                    .filter(|l| l.is_usable())
                    .map(move |l| (l, slot))
            })
            .collect();
        if leaves.is_empty() {
            return Ok(());
        }
        let (leaf, slot) = &leaves[(k % leaves.len() as u64) as usize];
        let labels = label::label_offsets(leaf.dev.size());
        let off = labels[((k / leaves.len() as u64) % labels.len() as u64) as usize];
        let at = off + label::ub_mmp_slot(*slot);
        leaf.write_raw(&stamp.encode(*slot as usize, at), at)?;
        self.mmp.written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Before importing `found` (newest uberblock `ub`): if another host may
/// be writing it, watch it and refuse if it is (theory above).
pub(crate) fn activity_check(
    found: &FoundPool,
    ub: &Uberblock,
    tun: &Tunables,
    ashift_of: impl Fn(u64) -> u8,
) -> Result<()> {
    let cfg = &found.config;
    let Some(m) = ub.mmp else { return Ok(()) };
    if cfg.state != PoolState::Active || (m.hostid != 0 && m.hostid == tun.hostid) {
        return Ok(());
    }
    let interval = Duration::from_millis(m.interval_ms.clamp(10, 60_000));
    let wait = interval * tun.mmp_import_intervals.max(1);
    log::info!(
        "pool '{}' was last written by hostid {:08x} with multihost=on: watching it for {} ms",
        cfg.name,
        m.hostid,
        wait.as_millis()
    );
    let start = Instant::now();
    while start.elapsed() < wait {
        std::thread::sleep((interval / 2).min(wait.saturating_sub(start.elapsed())));
        let Some(now) = best_uberblock(&found.devices, cfg.pool_guid, &ashift_of) else {
            continue;
        };
        if now != *ub {
            let host = now.mmp.map_or(m.hostid, |n| n.hostid);
            return Err(Error::invalid(format!(
                "cannot import '{}': pool is imported on another host ('{}', hostid {host:08x}) and is being written now (multihost=on); export it there first",
                cfg.name, cfg.hostname
            )));
        }
    }
    Ok(())
}
