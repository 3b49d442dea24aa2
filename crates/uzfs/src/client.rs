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
/// `/run/uzfs` for root and `$XDG_RUNTIME_DIR/uzfs` (or `/tmp/uzfs-$USER`)
/// for others.
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

fn send(sock: &Path, req: &Request) -> std::io::Result<Response> {
    let mut s = UnixStream::connect(sock)?;
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line)?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut r = BufReader::new(s);
    let mut buf = String::new();
    r.read_line(&mut buf)?;
    serde_json::from_str(&buf)
        .map_err(|e| std::io::Error::other(format!("bad reply from daemon: {e}")))
}

/// Send a command to the daemon, starting one if none is running.
pub fn call(rundir: &Path, argv: Vec<String>) -> Response {
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let req = Request { argv, cwd };
    let sock = socket_path(rundir);
    match send(&sock, &req) {
        Ok(r) => return r,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Response::err(
                1,
                format!(
                    "permission denied talking to the uzfs daemon at {}",
                    sock.display()
                ),
            );
        }
        Err(_) => {}
    }
    if let Err(e) = start_daemon(rundir) {
        return Response::err(1, format!("cannot start the uzfs daemon: {e}"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match send(&sock, &req) {
            Ok(r) => return r,
            Err(e) if Instant::now() > deadline => {
                return Response::err(
                    1,
                    format!(
                        "the uzfs daemon did not answer on {}: {e} (see {}/uzfsd.log)",
                        sock.display(),
                        rundir.display()
                    ),
                )
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Start `uzfs daemon --foreground` detached, logging to the run directory.
pub fn start_daemon(rundir: &Path) -> std::io::Result<()> {
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
        .spawn()?;
    Ok(())
}
