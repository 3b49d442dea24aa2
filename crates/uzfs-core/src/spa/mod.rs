//! The storage pool allocator: pool lifecycle (create, import, export,
//! destroy), configuration, allocation and the txg sync that ties the layers
//! together. See `txg.rs` for the commit protocol and `import.rs` for how a
//! pool is found and opened.

pub mod config;
pub mod expand;
pub mod feature;
pub mod gang;
pub mod import;
pub mod io;
pub mod label_check;
pub mod log_space;
pub mod metaslab;
pub mod mmp;
pub mod range_tree;
pub mod scan;
pub mod scan_queue;
pub mod space_map;
pub mod suspend;
pub mod txg;
pub mod uberblock;
pub mod vdev_ops;

use crate::dmu::blkptr::BlkPtr;
use crate::dmu::dnode::{ot, ObjProps};
use crate::dmu::objset::{Objset, OS_TYPE_DATASET, OS_TYPE_META};
use crate::error::{Error, Result};
use crate::vdev::{self, label, BlockDevice, FlushPolicy, Leaf, TopKind, TopVdev};
use config::*;
use io::SpaIo;
use metaslab::{Allocator, VdevAlloc};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;
use uberblock::Uberblock;

pub use txg::Tunables;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How one top-level vdev is to be built.
pub struct TopSpec {
    pub kind: TopKind,
    pub leaves: Vec<(String, Arc<dyn BlockDevice>)>,
}

#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub ashift: u8,
    pub flush: FlushPolicy,
    pub force: bool,
    pub tunables: Tunables,
    /// Seed for guids (tests); `None` draws from the OS.
    pub guid_seed: Option<u64>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            ashift: 12,
            flush: FlushPolicy::Honor,
            force: false,
            tunables: Tunables::default(),
            guid_seed: None,
        }
    }
}

pub(crate) struct SpaState {
    pub config: PoolConfig,
    pub alloc: Allocator,
    pub dir: ObjectDirectory,
    pub props: PoolProps,
    pub history_pending: Vec<String>,
    pub config_dirty: bool,
    pub ub: Option<Uberblock>,
    pub guid_rng: u64,
}

pub(crate) struct TxgState {
    pub open: u64,
    pub synced: u64,
    /// The txg being written out, if a sync is in progress.
    pub syncing: Option<u64>,
    pub shutdown: bool,
    pub want_sync: bool,
    /// The newest txg a `txg_wait_synced` caller waits for: the sync
    /// commits up to it even if the txg holds nothing (a waiter that saw
    /// changes pending must never wait on a sync that decides otherwise).
    pub wanted: u64,
    pub last_sync: Instant,
}

pub struct Pool {
    pub name: String,
    pub guid: u64,
    pub io: Arc<SpaIo>,
    pub mos: Objset,
    /// The root dataset's object set (also in `dsl`); a rollback of the
    /// root dataset replaces it (`root()`).
    root: RwLock<Arc<Objset>>,
    /// Every dataset (see `dsl/mod.rs`).
    pub dsl: crate::dsl::Dsl,
    pub(crate) st: Mutex<SpaState>,
    pub(crate) txg: Mutex<TxgState>,
    /// Set when a sync failed: the pool takes no more writes. Its own lock,
    /// so writers never wait behind a sync holding `st`.
    /// Space as of the last sync, for the same reason.
    pub(crate) space_snapshot: Mutex<SpaceSnapshot>,
    /// What admin commands read while a sync holds `st` (`published()`).
    pub(crate) published: Mutex<std::sync::Arc<Published>>,
    /// A write was refused for space while frees were still deferred: sync
    /// even otherwise empty txgs until this txg has committed, when they
    /// are allocatable again.
    pub(crate) frees_wanted: std::sync::atomic::AtomicU64,
    pub(crate) txg_cv: Condvar,
    pub(crate) sync_lock: Mutex<()>,
    pub tun: Tunables,
    /// The log allocation class (`log_space.rs`): its own lock, so intent
    /// log blocks are allocated while a sync holds `st`.
    pub log_space: log_space::LogSpace,
    /// What the import's intent-log replay did (`zil/replay.rs`).
    pub(crate) replay_report: Mutex<crate::zil::ReplayReport>,
    /// This pool, weakly (what an intent log keeps of it).
    me: std::sync::OnceLock<std::sync::Weak<Pool>>,
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Scrub / resilver state (see `scan.rs`).
    pub(crate) scan: Mutex<scan::ScanCtl>,
    pub scan_sig: scan::ScanSignals,
    /// When this pool was created or imported (iostat rates since then).
    pub opened: Instant,
    /// The multihost stamping thread (`mmp.rs`), while `multihost=on`.
    pub(crate) mmp: mmp::MmpCtl,
}

/// A copy of the pool state admin commands read (see `Pool::published`).
#[derive(Debug)]
pub(crate) struct Published {
    pub config: PoolConfig,
    pub props: PoolProps,
    pub ub: Option<Uberblock>,
    /// (allocated, free) of each top-level vdev, in vdev order.
    pub vdev_space: Vec<(u64, u64)>,
}

impl Published {
    fn of(st: &SpaState) -> Published {
        Published {
            config: st.config.clone(),
            props: st.props.clone(),
            ub: st.ub,
            vdev_space: st
                .alloc
                .vdevs
                .iter()
                .map(|v| {
                    let f = v.free_space();
                    (v.asize - f, f)
                })
                .collect(),
        }
    }
}

/// The pool's space as of the last committed txg.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpaceSnapshot {
    pub size: u64,
    /// Free, counting frees that wait out their two txgs.
    pub free: u64,
    /// What the allocator can hand out now (free less the deferred frees).
    pub allocatable: u64,
    pub pending_frees: u64,
    /// Worst allocated/logical ratio of a block, in 1/1024ths.
    pub inflation: u64,
    /// `size` deflated (`Allocator::deflated_space`).
    pub dsize: u64,
}

/// Validate a pool name as zpool(8) does.
pub fn check_pool_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("invalid pool name '{name}': {why}")));
    let Some(first) = name.chars().next() else {
        return bad("name is empty");
    };
    if !first.is_ascii_alphabetic() {
        return bad("name must begin with a letter");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.: ".contains(*c)) || *c == ' ')
    {
        return bad(&format!("invalid character '{c}' in pool name"));
    }
    if name.len() > 200 {
        return bad("name is too long");
    }
    for r in [
        "mirror", "raidz", "draid", "spare", "log", "cache", "special", "dedup",
    ] {
        if name.starts_with(r) {
            return bad(&format!("name is reserved ('{r}')"));
        }
    }
    if name.len() > 1
        && name.starts_with('c')
        && name[1..].starts_with(|c: char| c.is_ascii_digit())
    {
        return bad("pool name is reserved");
    }
    Ok(())
}

pub(crate) fn next_guid(state: &mut u64) -> u64 {
    loop {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z != 0 {
            return z;
        }
    }
}

pub(crate) fn os_entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Refuse a device whose labels say it belongs to a pool that is not
/// destroyed (`zpool create` / `add` without `-f`).
fn check_not_in_use(path: &str, dev: &dyn BlockDevice) -> Result<()> {
    match probe_label(dev) {
        Some(l) if l.pool.state != PoolState::Destroyed => Err(Error::invalid(format!(
            "{path} is part of {} pool '{}'\nuse '-f' to override",
            if l.pool.state == PoolState::Exported {
                "exported"
            } else {
                "active"
            },
            l.pool.name
        ))),
        _ => Ok(()),
    }
}

/// What a leaf's labels say, if anything.
pub fn probe_label(dev: &dyn BlockDevice) -> Option<LabelConfig> {
    label::read_configs(dev)
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .filter_map(|p| serde_json::from_slice::<LabelConfig>(&p).ok())
        .max_by_key(|c| c.pool.txg)
}

pub(crate) fn build_top(
    id: u32,
    spec: &TopSpec,
    ashift: u8,
    flush: FlushPolicy,
    guids: &mut u64,
) -> Result<(Arc<TopVdev>, TopConfig)> {
    if spec.leaves.is_empty() {
        return Err(Error::invalid("a vdev needs at least one device"));
    }
    let width = spec.leaves.len();
    spec.kind.ops().check_width(width).map_err(Error::invalid)?;
    if !(9..=16).contains(&ashift) {
        return Err(Error::invalid(format!(
            "ashift {ashift} out of range 9..16"
        )));
    }
    let mut raw_min = u64::MAX;
    for (path, dev) in &spec.leaves {
        if vdev::allocatable(dev.size()).is_none() {
            return Err(Error::invalid(format!(
                "cannot use '{path}': device is too small ({} bytes; the minimum is {} MiB)",
                dev.size(),
                vdev::MIN_DEVICE_SIZE >> 20
            )));
        }
        raw_min = raw_min
            .min(label::aligned_size(dev.size()) - vdev::LABEL_START_SIZE - vdev::LABEL_END_SIZE);
    }
    // The kind's address space over its smallest child (a mirror: that
    // child's; RAID-Z: one row short of it times the width), in whole
    // metaslabs. Every device is at least MIN_DEVICE_SIZE, so there is at
    // least one.
    let raw = vdev::Geometry {
        kind: spec.kind,
        width,
        ashift,
    }
    .space(raw_min);
    let ms_shift = vdev::metaslab_shift(raw);
    let asize = raw >> ms_shift << ms_shift;
    let top_guid = next_guid(guids);
    let children: Vec<Arc<Leaf>> = spec
        .leaves
        .iter()
        .map(|(path, dev)| Arc::new(Leaf::new(next_guid(guids), path.clone(), dev.clone())))
        .collect();
    let cfg = TopConfig {
        id,
        guid: top_guid,
        kind: spec.kind,
        ashift,
        asize,
        ms_shift,
        ms_array: 0,
        flush,
        children: children
            .iter()
            .map(|c| LeafConfig::new(c.guid, c.path.clone()))
            .collect(),
        log: false,
    };
    let top = Arc::new(TopVdev {
        id,
        guid: top_guid,
        kind: spec.kind,
        ashift,
        asize,
        ms_shift,
        flush,
        children,
    });
    Ok((top, cfg))
}

impl Pool {
    /// `zpool create`: label the devices and commit the pool's first txg.
    pub fn create(name: &str, specs: Vec<TopSpec>, opts: CreateOptions) -> Result<Arc<Pool>> {
        check_pool_name(name)?;
        if specs.is_empty() {
            return Err(Error::invalid("a pool needs at least one vdev"));
        }
        let mut seen = std::collections::HashSet::new();
        for (path, dev) in specs.iter().flat_map(|s| &s.leaves) {
            if !seen.insert(path.clone()) {
                return Err(Error::invalid(format!(
                    "device '{path}' is named more than once"
                )));
            }
            if !opts.force {
                check_not_in_use(path, &**dev)?;
            }
        }
        let mut guids = opts.guid_seed.unwrap_or_else(os_entropy);
        let pool_guid = next_guid(&mut guids);
        let mut tops = Vec::new();
        let mut cfgs = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let (t, c) = build_top(i as u32, spec, opts.ashift, opts.flush, &mut guids)?;
            tops.push(t);
            cfgs.push(c);
        }
        // Wipe stale uberblock rings so nothing of an older pool survives.
        for t in &tops {
            for c in t.leaves() {
                label::clear(&*c.dev)?;
            }
        }
        let txg = 1;
        let io = Arc::new(SpaIo::new(
            tops.clone(),
            opts.tunables.cache_bytes,
            opts.tunables.cache_min_bytes,
        ));
        let gate = Arc::new(crate::dmu::tx::TxgGate::new());
        let mos = Objset::create(OS_TYPE_META, io.clone(), gate.clone(), txg);
        let root = Arc::new(Objset::create(OS_TYPE_DATASET, io.clone(), gate, txg));
        let md = ObjProps::METADATA;
        let dir_obj = mos.create_object(ot::OBJECT_DIRECTORY, 4096, &md)?;
        debug_assert_eq!(dir_obj, 1);
        let dir = ObjectDirectory {
            config: mos.create_object(ot::PACKED_CONFIG, 16384, &md)?,
            history: mos.create_object(ot::HISTORY, 16384, &md)?,
            props: mos.create_object(ot::POOL_PROPS, 4096, &md)?,
            root_dataset: mos.create_object(ot::DSL_DATASET, 512, &md)?,
            scan: 0,
            dsl: mos.create_object(ot::DSL_DIR, 4096, &md)?,
            freeing: 0,
        };
        let mut vallocs = Vec::new();
        for c in &mut cfgs {
            let (ms_array, sms) = create_space_maps(&mos, c.asize >> c.ms_shift)?;
            c.ms_array = ms_array;
            vallocs.push(VdevAlloc::for_top(c, &sms));
        }
        let config = PoolConfig {
            version: POOL_VERSION,
            name: name.to_string(),
            pool_guid,
            state: PoolState::Active,
            txg,
            hostname: hostname(),
            hostid: opts.tunables.hostid,
            vdev_tree: cfgs,
            features: feature::default_set(),
            spares: Vec::new(),
            cache: Vec::new(),
        };
        let st = SpaState {
            config,
            alloc: Allocator::new(vallocs),
            dir: dir.clone(),
            props: PoolProps::default(),
            history_pending: Vec::new(),
            config_dirty: true,
            ub: None,
            guid_rng: guids,
        };
        let pool = Pool::assemble(io, mos, root, st, txg, 0, opts.tunables.clone());
        for d in pool.dsl_pool().datasets() {
            pool.attach_zil(&d)?;
        }
        pool.write_json(dir_obj, &dir)?;
        pool.write_json(dir.props, &PoolProps::default())?;
        pool.write_json(dir.dsl, &crate::dsl::DslDirPhys::default())?;
        pool.sync()?;
        if pool.tun.sync_thread {
            txg::start_sync_thread(&pool);
        }
        Ok(pool)
    }

    /// Put the pieces of an opened or created pool together (no thread yet).
    pub(crate) fn assemble(
        io: Arc<SpaIo>,
        mos: Objset,
        root: Arc<Objset>,
        mut st: SpaState,
        open_txg: u64,
        synced_txg: u64,
        tun: Tunables,
    ) -> Arc<Pool> {
        st.alloc.fence = io.reuse_fence.clone();
        st.alloc.scan_queue = io.scan_queue.clone();
        let root_ds = Arc::new(crate::dsl::Dataset {
            phys: crate::dsl::Record::new(crate::dsl::DsPhys {
                id: st.dir.root_dataset,
                ..Default::default()
            }),
            os: root.clone(),
            zil: Default::default(),
        });
        let dsl = crate::dsl::Dsl::default();
        dsl.list
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(st.dir.root_dataset, root_ds);
        let published = Arc::new(Published::of(&st));
        let pool = Arc::new(Pool {
            published: Mutex::new(published),
            name: st.config.name.clone(),
            guid: st.config.pool_guid,
            io,
            mos,
            root: RwLock::new(root),
            dsl,
            st: Mutex::new(st),
            txg: Mutex::new(TxgState {
                open: open_txg,
                synced: synced_txg,
                syncing: None,
                shutdown: false,
                want_sync: false,
                wanted: 0,
                last_sync: Instant::now(),
            }),
            txg_cv: Condvar::new(),
            space_snapshot: Mutex::new(SpaceSnapshot::default()),
            frees_wanted: std::sync::atomic::AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            scan_sig: scan::ScanSignals {
                delay_us: std::sync::atomic::AtomicU64::new(tun.scan_delay_us),
                ..Default::default()
            },
            tun,
            log_space: Default::default(),
            me: std::sync::OnceLock::new(),
            replay_report: Mutex::new(Default::default()),
            thread: Mutex::new(None),
            scan: Mutex::new(scan::ScanCtl::default()),
            opened: Instant::now(),
            mmp: mmp::MmpCtl::default(),
        });
        let _ = pool.me.set(Arc::downgrade(&pool));
        {
            let st = lock(&pool.st);
            pool.snapshot_space(&st.alloc);
        }
        pool
    }

    /// Write a JSON document as the whole contents of a MOS object.
    pub(crate) fn write_json<T: serde::Serialize>(&self, obj: u64, v: &T) -> Result<()> {
        let bytes = serde_json::to_vec(v).map_err(|e| Error::invalid(e.to_string()))?;
        let _tx = self.mos.tx();
        self.mos.write(obj, 0, &bytes)?;
        self.mos.set_size(obj, bytes.len() as u64)
    }

    pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
        mos: &Objset,
        obj: u64,
        what: &str,
    ) -> Result<T> {
        let dn = mos.stat(obj)?;
        if dn.size > 16 << 20 {
            return Err(Error::corrupt(what, "object too large"));
        }
        let mut buf = vec![0u8; dn.size as usize];
        mos.read(obj, 0, &mut buf)?;
        serde_json::from_slice(&buf).map_err(|e| Error::corrupt(what, e.to_string()))
    }

    /// Read the pool state without waiting for a sync: the live state when
    /// `st` is free (and publish it), else what was last published. The
    /// sync holds `st` for its whole length, which a hung device makes
    /// minutes; `zpool status`, `get`, `list` and `zfs list`/`get` must
    /// answer anyway (OpenZFS reads the config under a lock the sync does
    /// not hold for I/O).
    pub(crate) fn published(&self) -> std::sync::Arc<Published> {
        match self.st.try_lock() {
            Ok(st) => {
                let p = std::sync::Arc::new(Published::of(&st));
                *lock(&self.published) = p.clone();
                p
            }
            Err(_) => lock(&self.published).clone(),
        }
    }

    pub fn config(&self) -> PoolConfig {
        self.published().config.clone()
    }

    pub fn props(&self) -> PoolProps {
        self.published().props.clone()
    }

    pub fn set_comment(&self, comment: &str) -> Result<()> {
        check_comment(comment)?;
        self.update_props(|p| p.comment = comment.to_string())
    }

    pub fn set_default_ashift(&self, ashift: u8) -> Result<()> {
        if ashift != 0 && !(9..=16).contains(&ashift) {
            return Err(Error::invalid("ashift must be 0 or between 9 and 16"));
        }
        self.update_props(|p| p.ashift = ashift)
    }

    /// `zpool set autoexpand=on|off`; turning it on expands what can grow
    /// now, as OpenZFS does.
    pub fn set_autoexpand(&self, on: bool) -> Result<()> {
        self.update_props(|p| p.autoexpand = on)?;
        self.autoexpand();
        Ok(())
    }

    /// `zpool set autoreplace=on|off`.
    pub fn set_autoreplace(&self, on: bool) -> Result<()> {
        self.update_props(|p| p.autoreplace = on)
    }

    /// `zpool set failmode=wait|continue|panic`.
    pub fn set_failmode(&self, mode: config::FailMode) -> Result<()> {
        self.update_props(|p| p.failmode = mode)?;
        self.io.suspension.set_mode(mode);
        Ok(())
    }

    /// `zpool set listsnapshots=on|off`.
    pub fn set_listsnapshots(&self, on: bool) -> Result<()> {
        self.update_props(|p| p.listsnapshots = on)
    }

    /// Change the persisted pool properties (committed with the next txg).
    /// A pool whose sync is parked says so instead of waiting for `zpool
    /// clear` (the command hung before).
    fn update_props(&self, f: impl FnOnce(&mut PoolProps)) -> Result<()> {
        self.check_rw()?;
        let (obj, props) = {
            let mut st = self.lock_unless_parked(&self.st)?;
            f(&mut st.props);
            (st.dir.props, st.props.clone())
        };
        self.write_json(obj, &props)
    }

    pub fn set_flush(&self, vdev: &str, policy: FlushPolicy) -> Result<()> {
        self.check_rw()?;
        let mut st = self.lock_unless_parked(&self.st)?;
        let tops = self.io.tops();
        let Some(pos) = tops
            .iter()
            .position(|t| t.name() == vdev || t.children.iter().any(|c| c.path == vdev))
        else {
            return Err(Error::invalid(format!(
                "no such vdev '{vdev}' in pool '{}'",
                self.name
            )));
        };
        st.config.vdev_tree[pos].flush = policy;
        let new = tops[pos].with_flush(policy);
        self.io.vdevs.write().unwrap_or_else(|e| e.into_inner())[pos] = new;
        st.config_dirty = true;
        Ok(())
    }

    /// Record a command in the pool history (committed with the next txg).
    pub fn log_history(&self, cmd: &str) {
        if self.tun.readonly {
            return;
        }
        let now = scan::now_secs();
        match self.lock_unless_parked(&self.st) {
            Ok(mut st) => st.history_pending.push(format!("{now} {cmd}\n")),
            // The command's answer says the pool is suspended; waiting
            // here would hang it until `zpool clear`.
            Err(_) => log::warn!(
                "pool '{}': suspended; not recorded in its history: {cmd}",
                self.name
            ),
        }
    }

    /// Record an event of the pool itself (a device change, a scan), as
    /// OpenZFS's internal history events: `zpool history -i` shows them.
    pub fn log_internal(&self, event: &str) {
        self.log_history(&format!("{INTERNAL}{event}"));
    }

    /// Every history line: those written, then those waiting for the
    /// next txg (a command is listed as soon as it returned).
    pub fn history(&self) -> Result<Vec<(u64, String)>> {
        // Under `st`, so a sync cannot move lines from the queue to the
        // object in between (they would show twice). A sync parked on a
        // failed I/O holds `st`: say so rather than wait for it.
        let st = self.lock_unless_parked(&self.st)?;
        let obj = st.dir.history;
        let dn = self.mos.stat(obj)?;
        let mut buf = vec![0u8; dn.size as usize];
        self.mos.read(obj, 0, &mut buf)?;
        buf.extend_from_slice(st.history_pending.concat().as_bytes());
        drop(st);
        Ok(String::from_utf8_lossy(&buf)
            .lines()
            .filter_map(|l| {
                let (t, c) = l.split_once(' ')?;
                Some((t.parse().ok()?, c.to_string()))
            })
            .collect())
    }

    /// (allocated, free) of each top-level vdev, in vdev order.
    pub fn vdev_space(&self) -> Vec<(u64, u64)> {
        self.published().vdev_space.clone()
    }

    /// (size, allocated, free) in bytes, as of the last committed txg.
    /// Deferred frees count as free (they are, on disk), as `zpool list`
    /// shows them.
    pub fn space(&self) -> (u64, u64, u64) {
        let s = *lock(&self.space_snapshot);
        (s.size, s.size - s.free, s.free)
    }

    /// The longest free extent on any vdev, as of now: below the largest
    /// block size, new blocks are stored as gang blocks (`spa/gang.rs`).
    pub fn largest_free_extent(&self) -> u64 {
        lock(&self.st).alloc.largest_free()
    }

    /// Refresh the space snapshot from the allocator (caller holds `st`).
    pub(crate) fn snapshot_space(&self, alloc: &Allocator) {
        let size = alloc.total_space();
        // Chunks lent to the intent log that hold no live log block are
        // free on disk, and a sync short of space takes them back
        // (`LogSpace::release_idle`): users see them as free.
        let idle = self.log_space.idle_bytes();
        let free = alloc.free_space() + idle;
        let allocatable = alloc.allocatable_space() + idle;
        // Worst allocation overhead of a 16 KiB block on any vdev (RAID-Z
        // parity and padding, sector rounding), in 1/1024ths.
        const PROBE: u64 = 16 << 10;
        let inflation = alloc
            .vdevs
            .iter()
            .map(|v| v.round(PROBE) * 1024 / PROBE)
            .max()
            .unwrap_or(1024)
            .max(1024);
        *lock(&self.space_snapshot) = SpaceSnapshot {
            size,
            free,
            allocatable,
            pending_frees: free.saturating_sub(allocatable),
            inflation,
            dsize: alloc.deflated_space(),
        };
    }

    pub fn last_txg(&self) -> u64 {
        lock(&self.txg).synced
    }

    /// Ids of the top-level vdevs that are separate log devices.
    pub fn log_vdevs(&self) -> Vec<u32> {
        self.published()
            .config
            .vdev_tree
            .iter()
            .filter(|t| t.log)
            .map(|t| t.id)
            .collect()
    }

    /// The top-level vdevs as listings show them: data vdevs first, then
    /// the log devices (from the returned index on), each with its
    /// position in the config.
    pub fn tops_data_then_logs(&self) -> (Vec<(usize, Arc<TopVdev>)>, usize) {
        let logs = self.log_vdevs();
        let tops = self.io.tops();
        let (mut order, rest): (Vec<_>, Vec<_>) = tops
            .into_iter()
            .enumerate()
            .partition(|(_, t)| !logs.contains(&t.id));
        let first_log = order.len();
        order.extend(rest);
        (order, first_log)
    }

    /// What the import's intent-log replay did.
    pub fn replay_report(&self) -> crate::zil::ReplayReport {
        *lock(&self.replay_report)
    }

    /// The txg open for changes now.
    pub fn open_txg(&self) -> u64 {
        lock(&self.txg).open
    }

    /// An intent-log block of `psize` bytes from the log class, borrowing
    /// another chunk from the normal class if no sync holds it.
    pub fn log_alloc(&self, psize: u32) -> Option<log_space::LogLoc> {
        if let Some(l) = self.log_space.alloc(psize) {
            return Some(l);
        }
        let mut st = self.st.try_lock().ok()?;
        if !self.log_space.borrow(&mut st.alloc) {
            return None;
        }
        drop(st);
        self.log_space.alloc(psize)
    }

    /// Give a dataset its intent log (after replay, `zil/mod.rs`).
    pub(crate) fn attach_zil(&self, ds: &crate::dsl::Dataset) -> Result<()> {
        if self.tun.readonly {
            return Ok(());
        }
        let me = self.me.get().cloned().unwrap_or_default();
        let zil = Arc::new(crate::zil::Zil::new(
            me,
            Arc::downgrade(&ds.os),
            self.tun.zil_mem_max,
        ));
        ds.os.attach_log(zil.clone())?;
        ds.zil
            .set(zil)
            .map_err(|_| Error::invalid("dataset already has an intent log"))
    }

    /// This pool as its owners hold it (what a mounted snapshot keeps).
    pub(crate) fn arc(&self) -> Result<Arc<Pool>> {
        self.me
            .get()
            .and_then(std::sync::Weak::upgrade)
            .ok_or_else(|| Error::invalid(format!("pool '{}' is closing", self.name)))
    }

    /// The pool's dataset layer (OpenZFS `spa_get_dsl`).
    pub fn dsl_pool(&self) -> crate::dsl::DslPool<'_> {
        crate::dsl::DslPool { spa: self }
    }

    /// The root dataset's object set.
    pub fn root(&self) -> Arc<Objset> {
        self.root.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A rollback of the root dataset: its new object set.
    pub(crate) fn set_root(&self, os: Arc<Objset>) {
        *self.root.write().unwrap_or_else(|e| e.into_inner()) = os;
    }

    pub fn uberblock(&self) -> Option<Uberblock> {
        self.published().ub
    }

    /// Why the pool takes no more changes: a sync failed, or an operation
    /// broke off half done under a txg hold (fail-stop, `dmu/tx.rs`).
    pub fn suspended(&self) -> Option<String> {
        self.io
            .suspension
            .why()
            .or_else(|| self.mos.gate().poisoned())
    }

    /// `zpool add`: a new top-level vdev, committed before returning.
    pub fn add_vdev(&self, spec: TopSpec, ashift: Option<u8>, force: bool) -> Result<()> {
        self.add_top(spec, ashift, force, false)
    }

    /// `zpool add POOL log ...`: a separate intent-log device. Its space is
    /// the log class's alone (`log_space.rs`) and not in the pool's size.
    pub fn add_log_vdev(&self, spec: TopSpec, ashift: Option<u8>, force: bool) -> Result<()> {
        if !spec.kind.ops().replicated() {
            return Err(Error::invalid(format!(
                "a log device is a disk or a mirror, not {}",
                spec.kind.label()
            )));
        }
        if !force {
            if let Some((p, _)) = spec
                .leaves
                .iter()
                .find(|(p, _)| vdev::device::is_volatile(std::path::Path::new(p)))
            {
                return Err(Error::invalid(format!(
                    "{p} is in volatile memory (tmpfs or a RAM disk): synchronous writes acknowledged there are lost on power failure\nuse '-f' to override"
                )));
            }
        }
        self.add_top(spec, ashift, force, true)
    }

    fn add_top(&self, spec: TopSpec, ashift: Option<u8>, force: bool, log: bool) -> Result<()> {
        let _g = self.sync_guard()?;
        if !force {
            for (path, dev) in &spec.leaves {
                check_not_in_use(path, &**dev)?;
            }
        }
        let mut st = lock(&self.st);
        let id = st.config.vdev_tree.len() as u32;
        let ashift = ashift.unwrap_or(if st.props.ashift == 0 {
            12
        } else {
            st.props.ashift
        });
        let flush = st
            .config
            .vdev_tree
            .first()
            .map_or(FlushPolicy::Honor, |t| t.flush);
        let mut rng = st.guid_rng;
        let (top, mut cfg) = build_top(id, &spec, ashift, flush, &mut rng)?;
        cfg.log = log;
        st.guid_rng = rng;
        for c in top.leaves() {
            label::clear(&*c.dev)?;
        }
        let (ms_array, sms) = create_space_maps(&self.mos, cfg.asize >> cfg.ms_shift)?;
        cfg.ms_array = ms_array;
        st.alloc.vdevs.push(VdevAlloc::for_top(&cfg, &sms));
        st.config.vdev_tree.push(cfg);
        st.config_dirty = true;
        self.io
            .vdevs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(top);
        drop(st);
        drop(_g);
        self.sync().map(|_| ())
    }
}

/// How an internal event's history line starts (`Pool::log_internal`).
pub const INTERNAL: &str = "[internal] ";

/// The `comment` pool property's rule: at most 32 printable characters.
pub fn check_comment(comment: &str) -> Result<()> {
    if comment.len() > 32 || comment.chars().any(|c| c.is_control()) {
        return Err(Error::invalid(
            "comment must be at most 32 printable characters",
        ));
    }
    Ok(())
}

/// Rewrite the vdev tree, spares and cache devices of `config` from the
/// live leaves (paths, states, DTLs, attachments).
pub(crate) fn refresh_vdev_config(
    config: &mut PoolConfig,
    tops: &[Arc<TopVdev>],
    spares: &[Arc<Leaf>],
    caches: &[Arc<Leaf>],
) {
    for (t, tc) in tops.iter().zip(config.vdev_tree.iter_mut()) {
        tc.children = t.children.iter().map(|c| LeafConfig::of(c)).collect();
    }
    config.spares = spares.iter().map(|s| LeafConfig::of(s)).collect();
    config.cache = caches.iter().map(|s| LeafConfig::of(s)).collect();
}

/// Create one space map object per metaslab and the array listing them.
fn create_space_maps(mos: &Objset, count: u64) -> Result<(u64, Vec<u64>)> {
    let arr = mos.create_object(ot::METASLAB_ARRAY, 16384, &ObjProps::METADATA)?;
    let sms = append_space_maps(mos, arr, 0, count)?;
    Ok((arr, sms))
}

/// Create the space maps of metaslabs `from..to` and list them in the
/// metaslab array `arr` after the first `from`.
pub(crate) fn append_space_maps(mos: &Objset, arr: u64, from: u64, to: u64) -> Result<Vec<u64>> {
    let md = ObjProps::METADATA;
    let mut sms = Vec::with_capacity(to.saturating_sub(from) as usize);
    for _ in from..to {
        sms.push(mos.create_object(ot::SPACE_MAP, space_map::SM_BLOCK_SIZE, &md)?);
    }
    let bytes: Vec<u8> = sms.iter().flat_map(|s| s.to_le_bytes()).collect();
    mos.write(arr, from * 8, &bytes)?;
    Ok(sms)
}

/// The object-set pointers of every dataset of `dsl` (as committed in
/// `mos`), keyed by the scan bookmark's objset number (1 for the root
/// dataset, the MOS id for the others), in that order.
fn committed_datasets(
    mos: &Objset,
    dir: &ObjectDirectory,
    dsl: &crate::dsl::DslDirPhys,
) -> Result<Vec<(u64, BlkPtr)>> {
    let mut out = vec![(1, dataset_bp(mos, dir.root_dataset)?)];
    let mut ids: Vec<u64> = dsl.datasets.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    for id in ids {
        if id > 1 && id != dir.root_dataset && mos.exists(id)? {
            out.push((id, dataset_bp(mos, id)?));
        }
    }
    Ok(out)
}

/// One object set of a whole-pool walk (scan, zdb), in walk order.
pub(crate) struct WalkSet {
    /// Dataset (1: the root dataset, else its MOS object), then which of
    /// its sets: a snapshot's txg, `u64::MAX` for the head. The scan's
    /// bookmark orders by it.
    pub key: (u64, u64),
    pub root: BlkPtr,
    /// Blocks born before it belong to a set walked before: the previous
    /// snapshot of the same dataset, or a clone's origin.
    pub min_birth: u64,
    /// The snapshot's name (`None`: the head).
    pub snap: Option<String>,
    /// The snapshot's or head's dead list object and its recorded bytes.
    pub deadlist: (u64, u64),
    /// A snapshot's recorded `referenced` (`None`: the head, whose figure
    /// is in its object-set block).
    pub referenced: Option<u64>,
    /// The recorded `referenced` of the set before it in its line (the
    /// previous snapshot, or a clone's origin): what this one shares with
    /// it is that, less the dead list (zdb's exact cross-check).
    pub prev_referenced: u64,
    /// The txgs of the dataset's line (`dsl/deadlist.rs`): zdb checks
    /// the dead lists' keys against it.
    pub line: Vec<u64>,
}

/// Every dataset's snapshots, oldest first, then the dataset itself, as
/// committed. Each is walked only where it differs from the set before it
/// (`min_birth`): a block a later snapshot still holds was held by the
/// earlier one, so walking each once covers every block once.
///
/// `upto` (a scan's last txg): snapshots taken after it are not listed,
/// and the first of them stands in for the head, which holds every block
/// the scan needs that still exists. Blocks born after `upto` need no
/// scan, and a block born before it and overwritten in the head since
/// was either freed or kept by that snapshot, at the same position the
/// scan may already have passed in the head. So a scan's view of each
/// dataset does not shift under it when snapshots are taken.
pub(crate) fn walk_sets(
    mos: &Objset,
    dir: &ObjectDirectory,
    upto: Option<u64>,
) -> Result<Vec<WalkSet>> {
    let (dsl, _) = crate::dsl::records::read_dsl(mos, dir.dsl)?;
    let mut out = Vec::new();
    for (id, head_bp) in committed_datasets(mos, dir, &dsl)? {
        let head_id = if id == 1 { dir.root_dataset } else { id };
        let rec = dsl.datasets.iter().find(|d| d.id == head_id);
        let mut snaps: Vec<_> = dsl.snapshots.iter().filter(|s| s.ds == head_id).collect();
        snaps.sort_by_key(|s| s.txg);
        // A clone's blocks born by its origin's txg are the origin's.
        let origin = rec
            .filter(|d| d.origin != 0)
            .and_then(|d| dsl.snapshots.iter().find(|s| s.id == d.origin));
        let mut min_birth = origin.map_or(0, |o| o.txg + 1);
        let mut prev_referenced = origin.map_or(0, |o| o.referenced);
        let mut head = (head_bp, rec.map_or((0, 0), |d| (d.deadlist, d.dead_bytes)));
        let line = crate::dsl::deadlist::line_of(
            head_id,
            |ds| {
                dsl.snapshots
                    .iter()
                    .filter(|s| s.ds == ds)
                    .map(|s| s.txg)
                    .collect()
            },
            |ds| {
                let o = dsl.datasets.iter().find(|d| d.id == ds)?.origin;
                let os = dsl.snapshots.iter().find(|s| s.id == o)?;
                Some((os.ds, os.txg))
            },
            dsl.datasets.len(),
        );
        for s in snaps {
            let root = dataset_bp(mos, s.id)?;
            if upto.is_some_and(|u| s.txg > u) {
                head = (root, (s.deadlist, s.dead_bytes));
                break;
            }
            out.push(WalkSet {
                key: (id, s.txg),
                root,
                min_birth,
                snap: Some(s.name.clone()),
                deadlist: (s.deadlist, s.dead_bytes),
                referenced: Some(s.referenced),
                prev_referenced,
                line: line.clone(),
            });
            min_birth = s.txg + 1;
            prev_referenced = s.referenced;
        }
        out.push(WalkSet {
            key: (id, u64::MAX),
            root: head.0,
            min_birth,
            snap: None,
            deadlist: head.1,
            referenced: None,
            prev_referenced,
            line,
        });
    }
    Ok(out)
}

/// Decode the root dataset object: its first 128 bytes are the objset bp.
pub(crate) fn dataset_bp(mos: &Objset, obj: u64) -> Result<BlkPtr> {
    let mut b = [0u8; 128];
    mos.read(obj, 0, &mut b)?;
    BlkPtr::decode(&b)
}

/// The object interface of the pool's root dataset: what `zfs` datasets,
/// volumes and the benchmarks build on until the DSL arrives.
impl Pool {
    pub fn create_object(&self, blksz: u32, props: &ObjProps) -> Result<u64> {
        self.check_writable(0)?;
        self.root().create_object(ot::PLAIN_FILE, blksz, props)
    }

    /// Imported read-only? Then nothing may change it.
    pub fn readonly(&self) -> bool {
        self.tun.readonly
    }

    /// `Err(ReadOnly)` on a pool imported read-only.
    pub(crate) fn check_rw(&self) -> Result<()> {
        if self.tun.readonly {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        Ok(())
    }

    fn check_writable(&self, incoming: u64) -> Result<()> {
        self.check_rw()?;
        if let Some(why) = self.wait_out_suspension() {
            return Err(Error::suspended(&self.name, &why));
        }
        if self.admission_cost(self.dirty_bytes() + incoming) > self.writable_space() {
            // A scan parking frees holds space that writers need more: a
            // gather in progress ends its batch (`ScanSignals::yield_hold`),
            // the runs in flight (whose blocks' frees stay parked) go at
            // full pace, and the caller's retry after the next sync finds
            // the space.
            if self.pending_frees() > 0 && lock(&self.scan).thread.is_some() {
                self.scan_sig
                    .yield_hold
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                crate::vdev::queue::hurry_scans_for(std::time::Duration::from_millis(200));
            }
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// What `dirty` bytes of logical data may take once allocated: RAID-Z
    /// parity and sector rounding (the worst vdev's), plus 1/16 for the
    /// indirect, dnode and ditto metadata above the data. Copies beyond one
    /// are charged by the dataset that asks (`DsCtx`). An estimate: the
    /// slop reserve (`writable_space`) absorbs what it misses.
    pub fn admission_cost(&self, dirty: u64) -> u64 {
        let inflation = lock(&self.space_snapshot).inflation.max(1024);
        let bytes = dirty as u128 * inflation as u128 / 1024;
        (bytes + bytes / 16).min(u64::MAX as u128) as u64
    }

    /// Bytes freed in the last two txgs that are not allocatable yet.
    pub fn pending_frees(&self) -> u64 {
        lock(&self.space_snapshot).pending_frees
    }

    /// Write through the throttle. Fails with `NoSpace` (losing nothing
    /// already written) when the pool cannot hold the data.
    pub fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<()> {
        let copies = self.root().stat(obj)?.copies as u64;
        self.admit(data.len() as u64 * copies)?;
        self.root().write(obj, offset, data)?;
        Ok(())
    }

    /// Admit `bytes` of new dirty data into the open txg: refuse it when
    /// the pool cannot hold it (nothing is lost), else throttle.
    pub fn admit(&self, bytes: u64) -> Result<()> {
        self.scan_sig
            .fg_ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.check_writable(bytes)?;
        self.throttle(bytes)
    }

    pub fn read(&self, obj: u64, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.scan_sig
            .fg_ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.root().read(obj, offset, buf)
    }

    pub fn free_object(&self, obj: u64) -> Result<()> {
        self.root().free_object(obj)
    }

    pub fn object_size(&self, obj: u64) -> Result<u64> {
        Ok(self.root().stat(obj)?.size)
    }
}

/// Unit tests' pool: `name` on one simulated disk `d0` of `size` bytes.
#[cfg(test)]
pub(crate) fn sim_pool(
    world: &crate::vdev::sim::SimWorld,
    name: &str,
    size: u64,
    tunables: Tunables,
    guid_seed: Option<u64>,
) -> Result<(crate::vdev::sim::SimDevice, Arc<Pool>)> {
    let d = world.disk("d0", size);
    let spec = TopSpec {
        kind: TopKind::Disk,
        leaves: vec![(d.name(), Arc::new(d.clone()) as Arc<dyn BlockDevice>)],
    };
    let opts = CreateOptions {
        tunables,
        guid_seed,
        ..CreateOptions::default()
    };
    Ok((d, Pool::create(name, vec![spec], opts)?))
}

/// Unit tests' origin: dataset `t/o` of pool `t` with one file of 16 KiB
/// records holding 256 KiB of `fill`, snapshotted as `t/o@s`. Returns the
/// dataset and the file's object number.
#[cfg(test)]
pub(crate) fn sim_snapshotted_file(p: &Pool, fill: u8) -> (Arc<crate::dsl::Dataset>, u64) {
    use crate::dmu::dnode::{ot, ObjProps};
    p.dsl_pool().create_dataset("t/o", &[], false).expect("o");
    let o = p.dsl_pool().dataset("t/o").expect("o");
    let obj =
        o.os.create_object(ot::PLAIN_FILE, 16384, &ObjProps::default())
            .expect("object");
    o.os.write(obj, 0, &vec![fill; 256 << 10]).expect("write");
    p.dsl_pool()
        .create_snapshots(&["t/o@s".to_string()])
        .expect("snapshot");
    (o, obj)
}

/// Unit tests' tunables: no sync thread (the test syncs).
#[cfg(test)]
pub(crate) fn sim_tunables() -> Tunables {
    Tunables {
        sync_thread: false,
        ..Tunables::default()
    }
}

/// Import the pool on a copy of `d`'s image (as after a clean export or a
/// crash of the `sim_pool` it was made for).
#[cfg(test)]
pub(crate) fn sim_reimport(
    world: &crate::vdev::sim::SimWorld,
    d: &crate::vdev::sim::SimDevice,
    tunables: Tunables,
) -> Result<Arc<Pool>> {
    let img = world.disk_from_image("d0", d.image());
    let found = import::discover(vec![("d0".into(), Arc::new(img) as Arc<dyn BlockDevice>)]);
    let f = found
        .first()
        .ok_or_else(|| Error::invalid("pool not found"))?;
    Pool::import(f, None, tunables)
}
