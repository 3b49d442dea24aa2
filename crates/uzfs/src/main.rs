//! `uzfs`: one multi-call binary. `uzfs zpool ...`, `uzfs zfs ...` and
//! `uzfs zdb ...`, or the same through links named `zpool`, `zfs`, `zdb`.
//! `uzfs daemon` runs the daemon that holds imported pools; the CLI starts it
//! on first use. The run directory comes from `--rundir DIR` or `UZFS_RUNDIR`.

mod client;
mod daemon;
mod fmt;
mod zdb;
mod zfs;
mod zpool;

use std::io::Write;
use std::path::Path;

const USAGE: &str = "usage: uzfs [--rundir DIR] <command> [args]

commands:
    zpool ...            pool administration (see 'uzfs zpool help')
    zfs ...              dataset administration
    zdb ...              inspect and verify pools offline
    daemon [--foreground | --stop | --status]
                         run, stop or query the daemon
    object put POOL FILE | get POOL OBJ FILE | free POOL OBJ
                         raw object access to a pool's root dataset
    link DIR             install zpool/zfs/zdb links to this binary in DIR

The run directory (socket, pool cache, log) is --rundir, else $UZFS_RUNDIR,
else /run/uzfs for root.
";

fn emit(r: client::Response) -> i32 {
    print!("{}", r.stdout);
    eprint!("{}", r.stderr);
    let _ = std::io::stdout().flush();
    r.code
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut rest: Vec<String> = args.iter().skip(1).cloned().collect();
    let mut rundir_flag = None;
    let cmd = if matches!(argv0.as_str(), "zpool" | "zfs" | "zdb") {
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
            eprint!("{USAGE}");
            std::process::exit(2);
        }
        rest.remove(0)
    };
    let rundir = client::rundir(rundir_flag.as_deref());
    let code = match cmd.as_str() {
        "zpool" | "zfs" | "object" => {
            if cmd == "zpool" && rest.first().is_none_or(|a| a == "help" || a == "-?") {
                print!("{}", zpool::USAGE);
                0
            } else {
                let mut argv = vec![cmd.clone()];
                argv.extend(rest);
                emit(client::call(&rundir, argv))
            }
        }
        "zdb" => zdb::run(&rundir, &rest),
        "daemon" => match rest.first().map(String::as_str) {
            Some("--foreground") => daemon::run(&rundir),
            Some("--stop") => {
                let sock = client::socket_path(&rundir);
                if std::os::unix::net::UnixStream::connect(&sock).is_err() {
                    println!("no uzfs daemon is running on {}", sock.display());
                    0
                } else {
                    emit(client::call(&rundir, vec!["shutdown".into()]))
                }
            }
            Some("--status") => {
                let sock = client::socket_path(&rundir);
                if std::os::unix::net::UnixStream::connect(&sock).is_err() {
                    println!("no uzfs daemon is running on {}", sock.display());
                    1
                } else {
                    emit(client::call(&rundir, vec!["ping".into()]))
                }
            }
            None => match client::start_daemon(&rundir) {
                Ok(()) => emit(client::call(&rundir, vec!["ping".into()])),
                Err(e) => {
                    eprintln!("uzfs daemon: {e}");
                    1
                }
            },
            Some(other) => {
                eprintln!("uzfs daemon: unknown option '{other}'\n{USAGE}");
                2
            }
        },
        "link" => match rest.first() {
            Some(dir) => link(Path::new(dir)),
            None => {
                eprintln!("usage: uzfs link DIR");
                2
            }
        },
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            0
        }
        other => {
            eprintln!("uzfs: unknown command '{other}'\n{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

/// Install zpool/zfs/zdb symlinks to this binary in `dir`.
fn link(dir: &Path) -> i32 {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("uzfs link: cannot find my own path");
        return 1;
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("uzfs link: {}: {e}", dir.display());
        return 1;
    }
    for name in ["zpool", "zfs", "zdb"] {
        let l = dir.join(name);
        if let Ok(m) = std::fs::symlink_metadata(&l) {
            if !m.file_type().is_symlink() {
                eprintln!(
                    "uzfs link: {} exists and is not a link; leaving it alone",
                    l.display()
                );
                return 1;
            }
            let _ = std::fs::remove_file(&l);
        }
        if let Err(e) = std::os::unix::fs::symlink(&exe, &l) {
            eprintln!("uzfs link: {}: {e}", l.display());
            return 1;
        }
        println!("{} -> {}", l.display(), exe.display());
    }
    0
}
