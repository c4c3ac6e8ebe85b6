//! Batches decide exactly as the same requests one at a time.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use slidegate_core::{Algorithm, Decision, ManualClock, Policy, Weighting};
use slidegate_memory::{Budget, KeyedLimiter, MemoryError};
use std::time::Duration;

/// What a caller sees of a decision. (Two stores may differ in the raw
/// fields: an idle key that one store has dropped and the other still
/// holds answers alike, but remembers instants in the past.)
type Seen = (bool, u64, u64, Duration, Option<Duration>, f64);

fn seen(d: &Result<Decision, MemoryError>) -> Result<Seen, MemoryError> {
    d.clone().map(|d| {
        (
            d.allowed(),
            d.limit(),
            d.remaining(),
            d.reset_after(),
            d.retry_after(),
            d.estimate(),
        )
    })
}

fn policies() -> Vec<Policy> {
    let ring = |buckets, weighting| Algorithm::SlidingWindow { buckets, weighting };
    [
        ring(2, Weighting::Interpolated),
        ring(6, Weighting::Conservative),
        ring(30, Weighting::Interpolated),
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 3 },
        Algorithm::ExponentialHistogram { epsilon: 0.1 },
    ]
    .into_iter()
    .map(|algorithm| Policy::new(4, Duration::from_micros(50), algorithm).unwrap())
    .collect()
}

/// Random batches over few keys (so that keys repeat within a batch),
/// costs 0 to 5, the clock moving between batches: `check_many` and
/// `admit_many` answer exactly as `check` and `admit` one at a time, in
/// order, on a limiter of their own.
#[test]
fn batches_decide_as_one_at_a_time() {
    let mut rng = SmallRng::seed_from_u64(7);
    for policy in policies() {
        let clock = ManualClock::new(0);
        let new = || KeyedLimiter::<u64, _>::new(policy, clock.clone(), Budget::keys(4_000));
        let (batched, single, admitted, single_admitted) = (new(), new(), new(), new());
        let (mut out, mut out_admit) = (Vec::new(), Vec::new());
        let mut refused = 0;
        for _ in 0..300 {
            clock.advance(Duration::from_micros(rng.random_range(0..20)));
            let keys: Vec<u64> = (0..rng.random_range(0..40)).map(|_| rng.random_range(0..60)).collect();
            let batch: Vec<(&u64, u64)> = keys.iter().map(|k| (k, rng.random_range(0..=5))).collect();
            out.clear();
            batched.check_many(&batch, &mut out);
            let one_by_one: Vec<Result<Decision, MemoryError>> =
                batch.iter().map(|&(key, cost)| single.check(key, cost)).collect();
            let (out_seen, one_seen): (Vec<_>, Vec<_>) =
                (out.iter().map(seen).collect(), one_by_one.iter().map(seen).collect());
            assert_eq!(out_seen, one_seen, "{policy}");
            out_admit.clear();
            admitted.admit_many(&batch, &mut out_admit);
            let one_by_one: Vec<Result<bool, MemoryError>> = batch
                .iter()
                .map(|&(key, cost)| single_admitted.admit(key, cost))
                .collect();
            assert_eq!(out_admit, one_by_one, "{policy}");
            let decided: Vec<bool> = out.iter().map(|d| d.as_ref().unwrap().allowed()).collect();
            let admitted: Vec<bool> = out_admit.iter().map(|a| *a.as_ref().unwrap()).collect();
            assert_eq!(decided, admitted, "{policy}");
            refused += decided.iter().filter(|a| !**a).count();
        }
        assert!(refused > 0, "{policy}: the batches reached the limit");
        // Which idle keys each store still holds depends on its hash seed.
        assert!(batched.stats().keys <= 60 && single.stats().keys <= 60);
    }
}

/// Batches of borrowed string keys, with a key too large for the store
/// among them: each request answers for itself, and the others are
/// decided as one at a time would.
#[test]
fn batches_of_str_keys_answer_for_each_request() {
    let policy = Policy::new(2, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
    let clock = ManualClock::new(5);
    let limiter: KeyedLimiter<String, _> = KeyedLimiter::new(policy, clock, Budget::bytes(64 << 10));
    let huge = "x".repeat(100_000);
    let batch: Vec<(&str, u64)> = vec![
        ("alice", 1),
        (&huge, 1),
        ("bob", 2),
        ("alice", 1),
        ("alice", 1),
        ("bob", 1),
    ];
    let mut out = Vec::new();
    limiter.check_many(&batch, &mut out);
    let allowed: Vec<Option<bool>> = out.iter().map(|d| d.as_ref().ok().map(Decision::allowed)).collect();
    assert_eq!(
        allowed,
        [Some(true), None, Some(true), Some(true), Some(false), Some(false)]
    );
    assert!(matches!(out[1], Err(MemoryError::KeyTooLarge { bytes: 100_000, .. })));
    assert_eq!(limiter.stats().keys, 2);
}
