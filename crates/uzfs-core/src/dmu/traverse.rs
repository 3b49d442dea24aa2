//! One traversal of an object set's block tree (OpenZFS `dmu_traverse.c`).
//!
//! zdb, the scan (scrub and resilver), the freeing of destroyed and
//! rolled-back datasets and `zfs diff` all walk block trees; they differ
//! only in what they do at each block. This module walks; a [`Visitor`]
//! acts.
//!
//! # Order
//!
//! Depth first, in logical order, and nested the way the blocks are: the
//! object-set block, then the meta-dnode's tree; inside each level-0 dnode
//! block, every object it holds, in number order, each object's tree
//! before the next object. The visitor sees every block twice: `pre`
//! before anything beneath it, `post` after (so a free can be post-order:
//! a block is released only once nothing below it still needs reading).
//!
//! # Pruning by birth
//!
//! A block is never changed in place: a parent is always rewritten when a
//! child is, so nothing beneath a block is younger than it. A walk with
//! `min_birth` skips every subtree born before it: a snapshot's blocks
//! born at or before the previous snapshot (walked with that one), a
//! resilver's blocks older than the missing range, a destroyed clone's
//! blocks its origin still holds.
//!
//! # Positions and resuming
//!
//! A [`Position`] is `(object, blkid)`: everything that lies wholly before
//! it in walk order has been visited. A block of object `o` covering
//! level-0 blocks `b..b+n` lies at `(o, b)..(o, b+n)`; a block of the
//! meta-dnode covering the dnode blocks that hold objects `x..y` lies at
//! `(x, 0)..(y, 0)`, so it ends after the objects beneath it (it is
//! nested around them). A visitor may stop the walk at a block's `pre`;
//! the walk returns that block's start. A later walk from there skips
//! what ends at or before it, calls neither `pre` nor `post` for it, and
//! for the blocks around it (begun before, ending after: the path down)
//! calls only `post`. So a post-order free stopped and resumed frees every
//! block exactly once, and never frees a block it still has to read.

use super::blkptr::BlkPtr;
use super::dnode::{DnodePhys, DNODE_SIZE};
use super::objset::{decode_indirect, decode_objset_phys, BlockReader};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A place in one object set's walk order (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    pub object: u64,
    pub blkid: u64,
}

impl Position {
    pub const START: Position = Position {
        object: 0,
        blkid: 0,
    };
}

/// What kind of block a visit is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The object-set block (the root).
    Objset,
    /// A block of the meta-dnode's tree: its level-0 blocks hold dnodes.
    Dnodes,
    /// A block of an object's tree.
    Data,
}

/// Where a visited block sits (OpenZFS `zbookmark_phys_t`, without the
/// object set, which the caller knows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub kind: Kind,
    /// The object whose tree holds the block (0: the meta-dnode, and the
    /// object-set block).
    pub object: u64,
    pub level: u8,
    /// The first level-0 block id the block covers in that object.
    pub blkid: u64,
}

/// What a `pre` visit wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Walk what is beneath the block, then call `post`.
    Descend,
    /// Neither what is beneath nor `post`.
    Skip,
    /// End the walk here: it returns this block's position.
    Stop,
}

/// What a walk does at each block.
pub trait Visitor {
    /// Before anything beneath `bp`. Holes and blocks born before the
    /// walk's `min_birth` never reach a visitor.
    fn pre(&mut self, _bp: &BlkPtr, _at: &At) -> Next {
        Next::Descend
    }
    /// After everything beneath `bp` (also after a block whose contents
    /// could not be read: [`Visitor::error`] was told).
    fn post(&mut self, _bp: &BlkPtr, _at: &At) {}
    /// Read a block the walk descends into (an indirect block, a dnode
    /// block, the object-set block). Level-0 data is never read by the
    /// walk.
    fn read(&mut self, reader: &dyn BlockReader, bp: &BlkPtr) -> Result<Arc<Vec<u8>>> {
        reader.read_bp(bp)
    }
    /// A block beneath which the walk cannot go: unreadable or corrupt.
    /// The walk goes on with what follows.
    fn error(&mut self, _at: &At, _e: Error) {}
    /// An allocated dnode found in a dnode block: walk its tree?
    fn object(&mut self, _obj: u64, _dn: &DnodePhys) -> bool {
        true
    }
}

/// Walk the object set rooted at `root`, from `start`, skipping subtrees
/// born before `min_birth`. `Ok(None)`: the walk is complete;
/// `Ok(Some(p))`: the visitor stopped it, and a walk from `p` goes on
/// where it left off.
pub fn walk_objset(
    reader: &dyn BlockReader,
    root: &BlkPtr,
    min_birth: u64,
    start: Position,
    v: &mut dyn Visitor,
) -> Option<Position> {
    let mut w = Walk {
        reader,
        v,
        min_birth,
        start,
        stopped: None,
    };
    w.objset(root);
    w.stopped
}

/// Walk one object's tree (`dn`, object `obj`) from `start` (a position
/// in that object; other objects' positions are not looked at).
pub fn walk_object(
    reader: &dyn BlockReader,
    obj: u64,
    dn: &DnodePhys,
    min_birth: u64,
    v: &mut dyn Visitor,
) -> Option<Position> {
    let mut w = Walk {
        reader,
        v,
        min_birth,
        start: Position {
            object: obj,
            blkid: 0,
        },
        stopped: None,
    };
    w.object(obj, dn);
    w.stopped
}

struct Walk<'a> {
    reader: &'a dyn BlockReader,
    v: &'a mut dyn Visitor,
    min_birth: u64,
    start: Position,
    stopped: Option<Position>,
}

/// Where a subtree lies in walk order.
struct Span {
    begin: Position,
    end: Position,
}

impl Walk<'_> {
    /// The common part of every visit: prune, `pre`, descend through
    /// `below`, `post`. `below` gets the block's contents.
    fn visit(
        &mut self,
        bp: &BlkPtr,
        at: At,
        span: Span,
        below: &mut dyn FnMut(&mut Self, &[u8]) -> Result<()>,
    ) {
        if bp.is_hole() || self.stopped.is_some() || bp.birth < self.min_birth {
            return;
        }
        if span.end <= self.start {
            return;
        }
        if span.begin >= self.start {
            match self.v.pre(bp, &at) {
                Next::Descend => {}
                Next::Skip => return,
                Next::Stop => {
                    self.stopped = Some(span.begin);
                    return;
                }
            }
        }
        let descend = at.kind != Kind::Data || bp.level > 0;
        if descend {
            let done = self
                .v
                .read(self.reader, bp)
                .and_then(|data| below(self, &data));
            if let Err(e) = done {
                self.v.error(&at, e);
            }
        }
        if self.stopped.is_none() {
            self.v.post(bp, &at);
        }
    }

    fn objset(&mut self, root: &BlkPtr) {
        let at = At {
            kind: Kind::Objset,
            object: 0,
            level: 0,
            blkid: 0,
        };
        let span = Span {
            begin: Position::START,
            end: Position {
                object: u64::MAX,
                blkid: u64::MAX,
            },
        };
        self.visit(root, at, span, &mut |w, data| {
            let (_, meta) = decode_objset_phys(data)?;
            w.meta(&meta);
            Ok(())
        });
    }

    /// The meta-dnode's tree: objects nested inside their dnode blocks.
    fn meta(&mut self, meta: &DnodePhys) {
        let per = (meta.datablksz as u64 / DNODE_SIZE as u64).max(1);
        let span = meta.capacity(meta.nlevels) / 3;
        for (i, bp) in meta.blkptr.iter().enumerate() {
            self.meta_tree(bp, i as u64 * span, span, meta.epb(), per);
        }
    }

    fn meta_tree(&mut self, bp: &BlkPtr, base: u64, span: u64, epb: u64, per: u64) {
        let at = At {
            kind: Kind::Dnodes,
            object: 0,
            level: bp.level,
            blkid: base,
        };
        let first = base.saturating_mul(per);
        let pos = |object| Position { object, blkid: 0 };
        let sp = Span {
            begin: pos(first),
            end: pos(base.saturating_add(span).saturating_mul(per)),
        };
        self.visit(bp, at, sp, &mut |w, data| {
            if bp.level == 0 {
                for (i, raw) in data.chunks_exact(DNODE_SIZE).enumerate() {
                    let obj = first + i as u64;
                    if obj == 0 || pos(obj + 1) <= w.start {
                        continue;
                    }
                    let dn = DnodePhys::decode(raw)?;
                    if !dn.is_free() && w.v.object(obj, &dn) {
                        w.object(obj, &dn);
                    }
                    if w.stopped.is_some() {
                        break;
                    }
                }
                return Ok(());
            }
            let child = (span / epb).max(1);
            for (i, c) in decode_indirect(data, bp.level)?.iter().enumerate() {
                w.meta_tree(c, base + i as u64 * child, child, epb, per);
            }
            Ok(())
        });
    }

    fn object(&mut self, obj: u64, dn: &DnodePhys) {
        let span = dn.capacity(dn.nlevels) / 3;
        for (i, bp) in dn.blkptr.iter().enumerate() {
            self.data_tree(bp, obj, i as u64 * span, span, dn.epb());
        }
    }

    fn data_tree(&mut self, bp: &BlkPtr, obj: u64, base: u64, span: u64, epb: u64) {
        let at = At {
            kind: Kind::Data,
            object: obj,
            level: bp.level,
            blkid: base,
        };
        let pos = |blkid| Position { object: obj, blkid };
        let sp = Span {
            begin: pos(base),
            end: pos(base.saturating_add(span)),
        };
        self.visit(bp, at, sp, &mut |w, data| {
            let child = (span / epb).max(1);
            for (i, c) in decode_indirect(data, bp.level)?.iter().enumerate() {
                w.data_tree(c, obj, base + i as u64 * child, child, epb);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    //! The walk against a model: every block once, stop and resume
    //! anywhere visits the same blocks, and a post-order visitor never
    //! sees a block after its parent.
    use super::*;
    use crate::dmu::dnode::{ot, ObjProps};
    use crate::vdev::sim::SimWorld;

    #[derive(Default)]
    struct Log {
        pre: Vec<BlkPtr>,
        post: Vec<BlkPtr>,
        stop_after: Option<usize>,
        errors: usize,
    }

    impl Visitor for Log {
        fn pre(&mut self, bp: &BlkPtr, _at: &At) -> Next {
            // Like a free with a budget: stop once `stop_after` blocks
            // were released (so each walk makes progress).
            if self.stop_after.is_some_and(|n| self.post.len() >= n) {
                return Next::Stop;
            }
            self.pre.push(*bp);
            Next::Descend
        }
        fn post(&mut self, bp: &BlkPtr, _at: &At) {
            self.post.push(*bp);
        }
        fn error(&mut self, _at: &At, _e: Error) {
            self.errors += 1;
        }
    }

    fn key(b: &BlkPtr) -> (u32, u64) {
        (b.dva[0].vdev, b.dva[0].offset)
    }

    #[test]
    fn stopping_anywhere_and_resuming_visits_every_block_once() {
        let world = SimWorld::new();
        let tun = crate::spa::sim_tunables();
        let (_d, pool) = crate::spa::sim_pool(&world, "t", 64 << 20, tun, None).expect("create");
        // Objects of several shapes: one block, a few, an indirect tree;
        // enough of them for three dnode blocks.
        let props = ObjProps::default();
        for i in 0..80u64 {
            let obj = pool.root().create_object(ot::PLAIN_FILE, 4096, &props);
            let obj = obj.expect("create");
            let len = [100usize, 20_000, 600_000][(i % 3) as usize];
            pool.write(obj, 0, &vec![i as u8 | 1; len]).expect("write");
        }
        pool.sync().expect("sync");
        let root = pool.root().root_bp();
        let reader: &dyn BlockReader = &*pool.io;
        let mut all = Log::default();
        assert_eq!(
            walk_objset(reader, &root, 0, Position::START, &mut all),
            None
        );
        assert_eq!(all.errors, 0);
        let mut pre: Vec<_> = all.pre.iter().map(key).collect();
        let mut post: Vec<_> = all.post.iter().map(key).collect();
        let n = pre.len();
        pre.sort_unstable();
        pre.dedup();
        assert_eq!(pre.len(), n, "a block visited twice");
        post.sort_unstable();
        assert_eq!(pre, post);
        // Post-order: a block's parent comes after it.
        let order: std::collections::HashMap<_, _> = all
            .post
            .iter()
            .enumerate()
            .map(|(i, b)| (key(b), i))
            .collect();
        assert_eq!(*order.get(&key(&root)).expect("root"), n - 1);
        // Stop after k post visits, resume, k more, ...: the union of
        // post visits is every block once.
        for step in [1usize, 3, 17, 60] {
            let mut start = Position::START;
            let mut seen = Vec::new();
            let mut rounds = 0;
            loop {
                rounds += 1;
                assert!(rounds < 10_000, "no progress");
                let mut l = Log {
                    stop_after: Some(step),
                    ..Default::default()
                };
                let r = walk_objset(reader, &root, 0, start, &mut l);
                seen.extend(l.post.iter().map(key));
                match r {
                    None => break,
                    Some(p) => {
                        assert!(p >= start, "went backwards");
                        start = p;
                    }
                }
            }
            let m = seen.len();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), m, "step {step}: a block freed twice");
            assert_eq!(seen, post, "step {step}");
        }
        // min_birth: nothing born before it is visited.
        let born: Vec<u64> = all.pre.iter().map(|b| b.birth).collect();
        let cut = born.iter().copied().max().expect("blocks");
        let mut young = Log::default();
        walk_objset(reader, &root, cut, Position::START, &mut young);
        assert!(young.pre.iter().all(|b| b.birth >= cut));
        assert!(!young.pre.is_empty());
    }
}
