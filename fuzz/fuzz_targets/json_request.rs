//! `slidegate_fuzz::json_request` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slidegate_fuzz::json_request(data));
