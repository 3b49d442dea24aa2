//! Block cache beside the DMU. Today a plain LRU of verified, decompressed
//! blocks bounded in bytes; the adaptive (MRU/MFU with ghost lists) policy and
//! L2ARC belong to a later issue. Keys include the checksum, so a block
//! rewritten in place within its birth txg can never be served stale.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

pub type Key = (u32, u64, [u8; 16]);

#[derive(Default)]
struct Lru {
    map: HashMap<Key, (Arc<Vec<u8>>, u64)>,
    order: BTreeMap<u64, Key>,
    bytes: u64,
    tick: u64,
    hits: u64,
    misses: u64,
}

pub struct BlockCache {
    max_bytes: u64,
    lru: Mutex<Lru>,
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> Self {
        BlockCache {
            max_bytes,
            lru: Mutex::new(Lru::default()),
        }
    }

    pub fn get(&self, k: &Key) -> Option<Arc<Vec<u8>>> {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.tick += 1;
        let t = l.tick;
        match l.map.get_mut(k) {
            Some((v, tick)) => {
                let (v, old) = (v.clone(), *tick);
                *tick = t;
                l.order.remove(&old);
                l.order.insert(t, *k);
                l.hits += 1;
                Some(v)
            }
            None => {
                l.misses += 1;
                None
            }
        }
    }

    /// Drop every cached block (after the media changed under the pool).
    pub fn clear(&self) {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.map.clear();
        l.order.clear();
        l.bytes = 0;
    }

    pub fn insert(&self, k: Key, v: Arc<Vec<u8>>) {
        if self.max_bytes == 0 || v.len() as u64 > self.max_bytes / 4 {
            return;
        }
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.tick += 1;
        let t = l.tick;
        l.bytes += v.len() as u64;
        if let Some((old, tick)) = l.map.insert(k, (v, t)) {
            l.bytes -= old.len() as u64;
            l.order.remove(&tick);
        }
        l.order.insert(t, k);
        while l.bytes > self.max_bytes {
            let Some((_, victim)) = l.order.pop_first() else {
                break;
            };
            if let Some((v, _)) = l.map.remove(&victim) {
                l.bytes -= v.len() as u64;
            }
        }
    }

    /// (bytes held, hits, misses)
    pub fn stats(&self) -> (u64, u64, u64) {
        let l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        (l.bytes, l.hits, l.misses)
    }
}
