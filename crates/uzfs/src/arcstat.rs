//! `uzfs arcstat [-f FIELDS] [-v] [-p POOL] [interval [count]]`: each
//! pool's ARC, with OpenZFS `arcstat`'s column names. The daemon answers
//! `arcstat --snapshot` with every `arcstats` figure of each pool (JSON);
//! this side prints them, and with an interval each interval's counts.
//!
//! The daemon also keeps `arcstats` in its run directory, the figures of
//! all its pools summed, in the layout of Linux's
//! `/proc/spl/kstat/zfs/arcstats` (a header line, `name type data`, one
//! figure a line), rewritten every second, so exporters and scripts
//! written for OpenZFS can read it.

use crate::client::Response;
use crate::daemon::Daemon;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ArcSnap {
    pub pool: String,
    /// Every `arcstats` figure by name.
    pub stats: BTreeMap<String, u64>,
    pub rss: u64,
    pub limit: Option<u64>,
    /// Memory the machine (or cgroup) could still hand out.
    pub avail: Option<u64>,
}

/// Whether figure `k` is a size now, not a count since start (an interval
/// shows it as it is, not its difference): the core's own split.
fn is_gauge(k: &str) -> bool {
    uzfs_core::arc::ArcStats::default()
        .gauge_fields()
        .iter()
        .any(|(g, _)| *g == k)
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

/// What the sync did with written file data besides caching it
/// (`spa/io.rs`, `CacheWritten`; `dmu/bufpool.rs`), by name.
/// And what became of records written in part (`dmu/partial.rs`), and
/// records given whole to the kernel's page cache after a read of part
/// of them (`fuse/store.rs`), and the allocator trims that hold the RSS
/// to its budget (`daemon::return_free_memory`); these last four are
/// daemon-wide ([`DAEMON_WIDE`]), the same in every pool's line.
const WRITE_FIELDS: [&str; 13] = [
    "uzfs_written_uncached_bytes",
    "uzfs_bufpool_reused",
    "uzfs_bufpool_size",
    "uzfs_partial_deferred",
    "uzfs_partial_covered",
    "uzfs_partial_filled_read",
    "uzfs_partial_filled_sync",
    "uzfs_partial_retrieved",
    "uzfs_partial_retrieve_missed",
    "uzfs_kernel_stores",
    "uzfs_kernel_stores_dropped",
    "uzfs_malloc_trims",
    "uzfs_malloc_trim_us",
];

/// The figures of the whole daemon, not of a pool (the last four of
/// [`WRITE_FIELDS`]): the `arcstats` file gives them once, not summed
/// over pools.
const DAEMON_WIDE: &[&str] = WRITE_FIELDS.split_at(WRITE_FIELDS.len() - 4).1;

fn write_fields(p: &uzfs_core::spa::Pool) -> [(&'static str, u64); 13] {
    use std::sync::atomic::Ordering::Relaxed;
    let s = p.io.partial.stats();
    let v = [
        p.io.written_uncached.load(Relaxed),
        p.io.bufs.reused.load(Relaxed),
        p.io.bufs.bytes(),
        s.deferred,
        s.covered,
        s.filled_by_read,
        s.filled_by_sync,
        s.retrieved,
        s.retrieve_missed,
        crate::fuse::store::STORED.load(Relaxed),
        crate::fuse::store::DROPPED.load(Relaxed),
        crate::daemon::TRIMS.load(Relaxed),
        crate::daemon::TRIM_US.load(Relaxed),
    ];
    std::array::from_fn(|i| (WRITE_FIELDS[i], v[i]))
}

fn snaps<'a>(
    pools: impl Iterator<Item = &'a std::sync::Arc<uzfs_core::spa::Pool>>,
) -> Vec<ArcSnap> {
    use uzfs_core::arc::MemoryProbe;
    let rss = rss_bytes();
    let mem = uzfs_core::arc::SystemMemory::detect();
    let (limit, avail) = (mem.cgroup_limit(), mem.available());
    let mut out: Vec<ArcSnap> = pools
        .map(|p| ArcSnap {
            pool: p.name.clone(),
            stats: p
                .io
                .cache
                .arcstats()
                .fields()
                .into_iter()
                .chain(write_fields(p))
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            rss,
            limit,
            avail,
        })
        .collect();
    out.sort_by(|a, b| a.pool.cmp(&b.pool));
    out
}

/// Daemon side: every pool's cache.
pub fn snapshot_cmd(d: &Daemon, args: &[String]) -> Response {
    let pools = match crate::zpool::pools_in_args(d, args) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match serde_json::to_string(&snaps(pools.iter())) {
        Ok(j) => Response::ok(j),
        Err(e) => Response::err(1, format!("arcstat: {e}")),
    }
}

/// The `arcstats` file's text: every pool's figures summed, the
/// daemon's own ([`DAEMON_WIDE`]) once.
pub fn kstat_text(snaps: &[ArcSnap]) -> String {
    let names: Vec<&str> = uzfs_core::arc::ArcStats::default()
        .fields()
        .into_iter()
        .map(|(k, _)| k)
        .chain(WRITE_FIELDS)
        .collect();
    let avail = snaps.first().and_then(|s| s.avail).unwrap_or(0);
    let mut out = format!(
        "13 1 0x01 {} 0 0 0\nname                            type data\n",
        names.len() + 1
    );
    for k in names {
        let mut each = snaps.iter().filter_map(|s| s.stats.get(k));
        let sum: u64 = if DAEMON_WIDE.contains(&k) {
            each.next().copied().unwrap_or(0)
        } else {
            each.sum()
        };
        out.push_str(&format!("{k:<32}4    {sum}\n"));
    }
    out.push_str(&format!("{:<32}4    {avail}\n", "memory_available_bytes"));
    out
}

/// Memory besides the cache and dirty data the daemon is allowed before
/// it hands free allocator memory back (README, "In a container or under
/// a memory limit"). The RSS hovers near the budget: with 192 MiB, fs.sh
/// with a 512 MiB `arc_max` peaked at 1,005-1,076 MiB; with 128, at
/// 912-1,050 (bench/RESULTS.md, twenty-fifth session), until the checks
/// near the budget came closer together ([`NEAR_CHECK`]).
pub const ALLOWANCE: u64 = 128 << 20;

/// How close to its budget the RSS may come before it is checked every
/// [`NEAR_CHECK`] instead of every [`FAR_CHECK`].
pub const NEAR: u64 = 96 << 20;
pub const FAR_CHECK: std::time::Duration = std::time::Duration::from_millis(100);
pub const NEAR_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Keep `RUNDIR/arcstats` current (every second) and the daemon's RSS near
/// its budget while the daemon runs.
///
/// The budget is every pool's cache target `c` and dirty limit plus
/// [`ALLOWANCE`]. Past it, the free memory glibc keeps in its arenas (cache
/// blocks evicted and dirty buffers freed after a sync: 128 KiB-1 MiB
/// chunks scattered through the heaps) goes back to the kernel
/// (`malloc_trim`). Without that, `bench/fs.sh` with a 512 MiB `arc_max`
/// peaked at 1.4-1.8 GiB with the cache and dirty data within 768 MiB.
/// Trimming only past the budget costs nothing at the default sizes; a
/// trim every second regardless cost 6-10% of the CPU of cached reads.
///
/// The RSS is read every 100 ms while it is more than [`NEAR`] below the
/// budget, every 10 ms once it is closer. A sync filling partial records
/// from disk grows it at 550 MiB/s, and a trim of a heap full of freed
/// buffers takes 5-90 ms; checked only every 100 ms, fs.sh with a 512
/// MiB `arc_max` passed its 896 MiB budget by up to 135 MiB before the
/// trim caught it (bench/RESULTS.md, twenty-sixth session). Reading
/// `/proc/self/status` costs microseconds. A trim that leaves the RSS
/// over the budget found the memory in use, and the next check waits the
/// long interval.
pub fn start_kstat_writer(d: &std::sync::Arc<Daemon>) {
    let w = std::sync::Arc::downgrade(d);
    let _ = std::thread::Builder::new()
        .name("arcstats".into())
        .spawn(move || {
            let mut written: Option<std::time::Instant> = None;
            loop {
                let pause = {
                    // Nothing held across the sleep: a pool exported or a
                    // daemon stopping must not wait for this thread. The
                    // pools are read under the daemon's map lock, never
                    // cloned out: an export that took one out of the map
                    // has the last reference to it.
                    let Some(d) = w.upgrade() else { return };
                    let due =
                        written.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1));
                    let (budget, text) = {
                        let pools = d.pools.lock().unwrap_or_else(|e| e.into_inner());
                        let budget: u64 = pools
                            .values()
                            .map(|p| p.io.cache.target_bytes() + p.dirty_limit())
                            .sum::<u64>()
                            + ALLOWANCE;
                        let text = due.then(|| kstat_text(&snaps(pools.values())));
                        (budget, text)
                    };
                    // Trimmed with no lock held: a trim of a large heap
                    // takes milliseconds, and commands wait on the map.
                    let rss = rss_bytes();
                    let trimmed = rss > budget;
                    if trimmed {
                        crate::daemon::return_free_memory();
                    }
                    if let Some(text) = text {
                        written = Some(std::time::Instant::now());
                        let tmp = d.rundir.join(".arcstats.tmp");
                        if std::fs::write(&tmp, text).is_ok() {
                            let _ = std::fs::rename(&tmp, d.rundir.join("arcstats"));
                        }
                    }
                    let rss = if trimmed { rss_bytes() } else { rss };
                    // A trim that left the RSS over the budget found it
                    // in use: another at once would free nothing more.
                    if rss + NEAR > budget && rss <= budget {
                        NEAR_CHECK
                    } else {
                        FAR_CHECK
                    }
                };
                std::thread::sleep(pause);
            }
        });
}

const USAGE: &str = "usage: uzfs arcstat [-f field[,field...]] [-v] [-p pool] [interval [count]]\n\
     fields (-v lists them): time pool read hits miss hit% miss% dhit dmis dh% dm% phit pmis\n\
     ph% pm% mhit mmis mh% mm% mru mfu mrug mfug size c p c_min c_max data meta mrusz mfusz\n\
     pfu avail rss limit l2read l2hits l2miss l2hit% l2miss% l2size l2asize l2bytes\n";

const DEFAULT_FIELDS: &[&str] = &[
    "time", "pool", "read", "miss", "miss%", "dmis", "dm%", "pmis", "pm%", "mmis", "mm%", "size",
    "c", "avail",
];

/// (name, what it is) of every column.
const FIELDS: &[(&str, &str)] = &[
    ("time", "time of day"),
    ("pool", "pool name"),
    ("read", "ARC lookups (hits + misses) per interval"),
    ("hits", "ARC hits per interval"),
    ("miss", "ARC misses per interval"),
    ("hit%", "ARC hit percentage"),
    ("miss%", "ARC miss percentage"),
    ("dhit", "demand hits per interval"),
    ("dmis", "demand misses per interval"),
    ("dh%", "demand hit percentage"),
    ("dm%", "demand miss percentage"),
    ("phit", "prefetch hits per interval"),
    ("pmis", "prefetch misses per interval"),
    ("ph%", "prefetch hit percentage"),
    ("pm%", "prefetch miss percentage"),
    ("mhit", "metadata hits per interval"),
    ("mmis", "metadata misses per interval"),
    ("mh%", "metadata hit percentage"),
    ("mm%", "metadata miss percentage"),
    ("mru", "MRU list hits per interval"),
    ("mfu", "MFU list hits per interval"),
    ("mrug", "MRU ghost list hits per interval"),
    ("mfug", "MFU ghost list hits per interval"),
    ("size", "ARC size"),
    ("c", "ARC target size"),
    ("p", "MRU target size"),
    ("c_min", "ARC least target size (arc_min)"),
    ("c_max", "ARC largest target size (arc_max)"),
    ("data", "file data held"),
    ("meta", "metadata held"),
    ("mrusz", "MRU size"),
    ("mfusz", "MFU size"),
    ("pfu", "prefetched blocks not yet read"),
    ("avail", "memory available to the daemon"),
    ("rss", "daemon resident memory"),
    ("limit", "memory cgroup limit (- none)"),
    ("l2read", "L2ARC lookups per interval (after an ARC miss)"),
    ("l2hits", "L2ARC hits per interval"),
    ("l2miss", "L2ARC misses per interval"),
    ("l2hit%", "L2ARC hit percentage"),
    ("l2miss%", "L2ARC miss percentage"),
    ("l2size", "bytes held on cache devices"),
    ("l2asize", "bytes of cache devices used"),
    ("l2bytes", "bytes read from cache devices per interval"),
];

fn pct(part: u64, whole: u64) -> String {
    (part * 100)
        .checked_div(whole)
        .map_or("-".to_string(), |p| p.to_string())
}

/// Column `f` of one row; `d` has the interval's counts (gauges as they
/// are), `r` the snapshot.
fn column(f: &str, r: &ArcSnap, d: &BTreeMap<String, u64>) -> String {
    let g = |k: &str| d.get(k).copied().unwrap_or(0);
    let size = crate::fmt::nicebytes;
    let dh = g("demand_data_hits") + g("demand_metadata_hits");
    let dm = g("demand_data_misses") + g("demand_metadata_misses");
    let ph = g("prefetch_data_hits") + g("prefetch_metadata_hits");
    let pm = g("prefetch_data_misses") + g("prefetch_metadata_misses");
    let mh = g("demand_metadata_hits") + g("prefetch_metadata_hits");
    let mm = g("demand_metadata_misses") + g("prefetch_metadata_misses");
    let (h, m) = (g("hits"), g("misses"));
    let (l2h, l2m) = (g("l2_hits"), g("l2_misses"));
    match f {
        "time" => crate::zilstat::hms_now(),
        "pool" => r.pool.clone(),
        "read" => (h + m).to_string(),
        "hits" => h.to_string(),
        "miss" => m.to_string(),
        "hit%" => pct(h, h + m),
        "miss%" => pct(m, h + m),
        "dhit" => dh.to_string(),
        "dmis" => dm.to_string(),
        "dh%" => pct(dh, dh + dm),
        "dm%" => pct(dm, dh + dm),
        "phit" => ph.to_string(),
        "pmis" => pm.to_string(),
        "ph%" => pct(ph, ph + pm),
        "pm%" => pct(pm, ph + pm),
        "mhit" => mh.to_string(),
        "mmis" => mm.to_string(),
        "mh%" => pct(mh, mh + mm),
        "mm%" => pct(mm, mh + mm),
        "mru" => g("mru_hits").to_string(),
        "mfu" => g("mfu_hits").to_string(),
        "mrug" => g("mru_ghost_hits").to_string(),
        "mfug" => g("mfu_ghost_hits").to_string(),
        "size" => size(g("size")),
        "c" => size(g("c")),
        "p" => size(g("p")),
        "c_min" => size(g("c_min")),
        "c_max" => size(g("c_max")),
        "data" => size(g("data_size")),
        "meta" => size(g("metadata_size")),
        "mrusz" => size(g("mru_size")),
        "mfusz" => size(g("mfu_size")),
        "pfu" => size(g("uzfs_prefetch_unused_size")),
        "avail" => r.avail.map_or("-".to_string(), size),
        "rss" => size(r.rss),
        "limit" => r.limit.map_or("-".to_string(), size),
        "l2read" => (l2h + l2m).to_string(),
        "l2hits" => l2h.to_string(),
        "l2miss" => l2m.to_string(),
        "l2hit%" => pct(l2h, l2h + l2m),
        "l2miss%" => pct(l2m, l2h + l2m),
        "l2size" => size(g("l2_size")),
        "l2asize" => size(g("l2_asize")),
        "l2bytes" => size(g("l2_read_bytes")),
        _ => "-".to_string(),
    }
}

fn width(f: &str) -> usize {
    match f {
        "time" => 8,
        "pool" => 12,
        "read" | "hits" | "miss" | "dhit" | "dmis" | "phit" | "pmis" | "mhit" | "mmis" => 7,
        "l2read" | "l2hits" | "l2miss" | "l2asize" | "l2bytes" => 7,
        _ => 6,
    }
}

fn render(fields: &[String], rows: &[(ArcSnap, BTreeMap<String, u64>)]) -> String {
    let line = |cells: Vec<String>| -> String {
        let mut s = String::new();
        for (i, (f, c)) in fields.iter().zip(cells).enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let w = width(f);
            if f == "time" || f == "pool" {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("{c:>w$}"));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(fields.to_vec());
    for (r, d) in rows {
        out.push_str(&line(fields.iter().map(|f| column(f, r, d)).collect()));
    }
    out
}

/// The figures of `now` as an interval since `prev` shows them: counts as
/// their difference, sizes as they are (no `prev`: totals).
fn interval(prev: Option<&ArcSnap>, now: &ArcSnap) -> BTreeMap<String, u64> {
    now.stats
        .iter()
        .map(|(k, v)| {
            let before = match prev {
                Some(p) if !is_gauge(k) => p.stats.get(k).copied().unwrap_or(0),
                _ => 0,
            };
            (k.clone(), v.saturating_sub(before))
        })
        .collect()
}

/// Client side.
pub fn client(rundir: &Path, args: &[String]) -> i32 {
    let mut fields: Vec<String> = DEFAULT_FIELDS.iter().map(|s| s.to_string()).collect();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-v" => {
                let mut s = String::from("fields:\n");
                for (f, what) in FIELDS {
                    s.push_str(&format!("  {f:<8} {what}\n"));
                }
                crate::out(&s);
                return 0;
            }
            "-f" => {
                let Some(list) = it.next() else {
                    crate::err(USAGE);
                    return 2;
                };
                fields = list.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = fields.iter().find(|f| !FIELDS.iter().any(|(n, _)| n == f)) {
                    crate::err(&format!(
                        "arcstat: unknown field '{bad}' (uzfs arcstat -v lists them)\n"
                    ));
                    return 2;
                }
            }
            _ => rest.push(a.clone()),
        }
    }
    crate::zilstat::stat_client(rundir, &rest, "arcstat", USAGE, |prev, now: &[ArcSnap]| {
        let rows: Vec<_> = now
            .iter()
            .map(|n| {
                let p = prev.and_then(|prev| prev.iter().find(|p| p.pool == n.pool));
                (n.clone(), interval(p, n))
            })
            .collect();
        render(&fields, &rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(hits: u64, misses: u64, size: u64) -> ArcSnap {
        let mut stats: BTreeMap<String, u64> = uzfs_core::arc::ArcStats::default()
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        stats.insert("hits".into(), hits);
        stats.insert("misses".into(), misses);
        stats.insert("demand_data_misses".into(), misses);
        stats.insert("size".into(), size);
        ArcSnap {
            pool: "tank".into(),
            stats,
            rss: 0,
            limit: None,
            avail: Some(1 << 30),
        }
    }

    /// Counts are an interval's differences, sizes are as they are, and
    /// every column the usage names exists.
    #[test]
    fn columns_and_intervals() {
        let (a, b) = (snap(10, 10, 1 << 20), snap(40, 20, 2 << 20));
        let d = interval(Some(&a), &b);
        assert_eq!(column("read", &b, &d), "40");
        assert_eq!(column("miss%", &b, &d), "25");
        assert_eq!(column("dmis", &b, &d), "10");
        assert_eq!(column("size", &b, &d), "2M");
        for (f, _) in FIELDS {
            assert!(USAGE.contains(f), "{f} missing from the usage");
            assert_ne!(column(f, &b, &d), "", "{f}");
        }
        let (mut a, mut b) = (a, b);
        for s in [&mut a, &mut b] {
            s.stats.insert("uzfs_malloc_trims".into(), 7);
        }
        let text = kstat_text(&[a, b]);
        assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("name")));
        let hits = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("hits"))
            .and_then(|l| l.split_whitespace().nth(2));
        assert_eq!(hits, Some("50"), "summed over pools:\n{text}");
        let trims = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("uzfs_malloc_trims"))
            .and_then(|l| l.split_whitespace().nth(2));
        assert_eq!(trims, Some("7"), "the daemon's own, once:\n{text}");
        assert!(text.contains("mfu_ghost_hits") && text.contains("memory_available_bytes"));
    }
}
