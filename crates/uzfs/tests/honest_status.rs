//! What uzfs reports must be true: a pool whose data cannot be read does
//! not say "No known data errors", a scrub that stopped does not show as
//! finished, a command that failed did not half-happen, an impossible
//! setting is refused, and a tool that found nothing does not exit 0.

mod common;
use common::{can_mount, noise, put_bytes, write_synced, Env, Rng};

/// A single-disk pool whose file blocks were corrupted: reading them
/// fails, and `zpool status` must say data is lost (OpenZFS's "error
/// resulting in data corruption", a data error count), never that
/// applications are unaffected and no data errors are known.
#[test]
fn unreadable_data_on_a_single_disk_is_reported_as_data_errors() {
    let e = Env::new();
    let a = e.disk("a", 128);
    e.ok(&["zpool", "create", "tank", &a]);
    let obj = put_bytes(&e, "tank", 1, &noise(7, 8 << 20));
    e.ok(&["zpool", "sync", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(st.contains("errors: No known data errors"), "{st}");
    let out = e.ok(&["zinject", "-d", &a, "-C", "400", "tank"]);
    assert!(out.contains("Corrupted"), "{out}");
    e.ok(&["zinject", "-a", "tank"]);
    let back = e.dir.path().join("back");
    let o = e.run(&["object", "get", "tank", &obj, &back.display().to_string()]);
    assert!(!o.status.success(), "corrupted object read back whole");
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(
        !st.contains("Applications are unaffected") && !st.contains("No known data errors"),
        "{st}"
    );
    assert!(
        st.contains("Applications may be affected") && st.contains("data errors: "),
        "{st}"
    );
    let x = e.ok(&["zpool", "status", "-x"]);
    assert!(x.contains("pool: tank"), "status -x: {x}");
    // A scrub finds them again: the count stands.
    e.ok(&["zpool", "scrub", "-w", "tank"]);
    let st = e.ok(&["zpool", "status", "tank"]);
    assert!(
        st.contains("Applications may be affected") && st.contains("data errors: "),
        "after scrub: {st}"
    );
}

/// `zdb -l` of a device with no valid label prints what it found and
/// exits 2 (as OpenZFS's), not 0.
#[test]
fn zdb_l_without_labels_fails() {
    let e = Env::new();
    let blank = e.disk("blank", 16);
    let o = e.run(&["zdb", "-l", &blank]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("failed to unpack label 3"), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no valid label"));
    let a = e.disk("a", 128);
    e.ok(&["zpool", "create", "tank", &a]);
    let out = e.ok(&["zdb", "-l", &a]);
    assert!(out.contains("LABEL 0"), "{out}");
}

/// A reservation the pool cannot hold is refused (OpenZFS: "size is
/// greater than available space"), by `zfs set` and `zfs create -o`,
/// and changes nothing; one that fits is taken, and counts against the
/// others.
#[test]
fn a_reservation_larger_than_the_pool_is_refused() {
    let e = Env::new();
    let a = e.disk("a", 256);
    e.ok(&["zpool", "create", "tank", &a]);
    e.ok(&["zfs", "create", "tank/a"]);
    e.fails(
        &["zfs", "set", "reservation=100G", "tank/a"],
        1,
        "size is greater than available space",
    );
    let v = e.ok(&[
        "zfs",
        "get",
        "-H",
        "-o",
        "value,source",
        "reservation",
        "tank/a",
    ]);
    assert_eq!(v, "none\tdefault\n");
    e.fails(
        &["zfs", "create", "-o", "reservation=100G", "tank/b"],
        1,
        "size is greater than available space",
    );
    let list = e.ok(&["zfs", "list", "-H", "-o", "name"]);
    assert!(!list.contains("tank/b"), "{list}");
    e.ok(&["zfs", "set", "reservation=100M", "tank/a"]);
    // 100M of the pool's ~220M is promised to tank/a: another 150M is not
    // there, for a new dataset or the old one growing its reservation.
    e.fails(
        &["zfs", "create", "-o", "reservation=150M", "tank/b"],
        1,
        "size is greater than available space",
    );
    e.ok(&["zfs", "set", "reservation=150M", "tank/a"]);
    e.ok(&["zfs", "create", "-o", "reservation=20M", "tank/b"]);
}

/// An export whose last sync fails (the device fails every write) says
/// so and leaves the pool imported: it used to answer "cannot export" and
/// drop the pool all the same. Once the pool is given up as suspended,
/// export works, and the pool imports at its last committed txg.
#[test]
fn a_failed_export_leaves_the_pool_imported() {
    let mut e = Env::new();
    // A long txg timeout: the export's sync is the first to meet the error.
    e.envs.push(("UZFS_TXG_TIMEOUT".into(), "600".into()));
    let a = e.disk("a", 128);
    e.ok(&["zpool", "create", "-m", "none", "tank", &a]);
    let obj = put_bytes(&e, "tank", 1, &noise(3, 1 << 20));
    e.ok(&["zpool", "sync", "tank"]);
    e.ok(&["zpool", "set", "comment=changed", "tank"]);
    e.ok(&["zinject", "-d", &a, "-e", "io", "-T", "write", "tank"]);
    e.fails(
        &["zpool", "export", "tank"],
        1,
        "the pool is still imported",
    );
    let list = e.ok(&["zpool", "list", "-H", "-o", "name"]);
    assert_eq!(list, "tank\n");
    e.ok(&["zinject", "-c", "all", "tank"]);
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-d", ".", "tank"]);
    common::get_matches(&e, "tank", &obj, 1);
}

/// A reservation holds against the other datasets' writes: filling one
/// filesystem stops with ENOSPC where the other's unused reservation
/// begins, and the reserved one can still write what it was promised.
#[test]
fn writes_elsewhere_leave_a_reservation_free() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    e.ok(&["zfs", "create", "-o", "reservation=80M", "tank/kept"]);
    e.ok(&["zfs", "create", "tank/fill"]);
    let mut rng = Rng(12);
    let chunk = rng.bytes(4 << 20);
    let mut filled = 0u64;
    let mut hit = None;
    for i in 0..200 {
        match write_synced(&mnt.join(format!("fill/f{i}")), &chunk) {
            Ok(()) => filled += 4 << 20,
            Err(err) => {
                hit = err.raw_os_error();
                break;
            }
        }
    }
    assert_eq!(
        hit,
        Some(libc::ENOSPC),
        "filled {filled} bytes without ENOSPC"
    );
    // What tank/kept was promised is still there for it.
    for i in 0..15 {
        write_synced(&mnt.join(format!("kept/k{i}")), &chunk).expect("a reserved write");
    }
    e.ok(&["zpool", "sync", "tank"]);
    e.export_and_zdb("tank");
}
