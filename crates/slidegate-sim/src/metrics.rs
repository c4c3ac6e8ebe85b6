//! What one policy did with a request stream, in both views ([`Metrics`]),
//! and one client's state in the measurement view.

use crate::oracle::ExactWindow;
use serde::Serialize;
use slidegate_core::{LimitState, Policy, State};

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
    /// Admission view: each client's refused requests, as `(client,
    /// refused)` for the clients with any, by client number (what differs
    /// between algorithms client by client). Not serialised: the rows
    /// carry the totals.
    #[serde(skip)]
    pub refused_by_client: Vec<(u32, u64)>,
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

    /// Events the exact oracle holds (those still inside a later window).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.truth.held()
    }
}
