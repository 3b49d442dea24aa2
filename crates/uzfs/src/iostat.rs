//! `zpool iostat [-v] [-l] [-q] [-w] [-Hp] [pool...] [interval [count]]`.
//!
//! The daemon answers `zpool iostat --snapshot POOL...` with the raw
//! counters of every pool, vdev and leaf (JSON); the client takes snapshots
//! `interval` seconds apart and prints rates over each interval, the first
//! report covering the time since import, as zpool-iostat(8) does. Latency
//! is measured around each device I/O (disk_wait) and around its admission
//! by the leaf's queue, per priority class (`vdev/queue.rs`): syncq_wait
//! (sync reads and writes), asyncq_wait (read-ahead, txg writes) and scrub
//! (scrub and resilver); total_wait is the two together. There is no trim
//! ("-"). `-q` shows each class's queue at the moment of the report: I/Os
//! waiting to be admitted (pend) and in flight (activ), summed over the
//! leaves below a vdev; scrubq_read is every scan's (scrub and both
//! resilvers), trimq_write and rebuildq_write are always 0 (no trim, and a
//! sequential resilver's reads are in scrubq_read).

use crate::client::{self, Response};
use crate::daemon::Daemon;
use crate::fmt::nicenum;
use crate::zpool::{getopt, has, pools_or_all, usage_err};
use serde::{Deserialize, Serialize};
use std::path::Path;
use uzfs_core::vdev::leaf::LAT_BUCKETS;
use uzfs_core::vdev::{Leaf, TopKind, VdevStats};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ns: u64,
    pub write_ns: u64,
    pub read_hist: Vec<u64>,
    pub write_hist: Vec<u64>,
    /// Admissions by the leaf's queue and the time they waited, per class
    /// (`IoClass` order: sync read, sync write, async read, async write,
    /// scan).
    #[serde(default)]
    pub queue_ops: Vec<u64>,
    #[serde(default)]
    pub queue_ns: Vec<u64>,
    /// Queue depths when the snapshot was taken, per class: waiting to be
    /// admitted, and in flight (gauges, not counters).
    #[serde(default)]
    pub queue_pend: Vec<u64>,
    #[serde(default)]
    pub queue_activ: Vec<u64>,
}

impl Counters {
    fn of(l: &Leaf) -> Self {
        let s = &l.stats;
        Counters {
            reads: VdevStats::get(&s.reads),
            writes: VdevStats::get(&s.writes),
            bytes_read: VdevStats::get(&s.bytes_read),
            bytes_written: VdevStats::get(&s.bytes_written),
            read_ns: VdevStats::get(&s.read_ns),
            write_ns: VdevStats::get(&s.write_ns),
            read_hist: s.read_hist.iter().map(VdevStats::get).collect(),
            write_hist: s.write_hist.iter().map(VdevStats::get).collect(),
            queue_ops: l.queue.admitted().to_vec(),
            queue_ns: l.queue.wait_ns().to_vec(),
            queue_pend: l.queue.waiting().iter().map(|&n| u64::from(n)).collect(),
            queue_activ: l.queue.active().iter().map(|&n| u64::from(n)).collect(),
        }
    }

    fn add(&mut self, o: &Counters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.read_ns += o.read_ns;
        self.write_ns += o.write_ns;
        for (h, oh, min) in [
            (&mut self.read_hist, &o.read_hist, LAT_BUCKETS),
            (&mut self.write_hist, &o.write_hist, LAT_BUCKETS),
            (&mut self.queue_ops, &o.queue_ops, 0),
            (&mut self.queue_ns, &o.queue_ns, 0),
            (&mut self.queue_pend, &o.queue_pend, 0),
            (&mut self.queue_activ, &o.queue_activ, 0),
        ] {
            h.resize(min.max(h.len()).max(oh.len()), 0);
            for (a, b) in h.iter_mut().zip(oh) {
                *a += b;
            }
        }
    }

    fn minus(&self, o: &Counters) -> Counters {
        let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
            a.iter()
                .enumerate()
                .map(|(i, x)| x.saturating_sub(b.get(i).copied().unwrap_or(0)))
                .collect()
        };
        Counters {
            reads: self.reads.saturating_sub(o.reads),
            writes: self.writes.saturating_sub(o.writes),
            bytes_read: self.bytes_read.saturating_sub(o.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(o.bytes_written),
            read_ns: self.read_ns.saturating_sub(o.read_ns),
            write_ns: self.write_ns.saturating_sub(o.write_ns),
            read_hist: sub(&self.read_hist, &o.read_hist),
            write_hist: sub(&self.write_hist, &o.write_hist),
            queue_ops: sub(&self.queue_ops, &o.queue_ops),
            queue_ns: sub(&self.queue_ns, &o.queue_ns),
            // Depths are as of now, whatever they were before.
            queue_pend: self.queue_pend.clone(),
            queue_activ: self.queue_activ.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Node {
    pub name: String,
    pub depth: usize,
    /// Capacity columns (pool and top-level vdevs only).
    pub space: Option<(u64, u64)>,
    pub c: Counters,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PoolSnap {
    pub name: String,
    /// Seconds since the pool was imported or created.
    pub age: f64,
    pub nodes: Vec<Node>,
}

/// Daemon side: counters of the named (or all) pools.
pub fn snapshot_cmd(d: &Daemon, args: &[String]) -> Response {
    let names: Vec<String> = args
        .iter()
        .filter(|a| *a != "--snapshot" && !a.starts_with('-'))
        .cloned()
        .collect();
    let pools = match pools_or_all(d, &names) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut snaps = Vec::new();
    for p in pools {
        let (_, alloc, free) = p.space();
        let per_vdev = p.vdev_space();
        let mut nodes = vec![Node {
            name: p.name.clone(),
            depth: 0,
            space: Some((alloc, free)),
            c: Counters::default(),
        }];
        let mut total = Counters::default();
        // Data vdevs, then the separate log devices under "logs".
        let (order, first_log) = p.tops_data_then_logs();
        for (k, (i, t)) in order.iter().enumerate() {
            let i = *i;
            if k == first_log {
                nodes.push(Node {
                    name: "logs".into(),
                    depth: 0,
                    space: None,
                    c: Counters::default(),
                });
            }
            let leaves = t.leaves();
            let mut tc = Counters::default();
            let kids: Vec<Node> = leaves
                .iter()
                .map(|l| {
                    let c = Counters::of(l);
                    tc.add(&c);
                    Node {
                        name: l.path.clone(),
                        depth: 2,
                        space: None,
                        c,
                    }
                })
                .collect();
            total.add(&tc);
            if t.kind == TopKind::Disk && kids.len() == 1 {
                let mut n = kids.into_iter().next().unwrap_or_else(|| Node {
                    name: t.name(),
                    depth: 1,
                    space: None,
                    c: Counters::default(),
                });
                n.depth = 1;
                n.space = per_vdev.get(i).copied();
                nodes.push(n);
            } else {
                nodes.push(Node {
                    name: t.name(),
                    depth: 1,
                    space: per_vdev.get(i).copied(),
                    c: tc,
                });
                nodes.extend(kids);
            }
        }
        // Cache devices under "cache": what each holds and its room; their
        // I/O is not the pool's (OpenZFS's pool line leaves it out too).
        let caches = p.io.cache.l2_devices();
        if !caches.is_empty() {
            nodes.push(Node {
                name: "cache".into(),
                depth: 0,
                space: None,
                c: Counters::default(),
            });
            for d in caches {
                let held = d.stats().size;
                nodes.push(Node {
                    name: d.leaf.path.clone(),
                    depth: 1,
                    space: Some((held, d.capacity().saturating_sub(held))),
                    c: Counters::of(&d.leaf),
                });
            }
        }
        nodes[0].c = total;
        snaps.push(PoolSnap {
            name: p.name.clone(),
            age: p.opened.elapsed().as_secs_f64(),
            nodes,
        });
    }
    match serde_json::to_string(&snaps) {
        Ok(s) => Response::ok(s),
        Err(e) => Response::err(1, e.to_string()),
    }
}

pub struct Opts {
    pub verbose: bool,
    pub latency: bool,
    pub queues: bool,
    pub histo: bool,
    pub scripted: bool,
    pub parsable: bool,
}

/// Human time as zfs_nicenum(ZFS_NICENUM_TIME): the largest unit with a
/// value of at least 1, floored, no decimals: 512ns, 23us, 1ms, 2s.
pub fn nicetime(ns: u64) -> String {
    for (u, d) in [("s", 1_000_000_000u64), ("ms", 1_000_000), ("us", 1_000)] {
        if ns >= d {
            return format!("{}{u}", ns / d);
        }
    }
    format!("{ns}ns")
}

/// Row label of histogram bucket `i`: its upper bound, 2^(i+1)-1 ns, as
/// `nicetime`: 1ns, 3ns, ... 1us, 2us, ... 137s.
pub fn bucket_label(i: usize) -> String {
    nicetime((1u64 << (i + 1)) - 1)
}

fn center(s: &str, w: usize) -> String {
    let extra = w.saturating_sub(s.len());
    let left = extra.div_ceil(2);
    format!("{}{s}{}", " ".repeat(left), " ".repeat(extra - left))
}

fn num(v: u64, o: &Opts) -> String {
    if o.parsable {
        v.to_string()
    } else {
        nicenum(v)
    }
}

/// Render one report: `cur - prev` over `secs` seconds.
pub fn render(cur: &[PoolSnap], prev: Option<&[PoolSnap]>, o: &Opts) -> String {
    let mut out = String::new();
    let namew = cur
        .iter()
        .flat_map(|p| {
            p.nodes
                .iter()
                .filter(|n| o.verbose || n.depth == 0)
                .map(|n| n.name.len() + n.depth * 2)
        })
        .max()
        .unwrap_or(0)
        .max(10);
    if o.histo {
        for p in cur {
            let before = prev.and_then(|ps| ps.iter().find(|x| x.name == p.name));
            for (k, n) in p.nodes.iter().enumerate() {
                if !o.verbose && n.depth > 0 {
                    continue;
                }
                let d = delta(n, before, k);
                out.push_str(&histogram(&n.name, &d, o));
            }
        }
        return out;
    }
    let mut groups: Vec<(&str, usize)> = vec![("capacity", 2), ("operations", 2), ("bandwidth", 2)];
    if o.latency {
        groups.extend([
            ("total_wait", 2),
            ("disk_wait", 2),
            ("syncq_wait", 2),
            ("asyncq_wait", 2),
            ("scrub", 1),
            ("trim", 1),
        ]);
    }
    const QUEUES: [&str; 7] = [
        "syncq_read",
        "syncq_write",
        "asyncq_read",
        "asyncq_write",
        "scrubq_read",
        "trimq_write",
        "rebuildq_write",
    ];
    if o.queues {
        groups.extend(QUEUES.iter().map(|g| (*g, 2)));
    }
    let mut sub: Vec<&str> = vec!["alloc", "free", "read", "write", "read", "write"];
    if o.latency {
        sub.extend([
            "read", "write", "read", "write", "read", "write", "read", "write", "wait", "wait",
        ]);
    }
    if o.queues {
        for _ in QUEUES {
            sub.extend(["pend", "activ"]);
        }
    }
    if !o.scripted {
        let mut l1 = " ".repeat(namew);
        for (g, n) in &groups {
            l1.push_str("  ");
            l1.push_str(&center(g, n * 5 + (n - 1) * 2));
        }
        out.push_str(l1.trim_end());
        out.push('\n');
        let mut l2 = format!("{:<namew$}", "pool");
        for s in &sub {
            l2.push_str(&format!("  {s:>5}"));
        }
        out.push_str(&l2);
        out.push('\n');
        out.push_str(&dashes(namew, sub.len()));
    }
    for p in cur {
        let before = prev.and_then(|ps| ps.iter().find(|x| x.name == p.name));
        let secs = match before {
            Some(b) => (p.age - b.age).max(0.001),
            None => p.age.max(0.001),
        };
        for (k, n) in p.nodes.iter().enumerate() {
            if !o.verbose && n.depth > 0 {
                continue;
            }
            let d = delta(n, before, k);
            let rate = |v: u64| num((v as f64 / secs).round() as u64, o);
            let mut cols = vec![format!("{}{}", "  ".repeat(n.depth), n.name)];
            match n.space {
                Some((a, f)) => {
                    cols.push(num(a, o));
                    cols.push(num(f, o));
                }
                None => {
                    cols.push("-".into());
                    cols.push("-".into());
                }
            }
            cols.push(rate(d.reads));
            cols.push(rate(d.writes));
            cols.push(rate(d.bytes_read));
            cols.push(rate(d.bytes_written));
            if o.latency {
                let avg = |ns: u64, ops: u64| {
                    if ops == 0 {
                        "-".to_string()
                    } else if o.parsable {
                        (ns / ops).to_string()
                    } else {
                        nicetime(ns / ops)
                    }
                };
                use uzfs_core::vdev::queue::IoClass as C;
                let q = |c: C| {
                    let i = c as usize;
                    (
                        d.queue_ns.get(i).copied().unwrap_or(0),
                        d.queue_ops.get(i).copied().unwrap_or(0),
                    )
                };
                // Queue waits of reads and writes, for total_wait (a scan's
                // admissions are mostly reads).
                let (rq, wq) = (
                    q(C::SyncRead).0 + q(C::AsyncRead).0 + q(C::Scan).0,
                    q(C::SyncWrite).0 + q(C::AsyncWrite).0,
                );
                cols.push(avg(d.read_ns + rq, d.reads));
                cols.push(avg(d.write_ns + wq, d.writes));
                cols.push(avg(d.read_ns, d.reads));
                cols.push(avg(d.write_ns, d.writes));
                // syncq, asyncq (read, write each), scrub: IoClass's order.
                for c in C::ALL {
                    let (ns, ops) = q(c);
                    cols.push(avg(ns, ops));
                }
                cols.push("-".to_string());
            }
            if o.queues {
                // IoClass's order is the first five groups'; then trim
                // and rebuild, which have no queue here.
                for i in 0..QUEUES.len() {
                    for v in [&d.queue_pend, &d.queue_activ] {
                        cols.push(num(v.get(i).copied().unwrap_or(0), o));
                    }
                }
            }
            out.push_str(&row(&cols, namew, o.scripted));
        }
        if o.verbose && !o.scripted {
            out.push_str(&dashes(namew, sub.len()));
        }
    }
    out
}

/// Counters of node `k` over the interval since `before` (all of them on
/// the first report, or if the tree changed).
fn delta(n: &Node, before: Option<&PoolSnap>, k: usize) -> Counters {
    match before.and_then(|b| b.nodes.get(k)) {
        Some(bn) if bn.name == n.name => n.c.minus(&bn.c),
        _ => n.c.clone(),
    }
}

/// One output line: the name padded to `namew`, then 5-wide right-aligned
/// columns two spaces apart; tab-separated when scripted (`-H`).
fn row(cols: &[String], namew: usize, scripted: bool) -> String {
    if scripted {
        return cols.join("\t") + "\n";
    }
    let mut line = format!("{:<namew$}", cols[0]);
    for c in &cols[1..] {
        line.push_str(&format!("  {c:>5}"));
    }
    line + "\n"
}

fn dashes(namew: usize, ncols: usize) -> String {
    let mut l = "-".repeat(namew);
    for _ in 0..ncols {
        l.push_str("  -----");
    }
    l.push('\n');
    l
}

fn histogram(name: &str, c: &Counters, o: &Opts) -> String {
    let namew = name.len().max(10);
    let mut out = String::new();
    if !o.scripted {
        let mut l1 = format!("{name:<namew$}");
        for g in ["total_wait", "disk_wait", "syncq_wait", "asyncq_wait"] {
            l1.push_str("  ");
            l1.push_str(&center(g, 12));
        }
        out.push_str(l1.trim_end());
        out.push('\n');
        let mut l2 = format!("{:<namew$}", "latency");
        for s in [
            "read", "write", "read", "write", "read", "write", "read", "write", "scrub", "trim",
        ] {
            l2.push_str(&format!("  {s:>5}"));
        }
        out.push_str(&l2);
        out.push('\n');
        out.push_str(&dashes(namew, 10));
    }
    for i in 0..LAT_BUCKETS {
        let r = c.read_hist.get(i).copied().unwrap_or(0);
        let w = c.write_hist.get(i).copied().unwrap_or(0);
        let mut cols = vec![bucket_label(i), num(r, o), num(w, o), num(r, o), num(w, o)];
        cols.extend(std::iter::repeat_n("0".to_string(), 6));
        out.push_str(&row(&cols, namew, o.scripted));
    }
    if !o.scripted {
        out.push_str(&"-".repeat(namew + 10 * 7));
        out.push('\n');
    }
    out
}

/// `-L`: device names that are symbolic links shown as what they point to.
fn resolve_links(snap: &mut [PoolSnap]) {
    for p in snap.iter_mut() {
        for v in p.nodes.iter_mut() {
            if v.name.starts_with('/') {
                if let Ok(r) = std::fs::canonicalize(&v.name) {
                    v.name = r.display().to_string();
                }
            }
        }
    }
}

/// Client side: fetch snapshots, print reports.
pub fn client(rundir: &Path, args: &[String]) -> i32 {
    let (o, rest) = match getopt(args, "c:!g!HlLnpPqr!T:vwy") {
        Ok(x) => x,
        Err(e) => {
            let r = usage_err(&e);
            crate::err(&r.stderr);
            return 2;
        }
    };
    let opts = Opts {
        verbose: has(&o, 'v'),
        latency: has(&o, 'l'),
        queues: has(&o, 'q'),
        histo: has(&o, 'w'),
        scripted: has(&o, 'H'),
        parsable: has(&o, 'p'),
    };
    // Trailing numbers are interval and count.
    let mut pools: Vec<String> = rest.clone();
    let mut nums = Vec::new();
    while let Some(last) = pools.last() {
        match last.parse::<f64>() {
            Ok(v) if nums.len() < 2 && v > 0.0 => {
                nums.insert(0, v);
                pools.pop();
            }
            _ => break,
        }
    }
    let interval = nums.first().copied();
    let count = nums.get(1).map(|c| *c as u64);
    if let Err(r) = crate::status::timestamp(&o) {
        crate::err(&r.stderr);
        return 2;
    }
    // -P: full paths are what uzfs prints anyway; -L: links resolved.
    let resolve = has(&o, 'L');
    let skip_first = has(&o, 'y');
    let mut prev: Option<Vec<PoolSnap>> = None;
    let mut printed = 0u64;
    loop {
        let mut argv = vec!["zpool".to_string(), "iostat".into(), "--snapshot".into()];
        argv.extend(pools.iter().cloned());
        let r = client::call(rundir, argv);
        if r.code != 0 {
            crate::err(&r.stderr);
            return r.code;
        }
        let mut snap: Vec<PoolSnap> = match serde_json::from_str(&r.stdout) {
            Ok(s) => s,
            Err(e) => {
                crate::err(&format!("zpool iostat: bad reply from the daemon: {e}\n"));
                return 1;
            }
        };
        if snap.is_empty() {
            crate::out("no pools available\n");
            return 0;
        }
        if resolve {
            resolve_links(&mut snap);
        }
        if !(skip_first && prev.is_none() && interval.is_some()) {
            if let Ok(t) = crate::status::timestamp(&o) {
                crate::out(&t);
            }
            let report = render(&snap, prev.as_deref(), &opts);
            // -n: the headers once, not before every report.
            let skip = if has(&o, 'n') && printed > 0 && !opts.scripted {
                report.lines().take_while(|l| !l.starts_with("---")).count() + 1
            } else {
                0
            };
            let body: String = report
                .lines()
                .skip(skip)
                .map(|l| format!("{l}\n"))
                .collect();
            crate::out(&body);
            printed += 1;
        }
        let Some(iv) = interval else { return 0 };
        if count.is_some_and(|c| printed >= c) {
            return 0;
        }
        prev = Some(snap);
        std::thread::sleep(std::time::Duration::from_secs_f64(iv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(age: f64, reads: u64, bytes: u64) -> Vec<PoolSnap> {
        let c = Counters {
            reads,
            writes: reads * 2,
            bytes_read: bytes,
            bytes_written: bytes * 2,
            read_ns: reads * 250_000,
            write_ns: reads * 2 * 1_500_000,
            read_hist: vec![0; LAT_BUCKETS],
            write_hist: vec![0; LAT_BUCKETS],
            // Sync reads waited 50 us in the queue, txg writes 500 us.
            queue_ops: vec![reads, 0, 0, reads * 2, 0],
            queue_ns: vec![reads * 50_000, 0, 0, reads * 2 * 500_000, 0],
            queue_pend: vec![0, 0, 0, 3, 12],
            queue_activ: vec![1, 0, 0, 10, 1],
        };
        let mut half = c.clone();
        half.reads /= 2;
        half.writes /= 2;
        half.bytes_read /= 2;
        half.bytes_written /= 2;
        half.read_ns /= 2;
        half.write_ns /= 2;
        vec![PoolSnap {
            name: "tank".into(),
            age,
            nodes: vec![
                Node {
                    name: "tank".into(),
                    depth: 0,
                    space: Some((408 << 10, 9_500 << 20)),
                    c: c.clone(),
                },
                Node {
                    name: "mirror-0".into(),
                    depth: 1,
                    space: Some((408 << 10, 9_500 << 20)),
                    c: c.clone(),
                },
                Node {
                    name: "sda".into(),
                    depth: 2,
                    space: None,
                    c: half.clone(),
                },
                Node {
                    name: "sdb".into(),
                    depth: 2,
                    space: None,
                    c: half,
                },
            ],
        }]
    }

    fn opts(v: bool, l: bool) -> Opts {
        Opts {
            verbose: v,
            latency: l,
            queues: false,
            histo: false,
            scripted: false,
            parsable: false,
        }
    }

    #[test]
    fn golden_default_layout() {
        let s = snap(10.0, 100, 10 << 20);
        let got = render(&s, None, &opts(false, false));
        let want = "              capacity     operations     bandwidth
pool        alloc   free   read  write   read  write
----------  -----  -----  -----  -----  -----  -----
tank         408K  9.28G     10     20     1M     2M
";
        assert_eq!(got, want);
    }

    #[test]
    fn golden_verbose_layout_and_intervals() {
        let a = snap(10.0, 100, 10 << 20);
        let b = snap(12.0, 300, 30 << 20);
        let got = render(&b, Some(&a), &opts(true, false));
        let want = "              capacity     operations     bandwidth
pool        alloc   free   read  write   read  write
----------  -----  -----  -----  -----  -----  -----
tank         408K  9.28G    100    200    10M    20M
  mirror-0   408K  9.28G    100    200    10M    20M
    sda         -      -     50    100     5M    10M
    sdb         -      -     50    100     5M    10M
----------  -----  -----  -----  -----  -----  -----
";
        assert_eq!(got, want);
    }

    #[test]
    fn golden_latency_layout() {
        let s = snap(10.0, 100, 10 << 20);
        let got = render(&s, None, &opts(false, true));
        let want = "              capacity     operations     bandwidth    total_wait     disk_wait    syncq_wait    asyncq_wait  scrub   trim
pool        alloc   free   read  write   read  write   read  write   read  write   read  write   read  write   wait   wait
----------  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----
tank         408K  9.28G     10     20     1M     2M  300us    2ms  250us    1ms   50us      -      -  500us      -      -
";
        assert_eq!(got, want);
    }

    /// `-q`: the depths at the report, never a difference of two
    /// snapshots; OpenZFS's group names.
    #[test]
    fn golden_queue_layout() {
        let a = snap(10.0, 100, 10 << 20);
        let mut b = snap(12.0, 300, 30 << 20);
        b[0].nodes[0].c.queue_pend = vec![0, 2, 0, 0, 7];
        let mut o = opts(false, false);
        o.queues = true;
        let got = render(&b, Some(&a), &o);
        let want = "              capacity     operations     bandwidth    syncq_read    syncq_write   asyncq_read  asyncq_write   scrubq_read   trimq_write  rebuildq_write
pool        alloc   free   read  write   read  write   pend  activ   pend  activ   pend  activ   pend  activ   pend  activ   pend  activ   pend  activ
----------  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----  -----
tank         408K  9.28G    100    200    10M    20M      0      1      2      0      0      0      0     10      7      1      0      0      0      0
";
        assert_eq!(got, want);
    }

    #[test]
    fn histogram_labels_match_zfs() {
        let labels: Vec<String> = (0..LAT_BUCKETS).map(bucket_label).collect();
        assert_eq!(&labels[..4], ["1ns", "3ns", "7ns", "15ns"]);
        assert_eq!(labels[9], "1us");
        assert_eq!(labels[15], "65us");
        assert_eq!(labels[19], "1ms");
        assert_eq!(labels[24], "33ms");
        assert_eq!(labels[29], "1s");
        assert_eq!(labels[36], "137s");
    }
}
