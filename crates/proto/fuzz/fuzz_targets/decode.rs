#![no_main]
//! Any bytes, as a whole frame or a body, must decode or fail with an error: never panic,
//! never allocate past the decoder limit of the frame's size tier.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max = proto::DEFAULT_MAX_FRAME_BYTES;
    let _ = proto::decode_frame::<proto::Request>(data, max);
    let _ = proto::decode_frame::<proto::Response>(data, max);
    let _ = proto::decode_body::<proto::Request>(data, max);
    let _ = proto::read_frame::<proto::Request>(&mut &data[..], 1 << 16);
});
