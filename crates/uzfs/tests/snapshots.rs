//! Snapshots through the command line on a real mount: `zfs snapshot
//! [-r]`, `zfs list -t snapshot|all`, the space they hold, `zfs destroy`
//! of one (with `-nv` first, which changes nothing), refusals, the pool
//! history, and zdb clean after export (it walks every snapshot).

mod common;
use common::*;

/// A `zfs list -Hp -o name,PROP` value for `name`.
fn prop(e: &Env, name: &str, p: &str) -> u64 {
    let out = e.ok(&["zfs", "list", "-Hp", "-o", p, name]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{name} {p}: {out:?}"))
}

#[test]
fn snapshots_through_the_command_line() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    e.ok(&["zfs", "create", "tank/home"]);
    let file = mnt.join("home/f");
    let mut rng = Rng(7);
    // Written through the page cache, not synced: `zfs snapshot` must see
    // it anyway (every write that returned before the command).
    std::fs::write(&file, rng.bytes(8 << 20)).expect("write");
    e.ok(&["zfs", "snapshot", "-r", "tank@one"]);
    let listed = e.ok(&["zfs", "list", "-H", "-t", "snapshot", "-o", "name"]);
    assert_eq!(listed, "tank@one\ntank/home@one\n");
    assert!(prop(&e, "tank/home@one", "referenced") >= 8 << 20);
    assert_eq!(prop(&e, "tank/home", "usedbysnapshots"), 0);
    // Overwrite half: the snapshot now holds 4 MiB the file no longer does.
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .expect("open");
        f.seek(std::io::SeekFrom::Start(0)).expect("seek");
        f.write_all(&rng.bytes(4 << 20)).expect("write");
        f.sync_all().expect("fsync");
    }
    e.ok(&["zpool", "sync", "tank"]);
    let held = prop(&e, "tank/home", "usedbysnapshots");
    assert!((4 << 20..5 << 20).contains(&held), "usedbysnapshots {held}");
    assert_eq!(prop(&e, "tank/home@one", "used"), held);
    let used = prop(&e, "tank/home", "used");
    let refd = prop(&e, "tank/home", "referenced");
    assert_eq!(used, refd + held);
    // A dry run says what would go, and changes nothing.
    let dry = e.ok(&["zfs", "destroy", "-nv", "tank/home@one"]);
    assert!(
        dry.contains("would destroy tank/home@one") && dry.contains("would reclaim"),
        "{dry}"
    );
    assert!(e
        .ok(&["zfs", "list", "-H", "-t", "all", "-o", "name"])
        .contains("tank/home@one"));
    // Refusals: a name taken, no '@', a dataset with snapshots.
    e.fails(
        &["zfs", "snapshot", "tank/home@one"],
        1,
        "dataset already exists",
    );
    e.fails(&["zfs", "snapshot", "tank/home"], 1, "missing '@'");
    e.fails(&["zfs", "destroy", "tank/home"], 1, "has snapshots");
    e.fails(
        &["zfs", "destroy", "tank/home@nothere"],
        1,
        "could not find",
    );
    e.ok(&["zfs", "destroy", "tank/home@one"]);
    e.ok(&["zpool", "sync", "tank"]);
    assert_eq!(prop(&e, "tank/home", "usedbysnapshots"), 0);
    e.ok(&["zfs", "snapshot", "tank/home@two"]);
    // `listsnapshots=on`: `zfs list` without `-t` shows them too.
    assert!(!e.ok(&["zfs", "list", "-H", "-o", "name"]).contains('@'));
    e.ok(&["zpool", "set", "listsnapshots=on", "tank"]);
    assert!(e
        .ok(&["zfs", "list", "-H", "-o", "name"])
        .contains("tank/home@two"));
    e.ok(&["zpool", "set", "listsnapshots=off", "tank"]);
    let hist = e.ok(&["zpool", "history", "tank"]);
    assert!(
        hist.contains("zfs snapshot -r tank@one") && hist.contains("zfs destroy tank/home@one"),
        "{hist}"
    );
    // -r destroys the dataset with its snapshots.
    e.ok(&["zfs", "destroy", "-r", "tank/home"]);
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-t", "all", "-o", "name"]),
        "tank\ntank@one\n"
    );
    e.export_and_zdb("tank");
}
