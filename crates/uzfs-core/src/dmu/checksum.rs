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
pub fn fletcher4(data: &[u8]) -> [u8; 32] {
    let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
    let mut chunks = data.chunks_exact(4);
    for w in &mut chunks {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64;
        a = a.wrapping_add(v);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 4];
        w[..rest.len()].copy_from_slice(rest);
        let v = u32::from_le_bytes(w) as u64;
        a = a.wrapping_add(v);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    let mut out = [0u8; 32];
    out[0..8].copy_from_slice(&a.to_le_bytes());
    out[8..16].copy_from_slice(&b.to_le_bytes());
    out[16..24].copy_from_slice(&c.to_le_bytes());
    out[24..32].copy_from_slice(&d.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
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
