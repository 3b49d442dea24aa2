//! What a local user must not be able to do through uzfs: gain root by
//! writing into a set-user-ID file, talk to (or be answered by) a daemon
//! that is not theirs, or take the daemon down by opening connections.
//!
//! The unprivileged steps run through `setpriv` as uid/gid 65534 (nobody)
//! or other unnamed uids; the mount test needs root and /dev/fuse.

mod common;
use common::{can_mount, Env};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `args` run as `uid` (gid the same, no supplementary groups).
fn as_user(uid: u32, args: &[&str]) -> Output {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("UZFS_RUNDIR")
        .output()
        .expect("setpriv")
}

/// The local-root hole of the issue: root leaves a set-user-ID copy of
/// /bin/true writable by everyone (mode 4777); an unprivileged user writes
/// another program into it without O_TRUNC and runs it at once. The write
/// must drop S_ISUID (and S_ISGID of a group-executable file) before the
/// user can run the file: the program runs with the user's own ids. The
/// kernel caches attributes for a second, so a bit dropped only in the
/// daemon is not enough.
#[test]
fn writing_into_a_setuid_file_drops_the_bit_at_once() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let m = e.tank();
    chmod(e.dir.path(), 0o755);
    chmod(&e.dir.path().join("mnt"), 0o755);
    chmod(&m, 0o1777);
    let id = std::fs::read("/usr/bin/id").expect("/usr/bin/id");
    // The file /bin/true was is long enough that the whole of `id` lands
    // over it; pad so the program written in is exactly `id`.
    for (name, mode, field) in [("suid", 0o4777, "euid="), ("sgid", 0o2777, "egid=")] {
        let f = m.join(name);
        let mut content = std::fs::read("/bin/true").expect("/bin/true");
        content.resize(content.len().max(id.len()), 0);
        std::fs::write(&f, &content).expect("write");
        chmod(&f, mode);
        // Cache the set-id mode in the kernel, as a stat by anyone does.
        let before = std::fs::metadata(&f).expect("stat");
        assert_eq!(before.mode() & 0o7777, mode);
        // The attack: open without O_TRUNC, write, close, exec at once.
        let script = "import os,sys\n\
             f=sys.argv[1]\n\
             d=open('/usr/bin/id','rb').read()\n\
             fd=os.open(f,os.O_WRONLY)\n\
             os.write(fd,d)\n\
             os.close(fd)\n\
             os.execv(f,[f])\n";
        let o = as_user(
            65534,
            &["/usr/bin/python3", "-c", script, &f.display().to_string()],
        );
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success() && out.contains("uid=65534"),
            "{name}: the written program did not run: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            !out.contains(field),
            "{name}: a user's program ran with raised ids: {out}"
        );
        let after = std::fs::metadata(&f).expect("stat");
        assert_eq!(
            after.mode() & 0o6000,
            0,
            "{name}: mode {:o} after the write",
            after.mode()
        );
    }
    e.export_and_zdb("tank");
}

/// Two uids no other test uses (the default run directory of a uid is
/// `/tmp/uzfs-UID`, shared by every process of the machine).
fn two_uids() -> (u32, u32) {
    let v = 41_000 + (std::process::id() % 20_000) * 2;
    (v, v + 1)
}

fn uzfs() -> &'static str {
    env!("CARGO_BIN_EXE_uzfs")
}

/// The run-directory hijack of the issue: another user creates the
/// victim's default run directory first and listens on a socket in it.
/// The victim's command must refuse that directory (saying whose it is)
/// and send nothing to the socket: no command line, no working directory.
#[test]
fn a_run_directory_made_by_another_user_is_refused() {
    let (victim, attacker) = two_uids();
    let dir = std::path::PathBuf::from(format!("/tmp/uzfs-{victim}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o755);
    std::os::unix::fs::chown(&dir, Some(attacker), Some(attacker)).expect("chown");
    let sock = dir.join("uzfsd.sock");
    // The attacker's listener prints whatever a client sends it.
    let listener = "import os,socket,sys\n\
        s=socket.socket(socket.AF_UNIX)\n\
        s.bind(sys.argv[1])\n\
        os.chmod(sys.argv[1],0o777)\n\
        s.listen(8)\n\
        s.settimeout(4)\n\
        try:\n  c,_=s.accept(); c.settimeout(2); print('GOT', c.recv(65536))\n\
        except Exception as e: print('nothing', e)\n";
    let spy = Command::new("setpriv")
        .arg(format!("--reuid={attacker}"))
        .arg(format!("--regid={attacker}"))
        .args(["--clear-groups", "/usr/bin/python3", "-c", listener])
        .arg(&sock)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("listener");
    let t0 = std::time::Instant::now();
    let ready = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.mode() & 0o777 == 0o777);
    while !ready(&sock) && t0.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = as_user(victim, &[uzfs(), "zpool", "list"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let heard = spy.wait_with_output().expect("listener");
    let heard = String::from_utf8_lossy(&heard.stdout).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(heard.starts_with("nothing"), "the attacker heard: {heard}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("refusing run directory {}", dir.display()))
            && err.contains(&format!("owned by uid {attacker}")),
        "{err}"
    );
}

/// An ordinary user with no run directory yet gets a private one (0700,
/// theirs) and a daemon answering there; the socket is theirs alone.
#[test]
fn a_users_default_run_directory_is_private() {
    let (user, _) = two_uids();
    let user = user + 40_000;
    let dir = std::path::PathBuf::from(format!("/tmp/uzfs-{user}"));
    let _ = std::fs::remove_dir_all(&dir);
    let o = as_user(user, &[uzfs(), "zpool", "list"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let m = std::fs::metadata(&dir);
    let s = std::fs::symlink_metadata(dir.join("uzfsd.sock"));
    let _ = as_user(user, &[uzfs(), "daemon", "--stop"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success() && out.contains("no pools available"),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m = m.expect("run directory");
    assert_eq!((m.uid(), m.mode() & 0o7777), (user, 0o700));
    let s = s.expect("socket");
    assert_eq!((s.uid(), s.mode() & 0o777), (user, 0o600));
}

/// `UZFS_RUNDIR` naming a directory others may write (a 1777 one), or one
/// of another user, is refused, and its mode is left as it was (it used
/// to be chmod'ed to 0700 under its other users).
#[test]
fn an_unsafe_uzfs_rundir_is_refused_and_left_as_it_was() {
    let e = Env::new();
    let shared = e.dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    chmod(&shared, 0o1777);
    let theirs = e.dir.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    chmod(&theirs, 0o700);
    std::os::unix::fs::chown(&theirs, Some(40_999), Some(40_999)).expect("chown");
    for (dir, why, mode) in [
        (&shared, "mode 1777 lets others write it", 0o1777),
        (&theirs, "owned by uid 40999", 0o700),
    ] {
        for args in [&["zpool", "list"][..], &["daemon"][..]] {
            let o = Command::new(uzfs())
                .args(args)
                .env("UZFS_RUNDIR", dir)
                .output()
                .expect("uzfs");
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            assert_eq!(o.status.code(), Some(1), "{args:?} in {dir:?}: {err}");
            assert!(err.contains(why), "{args:?} in {dir:?}: {err}");
            let m = std::fs::metadata(dir).expect("stat");
            assert_eq!(m.mode() & 0o7777, mode, "{dir:?} changed mode");
            assert!(
                !dir.join("uzfsd.sock").exists() && !dir.join("uzfsd.log").exists(),
                "{dir:?}: something was created in it"
            );
        }
    }
}

/// The daemon's threads of `rundir`'s daemon.
fn daemon_threads(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("Threads:")
}

/// The thread-exhaustion crash of the issue: hundreds of idle control
/// connections, and spawns failing under a task limit. The daemon's
/// threads stay bounded, the flood's connections are told the daemon is
/// busy, the daemon lives, its mount keeps serving, and commands work
/// again once the flood is gone. Where this container lets a test make a
/// pids cgroup, the same flood runs with thread creation failing.
#[test]
fn a_flood_of_connections_does_not_stop_the_daemon() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let m = e.tank();
    std::fs::write(m.join("f"), b"before").expect("write");
    let pid = e.daemon_pid();
    let base = daemon_threads(pid);
    let sock = e.rundir.join("uzfsd.sock");
    let flood = |n: usize| -> Vec<std::os::unix::net::UnixStream> {
        (0..n)
            .filter_map(|_| std::os::unix::net::UnixStream::connect(&sock).ok())
            .collect()
    };
    let conns = flood(400);
    assert_eq!(conns.len(), 400, "connections refused by the kernel");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let threads = daemon_threads(pid);
    assert!(
        threads <= base + 64 + 2,
        "{threads} daemon threads for 400 idle connections (base {base})"
    );
    // Some of the flood were answered "busy" at once.
    let busy = conns
        .iter()
        .filter(|c| {
            c.set_read_timeout(Some(std::time::Duration::from_millis(50)))
                .is_ok()
                && {
                    let mut s = String::new();
                    std::io::BufRead::read_line(&mut std::io::BufReader::new(*c), &mut s)
                        .is_ok_and(|n| n > 0)
                        && s.contains("busy")
                }
        })
        .count();
    assert!(busy >= 300, "{busy} of 400 idle connections were told busy");
    // The mount serves meanwhile (it has its own threads).
    std::fs::write(m.join("g"), b"during").expect("write during the flood");
    drop(conns);
    // A command waits out the busy daemon (the idle ones time out).
    let out = e.ok(&["zpool", "list", "-H", "-o", "name"]);
    assert_eq!(out.trim(), "tank");

    // Thread creation failing: a pids cgroup one task above what the
    // daemon has.
    let cg = std::path::PathBuf::from(format!("/sys/fs/cgroup/pids/uzfs-test-{pid}"));
    if std::fs::create_dir(&cg).is_ok() {
        let now = daemon_threads(pid);
        std::fs::write(cg.join("pids.max"), format!("{}", now + 1)).expect("pids.max");
        std::fs::write(cg.join("cgroup.procs"), format!("{pid}")).expect("cgroup.procs");
        let conns = flood(400);
        std::thread::sleep(std::time::Duration::from_millis(500));
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        drop(conns);
        std::fs::write(cg.join("pids.max"), "max").expect("pids.max");
        let parent = std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs");
        std::fs::write(parent, format!("{pid}")).expect("move back");
        let _ = std::fs::remove_dir(&cg);
        assert!(alive, "the daemon died when thread creation failed");
    } else {
        eprintln!("no pids cgroup here: the failing-spawn half is skipped");
    }
    assert_eq!(std::fs::read(m.join("f")).expect("read"), b"before");
    assert_eq!(std::fs::read(m.join("g")).expect("read"), b"during");
    e.ok(&["zpool", "status", "tank"]);
    e.export_and_zdb("tank");
}
