//! The model of Envoy's RLQS client (`common::envoy_quota`) against Envoy's
//! behaviour worked out by hand from its sources (the filter, the global
//! client and `AtomicTokenBucketImpl`). Time is a manual clock in
//! nanoseconds; token counts are chosen to be exact in binary floating
//! point, so every value is compared exactly.

mod common;
use common::envoy_quota::*;
use std::time::Duration;

const A: &[(&str, &str)] = &[("name", "a"), ("tenant", "t1")];
const B: &[(&str, &str)] = &[("name", "b")];
const DOMAIN: &str = "edge";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(n: u64) -> u64 {
    n * 1_000_000
}

fn client(no_assignment: Blanket, expired: Option<(Strategy, Duration)>) -> EnvoyQuotaClient {
    EnvoyQuotaClient::new(DOMAIN, Behaviours { no_assignment, expired })
}

fn token_bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval: Duration) -> Strategy {
    Strategy::TokenBucket(TokenBucketSpec::new(max_tokens, tokens_per_fill, fill_interval))
}

const DENY: Strategy = Strategy::Blanket(Blanket::DenyAll);
const ALLOW: Strategy = Strategy::Blanket(Blanket::AllowAll);

/// The client receives one assignment at `now`.
fn assign(c: &mut EnvoyQuotaClient, bucket: &[(&str, &str)], strategy: &Strategy, ttl: Duration, now: u64) {
    c.receive(&response(vec![assignment(bucket, Some(strategy), Some(ttl))]), now);
}

type Row = (BucketKey, i64, u64, u64);

fn row(bucket: &[(&str, &str)], elapsed: i64, allowed: u64, denied: u64) -> Row {
    (bucket_key(bucket), elapsed, allowed, denied)
}

/// The messages sent since the last call: (stream, rows); each carries the
/// domain.
fn sent(c: &mut EnvoyQuotaClient) -> Vec<(usize, Vec<Row>)> {
    c.outbox()
        .into_iter()
        .map(|m| {
            assert_eq!(m.reports.domain, DOMAIN);
            (m.stream, m.reports.bucket_quota_usages.iter().map(usage_row).collect())
        })
        .collect()
}

#[test]
fn a_token_bucket_fills_at_a_fractional_rate_and_gives_whole_tokens() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    // 1 token every 2 s: 0.5 a second; a new bucket starts full.
    assign(&mut c, A, &token_bucket(3, 1, secs(2)), secs(60), 0);
    assert_eq!(c.token_bucket(A).unwrap().fill_rate(), 0.5);
    assert_eq!(c.remaining_tokens(A, 0), Some(3.0));
    for _ in 0..3 {
        assert!(c.request(A, 0));
    }
    assert!(!c.request(A, 0));
    assert_eq!(c.remaining_tokens(A, 0), Some(0.0));
    // Half a token is not a token, and a denial takes nothing.
    assert_eq!(c.remaining_tokens(A, 1_000_000_000), Some(0.5));
    assert!(!c.request(A, 1_000_000_000));
    assert_eq!(c.remaining_tokens(A, 1_000_000_000), Some(0.5));
    assert!(c.request(A, 2_000_000_000));
    assert_eq!(c.remaining_tokens(A, 2_000_000_000), Some(0.0));
    assert_eq!(c.remaining_tokens(A, 2_500_000_000), Some(0.25));
    // Capped at max_tokens.
    assert_eq!(c.remaining_tokens(A, 100 * NS), Some(3.0));
    assert_eq!(c.totals(A), Counts { allowed: 5, denied: 2 });

    // 1 token every 4 s: a quarter a second.
    assign(&mut c, B, &token_bucket(1, 1, secs(4)), secs(60), 3 * NS); // B is not cached: dropped
    assert!(c.request(B, 3 * NS));
    assign(&mut c, B, &token_bucket(1, 1, secs(4)), secs(60), 3 * NS);
    assert!(c.request(B, 3 * NS));
    assert!(!c.request(B, 6 * NS));
    assert_eq!(c.remaining_tokens(B, 6 * NS), Some(0.75));
    assert!(c.request(B, 7 * NS));
    assert_eq!(c.totals(B), Counts { allowed: 3, denied: 1 });
}

#[test]
fn a_fill_interval_under_a_second_is_zero_whole_seconds_an_infinite_rate() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assign(&mut c, A, &token_bucket(2, 1, Duration::from_millis(500)), secs(60), 0);
    assert_eq!(c.token_bucket(A).unwrap().fill_rate(), f64::INFINITY);
    // (now - t) * inf is NaN or inf, and C++'s std::min(max, NaN) is max:
    // the bucket is always full.
    for _ in 0..10 {
        assert!(c.request(A, 0));
    }
    assert_eq!(c.remaining_tokens(A, 0), Some(2.0));
    assert!(c.request(A, 1));
}

#[test]
fn an_equal_token_bucket_is_carried_over_and_its_ttl_restarts() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    let spec = token_bucket(4, 2, secs(1));
    assign(&mut c, A, &spec, secs(60), 0);
    for _ in 0..3 {
        assert!(c.request(A, 0));
    }
    assert_eq!(c.remaining_tokens(A, 0), Some(1.0));
    // The same assignment again: the bucket is kept, not refilled.
    assign(&mut c, A, &spec, secs(60), 0);
    assert_eq!(c.remaining_tokens(A, 0), Some(1.0));
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(Some(spec.clone()))));
    // Its expiry restarts with each assignment: 10 s + 60 s.
    assign(&mut c, A, &spec, secs(60), 10 * NS);
    c.tick(70 * NS - 1);
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(Some(spec))));
    c.tick(70 * NS);
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::AllowAll)));
    assert_eq!(c.token_bucket(A), None);
}

#[test]
fn token_buckets_are_compared_by_the_nanos_of_their_fill_interval_not_its_seconds() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assign(&mut c, A, &token_bucket(4, 2, secs(1)), secs(60), 0); // 2 a second
    for _ in 0..4 {
        assert!(c.request(A, 0));
    }
    // 2 every 2 s differs only in its seconds: Envoy keeps the old bucket,
    // still filling at 2 a second, under the new action.
    assign(&mut c, A, &token_bucket(4, 2, secs(2)), secs(60), 0);
    assert_eq!(
        c.action(A),
        Some(CurrentAction::Assigned(Some(token_bucket(4, 2, secs(2)))))
    );
    assert_eq!(c.token_bucket(A).unwrap().fill_rate(), 2.0);
    assert_eq!(c.remaining_tokens(A, ms(500)), Some(1.0));
    // Other nanos: a new bucket; 1.5 s is 1 whole second, so 2 a second
    // again. 1 token of 4 left: 4 * 0.25 = 1, not 0: it starts full.
    assign(
        &mut c,
        A,
        &token_bucket(4, 2, Duration::from_millis(1500)),
        secs(60),
        ms(500),
    );
    assert_eq!(c.token_bucket(A).unwrap().fill_rate(), 2.0);
    assert_eq!(c.remaining_tokens(A, ms(500)), Some(4.0));
}

#[test]
fn a_changed_token_bucket_starts_full_or_empty_by_the_old_ones_ratio() {
    // Envoy computes max_tokens * (remaining / max) of the old bucket as an
    // integer and passes it to AtomicTokenBucketImpl's `bool init_fill`.
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assign(&mut c, A, &token_bucket(8, 8, secs(1)), secs(60), 0);
    for _ in 0..6 {
        assert!(c.request(A, 0));
    }
    assert_eq!(c.remaining_tokens(A, 0), Some(2.0));
    // 4 * (2 / 8) = 1: full.
    assign(&mut c, A, &token_bucket(4, 1, secs(1)), secs(60), 0);
    assert_eq!(c.remaining_tokens(A, 0), Some(4.0));

    assert!(c.request(B, 0));
    assign(&mut c, B, &token_bucket(8, 8, secs(1)), secs(60), 0);
    for _ in 0..7 {
        assert!(c.request(B, 0));
    }
    assert_eq!(c.remaining_tokens(B, 0), Some(1.0));
    // 4 * (1 / 8) = 0.5, truncated 0: empty, filling at 1 a second.
    assign(&mut c, B, &token_bucket(4, 1, secs(1)), secs(60), 0);
    assert_eq!(c.remaining_tokens(B, 0), Some(0.0));
    assert!(!c.request(B, ms(999)));
    assert!(c.request(B, NS));

    // From a blanket rule there is no old bucket: full.
    assign(&mut c, B, &DENY, secs(60), 2 * NS);
    assert_eq!(c.token_bucket(B), None);
    assign(&mut c, B, &token_bucket(4, 1, secs(1)), secs(60), 2 * NS);
    assert_eq!(c.remaining_tokens(B, 2 * NS), Some(4.0));
}

#[test]
fn an_assignment_expires_after_its_whole_seconds_to_the_fallback_then_to_no_assignment() {
    let fallback = (DENY, Duration::from_millis(2900));
    let mut c = client(Blanket::AllowAll, Some(fallback));
    assert!(c.request(A, 0));
    let spec = token_bucket(1, 1, secs(1));
    // TTL 2.9 s is 2 s: expires at 3 s.
    assign(&mut c, A, &spec, Duration::from_millis(2900), NS);
    c.tick(3 * NS - 1);
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(Some(spec))));
    c.tick(3 * NS);
    assert_eq!(c.action(A), Some(CurrentAction::Fallback(DENY)));
    assert_eq!(c.token_bucket(A), None);
    assert!(!c.request(A, 3 * NS));
    // The fallback's 2.9 s is 2 s too: until 5 s.
    c.tick(5 * NS - 1);
    assert_eq!(c.action(A), Some(CurrentAction::Fallback(DENY)));
    assert!(c.request(A, 5 * NS));
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::AllowAll)));
}

#[test]
fn without_a_fallback_an_expired_assignment_goes_to_no_assignment() {
    let mut c = client(Blanket::DenyAll, None);
    assert!(!c.request(A, 0));
    assign(&mut c, A, &ALLOW, Duration::new(10, 999_999_999), NS);
    assert!(c.request(A, 11 * NS - 1));
    assert!(!c.request(A, 11 * NS));
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::DenyAll)));
    assert_eq!(c.totals(A), Counts { allowed: 1, denied: 2 });
}

#[test]
fn a_token_bucket_fallback_keeps_an_equal_expired_bucket() {
    // The fallback fills 1 a second, the assignment a quarter: equal for
    // Envoy (same max, tokens per fill and nanos).
    let mut c = client(Blanket::AllowAll, Some((token_bucket(4, 1, secs(1)), secs(10))));
    assert!(c.request(A, 0));
    assign(&mut c, A, &token_bucket(4, 1, secs(4)), secs(2), 0);
    for _ in 0..4 {
        assert!(c.request(A, 0));
    }
    c.tick(2 * NS);
    assert_eq!(c.action(A), Some(CurrentAction::Fallback(token_bucket(4, 1, secs(1)))));
    assert_eq!(c.token_bucket(A).unwrap().fill_rate(), 0.25);
    assert_eq!(c.remaining_tokens(A, 2 * NS), Some(0.5));
    c.tick(12 * NS);
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::AllowAll)));
    assert_eq!(c.token_bucket(A), None);
}

#[test]
fn the_first_report_is_sent_at_once_with_the_first_request_and_zero_elapsed() {
    let mut c = client(Blanket::DenyAll, None);
    assert_eq!(c.stream(), None);
    assert_eq!(c.next_deadline(), None);
    let t = 7 * NS + 123;
    assert!(!c.request(A, t));
    assert_eq!(sent(&mut c), vec![(0, vec![row(A, 0, 0, 1)])]);
    assert_eq!(c.stream(), Some(0));
    assert_eq!(c.next_deadline(), Some(t + REPORT_INTERVAL_NS));
    assert_eq!(c.unreported(A), Some(Counts::default()));
}

#[test]
fn every_bucket_is_reported_every_5_s_with_whole_seconds_elapsed() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assert!(c.request(A, NS));
    assert!(c.request(A, NS));
    assert!(c.request(B, ms(2700)));
    assert!(c.request(B, ms(4900)));
    assert_eq!(
        sent(&mut c),
        vec![(0, vec![row(A, 0, 1, 0)]), (0, vec![row(B, 0, 1, 0)])]
    );
    c.tick(5 * NS - 1);
    assert_eq!(sent(&mut c), vec![]);
    c.tick(5 * NS);
    // B: 5 - 2.7 = 2.3 s, reported as 2.
    assert_eq!(sent(&mut c), vec![(0, vec![row(A, 5, 2, 0), row(B, 2, 1, 0)])]);
    assert!(c.request(A, 6 * NS));
    // A late tick fires each deadline in turn, at its own time.
    c.tick(17 * NS);
    assert_eq!(
        sent(&mut c),
        vec![
            (0, vec![row(A, 5, 1, 0), row(B, 5, 0, 0)]),
            (0, vec![row(A, 5, 0, 0), row(B, 5, 0, 0)]),
        ]
    );
    assert_eq!(c.next_deadline(), Some(20 * NS));
}

#[test]
fn an_abandoned_bucket_is_forgotten_and_its_next_request_recreates_it() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assign(&mut c, A, &DENY, secs(60), NS);
    assert!(!c.request(A, NS));
    c.receive(&response(vec![abandon(A)]), 2 * NS);
    assert_eq!(c.action(A), None);
    assert_eq!(c.buckets(), Vec::<BucketKey>::new());
    // New again: the no-assignment behaviour and an immediate report; the
    // denial at 1 s went with the abandoned bucket.
    assert!(c.request(A, 3 * NS));
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::AllowAll)));
    assert_eq!(
        sent(&mut c),
        vec![(0, vec![row(A, 0, 1, 0)]), (0, vec![row(A, 0, 1, 0)])]
    );
    c.tick(5 * NS);
    assert_eq!(sent(&mut c), vec![(0, vec![row(A, 2, 0, 0)])]);
    assert_eq!(c.totals(A), Counts { allowed: 2, denied: 1 });
    // With no bucket left the timer still sends a report, empty.
    c.receive(&response(vec![abandon(A)]), 6 * NS);
    c.tick(10 * NS);
    assert_eq!(sent(&mut c), vec![(0, vec![])]);
}

#[test]
fn actions_without_a_bucket_id_or_for_buckets_not_cached_are_dropped() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    let mut no_id = assignment(A, Some(&DENY), Some(secs(60)));
    no_id.bucket_id = None;
    let mut empty_id = assignment(A, Some(&DENY), Some(secs(60)));
    empty_id.bucket_id.as_mut().unwrap().bucket.clear();
    c.receive(
        &response(vec![
            assignment(B, Some(&DENY), Some(secs(60))),
            no_id,
            empty_id,
            abandon(B),
            assignment(A, Some(&DENY), Some(secs(60))),
        ]),
        NS,
    );
    assert_eq!(c.ignored_actions(), 4);
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(Some(DENY))));
    assert_eq!(c.buckets(), vec![bucket_key(A)]);
    // B was never cached: its first request is new.
    assert!(c.request(B, NS));
    assert_eq!(
        sent(&mut c),
        vec![(0, vec![row(A, 0, 1, 0)]), (0, vec![row(B, 0, 1, 0)])]
    );
}

#[test]
fn requests_per_time_unit_and_an_unset_strategy_are_skipped() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    assign(&mut c, A, &DENY, secs(10), 0);
    c.receive(
        &response(vec![
            assignment(A, Some(&Strategy::RequestsPerTimeUnit), Some(secs(100))),
            assignment(A, None, Some(secs(100))),
        ]),
        5 * NS,
    );
    assert_eq!(c.ignored_actions(), 2);
    // The old action stays, and so does its expiry.
    assert!(!c.request(A, 10 * NS - 1));
    assert!(c.request(A, 10 * NS));
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::AllowAll)));
}

#[test]
fn an_action_with_neither_assignment_nor_abandon_fails_open_and_expires_at_once() {
    let mut c = client(Blanket::DenyAll, None);
    assert!(!c.request(A, 0));
    let mut neither = abandon(A);
    neither.bucket_action = None;
    c.receive(&response(vec![neither]), NS);
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(None)));
    assert_eq!(c.next_deadline(), Some(NS));
    c.tick(NS);
    assert_eq!(c.action(A), Some(CurrentAction::NoAssignment(Blanket::DenyAll)));
    assert_eq!(c.ignored_actions(), 0);
}

#[test]
fn a_closed_stream_is_reopened_by_the_next_tick_and_assignments_survive() {
    let mut c = client(Blanket::AllowAll, None);
    assert!(c.request(A, 0));
    let spec = token_bucket(2, 1, secs(1));
    assign(&mut c, A, &spec, secs(3600), NS);
    c.stream_closed();
    assert_eq!(c.stream(), None);
    assert!(c.request(A, 2 * NS));
    // A new bucket's immediate report finds no stream: lost, with its count.
    assert!(c.request(B, 3 * NS));
    assert_eq!(c.dropped_reports(), 1);
    assert_eq!(sent(&mut c), vec![(0, vec![row(A, 0, 1, 0)])]);
    c.tick(5 * NS);
    assert_eq!(sent(&mut c), vec![(1, vec![row(A, 5, 1, 0), row(B, 2, 0, 0)])]);
    assert_eq!(c.stream(), Some(1));
    assert_eq!(c.streams_opened(), 2);
    assert_eq!(c.action(A), Some(CurrentAction::Assigned(Some(spec))));
    assert_eq!(c.remaining_tokens(A, 5 * NS), Some(2.0));
}
