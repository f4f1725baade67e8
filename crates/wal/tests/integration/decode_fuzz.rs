//! The CI stand-in for the cargo-fuzz targets: random bytes into the record and segment
//! decoders, and random truncations and bit flips of real segment files into recovery. No
//! input may panic or allocate without bound; each yields a valid prefix or a typed error.

use crate::common;

use common::{DIR, open, payload, read_all};
use proptest::prelude::*;
use std::path::Path;
use wal::format::{self, SegmentHeader};
use wal::fs::FaultFs;
use wal::{Durability, Lsn, Term};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn record_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600), lsn in 0u64..4096, block_log in 6u32..13) {
        let block = 1u64 << block_log;
        let lsn = lsn & !7;
        if let Ok(decoded) = format::decode_record(&bytes, Lsn(lsn), block) {
            prop_assert!(decoded.record_len <= format::block_rest(lsn, block));
            prop_assert!(decoded.payload.len() <= bytes.len());
        }
        let _ = SegmentHeader::decode(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn recovery_of_damaged_segments_is_a_prefix_or_a_typed_error(
        entries in 1u64..30,
        flips in prop::collection::vec((any::<u32>(), 0u8..8), 0..4),
        cut in prop::option::of(any::<u32>()),
    ) {
        let fs = FaultFs::new();
        let wal = open(&fs).unwrap();
        for i in 1..=entries {
            wal.append_next(Term(1), &payload(i, 0), Durability::Fsync).unwrap();
        }
        wal.close().unwrap();
        drop(wal);
        let dir = Path::new(DIR);
        let names: Vec<String> = fs.names(dir).into_iter().filter(|n| n.ends_with(".wal")).collect();
        for (pick, bit) in flips {
            let path = dir.join(&names[pick as usize % names.len()]);
            let len = fs.read_file(&path).unwrap().len();
            let at = (pick as usize / names.len()) % len;
            let old = fs.read_file(&path).unwrap()[at];
            fs.corrupt(&path, at as u64, &[old ^ (1 << bit)]);
        }
        if let Some(cut) = cut {
            // A truncated last segment: bytes past the cut read as zero.
            let path = dir.join(names.last().unwrap());
            let len = fs.read_file(&path).unwrap().len();
            let at = cut as usize % len;
            fs.corrupt(&path, at as u64, &vec![0; len - at]);
        }
        match open(&fs) {
            Ok(wal) => {
                for (index, _, bytes) in read_all(&wal) {
                    prop_assert_eq!(bytes, payload(index, 0), "a recovered entry differs");
                }
                prop_assert!(wal.last_index().0 <= entries);
            }
            Err(error) => {
                // A typed error with a real sentence.
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }
}
