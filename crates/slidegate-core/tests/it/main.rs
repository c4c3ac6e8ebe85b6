//! Property tests of every algorithm against exact oracles.
//!
//! Each property runs `CASES` random cases (override with `PROPTEST_CASES`);
//! failures found in the past are replayed from the committed
//! `proptest-regressions` files.

mod oracle;
mod props;
