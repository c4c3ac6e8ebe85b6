//! Running one policy over a request stream, in both views.

use crate::oracle::{ExactWindow, max_window_sum};
use crate::traffic::Request;
use serde::Serialize;
use slidegate_core::{Algorithm, LimitState, Policy, State};
use std::collections::HashMap;

/// What one policy did with one request stream, in both views (see the
/// crate docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    /// Requests in the stream.
    pub requests: u64,
    /// Distinct clients in the stream.
    pub clients: u64,
    /// Measurement view: requests that the estimate would admit and the
    /// exact count would refuse. `None` for `gcra`, whose state is not a
    /// window count.
    pub wrongly_allowed: Option<u64>,
    /// Measurement view: requests that the estimate would refuse and the
    /// exact count would admit. `None` for `gcra`.
    pub wrongly_denied: Option<u64>,
    /// Measurement view: the mean of `|estimate − truth| / truth` over the
    /// requests whose true count was above zero. `None` for `gcra`, and when
    /// no request had a non-zero true count.
    pub mean_abs_error: Option<f64>,
    /// Admission view: requests admitted.
    pub admitted: u64,
    /// Admission view: the most units one client got admitted in any window
    /// `(t − W, t]` with `W = policy.effective_window_ns()`.
    pub max_window_admitted: u64,
    /// Admission view: `max_window_admitted / limit`. At most 1.0 means no
    /// client ever got more than its limit in any window.
    pub max_window_ratio: f64,
}

/// One client in the measurement view: every request is counted, admitted
/// or not, in the algorithm's state and in the exact oracle alike.
pub(crate) struct Measured {
    /// Every request recorded.
    state: State,
    /// The exact count of every request.
    truth: ExactWindow,
}

impl Measured {
    /// A fresh state and oracle for `policy`; the oracle counts over
    /// `policy.effective_window_ns()`.
    pub(crate) fn new(policy: &Policy) -> Self {
        Measured {
            state: State::new(policy),
            truth: ExactWindow::new(policy.effective_window_ns()),
        }
    }

    /// The algorithm's estimate of the window and the true count of
    /// `(t − W, t]`, both before the request at `t` is counted; then counts
    /// it in both.
    pub(crate) fn observe(&mut self, policy: &Policy, time_ns: u64, cost: u64) -> (f64, u64) {
        let est = self.state.estimate(policy, time_ns);
        let truth = self.truth.count(time_ns);
        self.state.record(policy, time_ns, cost);
        self.truth.record(time_ns, cost);
        (est, truth)
    }
}

/// One client's states in both views.
struct Client {
    /// Measurement view: every request counted.
    measured: Measured,
    /// Admission view: only admitted requests counted.
    admitting: State,
    /// Admission view: the admitted requests, in time order.
    admitted: Vec<(u64, u64)>,
}

/// Runs `policy` over `requests`, every client with its own states and
/// oracle, and measures both views.
///
/// Requests are taken in the order given, which should be time order (as
/// the traffic models produce).
pub fn evaluate(policy: &Policy, requests: &[Request]) -> Metrics {
    let window = policy.effective_window_ns();
    let limit = policy.limit();
    let measure = !matches!(policy.algorithm(), Algorithm::Gcra { .. });
    // Clients by id: a direct table when the ids are dense (as the traffic
    // models make them), a hash map otherwise.
    let max_id = requests.iter().map(|r| r.client as usize).max().unwrap_or(0);
    let mut table: Vec<Option<Client>> = Vec::new();
    let mut map: HashMap<u32, Client> = HashMap::new();
    if max_id < requests.len().saturating_mul(4).max(1024) {
        table.resize_with(max_id + 1, || None);
    }
    let new_client = || Client {
        measured: Measured::new(policy),
        admitting: State::new(policy),
        admitted: Vec::new(),
    };
    let (mut wrongly_allowed, mut wrongly_denied, mut admitted) = (0u64, 0u64, 0u64);
    let (mut error_sum, mut error_n) = (0.0f64, 0u64);
    for r in requests {
        let c = match table.get_mut(r.client as usize) {
            Some(slot) => slot.get_or_insert_with(new_client),
            None => map.entry(r.client).or_insert_with(new_client),
        };
        if measure {
            let (est, truth) = c.measured.observe(policy, r.time_ns, r.cost);
            let est_allows = est + r.cost as f64 <= limit as f64;
            let truth_allows = truth.saturating_add(r.cost) <= limit;
            match (est_allows, truth_allows) {
                (true, false) => wrongly_allowed += 1,
                (false, true) => wrongly_denied += 1,
                _ => {}
            }
            if truth > 0 {
                error_sum += (est - truth as f64).abs() / truth as f64;
                error_n += 1;
            }
        }
        if c.admitting.check(policy, r.time_ns, r.cost).allowed() {
            admitted += 1;
            c.admitted.push((r.time_ns, r.cost));
        }
    }
    let clients: Vec<&Client> = table.iter().flatten().chain(map.values()).collect();
    let max_window_admitted = clients
        .iter()
        .map(|c| max_window_sum(&c.admitted, window))
        .max()
        .unwrap_or(0);
    Metrics {
        requests: requests.len() as u64,
        clients: clients.len() as u64,
        wrongly_allowed: measure.then_some(wrongly_allowed),
        wrongly_denied: measure.then_some(wrongly_denied),
        mean_abs_error: (measure && error_n > 0).then(|| error_sum / error_n as f64),
        admitted,
        max_window_admitted,
        max_window_ratio: max_window_admitted as f64 / limit as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Traffic, generate};
    use std::time::Duration;

    #[test]
    fn sparse_client_ids_give_the_same_metrics() {
        let policy = Policy::new(10, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
        let dense = generate(Traffic::Clients, &policy, 20_000_000_000, 30, 5).unwrap();
        let sparse: Vec<Request> = dense
            .iter()
            .map(|r| Request {
                client: u32::MAX - r.client * 1_000_003,
                ..*r
            })
            .collect();
        let m = evaluate(&policy, &dense);
        assert_eq!(m.clients, 30);
        assert_eq!(evaluate(&policy, &sparse), m);
    }
}
