//! Mounted datasets: which dataset is mounted where, mounting on create,
//! import and daemon start, unmounting on export, destroy and shutdown.

use crate::daemon::Daemon;
use crate::fuse::rollback::FuseMount;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uzfs_core::dsl::{Dataset, DsCtx};
use uzfs_core::spa::Pool;
use uzfs_core::zpl::Zpl;

pub struct Mounted {
    pub pool: String,
    pub path: PathBuf,
    pub ctx: Arc<DsCtx>,
    /// The served tree (`fuse/rollback.rs` swaps it).
    fs: Arc<FuseMount>,
    session: Option<crate::fuse::Session>,
}

#[derive(Default)]
pub struct Mounts {
    /// Keyed by dataset name.
    pub by_name: BTreeMap<String, Mounted>,
    /// Pool name -> altroot (`zpool create/import -R`).
    pub altroot: BTreeMap<String, String>,
}

fn lock(d: &Daemon) -> std::sync::MutexGuard<'_, Mounts> {
    d.mounts.lock().unwrap_or_else(|e| e.into_inner())
}

fn umount2(path: &Path, flags: i32) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let r = unsafe { libc::umount2(c.as_ptr(), flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Unmount `path`, lazily if busy (the FUSE floor's exit).
pub fn umount_path(path: &Path) {
    if umount2(path, 0).is_err() {
        let _ = umount2(path, libc::MNT_DETACH);
    }
}

/// The altroot of pool `name`: from `zpool create/import -R`, else
/// `UZFS_ALTROOT` in the daemon's environment (a container or a test keeps
/// every mount under one directory).
pub fn altroot(d: &Daemon, name: &str) -> Option<String> {
    lock(d).altroot.get(name).cloned().or_else(|| {
        std::env::var("UZFS_ALTROOT")
            .ok()
            .filter(|a| a.starts_with('/'))
    })
}

/// Where `ds` mounts (altroot applied), or why it does not.
pub fn mountpoint_of(d: &Daemon, pool: &Pool, ds: &Arc<Dataset>) -> Result<PathBuf, String> {
    let (mp, _) = pool
        .dsl_pool()
        .get_prop(ds, "mountpoint")
        .map_err(|e| e.to_string())?;
    if mp == "none" || mp == "legacy" {
        return Err(format!("mountpoint is '{mp}'"));
    }
    Ok(match altroot(d, &pool.name) {
        Some(a) if mp == "/" => PathBuf::from(a),
        Some(a) => PathBuf::from(format!("{}{mp}", a.trim_end_matches('/'))),
        None => PathBuf::from(mp),
    })
}

/// List the FUSE connections in the run directory, for a client to cut
/// this daemon loose should it be killed while it waits on itself
/// (`crate::wedge`).
fn note_conns(d: &Daemon, m: &Mounts) {
    let conns = m
        .by_name
        .values()
        .filter_map(|m| m.session.as_ref()?.conn.as_ref())
        .map(|(minor, at)| (*minor, at.as_path()));
    crate::wedge::note(&d.rundir, conns);
}

/// Mount a dataset; `temp_ro`: `zfs mount -o ro|rw`, a temporary
/// `readonly` for this mount only (`None`: the property's value).
pub fn mount(
    d: &Daemon,
    pool: &Arc<Pool>,
    ds: &Arc<Dataset>,
    temp_ro: Option<bool>,
) -> Result<(), String> {
    let name = pool.dsl_pool().ds_name(&ds.rel());
    if lock(d).by_name.contains_key(&name) {
        return Err(format!("cannot mount '{name}': filesystem already mounted"));
    }
    let (canmount, _) = pool
        .dsl_pool()
        .get_prop(ds, "canmount")
        .map_err(|e| e.to_string())?;
    if canmount == "off" {
        return Err(format!(
            "cannot mount '{name}': 'canmount' property is set to 'off'"
        ));
    }
    let path = mountpoint_of(d, pool, ds).map_err(|e| format!("cannot mount '{name}': {e}"))?;
    // A daemon that died leaves a dead FUSE mount: clear it.
    if let Err(e) = std::fs::metadata(&path) {
        if is_dead_mount(&e) {
            let _ = umount2(&path, libc::MNT_DETACH);
        }
    }
    let ctx = DsCtx::new(pool.clone(), ds.clone());
    ctx.set_temp_readonly(temp_ro);
    let zpl = Arc::new(
        Zpl::mount(ds.os.clone(), ctx.clone())
            .map_err(|e| format!("cannot mount '{name}': not a filesystem: {e}"))?,
    );
    let readonly = uzfs_core::zpl::DatasetCtx::props(&*ctx).readonly;
    let posix_acl = pool
        .dsl_pool()
        .get_prop(ds, "acltype")
        .map(|(v, _)| v == "posix")
        .unwrap_or(false);
    let mount = || {
        let ctl = crate::fuse::ctldir::CtlDir::new(pool.clone(), ds.clone());
        crate::fuse::mount(zpl.clone(), &path, &name, readonly, posix_acl, Some(ctl))
    };
    let (session, fs) = match mount() {
        // The check above can miss a dead mount: the kernel answers a
        // stat of its root from the attribute cache. Clear it and retry.
        Err(e) if is_dead_mount(&e) => {
            let _ = umount2(&path, libc::MNT_DETACH);
            mount()
        }
        r => r,
    }
    .map_err(|e| format!("cannot mount '{name}' on {}: {e}", path.display()))?;
    log::info!(
        "mounted {name} at {} over {}",
        path.display(),
        session.transport
    );
    let mut m = lock(d);
    m.by_name.insert(
        name,
        Mounted {
            pool: pool.name.clone(),
            path,
            ctx,
            fs,
            session: Some(session),
        },
    );
    note_conns(d, &m);
    Ok(())
}

/// Mount every dataset of `pool` that should be (parents first). Errors are
/// collected, not fatal: one bad mountpoint must not keep the rest down.
pub fn mount_all(d: &Daemon, pool: &Arc<Pool>) -> Vec<String> {
    let mut errs = Vec::new();
    let mut dss: Vec<(PathBuf, Arc<Dataset>)> = pool
        .dsl_pool()
        .datasets()
        .into_iter()
        .filter(|ds| {
            pool.dsl_pool()
                .get_prop(ds, "canmount")
                .map(|(v, _)| v == "on")
                .unwrap_or(false)
        })
        .filter_map(|ds| mountpoint_of(d, pool, &ds).ok().map(|p| (p, ds)))
        .collect();
    dss.sort_by_key(|(p, _)| p.as_os_str().len());
    for (_, ds) in dss {
        if lock(d)
            .by_name
            .contains_key(&pool.dsl_pool().ds_name(&ds.rel()))
        {
            continue;
        }
        if ds.rel().is_empty() && !ds.os.exists(1).unwrap_or(false) {
            continue; // a pool made before filesystems existed
        }
        if let Err(e) = mount(d, pool, &ds, None) {
            errs.push(e);
        }
    }
    errs
}

/// Unmount one dataset. Busy mounts fail unless `force` (lazy detach).
pub fn unmount(d: &Daemon, name: &str, force: bool) -> Result<(), String> {
    let path = match lock(d).by_name.get(name) {
        Some(m) => m.path.clone(),
        None => return Err(format!("cannot unmount '{name}': not currently mounted")),
    };
    let flags = if force { libc::MNT_DETACH } else { 0 };
    if let Err(e) = umount2(&path, flags) {
        if e.raw_os_error() == Some(libc::EBUSY) {
            return Err(format!(
                "cannot unmount '{}': pool or dataset is busy",
                path.display()
            ));
        }
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(format!("cannot unmount '{}': {e}", path.display()));
        }
        // EINVAL: not mounted any more (someone ran umount); just reap.
    }
    let m = {
        let mut all = lock(d);
        let m = all.by_name.remove(name);
        note_conns(d, &all);
        m
    };
    if let Some(mut m) = m {
        if let Some(s) = m.session.take() {
            let held = d
                .pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&m.pool)
                .is_some_and(|p| p.suspended().is_some());
            if held {
                // A request may be held by failmode=wait until the pool
                // resumes or is exported: its session ends then, not now.
                let _ = std::thread::Builder::new()
                    .name("fuse-reaper".into())
                    .spawn(move || s.join());
            } else {
                s.join_or_abort(std::time::Duration::from_secs(5));
            }
        }
    }
    Ok(())
}

/// Unmount `names` deepest mountpoint first; stops at the first failure.
pub fn unmount_many(d: &Daemon, mut names: Vec<String>, force: bool) -> Result<(), String> {
    names.sort_by_key(|n| {
        std::cmp::Reverse(
            lock(d)
                .by_name
                .get(n)
                .map_or(0, |m| m.path.as_os_str().len()),
        )
    });
    for n in names {
        if lock(d).by_name.contains_key(&n) {
            unmount(d, &n, force)?;
        }
    }
    Ok(())
}

pub fn mounted_in_pool(d: &Daemon, pool: &str) -> Vec<String> {
    lock(d)
        .by_name
        .iter()
        .filter(|(_, m)| m.pool == pool)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Mounted datasets among `ds` and its descendants, deepest mount first.
pub fn mounted_under(d: &Daemon, pool: &Pool, ds: &Arc<Dataset>) -> Vec<String> {
    let mut names: Vec<String> = pool
        .dsl_pool()
        .descendants(ds)
        .iter()
        .chain(std::iter::once(ds))
        .map(|x| pool.dsl_pool().ds_name(&x.rel()))
        .collect();
    let g = lock(d);
    names.retain(|n| g.by_name.contains_key(n));
    names.sort_by_key(|n| {
        std::cmp::Reverse(g.by_name.get(n).map_or(0, |m| m.path.as_os_str().len()))
    });
    names
}

/// Mount `names` again (shallowest first, so each mount point's parent is
/// there): what an operation that unmounted them took down. The errors,
/// one per dataset that did not come back.
pub fn remount(d: &Daemon, pool: &Arc<Pool>, names: &[String]) -> Vec<String> {
    let mut errs = Vec::new();
    for n in names.iter().rev() {
        if lock(d).by_name.contains_key(n) {
            continue;
        }
        let r = pool
            .dsl_pool()
            .dataset(n)
            .map_err(|e| format!("cannot mount '{n}': {e}"))
            .and_then(|ds| mount(d, pool, &ds, None));
        if let Err(e) = r {
            errs.push(e);
        }
    }
    errs
}

pub fn unmount_pool(d: &Daemon, pool: &str, force: bool) -> Result<(), String> {
    unmount_many(d, mounted_in_pool(d, pool), force)
}

/// Properties changed: refresh the cached ones of mounted datasets.
pub fn refresh(d: &Daemon, pool: &str) {
    for m in lock(d).by_name.values().filter(|m| m.pool == pool) {
        m.ctx.refresh();
        m.fs.properties_changed();
    }
}

/// Snapshots were taken, destroyed, renamed or moved: every mount's
/// `.zfs/snapshot` as the kernel keeps it goes (the kernel is told
/// outside the table's lock).
pub fn snapshots_changed(d: &Daemon) {
    let served: Vec<Arc<FuseMount>> = lock(d).by_name.values().map(|m| m.fs.clone()).collect();
    for fs in served {
        fs.snapshots_changed();
    }
}

/// `acltype` changed in `pool`: a mounted dataset whose ACL handling
/// changes is mounted again, since only the INIT handshake can ask the
/// kernel to check ACLs or stop (and a remount drops the ACLs the kernel
/// caches with attributes); one that goes `off` stops storing and
/// answering them at once. A busy mount keeps its old handling in the
/// kernel until it is next mounted; the returned notes say which.
pub fn acl_changed(d: &Daemon, pool: &Arc<Pool>) -> Vec<String> {
    let mut notes = Vec::new();
    for ds in pool.dsl_pool().datasets() {
        let name = pool.dsl_pool().ds_name(&ds.rel());
        let want = pool
            .dsl_pool()
            .get_prop(&ds, "acltype")
            .map(|(v, _)| v == "posix")
            .unwrap_or(false);
        let have = match lock(d).by_name.get(&name) {
            Some(m) => m.fs.zpl().posix_acl(),
            None => continue,
        };
        if have == want {
            continue;
        }
        if !want {
            // Stored ACLs stop applying at once here; the kernel drops
            // the ones it caches (for as long as attributes) when the
            // mount is made again, below.
            if let Some(m) = lock(d).by_name.get(&name) {
                m.fs.zpl().set_posix_acl(false);
            }
        }
        // Whatever is mounted beneath comes down first, and back after.
        let Some(path) = is_mounted(d, &name) else {
            continue;
        };
        let down: Vec<String> = list(d)
            .into_iter()
            .filter(|(_, p)| p.starts_with(&path))
            .map(|(n, _)| n)
            .collect();
        if let Err(e) = unmount_many(d, down, false) {
            let v = if want { "posix" } else { "off" };
            notes.push(format!(
                "acltype={v} takes effect when '{name}' is next mounted ({e})"
            ));
        }
    }
    notes.extend(mount_all(d, pool));
    notes
}

/// Send what the kernel's page cache holds for dataset `name`'s mount (the
/// writeback cache keeps written pages there for a while) to the daemon:
/// `syncfs(2)` on the mount. A snapshot then holds every write that
/// returned before it was asked for, as on a kernel ZFS.
pub fn flush_kernel_cache(d: &Daemon, name: &str) -> Result<(), String> {
    let Some(path) = is_mounted(d, name) else {
        return Ok(());
    };
    let dir = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: `dir` is an open descriptor for the call's duration.
    let r = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) };
    if r != 0 {
        return Err(format!(
            "{}: syncfs: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

pub fn is_mounted(d: &Daemon, name: &str) -> Option<PathBuf> {
    lock(d).by_name.get(name).map(|m| m.path.clone())
}

/// The temporary `readonly` of a mounted dataset (`zfs mount -o ro|rw`).
pub fn temp_readonly(d: &Daemon, name: &str) -> Option<bool> {
    lock(d)
        .by_name
        .get(name)
        .and_then(|m| m.ctx.temp_readonly())
}

/// (dataset, mountpoint) of every mount.
pub fn list(d: &Daemon) -> Vec<(String, PathBuf)> {
    lock(d)
        .by_name
        .iter()
        .map(|(n, m)| (n.clone(), m.path.clone()))
        .collect()
}

/// What a FUSE mount whose daemon died answers: ENOTCONN ("transport
/// endpoint is not connected"), or ECONNABORTED where the connection was
/// aborted with requests in flight (a daemon killed in the middle of a
/// `zfs destroy` of a mounted child: the root then stayed unmounted after
/// the restart, 7 tries in 10).
fn is_dead_mount(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
    )
}

/// `zfs rollback` of mounted dataset `ds_name` to snapshot `snap`, keeping
/// the mount: its files become the snapshot's under the processes that
/// use them (`fuse/rollback.rs`). A filesystem mounted beneath on a
/// directory the rollback removes or replaces is unmounted around it
/// (busy: refused unless `force`) and mounted again; the notes say which
/// did not come back.
pub fn rollback_mounted(
    d: &Daemon,
    pool: &Arc<Pool>,
    ds_name: &str,
    snap: &str,
    force: bool,
) -> Result<Vec<String>, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("cannot rollback to '{snap}': {e}");
    let Some((path, fs, temp_ro)) = lock(d)
        .by_name
        .get(ds_name)
        .map(|m| (m.path.clone(), m.fs.clone(), m.ctx.temp_readonly()))
    else {
        return Err(cannot(&"not mounted"));
    };
    let (ds, s) = pool.dsl_pool().snapshot(snap).map_err(|e| cannot(&e))?;
    let snap_zpl = pool
        .dsl_pool()
        .mount_snapshot_of(&ds, &s)
        .map_err(|e| cannot(&e))?;
    let old = fs.zpl();
    let moved: Vec<String> = list(d)
        .into_iter()
        .filter(|(n, p)| n != ds_name && p != &path && p.starts_with(&path))
        .filter(|(_, p)| {
            let rel = p.strip_prefix(&path).unwrap_or(p);
            !same_path(&old, &snap_zpl, rel)
        })
        .map(|(n, _)| n)
        .collect();
    drop(old);
    if let Err(e) = unmount_many(d, moved.clone(), force) {
        let back = remount(d, pool, &moved);
        return Err(format!(
            "cannot rollback '{ds_name}': {e}{}",
            crate::zfs::lines(&back)
        ));
    }
    // The kernel's dirty pages are requests: they go before the hold. A
    // page that fails to land (a file a rollback made stale) is a change
    // the rollback discards anyway.
    if let Err(e) = flush_kernel_cache(d, ds_name) {
        log::warn!("{ds_name}: before rollback: {e}");
    }
    let r = (|| {
        let mut held = fs.suspend();
        let t = pool
            .sync()
            .and_then(|_| uzfs_core::zpl::diff::turnover(held.zpl(), &snap_zpl, s.phys().txg))
            .map_err(|e| cannot(&e))?;
        pool.dsl_pool().rollback(snap).map_err(|e| cannot(&e))?;
        // Rolled back: from here the old tree must not be served.
        let mounted = pool.dsl_pool().dataset(ds_name).and_then(|nds| {
            let ctx = DsCtx::new(pool.clone(), nds.clone());
            ctx.set_temp_readonly(temp_ro);
            let mut opens = held.zpl().opens();
            for g in &t.gone {
                opens.remove(g);
            }
            let zpl = Zpl::mount_open(nds.os.clone(), ctx.clone(), opens)?;
            Ok((nds, ctx, Arc::new(zpl)))
        });
        match mounted {
            Ok((nds, ctx, zpl)) => {
                let inv = held.swap(zpl, nds, t);
                drop(held);
                let (names, inodes) = inv.send();
                log::info!(
                    "{ds_name}: rolled back to {snap} under its mount ({names} names, {inodes} files invalidated)"
                );
                if let Some(m) = lock(d).by_name.get_mut(ds_name) {
                    m.ctx = ctx;
                }
                Ok(())
            }
            Err(e) => {
                drop(held);
                let _ = unmount(d, ds_name, true);
                Err(format!(
                    "rolled back to '{snap}', but cannot mount '{ds_name}' again: {e}"
                ))
            }
        }
    })();
    let back = remount(d, pool, &moved);
    r.map(|_| back)
}

/// Whether every directory on `rel` (below the root) is the same file in
/// `old` and `new`: then the kernel's cached walk to it stays valid and
/// a filesystem mounted there stays put.
fn same_path(old: &Zpl, new: &Zpl, rel: &Path) -> bool {
    let (mut a, mut b) = (old.root, new.root);
    for c in rel.components() {
        let name = c.as_os_str().as_bytes();
        match (old.lookup(a, name), new.lookup(b, name)) {
            (Ok(x), Ok(y)) if x.ino == y.ino && x.z.gen == y.z.gen => {
                a = x.ino;
                b = y.ino;
            }
            _ => return false,
        }
    }
    true
}
