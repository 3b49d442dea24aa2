//! Simulated devices for crash and fault tests.
//!
//! # Fault model
//!
//! Every simulated device keeps two images: `durable` (what survives a power
//! cut) and a list of `pending` writes issued since the last flush. Reads see
//! durable bytes with pending writes applied in order. `flush` folds pending
//! into durable.
//!
//! All devices of one pool share a [`SimWorld`], which counts I/O operations.
//! When the countdown set by `cut_power_after(n)` reaches zero the power is
//! cut: that operation and every later one fails with `Error::PowerLost`.
//! [`SimWorld::crash`] then decides, with the harness's seeded RNG, which
//! pending writes of each device reach the media: each one independently
//! survives or vanishes, and one of them may be torn (a random subset of its
//! 512-byte sectors written). The surviving image is what the next import sees.
//!
//! Beyond crashes the device can flip bits on the media (`corrupt`) and fail
//! reads or writes on demand (`fail_reads`), for self-healing and error-path
//! tests. Randomness and time come only from the harness (`SimRng`), so a
//! failing seed replays exactly.

use super::device::BlockDevice;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard};

/// SplitMix64: small, fast, seedable. Tests print the seed on failure.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[derive(Default)]
struct WorldState {
    /// Operations left before the power is cut; `None` = never.
    countdown: Option<u64>,
    /// Flushes left before the power is cut (the flush itself fails).
    flush_countdown: Option<u64>,
    power_lost: bool,
    ops: u64,
}

/// Called with (disk name, offset, length) before each write is issued,
/// with no lock held: a test can hold a write in flight by blocking here.
pub type WriteHook = Arc<dyn Fn(&str, u64, usize) + Send + Sync>;

/// Called with (disk name, offset, length) after each read has its data
/// (or, made to fail by `fail_reads`, before it returns its error), with
/// no lock held: a test can make a read complete late by blocking here.
pub type ReadHook = WriteHook;

/// Shared power supply of a set of simulated devices.
#[derive(Clone, Default)]
pub struct SimWorld {
    state: Arc<Mutex<WorldState>>,
    disks: Arc<Mutex<Vec<Arc<SimDisk>>>>,
    write_hook: Arc<Mutex<Option<WriteHook>>>,
    read_hook: Arc<Mutex<Option<ReadHook>>>,
}

struct SimDisk {
    name: String,
    inner: Mutex<DiskState>,
}

struct DiskState {
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
    fail_reads: bool,
    fail_writes: bool,
    /// The size in force (`BlockDevice::size`): the image's length when
    /// made, then as adopted after [`SimDevice::grow`].
    size: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a test thread panicked; the data is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimWorld {
    pub fn new() -> Self {
        Self::default()
    }

    /// Create a zero-filled disk of `size` bytes attached to this world.
    pub fn disk(&self, name: &str, size: u64) -> SimDevice {
        self.disk_from_image(name, vec![0u8; size as usize])
    }

    pub fn disk_from_image(&self, name: &str, image: Vec<u8>) -> SimDevice {
        let disk = Arc::new(SimDisk {
            name: name.to_string(),
            inner: Mutex::new(DiskState {
                size: image.len() as u64,
                durable: image,
                pending: Vec::new(),
                fail_reads: false,
                fail_writes: false,
            }),
        });
        lock(&self.disks).push(disk.clone());
        SimDevice {
            world: self.clone(),
            disk,
        }
    }

    /// Run `hook` before every write to this world's disks (`None` stops).
    pub fn set_write_hook(&self, hook: Option<WriteHook>) {
        *lock(&self.write_hook) = hook;
    }

    /// Run `hook` after every read from this world's disks has its data
    /// (`None` stops).
    pub fn set_read_hook(&self, hook: Option<ReadHook>) {
        *lock(&self.read_hook) = hook;
    }

    /// Cut the power when `n` more operations have been issued.
    pub fn cut_power_after(&self, n: u64) {
        lock(&self.state).countdown = Some(n);
    }

    /// Cut the power as the `n`-th flush from now is issued: every write
    /// issued since the previous flush is still volatile. This aims crashes
    /// at the commit protocol's interesting instants (e.g. just after the
    /// uberblocks were written).
    pub fn cut_power_at_flush(&self, n: u64) {
        lock(&self.state).flush_countdown = Some(n);
    }

    fn tick_flush(&self) -> Result<()> {
        let mut s = lock(&self.state);
        if let Some(c) = s.flush_countdown.as_mut() {
            if *c == 0 {
                s.power_lost = true;
                return Err(Error::PowerLost);
            }
            *c -= 1;
        }
        Ok(())
    }

    pub fn ops(&self) -> u64 {
        lock(&self.state).ops
    }

    pub fn power_lost(&self) -> bool {
        lock(&self.state).power_lost
    }

    /// Writes issued since the last flush, summed over every disk. After a
    /// power cut, non-zero means the power went out in the middle of a
    /// batch of writes: for a pool, inside a txg's sync (between its first
    /// block and its uberblock's flush) or a scan's repair. Crash tests
    /// count such seeds, to show the cuts land where they matter.
    pub fn volatile_writes(&self) -> usize {
        lock(&self.disks)
            .iter()
            .map(|d| lock(&d.inner).pending.len())
            .sum()
    }

    fn tick(&self) -> Result<()> {
        let mut s = lock(&self.state);
        if s.power_lost {
            return Err(Error::PowerLost);
        }
        s.ops += 1;
        if let Some(c) = s.countdown.as_mut() {
            if *c == 0 {
                s.power_lost = true;
                return Err(Error::PowerLost);
            }
            *c -= 1;
        }
        Ok(())
    }

    /// Power cut: return, for each disk in creation order, the image the media
    /// holds afterwards. Each unflushed write survives with probability 1/2;
    /// one of them (if any) is torn sector by sector.
    pub fn crash(&self, rng: &mut SimRng) -> Vec<(String, Vec<u8>)> {
        lock(&self.state).power_lost = true;
        let disks = lock(&self.disks);
        let total: usize = disks.iter().map(|d| lock(&d.inner).pending.len()).sum();
        let torn = if total > 0 && rng.chance(1, 2) {
            Some(rng.below(total as u64) as usize)
        } else {
            None
        };
        let mut idx = 0usize;
        let mut out = Vec::new();
        for d in disks.iter() {
            let st = lock(&d.inner);
            let mut image = st.durable.clone();
            for (off, data) in &st.pending {
                let off = *off as usize;
                if Some(idx) == torn {
                    for (i, sector) in data.chunks(512).enumerate() {
                        if rng.chance(1, 2) {
                            let at = off + i * 512;
                            image[at..at + sector.len()].copy_from_slice(sector);
                        }
                    }
                } else if rng.chance(1, 2) {
                    image[off..off + data.len()].copy_from_slice(data);
                }
                idx += 1;
            }
            out.push((d.name.clone(), image));
        }
        out
    }
}

/// One simulated disk; cheap to clone (clones share the media).
#[derive(Clone)]
pub struct SimDevice {
    world: SimWorld,
    disk: Arc<SimDisk>,
}

impl SimDevice {
    /// Flip bits directly on the media (durable and pending alike), as silent
    /// corruption would.
    pub fn corrupt(&self, offset: u64, len: usize, rng: &mut SimRng) {
        let mut st = lock(&self.disk.inner);
        let end = (offset as usize + len).min(st.durable.len());
        for b in &mut st.durable[offset as usize..end] {
            *b ^= (rng.next_u64() as u8) | 1;
        }
        st.pending
            .retain(|(o, d)| *o + d.len() as u64 <= offset || *o >= end as u64);
    }
    pub fn fail_reads(&self, on: bool) {
        lock(&self.disk.inner).fail_reads = on;
    }
    pub fn fail_writes(&self, on: bool) {
        lock(&self.disk.inner).fail_writes = on;
    }
    /// The disk grows to `len` bytes (zeros), as a file enlarged or a LUN
    /// resized: `current_size` sees it at once, `size` once adopted.
    pub fn grow(&self, len: u64) {
        let mut st = lock(&self.disk.inner);
        if len as usize > st.durable.len() {
            st.durable.resize(len as usize, 0);
        }
    }
    /// Writes issued but not yet flushed.
    pub fn pending_writes(&self) -> usize {
        lock(&self.disk.inner).pending.len()
    }

    /// The current image with pending writes applied (what reads return).
    pub fn image(&self) -> Vec<u8> {
        let st = lock(&self.disk.inner);
        let mut img = st.durable.clone();
        for (off, d) in &st.pending {
            img[*off as usize..*off as usize + d.len()].copy_from_slice(d);
        }
        img
    }
}

impl BlockDevice for SimDevice {
    /// A simulated disk takes any write; it answers as a disk of 512-byte
    /// sectors does, so the engine's choice of what goes out unstaged
    /// (`TopVdev::write_blocks`) is the one a file on such a disk gets.
    fn direct_granule(&self) -> usize {
        512
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.world.tick()?;
        let st = lock(&self.disk.inner);
        if st.fail_reads {
            drop(st);
            // A failing read takes its time too (the hook may delay it).
            let hook = lock(&self.world.read_hook).clone();
            if let Some(h) = hook {
                h(&self.disk.name, offset, buf.len());
            }
            return Err(Error::Io {
                path: self.disk.name.clone(),
                source: std::io::Error::other("injected read error"),
            });
        }
        let end = offset as usize + buf.len();
        if end > st.durable.len() {
            return Err(Error::Io {
                path: self.disk.name.clone(),
                source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            });
        }
        buf.copy_from_slice(&st.durable[offset as usize..end]);
        for (off, d) in &st.pending {
            let (ws, we) = (*off as usize, *off as usize + d.len());
            let (s, e) = (ws.max(offset as usize), we.min(end));
            if s < e {
                buf[s - offset as usize..e - offset as usize].copy_from_slice(&d[s - ws..e - ws]);
            }
        }
        drop(st);
        let hook = lock(&self.world.read_hook).clone();
        if let Some(h) = hook {
            h(&self.disk.name, offset, buf.len());
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let hook = lock(&self.world.write_hook).clone();
        if let Some(h) = hook {
            h(&self.disk.name, offset, buf.len());
        }
        self.world.tick()?;
        let mut st = lock(&self.disk.inner);
        if st.fail_writes {
            return Err(Error::Io {
                path: self.disk.name.clone(),
                source: std::io::Error::other("injected write error"),
            });
        }
        if offset + buf.len() as u64 > st.size {
            return Err(Error::invalid(format!(
                "{}: write past end",
                self.disk.name
            )));
        }
        st.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.world.tick()?;
        self.world.tick_flush()?;
        let mut st = lock(&self.disk.inner);
        let pending = std::mem::take(&mut st.pending);
        for (off, d) in pending {
            st.durable[off as usize..off as usize + d.len()].copy_from_slice(&d);
        }
        Ok(())
    }
    /// A file's `pwritev2(RWF_DSYNC)` at its weakest: this write becomes
    /// durable, other pending writes stay pending (a range-only sync does
    /// not write back the file's other dirty pages). So the simulation
    /// catches a commit that leans on such a write to make earlier writes
    /// durable. If an earlier pending write overlaps this one, everything
    /// up to it is folded, so reads keep their order.
    fn write_sync(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_at(buf, offset)?;
        self.world.tick()?;
        self.world.tick_flush()?;
        let mut st = lock(&self.disk.inner);
        let st = &mut *st;
        let Some(at) = st
            .pending
            .iter()
            .rposition(|(o, d)| *o == offset && d.as_slice() == buf)
        else {
            return Ok(());
        };
        let (s, e) = (offset, offset + buf.len() as u64);
        let overlaps = st.pending[..at]
            .iter()
            .any(|(o, d)| *o < e && s < *o + d.len() as u64);
        let folded: Vec<(u64, Vec<u8>)> = if overlaps {
            st.pending.drain(..=at).collect()
        } else {
            vec![st.pending.remove(at)]
        };
        for (off, d) in folded {
            st.durable[off as usize..off as usize + d.len()].copy_from_slice(&d);
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        lock(&self.disk.inner).size
    }
    fn current_size(&self) -> u64 {
        lock(&self.disk.inner).durable.len() as u64
    }
    fn adopt_size(&self) -> u64 {
        let mut st = lock(&self.disk.inner);
        st.size = st.size.max(st.durable.len() as u64);
        st.size
    }
    fn name(&self) -> String {
        self.disk.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Writes between two flushes reach the media in every combination: a
    /// later one may survive where an earlier one is lost. That is every
    /// order in which a device's queue (`vdev/queue.rs`) or its cache could
    /// complete them, so the crash tests cover I/O reordered inside a
    /// queue. Writes to the same sectors keep their issue order, as a
    /// device keeps it for writes it has acknowledged (the engine never
    /// has two overlapping writes in flight at once).
    #[test]
    fn unflushed_writes_reach_the_media_in_every_combination() {
        let mut seen = BTreeSet::new();
        for seed in 0..300 {
            let w = SimWorld::new();
            let d = w.disk("d", 8192);
            for (i, off) in [0u64, 1024, 2048].iter().enumerate() {
                d.write_at(&[i as u8 + 1; 512], *off).expect("write");
            }
            let img = w.crash(&mut SimRng::new(seed));
            let image = &img[0].1;
            seen.insert((image[0] == 1, image[1024] == 2, image[2048] == 3));
        }
        assert_eq!(seen.len(), 8, "combinations seen: {seen:?}");

        let mut last = BTreeSet::new();
        for seed in 0..300 {
            let w = SimWorld::new();
            let d = w.disk("d", 4096);
            d.write_at(&[1; 512], 0).expect("write");
            d.flush().expect("flush");
            d.write_at(&[2; 512], 0).expect("write");
            d.write_at(&[3; 512], 0).expect("write");
            last.insert(w.crash(&mut SimRng::new(seed))[0].1[0]);
        }
        // Flushed bytes or either later version; never anything else.
        assert_eq!(last, BTreeSet::from([1, 2, 3]));
    }
}
