//! `uzfs arcstat [-p POOL] [interval [count]]`: each pool's block cache,
//! like OpenZFS's `arcstat`. The daemon answers `arcstat --snapshot` with
//! its counters (JSON); this side prints them, and with an interval the
//! reads and hit ratio of each interval.
//!
//! Columns: `read` cache lookups (hits + misses), `hit%` the share served
//! from memory, `size` bytes held, `c` the size the cache is held to now
//! (below `c_max` while memory is short, never below `c_min`:
//! `UZFS_ARC_MIN`, default 32 MiB), `c_max` its largest size
//! (`UZFS_ARC_MAX`, or a quarter of the memory the daemon may use), `rss`
//! the daemon's resident memory, `limit` the memory cgroup's limit ("-":
//! none, the machine's RAM bounds it).

use crate::client::Response;
use crate::daemon::Daemon;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ArcSnap {
    pub pool: String,
    pub size: u64,
    pub target: u64,
    pub max: u64,
    #[serde(default)]
    pub min: u64,
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
    let pools = match crate::zpool::pools_in_args(d, args) {
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
                min: c.min_bytes(),
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
        "{:<8} {:<16} {:>8} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
        "time", "pool", "read", "hit%", "size", "c", "c_min", "c_max", "rss", "limit"
    );
    let now = crate::zilstat::hms_now();
    for (r, hits, misses) in rows {
        let reads = hits + misses;
        let pct = (hits * 100)
            .checked_div(reads)
            .map_or("-".to_string(), |p| p.to_string());
        s.push_str(&format!(
            "{:<8} {:<16} {:>8} {:>5} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n",
            now,
            r.pool,
            reads,
            pct,
            size(r.size),
            size(r.target),
            size(r.min),
            size(r.max),
            size(r.rss),
            r.limit.map_or("-".to_string(), size),
        ));
    }
    s
}

/// Client side.
pub fn client(rundir: &Path, args: &[String]) -> i32 {
    crate::zilstat::stat_client(rundir, args, "arcstat", USAGE, |prev, now: &[ArcSnap]| {
        let rows: Vec<_> = now
            .iter()
            .map(|n| {
                let p = prev.and_then(|prev| prev.iter().find(|p| p.pool == n.pool));
                let hits = n.hits.saturating_sub(p.map_or(0, |p| p.hits));
                let misses = n.misses.saturating_sub(p.map_or(0, |p| p.misses));
                (n.clone(), hits, misses)
            })
            .collect();
        render(&rows)
    })
}
