//! Block compression. A compressed physical block is
//!
//! ```text
//!   +--------------------+---------------------------+-------------+
//!   | u32 LE stream len  | compressed stream (lz4    | zero pad to |
//!   |                    | block or zstd frame)      | 512 bytes   |
//!   +--------------------+---------------------------+-------------+
//! ```
//!
//! As in OpenZFS a block is stored compressed only when that saves at least
//! 1/8 of its size; otherwise it is stored raw and its block pointer says
//! `off`, so reads never pay to decompress incompressible data.

use crate::error::{Error, Result};

pub const SECTOR: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Compression {
    Off = 0,
    Lz4 = 1,
    Zstd = 2,
}

impl Compression {
    pub fn from_u8(v: u8) -> Result<Self> {
        match v {
            0 => Ok(Self::Off),
            1 => Ok(Self::Lz4),
            2 => Ok(Self::Zstd),
            _ => Err(Error::corrupt(
                "block pointer",
                format!("unknown compression {v}"),
            )),
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Self::Off),
            "on" | "lz4" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd),
            _ => Err(Error::invalid(format!(
                "invalid compression '{s}': expected off, on, lz4 or zstd"
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Compress `data`; returns the algorithm actually used and the physical
/// bytes (a multiple of 512 long). Data stored raw is borrowed, not copied,
/// when it is already sector-aligned.
pub fn compress(alg: Compression, data: &[u8]) -> (Compression, std::borrow::Cow<'_, [u8]>) {
    use std::borrow::Cow;
    let framed = |stream: &[u8]| {
        let total = round_up(stream.len() + 4, SECTOR);
        (total <= data.len() - data.len() / 8).then(|| {
            // Room for whole pages, and at least `ALIGN_FROM`, so the
            // block starts on a page (`alloc.rs`) and its write takes it
            // from here, zeros after it up to its allocation
            // (`TopVdev::write_blocks`). The room is the sync's for the
            // length of one write: the cache keeps logical blocks.
            let room = total
                .next_multiple_of(crate::alloc::DIRECT_ALIGN)
                .max(crate::alloc::ALIGN_FROM);
            let mut out = Vec::with_capacity(room);
            out.extend_from_slice(&(stream.len() as u32).to_le_bytes());
            out.extend_from_slice(stream);
            out.resize(total, 0);
            out
        })
    };
    let out = match alg {
        Compression::Off => None,
        _ if looks_incompressible(data) => None,
        // Into the thread's scratch buffer, then once into the block: the
        // crate's own `compress` zero-fills an output buffer, shrinks it
        // (a copy) and returns it to be copied again.
        Compression::Lz4 => with_lz4_scratch(data.len(), |scratch| {
            lz4_flex::block::compress_into(data, scratch)
                .ok()
                .and_then(|n| framed(&scratch[..n]))
        }),
        Compression::Zstd => zstd::bulk::compress(data, 3).ok().and_then(|z| framed(&z)),
    };
    if let Some(out) = out {
        return (alg, Cow::Owned(out));
    }
    if data.len().is_multiple_of(SECTOR) {
        return (Compression::Off, Cow::Borrowed(data));
    }
    let mut out = data.to_vec();
    out.resize(round_up(data.len(), SECTOR), 0);
    (Compression::Off, Cow::Owned(out))
}

/// Early abort (OpenZFS's zstd does the same with an lz4 pass): lz4 one
/// probe made of [`PROBES`] slices of [`PROBE`] bytes spread evenly over a
/// large block; if it does not shrink by 1/16, store the block raw without
/// compressing all of it. Only the ratio can suffer from a wrong guess,
/// never the data. Incompressible writes (fio's, media, archives) stop
/// paying a full pass per record.
///
/// One call on the slices laid end to end, not one per slice: lz4 costs
/// about the same per byte on noise as on text (2 µs a KiB on this VM), so
/// the probe's cost is its length. Four separate 2 KiB calls were 13 µs of
/// every incompressible 128 KiB record, 14% of a sequential write's daemon
/// CPU (`perf`, bench/RESULTS.md); 2 KiB in one call is a third of that.
/// Laid end to end, the slices also find each other: a block that repeats
/// a stretch longer than a slice (a writer's 4 KiB buffer written over and
/// over) compresses, which four separate probes never saw. The bar is half
/// the 1/8 a block must save to be stored compressed, since a short probe
/// holds less history for lz4 to match against than the whole block.
fn looks_incompressible(data: &[u8]) -> bool {
    const PROBE: usize = 512;
    const PROBES: usize = 4;
    if data.len() < 32 << 10 {
        return false;
    }
    let mut probe = [0u8; PROBE * PROBES];
    for (i, slot) in probe.chunks_exact_mut(PROBE).enumerate() {
        let at = data.len() / PROBES * i;
        slot.copy_from_slice(&data[at..at + PROBE]);
    }
    let packed = with_lz4_scratch(probe.len(), |scratch| {
        lz4_flex::block::compress_into(&probe, scratch).unwrap_or(probe.len())
    });
    packed > probe.len() - probe.len() / 16
}

/// Run `f` with this thread's lz4 output buffer, grown to hold the
/// compression of `len` bytes (its largest size stays: records are at
/// most 16 MiB, and only the pipeline's threads compress large ones).
fn with_lz4_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let need = lz4_flex::block::get_maximum_output_size(len);
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < need {
            s.resize(need, 0);
        }
        f(&mut s[..need])
    })
}

/// Decompress physical bytes into exactly `lsize` logical bytes.
/// [`decompress`] taking the physical block: an uncompressed one is
/// returned as it is (cut to `lsize`), without a copy.
pub fn decompress_owned(alg: Compression, mut phys: Vec<u8>, lsize: usize) -> Result<Vec<u8>> {
    if alg == Compression::Off && phys.len() >= lsize {
        phys.truncate(lsize);
        return Ok(phys);
    }
    decompress(alg, &phys, lsize)
}

pub fn decompress(alg: Compression, phys: &[u8], lsize: usize) -> Result<Vec<u8>> {
    let bad = |why: String| Error::corrupt("compressed block", why);
    match alg {
        Compression::Off => {
            if phys.len() < lsize {
                return Err(bad(format!("physical {} < logical {lsize}", phys.len())));
            }
            Ok(phys[..lsize].to_vec())
        }
        Compression::Lz4 | Compression::Zstd => {
            let hdr: [u8; 4] = phys
                .get(..4)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| bad("short header".into()))?;
            let n = u32::from_le_bytes(hdr) as usize;
            let stream = phys
                .get(4..4 + n)
                .ok_or_else(|| bad(format!("stream length {n} exceeds block")))?;
            let out = if alg == Compression::Lz4 {
                lz4_flex::block::decompress(stream, lsize).map_err(|e| bad(e.to_string()))?
            } else {
                zstd::bulk::decompress(stream, lsize).map_err(|e| bad(e.to_string()))?
            };
            if out.len() != lsize {
                return Err(bad(format!(
                    "decompressed {} bytes, expected {lsize}",
                    out.len()
                )));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn roundtrip_and_fallback() {
        let text: Vec<u8> = b"uzfs ".iter().cycle().take(8192).copied().collect();
        for alg in [Compression::Lz4, Compression::Zstd] {
            let (used, phys) = compress(alg, &text);
            assert_eq!(used, alg);
            assert!(phys.len() < 8192 && phys.len() % 512 == 0);
            assert_eq!(decompress(used, &phys, 8192).ok(), Some(text.clone()));
        }
        let mut rng = crate::vdev::sim::SimRng::new(1);
        let mut noise = vec![0u8; 8192];
        rng.fill(&mut noise);
        let (used, phys) = compress(Compression::Lz4, &noise);
        assert_eq!(used, Compression::Off);
        assert_eq!(&phys[..], &noise[..]);
    }
    #[test]
    fn early_abort_skips_noise_but_not_sparse_blocks() {
        let mut rng = crate::vdev::sim::SimRng::new(2);
        let mut noise = vec![0u8; 128 << 10];
        rng.fill(&mut noise);
        assert!(looks_incompressible(&noise));
        assert_eq!(compress(Compression::Lz4, &noise).0, Compression::Off);
        // A random header followed by zeros still compresses.
        let mut sparse = vec![0u8; 128 << 10];
        sparse[..4096].copy_from_slice(&noise[..4096]);
        assert!(!looks_incompressible(&sparse));
        let (used, phys) = compress(Compression::Lz4, &sparse);
        assert_eq!(used, Compression::Lz4);
        assert_eq!(decompress(used, &phys, sparse.len()).ok(), Some(sparse));
        // A writer's 4 KiB buffer of noise written over and over: no 512
        // byte slice compresses on its own, the block does 30-fold.
        let repeated: Vec<u8> = noise[..4096]
            .iter()
            .cycle()
            .take(128 << 10)
            .copied()
            .collect();
        assert!(!looks_incompressible(&repeated));
        assert_eq!(compress(Compression::Lz4, &repeated).0, Compression::Lz4);
        // Words: text compresses, and so does its probe.
        let words = [
            "pool", "vdev", "mirror", "raidz", "scrub", "txg", "zil", "arc", "snapshot",
        ];
        let mut text = Vec::new();
        while text.len() < 128 << 10 {
            text.extend_from_slice(
                words[(rng.next_u64() % words.len() as u64) as usize].as_bytes(),
            );
            text.push(b' ');
        }
        text.truncate(128 << 10);
        assert!(!looks_incompressible(&text));
        assert_eq!(compress(Compression::Lz4, &text).0, Compression::Lz4);
    }
    #[test]
    fn garbage_is_an_error() {
        let junk = vec![0xffu8; 512];
        assert!(decompress(Compression::Lz4, &junk, 4096).is_err());
        assert!(decompress(Compression::Zstd, &junk, 4096).is_err());
        assert!(decompress(Compression::Off, &junk, 4096).is_err());
    }
}
