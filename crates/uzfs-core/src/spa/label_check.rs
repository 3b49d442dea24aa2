//! Noticing a device whose labels vanished.
//!
//! A leaf can be blanked, truncated or swapped for another device behind
//! the pool's back (a `dd` over the wrong disk, a file truncated to 0, a
//! disk pulled and another put in its slot). Writes to it still succeed and
//! reads of blocks it lost fail their checksums only when something reads
//! them, so until a scrub the pool said ONLINE with 0 errors, and a leaf
//! brought back with `zpool clear` was resilvered only over the txgs it had
//! missed while out (its DTL), leaving everything older missing on it.
//!
//! So the zed thread reads every usable leaf's labels now and then
//! (`LABEL_CHECK_MS`, `Tunables::label_check_ms`), and at the next txg after
//! any leaf shows new read or checksum errors, at most five times a second
//! (a blanked device shows itself to reads first; `tests/label_loss.rs`).
//! A leaf none of whose four labels names this pool
//! and this leaf is checked again under the sync lock (no label write in
//! flight, so a label being rewritten is never mistaken for a lost one),
//! then, on a vdev that survives its loss, faulted with its DTL covering
//! every txg: `zpool clear`, `zpool online`, a spare or `zpool replace`
//! then resilver it whole, and the config write of the next sync gives it
//! its labels again. A leaf of a vdev without redundancy is only reported:
//! faulting it would take the pool down for what may be a passing glitch,
//! and there is nothing to resilver it from anyway.

use super::config::LabelConfig;
use super::{lock, Pool};
use crate::error::Error;
use crate::vdev::{label, Leaf, LeafState};
use std::sync::Arc;

/// How often (milliseconds) the zed thread reads the labels of every
/// usable leaf: 4 small reads per leaf. Shorter finds a blanked device
/// sooner; longer costs less on pools of many devices.
pub const LABEL_CHECK_MS: u64 = 2000;

impl Pool {
    /// Whether `leaf`'s labels still say it is this pool's `leaf`, or
    /// could not be read at all (a failing or vanished device is the I/O
    /// path's business, not a blanked one).
    fn labels_name(&self, leaf: &Leaf) -> bool {
        // Shrunk (a file truncated): its end labels, and the data there,
        // are gone whatever the front ones say.
        if leaf.dev.current_size() < leaf.dev.size() {
            return false;
        }
        let labels = label::read_configs(&*leaf.dev);
        let unreadable = labels
            .iter()
            .any(|(_, r)| matches!(r, Err(Error::Io { .. } | Error::PowerLost)));
        unreadable
            || labels
                .iter()
                .filter_map(|(_, r)| r.as_ref().ok())
                .filter_map(|p| serde_json::from_slice::<LabelConfig>(p).ok())
                .any(|c| c.pool.pool_guid == self.guid && c.guid == leaf.guid)
    }

    /// Check every usable leaf's labels (see the module comment). Returns
    /// the paths of the leaves found without them.
    pub fn label_check(self: &Arc<Self>) -> Vec<String> {
        let mut lost = Vec::new();
        for t in self.io.tops() {
            for leaf in t.leaves() {
                if !leaf.is_usable() || self.labels_name(&leaf) {
                    continue;
                }
                let Ok(_g) = self.sync_guard() else {
                    return lost;
                };
                if !leaf.is_usable() || self.labels_name(&leaf) {
                    continue;
                }
                lost.push(leaf.path.clone());
                if t.dead_columns() >= t.redundancy() {
                    log::error!(
                        "pool '{}': {} has no label of this pool (overwritten or replaced?); \
                         its vdev has no redundancy left to rebuild it from",
                        self.name,
                        leaf.path
                    );
                    continue;
                }
                let txg = self.last_txg();
                leaf.set_state(LeafState::Faulted, txg);
                // Everything it held may be gone, not only what it misses
                // from now on.
                leaf.set_dtl(vec![(0, u64::MAX)]);
                lock(&self.st).config_dirty = true;
                self.log_internal(&format!(
                    "vdev {} faulted: its labels vanished (overwritten or replaced); \
                     it will be resilvered whole",
                    leaf.path
                ));
                log::error!(
                    "pool '{}': {} lost its labels (overwritten, truncated or replaced): \
                     faulted; 'zpool clear' or 'zpool replace' resilvers it whole",
                    self.name,
                    leaf.path
                );
            }
        }
        lost
    }
}
