//! `zpool status`: pool health, what to do about it, the scan line and the
//! device tree, laid out as OpenZFS prints them (zpool-status(8)).

use crate::client::Response;
use crate::daemon::Daemon;
use crate::zpool::{getopt, has, pools_or_all, usage_err};
use std::sync::Arc;
use uzfs_core::spa::config::FailMode;
use uzfs_core::spa::scan::{ScanFunc, ScanPhys, ScanState};
use uzfs_core::spa::Pool;
use uzfs_core::vdev::{AttachKind, Leaf, LeafState, TopVdev, VdevStats};

/// State of one leaf as `zpool status` names it.
pub fn leaf_state(l: &Leaf) -> &'static str {
    if l.is_missing() {
        return "UNAVAIL";
    }
    match l.state() {
        LeafState::Online => "ONLINE",
        LeafState::Offline => "OFFLINE",
        LeafState::Faulted => "FAULTED",
        LeafState::Removed => "REMOVED",
    }
}

pub fn pool_health(p: &Pool) -> &'static str {
    if p.suspended().is_some() {
        return "SUSPENDED";
    }
    let tops = p.io.tops();
    let logs = p.log_vdevs();
    // A log device lost costs latency, not data: the pool is DEGRADED.
    if tops
        .iter()
        .any(|t| !t.is_functional() && !logs.contains(&t.id))
    {
        return "UNAVAIL";
    }
    if tops.iter().any(|t| t.health() != "ONLINE") {
        return "DEGRADED";
    }
    "ONLINE"
}

/// "Sun Nov 22 06:30:00 2026" in local time, as ctime(3).
pub fn ctime(secs: u64) -> String {
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, strftime only into `buf`
    // (bounded by its length); both get valid pointers to owned memory.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return secs.to_string();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// HH:MM:SS, or "D days HH:MM:SS" past a day, as zpool status.
pub fn hms(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d} days {h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// Sizes in the scan paragraph: exact with `zpool status -p`.
fn nicebytes(n: u64) -> String {
    if SHOW.get().parsable {
        n.to_string()
    } else {
        crate::fmt::nicebytes(n)
    }
}

/// The "  scan:" paragraph of a scan whose thread stopped on an error
/// (a suspension): neither finished nor making progress.
fn stopped_scan_line(s: &ScanPhys, why: &str, at: u64) -> String {
    let what = s.func.name();
    let total = s.to_examine.max(s.examined).max(1);
    format!(
        "  scan: {what} stopped on {}: {why}
	{what} started on {}
	{} / {} scanned, {} / {} issued, {:.2}% done
	it goes on after 'zpool clear' resumes the pool, or at the next import
",
        ctime(at),
        ctime(s.start_time),
        nicebytes(s.examined),
        nicebytes(total),
        nicebytes(s.issued),
        nicebytes(total),
        s.issued as f64 * 100.0 / total as f64,
    )
}

/// The "  scan:" paragraph.
pub fn scan_line(s: &ScanPhys, rate: Option<f64>, now: u64) -> String {
    let what = s.func.name();
    let total = s.to_examine.max(s.examined).max(1);
    match s.state {
        ScanState::Finished => {
            let took = hms(s.end_time.saturating_sub(s.start_time));
            match s.func {
                ScanFunc::Scrub => format!(
                    "  scan: scrub repaired {} in {took} with {} errors on {}\n",
                    nicebytes(s.repaired),
                    s.errors,
                    ctime(s.end_time)
                ),
                ScanFunc::Resilver => format!(
                    "  scan: resilvered {} in {took} with {} errors on {}\n",
                    nicebytes(s.repaired),
                    s.errors,
                    ctime(s.end_time)
                ),
            }
        }
        ScanState::Canceled => format!("  scan: {what} canceled on {}\n", ctime(s.end_time)),
        ScanState::Scanning => {
            let pct = s.issued as f64 * 100.0 / total as f64;
            let done_word = if s.func == ScanFunc::Scrub {
                "repaired"
            } else {
                "resilvered"
            };
            if s.paused {
                return format!(
                    "  scan: {what} paused since {}\n\t{what} started on {}\n\t{} / {} scanned, {} / {} issued\n\t{} {done_word}, {pct:.2}% done\n",
                    ctime(s.pause_time),
                    ctime(s.start_time),
                    nicebytes(s.examined),
                    nicebytes(total),
                    nicebytes(s.issued),
                    nicebytes(total),
                    nicebytes(s.repaired),
                );
            }
            let elapsed = now.saturating_sub(s.start_time).max(1);
            let scan_rate = s.examined / elapsed;
            let rate = rate.unwrap_or(s.issued as f64 / elapsed as f64);
            let eta = if rate >= 1.0 {
                hms((total.saturating_sub(s.issued) as f64 / rate) as u64)
            } else {
                "no estimated completion time".into()
            };
            let eta = if rate >= 1.0 {
                format!("{eta} to go")
            } else {
                eta
            };
            format!(
                "  scan: {what} in progress since {}\n\t{} / {} scanned at {}/s, {} / {} issued at {}/s\n\t{} {done_word}, {pct:.2}% done, {eta}\n",
                ctime(s.start_time),
                nicebytes(s.examined),
                nicebytes(total),
                nicebytes(scan_rate),
                nicebytes(s.issued),
                nicebytes(total),
                nicebytes(rate as u64),
                nicebytes(s.repaired),
            )
        }
    }
}

fn counts(l: &Leaf) -> [String; 3] {
    [
        VdevStats::get(&l.stats.read_errors).to_string(),
        VdevStats::get(&l.stats.write_errors).to_string(),
        VdevStats::get(&l.stats.cksum_errors).to_string(),
    ]
}

/// How `zpool status` (and `list -v`) name devices: `-g` by guid, `-L`
/// with symbolic links resolved, else by path as configured (always the
/// full path: `-P` is what uzfs does anyway).
#[derive(Clone, Copy, Default)]
pub struct Naming {
    pub guid: bool,
    pub resolve: bool,
}

impl Naming {
    pub fn leaf(&self, l: &Leaf) -> String {
        if self.guid {
            return l.guid.to_string();
        }
        if self.resolve {
            if let Ok(p) = std::fs::canonicalize(&l.path) {
                return p.display().to_string();
            }
        }
        l.path.clone()
    }

    pub fn top(&self, t: &TopVdev) -> String {
        if self.guid {
            return t.guid.to_string();
        }
        match t.children.first() {
            Some(c) if t.kind == uzfs_core::vdev::TopKind::Disk => self.leaf(c),
            _ => t.name(),
        }
    }
}

thread_local! {
    /// The options of the report being rendered.
    static SHOW: std::cell::Cell<Show> = const { std::cell::Cell::new(Show::DEFAULT) };
}

fn leaf_row(l: &Leaf, indent: usize, resilvering: bool) -> Vec<String> {
    let [r, w, c] = counts(l);
    let show = SHOW.get();
    let mut note = if l.is_missing() {
        "cannot open".to_string()
    } else if l.state() == LeafState::Faulted {
        "too many errors".to_string()
    } else if resilvering && l.is_usable() && !l.dtl().is_empty() {
        "(resilvering)".to_string()
    } else {
        String::new()
    };
    // uzfs has neither `zpool initialize` nor TRIM: each leaf is what
    // OpenZFS calls a device never initialized and one without TRIM.
    for (on, what) in [
        (show.initialize, "(uninitialized)"),
        (show.trim, "(trim unsupported)"),
    ] {
        if on {
            if !note.is_empty() {
                note.push(' ');
            }
            note.push_str(what);
        }
    }
    let mut row = vec![
        format!("{}{}", " ".repeat(indent), show.naming.leaf(l)),
        leaf_state(l).into(),
        r,
        w,
        c,
    ];
    if show.slow {
        row.push(VdevStats::get(&l.stats.slow_ios).to_string());
    }
    row.push(note);
    row
}

fn zero_row(name: String, state: &str) -> Vec<String> {
    let zeros = if SHOW.get().slow { 4 } else { 3 };
    std::iter::once(name)
        .chain(std::iter::once(state.to_string()))
        .chain(std::iter::repeat_n("0".to_string(), zeros))
        .chain(std::iter::once(String::new()))
        .collect()
}

/// Rows for one column of a top-level vdev (a leaf, or a replacing/spare
/// group of leaves) at `indent`.
fn column_rows(
    col: &Arc<Leaf>,
    index: usize,
    indent: usize,
    resilvering: bool,
    rows: &mut Vec<Vec<String>>,
) {
    let att = col.attached();
    if att.is_empty() {
        rows.push(leaf_row(col, indent, resilvering));
        return;
    }
    let kind = if att.iter().any(|(k, _)| *k == AttachKind::Replacing) {
        "replacing"
    } else {
        "spare"
    };
    let all: Vec<Arc<Leaf>> = std::iter::once(col.clone())
        .chain(att.iter().map(|(_, l)| l.clone()))
        .collect();
    let usable = all.iter().filter(|l| l.is_usable()).count();
    let state = if usable == all.len() {
        "ONLINE"
    } else if usable > 0 {
        "DEGRADED"
    } else {
        "UNAVAIL"
    };
    rows.push(zero_row(
        format!("{}{kind}-{index}", " ".repeat(indent)),
        state,
    ));
    for l in &all {
        rows.push(leaf_row(l, indent + 2, resilvering));
    }
}

fn tree_rows(p: &Pool, health: &str, resilvering: bool) -> Vec<Vec<String>> {
    let mut rows = vec![zero_row(p.name.clone(), health)];
    let logs = p.log_vdevs();
    let tops = p.io.tops();
    for t in tops.iter().filter(|t| !logs.contains(&t.id)) {
        top_rows(t, resilvering, &mut rows);
    }
    if !logs.is_empty() {
        // OpenZFS's "logs" heading: a name and nothing else.
        let mut h = zero_row("logs".into(), "");
        for c in h.iter_mut().skip(1) {
            c.clear();
        }
        rows.push(h);
        for t in tops.iter().filter(|t| logs.contains(&t.id)) {
            let at = rows.len();
            top_rows(t, resilvering, &mut rows);
            let volatile = t
                .leaves()
                .iter()
                .any(|l| uzfs_core::vdev::device::is_volatile(std::path::Path::new(&l.path)));
            if volatile {
                if let Some(note) = rows.get_mut(at).and_then(|r| r.last_mut()) {
                    *note = "volatile log device: synchronous writes can be lost on power failure"
                        .into();
                }
            }
        }
    }
    let caches = p.io.cache_leaves();
    if !caches.is_empty() {
        let mut h = zero_row("cache".into(), "");
        for c in h.iter_mut().skip(1) {
            c.clear();
        }
        rows.push(h);
        for c in &caches {
            rows.push(leaf_row(c, 2, false));
        }
    }
    rows
}

fn top_rows(t: &TopVdev, resilvering: bool, rows: &mut Vec<Vec<String>>) {
    if t.kind == uzfs_core::vdev::TopKind::Disk {
        if let Some(c) = t.children.first() {
            column_rows(c, 0, 2, resilvering, rows);
        }
        return;
    }
    rows.push(zero_row(
        format!("  {}", SHOW.get().naming.top(t)),
        t.health(),
    ));
    for (i, c) in t.children.iter().enumerate() {
        column_rows(c, i, 4, resilvering, rows);
    }
}

fn explain(p: &Pool, health: &str, resilvering: bool, errs: u64) -> String {
    let leaves: Vec<Arc<Leaf>> = p.io.tops().iter().flat_map(|t| t.leaves()).collect();
    let any = |s: LeafState| leaves.iter().any(|l| !l.is_missing() && l.state() == s);
    if let Some(why) = p.suspended() {
        let parked = p.io.suspension.parked();
        let action = if parked {
            "Make the devices available, then run 'zpool clear': the sync resumes\n\twhere it stopped and nothing is lost."
        } else {
            "Export and re-import the pool: it comes back at its last committed txg."
        };
        let writes = if parked && p.props().failmode == FailMode::Wait {
            "writes wait\n\tuntil it resumes (failmode=wait)"
        } else {
            "writes fail\n\twith EIO"
        };
        return format!("status: The pool is suspended: {why}\n\tNothing after the last committed txg is written; reads continue, {writes}.\naction: {action}\n");
    }
    if resilvering {
        return "status: One or more devices is currently being resilvered.  The pool will\n\tcontinue to function, possibly in a degraded state.\naction: Wait for the resilver to complete.\n".into();
    }
    if health != "ONLINE" {
        if any(LeafState::Faulted) {
            return "status: One or more devices are faulted in response to persistent errors.\n\tSufficient replicas exist for the pool to continue functioning in a\n\tdegraded state.\naction: Replace the faulted device, or use 'zpool clear' to mark the device\n\trepaired.\n".into();
        }
        if any(LeafState::Removed) {
            return "status: One or more devices has been removed.\n\tSufficient replicas exist for the pool to continue functioning in a\n\tdegraded state.\naction: Online the device using 'zpool online' or replace the device with\n\t'zpool replace'.\n".into();
        }
        if any(LeafState::Offline) {
            return "status: One or more devices has been taken offline by the administrator.\n\tSufficient replicas exist for the pool to continue functioning in a\n\tdegraded state.\naction: Online the device using 'zpool online' or replace the device with\n\t'zpool replace'.\n".into();
        }
        return "status: One or more devices could not be opened.  Sufficient replicas exist for\n\tthe pool to continue functioning in a degraded state.\naction: Attach the missing device and online it using 'zpool online'.\n".into();
    }
    if data_errors(p) > 0 {
        return "status: One or more devices has experienced an error resulting in data\n\tcorruption.  Applications may be affected.\naction: Restore the file in question if possible.  Otherwise restore the\n\tentire pool from backup.\n".into();
    }
    if errs > 0 {
        return "status: One or more devices has experienced an unrecoverable error.  An\n\tattempt was made to correct the error.  Applications are unaffected.\naction: Determine if the device needs to be replaced, and clear the errors\n\tusing 'zpool clear' or replace the device with 'zpool replace'.\n".into();
    }
    String::new()
}

/// What `zpool status` options change in the report.
#[derive(Clone, Copy)]
pub struct Show {
    pub naming: Naming,
    /// `-e`: only vdevs that are not ONLINE or have errors (and the
    /// vdevs above them).
    pub unhealthy: bool,
    /// `-s`: a SLOW column (I/Os over 30 s).
    pub slow: bool,
    /// `-p`: exact numbers.
    pub parsable: bool,
    /// `-i`, `-t`: initialize and TRIM state of each leaf.
    pub initialize: bool,
    pub trim: bool,
    /// `-D`: the dedup table's summary.
    pub dedup: bool,
}

impl Show {
    const DEFAULT: Show = Show {
        naming: Naming {
            guid: false,
            resolve: false,
        },
        unhealthy: false,
        slow: false,
        parsable: false,
        initialize: false,
        trim: false,
        dedup: false,
    };
}

/// Keep the pool row, and each vdev row that is unhealthy or has an
/// unhealthy row beneath it (rows are in tree order, nested by indent).
fn unhealthy_only(rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let indent = |r: &[String]| r[0].len() - r[0].trim_start().len();
    let bad = |r: &[String]| r[1] != "ONLINE" || r[2..5].iter().any(|c| c != "0");
    let keep: Vec<bool> = (0..rows.len())
        .map(|i| {
            i == 0
                || bad(&rows[i])
                || rows[i + 1..]
                    .iter()
                    .take_while(|r| indent(r) > indent(&rows[i]))
                    .any(|r| bad(r))
        })
        .collect();
    rows.into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect()
}

/// The whole report for one pool. `now` is injectable for golden tests.
pub fn render_with(p: &Pool, now: u64, show: Show) -> String {
    SHOW.set(show);
    let health = pool_health(p);
    let errs: u64 =
        p.io.tops()
            .iter()
            .flat_map(|t| t.leaves())
            .map(|c| {
                VdevStats::get(&c.stats.read_errors)
                    + VdevStats::get(&c.stats.write_errors)
                    + VdevStats::get(&c.stats.cksum_errors)
            })
            .sum();
    let scan = p.scan_status();
    let resilvering = scan
        .as_ref()
        .is_some_and(|s| s.func == ScanFunc::Resilver && s.state == ScanState::Scanning);
    let mut out = format!("  pool: {}\n state: {health}\n", p.name);
    out.push_str(&explain(p, health, resilvering, errs));
    if !p.props().comment.is_empty() {
        out.push_str(&format!("comment: {}\n", p.props().comment));
    }
    match &scan {
        Some(s) => match (s.state, p.scan_stopped()) {
            (ScanState::Scanning, Some((at, why))) if !s.paused => {
                out.push_str(&stopped_scan_line(s, &why, at))
            }
            _ => out.push_str(&scan_line(s, p.scan_rate(), now)),
        },
        None => out.push_str("  scan: none requested\n"),
    }
    if let Some(why) = p.resilver_halted() {
        out.push_str(&format!("warning: {why}\n"));
    }
    out.push_str("config:\n\n");
    let mut rows = tree_rows(p, health, resilvering);
    if show.unhealthy {
        rows = unhealthy_only(rows);
    }
    let spares = p.io.spares();
    let namew = rows
        .iter()
        .map(|r| r[0].len())
        .chain(spares.iter().map(|s| show.naming.leaf(s).len() + 2))
        .max()
        .unwrap_or(0)
        .max(10);
    // zpool status: "\t%-*s  %-8s %5s %5s %5s  %s" (-s: one more %5s)
    let line = |r: &[String]| -> String {
        // A section heading ("logs"): the name alone.
        if r[1..].iter().all(|c| c.is_empty()) {
            return format!("\t{}\n", r[0]);
        }
        let mut l = format!(
            "\t{:<namew$}  {:<8} {:>5} {:>5} {:>5}",
            r[0], r[1], r[2], r[3], r[4]
        );
        let note = if show.slow {
            l.push_str(&format!(" {:>5}", r[5]));
            &r[6]
        } else {
            &r[5]
        };
        if !note.is_empty() {
            l.push_str("  ");
            l.push_str(note);
        }
        l.push('\n');
        l
    };
    let mut header: Vec<String> = ["NAME", "STATE", "READ", "WRITE", "CKSUM"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if show.slow {
        header.push("SLOW".into());
    }
    header.push(String::new());
    out.push_str(&line(&header));
    for r in &rows {
        out.push_str(&line(r));
    }
    if !spares.is_empty() {
        out.push_str("\tspares\n");
        for s in &spares {
            let st = if p.spare_in_use(s) {
                "INUSE     currently in use"
            } else if s.is_usable() {
                "AVAIL"
            } else {
                "UNAVAIL"
            };
            if show.unhealthy && st == "AVAIL" {
                continue;
            }
            out.push_str(&format!(
                "\t  {:<w$}  {st}\n",
                show.naming.leaf(s),
                w = namew - 2
            ));
        }
    }
    if show.dedup {
        // uzfs does not deduplicate: there is never a table.
        out.push_str("\n dedup: no DDT entries\n");
    }
    match data_errors(p) {
        0 => out.push_str("\nerrors: No known data errors\n"),
        n => out.push_str(&format!(
            "\nerrors: {n} data errors: blocks with no valid copy, found by reads since import or by the last scrub\n"
        )),
    }
    out
}

/// Blocks known to have no valid copy: those reads found since import
/// (`SpaIo::data_errors`), or the last scan's count if higher (it is all
/// that survives an export).
pub fn data_errors(p: &Pool) -> u64 {
    let scan = p.scan_status().map_or(0, |s| s.errors);
    p.io.data_errors.count().max(scan)
}

/// `-T u|d` (zpool status, list, iostat, wait): a timestamp line, seconds
/// since the epoch or the date as date(1) prints it.
pub fn timestamp(o: &crate::zpool::Opts) -> Result<String, Response> {
    match crate::zpool::values(o, 'T').last().map(String::as_str) {
        None => Ok(String::new()),
        Some("u") => Ok(format!("{}\n", uzfs_core::spa::scan::now_secs())),
        Some("d") => Ok(format!("{}\n", ctime(uzfs_core::spa::scan::now_secs()))),
        Some(x) => Err(usage_err(&format!(
            "invalid timestamp format '{x}': 'u' (seconds) or 'd' (date)"
        ))),
    }
}

pub fn status(d: &Daemon, args: &[String]) -> Response {
    let (o, rest) = match getopt(args, "c:!Degij!LpPstT:vx") {
        Ok(x) => x,
        Err(e) => return usage_err(&e),
    };
    let pools = match pools_or_all(d, &rest) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if pools.is_empty() {
        return Response::ok("no pools available\n".into());
    }
    let now = uzfs_core::spa::scan::now_secs();
    let show = Show {
        naming: Naming {
            guid: has(&o, 'g'),
            resolve: has(&o, 'L'),
        },
        unhealthy: has(&o, 'e'),
        slow: has(&o, 's'),
        parsable: has(&o, 'p'),
        initialize: has(&o, 'i'),
        trim: has(&o, 't'),
        dedup: has(&o, 'D'),
    };
    let mut out = match timestamp(&o) {
        Ok(t) => t,
        Err(r) => return r,
    };
    for p in &pools {
        let text = render_with(p, now, show);
        if has(&o, 'x') && pool_health(p) == "ONLINE" && !text.contains("status: ") {
            continue;
        }
        out.push_str(&text);
        out.push('\n');
    }
    if !out.contains("pool: ") {
        out.push_str("all pools are healthy\n");
    }
    Response::ok(out.trim_end().to_string() + "\n")
}
