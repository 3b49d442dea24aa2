//! `zfs` subcommands: create, destroy, snapshot, list, get, set, inherit,
//! mount, unmount, rename (zfs(8); output layouts as OpenZFS prints them).

use crate::client::Response;
use crate::daemon::Daemon;
use crate::fmt::{nicenum, Table};
use crate::mounts;
use crate::zpool::{err, getopt, has, values, Opts};
use std::sync::Arc;
use uzfs_core::dsl::snapshot::Snapshot;
use uzfs_core::dsl::{props, Dataset};
use uzfs_core::spa::Pool;

const USAGE: &str = "usage: zfs command args ...
\tcreate [-p] [-o property=value] ... <filesystem>
\tdestroy [-fnpRrv] <filesystem>
\tdestroy [-dnpRrv] <filesystem>@<snap>[%<snap>][,...]
\tsnapshot [-r] <filesystem>@<snapname> ...
\trollback [-rRf] <snapshot>
\tclone [-p] [-o property=value] ... <snapshot> <filesystem>
\tpromote <clone-filesystem>
\tdiff [-FHt] <snapshot> [snapshot|filesystem]
\tlist [-rHp] [-j [--json-int]] [-d depth] [-o property[,...]] [-s|-S property] ...
\t    [-t type[,...]] [filesystem|snapshot] ...
\tget [-rHp] [-j [--json-int]] [-d depth] [-o field[,...]] [-t type[,...]]
\t    [-s source[,...]] <\"all\" | property[,...]> [filesystem|snapshot] ...
\tset [-u] <property=value> ... <filesystem> ...
\tinherit [-r] <property> <filesystem> ...
\tmount [-a] [filesystem]
\tunmount [-f] <-a | filesystem | mountpoint>
\trename <filesystem> <filesystem>
\trename [-r] <snapshot> <snapshot>
\thold [-r] <tag> <snapshot> ...
\tholds [-rHp] <snapshot> ...
\trelease [-r] <tag> <snapshot> ...
";

fn usage_err(msg: &str) -> Response {
    Response::err(2, format!("{msg}\n{USAGE}"))
}

fn pools(d: &Daemon) -> Vec<Arc<Pool>> {
    d.pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect()
}

/// The pool and dataset a name refers to.
fn lookup(d: &Daemon, name: &str) -> Result<(Arc<Pool>, Arc<Dataset>), Response> {
    let pool_name = name.split('/').next().unwrap_or("");
    let pool = pools(d).into_iter().find(|p| p.name == pool_name);
    let missing = || err(format!("cannot open '{name}': dataset does not exist"));
    let pool = pool.ok_or_else(missing)?;
    let ds = pool.dsl_pool().dataset(name).map_err(|_| missing())?;
    Ok((pool, ds))
}

/// zfs(8) subcommands uzfs does not do yet: refused as such, never taken
/// for typos.
const NOT_YET: &[&str] = &[
    "allow",
    "unallow",
    "share",
    "unshare",
    "userspace",
    "groupspace",
    "projectspace",
    "project",
    "load-key",
    "unload-key",
    "change-key",
    "program",
    "jail",
    "unjail",
    "zone",
    "unzone",
    "wait",
    "upgrade",
];

pub fn run(d: &Daemon, args: &[String]) -> Response {
    let Some(cmd) = args.first() else {
        return usage_err("missing command");
    };
    let rest = &args[1..];
    let r = dispatch(d, cmd, rest);
    // Whatever the answer: a command that failed part way may have
    // changed some snapshots.
    if CHANGES_SNAPSHOTS.contains(&cmd.as_str()) {
        crate::mounts::snapshots_changed(d);
    }
    r
}

/// The commands that may take, destroy, rename or move snapshots.
const CHANGES_SNAPSHOTS: &[&str] = &[
    "destroy", "rename", "snapshot", "snap", "rollback", "promote", "release",
];

fn dispatch(d: &Daemon, cmd: &str, rest: &[String]) -> Response {
    match cmd {
        "create" => create(d, rest),
        "destroy" => destroy(d, rest),
        "list" => list(d, rest),
        "get" => get(d, rest),
        "set" => match getopt(rest, "u") {
            Ok((o, r)) => set(d, &r, has(&o, 'u')),
            Err(e) => usage_err(&e),
        },
        "inherit" => inherit(d, rest),
        "mount" => mount(d, rest),
        "unmount" | "umount" => unmount(d, rest),
        "rename" => rename(d, rest),
        "snapshot" | "snap" => snapshot(d, rest),
        "rollback" => rollback(d, rest),
        "clone" => clone(d, rest),
        "hold" => hold_release(d, rest, true),
        "release" => hold_release(d, rest, false),
        "holds" => holds(d, rest),
        "promote" => promote(d, rest),
        "diff" => diff(d, rest),
        "send" | "receive" | "recv" | "bookmark" | "redact" => Response::err(
            2,
            format!("zfs {cmd}: not supported yet (snapshots are taken, listed, browsed, held, renamed, cloned, rolled back to and destroyed; the rest is not implemented yet)"),
        ),
        c if NOT_YET.contains(&c) => Response::err(2, format!("zfs {c}: not supported yet")),
        other => usage_err(&format!("unrecognized command '{other}'")),
    }
}

fn create(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "b:!nPpuvo:s!V:!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [name] = rest.as_slice() else {
        return usage_err("expected one filesystem name");
    };
    let mut props = Vec::new();
    for kv in values(&o, 'o') {
        let Some((k, v)) = kv.split_once('=') else {
            return usage_err(&format!("bad property '{kv}': expected property=value"));
        };
        props.push((k.to_string(), v.to_string()));
    }
    let pool_name = name.split('/').next().unwrap_or("");
    let Some(pool) = pools(d).into_iter().find(|p| p.name == pool_name) else {
        return err(format!(
            "cannot create '{name}': no such pool '{pool_name}'"
        ));
    };
    // What would be (or is) created: -v says it, -P in machine form; -n
    // only says it.
    let (plan, local) = match pool
        .dsl_pool()
        .plan_create_dataset(name, &props, has(&o, 'p'))
    {
        Ok(x) => x,
        Err(e) => return err(format!("cannot create '{name}': {e}")),
    };
    let mut out = String::new();
    if has(&o, 'v') || has(&o, 'P') {
        let will = if has(&o, 'n') {
            "would create"
        } else {
            "create"
        };
        for rel in &plan {
            let full = pool.dsl_pool().ds_name(rel);
            out.push_str(&if has(&o, 'P') {
                format!("create\t{full}\n")
            } else {
                format!("{will} '{full}'\n")
            });
        }
        for (k, v) in &local {
            out.push_str(&if has(&o, 'P') {
                format!("property\t{k}\t{v}\n")
            } else {
                format!("\t{k}={v}\n")
            });
        }
    }
    if has(&o, 'n') {
        return Response::ok(out);
    }
    if let Err(e) = pool.dsl_pool().create_dataset(name, &props, has(&o, 'p')) {
        return err(format!("cannot create '{name}': {e}"));
    }
    pool.log_history(&format!("zfs create {}", args.join(" ")));
    // A reservation on the new one binds the others' writes.
    mounts::refresh(d, &pool.name);
    if let Err(e) = pool.txg_wait_synced() {
        return err(format!("cannot create '{name}': {e}"));
    }
    // -u: created, not mounted.
    if has(&o, 'u') {
        return Response::ok(out);
    }
    let errs = mounts::mount_all(d, &pool);
    if !errs.is_empty() {
        return err(format!(
            "filesystem successfully created, but not mounted\n{}",
            errs.join("\n")
        ));
    }
    Response::ok(out)
}

fn destroy(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "drfRnvp") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [name] = rest.as_slice() else {
        return usage_err("expected one filesystem name");
    };
    if name.contains('@') {
        return destroy_snapshots(d, &o, name, args);
    }
    if has(&o, 'd') {
        return usage_err("-d applies to snapshots only");
    }
    let (pool, ds) = match lookup(d, name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let recursive = has(&o, 'r') || has(&o, 'R');
    let kids = pool.dsl_pool().descendants(&ds);
    // Snapshots count as children (OpenZFS's message lists them too).
    let snaps = pool.dsl_pool().snapshot_names_under(&ds);
    if (!kids.is_empty() || !snaps.is_empty()) && !recursive {
        let what = if kids.is_empty() {
            "has snapshots"
        } else {
            "has children"
        };
        let mut m = format!(
            "cannot destroy '{name}': filesystem {what}\nuse '-r' to destroy the following datasets:\n"
        );
        for k in kids.iter().rev() {
            m.push_str(&pool.dsl_pool().ds_name(&k.rel()));
            m.push('\n');
        }
        for sn in &snaps {
            m.push_str(sn);
            m.push('\n');
        }
        return err(m);
    }
    let mut names: Vec<String> = kids
        .iter()
        .map(|k| pool.dsl_pool().ds_name(&k.rel()))
        .collect();
    names.push(name.clone());
    // What goes (children first, the order they are destroyed in) and what
    // it frees: OpenZFS's `-v` lines, `-p` their machine form. `-n` only
    // says it ("would"), changing nothing.
    let out = if has(&o, 'v') || has(&o, 'p') {
        destroy_report(
            &o,
            snaps.iter().chain(&names),
            pool.dsl_pool().ds_space(&ds).1,
        )
    } else {
        String::new()
    };
    if has(&o, 'n') {
        return Response::ok(out);
    }
    if let Err(e) = mounts::unmount_many(d, names, has(&o, 'f')) {
        return err(e);
    }
    if has(&o, 'R') {
        for sn in &snaps {
            if let Err(e) = destroy_clones(d, &pool, sn, has(&o, 'f')) {
                return err(e);
            }
        }
    }
    match pool.dsl_pool().destroy_dataset(name, recursive) {
        Ok(_) => {
            pool.log_history(&format!("zfs destroy {}", args.join(" ")));
            match pool.txg_wait_synced() {
                Ok(_) => Response::ok(out),
                Err(e) => err(format!("cannot destroy '{name}': {e}")),
            }
        }
        Err(e) => err(format!("cannot destroy '{name}': {e}")),
    }
}

/// `zfs destroy -v`'s lines (`-p`: their machine form; `-n`: "would"):
/// each name destroyed, then the bytes reclaimed.
fn destroy_report<'a>(o: &Opts, names: impl Iterator<Item = &'a String>, reclaim: u64) -> String {
    let will = if has(o, 'n') { "would" } else { "will" };
    let mut out = String::new();
    for n in names {
        out.push_str(&if has(o, 'p') {
            format!("destroy\t{n}\n")
        } else {
            format!("{will} destroy {n}\n")
        });
    }
    out.push_str(&if has(o, 'p') {
        format!("reclaim\t{reclaim}\n")
    } else {
        format!("{will} reclaim {}\n", nicenum(reclaim))
    });
    out
}

/// `zfs destroy [-rRdnvp] DS@SNAP`: that snapshot (with `-r`/`-R`, the
/// snapshot of that name of every descendant too). `-d` destroys at once:
/// without holds or clones nothing defers it.
fn destroy_snapshots(d: &Daemon, o: &Opts, name: &str, args: &[String]) -> Response {
    let Some((ds_name, snap)) = name.split_once('@') else {
        return usage_err("expected a snapshot name");
    };
    let (pool, ds) = match lookup(d, ds_name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // The spec must name something in the dataset itself; with -r, each
    // descendant contributes what the spec names there.
    let mine = match resolve_snaps(&pool, &ds, snap) {
        Ok(v) if !v.is_empty() => v,
        Ok(_) | Err(_) => {
            return err("could not find any snapshots to destroy; check snapshot names.")
        }
    };
    // (dataset, its short names), the named dataset first.
    let mut sets = vec![(ds.clone(), mine)];
    if has(o, 'r') || has(o, 'R') {
        for k in pool.dsl_pool().descendants(&ds).iter().rev() {
            if let Ok(v) = resolve_snaps(&pool, k, snap) {
                if !v.is_empty() {
                    sets.push((k.clone(), v));
                }
            }
        }
    }
    let mut found = Vec::new();
    for (x, names) in &sets {
        let base = pool.dsl_pool().ds_name(&x.rel());
        for n in names {
            if let Ok((_, s)) = pool.dsl_pool().snapshot(&format!("{base}@{n}")) {
                found.push((format!("{base}@{n}"), s));
            }
        }
    }
    let out = if has(o, 'v') || has(o, 'p') {
        let reclaim: u64 = sets
            .iter()
            .map(|(x, names)| {
                let set: std::collections::BTreeSet<String> = names.iter().cloned().collect();
                pool.dsl_pool()
                    .snapshots_wouldfree(x.id(), &set)
                    .unwrap_or(0)
            })
            .sum();
        let deps: Vec<String> = if has(o, 'R') {
            found
                .iter()
                .flat_map(|(_, s)| dependents(&pool, s.phys().id))
                .collect()
        } else {
            Vec::new()
        };
        // Each dependent's space (a child's is in its parent's).
        let deps_space: u64 = deps
            .iter()
            .filter(|n| !deps.iter().any(|p| n.starts_with(&format!("{p}/"))))
            .filter_map(|n| pool.dsl_pool().dataset(n).ok())
            .map(|x| pool.dsl_pool().ds_space(&x).1)
            .sum();
        destroy_report(
            o,
            deps.iter().chain(found.iter().map(|(n, _)| n)),
            reclaim + deps_space,
        )
    } else {
        String::new()
    };
    if has(o, 'n') {
        return Response::ok(out);
    }
    for (n, _) in &found {
        if has(o, 'R') {
            if let Err(e) = destroy_clones(d, &pool, n, has(o, 'f')) {
                return err(e);
            }
        }
        let r = if has(o, 'd') {
            pool.dsl_pool().destroy_snapshot_deferred(n).map(|_| ())
        } else {
            pool.dsl_pool().destroy_snapshot(n)
        };
        if let Err(e) = r {
            return err(match e {
                uzfs_core::Error::Busy(m) => m,
                e => format!("cannot destroy snapshot {n}: {e}"),
            });
        }
    }
    pool.log_history(&format!("zfs destroy {}", args.join(" ")));
    Response::ok(out)
}

/// `zfs rollback [-rRf] DS@SNAP`: the dataset becomes its snapshot again
/// and loses every change since. SNAP must be the latest snapshot unless
/// `-r` destroys the later ones first (`-R` also destroys their clones,
/// `-f` unmounting them if busy). A mounted filesystem stays mounted: its
/// files become the snapshot's under the processes using them
/// (`fuse/rollback.rs`).
fn rollback(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "rRf") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [name] = rest.as_slice() else {
        return usage_err("expected one snapshot name");
    };
    let Some((ds_name, _)) = name.split_once('@') else {
        return usage_err(&format!("'{name}' is not a snapshot"));
    };
    let (pool, ds) = match lookup(d, ds_name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Ok((_, s)) = pool.dsl_pool().snapshot(name) else {
        return err(format!("cannot open '{name}': dataset does not exist"));
    };
    let txg = s.phys().txg;
    let later: Vec<String> = pool
        .dsl_pool()
        .snapshots_of(ds.id())
        .iter()
        .map(|x| x.phys())
        .filter(|p| p.txg > txg)
        .map(|p| format!("{ds_name}@{}", p.name))
        .collect();
    let clones: Vec<String> = pool
        .dsl_pool()
        .snapshots_of(ds.id())
        .iter()
        .filter(|x| x.phys().txg > txg)
        .flat_map(|x| dependents(&pool, x.phys().id))
        .collect();
    if !clones.is_empty() && !has(&o, 'R') {
        return err(format!(
            "cannot rollback to '{name}': clones of previous snapshots exist\n\
             use '-R' to force deletion of the following clones and dependents:\n{}",
            clones.join("\n")
        ));
    }
    if !later.is_empty() && !has(&o, 'r') && !has(&o, 'R') {
        return err(format!(
            "cannot rollback to '{name}': more recent snapshots or bookmarks exist\n\
             use '-r' to force deletion of the following snapshots and bookmarks:\n{}",
            later.join("\n")
        ));
    }
    for l in &later {
        if let Err(e) = destroy_clones(d, &pool, l, has(&o, 'f')) {
            return err(format!("cannot rollback to '{name}': {e}"));
        }
        if let Err(e) = pool.dsl_pool().destroy_snapshot(l) {
            return err(format!("cannot rollback to '{name}': {e}"));
        }
    }
    let r = if mounts::is_mounted(d, ds_name).is_some() {
        mounts::rollback_mounted(d, &pool, ds_name, name, has(&o, 'f'))
    } else {
        // Nothing of it is served; a mount beneath it sits elsewhere.
        pool.dsl_pool()
            .rollback(name)
            .map(|_| Vec::new())
            .map_err(|e| format!("cannot rollback to '{name}': {e}"))
    };
    match r {
        Ok(back) => {
            pool.log_history(&format!("zfs rollback {}", args.join(" ")));
            if back.is_empty() {
                Response::ok(String::new())
            } else {
                err(format!("rolled back to '{name}', but{}", lines(&back)))
            }
        }
        Err(e) => err(e),
    }
}

/// The snapshots of `ds` a destroy spec names (the part after '@'):
/// `a`, a range `a%b` (either end may be left out: from the first, to the
/// last; inclusive, in txg order), or a comma list of those. Short names,
/// oldest first; an end that is not there is an error.
fn resolve_snaps(pool: &Pool, ds: &Arc<Dataset>, spec: &str) -> Result<Vec<String>, String> {
    let chain: Vec<String> = pool
        .dsl_pool()
        .snapshots_of(ds.id())
        .iter()
        .map(|s| s.phys().name)
        .collect();
    let at = |n: &str| {
        chain
            .iter()
            .position(|x| x == n)
            .ok_or_else(|| format!("no snapshot '{n}'"))
    };
    let mut take = vec![false; chain.len()];
    for part in spec.split(',') {
        match part.split_once('%') {
            Some((a, b)) => {
                let from = if a.is_empty() { 0 } else { at(a)? };
                let to = if b.is_empty() {
                    chain.len().saturating_sub(1)
                } else {
                    at(b)?
                };
                for t in take.iter_mut().take(to + 1).skip(from) {
                    *t = true;
                }
            }
            None => take[at(part)?] = true,
        }
    }
    Ok(chain
        .into_iter()
        .zip(take)
        .filter(|(_, t)| *t)
        .map(|(n, _)| n)
        .collect())
}

/// What depends on snapshot `id`: its clones, and recursively whatever
/// depends on their snapshots (and their descendants'), deepest first.
fn dependents(pool: &Pool, id: u64) -> Vec<String> {
    let mut out = Vec::new();
    for c in pool.dsl_pool().clones_of(id) {
        for x in pool
            .dsl_pool()
            .descendants(&c)
            .iter()
            .chain(std::iter::once(&c))
        {
            for s in pool.dsl_pool().snapshots_of(x.id()) {
                out.extend(dependents(pool, s.phys().id));
            }
        }
        for x in pool.dsl_pool().descendants(&c) {
            out.push(pool.dsl_pool().ds_name(&x.rel()));
        }
        out.push(pool.dsl_pool().ds_name(&c.rel()));
    }
    out
}

/// `-R`: destroy the clones of snapshot `snap` (full name) and whatever
/// depends on them, unmounted first (`force`: even if busy).
fn destroy_clones(d: &Daemon, pool: &Arc<Pool>, snap: &str, force: bool) -> Result<(), String> {
    let Ok((_, s)) = pool.dsl_pool().snapshot(snap) else {
        return Ok(());
    };
    // Deepest first; a name can come twice (a clone that is also a
    // descendant of another): the second finds it gone.
    for name in dependents(pool, s.phys().id) {
        let Ok(x) = pool.dsl_pool().dataset(&name) else {
            continue;
        };
        mounts::unmount_many(d, mounts::mounted_under(d, pool, &x), force)?;
        pool.dsl_pool()
            .destroy_dataset(&name, true)
            .map_err(|e| format!("cannot destroy '{name}': {e}"))?;
    }
    Ok(())
}

/// `zfs clone [-p] [-o prop=value]... SNAP FILESYSTEM`: a new filesystem
/// sharing every block with the snapshot (writes to either are their
/// own), mounted like one made by `zfs create`.
fn clone(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "po:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [snap, name] = rest.as_slice() else {
        return usage_err("expected a snapshot and a filesystem name");
    };
    if !snap.contains('@') {
        return usage_err(&format!("'{snap}' is not a snapshot"));
    }
    let mut props = Vec::new();
    for kv in values(&o, 'o') {
        let Some((k, v)) = kv.split_once('=') else {
            return usage_err(&format!("bad property '{kv}': expected property=value"));
        };
        props.push((k.to_string(), v.to_string()));
    }
    let ds_name = snap.split('@').next().unwrap_or("");
    let pool = match lookup(d, ds_name) {
        Ok((p, _)) => p,
        Err(r) => return r,
    };
    if pool.dsl_pool().snapshot(snap).is_err() {
        return err(format!("cannot open '{snap}': dataset does not exist"));
    }
    if let Err(e) = pool
        .dsl_pool()
        .clone_snapshot(snap, name, &props, has(&o, 'p'))
    {
        return err(format!("cannot create '{name}': {e}"));
    }
    pool.log_history(&format!("zfs clone {}", args.join(" ")));
    let errs = mounts::mount_all(d, &pool);
    if !errs.is_empty() {
        return err(format!(
            "filesystem successfully created, but not mounted\n{}",
            errs.join("\n")
        ));
    }
    Response::ok(String::new())
}

/// Further error lines, each on its own line.
pub(crate) fn lines(v: &[String]) -> String {
    v.iter().map(|l| format!("\n{l}")).collect()
}

/// `zfs snapshot [-r] DS@SNAP...`: every snapshot named (with `-r`, of
/// every descendant too) in one txg of their pool, or none.
fn snapshot(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "ro:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    // -o: user properties only (a snapshot's native ones are fixed).
    let mut set = Vec::new();
    for kv in values(&o, 'o') {
        let Some((k, v)) = kv.split_once('=') else {
            return usage_err(&format!("bad property '{kv}': expected property=value"));
        };
        if let Err(e) = props::snapshot_prop(k, Some(v)) {
            return err(format!("cannot create snapshot: {e}"));
        }
        set.push((k.to_string(), v.to_string()));
    }
    if rest.is_empty() {
        return usage_err("missing snapshot argument");
    }
    let mut pool: Option<Arc<Pool>> = None;
    let mut names = Vec::new();
    for n in &rest {
        let Some((ds_name, snap)) = n.split_once('@') else {
            return err(format!(
                "cannot create snapshot '{n}': missing '@' delimiter in snapshot name"
            ));
        };
        let (p, ds) = match lookup(d, ds_name) {
            Ok(x) => x,
            Err(_) => {
                return err(format!(
                    "cannot open '{ds_name}': dataset does not exist\nusage:\n\tsnapshot [-r] <filesystem|volume>@<snap> ..."
                ))
            }
        };
        if pool.as_ref().is_some_and(|q| q.name != p.name) {
            return err(format!(
                "cannot create snapshots: '{n}' is in another pool (one command snapshots one pool at a time)"
            ));
        }
        names.push(n.clone());
        if has(&o, 'r') {
            let mut kids = p.dsl_pool().descendants(&ds);
            kids.sort_by_key(|k| k.rel());
            names.extend(
                kids.iter()
                    .map(|k| format!("{}@{snap}", p.dsl_pool().ds_name(&k.rel()))),
            );
        }
        pool = Some(p);
    }
    let Some(pool) = pool else {
        return usage_err("missing snapshot argument");
    };
    for n in &names {
        let ds = n.split_once('@').map_or(n.as_str(), |x| x.0);
        if let Err(e) = mounts::flush_kernel_cache(d, ds) {
            return err(format!("cannot create snapshot '{n}': {e}"));
        }
    }
    // The user properties are born with the snapshots, in their txg.
    match pool.dsl_pool().create_snapshots_with(&names, &set) {
        Ok(()) => {
            pool.log_history(&format!("zfs snapshot {}", args.join(" ")));
            Response::ok(String::new())
        }
        Err(e) => err(format!("cannot create snapshots: {e}")),
    }
}

type Target = (Arc<Pool>, Arc<Dataset>);

/// How many levels below the pool's root a dataset is.
fn level(ds: &Dataset) -> usize {
    let r = ds.rel();
    if r.is_empty() {
        0
    } else {
        r.split('/').count()
    }
}

/// Datasets named by `names` (with their descendants if `recursive`, at
/// most `depth` levels below each name if given: `-d`), or all datasets
/// of all pools (within `depth` levels of the pools' roots).
fn targets(
    d: &Daemon,
    names: &[String],
    recursive: bool,
    depth: Option<usize>,
) -> Result<Vec<Target>, Response> {
    let mut out = Vec::new();
    if names.is_empty() {
        for p in pools(d) {
            for ds in p.dsl_pool().datasets() {
                if depth.is_none_or(|max| level(&ds) <= max) {
                    out.push((p.clone(), ds));
                }
            }
        }
        return Ok(out);
    }
    for n in names {
        let (p, ds) = lookup(d, n.trim_end_matches('/'))?;
        out.push((p.clone(), ds.clone()));
        if recursive || depth.is_some() {
            let base = level(&ds);
            let mut kids: Vec<_> = p
                .dsl_pool()
                .descendants(&ds)
                .into_iter()
                .filter(|k| depth.is_none_or(|max| level(k) - base <= max))
                .collect();
            kids.sort_by_key(|k| k.rel());
            out.extend(kids.into_iter().map(|k| (p.clone(), k)));
        }
    }
    Ok(out)
}

/// `-d depth`, checked.
fn depth_opt(o: &Opts) -> Result<Option<usize>, Response> {
    match values(o, 'd').last() {
        None => Ok(None),
        Some(v) => v
            .parse::<usize>()
            .map(Some)
            .map_err(|_| usage_err(&format!("invalid depth '{v}'"))),
    }
}

/// A property's display value (`-p`: exact numbers).
fn show(d: &Daemon, pool: &Pool, ds: &Arc<Dataset>, prop: &str, exact: bool) -> (String, String) {
    if prop == "mounted" {
        let m = mounts::is_mounted(d, &pool.dsl_pool().ds_name(&ds.rel())).is_some();
        return (if m { "yes" } else { "no" }.into(), "-".into());
    }
    if prop == "readonly" {
        // A mount's temporary value (`zfs mount -o ro|rw`) shows as such.
        if let Some(t) = mounts::temp_readonly(d, &pool.dsl_pool().ds_name(&ds.rel())) {
            return (if t { "on" } else { "off" }.into(), "temporary".into());
        }
    }
    let (v, src) = match pool.dsl_pool().get_prop(ds, prop) {
        Ok(x) => x,
        Err(_) => return ("-".into(), "-".into()),
    };
    let numeric = matches!(
        prop,
        "used"
            | "available"
            | "referenced"
            | "logicalused"
            | "logicalreferenced"
            | "usedbychildren"
            | "usedbydataset"
            | "usedbysnapshots"
            | "quota"
            | "refquota"
            | "reservation"
            | "refreservation"
            | "usedbyrefreservation"
            | "written"
    ) || prop.starts_with("written@");
    let shown = if prop == "mountpoint" {
        match mounts::mountpoint_of(d, pool, ds) {
            Ok(p) => p.display().to_string(),
            Err(_) => v,
        }
    } else if numeric && !exact {
        match v.parse::<u64>() {
            Ok(0)
                if matches!(
                    prop,
                    "quota" | "refquota" | "reservation" | "refreservation"
                ) =>
            {
                "none".into()
            }
            Ok(n) => nicenum(n),
            Err(_) => v,
        }
    } else if prop == "recordsize" && exact {
        props::parse_size(&v).map(|n| n.to_string()).unwrap_or(v)
    } else if prop == "creation" && !exact {
        v.parse::<u64>().map(crate::zpool::format_time).unwrap_or(v)
    } else {
        v
    };
    (shown, src.to_string())
}

const ALIASES: &[(&str, &str)] = &[
    ("avail", "available"),
    ("refer", "referenced"),
    ("compress", "compression"),
    ("recsize", "recordsize"),
    ("ratio", "compressratio"),
    ("lused", "logicalused"),
    ("lrefer", "logicalreferenced"),
    ("rdonly", "readonly"),
    ("reserv", "reservation"),
    ("refreserv", "refreservation"),
    ("usedsnap", "usedbysnapshots"),
    ("usedds", "usedbydataset"),
    ("usedchild", "usedbychildren"),
    ("usedrefreserv", "usedbyrefreservation"),
];

/// `zfs list -o space`.
const SPACE_COLS: &[&str] = &[
    "name",
    "available",
    "used",
    "usedbysnapshots",
    "usedbydataset",
    "usedbyrefreservation",
    "usedbychildren",
];

fn canon(p: &str) -> String {
    ALIASES
        .iter()
        .find(|(a, _)| *a == p)
        .map(|(_, c)| c.to_string())
        .unwrap_or_else(|| p.to_string())
}

fn known(p: &str) -> bool {
    props::def(p).is_some()
        || props::is_user_prop(p)
        || props::READONLY.contains(&p)
        || p.strip_prefix("written@").is_some_and(|s| !s.is_empty())
}

/// The refusal of a property `known` does not know: one zfsprops(7) has
/// and uzfs does not yet, or one that does not exist (usage errors both).
fn unknown_prop(p: &str, prefix: &str) -> Response {
    if props::NOT_YET.contains(&p) {
        return Response::err(2, format!("property '{p}' is not supported yet"));
    }
    usage_err(&format!("{prefix}invalid property '{p}'"))
}

/// `-j`/`--json [--json-int]` (zfs list, zfs get): the long forms become
/// `-j`; returns the arguments and whether `--json-int` was given.
fn json_args(args: &[String]) -> (Vec<String>, bool) {
    let mut int = false;
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        match a.as_str() {
            "--" => {
                out.extend(args[i..].iter().cloned());
                break;
            }
            "--json" => out.push("-j".into()),
            "--json-int" => int = true,
            _ => out.push(a.clone()),
        }
    }
    (out, int)
}

/// One dataset's entry in OpenZFS's JSON output (zfs list -j, zfs get
/// -j): name, type, pool and the properties with value and source (those
/// whose source `keep` takes: `zfs get -s`).
fn json_dataset(
    d: &Daemon,
    p: &Pool,
    ds: &Arc<Dataset>,
    props: &[String],
    exact: bool,
    int: bool,
    keep: &dyn Fn(&str) -> bool,
) -> serde_json::Value {
    let mut pm = serde_json::Map::new();
    for prop in props.iter().filter(|c| *c != "name") {
        let (v, src) = show(d, p, ds, prop, exact || int);
        if !keep(&src) {
            continue;
        }
        let (kind, data) = match src.as_str() {
            "-" => ("NONE", "-".to_string()),
            "default" => ("DEFAULT", "-".to_string()),
            "local" => ("LOCAL", "-".to_string()),
            "temporary" => ("TEMPORARY", "-".to_string()),
            s => match s.strip_prefix("inherited from ") {
                Some(from) => ("INHERITED", from.to_string()),
                None => ("NONE", s.to_string()),
            },
        };
        let value = match v.parse::<u64>() {
            Ok(n) if int => serde_json::json!(n),
            _ => serde_json::json!(v),
        };
        pm.insert(
            prop.clone(),
            serde_json::json!({ "value": value, "source": { "type": kind, "data": data } }),
        );
    }
    serde_json::json!({
        "name": p.dsl_pool().ds_name(&ds.rel()),
        "type": "FILESYSTEM",
        "pool": p.name,
        "properties": pm,
    })
}

/// The JSON document around the datasets' entries.
fn json_doc(command: &str, datasets: serde_json::Map<String, serde_json::Value>) -> Response {
    let doc = serde_json::json!({
        "output_version": { "command": command, "vers_major": 0, "vers_minor": 1 },
        "datasets": datasets,
    });
    Response::ok(format!("{doc}\n"))
}

/// Properties only snapshots have a value for (datasets show "-").
const SNAP_PROPS: &[&str] = &["createtxg", "guid", "clones", "userrefs", "defer_destroy"];

/// A snapshot's property as `zfs list` shows it (`-p`: exact numbers).
fn show_snap(p: &Pool, name: &str, s: &Snapshot, prop: &str, exact: bool) -> String {
    let sp = s.phys();
    let num = |n: u64| if exact { n.to_string() } else { nicenum(n) };
    match prop {
        "name" => name.to_string(),
        "type" => "snapshot".into(),
        "used" => p
            .dsl_pool()
            .snapshot_unique(s)
            .map_or_else(|_| "-".into(), num),
        "referenced" => num(sp.referenced),
        "logicalreferenced" => num(sp.logical),
        "creation" if exact => sp.creation.to_string(),
        "creation" => crate::zpool::format_time(sp.creation),
        "createtxg" => sp.txg.to_string(),
        "guid" => sp.guid.to_string(),
        "userrefs" => sp.holds.len().to_string(),
        "written" => p
            .dsl_pool()
            .snapshot_written(s)
            .map_or_else(|_| "-".into(), num),
        "defer_destroy" => if sp.defer_destroy { "on" } else { "off" }.into(),
        "clones" => p
            .dsl_pool()
            .clones_of(sp.id)
            .iter()
            .map(|c| p.dsl_pool().ds_name(&c.rel()))
            .collect::<Vec<_>>()
            .join(","),
        "compressratio" => uzfs_core::dsl::compressratio(sp.logical, sp.referenced),
        _ => "-".into(),
    }
}

/// The types `-t` asks for (`all_by_default`: `zfs get`'s default, every
/// type; `zfs list`'s is filesystems).
struct Types {
    fs: bool,
    snap: bool,
    typed: bool,
}

impl Types {
    fn of(o: &Opts, all_by_default: bool) -> Result<Types, Response> {
        let typed = !values(o, 't').is_empty();
        let mut t = Types {
            fs: true,
            snap: all_by_default,
            typed,
        };
        if let Some(v) = values(o, 't').last() {
            (t.fs, t.snap) = (false, false);
            for x in v.split(',') {
                match x {
                    "filesystem" | "fs" => t.fs = true,
                    "snapshot" | "snap" => t.snap = true,
                    "all" => (t.fs, t.snap) = (true, true),
                    "volume" | "vol" | "bookmark" => {}
                    _ => return Err(usage_err(&format!("invalid type '{x}'"))),
                }
            }
        }
        Ok(t)
    }
}

/// The rows `zfs list` and `zfs get` show for `names`: each snapshot
/// named, and each filesystem named (all with none; `-r`/`-d` their
/// descendants) if filesystems are wanted, followed by its snapshots if
/// `snaps_of` its pool says so.
fn gather(
    d: &Daemon,
    names: &[String],
    types: &Types,
    recursive: bool,
    depth: Option<usize>,
    snaps_of: &dyn Fn(&Pool) -> bool,
) -> Result<Vec<Item>, Response> {
    let (snap_names, fs_names): (Vec<String>, Vec<String>) =
        names.iter().cloned().partition(|n| n.contains('@'));
    let mut items: Vec<Item> = Vec::new();
    for n in &snap_names {
        let pool_name = n.split(['/', '@']).next().unwrap_or("");
        let found = pools(d)
            .into_iter()
            .find(|p| p.name == pool_name)
            .and_then(|p| p.dsl_pool().snapshot(n).ok().map(|(ds, s)| (p, ds, s)));
        match found {
            Some((p, ds, s)) => items.push((p, ds, Some((n.clone(), s)))),
            None => return Err(err(format!("cannot open '{n}': dataset does not exist"))),
        }
    }
    if !fs_names.is_empty() || snap_names.is_empty() {
        let ts = targets(d, &fs_names, recursive, depth)?;
        // A filesystem named alone (no -r/-d) brings no snapshots to
        // `zfs get`; `zfs list` decides through `snaps_of`.
        for (p, ds) in ts {
            if types.fs {
                items.push((p.clone(), ds.clone(), None));
            }
            if snaps_of(&p) {
                let base = p.dsl_pool().ds_name(&ds.rel());
                for s in p.dsl_pool().snapshots_of(ds.id()) {
                    let n = format!("{base}@{}", s.phys().name);
                    items.push((p.clone(), ds.clone(), Some((n, s))));
                }
            }
        }
    }
    Ok(items)
}

/// A snapshot's entry in `zfs list -j` and `zfs get -j`.
fn json_snapshot(
    d: &Daemon,
    it: &Item,
    props: &[String],
    exact: bool,
    int: bool,
) -> serde_json::Value {
    let (p, ds, _) = it;
    let name = show_item(d, it, "name", exact);
    let mut pm = serde_json::Map::new();
    for prop in props.iter().filter(|c| *c != "name") {
        let v = show_item(d, it, prop, exact || int);
        let value = match v.parse::<u64>() {
            Ok(x) if int => serde_json::json!(x),
            _ => serde_json::json!(v),
        };
        pm.insert(
            prop.clone(),
            serde_json::json!({ "value": value, "source": { "type": "NONE", "data": "-" } }),
        );
    }
    serde_json::json!({
        "name": name,
        "type": "SNAPSHOT",
        "pool": p.name,
        "dataset": p.dsl_pool().ds_name(&ds.rel()),
        "properties": pm,
    })
}

/// A row of `zfs list`: a dataset, or one of its snapshots.
type Item = (Arc<Pool>, Arc<Dataset>, Option<(String, Arc<Snapshot>)>);

fn show_item(d: &Daemon, (p, ds, snap): &Item, prop: &str, exact: bool) -> String {
    match snap {
        Some((_, s)) if props::is_user_prop(prop) => p.dsl_pool().snapshot_user_prop(ds, s, prop).0,
        Some((n, s)) => show_snap(p, n, s, prop, exact),
        None => show(d, p, ds, prop, exact).0,
    }
}

fn list(d: &Daemon, args: &[String]) -> Response {
    let (args, json_int) = json_args(args);
    let (o, rest) = match getopt(&args, "d:Hjo:prs:S:t:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let types = match Types::of(&o, false) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let cols: Vec<String> = values(&o, 'o')
        .last()
        .map(|s| {
            // `-o space`: OpenZFS's shorthand for the space breakdown.
            s.split(',')
                .flat_map(|c| match c {
                    "space" => SPACE_COLS.to_vec(),
                    c => vec![c],
                })
                .map(canon)
                .collect()
        })
        .unwrap_or_else(|| {
            ["name", "used", "available", "referenced", "mountpoint"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        });
    for c in &cols {
        if !known(c) && !SNAP_PROPS.contains(&c.as_str()) {
            return unknown_prop(c, "");
        }
    }
    let depth = match depth_opt(&o) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // Snapshots of the datasets listed: when asked for, or on a pool with
    // `listsnapshots=on` when no type is.
    let snaps_of = |p: &Pool| types.snap || (!types.typed && p.props().listsnapshots);
    let mut items = match gather(d, &rest, &types, has(&o, 'r'), depth, &snaps_of) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if items.is_empty() {
        return Response::ok("no datasets available\n".into());
    }
    // -s / -S: sort by properties, in the order given (numbers as numbers;
    // a later key breaks ties of an earlier one), as zfs-list(8).
    let keys: Vec<(String, bool)> = o
        .iter()
        .filter(|(c, _)| *c == 's' || *c == 'S')
        .filter_map(|(c, v)| v.as_ref().map(|v| (canon(v), *c == 'S')))
        .collect();
    for (k, _) in &keys {
        if !known(k) && !SNAP_PROPS.contains(&k.as_str()) {
            return unknown_prop(k, "");
        }
    }
    if !keys.is_empty() {
        let key_of = |it: &Item| -> Vec<(Option<u64>, String)> {
            keys.iter()
                .map(|(k, _)| {
                    let v = show_item(d, it, k, true);
                    (v.parse::<u64>().ok(), v)
                })
                .collect()
        };
        let mut keyed: Vec<_> = items.into_iter().map(|it| (key_of(&it), it)).collect();
        keyed.sort_by(|a, b| {
            for (i, (_, desc)) in keys.iter().enumerate() {
                let ord = a.0[i].cmp(&b.0[i]);
                let ord = if *desc { ord.reverse() } else { ord };
                if ord != std::cmp::Ordering::Equal {
                    return ord;
                }
            }
            std::cmp::Ordering::Equal
        });
        items = keyed.into_iter().map(|(_, it)| it).collect();
    }
    let header: Vec<String> = cols
        .iter()
        .map(|c| match c.as_str() {
            "available" => "AVAIL".into(),
            "referenced" => "REFER".into(),
            "usedbysnapshots" => "USEDSNAP".into(),
            "usedbydataset" => "USEDDS".into(),
            "usedbyrefreservation" => "USEDREFRESERV".into(),
            "usedbychildren" => "USEDCHILD".into(),
            "refreservation" => "REFRESERV".into(),
            "reservation" => "RESERV".into(),
            _ => c.to_uppercase(),
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    let right: Vec<bool> = cols
        .iter()
        .map(|c| {
            !matches!(
                c.as_str(),
                "name" | "mountpoint" | "type" | "compression" | "checksum"
            )
        })
        .collect();
    if has(&o, 'j') || json_int {
        let mut m = serde_json::Map::new();
        for it in &items {
            let (p, ds, snap) = it;
            match snap {
                None => {
                    m.insert(
                        p.dsl_pool().ds_name(&ds.rel()),
                        json_dataset(d, p, ds, &cols, has(&o, 'p'), json_int, &|_| true),
                    );
                }
                Some((n, _)) => {
                    m.insert(
                        n.clone(),
                        json_snapshot(d, it, &cols, has(&o, 'p'), json_int),
                    );
                }
            }
        }
        return json_doc("zfs list", m);
    }
    let mut t = Table::new(&h, &right);
    for it in &items {
        t.rows.push(
            cols.iter()
                .map(|c| show_item(d, it, c, has(&o, 'p')))
                .collect(),
        );
    }
    Response::ok(t.render(has(&o, 'H')))
}

fn get(d: &Daemon, args: &[String]) -> Response {
    let (args, json_int) = json_args(args);
    let (o, rest) = match getopt(&args, "d:Hjo:prs:t:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let Some(which) = rest.first() else {
        return usage_err("missing property argument");
    };
    let props_wanted: Vec<String> = if which == "all" {
        let mut v: Vec<String> = props::READONLY
            .iter()
            .filter(|p| **p != "name")
            .map(|s| s.to_string())
            .collect();
        v.extend(props::SETTABLE.iter().map(|d| d.name.to_string()));
        v.extend(SNAP_PROPS.iter().map(|p| p.to_string()));
        v
    } else {
        which.split(',').map(canon).collect()
    };
    for p in &props_wanted {
        if !known(p) && !SNAP_PROPS.contains(&p.as_str()) {
            return unknown_prop(p, "bad property list: ");
        }
    }
    let fields: Vec<String> = values(&o, 'o')
        .last()
        .filter(|s| *s != "all")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| {
            vec![
                "name".into(),
                "property".into(),
                "value".into(),
                "source".into(),
            ]
        });
    if let Some(f) = fields.iter().find(|f| {
        !matches!(
            f.as_str(),
            "name" | "property" | "value" | "received" | "source"
        )
    }) {
        return usage_err(&format!(
            "invalid field '{f}': name, property, value, received or source"
        ));
    }
    let depth = match depth_opt(&o) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // Every type unless -t says otherwise; a filesystem's snapshots come
    // with -r or -d (or when no dataset is named), as in OpenZFS.
    let types = match Types::of(&o, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let deep = has(&o, 'r') || depth.is_some() || rest.len() == 1;
    let snaps_of = |_: &Pool| types.snap && deep;
    let items = match gather(d, &rest[1..], &types, has(&o, 'r'), depth, &snaps_of) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // -s source[,source]: only properties whose source is one of them.
    let sources: Option<Vec<String>> = values(&o, 's')
        .last()
        .map(|v| v.split(',').map(str::to_string).collect());
    if let Some(ss) = &sources {
        for s in ss {
            if ![
                "local",
                "default",
                "inherited",
                "temporary",
                "received",
                "none",
            ]
            .contains(&s.as_str())
            {
                return usage_err(&format!("invalid source '{s}'"));
            }
        }
    }
    let wanted_source = |src: &str| {
        sources.as_ref().is_none_or(|ss| {
            ss.iter().any(|s| match s.as_str() {
                "inherited" => src.starts_with("inherited"),
                "none" => src == "-",
                s => src == s,
            })
        })
    };
    if has(&o, 'j') || json_int {
        let mut m = serde_json::Map::new();
        for it in &items {
            let (p, ds, snap) = it;
            let (name, v) = match snap {
                None => (
                    p.dsl_pool().ds_name(&ds.rel()),
                    json_dataset(
                        d,
                        p,
                        ds,
                        &props_wanted,
                        has(&o, 'p'),
                        json_int,
                        &wanted_source,
                    ),
                ),
                Some((n, _)) => (
                    n.clone(),
                    json_snapshot(d, it, &props_wanted, has(&o, 'p'), json_int),
                ),
            };
            m.insert(name, v);
        }
        return json_doc("zfs get", m);
    }
    let header: Vec<String> = fields.iter().map(|f| f.to_uppercase()).collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&h, &vec![false; fields.len()]);
    for it in &items {
        let (p, ds, snap) = it;
        let name = show_item(d, it, "name", false);
        // `all`: the user properties this one has, too.
        let users: Vec<String> = if which == "all" {
            p.dsl_pool()
                .user_props(ds)
                .into_iter()
                .map(|(n, _, _)| n)
                .collect()
        } else {
            Vec::new()
        };
        for prop in props_wanted.iter().chain(&users) {
            let (v, src) = match snap {
                None => show(d, p, ds, prop, has(&o, 'p')),
                Some((_, s)) if props::is_user_prop(prop) => {
                    let (v, src) = p.dsl_pool().snapshot_user_prop(ds, s, prop);
                    (v, src.to_string())
                }
                // What a snapshot does not have, `get all` leaves out.
                Some(_) => {
                    let v = show_item(d, it, prop, has(&o, 'p'));
                    if which == "all" && v == "-" {
                        continue;
                    }
                    (v, "-".to_string())
                }
            };
            if !wanted_source(&src) {
                continue;
            }
            t.rows.push(
                fields
                    .iter()
                    .map(|f| match f.as_str() {
                        "name" => name.clone(),
                        "property" => prop.clone(),
                        "value" => v.clone(),
                        "source" => src.clone(),
                        _ => "-".into(),
                    })
                    .collect(),
            );
        }
    }
    Response::ok(t.render(has(&o, 'H')))
}

/// Re-mount what a property change moved (mountpoint, canmount, readonly).
fn remount(d: &Daemon, pool: &Arc<Pool>) -> Vec<String> {
    let mut errs = Vec::new();
    let mut moving: Vec<std::path::PathBuf> = Vec::new();
    for ds in pool.dsl_pool().datasets() {
        let name = pool.dsl_pool().ds_name(&ds.rel());
        let now = mounts::is_mounted(d, &name);
        let want = mounts::mountpoint_of(d, pool, &ds).ok().filter(|_| {
            pool.dsl_pool()
                .get_prop(&ds, "canmount")
                .map(|(v, _)| v != "off")
                .unwrap_or(false)
        });
        if let Some(p) = now.filter(|p| Some(p) != want.as_ref()) {
            moving.push(p);
        }
    }
    // Whatever is mounted beneath a moving mount comes down first.
    let down: Vec<String> = mounts::list(d)
        .into_iter()
        .filter(|(_, p)| moving.iter().any(|m| p.starts_with(m)))
        .map(|(n, _)| n)
        .collect();
    if let Err(e) = mounts::unmount_many(d, down, false) {
        errs.push(e);
    }
    errs.extend(mounts::mount_all(d, pool));
    errs
}

/// `zfs set [-u] property=value ... filesystem ...`; `-u` (`no_mount`):
/// a changed mountpoint takes effect at the next mount, mounts stay as
/// they are.
fn set(d: &Daemon, args: &[String], no_mount: bool) -> Response {
    let (kvs, names): (Vec<&String>, Vec<&String>) = args.iter().partition(|a| a.contains('='));
    if kvs.is_empty() || names.is_empty() {
        return usage_err("expected property=value and a filesystem");
    }
    let mut notes = Vec::new();
    for n in names {
        if n.contains('@') {
            let history = format!("zfs set {}", args.join(" "));
            if let Err(r) = set_on_snapshot(d, n, kvs.iter().map(|kv| kv.as_str()), &history) {
                return r;
            }
            continue;
        }
        let (pool, ds) = match lookup(d, n) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let (mut moved, mut acl) = (false, false);
        for kv in &kvs {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let k = canon(k);
            if let Err(e) = pool.dsl_pool().set_prop(&ds, &k, v) {
                return err(format!("cannot set property for '{n}': {e}"));
            }
            moved |= matches!(k.as_str(), "mountpoint" | "canmount" | "readonly");
            acl |= k == "acltype";
        }
        pool.log_history(&format!("zfs set {}", args.join(" ")));
        if let Err(e) = pool.txg_wait_synced() {
            return err(format!("cannot set property for '{n}': {e}"));
        }
        mounts::refresh(d, &pool.name);
        if moved && !no_mount {
            let errs = remount(d, &pool);
            if !errs.is_empty() {
                return err(errs.join("\n"));
            }
        }
        if acl {
            notes.extend(mounts::acl_changed(d, &pool));
        }
    }
    acl_notes(notes)
}

/// Success, with notes about mounts that could not take a new `acltype`
/// yet on stderr.
fn acl_notes(notes: Vec<String>) -> Response {
    let mut r = Response::ok(String::new());
    for n in notes {
        r.stderr.push_str(&n);
        r.stderr.push('\n');
    }
    r
}

/// `zfs set` (`kvs` as `name=value`; a bare name: `zfs inherit`) on a
/// snapshot: user properties only. `history`: the command line to log.
fn set_on_snapshot<'a>(
    d: &Daemon,
    snap: &str,
    kvs: impl Iterator<Item = &'a str>,
    history: &str,
) -> Result<(), Response> {
    let ds_name = snap.split('@').next().unwrap_or("");
    let (pool, _) = lookup(d, ds_name)?;
    if pool.dsl_pool().snapshot(snap).is_err() {
        return Err(err(format!("cannot open '{snap}': dataset does not exist")));
    }
    for kv in kvs {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (kv, None),
        };
        pool.dsl_pool()
            .set_snapshot_prop(snap, k, v)
            .map_err(|e| err(format!("cannot set property for '{snap}': {e}")))?;
    }
    pool.log_history(history);
    Ok(())
}

fn inherit(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "rS!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [prop, names @ ..] = rest.as_slice() else {
        return usage_err("missing property argument");
    };
    if names.is_empty() {
        return usage_err("missing filesystem argument");
    }
    let prop = canon(prop);
    let mut notes = Vec::new();
    for n in names {
        if n.contains('@') {
            let history = format!("zfs inherit {}", args.join(" "));
            if let Err(r) = set_on_snapshot(d, n, std::iter::once(prop.as_str()), &history) {
                return r;
            }
            continue;
        }
        let ts = match targets(d, std::slice::from_ref(n), has(&o, 'r'), None) {
            Ok(t) => t,
            Err(r) => return r,
        };
        for (pool, ds) in &ts {
            if let Err(e) = pool.dsl_pool().inherit_prop(ds, &prop) {
                return err(format!("cannot inherit '{prop}' for '{n}': {e}"));
            }
        }
        if let Some((pool, _)) = ts.first() {
            let _ = pool.txg_wait_synced();
            mounts::refresh(d, &pool.name);
            let errs = remount(d, pool);
            if !errs.is_empty() {
                return err(errs.join("\n"));
            }
            if prop == "acltype" {
                notes.extend(mounts::acl_changed(d, pool));
            }
        }
    }
    acl_notes(notes)
}

fn mount(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "af!l!Oo:v") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    // -o ro|rw: a temporary readonly for these mounts (the last one
    // wins, as mount(8)); other options are refused, never ignored.
    let mut temp_ro = None;
    for opt in values(&o, 'o').iter().flat_map(|v| v.split(',')) {
        match opt {
            "ro" => temp_ro = Some(true),
            "rw" => temp_ro = Some(false),
            other => return Response::err(2, format!("mount option '{other}': not supported yet")),
        }
    }
    if has(&o, 'a') {
        let mut errs = Vec::new();
        if temp_ro.is_some() {
            return Response::err(2, "zfs mount -a -o: not supported yet".to_string());
        }
        for p in pools(d) {
            errs.extend(mounts::mount_all(d, &p));
        }
        return if errs.is_empty() {
            Response::ok(String::new())
        } else {
            err(errs.join("\n"))
        };
    }
    if rest.is_empty() {
        let mut out = String::new();
        for (n, p) in mounts::list(d) {
            out.push_str(&format!("{n:<30} {}\n", p.display()));
        }
        return Response::ok(out);
    }
    for n in &rest {
        let (pool, ds) = match lookup(d, n) {
            Ok(x) => x,
            Err(r) => return r,
        };
        if let Err(e) = mounts::mount(d, &pool, &ds, temp_ro) {
            return err(e);
        }
    }
    Response::ok(String::new())
}

fn unmount(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "afu") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let force = has(&o, 'f');
    if has(&o, 'a') {
        let names = mounts::list(d).into_iter().map(|(n, _)| n).collect();
        return match mounts::unmount_many(d, names, force) {
            Ok(()) => Response::ok(String::new()),
            Err(e) => err(e),
        };
    }
    if rest.is_empty() {
        return usage_err("missing filesystem argument");
    }
    for n in &rest {
        // A mountpoint names the dataset mounted there.
        let name = mounts::list(d)
            .into_iter()
            .find(|(ds, p)| ds == n || p.as_os_str() == n.as_str())
            .map(|(ds, _)| ds);
        let Some(name) = name else {
            return err(format!("cannot unmount '{n}': not currently mounted"));
        };
        if let Err(e) = mounts::unmount(d, &name, force) {
            return err(e);
        }
    }
    Response::ok(String::new())
}

/// `zfs rename [-r] DS@OLD DS@NEW` (or `@NEW`, or `NEW`): a snapshot's
/// name; `-r`, the snapshot of that name of every descendant too.
fn rename_snapshots(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "fr") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [from, to] = rest.as_slice() else {
        return usage_err("expected two snapshot names");
    };
    let Some((ds_name, old)) = from.split_once('@') else {
        return usage_err("expected a snapshot name");
    };
    let new = match to.split_once('@') {
        Some((tds, n)) if tds.is_empty() || tds == ds_name => n,
        Some(_) => {
            return err(format!(
                "cannot rename to '{to}': snapshots must be part of same dataset"
            ))
        }
        None => to.as_str(),
    };
    let (pool, ds) = match lookup(d, ds_name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if pool.dsl_pool().snapshot(from).is_err() {
        return err(format!("cannot open '{from}': dataset does not exist"));
    }
    let mut pairs = vec![(from.clone(), format!("{ds_name}@{new}"))];
    if has(&o, 'r') {
        for k in pool.dsl_pool().descendants(&ds) {
            let base = pool.dsl_pool().ds_name(&k.rel());
            if pool.dsl_pool().snapshot(&format!("{base}@{old}")).is_ok() {
                pairs.push((format!("{base}@{old}"), format!("{base}@{new}")));
            }
        }
    }
    // Every new name free first: all are renamed, or none.
    for (_, t) in &pairs {
        if pool.dsl_pool().snapshot(t).is_ok() {
            return err(format!("cannot rename to '{t}': dataset already exists"));
        }
    }
    for (f, t) in &pairs {
        if let Err(e) = pool.dsl_pool().rename_snapshot(f, t) {
            return err(format!("cannot rename '{f}': {e}"));
        }
    }
    pool.log_history(&format!("zfs rename {}", args.join(" ")));
    Response::ok(String::new())
}

/// Snapshot names given on a command line, each checked, with `-r` the
/// snapshot of that name of every descendant too; all of one pool.
fn snapshot_args(
    d: &Daemon,
    snaps: &[String],
    recursive: bool,
) -> Result<(Arc<Pool>, Vec<String>), Response> {
    let mut pool: Option<Arc<Pool>> = None;
    let mut names = Vec::new();
    for n in snaps {
        let Some((ds_name, snap)) = n.split_once('@') else {
            return Err(err(format!("'{n}' is not a snapshot")));
        };
        let (p, ds) = lookup(d, ds_name)?;
        if p.dsl_pool().snapshot(n).is_err() {
            return Err(err(format!("cannot open '{n}': dataset does not exist")));
        }
        names.push(n.clone());
        if recursive {
            for k in p.dsl_pool().descendants(&ds) {
                let kn = format!("{}@{snap}", p.dsl_pool().ds_name(&k.rel()));
                if p.dsl_pool().snapshot(&kn).is_ok() {
                    names.push(kn);
                }
            }
        }
        if pool.as_ref().is_some_and(|q| q.name != p.name) {
            return Err(err("snapshots of one pool at a time".to_string()));
        }
        pool = Some(p);
    }
    match pool {
        Some(p) => Ok((p, names)),
        None => Err(usage_err("missing snapshot name")),
    }
}

/// `zfs diff [-FHt] SNAP [SNAP|FILESYSTEM]`: `+` created, `-` removed,
/// `M` modified, `R` renamed, each under the filesystem's mount point
/// (`-F`: the file type, `-t`: the change time, `-H`: tabs, no arrows).
fn diff(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "FHt") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let (from, to) = match rest.as_slice() {
        [f] => (f, None),
        [f, t] => (f, Some(t.as_str())),
        _ => {
            return usage_err("expected a snapshot and, optionally, a later snapshot or filesystem")
        }
    };
    let Some((ds_name, _)) = from.split_once('@') else {
        return usage_err(&format!("'{from}' is not a snapshot"));
    };
    let (pool, ds) = match lookup(d, ds_name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let entries = match pool.dsl_pool().diff(from, to) {
        Ok(x) => x,
        Err(e) => return err(e.to_string()),
    };
    let base = mounts::is_mounted(d, ds_name)
        .map(|p| p.display().to_string())
        .or_else(|| {
            mounts::mountpoint_of(d, &pool, &ds)
                .ok()
                .map(|p| p.display().to_string())
        })
        .unwrap_or_default();
    let base = base.trim_end_matches('/');
    let mut out = String::new();
    for e in entries {
        if has(&o, 't') {
            out.push_str(&format!(
                "{}.{:09}\t",
                e.ctime.div_euclid(1_000_000_000),
                e.ctime.rem_euclid(1_000_000_000)
            ));
        }
        out.push(e.change);
        out.push('\t');
        if has(&o, 'F') {
            out.push(e.kind);
            out.push('\t');
        }
        out.push_str(&format!("{base}{}", e.path));
        if let Some(n) = e.new_path {
            if has(&o, 'H') {
                out.push_str(&format!("\t{base}{n}"));
            } else {
                out.push_str(&format!(" -> {base}{n}"));
            }
        }
        out.push('\n');
    }
    Response::ok(out)
}

/// `zfs promote CLONE`: the clone takes over its origin and the
/// snapshots before it; the origin's dataset becomes its clone.
fn promote(d: &Daemon, args: &[String]) -> Response {
    let (_, rest) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [name] = rest.as_slice() else {
        return usage_err("expected one filesystem name");
    };
    let (pool, _) = match lookup(d, name) {
        Ok(x) => x,
        Err(r) => return r,
    };
    match pool.dsl_pool().promote(name) {
        Ok(()) => {
            pool.log_history(&format!("zfs promote {}", args.join(" ")));
            Response::ok(String::new())
        }
        Err(e) => err(e.to_string()),
    }
}

/// `zfs hold [-r] TAG SNAP...` / `zfs release [-r] TAG SNAP...`: all or
/// none.
fn hold_release(d: &Daemon, args: &[String], hold: bool) -> Response {
    let (o, rest) = match getopt(args, "r") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [tag, snaps @ ..] = rest.as_slice() else {
        return usage_err("missing tag");
    };
    let (pool, names) = match snapshot_args(d, snaps, has(&o, 'r')) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = if hold {
        pool.dsl_pool().hold(tag, &names)
    } else {
        pool.dsl_pool().release(tag, &names)
    };
    match r {
        Ok(()) => {
            let cmd = if hold { "hold" } else { "release" };
            pool.log_history(&format!("zfs {cmd} {}", args.join(" ")));
            Response::ok(String::new())
        }
        Err(e) => err(e.to_string()),
    }
}

/// `zfs holds [-rHp] SNAP...`: NAME, TAG, TIMESTAMP of each hold.
fn holds(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "rHp") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let (pool, names) = match snapshot_args(d, &rest, has(&o, 'r')) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut t = Table::new(&["NAME", "TAG", "TIMESTAMP"], &[false, false, false]);
    for n in names {
        let Ok((_, s)) = pool.dsl_pool().snapshot(&n) else {
            continue;
        };
        for (tag, when) in s.phys().holds {
            let ts = if has(&o, 'p') {
                when.to_string()
            } else {
                crate::zpool::format_time(when)
            };
            t.rows.push(vec![n.clone(), tag, ts]);
        }
    }
    Response::ok(t.render(has(&o, 'H')))
}

fn rename(d: &Daemon, args: &[String]) -> Response {
    if args.iter().any(|a| !a.starts_with('-') && a.contains('@')) {
        return rename_snapshots(d, args);
    }
    let (o, rest) = match getopt(args, "fpr!u!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let [from, to] = rest.as_slice() else {
        return usage_err("expected two filesystem names");
    };
    let (pool, ds) = match lookup(d, from) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if to.split('/').next() != Some(pool.name.as_str()) {
        return err(format!(
            "cannot rename to '{to}': datasets must stay within pool '{}'",
            pool.name
        ));
    }
    if has(&o, 'p') {
        if let Some((parent, _)) = to.rsplit_once('/') {
            if pool.dsl_pool().dataset(parent).is_err() {
                if let Err(e) = pool.dsl_pool().create_dataset(parent, &[], true) {
                    return err(format!("cannot rename to '{to}': {e}"));
                }
            }
        }
    }
    let mut names: Vec<String> = pool
        .dsl_pool()
        .descendants(&ds)
        .iter()
        .map(|k| pool.dsl_pool().ds_name(&k.rel()))
        .collect();
    names.push(from.clone());
    let was_mounted: Vec<String> = names
        .iter()
        .filter(|n| mounts::is_mounted(d, n).is_some())
        .cloned()
        .collect();
    if let Err(e) = mounts::unmount_many(d, was_mounted, has(&o, 'f')) {
        return err(e);
    }
    if let Err(e) = pool.dsl_pool().rename_dataset(from, to) {
        let _ = mounts::mount_all(d, &pool);
        return err(format!("cannot rename '{from}': {e}"));
    }
    pool.log_history(&format!("zfs rename {from} {to}"));
    if let Err(e) = pool.txg_wait_synced() {
        return err(format!("cannot rename '{from}': {e}"));
    }
    let errs = mounts::mount_all(d, &pool);
    if errs.is_empty() {
        Response::ok(String::new())
    } else {
        err(errs.join("\n"))
    }
}
