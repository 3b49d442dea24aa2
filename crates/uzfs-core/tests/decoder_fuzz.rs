//! Property tests: every on-disk decoder, fed arbitrary or mutated bytes,
//! returns a value or an error and never panics; encoders round-trip.

use proptest::prelude::*;
use uzfs_core::dmu::blkptr::{BlkPtr, Dva};
use uzfs_core::dmu::checksum::ChecksumType;
use uzfs_core::dmu::compress::{decompress, Compression};
use uzfs_core::dmu::dnode::DnodePhys;
use uzfs_core::dmu::objset::{decode_indirect, decode_objset_phys};
use uzfs_core::spa::space_map;
use uzfs_core::spa::uberblock::Uberblock;
use uzfs_core::vdev::label::decode_config;

fn arb_bp() -> impl Strategy<Value = BlkPtr> {
    (
        1u64..1 << 40,
        1u32..256,
        1u64..1 << 30,
        any::<[u8; 32]>(),
        0u8..3,
        0u8..4,
    )
        .prop_map(|(off, sectors, birth, ck, comp, level)| {
            let psize = sectors * 512;
            BlkPtr {
                dva: [
                    Dva {
                        vdev: 1,
                        asize: psize as u64,
                        offset: off * 512,
                        flags: 0,
                    },
                    Dva::default(),
                    Dva::default(),
                ],
                lsize: psize,
                psize,
                compress: Compression::from_u8(comp).unwrap_or(Compression::Off),
                checksum_type: ChecksumType::Sha256,
                obj_type: 10,
                level,
                birth,
                phys_birth: birth,
                fill: 1,
                checksum: ck,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn blkptr_roundtrip(bp in arb_bp()) {
        prop_assert_eq!(BlkPtr::decode(&bp.to_bytes()).ok(), Some(bp));
    }

    #[test]
    fn blkptr_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = BlkPtr::decode(&b);
    }

    #[test]
    fn mutated_blkptr_never_panics(bp in arb_bp(), at in 0usize..128, x in 1u8..=255) {
        let mut b = bp.to_bytes();
        b[at] ^= x;
        let _ = BlkPtr::decode(&b);
    }

    #[test]
    fn dnode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = DnodePhys::decode(&b);
    }

    #[test]
    fn uberblock_never_panics(b in proptest::collection::vec(any::<u8>(), 0..5000), at in any::<u64>()) {
        let _ = Uberblock::decode(&b, at);
    }

    #[test]
    fn mutated_uberblock_is_rejected(bp in arb_bp(), txg in 1u64..1000, at in 0usize..4064, x in 1u8..=255) {
        let ub = Uberblock { txg, guid_sum: 5, timestamp: 6, rootbp: bp, pool_guid: 7, mmp: None };
        let mut b = ub.encode(4096, 12345);
        prop_assert_eq!(Uberblock::decode(&b, 12345).ok().flatten(), Some(ub));
        b[at] ^= x;
        prop_assert!(Uberblock::decode(&b, 12345).ok().flatten().is_none());
    }

    #[test]
    fn label_config_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300), at in any::<u64>()) {
        let _ = decode_config(&b, at);
    }

    #[test]
    fn objset_and_indirect_never_panic(b in proptest::collection::vec(any::<u8>(), 0..1200), level in 0u8..10) {
        let _ = decode_objset_phys(&b);
        let _ = decode_indirect(&b, level);
    }

    #[test]
    fn space_map_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = space_map::replay(&b, 0, 1 << 30);
    }

    #[test]
    fn decompress_never_panics(b in proptest::collection::vec(any::<u8>(), 0..2000), lsize in 0usize..70000, alg in 0u8..3) {
        let _ = decompress(Compression::from_u8(alg).unwrap_or(Compression::Off), &b, lsize);
    }
}
