//! `zdb`: reads devices directly and never writes. For a pool the running
//! daemon holds, the CLI sends the command to the daemon, which runs it with
//! the pool's txg commits paused, so the walk sees one stable committed txg
//! (otherwise the daemon could reuse blocks freed after that txg mid-walk and
//! zdb would report damage that is not there). Exported pools (`-e`, found by
//! scanning the `-p` directories, default /dev) and labels (`-l`) are read in
//! the calling process.

use crate::daemon::{open_paths, CacheEntry, Daemon};
use crate::zpool::getopt;
use std::fmt::Write;
use std::path::Path;
use uzfs_core::spa::import::{discover, scan_dir};
use uzfs_core::vdev::FileDevice;
use uzfs_core::zdb;

pub const USAGE: &str = "usage: zdb [-CbcuL] [-e [-p dir]...] poolname
       zdb -l device
    -C  show the pool configuration
    -u  show the uberblock rings and the active uberblock
    -b  traverse all blocks: verify every checksum of every copy and
        cross-check the space maps (leaks, double allocations)
    -c  same as -b
    -l  dump the labels of one device
    -e  the pool is exported: find it by scanning -p directories
";

/// Run zdb in this process (devices read directly).
pub fn run(rundir: &Path, args: &[String]) -> i32 {
    let (code, out, err) = run_captured(rundir, args, None);
    crate::out(&out);
    crate::err(&err);
    code
}

/// Inside the daemon: a pool it holds is verified with its txg commits
/// paused, so the walk sees one stable committed txg.
pub fn run_in_daemon(d: &Daemon, args: &[String]) -> crate::client::Response {
    let (code, stdout, stderr) = run_captured(&d.rundir, args, Some(d));
    crate::client::Response {
        code,
        stdout,
        stderr,
    }
}

/// The pool a zdb command line names, if it is not `-e` or `-l`.
pub fn named_pool(args: &[String]) -> Option<String> {
    let (o, rest) = getopt(args, "CbcuLl:ep:h").ok()?;
    if o.iter().any(|(k, _)| matches!(k, 'e' | 'l' | 'h')) {
        return None;
    }
    rest.first().cloned()
}

fn run_captured(rundir: &Path, args: &[String], daemon: Option<&Daemon>) -> (i32, String, String) {
    let mut out = String::new();
    let mut err = String::new();
    let code = run_into(rundir, args, daemon, &mut out, &mut err);
    (code, out, err)
}

fn run_into(
    rundir: &Path,
    args: &[String],
    daemon: Option<&Daemon>,
    out: &mut String,
    err: &mut String,
) -> i32 {
    let (o, rest) = match getopt(args, "CbcuLl:ep:h") {
        Ok(x) => x,
        Err(e) => {
            let _ = writeln!(err, "zdb: {e}\n{USAGE}");
            return 2;
        }
    };
    let has = |c: char| o.iter().any(|(k, _)| *k == c);
    if has('h') {
        let _ = write!(out, "{USAGE}");
        return 0;
    }
    if let Some((_, Some(dev))) = o.iter().find(|(k, _)| *k == 'l') {
        return match FileDevice::open(Path::new(dev)) {
            Ok(d) => {
                let (text, valid) = zdb::dump_labels(&d);
                let _ = write!(out, "{text}");
                if valid == 0 {
                    let _ = writeln!(err, "zdb: no valid label found on '{dev}'");
                    return 2;
                }
                0
            }
            Err(e) => {
                let _ = writeln!(err, "zdb: cannot open '{dev}': {e}");
                1
            }
        };
    }
    let Some(name) = rest.first() else {
        let _ = writeln!(err, "{USAGE}");
        return 2;
    };
    let devs = if has('e') {
        let dirs: Vec<String> = o
            .iter()
            .filter(|(k, _)| *k == 'p')
            .filter_map(|(_, v)| v.clone())
            .collect();
        let dirs = if dirs.is_empty() {
            vec!["/dev".to_string()]
        } else {
            dirs
        };
        let mut v = Vec::new();
        for d in dirs {
            match scan_dir(Path::new(&d)) {
                Ok(x) => v.extend(x),
                Err(e) => {
                    let _ = writeln!(err, "zdb: {e}");
                    return 1;
                }
            }
        }
        v
    } else {
        let cache: Vec<CacheEntry> = std::fs::read(rundir.join("zpool.cache"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        match cache.iter().find(|e| &e.name == name) {
            Some(e) => open_paths(&e.paths),
            None => {
                let _ = writeln!(err, "zdb: can't open '{name}': no such pool in the cache (use -e -p DIR for an exported pool)");
                return 1;
            }
        }
    };
    let found = discover(devs)
        .into_iter()
        .find(|f| &f.config.name == name || f.config.pool_guid.to_string() == *name);
    let Some(found) = found else {
        let _ = writeln!(
            err,
            "zdb: can't open '{name}': no such pool on the devices searched"
        );
        return 1;
    };
    let all = !(has('C') || has('u') || has('b') || has('c'));
    if all || has('C') {
        let _ = writeln!(out, "\nMOS Configuration:");
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&found.config).unwrap_or_default()
        );
    }
    if all || has('u') {
        let _ = write!(out, "{}", zdb::dump_uberblocks(&found));
    }
    if all || has('b') || has('c') {
        let paused = daemon.and_then(|d| {
            d.pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .cloned()
        });
        let verified = match &paused {
            Some(p) => p
                .with_syncs_paused(|| zdb::verify_found(&found))
                .and_then(|r| r),
            None => zdb::verify_found(&found),
        };
        match verified {
            Ok(r) => {
                let _ = write!(out, "\n{}", zdb::format_report(&r));
                if !r.is_clean() {
                    return 1;
                }
            }
            Err(e) => {
                let _ = writeln!(err, "zdb: cannot open '{name}': {e}");
                return 1;
            }
        }
    }
    0
}
