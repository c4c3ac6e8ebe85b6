//! Floods of distinct keys stay within the store's byte budget, measured
//! by a counting global allocator (its own test binary, so that the
//! counting slows no other test). The tests run one at a time, so that
//! each measures only itself.

mod common;

use common::accounts_for;
use slidegate_conformance::alloc::Counting;
use slidegate_core::{Algorithm, ManualClock, Policy, State, Weighting};
use slidegate_memory::internals::{StateMap, Timed};
use slidegate_memory::{Budget, KeyedLimiter, MemoryError, Stats};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

#[global_allocator]
static ALLOC: Counting = Counting::new();

/// Held by each test, so that no two measure at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What the test harness itself may allocate while a test measures (a
/// thread for the next test, captured output): far less than any
/// miscount of the store's.
const HARNESS: usize = 64 << 10;

/// Taken first thing by every test, before it allocates anything.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes allocated since a test started measuring.
struct Meter {
    before: usize,
}

impl Meter {
    fn start(_serial: &MutexGuard<'static, ()>) -> Meter {
        let before = ALLOC.current();
        ALLOC.reset_peak();
        Meter { before }
    }

    /// Bytes in use now, over what was in use at the start.
    fn in_use(&self) -> usize {
        ALLOC.current().saturating_sub(self.before)
    }

    /// The most bytes in use at once since the start.
    fn peak(&self) -> usize {
        ALLOC.peak().saturating_sub(self.before)
    }

    /// The store's own count of its bytes is what it really allocated
    /// (it never under-counts), and the peak stayed within the budget.
    fn within(&self, stats: Stats, budget: usize) {
        let (in_use, peak) = (self.in_use(), self.peak());
        eprintln!("{in_use} bytes in use, peak {peak}, in a budget of {budget}: {stats:?}");
        assert!(in_use <= stats.bytes + HARNESS, "{in_use} bytes in use, {stats:?}");
        assert!(stats.bytes <= budget, "{stats:?}");
        assert!(peak <= budget, "peak {peak} bytes over a budget of {budget}");
    }
}

/// Distinct keys in no particular order: `i` times an odd constant is a
/// bijection of `u64`.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// 10 million distinct `u64` keys through a keyed limiter in a 64 MiB
/// budget: it holds ~2.4 million at a time, evicts live keys and reclaims
/// idle ones, accounts for every key, and never allocates past its budget.
#[test]
fn ten_million_keys_stay_in_64_mib() {
    let serial = one_at_a_time();
    const BUDGET: usize = 64 << 20;
    const KEYS: u64 = 10_000_000;
    let policy = Policy::new(10, Duration::from_millis(10), Algorithm::TWO_BUCKETS).unwrap();
    let clock = ManualClock::new(0);
    let meter = Meter::start(&serial);
    let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::bytes(BUDGET));
    let mut refused = 0u64;
    for i in 0..KEYS {
        // 1 ms every 200 000 keys: a key is idle some 4 million keys after
        // it came, past the capacity, so both live keys are evicted and
        // idle ones reclaimed.
        if i % 200_000 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        refused += u64::from(!limiter.admit(&key(i), 1).unwrap());
    }
    let stats = limiter.stats();
    meter.within(stats, BUDGET);
    // Only a key started from the summary of evicted keys can be refused.
    assert!(refused <= stats.seeded, "{refused} refused: {stats:?}");
    assert!(stats.capacity > 2_000_000, "{stats:?}");
    assert!(stats.evictions > 0 && stats.reclaimed > 0, "{stats:?}");
    accounts_for(stats, KEYS);
}

/// A flood at one instant: nothing ever goes idle, every key past the
/// capacity evicts a live one.
#[test]
fn a_flood_at_one_instant_evicts_and_stays_in_budget() {
    let serial = one_at_a_time();
    const BUDGET: usize = 8 << 20;
    const KEYS: u64 = 1_000_000;
    let algorithm = Algorithm::SlidingWindow {
        buckets: 6,
        weighting: Weighting::Conservative,
    };
    let policy = Policy::new(100_000, Duration::from_secs(60), algorithm).unwrap();
    let clock = ManualClock::new(0);
    let meter = Meter::start(&serial);
    let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::bytes(BUDGET));
    let mut refused = 0u64;
    for i in 0..KEYS {
        refused += u64::from(!limiter.admit(&key(i), 1).unwrap());
    }
    let stats = limiter.stats();
    meter.within(stats, BUDGET);
    eprintln!("{refused} new keys refused from the summary");
    assert!(refused <= stats.summarised, "{refused} refused: {stats:?}");
    assert_eq!(stats.reclaimed, 0);
    assert_eq!(stats.evictions + stats.summarised, KEYS - stats.keys as u64);
    assert!(stats.keys > stats.capacity * 9 / 10, "{stats:?}");
    accounts_for(stats, KEYS);
}

/// Core states on the heap count against the budget too: each key's log
/// grows, then a ring of 20 buckets replaces it (another policy's shape),
/// and the bytes of both are counted as they come and go.
#[test]
fn heap_states_stay_in_budget() {
    let serial = one_at_a_time();
    const BUDGET: usize = 4 << 20;
    const KEYS: u64 = 100_000;
    let log = Policy::new(8, Duration::from_secs(60), Algorithm::SlidingLog).unwrap();
    let ring = Policy::new(
        8,
        Duration::from_secs(60),
        Algorithm::SlidingWindow {
            buckets: 20,
            weighting: Weighting::Interpolated,
        },
    )
    .unwrap();
    let meter = Meter::start(&serial);
    let store: StateMap<u64, Timed<State>> = StateMap::new(Budget::bytes(BUDGET));
    for i in 0..KEYS {
        for policy in [&log, &ring] {
            for t in 0..3 {
                // A key started from the summary may be refused.
                let _ = store.admit(policy, &key(i), 10 * i + t, 1).unwrap();
            }
        }
        // Every other key ends as a log of 3.
        if i % 2 == 0 {
            let _ = store.admit(&log, &key(i), 10 * i + 3, 3).unwrap();
        }
    }
    let stats = store.stats();
    meter.within(stats, BUDGET);
    assert!(stats.evictions > 0, "{stats:?}");
    // A key kept in the summary alone comes again as a new key.
    let (s, keys) = (stats, KEYS);
    assert!(
        s.keys as u64 + s.evictions + s.reclaimed + s.summarised >= keys,
        "{s:?}"
    );
}

/// 1.5 million distinct `String` keys, short and some long, in a 4 MiB
/// budget: the keys' heap bytes are counted, keys larger than a shard's
/// share (some 170 kB here) are refused, and the store never allocates past
/// its budget.
#[test]
fn string_keys_stay_in_budget() {
    let serial = one_at_a_time();
    const BUDGET: usize = 4 << 20;
    const KEYS: u64 = 1_500_000;
    let policy = Policy::new(5, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
    let clock = ManualClock::new(0);
    // Formatted into one buffer, so that the test allocates nothing per key.
    let mut name = String::with_capacity(520 << 10);
    let meter = Meter::start(&serial);
    let limiter: KeyedLimiter<String, _> = KeyedLimiter::new(policy, clock.clone(), Budget::bytes(BUDGET));
    let (mut refused, mut seeded_refused) = (0u64, 0u64);
    for i in 0..KEYS {
        use std::fmt::Write;
        name.clear();
        write!(name, "user-{:x}", key(i)).unwrap();
        match i % 1_000 {
            // Some long keys: a path of 200 to 1100 bytes.
            0..=9 => name.extend(std::iter::repeat_n('/', 200 + (i % 1_000) as usize * 100)),
            // Some too long for any shard.
            10 => name.extend(std::iter::repeat_n('x', 512 << 10)),
            _ => {}
        }
        match limiter.admit(name.as_str(), 1) {
            // A new key whose cells in the summary of evicted keys are all
            // taken starts from what they hold, and may be refused.
            Ok(allowed) => seeded_refused += u64::from(!allowed),
            Err(MemoryError::KeyTooLarge { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        // 100 ms every 10 000 keys: idle 100 000 keys later.
        if i % 10_000 == 0 {
            clock.advance(Duration::from_millis(100));
        }
    }
    let stats = limiter.stats();
    meter.within(stats, BUDGET);
    eprintln!("{seeded_refused} new keys refused from the summary");
    // The 512 kB keys, but those refused from the summary before.
    assert!(refused > 0 && refused <= KEYS / 1_000, "{refused} too large");
    assert!(stats.evictions > 0 && stats.reclaimed > 0, "{stats:?}");
    assert!(seeded_refused <= stats.summarised, "{stats:?}");
    accounts_for(stats, KEYS - refused);
}
