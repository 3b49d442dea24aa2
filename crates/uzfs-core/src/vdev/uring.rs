//! Durable writes to several files at once, from the calling thread.
//!
//! An intent-log commit on a mirror writes the same block to each side with
//! `pwritev2(RWF_DSYNC)`, in parallel. Through `vdev/fanout.rs` that costs
//! two thread hand-offs per commit (wake an I/O thread for the second side,
//! and be woken by it), which on this project's 2-CPU VM were a large part
//! of a 4 KiB fsync's latency and of the context switches under 8 writers:
//! two `RWF_DSYNC` writes through a condvar worker took 194-215 us, the same
//! two through one io_uring submission 159-193 us (`bench/RESULTS.md`).
//!
//! Here each thread keeps its own small io_uring. [`write_dsync_all`] copies
//! each source's bytes (gathered from its pieces) once into the ring's
//! staging buffers, submits every write of them with `RWF_DSYNC`, and
//! waits for every completion before it returns: the kernel runs the
//! writes (and their flushes) in parallel, the thread sleeps once. A
//! mirror's sides write the same source, so a block is copied once
//! whatever the width; an intent-log commit that writes data blocks early
//! gives them and its log block in one call (`zil::Zil::write_batch`).
//!
//! Why the copy: a submitted write reads its buffer until it completes, and
//! an entry the kernel has not consumed yet would be submitted by the next
//! call. If the ring ever fails in a way that leaves entries in doubt, the
//! ring and its staging buffers are leaked on purpose (`mem::forget`) and
//! the thread stops using io_uring, so no entry can ever point at memory
//! that was freed or reused. The caller then writes the same bytes to the
//! same offsets its own way, which is harmless to repeat. The copy is also
//! what aligns the bytes for a direct-I/O descriptor; for a log block it
//! costs less than one hand-off.
//!
//! Where io_uring is not available (an old kernel, or a container whose
//! seccomp filter refuses `io_uring_setup`), [`write_dsync_all`] returns
//! `None` and the caller uses the threads.

use std::cell::RefCell;
use std::os::fd::RawFd;

/// Most writes in one call (runs of blocks times a mirror's sides and
/// their spares).
pub const MAX_WRITES: usize = 32;

/// Staging bytes a thread keeps between calls: a 1 MiB synchronous write's
/// data and its log block without a new allocation (the pages of a fresh
/// one are faulted in on every call).
const STAGING_KEEP: usize = 2 << 20;

/// Writes done through a ring since the process started (tests check
/// that a path they mean to cover took it).
pub static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether this thread can use io_uring (sets its ring up if need be).
pub fn available() -> bool {
    write_dsync_all(&[], &[]).is_some()
}

/// One durable write: source `src`'s bytes at `offset` of `fd`.
pub struct DsyncWrite {
    pub fd: RawFd,
    pub offset: u64,
    /// Index into the call's sources.
    pub src: usize,
}

use super::device::DIRECT_ALIGN;

struct Ring {
    ring: io_uring::IoUring,
    staging: Vec<Vec<u8>>,
}

enum State {
    Untried,
    Ready(Box<Ring>),
    /// Not available here, or given up after an error (see the module doc).
    Off,
}

thread_local! {
    static RING: RefCell<State> = const { RefCell::new(State::Untried) };
}

/// Write every one of `writes` with `RWF_DSYNC`, all at once, and wait for
/// them all. A write's bytes are its source's pieces, one after the other
/// (staged at an address aligned for direct I/O, so any descriptor takes
/// them). Returns each write's result (bytes written, or a negative errno),
/// or `None` if this thread has no usable ring or the call is too large:
/// nothing of the caller's is in flight then, and it must do the writes
/// itself.
pub fn write_dsync_all(sources: &[&[&[u8]]], writes: &[DsyncWrite]) -> Option<Vec<i32>> {
    let too_long = |s: &&[&[u8]]| s.iter().map(|p| p.len()).sum::<usize>() > u32::MAX as usize;
    if writes.len() > MAX_WRITES
        || writes.iter().any(|w| w.src >= sources.len())
        || sources.iter().any(too_long)
    {
        return None;
    }
    RING.with(|cell| {
        let mut st = cell.try_borrow_mut().ok()?;
        if matches!(*st, State::Untried) {
            *st = match io_uring::IoUring::new(MAX_WRITES as u32) {
                Ok(ring) => State::Ready(Box::new(Ring {
                    ring,
                    staging: Vec::new(),
                })),
                Err(e) => {
                    log::debug!("io_uring unavailable for log writes ({e}); using threads");
                    State::Off
                }
            };
        }
        let State::Ready(r) = &mut *st else {
            return None;
        };
        if writes.is_empty() {
            return Some(Vec::new());
        }
        match r.run(sources, writes) {
            Ok(res) => {
                ISSUED.fetch_add(res.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Some(res)
            }
            Err(e) => {
                log::warn!("io_uring log writes failed ({e}); using threads from now on");
                if let State::Ready(r) = std::mem::replace(&mut *st, State::Off) {
                    std::mem::forget(r);
                }
                None
            }
        }
    })
}

impl Ring {
    fn run(&mut self, sources: &[&[&[u8]]], writes: &[DsyncWrite]) -> std::io::Result<Vec<i32>> {
        use io_uring::{opcode, types};
        let n = writes.len();
        if self.staging.len() < sources.len() {
            self.staging.resize_with(sources.len(), Vec::new);
        }
        // Each source's bytes start at `at` in its staging buffer, the
        // first aligned address in it.
        let mut starts = Vec::with_capacity(sources.len());
        let mut lens = Vec::with_capacity(sources.len());
        for (s, pieces) in self.staging.iter_mut().zip(sources) {
            let len: usize = pieces.iter().map(|p| p.len()).sum();
            s.clear();
            // Room for the whole source, so `at` stays aligned (no
            // reallocation while it is filled).
            s.reserve(len + DIRECT_ALIGN);
            let at = s.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
            s.resize(at, 0);
            for p in pieces.iter() {
                s.extend_from_slice(p);
            }
            starts.push(at);
            lens.push(len as u32);
        }
        {
            let mut sq = self.ring.submission();
            for (i, w) in writes.iter().enumerate() {
                let buf = self.staging[w.src][starts[w.src]..].as_ptr();
                let e = opcode::Write::new(types::Fd(w.fd), buf, lens[w.src])
                    .offset(w.offset)
                    .rw_flags(libc::RWF_DSYNC)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the entry reads a staging buffer this ring owns,
                // filled above and not touched again until it is reused
                // after this call has reaped every completion, and
                // leaked with the ring otherwise (module doc). The
                // descriptor belongs to a device the caller holds open
                // until this call returns.
                unsafe { sq.push(&e) }
                    .map_err(|_| std::io::Error::other("submission queue full"))?;
            }
        }
        let mut res = vec![i32::MIN; n];
        let mut done = 0;
        while done < n {
            if let Err(e) = self.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) | Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_micros(50))
                    }
                    _ => return Err(e),
                }
            }
            for c in self.ring.completion() {
                let i = c.user_data() as usize;
                if i < n && res[i] == i32::MIN {
                    res[i] = c.result();
                    done += 1;
                }
            }
        }
        // Every write has completed: the staging may go. A thread keeps at
        // most STAGING_KEEP of it between calls (every FUSE and I/O thread
        // may own a ring).
        if self.staging.iter().map(Vec::capacity).sum::<usize>() > STAGING_KEEP {
            self.staging.clear();
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;

    #[test]
    fn every_write_lands_or_the_caller_is_told_to_do_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files: Vec<std::fs::File> = (0..3)
            .map(|i| {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(dir.path().join(format!("f{i}")))
                    .expect("open");
                f.set_len(1 << 20).expect("set_len");
                f
            })
            .collect();
        for round in 0..50u64 {
            // Three sources; the third gathered from two pieces and written
            // to two files (a mirror's sides).
            let bufs: Vec<Vec<u8>> = (0..4)
                .map(|i| vec![(round * 4 + i) as u8; 4096 * (1 + i as usize)])
                .collect();
            let sources: [&[&[u8]]; 3] = [&[&bufs[0]], &[&bufs[1]], &[&bufs[2], &bufs[3]]];
            let want: Vec<Vec<u8>> = sources.iter().map(|s| s.concat()).collect();
            let at = (round % 7) * 8192;
            let plan = [(0, 0), (1, 1), (2, 2), (0, 2)];
            let writes: Vec<DsyncWrite> = plan
                .iter()
                .map(|&(f, src)| DsyncWrite {
                    fd: files[f].as_raw_fd(),
                    // The second write to file 0 lands after the first.
                    offset: at + if src == 2 && f == 0 { 16384 } else { 0 },
                    src,
                })
                .collect();
            let Some(res) = write_dsync_all(&sources, &writes) else {
                // No io_uring here: nothing to check.
                return;
            };
            for ((w, &(f, _)), r) in writes.iter().zip(&plan).zip(res) {
                let b = &want[w.src];
                assert_eq!(r, b.len() as i32, "round {round}");
                let mut got = vec![0u8; b.len()];
                files[f].read_exact_at(&mut got, w.offset).expect("read");
                assert_eq!(&got, b, "round {round}");
            }
        }
        // A bad descriptor fails that write alone, with its errno.
        let b = vec![7u8; 4096];
        let one: [&[&[u8]]; 1] = [&[&b]];
        let writes = [
            DsyncWrite {
                fd: files[0].as_raw_fd(),
                offset: 0,
                src: 0,
            },
            DsyncWrite {
                fd: -1,
                offset: 0,
                src: 0,
            },
        ];
        let res = write_dsync_all(&one, &writes).expect("ring");
        assert_eq!(res[0], 4096);
        assert_eq!(res[1], -libc::EBADF);
        // Too many writes for one call, or a source that is not there:
        // the caller's job.
        let many: Vec<DsyncWrite> = (0..MAX_WRITES + 1)
            .map(|_| DsyncWrite {
                fd: files[0].as_raw_fd(),
                offset: 0,
                src: 0,
            })
            .collect();
        assert!(write_dsync_all(&one, &many).is_none());
        let stray = [DsyncWrite {
            fd: files[0].as_raw_fd(),
            offset: 0,
            src: 1,
        }];
        assert!(write_dsync_all(&one, &stray).is_none());
    }
}
