//! Property tests of every algorithm against exact oracles.
//!
//! The properties, oracles and strategies live in `slidegate-conformance`,
//! shared with the stores; each runs `CASES` random cases (override with
//! `PROPTEST_CASES`); failures found in the past are replayed from the
//! committed `proptest-regressions` files.

mod props;
