//! Feeds arbitrary bytes to the record and segment-header decoders: no panic, and a decoded
//! record never claims more bytes than its block or its input holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wal::Lsn;
use wal::format::{self, SegmentHeader};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let block = 1u64 << (6 + data[0] % 14);
    let lsn = u64::from(data[1]) * 8;
    let bytes = &data[2..];
    if let Ok(decoded) = format::decode_record(bytes, Lsn(lsn), block) {
        assert!(decoded.record_len <= format::block_rest(lsn, block));
        assert!(decoded.payload.len() <= bytes.len());
    }
    let _ = SegmentHeader::decode(bytes);
});
