//! `zpool` subcommands, executed inside the daemon. Syntax and output follow
//! the OpenZFS man pages (zpool-create(8), zpool-status(8), ...); departures
//! are listed in the README.

use crate::client::Response;
use crate::daemon::Daemon;
use crate::fmt::{nicenum, Table};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uzfs_core::spa::config::{FailMode, FeatureState, PoolState};
use uzfs_core::spa::import::{discover, scan_dir, FoundPool};
use uzfs_core::spa::{feature, CreateOptions, Pool, TopSpec};
use uzfs_core::vdev::{label, BlockDevice, FileDevice, FlushPolicy, TopKind};

pub const USAGE: &str = "usage: zpool command args ...
where 'command' is one of the following:

\tcreate [-fn] [-m mountpoint] [-o property=value] ... [-O file-system-property=value] ...
\t    [-R root] <pool> <vdev> ...
\tdestroy [-f] <pool>

\tadd [-fnP] [-o ashift=N] <pool> <vdev> ...
\tremove <pool> <device> ...

\tlabelclear [-f] <vdev>

\tlist [-gHLpPv] [-o property[,...]] [-T u|d] [pool] ...
\tiostat [-v] [-l | -w] [-HLnpPy] [-T u|d] [pool] ... [interval [count]]
\tstatus [-DeigLpPstvx] [-T u|d] [pool] ...

\tonline [-e] <pool> <device> ...
\toffline [-ft] <pool> <device> ...
\tclear <pool> [device]

\tattach [-fsw] [-o ashift=N] <pool> <device> <new-device>
\tdetach <pool> <device>
\treplace [-fsw] [-o ashift=N] <pool> <device> [new-device]

\tscrub [-s | -p] [-w] <pool> ...
\twait [-H] [-t activity[,...]] <pool>

\timport [-d dir | -c cachefile] [-D] [-f] [-N] [-o property=value] ... [-R root] [-a]
\timport [-d dir | -c cachefile] [-D] [-f] [-N] [-o property=value] ... [-R root]
\t    <pool | id> [newpool]
\texport [-f] [-a | <pool> ...]
\tupgrade [-v] | [-a | pool...]

\thistory [-i] [pool] ...
\tsync [pool] ...

\tget [-Hp] [-o \"all\" | field[,...]] <\"all\" | property[,...]> [pool] ...
\tset <property=value> <pool> [vdev]

Options OpenZFS has that are not listed here are refused (\"option not
supported yet\").
";

pub(crate) type Opts = Vec<(char, Option<String>)>;

/// POSIX-style option parsing: `spec` lists flags, a trailing ':' takes a
/// value, a trailing '!' marks an option OpenZFS accepts that uzfs does not
/// implement yet ("option not supported yet: -X", exit 2). Every
/// subcommand's spec lists OpenZFS's whole option string this way, so an
/// option is either done or refused, never accepted and ignored.
pub(crate) fn getopt(args: &[String], spec: &str) -> Result<(Opts, Vec<String>), String> {
    let mut opts = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a.len() < 2 {
            break;
        }
        let chars: Vec<char> = a[1..].chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let c = chars[j];
            let Some(pos) = spec.find(c).filter(|_| c != ':' && c != '!') else {
                return Err(format!("invalid option '{c}'"));
            };
            let takes_arg = spec[pos + 1..].starts_with(':');
            // `X!` (or `X:!`): an option OpenZFS has and uzfs does not do
            // yet. Refused, never silently ignored.
            if spec[pos + 1 + takes_arg as usize..].starts_with('!') {
                return Err(format!("option not supported yet: -{c}"));
            }
            if takes_arg {
                let rest: String = chars[j + 1..].iter().collect();
                let v = if !rest.is_empty() {
                    rest
                } else {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| format!("missing argument for '{c}' option"))?
                };
                opts.push((c, Some(v)));
                break;
            }
            opts.push((c, None));
            j += 1;
        }
        i += 1;
    }
    Ok((opts, args[i..].to_vec()))
}

pub(crate) fn has(o: &Opts, c: char) -> bool {
    o.iter().any(|(k, _)| *k == c)
}

pub(crate) fn values(o: &Opts, c: char) -> Vec<String> {
    o.iter()
        .filter(|(k, _)| *k == c)
        .filter_map(|(_, v)| v.clone())
        .collect()
}

/// A device name as the user typed it, made absolute: relative to the
/// client's cwd if that exists, else under /dev (as zpool accepts `sdb`).
pub fn resolve(cwd: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    // `components` drops `.` (`-d .` lists `/dir/a`, not `/dir/./a`, so a
    // device is named the same way however it was found).
    let c: PathBuf = cwd.join(path).components().collect();
    if c.exists() {
        return c;
    }
    let d = Path::new("/dev").join(path);
    if d.exists() {
        return d;
    }
    c
}

pub(crate) fn open_dev(cwd: &Path, p: &str) -> Result<(String, Arc<dyn BlockDevice>), String> {
    let (path, dev) = open_dev_unclaimed(cwd, p)?;
    claim_dev(p, &*dev)?;
    Ok((path, dev))
}

/// Hold a device named for a pool (create, add, attach, replace, spare)
/// from here on: no other process, and no other pool of this one, can take
/// a disk a live pool uses, `-f` or not.
pub(crate) fn claim_dev(p: &str, dev: &dyn BlockDevice) -> Result<(), String> {
    dev.claim().map_err(|e| {
        // Say which pool, as OpenZFS does, when the label tells.
        match uzfs_core::spa::probe_label(dev) {
            Some(l) => format!("{p} is part of active pool '{}' ({e})", l.pool.name),
            None => format!("cannot use '{p}': {e}"),
        }
    })
}

/// `open_dev` without the exclusive hold: `zpool replace POOL DEV` of the
/// very device the pool holds (a disk swapped in place).
pub(crate) fn open_dev_unclaimed(
    cwd: &Path,
    p: &str,
) -> Result<(String, Arc<dyn BlockDevice>), String> {
    let path = resolve(cwd, p);
    let dev = FileDevice::open(&path).map_err(|e| format!("cannot open '{p}': {e}"))?;
    Ok((path.display().to_string(), Arc::new(dev)))
}

/// Opened devices, with the path each was named by.
pub type Devices = Vec<(String, Arc<dyn BlockDevice>)>;

/// A parsed vdev specification.
pub struct VdevSpec {
    pub tops: Vec<TopSpec>,
    pub spares: Devices,
    /// Separate intent-log devices (`log dev... | log mirror dev...`).
    pub logs: Vec<TopSpec>,
    /// L2ARC cache devices (`cache dev...`).
    pub caches: Devices,
}

/// Parse `dev | mirror dev... | raidz[1-3] dev... | spare dev... | log
/// [mirror] dev... | cache dev...` (zpoolconcepts(7)).
pub fn parse_vdevs(args: &[String], cwd: &Path) -> Result<VdevSpec, String> {
    let mut specs: Vec<TopSpec> = Vec::new();
    let mut spares = Vec::new();
    let mut logs: Vec<TopSpec> = Vec::new();
    let mut caches = Vec::new();
    // After `log`, top-level vdevs are log devices (until `spare`).
    let mut in_log = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let specs = if in_log { &mut logs } else { &mut specs };
        let group = |i: &mut usize| -> Result<Devices, String> {
            let mut leaves = Vec::new();
            *i += 1;
            while *i < args.len() && !is_keyword(&args[*i]) {
                leaves.push(open_dev(cwd, &args[*i])?);
                *i += 1;
            }
            Ok(leaves)
        };
        match a {
            "mirror" => {
                let leaves = group(&mut i)?;
                if leaves.len() < 2 {
                    return Err(
                        "invalid vdev specification: mirror requires at least 2 devices".into(),
                    );
                }
                specs.push(TopSpec {
                    kind: TopKind::Mirror,
                    leaves,
                });
            }
            "raidz" | "raidz1" | "raidz2" | "raidz3" => {
                let np = a
                    .strip_prefix("raidz")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                if in_log {
                    return Err(
                        "invalid vdev specification: a log device is a disk or a mirror, not raidz"
                            .into(),
                    );
                }
                let kind = TopKind::raidz(np).ok_or("invalid raidz parity")?;
                let leaves = group(&mut i)?;
                // As OpenZFS: one data column at least (raidz1 of two
                // disks keeps one copy and its parity, like a mirror).
                if leaves.len() < np + 1 {
                    return Err(format!(
                        "invalid vdev specification: {a} requires at least {} devices",
                        np + 1
                    ));
                }
                specs.push(TopSpec { kind, leaves });
            }
            "spare" | "cache" => {
                in_log = false;
                let leaves = group(&mut i)?;
                if leaves.is_empty() {
                    return Err(format!(
                        "invalid vdev specification: {a} requires at least 1 device"
                    ));
                }
                if a == "spare" {
                    spares.extend(leaves);
                } else {
                    caches.extend(leaves);
                }
            }
            k if k.starts_with("raidz") || k.starts_with("draid") => {
                return Err(format!(
                    "invalid vdev specification: unknown vdev type '{k}'"
                ));
            }
            "log" => {
                if args
                    .get(i + 1)
                    .is_none_or(|n| is_keyword(n) && n != "mirror" && !n.starts_with("raidz"))
                {
                    return Err("invalid vdev specification: log requires at least 1 device".into());
                }
                in_log = true;
                i += 1;
            }
            "special" | "dedup" => {
                return Err(format!(
                    "invalid vdev specification: '{a}' devices are not supported yet"
                ));
            }
            _ => {
                specs.push(TopSpec {
                    kind: TopKind::Disk,
                    leaves: vec![open_dev(cwd, a)?],
                });
                i += 1;
            }
        }
    }
    if specs.is_empty() && spares.is_empty() && logs.is_empty() && caches.is_empty() {
        return Err("missing vdev specification".into());
    }
    Ok(VdevSpec {
        tops: specs,
        spares,
        logs,
        caches,
    })
}

fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "mirror" | "log" | "cache" | "spare" | "special" | "dedup"
    ) || s.starts_with("raidz")
        || s.starts_with("draid")
}

pub(crate) fn err(msg: impl Into<String>) -> Response {
    Response::err(1, msg)
}

pub(crate) fn usage_err(msg: &str) -> Response {
    Response::err(2, format!("{msg}\n{USAGE}"))
}

pub(crate) fn get_pool(d: &Daemon, name: &str) -> Result<Arc<Pool>, Response> {
    d.pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
        .ok_or_else(|| err(format!("cannot open '{name}': no such pool")))
}

/// The pools a `*stat --snapshot` request names (its arguments that are
/// not options), or every pool.
pub(crate) fn pools_in_args(d: &Daemon, args: &[String]) -> Result<Vec<Arc<Pool>>, Response> {
    let names: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    pools_or_all(d, &names)
}

pub(crate) fn pools_or_all(d: &Daemon, names: &[String]) -> Result<Vec<Arc<Pool>>, Response> {
    if names.is_empty() {
        return Ok(d
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect());
    }
    names.iter().map(|n| get_pool(d, n)).collect()
}

pub fn run(d: &Daemon, args: &[String], cwd: &Path) -> Response {
    let Some(cmd) = args.first() else {
        return usage_err("missing command");
    };
    let rest = &args[1..];
    let full = format!("zpool {}", args.join(" "));
    let _admin = matches!(cmd.as_str(), "create" | "import" | "export" | "destroy")
        .then(|| d.admin.lock().unwrap_or_else(|e| e.into_inner()));
    // Commands that take no option uzfs does: OpenZFS's are refused as not
    // supported yet, any other is invalid (never a pool or device name).
    let plain = match cmd.as_str() {
        "set" | "sync" | "detach" => Some(""),

        "clear" => Some("F!n!"),
        "remove" => Some("n!p!s!w!"),
        _ => None,
    };
    let parsed;
    let rest = match plain.map(|spec| getopt(rest, spec)) {
        Some(Ok((_, r))) => {
            parsed = r;
            &parsed[..]
        }
        Some(Err(e)) => return usage_err(&e),
        None => rest,
    };
    match cmd.as_str() {
        "create" => create(d, rest, cwd, &full),
        "add" => add(d, rest, cwd, &full),
        "list" => list(d, rest),
        "status" => crate::status::status(d, rest),
        "import" => import(d, rest, cwd),
        "export" => export_or_destroy(d, rest, false),
        "destroy" => export_or_destroy(d, rest, true),
        "get" => get(d, rest),
        "set" => set(d, rest, &full),
        "history" => history(d, rest),
        "sync" => match pools_or_all(d, rest) {
            Ok(ps) => {
                for p in ps {
                    if let Err(e) = p.txg_wait_synced() {
                        return err(format!("cannot sync '{}': {e}", p.name));
                    }
                }
                Response::ok(String::new())
            }
            Err(r) => r,
        },
        "labelclear" => labelclear(d, rest, cwd),
        "scrub" => crate::vdevs::scrub(d, rest, &full),
        "offline" => crate::vdevs::offline(d, rest, &full),
        "online" => crate::vdevs::online(d, rest, &full),
        "clear" => crate::vdevs::clear(d, rest, &full),
        "attach" => crate::vdevs::attach_or_replace(d, rest, cwd, &full, false),
        "replace" => crate::vdevs::attach_or_replace(d, rest, cwd, &full, true),
        "detach" => crate::vdevs::detach(d, rest, &full),
        "remove" => crate::vdevs::remove(d, rest, &full),
        "wait" => crate::vdevs::wait(d, rest),
        "iostat" => crate::iostat::snapshot_cmd(d, rest),
        "upgrade" => upgrade(d, rest),
        "help" | "-?" | "--help" => Response::ok(USAGE.into()),
        "checkpoint" | "trim" | "initialize" | "split" | "reguid" | "reopen" | "events"
        | "resilver" | "prefetch" | "ddtprune" | "discard-checkpoint" => {
            Response::err(2, format!("zpool {cmd}: not supported yet"))
        }
        other => usage_err(&format!("unrecognized command '{other}'")),
    }
}

fn create(d: &Daemon, args: &[String], cwd: &Path, full: &str) -> Response {
    let (o, rest) = match getopt(args, "d!fnm:o:O:R:t:!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let Some(name) = rest.first() else {
        return usage_err("missing pool name argument");
    };
    if d.pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(name)
    {
        return err(format!("cannot create '{name}': pool already exists"));
    }
    let mut opts = CreateOptions {
        force: has(&o, 'f'),
        tunables: Daemon::tunables(),
        ..Default::default()
    };
    // Pool properties, checked before anything is written and set once
    // the pool exists (`zpool get ashift` then shows what create was told,
    // and a later `zpool add` uses it, as OpenZFS).
    let mut settings = Vec::new();
    for kv in values(&o, 'o') {
        let Some((k, v)) = kv.split_once('=') else {
            return usage_err(&format!("bad property '{kv}': expected property=value"));
        };
        match k {
            "flush" => match FlushPolicy::parse(v) {
                Ok(f) => opts.flush = f,
                Err(e) => return err(e.to_string()),
            },
            _ if k.starts_with("feature@") => {
                if feature::info(&k[8..]).is_none() {
                    return err(format!(
                        "property '{k}' is not a valid pool property (unknown feature)"
                    ));
                }
                if v != "enabled" {
                    return err(format!(
                        "property '{k}': only 'enabled' is supported at create"
                    ));
                }
            }
            _ => match pool_setting(k, v) {
                Ok(s) => {
                    if let PoolSetting::Ashift(a) = s {
                        opts.ashift = if a == 0 { 12 } else { a };
                    }
                    settings.push(s);
                }
                Err(e) if !prop_is_known(k) => return err(e),
                Err(e) => return err(format!("cannot create '{name}': {e}")),
            },
        }
    }
    let mut ds_props: Vec<(String, String)> = Vec::new();
    for kv in values(&o, 'O') {
        let Some((k, v)) = kv.split_once('=') else {
            return usage_err(&format!("bad property '{kv}': expected property=value"));
        };
        if let Err(e) = uzfs_core::dsl::props::validate(k, v) {
            return err(format!("cannot create '{name}': {e}"));
        }
        ds_props.push((k.to_string(), v.to_string()));
    }
    if let Some(m) = values(&o, 'm').last() {
        if let Err(e) = uzfs_core::dsl::props::validate("mountpoint", m) {
            return err(format!("cannot create '{name}': {e}"));
        }
        ds_props.push(("mountpoint".into(), m.to_string()));
    }
    let altroot = values(&o, 'R').last().map(|s| s.to_string());
    let VdevSpec {
        tops: specs,
        spares,
        logs,
        caches,
    } = match parse_vdevs(&rest[1..], cwd) {
        Ok(s) if s.tops.is_empty() => {
            return err(format!(
                "cannot create '{name}': a pool needs at least one data vdev"
            ))
        }
        Ok(s) => s,
        Err(e) => return err(format!("cannot create '{name}': {e}")),
    };
    if has(&o, 'n') {
        let (tops, spares) = named(&specs, &spares);
        let (logs, caches) = named(&logs, &caches);
        return Response::ok(format!(
            "would create '{name}' with the following layout:\n\n{}",
            layout(name, &tops, &spares, &logs, &caches)
        ));
    }
    let force = has(&o, 'f');
    let pool = match Pool::create(name, specs, opts) {
        Ok(p) => p,
        Err(e) => return err(format!("cannot create '{name}': {e}")),
    };
    for spec in logs {
        if let Err(e) = pool.add_log_vdev(spec, None, force) {
            let _ = pool.destroy();
            return err(format!("cannot create '{name}': {e}"));
        }
    }
    if !spares.is_empty() {
        if let Err(e) = pool.add_spares(spares, force) {
            let _ = pool.destroy();
            return err(format!("cannot create '{name}': {e}"));
        }
    }
    if !caches.is_empty() {
        if let Err(e) = pool.add_caches(caches, force) {
            let _ = pool.destroy();
            return err(format!("cannot create '{name}': {e}"));
        }
    }
    for st in settings {
        if let Err(e) = apply_setting(d, &pool, st) {
            let _ = pool.destroy();
            return err(format!("cannot create '{name}': {e}"));
        }
    }
    pool.log_history(full);
    if let Err(e) = pool.dsl_pool().format_root_fs() {
        return err(format!("cannot create '{name}': {e}"));
    }
    if let Ok(root) = pool.dsl_pool().dataset(name) {
        for (k, v) in &ds_props {
            if let Err(e) = pool.dsl_pool().set_prop(&root, k, v) {
                return err(format!("cannot create '{name}': {e}"));
            }
        }
    }
    if let Err(e) = pool.txg_wait_synced() {
        return err(format!("cannot create '{name}': {e}"));
    }
    if let Some(a) = altroot {
        d.mounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .altroot
            .insert(name.clone(), a);
    }
    d.pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.clone(), pool.clone());
    d.write_cache();
    let errs = crate::mounts::mount_all(d, &pool);
    if !errs.is_empty() {
        return Response::err(1, errs.join("\n"));
    }
    Response::ok(String::new())
}

fn add(d: &Daemon, args: &[String], cwd: &Path, full: &str) -> Response {
    let (o, rest) = match getopt(args, "fg!L!nPo:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let Some(name) = rest.first() else {
        return usage_err("missing pool name argument");
    };
    let pool = match get_pool(d, name) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut ashift = None;
    for kv in values(&o, 'o') {
        match kv.split_once('=') {
            Some(("ashift", v)) => match v.parse::<u8>() {
                Ok(a) if (9..=16).contains(&a) => ashift = Some(a),
                _ => return err(format!("invalid ashift '{v}'")),
            },
            _ => return err(format!("property '{kv}' cannot be set with add")),
        }
    }
    let VdevSpec {
        tops: specs,
        spares,
        logs,
        caches,
    } = match parse_vdevs(&rest[1..], cwd) {
        Ok(s) => s,
        Err(e) => return err(format!("cannot add to '{name}': {e}")),
    };
    if has(&o, 'n') {
        // The layout the pool would have; nothing is opened for writing.
        let cfg = pool.config();
        let mut new_normal: Vec<(TopKind, Vec<String>)> = Vec::new();
        let mut tops: Vec<(TopKind, Vec<String>)> = cfg
            .vdev_tree
            .iter()
            .map(|t| (t.kind, t.children.iter().map(|c| c.path.clone()).collect()))
            .collect();
        let mut all_spares: Vec<String> = cfg.spares.iter().map(|l| l.path.clone()).collect();
        let mut all_caches: Vec<String> = cfg.cache.iter().map(|l| l.path.clone()).collect();
        let (new_tops, new_spares) = named(&specs, &spares);
        let (new_logs, new_caches) = named(&logs, &caches);
        all_caches.extend(new_caches);
        let mut all_logs: Vec<(TopKind, Vec<String>)> = Vec::new();
        for (t, c) in tops.drain(..).zip(cfg.vdev_tree.iter()) {
            if c.log {
                all_logs.push(t);
            } else {
                new_normal.push(t);
            }
        }
        let mut tops = std::mem::take(&mut new_normal);
        tops.extend(new_tops);
        all_logs.extend(new_logs);
        all_spares.extend(new_spares);
        return Response::ok(format!(
            "would update '{name}' to the following configuration:\n\n{}",
            layout(name, &tops, &all_spares, &all_logs, &all_caches)
        ));
    }
    if !spares.is_empty() {
        if let Err(e) = pool.add_spares(spares, has(&o, 'f')) {
            return err(format!("cannot add to '{name}': {e}"));
        }
        d.write_cache();
    }
    if !caches.is_empty() {
        if let Err(e) = pool.add_caches(caches, has(&o, 'f')) {
            return err(format!("cannot add to '{name}': {e}"));
        }
        d.write_cache();
    }
    for spec in specs {
        if let Err(e) = pool.add_vdev(spec, ashift, has(&o, 'f')) {
            return err(format!("cannot add to '{name}': {e}"));
        }
    }
    for spec in logs {
        if let Err(e) = pool.add_log_vdev(spec, ashift, has(&o, 'f')) {
            return err(format!("cannot add to '{name}': {e}"));
        }
    }
    pool.log_history(full);
    let _ = pool.txg_wait_synced();
    d.write_cache();
    Response::ok(String::new())
}

/// Parsed vdev specs and single devices (spares, caches) by the paths
/// they were named with, for [`layout`].
fn named(specs: &[TopSpec], spares: &Devices) -> (Vec<(TopKind, Vec<String>)>, Vec<String>) {
    let paths = |devs: &Devices| devs.iter().map(|(p, _)| p.clone()).collect();
    (
        specs.iter().map(|s| (s.kind, paths(&s.leaves))).collect(),
        paths(spares),
    )
}

/// A pool layout as `zpool create -n` / `zpool add -n` print it (the
/// config part of `zpool status`, without states).
fn layout(
    name: &str,
    tops: &[(TopKind, Vec<String>)],
    spares: &[String],
    logs: &[(TopKind, Vec<String>)],
    caches: &[String],
) -> String {
    let mut out = format!("\t{name}\n");
    let logs_head = (!logs.is_empty()).then_some((TopKind::Disk, Vec::new()));
    for (i, (kind, leaves)) in tops.iter().chain(logs_head.iter()).chain(logs).enumerate() {
        if i == tops.len() && leaves.is_empty() {
            out.push_str("\tlogs\n");
            continue;
        }
        if *kind == TopKind::Disk {
            out.push_str(&format!(
                "\t  {}\n",
                leaves.first().map_or("", String::as_str)
            ));
        } else {
            out.push_str(&format!("\t  {}\n", kind.label()));
            for p in leaves {
                out.push_str(&format!("\t    {p}\n"));
            }
        }
    }
    for (head, devs) in [("cache", caches), ("spares", spares)] {
        if !devs.is_empty() {
            out.push_str(&format!("\t{head}\n"));
            for p in devs {
                out.push_str(&format!("\t  {p}\n"));
            }
        }
    }
    out
}

/// [`prop_value`], with what only the daemon knows (the altroot).
fn pool_prop(d: &Daemon, p: &Pool, prop: &str, parsable: bool) -> Option<(String, &'static str)> {
    if prop == "altroot" {
        if let Some(a) = crate::mounts::altroot(d, &p.name) {
            return Some((a, "local"));
        }
    }
    if prop == "cachefile" {
        let v = d
            .cachefiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .value(&p.name);
        let src = if v == "-" { "default" } else { "local" };
        return Some((v, src));
    }
    prop_value(p, prop, parsable)
}

/// An on/off pool property's value and source.
fn on_off_prop(on: bool) -> (String, &'static str) {
    (
        if on { "on" } else { "off" }.into(),
        if on { "local" } else { "default" },
    )
}

/// A pool property `zpool set`, and `-o` at create and import, change.
#[derive(Clone)]
enum PoolSetting {
    Comment(String),
    Multihost(bool),
    Ashift(u8),
    Autoexpand(bool),
    Autoreplace(bool),
    Failmode(FailMode),
    Listsnapshots(bool),
    /// `none`, a path, or the default (`""`).
    Cachefile(String),
}

fn on_off(k: &str, v: &str) -> Result<bool, String> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("invalid value '{v}' for property '{k}': on | off")),
    }
}

/// Check a settable pool property and its value (`Err`: what is wrong).
fn pool_setting(k: &str, v: &str) -> Result<PoolSetting, String> {
    use PoolSetting::*;
    Ok(match k {
        "comment" => {
            uzfs_core::spa::check_comment(v).map_err(|e| e.to_string())?;
            Comment(v.to_string())
        }
        "multihost" => Multihost(on_off(k, v)?),
        "ashift" => match v.parse::<u8>() {
            Ok(a) if a == 0 || (9..=16).contains(&a) => Ashift(a),
            _ => {
                return Err(format!(
                    "property 'ashift' must be 0 or between 9 and 16: '{v}'"
                ))
            }
        },
        "autoexpand" | "expand" => Autoexpand(on_off(k, v)?),
        "autoreplace" | "replace" => Autoreplace(on_off(k, v)?),
        "failmode" => Failmode(FailMode::parse(v).ok_or_else(|| {
            format!("invalid value '{v}' for property 'failmode': wait | continue | panic")
        })?),
        "listsnapshots" | "listsnaps" => Listsnapshots(on_off(k, v)?),
        "cachefile" => Cachefile(match v {
            "" | "-" | "none" => v.to_string(),
            p if p.starts_with('/') => {
                let dir = Path::new(p).parent().unwrap_or(Path::new("/"));
                if !dir.is_dir() {
                    return Err(format!(
                        "cannot use cachefile '{p}': directory '{}' does not exist",
                        dir.display()
                    ));
                }
                p.to_string()
            }
            _ => {
                return Err(format!(
                    "property 'cachefile' must be empty, an absolute path, or 'none': '{v}'"
                ))
            }
        }),
        "altroot" => {
            return Err("property 'altroot' can only be set at create or import (-R)".into())
        }
        _ if prop_is_known(k) => return Err(format!("property '{k}' is readonly")),
        _ => return Err(format!("property '{k}' is not a valid pool property")),
    })
}

/// A pool property `zpool get` knows (settable or not), by its name or
/// short name.
fn prop_is_known(k: &str) -> bool {
    ALL_PROPS.contains(&k)
        || matches!(
            k,
            "name"
                | "alloc"
                | "cap"
                | "dedup"
                | "frag"
                | "expandsz"
                | "ckpoint"
                | "txg"
                | "expand"
                | "replace"
                | "listsnaps"
        )
        || k.starts_with("feature@")
}

/// Apply a checked setting (the persisted ones commit with the next txg).
fn apply_setting(d: &Daemon, pool: &Arc<Pool>, s: PoolSetting) -> uzfs_core::Result<()> {
    use PoolSetting::*;
    match s {
        Comment(c) => pool.set_comment(&c),
        Multihost(on) => pool.set_multihost(on),
        Ashift(a) => pool.set_default_ashift(a),
        Autoexpand(on) => pool.set_autoexpand(on),
        Autoreplace(on) => pool.set_autoreplace(on),
        Failmode(m) => pool.set_failmode(m),
        Listsnapshots(on) => pool.set_listsnapshots(on),
        Cachefile(v) => {
            d.cachefiles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set(&pool.name, &v);
            d.write_cache();
            Ok(())
        }
    }
}

fn prop_value(p: &Pool, prop: &str, parsable: bool) -> Option<(String, &'static str)> {
    let (size, alloc, free) = p.space();
    let n = |v: u64| if parsable { v.to_string() } else { nicenum(v) };
    let cfg = p.config();
    let props = p.props();
    Some(match prop {
        "name" => (p.name.clone(), "-"),
        "size" => (n(size), "-"),
        "allocated" | "alloc" => (n(alloc), "-"),
        "free" => (n(free), "-"),
        "capacity" | "cap" => (capacity(alloc, size, parsable), "-"),
        "health" => (crate::status::pool_health(p).to_string(), "-"),
        "guid" => (p.guid.to_string(), "-"),
        "ashift" => (
            props.ashift.to_string(),
            if props.ashift == 0 {
                "default"
            } else {
                "local"
            },
        ),
        "comment" => (
            if props.comment.is_empty() {
                "-".into()
            } else {
                props.comment.clone()
            },
            if props.comment.is_empty() {
                "default"
            } else {
                "local"
            },
        ),
        "version" => ("-".into(), "default"),
        "readonly" => (if p.readonly() { "on" } else { "off" }.into(), "-"),
        "multihost" => on_off_prop(props.multihost),
        "autoexpand" | "expand" => on_off_prop(props.autoexpand),
        "autoreplace" | "replace" => on_off_prop(props.autoreplace),
        "listsnapshots" | "listsnaps" => on_off_prop(props.listsnapshots),
        "failmode" => (
            props.failmode.name().into(),
            if props.failmode == FailMode::default() {
                "default"
            } else {
                "local"
            },
        ),
        "expandsize" | "expandsz" => {
            let grow: u64 = p.expand_sizes().iter().sum();
            (if grow == 0 { "-".into() } else { n(grow) }, "-")
        }
        "dedupratio" | "dedup" => (
            if parsable {
                "1.00".into()
            } else {
                "1.00x".into()
            },
            "-",
        ),
        "fragmentation" | "frag" => ("-".into(), "-"),
        "freeing" => (n(p.dsl_pool().freeing()), "-"),
        "checkpoint" | "ckpoint" | "altroot" => ("-".into(), "default"),
        "txg" => (p.last_txg().to_string(), "-"),
        f if f.starts_with("feature@") => {
            let name = &f[8..];
            let full = feature::info(name)?.name;
            let st = cfg
                .features
                .get(full)
                .map_or(FeatureState::Disabled, |e| e.state);
            (format!("{st:?}").to_lowercase(), "local")
        }
        _ => return None,
    })
}

const ALL_PROPS: &[&str] = &[
    "size",
    "capacity",
    "altroot",
    "health",
    "guid",
    "version",
    "autoreplace",
    "cachefile",
    "failmode",
    "listsnapshots",
    "autoexpand",
    "dedupratio",
    "free",
    "allocated",
    "readonly",
    "ashift",
    "comment",
    "expandsize",
    "freeing",
    "fragmentation",
    "multihost",
    "checkpoint",
];

fn list(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "gHj!LpPvo:T:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let pools = match pools_or_all(d, &rest) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let default_cols = "name,size,allocated,free,checkpoint,expandsize,fragmentation,capacity,dedupratio,health,altroot";
    let cols: Vec<String> = values(&o, 'o')
        .last()
        .map_or(default_cols.to_string(), |s| s.clone())
        .split(',')
        .map(String::from)
        .collect();
    let hdr: Vec<String> = cols
        .iter()
        .map(|c| match c.as_str() {
            "allocated" => "ALLOC".into(),
            "checkpoint" => "CKPOINT".into(),
            "expandsize" => "EXPANDSZ".into(),
            "fragmentation" => "FRAG".into(),
            "capacity" => "CAP".into(),
            "dedupratio" => "DEDUP".into(),
            other => other.to_uppercase(),
        })
        .collect();
    let right: Vec<bool> = cols
        .iter()
        .map(|c| !matches!(c.as_str(), "name" | "altroot" | "health" | "comment"))
        .collect();
    let stamp = match crate::status::timestamp(&o) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let naming = crate::status::Naming {
        guid: has(&o, 'g'),
        resolve: has(&o, 'L'),
    };
    let mut t = Table::new(&hdr.iter().map(String::as_str).collect::<Vec<_>>(), &right);
    for p in &pools {
        let mut row = Vec::new();
        for c in &cols {
            match pool_prop(d, p, c, has(&o, 'p')) {
                Some((v, _)) => row.push(v),
                None => return err(format!("invalid property '{c}'")),
            }
        }
        t.rows.push(row);
        if has(&o, 'v') {
            t.rows.extend(vdev_rows(p, &cols, has(&o, 'p'), naming));
        }
    }
    if pools.is_empty() {
        return Response::ok("no pools available\n".into());
    }
    Response::ok(stamp + &t.render(has(&o, 'H')))
}

/// CAP as `zpool list` prints it: percent allocated (`-p`: the bare number).
fn capacity(alloc: u64, size: u64, parsable: bool) -> String {
    let c = (alloc * 100).checked_div(size).unwrap_or(0);
    if parsable {
        c.to_string()
    } else {
        format!("{c}%")
    }
}

/// `zpool list -v`: a row per top-level vdev (its own size, allocated,
/// free and capacity) and per device beneath it (its health), other
/// columns "-", as zpool-list(8).
fn vdev_rows(
    p: &Pool,
    cols: &[String],
    parsable: bool,
    naming: crate::status::Naming,
) -> Vec<Vec<String>> {
    let n = |v: u64| if parsable { v.to_string() } else { nicenum(v) };
    let space = p.vdev_space();
    let grow = p.expand_sizes();
    let mut rows = Vec::new();
    // Data vdevs, then the separate log devices under "logs".
    let (order, first_log) = p.tops_data_then_logs();
    for (k, (i, t)) in order.iter().enumerate() {
        let i = *i;
        if k == first_log {
            rows.push(
                cols.iter()
                    .map(|c| {
                        if c == "name" {
                            "logs".into()
                        } else {
                            "-".into()
                        }
                    })
                    .collect(),
            );
        }
        let (alloc, free) = space.get(i).copied().unwrap_or((0, 0));
        let expandsz = match grow.get(i) {
            Some(&g) if g > 0 => n(g),
            _ => "-".into(),
        };
        let size = alloc + free;
        rows.push(
            cols.iter()
                .map(|c| match c.as_str() {
                    "name" => format!("  {}", naming.top(t)),
                    "size" => n(size),
                    "allocated" | "alloc" => n(alloc),
                    "free" => n(free),
                    "capacity" | "cap" => capacity(alloc, size, parsable),
                    "expandsize" | "expandsz" => expandsz.clone(),
                    "health" => t.health().to_string(),
                    _ => "-".into(),
                })
                .collect(),
        );
        if t.kind == TopKind::Disk {
            continue;
        }
        for l in t.leaves() {
            rows.push(
                cols.iter()
                    .map(|c| match c.as_str() {
                        "name" => format!("    {}", naming.leaf(&l)),
                        "health" => crate::status::leaf_state(&l).to_string(),
                        _ => "-".into(),
                    })
                    .collect(),
            );
        }
    }
    let caches = p.io.cache.l2_devices();
    if !caches.is_empty() {
        let head = |c: &String| {
            if c == "name" {
                "cache".into()
            } else {
                "-".into()
            }
        };
        rows.push(cols.iter().map(head).collect());
        for d in caches {
            let alloc = d.stats().size;
            let size = d.capacity();
            rows.push(
                cols.iter()
                    .map(|c| match c.as_str() {
                        "name" => format!("  {}", naming.leaf(&d.leaf)),
                        "size" => n(size),
                        "allocated" | "alloc" => n(alloc),
                        "free" => n(size.saturating_sub(alloc)),
                        "capacity" | "cap" => capacity(alloc, size, parsable),
                        "health" => crate::status::leaf_state(&d.leaf).to_string(),
                        _ => "-".into(),
                    })
                    .collect(),
            );
        }
    }
    rows
}

fn found_tree(f: &FoundPool) -> String {
    let mut t = Table::new(&["", ""], &[false, false]);
    t.rows.push(vec![
        f.config.name.clone(),
        if f.missing().is_empty() {
            "ONLINE".into()
        } else {
            "DEGRADED".into()
        },
    ]);
    let path_of = |guid: u64, cfg_path: &str| -> (String, &'static str) {
        match f.devices.iter().find(|d| d.label.guid == guid) {
            Some(d) => (d.path.clone(), "ONLINE"),
            None => (cfg_path.to_string(), "UNAVAIL"),
        }
    };
    for tc in &f.config.vdev_tree {
        if tc.kind != TopKind::Disk {
            // mirror-N, raidz2-N: the layout as `zpool status` shows it.
            t.rows.push(vec![
                format!("  {}-{}", tc.kind.label(), tc.id),
                "ONLINE".into(),
            ]);
            for c in &tc.children {
                let (p, s) = path_of(c.guid, &c.path);
                t.rows.push(vec![format!("    {p}"), s.into()]);
            }
        } else if let Some(c) = tc.children.first() {
            let (p, s) = path_of(c.guid, &c.path);
            t.rows.push(vec![format!("  {p}"), s.into()]);
        }
    }
    t.rows.retain(|r| !r[0].is_empty());
    let body = t.render(false);
    body.lines().skip(1).map(|l| format!("\t{l}\n")).collect()
}

fn import(d: &Daemon, args: &[String], cwd: &Path) -> Response {
    let (o, rest) = match getopt(args, "Dd:fF!l!mn!Nt!T:!X!c:o:R:sa") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    // -o property=value: readonly=on|off and the settable pool properties
    // (set once imported); mount options are refused, never ignored.
    let mut readonly = false;
    let mut settings = Vec::new();
    for kv in values(&o, 'o') {
        match kv.split_once('=') {
            Some(("readonly", v)) => match on_off("readonly", v) {
                Ok(r) => readonly = r,
                Err(e) => return err(e),
            },
            Some((k, v)) => match pool_setting(k, v) {
                Ok(s) => settings.push(s),
                Err(e) if !prop_is_known(k) => return err(e),
                Err(e) => return err(format!("cannot import: {e}")),
            },
            None => {
                return Response::err(
                    2,
                    format!("mount options at import ('-o {kv}'): not supported yet"),
                )
            }
        }
    }
    if readonly
        && settings
            .iter()
            .any(|s| !matches!(s, PoolSetting::Cachefile(_)))
    {
        return err("cannot import: a read-only import sets no pool property but cachefile");
    }
    // -c FILE: the devices a cache file lists; else the -d directories.
    let mut devs = Vec::new();
    if let Some(c) = values(&o, 'c').last() {
        if !values(&o, 'd').is_empty() {
            return usage_err("-c and -d cannot be used together");
        }
        let c = resolve(cwd, c);
        let entries = match crate::daemon::read_cache_file(&c) {
            Ok(e) => e,
            Err(e) => return err(format!("cannot import: {e}")),
        };
        let paths: Vec<String> = entries.into_iter().flat_map(|e| e.paths).collect();
        devs = crate::daemon::open_paths(&paths);
        // The pool stays cached where it was found (unless -o says).
        if !settings
            .iter()
            .any(|s| matches!(s, PoolSetting::Cachefile(_)))
        {
            settings.push(PoolSetting::Cachefile(c.display().to_string()));
        }
    } else {
        let mut dirs: Vec<PathBuf> = values(&o, 'd').iter().map(|p| resolve(cwd, p)).collect();
        if dirs.is_empty() {
            dirs.push(PathBuf::from("/dev"));
        }
        for dir in &dirs {
            match scan_dir(dir) {
                Ok(v) => devs.extend(v),
                Err(e) => return err(format!("cannot search '{}': {e}", dir.display())),
            }
        }
    }
    let imported: Vec<u64> = d
        .pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .map(|p| p.guid)
        .collect();
    let found: Vec<FoundPool> = discover(devs)
        .into_iter()
        .filter(|f| !imported.contains(&f.config.pool_guid))
        .filter(|f| has(&o, 'D') == (f.config.state == PoolState::Destroyed))
        .collect();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let hostid = crate::daemon::hostid();
    // Labels that say the pool is imported by another host (by host id;
    // by name for labels written before host ids were recorded).
    let check_host = |f: &FoundPool| -> Result<(), Response> {
        let other = if f.config.hostid != 0 && hostid != 0 {
            f.config.hostid != hostid
        } else {
            !f.config.hostname.is_empty() && f.config.hostname != host
        };
        if f.config.state == PoolState::Active && other && !has(&o, 'f') {
            return Err(err(format!(
                "cannot import '{}': pool was previously in use from another system.\nLast accessed by {} (hostid={:08x})\nThe pool can be imported, use 'zpool import -f' to import the pool.",
                f.config.name, f.config.hostname, f.config.hostid
            )));
        }
        Ok(())
    };
    if rest.is_empty() && !has(&o, 'a') {
        if found.is_empty() {
            return err("no pools available to import");
        }
        let mut out = String::new();
        for f in &found {
            let state = if f.missing().is_empty() {
                "ONLINE"
            } else {
                "DEGRADED"
            };
            out.push_str(&format!(
                "   pool: {}\n     id: {}\n  state: {state}\n",
                f.config.name, f.config.pool_guid
            ));
            if f.config.state == PoolState::Destroyed {
                out.push_str(" status: The pool was destroyed.\n");
            }
            out.push_str(" action: The pool can be imported using its name or numeric identifier.\n config:\n\n");
            out.push_str(&found_tree(f));
            out.push('\n');
        }
        return Response::ok(out);
    }
    let targets: Vec<&FoundPool> = if has(&o, 'a') {
        found.iter().collect()
    } else {
        let key = &rest[0];
        let m: Vec<&FoundPool> = found
            .iter()
            .filter(|f| &f.config.name == key || f.config.pool_guid.to_string() == *key)
            .collect();
        match m.len() {
            0 => return err(format!("cannot import '{key}': no such pool available")),
            1 => m,
            _ => {
                return err(format!(
                "cannot import '{key}': more than one matching pool\nimport by numeric ID instead"
            ))
            }
        }
    };
    let new_name = if has(&o, 'a') {
        None
    } else {
        rest.get(1).map(String::as_str)
    };
    for f in targets {
        if let Err(r) = check_host(f) {
            return r;
        }
        if let Some(a) = values(&o, 'R').last() {
            let n = new_name.unwrap_or(&f.config.name).to_string();
            d.mounts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .altroot
                .insert(n, a.to_string());
        }
        // -D: a destroyed pool comes back as if it had been exported (its
        // labels are rewritten as active by the import's first txg).
        let revived;
        let f = if has(&o, 'D') {
            let mut g = f.clone();
            g.config.state = PoolState::Exported;
            revived = g;
            &revived
        } else {
            f
        };
        let pool = match d.import(f, new_name, !has(&o, 'N'), readonly, has(&o, 'm')) {
            Ok(p) => p,
            Err(e) => return err(e),
        };
        for s in &settings {
            if let Err(e) = apply_setting(d, &pool, s.clone()) {
                return err(format!("pool '{}' imported, but: {e}", pool.name));
            }
        }
        d.write_cache();
    }
    Response::ok(String::new())
}

fn export_or_destroy(d: &Daemon, args: &[String], destroy: bool) -> Response {
    let (o, mut rest) = match getopt(args, if destroy { "f" } else { "fa" }) {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    // export -a: every imported pool.
    if has(&o, 'a') {
        if !rest.is_empty() {
            return usage_err("-a and pool names cannot be used together");
        }
        rest = d
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        if rest.is_empty() {
            return Response::ok(String::new());
        }
    }
    if rest.is_empty() {
        return usage_err("missing pool argument");
    }
    for name in &rest {
        let pool = match get_pool(d, name) {
            Ok(p) => p,
            Err(r) => return r,
        };
        if destroy && pool.readonly() {
            return err(format!(
                "cannot destroy '{name}': pool '{name}' is read-only"
            ));
        }
        // A suspended pool's stuck txg is given up now (as export does
        // anyway), so writers held by failmode=wait get EIO and its
        // filesystems can come down.
        let was_suspended = pool.suspended().is_some();
        pool.abandon_parked_sync();
        let mut tries = 0;
        while let Err(e) = crate::mounts::unmount_pool(d, name, has(&o, 'f')) {
            // The writers just failed: give their processes a moment to
            // close their files.
            tries += 1;
            if !was_suspended || tries > 20 {
                return err(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        pool.log_history(&format!(
            "zpool {} {name}",
            if destroy { "destroy" } else { "export" }
        ));
        let r = if destroy {
            pool.destroy()
        } else {
            pool.export()
        };
        if let Err(e) = &r {
            if !pool.is_closed() {
                // Nothing was given up: the pool stays imported (its
                // filesystems unmounted, as OpenZFS leaves them).
                return err(format!(
                    "cannot {} '{name}': {e}\nthe pool is still imported; its filesystems are unmounted ('zfs mount -a' mounts them again)",
                    if destroy { "destroy" } else { "export" }
                ));
            }
        }
        d.pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        // `cachefile` lasts for one import.
        d.cachefiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_pool
            .remove(name.as_str());
        d.write_cache();
        if let Err(e) = r {
            return err(format!(
                "cannot {} '{name}': {e}",
                if destroy { "destroy" } else { "export" }
            ));
        }
    }
    Response::ok(String::new())
}

fn get(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "Hj!po:") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let Some(which) = rest.first() else {
        return usage_err("missing property argument");
    };
    let pools = match pools_or_all(d, &rest[1..]) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let fields: Vec<String> = match values(&o, 'o').last() {
        Some(f) if f != "all" => f.split(',').map(String::from).collect(),
        _ => vec![
            "name".into(),
            "property".into(),
            "value".into(),
            "source".into(),
        ],
    };
    if let Some(f) = fields
        .iter()
        .find(|f| !matches!(f.as_str(), "name" | "property" | "value" | "source"))
    {
        return usage_err(&format!(
            "invalid field '{f}': name, property, value or source"
        ));
    }
    let props: Vec<String> = if which == "all" {
        let mut v: Vec<String> = ALL_PROPS.iter().map(|s| s.to_string()).collect();
        v.extend(
            feature::FEATURES
                .iter()
                .map(|f| format!("feature@{}", feature::short(f.name))),
        );
        v
    } else {
        which.split(',').map(String::from).collect()
    };
    let hdr: Vec<String> = fields.iter().map(|f| f.to_uppercase()).collect();
    let mut t = Table::new(&hdr.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    for p in &pools {
        for prop in &props {
            let Some((v, src)) = pool_prop(d, p, prop, has(&o, 'p')) else {
                return err(format!("bad property list: invalid property '{prop}'"));
            };
            let row = fields
                .iter()
                .map(|f| match f.as_str() {
                    "name" => p.name.clone(),
                    "property" => prop.clone(),
                    "value" => v.clone(),
                    "source" => src.to_string(),
                    _ => "-".into(),
                })
                .collect();
            t.rows.push(row);
        }
    }
    Response::ok(t.render(has(&o, 'H')))
}

fn set(d: &Daemon, args: &[String], full: &str) -> Response {
    if args.len() < 2 {
        return usage_err("usage: zpool set <property=value> <pool> [vdev]");
    }
    let Some((k, v)) = args[0].split_once('=') else {
        return usage_err(&format!("invalid property=value format '{}'", args[0]));
    };
    let pool = match get_pool(d, &args[1]) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let r = match (k, args.get(2)) {
        ("flush", Some(vd)) => match FlushPolicy::parse(v) {
            Ok(f) => pool.set_flush(vd, f),
            Err(e) => return err(e.to_string()),
        },
        ("flush", None) => {
            return err("'flush' is a vdev property: zpool set flush=honor|ignore <pool> <vdev>")
        }
        (_, Some(vd)) => {
            return err(format!(
                "cannot set property for '{vd}': '{k}' is not a vdev property (only flush is)"
            ))
        }
        (k, None) => match pool_setting(k, v) {
            Ok(s) => apply_setting(d, &pool, s),
            Err(e) => return err(format!("cannot set property for '{}': {e}", pool.name)),
        },
    };
    if let Err(e) = r {
        return err(format!("cannot set property for '{}': {e}", pool.name));
    }
    pool.log_history(full);
    match pool.txg_wait_synced() {
        Ok(_) => Response::ok(String::new()),
        Err(e) => err(e.to_string()),
    }
}

/// `zpool history [-i] [pool]...`: the commands that changed the pools;
/// `-i` adds the pools' own events (device changes, scans).
fn history(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "il!") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let pools = match pools_or_all(d, &rest) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut out = String::new();
    for p in pools {
        out.push_str(&format!("History for '{}':\n", p.name));
        match p.history() {
            Ok(h) => {
                for (t, c) in h {
                    if !has(&o, 'i') && c.starts_with(uzfs_core::spa::INTERNAL) {
                        continue;
                    }
                    out.push_str(&format!("{} {c}\n", format_time(t)));
                }
            }
            Err(e) => return err(format!("cannot read history of '{}': {e}", p.name)),
        }
        out.push('\n');
    }
    Response::ok(out)
}

/// `YYYY-MM-DD.HH:MM:SS` in UTC, as zpool history prints.
pub fn format_time(t: u64) -> String {
    let days = t / 86400;
    let secs = t % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let dd = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{dd:02}.{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn labelclear(d: &Daemon, args: &[String], cwd: &Path) -> Response {
    let (o, rest) = match getopt(args, "f") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let Some(dev) = rest.first() else {
        return usage_err("missing vdev name");
    };
    let (path, dev) = match open_dev_unclaimed(cwd, dev) {
        Ok(x) => x,
        Err(e) => return err(e),
    };
    let Some(lab) = uzfs_core::spa::probe_label(&*dev) else {
        return err(format!(
            "failed to check state for {path}: no uzfs label found"
        ));
    };
    let imported = d
        .pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .any(|p| p.guid == lab.pool.pool_guid);
    if imported {
        return err(format!(
            "labelclear operation failed.\n\tVdev {path} is a member of the imported pool \"{}\".",
            lab.pool.name
        ));
    }
    // A pool another process (another daemon) has imported: refused, `-f`
    // or not; its hold on the device says so.
    if let Err(e) = claim_dev(&path, &*dev) {
        return err(format!("labelclear operation failed.\n\t{e}"));
    }
    if lab.pool.state == PoolState::Exported && !has(&o, 'f') {
        return err(format!(
            "use '-f' to override the following error:\n{path} is a member of exported pool \"{}\"",
            lab.pool.name
        ));
    }
    match label::clear(&*dev) {
        Ok(()) => Response::ok(String::new()),
        Err(e) => err(format!("failed to clear label for {path}: {e}")),
    }
}

/// `zpool upgrade`: `-v` lists the features this build knows; no
/// argument lists the imported pools that miss some (made by an earlier
/// build); `-a` or `POOL...` enables them.
fn upgrade(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "V:!va") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    const HEAD: &str = "This system supports ZFS pool feature flags.\n\n";
    if has(&o, 'v') {
        let mut out = format!(
            "{HEAD}The following features are supported:\n\nFEAT DESCRIPTION\n-------------------------------------------------------------\n"
        );
        for f in feature::FEATURES {
            out.push_str(&format!(
                "{:<24}{}\n     {}\n",
                feature::short(f.name),
                if f.read_only_compatible {
                    " (read-only compatible)"
                } else {
                    ""
                },
                f.description
            ));
        }
        out.push_str("\nThe following legacy versions are also supported: none (uzfs pools always use feature flags).\n");
        return Response::ok(out);
    }
    let all = has(&o, 'a');
    if all && !rest.is_empty() {
        return usage_err("-a cannot be combined with pool names");
    }
    let mut pools = match pools_or_all(d, &rest) {
        Ok(ps) => ps,
        Err(r) => return r,
    };
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from(HEAD);
    if !all && rest.is_empty() {
        out.push_str("All pools are formatted using feature flags.\n\n");
        let behind: Vec<(String, Vec<&str>)> = pools
            .iter()
            .map(|p| (p.name.clone(), p.missing_features()))
            .filter(|(_, m)| !m.is_empty())
            .collect();
        if behind.is_empty() {
            out.push_str(
                "Every feature flags pool has all supported and requested features enabled.\n",
            );
            return Response::ok(out);
        }
        out.push_str(
            "Some supported features are not enabled on the following pools. Once a\n\
             feature is enabled the pool may become incompatible with software\n\
             that does not support the feature. See zpool-features(7) for details.\n\n\
             POOL  FEATURE\n---------------\n",
        );
        for (name, missing) in behind {
            out.push_str(&format!("{name}\n"));
            for f in missing {
                out.push_str(&format!("      {}\n", feature::short(f)));
            }
        }
        return Response::ok(out);
    }
    for p in pools {
        match p.enable_features() {
            Ok(added) if added.is_empty() => out.push_str(&format!(
                "Pool '{}' already has all supported and requested features enabled.\n",
                p.name
            )),
            Ok(added) => {
                out.push_str(&format!(
                    "Enabled the following features on '{}':\n",
                    p.name
                ));
                for f in added {
                    out.push_str(&format!("  {}\n", feature::short(f)));
                }
            }
            Err(e) => return err(format!("cannot upgrade '{}': {e}", p.name)),
        }
    }
    Response::ok(out)
}

/// `uzfs object put|get|write POOL ...`: direct access to the root
/// dataset's objects (the demo and benchmarks use it until filesystems land).
pub fn object_cmd(d: &Daemon, args: &[String], cwd: &Path) -> Response {
    use uzfs_core::dmu::dnode::ObjProps;
    let usage = "usage: uzfs object put POOL FILE | get POOL OBJECT FILE | free POOL OBJECT";
    if args.len() < 2 {
        return usage_err(usage);
    }
    let pool = match get_pool(d, &args[1]) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match (args[0].as_str(), args.len()) {
        ("put", 3) => {
            let path = resolve(cwd, &args[2]);
            let Ok(mut f) = std::fs::File::open(&path) else {
                return err(format!("cannot open '{}'", path.display()));
            };
            let props = ObjProps {
                compress: uzfs_core::dmu::compress::Compression::Lz4,
                ..ObjProps::default()
            };
            let obj = match pool.create_object(128 << 10, &props) {
                Ok(o) => o,
                Err(e) => return err(e.to_string()),
            };
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            loop {
                use std::io::Read;
                let n = match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => return err(format!("read '{}': {e}", path.display())),
                };
                if let Err(e) = pool.write(obj, off, &buf[..n]) {
                    return err(format!("write failed after {off} bytes: {e}"));
                }
                off += n as u64;
            }
            if let Err(e) = pool.txg_wait_synced() {
                return err(e.to_string());
            }
            Response::ok(format!("{obj}\n"))
        }
        ("get", 4) => {
            let Ok(obj) = args[2].parse::<u64>() else {
                return err(format!("invalid object number '{}'", args[2]));
            };
            let size = match pool.object_size(obj) {
                Ok(s) => s,
                Err(e) => return err(e.to_string()),
            };
            let path = resolve(cwd, &args[3]);
            let Ok(mut f) = std::fs::File::create(&path) else {
                return err(format!("cannot create '{}'", path.display()));
            };
            let mut off = 0;
            let mut buf = vec![0u8; 1 << 20];
            while off < size {
                use std::io::Write;
                let n = (size - off).min(buf.len() as u64) as usize;
                if let Err(e) = pool.read(obj, off, &mut buf[..n]) {
                    return err(format!("read of object {obj} failed: {e}"));
                }
                if let Err(e) = f.write_all(&buf[..n]) {
                    return err(e.to_string());
                }
                off += n as u64;
            }
            Response::ok(String::new())
        }
        ("free", 3) => {
            let Ok(obj) = args[2].parse::<u64>() else {
                return err(format!("invalid object number '{}'", args[2]));
            };
            match pool.free_object(obj).and_then(|_| pool.txg_wait_synced()) {
                Ok(_) => Response::ok(String::new()),
                Err(e) => err(e.to_string()),
            }
        }
        _ => usage_err(usage),
    }
}
