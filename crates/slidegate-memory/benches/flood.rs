//! Issue [flood]: the price of the summary of evicted counts, against the
//! store that forgets evicted keys (`Budget::forgetting`, the store before
//! the summary), in one run, taking turns.
//!
//! A `MemoryStore` of 100,000 keys, full: 50,000 legitimate clients, each
//! at half its limit (one request a second on 20 per 10 s, the default
//! sliding window), and a flood of 50,000 new keys a second, one request
//! each, of the same policy (the attacker's best choice: the legitimate
//! keys' own cells), on a manual clock in 10 ms steps. After a 20 s
//! warm-up that fills the store, 30 s of traffic are timed. A legitimate
//! request refused is refused early: a store large enough refuses none.
//! A flood key is a new client's first request: the share of them refused
//! is what a new legitimate client arriving during the flood meets.
//!
//! `cargo bench -p slidegate-memory --bench flood` (`-- --quick` for one
//! round). Prints per store the median decisions a second over the rounds,
//! the share of legitimate requests refused, and the store's evictions and
//! seeded keys.

use slidegate_core::{Algorithm, ManualClock, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, Quota, Store};
use std::fmt::Write;
use std::time::{Duration, Instant};

const CAPACITY: usize = 100_000;
const LEGIT: u64 = 50_000;
const FLOOD_PER_S: u64 = 50_000;
const STEP_NS: u64 = 10_000_000;
const STEPS_PER_S: u64 = 1_000_000_000 / STEP_NS;
const WARM_S: u64 = 20;
const TIMED_S: u64 = 30;

struct Round {
    decisions: u64,
    elapsed: Duration,
    legit: u64,
    legit_refused: u64,
    new: u64,
    new_refused: u64,
    evictions: u64,
    seeded: u64,
}

fn round(budget: Budget) -> Round {
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::with_clock(budget, Budget::keys(1_000), clock.clone());
    let quota = [Quota::new(
        Policy::new(20, Duration::from_secs(10), Algorithm::DEFAULT).expect("a valid policy"),
    )];
    let mut out = Decisions::new();
    let mut key = String::with_capacity(32);
    let mut decide = |name: &str, n: u64| -> bool {
        key.clear();
        let _ = write!(key, "{name}{n}");
        match store.decide_now(&key, &quota, 1, &mut out) {
            Some(Ok(())) => out.first().is_some_and(|d| d.allowed()),
            other => panic!("the memory store decides now: {other:?}"),
        }
    };
    let (mut flood, mut legit, mut legit_refused, mut decisions) = (0u64, 0u64, 0u64, 0u64);
    let (mut new, mut new_refused) = (0u64, 0u64);
    let mut started = Instant::now();
    for step in 0..(WARM_S + TIMED_S) * STEPS_PER_S {
        if step == WARM_S * STEPS_PER_S {
            started = Instant::now();
            (legit, legit_refused, decisions, new, new_refused) = (0, 0, 0, 0, 0);
        }
        clock.set(1_000_000_000 + step * STEP_NS);
        // Each legitimate client once a second, at its own phase.
        for client in ((step % STEPS_PER_S)..LEGIT).step_by(STEPS_PER_S as usize) {
            legit += 1;
            legit_refused += u64::from(!decide("client-", client));
        }
        for _ in 0..FLOOD_PER_S / STEPS_PER_S {
            new += 1;
            new_refused += u64::from(!decide("flood-", flood));
            flood += 1;
        }
        decisions += LEGIT / STEPS_PER_S + FLOOD_PER_S / STEPS_PER_S;
    }
    let elapsed = started.elapsed();
    let stats = store.memory_stats();
    Round {
        decisions,
        elapsed,
        legit,
        legit_refused,
        new,
        new_refused,
        evictions: stats.evictions,
        seeded: stats.seeded,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 1 } else { 5 };
    let stores = [
        ("summary (default)", Budget::keys(CAPACITY)),
        ("forgetting (before)", Budget::keys(CAPACITY).forgetting()),
    ];
    let mut results: Vec<Vec<Round>> = stores.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for ((_, budget), rs) in stores.iter().zip(&mut results) {
            rs.push(round(*budget));
        }
    }
    println!(
        "flood: store of {CAPACITY} keys, {LEGIT} clients at half their limit, {FLOOD_PER_S} new keys/s; \
         {TIMED_S} s timed after {WARM_S} s, median of {rounds} rounds"
    );
    println!(
        "{:<20} {:>14} {:>15} {:>15} {:>10} {:>10}",
        "store", "decisions/s", "legit refused", "new refused", "evictions", "seeded"
    );
    let mut rates = Vec::new();
    for ((name, _), rs) in stores.iter().zip(&results) {
        let rate = median(rs.iter().map(|r| r.decisions as f64 / r.elapsed.as_secs_f64()).collect());
        let refused = median(rs.iter().map(|r| 100.0 * r.legit_refused as f64 / r.legit as f64).collect());
        let new = median(rs.iter().map(|r| 100.0 * r.new_refused as f64 / r.new as f64).collect());
        let last = rs.last().expect("a round");
        println!(
            "{name:<20} {:>12.2} M {:>13.3} % {:>13.3} % {:>10} {:>10}",
            rate / 1e6,
            refused,
            new,
            last.evictions,
            last.seeded
        );
        rates.push(rate);
    }
    println!("ratio summary / forgetting: {:.2}×", rates[0] / rates[1]);
}
