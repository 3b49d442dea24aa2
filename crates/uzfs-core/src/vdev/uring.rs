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
//! each write's bytes into the ring's staging buffers, submits them all with
//! `RWF_DSYNC`, and waits for every completion before it returns: the
//! kernel runs the writes (and their flushes) in parallel, the thread
//! sleeps once.
//!
//! Why the copy: a submitted write reads its buffer until it completes, and
//! an entry the kernel has not consumed yet would be submitted by the next
//! call. If the ring ever fails in a way that leaves entries in doubt, the
//! ring and its staging buffers are leaked on purpose (`mem::forget`) and
//! the thread stops using io_uring, so no entry can ever point at memory
//! that was freed or reused. The caller then writes the same bytes to the
//! same offsets its own way, which is harmless to repeat. Log blocks are
//! small; the copy costs less than one hand-off.
//!
//! Where io_uring is not available (an old kernel, or a container whose
//! seccomp filter refuses `io_uring_setup`), [`write_dsync_all`] returns
//! `None` and the caller uses the threads.

use std::cell::RefCell;
use std::os::fd::RawFd;

/// Most writes in one call (a mirror's sides and their spares).
pub const MAX_WRITES: usize = 16;

/// Staging bytes a thread keeps between calls.
const STAGING_KEEP: usize = 1 << 20;

/// Writes done through a ring since the process started (tests check
/// that a path they mean to cover took it).
pub static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether this thread can use io_uring (sets its ring up if need be).
pub fn available() -> bool {
    write_dsync_all(&[]).is_some()
}

/// One durable write.
pub struct DsyncWrite<'a> {
    pub fd: RawFd,
    pub offset: u64,
    pub buf: &'a [u8],
    /// A direct-I/O descriptor: the bytes are staged at an address aligned
    /// to [`DIRECT_ALIGN`].
    pub aligned: bool,
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
/// them all. Returns each write's result (bytes written, or a negative
/// errno), or `None` if this thread has no usable ring: nothing of the
/// caller's is in flight then, and it must do the writes itself.
pub fn write_dsync_all(writes: &[DsyncWrite<'_>]) -> Option<Vec<i32>> {
    if writes.len() > MAX_WRITES {
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
        match r.run(writes) {
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
    fn run(&mut self, writes: &[DsyncWrite<'_>]) -> std::io::Result<Vec<i32>> {
        use io_uring::{opcode, types};
        let n = writes.len();
        if self.staging.len() < n {
            self.staging.resize_with(n, Vec::new);
        }
        // Each write's bytes start at `at` in its staging buffer: 0, or the
        // first aligned address for a direct descriptor.
        let mut starts = [0usize; MAX_WRITES];
        for ((s, w), at) in self.staging.iter_mut().zip(writes).zip(&mut starts) {
            s.clear();
            s.resize(w.buf.len() + DIRECT_ALIGN, 0);
            *at = if w.aligned {
                s.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN)
            } else {
                0
            };
            s[*at..*at + w.buf.len()].copy_from_slice(w.buf);
        }
        {
            let mut sq = self.ring.submission();
            for (i, ((w, s), at)) in writes.iter().zip(&self.staging).zip(starts).enumerate() {
                let len = u32::try_from(w.buf.len())
                    .map_err(|_| std::io::Error::other("write too large"))?;
                let e = opcode::Write::new(types::Fd(w.fd), s[at..].as_ptr(), len)
                    .offset(w.offset)
                    .rw_flags(libc::RWF_DSYNC)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the entry reads `s`, a staging buffer this ring
                // owns; it is only reused after this call has reaped every
                // completion, and leaked with the ring otherwise (module
                // doc). The descriptor belongs to a device the caller holds
                // open until this call returns.
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
        // most STAGING_KEEP of it between calls (log blocks are up to 256
        // KiB, and every FUSE and I/O thread may own a ring).
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
            let bufs: Vec<Vec<u8>> = (0..3)
                .map(|i| vec![(round * 3 + i) as u8; 4096 * (1 + i as usize)])
                .collect();
            let writes: Vec<DsyncWrite<'_>> = files
                .iter()
                .zip(&bufs)
                .map(|(f, b)| DsyncWrite {
                    fd: f.as_raw_fd(),
                    offset: (round % 7) * 8192,
                    buf: b,
                    aligned: round % 2 == 0,
                })
                .collect();
            let Some(res) = write_dsync_all(&writes) else {
                // No io_uring here: nothing to check.
                return;
            };
            for ((f, b), r) in files.iter().zip(&bufs).zip(res) {
                assert_eq!(r, b.len() as i32, "round {round}");
                let mut got = vec![0u8; b.len()];
                f.read_exact_at(&mut got, (round % 7) * 8192).expect("read");
                assert_eq!(&got, b, "round {round}");
            }
        }
        // A bad descriptor fails that write alone, with its errno.
        let b = vec![7u8; 4096];
        let writes = [
            DsyncWrite {
                fd: files[0].as_raw_fd(),
                offset: 0,
                buf: &b,
                aligned: false,
            },
            DsyncWrite {
                fd: -1,
                offset: 0,
                buf: &b,
                aligned: false,
            },
        ];
        let res = write_dsync_all(&writes).expect("ring");
        assert_eq!(res[0], 4096);
        assert_eq!(res[1], -libc::EBADF);
        // Too many writes for one call: the caller's job.
        let many: Vec<DsyncWrite<'_>> = (0..MAX_WRITES + 1)
            .map(|_| DsyncWrite {
                fd: files[0].as_raw_fd(),
                offset: 0,
                buf: &b,
                aligned: false,
            })
            .collect();
        assert!(write_dsync_all(&many).is_none());
    }
}
