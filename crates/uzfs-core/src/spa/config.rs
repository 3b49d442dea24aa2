//! The pool configuration (OpenZFS: the config nvlist). Stored as JSON in
//! every label (for discovery at import) and in the MOS (authoritative, and
//! committed atomically with the txg that changed it).

use crate::vdev::{AttachKind, FlushPolicy, Leaf, LeafState, TopKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const POOL_VERSION: u64 = 5000; // feature flags, as OpenZFS

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Active,
    Exported,
    Destroyed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    pub guid: u64,
    pub path: String,
    /// "offline" or "faulted" when the leaf was taken out; persists.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// Txg ranges (inclusive) the leaf lacks; `u64::MAX` ends an open range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtl: Vec<(u64, u64)>,
    /// Leaves in the same column: a replacement or a spare.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached: Vec<AttachedConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedConfig {
    pub kind: AttachKind,
    pub leaf: LeafConfig,
}

impl LeafConfig {
    pub fn new(guid: u64, path: String) -> Self {
        LeafConfig {
            guid,
            path,
            state: String::new(),
            dtl: Vec::new(),
            attached: Vec::new(),
        }
    }

    /// The config of a live leaf (and what is attached to it).
    pub fn of(l: &Leaf) -> Self {
        let temporary = l.temporary.load(std::sync::atomic::Ordering::Relaxed);
        let state = match l.state() {
            _ if temporary => "",
            LeafState::Offline => "offline",
            LeafState::Faulted => "faulted",
            _ => "",
        };
        LeafConfig {
            guid: l.guid,
            path: l.path.clone(),
            state: state.to_string(),
            dtl: l.dtl(),
            attached: l
                .attached()
                .iter()
                .map(|(k, a)| AttachedConfig {
                    kind: *k,
                    leaf: LeafConfig::of(a),
                })
                .collect(),
        }
    }

    /// This leaf and every leaf attached below it.
    pub fn all(&self) -> Vec<&LeafConfig> {
        let mut v = vec![self];
        for a in &self.attached {
            v.extend(a.leaf.all());
        }
        v
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopConfig {
    pub id: u32,
    pub guid: u64,
    pub kind: TopKind,
    pub ashift: u8,
    /// Bytes of the vdev's address space (for RAID-Z: all children's).
    pub asize: u64,
    pub ms_shift: u8,
    /// MOS object listing the space map object of each metaslab.
    pub ms_array: u64,
    pub flush: FlushPolicy,
    pub children: Vec<LeafConfig>,
    /// A separate intent-log device (`zpool add POOL log DEV`): lent whole
    /// to the log class, never used for other blocks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub log: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureState {
    Disabled,
    Enabled,
    Active,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureEntry {
    pub state: FeatureState,
    /// A build that does not know this feature may still import read-only.
    pub read_only_compatible: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub version: u64,
    pub name: String,
    pub pool_guid: u64,
    pub state: PoolState,
    /// Txg in which this config was written.
    pub txg: u64,
    pub hostname: String,
    /// The importing host's id (0: unknown), for "in use from another
    /// system" and multihost messages.
    #[serde(default)]
    pub hostid: u64,
    pub vdev_tree: Vec<TopConfig>,
    pub features: BTreeMap<String, FeatureEntry>,
    /// Hot spares (`zpool add POOL spare DEV`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares: Vec<LeafConfig>,
    /// L2ARC cache devices (`zpool add POOL cache DEV`, `arc/l2.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache: Vec<LeafConfig>,
}

impl PoolConfig {
    pub fn guid_sum(&self) -> u64 {
        let mut s = self.pool_guid;
        for t in &self.vdev_tree {
            s = s.wrapping_add(t.guid);
            for c in t.children.iter().flat_map(|c| c.all()) {
                s = s.wrapping_add(c.guid);
            }
        }
        s
    }
}

/// What each leaf's label holds: the pool config plus who this leaf is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelConfig {
    pub pool: PoolConfig,
    pub top_guid: u64,
    pub guid: u64,
}

/// The MOS object directory (object 1): names of the pool's MOS objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectDirectory {
    pub config: u64,
    pub history: u64,
    pub props: u64,
    pub root_dataset: u64,
    /// Scrub/resilver state (OpenZFS DMU_POOL_SCAN), created by the first scan.
    #[serde(default)]
    pub scan: u64,
    /// The DSL record: every dataset but the root (see `dsl/mod.rs`).
    #[serde(default)]
    pub dsl: u64,
    /// Frees of destroyed datasets and snapshots still to be done (JSON
    /// `FreeQueue`, `dsl/async_destroy.rs`), created by the first.
    #[serde(default)]
    pub freeing: u64,
}

/// Settable pool properties persisted in the MOS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolProps {
    #[serde(default)]
    pub comment: String,
    /// Default ashift for vdevs added later (0 = automatic, 12).
    #[serde(default)]
    pub ashift: u8,
    /// `multihost=on`: stamp the labels so another host's import can see
    /// the pool is alive (`spa/mmp.rs`).
    #[serde(default)]
    pub multihost: bool,
    /// `autoexpand=on`: grow vdevs whose devices grew (`spa/expand.rs`).
    #[serde(default)]
    pub autoexpand: bool,
    /// `autoreplace=on`: a new device found where a lost leaf was takes
    /// its place (`Pool::autoreplace`).
    #[serde(default)]
    pub autoreplace: bool,
    /// What a pool does when its sync cannot write (`spa/suspend.rs`).
    #[serde(default)]
    pub failmode: FailMode,
    /// `listsnapshots=on`: `zfs list` without `-t` lists snapshots too.
    #[serde(default)]
    pub listsnapshots: bool,
}

/// `failmode`: what a pool does when its sync cannot write (OpenZFS
/// zpoolprops(7)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Changes and `fsync` wait until `zpool clear` resumes the pool.
    #[default]
    Wait,
    /// New changes and `fsync` get EIO; reads go on.
    Continue,
    /// The daemon aborts (what a crash dump is for the kernel).
    Panic,
}

impl FailMode {
    pub fn parse(s: &str) -> Option<FailMode> {
        match s {
            "wait" => Some(FailMode::Wait),
            "continue" => Some(FailMode::Continue),
            "panic" => Some(FailMode::Panic),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FailMode::Wait => "wait",
            FailMode::Continue => "continue",
            FailMode::Panic => "panic",
        }
    }
}
