//! Pool feature flags (OpenZFS zpool-features(7)).
//!
//! Each feature is `disabled` (the pool may never use it), `enabled` (it may,
//! but nothing on disk depends on it yet) or `active` (something on disk
//! needs it). A build refuses to import a pool on which a feature it does not
//! know is active, unless the feature is read-only compatible, in which case
//! only a read-only import would be safe (and this build does not offer one
//! yet, so it refuses with that explanation).

use super::config::{FeatureEntry, FeatureState};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

pub struct FeatureInfo {
    pub name: &'static str,
    pub read_only_compatible: bool,
    pub description: &'static str,
}

pub const LZ4: &str = "org.openzfs:lz4_compress";
pub const ZSTD: &str = "org.freebsd:zstd_compress";
pub const BLAKE3: &str = "org.openzfs:blake3";
pub const BLOCK_REMAP: &str = "com.uzfs:block_remap";
pub const GANG_BLOCK: &str = "com.uzfs:gang_block";
pub const INTENT_LOG: &str = "com.uzfs:intent_log";
pub const SNAPSHOTS: &str = "com.uzfs:snapshots";
pub const ASYNC_DESTROY: &str = "com.delphix:async_destroy";
pub const DSL_RECORDS: &str = "com.uzfs:dsl_records";
pub const DEADLIST_KEYS: &str = "com.uzfs:deadlist_keys";
pub const DSL_DIRS: &str = "com.uzfs:dsl_dirs";

pub const FEATURES: &[FeatureInfo] = &[
    FeatureInfo {
        name: LZ4,
        read_only_compatible: false,
        description: "LZ4 compression algorithm support.",
    },
    FeatureInfo {
        name: ZSTD,
        read_only_compatible: false,
        description: "zstd compression algorithm support.",
    },
    FeatureInfo {
        name: BLAKE3,
        read_only_compatible: false,
        description: "BLAKE3 hash algorithm.",
    },
    FeatureInfo {
        name: BLOCK_REMAP,
        read_only_compatible: false,
        description: "Relocate blocks through the remap table without rewriting their parents.",
    },
    FeatureInfo {
        name: GANG_BLOCK,
        read_only_compatible: false,
        description: "Blocks stored in pieces when no free extent holds them whole.",
    },
    FeatureInfo {
        name: INTENT_LOG,
        read_only_compatible: true,
        description: "Intent log chains (synchronous writes) reachable from object sets.",
    },
    FeatureInfo {
        name: SNAPSHOTS,
        read_only_compatible: true,
        description: "Snapshots and their dead lists: blocks freed by birth time.",
    },
    FeatureInfo {
        name: ASYNC_DESTROY,
        read_only_compatible: true,
        description: "Destroy filesystems asynchronously.",
    },
    FeatureInfo {
        name: DSL_RECORDS,
        read_only_compatible: false,
        description: "Each dataset's and snapshot's record in its own MOS object.",
    },
    FeatureInfo {
        name: DEADLIST_KEYS,
        read_only_compatible: true,
        description: "Dead lists split by birth txg: snapshot destroy frees whole sub-lists.",
    },
    FeatureInfo {
        name: DSL_DIRS,
        read_only_compatible: false,
        description: "DSL directories apart from datasets; children and snapshots in ZAPs.",
    },
];

pub fn info(name: &str) -> Option<&'static FeatureInfo> {
    FEATURES
        .iter()
        .find(|f| f.name == name || short(f.name) == name)
}

pub fn short(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

/// Every known feature enabled; lz4 active from birth (pool metadata uses it).
pub fn default_set() -> BTreeMap<String, FeatureEntry> {
    FEATURES
        .iter()
        .map(|f| {
            let state = if f.name == LZ4 {
                FeatureState::Active
            } else {
                FeatureState::Enabled
            };
            (
                f.name.to_string(),
                FeatureEntry {
                    state,
                    read_only_compatible: f.read_only_compatible,
                },
            )
        })
        .collect()
}

impl super::Pool {
    /// The features this build knows that the pool does not list: it was
    /// made by a build before them (`zpool upgrade` lists such pools).
    pub fn missing_features(&self) -> Vec<&'static str> {
        let have = self.config().features;
        FEATURES
            .iter()
            .map(|f| f.name)
            .filter(|n| !have.contains_key(*n))
            .collect()
    }

    /// `zpool upgrade POOL`: every feature this build knows and the pool
    /// does not list becomes enabled, in the config of the next txg (what
    /// uses one on disk activates it then). Returns them, once on disk.
    pub fn enable_features(&self) -> Result<Vec<&'static str>> {
        self.check_rw()?;
        let added: Vec<&'static str> = {
            let mut st = super::lock(&self.st);
            let mut added = Vec::new();
            for f in FEATURES {
                if !st.config.features.contains_key(f.name) {
                    st.config.features.insert(
                        f.name.to_string(),
                        FeatureEntry {
                            state: FeatureState::Enabled,
                            read_only_compatible: f.read_only_compatible,
                        },
                    );
                    added.push(f.name);
                }
            }
            if !added.is_empty() {
                st.config_dirty = true;
            }
            added
        };
        if !added.is_empty() {
            // The layer is rewritten in a layout a new feature allows.
            *super::lock(&self.dsl.dirty) = true;
            self.sync()?;
        }
        Ok(added)
    }
}

/// Refuse a pool that depends on a feature this build does not implement.
pub fn check_importable(pool: &str, features: &BTreeMap<String, FeatureEntry>) -> Result<()> {
    let unknown: Vec<String> = features
        .iter()
        .filter(|(name, e)| e.state == FeatureState::Active && info(name).is_none())
        .map(|(name, e)| {
            if e.read_only_compatible {
                format!("{name} (read-only compatible)")
            } else {
                name.clone()
            }
        })
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "cannot import '{pool}': pool uses the following feature(s) not supported by this system:\n\t{}\nUse a newer uzfs to import it.",
        unknown.join("\n\t")
    )))
}
