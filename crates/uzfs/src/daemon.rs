//! `uzfs daemon`: holds imported pools and serves the control socket.
//!
//! Everything it keeps lives in the run directory (mode 0700): the socket
//! `uzfsd.sock` (mode 0600, so only its owner and root can connect), the pool
//! cache `zpool.cache` (which pools to re-import at start), `uzfsd.pid`,
//! `uzfsd.lock`, `uzfsd.conns` (its FUSE connections, for a client to cut a
//! daemon stuck dying loose: `wedge.rs`) and, when started by the CLI,
//! `uzfsd.log`. `uzfs daemon --stop` syncs and
//! closes every pool but leaves them in the cache, so the next daemon
//! re-imports them.

use crate::client::{socket_path, Request, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use uzfs_core::spa::import::{discover, FoundPool};
use uzfs_core::spa::{Pool, Tunables};
use uzfs_core::vdev::{BlockDevice, FileDevice};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CacheEntry {
    pub name: String,
    pub guid: u64,
    pub paths: Vec<String>,
    /// `-R altroot` the pool was created or imported with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub altroot: Option<String>,
    /// Imported read-only (`-o readonly=on`): re-imported read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
}

pub struct Daemon {
    pub rundir: PathBuf,
    pub pools: Mutex<BTreeMap<String, Arc<Pool>>>,
    /// Held by commands that change the set of imported pools (create,
    /// import, export, destroy), so two of them cannot both claim a name.
    pub admin: Mutex<()>,
    /// Mounted datasets (see `mounts.rs`).
    pub mounts: Mutex<crate::mounts::Mounts>,
    /// The `cachefile` property of imported pools.
    pub cachefiles: Mutex<CacheFiles>,
}

/// The `cachefile` pool property (zpoolprops(7)): where a pool's config is
/// cached so it is imported again when the daemon starts. Not stored in
/// the pool: it lasts for one import (and across daemon restarts, through
/// the cache entry), as OpenZFS.
#[derive(Default)]
pub struct CacheFiles {
    /// Pool name to `none` (never cached) or a file path; pools not listed
    /// use the daemon's `zpool.cache`, the only one read at start.
    pub by_pool: BTreeMap<String, String>,
    /// Every file named so far, rewritten (empty once its last pool is
    /// exported) by each `write_cache`.
    pub files: std::collections::BTreeSet<String>,
}

impl CacheFiles {
    /// `zpool get cachefile`: `-` for the default.
    pub fn value(&self, pool: &str) -> String {
        self.by_pool
            .get(pool)
            .cloned()
            .unwrap_or_else(|| "-".into())
    }

    /// Set a pool's `cachefile` (`""` or `-`: the default).
    pub fn set(&mut self, pool: &str, v: &str) {
        match v {
            "" | "-" => {
                self.by_pool.remove(pool);
            }
            v => {
                if v != "none" {
                    self.files.insert(v.to_string());
                }
                self.by_pool.insert(pool.to_string(), v.to_string());
            }
        }
    }
}

/// Read a cache file's entries (`zpool import -c`).
pub fn read_cache_file(path: &Path) -> Result<Vec<CacheEntry>, String> {
    let b = std::fs::read(path).map_err(|e| format!("cannot read '{}': {e}", path.display()))?;
    if b.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&b).map_err(|e| format!("'{}' is not a cache file: {e}", path.display()))
}

/// Write `entries` to `path` atomically (temp + rename), unless it holds
/// them already.
fn write_entries(path: &Path, entries: &[CacheEntry]) {
    let Ok(b) = serde_json::to_vec_pretty(entries) else {
        return;
    };
    if std::fs::read(path).is_ok_and(|old| old == b) {
        return;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    if std::fs::write(&tmp, b).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Create the run directory (0700; its parents as umask says), or check
/// that an existing one is safe (`client::check_rundir`). An existing
/// directory's mode is never changed: a shared one (say 1777) named by
/// mistake is refused, not made private under its other users.
pub fn prepare_rundir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    crate::client::check_rundir(dir)
}

pub fn open_paths(paths: &[String]) -> Vec<(String, Arc<dyn BlockDevice>)> {
    paths
        .iter()
        .filter_map(|p| {
            FileDevice::open(Path::new(p))
                .ok()
                .map(|d| (p.clone(), Arc::new(d) as Arc<dyn BlockDevice>))
        })
        .collect()
}

impl Daemon {
    pub fn cache_path(&self) -> PathBuf {
        self.rundir.join("zpool.cache")
    }

    pub fn read_cache(&self) -> Vec<CacheEntry> {
        std::fs::read(self.cache_path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Update the device paths of imported pools in the cache, keeping the
    /// entries of cached pools that are not imported (devices away).
    pub fn refresh_cache(&self) {
        let Ok(old) = std::fs::read(self.cache_path()) else {
            return;
        };
        let Ok(mut entries) = serde_json::from_slice::<Vec<CacheEntry>>(&old) else {
            return;
        };
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for e in entries.iter_mut() {
            if let Some(p) = pools.values().find(|p| p.guid == e.guid) {
                e.paths = device_paths(p);
            }
        }
        drop(pools);
        if let Ok(b) = serde_json::to_vec_pretty(&entries) {
            if b != old {
                let tmp = self.rundir.join("zpool.cache.tmp");
                if std::fs::write(&tmp, b).is_ok() {
                    let _ = std::fs::rename(&tmp, self.cache_path());
                }
            }
        }
    }

    /// Rewrite the cache from the imported pools, and every `cachefile`
    /// named by one (atomically: temp + rename).
    pub fn write_cache(&self) {
        let alt = self
            .mounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .altroot
            .clone();
        let cf = self.cachefiles.lock().unwrap_or_else(|e| e.into_inner());
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let entry = |p: &Arc<Pool>| CacheEntry {
            name: p.name.clone(),
            guid: p.guid,
            altroot: alt.get(&p.name).cloned(),
            readonly: p.readonly(),
            paths: device_paths(p),
        };
        let of = |file: Option<&str>| -> Vec<CacheEntry> {
            pools
                .values()
                .filter(|p| cf.by_pool.get(&p.name).map(String::as_str) == file)
                .map(entry)
                .collect()
        };
        write_entries(&self.cache_path(), &of(None));
        for f in &cf.files {
            write_entries(Path::new(f), &of(Some(f)));
        }
    }

    pub fn tunables() -> Tunables {
        fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok().and_then(|v| v.parse::<T>().ok())
        }
        let mut t = Tunables {
            hostid: hostid(),
            ..Tunables::default()
        };
        if let Some(ms) = env::<u64>("UZFS_MMP_INTERVAL_MS") {
            t.mmp_interval = std::time::Duration::from_millis(ms.clamp(10, 60_000));
        }
        if let Some(s) = env::<u64>("UZFS_TXG_TIMEOUT") {
            t.txg_timeout = std::time::Duration::from_secs(s.max(1));
        }
        if let Some(m) = env::<u64>("UZFS_DIRTY_MAX") {
            t.dirty_max = m.max(1 << 20);
        }
        if let Some(p) = env::<u64>("UZFS_DIRTY_SYNC_PCT") {
            t.dirty_sync_pct = p.clamp(1, 100);
        }
        if let Some(b) = env::<u64>("UZFS_DIRTY_WHOLE_SYNC") {
            t.dirty_whole_sync = b.max(1 << 20);
        }
        if let Some(m) = env::<u64>("UZFS_ARC_MAX") {
            t.cache_bytes = m.max(1 << 20);
        }
        if let Some(m) = env::<u64>("UZFS_ARC_MIN") {
            t.cache_min_bytes = m;
        }
        if let Some(m) = env("UZFS_ZIL_MEM_MAX") {
            t.zil_mem_max = m;
        }
        if let Some(m) = env("UZFS_ZIL_IMMEDIATE_WRITE_SZ") {
            t.zil_indirect_min = m;
        }
        if let Some(n) = env::<usize>("UZFS_ZIL_INFLIGHT") {
            t.zil_inflight = n.clamp(1, 16);
        }
        if let Some(us) = env("UZFS_SCAN_DELAY_US") {
            t.scan_delay_us = us;
        }
        // Blocks one txg frees of destroyed datasets (async destroy).
        if let Some(n) = env::<u64>("UZFS_FREE_MAX_BLOCKS") {
            t.free_max_blocks = n.max(1);
        }
        t
    }

    /// Import and hold a pool. Does not touch the cache: `zpool import`
    /// records it there, a re-import at start finds it there already.
    /// Import a found pool; `mount`: mount its filesystems (`-N` does not).
    pub fn import(
        &self,
        found: &FoundPool,
        new_name: Option<&str>,
        mount: bool,
        readonly: bool,
        missing_log: bool,
    ) -> Result<Arc<Pool>, String> {
        let name = new_name.unwrap_or(&found.config.name).to_string();
        if self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&name)
        {
            return Err(format!(
                "cannot import '{name}': a pool with that name already exists"
            ));
        }
        // One owner per pool: hold every device before anything is written.
        for d in &found.devices {
            d.dev
                .claim()
                .map_err(|e| format!("cannot import '{}': {e}", found.config.name))?;
        }
        let tun = Tunables {
            readonly,
            missing_log_ok: missing_log,
            ..Self::tunables()
        };
        let pool = Pool::import(found, new_name, tun).map_err(|e| e.to_string())?;
        if !readonly {
            pool.log_history(&format!("zpool import {}", found.config.name));
            pool.txg_wait_synced().map_err(|e| e.to_string())?;
        }
        self.pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, pool.clone());
        if mount {
            for e in crate::mounts::mount_all(self, &pool) {
                log::warn!("{e}");
            }
        }
        Ok(pool)
    }

    fn reimport_cached(&self) {
        for e in self.read_cache() {
            let found = discover(open_paths(&e.paths))
                .into_iter()
                .find(|f| f.config.pool_guid == e.guid);
            if let Some(a) = &e.altroot {
                self.mounts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .altroot
                    .insert(e.name.clone(), a.clone());
            }
            match found {
                Some(f) => match self.import(&f, Some(&e.name), true, e.readonly, false) {
                    Ok(_) => log::info!("imported '{}' from the cache", e.name),
                    Err(err) => {
                        log::error!("cannot re-import '{}': {err}", e.name)
                    }
                },
                None => log::error!("cannot re-import '{}': devices not found", e.name),
            }
        }
        // The cache is left as it was: a pool whose devices are absent now
        // stays listed, and is re-imported by a later start.
    }

    pub fn close_all(&self) {
        let names: Vec<String> = crate::mounts::list(self)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if let Err(e) = crate::mounts::unmount_many(self, names, true) {
            log::warn!("{e}");
        }
        let pools: Vec<Arc<Pool>> = self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for p in pools {
            if let Err(e) = p.close() {
                log::error!("closing '{}': {e}", p.name);
            }
        }
    }
}

fn handle(d: &Daemon, stream: UnixStream) {
    // A client sends its request as soon as it connects; one that sends
    // nothing must not hold a slot for ever.
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut r = BufReader::new((&stream).take(MAX_REQUEST));
    let mut line = String::new();
    // Only the thread that served `shutdown` ends the process, once its
    // unmounts and exports are done. Any thread used to, as soon as the
    // flag was up: `daemon --stop` probes the socket with a connection
    // that sends nothing, and that connection's thread exited the process
    // while the shutdown's unmount waited on a FUSE request of its own
    // mount, which left the daemon a zombie stuck in the kernel (the CLI
    // test `cache_keeps_a_pool_whose_devices_are_away` hung 1 run in 5).
    let mut stopping = false;
    let resp = match r.read_line(&mut line) {
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                stopping = req.argv.first().map(String::as_str) == Some("shutdown");
                dispatch(d, &req)
            }
            Err(e) => Response::err(2, format!("bad request: {e}")),
        },
        Err(e) => Response::err(2, format!("bad request: {e}")),
    };
    if let Ok(mut b) = serde_json::to_vec(&resp) {
        b.push(b'\n');
        let _ = (&stream).write_all(&b);
    }
    if stopping {
        let _ = std::fs::remove_file(socket_path(&d.rundir));
        let _ = std::fs::remove_file(d.rundir.join("uzfsd.pid"));
        std::process::exit(0);
    }
}

fn dispatch(d: &Daemon, req: &Request) -> Response {
    let cwd = Path::new(&req.cwd);
    match req.argv.first().map(String::as_str) {
        Some("zpool") => crate::zpool::run(d, &req.argv[1..], cwd),
        Some("zfs") => crate::zfs::run(d, &req.argv[1..]),
        Some("zdb") => crate::zdb::run_in_daemon(d, &req.argv[1..]),
        Some("zinject") => crate::vdevs::zinject(d, &req.argv[1..]),
        Some("zilstat") => crate::zilstat::snapshot_cmd(d, &req.argv[1..]),
        Some("arcstat") => crate::arcstat::snapshot_cmd(d, &req.argv[1..]),
        Some("object") => crate::zpool::object_cmd(d, &req.argv[1..], cwd),
        Some("shutdown") => {
            d.close_all();
            Response::ok("uzfs daemon stopped\n".into())
        }
        Some("ping") => Response::ok(format!(
            "uzfsd {} pid {}\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id()
        )),
        _ => Response::err(2, "unknown request"),
    }
}

/// The daemon log (stderr, which an auto-started daemon sends to
/// `uzfsd.log`): a timestamp and a level on every line. `UZFS_LOG` sets the
/// filter (`info` by default; `debug` adds per-txg and scan traces).
fn init_logging() {
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("UZFS_LOG", "info"))
        .format_timestamp_millis()
        .format_target(false)
        .try_init();
}

/// Take the run directory's lock. A daemon that is stopping (`daemon
/// --stop`, then a command auto-starts the next) still holds it for a
/// moment: wait for that, up to 10 s, but give up at once while another
/// daemon answers on the socket.
fn lock_run_dir(f: &std::fs::File, rundir: &Path) -> Result<(), std::fs::TryLockError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match f.try_lock() {
            Err(std::fs::TryLockError::WouldBlock)
                if std::time::Instant::now() < deadline
                    && crate::client::connect(rundir).is_err() =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Arenas glibc's malloc may use in the daemon (`MALLOC_ARENA_MAX` in its
/// environment overrides it). By default glibc gives threads that contend
/// an arena each, up to eight per CPU, and hands little of an arena's
/// freed memory back: data buffers allocated on the FUSE threads and freed
/// on the sync thread strand memory across arenas. Measured with the
/// daemon in a 1 GiB cgroup writing and reading a 4 GiB file
/// (`tests/memory_bound.rs`): peak RSS 869-919 MiB with glibc's default
/// (16 arenas on two CPUs), 455-572 MiB with two, 556 MiB with four. Four
/// cost eight clients' 4 KiB fsyncs 1-5% of their IOPS (bench/RESULTS.md).
const MALLOC_ARENAS: i32 = 4;

fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only sets a parameter of the allocator; it takes
    // the allocator's own lock and has no other precondition.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Hand memory the allocator holds free back to the kernel (glibc's
/// `malloc_trim`, which also releases whole free pages inside its heaps,
/// not only at their top). Called when the daemon's RSS passes its budget
/// (`arcstat::start_kstat_writer`). `UZFS_MALLOC_TRIM=0` turns it off.
pub fn return_free_memory() {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("UZFS_MALLOC_TRIM").map_or(true, |v| v != "0")) {
        return;
    }
    let t = std::time::Instant::now();
    // SAFETY: malloc_trim takes each arena's lock itself and only returns
    // pages that hold no allocation; it has no precondition.
    unsafe {
        libc::malloc_trim(0);
    }
    use std::sync::atomic::Ordering::Relaxed;
    TRIMS.fetch_add(1, Relaxed);
    TRIM_US.fetch_add(t.elapsed().as_micros() as u64, Relaxed);
}

/// Trims done, and the microseconds they took (each holds an arena's lock
/// while it walks the heap: a thread allocating there waits):
/// `uzfs_malloc_trims` and `uzfs_malloc_trim_us` in `arcstats`.
pub static TRIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static TRIM_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Run the daemon in the foreground until a `shutdown` request.
pub fn run(rundir: &Path) -> i32 {
    limit_malloc_arenas();
    init_logging();
    // Before any thread: the flag is inherited by threads created later.
    crate::fuse::bdi::mark_io_flusher();
    if let Err(e) = prepare_rundir(rundir) {
        log::error!("cannot create run directory {}: {e}", rundir.display());
        return 1;
    }
    // One daemon per run directory: concurrent auto-starts race here, and
    // all but one stop before touching the socket or any pool. The lock
    // lives as long as this process.
    let lock_path = rundir.join("uzfsd.lock");
    let _run_lock = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    {
        Ok(f) => match lock_run_dir(&f, rundir) {
            Ok(()) => f,
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = std::fs::read_to_string(rundir.join("uzfsd.pid")).unwrap_or_default();
                if crate::client::connect(rundir).is_ok() {
                    log::error!(
                        "another daemon (pid {}) already serves {}",
                        pid.trim(),
                        rundir.display()
                    );
                } else {
                    // Killed and still finishing its I/O, or hung: the
                    // client that started this one starts another.
                    log::error!(
                        "the lock of {} is still held (the daemon with pid {} is \
                         exiting, or hung) and nothing answers on its socket",
                        rundir.display(),
                        pid.trim()
                    );
                }
                return 1;
            }
            Err(std::fs::TryLockError::Error(e)) => {
                log::error!("cannot lock {}: {e}", lock_path.display());
                return 1;
            }
        },
        Err(e) => {
            log::error!("cannot open {}: {e}", lock_path.display());
            return 1;
        }
    };
    let sock = socket_path(rundir);
    if crate::client::connect(rundir).is_ok() {
        log::error!("another daemon is already serving {}", sock.display());
        return 1;
    }
    let _ = std::fs::remove_file(&sock);
    // The socket is born 0600 (no window in which others may connect).
    // SAFETY: umask(2) has no preconditions; the old mask is restored.
    let old_mask = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(&sock);
    // SAFETY: as above.
    unsafe { libc::umask(old_mask) };
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            log::error!("cannot listen on {}: {e}", sock.display());
            return 1;
        }
    };
    let _ = std::fs::write(
        rundir.join("uzfsd.pid"),
        format!("{}\n", std::process::id()),
    );
    let d = Arc::new(Daemon {
        rundir: rundir.to_path_buf(),
        pools: Mutex::new(BTreeMap::new()),
        admin: Mutex::new(()),
        mounts: Mutex::new(Default::default()),
        cachefiles: Mutex::new(Default::default()),
    });
    d.reimport_cached();
    crate::arcstat::start_kstat_writer(&d);
    // Devices change without a command (a replacement finishing, a spare
    // stepping in): keep the cache's device paths current.
    {
        let w = Arc::downgrade(&d);
        let _ = std::thread::Builder::new()
            .name("cache-writer".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(2));
                match w.upgrade() {
                    Some(d) => d.refresh_cache(),
                    None => return,
                }
            });
    }
    log::info!("serving {}", sock.display());
    serve_connections(&d, &listener);
    0
}

/// Commands served at once (`UZFS_MAX_CONNECTIONS`, default 64, at least
/// 2). Each has a thread; a connection over the bound is answered "busy"
/// at once. Unbounded, 400 idle connections under a 200-task limit made a
/// thread spawn fail, which panicked the daemon and took every mount with
/// it. Too low a bound makes concurrent commands (`zpool wait`, scripts
/// in parallel) wait: the client retries a busy daemon for 30 s.
fn max_connections() -> usize {
    std::env::var("UZFS_MAX_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64usize)
        .max(2)
}

/// One of the `max_connections` slots, given back when its thread ends.
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Accept control connections until the process exits: a thread each,
/// within the bound. Neither a flood of connections nor a failed thread
/// spawn (the task limit reached by something else) stops the daemon:
/// that connection is answered "busy" and closed.
fn serve_connections(d: &Arc<Daemon>, listener: &UnixListener) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let live = Arc::new(AtomicUsize::new(0));
    let max = max_connections();
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            // Out of descriptors (EMFILE, ENFILE) or memory: let the
            // commands in flight finish and close theirs.
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let n = live.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(live.clone());
        if n >= max {
            answer_busy(stream, &format!("{n} commands are in progress"));
            continue;
        }
        let reply_to = stream.try_clone();
        let d2 = d.clone();
        let spawned = std::thread::Builder::new()
            .name("uzfs-cmd".into())
            .spawn(move || {
                let _slot = slot;
                handle(&d2, stream)
            });
        if let Err(e) = spawned {
            log::warn!("cannot start a thread for a command: {e}");
            if let Ok(s) = reply_to {
                answer_busy(s, &format!("cannot start a thread: {e}"));
            }
        }
    }
}

/// Answer a connection the daemon cannot serve now, without a thread and
/// without waiting for the client: read what it sent already, say why
/// (`client::BUSY`, so the client retries), close.
fn answer_busy(stream: UnixStream, why: &str) {
    let _ = stream.set_nonblocking(true);
    let mut sink = [0u8; 4096];
    while matches!((&stream).read(&mut sink), Ok(n) if n > 0) {}
    let r = Response::err(
        crate::client::BUSY,
        format!("the uzfs daemon is busy ({why}); try again"),
    );
    if let Ok(mut b) = serde_json::to_vec(&r) {
        b.push(b'\n');
        let _ = (&stream).write_all(&b);
    }
}

/// Largest request line read: argv and cwd, never data.
const MAX_REQUEST: u64 = 4 << 20;

/// This host's id, as OpenZFS takes it: `/etc/hostid` (written by
/// `zgenhostid`) through gethostid(3), which falls back to one derived
/// from the host's address. `UZFS_HOSTID` (hex, `0x` optional) overrides
/// it, for containers sharing one `/etc/hostid` and for tests.
pub fn hostid() -> u64 {
    if let Ok(v) = std::env::var("UZFS_HOSTID") {
        let v = v.trim().trim_start_matches("0x");
        if let Ok(id) = u64::from_str_radix(v, 16) {
            return id & 0xffff_ffff;
        }
        log::warn!("UZFS_HOSTID={v} is not a hex number; using gethostid()");
    }
    // SAFETY: gethostid has no preconditions.
    (unsafe { libc::gethostid() }) as u32 as u64
}

/// Every device of `p` the cache file lists for the next start's import:
/// data and log leaves, spares, cache devices.
fn device_paths(p: &Pool) -> Vec<String> {
    p.io.tops()
        .iter()
        .flat_map(|t| t.leaves())
        .chain(p.io.spares())
        .chain(p.io.cache_leaves())
        .map(|l| l.path.clone())
        .collect()
}
