//! `sync=always` through a real mount: every change is on stable storage
//! before the system call returns, with no fsync, so a daemon killed right
//! after loses none of them. Files there are opened with direct I/O (the
//! writeback cache would acknowledge write(2) before the daemon saw it).

mod common;
use common::{can_mount, noise, Env};
use std::io::Write;

#[test]
fn sync_always_keeps_every_change_without_fsync_across_a_kill() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let m = e.tank();
    e.ok(&["zfs", "create", "tank/db"]);
    assert_eq!(
        e.ok(&["zfs", "get", "-H", "-o", "value,source", "sync", "tank/db"]),
        "standard\tdefault\n"
    );
    e.ok(&["zfs", "set", "sync=always", "tank"]);
    assert_eq!(
        e.ok(&["zfs", "get", "-H", "-o", "value,source", "sync", "tank/db"]),
        "always\tinherited from tank\n"
    );
    let db = m.join("db");
    for round in 0..3u64 {
        // A write through an open descriptor, a namespace change, a
        // metadata change: no fsync anywhere, then a kill at once.
        let data = noise(round + 1, 300_000);
        let mut f = std::fs::File::create(db.join("t.tmp")).expect("create");
        f.write_all(&data).expect("write");
        std::fs::rename(db.join("t.tmp"), db.join(format!("t{round}"))).expect("rename");
        std::fs::create_dir(db.join(format!("d{round}"))).expect("mkdir");
        e.kill_daemon();
        drop(f);
        // The next command starts a daemon, which imports and mounts again.
        e.ok(&["zpool", "status", "tank"]);
        let back = std::fs::read(db.join(format!("t{round}"))).expect("the renamed file");
        assert!(
            back == data,
            "round {round}: the file differs after the kill"
        );
        assert!(
            !db.join("t.tmp").exists(),
            "round {round}: the old name is back"
        );
        assert!(
            db.join(format!("d{round}")).is_dir(),
            "round {round}: mkdir lost"
        );
    }
    // Shared mmap still works on files opened with direct I/O (the
    // kernel's DIRECT_IO_ALLOW_MMAP), and msync commits.
    let py = "import mmap,sys\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\nm[0:5]=b'MMAP!'\nm.flush()\nm.close()\nf.close()\n";
    let o = std::process::Command::new("/usr/bin/python3")
        .args(["-c", py, &db.join("t0").to_string_lossy()])
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "mmap: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    e.kill_daemon();
    e.ok(&["zpool", "status", "tank"]);
    let back = std::fs::read(db.join("t0")).expect("t0");
    assert_eq!(&back[..5], b"MMAP!");
    // Bad values are refused and change nothing.
    let o = e.run(&["zfs", "set", "sync=sometimes", "tank"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("'standard', 'always' or 'disabled'"));
    assert_eq!(
        e.ok(&["zfs", "get", "-H", "-o", "value", "sync", "tank"]),
        "always\n"
    );
    e.export_and_zdb("tank");
}
