//! `slidegate_fuzz::core_states` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slidegate_fuzz::core_states(data));
