//! Fuzz the wire frame decoder: any bytes must decode or be rejected with an error, never panic,
//! never claim more bytes than given, and every decoded message must re-encode to an equal message.
//!
//! cargo install cargo-fuzz && cd crates/engine/fuzz &&
//!   cargo +nightly fuzz run frame_decoder -- -max_total_time=60
//! (bounded, for CI). It starts from the checked-in seeds in `corpus/frame_decoder/`: one valid
//! version-3 frame per message kind, kept current by `tests/wire_doc.rs`.
#![no_main]

use gdx_engine::wire::{decode_body, decode_frame, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((msg, payload, used))) = decode_frame(data) {
        assert!(used <= data.len());
        let again = encode(&msg, payload);
        let (back, p2, _) = decode_frame(&again).expect("re-encoded frame decodes").expect("complete");
        assert_eq!(back, msg);
        assert_eq!(p2, payload);
    }
    // Bodies of every type, without a header.
    if let Some((&kind, body)) = data.split_first() {
        let _ = decode_body(kind, body);
    }
});
