//! `uzfs zilstat [-p POOL] [interval [count]]`: the intent log at work, per
//! dataset, like OpenZFS's `zilstat`. The daemon answers `zilstat
//! --snapshot` with its counters (JSON); this side prints the differences
//! between snapshots (or the totals since import without an interval).
//!
//! Columns: `cc` commits (fsync, O_SYNC writes, sync=always changes),
//! `cwc` commits that wrote the log (the rest shared another's write:
//! group commit), `cfc` commits a txg carried instead (first commit of a
//! chain, no log space), `ic` records written, `icb` their bytes in the
//! log, `iic`/`iib` whole data blocks logged by pointer and their bytes
//! (written once as ordinary blocks, which the txg adopts: OpenZFS's
//! `itx_indirect_count`/`_bytes`), `lwb`/`lwbb` log blocks and their bytes, `flush` device
//! flushes, `p50`/`p99` commit latency (upper bound of the histogram
//! bucket, microseconds).

use crate::client::{self, Response};
use crate::daemon::Daemon;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::Ordering;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ZilSnap {
    pub dataset: String,
    pub commits: u64,
    pub writes: u64,
    pub fallbacks: u64,
    pub records: u64,
    pub record_bytes: u64,
    #[serde(default)]
    pub indirect: u64,
    #[serde(default)]
    pub indirect_bytes: u64,
    pub blocks: u64,
    pub block_bytes: u64,
    pub flushes: u64,
    pub latency_us: Vec<u64>,
}

impl ZilSnap {
    fn minus(&self, o: &ZilSnap) -> ZilSnap {
        ZilSnap {
            dataset: self.dataset.clone(),
            commits: self.commits.saturating_sub(o.commits),
            writes: self.writes.saturating_sub(o.writes),
            fallbacks: self.fallbacks.saturating_sub(o.fallbacks),
            records: self.records.saturating_sub(o.records),
            record_bytes: self.record_bytes.saturating_sub(o.record_bytes),
            indirect: self.indirect.saturating_sub(o.indirect),
            indirect_bytes: self.indirect_bytes.saturating_sub(o.indirect_bytes),
            blocks: self.blocks.saturating_sub(o.blocks),
            block_bytes: self.block_bytes.saturating_sub(o.block_bytes),
            flushes: self.flushes.saturating_sub(o.flushes),
            latency_us: self
                .latency_us
                .iter()
                .enumerate()
                .map(|(i, v)| v.saturating_sub(o.latency_us.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// Upper bound (us) of the bucket holding the `q` quantile.
    fn quantile(&self, q: f64) -> Option<u64> {
        let n: u64 = self.latency_us.iter().sum();
        if n == 0 {
            return None;
        }
        let want = ((n as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.latency_us.iter().enumerate() {
            seen += c;
            if seen >= want.max(1) {
                return Some(2u64 << i);
            }
        }
        None
    }
}

/// Daemon side: every dataset's counters.
pub fn snapshot_cmd(d: &Daemon, args: &[String]) -> Response {
    let pools = match crate::zpool::pools_in_args(d, args) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut out = Vec::new();
    for p in pools {
        for ds in p.dsl_pool().datasets() {
            let Some(z) = ds.zil.get() else { continue };
            let s = &z.stats;
            let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            out.push(ZilSnap {
                dataset: p.dsl_pool().ds_name(&ds.rel()),
                commits: ld(&s.commits),
                writes: ld(&s.writes),
                fallbacks: ld(&s.fallbacks),
                records: ld(&s.records),
                record_bytes: ld(&s.record_bytes),
                indirect: ld(&s.indirect),
                indirect_bytes: ld(&s.indirect_bytes),
                blocks: ld(&s.blocks),
                block_bytes: ld(&s.block_bytes),
                flushes: ld(&s.flushes),
                latency_us: s.latency_us.iter().map(ld).collect(),
            });
        }
    }
    out.sort_by(|a, b| a.dataset.cmp(&b.dataset));
    match serde_json::to_string(&out) {
        Ok(j) => Response::ok(j),
        Err(e) => Response::err(1, format!("zilstat: {e}")),
    }
}

const USAGE: &str = "usage: uzfs zilstat [-p pool] [interval [count]]\n";

fn size(n: u64) -> String {
    crate::fmt::nicebytes(n)
}

fn render(rows: &[ZilSnap]) -> String {
    let mut s = format!(
        "{:<8} {:<24} {:>6} {:>6} {:>5} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>7}\n",
        "time",
        "dataset",
        "cc",
        "cwc",
        "cfc",
        "ic",
        "icb",
        "iic",
        "iib",
        "lwb",
        "lwbb",
        "flush",
        "p50us",
        "p99us"
    );
    let now = hms_now();
    for r in rows {
        let q = |x: Option<u64>| x.map_or("-".to_string(), |v| v.to_string());
        s.push_str(&format!(
            "{:<8} {:<24} {:>6} {:>6} {:>5} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>7}\n",
            now,
            r.dataset,
            r.commits,
            r.writes,
            r.fallbacks,
            r.records,
            size(r.record_bytes),
            r.indirect,
            size(r.indirect_bytes),
            r.blocks,
            size(r.block_bytes),
            r.flushes,
            q(r.quantile(0.5)),
            q(r.quantile(0.99)),
        ));
    }
    s
}

/// HH:MM:SS (UTC) without a date crate.
pub fn hms_now() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{:02}:{:02}:{:02}", (t / 3600) % 24, (t / 60) % 60, t % 60)
}

/// The client side of a `*stat` command (`name [-p pool] [interval
/// [count]]`): one `name --snapshot` request to the daemon per print;
/// `print(prev, now)` renders the totals (`prev` none) or an interval's
/// differences.
pub fn stat_client<T: serde::de::DeserializeOwned>(
    rundir: &Path,
    args: &[String],
    name: &str,
    usage: &str,
    print: impl Fn(Option<&[T]>, &[T]) -> String,
) -> i32 {
    let mut pools = Vec::new();
    let mut nums = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" | "-?" => {
                crate::out(usage);
                return 0;
            }
            "-p" => match it.next() {
                Some(p) => pools.push(p.clone()),
                None => {
                    crate::err(usage);
                    return 2;
                }
            },
            n => match n.parse::<u64>() {
                Ok(v) if v > 0 || !nums.is_empty() => nums.push(v),
                _ => {
                    crate::err(&format!("{name}: bad argument '{n}'\n{usage}"));
                    return 2;
                }
            },
        }
    }
    if nums.len() > 2 {
        crate::err(usage);
        return 2;
    }
    let (interval, count) = (nums.first().copied(), nums.get(1).copied());
    let fetch = || -> Result<Vec<T>, i32> {
        let mut argv = vec![name.to_string(), "--snapshot".into()];
        argv.extend(pools.iter().cloned());
        let r = client::call(rundir, argv);
        if r.code != 0 {
            crate::err(&r.stderr);
            return Err(r.code);
        }
        serde_json::from_str(&r.stdout).map_err(|e| {
            crate::err(&format!("{name}: bad reply from the daemon: {e}\n"));
            1
        })
    };
    let mut prev = match fetch() {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(iv) = interval else {
        crate::out(&print(None, &prev));
        return 0;
    };
    let mut printed = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_secs(iv));
        let now = match fetch() {
            Ok(s) => s,
            Err(c) => return c,
        };
        crate::out(&print(Some(&prev), &now));
        prev = now;
        printed += 1;
        if count.is_some_and(|c| printed >= c) {
            return 0;
        }
    }
}

/// Client side.
pub fn client(rundir: &Path, args: &[String]) -> i32 {
    stat_client(rundir, args, "zilstat", USAGE, |prev, now: &[ZilSnap]| {
        let rows: Vec<ZilSnap> = match prev {
            None => now.to_vec(),
            Some(prev) => now
                .iter()
                .map(|n| match prev.iter().find(|p| p.dataset == n.dataset) {
                    Some(p) => n.minus(p),
                    None => n.clone(),
                })
                .collect(),
        };
        render(&rows)
    })
}
