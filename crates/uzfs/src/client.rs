//! The CLI side of the control socket, and the run directory.
//!
//! Protocol: one request per connection. The client writes a JSON line
//! `{"argv": [...], "cwd": "..."}`; the daemon answers with one JSON line
//! `{"code": N, "stdout": "...", "stderr": "..."}` and closes.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize, Debug)]
pub struct Request {
    pub argv: Vec<String>,
    pub cwd: String,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Response {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Response {
    pub fn ok(stdout: String) -> Self {
        Response {
            code: 0,
            stdout,
            stderr: String::new(),
        }
    }
    pub fn err(code: i32, stderr: impl Into<String>) -> Self {
        let mut s: String = stderr.into();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        Response {
            code,
            stdout: String::new(),
            stderr: s,
        }
    }
}

/// The run directory: `--rundir` flag, else `$UZFS_RUNDIR`, else
/// `/run/uzfs` for root and `$XDG_RUNTIME_DIR/uzfs` (or `/tmp/uzfs-$UID`)
/// for others.
///
/// Whoever can put a socket where a client looks for the daemon's is sent
/// every command line and working directory, and answers in the daemon's
/// name; whoever can write the directory can do that. So a run directory
/// is used only if it is owned by the caller (euid) and nobody else may
/// write it, and the socket only if it is the caller's own socket
/// ([`check_rundir`], [`connect`]); an existing directory is never
/// chmod'ed into shape ([`crate::daemon::prepare_rundir`]), it is refused.
pub fn rundir(flag: Option<&str>) -> PathBuf {
    if let Some(f) = flag {
        return PathBuf::from(f);
    }
    if let Ok(d) = std::env::var("UZFS_RUNDIR") {
        if !d.is_empty() {
            return PathBuf::from(d);
        }
    }
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    if uid == 0 {
        return PathBuf::from("/run/uzfs");
    }
    match std::env::var("XDG_RUNTIME_DIR") {
        Ok(d) if !d.is_empty() => PathBuf::from(d).join("uzfs"),
        _ => PathBuf::from(format!("/tmp/uzfs-{uid}")),
    }
}

pub fn socket_path(rundir: &Path) -> PathBuf {
    rundir.join("uzfsd.sock")
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn refuse(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, msg)
}

/// Whether `dir` is safe as this user's run directory: a directory (or a
/// link to one that this user or root made) owned by the caller and not
/// writable by group or others. A directory that does not exist yet is
/// fine (it is created 0700 by `prepare_rundir`). The error says what is
/// wrong and how to fix it.
pub fn check_rundir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = euid();
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(l) if l.file_type().is_symlink() && l.uid() != me && l.uid() != 0 => {
            return Err(refuse(format!(
                "refusing run directory {}: a link owned by uid {}, not by you (uid {me})",
                dir.display(),
                l.uid()
            )))
        }
        Ok(_) => {}
    }
    let m = std::fs::metadata(dir)?;
    if !m.is_dir() {
        return Err(refuse(format!(
            "refusing run directory {}: not a directory",
            dir.display()
        )));
    }
    if m.uid() != me {
        return Err(refuse(format!(
            "refusing run directory {}: owned by uid {}, not by you (uid {me}); \
             another user may be listening there (remove it, or set UZFS_RUNDIR)",
            dir.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "refusing run directory {}: mode {:o} lets others write it (chmod go-w it, \
             or set UZFS_RUNDIR to a private directory)",
            dir.display(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Connect to the daemon of `rundir`, after checking that the directory
/// and the socket in it are the caller's own (`check_rundir`): never to a
/// socket someone else put there. Unsafe ones give PermissionDenied with
/// the reason.
pub fn connect(rundir: &Path) -> std::io::Result<UnixStream> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    check_rundir(rundir)?;
    let sock = socket_path(rundir);
    let m = std::fs::symlink_metadata(&sock)?;
    if !m.file_type().is_socket() || m.uid() != euid() {
        return Err(refuse(format!(
            "refusing {}: not a socket of yours (uid {}, you are uid {})",
            sock.display(),
            m.uid(),
            euid()
        )));
    }
    UnixStream::connect(&sock)
}

/// Why a command got no answer.
enum SendErr {
    /// The daemon did not get the request (none listening, or it closed
    /// the connection first): sending it again (to a new daemon) is safe.
    Unsent(std::io::Error),
    /// The daemon got the request and died before it answered: the
    /// command may have taken effect, in whole or in part, so it is not
    /// sent again; the user is told.
    Lost(String),
}

fn send(rundir: &Path, req: &Request) -> Result<Response, SendErr> {
    let unsent = SendErr::Unsent;
    let mut s = connect(rundir).map_err(unsent)?;
    let mut line = serde_json::to_vec(req)
        .map_err(std::io::Error::other)
        .map_err(unsent)?;
    line.push(b'\n');
    s.write_all(&line).map_err(unsent)?;
    s.shutdown(std::net::Shutdown::Write).map_err(unsent)?;
    let lost = |why: String| {
        SendErr::Lost(format!(
            "the uzfs daemon {why} before it answered; the command may or may not have \
             taken effect (check with zfs list / zpool status; the next command starts a \
             new daemon; see {}/uzfsd.log)",
            rundir.display()
        ))
    };
    // A command may run for hours (`zpool wait`); the wait for its answer
    // has no deadline, but it looks every half second whether the daemon
    // is still alive: one killed while it waited on its own FUSE mount
    // never closes this socket (`crate::wedge`).
    let pid = peer_pid(&s);
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| lost(format!("could not be waited on ({e})")))?;
    let mut r = BufReader::new(s);
    let mut buf = Vec::new();
    let who = pid.map(|p| format!("(pid {p}) ")).unwrap_or_default();
    // After a dying daemon is cut loose: how many connections that took,
    // and how long its socket may take to close.
    let mut freed: Option<(usize, Instant)> = None;
    loop {
        match r.read_until(b'\n', &mut buf) {
            Ok(_) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                match (freed, pid) {
                    (None, Some(p)) if crate::wedge::dying(p) => {
                        let n = crate::wedge::cut_loose(rundir, p);
                        freed = Some((n, Instant::now() + Duration::from_secs(15)));
                    }
                    (Some((n, deadline)), _) if Instant::now() > deadline => {
                        return Err(lost(format!(
                            "{who}died and its socket stayed open ({n} FUSE connections aborted)"
                        )));
                    }
                    _ => {}
                }
            }
            // Reset: it closed with the request unread in its socket (it
            // died before taking it, or never accepted the connection).
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && buf.is_empty() => {
                return Err(SendErr::Unsent(e))
            }
            Err(e) => return Err(lost(format!("{who}connection failed ({e})"))),
        }
    }
    if buf.is_empty() {
        return Err(lost(match freed {
            Some((n, _)) => format!(
                "{who}died waiting on its own mount ({n} FUSE connections aborted to free it)"
            ),
            None => format!("{who}exited"),
        }));
    }
    serde_json::from_slice(&buf).map_err(|e| lost(format!("sent a bad reply ({e})")))
}

/// The pid of the process on the other end of `s` (the daemon that
/// listens), from the kernel: not a pid file that may be stale.
fn peer_pid(s: &UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `cred`, a
    // ucred that outlives the call; the fd is the open socket `s`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Exit code of a command the daemon had no room for (`EX_TEMPFAIL`):
/// [`call`] tries again until its deadline.
pub const BUSY: i32 = 75;

/// Send a command to the daemon, starting one if none is running; a busy
/// daemon is asked again for up to 30 s.
pub fn call(rundir: &Path, argv: Vec<String>) -> Response {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call_once(rundir, argv.clone());
        if r.code != BUSY || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn call_once(rundir: &Path, argv: Vec<String>) -> Response {
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let req = Request { argv, cwd };
    let sock = socket_path(rundir);
    match send(rundir, &req) {
        Ok(r) => return r,
        Err(SendErr::Lost(msg)) => return Response::err(1, msg),
        Err(SendErr::Unsent(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Response::err(
                1,
                format!("cannot talk to the uzfs daemon at {}: {e}", sock.display()),
            );
        }
        Err(_) => {}
    }
    let mut daemon = match start_daemon(rundir) {
        Ok(c) => c,
        Err(e) => return Response::err(1, format!("cannot start the uzfs daemon: {e}")),
    };
    // The daemon this started may exit at once: another one won the
    // run directory (the next send finds it), or the one before it, killed,
    // still holds the run directory's lock while the kernel finishes its
    // I/O, which under load takes longer than a new daemon waits for it
    // (`daemon::lock_run_dir`). Then start another, until the deadline.
    let (mut exited, mut since) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match send(rundir, &req) {
            Ok(r) => return r,
            Err(SendErr::Lost(msg)) => return Response::err(1, msg),
            Err(SendErr::Unsent(e)) if Instant::now() > deadline => {
                let why = match exited {
                    Some(status) => format!(
                        "; the daemon it started exited ({status}): {}",
                        last_log_line(rundir)
                    ),
                    None => String::new(),
                };
                return Response::err(
                    1,
                    format!(
                        "the uzfs daemon did not answer on {}: {e}{why} (see {}/uzfsd.log)",
                        sock.display(),
                        rundir.display()
                    ),
                );
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                if let Ok(Some(status)) = daemon.try_wait() {
                    match since {
                        // Give a send a moment to find the daemon that won.
                        None => since = Some(Instant::now()),
                        Some(t) if t.elapsed() > Duration::from_millis(200) => {
                            daemon = match start_daemon(rundir) {
                                Ok(c) => c,
                                Err(e) => {
                                    return Response::err(
                                        1,
                                        format!("cannot start the uzfs daemon: {e}"),
                                    )
                                }
                            };
                            since = None;
                        }
                        Some(_) => {}
                    }
                    exited = Some(status);
                }
            }
        }
    }
}

/// The last line the daemon logged, for an error that points at the log.
fn last_log_line(rundir: &Path) -> String {
    std::fs::read_to_string(rundir.join("uzfsd.log"))
        .ok()
        .and_then(|l| l.lines().last().map(str::to_string))
        .unwrap_or_default()
}

/// Start `uzfs daemon --foreground` detached, logging to the run directory.
pub fn start_daemon(rundir: &Path) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    crate::daemon::prepare_rundir(rundir)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(rundir.join("uzfsd.log"))?;
    let exe = std::env::current_exe()?;
    std::process::Command::new(exe)
        .arg("--rundir")
        .arg(rundir)
        .arg("daemon")
        .arg("--foreground")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
}
