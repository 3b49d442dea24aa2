//! A daemon that cannot finish dying, and how a client cuts it loose.
//!
//! The daemon serves its FUSE mounts, and some of its own threads use
//! paths inside them: a nested filesystem's mountpoint is created, looked
//! up and mounted on through its parent's mount. Such a request is
//! answered by another thread of the same daemon. If the daemon is killed
//! after a request thread read the request and before it answered, the
//! thread that asked waits for the answer uninterruptibly: FUSE waits out
//! a request that already reached user space, fatal signal or not. The
//! answer can now come only from the connection ending, which happens when
//! /dev/fuse is closed, which happens when the process's last thread
//! exits: never. The process stays a zombie with one thread in D state,
//! holding the run-directory lock, the pools' device locks and the control
//! socket, on which clients connect and wait forever. (CI once hung 78
//! minutes this way, a daemon killed in the middle of `zfs destroy -f`.)
//!
//! The way out is the one an operator would take: abort the connections
//! through FUSE's control filesystem. The daemon lists them in
//! `uzfsd.conns` in its run directory ([`note`]); a client that finds the
//! daemon it waits on dying ([`dying`]) aborts each listed connection that
//! mountinfo still shows mounted where it was (a minor is reused once its
//! mount is gone), and waits until the run directory's lock is free
//! ([`cut_loose`]). A daemon that is dying without being stuck loses
//! nothing by it: its connections are dead already.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FILE: &str = "uzfsd.conns";

/// Record this daemon's FUSE connections (minor, mountpoint as mountinfo
/// lists it), replacing the last list. Best effort: a list that cannot be
/// written only means a stuck daemon needs an operator.
pub fn note<'a>(rundir: &Path, conns: impl Iterator<Item = (u32, &'a Path)>) {
    let mut text = format!("pid {}\n", std::process::id());
    for (minor, at) in conns {
        let Some(at) = at.to_str().filter(|s| !s.contains('\n')) else {
            continue;
        };
        text.push_str(&format!("{minor}\t{at}\n"));
    }
    let tmp = rundir.join(format!("{FILE}.tmp"));
    if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, rundir.join(FILE)).is_err() {
        log::warn!("cannot record the FUSE connections in {}", rundir.display());
    }
}

/// The connections `text` (an `uzfsd.conns`) lists for daemon `pid`.
fn listed(text: &str, pid: i32) -> Vec<(u32, PathBuf)> {
    let mut lines = text.lines();
    if lines.next() != Some(&format!("pid {pid}")) {
        return Vec::new();
    }
    lines
        .filter_map(|l| {
            let (minor, at) = l.split_once('\t')?;
            Some((minor.parse().ok()?, PathBuf::from(at)))
        })
        .collect()
}

/// Whether process `pid` is gone or exiting: its main thread a zombie
/// (`Z`, while other threads may still be stuck) or dead (`X`).
pub fn dying(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "PID (COMM) STATE ...": COMM may hold anything, ')' included.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("Z") | Some("X"))
}

/// Free dying daemon `pid` of the requests it sent itself: abort the
/// FUSE connections it listed that are still mounted where they were,
/// then wait (up to 10 s) until its run-directory lock is released, so a
/// new daemon can start. Returns how many connections were aborted.
pub fn cut_loose(rundir: &Path, pid: i32) -> usize {
    let text = std::fs::read_to_string(rundir.join(FILE)).unwrap_or_default();
    let mut aborted = 0;
    for (minor, at) in listed(&text, pid) {
        if crate::fuse::mountinfo::serves(minor, &at) {
            match crate::fuse::session::abort_connection(minor) {
                Ok(()) => aborted += 1,
                Err(e) => eprintln!("uzfs: daemon {pid} is stuck dying: {e}"),
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let free = std::fs::File::open(rundir.join("uzfsd.lock"))
            .map(|f| f.try_lock().is_ok())
            .unwrap_or(true);
        if free {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    aborted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_only_its_own_daemons_connections() {
        let text = "pid 42\n43\t/mnt/a b\nbad\n44\t/mnt/c\n";
        assert_eq!(
            listed(text, 42),
            vec![
                (43, PathBuf::from("/mnt/a b")),
                (44, PathBuf::from("/mnt/c"))
            ]
        );
        assert!(listed(text, 7).is_empty(), "another daemon's list");
        assert!(listed("", 42).is_empty());
    }

    #[test]
    fn a_live_process_is_not_dying() {
        assert!(!dying(std::process::id() as i32));
        assert!(dying(i32::MAX), "no such process");
    }

    #[test]
    fn notes_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        note(
            dir.path(),
            [(5, Path::new("/x")), (6, Path::new("/y\nz"))].into_iter(),
        );
        let text = std::fs::read_to_string(dir.path().join(FILE)).expect("read");
        assert_eq!(
            listed(&text, std::process::id() as i32),
            vec![(5, PathBuf::from("/x"))]
        );
    }
}
