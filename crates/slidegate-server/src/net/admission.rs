//! What the service lets in, so that an attacker or a fault costs only
//! itself: open connections under a cap, calls under an in-flight budget,
//! and each connection kept only while it makes progress.
//!
//! - **Connections**: at most [`ConnectionLimits::max_connections`] open
//!   at once, over both listeners. A connection that comes when they are
//!   all taken takes the place of one without a call in flight, from the
//!   peer address (an IPv6 /64) holding most connections, and never from a
//!   peer holding fewer than its own: first one that never started a call
//!   (the oldest first, closed at once), else the newest of those that did (asked to close with a `GOAWAY`, or closed
//!   after its answer on HTTP/1.1), so that established clients (Envoy's
//!   channels, kept-alive connections) keep their place against a crowd
//!   that reconnects. When every open connection has a call in flight, or
//!   those asked to close have not yet and the cap and an eighth more are
//!   open, the new one is closed at once (shed). Connections that only
//!   trickle bytes therefore come and go while clients that make calls
//!   stay.
//! - **Progress**: a connection must start its first call within the
//!   header timeout of opening, and then another within the idle timeout
//!   of the last one started (unless one is in flight); bytes alone (HTTP/2
//!   `PING`s, `SETTINGS`, half a request) do not keep it. It is then asked
//!   to close (`GOAWAY`), and dropped if it has not within the request
//!   timeout. With [`ConnectionLimits::max_age`] a connection is also
//!   asked to close at that age, as gRPC's `max_connection_age` does.
//! - **Calls**: at most [`ConnectionLimits::max_in_flight`] calls in
//!   flight over every connection; past it a new call is answered at once
//!   (HTTP 503, gRPC `RESOURCE_EXHAUSTED`) and counted, rather than
//!   queued without bound.
//!
//! Per connection, HTTP/2 allows [`ConnectionLimits::max_streams`]
//! concurrent streams, each with a 64 KiB flow-control window (see
//! `crate::net::conn::serve_grpc`), so that what one connection can make the
//! process hold is bounded too.
//!
//! # Concurrency
//!
//! The table of connections is one mutex, taken when a connection opens
//! or closes (and scanned only when full); a call touches only its own
//! connection's atomics and the global in-flight count.

use crate::api::rlqs::StreamHold;
use crate::log_limit::LogLimit;
pub use crate::metrics::AdmissionStats;
use crate::metrics::ConnectionStats;
use parking_lot::Mutex;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The default cap on concurrent HTTP/2 streams per connection (hyper's
/// own default is 200; gRPC clients and Envoy open another connection
/// when one is full).
pub const DEFAULT_MAX_STREAMS: u32 = 100;

/// The default budget of calls in flight, over every connection.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4096;

/// The most connections the default cap allows, whatever the descriptor
/// limit.
const MOST_DEFAULT_CONNECTIONS: usize = 16_384;

/// Descriptors kept for everything but client connections (listeners,
/// the runtime's, Redis, config files, logs), and the least cap derived.
const RESERVED_DESCRIPTORS: u64 = 32;

/// Bounds on what connections and calls may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// The most connections open at once, HTTP and gRPC together.
    pub max_connections: usize,
    /// The most concurrent streams of one HTTP/2 (gRPC) connection.
    pub max_streams: u32,
    /// The most calls in flight at once, HTTP and gRPC together.
    pub max_in_flight: usize,
    /// A connection this old is asked to close (`GOAWAY`), its calls in
    /// flight finishing; `None` never.
    pub max_age: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: default_max_connections(descriptor_limit()),
            max_streams: DEFAULT_MAX_STREAMS,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_age: None,
        }
    }
}

/// The process's limit on open file descriptors (the soft limit of
/// `RLIMIT_NOFILE`, as `/proc/self/limits` gives it); `None` where it
/// cannot be read, or is unlimited.
pub fn descriptor_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The default connection cap for a descriptor limit: what is left after
/// a reserve of 32 descriptors and an eighth of the rest (connections
/// being made, files, Redis), at least 8 and at most 16,384; 1,024
/// connections when the limit is unknown.
pub fn default_max_connections(descriptors: Option<u64>) -> usize {
    let Some(limit) = descriptors else {
        return 1024;
    };
    let usable = limit.saturating_sub(RESERVED_DESCRIPTORS);
    let cap = usable - usable / 8;
    usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .clamp(8, MOST_DEFAULT_CONNECTIONS)
}

/// How a connection is to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Close {
    /// At once: it never started a call, and its place is wanted.
    Now,
    /// Gracefully (`GOAWAY`; HTTP/1.1: after the answer in flight), then
    /// dropped if it has not closed within the grace.
    Graceful(Reason),
}

/// Why a connection was asked to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// No call started in time.
    Idle,
    /// Its place was wanted by a new connection.
    Evicted,
    /// It reached the maximum age.
    Age,
}

/// One open connection's progress.
pub(crate) struct Conn {
    opened: Instant,
    /// Where it comes from (an IPv6 address's /64), if known.
    peer: Option<IpAddr>,
    /// When the last call started, in nanoseconds after `opened`, plus 1
    /// (0: none yet).
    last_call: AtomicU64,
    in_flight: AtomicU32,
    /// Chosen to make room: how (`CLOSE_*`).
    doomed: AtomicU32,
    wake: Notify,
}

const CLOSE_NONE: u32 = 0;
const CLOSE_NOW: u32 = 1;
const CLOSE_GRACEFUL: u32 = 2;

impl Conn {
    fn new(opened: Instant, peer: Option<IpAddr>) -> Self {
        Conn {
            opened,
            peer,
            last_call: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            doomed: AtomicU32::new(CLOSE_NONE),
            wake: Notify::new(),
        }
    }

    /// A call starts.
    fn begin(&self) {
        let since = Instant::now().saturating_duration_since(self.opened);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1);
        self.last_call.store(nanos + 1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// When the last call started, if one has.
    fn last_call(&self) -> Option<Instant> {
        match self.last_call.load(Ordering::Relaxed) {
            0 => None,
            n => self.opened.checked_add(Duration::from_nanos(n - 1)),
        }
    }

    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
    }

    /// Resolves when the connection must close, and how: made room for,
    /// no call started in time (its first within `first` of opening, then
    /// each within `idle` of the last, none in flight), or `max_age`.
    pub(crate) async fn watch(&self, first: Duration, idle: Duration, max_age: Option<Duration>) -> Close {
        let aged = max_age.and_then(|age| self.opened.checked_add(age));
        loop {
            let wake = self.wake.notified();
            match self.doomed.load(Ordering::Acquire) {
                CLOSE_NOW => return Close::Now,
                CLOSE_GRACEFUL => return Close::Graceful(Reason::Evicted),
                _ => {}
            }
            let now = Instant::now();
            if aged.is_some_and(|at| at <= now) {
                return Close::Graceful(Reason::Age);
            }
            let quiet_until = match self.last_call() {
                None => self.opened.checked_add(first),
                Some(last) => last.checked_add(idle),
            };
            let quiet_until = quiet_until.unwrap_or(now + idle);
            let next = if quiet_until > now {
                quiet_until
            } else if self.idle() {
                return Close::Graceful(Reason::Idle);
            } else {
                // A call in flight: look again after another idle period
                // (calls are bounded by the request timeout).
                now + idle
            };
            let next = aged.map_or(next, |at| at.min(next));
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = wake => {}
            }
        }
    }
}

#[derive(Default)]
struct Counters {
    shed: AtomicU64,
    evicted: AtomicU64,
    idle: AtomicU64,
    aged: AtomicU64,
    protocol_errors: AtomicU64,
    calls_shed: AtomicU64,
    accept_errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The open connections and the calls in flight, shared by both
/// listeners (see the module's docs).
pub(crate) struct Admission {
    limits: ConnectionLimits,
    table: Mutex<Table>,
    in_flight: AtomicUsize,
    counters: Counters,
    protocol_log: LogLimit,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: foldhash::HashMap<u64, Arc<Conn>>,
    /// Open connections already asked to make room (not counted against
    /// the cap while they close).
    doomed: usize,
}

impl Admission {
    pub(crate) fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Admission {
            limits,
            table: Mutex::new(Table::default()),
            in_flight: AtomicUsize::new(0),
            counters: Counters::default(),
            protocol_log: LogLimit::new(Duration::from_secs(10)),
        })
    }

    pub(crate) fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// A connection just accepted, opened at `opened`, from `peer`: its
    /// ticket if it may stay, room made for it as the module's docs say;
    /// `None` if it is to be closed at once (counted as shed).
    pub(crate) fn admit(self: &Arc<Self>, opened: Instant, peer: Option<IpAddr>) -> Option<Ticket> {
        let peer = peer.map(group);
        let max = self.limits.max_connections.max(1);
        let mut table = self.table.lock();
        // Those asked to make room may not have closed yet: past the cap
        // and an eighth, no more descriptors are taken but for a peer
        // holding fewer than another (which then closes one at once).
        let hard = table.open.len() >= max.saturating_add(max / 8).saturating_add(2);
        if hard || table.open.len().saturating_sub(table.doomed) >= max {
            match Self::victim(&table, peer, opened, hard) {
                Some((victim, how)) => {
                    victim.doomed.store(how, Ordering::Release);
                    victim.wake.notify_one();
                    table.doomed += 1;
                    bump(&self.counters.evicted);
                }
                None => {
                    drop(table);
                    bump(&self.counters.shed);
                    return None;
                }
            }
        }
        let id = table.next;
        table.next += 1;
        let conn = Arc::new(Conn::new(opened, peer));
        table.open.insert(id, Arc::clone(&conn));
        drop(table);
        Some(Ticket {
            admission: Arc::clone(self),
            id,
            conn,
        })
    }

    /// The connection to close for one from `peer` opened at `opened`, and
    /// how. Only from a peer holding at least as many connections as
    /// `peer` (a crowd from one address takes its own places, never those
    /// of a peer holding fewer), the peer holding most first; then one
    /// without a call in flight, never called (the oldest first: it had the
    /// longest to start one, closed at once), else the newest of those that
    /// called (established clients keep their place against a crowd that
    /// reconnects; asked to close). When `peer` holds fewer than the
    /// heaviest peer and that peer's connections are all busy, or `hard`
    /// (no descriptor to spare), the heaviest peer's newest connection is
    /// closed at once, its call in flight with it: its crowd pays, not the
    /// newcomer. Otherwise, with none idle, none (the newcomer is shed).
    fn victim(table: &Table, peer: Option<IpAddr>, opened: Instant, hard: bool) -> Option<(Arc<Conn>, u32)> {
        let live = || {
            table
                .open
                .values()
                .filter(|c| c.doomed.load(Ordering::Relaxed) == CLOSE_NONE)
        };
        let mut held = foldhash::HashMap::<Option<IpAddr>, usize>::default();
        for c in live() {
            *held.entry(c.peer).or_default() += 1;
        }
        let count = |c: &Conn| held.get(&c.peer).copied().unwrap_or(0);
        let own = held.get(&peer).copied().unwrap_or(0);
        let heaviest = held.values().copied().max().unwrap_or(0);
        let age = |c: &Conn| i128::try_from(opened.saturating_duration_since(c.opened).as_nanos()).unwrap_or(i128::MAX);
        let lighter = own < heaviest;
        if !hard {
            let idle = live()
                .filter(|c| c.idle() && count(c) >= own)
                .min_by_key(|c| match c.last_call() {
                    None => (std::cmp::Reverse(count(c)), 0, -age(c)),
                    Some(_) => (std::cmp::Reverse(count(c)), 1, age(c)),
                });
            if let Some(c) = idle.filter(|c| !lighter || count(c) > own) {
                let how = if c.last_call().is_none() {
                    CLOSE_NOW
                } else {
                    CLOSE_GRACEFUL
                };
                return Some((Arc::clone(c), how));
            }
        }
        if !lighter {
            return None;
        }
        live()
            .filter(|c| count(c) == heaviest)
            .min_by_key(|c| age(c))
            .map(|c| (Arc::clone(c), CLOSE_NOW))
    }

    /// Counts how a connection was asked to close (eviction is counted
    /// when chosen).
    pub(crate) fn closed(&self, how: Close) {
        match how {
            Close::Graceful(Reason::Idle) => bump(&self.counters.idle),
            Close::Graceful(Reason::Age) => bump(&self.counters.aged),
            Close::Now | Close::Graceful(Reason::Evicted) => {}
        }
    }

    /// Counts a connection ended by an HTTP/2 protocol error; `Some(n)`
    /// when a line is to be logged (one per 10 s at most), `n` such
    /// connections not logged since the last.
    pub(crate) fn protocol_error(&self) -> Option<u64> {
        bump(&self.counters.protocol_errors);
        self.protocol_log.hit(Instant::now().into_std())
    }

    /// Counts a failed `accept`.
    pub(crate) fn accept_error(&self) {
        bump(&self.counters.accept_errors);
    }

    /// What was counted, and what is open and in flight now.
    pub(crate) fn stats(&self) -> AdmissionStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        let open = self.table.lock().open.len();
        AdmissionStats {
            open: open as u64,
            shed: get(&c.shed),
            evicted: get(&c.evicted),
            idle: get(&c.idle),
            aged: get(&c.aged),
            protocol_errors: get(&c.protocol_errors),
            in_flight: self.in_flight.load(Ordering::Relaxed) as u64,
            calls_shed: get(&c.calls_shed),
            accept_errors: get(&c.accept_errors),
        }
    }

    /// Takes a place in the in-flight budget, if one is left.
    fn try_begin(&self) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if before < self.limits.max_in_flight {
            true
        } else {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            bump(&self.counters.calls_shed);
            false
        }
    }

    fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An admitted connection's place in the table, given back on drop.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    conn: Arc<Conn>,
}

impl Ticket {
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// `service`, each of its calls counted on this connection and in the
    /// in-flight budget; past the budget a call is answered `overloaded()`.
    pub(crate) fn track<S, R>(&self, service: S, overloaded: fn() -> R) -> Tracked<S, R> {
        Tracked {
            inner: service,
            conn: Arc::clone(&self.conn),
            admission: Arc::clone(&self.admission),
            overloaded,
            streams: None,
        }
    }
}

impl<S, R> Tracked<S, R> {
    /// Calls whose path `streams` picks are streams that outlive their
    /// answer's headers: each request carries a [`StreamHold`] for its
    /// handler to keep for as long as the stream lasts, during which the
    /// connection is not idle (it is not asked to close for want of calls).
    pub(crate) fn holding(mut self, streams: fn(&str) -> bool) -> Self {
        self.streams = Some(streams);
        self
    }
}

/// A stream's hold on its connection ([`StreamHold`]): counted on the
/// connection only, not in the in-flight budget, which long streams would
/// otherwise spend; ended when the last clone of its [`StreamHold`] drops.
struct Held(Arc<Conn>);

/// A [`StreamHold`] on `conn`.
fn hold(conn: &Arc<Conn>) -> StreamHold {
    conn.in_flight.fetch_add(1, Ordering::Relaxed);
    StreamHold::new(Arc::new(Held(Arc::clone(conn))))
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut table = self.admission.table.lock();
        if table.open.remove(&self.id).is_some() && self.conn.doomed.load(Ordering::Relaxed) != CLOSE_NONE {
            table.doomed = table.doomed.saturating_sub(1);
        }
    }
}

/// A connection's service, its calls counted (see [`Ticket::track`]).
pub(crate) struct Tracked<S, R> {
    inner: S,
    conn: Arc<Conn>,
    admission: Arc<Admission>,
    overloaded: fn() -> R,
    /// Which paths are streams that hold the connection.
    streams: Option<fn(&str) -> bool>,
}

impl<S, R: Unpin, B> hyper::service::Service<http::Request<B>> for Tracked<S, R>
where
    S: hyper::service::Service<http::Request<B>, Response = R>,
    S::Future: Unpin,
{
    type Response = R;
    type Error = S::Error;
    type Future = Counted<S::Future, R>;

    fn call(&self, mut request: http::Request<B>) -> Self::Future {
        if !self.admission.try_begin() {
            return Counted::Refused(Some((self.overloaded)()));
        }
        self.conn.begin();
        if self.streams.is_some_and(|streams| streams(request.uri().path())) {
            request.extensions_mut().insert(hold(&self.conn));
        }
        Counted::Running {
            call: self.inner.call(request),
            _guard: CallGuard {
                conn: Arc::clone(&self.conn),
                admission: Arc::clone(&self.admission),
            },
        }
    }
}

/// Ends a call's count when dropped (answered, or the stream reset).
pub(crate) struct CallGuard {
    conn: Arc<Conn>,
    admission: Arc<Admission>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.conn.end();
        self.admission.end();
    }
}

/// A counted call, or the answer to one refused for want of budget.
pub(crate) enum Counted<F, R> {
    Running { call: F, _guard: CallGuard },
    Refused(Option<R>),
}

impl<F, R: Unpin, E> Future for Counted<F, R>
where
    F: Future<Output = Result<R, E>> + Unpin,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R, E>> {
        match self.get_mut() {
            Counted::Running { call, .. } => Pin::new(call).poll(cx),
            Counted::Refused(answer) => match answer.take() {
                Some(answer) => Poll::Ready(Ok(answer)),
                None => Poll::Pending,
            },
        }
    }
}

/// A peer's address as connections are counted by: an IPv4 address
/// whole, an IPv6 address by its /64 (what one host is usually given).
fn group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Whether `error` (a connection's, from hyper) is an HTTP/2 protocol
/// error: the peer broke the protocol, or tripped one of h2's defences
/// (too many resets, `ENHANCE_YOUR_CALM`).
pub(crate) fn is_protocol_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2
                .reason()
                .is_some_and(|r| r != h2::Reason::NO_ERROR && r != h2::Reason::CANCEL);
        }
        source = e.source();
    }
    false
}

impl ConnectionStats for Admission {
    fn connection_stats(&self) -> AdmissionStats {
        self.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_in_flight: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            max_streams: DEFAULT_MAX_STREAMS,
            max_in_flight,
            max_age: None,
        }
    }

    #[test]
    fn the_default_cap_follows_the_descriptor_limit() {
        assert_eq!(default_max_connections(Some(64)), 28);
        assert_eq!(default_max_connections(Some(1024)), 868);
        assert_eq!(default_max_connections(Some(10)), 8);
        assert_eq!(default_max_connections(Some(1 << 20)), MOST_DEFAULT_CONNECTIONS);
        assert_eq!(default_max_connections(None), 1024);
        // This process's limit is readable here (Linux).
        assert!(descriptor_limit().is_some_and(|n| n > 0));
    }

    /// A stream (the quota service's) keeps its connection from idling
    /// for as long as it lasts, though its call was answered long ago.
    #[tokio::test(start_paused = true)]
    async fn a_stream_keeps_its_connection_until_it_ends() {
        let admission = Admission::new(limits(8, 10));
        let ticket = admission.admit(Instant::now(), None).unwrap();
        ticket.conn().begin();
        let held = hold(ticket.conn());
        // The call is answered (its headers): the stream goes on.
        ticket.conn().end();
        let idle = Duration::from_secs(60);
        let watch = ticket.conn().watch(Duration::from_secs(10), idle, None);
        tokio::pin!(watch);
        assert!(tokio::time::timeout(idle * 10, &mut watch).await.is_err());
        // Held in the admission's in-flight budget? No: only the connection.
        assert_eq!(admission.stats().in_flight, 0);
        drop(held);
        assert_eq!(watch.await, Close::Graceful(Reason::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_closes_a_connection_that_never_called_first() {
        let admission = Admission::new(limits(2, 10));
        let t0 = Instant::now();
        let caller = admission.admit(t0, None).unwrap();
        caller.conn().begin();
        caller.conn().end();
        tokio::time::advance(Duration::from_secs(1)).await;
        let silent = admission.admit(Instant::now(), None).unwrap();
        // Full: the silent one (never called) makes room, though it is
        // newer than the caller.
        let third = admission.admit(Instant::now(), None).unwrap();
        assert_eq!(silent.conn().doomed.load(Ordering::Relaxed), CLOSE_NOW);
        assert_eq!(caller.conn().doomed.load(Ordering::Relaxed), CLOSE_NONE);
        let closing = silent
            .conn()
            .watch(Duration::from_secs(10), Duration::from_secs(60), None);
        assert_eq!(closing.await, Close::Now);
        drop(silent);
        // Full again, and both left have called: the newest is asked to
        // close gracefully, the established one keeps its place.
        third.conn().begin();
        third.conn().end();
        let _fourth = admission.admit(Instant::now(), None).unwrap();
        assert_eq!(third.conn().doomed.load(Ordering::Relaxed), CLOSE_GRACEFUL);
        assert_eq!(caller.conn().doomed.load(Ordering::Relaxed), CLOSE_NONE);
        assert_eq!(admission.stats().evicted, 2);
        assert_eq!(
            admission.stats().open,
            3,
            "the doomed one counts as open until it closes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_cap_and_an_eighth_stay_open_while_closing() {
        let admission = Admission::new(limits(8, 10));
        let tickets: Vec<_> = (0..11).map(|_| admission.admit(Instant::now(), None)).collect();
        // 8, then 3 more making room (1 + 8 / 8 + 2 = 11 open at most).
        assert!(tickets.iter().all(Option::is_some));
        assert!(admission.admit(Instant::now(), None).is_none());
        assert_eq!((admission.stats().evicted, admission.stats().shed), (3, 1));
        drop(tickets);
        assert_eq!(admission.stats().open, 0);
        assert!(admission.admit(Instant::now(), None).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_crowd_from_one_address_takes_only_its_own_places() {
        let admission = Admission::new(limits(5, 10));
        let (client, crowd) = (Some(IpAddr::from([10, 0, 0, 1])), Some(IpAddr::from([10, 0, 0, 2])));
        let kept = admission.admit(Instant::now(), client).unwrap();
        kept.conn().begin();
        kept.conn().end();
        let mut tickets = Vec::new();
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(1)).await;
            if let Some(t) = admission.admit(Instant::now(), crowd) {
                tickets.push(t);
            }
            // Those asked to make room close.
            tickets.retain(|t: &Ticket| t.conn().doomed.load(Ordering::Relaxed) == CLOSE_NONE);
        }
        assert_eq!(kept.conn().doomed.load(Ordering::Relaxed), CLOSE_NONE);
        // A newcomer from the client's address makes room in the crowd's,
        // though the client's connection is the oldest idle one.
        let second = admission.admit(Instant::now(), client).unwrap();
        assert_eq!(kept.conn().doomed.load(Ordering::Relaxed), CLOSE_NONE);
        tickets.retain(|t: &Ticket| t.conn().doomed.load(Ordering::Relaxed) == CLOSE_NONE);
        // The crowd's connections all busy, and no descriptor to spare:
        // the newcomer from the lighter address still gets in, one of the
        // crowd's closed at once.
        for t in &tickets {
            t.conn().begin();
        }
        let crowded: Vec<_> = (0..3).filter_map(|_| admission.admit(Instant::now(), crowd)).collect();
        assert!(crowded.is_empty(), "the crowd's own newcomers are shed");
        let third = admission.admit(Instant::now(), client).unwrap();
        assert_eq!(
            tickets
                .iter()
                .filter(|t| t.conn().doomed.load(Ordering::Relaxed) == CLOSE_NOW)
                .count(),
            1
        );
        for c in [&kept, &second, &third] {
            assert_eq!(c.conn().doomed.load(Ordering::Relaxed), CLOSE_NONE);
        }
        // IPv6 peers count by their /64.
        let a = group("2001:db8::1".parse().unwrap());
        assert_eq!(a, group("2001:db8::ffff:1".parse().unwrap()));
        assert_ne!(a, group("2001:db8:0:1::1".parse().unwrap()));
        assert_eq!(group("::ffff:10.0.0.1".parse().unwrap()), IpAddr::from([10, 0, 0, 1]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_of_busy_connections_sheds_the_new_one() {
        let admission = Admission::new(limits(1, 10));
        let busy = admission.admit(Instant::now(), None).unwrap();
        busy.conn().begin();
        assert!(admission.admit(Instant::now(), None).is_none());
        assert_eq!(admission.stats().shed, 1);
        busy.conn().end();
        let _next = admission.admit(Instant::now(), None).expect("idle now: it makes room");
        assert_eq!(busy.conn().doomed.load(Ordering::Relaxed), CLOSE_GRACEFUL);
        drop(busy);
        assert_eq!(admission.stats().open, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_must_start_calls_in_time() {
        let admission = Admission::new(limits(10, 10));
        let (first, idle) = (Duration::from_secs(10), Duration::from_secs(60));
        let ticket = admission.admit(Instant::now(), None).unwrap();
        let conn = Arc::clone(ticket.conn());
        let start = Instant::now();
        // No call: closed at the first-call deadline.
        assert_eq!(conn.watch(first, idle, None).await, Close::Graceful(Reason::Idle));
        assert_eq!(start.elapsed(), first);
        // A call at 10 s: the next deadline is 60 s after it.
        conn.begin();
        conn.end();
        assert_eq!(conn.watch(first, idle, None).await, Close::Graceful(Reason::Idle));
        assert_eq!(start.elapsed(), first + idle);
        // A call in flight keeps it open past the idle timeout.
        conn.begin();
        let watching = tokio::spawn({
            let conn = Arc::clone(&conn);
            async move { conn.watch(first, idle, None).await }
        });
        tokio::time::advance(idle * 3).await;
        assert!(!watching.is_finished());
        conn.end();
        tokio::time::advance(idle).await;
        assert_eq!(watching.await.unwrap(), Close::Graceful(Reason::Idle));
        // The maximum age comes first when it is shorter.
        let young = admission.admit(Instant::now(), None).unwrap();
        young.conn().begin();
        let aged = young.conn().watch(first, idle, Some(Duration::from_secs(5))).await;
        assert_eq!(aged, Close::Graceful(Reason::Age));
    }

    /// A service whose calls never end.
    struct Pending;

    impl hyper::service::Service<http::Request<()>> for Pending {
        type Response = u8;
        type Error = ();
        type Future = std::future::Pending<Result<u8, ()>>;

        fn call(&self, _: http::Request<()>) -> Self::Future {
            std::future::pending()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_past_the_budget_are_answered_at_once() {
        use hyper::service::Service as _;
        let admission = Admission::new(limits(10, 2));
        let ticket = admission.admit(Instant::now(), None).unwrap();
        let service = ticket.track(Pending, || 7);
        let a = service.call(http::Request::new(()));
        let b = service.call(http::Request::new(()));
        assert_eq!(admission.stats().in_flight, 2);
        assert_eq!(service.call(http::Request::new(())).await, Ok(7));
        assert_eq!(admission.stats().calls_shed, 1);
        drop(a);
        assert_eq!(admission.stats().in_flight, 1);
        drop(b);
        assert_eq!(admission.stats().in_flight, 0);
        assert_eq!(ticket.conn().in_flight.load(Ordering::Relaxed), 0);
    }
}
