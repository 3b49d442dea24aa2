//! `zfs` subcommands. Datasets, snapshots and mounts arrive with issue #4;
//! until then every pool has exactly its root dataset, which `zfs list`
//! shows, and the other verbs say plainly that they are not there yet.

use crate::client::Response;
use crate::daemon::Daemon;
use crate::fmt::{nicenum, Table};

pub fn run(d: &Daemon, args: &[String]) -> Response {
    match args.first().map(String::as_str) {
        Some("list") => {
            let scripted = args.iter().any(|a| a == "-H");
            let pools: Vec<_> = d.pools.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            if pools.is_empty() {
                return Response::ok("no datasets available\n".into());
            }
            let mut t = Table::new(&["NAME", "USED", "AVAIL", "REFER", "MOUNTPOINT"], &[false, true, true, true, false]);
            for p in pools {
                let (_, alloc, _) = p.space();
                let avail = p.writable_space();
                t.rows.push(vec![p.name.clone(), nicenum(alloc), nicenum(avail), nicenum(alloc), "-".into()]);
            }
            Response::ok(t.render(scripted))
        }
        Some(other) => Response::err(
            1,
            format!("zfs {other}: datasets, snapshots and mounts are not implemented yet (issue #4); 'zfs list' shows each pool's root dataset"),
        ),
        None => Response::err(2, "usage: zfs command args ...\n\tlist [-H]\n"),
    }
}
