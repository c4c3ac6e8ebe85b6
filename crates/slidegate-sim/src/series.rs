//! Per-request series of the measurement view, for plotting one client's
//! true and estimated counts over time.

use crate::metrics::Measured;
use crate::traffic::Request;
use serde::Serialize;
use slidegate_core::Policy;
use std::collections::HashMap;

/// One request of one client in the measurement view (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    /// The request's time, in nanoseconds since the start of the simulation.
    pub time_ns: u64,
    /// The exact count of the client's window `(t − W, t]` before this
    /// request is counted, with `W = policy.effective_window_ns()`: the
    /// `truth` of the measurement view.
    pub truth: u64,
    /// The algorithm's estimate of the same window, before this request is
    /// counted: the usage a decision at `t` reports as
    /// `Decision::estimate()`. For `gcra`, whose state is not a window count,
    /// it is the GCRA's backlog in units.
    pub estimate: f64,
}

/// The measurement view of one client: one [`Point`] per request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClientSeries {
    /// The client.
    pub client: u32,
    /// One point per request of the client, in the order of the requests.
    pub points: Vec<Point>,
}

/// The measurement view of `policy` over `requests`, point by point, for
/// each client in `clients`: every request is counted, admitted or not, in
/// the algorithm's state and in the exact oracle alike, exactly as
/// [`evaluate`](crate::evaluate) measures it.
///
/// One series per entry of `clients`, in that order (a client listed twice
/// gets the same series twice; a client without requests gets no points).
/// Requests are taken in the order given, which should be time order.
pub fn count_series(policy: &Policy, requests: &[Request], clients: &[u32]) -> Vec<ClientSeries> {
    let mut states: HashMap<u32, (Measured, Vec<Point>)> = clients
        .iter()
        .map(|&c| (c, (Measured::new(policy), Vec::new())))
        .collect();
    for r in requests {
        if let Some((measured, points)) = states.get_mut(&r.client) {
            let (estimate, truth) = measured.observe(policy, r.time_ns, r.cost);
            points.push(Point {
                time_ns: r.time_ns,
                truth,
                estimate,
            });
        }
    }
    clients
        .iter()
        .map(|&client| ClientSeries {
            client,
            points: states.get(&client).map(|(_, p)| p.clone()).unwrap_or_default(),
        })
        .collect()
}

/// The `k` clients with the most requests, most first; ties go to the
/// smaller client id. Fewer than `k` when fewer clients sent requests.
pub fn busiest_clients(requests: &[Request], k: usize) -> Vec<u32> {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for r in requests {
        *counts.entry(r.client).or_default() += 1;
    }
    let mut ranked: Vec<(u32, u64)> = counts.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(k).map(|(client, _)| client).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Traffic, generate};
    use slidegate_core::{Algorithm, LimitState, State, Weighting};
    use std::time::Duration;

    fn policy(algorithm: Algorithm) -> Policy {
        Policy::new(20, Duration::from_secs(1), algorithm).unwrap()
    }

    fn traffic(policy: &Policy) -> Vec<Request> {
        generate(Traffic::Clients, policy, 10_000_000_000, 12, 7).unwrap()
    }

    /// The true count by definition: the costs of the client's earlier
    /// requests in `(t − W, t]`.
    fn brute_truth(requests: &[Request], i: usize, w: u64) -> u64 {
        let r = requests[i];
        requests[..i]
            .iter()
            .filter(|q| q.client == r.client && q.time_ns <= r.time_ns)
            .filter(|q| r.time_ns.checked_sub(w).is_none_or(|cutoff| q.time_ns > cutoff))
            .map(|q| q.cost)
            .sum()
    }

    #[test]
    fn truth_matches_a_brute_force_count() {
        for algorithm in [
            Algorithm::TWO_BUCKETS,
            Algorithm::SlidingWindow {
                buckets: 5,
                weighting: Weighting::Conservative,
            },
            Algorithm::FixedWindow,
        ] {
            let p = policy(algorithm);
            let requests = traffic(&p);
            let clients = busiest_clients(&requests, 3);
            let series = count_series(&p, &requests, &clients);
            assert_eq!(series.len(), 3);
            for s in &series {
                let mine: Vec<usize> = (0..requests.len())
                    .filter(|&i| requests[i].client == s.client)
                    .collect();
                assert!(!mine.is_empty());
                assert_eq!(s.points.len(), mine.len(), "{algorithm:?}");
                for (point, &i) in s.points.iter().zip(&mine) {
                    assert_eq!(point.time_ns, requests[i].time_ns);
                    let truth = brute_truth(&requests, i, p.effective_window_ns());
                    assert_eq!(point.truth, truth, "{algorithm:?}, client {}, request {i}", s.client);
                }
            }
        }
    }

    #[test]
    fn sliding_log_estimates_the_truth() {
        let p = policy(Algorithm::SlidingLog);
        let requests = traffic(&p);
        let clients = busiest_clients(&requests, 4);
        let series = count_series(&p, &requests, &clients);
        let mut points = 0;
        for s in &series {
            for point in &s.points {
                assert_eq!(point.estimate, point.truth as f64, "client {}: {point:?}", s.client);
                points += 1;
            }
        }
        // The busiest clients go over the limit, so the log is tested past it.
        assert!(series.iter().flat_map(|s| &s.points).any(|p| p.truth > 20));
        assert!(points > 100, "{points}");
    }

    #[test]
    fn estimates_are_the_decisions_estimates() {
        // A zero-cost check peeks: its decision reports the estimate the
        // measurement view compares with the truth.
        let p = policy(Algorithm::TWO_BUCKETS);
        let requests = traffic(&p);
        let client = busiest_clients(&requests, 1)[0];
        let series = count_series(&p, &requests, &[client]);
        let mut state = State::new(&p);
        let mut wrong = 0;
        for (r, point) in requests.iter().filter(|r| r.client == client).zip(&series[0].points) {
            assert_eq!(state.check(&p, r.time_ns, 0).estimate(), point.estimate);
            wrong += usize::from(point.estimate != point.truth as f64);
            state.record(&p, r.time_ns, r.cost);
        }
        assert!(wrong > 0, "two buckets should misestimate somewhere");
    }

    #[test]
    fn series_follow_the_clients_listed() {
        let p = policy(Algorithm::TWO_BUCKETS);
        let requests = traffic(&p);
        let series = count_series(&p, &requests, &[3, 999, 3]);
        assert_eq!(series.iter().map(|s| s.client).collect::<Vec<_>>(), [3, 999, 3]);
        assert!(series[1].points.is_empty());
        assert_eq!(series[0], series[2]);
        assert!(count_series(&p, &requests, &[]).is_empty());
        assert!(count_series(&p, &[], &[1])[0].points.is_empty());
    }

    #[test]
    fn busiest_clients_rank_by_requests_then_id() {
        let r = |client| Request {
            time_ns: 0,
            client,
            cost: 1,
        };
        let requests = [r(5), r(2), r(5), r(9), r(2), r(7), r(5)];
        assert_eq!(busiest_clients(&requests, 10), [5, 2, 7, 9]);
        assert_eq!(busiest_clients(&requests, 2), [5, 2]);
        assert_eq!(busiest_clients(&requests, 0), Vec::<u32>::new());
        assert_eq!(busiest_clients(&[], 3), Vec::<u32>::new());
    }
}
