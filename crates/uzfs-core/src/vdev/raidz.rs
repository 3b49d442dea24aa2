//! RAID-Z: geometry, parity, reconstruction, and the vdev kind itself
//! ([`Raidz`], reading and rebuilding blocks) (OpenZFS vdev_raidz.c).
//!
//! # Layout
//!
//! A RAID-Z vdev of `dcols` children presents one address space of
//! `dcols * child_size` bytes. Sector `b` of that space lives on child
//! `b % dcols` at row `b / dcols`. Every block is its own full stripe: a block
//! of `s` data sectors allocated at sector `b` occupies the `tot` sectors
//! from `b` on, `tot = s + nparity * ceil(s / (dcols - nparity))`, rounded up
//! to a multiple of `nparity + 1` so no unusable gap is left behind. So there
//! is never a read-modify-write of another block's stripe and no write hole:
//! a block and its parity are written together to fresh space (copy on
//! write) and only become visible when the uberblock points at them.
//!
//! Within a block, columns start at child `f = b % dcols` and wrap. The first
//! `nparity` columns hold parity (P, Q, R), the rest hold data, filled one
//! column after the other. The first `bc` columns are one sector taller than
//! the rest when `s` does not divide evenly; parity columns are always the
//! tallest, and shorter data columns count as zero-padded for parity.
//! RAID-Z1 swaps its parity and first data column on every other MiB of the
//! address space so parity does not pile up on some children (as ZFS does).
//!
//! # Parity
//!
//! Over GF(2^8) with the polynomial x^8+x^4+x^3+x^2+1 (0x11d) and generator 2,
//! for data columns D_0..D_{n-1}:
//!
//! ```text
//!   P = D_0 ^ D_1 ^ ... ^ D_{n-1}
//!   Q = sum 2^(n-1-j) * D_j     (Horner: Q = Q*2 ^ D_j)
//!   R = sum 4^(n-1-j) * D_j     (Horner: R = R*4 ^ D_j)
//! ```
//!
//! Multiplying 8 bytes at once by 2 is a shift and a masked xor, so
//! generation runs on u64 lanes. Any `k <= nparity` missing columns are
//! recovered by solving the k x k system formed by k surviving parity rows
//! (a Vandermonde-like matrix, invertible for distinct columns when
//! `dcols <= 255`), OpenZFS's "general reconstruction".

use super::leaf::column_source;
use super::ops::{Columns, Extent, Geometry, ReadOutcome, ReadReq, VdevOps};
use super::top::{is_power_lost, TopVdev};
use super::{Leaf, VdevStats};
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::sync::Arc;

/// Most parity columns (RAID-Z3).
pub const MAX_PARITY: usize = 3;

/// One column of a block's stripe: which child, where on it (relative to the
/// child's allocatable area), how many bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Col {
    pub child: usize,
    pub offset: u64,
    pub size: u64,
}

/// Where one block's columns live. `cols[..nparity]` are parity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Map {
    pub nparity: usize,
    pub cols: Vec<Col>,
    /// Bytes of the vdev address space the block occupies (incl. skip sectors).
    pub asize: u64,
}

/// Allocated size of a block of `psize` bytes (vdev_raidz_asize).
pub fn asize(psize: u64, ashift: u8, dcols: usize, nparity: usize) -> u64 {
    let s = ((psize.max(1) - 1) >> ashift) + 1;
    let ndata = (dcols - nparity) as u64;
    let tot = s + nparity as u64 * s.div_ceil(ndata);
    let p1 = nparity as u64 + 1;
    (tot.div_ceil(p1) * p1) << ashift
}

/// Column map of a block of `psize` bytes at `offset` (vdev_raidz_map_alloc).
pub fn map(offset: u64, psize: u64, ashift: u8, dcols: usize, nparity: usize) -> Map {
    debug_assert!(nparity < dcols && nparity <= MAX_PARITY);
    let b = offset >> ashift;
    let s = ((psize.max(1) - 1) >> ashift) + 1;
    let dc = dcols as u64;
    let f = b % dc;
    let o = (b / dc) << ashift;
    let ndata = dc - nparity as u64;
    let q = s / ndata;
    let r = s - q * ndata;
    let bc = if r == 0 { 0 } else { r + nparity as u64 };
    let acols = if q == 0 { bc } else { dc };
    let mut cols = Vec::with_capacity(acols as usize);
    for c in 0..acols {
        let mut col = f + c;
        let mut coff = o;
        if col >= dc {
            col -= dc;
            coff += 1 << ashift;
        }
        let rows = if c < bc { q + 1 } else { q };
        cols.push(Col {
            child: col as usize,
            offset: coff,
            size: rows << ashift,
        });
    }
    if nparity == 1 && offset & (1 << 20) != 0 && cols.len() > 1 {
        let (a, b) = (cols[0], cols[1]);
        cols[0].child = b.child;
        cols[0].offset = b.offset;
        cols[1].child = a.child;
        cols[1].offset = a.offset;
    }
    Map {
        nparity,
        cols,
        asize: asize(psize, ashift, dcols, nparity),
    }
}

// ---------------------------------------------------------------- GF(2^8)

struct Gf {
    exp: [u8; 512],
    log: [u8; 256],
}

const fn gf_tables() -> Gf {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    exp[510] = exp[0];
    exp[511] = exp[1];
    Gf { exp, log }
}

static GF: Gf = gf_tables();

pub fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    GF.exp[GF.log[a as usize] as usize + GF.log[b as usize] as usize]
}

fn gf_inv(a: u8) -> u8 {
    debug_assert!(a != 0);
    GF.exp[255 - GF.log[a as usize] as usize]
}

fn gf_pow(a: u8, n: usize) -> u8 {
    let mut r = 1u8;
    for _ in 0..n {
        r = gf_mul(r, a);
    }
    r
}

/// Coefficient of data column `j` (of `ndata`) in parity row `p`.
fn coef(p: usize, j: usize, ndata: usize) -> u8 {
    let g = [1u8, 2, 4][p];
    gf_pow(g, ndata - 1 - j)
}

#[inline]
fn mul2_u64(x: u64) -> u64 {
    let hi = x & 0x8080_8080_8080_8080;
    ((x << 1) & 0xfefe_fefe_fefe_fefe) ^ ((hi >> 7).wrapping_mul(0x1d))
}

/// `acc = acc * 2^times ^ d`, `d` zero-padded to `acc`'s length. Runs on
/// u64 lanes (eight bytes multiplied by 2 in a shift and a masked xor).
fn horner_step(acc: &mut [u8], d: &[u8], times: u32) {
    #[inline]
    fn lane(a: &mut [u8], b: u64, times: u32) {
        let mut x = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
        for _ in 0..times {
            x = mul2_u64(x);
        }
        a.copy_from_slice(&(x ^ b).to_le_bytes());
    }
    let n = d.len().min(acc.len()) / 8 * 8;
    let (a_main, a_rest) = acc.split_at_mut(n);
    for (a, b) in a_main.chunks_exact_mut(8).zip(d[..n].chunks_exact(8)) {
        lane(a, u64::from_le_bytes(b.try_into().unwrap_or([0; 8])), times);
    }
    let d_rest = &d[n.min(d.len())..];
    let mut chunks = a_rest.chunks_exact_mut(8);
    let mut i = 0;
    for a in &mut chunks {
        let mut b = [0u8; 8];
        if i < d_rest.len() {
            let end = (i + 8).min(d_rest.len());
            b[..end - i].copy_from_slice(&d_rest[i..end]);
        }
        lane(a, u64::from_le_bytes(b), times);
        i += 8;
    }
    for (k, a) in chunks.into_remainder().iter_mut().enumerate() {
        let mut x = *a;
        for _ in 0..times {
            x = gf_mul(x, 2);
        }
        *a = x ^ d_rest.get(i + k).copied().unwrap_or(0);
    }
}

fn xor_into(acc: &mut [u8], d: &[u8]) {
    let n = d.len().min(acc.len());
    let (a8, at) = acc[..n].split_at_mut(n / 8 * 8);
    let (d8, dt) = d[..n].split_at(n / 8 * 8);
    for (a, b) in a8.chunks_exact_mut(8).zip(d8.chunks_exact(8)) {
        let x = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]))
            ^ u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        a.copy_from_slice(&x.to_le_bytes());
    }
    for (a, b) in at.iter_mut().zip(dt) {
        *a ^= b;
    }
}

/// Bytes of every parity column computed together before moving on: the
/// parity tiles stay in the L1 cache while each data column's tile is
/// folded into all of them, so the data is read once, not once per parity.
const TILE: usize = 4096;

/// Compute `nparity` parity columns, each `len` bytes, of the data columns
/// (each at most `len` long; a shorter one counts as zero-padded).
///
/// Parity `p` is Horner's rule over the columns with generator `2^p`: P is
/// their XOR, Q and R multiply what they hold by 2 or 4 before adding the
/// next column. Each parity starts as a copy of the first column (Horner's
/// first step from zero), so nothing is cleared first, and the columns are
/// walked in [`TILE`]-byte tiles for every parity at once. Computing P, Q
/// and R one after another over the whole block, each from cleared
/// memory, was a fifth of a raidz2 sequential write's daemon CPU (`perf`,
/// bench/RESULTS.md, twenty-ninth session).
pub fn generate(data: &[&[u8]], nparity: usize, len: usize) -> Vec<Vec<u8>> {
    let first: &[u8] = data.first().map_or(&[][..], |d| &d[..d.len().min(len)]);
    let mut out: Vec<Vec<u8>> = (0..nparity)
        .map(|_| {
            let mut acc = Vec::with_capacity(len);
            acc.extend_from_slice(first);
            acc.resize(len, 0);
            acc
        })
        .collect();
    let rest = data.get(1..).unwrap_or(&[]);
    for at in (0..len).step_by(TILE) {
        let end = (at + TILE).min(len);
        for d in rest {
            let piece = &d[at.min(d.len())..end.min(d.len())];
            for (p, acc) in out.iter_mut().enumerate() {
                horner_tile(&mut acc[at..end], piece, p as u32);
            }
        }
    }
    out
}

/// `acc = acc * 2^times ^ d` over one tile (`d` zero-padded to `acc`'s
/// length): with AVX2 when the CPU has it, else in u64 lanes
/// ([`horner_step`], which with `times` 0 is an XOR).
fn horner_tile(acc: &mut [u8], d: &[u8], times: u32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { horner_tile_avx2(acc, d, times) };
        }
    }
    horner_step(acc, d, times);
}

/// [`horner_tile`] 32 bytes at a time: a byte is multiplied by 2 in
/// GF(2^8) as `x + x` (a shift within each byte) XOR 0x1d where its top
/// bit was set (the sign of the byte, `cmpgt(0, x)`). Whatever does not
/// fill a vector (and the zero padding past `d`) goes to the u64 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn horner_tile_avx2(acc: &mut [u8], d: &[u8], times: u32) {
    use std::arch::x86_64::*;
    let n = d.len().min(acc.len()) / 32 * 32;
    let (a_vec, a_rest) = acc.split_at_mut(n);
    let poly = _mm256_set1_epi8(0x1d);
    let zero = _mm256_setzero_si256();
    for (a, b) in a_vec.chunks_exact_mut(32).zip(d[..n].chunks_exact(32)) {
        // SAFETY: `a` and `b` are 32 bytes each; loadu and storeu have no
        // alignment needs.
        unsafe {
            let mut x = _mm256_loadu_si256(a.as_ptr().cast());
            for _ in 0..times {
                let top = _mm256_cmpgt_epi8(zero, x);
                x = _mm256_xor_si256(_mm256_add_epi8(x, x), _mm256_and_si256(top, poly));
            }
            x = _mm256_xor_si256(x, _mm256_loadu_si256(b.as_ptr().cast()));
            _mm256_storeu_si256(a.as_mut_ptr().cast(), x);
        }
    }
    horner_step(a_rest, &d[n.min(d.len())..], times);
}

/// Split a block's physical bytes into the map's columns (parity first),
/// each column exactly `cols[i].size` bytes.
pub fn encode(m: &Map, phys: &[u8]) -> Vec<Vec<u8>> {
    encode_borrowed(m, phys)
        .into_iter()
        .map(Cow::into_owned)
        .collect()
}

/// [`encode`], with each data column that lies whole inside `phys` (a
/// column is a contiguous run of the block) borrowed from it instead of
/// copied: only the parity and a short last column are new buffers. A
/// sync writes the borrowed ones straight from the record's buffer.
pub fn encode_borrowed<'a>(m: &Map, phys: &'a [u8]) -> Vec<Cow<'a, [u8]>> {
    let mut data: Vec<Cow<'a, [u8]>> = Vec::with_capacity(m.cols.len() - m.nparity);
    let mut at = 0usize;
    for c in &m.cols[m.nparity..] {
        let size = c.size as usize;
        if at + size <= phys.len() {
            data.push(Cow::Borrowed(&phys[at..at + size]));
        } else {
            let end = phys.len().max(at);
            let mut col = vec![0u8; size];
            if at < end {
                col[..end - at].copy_from_slice(&phys[at..end]);
            }
            data.push(Cow::Owned(col));
        }
        at += size;
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_ref()).collect();
    let plen = m.cols.first().map_or(0, |c| c.size as usize);
    let mut out: Vec<Cow<'a, [u8]>> = generate(&refs, m.nparity, plen)
        .into_iter()
        .map(Cow::Owned)
        .collect();
    out.extend(data);
    out
}

/// Concatenate the data columns back into `psize` physical bytes.
pub fn join(m: &Map, cols: &[Vec<u8>], psize: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(psize);
    for c in &cols[m.nparity..] {
        let take = (psize - out.len()).min(c.len());
        out.extend_from_slice(&c[..take]);
        if out.len() == psize {
            break;
        }
    }
    out.resize(psize, 0);
    out
}

/// Invert a k x k matrix over GF(2^8) (Gauss-Jordan). `None` if singular.
fn invert(mut a: Vec<Vec<u8>>) -> Option<Vec<Vec<u8>>> {
    let k = a.len();
    let mut inv: Vec<Vec<u8>> = (0..k)
        .map(|i| (0..k).map(|j| u8::from(i == j)).collect())
        .collect();
    for col in 0..k {
        let piv = (col..k).find(|&r| a[r][col] != 0)?;
        a.swap(col, piv);
        inv.swap(col, piv);
        let f = gf_inv(a[col][col]);
        for j in 0..k {
            a[col][j] = gf_mul(a[col][j], f);
            inv[col][j] = gf_mul(inv[col][j], f);
        }
        for r in 0..k {
            if r != col && a[r][col] != 0 {
                let g = a[r][col];
                for j in 0..k {
                    let (x, y) = (gf_mul(g, a[col][j]), gf_mul(g, inv[col][j]));
                    a[r][j] ^= x;
                    inv[r][j] ^= y;
                }
            }
        }
    }
    Some(inv)
}

/// `out ^= c * src` byte by byte through a 256-entry product table.
fn mul_acc(out: &mut [u8], src: &[u8], c: u8) {
    if c == 0 {
        return;
    }
    if c == 1 {
        xor_into(out, src);
        return;
    }
    let mut t = [0u8; 256];
    for (x, e) in t.iter_mut().enumerate() {
        *e = gf_mul(x as u8, c);
    }
    for (o, s) in out.iter_mut().zip(src) {
        *o ^= t[*s as usize];
    }
}

/// Rebuild the columns listed in `missing` (indices into `cols`, parity
/// first) in place from the others. Columns keep their map sizes.
pub fn reconstruct(m: &Map, cols: &mut [Vec<u8>], missing: &[usize]) -> Result<()> {
    let np = m.nparity;
    let ndata = m.cols.len() - np;
    if missing.len() > np {
        return Err(Error::Checksum(format!(
            "{} columns missing, parity covers {np}",
            missing.len()
        )));
    }
    let miss_data: Vec<usize> = missing.iter().copied().filter(|&c| c >= np).collect();
    let miss_par: Vec<usize> = missing.iter().copied().filter(|&c| c < np).collect();
    let rows: Vec<usize> = (0..np)
        .filter(|p| !miss_par.contains(p))
        .take(miss_data.len())
        .collect();
    if !miss_data.is_empty() {
        let plen = m.cols[0].size as usize;
        // Syndromes: stored parity ^ parity of the surviving data (missing
        // columns as zeros), computed with the fast generator.
        let refs: Vec<&[u8]> = (np..np + ndata)
            .map(|c| {
                if miss_data.contains(&c) {
                    &[][..]
                } else {
                    cols[c].as_slice()
                }
            })
            .collect();
        let rows_needed = rows.iter().max().map_or(0, |r| r + 1);
        let gen = generate(&refs, rows_needed, plen);
        let synd: Vec<Vec<u8>> = rows
            .iter()
            .map(|&p| {
                let mut s = gen[p].clone();
                xor_into(&mut s, &cols[p]);
                s
            })
            .collect();
        let a: Vec<Vec<u8>> = rows
            .iter()
            .map(|&p| miss_data.iter().map(|&c| coef(p, c - np, ndata)).collect())
            .collect();
        let inv = invert(a).ok_or_else(|| Error::Checksum("RAID-Z matrix is singular".into()))?;
        for (i, &c) in miss_data.iter().enumerate() {
            let mut out = vec![0u8; plen];
            for (s, &w) in synd.iter().zip(&inv[i]) {
                mul_acc(&mut out, s, w);
            }
            out.truncate(m.cols[c].size as usize);
            cols[c] = out;
        }
    }
    if !miss_par.is_empty() {
        let refs: Vec<&[u8]> = cols[np..].iter().map(|c| c.as_slice()).collect();
        let plen = m.cols[0].size as usize;
        let par = generate(&refs, np, plen);
        for p in miss_par {
            cols[p] = par[p].clone();
        }
    }
    Ok(())
}

/// A RAID-Z group of `nparity` parity columns (the vdev's side of
/// OpenZFS's vdev_raidz.c).
///
/// # Reading
///
/// A read fetches only the data columns. If a column cannot be read or
/// the block does not verify, it reads the parity too and rebuilds the
/// columns known to be bad (I/O errors, missing leaves, leaves whose DTL
/// lacks the block's txg). If the block still does not verify and no
/// device admitted an error, it tries every combination of up to the
/// remaining parity count of columns as the wrong ones (OpenZFS
/// vdev_raidz_combrec): the combination that verifies names the culprits,
/// whose CKSUM counters rise and which are rewritten. A thorough read
/// (scrub, zdb) reads every column, parity included, and repairs each one
/// that differs from what the verified block implies.
pub struct Raidz {
    pub nparity: usize,
}

pub static RAIDZ1: Raidz = Raidz { nparity: 1 };
pub static RAIDZ2: Raidz = Raidz { nparity: 2 };
pub static RAIDZ3: Raidz = Raidz { nparity: 3 };

impl Raidz {
    fn map_of(&self, g: &Geometry, offset: u64, psize: u64) -> Map {
        map(offset, psize, g.ashift, g.width, self.nparity)
    }
}

/// Every way to pick `k` of `items`, in order.
fn combinations(items: &[usize], k: usize, out: &mut Vec<Vec<usize>>) {
    fn go(items: &[usize], k: usize, at: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in at..items.len() {
            cur.push(items[i]);
            go(items, k, i + 1, cur, out);
            cur.pop();
        }
    }
    go(items, k, 0, &mut Vec::new(), out);
}

impl VdevOps for Raidz {
    fn redundancy(&self, _width: usize) -> usize {
        self.nparity
    }

    fn check_width(&self, width: usize) -> std::result::Result<(), String> {
        if (self.nparity + 1..=255).contains(&width) {
            Ok(())
        } else {
            Err(format!(
                "a raidz{} vdev needs {} to 255 devices, got {width}",
                self.nparity,
                self.nparity + 1
            ))
        }
    }

    /// One row short of the smallest child, so a column that wraps to the
    /// next row still fits (see the layout above).
    fn space(&self, g: &Geometry, raw: u64) -> u64 {
        let rows = (raw >> g.ashift).saturating_sub(1);
        (rows * g.width as u64) << g.ashift
    }

    fn child_need(&self, g: &Geometry, asize: u64) -> u64 {
        let sectors = asize >> g.ashift;
        (sectors.div_ceil(g.width as u64) + 1) << g.ashift
    }

    fn asize(&self, g: &Geometry, psize: u64) -> u64 {
        asize(psize, g.ashift, g.width, self.nparity)
    }

    fn extents(&self, g: &Geometry, offset: u64, psize: u64) -> Vec<Extent> {
        self.map_of(g, offset, psize)
            .cols
            .iter()
            .map(|c| Extent {
                child: c.child,
                offset: c.offset,
                size: c.size,
            })
            .collect()
    }

    fn columns<'a>(&self, top: &TopVdev, offset: u64, phys: &'a [u8], _asize: u64) -> Columns<'a> {
        let m = self.map_of(&top.geometry(), offset, phys.len() as u64);
        Columns {
            bufs: encode_borrowed(&m, phys),
            cols: m
                .cols
                .iter()
                .enumerate()
                .map(|(i, c)| (c.child, c.offset, i))
                .collect(),
        }
    }

    fn read(&self, top: &TopVdev, req: &ReadReq<'_>) -> Result<ReadOutcome> {
        let (offset, psize) = (req.offset, req.psize);
        let m = self.map_of(&top.geometry(), offset, psize);
        let np = m.nparity;
        let n = m.cols.len();
        let mut cols: Vec<Vec<u8>> = m.cols.iter().map(|c| vec![0u8; c.size as usize]).collect();
        let src: Vec<Option<Arc<Leaf>>> = m
            .cols
            .iter()
            .map(|c| column_source(&top.children[c.child], req.birth))
            .collect();
        let mut have = vec![false; n];
        let mut erased: Vec<usize> = Vec::new();
        let mut errored: Vec<usize> = Vec::new();
        let mut read_cols = |range: std::ops::Range<usize>,
                             cols: &mut Vec<Vec<u8>>,
                             have: &mut Vec<bool>|
         -> Result<()> {
            for i in range {
                match &src[i] {
                    None => erased.push(i),
                    Some(l) => match l.read(&mut cols[i], m.cols[i].offset) {
                        Ok(()) => have[i] = true,
                        Err(e) if is_power_lost(&e) => return Err(e),
                        Err(_) => {
                            erased.push(i);
                            errored.push(i);
                        }
                    },
                }
            }
            Ok(())
        };
        if req.thorough {
            read_cols(0..n, &mut cols, &mut have)?;
        } else {
            read_cols(np..n, &mut cols, &mut have)?;
            if !have[np..].contains(&false) {
                let d = join(&m, &cols, psize as usize);
                if (req.verify)(&d) {
                    return Ok(ReadOutcome {
                        data: d,
                        repaired: 0,
                        bad: Vec::new(),
                    });
                }
            }
            read_cols(0..np, &mut cols, &mut have)?;
        }
        let attempt = |set: &[usize]| -> Option<Vec<u8>> {
            let mut c = cols.clone();
            reconstruct(&m, &mut c, set).ok()?;
            let d = join(&m, &c, psize as usize);
            (req.verify)(&d).then_some(d)
        };
        let mut data = None;
        if erased.len() <= np {
            data = attempt(&erased);
            if data.is_none() {
                // Silent damage: guess which of the columns that read fine
                // are wrong, as many as the parity left over allows.
                let candidates: Vec<usize> = (0..n).filter(|i| have[*i]).collect();
                'outer: for k in 1..=np - erased.len() {
                    let mut combos = Vec::new();
                    combinations(&candidates, k, &mut combos);
                    for combo in combos {
                        let mut set = erased.clone();
                        set.extend(&combo);
                        if set.iter().all(|&c| c < np) {
                            continue; // no data column rebuilt: nothing would change
                        }
                        if let Some(d) = attempt(&set) {
                            data = Some(d);
                            break 'outer;
                        }
                    }
                }
            }
        }
        let Some(data) = data else {
            return Err(Error::Checksum(format!(
                "{} cannot rebuild the block at {offset:#x}: {} columns unreadable, parity {np}",
                top.name(),
                erased.len()
            )));
        };
        // Rewrite every column that read wrong or failed to read.
        let expect = encode(&m, &data);
        let mut repaired = 0;
        let mut bad = Vec::new();
        for i in 0..n {
            let Some(l) = &src[i] else { continue };
            let wrong = have[i] && cols[i] != expect[i];
            if wrong {
                bad.push((l.clone(), "checksum mismatch"));
            } else if errored.contains(&i) {
                bad.push((l.clone(), "I/O error"));
            } else {
                continue;
            }
            if !req.repair {
                continue;
            }
            if wrong {
                VdevStats::bump(&l.stats.cksum_errors, 1);
            }
            if l.write(&expect[i], m.cols[i].offset).is_ok() {
                repaired += expect[i].len() as u64;
            }
        }
        Ok(ReadOutcome {
            data,
            repaired,
            bad,
        })
    }

    fn replicated(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(seed: &mut u64, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (*seed >> 33) as u8
            })
            .collect()
    }

    /// Parity by the definition, a byte at a time: `sum coef(p, j) * d_j`.
    fn generate_by_definition(data: &[&[u8]], nparity: usize, len: usize) -> Vec<Vec<u8>> {
        (0..nparity)
            .map(|p| {
                (0..len)
                    .map(|i| {
                        data.iter().enumerate().fold(0u8, |acc, (j, d)| {
                            acc ^ gf_mul(coef(p, j, data.len()), d.get(i).copied().unwrap_or(0))
                        })
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn parity_equals_the_definition_for_any_lengths() {
        let mut seed = 11;
        // Lengths across tile and vector edges; columns shorter than the
        // parity (the last of a block, a missing one given as empty).
        for len in [0usize, 1, 7, 31, 32, 33, 100, 4095, 4096, 4097, 9000, 12345] {
            for ncols in 1..=7usize {
                let cols: Vec<Vec<u8>> = (0..ncols)
                    .map(|j| {
                        let n = match j % 3 {
                            0 => len,
                            1 => len.saturating_sub(5 + j),
                            _ => len / 2,
                        };
                        if j == 4 {
                            Vec::new()
                        } else {
                            rnd(&mut seed, n)
                        }
                    })
                    .collect();
                let refs: Vec<&[u8]> = cols.iter().map(|c| c.as_slice()).collect();
                assert_eq!(
                    generate(&refs, 3, len),
                    generate_by_definition(&refs, 3, len),
                    "len {len} columns {ncols}"
                );
            }
        }
    }

    #[test]
    fn gf_tables_are_a_field() {
        for a in 1..=255u8 {
            assert_eq!(gf_mul(a, gf_inv(a)), 1);
        }
        assert_eq!(mul2_u64(0x80), 0x1d);
        assert_eq!(gf_mul(0x80, 2), 0x1d);
    }

    #[test]
    fn columns_tile_the_allocation_without_overlap() {
        for dcols in 2..=12usize {
            for np in 1..=3.min(dcols - 1) {
                let mut used = std::collections::HashSet::new();
                let mut off = 0u64;
                for s in [1u64, 2, 3, 5, 8, 13, 32, 33] {
                    let psize = s << 9;
                    let m = map(off, psize, 9, dcols, np);
                    let total: u64 = m.cols.iter().map(|c| c.size).sum();
                    assert!(total <= m.asize);
                    for c in &m.cols {
                        for r in 0..c.size >> 9 {
                            assert!(used.insert((c.child, c.offset + (r << 9))), "overlap");
                        }
                    }
                    // Every cell lies inside the block's address range.
                    off += m.asize;
                }
            }
        }
    }

    /// Borrowed columns are the same bytes as copied ones; every data
    /// column that lies whole inside the block is borrowed, not copied.
    #[test]
    fn borrowed_columns_match_copied_ones() {
        for dcols in 2..=8usize {
            for np in 1..=3.min(dcols - 1) {
                for s in [1u64, 3, 8, 13, 32, 33, 256] {
                    let psize = s << 9;
                    let m = map(0, psize, 9, dcols, np);
                    let phys: Vec<u8> = (0..psize as u32).map(|i| (i % 251) as u8).collect();
                    let copied = encode(&m, &phys);
                    let borrowed = encode_borrowed(&m, &phys);
                    assert_eq!(copied.len(), borrowed.len());
                    let mut at = 0usize;
                    for (i, (c, b)) in copied.iter().zip(&borrowed).enumerate() {
                        assert!(c.as_slice() == b.as_ref(), "column {i}");
                        if i >= np {
                            let whole = at + c.len() <= phys.len();
                            assert_eq!(matches!(b, Cow::Borrowed(_)), whole, "column {i}");
                            at += c.len();
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn any_parity_many_columns_rebuild() {
        let mut seed = 7;
        for dcols in 3..=9usize {
            for np in 1..=3.min(dcols - 1) {
                for s in [1u64, 3, 7, 16, 40] {
                    let phys = rnd(&mut seed, (s << 9) as usize - 13);
                    let m = map(4096 * 3, phys.len() as u64, 9, dcols, np);
                    let good = encode(&m, &phys);
                    let n = m.cols.len();
                    let mut sets: Vec<Vec<usize>> = Vec::new();
                    for a in 0..n {
                        sets.push(vec![a]);
                        for b in a + 1..n {
                            sets.push(vec![a, b]);
                            for c in b + 1..n {
                                sets.push(vec![a, b, c]);
                            }
                        }
                    }
                    for set in sets.into_iter().filter(|s| s.len() <= np) {
                        let mut cols = good.clone();
                        for &c in &set {
                            cols[c] = vec![0xEE; cols[c].len()];
                        }
                        reconstruct(&m, &mut cols, &set).expect("rebuild");
                        assert_eq!(cols, good, "dcols {dcols} np {np} s {s} set {set:?}");
                        assert_eq!(join(&m, &cols, phys.len()), phys);
                    }
                }
            }
        }
    }
}
