//! Gang blocks: a block stored in pieces when no free extent can hold it
//! whole.
//!
//! # Theory
//!
//! Admission (`spa/txg.rs`, `writable_space`) guarantees that the sync has
//! enough free *bytes* for everything it writes. It cannot guarantee
//! *contiguous* bytes: after many small files are written and every other
//! one deleted, a pool can have megabytes free and no hole as large as one
//! 128 KiB record (measured: 19 MiB allocatable, largest extent 124 KiB,
//! four processes filling a 160 MiB pool). Before gang blocks that sync
//! failed with "out of space" and suspended the pool.
//!
//! As in OpenZFS (`zio_write_gang_block`), the sync then writes the block
//! as a *gang*: the bytes are cut into up to [`MAX_PIECES`] pieces, each
//! allocated on its own, and a small *gang header* lists them. The block
//! pointer's DVA points to the header and carries the `DVA_GANG` flag; its
//! `asize` is the whole tree's (header and pieces), so space accounting is
//! unchanged. A piece that still does not fit is itself a gang (the tree
//! recurses until pieces are one sector). Each copy (`copies=N`) is its
//! own tree on one top-level vdev. Everything above the SPA (the DMU,
//! the block checksum in the pointer, compression) never sees the
//! difference: `SpaIo::read_phys` returns the joined bytes, verified
//! against the pointer's checksum as for any block.
//!
//! ```text
//! gang header, HEADER_PSIZE (1 KiB) bytes, little-endian
//!    0  magic u64 "UZFSGANG"
//!    8  count u64                  pieces (1..=MAX_PIECES)
//!   16  reserved u64 (zero)
//!   24  piece[count], 56 bytes each:
//!         0 offset u64             of the piece (or its gang header) in the vdev
//!         8 asize u64              allocated bytes (a gang piece: its whole tree)
//!        16 psize u32              bytes of the block this piece holds
//!        20 flags u32              bit 0: the piece is itself a gang
//!        24 sha256[32]             of the piece's bytes
//!  1024-32  sha256(header[0..1024-32] ++ header's vdev offset u64)
//! ```
//!
//! The header checksums itself, folding in its own address (as the
//! uberblock does), so a header read from the wrong place never verifies;
//! each piece carries its own checksum so a mirror or RAID-Z vdev can
//! rebuild a damaged piece, and a scrub repairs it, piece by piece.
//!
//! Costs: a gang block takes one more header allocation per level and
//! more I/Os; it only exists when the pool is fragmented and nearly full.
//! Reads heal a damaged piece from the vdev's own redundancy (mirror
//! sides, RAID-Z parity); unlike a whole block, a gang copy is not
//! rewritten from a ditto copy on another vdev (a scrub reports it).

use crate::error::{Error, Result};
use crate::vdev::{ScanRepair, TopVdev};
use sha2::Digest;

pub use crate::dmu::blkptr::DVA_GANG;
/// Bytes of a gang header.
pub const HEADER_PSIZE: u64 = 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"UZFSGANG");
const HEAD: usize = 24;
const ENTRY: usize = 56;
const TRAILER: usize = 32;
/// Pieces one header lists.
pub const MAX_PIECES: usize = (HEADER_PSIZE as usize - HEAD - TRAILER) / ENTRY;
/// Levels below the top header a writer builds (about log17(block /
/// sector) are ever needed).
pub const WRITE_DEPTH: u32 = 5;
/// Levels of gang headers a reader follows (more than a writer builds
/// means a damaged or hostile header).
const MAX_DEPTH: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: u64,
    pub asize: u64,
    pub psize: u32,
    pub gang: bool,
    pub checksum: [u8; 32],
}

pub fn piece_checksum(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

fn header_checksum(body: &[u8], at: u64) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    h.update(body);
    h.update(at.to_le_bytes());
    h.finalize().into()
}

/// Encode the header listing `pieces`, to be written at vdev offset `at`.
pub fn encode_header(pieces: &[Piece], at: u64) -> Vec<u8> {
    assert!(
        (1..=MAX_PIECES).contains(&pieces.len()),
        "gang header with {} pieces",
        pieces.len()
    );
    let mut b = vec![0u8; HEADER_PSIZE as usize];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&(pieces.len() as u64).to_le_bytes());
    for (i, p) in pieces.iter().enumerate() {
        let e = &mut b[HEAD + i * ENTRY..HEAD + (i + 1) * ENTRY];
        e[0..8].copy_from_slice(&p.offset.to_le_bytes());
        e[8..16].copy_from_slice(&p.asize.to_le_bytes());
        e[16..20].copy_from_slice(&p.psize.to_le_bytes());
        e[20..24].copy_from_slice(&(p.gang as u32).to_le_bytes());
        e[24..56].copy_from_slice(&p.checksum);
    }
    let n = b.len() - TRAILER;
    let ck = header_checksum(&b[..n], at);
    b[n..].copy_from_slice(&ck);
    b
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decode a header read from vdev offset `at`; every field is checked.
pub fn decode_header(b: &[u8], at: u64) -> Result<Vec<Piece>> {
    let bad = |why: &str| Err(Error::corrupt("gang header", format!("at {at:#x}: {why}")));
    if b.len() != HEADER_PSIZE as usize {
        return bad("wrong size");
    }
    let n = b.len() - TRAILER;
    if header_checksum(&b[..n], at)[..] != b[n..] {
        return bad("checksum mismatch");
    }
    if le64(b, 0) != MAGIC {
        return bad("bad magic");
    }
    let count = le64(b, 8);
    if count == 0 || count > MAX_PIECES as u64 {
        return bad("bad piece count");
    }
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let e = &b[HEAD + i * ENTRY..HEAD + (i + 1) * ENTRY];
        let mut psize = [0u8; 4];
        psize.copy_from_slice(&e[16..20]);
        let mut flags = [0u8; 4];
        flags.copy_from_slice(&e[20..24]);
        let mut checksum = [0u8; 32];
        checksum.copy_from_slice(&e[24..56]);
        let p = Piece {
            offset: le64(e, 0),
            asize: le64(e, 8),
            psize: u32::from_le_bytes(psize),
            gang: u32::from_le_bytes(flags) & 1 != 0,
            checksum,
        };
        if p.psize == 0 || p.asize == 0 || u32::from_le_bytes(flags) > 1 {
            return bad("bad piece");
        }
        out.push(p);
    }
    Ok(out)
}

fn depth_ok(depth: u32, at: u64) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::corrupt(
            "gang header",
            format!("at {at:#x}: gang tree deeper than {MAX_DEPTH} levels"),
        ));
    }
    Ok(())
}

fn in_bounds(top: &TopVdev, offset: u64, len: u64) -> Result<()> {
    if offset.checked_add(len).is_none_or(|e| e > top.asize) {
        return Err(Error::corrupt(
            "gang header",
            format!("piece at {offset:#x} lies past the end of the vdev"),
        ));
    }
    Ok(())
}

/// Read and decode the header at `offset` (healing it from the vdev's own
/// redundancy like any block).
pub fn read_header(top: &TopVdev, offset: u64, birth: u64) -> Result<Vec<Piece>> {
    in_bounds(top, offset, HEADER_PSIZE)?;
    let verify = |b: &[u8]| decode_header(b, offset).is_ok();
    let (b, _) = top.read_block(offset, HEADER_PSIZE, birth, &verify, false)?;
    decode_header(&b, offset)
}

/// The bytes of the gang tree whose header is at `offset` on `top`.
pub fn read(top: &TopVdev, offset: u64, birth: u64) -> Result<Vec<u8>> {
    read_at(top, offset, birth, 0)
}

fn read_at(top: &TopVdev, offset: u64, birth: u64, depth: u32) -> Result<Vec<u8>> {
    depth_ok(depth, offset)?;
    let pieces = read_header(top, offset, birth)?;
    let mut out = Vec::new();
    for p in pieces {
        let data = if p.gang {
            read_at(top, p.offset, birth, depth + 1)?
        } else {
            in_bounds(top, p.offset, p.psize as u64)?;
            let verify = |b: &[u8]| piece_checksum(b) == p.checksum;
            top.read_block(p.offset, p.psize as u64, birth, &verify, false)?
                .0
        };
        if data.len() != p.psize as usize || piece_checksum(&data) != p.checksum {
            return Err(Error::Checksum(format!(
                "gang piece at {:#x} does not match its header",
                p.offset
            )));
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// Every extent `(offset, asize)` of the tree whose header is at `offset`
/// and whose whole tree takes `total` bytes: the headers and the pieces
/// (what a free returns to the allocator, what zdb counts as referenced).
pub fn extents(top: &TopVdev, offset: u64, total: u64, birth: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    extents_at(top, offset, total, birth, 0, &mut out)?;
    Ok(out)
}

fn extents_at(
    top: &TopVdev,
    offset: u64,
    total: u64,
    birth: u64,
    depth: u32,
    out: &mut Vec<(u64, u64)>,
) -> Result<()> {
    depth_ok(depth, offset)?;
    let pieces = read_header(top, offset, birth)?;
    let below: u64 = pieces.iter().map(|p| p.asize).sum();
    let Some(header) = total.checked_sub(below).filter(|h| *h > 0) else {
        return Err(Error::corrupt(
            "gang header",
            format!("at {offset:#x}: pieces take more than the tree's {total} bytes"),
        ));
    };
    out.push((offset, header));
    for p in pieces {
        if p.gang {
            extents_at(top, p.offset, p.asize, birth, depth + 1, out)?;
        } else {
            out.push((p.offset, p.asize));
        }
    }
    Ok(())
}

/// What [`each_extent`] calls per extent: `(offset, psize, verify)`.
type ExtentOp<'a> = dyn FnMut(u64, u64, &dyn Fn(&[u8]) -> bool) -> Result<bool> + 'a;

/// Visit every extent of the tree whose header is at `offset`: each
/// header, then its pieces in order, with the check that verifies it.
/// `op(offset, psize, verify)` returns whether to go on below a header
/// (false: it could not be read whole).
fn each_extent(
    top: &TopVdev,
    offset: u64,
    birth: u64,
    depth: u32,
    op: &mut ExtentOp<'_>,
) -> Result<()> {
    depth_ok(depth, offset)?;
    in_bounds(top, offset, HEADER_PSIZE)?;
    if !op(offset, HEADER_PSIZE, &|b| decode_header(b, offset).is_ok())? {
        return Ok(());
    }
    for p in read_header(top, offset, birth)? {
        if p.gang {
            each_extent(top, p.offset, birth, depth + 1, op)?;
        } else {
            in_bounds(top, p.offset, p.psize as u64)?;
            op(p.offset, p.psize as u64, &|b| {
                piece_checksum(b) == p.checksum
            })?;
        }
    }
    Ok(())
}

/// Scrub or resilver every extent of a gang tree: the headers and the
/// pieces, each verified by its own checksum and repaired from the vdev's
/// redundancy (`TopVdev::scan_block`).
pub fn scan(top: &TopVdev, offset: u64, birth: u64, scrub: bool) -> Result<ScanRepair> {
    let mut total = ScanRepair::default();
    each_extent(top, offset, birth, 0, &mut |at, len, verify| {
        let r = top.scan_block(at, len, birth, verify, scrub)?;
        total.repaired += r.repaired;
        total.unrecoverable |= r.unrecoverable;
        Ok(!r.unrecoverable)
    })?;
    Ok(total)
}

/// zdb: check every copy and column of every extent of a gang tree
/// without writing; returns the bad leaves and why.
pub fn check(top: &TopVdev, offset: u64, birth: u64) -> Result<Vec<(String, &'static str)>> {
    let mut bad = Vec::new();
    each_extent(top, offset, birth, 0, &mut |at, len, verify| {
        bad.extend(top.check_block(at, len, birth, verify)?);
        Ok(true)
    })?;
    Ok(bad)
}

/// How to cut `len` bytes into pieces on a vdev of `sector`-byte sectors:
/// at most [`MAX_PIECES`], each a whole number of sectors but the last.
pub fn piece_len(len: usize, sector: usize) -> usize {
    let n = len.div_ceil(sector).clamp(1, MAX_PIECES);
    len.div_ceil(n).next_multiple_of(sector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(i: u64, gang: bool) -> Piece {
        Piece {
            offset: i << 12,
            asize: 4096,
            psize: 4000,
            gang,
            checksum: piece_checksum(&i.to_le_bytes()),
        }
    }

    #[test]
    fn header_round_trips_and_refuses_damage() {
        let ps: Vec<Piece> = (0..MAX_PIECES as u64)
            .map(|i| piece(i, i % 3 == 0))
            .collect();
        let b = encode_header(&ps, 0x4000);
        assert_eq!(decode_header(&b, 0x4000).expect("decode"), ps);
        // Read from another address (a misdirected write): refused.
        assert!(decode_header(&b, 0x8000).is_err());
        // Any flipped bit: refused.
        for at in [0, 9, 30, 500, HEADER_PSIZE as usize - 1] {
            let mut c = b.clone();
            c[at] ^= 1;
            assert!(decode_header(&c, 0x4000).is_err(), "bit at {at}");
        }
    }

    #[test]
    fn pieces_cover_the_block_in_sectors() {
        for (len, sector) in [
            (131072, 4096),
            (131072, 512),
            (5000, 4096),
            (4096, 4096),
            (1, 512),
        ] {
            let p = piece_len(len, sector);
            assert!(p.is_multiple_of(sector) && p > 0);
            assert!(len.div_ceil(p) <= MAX_PIECES, "{len}/{sector}: {p}");
            // Progress: a piece is smaller than the block it splits
            // (unless the block is one sector already).
            assert!(p < len || len <= sector, "{len}/{sector}: {p}");
        }
    }
}
