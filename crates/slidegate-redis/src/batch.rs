//! Coalescing: the requests that arrive while a script call is in flight
//! on their lane (the server, or a Cluster hash slot) wait, and go
//! together in the next call, which decides each in the order it came.

use crate::{Function, RedisStoreError};
use parking_lot::Mutex;
use redis::{Cmd, RedisError, RedisWrite, Script, ToRedisArgs};
use slidegate_store::StoreError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// How a [`RedisStore`](crate::RedisStore) groups requests into script
/// calls.
///
/// A request that finds no call in flight on its lane is sent at once, on
/// its own: an idle store adds no wait. While a call is in flight, the
/// requests of its lane wait, and go together in the next call (at most
/// [`MAX_BATCH`]; before forming it the lane's task yields to the runtime,
/// up to four times until as many wait as the last call carried, so that
/// callers answered by the last call who come back at once join it), one
/// script run that decides each in the order it
/// arrived, each exactly and atomically as if alone, reading the server's
/// `TIME` once for all and each hash state once (and writing it once) for
/// all the requests on its key; a run of decisions alike (one key, one
/// `fixed_window`, `sliding_window` or `gcra` limit, the same time and
/// cost: a hot key's on the server's clock) costs the script about what one
/// request does, whatever its length, and when it is the whole call it goes
/// to the leaner [`scripts::ONE`](crate::scripts::ONE), which reads the
/// state a few times (the first decision, the first refusal) and writes
/// the passes at once. So the busier a key or a server, the
/// fewer calls Redis runs per decision (`BENCHMARKS.md` has the figures).
/// A call that fails fails every request in it, and writes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Batching {
    /// One call per request, each sent at once.
    Off,
    /// The requests on keys of one Redis Cluster hash slot (every request
    /// on a hot key, among others) share calls. Safe on any connection:
    /// the default of [`RedisStore::new`](crate::RedisStore::new) and of
    /// [`RedisStore::connect_cluster`](crate::RedisStore::connect_cluster).
    #[default]
    PerSlot,
    /// All the requests share calls, whatever their keys: for a connection
    /// to one server ([`RedisStore::connect`](crate::RedisStore::connect),
    /// [`RedisStore::connect_sentinel`](crate::RedisStore::connect_sentinel));
    /// never for a Cluster, which refuses a script whose keys cross slots.
    PerServer,
}

impl Batching {
    /// How many lanes the store keeps.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Batching::Off => 0,
            Batching::PerSlot => 16384,
            Batching::PerServer => 1,
        }
    }
}

/// The most requests in one script call: 64.
pub const MAX_BATCH: usize = 64;

/// One argument of a script call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Arg {
    Int(i64),
    Str(&'static str),
}

impl ToRedisArgs for Arg {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Int(x) => x.write_redis_args(out),
            Arg::Str(s) => s.write_redis_args(out),
        }
    }
}

/// One request's part of a script call, as `scripts/batch.lua` takes it:
/// its keys and its shape (the mode, the number of limits, and each
/// limit's algorithm and figures), sent once for all the requests of a
/// call that share them; its time and its cost under each limit; how many
/// integers its reply has; and the range of slots whose backoff it follows.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) keys: Vec<String>,
    pub(crate) shape: Vec<Arg>,
    pub(crate) now: i64,
    pub(crate) costs: Vec<i64>,
    pub(crate) reply_len: usize,
    pub(crate) range: usize,
    pub(crate) lane: usize,
}

/// The runs of `calls`: how many requests alike (the same keys, shape,
/// time and costs) follow one another, from the first. `scripts/batch.lua`
/// decides a run of decisions on one limit at once.
fn runs(calls: &[Call]) -> Vec<usize> {
    let mut runs: Vec<usize> = Vec::new();
    let mut prev: Option<&Call> = None;
    for call in calls {
        let alike = prev.is_some_and(|p| {
            p.now == call.now && p.costs == call.costs && p.shape == call.shape && p.keys == call.keys
        });
        match runs.last_mut() {
            Some(m) if alike => *m += 1,
            _ => runs.push(1),
        }
        prev = Some(call);
    }
    runs
}

/// Whether `scripts/run.lua` decides a run of more than one decision at
/// `cost` under this limit in closed form: at a cost, but for a `gcra`
/// whose burst exceeds its limit (its remaining is then cut to the limit,
/// which the closed form does not follow). Other runs go request by
/// request, which [`scripts::MULTI`](crate::scripts::MULTI) does on its
/// hash cache and [`scripts::ONE`](crate::scripts::ONE) would do with a
/// read and a write of the state per request. (A run of `sliding_window`
/// decisions before the ring's newest bucket, a clock gone back, is in
/// closed form too: judged at the newest's start, every bucket of the
/// ring weighs whole.)
fn in_closed_form(kind: &str, figures: &[Arg], cost: i64) -> bool {
    let cut = kind == "g" && matches!(figures, [_, Arg::Int(burst), Arg::Int(limit), ..] if burst > limit);
    cost > 0 && !cut
}

/// A script call ready to send: its command (`FCALL` of the script's
/// Redis function, or `EVALSHA` of the script), the function (for an
/// `FCALL`) to load when the server has none by that name, and the script
/// to load when it answers `NOSCRIPT`.
pub(crate) struct Invocation {
    pub(crate) script: &'static Script,
    pub(crate) function: Option<&'static Function>,
    pub(crate) cmd: Cmd,
}

impl Invocation {
    /// The same call by `EVALSHA` of the script (for a server that has no
    /// functions, or will not load one).
    pub(crate) fn by_evalsha(&self) -> Cmd {
        let mut cmd = Cmd::with_capacity(self.cmd.args_iter().len(), 64);
        cmd.arg("EVALSHA").arg(self.script.get_hash());
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// `FCALL` of `function` (or, without `functions`, `EVALSHA` of `script`)
/// with `keys` keys, room made for `args` arguments of about `bytes` bytes
/// in all: the keys and arguments written in one buffer (a
/// `redis::ScriptInvocation` allocates one per argument, and copies them
/// all again into its command).
fn call_of(
    script: &'static Script,
    function: &'static Function,
    functions: bool,
    (keys, args, bytes): (usize, usize, usize),
) -> Invocation {
    let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes);
    let function = functions.then_some(function);
    match function {
        Some(function) => cmd.arg("FCALL").arg(function.name.as_str()),
        None => cmd.arg("EVALSHA").arg(script.get_hash()),
    };
    cmd.arg(keys);
    Invocation { script, function, cmd }
}

/// The script call of `calls`: [`scripts::ONE`](crate::scripts::ONE) when
/// they are one request, or one run decided in closed form, under one
/// limit that is not a `sliding_log` (its key, the limit, the time, the
/// cost, the run's length); else [`scripts::MULTI`](crate::scripts::MULTI) with the
/// distinct shapes (and their keys), then each run of requests alike; by
/// `FCALL` of its Redis function when `functions`, else by `EVALSHA`.
pub(crate) fn invocation(calls: &[Call], functions: bool) -> Invocation {
    let runs = runs(calls);
    if let ([m], Some(call)) = (runs.as_slice(), calls.first())
        && let [Arg::Str("d"), Arg::Int(1), Arg::Str(kind), figures @ ..] = call.shape.as_slice()
        && *kind != "l"
        && let ([key], [cost]) = (call.keys.as_slice(), call.costs.as_slice())
        && (*m == 1 || in_closed_form(kind, figures, *cost))
    {
        let room = (1, 4 + figures.len(), key.len() + 8 * figures.len() + 32);
        let mut one = call_of(&crate::ONE, &crate::ONE_FUNCTION, functions, room);
        one.cmd.arg(key).arg(kind);
        for figure in figures {
            one.cmd.arg(figure);
        }
        one.cmd.arg(call.now).arg(cost).arg(m);
        return one;
    }
    // The distinct shapes (a request's keys and limits), numbered from 1 in
    // the order first seen, found by hashing: a call carries up to
    // MAX_BATCH requests, most of them on keys of their own.
    let mut shapes: Vec<&Call> = Vec::new();
    let mut numbers: foldhash::HashMap<(&[String], &[Arg]), usize> = foldhash::HashMap::default();
    numbers.reserve(calls.len());
    let mut keys: foldhash::HashSet<&str> = foldhash::HashSet::default();
    keys.reserve(calls.len());
    let mut key_again = false;
    let mut index = Vec::with_capacity(calls.len());
    for call in calls {
        let at = *numbers
            .entry((call.keys.as_slice(), call.shape.as_slice()))
            .or_insert_with(|| {
                shapes.push(call);
                for key in &call.keys {
                    key_again |= !keys.insert(key);
                }
                shapes.len()
            });
        index.push(at);
    }
    // Some key in more than one request: the script caches the hashes.
    let caching = shapes.len() < calls.len() || key_again;
    let key_count: usize = shapes.iter().map(|s| s.keys.len()).sum();
    let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
    let args: usize = 3 + shapes.iter().map(|s| s.shape.len()).sum::<usize>() + calls.len() * 4;
    let room = (key_count, args, key_bytes + 8 * args);
    let mut multi = call_of(&crate::MULTI, &crate::MULTI_FUNCTION, functions, room);
    let cmd = &mut multi.cmd;
    for shape in &shapes {
        for key in &shape.keys {
            cmd.arg(key);
        }
    }
    cmd.arg(if caching { "1" } else { "0" }).arg(shapes.len());
    for shape in &shapes {
        for arg in &shape.shape {
            cmd.arg(arg);
        }
    }
    cmd.arg(runs.len());
    let mut first = 0;
    for m in runs {
        if let (Some(call), Some(&at)) = (calls.get(first), index.get(first)) {
            // A run of more than one: its shape negated, then its length.
            if m == 1 {
                cmd.arg(at);
            } else {
                cmd.arg(-(at as i64)).arg(m);
            }
            cmd.arg(call.now);
            for cost in &call.costs {
                cmd.arg(cost);
            }
        }
        first += m;
    }
    multi
}

/// Why a call failed, for every request it carried.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    Timeout(Duration),
    Redis(RedisError),
    Reply(Vec<i64>),
    Backoff(Duration),
    /// The call a request waited for was dropped (its runtime shut down).
    Abandoned,
}

impl From<Failure> for StoreError {
    fn from(f: Failure) -> StoreError {
        match f {
            Failure::Timeout(t) => StoreError::Timeout(t),
            Failure::Redis(e) => StoreError::unavailable(RedisStoreError::Redis(e)),
            Failure::Reply(r) => StoreError::unavailable(RedisStoreError::Reply(r)),
            Failure::Backoff(b) => StoreError::unavailable(RedisStoreError::Backoff(b)),
            Failure::Abandoned => StoreError::unavailable(RedisStoreError::Abandoned),
        }
    }
}

pub(crate) type Reply = Result<Vec<i64>, Failure>;

/// A request waiting for the next call of its lane.
struct Waiting {
    call: Call,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Lane {
    /// A call is in flight (or being formed) on the lane.
    busy: bool,
    queue: VecDeque<Waiting>,
}

/// Every lane of a store, and the figures of the calls.
pub(crate) struct Lanes {
    batching: Batching,
    lanes: Box<[Mutex<Lane>]>,
    calls: AtomicU64,
    requests: AtomicU64,
}

/// What a request finds on its lane.
pub(crate) enum Turn {
    /// No call in flight: the request is sent now, by its caller, who
    /// hands the lane on afterwards ([`Lanes::hand_on`]).
    Lead(Call),
    /// A call is in flight: the reply comes by this channel.
    Wait(oneshot::Receiver<Reply>),
}

impl Lanes {
    pub(crate) fn new(batching: Batching) -> Self {
        Lanes {
            batching,
            lanes: (0..batching.lanes()).map(|_| Mutex::new(Lane::default())).collect(),
            calls: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// How requests are grouped.
    pub(crate) fn batching(&self) -> Batching {
        self.batching
    }

    /// Takes `call`'s turn on `lane`.
    pub(crate) fn turn(&self, lane: usize, call: Call) -> Turn {
        let Some(cell) = self.lanes.get(lane) else {
            return Turn::Lead(call);
        };
        let mut lane = cell.lock();
        if lane.busy {
            let (reply, rx) = oneshot::channel();
            lane.queue.push_back(Waiting { call, reply });
            Turn::Wait(rx)
        } else {
            lane.busy = true;
            Turn::Lead(call)
        }
    }

    /// How many requests wait on `lane`.
    pub(crate) fn waiting(&self, lane: usize) -> usize {
        self.lanes.get(lane).map_or(0, |cell| cell.lock().queue.len())
    }

    /// Frees `lane` if nobody waits on it: whether it did. Else the lane
    /// stays busy, for the task that will send the next call.
    pub(crate) fn free_if_idle(&self, lane: usize) -> bool {
        let Some(cell) = self.lanes.get(lane) else {
            return true;
        };
        let mut lane = cell.lock();
        if lane.queue.is_empty() {
            lane.busy = false;
        }
        !lane.busy
    }

    /// After a call on `lane`: the lane is free when nobody waits;
    /// otherwise the waiting requests (at most [`MAX_BATCH`], those whose
    /// callers gave up left out) are taken for the next call, and the lane
    /// stays busy.
    pub(crate) fn hand_on(&self, lane: usize) -> Option<(Vec<Call>, Vec<oneshot::Sender<Reply>>)> {
        let cell = self.lanes.get(lane)?;
        let mut lane = cell.lock();
        let mut calls = Vec::new();
        let mut replies = Vec::new();
        while calls.len() < MAX_BATCH {
            let Some(waiting) = lane.queue.pop_front() else {
                break;
            };
            if !waiting.reply.is_closed() {
                calls.push(waiting.call);
                replies.push(waiting.reply);
            }
        }
        if calls.is_empty() {
            lane.busy = false;
            return None;
        }
        Some((calls, replies))
    }

    /// Frees `lane` and answers everyone waiting on it with `failure` (no
    /// runtime to send their call on).
    pub(crate) fn abandon(&self, lane: usize, failure: &Failure) {
        if let Some(cell) = self.lanes.get(lane) {
            let mut lane = cell.lock();
            lane.busy = false;
            for waiting in lane.queue.drain(..) {
                let _ = waiting.reply.send(Err(failure.clone()));
            }
        }
    }

    /// Counts one call of `requests` requests.
    pub(crate) fn count(&self, requests: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
    }

    /// The script calls sent, and the requests they carried.
    pub(crate) fn figures(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }
}

/// Splits a call's `reply` into the replies of `calls`, in order (each
/// run of requests alike as `scripts/batch.lua` answers it).
pub(crate) fn split(calls: &[Call], reply: Vec<i64>) -> Result<Vec<Vec<i64>>, Failure> {
    match split_runs(calls, &reply) {
        Some(out) => Ok(out),
        None => Err(Failure::Reply(reply)),
    }
}

fn split_runs(calls: &[Call], reply: &[i64]) -> Option<Vec<Vec<i64>>> {
    let mut rest = reply;
    let mut take = |len: usize| take(&mut rest, len);
    let mut out = Vec::with_capacity(calls.len());
    let mut first = 0;
    for m in runs(calls) {
        let call = calls.get(first)?;
        first += m;
        let len = call.reply_len;
        let head = if m == 1 { -1 } else { *take(1)?.first()? };
        if head == -1 {
            // Each request's reply in full.
            for _ in 0..m {
                out.push(take(len)?.to_vec());
            }
            continue;
        }
        // x passed (the first's reply, then a step more each), the rest
        // refused alike.
        let x = usize::try_from(head).ok().filter(|&x| x <= m)?;
        if x > 0 {
            let (passed, step) = (take(len)?, take(len)?);
            for i in 0..x as i64 {
                out.push(
                    passed
                        .iter()
                        .zip(step)
                        .map(|(a, s)| a.saturating_add(i.saturating_mul(*s)))
                        .collect(),
                );
            }
        }
        if x < m {
            let refused = take(len)?;
            for _ in x..m {
                out.push(refused.to_vec());
            }
        }
    }
    rest.is_empty().then_some(out)
}

/// The first `len` integers of `rest`, which keeps the others.
fn take<'a>(rest: &mut &'a [i64], len: usize) -> Option<&'a [i64]> {
    let (one, tail) = rest.split_at_checked(len)?;
    *rest = tail;
    Some(one)
}

#[cfg(test)]
mod tests {
    use super::{Arg, Call, Failure, runs, split};

    fn call(key: &str, now: i64, cost: i64) -> Call {
        Call {
            keys: vec![key.to_owned()],
            shape: vec![Arg::Str("d"), Arg::Int(1), Arg::Str("f"), Arg::Int(60), Arg::Int(5)],
            now,
            costs: vec![cost],
            reply_len: 8,
            range: 0,
            lane: 0,
        }
    }

    #[test]
    fn runs_are_requests_alike_one_after_the_other() {
        let calls = [
            call("a", 7, 1),
            call("a", 7, 1),
            call("a", 7, 1),
            call("b", 7, 1),
            call("a", 7, 2),
            call("a", 8, 2),
            call("a", 8, 2),
        ];
        assert_eq!(runs(&calls), [3, 1, 1, 2]);
        assert_eq!(runs(&[]), Vec::<usize>::new());
    }

    #[test]
    fn a_run_is_answered_as_its_passes_then_its_refusals() {
        let calls = [call("a", 7, 2), call("a", 7, 2), call("a", 7, 2), call("b", 7, 1)];
        let first = [1, 3, 60, -1, 0, 0, 1, 7];
        let step = [0, -2, 0, 0, 2, 0, 0, 0];
        let refused = [0, 1, 60, 60, 4, 0, 1, 7];
        let alone = [1, 4, 60, -1, 0, 0, 1, 7];
        let reply = [&[2][..], &first, &step, &refused, &alone].concat();
        let out = split(&calls, reply).unwrap();
        assert_eq!(out[0], first);
        assert_eq!(out[1], [1, 1, 60, -1, 2, 0, 1, 7]);
        assert_eq!(out[2], refused);
        assert_eq!(out[3], alone);
        // All refused; each in full.
        let reply = [&[0][..], &refused, &alone].concat();
        assert_eq!(split(&calls, reply).unwrap()[..3], [refused; 3]);
        let reply = [&[-1][..], &first, &first, &refused, &alone].concat();
        assert_eq!(split(&calls, reply).unwrap()[1], first);
        // Malformed: more passes than requests, a reply short or long.
        for bad in [
            [&[4][..], &first, &step, &alone].concat(),
            [&[3][..], &first, &step].concat(),
            [&[3][..], &first, &step, &alone, &[0]].concat(),
            [&[2][..], &first, &step, &alone].concat(),
        ] {
            assert!(matches!(split(&calls, bad), Err(Failure::Reply(_))));
        }
    }
}
