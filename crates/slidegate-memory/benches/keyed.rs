//! Placeholder replaced by the keyed benchmark.
fn main() {}
