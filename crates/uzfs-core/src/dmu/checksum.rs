//! Block checksums. Every block pointer carries a 256-bit checksum of the
//! block's physical (compressed) bytes; the checksum lives in the parent, so a
//! block can never vouch for itself (the Merkle tree ends at the uberblock,
//! which carries an embedded checksum of its own).

use crate::error::{Error, Result};
use sha2::Digest;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChecksumType {
    /// Fletcher-4 over little-endian 32-bit words, as OpenZFS's default.
    /// Catches bit rot and torn writes; not collision resistant.
    Fletcher4 = 1,
    Sha256 = 2,
    Blake3 = 3,
}

impl ChecksumType {
    pub fn from_u8(v: u8) -> Result<Self> {
        match v {
            1 => Ok(Self::Fletcher4),
            2 => Ok(Self::Sha256),
            3 => Ok(Self::Blake3),
            _ => Err(Error::corrupt(
                "block pointer",
                format!("unknown checksum type {v}"),
            )),
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "on" | "fletcher4" => Ok(Self::Fletcher4),
            "sha256" => Ok(Self::Sha256),
            "blake3" => Ok(Self::Blake3),
            _ => Err(Error::invalid(format!(
                "invalid checksum '{s}': expected on, fletcher4, sha256 or blake3"
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Fletcher4 => "fletcher4",
            Self::Sha256 => "sha256",
            Self::Blake3 => "blake3",
        }
    }
    pub fn compute(self, data: &[u8]) -> [u8; 32] {
        match self {
            Self::Fletcher4 => fletcher4(data),
            Self::Sha256 => sha2::Sha256::digest(data).into(),
            Self::Blake3 => *blake3::hash(data).as_bytes(),
        }
    }
}

/// Fletcher-4: four running 64-bit sums over 32-bit words. A trailing partial
/// word is zero-padded. Output: a, b, c, d little-endian.
///
/// The sums are one long dependency chain (each word feeds a, a feeds b, b
/// feeds c, c feeds d), so a word at a time runs at the latency of four
/// adds. Instead four lanes each sum every fourth word, independently, and
/// are folded at the end: for word i of n, the serial sums weigh it by
/// 1, t, t(t+1)/2 and t(t+1)(t+2)/6 with t = n - i; in lane j (of N words
/// per lane, m = N - g for its g-th word) t = 4m - j, and expanding those
/// weights in the lane's own 1, m, m(m+1)/2, m(m+1)(m+2)/6 gives
///
///   a = sum A_j
///   b = sum 4 B_j - j A_j
///   c = sum 16 C_j - (6 + 4j) B_j + (j^2 - j)/2 A_j
///   d = sum 64 D_j - (48 + 16j) C_j + (4 + 4j + 2j^2) B_j + (3j^2 - j^3 - 2j)/6 A_j
///
/// The identities hold over the integers, hence also modulo 2^64. Words
/// left over after the last group of four continue the serial recurrence.
pub fn fletcher4(data: &[u8]) -> [u8; 32] {
    let whole = data.len() / 16 * 16;
    let lanes = fletcher4_lanes(&data[..whole]);
    let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
    for j in 0..4u64 {
        let [la, lb, lc, ld] = [0, 1, 2, 3].map(|k| lanes[k][j as usize]);
        let m = |x: u64, k: u64| x.wrapping_mul(k);
        a = a.wrapping_add(la);
        b = b.wrapping_add(m(lb, 4)).wrapping_sub(m(la, j));
        c = c
            .wrapping_add(m(lc, 16))
            .wrapping_sub(m(lb, 6 + 4 * j))
            .wrapping_add(m(la, (j * j - j) / 2));
        // (3j^2 - j^3 - 2j)/6 is 0 for j = 0, 1, 2 and -1 for j = 3.
        d = d
            .wrapping_add(m(ld, 64))
            .wrapping_sub(m(lc, 48 + 16 * j))
            .wrapping_add(m(lb, 4 + 4 * j + 2 * j * j))
            .wrapping_sub(if j == 3 { la } else { 0 });
    }
    let mut step = |v: u64| {
        a = a.wrapping_add(v);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    };
    let tail = &data[whole..];
    let mut words = tail.chunks_exact(4);
    for w in &mut words {
        step(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 4];
        w[..rest.len()].copy_from_slice(rest);
        step(u32::from_le_bytes(w) as u64);
    }
    let mut out = [0u8; 32];
    out[0..8].copy_from_slice(&a.to_le_bytes());
    out[8..16].copy_from_slice(&b.to_le_bytes());
    out[16..24].copy_from_slice(&c.to_le_bytes());
    out[24..32].copy_from_slice(&d.to_le_bytes());
    out
}

/// The four lanes' sums `[A, B, C, D][lane]` over `data` (a multiple of 16
/// bytes): with AVX2 when the CPU has it (the four lanes are the four 64-bit
/// elements of one vector; 3x the scalar lanes, which were 10-14% of the
/// daemon's CPU in sequential reads and writes), else in scalar code.
fn fletcher4_lanes(data: &[u8]) -> [[u64; 4]; 4] {
    debug_assert!(data.len().is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { fletcher4_lanes_avx2(data) };
        }
    }
    fletcher4_lanes_scalar(data)
}

fn fletcher4_lanes_scalar(data: &[u8]) -> [[u64; 4]; 4] {
    let mut lanes = [[0u64; 4]; 4];
    for g in data.chunks_exact(16) {
        for (j, w) in g.chunks_exact(4).enumerate() {
            let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64;
            lanes[0][j] = lanes[0][j].wrapping_add(v);
            lanes[1][j] = lanes[1][j].wrapping_add(lanes[0][j]);
            lanes[2][j] = lanes[2][j].wrapping_add(lanes[1][j]);
            lanes[3][j] = lanes[3][j].wrapping_add(lanes[2][j]);
        }
    }
    lanes
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fletcher4_lanes_avx2(data: &[u8]) -> [[u64; 4]; 4] {
    use std::arch::x86_64::*;
    let (mut a, mut b, mut c, mut d) = (
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
    );
    for g in data.chunks_exact(16) {
        // SAFETY: `g` is 16 readable bytes; loadu has no alignment needs.
        let w = unsafe { _mm256_cvtepu32_epi64(_mm_loadu_si128(g.as_ptr().cast())) };
        a = _mm256_add_epi64(a, w);
        b = _mm256_add_epi64(b, a);
        c = _mm256_add_epi64(c, b);
        d = _mm256_add_epi64(d, c);
    }
    let mut lanes = [[0u64; 4]; 4];
    for (out, v) in lanes.iter_mut().zip([a, b, c, d]) {
        // SAFETY: `out` is 32 writable bytes; storeu has no alignment needs.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
    }
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, a word at a time: what the four-lane version must
    /// equal for every length.
    fn fletcher4_serial(data: &[u8]) -> [u8; 32] {
        let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
        for w in data.chunks(4) {
            let mut x = [0u8; 4];
            x[..w.len()].copy_from_slice(w);
            a = a.wrapping_add(u32::from_le_bytes(x) as u64);
            b = b.wrapping_add(a);
            c = c.wrapping_add(b);
            d = d.wrapping_add(c);
        }
        let mut out = [0u8; 32];
        for (i, v) in [a, b, c, d].iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    #[test]
    fn fletcher4_lanes_equal_the_serial_definition() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut data = vec![0u8; 1 << 17];
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        // Every length up to 100 bytes, then record sizes and odd tails.
        let lens = (0..100).chain([512, 4096, 4099, 131_071, 131_072]);
        for n in lens {
            assert_eq!(
                fletcher4(&data[..n]),
                fletcher4_serial(&data[..n]),
                "length {n}"
            );
        }
        // All-ones words make the sums wrap quickly.
        let ff = vec![0xffu8; 1 << 20];
        assert_eq!(fletcher4(&ff), fletcher4_serial(&ff));
        // Whichever lane code ran above, the scalar one agrees too.
        for n in [16, 4096, 131_072] {
            assert_eq!(
                fletcher4_lanes(&data[..n]),
                fletcher4_lanes_scalar(&data[..n]),
                "length {n}"
            );
        }
    }
    #[test]
    fn fletcher4_known_values() {
        // words 1,2: a=3, b=1+3=4, c=1+4=5, d=1+5=6
        let mut v = Vec::new();
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&2u32.to_le_bytes());
        let s = fletcher4(&v);
        assert_eq!(
            u64::from_le_bytes(s[0..8].try_into().unwrap_or_default()),
            3
        );
        assert_eq!(
            u64::from_le_bytes(s[8..16].try_into().unwrap_or_default()),
            4
        );
        assert_eq!(
            u64::from_le_bytes(s[16..24].try_into().unwrap_or_default()),
            5
        );
        assert_eq!(
            u64::from_le_bytes(s[24..32].try_into().unwrap_or_default()),
            6
        );
    }
    #[test]
    fn every_type_detects_a_flip() {
        for t in [
            ChecksumType::Fletcher4,
            ChecksumType::Sha256,
            ChecksumType::Blake3,
        ] {
            let mut data = vec![7u8; 4096];
            let a = t.compute(&data);
            data[100] ^= 1;
            assert_ne!(a, t.compute(&data), "{}", t.name());
        }
    }
}
