//! Growing a pool whose devices grew (OpenZFS `vdev_expand`: the
//! `autoexpand` property and `zpool online -e`).
//!
//! # Theory
//!
//! A top-level vdev's address space is `asize` bytes, a whole number of
//! metaslabs of `2^ms_shift` bytes, derived at create from its smallest
//! leaf. Leaves can later hold more than the vdev uses: a mirror's sides
//! replaced by bigger disks, files or LUNs enlarged. That space stays unused
//! (and `zpool list` shows it as `EXPANDSZ`) until the vdev *expands*:
//!
//! 1. every leaf of the vdev adopts its device's current size
//!    (`BlockDevice::adopt_size`); label positions follow from a device's
//!    size, so labels L2 and L3 move to the new end;
//! 2. the new `asize` is computed from the smallest leaf as at create, with
//!    the same `ms_shift`, so existing metaslabs and every block address
//!    stay as they are: only metaslabs are added after the last one;
//! 3. the new metaslabs' space maps are created in the MOS and appended to
//!    the vdev's metaslab array, the allocator gains empty metaslabs and the
//!    config records the new `asize`;
//! 4. one txg commits all of it. Its config write puts whole labels (config
//!    and uberblock ring) at the new end.
//!
//! A vdev grows only when all its leaves did: a missing leaf (size 0) or a
//! side still small keeps it as it is, as OpenZFS.
//!
//! # Crash safety
//!
//! Until that txg's uberblock is durable, import reads the old `asize` and
//! metaslab count from the MOS (the authoritative config) and the space
//! past the old end is unused, whatever labels say. Labels at the old end
//! are left in what becomes allocatable space, where nothing looks for
//! them. A device that grew before import is opened at its new size: its
//! labels at the new end do not exist yet, and L0 and L1 carry the pool.
//!
//! # When it runs
//!
//! `zpool online -e` expands the named device's vdev. With `autoexpand=on`,
//! setting the property, importing the pool, `zpool online` and the zed
//! check after each sync (`Pool::zed_check`: a device grew while imported,
//! a replace by a bigger device finished; at most once a second) expand
//! every vdev that can grow.

use super::{append_space_maps, lock, Pool};
use crate::error::Result;
use crate::vdev::{self, label, BlockDevice, TopVdev};
use std::sync::Arc;

/// The address space `top` would have with leaf devices of the sizes
/// `size` gives (its `asize` when none grew).
fn grown_asize(top: &TopVdev, size: impl Fn(&dyn BlockDevice) -> u64) -> u64 {
    let smallest = top
        .leaves()
        .iter()
        .map(|l| size(&*l.dev))
        .min()
        .unwrap_or(0);
    let raw =
        label::aligned_size(smallest).saturating_sub(vdev::LABEL_START_SIZE + vdev::LABEL_END_SIZE);
    let raw = top.geometry().space(raw);
    (raw >> top.ms_shift << top.ms_shift).max(top.asize)
}

impl Pool {
    /// Bytes each top-level vdev would gain if expanded now (`EXPANDSZ`).
    pub fn expand_sizes(&self) -> Vec<u64> {
        self.io
            .tops()
            .iter()
            .map(|t| grown_asize(t, |d| d.current_size()) - t.asize)
            .collect()
    }

    /// Expand the top-level vdev `which` (`None`: every one) to what its
    /// devices hold now, and commit. Returns the bytes added.
    pub fn expand(&self, which: Option<u32>) -> Result<u64> {
        let mut added = 0;
        {
            let _g = self.sync_guard()?;
            let mut st = lock(&self.st);
            for top in self.io.tops() {
                if which.is_some_and(|w| w != top.id)
                    || grown_asize(&top, |d| d.current_size()) == top.asize
                {
                    continue;
                }
                for l in top.leaves() {
                    l.dev.adopt_size();
                }
                let asize = grown_asize(&top, |d| d.size());
                if asize == top.asize {
                    continue;
                }
                let id = top.id as usize;
                let (from, to) = (top.asize >> top.ms_shift, asize >> top.ms_shift);
                let Some(cfg) = st.config.vdev_tree.get_mut(id) else {
                    continue;
                };
                let sms = append_space_maps(&self.mos, cfg.ms_array, from, to)?;
                cfg.asize = asize;
                if let Some(v) = st.alloc.vdevs.get_mut(id) {
                    v.grow(asize, &sms);
                }
                self.io.vdevs.write().unwrap_or_else(|e| e.into_inner())[id] =
                    top.with_asize(asize);
                st.config_dirty = true;
                log::info!(
                    "pool '{}': vdev {} expanded from {} to {} bytes ({} metaslabs added)",
                    self.name,
                    top.name(),
                    top.asize,
                    asize,
                    to - from
                );
                added += asize - top.asize;
            }
        }
        if added > 0 {
            self.sync()?;
        }
        Ok(added)
    }

    /// `zpool online -e DEV`: expand the vdev the device belongs to.
    pub fn online_expand(self: &Arc<Self>, name: &str) -> Result<u64> {
        let pos = self.leaf_or_err(name)?;
        self.online(name)?;
        self.expand(Some(pos.top as u32))
    }

    /// With `autoexpand=on`, expand whatever can grow (errors are logged:
    /// this runs after the operation that prompted it succeeded).
    pub fn autoexpand(&self) {
        if !self.props().autoexpand || self.readonly() || self.suspended().is_some() {
            return;
        }
        if self.expand_sizes().iter().all(|&g| g == 0) {
            return;
        }
        if let Err(e) = self.expand(None) {
            log::warn!("pool '{}': autoexpand failed: {e}", self.name);
        }
    }
}
