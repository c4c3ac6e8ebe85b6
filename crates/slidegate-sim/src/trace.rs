//! Access logs as traffic: the conversion of a log, read by a
//! [`LogReader`] (see [`crate::logs`]), into a time-sorted request stream
//! (see [`read_trace`]).

use crate::errors::{BadLine, TraceError};
use crate::logs::{Field, LogFormat, LogOptions, LogReader};
use crate::stream::{Reorder, ReorderOptions};
use crate::traffic::{MAX_CLIENTS, Request};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::BufRead;

/// How to read a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// The format and what a malformed line does.
    pub log: LogOptions,
    /// The field that is the client: a name of the format's or an alias
    /// (see [`crate::logs`]).
    pub key_by: String,
    /// The most distinct keys the trace may have.
    pub max_clients: u32,
}

impl Default for TraceOptions {
    /// Detected format, keyed by client, malformed lines skipped, at most
    /// [`MAX_CLIENTS`] clients.
    fn default() -> Self {
        TraceOptions {
            log: LogOptions::default(),
            key_by: "client".to_string(),
            max_clients: MAX_CLIENTS,
        }
    }
}

/// A trace read into a request stream (see [`read_trace`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The name it was read under (for messages).
    pub name: String,
    /// Its format, as given or detected.
    pub format: LogFormat,
    /// Its requests, sorted by time (stably: lines at the same time keep
    /// their order), time 0 being the earliest; each costs 1.
    pub requests: Vec<Request>,
    /// Each client's key, by client number.
    pub keys: Vec<String>,
    /// Distinct keys: the clients are `0..clients`, numbered in the order
    /// they first appear in the file.
    pub clients: u32,
    /// The time of the earliest request, in nanoseconds since the Unix
    /// epoch: time 0 of [`Trace::requests`].
    pub start_unix_ns: i64,
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Malformed lines skipped (with [`OnError::Skip`]).
    ///
    /// [`OnError::Skip`]: crate::OnError::Skip
    pub skipped: u64,
    /// The first [`REPORTED_BAD_LINES`] malformed lines skipped.
    ///
    /// [`REPORTED_BAD_LINES`]: crate::REPORTED_BAD_LINES
    pub bad_lines: Vec<BadLine>,
}

impl Trace {
    /// Time from the earliest request to the latest, in nanoseconds.
    pub fn span_ns(&self) -> u64 {
        self.requests.last().map_or(0, |r| r.time_ns)
    }
}

/// How many lines between two calls of the progress callback.
const PROGRESS_LINES: u64 = 4096;

/// A trace streamed by [`stream_trace`]: everything about it but its
/// requests, which went to the sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// The name it was read under (for messages).
    pub name: String,
    /// Its format, as given or detected.
    pub format: LogFormat,
    /// Each client's key, by client number.
    pub keys: Vec<String>,
    /// Distinct keys: the clients are `0..clients`, numbered in the order
    /// they first appear in the file.
    pub clients: u32,
    /// Requests sent to the sink.
    pub requests: u64,
    /// Requests of each client, by client number.
    pub requests_per_client: Vec<u64>,
    /// The time of the first request released, in nanoseconds since the
    /// Unix epoch: time 0 of the requests.
    pub start_unix_ns: i64,
    /// Time from the first request released to the last, in nanoseconds.
    pub span_ns: u64,
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Malformed lines skipped (with [`OnError::Skip`]).
    ///
    /// [`OnError::Skip`]: crate::OnError::Skip
    pub skipped: u64,
    /// The first [`REPORTED_BAD_LINES`] malformed lines skipped.
    ///
    /// [`REPORTED_BAD_LINES`]: crate::REPORTED_BAD_LINES
    pub bad_lines: Vec<BadLine>,
    /// Lines that came later than the reorder buffer could wait for (see
    /// [`Reorder`]): they were decided at the latest time released.
    pub late: u64,
    /// The most one of them was earlier than that time, in nanoseconds.
    pub max_lateness_ns: u64,
}

/// What one pass over a log released.
struct Released {
    /// The first time released.
    start: Option<i64>,
    /// The last.
    last: i64,
    late: u64,
    max_lateness_ns: u64,
}

/// One pass over the records of `reader`: each record's key (its
/// `key_field`, `-` when absent) goes through `classify`, and what it gives
/// (when anything) through a [`Reorder`] buffer to `release`, with the
/// record's time counted from the first time released.
fn pass<R: BufRead, T>(
    reader: &mut LogReader<R>,
    key_field: &Field,
    order: ReorderOptions,
    progress: &mut dyn FnMut(u64),
    classify: &mut dyn FnMut(Cow<'_, str>) -> Option<T>,
    release: &mut dyn FnMut(u64, T),
) -> Result<Released, TraceError> {
    let mut buffer = Reorder::new(order);
    let mut start: Option<i64> = None;
    let mut last = 0i64;
    let mut out = |time: i64, item: T| {
        let first = *start.get_or_insert(time);
        last = time;
        // Released times never go below the first: the difference of two
        // i64 fits a u64.
        release((i128::from(time) - i128::from(first)) as u64, item);
    };
    let mut next_progress = PROGRESS_LINES;
    while let Some(record) = reader.next_record()? {
        let time = record.time_unix_ns();
        let key = record.get(key_field).unwrap_or(Cow::Borrowed("-"));
        if let Some(item) = classify(key) {
            buffer.push(time, item, &mut out);
        }
        if reader.lines() >= next_progress {
            next_progress = reader.lines() + PROGRESS_LINES;
            progress(reader.bytes_read());
        }
    }
    buffer.finish(&mut out);
    progress(reader.bytes_read());
    Ok(Released {
        start,
        last,
        late: buffer.late(),
        max_lateness_ns: buffer.max_lateness_ns(),
    })
}

/// Streams the trace called `name` from `input` into `sink`, one request
/// at a time, in memory that does not grow with the log: the clients' keys
/// and counts, and what the reorder buffer holds.
///
/// The lines are read by a [`LogReader`] (see it for the formats, their
/// detection, blank lines, a byte order mark and a CSV header). Every
/// well-formed line is one request of cost 1 from the client its
/// `options.key_by` field names (a field that is `-` or absent is the key
/// `-`); the clients are numbered in the order their keys first appear.
/// The requests are put in time order by a [`Reorder`] buffer with `order`
/// (stably: lines at the same time keep their order; a line later than the
/// buffer could wait for is decided at the latest time released, and
/// counted in [`TraceSummary::late`]); time 0 is the first one released.
///
/// `progress` is called now and then, and at the end, with the number of
/// bytes read so far. The sink may have been given requests when an error
/// comes.
///
/// # Errors
///
/// - [`TraceError::BadLine`] at the first malformed line with
///   [`OnError::Stop`] (with [`OnError::Skip`], malformed lines are counted
///   in [`TraceSummary::skipped`] and the first few kept in
///   [`TraceSummary::bad_lines`]);
/// - [`TraceError::NoRequests`] when no line is a request, with why;
/// - [`TraceError::FieldNotInFormat`], [`TraceError::TooManyClients`] (at
///   the end, with the count of every distinct key; past the limit, no
///   request goes to the sink) and those of [`LogReader::new`].
///
/// [`OnError::Stop`]: crate::OnError::Stop
/// [`OnError::Skip`]: crate::OnError::Skip
pub fn stream_trace(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    order: ReorderOptions,
    progress: &mut dyn FnMut(u64),
    sink: &mut dyn FnMut(Request),
) -> Result<TraceSummary, TraceError> {
    let mut reader = LogReader::new(name, input, &options.log)?;
    let key_field = reader.field(&options.key_by)?;
    let mut keys: HashMap<String, u32> = HashMap::new();
    let mut distinct: u64 = 0;
    let mut per_client: Vec<u64> = Vec::new();
    let mut requests: u64 = 0;
    let max = u64::from(options.max_clients);
    let released = pass(
        &mut reader,
        &key_field,
        order,
        progress,
        &mut |key| {
            let client = match keys.get(key.as_ref()) {
                Some(&client) => client,
                None => {
                    distinct += 1;
                    let client = u32::try_from(keys.len()).unwrap_or(u32::MAX);
                    keys.insert(key.into_owned(), client);
                    client
                }
            };
            // Past the limit, only count the keys: the run will fail.
            (distinct <= max).then_some(client)
        },
        &mut |time_ns, client| {
            requests += 1;
            if let Some(n) = per_client.get_mut(client as usize) {
                *n += 1;
            } else {
                per_client.resize(client as usize, 0);
                per_client.push(1);
            }
            sink(Request {
                time_ns,
                client,
                cost: 1,
            });
        },
    )?;
    if distinct > max {
        return Err(TraceError::TooManyClients {
            file: name.to_string(),
            key_by: options.key_by.clone(),
            clients: distinct,
            max: options.max_clients,
        });
    }
    let (Some(format), Some(start)) = (reader.format(), released.start) else {
        return Err(reader.no_requests());
    };
    let mut names = vec![String::new(); keys.len()];
    for (key, client) in keys {
        if let Some(slot) = names.get_mut(client as usize) {
            *slot = key;
        }
    }
    per_client.resize(names.len(), 0);
    Ok(TraceSummary {
        name: name.to_string(),
        format: format.clone(),
        keys: names,
        clients: u32::try_from(distinct).unwrap_or(u32::MAX),
        requests,
        requests_per_client: per_client,
        start_unix_ns: start,
        span_ns: (i128::from(released.last) - i128::from(start)) as u64,
        lines: reader.lines(),
        skipped: reader.skipped(),
        bad_lines: reader.bad_lines().to_vec(),
        late: released.late,
        max_lateness_ns: released.max_lateness_ns,
    })
}

/// The requests of a few clients of a trace, as [`stream_trace`] with the
/// same `options` and `order` sends them (the same times, the same order):
/// `clients` are their keys and the client numbers they are given. For the
/// plots of the busiest clients, in a second pass over the log: memory
/// grows with those clients' requests only.
///
/// # Errors
///
/// Those of [`stream_trace`] but [`TraceError::TooManyClients`] and
/// [`TraceError::NoRequests`] (an empty list then).
pub fn trace_requests_of(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    order: ReorderOptions,
    clients: &[(String, u32)],
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<Request>, TraceError> {
    let mut reader = LogReader::new(name, input, &options.log)?;
    let key_field = reader.field(&options.key_by)?;
    let wanted: HashMap<&str, u32> = clients.iter().map(|(k, c)| (k.as_str(), *c)).collect();
    let mut requests = Vec::new();
    pass(
        &mut reader,
        &key_field,
        order,
        progress,
        // Every record goes through the buffer, so that it releases the
        // wanted ones exactly as in the full pass.
        &mut |key| Some(wanted.get(key.as_ref()).copied()),
        &mut |time_ns, client| {
            if let Some(client) = client {
                requests.push(Request {
                    time_ns,
                    client,
                    cost: 1,
                });
            }
        },
    )?;
    Ok(requests)
}

/// Reads the trace called `name` from `input` into a request stream held
/// in memory: [`stream_trace`] with [`ReorderOptions::FULL_SORT`] (the
/// requests sorted by time, stably; time 0 is the earliest one's), its
/// requests collected.
///
/// # Errors
///
/// Those of [`stream_trace`].
pub fn read_trace(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Trace, TraceError> {
    let mut requests = Vec::new();
    let summary = stream_trace(name, input, options, ReorderOptions::FULL_SORT, progress, &mut |r| {
        requests.push(r)
    })?;
    Ok(Trace {
        name: summary.name,
        format: summary.format,
        requests,
        keys: summary.keys,
        clients: summary.clients,
        start_unix_ns: summary.start_unix_ns,
        lines: summary.lines,
        skipped: summary.skipped,
        bad_lines: summary.bad_lines,
    })
}
