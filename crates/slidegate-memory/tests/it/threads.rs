//! Many threads on one store, with a manual clock that does not move while
//! they run: decisions on one key are linearizable, so the exact
//! algorithms admit exactly their limit, whatever the interleaving.

use slidegate_core::{Algorithm, Clock, ManualClock, Policy, State, Weighting};
use slidegate_memory::internals::{StateMap, Timed};
use slidegate_memory::{Budget, KeyedLimiter};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(1);
/// Mid-bucket, so that no request sits on a bucket's edge.
const START: u64 = 1_000_000_000_000 + 123_456_789;

/// Algorithms that admit exactly `limit` cost-1 requests at one instant.
fn exact(limit: u64) -> Vec<Policy> {
    let ring = |buckets, weighting| Algorithm::SlidingWindow { buckets, weighting };
    [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: limit },
        ring(2, Weighting::Conservative),
        ring(8, Weighting::Conservative),
        ring(20, Weighting::Conservative),
        ring(2, Weighting::Interpolated),
    ]
    .into_iter()
    .map(|algorithm| Policy::new(limit, WINDOW, algorithm).unwrap())
    .collect()
}

/// Every admitted request of `threads` threads making `per_thread`
/// decisions each through `decide(thread, i)`.
fn admitted_by(threads: u64, per_thread: u64, decide: impl Fn(u64, u64) -> bool + Sync) -> u64 {
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for thread in 0..threads {
            let (admitted, decide) = (&admitted, &decide);
            s.spawn(move || {
                let mine = (0..per_thread).filter(|&i| decide(thread, i)).count() as u64;
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

/// T threads × N requests on one key admit exactly the limit, through the
/// keyed limiter's compact states and through a store of core states;
/// threads alternate `check` and `admit`. Through the store, half the
/// threads ask 1 ns later than the others, so requests arrive out of time
/// order, as with a clock read just before taking the lock.
#[test]
fn one_key_admits_exactly_the_limit() {
    const LIMIT: u64 = 500;
    for threads in [2, 4, 8] {
        let per_thread = 2 * LIMIT / threads + 50;
        for policy in exact(LIMIT) {
            let clock = ManualClock::new(START);
            let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::keys(1_000));
            let admitted = admitted_by(threads, per_thread, |thread, i| {
                if (thread + i) % 2 == 0 {
                    limiter.check(&42, 1).unwrap().allowed()
                } else {
                    limiter.admit(&42, 1).unwrap()
                }
            });
            assert_eq!(admitted, LIMIT, "{threads} threads, {policy}, keyed limiter");
            assert!(!limiter.check(&42, 1).unwrap().allowed());
            assert_eq!(limiter.check(&42, 0).unwrap().remaining(), 0);

            let store: StateMap<u64, Timed<State>> = StateMap::new(Budget::keys(1_000));
            let admitted = admitted_by(threads, per_thread, |thread, i| {
                store.admit(&policy, &42, START + thread % 2 * (i % 2), 1).unwrap()
            });
            assert_eq!(admitted, LIMIT, "{threads} threads, {policy}, store of core states");
        }
    }
}

/// The number of requests thread `thread` sends to `key` (up to 3 each),
/// so that totals per key vary from 0 to well above the limit.
fn sends(thread: u64, key: u64) -> u64 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (thread * 2 + 7)) % 4
}

/// 8 threads each send their own sequence of requests over 1000 keys,
/// interleaved; per key, the admitted total is what a single thread
/// replaying all the sequences gets (order does not matter at one instant
/// for cost-1 requests), and `min(limit, sent)`. Some threads send their
/// requests in batches.
#[test]
fn many_keys_admit_what_a_single_thread_would() {
    const KEYS: u64 = 1_000;
    const THREADS: u64 = 8;
    const LIMIT: u64 = 5;
    // Thread t visits the keys in its own order, as often as `sends` says.
    let sequence = |thread: u64| -> Vec<u64> {
        let stride = [1, 7, 13, 101, 257, 331, 499, 997][thread as usize];
        (0..KEYS)
            .map(|i| (i * stride + thread * 17) % KEYS)
            .flat_map(|key| std::iter::repeat_n(key, sends(thread, key) as usize))
            .collect()
    };
    for policy in exact(LIMIT) {
        let clock = ManualClock::new(START);
        let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::keys(100_000));
        let per_key: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|thread| {
                    let limiter = &limiter;
                    s.spawn(move || {
                        let mut admitted = vec![0u64; KEYS as usize];
                        let keys = sequence(thread);
                        if thread % 2 == 0 {
                            for &key in &keys {
                                admitted[key as usize] += u64::from(limiter.admit(&key, 1).unwrap());
                            }
                        } else {
                            let mut out = Vec::new();
                            for chunk in keys.chunks(37) {
                                let batch: Vec<(&u64, u64)> = chunk.iter().map(|k| (k, 1)).collect();
                                out.clear();
                                limiter.admit_many(&batch, &mut out);
                                for (key, allowed) in chunk.iter().zip(&out) {
                                    admitted[*key as usize] += u64::from(*allowed.as_ref().unwrap());
                                }
                            }
                        }
                        admitted
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let threaded: Vec<u64> = (0..KEYS as usize).map(|k| per_key.iter().map(|a| a[k]).sum()).collect();

        let replay: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::keys(100_000));
        let mut single = vec![0u64; KEYS as usize];
        for thread in 0..THREADS {
            for key in sequence(thread) {
                single[key as usize] += u64::from(replay.admit(&key, 1).unwrap());
            }
        }
        assert_eq!(threaded, single, "{policy}");
        for key in 0..KEYS {
            let sent: u64 = (0..THREADS).map(|t| sends(t, key)).sum();
            assert_eq!(
                threaded[key as usize],
                sent.min(LIMIT),
                "{policy}, key {key} sent {sent}"
            );
        }
        let stats = limiter.stats();
        assert_eq!(stats.evictions, 0, "{policy}");
        let held = (0..KEYS).filter(|&k| (0..THREADS).any(|t| sends(t, k) > 0)).count();
        assert_eq!(stats.keys, held, "{policy}");
        assert!(threaded.contains(&LIMIT) && threaded.iter().any(|&n| n < LIMIT));
        assert_eq!(clock.now(), START, "the clock never moved");
    }
}

/// Threads run in phases; between phases, and only then, the clock moves
/// on by two windows: every phase admits exactly the limit again.
#[test]
fn every_window_admits_exactly_the_limit_again() {
    const THREADS: usize = 4;
    const PHASES: usize = 5;
    const LIMIT: u64 = 200;
    for policy in exact(LIMIT) {
        let clock = ManualClock::new(START);
        let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, clock.clone(), Budget::keys(1_000));
        let barrier = Barrier::new(THREADS);
        let per_phase: Vec<AtomicU64> = (0..PHASES).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let (limiter, clock, barrier, per_phase) = (&limiter, &clock, &barrier, &per_phase);
                s.spawn(move || {
                    for admitted in per_phase {
                        let mine = (0..LIMIT).filter(|_| limiter.admit(&7, 1).unwrap()).count() as u64;
                        admitted.fetch_add(mine, Ordering::Relaxed);
                        // Everyone has decided; one thread moves the clock
                        // on while the others wait.
                        if barrier.wait().is_leader() {
                            clock.advance(2 * WINDOW);
                        }
                        barrier.wait();
                    }
                });
            }
        });
        let per_phase: Vec<u64> = per_phase.into_iter().map(AtomicU64::into_inner).collect();
        assert_eq!(per_phase, vec![LIMIT; PHASES], "{policy}");
    }
}
