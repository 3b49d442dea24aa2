//! Changing a live pool's devices: offline, online, clear, attach, detach,
//! replace, spares (OpenZFS spa_vdev_attach / spa_vdev_detach /
//! vdev_offline / vdev_online / vdev_clear).
//!
//! Every change happens under `sync_lock`, so no txg is being written while
//! the tree changes; the new tree goes into the config of the next txg, which
//! each call waits for before returning. A leaf that joins (replace, attach,
//! spare) starts with a DTL of every committed txg and gets writes from the
//! next txg on; the resilver that follows fills in the past.

use super::config::LeafConfig;
use super::{check_not_in_use, lock, next_guid, Pool};
use crate::error::{Error, Result};
use crate::vdev::{self, label, AttachKind, BlockDevice, Leaf, LeafState, TopKind, TopVdev};
use std::sync::Arc;

/// Where a leaf sits in the tree.
#[derive(Clone)]
pub struct LeafPos {
    pub top: usize,
    pub column: usize,
    /// The leaf itself (a column primary or an attached leaf).
    pub leaf: Arc<Leaf>,
    /// The column's primary leaf (equal to `leaf` unless attached).
    pub primary: Arc<Leaf>,
}

impl Pool {
    /// Find a leaf by path (as given or as resolved), or by guid in decimal.
    pub fn find_leaf(&self, name: &str) -> Option<LeafPos> {
        let matches = |l: &Leaf| {
            l.path == name
                || l.guid.to_string() == name
                || std::path::Path::new(&l.path)
                    .file_name()
                    .is_some_and(|f| f == name)
        };
        for (ti, t) in self.io.tops().iter().enumerate() {
            for (ci, c) in t.children.iter().enumerate() {
                if matches(c) {
                    return Some(LeafPos {
                        top: ti,
                        column: ci,
                        leaf: c.clone(),
                        primary: c.clone(),
                    });
                }
                for (_, a) in c.attached() {
                    if matches(&a) {
                        return Some(LeafPos {
                            top: ti,
                            column: ci,
                            leaf: a,
                            primary: c.clone(),
                        });
                    }
                }
            }
        }
        None
    }

    pub(crate) fn leaf_or_err(&self, name: &str) -> Result<LeafPos> {
        self.find_leaf(name)
            .ok_or_else(|| Error::invalid(format!("no such device in pool: '{name}'")))
    }

    /// `zpool offline`: refuse when it would leave data without a replica.
    pub fn offline(&self, name: &str) -> Result<()> {
        self.offline_with(name, false, false)
    }

    /// `zpool offline [-f] [-t]`: `fault` puts the leaf in the FAULTED
    /// state instead (as too many errors would; a hot spare may step in),
    /// `temporary` keeps either state for this import only.
    pub fn offline_with(&self, name: &str, fault: bool, temporary: bool) -> Result<()> {
        let pos = self.leaf_or_err(name)?;
        let to = if fault {
            LeafState::Faulted
        } else {
            LeafState::Offline
        };
        {
            let _g = self.sync_guard()?;
            let top = self.io.top(pos.top as u32)?;
            if pos.leaf.state() == to {
                return Ok(());
            }
            // Would the vdev still work without this leaf?
            let others_usable = vdev::leaf::column_leaves(&pos.primary)
                .iter()
                .any(|l| !Arc::ptr_eq(l, &pos.leaf) && l.is_usable());
            let col_dies = pos.leaf.is_usable() && !others_usable;
            if col_dies && top.dead_columns() + 1 > top.redundancy() {
                return Err(Error::invalid(format!(
                    "cannot offline {name}: no valid replicas"
                )));
            }
            let txg = self.last_txg() + 1;
            pos.leaf
                .temporary
                .store(temporary, std::sync::atomic::Ordering::Relaxed);
            pos.leaf.set_state(to, txg);
            lock(&self.st).config_dirty = true;
        }
        self.log_internal(&format!(
            "offline {}{}{name}",
            if fault { "-f " } else { "" },
            if temporary { "-t " } else { "" }
        ));
        self.txg_wait_synced().map(|_| ())
    }

    /// `zpool online` / the device came back: take writes again and
    /// resilver what it missed (only blocks born while it was away).
    pub fn online(self: &Arc<Self>, name: &str) -> Result<()> {
        let pos = self.leaf_or_err(name)?;
        if pos.leaf.is_missing() {
            return Err(Error::invalid(format!(
                "cannot online {name}: the device was not found at import; re-import the pool once it is present"
            )));
        }
        if !self.bring_back(&pos.leaf) {
            // The sync is parked on a failed I/O: `zpool clear` resumes it.
            return Ok(());
        }
        self.log_internal(&format!("online {name}"));
        self.txg_wait_synced()?;
        self.maybe_resilver()
    }

    /// False if the sync was parked on a failed I/O (the leaf came back
    /// as `bring_back_parked` does).
    fn bring_back(&self, leaf: &Arc<Leaf>) -> bool {
        let Ok(_g) = self.sync_guard() else {
            self.bring_back_parked(leaf);
            return false;
        };
        leaf.inject.clear();
        leaf.clear_errors();
        self.resilver_unhalt();
        if leaf.state() != LeafState::Online {
            // Everything committed so far was written without it.
            leaf.dtl_close(self.last_txg());
            leaf.set_state(LeafState::Online, 0);
        }
        lock(&self.st).config_dirty = true;
        true
    }

    /// A leaf returns while the sync is parked on a failed I/O (it holds
    /// the sync lock and the pool state): only the leaf's own state
    /// changes. It lacks what the parked txg wrote before it failed, so its
    /// DTL closes at that txg, not at the last committed one.
    fn bring_back_parked(&self, leaf: &Arc<Leaf>) {
        leaf.inject.clear();
        leaf.clear_errors();
        if leaf.state() != LeafState::Online {
            let t = lock(&self.txg);
            let upto = t.syncing.unwrap_or(t.synced);
            drop(t);
            leaf.dtl_close(upto);
            leaf.set_state(LeafState::Online, 0);
        }
    }

    /// `zpool clear [dev]`: forget errors; faulted or removed leaves
    /// return; a sync parked on a failed I/O is resumed (spa/suspend.rs)
    /// and this waits until it commits or fails again. A suspension that
    /// cannot be resumed is an error saying so.
    pub fn clear(self: &Arc<Self>, name: Option<&str>) -> Result<()> {
        let leaves: Vec<Arc<Leaf>> = match name {
            Some(n) => vec![self.leaf_or_err(n)?.leaf],
            None => self.io.tops().iter().flat_map(|t| t.leaves()).collect(),
        };
        let parked = self.io.suspension.parked();
        for l in &leaves {
            l.clear_errors();
            if matches!(l.state(), LeafState::Faulted | LeafState::Removed) && !l.is_missing() {
                if parked {
                    self.bring_back_parked(l);
                } else {
                    let _ = self.bring_back(l);
                }
            }
        }
        for s in self.io.spares() {
            s.clear_errors();
        }
        if self.mos.gate().poisoned().is_some() {
            let why = self.suspended().unwrap_or_default();
            return Err(Error::suspended(
                &self.name,
                &format!("{why}; it cannot be resumed: export and import the pool"),
            ));
        }
        if self.io.suspension.resume(&self.name)? == super::suspend::Resume::Retrying {
            log::info!("pool '{}': zpool clear resumes the parked sync", self.name);
        }
        self.txg_wait_synced()?;
        // A scan stopped by the suspension goes on.
        self.resume_stopped_scan();
        self.maybe_resilver()
    }

    fn check_new_device(
        &self,
        path: &str,
        dev: &Arc<dyn BlockDevice>,
        top: &TopVdev,
        force: bool,
        replacing: Option<&Arc<Leaf>>,
    ) -> Result<()> {
        // `zpool replace POOL DEV`: a new device at the path of the one it
        // replaces is not "part of this pool".
        let in_place = |p: &LeafPos| replacing.is_some_and(|r| Arc::ptr_eq(r, &p.leaf));
        if self.find_leaf(path).is_some_and(|p| !in_place(&p)) {
            return Err(Error::invalid(format!(
                "{path} is part of this pool already"
            )));
        }
        if !force {
            check_not_in_use(path, &**dev)?;
        }
        let need = vdev::LABEL_START_SIZE + top.child_need() + vdev::LABEL_END_SIZE;
        if label::aligned_size(dev.size()) < need {
            return Err(Error::invalid(format!(
                "cannot use {path}: device is too small ({} bytes, needs {need})",
                dev.size()
            )));
        }
        Ok(())
    }

    fn new_guid(&self) -> u64 {
        let mut st = lock(&self.st);
        let mut r = st.guid_rng;
        let g = next_guid(&mut r);
        st.guid_rng = r;
        g
    }

    fn new_leaf(&self, path: &str, dev: Arc<dyn BlockDevice>) -> Result<Arc<Leaf>> {
        label::clear(&*dev)?;
        let leaf = Leaf::new(self.new_guid(), path.to_string(), dev);
        // It lacks everything committed so far.
        leaf.set_dtl(vec![(1, self.last_txg().max(1))]);
        Ok(Arc::new(leaf))
    }

    /// `zpool replace POOL OLD NEW`: NEW joins OLD's column and is
    /// resilvered; OLD leaves when the resilver completes.
    pub fn replace(
        self: &Arc<Self>,
        old: &str,
        new_path: &str,
        dev: Arc<dyn BlockDevice>,
        force: bool,
    ) -> Result<()> {
        let pos = self.leaf_or_err(old)?;
        {
            let _g = self.sync_guard()?;
            let top = self.io.top(pos.top as u32)?;
            if pos.leaf.is_spare && !Arc::ptr_eq(&pos.leaf, &pos.primary) {
                return Err(Error::invalid(format!(
                    "cannot replace {old}: it is a hot spare standing in; replace the device it stands in for"
                )));
            }
            if pos
                .primary
                .attached()
                .iter()
                .any(|(k, _)| *k == AttachKind::Replacing)
            {
                return Err(Error::invalid(format!(
                    "cannot replace {old}: a replacement is already in progress"
                )));
            }
            self.check_new_device(new_path, &dev, &top, force, Some(&pos.leaf))?;
            let leaf = self.new_leaf(new_path, dev)?;
            pos.primary
                .attached
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .push((AttachKind::Replacing, leaf));
            lock(&self.st).config_dirty = true;
        }
        self.log_internal(&format!("replace {old} {new_path}"));
        self.txg_wait_synced()?;
        self.resilver_unhalt();
        self.restart_resilver()
    }

    /// `zpool attach POOL EXISTING NEW`: make a disk a mirror, or a mirror
    /// one side wider.
    pub fn attach(
        self: &Arc<Self>,
        existing: &str,
        new_path: &str,
        dev: Arc<dyn BlockDevice>,
        force: bool,
    ) -> Result<()> {
        let pos = self.leaf_or_err(existing)?;
        {
            let _g = self.sync_guard()?;
            let top = self.io.top(pos.top as u32)?;
            if !top.ops().replicated() {
                return Err(Error::invalid(format!(
                    "cannot attach {new_path} to {existing}: can only attach to mirrors and top-level disks"
                )));
            }
            self.check_new_device(new_path, &dev, &top, force, None)?;
            let leaf = self.new_leaf(new_path, dev)?;
            let mut children = top.children.clone();
            children.push(leaf.clone());
            let new_top = top.with_children(TopKind::Mirror, children);
            self.io.vdevs.write().unwrap_or_else(|e| e.into_inner())[pos.top] = new_top;
            let mut st = lock(&self.st);
            st.config.vdev_tree[pos.top].kind = TopKind::Mirror;
            st.config.vdev_tree[pos.top]
                .children
                .push(LeafConfig::new(leaf.guid, leaf.path.clone()));
            st.config_dirty = true;
        }
        self.log_internal(&format!("attach {existing} {new_path}"));
        self.restart_logs_on(pos.top as u32);
        self.txg_wait_synced()?;
        self.resilver_unhalt();
        self.restart_resilver()
    }

    /// `zpool detach POOL DEV`: drop a mirror side, cancel a replacement or
    /// return a spare.
    pub fn detach(self: &Arc<Self>, name: &str) -> Result<()> {
        let pos = self.leaf_or_err(name)?;
        {
            let _g = self.sync_guard()?;
            let top = self.io.top(pos.top as u32)?;
            let attached = pos.primary.attached();
            if !Arc::ptr_eq(&pos.leaf, &pos.primary) {
                // An attached leaf: a replacement or a spare goes away.
                let mut a = pos
                    .primary
                    .attached
                    .write()
                    .unwrap_or_else(|e| e.into_inner());
                a.retain(|(_, l)| !Arc::ptr_eq(l, &pos.leaf));
            } else if !attached.is_empty() {
                // The primary goes; the first complete stand-in takes over.
                let Some((_, heir)) = attached
                    .iter()
                    .find(|(_, l)| l.is_usable() && l.dtl().is_empty())
                    .cloned()
                else {
                    return Err(Error::invalid(format!(
                        "cannot detach {name}: no valid replicas (its replacement is still resilvering)"
                    )));
                };
                let rest: Vec<_> = attached
                    .into_iter()
                    .filter(|(_, l)| !Arc::ptr_eq(l, &heir))
                    .collect();
                *heir.attached.write().unwrap_or_else(|e| e.into_inner()) = rest;
                let mut children = top.children.clone();
                children[pos.column] = heir;
                let t = top.with_children(top.kind, children);
                self.io.vdevs.write().unwrap_or_else(|e| e.into_inner())[pos.top] = t;
            } else if top.kind == TopKind::Mirror {
                let others_ok = top
                    .children
                    .iter()
                    .enumerate()
                    .any(|(i, c)| i != pos.column && c.is_usable() && c.dtl().is_empty());
                if !others_ok {
                    return Err(Error::invalid(format!(
                        "cannot detach {name}: no valid replicas"
                    )));
                }
                let mut children = top.children.clone();
                children.remove(pos.column);
                let kind = if children.len() == 1 {
                    TopKind::Disk
                } else {
                    TopKind::Mirror
                };
                let t = top.with_children(kind, children);
                self.io.vdevs.write().unwrap_or_else(|e| e.into_inner())[pos.top] = t;
                let mut st = lock(&self.st);
                st.config.vdev_tree[pos.top].kind = kind;
                st.config.vdev_tree[pos.top].children.remove(pos.column);
            } else {
                return Err(Error::invalid(format!(
                    "cannot detach {name}: only applicable to mirror and replacing/spare vdevs"
                )));
            }
            lock(&self.st).config_dirty = true;
            // The detached device is no longer part of the pool.
            let _ = label::clear(&*pos.leaf.dev);
        }
        self.log_internal(&format!("detach {name}"));
        self.restart_logs_on(pos.top as u32);
        self.txg_wait_synced().map(|_| ())
    }

    /// A device about to become a spare or a cache device: not a member
    /// already (a leaf, a spare, a cache device), nor, without `force`,
    /// labeled as another pool's.
    fn check_new_aux(&self, path: &str, dev: &dyn BlockDevice, force: bool) -> Result<()> {
        if self.find_leaf(path).is_some()
            || self.io.spares().iter().any(|s| s.path == path)
            || self.io.cache_leaves().iter().any(|l| l.path == path)
        {
            return Err(Error::invalid(format!(
                "{path} is part of this pool already"
            )));
        }
        if !force {
            check_not_in_use(path, dev)?;
        }
        Ok(())
    }

    /// The cache device named `name` (its path or guid).
    pub fn find_cache(&self, name: &str) -> Option<Arc<crate::arc::l2::L2Device>> {
        self.io
            .cache
            .l2_devices()
            .into_iter()
            .find(|d| d.leaf.path == name || d.leaf.guid.to_string() == name)
    }

    /// `zpool add POOL spare DEV...`.
    pub fn add_spares(&self, devs: Vec<(String, Arc<dyn BlockDevice>)>, force: bool) -> Result<()> {
        {
            let _g = self.sync_guard()?;
            let min_need = self
                .io
                .tops()
                .iter()
                .map(|t| t.child_need())
                .max()
                .unwrap_or(0);
            for (path, dev) in &devs {
                self.check_new_aux(path, &**dev, force)?;
                if label::aligned_size(dev.size())
                    < vdev::LABEL_START_SIZE + min_need + vdev::LABEL_END_SIZE
                {
                    return Err(Error::invalid(format!(
                        "cannot use {path}: device is smaller than the pool's devices"
                    )));
                }
            }
            for (path, dev) in devs {
                label::clear(&*dev)?;
                let guid = self.new_guid();
                self.io
                    .spares
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Arc::new(Leaf::spare(guid, path, dev)));
            }
            lock(&self.st).config_dirty = true;
        }
        self.txg_wait_synced().map(|_| ())
    }

    /// `zpool add POOL cache DEV...`: L2ARC devices (`arc/l2.rs`). They
    /// start empty and fill with what the ARC lets go; the next txg
    /// writes their labels, so that import finds them.
    pub fn add_caches(&self, devs: Vec<(String, Arc<dyn BlockDevice>)>, force: bool) -> Result<()> {
        {
            let _g = self.sync_guard()?;
            for (path, dev) in &devs {
                self.check_new_aux(path, &**dev, force)?;
                let need =
                    vdev::LABEL_START_SIZE + crate::arc::l2::SLOT_SIZE + vdev::LABEL_END_SIZE;
                if label::aligned_size(dev.size()) < need {
                    return Err(Error::invalid(format!(
                        "cannot use {path}: a cache device must hold at least {} MiB",
                        need >> 20
                    )));
                }
            }
            let pool_guid = lock(&self.st).config.pool_guid;
            for (path, dev) in devs {
                label::clear(&*dev)?;
                let guid = self.new_guid();
                let leaf = Arc::new(Leaf::new(guid, path, dev));
                self.io
                    .cache
                    .add_l2(crate::arc::l2::L2Device::open(leaf, pool_guid, false));
            }
            lock(&self.st).config_dirty = true;
        }
        self.txg_wait_synced().map(|_| ())
    }

    /// `zpool remove POOL CACHEDEV`: a cache device leaves at once (what
    /// it held is only a copy).
    pub fn remove_cache(&self, name: &str) -> Result<()> {
        {
            let _g = self.sync_guard()?;
            let Some(d) = self.find_cache(name) else {
                return Err(Error::invalid(format!(
                    "no such cache device in pool: '{name}'"
                )));
            };
            self.io.cache.remove_l2(d.leaf.guid);
            if !d.leaf.is_missing() {
                let _ = label::clear(&*d.leaf.dev);
            }
            lock(&self.st).config_dirty = true;
        }
        self.txg_wait_synced().map(|_| ())
    }

    /// `zpool remove POOL LOGDEV`: a separate log device leaves the pool
    /// (a single-disk log by its path, a mirror by its name, `mirror-N`).
    /// The logs move off it first: no more space is lent from it, every
    /// dataset's chain starts over elsewhere, and a txg commits whatever
    /// was only in the log. Only the last top-level vdev can go (vdev ids
    /// are positions; a hole vdev would lift that).
    /// A log device's mirror gained or lost a side: blocks of the logs'
    /// current chains may be on the old sides only (a resilver copies no
    /// log blocks), so every chain starts over, on the new set of sides,
    /// and the caller's txg commits what only the old chains held.
    fn restart_logs_on(&self, top: u32) {
        if !self.log_vdevs().contains(&top) {
            return;
        }
        for ds in self.dsl_pool().datasets() {
            if let Some(z) = ds.zil.get() {
                z.restart();
            }
        }
    }

    pub fn remove_log(&self, name: &str) -> Result<()> {
        let logs = self.log_vdevs();
        let tops = self.io.tops();
        let Some(t) = tops.iter().find(|t| {
            logs.contains(&t.id)
                && (t.name() == name
                    || (t.kind == crate::vdev::TopKind::Disk
                        && t.leaves().iter().any(|l| l.path == name)))
        }) else {
            return Err(Error::invalid(format!(
                "no such log device in pool: '{name}'"
            )));
        };
        if t.id as usize + 1 != tops.len() {
            return Err(Error::invalid(format!(
                "cannot remove {name}: vdevs were added after it (uzfs removes only the last top-level vdev)"
            )));
        }
        let v = t.id;
        {
            let mut st = lock(&self.st);
            self.log_space.set_avoid(v, true, Some(&mut st.alloc));
        }
        for ds in self.dsl_pool().datasets() {
            if let Some(z) = ds.zil.get() {
                z.forget_vdev(v);
            }
        }
        // What was only in the log is committed by the txg.
        self.txg_wait_synced()?;
        let _g = self.sync_guard()?;
        let mut st = lock(&self.st);
        if st.config.vdev_tree.len() != v as usize + 1 {
            return Err(Error::invalid(format!(
                "cannot remove {name}: the pool changed"
            )));
        }
        let Some(cfg) = st.config.vdev_tree.pop() else {
            return Err(Error::invalid("no vdev"));
        };
        let va = st.alloc.vdevs.pop();
        self.log_space.drop_vdev(v);
        // Its space maps (empty: nothing but log blocks ever lived there).
        if let Some(va) = va {
            for ms in &va.metaslabs {
                if ms.sm_obj != 0 {
                    let _ = self.mos.free_object(ms.sm_obj);
                }
            }
        }
        if cfg.ms_array != 0 {
            let _ = self.mos.free_object(cfg.ms_array);
        }
        st.config_dirty = true;
        let removed = self
            .io
            .vdevs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        drop(st);
        drop(_g);
        self.sync()?;
        if let Some(top) = removed {
            for l in top.leaves() {
                let _ = label::clear(&*l.dev);
            }
        }
        Ok(())
    }

    /// `zpool remove POOL SPARE`: an unused spare leaves the pool.
    pub fn remove_spare(&self, name: &str) -> Result<()> {
        let _g = self.sync_guard()?;
        let spares = self.io.spares();
        let Some(s) = spares
            .iter()
            .find(|s| s.path == name || s.guid.to_string() == name)
        else {
            return Err(Error::invalid(format!("no such spare in pool: '{name}'")));
        };
        if self.spare_in_use(s) {
            return Err(Error::invalid(format!(
                "cannot remove {name}: spare is in use"
            )));
        }
        let _ = label::clear(&*s.dev);
        self.io
            .spares
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| !Arc::ptr_eq(x, s));
        lock(&self.st).config_dirty = true;
        Ok(())
    }

    pub fn spare_in_use(&self, s: &Arc<Leaf>) -> bool {
        self.io
            .tops()
            .iter()
            .flat_map(|t| t.leaves())
            .any(|l| Arc::ptr_eq(&l, s))
    }
}
