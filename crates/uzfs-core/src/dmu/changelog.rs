//! The object set's change log: what the intent log (`zil/`) records.
//!
//! # Theory of operation
//!
//! The intent log must be able to redo, after a crash, every operation that
//! was acknowledged as synced but whose txg never committed. OpenZFS logs
//! POSIX-level records (`TX_CREATE`, `TX_WRITE`, ...) and replays them
//! through the POSIX layer with forced object numbers. uzfs logs one level
//! lower: every change an operation makes to its object set (create an
//! object with this number, set this bonus buffer, write these bytes at this
//! offset, punch this range, free this object) is encoded as it is made,
//! and replay applies the same changes to the same object set. That has
//! three consequences the crash tests lean on:
//!
//! * **Every operation is covered**, including the ones a POSIX-level log
//!   forgets (ACLs through xattrs, the unlinked set, a block-size change),
//!   because nothing above the object set can change it without passing
//!   through one of the seven calls below.
//! * **Replay is deterministic and idempotent**: the changes are applied
//!   from the committed state, in the order they were made, with the object
//!   numbers they had; replaying the same records again from the same
//!   committed state gives the same result (the replay's own txg resets the
//!   log header, so it is replayed either wholly again or never).
//! * **Order is the order of the locks.** An operation buffers its changes
//!   (a thread-local *op scope*) and hands them to the log as one record
//!   while it still holds its object locks (`Zpl` flushes the scope when
//!   its lock guards drop), so two operations on one object reach the log
//!   in the order they changed it, and a record never holds half an
//!   operation. Directory changes are logged as the whole ZAP block they
//!   produced (`modify_block`), data writes as the bytes written.
//!
//! Records are tagged with the txg the operation held; the log drops them
//! when that txg commits (`ChangeLog::synced`).

use super::blkptr::{BlkPtr, BLKPTR_SIZE};
use super::checksum::ChecksumType;
use super::compress::Compression;
use super::dnode::{ObjProps, BONUS_SIZE};
use super::objset::Objset;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// Where the changes of an object set go (the dataset's intent log).
pub trait ChangeLog: Send + Sync {
    /// Whether changes of `txg` are to be recorded at all (the log may have
    /// given up on a txg whose records outgrew its memory bound, or the
    /// dataset may have `sync=disabled`).
    fn recording(&self, txg: u64) -> bool;
    /// One operation's changes, made while holding `txg`. `blocks` are the
    /// whole data blocks its `BLOCK_REF` changes name (see [`resolve`]).
    fn push(&self, txg: u64, record: Vec<u8>, blocks: Vec<Arc<Vec<u8>>>);
    /// The log header to store in the object-set block written for `txg`.
    fn header(&self, txg: u64) -> [u8; LOG_HEADER_SIZE];
    /// `txg` has committed: its records are no longer needed.
    fn synced(&self, txg: u64);
    /// A header written with `txg` would free log blocks the last one
    /// keeps: the object set is rewritten for it even with nothing dirty.
    fn wants_header(&self, _txg: u64) -> bool {
        false
    }
}

/// Bytes of the log header in the object-set block.
pub const LOG_HEADER_SIZE: usize = 64;

const CREATE: u8 = 1;
const FREE: u8 = 2;
const SET_SIZE: u8 = 3;
const SET_BONUS: u8 = 4;
const GROW: u8 = 5;
const FREE_RANGE: u8 = 6;
const WRITE: u8 = 7;
/// A whole data block written once as an ordinary block: its block
/// pointer (OpenZFS's `WR_INDIRECT`). On disk only.
const WRITE_INDIRECT: u8 = 8;
/// A whole data block by reference (the dirty buffer, shared): in memory
/// only, turned into `WRITE` or `WRITE_INDIRECT` when the log is written.
const BLOCK_REF: u8 = 9;

/// One change, borrowed from the caller (encoded at once).
pub(crate) enum Change<'a> {
    Create {
        obj: u64,
        obj_type: u8,
        blksz: u32,
        props: ObjProps,
    },
    Free {
        obj: u64,
    },
    SetSize {
        obj: u64,
        size: u64,
    },
    SetBonus {
        obj: u64,
        bonus: &'a [u8; BONUS_SIZE],
    },
    Grow {
        obj: u64,
        blksz: u32,
    },
    FreeRange {
        obj: u64,
        start: u64,
        end: u64,
    },
    Write {
        obj: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// Block `offset / lsize` of `obj` is the block `bp` points at.
    WriteIndirect {
        obj: u64,
        offset: u64,
        bp: BlkPtr,
    },
    /// In memory only: block `blkid` of `obj` holds the record's
    /// `blocks[idx]`.
    BlockRef {
        obj: u64,
        blkid: u64,
        idx: u32,
    },
}

impl Change<'_> {
    fn encode(&self, out: &mut Vec<u8>) {
        let u64s = |out: &mut Vec<u8>, v: &[u64]| {
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
        match *self {
            Change::Create {
                obj,
                obj_type,
                blksz,
                props,
            } => {
                out.push(CREATE);
                u64s(out, &[obj]);
                out.push(obj_type);
                out.extend_from_slice(&blksz.to_le_bytes());
                out.extend_from_slice(&[props.checksum as u8, props.compress as u8, props.copies]);
            }
            Change::Free { obj } => {
                out.push(FREE);
                u64s(out, &[obj]);
            }
            Change::SetSize { obj, size } => {
                out.push(SET_SIZE);
                u64s(out, &[obj, size]);
            }
            Change::SetBonus { obj, bonus } => {
                out.push(SET_BONUS);
                u64s(out, &[obj]);
                out.extend_from_slice(bonus);
            }
            Change::Grow { obj, blksz } => {
                out.push(GROW);
                u64s(out, &[obj]);
                out.extend_from_slice(&blksz.to_le_bytes());
            }
            Change::FreeRange { obj, start, end } => {
                out.push(FREE_RANGE);
                u64s(out, &[obj, start, end]);
            }
            Change::Write { obj, offset, data } => {
                out.push(WRITE);
                u64s(out, &[obj, offset]);
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
            }
            Change::WriteIndirect { obj, offset, bp } => {
                out.push(WRITE_INDIRECT);
                u64s(out, &[obj, offset]);
                out.extend_from_slice(&bp.to_bytes());
            }
            Change::BlockRef { obj, blkid, idx } => {
                out.push(BLOCK_REF);
                u64s(out, &[obj, blkid]);
                out.extend_from_slice(&idx.to_le_bytes());
            }
        }
    }
}

thread_local! {
    /// The op scope of this thread: (object set address, txg, changes).
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// One operation's changes being buffered.
struct Scope {
    os: usize,
    txg: u64,
    rec: Vec<u8>,
    blocks: Vec<Arc<Vec<u8>>>,
}

/// An operation's changes are buffered while this lives and handed to the
/// log as one record when it is flushed or dropped (see the module docs).
#[must_use = "changes are buffered only while the scope lives"]
pub struct OpScope<'a> {
    os: Option<&'a Objset>,
}

impl<'a> OpScope<'a> {
    pub(crate) fn open(os: &'a Objset) -> OpScope<'a> {
        if os.change_log().is_none() {
            return OpScope { os: None };
        }
        let took = SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            if s.is_some() {
                return false;
            }
            *s = Some(Scope {
                os: os.key(),
                txg: 0,
                rec: Vec::new(),
                blocks: Vec::new(),
            });
            true
        });
        OpScope {
            os: took.then_some(os),
        }
    }
}

impl Drop for OpScope<'_> {
    fn drop(&mut self) {
        if let Some(os) = self.os {
            flush(os);
            SCOPE.with(|s| *s.borrow_mut() = None);
        }
    }
}

/// Hand the changes buffered by this thread's scope on `os` to its log.
pub(crate) fn flush(os: &Objset) {
    let Some(log) = os.change_log() else { return };
    let taken = SCOPE.with(|s| match &mut *s.borrow_mut() {
        Some(sc) if sc.os == os.key() && !sc.rec.is_empty() => Some((
            sc.txg,
            std::mem::take(&mut sc.rec),
            std::mem::take(&mut sc.blocks),
        )),
        _ => None,
    });
    if let Some((txg, rec, blocks)) = taken {
        log.push(txg, rec, blocks);
    }
}

/// Record `c`, made on `os` in `txg`: into this thread's scope if it has
/// one on `os`, else as a record of its own.
pub(crate) fn note(os: &Objset, txg: u64, c: Change<'_>) {
    let Some(log) = os.change_log() else { return };
    if !log.recording(txg) {
        return;
    }
    let own = SCOPE.with(|s| match &mut *s.borrow_mut() {
        Some(sc) if sc.os == os.key() => {
            debug_assert!(sc.txg == 0 || sc.txg == txg, "one op scope across two txgs");
            sc.txg = txg;
            c.encode(&mut sc.rec);
            true
        }
        _ => false,
    });
    if !own {
        let mut rec = Vec::new();
        c.encode(&mut rec);
        log.push(txg, rec, Vec::new());
    }
}

/// Record that block `blkid` of `obj` was written whole in `txg` and now
/// holds `data` (the dirty buffer itself: a later write of the block in
/// the same txg copies it first, so the record keeps what this write
/// left). When the log is written the block is copied into the record or,
/// if large, written once as an ordinary block and logged by its pointer
/// ([`resolve`]).
pub(crate) fn note_block(os: &Objset, txg: u64, obj: u64, blkid: u64, data: Arc<Vec<u8>>) {
    let Some(log) = os.change_log() else { return };
    if !log.recording(txg) {
        return;
    }
    let mut data = Some(data);
    SCOPE.with(|s| {
        if let Some(sc) = &mut *s.borrow_mut() {
            if sc.os == os.key() {
                debug_assert!(sc.txg == 0 || sc.txg == txg, "one op scope across two txgs");
                sc.txg = txg;
                let idx = sc.blocks.len() as u32;
                Change::BlockRef { obj, blkid, idx }.encode(&mut sc.rec);
                sc.blocks.extend(data.take());
            }
        }
    });
    if let Some(d) = data {
        let mut rec = Vec::new();
        Change::BlockRef { obj, blkid, idx: 0 }.encode(&mut rec);
        log.push(txg, rec, vec![d]);
    }
}

/// How [`resolve`] logs one whole block: `Some(bp)` if it was written as
/// an ordinary block, `None` to copy it into the record.
pub type BlockPlacer<'a> = dyn FnMut(u64, u64, &Arc<Vec<u8>>) -> Option<BlkPtr> + 'a;

/// The on-disk form of an in-memory record: each `BLOCK_REF` becomes a
/// `WRITE_INDIRECT` (if `place(obj, blkid, data)` wrote the block) or a
/// `WRITE` of its bytes. Returns (record, bytes logged by pointer).
pub fn resolve(
    rec: &[u8],
    blocks: &[Arc<Vec<u8>>],
    place: &mut BlockPlacer<'_>,
) -> Result<(Vec<u8>, u64)> {
    if blocks.is_empty() {
        return Ok((rec.to_vec(), 0));
    }
    let mut out = Vec::with_capacity(rec.len());
    let mut indirect = 0;
    for c in decode_any(rec, true)? {
        match c {
            Change::BlockRef { obj, blkid, idx } => {
                let data = blocks.get(idx as usize).ok_or_else(|| {
                    Error::Internal(format!("record names block {idx} of {}", blocks.len()))
                })?;
                let offset = blkid * data.len() as u64;
                match place(obj, blkid, data) {
                    Some(bp) => {
                        indirect += data.len() as u64;
                        Change::WriteIndirect { obj, offset, bp }.encode(&mut out)
                    }
                    None => Change::Write {
                        obj,
                        offset,
                        data: data.as_slice(),
                    }
                    .encode(&mut out),
                }
            }
            c => c.encode(&mut out),
        }
    }
    Ok((out, indirect))
}

struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| Error::corrupt("intent log record", "truncated change"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let mut x = [0u8; 4];
        x.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(x))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut x = [0u8; 8];
        x.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(x))
    }
}

/// Decode an on-disk record into its changes (checked whole before any is
/// applied).
pub(crate) fn decode(rec: &[u8]) -> Result<Vec<Change<'_>>> {
    decode_any(rec, false)
}

/// `in_memory`: `BLOCK_REF` is allowed (a record not yet resolved).
fn decode_any(rec: &[u8], in_memory: bool) -> Result<Vec<Change<'_>>> {
    let mut r = Rd { b: rec, at: 0 };
    let mut out = Vec::new();
    while r.at < rec.len() {
        let tag = r.u8()?;
        let obj = r.u64()?;
        out.push(match tag {
            CREATE => {
                let obj_type = r.u8()?;
                let blksz = r.u32()?;
                let p = r.take(3)?;
                Change::Create {
                    obj,
                    obj_type,
                    blksz,
                    props: ObjProps {
                        checksum: ChecksumType::from_u8(p[0])?,
                        compress: Compression::from_u8(p[1])?,
                        copies: p[2],
                    },
                }
            }
            FREE => Change::Free { obj },
            SET_SIZE => Change::SetSize {
                obj,
                size: r.u64()?,
            },
            SET_BONUS => Change::SetBonus {
                obj,
                bonus: r
                    .take(BONUS_SIZE)?
                    .try_into()
                    .map_err(|_| Error::corrupt("intent log record", "bonus size"))?,
            },
            GROW => Change::Grow {
                obj,
                blksz: r.u32()?,
            },
            FREE_RANGE => Change::FreeRange {
                obj,
                start: r.u64()?,
                end: r.u64()?,
            },
            WRITE => {
                let offset = r.u64()?;
                let n = r.u32()? as usize;
                Change::Write {
                    obj,
                    offset,
                    data: r.take(n)?,
                }
            }
            WRITE_INDIRECT => Change::WriteIndirect {
                obj,
                offset: r.u64()?,
                bp: BlkPtr::decode(r.take(BLKPTR_SIZE)?)?,
            },
            BLOCK_REF if in_memory => Change::BlockRef {
                obj,
                blkid: r.u64()?,
                idx: r.u32()?,
            },
            t => {
                return Err(Error::corrupt(
                    "intent log record",
                    format!("unknown change type {t}"),
                ))
            }
        });
    }
    Ok(out)
}

/// Reads the data block a `WRITE_INDIRECT` change names (logical bytes).
pub type LoggedBlockReader<'a> = dyn Fn(&BlkPtr) -> Result<Vec<u8>> + 'a;

/// Apply a record's changes to `os` (replay; the log is not attached yet,
/// so nothing is recorded again).
pub fn apply(os: &Objset, rec: &[u8], read: &LoggedBlockReader<'_>) -> Result<()> {
    let changes = decode(rec)?;
    let _tx = os.tx();
    for c in changes {
        match c {
            Change::Create {
                obj,
                obj_type,
                blksz,
                props,
            } => os.create_object_at(obj, obj_type, blksz, &props)?,
            Change::Free { obj } => os.free_object(obj)?,
            Change::SetSize { obj, size } => os.set_size(obj, size)?,
            Change::SetBonus { obj, bonus } => os.set_bonus(obj, bonus)?,
            Change::Grow { obj, blksz } => os.grow_blocksize(obj, blksz)?,
            Change::FreeRange { obj, start, end } => os.free_range(obj, start, end)?,
            Change::Write { obj, offset, data } => {
                os.write(obj, offset, data)?;
            }
            Change::WriteIndirect { obj, offset, bp } => {
                let data = read(&bp)?;
                os.write(obj, offset, &data)?;
            }
            Change::BlockRef { .. } => {
                return Err(Error::corrupt("intent log record", "unresolved block"))
            }
        }
    }
    Ok(())
}

/// The block pointers a record's `WRITE_INDIRECT` changes name (claimed at
/// import before replay, like the log's own blocks).
pub fn indirect_blocks(rec: &[u8]) -> Result<Vec<BlkPtr>> {
    Ok(decode(rec)?
        .into_iter()
        .filter_map(|c| match c {
            Change::WriteIndirect { bp, .. } => Some(bp),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_every_cut_or_bad_tag_is_an_error() {
        let bonus = [7u8; BONUS_SIZE];
        let changes = [
            Change::Create {
                obj: 5,
                obj_type: 19,
                blksz: 512,
                props: ObjProps::default(),
            },
            Change::SetBonus {
                obj: 5,
                bonus: &bonus,
            },
            Change::Write {
                obj: 5,
                offset: 100,
                data: b"hello",
            },
            Change::Grow {
                obj: 5,
                blksz: 4096,
            },
            Change::FreeRange {
                obj: 5,
                start: 0,
                end: 1,
            },
            Change::SetSize { obj: 5, size: 9 },
            Change::Free { obj: 5 },
        ];
        let mut rec = Vec::new();
        let mut ends = Vec::new();
        for c in &changes {
            c.encode(&mut rec);
            ends.push(rec.len());
        }
        assert_eq!(decode(&rec).expect("decode").len(), changes.len());
        // Cut at a change boundary: the changes before it; anywhere else
        // (inside a change): an error, never a panic or a partial change.
        for cut in 1..rec.len() {
            match ends.iter().position(|&e| e == cut) {
                Some(i) => assert_eq!(decode(&rec[..cut]).expect("boundary").len(), i + 1),
                None => assert!(decode(&rec[..cut]).is_err(), "cut {cut} decoded"),
            }
        }
        let mut bad = rec.clone();
        bad[0] = 99;
        assert!(decode(&bad).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..600usize {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly valid tags, so decoding gets past the first byte.
                    if x.is_multiple_of(5) {
                        (x % 8) as u8
                    } else {
                        (x >> 8) as u8
                    }
                })
                .collect();
            let _ = decode(&b);
        }
    }
}
