//! Streaming evaluation: policies fed one request at a time, in memory
//! bounded by the clients and the contents of their windows, never by the
//! length of the stream; and a bounded reorder buffer that puts a nearly
//! sorted stream (an access log) in time order.

use crate::metrics::{Measured, Metrics};
use crate::traffic::Request;
use slidegate_core::{Algorithm, LimitState, Policy, State};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc;

/// Client ids below this are found in a direct table, the others in a hash
/// map (the traffic models and the traces number their clients densely).
const DENSE_IDS: u32 = 1 << 20;

/// One client's states in both views.
struct Client {
    /// Its number.
    id: u32,
    /// Admission view: its requests refused.
    refused: u64,
    /// Measurement view: every request counted.
    measured: Measured,
    /// Admission view: only admitted requests counted.
    admitting: State,
    /// Admission view: the admitted requests still inside the window of the
    /// latest one, oldest first.
    window: VecDeque<(u64, u64)>,
    /// The sum of the costs in `window` (exact: u128).
    window_sum: u128,
}

/// One policy evaluated over a request stream fed one request at a time,
/// in both views (see the crate docs): the streaming form of
/// [`evaluate`](crate::evaluate), which is built on it.
///
/// Its memory grows with the distinct clients and what their windows hold
/// (the exact oracle's events and the admitted requests of the last
/// window), not with the number of requests.
///
/// Requests should come in time order (as the traffic models make them,
/// and as [`Reorder`] releases a log's); out of order, the figures are
/// those of the order given, approximately.
pub struct Evaluation {
    policy: Policy,
    window_ns: u64,
    measure: bool,
    /// Client id → position in `clients` (`u32::MAX`: none), for ids below
    /// [`DENSE_IDS`].
    dense: Vec<u32>,
    /// The same for the larger ids.
    sparse: HashMap<u32, u32>,
    clients: Vec<Client>,
    requests: u64,
    wrongly_allowed: u64,
    wrongly_denied: u64,
    admitted: u64,
    error_sum: f64,
    error_n: u64,
    max_window_admitted: u128,
}

impl Evaluation {
    /// An evaluation of `policy` that has seen no request.
    pub fn new(policy: &Policy) -> Self {
        Evaluation {
            policy: *policy,
            window_ns: policy.effective_window_ns(),
            measure: !matches!(policy.algorithm(), Algorithm::Gcra { .. }),
            dense: Vec::new(),
            sparse: HashMap::new(),
            clients: Vec::new(),
            requests: 0,
            wrongly_allowed: 0,
            wrongly_denied: 0,
            admitted: 0,
            error_sum: 0.0,
            error_n: 0,
            max_window_admitted: 0,
        }
    }

    /// The policy evaluated.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The position of `client`'s states, made on its first request.
    fn slot(&mut self, client: u32) -> usize {
        let next = self.clients.len();
        let known = if client < DENSE_IDS {
            let i = client as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, u32::MAX);
            }
            match self.dense[i] {
                u32::MAX => {
                    self.dense[i] = next as u32;
                    None
                }
                at => Some(at),
            }
        } else {
            match self.sparse.get(&client) {
                Some(&at) => Some(at),
                None => {
                    self.sparse.insert(client, next as u32);
                    None
                }
            }
        };
        match known {
            Some(at) => at as usize,
            None => {
                self.clients.push(Client {
                    id: client,
                    refused: 0,
                    measured: Measured::new(&self.policy),
                    admitting: State::new(&self.policy),
                    window: VecDeque::new(),
                    window_sum: 0,
                });
                next
            }
        }
    }

    /// Takes the next request: `cost` units from `client` at `time_ns`.
    pub fn observe(&mut self, time_ns: u64, client: u32, cost: u64) {
        let (policy, window_ns, measure) = (self.policy, self.window_ns, self.measure);
        let limit = policy.limit();
        let at = self.slot(client);
        let Some(c) = self.clients.get_mut(at) else {
            return;
        };
        self.requests += 1;
        if measure {
            let (est, truth) = c.measured.observe(&policy, time_ns, cost);
            let est_allows = est + cost as f64 <= limit as f64;
            let truth_allows = truth.saturating_add(cost) <= limit;
            match (est_allows, truth_allows) {
                (true, false) => self.wrongly_allowed += 1,
                (false, true) => self.wrongly_denied += 1,
                _ => {}
            }
            if truth > 0 {
                self.error_sum += (est - truth as f64).abs() / truth as f64;
                self.error_n += 1;
            }
        }
        if c.admitting.check(&policy, time_ns, cost).allowed() {
            self.admitted += 1;
            // The busiest window ends at an admitted request: the sum of the
            // admitted costs in `(t − W, t]`, this one included.
            c.window.push_back((time_ns, cost));
            c.window_sum += u128::from(cost);
            if let Some(cutoff) = time_ns.checked_sub(window_ns) {
                while let Some(&(old, cost)) = c.window.front() {
                    if old > cutoff {
                        break;
                    }
                    c.window.pop_front();
                    c.window_sum -= u128::from(cost);
                }
            }
            self.max_window_admitted = self.max_window_admitted.max(c.window_sum);
        } else {
            c.refused += 1;
        }
    }

    /// Takes the next request.
    pub fn observe_request(&mut self, request: &Request) {
        self.observe(request.time_ns, request.client, request.cost);
    }

    /// Requests taken so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The metrics of the requests taken so far.
    pub fn metrics(&self) -> Metrics {
        let limit = self.policy.limit();
        let max_window_admitted = u64::try_from(self.max_window_admitted).unwrap_or(u64::MAX);
        Metrics {
            requests: self.requests,
            clients: self.clients.len() as u64,
            wrongly_allowed: self.measure.then_some(self.wrongly_allowed),
            wrongly_denied: self.measure.then_some(self.wrongly_denied),
            mean_abs_error: (self.measure && self.error_n > 0).then(|| self.error_sum / self.error_n as f64),
            admitted: self.admitted,
            max_window_admitted,
            max_window_ratio: max_window_admitted as f64 / limit as f64,
            refused_by_client: {
                let mut refused: Vec<(u32, u64)> = self
                    .clients
                    .iter()
                    .filter(|c| c.refused > 0)
                    .map(|c| (c.id, c.refused))
                    .collect();
                refused.sort_unstable();
                refused
            },
        }
    }
}

/// Runs `policy` over `requests`, every client with its own states and
/// oracle, and measures both views: an [`Evaluation`] fed every request.
///
/// Requests are taken in the order given, which should be time order (as
/// the traffic models produce).
pub fn evaluate(policy: &Policy, requests: &[Request]) -> Metrics {
    let mut evaluation = Evaluation::new(policy);
    requests.iter().for_each(|r| evaluation.observe_request(r));
    evaluation.metrics()
}

/// Requests per batch handed to the evaluating threads of
/// [`evaluate_stream`].
const BATCH: usize = 8192;

/// Batches in flight to each evaluating thread: the reader waits when they
/// fall this far behind.
const BATCHES_IN_FLIGHT: usize = 4;

/// Evaluates every policy on one request stream that `feed` produces: it
/// is given a sink and calls it with each request, in time order. Gives
/// the metrics of every policy, in the order given (exactly those of
/// [`evaluate`](crate::evaluate) on the same requests), and what `feed`
/// returned.
///
/// Nothing is kept of the stream but batches of a few thousand requests on
/// their way to the evaluating threads: memory is that of the policies'
/// [`Evaluation`]s. With `threads` above one, `feed` runs on the calling
/// thread and the policies are shared out among up to `threads` more,
/// which take the requests in batches through bounded channels.
///
/// # Errors
///
/// `feed`'s error, once the threads have stopped.
pub fn evaluate_stream<R, E>(
    policies: &[Policy],
    threads: usize,
    feed: impl FnOnce(&mut dyn FnMut(Request)) -> Result<R, E>,
) -> Result<(Vec<Metrics>, R), E> {
    let threads = threads.clamp(1, policies.len().max(1));
    if threads == 1 {
        let mut evaluations: Vec<Evaluation> = policies.iter().map(Evaluation::new).collect();
        let mut batch = Vec::with_capacity(BATCH);
        let run = |evaluations: &mut [Evaluation], batch: &[Request]| {
            for e in evaluations {
                batch.iter().for_each(|r| e.observe_request(r));
            }
        };
        let fed = feed(&mut |r| {
            batch.push(r);
            if batch.len() == BATCH {
                run(&mut evaluations, &batch);
                batch.clear();
            }
        })?;
        run(&mut evaluations, &batch);
        return Ok((evaluations.iter().map(Evaluation::metrics).collect(), fed));
    }
    std::thread::scope(|s| {
        let mut senders = Vec::with_capacity(threads);
        let mut workers = Vec::with_capacity(threads);
        let shares = shares(policies, threads);
        for w in 0..threads {
            let (tx, rx) = mpsc::sync_channel::<Arc<Vec<Request>>>(BATCHES_IN_FLIGHT);
            senders.push(tx);
            let mine: Vec<(usize, Evaluation)> = policies
                .iter()
                .enumerate()
                .filter(|&(p, _)| shares[p] == w)
                .map(|(p, policy)| (p, Evaluation::new(policy)))
                .collect();
            workers.push(s.spawn(move || {
                let mut mine = mine;
                while let Ok(batch) = rx.recv() {
                    for (_, e) in &mut mine {
                        batch.iter().for_each(|r| e.observe_request(r));
                    }
                }
                mine.into_iter().map(|(p, e)| (p, e.metrics())).collect::<Vec<_>>()
            }));
        }
        let mut batch = Vec::with_capacity(BATCH);
        let send = |senders: &[mpsc::SyncSender<Arc<Vec<Request>>>], batch: Vec<Request>| {
            let batch = Arc::new(batch);
            for tx in senders {
                // A worker only hangs up when it panicked: the join below
                // passes the panic on.
                let _ = tx.send(Arc::clone(&batch));
            }
        };
        let fed = feed(&mut |r| {
            batch.push(r);
            if batch.len() == BATCH {
                send(&senders, std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
            }
        });
        if fed.is_ok() && !batch.is_empty() {
            send(&senders, batch);
        }
        drop(senders);
        let mut metrics: Vec<(usize, Metrics)> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        let fed = fed?;
        metrics.sort_unstable_by_key(|&(p, _)| p);
        Ok((metrics.into_iter().map(|(_, m)| m).collect(), fed))
    })
}

/// The worker of each policy: the costliest first, each to the worker with
/// the least work so far, so that a worker with the sliding log does not
/// also get the histogram while another idles.
fn shares(policies: &[Policy], threads: usize) -> Vec<usize> {
    // Relative cost of a decision: a check of the log or the histogram
    // takes about three times one of the others (BENCHMARKS.md's criterion
    // table: 68-70 ns against 15-28 ns).
    let cost = |p: &Policy| match p.algorithm() {
        Algorithm::SlidingLog | Algorithm::ExponentialHistogram { .. } => 3,
        _ => 1,
    };
    let mut order: Vec<usize> = (0..policies.len()).collect();
    order.sort_by_key(|&p| Reverse(cost(&policies[p])));
    let mut load = vec![0u32; threads];
    let mut share = vec![0; policies.len()];
    for p in order {
        let w = (0..threads).min_by_key(|&w| load[w]).unwrap_or(0);
        load[w] += cost(&policies[p]);
        share[p] = w;
    }
    share
}

/// How long [`Reorder`] holds records, by default: 60 s of log time.
pub const REORDER_HORIZON_NS: u64 = 60_000_000_000;

/// The most records [`Reorder`] holds, by default.
pub const REORDER_MAX_PENDING: usize = 1_000_000;

/// How a [`Reorder`] buffer holds records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReorderOptions {
    /// A record is held until one at least this much later (in its own
    /// time) has been read.
    pub horizon_ns: u64,
    /// At most this many records are held: past it, the earliest is
    /// released.
    pub max_pending: usize,
}

impl ReorderOptions {
    /// No bound: every record is held to the end, which sorts the whole
    /// stream (in memory that grows with it).
    pub const FULL_SORT: ReorderOptions = ReorderOptions {
        horizon_ns: u64::MAX,
        max_pending: usize::MAX,
    };
}

impl Default for ReorderOptions {
    /// [`REORDER_HORIZON_NS`] and [`REORDER_MAX_PENDING`].
    fn default() -> Self {
        ReorderOptions {
            horizon_ns: REORDER_HORIZON_NS,
            max_pending: REORDER_MAX_PENDING,
        }
    }
}

/// A record held, ordered by time then by arrival.
struct Pending<T> {
    time: i64,
    seq: u64,
    item: T,
}

impl<T> Pending<T> {
    fn key(&self) -> (i64, u64) {
        (self.time, self.seq)
    }
}

impl<T> PartialEq for Pending<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<T> Eq for Pending<T> {}

impl<T> PartialOrd for Pending<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Pending<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// A bounded reorder buffer: puts a nearly sorted stream of timed records
/// (an access log, whose servers write a request when it ends) in time
/// order, in memory bounded by [`ReorderOptions`] rather than by the
/// stream.
///
/// Records are held until one at least `horizon_ns` later has been read, or
/// until more than `max_pending` are held, then released earliest first;
/// records at the same time keep the order they came in. A record earlier
/// than one already released is *late*: it is released at the latest time
/// released instead of its own (it is decided then), and counted in
/// [`Reorder::late`] with how late it was in [`Reorder::max_lateness_ns`].
///
/// In-order records cost O(1); others O(log held).
pub struct Reorder<T> {
    options: ReorderOptions,
    seq: u64,
    /// Records that came in time order, earliest first.
    in_order: VecDeque<Pending<T>>,
    /// The others.
    heap: BinaryHeap<Reverse<Pending<T>>>,
    newest: Option<i64>,
    released: Option<i64>,
    late: u64,
    max_lateness_ns: u64,
}

impl<T> Reorder<T> {
    /// An empty buffer.
    pub fn new(options: ReorderOptions) -> Self {
        Reorder {
            options,
            seq: 0,
            in_order: VecDeque::new(),
            heap: BinaryHeap::new(),
            newest: None,
            released: None,
            late: 0,
            max_lateness_ns: 0,
        }
    }

    /// Takes the record `item` at `time` (nanoseconds, any epoch), and
    /// calls `release` with every record that may go now, in time order.
    pub fn push(&mut self, time: i64, item: T, release: &mut impl FnMut(i64, T)) {
        let time = match self.released {
            Some(latest) if time < latest => {
                self.late += 1;
                let by = u64::try_from(i128::from(latest) - i128::from(time)).unwrap_or(u64::MAX);
                self.max_lateness_ns = self.max_lateness_ns.max(by);
                latest
            }
            _ => time,
        };
        self.seq += 1;
        let pending = Pending {
            time,
            seq: self.seq,
            item,
        };
        match self.in_order.back() {
            Some(back) if back.time > time => self.heap.push(Reverse(pending)),
            _ => self.in_order.push_back(pending),
        }
        self.newest = Some(self.newest.map_or(time, |n| n.max(time)));
        let cutoff = self
            .newest
            .map_or(i128::MIN, |n| i128::from(n) - i128::from(self.options.horizon_ns));
        while let Some(first) = self.peek() {
            if i128::from(first) > cutoff && self.pending() <= self.options.max_pending {
                break;
            }
            self.release_first(release);
        }
    }

    /// Releases every record still held, in time order.
    pub fn finish(&mut self, release: &mut impl FnMut(i64, T)) {
        while self.peek().is_some() {
            self.release_first(release);
        }
    }

    /// The time of the earliest record held.
    fn peek(&self) -> Option<i64> {
        match (self.in_order.front(), self.heap.peek()) {
            (Some(a), Some(Reverse(b))) => Some(a.time.min(b.time)),
            (Some(a), None) => Some(a.time),
            (None, Some(Reverse(b))) => Some(b.time),
            (None, None) => None,
        }
    }

    fn release_first(&mut self, release: &mut impl FnMut(i64, T)) {
        let from_heap = match (self.in_order.front(), self.heap.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (None, Some(_)) => true,
            _ => false,
        };
        let first = if from_heap {
            self.heap.pop().map(|Reverse(p)| p)
        } else {
            self.in_order.pop_front()
        };
        if let Some(p) = first {
            self.released = Some(p.time);
            release(p.time, p.item);
        }
    }

    /// Records held now.
    pub fn pending(&self) -> usize {
        self.in_order.len() + self.heap.len()
    }

    /// Records that came later than an earlier-released one, and were
    /// released at the latest time released.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// The most a late record was earlier than the latest time released
    /// when it came, in nanoseconds (0 when none was late).
    pub fn max_lateness_ns(&self) -> u64 {
        self.max_lateness_ns
    }

    /// The time of the latest record released.
    pub fn latest_released(&self) -> Option<i64> {
        self.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::max_window_sum;
    use crate::{Row, Traffic, generate, run_requests};
    use proptest::prelude::*;
    use slidegate_core::Weighting;
    use std::time::Duration;

    impl Evaluation {
        /// Events held for the clients: the oracles' and the admitted
        /// windows'.
        fn held(&self) -> usize {
            self.clients.iter().map(|c| c.measured.held() + c.window.len()).sum()
        }
    }

    /// The evaluation as it was before streaming: every admitted request
    /// kept, the busiest window found at the end.
    fn reference(policy: &Policy, requests: &[Request]) -> Metrics {
        /// A client's measured state, admission state and admitted requests.
        type Client = (Measured, State, Vec<(u64, u64)>);
        let limit = policy.limit();
        let measure = !matches!(policy.algorithm(), Algorithm::Gcra { .. });
        let mut clients: HashMap<u32, Client> = HashMap::new();
        let (mut wa, mut wd, mut admitted, mut sum, mut n) = (0, 0, 0, 0.0, 0u64);
        let mut refused: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for r in requests {
            let c = clients
                .entry(r.client)
                .or_insert_with(|| (Measured::new(policy), State::new(policy), Vec::new()));
            if measure {
                let (est, truth) = c.0.observe(policy, r.time_ns, r.cost);
                let (est_allows, truth_allows) = (est + r.cost as f64 <= limit as f64, truth + r.cost <= limit);
                match (est_allows, truth_allows) {
                    (true, false) => wa += 1,
                    (false, true) => wd += 1,
                    _ => {}
                }
                if truth > 0 {
                    sum += (est - truth as f64).abs() / truth as f64;
                    n += 1;
                }
            }
            if c.1.check(policy, r.time_ns, r.cost).allowed() {
                admitted += 1;
                c.2.push((r.time_ns, r.cost));
            } else {
                *refused.entry(r.client).or_default() += 1;
            }
        }
        let most = clients
            .values()
            .map(|c| max_window_sum(&c.2, policy.effective_window_ns()))
            .max()
            .unwrap_or(0);
        Metrics {
            requests: requests.len() as u64,
            clients: clients.len() as u64,
            wrongly_allowed: measure.then_some(wa),
            wrongly_denied: measure.then_some(wd),
            mean_abs_error: (measure && n > 0).then(|| sum / n as f64),
            admitted,
            max_window_admitted: most,
            max_window_ratio: most as f64 / limit as f64,
            refused_by_client: refused.into_iter().collect(),
        }
    }

    fn policies(limit: u64, window_ns: u64) -> Vec<Policy> {
        [
            Algorithm::TWO_BUCKETS,
            Algorithm::SlidingWindow {
                buckets: 3,
                weighting: Weighting::Conservative,
            },
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra { burst: 2 },
            Algorithm::ExponentialHistogram { epsilon: 0.1 },
        ]
        .into_iter()
        .map(|a| Policy::new(limit, Duration::from_nanos(window_ns), a).unwrap())
        .collect()
    }

    /// Sorted streams of a few clients, some with sparse ids, with equal
    /// times and costs above one.
    fn streams() -> impl Strategy<Value = Vec<Request>> {
        prop::collection::vec(
            (0u64..400, prop::sample::select(vec![0u32, 1, 2, 7, u32::MAX]), 1u64..4),
            0..120,
        )
        .prop_map(|mut v| {
            v.sort_by_key(|&(t, _, _)| t);
            v.into_iter()
                .map(|(time_ns, client, cost)| Request { time_ns, client, cost })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn streaming_gives_the_rows_of_run_requests(
            requests in streams(), limit in 1u64..6, window in 10u64..200, threads in 1usize..4,
        ) {
            let policies = policies(limit, window);
            let rows = run_requests(&policies, "t", &requests, threads, &|| {});
            let (metrics, fed) = evaluate_stream(&policies, threads, |sink| {
                requests.iter().for_each(|&r| sink(r));
                Ok::<_, ()>(requests.len())
            })
            .unwrap();
            prop_assert_eq!(fed, requests.len());
            let streamed: Vec<Row> = policies.iter().zip(metrics.clone()).map(|(p, m)| Row::new(p, "t", m)).collect();
            prop_assert_eq!(&streamed, &rows);
            for (p, row) in policies.iter().zip(&rows) {
                prop_assert_eq!(row, &Row::new(p, "t", reference(p, &requests)));
            }
            // Each client's refusals, as the reference counts them.
            for (p, m) in policies.iter().zip(&metrics) {
                prop_assert_eq!(&m.refused_by_client, &reference(p, &requests).refused_by_client);
            }
        }

        /// With no bound, the buffer is a stable sort; with any, it
        /// releases in time order, and what it releases late is counted.
        #[test]
        fn reorder_releases_in_time_order(
            times in prop::collection::vec(0i64..100, 0..80), horizon in 0u64..30, max_pending in 1usize..10,
        ) {
            let mut all = Vec::new();
            let mut full = Reorder::new(ReorderOptions::FULL_SORT);
            for (i, &t) in times.iter().enumerate() {
                full.push(t, i, &mut |t, i| all.push((t, i)));
            }
            prop_assert!(all.is_empty());
            full.finish(&mut |t, i| all.push((t, i)));
            let mut sorted: Vec<(i64, usize)> = times.iter().copied().zip(0..).collect();
            sorted.sort_by_key(|&(t, _)| t);
            prop_assert_eq!(&all, &sorted);
            prop_assert_eq!(full.late(), 0);

            let options = ReorderOptions { horizon_ns: horizon, max_pending };
            let mut buffer = Reorder::new(options);
            let mut out = Vec::new();
            let mut late = 0;
            for (i, &t) in times.iter().enumerate() {
                if buffer.latest_released().is_some_and(|r| t < r) {
                    late += 1;
                }
                buffer.push(t, i, &mut |t, i| out.push((t, i)));
                prop_assert!(buffer.pending() <= max_pending);
            }
            buffer.finish(&mut |t, i| out.push((t, i)));
            prop_assert_eq!(buffer.late(), late);
            prop_assert_eq!(out.len(), times.len());
            prop_assert!(out.windows(2).all(|w| w[0].0 <= w[1].0), "{:?}", out);
            // Equal times keep their order.
            prop_assert!(out.windows(2).all(|w| w[0].0 < w[1].0 || w[0].1 < w[1].1), "{:?}", out);
            // A record is released at its own time unless it was late.
            let moved = out.iter().filter(|&&(t, i)| t != times[i]).count() as u64;
            prop_assert_eq!(moved, late);
        }
    }

    #[test]
    fn reorder_holds_up_to_the_horizon() {
        let mut buffer = Reorder::new(ReorderOptions {
            horizon_ns: 10,
            max_pending: 100,
        });
        let mut out = Vec::new();
        // 5 comes after 12, within the horizon: put back in its place.
        for (t, what) in [(0, "a"), (12, "b"), (5, "c"), (5, "d"), (20, "e")] {
            buffer.push(t, what, &mut |t, w| out.push((t, w)));
        }
        // 20 − 10 = 10: what is at or before 10 went.
        assert_eq!(out, [(0, "a"), (5, "c"), (5, "d")]);
        assert_eq!(buffer.pending(), 2);
        // 3 is older than the latest released (5): decided at 5, counted.
        buffer.push(3, "f", &mut |t, w| out.push((t, w)));
        assert_eq!((buffer.late(), buffer.max_lateness_ns()), (1, 2));
        buffer.push(40, "g", &mut |t, w| out.push((t, w)));
        buffer.finish(&mut |t, w| out.push((t, w)));
        assert_eq!(
            out,
            [(0, "a"), (5, "c"), (5, "d"), (5, "f"), (12, "b"), (20, "e"), (40, "g")]
        );
        assert_eq!(buffer.pending(), 0);
    }

    #[test]
    fn reorder_is_bounded_by_its_pending_records() {
        let mut buffer = Reorder::new(ReorderOptions {
            horizon_ns: u64::MAX,
            max_pending: 3,
        });
        let mut out = Vec::new();
        for t in [9, 8, 7, 6, 5] {
            buffer.push(t, (), &mut |t, ()| out.push(t));
            assert!(buffer.pending() <= 3);
        }
        buffer.finish(&mut |t, ()| out.push(t));
        // 6 went when it made four; 5, earlier than it, was decided at 6.
        assert_eq!(out, [6, 6, 7, 8, 9]);
        assert_eq!((buffer.late(), buffer.max_lateness_ns()), (1, 1));
        // Times at the ends of i64 do not overflow.
        let mut buffer = Reorder::new(ReorderOptions::default());
        let mut out = Vec::new();
        for t in [0, i64::MAX, i64::MIN] {
            buffer.push(t, (), &mut |t, ()| out.push(t));
        }
        buffer.finish(&mut |t, ()| out.push(t));
        assert_eq!(out, [0, 0, i64::MAX]);
        assert_eq!((buffer.late(), buffer.max_lateness_ns()), (1, 1 << 63));
    }

    /// A million requests from a generator, never collected: what the
    /// evaluations and the reorder buffer hold stays bounded by the clients
    /// and one window, and does not grow along the stream.
    #[test]
    fn memory_does_not_grow_with_the_stream() {
        const N: u64 = 1_000_000;
        const CLIENTS: u64 = 50;
        let window_ns = 1_000_000_000;
        let policies = policies(20, window_ns);
        // A request every millisecond from a pseudo-random client, logged up
        // to 0.2 s late.
        let mut x: u64 = 1;
        let mut next = move || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            x >> 33
        };
        let requests = (0..N).map(move |i| {
            let r = next();
            let late = if r % 10 == 0 { (r % 200) * 1_000_000 } else { 0 };
            ((i * 1_000_000 + late) as i64, (r % CLIENTS) as u32)
        });
        let mut evaluations: Vec<Evaluation> = policies.iter().map(Evaluation::new).collect();
        let mut buffer = Reorder::new(ReorderOptions {
            horizon_ns: 300_000_000,
            max_pending: 10_000,
        });
        let (mut most_held, mut most_pending, mut released) = (0, 0, 0u64);
        for (i, (time, client)) in requests.enumerate() {
            buffer.push(time, client, &mut |t, client| {
                released += 1;
                for e in &mut evaluations {
                    e.observe(t as u64, client, 1);
                }
            });
            if i % 10_000 == 0 {
                most_held = most_held.max(evaluations.iter().map(Evaluation::held).max().unwrap_or(0));
                most_pending = most_pending.max(buffer.pending());
            }
        }
        buffer.finish(&mut |t, client| {
            released += 1;
            for e in &mut evaluations {
                e.observe(t as u64, client, 1);
            }
        });
        assert_eq!(released, N);
        assert_eq!(buffer.late(), 0, "0.2 s late is within the 0.3 s horizon");
        // One window holds about 1,000 requests: each in an oracle and, if
        // admitted, in an admitted window.
        assert!(most_held <= 2 * 1_300, "{most_held}");
        // The buffer holds about 0.3 s of requests.
        assert!(most_pending <= 400, "{most_pending}");
        for e in &evaluations {
            assert_eq!((e.requests(), e.metrics().clients), (N, CLIENTS));
        }
    }

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
        // The same figures; each client's refusals under its own id.
        let mut renamed: Vec<(u32, u64)> = m
            .refused_by_client
            .iter()
            .map(|&(c, n)| (u32::MAX - c * 1_000_003, n))
            .collect();
        renamed.sort_unstable();
        assert!(!renamed.is_empty());
        assert_eq!(
            evaluate(&policy, &sparse),
            Metrics {
                refused_by_client: renamed,
                ..m
            }
        );
    }
}
