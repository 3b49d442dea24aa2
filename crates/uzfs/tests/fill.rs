//! A small pool filled past full by several processes at once, on a real
//! mount (the fsstress-like load of issue #12's pool-full point).
//!
//! Four worker processes run random operations for a while on a 160 MiB
//! pool: create and write files of random sizes (4 KiB to 6 MiB) and fsync
//! them, delete and rewrite right after deleting, overwrite ranges in
//! place, truncate, rename (within a worker's directory and into a shared
//! one), hard links, mkdir and rmdir. The pool is full most of the time.
//! Each worker keeps the contents it expects of every file it owns.
//!
//! What must hold:
//! - a call the pool cannot hold fails with ENOSPC, never EIO and never a
//!   suspended pool; unlink and rmdir always succeed, full or not;
//! - ENOSPC is seen many times over (the load really fills the pool);
//! - after `zpool sync`, export and import, every file a worker wrote and
//!   fsynced without error and did not delete is intact (its whole
//!   contents and link count), and nothing else exists;
//! - `rm -rf` of everything works, the space comes back, zdb is clean.
//!
//! The workers are this test binary run again with `UZFS_FILL_WORKER` set
//! (see `fill_worker_process`), so they are real processes.

mod common;
use common::{can_mount, Env, Rng};
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const WORKERS: u64 = 4;

/// FNV-1a: the model's digest of a file's contents.
fn digest(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn enospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

/// One worker's files: inode number (its own) -> contents, and its names.
#[derive(Default)]
struct Owned {
    data: BTreeMap<u64, Vec<u8>>,
    names: BTreeMap<String, u64>,
    dirs: Vec<String>,
    next: u64,
}

impl Owned {
    fn pick(&self, r: &mut Rng) -> Option<(String, u64)> {
        if self.names.is_empty() {
            return None;
        }
        let i = r.below(self.names.len() as u64) as usize;
        self.names.iter().nth(i).map(|(n, &ino)| (n.clone(), ino))
    }
    fn drop_name(&mut self, name: &str) {
        if let Some(ino) = self.names.remove(name) {
            if !self.names.values().any(|&i| i == ino) {
                self.data.remove(&ino);
            }
        }
    }
    /// Create `name` holding `data`, fsynced: `Ok(false)` when the pool
    /// said ENOSPC (the file is then removed and forgotten).
    fn create(&mut self, root: &Path, name: String, data: Vec<u8>) -> Result<bool, String> {
        self.next += 1;
        let ok = write_sync(&root.join(&name), 0, &data, true)?;
        self.names.insert(name, self.next);
        if ok {
            self.data.insert(self.next, data);
        } else {
            self.discard(root, self.next, true)?;
        }
        Ok(ok)
    }

    /// Forget a file whose contents are unknown after a failed write, by
    /// removing every name of it (which must work on a full pool). `fresh`:
    /// its creation may itself have been refused (no name to remove).
    fn discard(&mut self, root: &Path, ino: u64, fresh: bool) -> Result<(), String> {
        let names: Vec<String> = self
            .names
            .iter()
            .filter(|(_, &i)| i == ino)
            .map(|(n, _)| n.clone())
            .collect();
        for n in names {
            match std::fs::remove_file(root.join(&n)) {
                Ok(()) => {}
                Err(e) if fresh && e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(format!("unlink {n} (full pool): {e}")),
            }
            self.names.remove(&n);
        }
        self.data.remove(&ino);
        Ok(())
    }
}

/// Write `data` at `off` and fsync; `Ok(false)` on ENOSPC.
fn write_sync(path: &Path, off: u64, data: &[u8], create: bool) -> Result<bool, String> {
    let r = (|| {
        let f = std::fs::OpenOptions::new()
            .create(create)
            .truncate(false)
            .write(true)
            .open(path)?;
        for (i, c) in data.chunks(256 << 10).enumerate() {
            f.write_all_at(c, off + (i as u64) * (256 << 10))?;
        }
        f.sync_all()
    })();
    match r {
        Ok(()) => Ok(true),
        Err(e) if enospc(&e) => Ok(false),
        Err(e) => Err(format!("write {}: {e}", path.display())),
    }
}

/// The worker's loop: random operations for `secs`; returns the number of
/// operations and of ENOSPC answers, and leaves its model in `out`.
fn work(root: &Path, id: u64, secs: u64, out: &Path) -> Result<(u64, u64), String> {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15 ^ (id + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let mut o = Owned::default();
    let mine = format!("w{id}");
    std::fs::create_dir_all(root.join(&mine)).map_err(|e| format!("mkdir: {e}"))?;
    let (mut ops, mut full) = (0u64, 0u64);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        ops += 1;
        let roll = r.below(100);
        let dir = if !o.dirs.is_empty() && r.below(3) == 0 {
            o.dirs[r.below(o.dirs.len() as u64) as usize].clone()
        } else {
            mine.clone()
        };
        match roll {
            0..=34 => {
                // A new file of a random size, log-uniform 4 KiB..6 MiB.
                let name = format!("{dir}/f{}", o.next + 1);
                let len = (4096f64 * (1536f64).powf(r.below(1000) as f64 / 1000.0)) as usize;
                full += !o.create(root, name, r.bytes(len))? as u64;
            }
            35..=49 => {
                // Delete; half the time write a new file at once into the
                // space the delete frees (two txgs later).
                if let Some((name, _)) = o.pick(&mut r) {
                    std::fs::remove_file(root.join(&name))
                        .map_err(|e| format!("unlink {name}: {e}"))?;
                    o.drop_name(&name);
                    if r.below(2) == 0 {
                        let len = 1 + r.below(2 << 20) as usize;
                        full += !o.create(root, name, r.bytes(len))? as u64;
                    }
                }
            }
            50..=61 => {
                // Overwrite a range in place (copy-on-write: needs space).
                if let Some((name, ino)) = o.pick(&mut r) {
                    let cur = o.data[&ino].len() as u64;
                    let off = r.below(cur + 1);
                    let len = 1 + r.below(512 << 10) as usize;
                    let data = r.bytes(len);
                    if write_sync(&root.join(&name), off, &data, false)? {
                        let v = o.data.get_mut(&ino).ok_or("model")?;
                        let end = off as usize + data.len();
                        if v.len() < end {
                            v.resize(end, 0);
                        }
                        v[off as usize..end].copy_from_slice(&data);
                    } else {
                        full += 1;
                        o.discard(root, ino, false)?;
                    }
                }
            }
            62..=69 => {
                // Truncate shorter or longer.
                if let Some((name, ino)) = o.pick(&mut r) {
                    let size = r.below(o.data[&ino].len() as u64 * 3 / 2 + 1);
                    let res = std::fs::OpenOptions::new()
                        .write(true)
                        .open(root.join(&name))
                        .and_then(|f| f.set_len(size).and_then(|_| f.sync_all()));
                    match res {
                        Ok(()) => o
                            .data
                            .get_mut(&ino)
                            .ok_or("model")?
                            .resize(size as usize, 0),
                        Err(e) if enospc(&e) => {
                            full += 1;
                            o.discard(root, ino, false)?;
                        }
                        Err(e) => return Err(format!("truncate {name}: {e}")),
                    }
                }
            }
            70..=79 => {
                // Rename, within the worker's directories or into the
                // shared one (names stay the worker's own).
                if let Some((name, ino)) = o.pick(&mut r) {
                    o.next += 1;
                    let to = if r.below(3) == 0 {
                        format!("shared/w{id}-r{}", o.next)
                    } else {
                        format!("{dir}/r{}", o.next)
                    };
                    match std::fs::rename(root.join(&name), root.join(&to)) {
                        Ok(()) => {
                            o.names.remove(&name);
                            o.names.insert(to, ino);
                        }
                        Err(e) if enospc(&e) => full += 1,
                        Err(e) => return Err(format!("rename {name} {to}: {e}")),
                    }
                }
            }
            80..=86 => {
                if let Some((name, ino)) = o.pick(&mut r) {
                    o.next += 1;
                    let to = format!("{dir}/l{}", o.next);
                    match std::fs::hard_link(root.join(&name), root.join(&to)) {
                        Ok(()) => {
                            o.names.insert(to, ino);
                        }
                        Err(e) if enospc(&e) => full += 1,
                        Err(e) => return Err(format!("link {name} {to}: {e}")),
                    }
                }
            }
            87..=92 => {
                // mkdir, or rmdir of an empty directory of the worker's.
                let empty = o
                    .dirs
                    .iter()
                    .position(|d| !o.names.keys().any(|n| n.starts_with(&format!("{d}/"))));
                match empty {
                    Some(i) if r.below(2) == 0 => {
                        let d = o.dirs.remove(i);
                        std::fs::remove_dir(root.join(&d))
                            .map_err(|e| format!("rmdir {d}: {e}"))?;
                    }
                    _ => {
                        o.next += 1;
                        let d = format!("{mine}/d{}", o.next);
                        match std::fs::create_dir(root.join(&d)) {
                            Ok(()) => o.dirs.push(d),
                            Err(e) if enospc(&e) => full += 1,
                            Err(e) => return Err(format!("mkdir {d}: {e}")),
                        }
                    }
                }
            }
            _ => {
                // Read back and compare, full pool or not.
                if let Some((name, ino)) = o.pick(&mut r) {
                    let got =
                        std::fs::read(root.join(&name)).map_err(|e| format!("read {name}: {e}"))?;
                    if got != o.data[&ino] {
                        return Err(format!("{name}: contents differ while running"));
                    }
                }
            }
        }
    }
    let mut m = String::new();
    for (name, ino) in &o.names {
        let nlink = o.names.values().filter(|&&i| i == *ino).count();
        let d = &o.data[ino];
        m.push_str(&format!("{name}\t{}\t{nlink}\t{:x}\n", d.len(), digest(d)));
    }
    for d in &o.dirs {
        m.push_str(&format!("{d}/\n"));
    }
    std::fs::write(out, m).map_err(|e| format!("model: {e}"))?;
    Ok((ops, full))
}

/// The entry point of a worker process (not a test of its own: without
/// `UZFS_FILL_WORKER` it returns at once).
#[test]
fn fill_worker_process() {
    let Ok(spec) = std::env::var("UZFS_FILL_WORKER") else {
        return;
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let [root, id, secs, out] = parts[..] else {
        panic!("UZFS_FILL_WORKER={spec}: want root:id:secs:out");
    };
    let id: u64 = id.parse().expect("id");
    let secs: u64 = secs.parse().expect("secs");
    match work(Path::new(root), id, secs, Path::new(out)) {
        Ok((ops, full)) => println!("FILL {ops} {full}"),
        Err(e) => panic!("worker {id}: {e}"),
    }
}

#[test]
fn several_processes_fill_a_small_pool_past_full() {
    if !can_mount() {
        return;
    }
    let e = Env::new();
    let m = e.small_pool();
    std::fs::create_dir(m.join("shared")).expect("mkdir shared");
    let secs = std::env::var("UZFS_FILL_SECS").unwrap_or_else(|_| "20".into());
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let out = e.dir.path().join(format!("model{id}"));
            let child = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "fill_worker_process", "--nocapture"])
                .env(
                    "UZFS_FILL_WORKER",
                    format!("{}:{id}:{secs}:{}", m.display(), out.display()),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn worker");
            (child, out)
        })
        .collect();
    let (mut ops, mut full) = (0u64, 0u64);
    let mut models = Vec::new();
    for (id, (child, out)) in workers.into_iter().enumerate() {
        let o = child.wait_with_output().expect("worker");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "worker {id} failed:\n{text}{}\ndaemon log:\n{}\n{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(e.rundir.join("uzfsd.log")).unwrap_or_default(),
            e.ok(&["zpool", "status", "small"])
        );
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("FILL "))
            .unwrap_or_else(|| panic!("worker {id} said nothing:\n{text}"));
        let n: Vec<u64> = line.split(' ').map(|x| x.parse().expect("count")).collect();
        ops += n[0];
        full += n[1];
        models.push(std::fs::read_to_string(out).expect("model"));
    }
    eprintln!("{WORKERS} workers: {ops} operations, {full} answered ENOSPC");
    assert!(
        full >= 20,
        "only {full} ENOSPC in {ops} operations: the pool never filled"
    );
    let st = e.ok(&["zpool", "status", "small"]);
    assert!(
        !st.contains("SUSPENDED") && st.contains("No known data errors"),
        "{st}"
    );
    e.ok(&["zpool", "sync", "small"]);
    e.export_and_zdb("small");
    e.ok(&["zpool", "import", "-d", ".", "small"]);

    // Every acknowledged file, and nothing else.
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    for model in &models {
        for l in model.lines() {
            let (name, rest) = l.split_once('\t').unwrap_or((l, ""));
            want.insert(name.to_string(), rest.to_string());
        }
    }
    let mut got: BTreeMap<String, String> = BTreeMap::new();
    let mut stack = vec![m.clone()];
    while let Some(d) = stack.pop() {
        for ent in std::fs::read_dir(&d).expect("readdir") {
            let p = ent.expect("entry").path();
            let rel = p
                .strip_prefix(&m)
                .expect("under mount")
                .display()
                .to_string();
            let md = std::fs::symlink_metadata(&p).expect("stat");
            if md.is_dir() {
                stack.push(p);
                if rel != "shared" && rel.matches('/').count() == 1 {
                    got.insert(format!("{rel}/"), String::new());
                }
            } else {
                let data = std::fs::read(&p).unwrap_or_else(|e| panic!("read {rel}: {e}"));
                got.insert(
                    rel,
                    format!("{}\t{}\t{:x}", data.len(), md.nlink(), digest(&data)),
                );
            }
        }
    }
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .map(|(k, v)| (k, v, &got[k]))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "after export and import: missing {missing:?}, unexpected {extra:?}, differing (want, got) {differ:?}"
    );

    // Everything can be removed, and the space comes back.
    for ent in std::fs::read_dir(&m).expect("readdir") {
        let p = ent.expect("entry").path();
        std::fs::remove_dir_all(&p).unwrap_or_else(|e| panic!("rm -rf {}: {e}", p.display()));
    }
    e.ok(&["zpool", "sync", "small"]);
    e.ok(&["zpool", "sync", "small"]);
    let used: u64 = e
        .ok(&["zfs", "get", "-Hp", "-o", "value", "used", "small"])
        .trim()
        .parse()
        .expect("used");
    assert!(used < 8 << 20, "{used} bytes still used after rm -rf");
    e.export_and_zdb("small");
}
