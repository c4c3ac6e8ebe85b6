//! The shared conformance suite through the store: one key of a store of
//! each kind of state, a key crowded by others, and a [`KeyedLimiter`]'s
//! key. Each store also decides exactly as the core state, header for
//! header.
//!
//! [`KeyedLimiter`]: slidegate_memory::KeyedLimiter

use crate::subjects::{Crowded, Keyed, OneKey};
use slidegate_core::{FixedWindow, Gcra, State};
use slidegate_memory::internals::{Ring2, Ring8, Timed};

/// Cases per property (`PROPTEST_CASES` overrides): fewer than the core's,
/// as every what-if question replays the key's history into a new store,
/// and the suite runs for ten kinds of subject.
const CASES: u32 = 512;

/// Declares a module running the suite and the comparison with the core
/// on the subjects built by `$new`.
macro_rules! through_the_store {
    ($name:ident, $new:expr, family: $family:ident $(($($args:tt)*))?, order: $order:ident) => {
        mod $name {
            use super::*;

            slidegate_conformance::suite! {
                subject: $new,
                cases: CASES,
                family: $family $(($($args)*))?,
                order: $order,
            }

            slidegate_conformance::decides_like_the_core! {
                subject: $new,
                cases: CASES,
                family: $family $(($($args)*))?,
                order: $order,
            }
        }
    };
}

const U16: u64 = u16::MAX as u64;
const U32: u64 = u32::MAX as u64;

through_the_store!(timed_state, OneKey::<Timed<State>>::new, family: any, order: any);
through_the_store!(keyed_limiter, Keyed::new, family: any, order: any);
through_the_store!(ring2_u16, OneKey::<Ring2<u16>>::new, family: sliding_window(buckets: 2..3, max_limit: U16), order: any);
through_the_store!(ring2_u32, OneKey::<Ring2<u32>>::new, family: sliding_window(buckets: 2..3, max_limit: U32), order: any);
through_the_store!(ring8_u16, OneKey::<Ring8<u16>>::new, family: sliding_window(buckets: 2..9, max_limit: U16), order: any);
through_the_store!(ring8_u32, OneKey::<Ring8<u32>>::new, family: sliding_window(buckets: 2..9, max_limit: U32), order: any);
through_the_store!(fixed_window, OneKey::<FixedWindow>::new, family: fixed_window, order: any);
through_the_store!(gcra, OneKey::<Gcra>::new, family: gcra, order: any);
through_the_store!(crowded_timed_state, Crowded::<Timed<State>>::new, family: any, order: in_order);
through_the_store!(crowded_ring8, Crowded::<Ring8<u16>>::new, family: sliding_window(buckets: 2..9, max_limit: U16), order: in_order);
