//! The ARC through the engine: file data kept compressed in memory as it
//! is on disk (OpenZFS's compressed ARC), decompressed on every use; and
//! written data it does not keep, whose buffers are recycled.

mod common;
use common::*;
use uzfs_core::vdev::sim::SimWorld;

const REG: u32 = libc::S_IFREG | 0o644;

/// Text that lz4 packs to a fraction of its size, different per offset.
fn text(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while v.len() < len {
        v.extend_from_slice(format!("line {i:08} of a compressible file, ").as_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// A new file in the root holding `data`; its object number.
fn file(fs: &uzfs_core::zpl::Zpl, name: &[u8], data: &[u8]) -> u64 {
    let f = fs.mknod(fs.root, name, REG, 0, 0, 0, None).expect("create");
    fs.write(f.ino, 0, data).expect("write");
    f.ino
}

#[test]
fn compressed_file_data_is_held_compressed_and_read_right() {
    let world = SimWorld::new();
    let (_disks, p) = one_disk_fs(&world, 11);
    let ds = p.dsl_pool().dataset("tank").expect("dataset");
    p.dsl_pool()
        .set_prop(&ds, "compression", "lz4")
        .expect("compression");
    let fs = mount_fs(&p, "tank");
    // 3 MiB of text and 1 MiB that does not compress, in a cache of 4 MiB.
    let data = text(3 << 20);
    let noise = pattern(5, 1 << 20);
    let f = file(&fs, b"text", &data);
    let g = file(&fs, b"noise", &noise);
    p.sync().expect("sync");
    // Read both cold.
    p.io.cache.clear();
    assert!(fs.read(f, 0, data.len()).expect("read") == data);
    assert!(fs.read(g, 0, noise.len()).expect("read") == noise);
    let held = p.io.cache.arcstats().sizes.data;
    // The text's records are held as lz4 packed them (a fraction of 3
    // MiB); the noise could not be compressed and is held whole.
    assert!(
        held < (1 << 20) + (1 << 20),
        "{held} bytes of file data held for 3 MiB of text and 1 MiB of noise"
    );
    assert!(held >= 1 << 20, "the noise is held: {held}");
    // Hits decompress: the same bytes, and no device read.
    let misses = p.io.cache.stats().2;
    for round in 0..3 {
        assert!(
            fs.read(f, 0, data.len()).expect("read") == data,
            "round {round}"
        );
        let at = 12345 * (round + 1);
        assert_eq!(
            fs.read(f, at as u64, 4096).expect("read"),
            data[at..at + 4096].to_vec()
        );
    }
    assert_eq!(p.io.cache.stats().2, misses, "hits went to the devices");
    // A record read in 4 KiB pieces is decompressed once, not 32 times
    // (the request thread keeps the record it decompressed last).
    let d0 = uzfs_core::spa::io::decompressions_here();
    for i in 0..32 {
        let at = (2 << 20) + i * 4096;
        assert_eq!(
            fs.read(f, at as u64, 4096).expect("read"),
            data[at..at + 4096].to_vec()
        );
    }
    let d = uzfs_core::spa::io::decompressions_here() - d0;
    assert!(
        d <= 2,
        "a record read in 32 pieces was decompressed {d} times"
    );
    // Overwrite part of it: the next txg reads the old record from the
    // cache (compressed), patches and writes it; the result is right.
    fs.write(f, 1 << 20, b"PATCHED").expect("patch");
    p.sync().expect("sync");
    p.io.cache.clear();
    let mut want = data.clone();
    want[1 << 20..(1 << 20) + 7].copy_from_slice(b"PATCHED");
    assert!(fs.read(f, 0, want.len()).expect("read") == want);

    // With a cache device: what the ARC lets go is written there as it
    // was held (the text compressed), and read back right.
    let dev: std::sync::Arc<dyn uzfs_core::vdev::BlockDevice> =
        std::sync::Arc::new(world.disk("c", 64 << 20));
    let leaf = std::sync::Arc::new(uzfs_core::vdev::Leaf::new(99, "c".into(), dev));
    let l2 = uzfs_core::arc::l2::L2Device::open_with(leaf, 1, false, None);
    p.io.cache.add_l2(l2.clone());
    // Read the text, then push it out of the 4 MiB cache with 6 MiB more.
    let big = pattern(6, 6 << 20);
    let h = file(&fs, b"big", &big);
    p.sync().expect("sync");
    p.io.cache.clear();
    assert!(fs.read(f, 0, want.len()).expect("read") == want);
    assert!(fs.read(f, 0, want.len()).expect("read") == want);
    assert!(fs.read(h, 0, big.len()).expect("read") == big);
    l2.flush_feed();
    let s = l2.stats();
    assert!(s.entries > 0, "{s:?}");
    // Records of 128 KiB: the text's went there compressed.
    assert!(
        s.size < s.entries * (100 << 10),
        "the text is on the cache device compressed: {s:?}"
    );
    p.io.cache.clear();
    let hits = l2.stats().hits;
    assert!(fs.read(f, 0, want.len()).expect("read") == want);
    assert!(l2.stats().hits > hits, "no L2 hits: {:?}", l2.stats());
    l2.close();
}

/// File "stream" holding `data`, written as a mount streams it (through
/// the kernel's page cache), 1 MiB per write and a txg per 4 MiB.
fn stream_file(
    fs: &uzfs_core::zpl::Zpl,
    p: &std::sync::Arc<uzfs_core::spa::Pool>,
    data: &[u8],
) -> uzfs_core::zpl::Attr {
    let f = fs
        .mknod(fs.root, b"stream", REG, 0, 0, 0, None)
        .expect("create");
    uzfs_core::dmu::objset::through_page_cache(|| {
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            fs.write(f.ino, (i << 20) as u64, chunk).expect("write");
            if i % 4 == 3 {
                p.sync().expect("sync");
            }
        }
    });
    f
}

/// With `CacheWritten::Never` (the default), a stream of whole records
/// written through the kernel's page cache is not cached (the page cache
/// holds it): its buffers are recycled for the next writes, what it wrote
/// reads back right from the devices; a record patched in part is kept
/// (a random writer patches it again), and so is one written around the
/// page cache.
#[test]
fn a_stream_not_cached_is_recycled_and_a_patched_record_kept() {
    uzfs_core::spa::io::set_cache_written(uzfs_core::spa::io::CacheWritten::Never);
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 21);
    let fs = mount_fs(&p, "tank");
    let rec = 128 << 10;
    // 24 MiB through a 4 MiB cache, 1 MiB per write, a txg per 4 MiB.
    let data = pattern(31, 24 << 20);
    let f = stream_file(&fs, &p, &data);
    p.sync().expect("sync");
    let uncached =
        p.io.written_uncached
            .load(std::sync::atomic::Ordering::Relaxed);
    assert!(uncached >= 16 << 20, "only {uncached} bytes left uncached");
    let reused = p.io.bufs.reused.load(std::sync::atomic::Ordering::Relaxed);
    assert!(reused >= 64, "only {reused} record buffers reused");
    let sizes = p.io.cache.arcstats().sizes;
    assert!(
        sizes.size <= sizes.c,
        "{} held past c {}",
        sizes.size,
        sizes.c
    );
    assert!(
        fs.read(f.ino, 0, data.len()).expect("read") == data,
        "the stream reads back as written"
    );
    // A record patched in part stays cached once written: reading it
    // again costs no device read.
    let at = 5 * rec + 1000;
    let patch = pattern(32, 4096);
    fs.write(f.ino, at as u64, &patch).expect("patch");
    p.sync().expect("sync");
    let misses = p.io.cache.stats().2;
    let got = fs.read(f.ino, (5 * rec) as u64, rec).expect("read");
    assert_eq!(
        p.io.cache.stats().2,
        misses,
        "the patched record was read from a device"
    );
    assert!(got[1000..1000 + 4096] == patch[..] && got[..1000] == data[5 * rec..at]);
    // Written whole but not through the kernel's page cache (O_DIRECT,
    // `uzfs object put`): nobody else holds it, so it is kept.
    let around = pattern(33, rec);
    fs.write(f.ino, (7 * rec) as u64, &around).expect("write");
    p.sync().expect("sync");
    let misses = p.io.cache.stats().2;
    assert!(fs.read(f.ino, (7 * rec) as u64, rec).expect("read") == around);
    assert_eq!(
        p.io.cache.stats().2,
        misses,
        "a record written around the page cache was not kept"
    );
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the stream");
}

/// Record buffers a stream left for reuse count within the dirty limit
/// once no txg charges them: a random writer after the stream takes none,
/// and as its dirty data grows the recycled buffers are dropped to what
/// that leaves of the limit (before, they stayed beside a full limit of
/// patches, and the daemon passed its memory budget).
#[test]
fn recycled_buffers_make_room_for_dirty_data_that_takes_none() {
    uzfs_core::spa::io::set_cache_written(uzfs_core::spa::io::CacheWritten::Never);
    let world = SimWorld::new();
    let mut o = opts(23);
    // A limit the 24 MiB file's patches pass.
    o.tunables.dirty_max = 16 << 20;
    let (disks, p) = one_disk_fs_with(&world, o);
    let fs = mount_fs(&p, "tank");
    let rec = 128 << 10;
    let data = pattern(41, 24 << 20);
    let f = stream_file(&fs, &p, &data);
    // (No further sync: one with no writer asking gives the buffers back.)
    let limit = p.dirty_limit();
    let left = p.io.bufs.loose_bytes();
    assert!(left >= 2 << 20, "the stream left {left} bytes for reuse");
    let mut rng = uzfs_core::vdev::sim::SimRng::new(7);
    let patch = pattern(42, 16 << 10);
    let mut peak_dirty = 0;
    for _ in 0..2000 {
        let at = rng.below((data.len() - patch.len()) as u64) & !4095;
        // As a mount writes: a patch leaves a partial block holding only
        // its bytes, and takes no record buffer.
        uzfs_core::dmu::partial::deferring(|| fs.write(f.ino, at, &patch)).expect("patch");
        let (dirty, loose) = (p.dirty_bytes(), p.io.bufs.loose_bytes());
        peak_dirty = peak_dirty.max(dirty);
        assert!(
            loose <= limit.saturating_sub(dirty) + rec + patch.len() as u64,
            "{loose} recycled bytes beside {dirty} dirty, limit {limit}"
        );
        if dirty >= limit {
            break;
        }
    }
    assert!(
        peak_dirty + left > limit,
        "the writes never pressed the recycled buffers ({peak_dirty} dirty)"
    );
    p.sync().expect("sync");
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the patches");
}

/// Writers streaming whole records over their files again and again,
/// with the sync thread running and none of it cached: every record buffer is recycled many times, and every file always
/// reads back as its last write left it.
#[test]
fn recycled_record_buffers_never_leak_into_another_write() {
    uzfs_core::spa::io::set_cache_written(uzfs_core::spa::io::CacheWritten::Never);
    let world = SimWorld::new();
    let mut o = opts(22);
    o.tunables.sync_thread = true;
    o.tunables.txg_timeout = std::time::Duration::from_millis(10);
    let (disks, p) = one_disk_fs_with(&world, o);
    let fs = std::sync::Arc::new(mount_fs(&p, "tank"));
    let size = 2 << 20;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let fs = fs.clone();
            s.spawn(move || {
                uzfs_core::dmu::objset::through_page_cache(|| {
                    let name = format!("w{t}");
                    let f = fs
                        .mknod(fs.root, name.as_bytes(), REG, 0, 0, 0, None)
                        .expect("create");
                    for round in 0..12u64 {
                        let data = pattern(t * 100 + round, size);
                        for (i, c) in data.chunks(256 << 10).enumerate() {
                            fs.write(f.ino, (i * (256 << 10)) as u64, c).expect("write");
                        }
                        let back = fs.read(f.ino, 0, size).expect("read");
                        assert!(back == data, "writer {t} round {round}: wrong bytes");
                    }
                })
            });
        }
    });
    p.sync().expect("sync");
    let reused = p.io.bufs.reused.load(std::sync::atomic::Ordering::Relaxed);
    assert!(reused > 0, "no buffer was recycled");
    for t in 0..4u64 {
        let f = fs
            .lookup(fs.root, format!("w{t}").as_bytes())
            .expect("lookup");
        assert!(fs.read(f.ino, 0, size).expect("read") == pattern(t * 100 + 11, size));
    }
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the writers");
}

/// Readers that miss on the same block at once (an application and the
/// read-ahead, or several readers of one file) share one device read, as
/// OpenZFS's ARC keeps a header for a read in flight: the first reads,
/// the others wait for its bytes (`iohits`). A read that fails wakes its
/// waiters, which read for themselves and get their own error.
#[test]
fn concurrent_misses_on_one_block_read_it_once() {
    let world = SimWorld::new();
    let (_disks, p) = one_disk_fs(&world, 41);
    let fs = mount_fs(&p, "tank");
    let rec = 128 << 10;
    let data = pattern(41, 8 * rec);
    let f = file(&fs, b"shared", &data);
    p.sync().expect("sync");
    p.io.cache.clear();
    // Warm what every read of the file needs (dnode, indirect block) with
    // a read of record 0; records 1-7 stay cold.
    assert!(fs.read(f, 0, 4096).expect("warm") == data[..4096]);
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = reads.clone();
    // Every device read takes 50 ms: long enough for all four readers to
    // miss before the first read completes.
    world.set_read_hook(Some(std::sync::Arc::new(
        move |_: &str, _: u64, _: usize| {
            r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(50));
        },
    )));
    let iohits0 = p.io.cache.iohits();
    let at = 3 * rec + 512;
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                let got = fs.read(f, at as u64, 4096).expect("read");
                assert!(got == data[at..at + 4096], "wrong bytes");
            });
        }
    });
    let n = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(n, 1, "four readers of one cold record read it {n} times");
    assert_eq!(
        p.io.cache.iohits() - iohits0,
        3,
        "three waited for the read"
    );

    // The record's only copy fails to read: every reader gets EIO, none
    // hangs waiting for a read that will never bring bytes.
    p.io.cache.clear();
    world.set_read_hook(None);
    assert!(fs.read(f, 0, 4096).expect("warm") == data[..4096]);
    world.set_read_hook(Some(std::sync::Arc::new(|_: &str, _: u64, _: usize| {
        std::thread::sleep(std::time::Duration::from_millis(50));
    })));
    _disks[0].fail_reads(true);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                assert_eq!(fs.read(f, (5 * rec) as u64, 4096), Err(libc::EIO));
            });
        }
    });
    _disks[0].fail_reads(false);
    world.set_read_hook(None);
    assert!(fs.read(f, (5 * rec) as u64, 4096).expect("read") == data[5 * rec..5 * rec + 4096]);
}

/// One copy of what a mount reads: records read whole for the kernel's
/// page cache (`Zpl::read_for_kernel`, every cached FUSE read) leave the
/// ARC, which the kernel now stands in for. What stays: a record read in
/// part (the kernel holds only that part), a record held compressed, a
/// record a snapshot shares (a read through `.zfs` or a clone is another
/// file to the kernel), and everything read for a reader the kernel does
/// not cache for (`read_into`: O_DIRECT). What the reads return is the
/// same either way.
#[test]
fn records_read_whole_for_the_kernel_leave_the_cache() {
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 41);
    let fs = mount_fs(&p, "tank");
    let rec = 128 << 10;
    let data = pattern(7, 16 * rec);
    let f = file(&fs, b"noise", &data);
    p.sync().expect("sync");
    let stats = || p.io.cache.arcstats();
    let read_k = |at: usize, len: usize| {
        let mut b = Vec::new();
        fs.read_for_kernel(f, at as u64, len, &mut b)
            .expect("read for the kernel");
        assert!(b == data[at..at + len], "bytes {at}+{len} read back");
    };

    // A cold read of the whole file: sixteen records from the device,
    // none left in the cache.
    p.io.cache.clear();
    let (h0, m0) = (stats().counters.handed_off, p.io.cache.stats().2);
    read_k(0, data.len());
    let s = stats();
    assert_eq!(s.counters.handed_off - h0, 16, "records handed off");
    assert_eq!(s.sizes.data, 0, "file data left in the cache");
    assert!(p.io.cache.stats().2 - m0 >= 16, "the records were read");

    // A read for a reader the kernel does not cache for keeps them.
    let mut b = Vec::new();
    fs.read_into(f, 0, data.len(), &mut b).expect("direct read");
    assert!(b == data);
    assert_eq!(stats().sizes.data, data.len() as u64, "kept for O_DIRECT");
    // ... and a read for the kernel of part of each record keeps them too.
    p.io.cache.clear();
    for r in 0..16 {
        read_k(r * rec + 4096, 8192);
    }
    assert_eq!(stats().sizes.data, data.len() as u64, "parts read: kept");
    // Reads crossing records: only those covered whole go.
    let h1 = stats().counters.handed_off;
    read_k(rec / 2, 3 * rec);
    assert_eq!(stats().counters.handed_off - h1, 2, "two whole records");
    assert_eq!(stats().sizes.data, 14 * rec as u64);

    // Dirty data is not the cache's: reading it gives nothing up.
    let fresh = pattern(8, 2 * rec);
    fs.write(f, 0, &fresh).expect("write");
    let h2 = stats().counters.handed_off;
    let mut b = Vec::new();
    fs.read_for_kernel(f, 0, 2 * rec, &mut b)
        .expect("read dirty");
    assert!(b == fresh, "the open txg's data");
    assert_eq!(stats().counters.handed_off, h2, "nothing handed off");
    p.sync().expect("sync");
    let mut data = data;
    data[..2 * rec].copy_from_slice(&fresh);

    // Once a snapshot shares the records, they stay.
    p.dsl_pool()
        .create_snapshots(&["tank@s".to_string()])
        .expect("snapshot");
    p.io.cache.clear();
    let h3 = stats().counters.handed_off;
    let mut b = Vec::new();
    fs.read_for_kernel(f, 0, data.len(), &mut b)
        .expect("read shared");
    assert!(b == data);
    assert_eq!(stats().counters.handed_off, h3, "shared records handed off");
    assert_eq!(stats().sizes.data, data.len() as u64, "shared records kept");

    // A record written after the snapshot is the head's alone again.
    let newer = pattern(9, rec);
    fs.write(f, 4 * rec as u64, &newer).expect("write");
    p.sync().expect("sync");
    let h4 = stats().counters.handed_off;
    let mut b = Vec::new();
    fs.read_for_kernel(f, 4 * rec as u64, rec, &mut b)
        .expect("read");
    assert!(b == newer);
    assert_eq!(stats().counters.handed_off - h4, 1, "the new record goes");
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the reads");
}

/// File data held compressed is a fraction of the kernel's copy and stays
/// when read whole for the kernel.
#[test]
fn compressed_records_read_for_the_kernel_stay_cached() {
    let world = SimWorld::new();
    let (_disks, p) = one_disk_fs(&world, 42);
    let ds = p.dsl_pool().dataset("tank").expect("dataset");
    p.dsl_pool()
        .set_prop(&ds, "compression", "lz4")
        .expect("compression");
    let fs = mount_fs(&p, "tank");
    let data = text(1 << 20);
    let f = file(&fs, b"text", &data);
    p.sync().expect("sync");
    p.io.cache.clear();
    let mut b = Vec::new();
    fs.read_for_kernel(f, 0, data.len(), &mut b).expect("read");
    assert!(b == data);
    let s = p.io.cache.arcstats();
    assert_eq!(s.counters.handed_off, 0, "compressed records handed off");
    assert!(s.sizes.data > 0 && s.sizes.data < 1 << 19, "{:?}", s.sizes);
}

/// A write of part of a record over a hole starts from a recycled buffer
/// (`objset::private_copy`): what another file's stream left in it must
/// never show, only zeros around the bytes written.
#[test]
fn a_patch_of_a_hole_in_a_recycled_buffer_reads_zeros_around_it() {
    uzfs_core::spa::io::set_cache_written(uzfs_core::spa::io::CacheWritten::Never);
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 23);
    let fs = mount_fs(&p, "tank");
    let old = pattern(77, 2 << 20);
    uzfs_core::dmu::objset::through_page_cache(|| file(&fs, b"stream", &old));
    // The stream's buffers go to the pool as its txg is written, and are
    // free once the intent log lets go of them too (its records of a txg
    // go after that txg): another writer asking in between keeps them.
    p.sync().expect("sync");
    uzfs_core::dmu::objset::through_page_cache(|| file(&fs, b"asks", &pattern(79, 128 << 10)));
    p.sync().expect("sync");
    let reused = p.io.bufs.reused.load(std::sync::atomic::Ordering::Relaxed);
    let g = fs
        .mknod(fs.root, b"sparse", REG, 0, 0, 0, None)
        .expect("create");
    let at = (128 << 10) + 4096;
    let new = pattern(78, 4096);
    fs.write(g.ino, at, &new).expect("write");
    assert!(
        p.io.bufs.reused.load(std::sync::atomic::Ordering::Relaxed) > reused,
        "the patch did not take a recycled buffer (the test proves nothing)"
    );
    let end = at as usize + 4096;
    let mut want = vec![0u8; end];
    want[at as usize..end].copy_from_slice(&new);
    assert!(
        fs.read(g.ino, 0, end).expect("read") == want,
        "before the sync"
    );
    p.sync().expect("sync");
    p.io.cache.clear();
    assert!(
        fs.read(g.ino, 0, end).expect("read") == want,
        "after the sync"
    );
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the patch");
}

/// A block the sync frees leaves the cache with it (OpenZFS's
/// `arc_freed`): records rewritten in every txg leave one live version
/// cached, not one per txg. A snapshot's blocks are not freed, so they
/// stay.
#[test]
fn freed_blocks_leave_the_cache_and_a_snapshots_stay() {
    let world = SimWorld::new();
    let (disks, p) = one_disk_fs(&world, 24);
    let fs = mount_fs(&p, "tank");
    let size = 1usize << 20;
    let f = file(&fs, b"f", &pattern(1, size));
    p.sync().expect("sync");
    // Records patched in part are kept (they are not the kernel's): five
    // txgs, each rewriting 4 KiB of every record.
    let rewrite = |round: u64| {
        for r in 0..(size / (128 << 10)) as u64 {
            fs.write(f, r * (128 << 10) + 512, &pattern(round * 100 + r, 4096))
                .expect("patch");
        }
        p.sync().expect("sync");
    };
    for round in 2..7 {
        rewrite(round);
    }
    let held = p.io.cache.arcstats().sizes.data;
    assert!(
        held <= size as u64 + (size as u64 / 4),
        "{held} bytes of file data cached for a 1 MiB file rewritten five times"
    );
    // After a snapshot the old versions are the snapshot's: kept.
    p.dsl_pool()
        .create_snapshots(&["tank@s".to_string()])
        .expect("snapshot");
    rewrite(7);
    let held = p.io.cache.arcstats().sizes.data;
    assert!(
        held >= 2 * size as u64 - (size as u64 / 4),
        "{held} bytes cached: the snapshot's versions were dropped"
    );
    drop(fs);
    p.export().expect("export");
    assert_zdb_clean(&disks, "after the rewrites");
}
