//! Finding and opening pools (OpenZFS spa_import, vdev_label.c discovery).
//!
//! Import reads the labels of every candidate device, groups devices by pool
//! guid, opens the leaves the newest label config names (matching them by
//! guid, not by path, so files may move), takes the newest uberblock that
//! verifies on any label of any leaf, and opens the MOS it points to. The MOS
//! copy of the config is authoritative; the label copy only finds devices.
//! Space maps are replayed into each metaslab's free tree.

use super::config::*;
use super::io::SpaIo;
use super::metaslab::{Allocator, VdevAlloc};
use super::space_map;
use super::txg::{self, Tunables};
use super::uberblock::Uberblock;
use super::{feature, hostname, lock, os_entropy, Pool, SpaState};
use crate::dmu::objset::Objset;
use crate::error::{Error, Result};
use crate::vdev::device::MissingDevice;
use crate::vdev::{label, AttachKind, BlockDevice, FileDevice, Leaf, LeafState, TopVdev};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// One device that carries a uzfs label.
#[derive(Clone)]
pub struct LabeledDevice {
    pub path: String,
    pub dev: Arc<dyn BlockDevice>,
    pub label: LabelConfig,
}

/// A pool found on a set of devices.
#[derive(Clone)]
pub struct FoundPool {
    pub config: PoolConfig,
    pub devices: Vec<LabeledDevice>,
}

impl FoundPool {
    /// Leaves named by the config that were not found.
    pub fn missing(&self) -> Vec<String> {
        self.config
            .vdev_tree
            .iter()
            .flat_map(|t| t.children.iter().flat_map(|c| c.all()))
            .filter(|c| !self.devices.iter().any(|d| d.label.guid == c.guid))
            .map(|c| c.path.clone())
            .collect()
    }
}

/// Open every regular file and block device directly in `dir`.
pub fn scan_dir(dir: &Path) -> Result<Vec<(String, Arc<dyn BlockDevice>)>> {
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut out: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
    let mut paths: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        use std::os::unix::fs::FileTypeExt;
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        let ft = meta.file_type();
        if !(ft.is_file() || ft.is_block_device()) {
            continue;
        }
        if let Ok(d) = FileDevice::open(&p) {
            out.push((p.display().to_string(), Arc::new(d)));
        }
    }
    Ok(out)
}

/// Group labeled devices into pools. Devices with no readable label are skipped.
pub fn discover(devs: Vec<(String, Arc<dyn BlockDevice>)>) -> Vec<FoundPool> {
    let mut pools: BTreeMap<u64, FoundPool> = BTreeMap::new();
    for (path, dev) in devs {
        let Some(lab) = super::probe_label(&*dev) else {
            continue;
        };
        let e = pools
            .entry(lab.pool.pool_guid)
            .or_insert_with(|| FoundPool {
                config: lab.pool.clone(),
                devices: Vec::new(),
            });
        if lab.pool.txg > e.config.txg {
            e.config = lab.pool.clone();
        }
        // The same device reached twice (e.g. a symlink): keep one.
        if !e.devices.iter().any(|d| d.label.guid == lab.guid) {
            e.devices.push(LabeledDevice {
                path,
                dev,
                label: lab,
            });
        }
    }
    pools.into_values().collect()
}

/// The newest uberblock of `pool_guid` that verifies on any label of `devs`.
pub fn best_uberblock(
    devs: &[LabeledDevice],
    pool_guid: u64,
    ashift_of: impl Fn(u64) -> u8,
) -> Option<Uberblock> {
    let mut best: Option<Uberblock> = None;
    for d in devs {
        let slot = label::ub_slot_size(ashift_of(d.label.top_guid));
        for off in label::label_offsets(d.dev.size()) {
            let mut ring = vec![0u8; label::UB_RING_SIZE as usize];
            let base = off + label::UB_RING_OFFSET;
            if d.dev.read_at(&mut ring, base).is_err() {
                continue;
            }
            for (i, s) in ring.chunks_exact(slot as usize).enumerate() {
                if let Ok(Some(ub)) = Uberblock::decode(s, base + i as u64 * slot) {
                    if ub.pool_guid == pool_guid && best.is_none_or(|b| ub.newer_than(&b)) {
                        best = Some(ub);
                    }
                }
            }
        }
    }
    best
}

/// Open one leaf of the config (and what is attached to it) on the found
/// devices; a leaf not found, or found truncated, becomes a MissingDevice.
fn build_leaf(
    c: &LeafConfig,
    need: u64,
    found: &FoundPool,
    spare: bool,
    problems: &mut Vec<String>,
) -> Arc<Leaf> {
    let dev = found.devices.iter().find(|d| d.label.guid == c.guid);
    if dev.is_none() {
        problems.push(format!("{}: not found", c.path));
    }
    let dev = dev.filter(|d| {
        let ok = label::aligned_size(d.dev.size()) >= need;
        if !ok {
            problems.push(format!(
                "{}: device is truncated ({} bytes, the pool needs {need})",
                d.path,
                d.dev.size()
            ));
        }
        ok
    });
    let (path, dev): (String, Arc<dyn BlockDevice>) = match dev {
        Some(d) => (d.path.clone(), d.dev.clone()),
        None => (
            c.path.clone(),
            Arc::new(MissingDevice {
                path: c.path.clone(),
                size: 0,
            }),
        ),
    };
    let leaf = if spare {
        Leaf::spare(c.guid, path, dev)
    } else {
        Leaf::new(c.guid, path, dev)
    };
    leaf.set_dtl(c.dtl.clone());
    match c.state.as_str() {
        "offline" => leaf.set_state(LeafState::Offline, 0),
        "faulted" => leaf.set_state(LeafState::Faulted, 0),
        _ => {}
    }
    leaf.config_dirty
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let att: Vec<_> = c
        .attached
        .iter()
        .map(|a| {
            let is_spare = a.kind == AttachKind::Spare;
            (a.kind, build_leaf(&a.leaf, need, found, is_spare, problems))
        })
        .collect();
    *leaf.attached.write().unwrap_or_else(|e| e.into_inner()) = att;
    Arc::new(leaf)
}

/// Open the hot spares (`spare`) or cache devices the config lists in
/// `list` (missing ones are still listed, UNAVAIL; the pool imports).
pub(crate) fn build_aux(list: &[LeafConfig], found: &FoundPool, spare: bool) -> Vec<Arc<Leaf>> {
    let mut problems = Vec::new();
    list.iter()
        .map(|c| build_leaf(c, 0, found, spare, &mut problems))
        .collect()
}

fn build_tops(cfg: &PoolConfig, found: &FoundPool) -> Result<Vec<Arc<TopVdev>>> {
    let mut tops = Vec::new();
    for (i, t) in cfg.vdev_tree.iter().enumerate() {
        if t.id as usize != i {
            return Err(Error::corrupt("pool config", "vdev ids out of order"));
        }
        // The config is checksummed, but a crafted one must still not reach
        // arithmetic that assumes a sane geometry.
        let width = t.children.len();
        let width_ok = t.kind.ops().check_width(width).is_ok();
        if !width_ok || !(9..=16).contains(&t.ashift) || t.ms_shift >= 64 {
            return Err(Error::corrupt(
                "pool config",
                format!(
                    "vdev {i}: impossible geometry ({} with {width} children, ashift {}, ms_shift {})",
                    t.kind.label(),
                    t.ashift,
                    t.ms_shift
                ),
            ));
        }
        let mut problems = Vec::new();
        let need = crate::vdev::LABEL_START_SIZE
            + crate::vdev::Geometry {
                kind: t.kind,
                width: t.children.len(),
                ashift: t.ashift,
            }
            .child_need(t.asize)
            + crate::vdev::LABEL_END_SIZE;
        let children: Vec<Arc<Leaf>> = t
            .children
            .iter()
            .map(|c| build_leaf(c, need, found, false, &mut problems))
            .collect();
        let top = Arc::new(TopVdev {
            id: t.id,
            guid: t.guid,
            kind: t.kind,
            ashift: t.ashift,
            asize: t.asize,
            ms_shift: t.ms_shift,
            flush: t.flush,
            children,
        });
        let present = top.leaves().iter().filter(|l| !l.is_missing()).count();
        // A log device holds no data of the pool: whether the pool can do
        // without it is the intent log's call (`zil/replay.rs`).
        if !t.log && (present == 0 || top.dead_columns() > top.redundancy()) {
            return Err(Error::invalid(format!(
                "cannot import '{}': one or more devices is currently unavailable:\n\t{}",
                cfg.name,
                problems.join("\n\t")
            )));
        }
        tops.push(top);
    }
    Ok(tops)
}

impl Pool {
    /// Import a found pool and start its sync thread (if the tunables say so).
    pub fn import(found: &FoundPool, new_name: Option<&str>, tun: Tunables) -> Result<Arc<Pool>> {
        // Read-only: every device behind a wrapper that refuses writes.
        let ro;
        let found = if tun.readonly {
            ro = FoundPool {
                config: found.config.clone(),
                devices: found
                    .devices
                    .iter()
                    .map(|d| LabeledDevice {
                        path: d.path.clone(),
                        dev: Arc::new(crate::vdev::device::ReadOnlyDevice(d.dev.clone())),
                        label: d.label.clone(),
                    })
                    .collect(),
            };
            &ro
        } else {
            found
        };
        let lcfg = &found.config;
        if lcfg.state == PoolState::Destroyed {
            return Err(Error::invalid(format!(
                "cannot import '{}': pool was destroyed",
                lcfg.name
            )));
        }
        feature::check_importable(&lcfg.name, &lcfg.features)?;
        let ashifts: BTreeMap<u64, u8> =
            lcfg.vdev_tree.iter().map(|t| (t.guid, t.ashift)).collect();
        let ub = best_uberblock(&found.devices, lcfg.pool_guid, |g| {
            ashifts.get(&g).copied().unwrap_or(12)
        })
        .ok_or_else(|| {
            Error::corrupt(
                "pool",
                format!(
                    "cannot import '{}': no valid uberblock found on any label",
                    lcfg.name
                ),
            )
        })?;
        // Another host writing this pool (multihost=on): refuse before
        // anything is read into memory or written.
        super::mmp::activity_check(found, &ub, &tun, |g| ashifts.get(&g).copied().unwrap_or(12))?;
        let tops = build_tops(lcfg, found)?;
        let io = Arc::new(SpaIo::new(tops, tun.cache_bytes, tun.cache_min_bytes));
        let open_txg = ub.txg + 1;
        let gate = Arc::new(crate::dmu::tx::TxgGate::new());
        let mos = Objset::open(&ub.rootbp, io.clone(), gate.clone(), open_txg)?;
        let dir: ObjectDirectory = Pool::read_json(&mos, 1, "object directory")?;
        let mut config: PoolConfig = Pool::read_json(&mos, dir.config, "pool config")?;
        feature::check_importable(&config.name, &config.features)?;
        if config.pool_guid != lcfg.pool_guid {
            return Err(Error::corrupt(
                "pool config",
                "MOS config belongs to another pool",
            ));
        }
        // The MOS config is authoritative: rebuild the vdev tree from it.
        let tops = build_tops(&config, found)?;
        if config.guid_sum() != ub.guid_sum {
            return Err(Error::corrupt(
                "pool",
                format!(
                    "cannot import '{}': vdev guid sum does not match the uberblock (a device of another configuration?)",
                    config.name
                ),
            ));
        }
        *io.vdevs.write().unwrap_or_else(|e| e.into_inner()) = tops.clone();
        let props: PoolProps =
            Pool::read_json(&mos, dir.props, "pool properties").unwrap_or_default();
        let mut vallocs = Vec::new();
        for t in &config.vdev_tree {
            let count = t.asize >> t.ms_shift;
            let mut raw = vec![0u8; count as usize * 8];
            mos.read(t.ms_array, 0, &mut raw)?;
            let sms: Vec<u64> = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            let mut va = VdevAlloc::for_top(t, &sms);
            for ms in &mut va.metaslabs {
                let dn = mos.stat(ms.sm_obj)?;
                if dn.size > 1 << 30 {
                    return Err(Error::corrupt("space map", "implausibly large"));
                }
                let mut buf = vec![0u8; dn.size as usize];
                mos.read(ms.sm_obj, 0, &mut buf)?;
                let allocated = space_map::replay(&buf, ms.start, ms.size)?;
                for (off, len) in allocated.iter() {
                    if !ms.free.remove(off, len) {
                        return Err(Error::corrupt("space map", "allocation outside metaslab"));
                    }
                }
            }
            vallocs.push(va);
        }
        let root_bp = super::dataset_bp(&mos, dir.root_dataset)?;
        let root = Arc::new(Objset::open(&root_bp, io.clone(), gate.clone(), open_txg)?);
        let (dsl, layout) = crate::dsl::records::read_dsl(&mos, dir.dsl)?;
        let read = dsl.clone();
        let mut children = Vec::new();
        let mut root_phys = None;
        let root_id = dir.root_dataset;
        for d in dsl.datasets {
            if d.id == dir.root_dataset && d.rel.is_empty() {
                root_phys = Some(d);
                continue;
            }
            if d.id == dir.root_dataset || d.id <= 1 || d.rel.is_empty() || d.parent == 0 {
                return Err(Error::corrupt("DSL directory", "bad dataset record"));
            }
            let bp = super::dataset_bp(&mos, d.id)?;
            let os = Arc::new(Objset::open(&bp, io.clone(), gate.clone(), open_txg)?);
            children.push(Arc::new(crate::dsl::Dataset {
                phys: crate::dsl::Record::new(d),
                os,
                zil: Default::default(),
            }));
        }
        let mut snaps = Vec::new();
        for sp in dsl.snapshots {
            if sp.id <= 1 || sp.ds == 0 {
                return Err(Error::corrupt("DSL directory", "bad snapshot record"));
            }
            let root = super::dataset_bp(&mos, sp.id)?;
            snaps.push(Arc::new(crate::dsl::snapshot::Snapshot {
                phys: crate::dsl::Record::new(sp),
                root,
            }));
        }
        // Record where the devices are now and that the pool is in use.
        let spares = build_aux(&config.spares, found, true);
        *io.spares.write().unwrap_or_else(|e| e.into_inner()) = spares.clone();
        // Cache devices: what they held is indexed again from their slot
        // headers.
        let caches = build_aux(&config.cache, found, false);
        for c in &caches {
            io.cache.add_l2(crate::arc::l2::L2Device::open(
                c.clone(),
                config.pool_guid,
                true,
            ));
        }
        super::refresh_vdev_config(&mut config, &tops, &spares, &caches);
        config.state = PoolState::Active;
        config.hostname = hostname();
        config.hostid = tun.hostid;
        if let Some(n) = new_name {
            super::check_pool_name(n)?;
            config.name = n.to_string();
        }
        let st = SpaState {
            config,
            alloc: Allocator::new(vallocs),
            dir,
            props,
            history_pending: Vec::new(),
            config_dirty: true,
            ub: Some(ub),
            guid_rng: os_entropy(),
        };
        let scan_obj = st.dir.scan;
        let pool = Pool::assemble(io, mos, root, st, open_txg, ub.txg, tun.clone());
        pool.dsl_pool().ensure_dsl_record()?;
        pool.dsl_pool().note_records_read(&read, layout)?;
        pool.dsl_pool().load_free_queue()?;
        {
            let mut list = pool.dsl.list.write().unwrap_or_else(|e| e.into_inner());
            if let (Some(p), Some(root)) = (root_phys, list.get(&root_id)) {
                *root.phys.write() = p;
            }
            for c in children {
                list.insert(c.id(), c);
            }
            let mut snap_list = pool.dsl.snaps.write().unwrap_or_else(|e| e.into_inner());
            for s in snaps {
                let id = s.phys().id;
                snap_list.insert(id, s);
            }
            drop(snap_list);
            pool.dsl.snaps_changed();
        }
        pool.io.suspension.set_mode(lock(&pool.st).props.failmode);
        // Before anything is allocated or served (zil/mod.rs).
        let replayed = pool.replay_logs(ub.txg)?;
        *lock(&pool.replay_report) = replayed;
        if tun.sync_thread && !tun.readonly {
            txg::start_sync_thread(&pool);
        }
        if lock(&pool.st).props.multihost && !tun.readonly {
            // Stamps continue the sequence of the last writer's (another
            // host's, maybe): ordered after them, never hidden by them.
            pool.start_mmp_after(ub.mmp.map_or(0, |m| m.seq));
        }
        let scan = if scan_obj != 0 {
            Some(Pool::read_json(&pool.mos, scan_obj, "scan state")?)
        } else {
            None
        };
        // A leaf whose device is back takes writes again from this import
        // on: the range of txgs it missed, left open when it went away,
        // ends at the imported txg. (Left open, every resilver found it
        // still lacking the newest txgs and started another, forever.)
        let synced = pool.last_txg();
        for l in pool.io.tops().iter().flat_map(|t| t.leaves()) {
            if l.is_usable() && l.dtl().iter().any(|r| r.1 == u64::MAX) {
                l.dtl_close(synced);
            }
        }
        if tun.readonly {
            // Shown by `zpool status` as it stands; never continued.
            lock(&pool.scan).phys = scan;
            return Ok(pool);
        }
        pool.resume_scan(scan);
        // Devices that grew while the pool was away.
        pool.autoexpand();
        if tun.sync_thread {
            // Leaves that came back, or a spare needed since export.
            pool.activate_spares()?;
            pool.maybe_resilver()?;
        }
        Ok(pool)
    }

    /// `zpool export`: commit, mark the labels exported, stop.
    pub fn export(&self) -> Result<()> {
        self.set_state(PoolState::Exported)
    }

    /// `zpool destroy`: mark the labels destroyed, stop.
    pub fn destroy(&self) -> Result<()> {
        self.set_state(PoolState::Destroyed)
    }

    fn set_state(&self, s: PoolState) -> Result<()> {
        if self.tun.readonly {
            // Export leaves the labels as they were (the pool stays marked
            // as its last writer left it); destroy would write them.
            if s != PoolState::Exported {
                self.check_rw()?;
            }
            return self.close();
        }
        {
            let mut st = lock(&self.st);
            st.config.state = s;
            st.config_dirty = true;
        }
        // Commit the new state while the pool still runs: if that fails
        // (a device fails its writes), the pool stays imported as it was
        // and the caller says so, instead of a pool that is neither
        // exported on disk nor imported here. A suspended pool is
        // closed as it is (its stuck txg given up, `close`).
        if self.suspended().is_none() {
            if let Err(e) = self.sync() {
                let mut st = lock(&self.st);
                st.config.state = PoolState::Active;
                st.config_dirty = true;
                return Err(e);
            }
        }
        self.close()
    }

    /// Leaves that were missing at import (their I/O fails).
    pub fn unavailable_leaves(&self) -> Vec<String> {
        self.io
            .tops()
            .iter()
            .flat_map(|t| t.leaves())
            .filter(|c| c.is_missing())
            .map(|c| c.path.clone())
            .collect()
    }
}
