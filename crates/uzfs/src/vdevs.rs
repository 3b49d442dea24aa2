//! Device maintenance commands, executed in the daemon: `zpool scrub`,
//! `offline`, `online`, `clear`, `attach`, `detach`, `replace`, `remove`,
//! `wait`, and `zinject` (fault injection, zinject(8)-like).

use crate::client::Response;
use crate::daemon::Daemon;
use crate::zpool::{err, get_pool, getopt, has, usage_err, values};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::SimRng;

fn pool_and_rest<'a>(
    d: &Daemon,
    rest: &'a [String],
    what: &str,
) -> Result<(Arc<Pool>, &'a [String]), Response> {
    let Some(name) = rest.first() else {
        return Err(usage_err(&format!(
            "missing pool name argument for '{what}'"
        )));
    };
    Ok((get_pool(d, name)?, &rest[1..]))
}

fn done(p: &Pool, full: &str) -> Response {
    p.log_history(full);
    Response::ok(String::new())
}

pub fn scrub(d: &Daemon, args: &[String], full: &str) -> Response {
    let (o, rest) = match getopt(args, "e!spw") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    if rest.is_empty() {
        return usage_err("missing pool name argument");
    }
    for name in &rest {
        let p = match get_pool(d, name) {
            Ok(p) => p,
            Err(r) => return r,
        };
        let r = if has(&o, 's') {
            p.scrub_cancel()
        } else if has(&o, 'p') {
            p.scrub_pause()
        } else {
            p.scrub()
        };
        if let Err(e) = r {
            return err(e.to_string());
        }
        if has(&o, 'w') {
            p.wait_scan();
        }
        p.log_history(full);
    }
    Response::ok(String::new())
}

pub fn offline(d: &Daemon, args: &[String], full: &str) -> Response {
    each_device(d, args, full, "ft", "offline", |o, p, dev| {
        p.offline_with(dev, has(o, 'f'), has(o, 't'))
    })
}

/// `zpool online [-e] POOL DEV...`: `-e` also expands the device's vdev to
/// what its devices hold now (`spa/expand.rs`).
pub fn online(d: &Daemon, args: &[String], full: &str) -> Response {
    each_device(d, args, full, "e", "online", |o, p, dev| {
        if has(o, 'e') {
            p.online_expand(dev).map(|_| ())
        } else {
            p.online(dev).map(|_| p.autoexpand())
        }
    })
}

/// `zpool VERB [-opts] POOL DEV...`: apply `op` to each device in turn.
fn each_device(
    d: &Daemon,
    args: &[String],
    full: &str,
    opts: &str,
    verb: &str,
    op: impl Fn(&crate::zpool::Opts, &Arc<Pool>, &str) -> uzfs_core::Result<()>,
) -> Response {
    let (o, rest) = match getopt(args, opts) {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let (p, devs) = match pool_and_rest(d, &rest, verb) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if devs.is_empty() {
        return usage_err("missing device name");
    }
    for dev in devs {
        if let Err(e) = op(&o, &p, dev) {
            return err(e.to_string());
        }
    }
    done(&p, full)
}

pub fn clear(d: &Daemon, args: &[String], full: &str) -> Response {
    let (p, devs) = match pool_and_rest(d, args, "clear") {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(e) = p.clear(devs.first().map(String::as_str)) {
        return err(format!("cannot clear errors for {}: {e}", p.name));
    }
    done(&p, full)
}

pub fn attach_or_replace(
    d: &Daemon,
    args: &[String],
    cwd: &Path,
    full: &str,
    replace: bool,
) -> Response {
    let (o, rest) = match getopt(args, "fwso:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let (p, devs) = match pool_and_rest(d, &rest, if replace { "replace" } else { "attach" }) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (old, new) = match (devs.first(), devs.get(1)) {
        (Some(o), Some(n)) => (o, n.clone()),
        // `zpool replace POOL DEV`: the same device, after a disk swap.
        (Some(o), None) if replace => (o, o.clone()),
        _ => return usage_err("missing <device> [new-device]"),
    };
    // -o ashift=N: the new device's sector size. Its leaves share the
    // vdev's ashift, so one no larger than the vdev's is what it gets.
    for kv in values(&o, 'o') {
        let top = p
            .find_leaf(old)
            .and_then(|pos| p.io.top(pos.top as u32).ok());
        match (kv.split_once('='), top) {
            (Some(("ashift", v)), Some(t)) => match v.parse::<u8>() {
                Ok(a) if (9..=16).contains(&a) && a <= t.ashift => {}
                Ok(a) if (9..=16).contains(&a) => {
                    return err(format!(
                        "cannot use ashift={a}: the vdev of {old} has ashift {}, and a device joining it cannot have larger sectors",
                        t.ashift
                    ))
                }
                _ => return err(format!("invalid ashift '{v}': 9 to 16")),
            },
            (Some(("ashift", _)), None) => {
                return err(format!("no such device in pool: '{old}'"))
            }
            _ => {
                return err(format!(
                    "property '{kv}' cannot be set with {}: only ashift",
                    if replace { "replace" } else { "attach" }
                ))
            }
        }
    }
    // The very device the pool holds (a disk swapped in place), or one
    // this pool already uses (refused below with the pool's own message),
    // is opened without the exclusive hold; any other is claimed.
    let opened = crate::zpool::open_dev_unclaimed(cwd, &new).and_then(|(path, dev)| {
        let ours = uzfs_core::spa::probe_label(&*dev).is_some_and(|l| l.pool.pool_guid == p.guid);
        if &new != old && !ours {
            crate::zpool::claim_dev(&new, &*dev)?;
        }
        Ok((path, dev))
    });
    let (new_path, dev) = match opened {
        Ok(x) => x,
        Err(e) => return err(e),
    };
    let r = if replace {
        p.replace(old, &new_path, dev, has(&o, 'f'))
    } else {
        p.attach(old, &new_path, dev, has(&o, 'f'))
    };
    if let Err(e) = r {
        return err(format!(
            "cannot {} {new} {} {old}: {e}",
            if replace { "replace" } else { "attach" },
            if replace { "with" } else { "to" }
        ));
    }
    if has(&o, 'w') {
        p.wait_scan();
    }
    d.refresh_cache();
    done(&p, full)
}

pub fn detach(d: &Daemon, args: &[String], full: &str) -> Response {
    let (p, devs) = match pool_and_rest(d, args, "detach") {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(dev) = devs.first() else {
        return usage_err("missing <device>");
    };
    if let Err(e) = p.detach(dev) {
        return err(e.to_string());
    }
    d.refresh_cache();
    done(&p, full)
}

pub fn remove(d: &Daemon, args: &[String], full: &str) -> Response {
    let (p, devs) = match pool_and_rest(d, args, "remove") {
        Ok(x) => x,
        Err(r) => return r,
    };
    for dev in devs {
        let is_spare =
            p.io.spares()
                .iter()
                .any(|s| s.path == *dev || s.guid.to_string() == *dev);
        let r = if is_spare {
            p.remove_spare(dev)
        } else if p.find_cache(dev).is_some() {
            p.remove_cache(dev)
        } else {
            match p.remove_log(dev) {
                Err(e) if e.to_string().contains("no such log device") => Err(
                    uzfs_core::Error::invalid(format!(
                        "{e} (only hot spares, cache and log devices can be removed; removing data devices is not supported)"
                    )),
                ),
                r => r,
            }
        };
        if let Err(e) = r {
            return err(format!("cannot remove {dev}: {e}"));
        }
    }
    let _ = p.txg_wait_synced();
    d.refresh_cache();
    done(&p, full)
}

/// `zpool wait [-t scrub,resilver,replace] POOL`.
pub fn wait(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "Hp!t:T:!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let kinds: Vec<String> = values(&o, 't')
        .iter()
        .flat_map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
        .collect();
    for t in &kinds {
        if !matches!(t.as_str(), "scrub" | "resilver" | "replace" | "free") {
            return err(format!(
                "invalid activity '{t}': uzfs waits for scrub, resilver, replace, free"
            ));
        }
    }
    let want_free = kinds.is_empty() || kinds.iter().any(|k| k == "free");
    let want_scan = kinds.is_empty() || kinds.iter().any(|k| k != "free");
    let (p, more) = match pool_and_rest(d, &rest, "wait") {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Some(x) = more.first() {
        return Response::err(
            2,
            format!("zpool wait: an interval ('{x}': progress reports) is not supported yet"),
        );
    }
    if want_scan {
        p.wait_scan();
    }
    if want_free {
        if let Err(e) = p.dsl_pool().wait_freed() {
            return err(format!("cannot wait for '{}': {e}", p.name));
        }
    }
    Response::ok(String::new())
}

const ZINJECT_USAGE: &str = "usage: zinject
\tList injected faults.
zinject -d DEVICE -e io [-T read|write|all] POOL
\tMake the device fail reads, writes or both with EIO.
zinject -d DEVICE -e nxio POOL
\tMake the device vanish (every I/O fails with ENXIO; it turns REMOVED).
zinject -d DEVICE -D MILLISECONDS POOL
\tAdd latency to every I/O of the device.
zinject -d DEVICE -C COUNT POOL
\tSilently corrupt COUNT random allocated blocks' data on the device.
zinject -c DEVICE|all POOL
\tClear injections; a vanished device comes back and is resilvered.
zinject -a [POOL]
\tFlush the block cache (ARC) of POOL, or of every imported pool; with
\tanother form, before injecting. The next read of every block goes to
\tthe devices (a cold read, or a corruption noticed at once).
";

pub fn zinject(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "d:e:T:D:C:c:ha") {
        Ok(x) => x,
        Err(e) => return Response::err(2, format!("{e}\n{ZINJECT_USAGE}")),
    };
    if has(&o, 'h') {
        return Response::ok(ZINJECT_USAGE.into());
    }
    if has(&o, 'a') {
        let pools: Vec<_> = match rest.first() {
            Some(name) => match get_pool(d, name) {
                Ok(p) => vec![p],
                Err(r) => return r,
            },
            None => d
                .pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect(),
        };
        for p in &pools {
            p.io.cache.clear();
        }
        if o.iter().all(|(c, _)| *c == 'a') {
            return Response::ok(String::new());
        }
    }
    if o.is_empty() && rest.is_empty() {
        return zinject_list(d);
    }
    let Some(pname) = rest.first() else {
        return Response::err(2, format!("missing pool name\n{ZINJECT_USAGE}"));
    };
    let p = match get_pool(d, pname) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Some(c) = values(&o, 'c').first() {
        let leaves: Vec<_> = if c == "all" {
            p.io.tops().iter().flat_map(|t| t.leaves()).collect()
        } else {
            match p.find_leaf(c) {
                Some(pos) => vec![pos.leaf],
                None => return err(format!("no such device in pool: '{c}'")),
            }
        };
        for l in leaves {
            let vanished = l.inject.vanished.load(Ordering::Relaxed);
            l.inject.clear();
            if vanished || l.state() == uzfs_core::vdev::LeafState::Removed {
                if let Err(e) = p.online(&l.path) {
                    return err(format!("{}: {e}", l.path));
                }
            }
        }
        return Response::ok(String::new());
    }
    let Some(dev) = values(&o, 'd').first().cloned() else {
        return Response::err(2, format!("missing -d DEVICE\n{ZINJECT_USAGE}"));
    };
    let Some(pos) = p.find_leaf(&dev) else {
        return err(format!("no such device in pool: '{dev}'"));
    };
    let leaf = pos.leaf;
    if let Some(e) = values(&o, 'e').first() {
        match e.as_str() {
            "io" => {
                let t = values(&o, 'T')
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "all".into());
                let (r, w) = match t.as_str() {
                    "read" => (true, false),
                    "write" => (false, true),
                    "all" => (true, true),
                    _ => return err(format!("invalid -T '{t}': read, write or all")),
                };
                leaf.inject.read_errors.store(r, Ordering::Relaxed);
                leaf.inject.write_errors.store(w, Ordering::Relaxed);
            }
            "nxio" => leaf.inject.vanished.store(true, Ordering::Relaxed),
            other => return err(format!("invalid error type '{other}': io or nxio")),
        }
        return Response::ok(format!("Added handler to {dev}\n"));
    }
    if let Some(ms) = values(&o, 'D').first() {
        let Ok(ms) = ms.trim_end_matches("ms").parse::<u64>() else {
            return err(format!("invalid latency '{ms}': milliseconds expected"));
        };
        leaf.inject.delay_us.store(ms * 1000, Ordering::Relaxed);
        return Response::ok(format!("Added {ms} ms of latency to {dev}\n"));
    }
    if let Some(n) = values(&o, 'C').first() {
        let Ok(n) = n.parse::<usize>() else {
            return err(format!("invalid count '{n}'"));
        };
        return match corrupt_blocks(&p, &leaf, pos.top, pos.column, n) {
            Ok(k) => Response::ok(format!("Corrupted {k} blocks on {dev}\n")),
            Err(e) => err(e),
        };
    }
    Response::err(2, ZINJECT_USAGE.to_string())
}

fn zinject_list(d: &Daemon) -> Response {
    let mut out = String::new();
    for (name, p) in d.pools.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        for l in p.io.tops().iter().flat_map(|t| t.leaves()) {
            let i = &l.inject;
            let mut what = Vec::new();
            if i.read_errors.load(Ordering::Relaxed) {
                what.push("read EIO".to_string());
            }
            if i.write_errors.load(Ordering::Relaxed) {
                what.push("write EIO".to_string());
            }
            if i.vanished.load(Ordering::Relaxed) {
                what.push("ENXIO (vanished)".to_string());
            }
            let us = i.delay_us.load(Ordering::Relaxed);
            if us > 0 {
                what.push(format!("{} ms latency", us / 1000));
            }
            if !what.is_empty() {
                out.push_str(&format!("{name}  {}  {}\n", l.path, what.join(", ")));
            }
        }
    }
    if out.is_empty() {
        out = "No handlers registered.\n".into();
    }
    Response::ok(out)
}

/// Overwrite the part of `count` random L0 blocks of the root dataset that
/// lives on `leaf` with random bytes, bypassing the pool (silent damage).
fn corrupt_blocks(
    p: &Pool,
    leaf: &Arc<uzfs_core::vdev::Leaf>,
    top: usize,
    column: usize,
    count: usize,
) -> Result<usize, String> {
    let t = p.io.top(top as u32).map_err(|e| e.to_string())?;
    let mut rng = SimRng::new(uzfs_core::spa::scan::now_secs() ^ leaf.guid);
    let blocks = p.root_data_blocks().map_err(|e| e.to_string())?;
    let mine: Vec<_> = blocks
        .into_iter()
        .filter_map(|bp| {
            let dva = bp
                .dva
                .iter()
                .find(|d| d.is_valid() && d.vdev as usize == top)?;
            let e = t
                .geometry()
                .extents(dva.offset, bp.psize as u64)
                .into_iter()
                .find(|e| e.child == column)?;
            Some((e.offset, e.size))
        })
        .collect();
    if mine.is_empty() {
        return Err("no data blocks on that device".into());
    }
    let mut done = 0;
    for _ in 0..count.min(mine.len()) {
        let (off, len) = mine[rng.below(mine.len() as u64) as usize];
        let mut junk = vec![0u8; len as usize];
        rng.fill(&mut junk);
        leaf.dev
            .write_at(&junk, uzfs_core::vdev::LABEL_START_SIZE + off)
            .map_err(|e| e.to_string())?;
        done += 1;
    }
    let _ = leaf.dev.flush();
    p.io.cache.clear();
    Ok(done)
}
