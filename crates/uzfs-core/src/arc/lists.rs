//! The adaptive replacement policy: Megiddo and Modha's ARC as OpenZFS's
//! `arc.c` runs it, counted in bytes. No locks, no clock, no memory probe:
//! `arc/mod.rs` wraps it in a mutex, gives it the time and sets its target.
//!
//! # Theory
//!
//! An LRU keeps what was used last; one pass over data larger than the
//! cache (a big sequential read, a backup, a `find`) flushes everything,
//! including the indirect blocks and dnodes that every access needs. ARC
//! keeps two lists of resident blocks: **MRU** (T1, seen once recently) and
//! **MFU** (T2, seen at least twice), and beside each a **ghost** list (B1,
//! B2) of keys it evicted lately, without their data. A target `p` splits
//! the cache `c` between the two: eviction takes from MRU while MRU holds
//! more than `p`, else from MFU. A miss that finds its key in the MRU ghost
//! list says MRU was evicted too early: `p` grows (by the block's size,
//! more when the MFU ghost list is the larger). A hit in the MFU ghost list
//! shrinks `p`. So a one-time scan streams through MRU (its blocks are
//! never seen twice and never hit a ghost) while the hot set stays in MFU;
//! and a workload that loops over slightly more than MRU holds teaches `p`
//! to grow.
//!
//! The rules below are the paper's (cases I-IV and REPLACE), with sizes in
//! bytes instead of pages: with blocks of one size they make the same
//! decisions as the paper, which the tests check access by access against a
//! page-counting transcription of the paper.
//!
//! Three departures, as in OpenZFS:
//!
//! * **Two accesses close together count once.** A hit on an MRU block
//!   within [`MIN_PROMOTE_MS`] of its last access (a FUSE read of a 1 MiB
//!   record arrives as several requests; every read of a file touches its
//!   indirect block) leaves it in MRU (OpenZFS's `ARC_MINTIME`).
//! * **Prefetched blocks not yet used go first.** A block read ahead enters
//!   MRU marked as prefetched; a demand read clears the mark (its first real
//!   access); eviction takes marked blocks older than [`MIN_PREFETCH_MS`]
//!   before any other (younger ones after the list's data, so a stream's
//!   read-ahead survives until it is read), and they leave no ghost (they
//!   were never wanted).
//! * **A metadata floor.** Within the list eviction picks, data goes before
//!   metadata while metadata is at most a quarter of `c`, and when that list
//!   holds only metadata the other list's data goes first. Indirect blocks,
//!   dnodes and directories therefore survive a stream of data.
//!
//! Ghost lists cost memory per key (OpenZFS's ghost headers do too): their
//! bytes are bounded as in the paper (T1 + B1 <= c, all four <= 2c) and
//! their count by twice the resident count, so a cache of small blocks
//! does not keep millions of keys.

use super::Key;
use std::collections::{BTreeMap, HashMap};

/// Two accesses to an MRU block within this many milliseconds are one.
pub const MIN_PROMOTE_MS: u64 = 62;
/// A prefetched block is kept this long before it counts as unused
/// (OpenZFS's `arc_min_prefetch_ms`), so a stream's read-ahead is not
/// evicted by its own next read-ahead.
pub const MIN_PREFETCH_MS: u64 = 1000;

/// What a cached block is, for eviction and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// File contents (level-0 blocks of plain files).
    Data,
    /// Everything else: indirect blocks, dnodes, directories, the MOS.
    Metadata,
}

impl Class {
    /// The class of a block of object type `obj_type` at `level`.
    pub fn of(level: u8, obj_type: u8) -> Class {
        if level == 0 && obj_type == crate::dmu::dnode::ot::PLAIN_FILE {
            Class::Data
        } else {
            Class::Metadata
        }
    }
}

/// One access: what the block is, whether something waits for it (a
/// demand read) or it is read ahead, and when (the caller's milliseconds).
#[derive(Clone, Copy, Debug)]
pub struct Access {
    pub class: Class,
    pub demand: bool,
    pub now: u64,
}

impl Access {
    pub fn new(class: Class, demand: bool, now: u64) -> Access {
        Access { class, demand, now }
    }
}

/// How far a ghost hit of a block of `s` bytes moves `p`: `s * max(1,
/// other / hit)`, the paper's delta, where `hit` is the bytes of the ghost
/// list that was hit and `other` those of the other one.
fn ghost_delta(s: u64, hit: u64, other: u64) -> u64 {
    if other <= hit || hit == 0 {
        s
    } else {
        (s as u128 * other as u128 / hit as u128) as u64
    }
}

const MRU: usize = 0;
const MFU: usize = 1;
/// Sub-lists of each state, in the order eviction takes from them.
const PREFETCH: usize = 0;
const DATA: usize = 1;
const META: usize = 2;

fn kind_of(c: Class) -> usize {
    match c {
        Class::Data => DATA,
        Class::Metadata => META,
    }
}

/// A block the policy let go, handed back so that it is freed outside
/// the lock, and fed to the L2ARC (`l2.rs`) if it was `used`: read since
/// it came in (an unused prefetch is not worth a cache device's write).
pub struct Evicted<V> {
    pub key: Key,
    pub v: V,
    pub class: Class,
    pub used: bool,
}

struct Entry<V> {
    v: V,
    size: u64,
    /// Position in its sub-list (a global counter, so order is age).
    tick: u64,
    /// Last access, in the caller's milliseconds.
    atime: u64,
    state: usize,
    kind: usize,
    class: Class,
}

#[derive(Default)]
struct Ghosts {
    map: HashMap<Key, (u64, u64)>,
    order: BTreeMap<u64, Key>,
    bytes: u64,
}

impl Ghosts {
    fn push(&mut self, k: Key, size: u64, tick: u64) {
        if let Some((t, s)) = self.map.insert(k, (tick, size)) {
            self.order.remove(&t);
            self.bytes -= s;
        }
        self.order.insert(tick, k);
        self.bytes += size;
    }
    fn contains(&self, k: &Key) -> bool {
        self.map.contains_key(k)
    }
    fn remove(&mut self, k: &Key) {
        if let Some((t, s)) = self.map.remove(k) {
            self.order.remove(&t);
            self.bytes -= s;
        }
    }
    fn pop_lru(&mut self) -> bool {
        let Some((_, k)) = self.order.pop_first() else {
            return false;
        };
        if let Some((_, s)) = self.map.remove(&k) {
            self.bytes -= s;
        }
        true
    }
}

/// Event counters, named after OpenZFS's `arcstats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub demand_data_hits: u64,
    pub demand_data_misses: u64,
    pub demand_metadata_hits: u64,
    pub demand_metadata_misses: u64,
    pub prefetch_data_hits: u64,
    pub prefetch_data_misses: u64,
    pub prefetch_metadata_hits: u64,
    pub prefetch_metadata_misses: u64,
    pub mru_hits: u64,
    pub mfu_hits: u64,
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    pub evict_mru: u64,
    pub evict_mfu: u64,
    /// Prefetched blocks evicted before any demand read used them.
    pub evict_prefetch_unused: u64,
    /// Blocks taken out once delivered whole to the kernel's page cache
    /// (`BlockCache::hand_off`).
    pub handed_off: u64,
    /// Blocks taken out because the sync freed them (`BlockCache::freed`).
    pub freed: u64,
}

/// Sizes now, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    pub size: u64,
    pub c: u64,
    pub p: u64,
    pub mru: u64,
    pub mfu: u64,
    pub mru_ghost: u64,
    pub mfu_ghost: u64,
    pub data: u64,
    pub metadata: u64,
    /// Metadata up to this is kept before data ([`Lists::meta_floor`]).
    pub meta_floor: u64,
    pub prefetch_unused: u64,
    pub entries: u64,
    pub ghost_entries: u64,
}

/// The ARC's lists. `V` is the cached value (an `Arc` of the block).
pub struct Lists<V> {
    map: HashMap<Key, Entry<V>>,
    order: [[BTreeMap<u64, Key>; 3]; 2],
    size: [u64; 2],
    /// Bytes by class: data, metadata.
    class_size: [u64; 2],
    prefetch_size: u64,
    ghost: [Ghosts; 2],
    p: u64,
    c: u64,
    tick: u64,
    /// The latest time a caller gave (ms).
    now: u64,
    pub counters: Counters,
}

impl<V: Clone> Lists<V> {
    /// Empty lists with target `c` bytes (`p` starts at 0, as in the paper).
    pub fn new(c: u64) -> Self {
        Lists {
            map: HashMap::new(),
            order: Default::default(),
            size: [0; 2],
            class_size: [0; 2],
            prefetch_size: 0,
            ghost: Default::default(),
            p: 0,
            c,
            tick: 0,
            now: 0,
            counters: Counters::default(),
        }
    }

    pub fn sizes(&self) -> Sizes {
        Sizes {
            size: self.size[MRU] + self.size[MFU],
            c: self.c,
            p: self.p,
            mru: self.size[MRU],
            mfu: self.size[MFU],
            mru_ghost: self.ghost[MRU].bytes,
            mfu_ghost: self.ghost[MFU].bytes,
            data: self.class_size[0],
            metadata: self.class_size[1],
            meta_floor: self.meta_floor(),
            prefetch_unused: self.prefetch_size,
            entries: self.map.len() as u64,
            ghost_entries: (self.ghost[0].map.len() + self.ghost[1].map.len()) as u64,
        }
    }

    /// Metadata up to this is kept before data of either list.
    pub fn meta_floor(&self) -> u64 {
        self.c / 4
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn class_slot(c: Class) -> usize {
        match c {
            Class::Data => 0,
            Class::Metadata => 1,
        }
    }

    /// Whether `k` is cached (no access is counted).
    pub fn contains(&self, k: &Key) -> bool {
        self.map.contains_key(k)
    }

    /// A lookup at time `now` (ms). `demand`: a read something waits for;
    /// otherwise a prefetch, which changes no list. `class` is the block's
    /// (the caller knows it from the block pointer).
    pub fn lookup(&mut self, k: &Key, a: Access) -> Option<V> {
        let Access { class, demand, now } = a;
        let tick = self.next_tick();
        self.now = self.now.max(now);
        let c = &mut self.counters;
        let Some(e) = self.map.get_mut(k) else {
            c.misses += 1;
            match (demand, class) {
                (true, Class::Data) => c.demand_data_misses += 1,
                (true, Class::Metadata) => c.demand_metadata_misses += 1,
                (false, Class::Data) => c.prefetch_data_misses += 1,
                (false, Class::Metadata) => c.prefetch_metadata_misses += 1,
            }
            return None;
        };
        c.hits += 1;
        match (demand, class) {
            (true, Class::Data) => c.demand_data_hits += 1,
            (true, Class::Metadata) => c.demand_metadata_hits += 1,
            (false, Class::Data) => c.prefetch_data_hits += 1,
            (false, Class::Metadata) => c.prefetch_metadata_hits += 1,
        }
        if !demand {
            return Some(e.v.clone());
        }
        if e.state == MRU {
            c.mru_hits += 1;
        } else {
            c.mfu_hits += 1;
        }
        let (st, kind) = (e.state, e.kind);
        let (new_st, new_kind) = if kind == PREFETCH {
            // Its first demand access: it stays in MRU, now wanted.
            self.prefetch_size -= e.size;
            (MRU, kind_of(e.class))
        } else if st == MRU && now.saturating_sub(e.atime) < MIN_PROMOTE_MS {
            (MRU, kind)
        } else {
            (MFU, kind)
        };
        e.atime = now;
        let (old, size) = (e.tick, e.size);
        e.tick = tick;
        e.state = new_st;
        e.kind = new_kind;
        let v = e.v.clone();
        self.order[st][kind].remove(&old);
        self.order[new_st][new_kind].insert(tick, *k);
        self.size[st] -= size;
        self.size[new_st] += size;
        Some(v)
    }

    /// A block read (or written) at time `now` enters the cache. `demand`
    /// as for [`Lists::lookup`]. Evicted values are pushed to `evicted`
    /// (the caller drops or recycles them outside its lock).
    pub fn insert(&mut self, k: Key, v: V, size: u64, a: Access, evicted: &mut Vec<Evicted<V>>) {
        let Access { class, demand, now } = a;
        self.now = self.now.max(now);
        if let Some(e) = self.map.get_mut(&k) {
            // Two readers raced on one miss: keep the entry, take the value.
            let old = std::mem::replace(&mut e.v, v);
            let (st, cl, kind, was) = (e.state, e.class, e.kind, e.size);
            e.size = size;
            self.size[st] = self.size[st] - was + size;
            let slot = Self::class_slot(cl);
            self.class_size[slot] = self.class_size[slot] - was + size;
            if kind == PREFETCH {
                self.prefetch_size = self.prefetch_size - was + size;
            }
            evicted.push(Evicted {
                key: k,
                v: old,
                class: cl,
                used: false,
            });
            self.make_room(0, false, evicted);
            return;
        }
        if size > self.c {
            return;
        }
        let c = self.c;
        let s = size;
        let (b1, b2) = (self.ghost[MRU].bytes, self.ghost[MFU].bytes);
        let state = if demand && self.ghost[MRU].contains(&k) {
            // Case II: MRU was evicted too early. p += s * max(1, B2/B1).
            self.p = self.p.saturating_add(ghost_delta(s, b1, b2)).min(c);
            self.counters.mru_ghost_hits += 1;
            self.ghost[MRU].remove(&k);
            self.make_room(s, false, evicted);
            MFU
        } else if demand && self.ghost[MFU].contains(&k) {
            // Case III: MFU was evicted too early. p -= s * max(1, B1/B2).
            self.p = self.p.saturating_sub(ghost_delta(s, b2, b1));
            self.counters.mfu_ghost_hits += 1;
            self.ghost[MFU].remove(&k);
            self.make_room(s, true, evicted);
            MFU
        } else {
            // Case IV: new to the cache (or a prefetch of a ghost).
            self.ghost[MRU].remove(&k);
            self.ghost[MFU].remove(&k);
            let t1 = self.size[MRU];
            let total = t1 + self.size[MFU] + self.ghost[MRU].bytes + self.ghost[MFU].bytes;
            if t1 + self.ghost[MRU].bytes + s > c {
                if self.ghost[MRU].bytes > 0 {
                    while self.ghost[MRU].bytes > 0 && t1 + self.ghost[MRU].bytes + s > c {
                        self.ghost[MRU].pop_lru();
                    }
                } else {
                    // MRU alone fills its half of the directory: its
                    // oldest blocks leave without a ghost.
                    while self.size[MRU] > 0 && self.size[MRU] + self.size[MFU] + s > c {
                        if !self.evict_from(MRU, false, false, evicted) {
                            break;
                        }
                    }
                }
            } else if total + s > c {
                while self.ghost[MFU].bytes > 0 && self.total() + s > 2 * c {
                    self.ghost[MFU].pop_lru();
                }
            }
            self.make_room(s, false, evicted);
            MRU
        };
        let kind = if demand { kind_of(class) } else { PREFETCH };
        let tick = self.next_tick();
        self.order[state][kind].insert(tick, k);
        self.size[state] += s;
        self.class_size[Self::class_slot(class)] += s;
        if kind == PREFETCH {
            self.prefetch_size += s;
        }
        self.map.insert(
            k,
            Entry {
                v,
                size: s,
                tick,
                atime: now,
                state,
                kind,
                class,
            },
        );
        self.trim_ghosts();
    }

    fn total(&self) -> u64 {
        self.size[MRU] + self.size[MFU] + self.ghost[MRU].bytes + self.ghost[MFU].bytes
    }

    /// Evict until `s` more bytes fit in `c` (the paper's REPLACE, once per
    /// block evicted).
    fn make_room(&mut self, s: u64, in_b2: bool, evicted: &mut Vec<Evicted<V>>) {
        while self.size[MRU] + self.size[MFU] + s > self.c {
            if !self.replace(in_b2, evicted) {
                break;
            }
        }
    }

    /// REPLACE: evict one block from MRU if it holds more than `p` (or
    /// exactly `p` and the miss was an MFU ghost hit), else from MFU; the
    /// block goes to its list's ghost list.
    fn replace(&mut self, in_b2: bool, evicted: &mut Vec<Evicted<V>>) -> bool {
        let t1 = self.size[MRU];
        let first = if t1 > 0 && (t1 > self.p || (in_b2 && t1 >= self.p)) || self.size[MFU] == 0 {
            MRU
        } else {
            MFU
        };
        let other = 1 - first;
        self.evict_from(first, true, true, evicted)
            || self.evict_from(other, true, true, evicted)
            || self.evict_from(first, false, true, evicted)
            || self.evict_from(other, false, true, evicted)
    }

    /// Evict the oldest block of state `st`: unused prefetches older than
    /// [`MIN_PREFETCH_MS`], then data, then younger prefetches, then
    /// metadata (with `keep_meta`, only above the floor). `ghost`:
    /// remember its key. False if nothing qualified.
    fn evict_from(
        &mut self,
        st: usize,
        keep_meta: bool,
        ghost: bool,
        ev: &mut Vec<Evicted<V>>,
    ) -> bool {
        let meta_ok = !keep_meta || self.class_size[1] > self.meta_floor();
        let stale_prefetch = self.order[st][PREFETCH]
            .first_key_value()
            .and_then(|(_, k)| self.map.get(k))
            .is_some_and(|e| e.atime + MIN_PREFETCH_MS <= self.now);
        let kind = [PREFETCH, DATA, PREFETCH, META]
            .into_iter()
            .enumerate()
            .find(|&(i, k)| {
                !self.order[st][k].is_empty()
                    && (i != 0 || stale_prefetch)
                    && (k != META || meta_ok)
            })
            .map(|(_, k)| k);
        let Some(kind) = kind else {
            return false;
        };
        let Some((_, k)) = self.order[st][kind].pop_first() else {
            return false;
        };
        let Some(e) = self.map.remove(&k) else {
            return false;
        };
        self.size[st] -= e.size;
        self.class_size[Self::class_slot(e.class)] -= e.size;
        if kind == PREFETCH {
            self.prefetch_size -= e.size;
            self.counters.evict_prefetch_unused += 1;
        } else if ghost {
            let t = self.next_tick();
            self.ghost[st].push(k, e.size, t);
        }
        if st == MRU {
            self.counters.evict_mru += 1;
        } else {
            self.counters.evict_mfu += 1;
        }
        ev.push(Evicted {
            key: k,
            v: e.v,
            class: e.class,
            used: kind != PREFETCH,
        });
        true
    }

    /// Keep the ghost lists within the paper's bounds (T1 + B1 <= c, all
    /// four <= 2c) and their count within twice the resident count.
    fn trim_ghosts(&mut self) {
        while self.size[MRU] + self.ghost[MRU].bytes > self.c && self.ghost[MRU].pop_lru() {}
        while self.total() > 2 * self.c {
            if !self.ghost[MFU].pop_lru() && !self.ghost[MRU].pop_lru() {
                break;
            }
        }
        let cap = 2 * self.map.len() + 64;
        while self.ghost[0].map.len() + self.ghost[1].map.len() > cap {
            let big = usize::from(self.ghost[MFU].map.len() > self.ghost[MRU].map.len());
            if !self.ghost[big].pop_lru() {
                break;
            }
        }
    }

    /// Take block `k` out of the cache, leaving no ghost: its bytes now
    /// live elsewhere (the kernel's page cache above a mount, `arc/mod.rs`
    /// [`BlockCache::hand_off`](super::BlockCache::hand_off)) or nowhere
    /// (the sync freed it, [`BlockCache::freed`](super::BlockCache::freed)),
    /// so a later miss on it says nothing about this cache's split. `None`
    /// if it is not held. The caller counts it.
    pub fn remove(&mut self, k: &Key) -> Option<Evicted<V>> {
        let e = self.map.remove(k)?;
        self.order[e.state][e.kind].remove(&e.tick);
        self.size[e.state] -= e.size;
        self.class_size[Self::class_slot(e.class)] -= e.size;
        if e.kind == PREFETCH {
            self.prefetch_size -= e.size;
        }
        Some(Evicted {
            key: *k,
            v: e.v,
            class: e.class,
            used: e.kind != PREFETCH,
        })
    }

    /// A new target (memory pressure or its end): evict down to it.
    pub fn set_target(&mut self, c: u64, evicted: &mut Vec<Evicted<V>>) {
        self.c = c;
        self.p = self.p.min(c);
        self.make_room(0, false, evicted);
        self.trim_ghosts();
    }

    /// Forget everything (the media changed under the pool).
    pub fn clear(&mut self, evicted: &mut Vec<Evicted<V>>) {
        // Not worth a second-level cache: the media changed.
        evicted.extend(self.map.drain().map(|(key, e)| Evicted {
            key,
            v: e.v,
            class: e.class,
            used: false,
        }));
        self.order = Default::default();
        self.size = [0; 2];
        self.class_size = [0; 2];
        self.prefetch_size = 0;
        self.ghost = Default::default();
        self.p = 0;
    }

    /// Every size agrees with the entries (tests).
    #[cfg(test)]
    fn check(&self) {
        let mut size = [0u64; 2];
        let mut class = [0u64; 2];
        let mut pf = 0;
        for (k, e) in &self.map {
            assert_eq!(self.order[e.state][e.kind].get(&e.tick), Some(k));
            size[e.state] += e.size;
            class[Self::class_slot(e.class)] += e.size;
            if e.kind == PREFETCH {
                pf += e.size;
            }
        }
        let listed: usize = self.order.iter().flatten().map(|l| l.len()).sum();
        assert_eq!(listed, self.map.len());
        assert_eq!(
            (size, class, pf),
            (self.size, self.class_size, self.prefetch_size)
        );
        for g in &self.ghost {
            assert_eq!(g.bytes, g.map.values().map(|x| x.1).sum::<u64>());
            assert_eq!(g.order.len(), g.map.len());
        }
        for k in self.map.keys() {
            assert!(!self.ghost[0].contains(k) && !self.ghost[1].contains(k));
        }
        assert!(self.size[0] + self.size[1] <= self.c, "resident over c");
        assert!(
            self.size[0] + self.ghost[0].bytes <= self.c,
            "T1 + B1 over c"
        );
        assert!(self.total() <= 2 * self.c, "directory over 2c");
        assert!(self.p <= self.c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn key(i: u64) -> Key {
        (0, i, [0; 16])
    }

    /// A demand read of block `x` (`size` bytes) at `now`: a lookup, and on
    /// a miss the insert the read path makes. True on a hit.
    fn read(
        arc: &mut Lists<u64>,
        x: u64,
        size: u64,
        a: Access,
        ev: &mut Vec<Evicted<u64>>,
    ) -> bool {
        let hit = arc.lookup(&key(x), a).is_some();
        if !hit {
            arc.insert(key(x), x, size, a, ev);
        }
        hit
    }

    /// The paper's ARC(c) in pages, transcribed literally (Megiddo and
    /// Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST
    /// 2003, Fig. 4), with `p` in bytes of pages of `unit` bytes so its
    /// arithmetic matches the byte version's.
    struct Paper {
        c: usize,
        unit: u64,
        p: u64,
        t1: VecDeque<u64>,
        t2: VecDeque<u64>,
        b1: VecDeque<u64>,
        b2: VecDeque<u64>,
    }

    fn take(l: &mut VecDeque<u64>, x: u64) -> bool {
        match l.iter().position(|&y| y == x) {
            Some(i) => {
                l.remove(i);
                true
            }
            None => false,
        }
    }

    impl Paper {
        fn replace(&mut self, in_b2: bool) {
            let t1 = self.t1.len() as u64 * self.unit;
            if !self.t1.is_empty() && (t1 > self.p || (in_b2 && t1 == self.p)) {
                let y = self.t1.pop_front().expect("t1");
                self.b1.push_back(y);
            } else if let Some(y) = self.t2.pop_front() {
                self.b2.push_back(y);
            } else if let Some(y) = self.t1.pop_front() {
                self.b1.push_back(y);
            }
        }
        /// One access; true on a hit.
        fn access(&mut self, x: u64) -> bool {
            let (u, c) = (self.unit, self.c);
            if take(&mut self.t1, x) || take(&mut self.t2, x) {
                self.t2.push_back(x);
                return true;
            }
            let (b1, b2) = (self.b1.len() as u64, self.b2.len() as u64);
            if self.b1.contains(&x) {
                let d = if b2 <= b1 { u } else { u * b2 / b1 };
                self.p = (self.p + d).min(c as u64 * u);
                self.replace(false);
                take(&mut self.b1, x);
                self.t2.push_back(x);
                return false;
            }
            if self.b2.contains(&x) {
                let d = if b1 <= b2 { u } else { u * b1 / b2 };
                self.p = self.p.saturating_sub(d);
                self.replace(true);
                take(&mut self.b2, x);
                self.t2.push_back(x);
                return false;
            }
            let l1 = self.t1.len() + self.b1.len();
            let all = l1 + self.t2.len() + self.b2.len();
            if l1 == c {
                if self.t1.len() < c {
                    self.b1.pop_front();
                    self.replace(false);
                } else {
                    self.t1.pop_front();
                }
            } else if all >= c {
                if all == 2 * c {
                    self.b2.pop_front();
                }
                self.replace(false);
            }
            self.t1.push_back(x);
            false
        }
    }

    /// A trace mixing a hot set, loops and one-off scans.
    fn trace(seed: u64, n: usize) -> Vec<u64> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::with_capacity(n);
        let mut scan = 100_000;
        while out.len() < n {
            match next() % 10 {
                0..=4 => out.push(next() % 40),
                5..=6 => out.push(1000 + next() % 120),
                7 => {
                    for _ in 0..(next() % 60) {
                        out.push(scan);
                        scan += 1;
                    }
                }
                _ => out.push(5000 + (next() % 400)),
            }
        }
        out.truncate(n);
        out
    }

    /// With blocks of one size, every access hits or misses exactly as the
    /// paper's algorithm says, and `p` follows it.
    #[test]
    fn same_decisions_as_the_paper_with_equal_blocks() {
        const UNIT: u64 = 4096;
        let mut ghost_hits = (0, 0);
        for seed in 0..40 {
            let cap = 8 + (seed as usize % 5) * 13;
            let mut paper = Paper {
                c: cap,
                unit: UNIT,
                p: 0,
                t1: VecDeque::new(),
                t2: VecDeque::new(),
                b1: VecDeque::new(),
                b2: VecDeque::new(),
            };
            let mut arc: Lists<u64> = Lists::new(cap as u64 * UNIT);
            let mut ev = Vec::new();
            for (i, x) in trace(seed, 6000).into_iter().enumerate() {
                let now = i as u64 * 1000;
                let hit = read(
                    &mut arc,
                    x,
                    UNIT,
                    Access::new(Class::Data, true, now),
                    &mut ev,
                );
                assert_eq!(hit, paper.access(x), "seed {seed} access {i} of {x}");
                assert_eq!(arc.p, paper.p, "seed {seed} access {i}: p");
                let s = arc.sizes();
                assert_eq!(
                    s.mru,
                    paper.t1.len() as u64 * UNIT,
                    "seed {seed} access {i}: T1"
                );
                assert_eq!(
                    s.mru_ghost,
                    paper.b1.len() as u64 * UNIT,
                    "seed {seed} access {i}: B1"
                );
                assert_eq!(
                    s.mfu_ghost,
                    paper.b2.len() as u64 * UNIT,
                    "seed {seed} access {i}: B2"
                );
                if i % 97 == 0 {
                    arc.check();
                }
            }
            arc.check();
            ghost_hits.0 += arc.counters.mru_ghost_hits;
            ghost_hits.1 += arc.counters.mfu_ghost_hits;
        }
        // The traces exercise both adaptations.
        assert!(ghost_hits.0 > 500 && ghost_hits.1 > 500, "{ghost_hits:?}");
    }

    /// Blocks of mixed sizes, metadata and prefetches, a target that moves,
    /// blocks taken out (`remove`): the bounds hold after every step.
    #[test]
    fn bounds_hold_with_mixed_sizes_classes_and_targets() {
        for seed in 0..20u64 {
            let mut arc: Lists<u64> = Lists::new(1 << 20);
            let mut ev = Vec::new();
            for (i, x) in trace(seed, 8000).into_iter().enumerate() {
                let now = i as u64 * 20;
                let size = 512 << (x % 9);
                let class = if x % 3 == 0 {
                    Class::Metadata
                } else {
                    Class::Data
                };
                let demand = x % 7 != 0 || i % 2 == 0;
                read(&mut arc, x, size, Access::new(class, demand, now), &mut ev);
                // Some blocks leave once read, as a mount's hand-offs do.
                if x % 5 == 0 && i % 3 == 0 {
                    let held = arc.contains(&key(x));
                    let gone = arc.remove(&key(x));
                    assert_eq!(gone.is_some(), held, "remove says what was held");
                    assert!(!arc.contains(&key(x)), "removed, yet held");
                }
                if i % 1000 == 999 {
                    let c = [1 << 20, 300 << 10, 4 << 20, 64 << 10][(i / 1000) % 4];
                    arc.set_target(c, &mut ev);
                }
                arc.check();
            }
        }
    }

    /// The hot set survives a scan of four times the cache: an LRU would
    /// keep none of it.
    #[test]
    fn a_scan_larger_than_the_cache_does_not_flush_the_hot_set() {
        let unit = 128 << 10;
        let mut arc: Lists<u64> = Lists::new(256 * unit);
        let mut ev = Vec::new();
        let mut now = 0;
        let mut access = |arc: &mut Lists<u64>, x: u64| {
            now += 100;
            read(arc, x, unit, Access::new(Class::Data, true, now), &mut ev)
        };
        for _ in 0..3 {
            for x in 0..150 {
                access(&mut arc, x);
            }
        }
        for x in 10_000..(10_000 + 4 * 256) {
            access(&mut arc, x);
        }
        let hits = (0..150).filter(|&x| access(&mut arc, x)).count();
        assert!(hits >= 140, "hot set hits after the scan: {hits} of 150");
        arc.check();
    }

    /// A loop a little larger than MRU's share hits MRU's ghosts and `p`
    /// grows; then a frequency workload that hits MFU's ghosts shrinks it.
    #[test]
    fn p_adapts_between_recency_and_frequency() {
        let unit = 4096;
        let mut arc: Lists<u64> = Lists::new(100 * unit);
        let mut ev = Vec::new();
        let mut now = 0;
        let mut access = |arc: &mut Lists<u64>, x: u64| {
            now += 100;
            read(arc, x, unit, Access::new(Class::Data, true, now), &mut ev);
        };
        // A frequency set of 80 fills MFU.
        for _ in 0..3 {
            for x in 0..80 {
                access(&mut arc, x);
            }
        }
        let p0 = arc.sizes().p;
        // Recency: a loop of 60 new blocks, then again: MRU ghost hits.
        for _ in 0..4 {
            for x in 1000..1060 {
                access(&mut arc, x);
            }
        }
        let p1 = arc.sizes().p;
        assert!(p1 > p0, "p grew on MRU ghost hits: {p0} -> {p1}");
        assert!(arc.counters.mru_ghost_hits > 0);
        // Frequency again: the first set, evicted from MFU, hits its ghosts.
        for _ in 0..4 {
            for x in 0..80 {
                access(&mut arc, x);
            }
        }
        let p2 = arc.sizes().p;
        assert!(arc.counters.mfu_ghost_hits > 0);
        assert!(p2 < p1, "p shrank on MFU ghost hits: {p1} -> {p2}");
        arc.check();
    }

    /// A stream of data never evicts metadata while metadata is within its
    /// floor; unused prefetches go before anything else.
    #[test]
    fn metadata_floor_and_unused_prefetches_first() {
        let unit = 4096;
        let mut arc: Lists<u64> = Lists::new(100 * unit);
        let mut ev = Vec::new();
        // 20 metadata blocks, seen once (MRU): within the floor of 25.
        for x in 0..20 {
            arc.insert(
                key(x),
                x,
                unit,
                Access::new(Class::Metadata, true, x),
                &mut ev,
            );
        }
        for x in 1000..1500 {
            arc.insert(key(x), x, unit, Access::new(Class::Data, true, x), &mut ev);
        }
        for x in 0..20 {
            assert!(arc
                .lookup(&key(x), Access::new(Class::Metadata, true, 10_000))
                .is_some());
        }
        // Prefetched: kept while young (data goes instead) ...
        for x in 2000..2010 {
            arc.insert(
                key(x),
                x,
                unit,
                Access::new(Class::Data, false, 18_000 + x),
                &mut ev,
            );
        }
        assert_eq!(arc.counters.evict_prefetch_unused, 0);
        arc.insert(
            key(2999),
            2999,
            unit,
            Access::new(Class::Data, true, 20_500),
            &mut ev,
        );
        assert_eq!(arc.counters.evict_prefetch_unused, 0);
        // ... and once stale, never used, they go first, leaving no ghost.
        arc.insert(
            key(3000),
            3000,
            unit,
            Access::new(Class::Data, true, 23_001),
            &mut ev,
        );
        assert_eq!(arc.counters.evict_prefetch_unused, 1);
        assert!(arc
            .lookup(&key(2000), Access::new(Class::Data, true, 23_002))
            .is_none());
        assert!(!arc.ghost[MRU].contains(&key(2000)));
        // A prefetch lookup changes nothing; a demand read makes it wanted.
        assert!(arc
            .lookup(&key(2001), Access::new(Class::Data, false, 23_003))
            .is_some());
        assert_eq!(arc.sizes().prefetch_unused, 9 * unit);
        assert!(arc
            .lookup(&key(2001), Access::new(Class::Data, true, 23_004))
            .is_some());
        assert_eq!(arc.sizes().prefetch_unused, 8 * unit);
        arc.check();
    }

    /// Reads of one block close together promote it once.
    #[test]
    fn close_accesses_count_once() {
        let mut arc: Lists<u64> = Lists::new(1 << 20);
        let mut ev = Vec::new();
        arc.insert(
            key(1),
            1,
            4096,
            Access::new(Class::Data, true, 1000),
            &mut ev,
        );
        for t in [1010, 1020, 1050] {
            assert!(arc
                .lookup(&key(1), Access::new(Class::Data, true, t))
                .is_some());
        }
        assert_eq!(arc.sizes().mfu, 0, "still MRU");
        assert!(arc
            .lookup(
                &key(1),
                Access::new(Class::Data, true, 1050 + MIN_PROMOTE_MS)
            )
            .is_some());
        assert_eq!(arc.sizes().mfu, 4096);
    }
}
