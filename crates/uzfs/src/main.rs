//! `uzfs`: one multi-call binary. `uzfs zpool ...`, `uzfs zfs ...` and
//! `uzfs zdb ...`, or the same through links named `zpool`, `zfs`, `zdb`.
//! `uzfs daemon` runs the daemon that holds imported pools; the CLI starts it
//! on first use. The run directory comes from `--rundir DIR` or `UZFS_RUNDIR`.

mod arcstat;
mod client;
mod daemon;
mod fmt;
mod fuse;
mod fuse_floor;
mod iostat;
mod mounts;
mod status;
mod vdevs;
mod wedge;
mod zdb;
mod zfs;
mod zilstat;
mod zpool;

use std::io::Write;
use std::path::Path;

const USAGE: &str = "usage: uzfs [--rundir DIR] <command> [args]

commands:
    zpool ...            pool administration (see 'uzfs zpool help')
    zfs ...              dataset administration
    zdb ...              inspect and verify pools offline
    zinject ...          inject device faults (see 'uzfs zinject -h')
    zilstat [-p POOL] [interval [count]]
                         intent log activity per dataset
    arcstat [-f FIELDS] [-v] [-p POOL] [interval [count]]
                         block cache (ARC) hits, misses, sizes, daemon memory
    daemon [--foreground | --stop | --status]
                         run, stop or query the daemon
    object put POOL FILE | get POOL OBJ FILE | free POOL OBJ
                         raw object access to a pool's root dataset
    link DIR             install zpool/zfs/zdb links to this binary in DIR

The run directory (socket, pool cache, log) is --rundir, else $UZFS_RUNDIR,
else /run/uzfs for root.
";

/// Write to stdout or stderr; a closed pipe (`uzfs ... | head`) is not an
/// error worth a panic, so write failures are ignored.
pub fn out(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes()).and_then(|_| o.flush());
}

pub fn err(s: &str) {
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

fn emit(r: client::Response) -> i32 {
    out(&r.stdout);
    err(&r.stderr);
    r.code
}

fn main() {
    // The engine reads no environment: tunables that come from it are
    // handed over here (and in `Daemon::tunables`).
    uzfs_core::vdev::device::set_direct_io(
        std::env::var("UZFS_DIRECT_IO").map_or(true, |v| v != "0"),
    );
    uzfs_core::vdev::queue::set_enabled(
        std::env::var("UZFS_VDEV_QUEUE").map_or(true, |v| v != "0"),
    );
    uzfs_core::spa::io::set_compressed_arc(
        std::env::var("UZFS_COMPRESSED_ARC").map_or(true, |v| v != "0"),
    );
    uzfs_core::spa::io::set_hand_off(std::env::var("UZFS_ARC_HAND_OFF").map_or(true, |v| v != "0"));
    uzfs_core::dmu::partial::set_fill_at_sync(
        std::env::var("UZFS_FILL_AT_SYNC").is_ok_and(|v| v == "1"),
    );
    if let Ok(v) = std::env::var("UZFS_ARC_CACHE_WRITES") {
        use uzfs_core::spa::io::CacheWritten;
        let p = match v.as_str() {
            "always" => Some(CacheWritten::Always),
            "never" => Some(CacheWritten::Never),
            _ => None,
        };
        match p {
            Some(p) => uzfs_core::spa::io::set_cache_written(p),
            None => eprintln!("uzfs: UZFS_ARC_CACHE_WRITES={v} ignored (always or never)"),
        }
    }
    if let Some(rate) = std::env::var("UZFS_L2ARC_WRITE_MAX")
        .ok()
        .and_then(|v| uzfs_core::dsl::props::parse_size(&v).ok())
    {
        uzfs_core::arc::l2::set_write_max(rate);
    }
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut rest: Vec<String> = args.iter().skip(1).cloned().collect();
    let mut rundir_flag = None;
    let cmd = if matches!(argv0.as_str(), "zpool" | "zfs" | "zdb" | "zinject") {
        argv0.clone()
    } else {
        while let Some(a) = rest.first() {
            if a == "--rundir" && rest.len() > 1 {
                rundir_flag = Some(rest[1].clone());
                rest.drain(..2);
            } else if let Some(v) = a.strip_prefix("--rundir=") {
                rundir_flag = Some(v.to_string());
                rest.remove(0);
            } else {
                break;
            }
        }
        if rest.is_empty() {
            err(USAGE);
            std::process::exit(2);
        }
        rest.remove(0)
    };
    let rundir = client::rundir(rundir_flag.as_deref());
    let code = match cmd.as_str() {
        "zpool" | "zfs" | "object" | "zinject" => {
            if cmd == "zpool" && rest.first().is_none_or(|a| a == "help" || a == "-?") {
                out(zpool::USAGE);
                0
            } else if cmd == "zpool" && rest.first().is_some_and(|a| a == "iostat") {
                iostat::client(&rundir, &rest[1..])
            } else {
                let mut argv = vec![cmd.clone()];
                argv.extend(rest);
                emit(client::call(&rundir, argv))
            }
        }
        "zdb" => {
            // A pool the daemon holds is verified inside it, with commits
            // paused; anything else (-e, -l, no daemon) runs here.
            let held = zdb::named_pool(&rest).is_some_and(|name| {
                client::connect(&rundir).is_ok()
                    && std::fs::read_to_string(rundir.join("zpool.cache"))
                        .ok()
                        .and_then(|c| serde_json::from_str::<Vec<daemon::CacheEntry>>(&c).ok())
                        .is_some_and(|c| c.iter().any(|e| e.name == name))
            });
            if held {
                let mut argv = vec!["zdb".to_string()];
                argv.extend(rest);
                emit(client::call(&rundir, argv))
            } else {
                zdb::run(&rundir, &rest)
            }
        }
        "zilstat" => zilstat::client(&rundir, &rest),
        "arcstat" => arcstat::client(&rundir, &rest),
        "daemon" => match rest.first().map(String::as_str) {
            Some("--foreground") => daemon::run(&rundir),
            Some("--stop") => ask_running_daemon(&rundir, "shutdown", 0),
            Some("--status") => ask_running_daemon(&rundir, "ping", 1),
            None => match client::start_daemon(&rundir) {
                Ok(_) => emit(client::call(&rundir, vec!["ping".into()])),
                Err(e) => {
                    err(&format!("uzfs daemon: {e}\n"));
                    1
                }
            },
            Some(other) => {
                err(&format!("uzfs daemon: unknown option '{other}'\n{USAGE}\n"));
                2
            }
        },
        // Benchmark tool (bench/fs.sh), not in the usage text.
        "fuse-floor" => match rest.first() {
            Some(dir) => fuse_floor::run(Path::new(dir)),
            None => {
                err("usage: uzfs fuse-floor MOUNTPOINT\n");
                2
            }
        },
        "link" => match rest.first() {
            Some(dir) => link(Path::new(dir)),
            None => {
                err("usage: uzfs link DIR\n");
                2
            }
        },
        "help" | "--help" | "-h" => {
            out(USAGE);
            0
        }
        other => {
            err(&format!("uzfs: unknown command '{other}'\n{USAGE}\n"));
            2
        }
    };
    std::process::exit(code);
}

/// Send `request` to the daemon if one is running (never start one);
/// otherwise say so and return `code_if_none`.
fn ask_running_daemon(rundir: &Path, request: &str, code_if_none: i32) -> i32 {
    let sock = client::socket_path(rundir);
    match client::connect(rundir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            err(&format!("uzfs daemon: {e}\n"));
            return 1;
        }
        Err(_) => {
            out(&format!(
                "no uzfs daemon is running on {}\n",
                sock.display()
            ));
            return code_if_none;
        }
    }
    emit(client::call(rundir, vec![request.into()]))
}

/// Install zpool/zfs/zdb symlinks to this binary in `dir`.
fn link(dir: &Path) -> i32 {
    let Ok(exe) = std::env::current_exe() else {
        err("uzfs link: cannot find my own path\n");
        return 1;
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        err(&format!("uzfs link: {}: {e}\n", dir.display()));
        return 1;
    }
    for name in ["zpool", "zfs", "zdb", "zinject"] {
        let l = dir.join(name);
        if let Ok(m) = std::fs::symlink_metadata(&l) {
            if !m.file_type().is_symlink() {
                err(&format!(
                    "uzfs link: {} exists and is not a link; leaving it alone\n",
                    l.display()
                ));
                return 1;
            }
            let _ = std::fs::remove_file(&l);
        }
        if let Err(e) = std::os::unix::fs::symlink(&exe, &l) {
            err(&format!("uzfs link: {}: {e}\n", l.display()));
            return 1;
        }
        out(&format!("{} -> {}\n", l.display(), exe.display()));
    }
    0
}
