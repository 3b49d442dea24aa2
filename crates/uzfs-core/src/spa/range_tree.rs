//! Range trees: sets of disjoint byte ranges, kept merged. A metaslab's free
//! space is one (OpenZFS range_tree.c).

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeTree {
    /// start -> end (exclusive); never adjacent, never overlapping.
    segs: BTreeMap<u64, u64>,
    space: u64,
}

impl RangeTree {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn space(&self) -> u64 {
        self.space
    }
    pub fn len(&self) -> usize {
        self.segs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segs.iter().map(|(&s, &e)| (s, e - s))
    }

    /// True if any byte of `[start, start+len)` is in the tree.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start + len;
        if let Some((_, &e)) = self.segs.range(..end).next_back() {
            return e > start;
        }
        false
    }

    /// True if all of `[start, start+len)` is in the tree.
    pub fn contains(&self, start: u64, len: u64) -> bool {
        match self.segs.range(..=start).next_back() {
            Some((&s, &e)) => s <= start && e >= start + len,
            None => false,
        }
    }

    /// Add a range; `false` (and no change) if it overlaps what is there.
    pub fn add(&mut self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        if self.overlaps(start, len) {
            return false;
        }
        let mut s = start;
        let mut e = start + len;
        if let Some((&ps, &pe)) = self.segs.range(..s).next_back() {
            if pe == s {
                self.segs.remove(&ps);
                s = ps;
            }
        }
        if let Some(&ne) = self.segs.get(&e) {
            self.segs.remove(&e);
            e = ne;
        }
        self.segs.insert(s, e);
        self.space += len;
        true
    }

    /// Remove a range; `false` (and no change) unless it is wholly present.
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let (s, e) = match self.segs.range(..=start).next_back() {
            Some((&s, &e)) if e >= start + len => (s, e),
            _ => return false,
        };
        self.segs.remove(&s);
        if s < start {
            self.segs.insert(s, start);
        }
        if start + len < e {
            self.segs.insert(start + len, e);
        }
        self.space -= len;
        true
    }

    /// First fit for `len` bytes at or after `cursor`, wrapping to the start.
    pub fn find_fit(&self, len: u64, cursor: u64) -> Option<u64> {
        let first = self
            .segs
            .range(..=cursor)
            .next_back()
            .map_or(cursor, |(&s, _)| s);
        for (&s, &e) in self.segs.range(first..) {
            let s = s.max(cursor);
            if e > s && e - s >= len {
                return Some(s);
            }
        }
        // Wrap: anything starting at or before the cursor, from its start.
        self.segs
            .range(..=cursor)
            .find(|(&s, &e)| e - s >= len)
            .map(|(&s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Model test: the tree agrees with a byte bitmap under random ops.
        #[test]
        fn matches_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..60, 1u64..12), 1..200)) {
            let mut t = RangeTree::new();
            let mut m = [false; 80];
            for (add, s, l) in ops {
                let r = s as usize..(s + l) as usize;
                if add {
                    let ok = t.add(s, l);
                    prop_assert_eq!(ok, !m[r.clone()].iter().any(|&x| x));
                    if ok { m[r].iter_mut().for_each(|x| *x = true); }
                } else {
                    let ok = t.remove(s, l);
                    prop_assert_eq!(ok, m[r.clone()].iter().all(|&x| x));
                    if ok { m[r].iter_mut().for_each(|x| *x = false); }
                }
                prop_assert_eq!(t.space(), m.iter().filter(|&&x| x).count() as u64);
                // Segments are merged: no two touch.
                let segs: Vec<_> = t.iter().collect();
                for w in segs.windows(2) { prop_assert!(w[0].0 + w[0].1 < w[1].0); }
            }
        }
    }

    #[test]
    fn find_fit_wraps() {
        let mut t = RangeTree::new();
        t.add(0, 10);
        t.add(100, 5);
        assert_eq!(t.find_fit(4, 50), Some(100));
        assert_eq!(t.find_fit(8, 50), Some(0));
        assert_eq!(t.find_fit(4, 102), Some(0));
        assert_eq!(t.find_fit(2, 102), Some(102));
        assert_eq!(t.find_fit(20, 0), None);
    }
}
