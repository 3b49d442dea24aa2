//! ENOSPC at writeback.
//!
//! With the writeback cache, write(2) returns once the data is in the
//! kernel's pages; the daemon sees it at writeback, and a write it refuses
//! there for space is lost (the kernel drops the pages and reports the
//! error at fsync and close). The kernel does not write a file's pages
//! back in order: background writeback of the tail runs beside the
//! fsync's sweep from the start (seen here: pages at 36-40 MiB written
//! before those at 12-20 MiB). So when a page in the middle is refused,
//! pages after it may already be on disk, and the file would keep
//! zero-filled MiBs in the middle with intact data after them, a file
//! that looks whole and is not.
//!
//! The rule: what a file keeps after a lost writeback is a prefix of what
//! was written to it, as a failed write(2) would have left it.
//!
//! - The first loss latches: writeback of the file past the first lost
//!   byte is refused with the same error.
//! - What landed past the lost byte already is cut off: the file is
//!   truncated to the lost byte, never below its size before this round of
//!   writes (`base`: the size at the first cached write since the last
//!   successful fsync or close), so older data is never cut.
//! - A write that was in flight when the loss latched and lands past it is
//!   cut off too, and answered with the error.
//! - A write that reaches the lost byte again (the application rewriting
//!   from there) moves the mark on; a truncate to at most the lost byte
//!   clears it.
//!
//! The kernel keeps its own idea of the size and pages until it drops the
//! inode; the application has been told (fsync and close fail).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

#[derive(Default)]
pub struct WritebackLatch {
    files: Mutex<HashMap<u64, File>>,
}

struct File {
    /// The file's size at the first cached write of this round.
    base: u64,
    /// The first byte lost, and the error.
    lost: Option<(u64, i32)>,
}

impl File {
    /// The size the file is cut to after a loss.
    fn keep(&self, at: u64) -> u64 {
        at.max(self.base)
    }
}

impl WritebackLatch {
    fn files(&self) -> MutexGuard<'_, HashMap<u64, File>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cached write of `ino` at `offset` is about to be made: refused
    /// with the latched error if it starts past the lost byte. `size`
    /// gives the file's size the first time the file is seen this round.
    pub fn before(&self, ino: u64, offset: u64, size: impl FnOnce() -> u64) -> Result<(), i32> {
        let refused = |f: &File| match f.lost {
            Some((at, errno)) if offset > at => Err(errno),
            _ => Ok(()),
        };
        if let Some(f) = self.files().get(&ino) {
            return refused(f);
        }
        // The size may take a read: not under the lock every writer takes.
        let base = size();
        let mut files = self.files();
        refused(files.entry(ino).or_insert(File { base, lost: None }))
    }

    /// A cached write at `offset` was refused for space (`errno`). Returns
    /// the size the file must be cut to.
    pub fn lost(&self, ino: u64, offset: u64, errno: i32) -> u64 {
        let mut f = self.files();
        let f = f.entry(ino).or_insert(File {
            base: u64::MAX,
            lost: None,
        });
        let at = f.lost.map_or(offset, |(at, _)| at.min(offset));
        f.lost = Some((at, errno));
        f.keep(at)
    }

    /// A cached write of `[offset, offset + n)` landed. `Err((keep,
    /// errno))` if it lies past a byte lost meanwhile: the file must be cut
    /// to `keep` again and the write answered with `errno`.
    pub fn landed(&self, ino: u64, offset: u64, n: u64) -> Result<(), (u64, i32)> {
        let mut files = self.files();
        let Some(f) = files.get_mut(&ino) else {
            return Ok(());
        };
        match f.lost {
            Some((at, errno)) if offset > at => Err((f.keep(at), errno)),
            Some((at, errno)) if offset + n > at => {
                f.lost = Some((offset + n, errno));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// An fsync succeeded, or the file was closed: unless data was lost,
    /// the next round starts from the size the file has then.
    pub fn settled(&self, ino: u64) {
        let mut files = self.files();
        if files.get(&ino).is_some_and(|f| f.lost.is_none()) {
            files.remove(&ino);
        }
    }

    /// The file was truncated to `size`: a loss at or past it is gone.
    pub fn truncated(&self, ino: u64, size: u64) {
        let mut files = self.files();
        if files
            .get(&ino)
            .is_some_and(|f| f.lost.is_some_and(|(at, _)| size <= at))
        {
            files.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_loss_cuts_what_landed_after_it_but_never_older_data() {
        let w = WritebackLatch::default();
        // A file of 4 MiB gets 8 MiB more; the tail lands first.
        w.before(7, 10 * MIB, || 4 * MIB).expect("first write");
        w.landed(7, 10 * MIB, MIB).expect("tail");
        w.before(7, 6 * MIB, || unreachable!()).expect("middle");
        // Refused at 6 MiB: cut to 6 MiB, later writes refused.
        assert_eq!(w.lost(7, 6 * MIB, libc::ENOSPC), 6 * MIB);
        assert_eq!(w.before(7, 7 * MIB, || 0), Err(libc::ENOSPC));
        // One in flight meanwhile lands past it: cut again, refused.
        assert_eq!(w.landed(7, 8 * MIB, MIB), Err((6 * MIB, libc::ENOSPC)));
        // An earlier refusal below the old size keeps the old size.
        assert_eq!(w.lost(7, MIB, libc::ENOSPC), 4 * MIB);
        // Not settled while data is lost; a rewrite from the lost byte
        // moves the mark on.
        w.settled(7);
        w.before(7, MIB, || 0).expect("rewrite");
        w.landed(7, MIB, MIB).expect("rewrite lands");
        assert_eq!(w.before(7, 3 * MIB, || 0), Err(libc::ENOSPC));
        w.before(7, 2 * MIB, || 0).expect("next");
        // A truncate to the lost byte clears it.
        w.truncated(7, 2 * MIB);
        w.before(7, 9 * MIB, || 2 * MIB).expect("after truncate");
        w.settled(7);
        assert!(w.files().is_empty());
    }
}
