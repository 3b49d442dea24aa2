//! `uzfs arcstat [-p POOL] [interval [count]]`: each pool's block cache,
//! like OpenZFS's `arcstat`. The daemon answers `arcstat --snapshot` with
//! its counters (JSON); this side prints them, and with an interval the
//! reads and hit ratio of each interval.
//!
//! Columns: `read` cache lookups (hits + misses), `hit%` the share served
//! from memory, `size` bytes held, `c` the size the cache is held to now
//! (below `c_max` while memory is short), `c_max` its largest size
//! (`UZFS_ARC_MAX`, or a quarter of the memory the daemon may use), `rss`
//! the daemon's resident memory, `limit` the memory cgroup's limit ("-":
//! none, the machine's RAM bounds it).

use crate::client::{self, Response};
use crate::daemon::Daemon;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ArcSnap {
    pub pool: String,
    pub size: u64,
    pub target: u64,
    pub max: u64,
    pub hits: u64,
    pub misses: u64,
    pub rss: u64,
    pub limit: Option<u64>,
}

/// The daemon's resident memory (VmRSS), bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

/// Daemon side: every pool's cache.
pub fn snapshot_cmd(d: &Daemon, args: &[String]) -> Response {
    let names: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    let pools = match crate::zpool::pools_or_all(d, &names) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let rss = rss_bytes();
    let limit = uzfs_core::arc::SystemMemory::detect().cgroup_limit();
    let mut out: Vec<ArcSnap> = pools
        .iter()
        .map(|p| {
            let c = &p.io.cache;
            let (size, hits, misses) = c.stats();
            ArcSnap {
                pool: p.name.clone(),
                size,
                target: c.target_bytes(),
                max: c.max_bytes(),
                hits,
                misses,
                rss,
                limit,
            }
        })
        .collect();
    out.sort_by(|a, b| a.pool.cmp(&b.pool));
    match serde_json::to_string(&out) {
        Ok(j) => Response::ok(j),
        Err(e) => Response::err(1, format!("arcstat: {e}")),
    }
}

const USAGE: &str = "usage: uzfs arcstat [-p pool] [interval [count]]\n";

fn render(rows: &[(ArcSnap, u64, u64)]) -> String {
    let size = crate::fmt::nicebytes;
    let mut s = format!(
        "{:<8} {:<16} {:>8} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
        "time", "pool", "read", "hit%", "size", "c", "c_max", "rss", "limit"
    );
    let now = crate::zilstat::hms_now();
    for (r, hits, misses) in rows {
        let reads = hits + misses;
        let pct = (hits * 100)
            .checked_div(reads)
            .map_or("-".to_string(), |p| p.to_string());
        s.push_str(&format!(
            "{:<8} {:<16} {:>8} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
            now,
            r.pool,
            reads,
            pct,
            size(r.size),
            size(r.target),
            size(r.max),
            size(r.rss),
            r.limit.map_or("-".to_string(), size),
        ));
    }
    s
}

/// Client side.
pub fn client(rundir: &Path, args: &[String]) -> i32 {
    let mut pools = Vec::new();
    let mut nums = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" | "-?" => {
                crate::out(USAGE);
                return 0;
            }
            "-p" => match it.next() {
                Some(p) => pools.push(p.clone()),
                None => {
                    crate::err(USAGE);
                    return 2;
                }
            },
            n => match n.parse::<u64>() {
                Ok(v) if v > 0 || !nums.is_empty() => nums.push(v),
                _ => {
                    crate::err(&format!("arcstat: bad argument '{n}'\n{USAGE}"));
                    return 2;
                }
            },
        }
    }
    if nums.len() > 2 {
        crate::err(USAGE);
        return 2;
    }
    let (interval, count) = (nums.first().copied(), nums.get(1).copied());
    let fetch = || -> Result<Vec<ArcSnap>, i32> {
        let mut argv = vec!["arcstat".to_string(), "--snapshot".into()];
        argv.extend(pools.iter().cloned());
        let r = client::call(rundir, argv);
        if r.code != 0 {
            crate::err(&r.stderr);
            return Err(r.code);
        }
        serde_json::from_str(&r.stdout).map_err(|e| {
            crate::err(&format!("arcstat: bad reply from the daemon: {e}\n"));
            1
        })
    };
    let mut prev = match fetch() {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(iv) = interval else {
        let rows: Vec<_> = prev.iter().map(|r| (r.clone(), r.hits, r.misses)).collect();
        crate::out(&render(&rows));
        return 0;
    };
    let mut printed = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_secs(iv));
        let now = match fetch() {
            Ok(s) => s,
            Err(c) => return c,
        };
        let rows: Vec<_> = now
            .iter()
            .map(|n| {
                let p = prev.iter().find(|p| p.pool == n.pool);
                let hits = n.hits.saturating_sub(p.map_or(0, |p| p.hits));
                let misses = n.misses.saturating_sub(p.map_or(0, |p| p.misses));
                (n.clone(), hits, misses)
            })
            .collect();
        crate::out(&render(&rows));
        prev = now;
        printed += 1;
        if count.is_some_and(|c| printed >= c) {
            return 0;
        }
    }
}
