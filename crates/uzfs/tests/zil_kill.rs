//! The intent log through a real mount, with the daemon killed (SIGKILL)
//! under load, many times: every transaction a client saw committed is
//! there after the restart (which replays the log), and SQLite's own check
//! passes. Clients log what they saw committed to a file outside the pool.
//!
//! * sqlite3, `journal_mode=WAL` with `synchronous=FULL` (the commit is a
//!   WAL append and fsync);
//! * sqlite3, `journal_mode=DELETE` with `synchronous=EXTRA` (the commit is
//!   the rollback journal's unlink plus a directory fsync; see its test for
//!   the one gap SQLite leaves when the daemon dies);
//! * a record writer: 4 KiB records at increasing offsets of one file, each
//!   followed by fsync (what `fio --fsync=1` does), checked byte for byte.
//!
//! `UZFS_KILL_ROUNDS=N` (default 20) kills per client; `uzfs zilstat`
//! must show the log at work.

mod common;
use common::{can_mount, Env};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CLIENT: &str = r#"
import os, sqlite3, sys
mode, path, log = sys.argv[1:4]
lf = open(log, 'a')
if mode == 'records':
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    i = os.fstat(fd).st_size // 4096
    while True:
        rec = (b'%016d' % i) * 256
        try:
            os.pwrite(fd, rec, i * 4096)
            os.fsync(fd)
        except OSError:
            break
        lf.write('%d\n' % i); lf.flush()
        i += 1
    sys.exit(0)
try:
    c = sqlite3.connect(path, isolation_level=None, timeout=1)
    if mode == 'wal':
        c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=FULL')
    else:
        c.execute('PRAGMA journal_mode=DELETE'); c.execute('PRAGMA synchronous=EXTRA')
    c.execute('CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)')
    i = (c.execute('SELECT max(id) FROM t').fetchone()[0] or 0) + 1
except Exception:
    sys.exit(0)
while True:
    try:
        c.execute('BEGIN')
        c.execute('INSERT INTO t VALUES(?, randomblob(300))', (i,))
        c.execute('COMMIT')
        if mode == 'delete':
            # SQLite ignores a directory it cannot open for the sync after
            # the journal's unlink: see sqlite_delete_mode_survives_daemon_kills.
            d = os.open(os.path.dirname(path), os.O_RDONLY)
            os.fsync(d); os.close(d)
    except Exception:
        break
    lf.write('%d\n' % i); lf.flush()
    i += 1
"#;

const CHECK: &str = r#"
import sqlite3, sys
path, last = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(path, isolation_level=None)
ok = c.execute('PRAGMA integrity_check').fetchone()[0]
n = c.execute('SELECT count(*) FROM t WHERE id <= ?', (last,)).fetchone()[0]
print(ok, n)
"#;

fn start(mode: &str, path: &Path, log: &Path) -> Child {
    Command::new("/usr/bin/python3")
        .args(["-c", CLIENT, mode])
        .arg(path)
        .arg(log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3")
}

/// The last id the client logged as committed (0: none).
fn last_logged(log: &Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn committed_transactions_survive_daemon_kills() {
    kill_rounds(&["wal", "records"]);
}

/// sqlite3 with `journal_mode=DELETE, synchronous=EXTRA` under the same
/// kills. The commit ends with the journal's unlink, then an open of the
/// directory and its fsync; SQLite's `unixDelete` treats a directory it
/// cannot open as success. When the daemon dies between the unlink and
/// that open, the open fails (ENOTCONN) and SQLite reports the commit done
/// though the unlink was never synced: after the restart the journal is
/// back, hot, and rolls the transaction back. No file system can keep an
/// unlink nobody asked to sync, so the client here syncs the directory
/// itself after COMMIT (what SQLite does when the open works) and logs
/// the commit only if that succeeds. (Found with a request trace,
/// `UZFS_FUSE_TRACE`: the kill fell between UNLINK and OPENDIR. Without
/// the extra sync a run of 20-60 kills failed; with it, 80 kills pass
/// with either logbias.)
#[test]
fn sqlite_delete_mode_survives_daemon_kills() {
    kill_rounds(&["delete"]);
}

fn kill_rounds(modes: &[&str]) {
    if !can_mount() {
        return;
    }
    let rounds: u64 = std::env::var("UZFS_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let e = Env::new();
    let m = e.tank();
    e.ok(&["zfs", "create", "tank/db"]);
    let db = m.join("db");
    for &mode in modes {
        let file = db.join(format!("{mode}.db"));
        let log = e.dir.path().join(format!("{mode}.log"));
        let mut kills = 0;
        for round in 0..rounds {
            let mut child = start(mode, &file, &log);
            // Let it commit for a while (more each round), then kill.
            std::thread::sleep(Duration::from_millis(150 + 20 * (round % 10)));
            e.kill_daemon();
            kills += 1;
            let _ = child.wait();
            // The next command starts a daemon: import, replay, mount.
            e.ok(&["zpool", "status", "tank"]);
            let last = last_logged(&log);
            if mode == "records" {
                let data = std::fs::read(&file).unwrap_or_default();
                for i in 0..=last {
                    let rec = format!("{i:016}").repeat(256);
                    let at = i as usize * 4096;
                    assert!(
                        data.get(at..at + 4096) == Some(rec.as_bytes()),
                        "round {round}: record {i} of {last} acknowledged by fsync is not there"
                    );
                }
                continue;
            }
            if last == 0 {
                continue;
            }
            let o = Command::new("/usr/bin/python3")
                .args(["-c", CHECK])
                .arg(&file)
                .arg(last.to_string())
                .output()
                .expect("python3");
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(
                out.trim(),
                format!("ok {last}"),
                "{mode} round {round}: after the kill (integrity, committed rows up to {last}): {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let last = last_logged(&log);
        eprintln!("{mode}: {kills} kills, {last} transactions committed and found");
        assert!(last > 0, "{mode}: the client never committed anything");
    }
    // The log does the work: commits write log blocks (counters since the
    // daemon started, which the last kill restarted).
    let py = "import os,sys\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o644)\nfor i in range(20):\n    os.pwrite(fd,b'x'*4096,i*4096); os.fsync(fd)\nfd=os.open(sys.argv[1]+'big',os.O_RDWR|os.O_CREAT,0o644)\nos.pwrite(fd,os.urandom(1<<20),0); os.fsync(fd)\n";
    let o = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(db.join("z"))
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let z = e.ok(&["zilstat"]);
    let row = z
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("tank/db"))
        .unwrap_or_else(|| panic!("no tank/db row in zilstat:\n{z}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    let cc: u64 = cols[2].parse().expect("cc");
    let cwc: u64 = cols[3].parse().expect("cwc");
    assert!(cc >= 20 && cwc > 0, "zilstat shows no log writes:\n{z}");
    // The 1 MiB write went by pointer: eight 128 KiB blocks written once.
    let iic: u64 = cols[7].parse().expect("iic");
    assert!(iic >= 8, "zilstat shows no block logged by pointer:\n{z}");
    e.export_and_zdb("tank");
}

/// `zpool attach`/`detach` on a log device: a log mirror is made and
/// unmade under fsyncs, and what was fsynced before either (whose log
/// blocks are on the old side only) survives a kill right after.
#[test]
fn a_log_mirror_is_attached_and_detached() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let (a, l1, l2) = (e.disk("a", 256), e.disk("l1", 128), e.disk("l2", 128));
    e.ok(&["zpool", "create", "tank", &a, "log", &l1]);
    let m = e.dir.path().join("mnt/tank");
    let records = |name: &str, n: usize| {
        let py = "import os,sys\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o644)\nfor i in range(int(sys.argv[2])):\n    os.pwrite(fd,b'%08d'%i*512,i*4096); os.fsync(fd)\n";
        let o = Command::new("/usr/bin/python3")
            .args(["-c", py])
            .arg(m.join(name))
            .arg(n.to_string())
            .output()
            .expect("python3");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let check = |name: &str, n: usize| {
        let d = std::fs::read(m.join(name)).expect("read");
        for i in 0..n {
            let want = format!("{i:08}").repeat(512);
            assert!(
                d.get(i * 4096..(i + 1) * 4096) == Some(want.as_bytes()),
                "{name}: record {i} of {n} lost"
            );
        }
    };
    records("f", 30);
    e.ok(&["zpool", "attach", "tank", &l1, &l2]);
    let st = e.ok(&["zpool", "status", "tank"]);
    let logs = &st[st
        .find("\tlogs")
        .unwrap_or_else(|| panic!("no logs:\n{st}"))..];
    assert!(
        logs.contains("mirror-1") && logs.contains(&l1) && logs.contains(&l2),
        "{st}"
    );
    records("g", 30);
    // l2 is a valid replica once its resilver is done (on a loaded
    // machine it may not be yet: detaching l1 then says "no valid
    // replicas", as OpenZFS does).
    e.ok(&["zpool", "wait", "-t", "resilver", "tank"]);
    e.ok(&["zpool", "detach", "tank", &l1]);
    e.kill_daemon();
    e.ok(&["zpool", "status", "tank"]);
    check("f", 30);
    check("g", 30);
    let st = e.ok(&["zpool", "status", "tank"]);
    let logs = &st[st
        .find("\tlogs")
        .unwrap_or_else(|| panic!("no logs:\n{st}"))..];
    assert!(logs.contains(&l2) && !logs.contains(&l1), "{st}");
    // The remaining side takes the log: fsync, kill, replay.
    records("h", 30);
    e.kill_daemon();
    e.ok(&["zpool", "status", "tank"]);
    check("h", 30);
    e.export_and_zdb("tank");
}

#[test]
fn log_devices_from_the_command_line() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let (a, b, l1, l2, l3) = (
        e.disk("a", 256),
        e.disk("b", 256),
        e.disk("l1", 128),
        e.disk("l2", 128),
        e.disk("l3", 128),
    );
    let dry = e.ok(&[
        "zpool", "create", "-n", "tank", "mirror", &a, &b, "log", &l1,
    ]);
    assert!(dry.contains("\tlogs\n"), "{dry}");
    e.fails(
        &["zpool", "create", "tank", &a, "log", "raidz", &l1, &l2],
        1,
        "not raidz",
    );
    e.fails(&["zpool", "create", "tank", &a, "log"], 1, "log requires");
    e.ok(&["zpool", "create", "tank", "mirror", &a, &b, "log", &l1]);
    let size_before = e.ok(&["zpool", "list", "-Hp", "-o", "size", "tank"]);
    e.ok(&["zpool", "add", "tank", "log", "mirror", &l2, &l3]);
    // Log devices are not pool space.
    assert_eq!(
        e.ok(&["zpool", "list", "-Hp", "-o", "size", "tank"]),
        size_before
    );
    let st = e.ok(&["zpool", "status", "tank"]);
    let logs_at = st
        .find("\tlogs")
        .unwrap_or_else(|| panic!("no logs section:\n{st}"));
    let tail = &st[logs_at..];
    assert!(tail.contains(&l1) && tail.contains("mirror-2"), "{st}");
    assert!(!st[..logs_at].contains(&l1), "{st}");
    // fsyncs go to the log devices.
    let m = e.dir.path().join("mnt/tank");
    let py = "import os,sys\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o644)\nfor i in range(50):\n    os.pwrite(fd,b'y'*4096,i*4096); os.fsync(fd)\n";
    let o = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(m.join("f"))
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let io = e.ok(&["zpool", "iostat", "-vp", "tank"]);
    let w = |dev: &str| -> u64 {
        io.lines()
            .find(|l| l.split_whitespace().next() == Some(dev))
            .and_then(|l| l.split_whitespace().nth(4))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no write ops for {dev}:\n{io}"))
    };
    assert!(
        w(&l1) + w(&l2) >= 40,
        "the log devices took no writes:\n{io}"
    );
    // Killed, the daemon replays from the log devices.
    e.kill_daemon();
    e.ok(&["zpool", "status", "tank"]);
    assert_eq!(std::fs::read(m.join("f")).expect("f").len(), 50 * 4096);
    e.export_and_zdb("tank");
    // A missing log device: import refuses, -m imports without it.
    std::fs::remove_file(&l1).expect("rm l1");
    e.fails(
        &[
            "zpool",
            "import",
            "-d",
            &e.dir.path().display().to_string(),
            "tank",
        ],
        1,
        "log device missing",
    );
    e.ok(&[
        "zpool",
        "import",
        "-m",
        "-d",
        &e.dir.path().display().to_string(),
        "tank",
    ]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("state: DEGRADED"), "{st}");
}

#[test]
fn log_devices_can_be_removed_under_load() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let (a, l1, l2, l3) = (
        e.disk("a", 256),
        e.disk("l1", 128),
        e.disk("l2", 128),
        e.disk("l3", 128),
    );
    e.ok(&[
        "zpool", "create", "tank", &a, "log", &l1, "mirror", &l2, &l3,
    ]);
    let m = e.dir.path().join("mnt/tank");
    // A writer fsyncing all along, its acknowledged records logged.
    let log = e.dir.path().join("records.log");
    let mut child = start("records", &m.join("r"), &log);
    std::thread::sleep(Duration::from_millis(200));
    e.fails(&["zpool", "remove", "tank", &l2], 1, "no such log device");
    e.fails(
        &["zpool", "remove", "tank", &l1],
        1,
        "vdevs were added after it",
    );
    e.ok(&["zpool", "remove", "tank", "mirror-2"]);
    std::thread::sleep(Duration::from_millis(200));
    e.ok(&["zpool", "remove", "tank", &l1]);
    std::thread::sleep(Duration::from_millis(200));
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(!st.contains("logs") && !st.contains(&l1), "{st}");
    // Kill with the writer still going: everything it saw fsynced is there.
    e.kill_daemon();
    let _ = child.wait();
    e.ok(&["zpool", "status", "tank"]);
    let last = last_logged(&log);
    assert!(last > 0, "the writer committed nothing");
    let data = std::fs::read(m.join("r")).unwrap_or_default();
    for i in 0..=last {
        let rec = format!("{i:016}").repeat(256);
        let at = i as usize * 4096;
        assert!(
            data.get(at..at + 4096) == Some(rec.as_bytes()),
            "record {i} of {last} is not there"
        );
    }
    // A log device in memory (tmpfs) is refused without -f, and flagged.
    if let Ok(shm) = tempfile::Builder::new()
        .prefix("uzfs-log")
        .tempfile_in("/dev/shm")
    {
        shm.as_file().set_len(128 << 20).expect("size");
        let p = shm.path().display().to_string();
        e.fails(&["zpool", "add", "tank", "log", &p], 1, "volatile memory");
        e.ok(&["zpool", "add", "-f", "tank", "log", &p]);
        let st = e.ok(&["zpool", "status", "tank"]);
        assert!(st.contains("volatile log device"), "{st}");
        e.ok(&["zpool", "remove", "tank", &p]);
    }
    e.export_and_zdb("tank");
}
