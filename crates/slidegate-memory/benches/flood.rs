//! Issue [flood]: the price of the summary of evicted counts, against the
//! store that forgets evicted keys (`Budget::forgetting`, the store before
//! the summary), in one run, taking turns.
//!
//! A `MemoryStore` of 100,000 keys, full: 50,000 legitimate clients, each
//! at half its limit (one request a second on 20 per 10 s, the default
//! sliding window), and a flood of 5,000 to 50,000 new keys a second (the
//! issue's figure; 10 s of it is 5 times what the store holds), one request
//! each, of the same policy (the attacker's best choice: the legitimate
//! keys' own cells), on a manual clock in 10 ms steps. After a 20 s
//! warm-up that fills the store, 30 s of traffic are timed. A legitimate
//! request refused is refused early: a store large enough refuses none.
//! A flood key is a new client's first request: the share of them refused
//! is what a new legitimate client arriving during the flood meets. And
//! 1,000 victims ask every 100 ms, far over their limit: "past limit"
//! counts their requests admitted beyond 20 in the 10 s before (an exact
//! log beside the store), which the default store never admits. "False
//! seeds" is the store's own estimate (`Stats::false_seed_rate`, the
//! `slidegate_eviction_summary_false_seed_ratio` metric) of the share of
//! new keys started from a non-zero estimate, which bounds "new refused".
//!
//! `cargo bench -p slidegate-memory --bench flood` (`-- --quick` for one
//! round). Prints per store the median decisions a second over the rounds,
//! the share of legitimate requests refused, and the store's evictions and
//! seeded keys.

use slidegate_core::{Algorithm, ManualClock, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, Quota, Store};
use std::collections::VecDeque;
use std::fmt::Write;
use std::time::{Duration, Instant};

const CAPACITY: usize = 100_000;
const LIMIT: u64 = 20;
const WINDOW_NS: u64 = 10_000_000_000;
/// Clients asking far more than their limit: none may be admitted more
/// than `LIMIT` times in any window.
const VICTIMS: u64 = 1_000;
const LEGIT: u64 = 50_000;
/// New keys a second: the 50,000, and lighter floods for the curve.
const FLOODS_PER_S: [u64; 4] = [5_000, 10_000, 25_000, 50_000];
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
    past_limit: u64,
    false_seed: f64,
    evictions: u64,
    seeded: u64,
}

fn round(budget: Budget, flood_per_s: u64) -> Round {
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::with_clock(budget, Budget::keys(1_000), clock.clone());
    let quota = [Quota::new(
        Policy::new(LIMIT, Duration::from_nanos(WINDOW_NS), Algorithm::DEFAULT).expect("a valid policy"),
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
    // Each victim's admissions in the last window, exactly.
    let mut admitted: Vec<VecDeque<u64>> = vec![VecDeque::new(); VICTIMS as usize];
    let mut past_limit = 0u64;
    let mut started = Instant::now();
    for step in 0..(WARM_S + TIMED_S) * STEPS_PER_S {
        if step == WARM_S * STEPS_PER_S {
            started = Instant::now();
            (legit, legit_refused, decisions, new, new_refused, past_limit) = (0, 0, 0, 0, 0, 0);
        }
        let now = 1_000_000_000 + step * STEP_NS;
        clock.set(now);
        // Each victim every 100 ms, far above its limit.
        for victim in ((step % 10)..VICTIMS).step_by(10) {
            let log = &mut admitted[victim as usize];
            while log.front().is_some_and(|&t| t + WINDOW_NS <= now) {
                log.pop_front();
            }
            if decide("victim-", victim) {
                past_limit += u64::from(log.len() as u64 >= LIMIT);
                log.push_back(now);
            }
            decisions += 1;
        }
        // Each legitimate client once a second, at its own phase.
        for client in ((step % STEPS_PER_S)..LEGIT).step_by(STEPS_PER_S as usize) {
            legit += 1;
            legit_refused += u64::from(!decide("client-", client));
        }
        for _ in 0..flood_per_s / STEPS_PER_S {
            new += 1;
            new_refused += u64::from(!decide("flood-", flood));
            flood += 1;
        }
        decisions += LEGIT / STEPS_PER_S + flood_per_s / STEPS_PER_S;
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
        past_limit,
        false_seed: stats.false_seed_rate(),
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
    println!(
        "flood: store of {CAPACITY} keys, {LEGIT} clients at half their limit (20 per 10 s); \
         {TIMED_S} s timed after {WARM_S} s, median of {rounds} rounds"
    );
    println!(
        "{:>12} {:<20} {:>14} {:>15} {:>15} {:>12} {:>12} {:>10} {:>10}",
        "new keys/s",
        "store",
        "decisions/s",
        "legit refused",
        "new refused",
        "false seeds",
        "past limit",
        "evictions",
        "seeded"
    );
    for flood_per_s in FLOODS_PER_S {
        flood(&stores, flood_per_s, rounds);
    }
}

/// One flood rate: the stores take turns, `rounds` times.
fn flood(stores: &[(&str, Budget)], flood_per_s: u64, rounds: usize) {
    let mut results: Vec<Vec<Round>> = stores.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for ((_, budget), rs) in stores.iter().zip(&mut results) {
            rs.push(round(*budget, flood_per_s));
        }
    }
    let mut rates = Vec::new();
    for ((name, _), rs) in stores.iter().zip(&results) {
        let rate = median(
            rs.iter()
                .map(|r| r.decisions as f64 / r.elapsed.as_secs_f64())
                .collect(),
        );
        let refused = median(
            rs.iter()
                .map(|r| 100.0 * r.legit_refused as f64 / r.legit as f64)
                .collect(),
        );
        let new = median(rs.iter().map(|r| 100.0 * r.new_refused as f64 / r.new as f64).collect());
        let past = median(rs.iter().map(|r| r.past_limit as f64).collect());
        let last = rs.last().expect("a round");
        println!(
            "{flood_per_s:>12} {name:<20} {:>12.2} M {:>13.3} % {:>13.3} % {:>10.3} % {:>12} {:>10} {:>10}",
            rate / 1e6,
            refused,
            new,
            100.0 * last.false_seed,
            past,
            last.evictions,
            last.seeded
        );
        rates.push(rate);
    }
    println!(
        "{flood_per_s:>12} decisions/s, summary / forgetting: {:.2}×",
        rates[0] / rates[1]
    );
}
