//! Snapshots (`dsl/snapshot.rs`): random file operations interleaved with
//! snapshots, their destruction, rollbacks to them and clones of them
//! (written to in turn), against a model. At every check each
//! snapshot reads back as the model had it when it was taken; its space
//! figures add up; zdb (which walks every snapshot and checks every dead
//! list) is clean after export; and destroying every snapshot and file
//! gives the dataset back the space of an empty one. A power cut at any
//! I/O while snapshots are taken and destroyed imports to a committed
//! state with zdb clean, rollbacks included.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use uzfs_core::dsl::DsCtx;
use uzfs_core::spa::Pool;
use uzfs_core::vdev::sim::{SimRng, SimWorld};
use uzfs_core::vdev::TopKind;
use uzfs_core::zpl::fs::SetAttr;
use uzfs_core::zpl::Zpl;

const MIB: u64 = 1 << 20;

type Model = BTreeMap<String, Vec<u8>>;

/// Pool "z": a mirror of two 128 MiB simulated disks, its root formatted
/// as a filesystem and synced.
fn mirror_pool(
    world: &SimWorld,
    o: uzfs_core::spa::CreateOptions,
) -> (Vec<uzfs_core::vdev::sim::SimDevice>, Arc<Pool>) {
    let disks: Vec<_> = (0..2)
        .map(|i| world.disk(&format!("d{i}"), 128 * MIB))
        .collect();
    let pool = Pool::create("z", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    pool.sync().expect("sync");
    (disks, pool)
}

fn mount(pool: &Arc<Pool>) -> Zpl {
    mount_ds(pool, "z")
}

fn mount_ds(pool: &Arc<Pool>, name: &str) -> Zpl {
    let ds = pool.dsl_pool().dataset(name).expect("dataset");
    let ctx = DsCtx::new(pool.clone(), ds.clone());
    Zpl::mount(ds.os.clone(), ctx).expect("mount")
}

fn truncate(fs: &Zpl, ino: u64, size: u64) {
    fs.setattr(
        ino,
        &SetAttr {
            size: Some(size),
            ..Default::default()
        },
    )
    .expect("truncate");
}

fn contents(fs: &Zpl) -> Model {
    let mut out = Model::new();
    for (_, _, _, raw) in fs.readdir(fs.root, 0, usize::MAX).expect("readdir") {
        let name = String::from_utf8_lossy(&raw).to_string();
        if name == "." || name == ".." {
            continue;
        }
        let a = fs.lookup(fs.root, &raw).expect("lookup");
        let mut b = Vec::new();
        fs.read_into(a.ino, 0, a.size as usize, &mut b)
            .expect("read");
        out.insert(name, b);
    }
    out
}

/// One random change to the filesystem and the model.
fn step(fs: &Zpl, model: &mut Model, rng: &mut SimRng, seed: u64, i: u64) {
    let names: Vec<String> = model.keys().cloned().collect();
    match rng.below(10) {
        0..=3 => {
            let name = format!("f{}", rng.below(12));
            let len = 1 + rng.below(300_000) as usize;
            let data = pattern(seed * 10_000 + i, len);
            let ino = match fs.lookup(fs.root, name.as_bytes()) {
                Ok(a) => {
                    truncate(fs, a.ino, 0);
                    a.ino
                }
                Err(_) => create_file(fs, name.as_bytes()),
            };
            fs.write(ino, 0, &data).expect("write");
            model.insert(name, data);
        }
        4..=5 if !names.is_empty() => {
            // Overwrite part of a file in place.
            let name = &names[rng.below(names.len() as u64) as usize];
            let a = fs.lookup(fs.root, name.as_bytes()).expect("lookup");
            let cur = model.get_mut(name).expect("model");
            let at = rng.below(cur.len() as u64 + 1) as usize;
            let data = pattern(seed * 20_000 + i, 1 + rng.below(150_000) as usize);
            fs.write(a.ino, at as u64, &data).expect("write");
            if cur.len() < at + data.len() {
                cur.resize(at + data.len(), 0);
            }
            cur[at..at + data.len()].copy_from_slice(&data);
        }
        6 if !names.is_empty() => {
            let name = &names[rng.below(names.len() as u64) as usize];
            fs.unlink(fs.root, name.as_bytes()).expect("unlink");
            model.remove(name);
        }
        7 if !names.is_empty() => {
            let name = &names[rng.below(names.len() as u64) as usize];
            let a = fs.lookup(fs.root, name.as_bytes()).expect("lookup");
            let cur = model.get_mut(name).expect("model");
            let len = rng.below(cur.len() as u64 + 1);
            truncate(fs, a.ino, len);
            cur.truncate(len as usize);
        }
        _ => {}
    }
}

/// Snapshots of `z` taken after `name`'s, oldest first.
fn later_than(pool: &Pool, name: &str) -> Vec<String> {
    let (d, s) = pool
        .dsl_pool()
        .snapshot(&format!("z@{name}"))
        .expect("snapshot");
    let txg = s.phys().txg;
    pool.dsl_pool()
        .snapshots_of(d.id())
        .iter()
        .map(|x| x.phys())
        .filter(|p| p.txg > txg)
        .map(|p| p.name)
        .collect()
}

/// `zfs rollback -r z@name` as the command does it: unmounted, the later
/// snapshots destroyed, then the rollback; mounted again.
fn rollback_r(pool: &Arc<Pool>, fs: Zpl, name: &str) -> uzfs_core::Result<Zpl> {
    drop(fs);
    for l in later_than(pool, name) {
        pool.dsl_pool().destroy_snapshot(&format!("z@{l}"))?;
    }
    pool.dsl_pool().rollback(&format!("z@{name}"))?;
    Ok(mount(pool))
}

/// Counts the blocks a walk hands it (object-set blocks left out, as in
/// `referenced`): with `Objset::free_born_after`, the bytes of a tree born
/// after a txg, by walking it.
struct Born(u64);

impl uzfs_core::dmu::objset::BlockWriter for Born {
    fn txg(&self) -> u64 {
        0
    }
    fn write_bp(
        &mut self,
        _old: &uzfs_core::dmu::blkptr::BlkPtr,
        _data: &[u8],
        _wp: uzfs_core::dmu::objset::WriteParams,
    ) -> uzfs_core::Result<uzfs_core::dmu::blkptr::BlkPtr> {
        Err(uzfs_core::Error::invalid("a counting walk writes nothing"))
    }
    fn free_bp(&mut self, bp: &uzfs_core::dmu::blkptr::BlkPtr) {
        if bp.obj_type != uzfs_core::dmu::dnode::ot::OBJSET {
            self.0 += bp.asize();
        }
    }
}

/// Bytes of `os`'s tree (as last synced) born after `txg`, walked.
fn born_after(os: &uzfs_core::dmu::objset::Objset, txg: u64) -> u64 {
    let mut b = Born(0);
    os.free_born_after(&mut b, txg).expect("walk");
    b.0
}

/// `zfs diff z@name z` against the models: a name only in the old model
/// is removed, only in the new one created, in both with other contents
/// modified (or removed and created again); nothing is renamed; the root
/// is modified when names came or went.
fn check_diff(pool: &Arc<Pool>, name: &str, old: &Model, new: &Model, what: &str) {
    let d = pool
        .dsl_pool()
        .diff(&format!("z@{name}"), None)
        .expect("diff");
    let has = |c: char, n: &str| d.iter().any(|e| e.change == c && e.path == format!("/{n}"));
    for n in old.keys().filter(|n| !new.contains_key(*n)) {
        assert!(has('-', n), "{what}: diff @{name}: {n} removed: {d:?}");
    }
    for n in new.keys().filter(|n| !old.contains_key(*n)) {
        assert!(has('+', n), "{what}: diff @{name}: {n} created: {d:?}");
    }
    for (n, v) in new {
        if old.get(n).is_some_and(|o| o != v) {
            assert!(
                has('M', n) || (has('-', n) && has('+', n)),
                "{what}: diff @{name}: {n} modified: {d:?}"
            );
        }
    }
    for e in &d {
        let n = e.path.trim_start_matches('/');
        assert!(e.change != 'R', "{what}: diff @{name}: a rename: {e:?}");
        assert!(
            n.is_empty() || old.contains_key(n) || new.contains_key(n),
            "{what}: diff @{name}: {e:?} is in neither model"
        );
    }
    if old.keys().ne(new.keys()) {
        assert!(
            has('M', ""),
            "{what}: diff @{name}: the root changed: {d:?}"
        );
    }
}

fn usedbysnapshots(pool: &Pool) -> u64 {
    let d = pool.dsl_pool().dataset("z").expect("ds");
    pool.dsl_pool()
        .get_prop(&d, "usedbysnapshots")
        .expect("prop")
        .0
        .parse()
        .expect("number")
}

/// Every snapshot reads back as the model had it, and the dataset's
/// space figures add up.
fn check_snapshots(pool: &Arc<Pool>, snaps: &BTreeMap<String, Model>, what: &str) {
    let listed: Vec<String> = pool
        .dsl_pool()
        .snapshots()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let want: Vec<String> = snaps.keys().map(|n| format!("z@{n}")).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, want, "{what}: snapshots listed");
    for (name, model) in snaps {
        let fs = pool
            .dsl_pool()
            .mount_snapshot(&format!("z@{name}"))
            .unwrap_or_else(|e| panic!("{what}: mount z@{name}: {e}"));
        assert!(
            contents(&fs) == *model,
            "{what}: z@{name} does not read back as taken"
        );
        // Read-only: every change is refused.
        assert!(fs
            .mknod(fs.root, b"new", libc::S_IFREG | 0o644, 0, 0, 0, None)
            .is_err());
    }
    let d = pool.dsl_pool().dataset("z").expect("ds");
    let by_snaps: u64 = pool
        .dsl_pool()
        .get_prop(&d, "usedbysnapshots")
        .expect("prop")
        .0
        .parse()
        .expect("number");
    let used: u64 = pool
        .dsl_pool()
        .get_prop(&d, "used")
        .expect("prop")
        .0
        .parse()
        .expect("n");
    let refd: u64 = pool
        .dsl_pool()
        .get_prop(&d, "referenced")
        .expect("prop")
        .0
        .parse()
        .expect("n");
    // Children: the clones, each charged only what is its own.
    let mut children = 0;
    for c in pool.dsl_pool().descendants(&d) {
        let n = |p: &str| -> u64 {
            pool.dsl_pool()
                .get_prop(&c, p)
                .expect("prop")
                .0
                .parse()
                .expect("number")
        };
        assert!(
            n("usedbydataset") <= n("referenced"),
            "{what}: clone unique"
        );
        children += n("used");
    }
    assert_eq!(
        used,
        refd + by_snaps + children,
        "{what}: used = referenced + snapshots + clones"
    );
    // What each snapshot alone holds is part of what snapshots hold.
    let unique: u64 = pool
        .dsl_pool()
        .snapshots()
        .iter()
        .map(|(_, s)| pool.dsl_pool().snapshot_unique(s).expect("unique"))
        .sum();
    assert!(unique <= by_snaps, "{what}: unique {unique} > {by_snaps}");
    // `written` and `written@S`, against walks of the trees: the bytes
    // born after the snapshot (or the one before it).
    let chain = pool.dsl_pool().snapshots_of(d.id());
    for (i, s) in chain.iter().enumerate() {
        let sp = s.phys();
        let w: u64 = pool
            .dsl_pool()
            .get_prop(&d, &format!("written@{}", sp.name))
            .expect("written@")
            .0
            .parse()
            .expect("n");
        assert_eq!(w, born_after(&d.os, sp.txg), "{what}: written@{}", sp.name);
        let prev = i.checked_sub(1).map_or(0, |p| chain[p].phys().txg);
        let os = pool.dsl_pool().snapshot_objset(s).expect("objset");
        assert_eq!(
            pool.dsl_pool().snapshot_written(s).expect("written"),
            born_after(&os, prev),
            "{what}: written of @{}",
            sp.name
        );
    }
    let w: u64 = pool
        .dsl_pool()
        .get_prop(&d, "written")
        .expect("written")
        .0
        .parse()
        .expect("n");
    let last = chain.last().map_or(0, |s| s.phys().txg);
    assert_eq!(w, born_after(&d.os, last), "{what}: written");
}

#[test]
fn snapshots_read_back_as_taken_and_destroying_them_frees_what_only_they_held() {
    let seeds = env_u64("UZFS_SNAP_SEEDS", 4);
    let mut rollbacks = 0;
    let mut clones_written = 0;
    // Steps that began with frees still queued.
    let mut queued = 0;
    for seed in 0..seeds {
        let world = SimWorld::new();
        // Odd seeds free destroyed clones and rolled-back heads a few
        // blocks per txg (`dsl/async_destroy.rs`), so queued frees overlap
        // the snapshots, destroys and exports that follow.
        let mut o = opts(seed);
        if seed % 2 == 1 {
            o.tunables.free_max_blocks = 6;
        }
        let (mut disks, mut pool) = mirror_pool(&world, o);
        let empty_used = pool.dsl_pool().dataset("z").expect("ds").os.space().used;
        let mut fs = mount(&pool);
        let mut rng = SimRng::new(seed);
        let mut model = Model::new();
        let mut snaps: BTreeMap<String, Model> = BTreeMap::new();
        // Clone name -> (its files, its model, its origin snapshot).
        let mut clones: BTreeMap<String, (Zpl, Model, String)> = BTreeMap::new();
        let mut next = 0;
        let mut next_clone = 0;
        // Snapshots `destroy -d` marked, kept by a clone.
        let mut deferred = std::collections::BTreeSet::new();
        for i in 0..120u64 {
            queued += u64::from(pool.dsl_pool().freeing() > 0);
            step(&fs, &mut model, &mut rng, seed, i);
            match rng.below(12) {
                // No sync first: every write that returned is in it.
                0 | 1 => {
                    let name = format!("s{next}");
                    next += 1;
                    pool.dsl_pool()
                        .create_snapshots(&[format!("z@{name}")])
                        .expect("snapshot");
                    snaps.insert(name, model.clone());
                }
                2 if !snaps.is_empty() => {
                    let names: Vec<String> = snaps.keys().cloned().collect();
                    let name = names[rng.below(names.len() as u64) as usize].clone();
                    if !clones.values().any(|c| c.2 == name) {
                        pool.dsl_pool()
                            .destroy_snapshot(&format!("z@{name}"))
                            .expect("destroy");
                        snaps.remove(&name);
                    }
                }
                3 => {
                    pool.sync().expect("sync");
                }
                5 if !snaps.is_empty() && clones.len() < 3 => {
                    let names: Vec<String> = snaps.keys().cloned().collect();
                    let name = names[rng.below(names.len() as u64) as usize].clone();
                    let cname = format!("z/c{next_clone}");
                    next_clone += 1;
                    pool.dsl_pool()
                        .clone_snapshot(&format!("z@{name}"), &cname, &[], false)
                        .expect("clone");
                    let cfs = mount_ds(&pool, &cname);
                    assert_eq!(
                        contents(&cfs),
                        snaps[&name],
                        "seed {seed}: {cname} of {name}"
                    );
                    let o = pool.dsl_pool().dataset(&cname).expect("clone");
                    assert_eq!(
                        pool.dsl_pool().get_prop(&o, "origin").expect("origin").0,
                        format!("z@{name}")
                    );
                    // Nothing of its own yet but metadata.
                    let unique: u64 = pool
                        .dsl_pool()
                        .get_prop(&o, "usedbydataset")
                        .expect("prop")
                        .0
                        .parse()
                        .expect("n");
                    assert!(unique < 64 << 10, "seed {seed}: new clone uses {unique}");
                    // Its origin is busy now.
                    let err = pool
                        .dsl_pool()
                        .destroy_snapshot(&format!("z@{name}"))
                        .expect_err("origin of a clone");
                    assert!(err.to_string().contains("dependent clones"), "{err}");
                    clones.insert(cname, (cfs, snaps[&name].clone(), name));
                }
                7 if !snaps.is_empty() => {
                    // Rename one; clones keep their origin under the new name.
                    let names: Vec<String> = snaps.keys().cloned().collect();
                    let old = names[rng.below(names.len() as u64) as usize].clone();
                    let new = format!("r{next}");
                    next += 1;
                    pool.dsl_pool()
                        .rename_snapshot(&format!("z@{old}"), &format!("z@{new}"))
                        .expect("rename");
                    let m = snaps.remove(&old).expect("model");
                    snaps.insert(new.clone(), m);
                    if deferred.remove(&old) {
                        deferred.insert(new.clone());
                    }
                    for c in clones.values_mut() {
                        if c.2 == old {
                            c.2 = new.clone();
                        }
                    }
                }
                8 if snaps.len() >= 2 => {
                    // A range of consecutive snapshots, none an origin:
                    // destroying it frees exactly what was predicted.
                    let d = pool.dsl_pool().dataset("z").expect("ds");
                    let chain: Vec<String> = pool
                        .dsl_pool()
                        .snapshots_of(d.id())
                        .iter()
                        .map(|s| s.phys().name)
                        .collect();
                    let a = rng.below(chain.len() as u64) as usize;
                    let b = (a + rng.below(3) as usize).min(chain.len() - 1);
                    let run: std::collections::BTreeSet<String> =
                        chain[a..=b].iter().cloned().collect();
                    if !clones.values().any(|c| run.contains(&c.2)) {
                        pool.sync().expect("sync");
                        let before = usedbysnapshots(&pool);
                        let would = pool
                            .dsl_pool()
                            .snapshots_wouldfree(d.id(), &run)
                            .expect("wouldfree");
                        for n in &run {
                            pool.dsl_pool()
                                .destroy_snapshot(&format!("z@{n}"))
                                .expect("destroy");
                            snaps.remove(n);
                        }
                        pool.sync().expect("sync");
                        let after = usedbysnapshots(&pool);
                        assert_eq!(
                            before - after,
                            would,
                            "seed {seed} step {i}: destroying {run:?} freed what -nv said"
                        );
                    }
                }
                9 if !snaps.is_empty() => {
                    // Held: destroy refuses; -d defers; the release destroys.
                    let names: Vec<String> = snaps.keys().cloned().collect();
                    let name = names[rng.below(names.len() as u64) as usize].clone();
                    let full = vec![format!("z@{name}")];
                    pool.dsl_pool().hold("keep", &full).expect("hold");
                    assert!(pool.dsl_pool().hold("keep", &full).is_err(), "a tag twice");
                    let err = pool
                        .dsl_pool()
                        .destroy_snapshot(&full[0])
                        .expect_err("held");
                    assert!(matches!(err, uzfs_core::Error::Busy(_)), "{err}");
                    if rng.below(2) == 0 {
                        assert!(!pool
                            .dsl_pool()
                            .destroy_snapshot_deferred(&full[0])
                            .expect("-d"));
                        assert!(
                            pool.dsl_pool().snapshot(&full[0]).is_ok(),
                            "deferred, still there"
                        );
                        pool.dsl_pool().release("keep", &full).expect("release");
                        let cloned = clones.values().any(|c| c.2 == name);
                        assert_eq!(
                            pool.dsl_pool().snapshot(&full[0]).is_ok(),
                            cloned,
                            "released"
                        );
                        if cloned {
                            deferred.insert(name.clone());
                        } else {
                            snaps.remove(&name);
                        }
                    } else {
                        pool.dsl_pool().release("keep", &full).expect("release");
                        assert!(
                            pool.dsl_pool().release("keep", &full).is_err(),
                            "no such tag"
                        );
                    }
                }
                6 if !clones.is_empty() => {
                    // Write to a clone; now and then destroy one.
                    let names: Vec<String> = clones.keys().cloned().collect();
                    let cname = names[rng.below(names.len() as u64) as usize].clone();
                    if rng.below(4) == 0 {
                        let (cfs, _, origin) = clones.remove(&cname).expect("clone");
                        drop(cfs);
                        pool.dsl_pool()
                            .destroy_dataset(&cname, true)
                            .expect("destroy clone");
                        // A deferred origin goes with its last clone.
                        if deferred.contains(&origin) && !clones.values().any(|c| c.2 == origin) {
                            assert!(
                                pool.dsl_pool().snapshot(&format!("z@{origin}")).is_err(),
                                "deferred"
                            );
                            deferred.remove(&origin);
                            snaps.remove(&origin);
                        }
                    } else {
                        let (cfs, cmodel, _) = clones.get_mut(&cname).expect("clone");
                        for j in 0..3 {
                            step(cfs, cmodel, &mut rng, seed + 1000, i * 10 + j);
                        }
                        clones_written += 1;
                    }
                }
                4 if !snaps.is_empty() => {
                    let names: Vec<String> = snaps.keys().cloned().collect();
                    let name = names[rng.below(names.len() as u64) as usize].clone();
                    let later = later_than(&pool, &name);
                    // A later snapshot with clones is not destroyed by -r
                    // (that takes -R): roll back only when none has.
                    if !later.iter().any(|l| clones.values().any(|c| &c.2 == l)) {
                        if !later.is_empty() {
                            let err = pool
                                .dsl_pool()
                                .rollback(&format!("z@{name}"))
                                .expect_err("later snapshots exist");
                            assert!(err.to_string().contains("more recent"), "{err}");
                        }
                        fs = rollback_r(&pool, fs, &name).expect("rollback");
                        rollbacks += 1;
                        for l in later {
                            snaps.remove(&l);
                        }
                        model = snaps[&name].clone();
                        assert_eq!(
                            contents(&fs),
                            model,
                            "seed {seed} step {i}: rolled back to {name}"
                        );
                    }
                }
                _ => {}
            }
            if i % 40 == 39 {
                pool.sync().expect("sync");
                check_snapshots(&pool, &snaps, &format!("seed {seed} step {i}"));
                assert_eq!(contents(&fs), model, "seed {seed} step {i}: the dataset");
                for (name, old) in &snaps {
                    check_diff(&pool, name, old, &model, &format!("seed {seed} step {i}"));
                }
                // Export, zdb, import: the same after.
                drop(fs);
                let open: Vec<String> = clones.keys().cloned().collect();
                let mut kept = BTreeMap::new();
                for (cname, (cfs, cmodel, origin)) in std::mem::take(&mut clones) {
                    assert_eq!(contents(&cfs), cmodel, "seed {seed} step {i}: {cname}");
                    drop(cfs);
                    kept.insert(cname, (cmodel, origin));
                }
                let sets = 1 + pool.dsl_pool().snapshots().len() + kept.len();
                pool.export().expect("export");
                assert_zdb_clean(&disks, &format!("seed {seed} step {i}"));
                // zdb checked every snapshot's and dataset's `referenced`
                // against the blocks it walked (exact).
                let r = uzfs_core::zdb::verify(devs(&disks)).expect("zdb");
                assert_eq!(r.sets_checked as usize, sets, "seed {seed} step {i}");
                (disks, pool) = import_images(images(&disks), seed);
                check_snapshots(&pool, &snaps, &format!("seed {seed} step {i}, imported"));
                fs = mount(&pool);
                for cname in open {
                    let (cmodel, origin) = kept.remove(&cname).expect("kept");
                    let cfs = mount_ds(&pool, &cname);
                    assert_eq!(
                        contents(&cfs),
                        cmodel,
                        "seed {seed} step {i}: {cname} imported"
                    );
                    clones.insert(cname, (cfs, cmodel, origin));
                }
            }
        }
        // A name taken, a snapshot that is not there, a bad name: refused,
        // nothing changes.
        if let Some(name) = snaps.keys().next() {
            assert!(pool
                .dsl_pool()
                .create_snapshots(&[format!("z@{name}")])
                .is_err());
        }
        assert!(pool.dsl_pool().destroy_snapshot("z@nothere").is_err());
        assert!(pool
            .dsl_pool()
            .create_snapshots(&["z@a/b".to_string()])
            .is_err());
        assert!(pool
            .dsl_pool()
            .create_snapshots(&["z".to_string()])
            .is_err());
        // Destroy everything: the dataset holds what an empty one does.
        for (cname, (cfs, _, _)) in std::mem::take(&mut clones) {
            drop(cfs);
            pool.dsl_pool()
                .destroy_dataset(&cname, true)
                .expect("destroy clone");
        }
        for name in &deferred {
            assert!(
                pool.dsl_pool().snapshot(&format!("z@{name}")).is_err(),
                "deferred {name}"
            );
            snaps.remove(name);
        }
        for name in snaps.keys() {
            pool.dsl_pool()
                .destroy_snapshot(&format!("z@{name}"))
                .expect("destroy");
        }
        for name in model.keys() {
            fs.unlink(fs.root, name.as_bytes()).expect("unlink");
        }
        pool.sync().expect("sync");
        pool.sync().expect("sync");
        let d = pool.dsl_pool().dataset("z").expect("ds");
        assert_eq!(
            pool.dsl_pool()
                .get_prop(&d, "usedbysnapshots")
                .expect("p")
                .0,
            "0"
        );
        assert_eq!(
            d.os.space().used,
            empty_used,
            "seed {seed}: an empty dataset again"
        );
        drop(fs);
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("seed {seed}: all destroyed"));
    }
    assert!(rollbacks > 0, "no seed rolled back");
    assert!(clones_written > 0, "no seed wrote to a clone");
    assert!(seeds < 2 || queued > 0, "no step ran with frees queued");
}

/// `-r`: one call, one txg, every dataset's snapshot; the dataset with
/// snapshots is only destroyed with them (`-r`).
#[test]
fn snapshots_of_several_datasets_land_in_one_txg() {
    let world = SimWorld::new();
    let (disks, pool) = mirror_pool(&world, opts(7));
    for n in ["z/a", "z/a/b", "z/c"] {
        pool.dsl_pool()
            .create_dataset(n, &[], false)
            .expect("create");
    }
    pool.sync().expect("sync");
    let names: Vec<String> = ["z", "z/a", "z/a/b", "z/c"]
        .iter()
        .map(|n| format!("{n}@now"))
        .collect();
    // `-o module:name=value`: born with the property, in the same txg.
    let note = [("com.example:note".to_string(), "v1".to_string())];
    pool.dsl_pool()
        .create_snapshots_with(&names, &note)
        .expect("snapshot");
    let txgs: Vec<u64> = pool
        .dsl_pool()
        .snapshots()
        .iter()
        .map(|(_, s)| s.phys().txg)
        .collect();
    assert_eq!(txgs.len(), 4);
    assert!(txgs.iter().all(|t| *t == txgs[0]), "txgs {txgs:?}");
    assert_eq!(
        pool.last_txg(),
        txgs[0],
        "the property took a txg of its own"
    );
    for (_, s) in pool.dsl_pool().snapshots() {
        let props = s.phys().props;
        assert_eq!(
            props.get("com.example:note").map(String::as_str),
            Some("v1")
        );
    }
    assert!(pool
        .dsl_pool()
        .create_snapshots_with(&["z@x".to_string()], &[("atime".into(), "off".into())])
        .is_err());
    // One bad name: none is taken.
    let bad = vec!["z@later".to_string(), "z/nothere@later".to_string()];
    assert!(pool.dsl_pool().create_snapshots(&bad).is_err());
    assert!(pool.dsl_pool().snapshot("z@later").is_err());
    let err = pool
        .dsl_pool()
        .destroy_dataset("z/a", false)
        .expect_err("has children and snapshots");
    assert!(err.to_string().contains("children"), "{err}");
    let err = pool
        .dsl_pool()
        .destroy_dataset("z/c", false)
        .expect_err("has snapshots");
    assert!(err.to_string().contains("snapshots"), "{err}");
    let gone = pool
        .dsl_pool()
        .destroy_dataset("z/a", true)
        .expect("destroy -r");
    assert!(gone.contains(&"z/a/b@now".to_string()), "{gone:?}");
    assert!(pool.dsl_pool().snapshot("z/a@now").is_err());
    pool.sync().expect("sync");
    pool.export().expect("export");
    assert_zdb_clean(&disks, "after destroy -r");
}

/// A power cut at any I/O while snapshots are taken and destroyed under
/// writes: the pool imports to a committed state (each snapshot there reads
/// back as taken, if its txg committed), and zdb is clean.
#[test]
fn a_power_cut_during_snapshots_leaves_a_committed_state() {
    let seeds = env_u64("UZFS_SNAP_CRASH_SEEDS", 12);
    let base = env_u64("UZFS_SNAP_CRASH_BASE", 0);
    let mut rollbacks = 0;
    for seed in base..base + seeds {
        let world = SimWorld::new();
        let (_disks, pool) = mirror_pool(&world, opts(seed));
        let mut fs = mount(&pool);
        let mut rng = SimRng::new(seed ^ 0x5eed);
        world.cut_power_after(50 + rng.below(1500));
        let mut model = Model::new();
        // What each snapshot must hold, if it exists after the crash.
        let mut taken: BTreeMap<String, Model> = BTreeMap::new();
        // Snapshots whose destroy was asked for (done or not).
        let mut doomed = std::collections::BTreeSet::new();
        for i in 0..200u64 {
            if world.power_lost() {
                break;
            }
            step(&fs, &mut model, &mut rng, seed, i);
            let r = match rng.below(6) {
                0 => {
                    let name = format!("s{i}");
                    let r = pool.dsl_pool().create_snapshots(&[format!("z@{name}")]);
                    if r.is_ok() {
                        taken.insert(name, model.clone());
                    }
                    r
                }
                1 if !taken.is_empty() => {
                    let names: Vec<String> = taken.keys().cloned().collect();
                    let name = &names[rng.below(names.len() as u64) as usize];
                    doomed.insert(name.clone());
                    match pool.dsl_pool().destroy_snapshot(&format!("z@{name}")) {
                        // The origin of a clone: refused, stays.
                        Err(uzfs_core::Error::Busy(_)) => {
                            doomed.remove(name);
                            Ok(())
                        }
                        r => r,
                    }
                }
                3 if !taken.is_empty() && rng.below(2) == 0 => {
                    // Clone a snapshot, write to the clone, maybe destroy it.
                    let names: Vec<String> = taken.keys().cloned().collect();
                    let name = &names[rng.below(names.len() as u64) as usize];
                    let cname = format!("z/c{i}");
                    pool.dsl_pool()
                        .clone_snapshot(&format!("z@{name}"), &cname, &[], false)
                        .and_then(|_| {
                            let ds = pool.dsl_pool().dataset(&cname)?;
                            let ctx = DsCtx::new(pool.clone(), ds.clone());
                            let cfs = Zpl::mount(ds.os.clone(), ctx)?;
                            if world.power_lost() {
                                return Err(uzfs_core::Error::PowerLost);
                            }
                            let mut cm = taken.get(name).cloned().unwrap_or_default();
                            step(&cfs, &mut cm, &mut rng, seed + 7, i);
                            drop(cfs);
                            if rng.below(2) == 0 {
                                pool.dsl_pool().destroy_dataset(&cname, true).map(|_| ())
                            } else {
                                pool.sync().map(|_| ())
                            }
                        })
                }
                2 if !taken.is_empty() => {
                    let latest =
                        pool.dsl_pool().snapshots().last().map(|(n, _)| {
                            n.split_once('@').map_or(String::new(), |x| x.1.to_string())
                        });
                    match latest {
                        Some(name) if taken.contains_key(&name) => {
                            match rollback_r(&pool, fs, &name) {
                                Ok(f) => {
                                    rollbacks += 1;
                                    fs = f;
                                    model = taken[&name].clone();
                                    Ok(())
                                }
                                Err(e) => {
                                    fs = mount(&pool);
                                    Err(e)
                                }
                            }
                        }
                        _ => Ok(()),
                    }
                }
                _ => Ok(()),
            };
            if r.is_err() {
                break;
            }
        }
        let images = world.crash(&mut SimRng::new(seed));
        drop(fs);
        drop(pool);
        let (disks, pool) = import_images(images, seed);
        // Every snapshot whose command returned is there, unless its
        // destroy was asked for.
        for name in taken.keys().filter(|n| !doomed.contains(*n)) {
            assert!(
                pool.dsl_pool().snapshot(&format!("z@{name}")).is_ok(),
                "seed {seed}: z@{name} was taken and is gone"
            );
        }
        for (name, s) in pool.dsl_pool().snapshots() {
            let short = name.split_once('@').map(|x| x.1).unwrap_or("").to_string();
            let Some(want) = taken.get(&short) else {
                // Taken in the txg the power cut: its command never
                // returned, and the txg committed anyway.
                continue;
            };
            let fs = pool
                .dsl_pool()
                .mount_snapshot(&name)
                .expect("mount snapshot");
            assert!(
                contents(&fs) == *want,
                "seed {seed}: {name} after the crash"
            );
            let _ = s;
        }
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("seed {seed}: after the crash"));
    }
    assert!(seeds < 4 || rollbacks > 0, "no seed rolled back");
}

/// A clone shares the block cache with its origin: reading an unchanged
/// file through the clone after reading it through the origin misses the
/// cache only for the little metadata that is the clone's own. Read as a
/// mount reads (for the kernel's page cache, which lets records it takes
/// whole leave the cache): the origin's records are shared, so they stay.
#[test]
fn a_clone_reads_its_origins_blocks_from_the_cache() {
    let world = SimWorld::new();
    let disks: Vec<_> = (0..2)
        .map(|i| world.disk(&format!("d{i}"), 128 * MIB))
        .collect();
    // A cache larger than the file (the tests' default is 4 MiB).
    let mut o = opts(3);
    o.tunables.cache_bytes = 64 << 20;
    let pool = Pool::create("z", vec![spec(TopKind::Mirror, &disks)], o).expect("create");
    pool.dsl_pool().format_root_fs().expect("format");
    let fs = mount(&pool);
    let data = pattern(1, 8 << 20);
    let ino = create_file(&fs, b"big");
    fs.write(ino, 0, &data).expect("write");
    pool.dsl_pool()
        .create_snapshots(&["z@s".to_string()])
        .expect("snapshot");
    pool.dsl_pool()
        .clone_snapshot("z@s", "z/c", &[], false)
        .expect("clone");
    let clone = mount_ds(&pool, "z/c");
    pool.io.cache.clear();
    let misses = || pool.io.cache.stats().2;
    let read = |fs: &Zpl| {
        let a = fs.lookup(fs.root, b"big").expect("lookup");
        let mut b = Vec::new();
        fs.read_for_kernel(a.ino, 0, a.size as usize, &mut b)
            .expect("read");
        assert!(b == data, "the file reads back");
    };
    let m0 = misses();
    read(&fs);
    let first = misses() - m0;
    let m1 = misses();
    read(&clone);
    let second = misses() - m1;
    assert!(first >= 64, "8 MiB read cold: {first} misses");
    assert!(
        second * 10 < first,
        "the clone missed {second} times after the origin missed {first}"
    );
}

fn used_of(pool: &Pool, name: &str, prop: &str) -> u64 {
    let d = pool.dsl_pool().dataset(name).expect("dataset");
    pool.dsl_pool()
        .get_prop(&d, prop)
        .expect("prop")
        .0
        .parse()
        .expect("number")
}

/// Every snapshot of `owner` in `want` reads back as its model.
fn check_line(pool: &Arc<Pool>, owner: &str, want: &BTreeMap<String, Model>, what: &str) {
    let d = pool.dsl_pool().dataset(owner).expect("dataset");
    let mut have: Vec<String> = pool
        .dsl_pool()
        .snapshots_of(d.id())
        .iter()
        .map(|s| s.phys().name)
        .collect();
    have.sort();
    let names: Vec<String> = want.keys().cloned().collect();
    assert_eq!(have, names, "{what}: snapshots of {owner}");
    for (n, m) in want {
        let fs = pool
            .dsl_pool()
            .mount_snapshot(&format!("{owner}@{n}"))
            .unwrap_or_else(|e| panic!("{what}: {owner}@{n}: {e}"));
        assert!(contents(&fs) == *m, "{what}: {owner}@{n} reads back");
    }
    let used = used_of(pool, owner, "used");
    let parts = used_of(pool, owner, "usedbydataset") + used_of(pool, owner, "usedbysnapshots");
    assert_eq!(used, parts, "{what}: {owner} used = dataset + snapshots");
}

/// `zfs promote` and back: the snapshots up to the origin move to the
/// clone and return, each reading back as taken; the old dataset becomes
/// the clone's clone; the pool's total `used` does not change (space
/// moves, none appears or vanishes); zdb is clean after each; destroying
/// everything leaves the root as empty as it began. Then power cuts during
/// promotes: a committed state, zdb clean.
#[test]
fn promote_moves_snapshots_and_their_space_and_back() {
    let seeds = env_u64("UZFS_PROMOTE_SEEDS", 4);
    for seed in 0..seeds {
        let world = SimWorld::new();
        let (mut disks, mut pool) = mirror_pool(&world, opts(seed));
        let empty = used_of(&pool, "z", "used");
        pool.dsl_pool()
            .create_dataset("z/o", &[], false)
            .expect("create");
        let mut rng = SimRng::new(seed ^ 0x9e0);
        let mut om = Model::new();
        let mut o_snaps: BTreeMap<String, Model> = BTreeMap::new();
        {
            let o = mount_ds(&pool, "z/o");
            for k in 0..5u64 {
                for j in 0..4 {
                    step(&o, &mut om, &mut rng, seed, k * 10 + j);
                }
                pool.dsl_pool()
                    .create_snapshots(&[format!("z/o@s{k}")])
                    .expect("snap");
                o_snaps.insert(format!("s{k}"), om.clone());
            }
            step(&o, &mut om, &mut rng, seed, 99);
            // A change after the last snapshot, so the dataset has let go
            // of that snapshot's object-set block (charged from then on)
            // before the totals below are taken.
            let t = create_file(&o, b"tail");
            o.write(t, 0, b"tail").expect("write");
            om.insert("tail".into(), b"tail".to_vec());
        }
        let k = rng.below(5);
        let origin = format!("s{k}");
        pool.dsl_pool()
            .clone_snapshot(&format!("z/o@{origin}"), "z/c", &[], false)
            .expect("clone");
        let mut cm = o_snaps[&origin].clone();
        let mut c_snaps: BTreeMap<String, Model> = BTreeMap::new();
        {
            let c = mount_ds(&pool, "z/c");
            for j in 0..2u64 {
                for x in 0..4 {
                    step(&c, &mut cm, &mut rng, seed + 50, j * 10 + x);
                }
                pool.dsl_pool()
                    .create_snapshots(&[format!("z/c@c{j}")])
                    .expect("snap");
                c_snaps.insert(format!("c{j}"), cm.clone());
            }
            step(&c, &mut cm, &mut rng, seed + 50, 77);
        }
        pool.sync().expect("sync");
        let total = used_of(&pool, "z", "used");
        let what = format!("seed {seed}, origin {origin}");
        check_line(&pool, "z/o", &o_snaps, &what);
        check_line(&pool, "z/c", &c_snaps, &what);

        pool.dsl_pool().promote("z/c").expect("promote");
        assert!(pool.dsl_pool().promote("z/c").is_err(), "no longer a clone");
        // The snapshots up to the origin moved.
        let (moved, stayed): (BTreeMap<_, _>, BTreeMap<_, _>) = o_snaps
            .clone()
            .into_iter()
            .partition(|(n, _)| n[1..].parse::<u64>().expect("n") <= k);
        let mut c_all = c_snaps.clone();
        c_all.extend(moved.clone());
        check_line(&pool, "z/c", &c_all, &format!("{what}: promoted"));
        check_line(&pool, "z/o", &stayed, &format!("{what}: promoted"));
        let o = pool.dsl_pool().dataset("z/o").expect("o");
        assert_eq!(
            pool.dsl_pool().get_prop(&o, "origin").expect("p").0,
            format!("z/c@{origin}")
        );
        let c = pool.dsl_pool().dataset("z/c").expect("c");
        assert_eq!(pool.dsl_pool().get_prop(&c, "origin").expect("p").0, "-");
        pool.sync().expect("sync");
        assert_eq!(
            used_of(&pool, "z", "used"),
            total,
            "{what}: space moved, none made"
        );
        assert_eq!(contents(&mount_ds(&pool, "z/o")), om, "{what}: z/o");
        assert_eq!(contents(&mount_ds(&pool, "z/c")), cm, "{what}: z/c");
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("{what}: promoted"));
        (disks, pool) = import_images(images(&disks), seed);
        check_line(&pool, "z/c", &c_all, &format!("{what}: promoted, imported"));

        // Back again (reading the heads above wrote their access times:
        // the total to keep is the one now).
        pool.sync().expect("sync");
        let total = used_of(&pool, "z", "used");
        pool.dsl_pool().promote("z/o").expect("promote back");
        check_line(&pool, "z/o", &o_snaps, &format!("{what}: back"));
        check_line(&pool, "z/c", &c_snaps, &format!("{what}: back"));
        pool.sync().expect("sync");
        assert_eq!(
            used_of(&pool, "z", "used"),
            total,
            "{what}: back, same space"
        );
        let c = pool.dsl_pool().dataset("z/c").expect("c");
        assert_eq!(
            pool.dsl_pool().get_prop(&c, "origin").expect("p").0,
            format!("z/o@{origin}")
        );
        // Everything goes: the clone first, then its origin's dataset.
        pool.dsl_pool()
            .destroy_dataset("z/c", true)
            .expect("destroy clone");
        pool.dsl_pool()
            .destroy_dataset("z/o", true)
            .expect("destroy");
        pool.sync().expect("sync");
        pool.sync().expect("sync");
        assert_eq!(used_of(&pool, "z", "used"), empty, "{what}: nothing leaked");
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("{what}: all destroyed"));
    }
}

#[test]
fn a_power_cut_during_promote_leaves_a_committed_state() {
    let seeds = env_u64("UZFS_PROMOTE_CRASH_SEEDS", 12);
    // Seeds whose power went out during a promote (its call failed).
    let mut cut = 0;
    for seed in 0..seeds {
        let world = SimWorld::new();
        let (_disks, pool) = mirror_pool(&world, opts(seed));
        pool.dsl_pool()
            .create_dataset("z/o", &[], false)
            .expect("create");
        let mut rng = SimRng::new(seed ^ 0xc0);
        let mut om = Model::new();
        {
            let o = mount_ds(&pool, "z/o");
            for k in 0..3u64 {
                for j in 0..3 {
                    step(&o, &mut om, &mut rng, seed, k * 10 + j);
                }
                pool.dsl_pool()
                    .create_snapshots(&[format!("z/o@s{k}")])
                    .expect("snap");
            }
        }
        pool.dsl_pool()
            .clone_snapshot("z/o@s1", "z/c", &[], false)
            .expect("clone");
        {
            let c = mount_ds(&pool, "z/c");
            let mut cm = Model::new();
            for j in 0..4 {
                step(&c, &mut cm, &mut rng, seed + 9, j);
            }
        }
        world.cut_power_after(1 + rng.below(200));
        for who in ["z/c", "z/o", "z/c"] {
            if pool.dsl_pool().promote(who).is_err() {
                cut += 1;
                break;
            }
        }
        let images = world.crash(&mut SimRng::new(seed));
        drop(pool);
        let (disks, pool) = import_images(images, seed);
        // Whichever side holds s1 now, both read back and zdb is clean.
        let owner = ["z/o", "z/c"]
            .into_iter()
            .find(|o| pool.dsl_pool().snapshot(&format!("{o}@s1")).is_ok())
            .expect("s1 survives");
        pool.dsl_pool()
            .mount_snapshot(&format!("{owner}@s1"))
            .expect("mount s1");
        pool.export().expect("export");
        assert_zdb_clean(&disks, &format!("seed {seed}: promote crash"));
    }
    assert!(
        seeds < 6 || cut > 0,
        "no seed cut the power during a promote"
    );
}
