//! `slidegate_fuzz::config_yaml` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slidegate_fuzz::config_yaml(data));
