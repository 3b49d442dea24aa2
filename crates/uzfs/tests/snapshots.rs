//! Snapshots through the command line on a real mount: `zfs snapshot
//! [-r]`, `zfs list -t snapshot|all`, the space they hold, `zfs destroy`
//! of one (with `-nv` first, which changes nothing), refusals, the pool
//! history, and zdb clean after export (it walks every snapshot).

mod common;
use common::*;

/// Pool "tank" mounted, with filesystem `ds` created in it: the
/// environment and tank's mount point (`None` where FUSE cannot mount).
fn tank_with(ds: &str) -> Option<(Env, std::path::PathBuf)> {
    if !can_mount() {
        return None;
    }
    let e = Env::new();
    let mnt = e.tank();
    e.ok(&["zfs", "create", ds]);
    Some((e, mnt))
}

/// A `zfs list -Hp -o name,PROP` value for `name`.
fn prop(e: &Env, name: &str, p: &str) -> u64 {
    let out = e.ok(&["zfs", "list", "-Hp", "-o", p, name]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{name} {p}: {out:?}"))
}

#[test]
fn snapshots_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    let file = mnt.join("home/f");
    let mut rng = Rng(7);
    // Written through the page cache, not synced: `zfs snapshot` must see
    // it anyway (every write that returned before the command).
    std::fs::write(&file, rng.bytes(8 << 20)).expect("write");
    e.ok(&["zfs", "snapshot", "-r", "tank@one"]);
    let listed = e.ok(&["zfs", "list", "-H", "-t", "snapshot", "-o", "name"]);
    assert_eq!(listed, "tank@one\ntank/home@one\n");
    assert!(prop(&e, "tank/home@one", "referenced") >= 8 << 20);
    // zfs get of snapshots, as sanoid asks it: -t snapshot, -r, -p.
    let got = e.ok(&["zfs", "get", "-Hrpt", "snapshot", "creation,createtxg"]);
    let rows: Vec<Vec<&str>> = got.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 4, "{got}");
    for r in &rows {
        assert!(r[0] == "tank@one" || r[0] == "tank/home@one", "{got}");
        assert!(r[2].parse::<u64>().is_ok() && r[3] == "-", "{got}");
    }
    // A filesystem alone brings no snapshots; -r does.
    assert_eq!(
        e.ok(&["zfs", "get", "-H", "-o", "name", "used", "tank/home"]),
        "tank/home\n"
    );
    assert_eq!(
        e.ok(&["zfs", "get", "-rH", "-o", "name", "used", "tank/home"]),
        "tank/home\ntank/home@one\n"
    );
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

/// Write a small tree (files of several sizes, a symlink, a subdirectory)
/// under `root`.
fn write_tree(root: &std::path::Path, rng: &mut Rng) {
    for d in ["src", "src/deep", "docs"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    for (i, d) in ["src", "src/deep", "docs"].iter().enumerate() {
        for j in 0..6 {
            let len = [0, 100, 4096, 70_000, 300_000, 1 << 20][j];
            std::fs::write(root.join(d).join(format!("f{i}{j}")), rng.bytes(len)).expect("write");
        }
    }
    std::os::unix::fs::symlink("src/f00", root.join("link")).expect("symlink");
}

/// `diff -r A B` finds no difference.
fn same_tree(a: &std::path::Path, b: &std::path::Path) {
    same_tree_but(a, b, &[])
}

/// `diff -r A B` finds no difference outside names `skip`.
fn same_tree_but(a: &std::path::Path, b: &std::path::Path, skip: &[&str]) {
    let o = std::process::Command::new("diff")
        .arg("-r")
        .args(skip.iter().flat_map(|s| ["-x", s]))
        .arg(a)
        .arg(b)
        .output()
        .expect("diff");
    assert!(
        o.status.success(),
        "diff -r {} {}:\n{}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("should fail").raw_os_error().unwrap_or(0)
}

/// `.zfs/snapshot` on a real mount: each snapshot's files as they were,
/// read-only, browsable with tar, diff and rsync while writes go on in
/// the head; snapshots created and destroyed while mounted come and go;
/// `snapdir` hides or lists `.zfs`.
#[test]
fn snapshot_directory_on_a_mount() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    let reference = e.dir.path().join("reference");
    let mut rng = Rng(11);
    write_tree(&mnt, &mut rng);
    write_tree(&reference, &mut Rng(11));
    e.ok(&["zfs", "snapshot", "tank@a"]);
    // Change the head after it: overwrite, remove, add.
    std::fs::write(mnt.join("src/f03"), b"changed").expect("overwrite");
    std::fs::remove_file(mnt.join("docs/f25")).expect("unlink");
    std::fs::write(mnt.join("added"), b"new").expect("add");
    e.ok(&["zfs", "snapshot", "tank@b"]);

    // Hidden by default: not listed, but there.
    let names = |p: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .expect("readdir")
            .map(|d| d.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(!names(&mnt).contains(&".zfs".to_string()));
    let snapdir = mnt.join(".zfs/snapshot");
    assert_eq!(names(&mnt.join(".zfs")), ["snapshot"]);
    assert_eq!(names(&snapdir), ["a", "b"]);
    same_tree(&snapdir.join("a"), &reference);
    assert_eq!(
        std::fs::read(snapdir.join("b/src/f03")).expect("read"),
        b"changed"
    );
    assert!(!snapdir.join("b/docs/f25").exists());
    assert_eq!(
        std::fs::read_link(snapdir.join("a/link")).expect("readlink"),
        std::path::Path::new("src/f00")
    );
    // A snapshot's file is not the head's (another inode).
    use std::os::unix::fs::MetadataExt;
    let head_ino = std::fs::metadata(mnt.join("src/f00")).expect("stat").ino();
    let snap_ino = std::fs::metadata(snapdir.join("a/src/f00"))
        .expect("stat")
        .ino();
    assert_ne!(head_ino, snap_ino);

    // Read-only, every way of changing it.
    assert_eq!(
        errno(std::fs::write(snapdir.join("a/x"), b"x")),
        libc::EROFS
    );
    assert_eq!(
        errno(
            std::fs::OpenOptions::new()
                .write(true)
                .open(snapdir.join("a/src/f00"))
        ),
        libc::EROFS
    );
    assert_eq!(
        errno(std::fs::remove_file(snapdir.join("a/src/f00"))),
        libc::EROFS
    );
    assert_eq!(errno(std::fs::create_dir(snapdir.join("c"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::rename(mnt.join("added"), snapdir.join("a/added"))),
        libc::EXDEV
    );
    assert_eq!(errno(std::fs::create_dir(mnt.join(".zfs"))), libc::EEXIST);

    // tar, diff and rsync of a snapshot while a writer changes the head.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mnt, stop) = (mnt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(5);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let f = format!("src/f0{}", n % 6);
                std::fs::write(mnt.join(&f), rng.bytes(50_000)).expect("rewrite");
                std::fs::write(mnt.join(format!("w{}", n % 50)), rng.bytes(9000)).expect("w");
                n += 1;
            }
            n
        })
    };
    let out = e.dir.path().join("out");
    for tool in ["tar", "rsync", "diff"] {
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("mkdir");
        let src = snapdir.join("a");
        let ok = match tool {
            "tar" => std::process::Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "tar cf - -C {} . | tar xf - -C {}",
                    src.display(),
                    out.display()
                ))
                .status(),
            "rsync" => std::process::Command::new("rsync")
                .arg("-a")
                .arg(format!("{}/", src.display()))
                .arg(&out)
                .status(),
            _ => {
                same_tree(&src, &reference);
                continue;
            }
        }
        .expect(tool);
        assert!(ok.success(), "{tool} of a snapshot failed");
        same_tree(&out, &reference);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = writer.join().expect("writer");
    assert!(rewrites > 0);

    // Snapshots taken and destroyed while mounted come and go.
    e.ok(&["zfs", "snapshot", "tank@c"]);
    assert_eq!(names(&snapdir), ["a", "b", "c"]);
    let held = snapdir.join("a/src/f01");
    e.ok(&["zfs", "destroy", "tank@a"]);
    assert_eq!(names(&snapdir), ["b", "c"]);
    // Its name is gone at once too (not after the entry TTL).
    assert!(!snapdir.join("a").exists(), "a destroyed snapshot's name");
    assert_eq!(
        errno(std::fs::read(&held)),
        libc::ENOENT,
        "a destroyed snapshot's file"
    );
    assert_eq!(names(&snapdir.join("c/src")).len(), 7);

    // snapdir=visible lists `.zfs` in the root (once).
    e.ok(&["zfs", "set", "snapdir=visible", "tank"]);
    let listed = names(&mnt);
    assert_eq!(listed.iter().filter(|n| *n == ".zfs").count(), 1);
    e.fails(&["zfs", "set", "snapdir=shown", "tank"], 1, "snapdir");
    e.export_and_zdb("tank");
}

/// `zfs rollback` on real mounts: refused past later snapshots without
/// `-r`; with it they go; the pool's root dataset rolls back with a child
/// mounted beneath it; a file open across it that the snapshot lacks is
/// stale; files read back as snapshotted through the mount; zdb clean
/// (nothing leaked).
#[test]
fn rollback_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    let mut rng = Rng(3);
    let first = rng.bytes(3 << 20);
    std::fs::write(mnt.join("home/f"), &first).expect("write");
    std::fs::write(mnt.join("top"), b"top").expect("write");
    e.ok(&["zfs", "snapshot", "-r", "tank@a"]);
    let refer_a = prop(&e, "tank/home@a", "referenced");
    std::fs::write(mnt.join("home/f"), rng.bytes(5 << 20)).expect("write");
    std::fs::write(mnt.join("home/g"), b"later").expect("write");
    e.ok(&["zfs", "snapshot", "tank/home@b"]);
    std::fs::write(mnt.join("home/f"), b"third").expect("write");
    e.fails(
        &["zfs", "rollback", "tank/home@a"],
        1,
        "more recent snapshots or bookmarks exist",
    );
    e.fails(
        &["zfs", "rollback", "tank/home@nothere"],
        1,
        "does not exist",
    );
    e.fails(&["zfs", "rollback", "tank/home"], 2, "not a snapshot");
    e.ok(&["zfs", "rollback", "-r", "tank/home@a"]);
    assert_eq!(std::fs::read(mnt.join("home/f")).expect("read"), first);
    assert!(!mnt.join("home/g").exists());
    assert!(e.run(&["zfs", "list", "tank/home@b"]).status.code() != Some(0));
    e.ok(&["zpool", "sync", "tank"]);
    assert_eq!(prop(&e, "tank/home", "referenced"), refer_a);
    // Only metadata the head rewrote since (the snapshot's own object-set
    // block, an atime): @b's 5 MiB went with it.
    assert!(prop(&e, "tank/home", "usedbysnapshots") < 256 << 10);
    // The root dataset, with tank/home mounted beneath it.
    std::fs::remove_file(mnt.join("top")).expect("rm");
    e.ok(&["zfs", "rollback", "tank@a"]);
    assert_eq!(std::fs::read(mnt.join("top")).expect("read"), b"top");
    assert_eq!(std::fs::read(mnt.join("home/f")).expect("read"), first);
    // A file open across the rollback that the snapshot lacks: the mount
    // stays, the descriptor is stale.
    std::fs::write(mnt.join("home/h"), b"busy").expect("write");
    let held = std::fs::File::open(mnt.join("home/h")).expect("open");
    e.ok(&["zfs", "rollback", "tank/home@a"]);
    assert!(!mnt.join("home/h").exists());
    let mut b = [0u8; 4];
    assert_eq!(
        errno(std::os::unix::fs::FileExt::read_at(&held, &mut b, 0)),
        libc::ESTALE
    );
    drop(held);
    let hist = e.ok(&["zpool", "history", "tank"]);
    assert!(hist.contains("zfs rollback -r tank/home@a"), "{hist}");
    e.export_and_zdb("tank");
}

/// A rollback keeps the mount (`fuse/rollback.rs`): with a process whose
/// working directory is inside, descriptors open, a writer running and a
/// child mounted beneath, the filesystem reads as the snapshot at once
/// (names, contents, attributes; nothing the kernel cached survives): a
/// file the snapshot has reads its old bytes through a descriptor opened
/// before, one it lacks answers ESTALE; a child mounted on a directory
/// the rollback removes is mounted again; zdb clean.
#[test]
fn rollback_keeps_the_mount() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    let home = mnt.join("home");
    let mut rng = Rng(11);
    write_tree(&home, &mut rng);
    let before = std::fs::read(home.join("src/f04")).expect("read");
    e.ok(&["zfs", "snapshot", "tank/home@a"]);
    let snap = home.join(".zfs/snapshot/a");

    // Every kind of change, each cached by the kernel after it was made.
    std::fs::write(home.join("src/f04"), rng.bytes(200_000)).expect("write");
    std::fs::write(home.join("docs/new"), b"new").expect("write");
    std::fs::rename(home.join("docs/f20"), home.join("docs/renamed")).expect("rename");
    std::fs::rename(home.join("src/f05"), home.join("src/f03")).expect("rename over");
    std::fs::remove_file(home.join("src/deep/f10")).expect("unlink");
    std::fs::create_dir(home.join("newdir")).expect("mkdir");
    std::fs::write(home.join("newdir/x"), b"x").expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        home.join("docs/f22"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(home.join("docs/f24"))
        .expect("open");
    f.set_len(10).expect("truncate");
    drop(f);
    for p in [
        "src/f04",
        "docs/new",
        "docs/renamed",
        "src/f03",
        "newdir/x",
        "docs/f22",
    ] {
        std::fs::metadata(home.join(p)).expect("stat");
    }
    // A child whose mount point the snapshot lacks.
    e.ok(&["zfs", "create", "tank/home/later"]);
    std::fs::write(home.join("later/kept"), b"kept").expect("write");

    // Users of the mount: a descriptor on a file the snapshot has, one on
    // a file it lacks, a process living in a directory, a writer.
    let old_file = std::fs::File::open(home.join("src/f04")).expect("open");
    let untouched = std::fs::File::open(home.join("docs/f25")).expect("open");
    let untouched_bytes = std::fs::read(home.join("docs/f25")).expect("read");
    let new_file = std::fs::File::open(home.join("docs/new")).expect("open");
    let mut inside = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(home.join("src"))
        .spawn()
        .expect("spawn sleep");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let path = home.join("docs/f21");
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&path, n.to_le_bytes().repeat(512)).expect("writer");
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    e.ok(&["zfs", "rollback", "tank/home@a"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.join().expect("writer") > 0);
    std::fs::write(home.join("docs/f21"), b"settled").expect("write");
    e.ok(&["zfs", "rollback", "tank/home@a"]);

    // At once, no cache left to expire (`later`: the child's mount point,
    // made again). A stat first, before any listing refreshes the kernel.
    let len = std::fs::metadata(home.join("src/f04")).expect("stat").len();
    assert_eq!(len, before.len() as u64);
    same_tree_but(&home, &snap, &["later"]);
    for p in ["docs/new", "docs/renamed", "newdir"] {
        assert!(!home.join(p).exists(), "{p} survived the rollback");
    }
    assert!(std::fs::read(home.join("src/f04")).expect("read") == before);
    let mode = std::fs::metadata(home.join("docs/f22"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        std::fs::metadata(snap.join("docs/f22"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777
    );
    // A descriptor on a file the rollback rewrote or removed fails: ESTALE,
    // or EIO once the kernel retired the inode (a lookup handed its node
    // id out again); one on a file it did not touch reads on.
    let mut b = vec![0u8; before.len()];
    for f in [&old_file, &new_file] {
        let e1 = errno(std::os::unix::fs::FileExt::read_at(f, &mut b, 0));
        assert!(e1 == libc::ESTALE || e1 == libc::EIO, "errno {e1}");
    }
    let n = std::os::unix::fs::FileExt::read_at(&untouched, &mut b, 0).expect("read");
    assert!(
        n > 0 && b[..n] == untouched_bytes[..n],
        "untouched file reads other bytes"
    );
    let cwd = std::fs::read_dir(format!("/proc/{}/cwd", inside.id()))
        .expect("cwd listing")
        .count();
    assert_eq!(
        cwd,
        std::fs::read_dir(snap.join("src")).expect("ls").count()
    );
    inside.kill().expect("kill");
    let _ = inside.wait();
    drop((old_file, new_file, untouched));
    // The child came back on its recreated mount point.
    assert_eq!(
        std::fs::read(home.join("later/kept")).expect("read"),
        b"kept"
    );
    // And the filesystem goes on.
    std::fs::write(home.join("after"), b"after").expect("write");
    assert_eq!(std::fs::read(home.join("after")).expect("read"), b"after");
    e.export_and_zdb("tank");
}

/// `zfs clone` on real mounts: the clone reads as the snapshot, is
/// mounted and written on its own, is charged only what it writes, shows
/// `origin` and `clones`; its origin refuses destroy without `-R`, and
/// `-R` (after a dry run that changes nothing) takes the clone with it;
/// `rollback -R` likewise; zdb clean.
#[test]
fn clones_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/db") else {
        return;
    };
    let mut rng = Rng(9);
    let data = rng.bytes(4 << 20);
    std::fs::write(mnt.join("db/data"), &data).expect("write");
    e.ok(&["zfs", "snapshot", "tank/db@s"]);
    e.ok(&["zfs", "clone", "-o", "atime=off", "tank/db@s", "tank/test"]);
    assert_eq!(std::fs::read(mnt.join("test/data")).expect("read"), data);
    // Writes to either side are its own.
    std::fs::write(mnt.join("test/data"), b"clone").expect("write");
    std::fs::write(mnt.join("test/new"), rng.bytes(1 << 20)).expect("write");
    assert_eq!(std::fs::read(mnt.join("db/data")).expect("read"), data);
    e.ok(&["zpool", "sync", "tank"]);
    let unique = prop(&e, "tank/test", "usedbydataset");
    assert!(
        (1 << 20..(1 << 20) + (256 << 10)).contains(&unique),
        "clone charged {unique}"
    );
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-o", "origin", "tank/test"]),
        "tank/db@s\n"
    );
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-o", "clones", "tank/db@s"]),
        "tank/test\n"
    );
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "atime",
            "tank/test"
        ]),
        "off\tlocal\n"
    );
    e.fails(&["zfs", "destroy", "tank/db@s"], 1, "dependent clones");
    e.fails(
        &["zfs", "clone", "tank/db@nope", "tank/x"],
        1,
        "does not exist",
    );
    e.fails(
        &["zfs", "clone", "tank/db@s", "tank/test"],
        1,
        "already exists",
    );
    let dry = e.ok(&["zfs", "destroy", "-nvR", "tank/db@s"]);
    assert!(
        dry.contains("would destroy tank/test") && dry.contains("would destroy tank/db@s"),
        "{dry}"
    );
    assert!(mnt.join("test/new").exists());
    // rollback past a snapshot with a clone needs -R.
    e.ok(&["zfs", "snapshot", "tank/db@t"]);
    e.ok(&["zfs", "clone", "tank/db@t", "tank/t2"]);
    e.fails(
        &["zfs", "rollback", "-r", "tank/db@s"],
        1,
        "clones of previous snapshots",
    );
    e.ok(&["zfs", "rollback", "-R", "tank/db@s"]);
    assert!(e.run(&["zfs", "list", "tank/t2"]).status.code() != Some(0));
    e.ok(&["zfs", "destroy", "-R", "tank/db@s"]);
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-t", "all", "-o", "name"]),
        "tank\ntank/db\n"
    );
    e.export_and_zdb("tank");
}

/// sanoid (Debian's package, unchanged) with uzfs's `zfs` first in PATH:
/// it takes its hourly and daily snapshots, and prunes the hourlies past
/// its retention once they are old (the hours passed by faketime).
#[test]
fn sanoid_takes_and_prunes_snapshots() {
    if !can_mount() {
        return;
    }
    let have = |t: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("sanoid") || !have("faketime") {
        assert!(
            std::env::var_os("UZFS_REQUIRE_FUSE").is_none(),
            "sanoid and faketime are missing: run scripts/setup.sh"
        );
        eprintln!("skipped: sanoid or faketime not installed");
        return;
    }
    let e = Env::new();
    let mnt = e.tank();
    e.ok(&["zfs", "create", "tank/home"]);
    std::fs::write(mnt.join("home/f"), b"data").expect("write");
    let dir = e.dir.path();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    for name in ["zfs", "zpool"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_uzfs"), bin.join(name)).expect("link");
    }
    let conf = dir.join("sanoid");
    std::fs::create_dir_all(conf.join("cache")).expect("mkdir");
    std::fs::write(
        conf.join("sanoid.conf"),
        "[tank/home]\n\tuse_template = production\n\n\
         [template_production]\n\tfrequently = 0\n\thourly = 2\n\tdaily = 1\n\
         \tmonthly = 0\n\tyearly = 0\n\tautosnap = yes\n\tautoprune = yes\n",
    )
    .expect("conf");
    for f in [
        "/usr/share/sanoid/sanoid.defaults.conf",
        "/etc/sanoid/sanoid.defaults.conf",
    ] {
        if std::path::Path::new(f).exists() {
            std::fs::copy(f, conf.join("sanoid.defaults.conf")).expect("defaults");
            break;
        }
    }
    let sanoid = |hours: u32, what: &str| {
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = std::process::Command::new("faketime")
            .arg(format!("+{hours} hours"))
            .arg("sanoid")
            .arg(format!("--configdir={}", conf.display()))
            .arg(format!("--cache-dir={}", conf.join("cache").display()))
            .arg(format!("--run-dir={}", conf.display()))
            .arg(what)
            .arg("--force-update")
            .env("PATH", path)
            .env("UZFS_RUNDIR", &e.rundir)
            .env("UZFS_TXG_TIMEOUT", "1")
            .env("UZFS_ALTROOT", dir.join("mnt"))
            .output()
            .expect("sanoid");
        assert!(
            o.status.success(),
            "sanoid {what}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let snaps = |kind: &str| -> usize {
        e.ok(&["zfs", "list", "-H", "-t", "snapshot", "-o", "name"])
            .lines()
            .filter(|l| l.starts_with("tank/home@autosnap_") && l.ends_with(kind))
            .count()
    };
    for h in 0..4 {
        sanoid(h, "--take-snapshots");
    }
    assert_eq!(snaps("_hourly"), 4);
    // Two if the faked hours crossed midnight.
    assert!(snaps("_daily") >= 1);
    sanoid(30, "--prune-snapshots");
    assert_eq!(snaps("_hourly"), 2, "pruned to the retention");
    assert_eq!(snaps("_daily"), 1);
    // The files are untouched; the pool is clean.
    assert_eq!(std::fs::read(mnt.join("home/f")).expect("read"), b"data");
    e.export_and_zdb("tank");
}

/// `zfs hold`/`holds`/`release`, `destroy -d`, snapshot `rename [-r]`
/// (followed by `.zfs/snapshot`) and destroy ranges `a%b` and lists, with
/// `-nv` saying exactly what a range frees.
#[test]
fn holds_renames_and_ranges_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    let mut rng = Rng(21);
    for s in ["s1", "s2", "s3", "s4", "s5"] {
        std::fs::write(mnt.join("home/f"), rng.bytes(1 << 20)).expect("write");
        e.ok(&["zfs", "snapshot", "-r", &format!("tank@{s}")]);
    }
    // Holds: a held snapshot refuses destroy; -d defers it to the release.
    e.ok(&["zfs", "hold", "-r", "keep", "tank@s1"]);
    e.fails(
        &["zfs", "hold", "keep", "tank/home@s1"],
        1,
        "tag already exists",
    );
    let h = e.ok(&["zfs", "holds", "-rHp", "tank@s1"]);
    assert_eq!(h.lines().count(), 2, "{h}");
    assert!(h.starts_with("tank@s1\tkeep\t"), "{h}");
    // written: what each snapshot added over the one before (1 MiB each),
    // and what the dataset wrote since one.
    let w2 = prop(&e, "tank/home@s2", "written");
    assert!(
        (1 << 20..(1 << 20) + (128 << 10)).contains(&w2),
        "written {w2}"
    );
    std::fs::write(mnt.join("home/g"), rng.bytes(2 << 20)).expect("write");
    e.ok(&["zpool", "sync", "tank"]);
    let since = prop(&e, "tank/home", "written@s5");
    assert!(
        (2 << 20..(2 << 20) + (128 << 10)).contains(&since),
        "written@s5 {since}"
    );
    assert_eq!(prop(&e, "tank/home", "written"), since);
    let since3 = prop(&e, "tank/home", "written@s3");
    assert!(since3 >= since + (1 << 20), "written@s3 {since3}");
    assert_eq!(prop(&e, "tank/home@s1", "userrefs"), 1);
    e.fails(&["zfs", "destroy", "tank/home@s1"], 1, "busy");
    e.ok(&["zfs", "destroy", "-d", "tank/home@s1"]);
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-o", "defer_destroy", "tank/home@s1"]),
        "on\n"
    );
    e.ok(&["zfs", "release", "keep", "tank/home@s1"]);
    assert!(e.run(&["zfs", "list", "tank/home@s1"]).status.code() != Some(0));
    e.fails(
        &["zfs", "release", "keep", "tank/home@s2"],
        1,
        "no such tag",
    );
    e.ok(&["zfs", "release", "keep", "tank@s1"]);
    // Rename, -r, seen in .zfs/snapshot at once.
    e.ok(&["zfs", "rename", "-r", "tank@s2", "@two"]);
    assert!(mnt.join("home/.zfs/snapshot/two/f").exists());
    assert!(!mnt.join("home/.zfs/snapshot/s2").exists());
    e.ok(&["zfs", "rename", "tank/home@two", "tank/home@deux"]);
    e.fails(
        &["zfs", "rename", "tank/home@deux", "tank/home@s3"],
        1,
        "already exists",
    );
    e.fails(
        &["zfs", "rename", "tank/home@deux", "tank@x"],
        1,
        "same dataset",
    );
    // A range: -nv says what it frees, exactly what goes.
    e.ok(&["zpool", "sync", "tank"]);
    let before = prop(&e, "tank/home", "usedbysnapshots");
    let dry = e.ok(&["zfs", "destroy", "-nvp", "tank/home@deux%s4"]);
    assert!(
        dry.contains("destroy\ttank/home@deux") && dry.contains("destroy\ttank/home@s4"),
        "{dry}"
    );
    let would: u64 = dry
        .lines()
        .find_map(|l| l.strip_prefix("reclaim\t"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{dry}"));
    assert!(would >= 2 << 20, "{dry}");
    e.ok(&["zfs", "destroy", "tank/home@deux%s4"]);
    e.ok(&["zpool", "sync", "tank"]);
    assert_eq!(before - prop(&e, "tank/home", "usedbysnapshots"), would);
    assert_eq!(
        e.ok(&[
            "zfs",
            "list",
            "-H",
            "-t",
            "snapshot",
            "-o",
            "name",
            "-r",
            "tank/home"
        ]),
        "tank/home@s5\n"
    );
    // A list with an open-ended range, -r over descendants (tank/home has
    // no s3 left, so the spec names nothing there).
    e.ok(&["zfs", "destroy", "-r", "tank@two,s3%"]);
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-t", "snapshot", "-o", "name"]),
        "tank@s1\ntank/home@s5\n"
    );
    e.fails(
        &["zfs", "destroy", "tank/home@nope%s5"],
        1,
        "could not find",
    );
    e.export_and_zdb("tank");
}

/// `zfs promote` on real mounts: the clone takes the origin and the
/// snapshots before it (seen in both `.zfs/snapshot` directories), the
/// old dataset becomes its clone, and can be destroyed while the promoted
/// clone lives on; zdb clean.
#[test]
fn promote_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/db") else {
        return;
    };
    std::fs::write(mnt.join("db/v1"), b"one").expect("write");
    e.ok(&["zfs", "snapshot", "tank/db@a"]);
    std::fs::write(mnt.join("db/v2"), b"two").expect("write");
    e.ok(&["zfs", "snapshot", "tank/db@b"]);
    std::fs::write(mnt.join("db/v3"), b"three").expect("write");
    e.ok(&["zfs", "snapshot", "tank/db@c"]);
    e.ok(&["zfs", "clone", "tank/db@b", "tank/next"]);
    std::fs::write(mnt.join("next/v4"), b"four").expect("write");
    e.fails(&["zfs", "promote", "tank/db"], 1, "not a cloned filesystem");
    e.ok(&["zfs", "promote", "tank/next"]);
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-r", "tank"]),
        "tank/db@c\ntank/next@a\ntank/next@b\n"
    );
    assert_eq!(
        e.ok(&["zfs", "list", "-H", "-o", "origin", "tank/db", "tank/next"]),
        "tank/next@b\n-\n"
    );
    assert!(mnt.join("next/.zfs/snapshot/a/v1").exists());
    assert!(!mnt.join("db/.zfs/snapshot/a").exists());
    // The old dataset is now the clone: it can go, the new line stays.
    e.ok(&["zfs", "destroy", "-r", "tank/db"]);
    assert_eq!(std::fs::read(mnt.join("next/v4")).expect("read"), b"four");
    assert_eq!(
        std::fs::read(mnt.join("next/.zfs/snapshot/a/v1")).expect("read"),
        b"one"
    );
    let hist = e.ok(&["zpool", "history", "tank"]);
    assert!(hist.contains("zfs promote tank/next"), "{hist}");
    e.export_and_zdb("tank");
}

/// `zfs diff` between a snapshot and the live filesystem, and between two
/// snapshots: created, removed, modified and renamed files, with `-F`,
/// `-H` and `-t`.
#[test]
fn diff_through_the_command_line() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    let h = mnt.join("home");
    std::fs::create_dir(h.join("dir")).expect("mkdir");
    for f in ["keep", "change", "gone", "dir/old"] {
        std::fs::write(h.join(f), f).expect("write");
    }
    e.ok(&["zfs", "snapshot", "tank/home@a"]);
    std::fs::write(h.join("change"), b"changed").expect("write");
    std::fs::remove_file(h.join("gone")).expect("rm");
    std::fs::write(h.join("new"), b"new").expect("write");
    std::fs::rename(h.join("dir/old"), h.join("dir/renamed")).expect("mv");
    std::os::unix::fs::symlink("keep", h.join("link")).expect("ln");
    let base = h.display().to_string();
    let got = e.ok(&["zfs", "diff", "tank/home@a"]);
    let want = format!(
        "M\t{base}/\n\
         M\t{base}/change\n\
         M\t{base}/dir\n\
         R\t{base}/dir/old -> {base}/dir/renamed\n\
         -\t{base}/gone\n\
         +\t{base}/link\n\
         +\t{base}/new\n"
    );
    assert_eq!(got, want);
    // Two snapshots; -F types, -H tabs, -t times.
    e.ok(&["zfs", "snapshot", "tank/home@b"]);
    std::fs::write(h.join("later"), b"x").expect("write");
    let fh = e.ok(&["zfs", "diff", "-FH", "tank/home@a", "tank/home@b"]);
    assert!(
        fh.contains(&format!("R\tF\t{base}/dir/old\t{base}/dir/renamed\n")),
        "{fh}"
    );
    assert!(fh.contains(&format!("+\t@\t{base}/link\n")), "{fh}");
    assert!(fh.contains(&format!("M\t/\t{base}/dir\n")), "{fh}");
    assert!(!fh.contains("later"), "{fh}");
    let t = e.ok(&["zfs", "diff", "-t", "tank/home@b", "tank/home"]);
    let line = t
        .lines()
        .find(|l| l.ends_with("/later"))
        .expect("later listed");
    let (secs, _) = line.split_once('.').expect("seconds.nanoseconds");
    assert!(secs.parse::<u64>().is_ok_and(|s| s > 1_600_000_000), "{t}");
    assert_eq!(e.ok(&["zfs", "diff", "tank/home@b", "tank/home@b"]), "");
    e.fails(&["zfs", "diff", "tank/home@b", "tank/home@a"], 1, "earlier");
    e.fails(
        &["zfs", "diff", "tank/home@a", "tank"],
        1,
        "same filesystem",
    );
    e.export_and_zdb("tank");
}

/// User properties (`module:name`): set, inherited down the tree and by
/// snapshots, shown by `get all` and `list -o`, set on snapshots by `zfs
/// snapshot -o` and `zfs set`, removed by `zfs inherit`; kept across
/// export and import. Native properties cannot be set on a snapshot.
#[test]
fn user_properties() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    e.tank();
    e.ok(&["zfs", "create", "tank/home"]);
    e.ok(&["zfs", "set", "com.example:backup=daily", "tank"]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "com.example:backup",
            "tank/home"
        ]),
        "daily\tinherited from tank\n"
    );
    e.ok(&[
        "zfs",
        "snapshot",
        "-o",
        "com.example:note=before upgrade",
        "tank/home@s",
    ]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "com.example:note",
            "tank/home@s"
        ]),
        "before upgrade\tlocal\n"
    );
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "com.example:backup",
            "tank/home@s"
        ]),
        "daily\tinherited from tank\n"
    );
    let all = e.ok(&["zfs", "get", "-H", "all", "tank/home"]);
    assert!(
        all.contains("tank/home\tcom.example:backup\tdaily\tinherited from tank"),
        "{all}"
    );
    e.ok(&["zfs", "set", "com.example:backup=none", "tank/home@s"]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "list",
            "-H",
            "-o",
            "name,com.example:backup",
            "-t",
            "all",
            "-r",
            "tank"
        ]),
        "tank\tdaily\ntank/home\tdaily\ntank/home@s\tnone\n"
    );
    e.ok(&["zfs", "inherit", "com.example:backup", "tank/home@s"]);
    e.ok(&["zfs", "inherit", "com.example:backup", "tank"]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value",
            "com.example:backup",
            "tank/home@s"
        ]),
        "-\n"
    );
    e.fails(
        &["zfs", "set", "atime=off", "tank/home@s"],
        1,
        "cannot be set on a snapshot",
    );
    e.fails(&["zfs", "set", "Bad:Name=x", "tank"], 1, "invalid property");
    e.ok(&["zpool", "export", "tank"]);
    e.ok(&["zpool", "import", "-d", ".", "tank"]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value",
            "com.example:note",
            "tank/home@s"
        ]),
        "before upgrade\n"
    );
    e.export_and_zdb("tank");
}

/// `refquota` limits what a filesystem itself references: a write past it
/// fails with EDQUOT, but what its snapshots hold does not count (where
/// `quota` would refuse the same write).
#[test]
fn refquota_counts_only_what_the_filesystem_references() {
    let Some((e, mnt)) = tank_with("tank/home") else {
        return;
    };
    e.ok(&["zfs", "set", "refquota=10M", "tank/home"]);
    assert_eq!(
        e.ok(&[
            "zfs",
            "get",
            "-H",
            "-o",
            "value,source",
            "refquota",
            "tank/home"
        ]),
        "10M\tlocal\n"
    );
    let mut rng = Rng(4);
    let f = mnt.join("home/f");
    std::fs::write(&f, rng.bytes(6 << 20)).expect("write 6M");
    e.ok(&["zfs", "snapshot", "tank/home@s"]);
    std::fs::remove_file(&f).expect("rm");
    e.ok(&["zpool", "sync", "tank"]);
    // The snapshot holds 6 MiB; the filesystem references almost nothing.
    // Synced, so the daemon holds `f` before `g` arrives: under a mount
    // the kernel buffers writes, and an unsynced `f` could reach the
    // daemon after `g` (then `f` is the write refused, not `g`).
    write_synced(&f, &rng.bytes(6 << 20)).expect("6M again: the snapshot's share does not count");
    let r = write_synced(&mnt.join("home/g"), &rng.bytes(8 << 20));
    assert_eq!(
        r.expect_err("past the refquota").raw_os_error(),
        Some(libc::EDQUOT)
    );
    assert!(prop(&e, "tank/home", "available") <= 10 << 20);
    e.ok(&["zfs", "set", "refquota=none", "tank/home"]);
    std::fs::write(mnt.join("home/g"), rng.bytes(8 << 20)).expect("no refquota");
    e.export_and_zdb("tank");
}

/// `zfs destroy` of a large filesystem returns once queued; `zpool get
/// freeing` shows what is left, `zpool wait -t free` waits for it to be
/// freed (a budget of 2 blocks per txg here, so it spans many txgs).
#[test]
fn destroy_frees_in_the_background() {
    if !can_mount() {
        return;
    }
    let mut e = Env::new();
    e.envs
        .push(("UZFS_FREE_MAX_BLOCKS".to_string(), "2".to_string()));
    let mnt = e.tank();
    e.ok(&["zfs", "create", "tank/big"]);
    let pool_alloc = |e: &Env| -> u64 {
        let v = e.ok(&["zpool", "get", "-Hp", "-o", "value", "allocated", "tank"]);
        v.trim().parse().expect("allocated")
    };
    let before = pool_alloc(&e);
    let data = Rng(11).bytes(24 << 20);
    std::fs::write(mnt.join("big/f"), &data).expect("write");
    e.ok(&["zfs", "unmount", "tank/big"]);
    e.ok(&["zpool", "sync", "tank"]);
    assert!(pool_alloc(&e) > before + (20 << 20));
    e.ok(&["zfs", "destroy", "tank/big"]);
    let left: u64 = e
        .ok(&["zpool", "get", "-Hp", "-o", "value", "freeing", "tank"])
        .trim()
        .parse()
        .expect("freeing");
    assert!(left <= 2 * data.len() as u64 + (1 << 20), "freeing {left}");
    let all = e.ok(&["zpool", "get", "all", "tank"]);
    assert!(all.contains("freeing"), "{all}");
    e.ok(&["zpool", "wait", "-t", "free", "tank"]);
    let v = e.ok(&["zpool", "get", "-Hp", "-o", "value", "freeing", "tank"]);
    assert_eq!(v.trim(), "0");
    e.ok(&["zpool", "sync", "tank"]);
    assert!(pool_alloc(&e) < before + (2 << 20), "space not returned");
    e.fails(
        &["zpool", "wait", "-t", "frees", "tank"],
        1,
        "invalid activity",
    );
    e.export_and_zdb("tank");
}

/// `refreservation`: space kept for what a filesystem itself references.
/// Its unused part is charged to the dataset (`usedbyrefreservation`,
/// `used`, the parent's `usedbychildren`), kept from every other
/// dataset's writes, and shrinks as the dataset holds data alone (a
/// snapshot's share does not count). `snapshot_limit` caps the snapshots
/// of a dataset and its descendants (`snapshot_count`).
#[test]
fn refreservation_and_snapshot_limit() {
    let Some((e, mnt)) = tank_with("tank/fill") else {
        return;
    };
    const M: u64 = 1 << 20;
    e.ok(&["zfs", "create", "-o", "refreservation=60M", "tank/db"]);
    let unused = prop(&e, "tank/db", "usedbyrefreservation");
    assert!(unused > 59 * M && unused <= 60 * M, "{unused}");
    assert!(prop(&e, "tank/db", "used") >= 60 * M);
    assert!(prop(&e, "tank", "usedbychildren") >= 60 * M);
    let head = e.ok(&["zfs", "list", "-o", "space", "tank/db"]);
    assert!(
        head.starts_with("NAME") && head.contains("USEDREFRESERV") && head.contains("USEDCHILD"),
        "{head}"
    );
    let mut rng = Rng(21);
    std::fs::write(mnt.join("db/a"), rng.bytes(20 << 20)).expect("write");
    e.ok(&["zpool", "sync", "tank"]);
    let unused = prop(&e, "tank/db", "usedbyrefreservation");
    assert!(unused > 39 * M && unused <= 40 * M, "{unused}");
    // Overwritten after a snapshot: the snapshot's 20M are not the
    // dataset's own, the new 20M are.
    e.ok(&["zfs", "snapshot", "tank/db@s"]);
    std::fs::write(mnt.join("db/a"), rng.bytes(20 << 20)).expect("overwrite");
    e.ok(&["zpool", "sync", "tank"]);
    let unused = prop(&e, "tank/db", "usedbyrefreservation");
    assert!(unused > 39 * M && unused <= 40 * M, "{unused}");
    assert!(prop(&e, "tank/db", "usedbysnapshots") >= 20 * M);
    e.fails(
        &["zfs", "set", "refreservation=10G", "tank/db"],
        1,
        "greater than available",
    );
    // Another filesystem fills the pool: ENOSPC where the unused 40M begin.
    let chunk = rng.bytes(4 << 20);
    let mut hit = None;
    for i in 0..100 {
        if let Err(err) = write_synced(&mnt.join(format!("fill/f{i}")), &chunk) {
            hit = err.raw_os_error();
            break;
        }
    }
    assert_eq!(hit, Some(libc::ENOSPC));
    // tank/db still writes what it was promised.
    for i in 0..8 {
        write_synced(&mnt.join(format!("db/k{i}")), &chunk)
            .expect("a write into the refreservation");
    }
    // snapshot_limit counts the dataset's snapshots and its descendants'.
    e.ok(&["zfs", "create", "tank/db/sub"]);
    e.ok(&["zfs", "set", "snapshot_limit=3", "tank/db"]);
    e.ok(&["zfs", "snapshot", "tank/db/sub@a"]);
    assert_eq!(prop(&e, "tank/db", "snapshot_count"), 2);
    e.fails(
        &["zfs", "snapshot", "-r", "tank/db@b"],
        1,
        "snapshot_limit=3",
    );
    e.ok(&["zfs", "snapshot", "tank/db@b"]);
    e.fails(&["zfs", "snapshot", "tank/db/sub@c"], 1, "snapshot_limit=3");
    let v = e.ok(&[
        "zfs",
        "get",
        "-H",
        "-o",
        "value",
        "snapshot_limit",
        "tank/db",
    ]);
    assert_eq!(v.trim(), "3");
    e.ok(&["zfs", "set", "refreservation=none", "tank/db"]);
    assert_eq!(prop(&e, "tank/db", "usedbyrefreservation"), 0);
    e.export_and_zdb("tank");
}
