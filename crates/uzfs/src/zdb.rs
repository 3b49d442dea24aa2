//! `zdb`: runs in the calling process, reading devices directly (it never
//! writes). The pool's devices come from the daemon's pool cache, or with
//! `-e` from scanning the directories given with `-p` (default /dev).

use crate::daemon::{open_paths, CacheEntry};
use crate::zpool::getopt;
use std::path::Path;
use uzfs_core::spa::import::{discover, scan_dir};
use uzfs_core::vdev::FileDevice;
use uzfs_core::zdb;

pub const USAGE: &str = "usage: zdb [-CbcuL] [-e [-p dir]...] poolname
       zdb -l device
    -C  show the pool configuration
    -u  show the uberblock rings and the active uberblock
    -b  traverse all blocks: verify every checksum of every copy and
        cross-check the space maps (leaks, double allocations)
    -c  same as -b
    -l  dump the labels of one device
    -e  the pool is exported: find it by scanning -p directories
";

pub fn run(rundir: &Path, args: &[String]) -> i32 {
    let (o, rest) = match getopt(args, "CbcuLl:ep:h") {
        Ok(x) => x,
        Err(e) => {
            eprintln!("zdb: {e}\n{USAGE}");
            return 2;
        }
    };
    let has = |c: char| o.iter().any(|(k, _)| *k == c);
    if has('h') {
        print!("{USAGE}");
        return 0;
    }
    if let Some((_, Some(dev))) = o.iter().find(|(k, _)| *k == 'l') {
        return match FileDevice::open(Path::new(dev)) {
            Ok(d) => {
                print!("{}", zdb::dump_labels(&d));
                0
            }
            Err(e) => {
                eprintln!("zdb: cannot open '{dev}': {e}");
                1
            }
        };
    }
    let Some(name) = rest.first() else {
        eprintln!("{USAGE}");
        return 2;
    };
    let devs = if has('e') {
        let dirs: Vec<String> = o
            .iter()
            .filter(|(k, _)| *k == 'p')
            .filter_map(|(_, v)| v.clone())
            .collect();
        let dirs = if dirs.is_empty() {
            vec!["/dev".to_string()]
        } else {
            dirs
        };
        let mut v = Vec::new();
        for d in dirs {
            match scan_dir(Path::new(&d)) {
                Ok(x) => v.extend(x),
                Err(e) => {
                    eprintln!("zdb: {e}");
                    return 1;
                }
            }
        }
        v
    } else {
        let cache: Vec<CacheEntry> = std::fs::read(rundir.join("zpool.cache"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        match cache.iter().find(|e| &e.name == name) {
            Some(e) => open_paths(&e.paths),
            None => {
                eprintln!("zdb: can't open '{name}': no such pool in the cache (use -e -p DIR for an exported pool)");
                return 1;
            }
        }
    };
    let found = discover(devs)
        .into_iter()
        .find(|f| &f.config.name == name || f.config.pool_guid.to_string() == *name);
    let Some(found) = found else {
        eprintln!("zdb: can't open '{name}': no such pool on the devices searched");
        return 1;
    };
    let all = !(has('C') || has('u') || has('b') || has('c'));
    if all || has('C') {
        println!("\nMOS Configuration:");
        println!(
            "{}",
            serde_json::to_string_pretty(&found.config).unwrap_or_default()
        );
    }
    if all || has('u') {
        print!("{}", zdb::dump_uberblocks(&found));
    }
    if all || has('b') || has('c') {
        match zdb::verify_found(&found) {
            Ok(r) => {
                print!("\n{}", zdb::format_report(&r));
                if !r.is_clean() {
                    return 1;
                }
            }
            Err(e) => {
                eprintln!("zdb: cannot open '{name}': {e}");
                return 1;
            }
        }
    }
    0
}
