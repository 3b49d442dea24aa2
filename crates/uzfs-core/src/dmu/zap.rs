//! Name → (object, type) maps (OpenZFS: the fat ZAP), built as extendible
//! hashing without a pointer table: the directories of the ZPL, and in the
//! MOS the children of each DSL directory and the snapshots of each
//! dataset (`dsl/records.rs`).
//!
//! # Theory of operation
//!
//! A name hashes (salted per map) to a 64-bit *key*: bit 63 is zero, bits
//! 8..63 come from the hash and the low 8 bits are a collision
//! differentiator chosen at insert, so keys are unique within a map and the
//! order of keys is a stable iteration order (`readdir` cookies are keys).
//!
//! The key space is cut into *leaves*, 4 KiB blocks holding entries sorted
//! by key. A leaf at depth `d` holds the keys whose top `d` bits (after bit
//! 63) equal its prefix `p`, and lives at block id `2^d + p` of the object:
//! the object is sparse, so the blocks of leaves that do not exist are holes
//! and cost nothing. Exactly one leaf exists on the path of every key, so a
//! lookup probes depths from the deepest downwards and takes the first block
//! that exists. Keys are uniform, so leaves sit at the two deepest levels and
//! a lookup costs one or two block reads whatever the size of the map.
//!
//! A full leaf splits into its two children one level down (each written
//! before the parent is punched, all in one txg so no reader in between
//! sees both or neither). Leaves never merge; a directory emptied of a
//! million entries keeps its leaves (as in ZFS).
//!
//! ```text
//! block 0 (header): magic u64 | salt u64 | max_depth u64 | count u64
//! leaf:             magic u32 | depth u8 | pad u8 | nentries u16 | pad u64
//!                   entries: key u64 | value u64 | vtype u8 | namelen u8 | name
//! ```

use crate::dmu::dnode::{ObjProps, DNODE_SIZE};
use crate::dmu::objset::{Objset, TxgDirty};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

pub const ZAP_BLOCK: u32 = 4096;
const HDR_MAGIC: u64 = 0x5041_5a55_7a66_7321; // "!sfzUZAP"
const LEAF_MAGIC: u32 = 0x4641_454c; // "LEAF"
const LEAF_HDR: usize = 16;
const ENTRY_HDR: usize = 18;
/// Deepest leaf: 2^40 leaves is far beyond any real directory; a split
/// that would go deeper means thousands of names hashing alike.
const MAX_DEPTH: u32 = 40;
pub const MAX_NAME: usize = 255;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: u64,
    pub name: Vec<u8>,
    pub value: u64,
    pub vtype: u8,
}

struct Header {
    salt: u64,
    max_depth: u32,
    count: u64,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The key of `name` with collision differentiator 0.
fn base_key(salt: u64, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ((mix(h) >> 1) & !0x1ff) | 0x100
}

fn prefix(key: u64, depth: u32) -> u64 {
    if depth == 0 {
        0
    } else {
        (key << 1) >> (64 - depth)
    }
}

fn leaf_blkid(depth: u32, prefix: u64) -> u64 {
    (1u64 << depth) + prefix
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn decode_header(b: &[u8]) -> Result<Header> {
    if b.len() < 32 || le64(b, 0) != HDR_MAGIC {
        return Err(Error::corrupt("directory", "bad header"));
    }
    let max_depth = le64(b, 16);
    if max_depth > MAX_DEPTH as u64 {
        return Err(Error::corrupt("directory", "depth out of range"));
    }
    Ok(Header {
        salt: le64(b, 8),
        max_depth: max_depth as u32,
        count: le64(b, 24),
    })
}

fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[0..8].copy_from_slice(&HDR_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&h.salt.to_le_bytes());
    b[16..24].copy_from_slice(&(h.max_depth as u64).to_le_bytes());
    b[24..32].copy_from_slice(&h.count.to_le_bytes());
    b
}

/// One entry as it lies in a leaf: where it starts, and its fields.
struct RawEntry<'b> {
    at: usize,
    key: u64,
    value: u64,
    vtype: u8,
    name: &'b [u8],
}

impl RawEntry<'_> {
    fn len(&self) -> usize {
        ENTRY_HDR + self.name.len()
    }
    fn to_entry(&self) -> Entry {
        Entry {
            key: self.key,
            value: self.value,
            vtype: self.vtype,
            name: self.name.to_vec(),
        }
    }
}

/// Check a leaf's header and walk its entries in place; every reader and
/// writer of leaves goes through here, so bounds are checked once.
fn raw_entries(b: &[u8], depth: u32) -> Result<impl Iterator<Item = Result<RawEntry<'_>>>> {
    let bad = |why: &str| Error::corrupt("directory leaf", why.to_string());
    if b.len() < LEAF_HDR || u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != LEAF_MAGIC {
        return Err(bad("bad magic"));
    }
    if b[4] as u32 != depth {
        return Err(bad("depth mismatch"));
    }
    let n = u16::from_le_bytes([b[6], b[7]]) as usize;
    let mut at = LEAF_HDR;
    Ok((0..n).map(move |_| {
        let hdr = b.get(at..at + ENTRY_HDR).ok_or_else(|| bad("truncated"))?;
        let len = hdr[17] as usize;
        let name = b
            .get(at + ENTRY_HDR..at + ENTRY_HDR + len)
            .ok_or_else(|| bad("truncated name"))?;
        let e = RawEntry {
            at,
            key: le64(hdr, 0),
            value: le64(hdr, 8),
            vtype: hdr[16],
            name,
        };
        at += e.len();
        Ok(e)
    }))
}

fn decode_leaf(b: &[u8], depth: u32) -> Result<Vec<Entry>> {
    let out = raw_entries(b, depth)?
        .map(|e| e.map(|e| e.to_entry()))
        .collect::<Result<Vec<Entry>>>()?;
    if out.windows(2).any(|w| w[0].key >= w[1].key) {
        return Err(Error::corrupt("directory leaf", "entries out of order"));
    }
    Ok(out)
}

/// Find `name` (whose key without differentiator is `base`) in a leaf.
fn scan_leaf(b: &[u8], depth: u32, base: u64, name: &[u8]) -> Result<Option<Entry>> {
    for e in raw_entries(b, depth)? {
        let e = e?;
        if e.key & !0xff == base && e.name == name {
            return Ok(Some(e.to_entry()));
        }
        if e.key > base | 0xff {
            break; // sorted: past every key that could match
        }
    }
    Ok(None)
}

/// Insert an entry into an encoded leaf in place. `Ok(None)`: no room (the
/// caller splits); `Err`: the name exists, or the leaf is damaged.
fn splice_into_leaf(
    b: &mut [u8],
    depth: u32,
    base: u64,
    name: &[u8],
    value: u64,
    vtype: u8,
) -> Result<Option<u64>> {
    let mut used_cds = [false; 256];
    let mut end = LEAF_HDR;
    let mut n = 0usize;
    for e in raw_entries(b, depth)? {
        let e = e?;
        if e.key & !0xff == base {
            if e.name == name {
                return Err(Error::invalid("entry exists"));
            }
            used_cds[(e.key & 0xff) as usize] = true;
        }
        end = e.at + e.len();
        n += 1;
    }
    let need = ENTRY_HDR + name.len();
    if end + need > b.len() {
        return Ok(None);
    }
    let cd = used_cds
        .iter()
        .position(|u| !u)
        .ok_or_else(|| Error::invalid("too many names with one hash"))? as u64;
    let key = base | cd;
    // Keep the entries sorted: the new one goes before the first larger key.
    let pos = raw_entries(b, depth)?
        .filter_map(|e| e.ok())
        .find(|e| e.key > key)
        .map_or(end, |e| e.at);
    b.copy_within(pos..end, pos + need);
    b[pos..pos + 8].copy_from_slice(&key.to_le_bytes());
    b[pos + 8..pos + 16].copy_from_slice(&value.to_le_bytes());
    b[pos + 16] = vtype;
    b[pos + 17] = name.len() as u8;
    b[pos + ENTRY_HDR..pos + need].copy_from_slice(name);
    b[6..8].copy_from_slice(&((n + 1) as u16).to_le_bytes());
    Ok(Some(key))
}

fn leaf_bytes(entries: &[Entry]) -> usize {
    LEAF_HDR
        + entries
            .iter()
            .map(|e| ENTRY_HDR + e.name.len())
            .sum::<usize>()
}

fn encode_leaf(entries: &[Entry], depth: u32) -> Vec<u8> {
    let mut b = vec![0u8; ZAP_BLOCK as usize];
    b[0..4].copy_from_slice(&LEAF_MAGIC.to_le_bytes());
    b[4] = depth as u8;
    b[6..8].copy_from_slice(&(entries.len() as u16).to_le_bytes());
    let mut at = LEAF_HDR;
    for e in entries {
        b[at..at + 8].copy_from_slice(&e.key.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&e.value.to_le_bytes());
        b[at + 16] = e.vtype;
        b[at + 17] = e.name.len() as u8;
        b[at + ENTRY_HDR..at + ENTRY_HDR + e.name.len()].copy_from_slice(&e.name);
        at += ENTRY_HDR + e.name.len();
    }
    b
}

/// Where a map's blocks are read and written: an object set's open txg
/// (the ZPL's directories), or a txg being synced ([`InSync`]: the DSL's
/// maps in the MOS, changed by the sync itself).
pub trait ZapStore {
    /// Current contents of one block (`None`: a hole).
    fn read_block(&self, obj: u64, blkid: u64) -> Result<Option<Arc<Vec<u8>>>>;
    fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<()>;
    /// Edit one whole block in place (zeros for a hole).
    fn modify_block<R>(&self, obj: u64, blkid: u64, f: impl FnOnce(&mut Vec<u8>) -> R)
        -> Result<R>;
    /// Punch blocks `[start, end)`.
    fn free_range(&self, obj: u64, start: u64, end: u64) -> Result<()>;
}

impl ZapStore for Objset {
    fn read_block(&self, obj: u64, blkid: u64) -> Result<Option<Arc<Vec<u8>>>> {
        Objset::read_block(self, obj, blkid)
    }
    fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<()> {
        Objset::write(self, obj, offset, data).map(|_| ())
    }
    fn modify_block<R>(
        &self,
        obj: u64,
        blkid: u64,
        f: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> Result<R> {
        Objset::modify_block(self, obj, blkid, f)
    }
    fn free_range(&self, obj: u64, start: u64, end: u64) -> Result<()> {
        Objset::free_range(self, obj, start, end)
    }
}

/// A MOS map changed in sync context: reads see the synced tree under
/// what this pass has written into `into`, writes go into `into`.
pub struct InSync<'a, 'b> {
    pub os: &'a Objset,
    pub into: RefCell<&'b mut TxgDirty>,
}

impl ZapStore for InSync<'_, '_> {
    fn read_block(&self, obj: u64, blkid: u64) -> Result<Option<Arc<Vec<u8>>>> {
        self.os.read_in_sync(&self.into.borrow(), obj, blkid)
    }
    fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.os
            .write_in_sync(&mut self.into.borrow_mut(), obj, offset, data)
    }
    fn modify_block<R>(
        &self,
        obj: u64,
        blkid: u64,
        f: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> Result<R> {
        let mut b = match self.read_block(obj, blkid)? {
            Some(b) => b.to_vec(),
            None => vec![0u8; ZAP_BLOCK as usize],
        };
        if b.len() != ZAP_BLOCK as usize {
            return Err(Error::corrupt(
                "map",
                format!("object {obj}: block of {}", b.len()),
            ));
        }
        let r = f(&mut b);
        self.write(obj, blkid * ZAP_BLOCK as u64, &b)?;
        Ok(r)
    }
    fn free_range(&self, obj: u64, start: u64, end: u64) -> Result<()> {
        self.os
            .free_range_in_sync(&mut self.into.borrow_mut(), obj, start, end);
        Ok(())
    }
}

/// A map stored in object `obj` of `os`. Callers serialize mutations of one
/// map (the ZPL holds the directory's lock; the DSL changes its maps in
/// the sync, alone).
pub struct Zap<'a, S: ZapStore + ?Sized = Objset> {
    pub os: &'a S,
    pub obj: u64,
}

impl<'a> Zap<'a> {
    /// Create an empty map object of type `obj_type`.
    pub fn create(os: &'a Objset, obj_type: u8, props: &ObjProps, salt: u64) -> Result<Zap<'a>> {
        let obj = os.create_object(obj_type, ZAP_BLOCK, props)?;
        Zap::init(os, obj, salt)
    }

    pub fn open(os: &'a Objset, obj: u64) -> Zap<'a> {
        Zap { os, obj }
    }
}

impl<'a, S: ZapStore + ?Sized> Zap<'a, S> {
    /// Lay out an empty map in `obj`, a new object of `ZAP_BLOCK` blocks.
    pub fn init(os: &'a S, obj: u64, salt: u64) -> Result<Zap<'a, S>> {
        let z = Zap { os, obj };
        z.put_header(&Header {
            salt,
            max_depth: 0,
            count: 0,
        })?;
        os.write(obj, ZAP_BLOCK as u64, &encode_leaf(&[], 0))?;
        Ok(z)
    }

    /// The map in `obj` of any store ([`Zap::open`] for an object set).
    pub fn at(os: &'a S, obj: u64) -> Zap<'a, S> {
        Zap { os, obj }
    }

    fn header(&self) -> Result<Header> {
        match self.os.read_block(self.obj, 0)? {
            Some(b) => decode_header(&b),
            None => Err(Error::corrupt("directory", "missing header")),
        }
    }

    fn put_header(&self, h: &Header) -> Result<()> {
        self.os.write(self.obj, 0, &encode_header(h))
    }

    pub fn count(&self) -> Result<u64> {
        Ok(self.header()?.count)
    }

    /// The leaf holding `key`: (depth, prefix, entries).
    fn find_leaf(&self, h: &Header, key: u64) -> Result<(u32, u64, Vec<Entry>)> {
        for depth in (0..=h.max_depth).rev() {
            let p = prefix(key, depth);
            if let Some(b) = self.os.read_block(self.obj, leaf_blkid(depth, p))? {
                return Ok((depth, p, decode_leaf(&b, depth)?));
            }
        }
        Err(Error::corrupt("directory", "no leaf covers a key"))
    }

    fn write_leaf(&self, depth: u32, p: u64, entries: &[Entry]) -> Result<()> {
        let at = leaf_blkid(depth, p) * ZAP_BLOCK as u64;
        self.os.write(self.obj, at, &encode_leaf(entries, depth))
    }

    pub fn lookup(&self, name: &[u8]) -> Result<Option<Entry>> {
        let h = self.header()?;
        let base = base_key(h.salt, name);
        // The hot path of every path walk: find the leaf, then scan its
        // bytes in place (no decoding into entries).
        for depth in (0..=h.max_depth).rev() {
            let blk = leaf_blkid(depth, prefix(base, depth));
            if let Some(b) = self.os.read_block(self.obj, blk)? {
                return scan_leaf(&b, depth, base, name);
            }
        }
        Err(Error::corrupt("directory", "no leaf covers a key"))
    }

    /// Read, before a txg hold, every block a lookup, insert or remove of
    /// `name` may read under it (dmu/tx.rs, "What bounds a hold"): the
    /// header and the leaves at every depth down to `name`'s, plus two
    /// depths more, for splits other operations may make before the hold
    /// (a lookup probes from the deepest depth up; a probe of a hole walks
    /// the object's indirect blocks).
    pub fn warm(&self, name: &[u8]) {
        let Ok(h) = self.header() else { return };
        let base = base_key(h.salt, name);
        for depth in 0..=(h.max_depth + 2).min(MAX_DEPTH) {
            if self
                .os
                .read_block(self.obj, leaf_blkid(depth, prefix(base, depth)))
                .is_err()
            {
                return;
            }
        }
    }

    /// Add `name`; fails with `AlreadyExists` (as `Invalid`) if present.
    /// Returns the new entry's key.
    pub fn insert(&self, name: &[u8], value: u64, vtype: u8) -> Result<u64> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(Error::invalid("name length out of range"));
        }
        let mut h = self.header()?;
        let base = base_key(h.salt, name);
        // Fast path: the leaf has room; splice the entry into its bytes in
        // place (no decoding, no copies of the block).
        for depth in (0..=h.max_depth).rev() {
            let blk = leaf_blkid(depth, prefix(base, depth));
            if self.os.read_block(self.obj, blk)?.is_some() {
                let spliced = self.os.modify_block(self.obj, blk, |b| {
                    splice_into_leaf(b, depth, base, name, value, vtype)
                })??;
                if let Some(key) = spliced {
                    self.bump_count(1)?;
                    return Ok(key);
                }
                break;
            }
        }
        loop {
            let (depth, p, mut entries) = self.find_leaf(&h, base)?;
            let same: Vec<&Entry> = entries.iter().filter(|e| e.key & !0xff == base).collect();
            if same.iter().any(|e| e.name == name) {
                return Err(Error::invalid("entry exists"));
            }
            let cd = (0..=0xffu64)
                .find(|cd| !same.iter().any(|e| e.key & 0xff == *cd))
                .ok_or_else(|| Error::invalid("too many names with one hash"))?;
            let e = Entry {
                key: base | cd,
                name: name.to_vec(),
                value,
                vtype,
            };
            if leaf_bytes(&entries) + ENTRY_HDR + name.len() <= ZAP_BLOCK as usize {
                let at = entries.partition_point(|x| x.key < e.key);
                entries.insert(at, e);
                self.write_leaf(depth, p, &entries)?;
                self.bump_count(1)?;
                return Ok(base | cd);
            }
            // Split and retry.
            if depth >= MAX_DEPTH {
                return Err(Error::NoSpace);
            }
            let (lo, hi): (Vec<Entry>, Vec<Entry>) = entries
                .into_iter()
                .partition(|x| prefix(x.key, depth + 1) & 1 == 0);
            self.write_leaf(depth + 1, p * 2, &lo)?;
            self.write_leaf(depth + 1, p * 2 + 1, &hi)?;
            let old = leaf_blkid(depth, p);
            self.os.free_range(self.obj, old, old + 1)?;
            if depth + 1 > h.max_depth {
                h.max_depth = depth + 1;
                let d = h.max_depth as u64;
                self.os
                    .modify_block(self.obj, 0, |b| b[16..24].copy_from_slice(&d.to_le_bytes()))?;
            }
        }
    }

    /// Add `delta` to the entry count in the header, in place.
    fn bump_count(&self, delta: i64) -> Result<()> {
        self.os.modify_block(self.obj, 0, |b| {
            let c = (le64(b, 24) as i64 + delta).max(0) as u64;
            b[24..32].copy_from_slice(&c.to_le_bytes());
        })
    }

    /// Remove `name`; returns the removed entry.
    pub fn remove(&self, name: &[u8]) -> Result<Option<Entry>> {
        let h = self.header()?;
        let base = base_key(h.salt, name);
        let (depth, p, mut entries) = self.find_leaf(&h, base)?;
        let Some(i) = entries
            .iter()
            .position(|e| e.key & !0xff == base && e.name == name)
        else {
            return Ok(None);
        };
        let e = entries.remove(i);
        self.write_leaf(depth, p, &entries)?;
        self.bump_count(-1)?;
        Ok(Some(e))
    }

    /// Change the value of an existing entry in place (same key).
    pub fn update(&self, name: &[u8], value: u64, vtype: u8) -> Result<bool> {
        let h = self.header()?;
        let base = base_key(h.salt, name);
        let (depth, p, mut entries) = self.find_leaf(&h, base)?;
        let Some(e) = entries
            .iter_mut()
            .find(|e| e.key & !0xff == base && e.name == name)
        else {
            return Ok(false);
        };
        e.value = value;
        e.vtype = vtype;
        self.write_leaf(depth, p, &entries)?;
        Ok(true)
    }

    /// Entries with key >= `from`, in key order, at most `max` of them.
    pub fn list_from(&self, from: u64, max: usize) -> Result<Vec<Entry>> {
        let h = self.header()?;
        let mut out = Vec::new();
        let mut at = from;
        while at < (1u64 << 63) && out.len() < max {
            let (depth, p, entries) = self.find_leaf(&h, at)?;
            out.extend(
                entries
                    .into_iter()
                    .filter(|e| e.key >= at)
                    .take(max - out.len()),
            );
            at = if depth == 0 {
                1u64 << 63
            } else {
                (p + 1) << (63 - depth)
            };
        }
        Ok(out)
    }

    /// Every entry (for small maps and for destroy).
    pub fn all(&self) -> Result<Vec<Entry>> {
        self.list_from(0, usize::MAX)
    }
}

/// Salt a new map from its object number and the time.
pub fn new_salt(obj_hint: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix(t ^ obj_hint.wrapping_mul(DNODE_SIZE as u64 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_leaves_and_headers_are_errors_not_panics() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for round in 0..20_000 {
            let mut b = vec![0u8; (round % 97) * 43];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            if b.len() >= LEAF_HDR && round % 2 == 0 {
                b[..4].copy_from_slice(&LEAF_MAGIC.to_le_bytes());
                b[4] = 3;
            }
            let _ = decode_leaf(&b, 3);
            let _ = scan_leaf(&b, 3, 0x100, b"name");
            let _ = decode_header(&b);
        }
    }

    #[test]
    fn leaf_round_trip_and_scan() {
        let mut entries: Vec<Entry> = (0..50u64)
            .map(|i| Entry {
                key: base_key(7, format!("n{i}").as_bytes()),
                name: format!("n{i}").into_bytes(),
                value: i,
                vtype: 8,
            })
            .collect();
        entries.sort_by_key(|e| e.key);
        let b = encode_leaf(&entries, 0);
        assert_eq!(decode_leaf(&b, 0).ok(), Some(entries.clone()));
        let e = scan_leaf(&b, 0, base_key(7, b"n17"), b"n17").ok().flatten();
        assert_eq!(e.map(|e| e.value), Some(17));
        assert!(scan_leaf(&b, 0, base_key(7, b"zz"), b"zz")
            .ok()
            .flatten()
            .is_none());
        assert!(decode_leaf(&b, 1).is_err(), "depth is checked");
    }
}
