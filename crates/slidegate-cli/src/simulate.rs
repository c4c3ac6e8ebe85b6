//! `slidegate simulate`: every chosen algorithm against every chosen traffic
//! model, or against access logs replayed with `--trace`, in the measurement
//! and the admission view.

use anyhow::{Context, Result};
use clap::builder::PossibleValuesParser;
use clap::{ValueEnum, value_parser};
use slidegate_core::duration::{format_duration, parse_positive_duration};
use slidegate_core::{Algorithm, AlgorithmSpec, Policy, Weighting};
use slidegate_sim::{
    FormatChoice, LogOptions, LogReader, MAX_CLIENTS, Metrics, OnError, REORDER_MAX_PENDING, ReorderOptions, Request,
    Row, Scenario, TimeFormat, TraceError, TraceOptions, TraceSummary, Traffic,
};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `slidegate simulate`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Traffic model; repeat or separate with commas [default: all]
    #[arg(long, value_name = "MODEL", value_delimiter = ',', value_parser = PossibleValuesParser::new(Traffic::NAMES),
          conflicts_with = "trace")]
    traffic: Vec<String>,

    /// Replay an access log instead of the traffic models; repeat for several files, each its own traffic row
    ///
    /// Common or Combined Log Format (with extra fields), nginx or Apache logs
    /// in their format (--log-format), Envoy's default format, JSON lines
    /// (Envoy, Caddy, Traefik or any with --time-field) or `timestamp,key`
    /// CSV, plain or gzip-compressed. Every line is a request of cost 1;
    /// time 0 is the earliest request. The file is streamed: memory grows
    /// with its clients (see --max-clients) and the lines of one
    /// --reorder-horizon, not with its length.
    #[arg(long, value_name = "FILE")]
    trace: Vec<PathBuf>,

    /// Format of the --trace files (auto: from each file's first lines)
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TraceFormatArg::Auto, requires = "trace")]
    trace_format: TraceFormatArg,

    /// The nginx `log_format` or Apache `LogFormat` string the --trace files were written with
    ///
    /// With --trace-format nginx or apache (or envoy, for an Envoy format
    /// string); with auto, a `$` makes it nginx and a `%` Apache.
    #[arg(long, value_name = "STRING", requires = "trace")]
    log_format: Option<String>,

    /// JSON --trace files: the key path of the time (default: start_time, ts, StartUTC, time, timestamp, @timestamp)
    #[arg(long, value_name = "NAME", requires = "trace")]
    time_field: Option<String>,

    /// JSON --trace files: how the time is written (default: from its type)
    #[arg(long, value_name = "F", value_parser = PossibleValuesParser::new(TimeFormat::NAMES), requires = "trace")]
    time_format: Option<String>,

    /// The field of a --trace line that is its client (the rate-limit key)
    ///
    /// A name of the format's (an nginx variable without `$`, an Apache
    /// directive such as `%{X-Forwarded-For}i`, an Envoy command such as
    /// `REQ(:AUTHORITY)`, a JSON key path such as `request.remote_ip`,
    /// `extra1` for a combined log's first extra field) or one of client,
    /// user, method, path, request, status, referer, user-agent, host,
    /// forwarded-for, key.
    #[arg(long, value_name = "FIELD", default_value = "client", requires = "trace")]
    key_by: String,

    /// What a malformed --trace line does
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnErrorArg::Skip, requires = "trace")]
    on_error: OnErrorArg,

    /// Most distinct keys one --trace file may have
    #[arg(long, value_name = "N", default_value_t = MAX_CLIENTS, requires = "trace",
          value_parser = value_parser!(u32).range(1..))]
    max_clients: u32,

    /// How long a --trace line may wait for earlier ones logged after it (log time)
    ///
    /// Servers log a request when it ends, so a log is only nearly in time
    /// order. The replay streams the file: it holds each line until one
    /// this much later is read (and at most 1,000,000 lines), then decides
    /// the lines held in time order (at equal times, in file order). A line
    /// that comes later than that is decided at the latest time decided so
    /// far, and the heading counts such lines and says by how much they
    /// were out of order.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration,
          requires = "trace")]
    reorder_horizon: Duration,

    /// Algorithm; repeat or separate with commas [default: all]
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_parser = PossibleValuesParser::new(Algorithm::NAMES))]
    algorithm: Vec<String>,

    /// Requests admitted per window, per client
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u64,

    /// Window length: an integer and ns, us, ms, s, m, h or d
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    window: Duration,

    /// Sub-buckets of sliding_window (2 is the classic two-bucket estimate); several give rows side by side
    #[arg(long, value_name = "N", value_delimiter = ',', default_values_t = [AlgorithmSpec::DEFAULT_BUCKETS])]
    buckets: Vec<u32>,

    /// How sliding_window weighs its oldest bucket
    #[arg(long, value_enum, default_value_t = WeightingArg::from(Weighting::default()))]
    weighting: WeightingArg,

    /// Clients of the `clients` traffic model (not with --trace)
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = value_parser!(u32).range(1..=i64::from(MAX_CLIENTS)), conflicts_with = "trace")]
    clients: u32,

    /// Simulated time (not with --trace, which lasts as long as its log)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_positive_duration,
          conflicts_with = "trace")]
    duration: Duration,

    /// Seed of the traffic models' random numbers (not with --trace)
    #[arg(long, value_name = "N", default_value_t = 1, conflicts_with = "trace")]
    seed: u64,

    /// Burst of gcra [default: the limit]
    #[arg(long, value_name = "N")]
    burst: Option<u64>,

    /// Relative error bound of exponential_histogram
    #[arg(long, value_name = "F", default_value_t = AlgorithmSpec::DEFAULT_EPSILON)]
    epsilon: f64,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,

    /// Write plots (SVG and PNG) of each traffic into this folder: true
    /// against estimated count for the three clients where the algorithms
    /// disagree most (or those of --plot-client), wrong decisions against
    /// buckets, the most admitted in a window per algorithm
    ///
    /// With --trace, each file is read a second time for the count plots,
    /// which hold every request of their clients in memory.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,

    /// The client of a count plot: its key (a --trace file's) or its number (a traffic model's); repeat for more
    ///
    /// Without it, the count plots show the three clients whose refused
    /// requests differ most between the algorithms.
    #[arg(long, value_name = "KEY", requires = "plot", conflicts_with = "config")]
    plot_client: Vec<String>,

    /// What-if replay: the service's config (files or directories, as `serve --config`); every --trace line is
    /// decided as a request of --domain, and each rule's refusals are reported
    ///
    /// The requests are decided by the service's own matching and engine on
    /// a clock set to each line's time, and again with every limit counted
    /// by the exact sliding log and by a fixed window of the same length.
    /// Several --trace files are one log, replayed in the order given.
    #[arg(long, value_name = "PATH", requires_all = ["trace", "domain", "descriptor"],
          conflicts_with_all = ["algorithm", "limit", "window", "buckets", "weighting", "burst", "epsilon", "key_by"])]
    config: Vec<PathBuf>,

    /// The domain of the what-if requests
    #[arg(long, value_name = "NAME", requires = "config")]
    domain: Option<String>,

    /// An entry of the what-if requests' descriptor: KEY=FIELD (the log field's value) or KEY=literal:TEXT;
    /// repeat for the descriptor's next entry
    ///
    /// FIELD is any field of the log's format (its name as --key-by takes
    /// it). A line whose field is missing, empty or `-` sends the request
    /// without this descriptor, as Envoy leaves out a descriptor it cannot
    /// fill.
    #[arg(long, value_name = "KEY=FIELD", requires = "config")]
    descriptor: Vec<slidegate_whatif::EntrySpec>,

    /// Another descriptor of the same what-if requests: its entries as KEY=FIELD or KEY=literal:TEXT separated
    /// by commas; repeat for more descriptors
    #[arg(long, value_name = "ENTRIES", requires = "descriptor", value_parser = parse_descriptor)]
    other_descriptor: Vec<Vec<slidegate_whatif::EntrySpec>>,

    /// Memory of each what-if store, in MiB: the config's sliding windows, its other algorithms, the sliding
    /// logs and the fixed windows each get this much
    #[arg(long, value_name = "MIB", default_value_t = 32, requires = "config",
          value_parser = value_parser!(u32).range(1..=1 << 20))]
    memory_mib: u32,
}

/// `--other-descriptor`: entries separated by commas.
fn parse_descriptor(s: &str) -> Result<Vec<slidegate_whatif::EntrySpec>, String> {
    s.split(',').map(str::parse).collect()
}

/// `--weighting`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WeightingArg {
    /// The oldest bucket weighted by its part still in the window
    Interpolated,
    /// The oldest bucket counted whole: never more than the limit
    Conservative,
    /// One row for each
    Both,
}

impl From<Weighting> for WeightingArg {
    fn from(weighting: Weighting) -> Self {
        match weighting {
            Weighting::Interpolated => WeightingArg::Interpolated,
            Weighting::Conservative => WeightingArg::Conservative,
        }
    }
}

impl WeightingArg {
    fn weightings(self) -> &'static [Weighting] {
        match self {
            WeightingArg::Interpolated => &[Weighting::Interpolated],
            WeightingArg::Conservative => &[Weighting::Conservative],
            WeightingArg::Both => &[Weighting::Interpolated, Weighting::Conservative],
        }
    }
}

/// `--trace-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TraceFormatArg {
    /// Each file's format from its first lines (or from --log-format)
    Auto,
    /// Common Log Format: host, ident, authuser, time in brackets, quoted request, status, bytes
    Clf,
    /// Combined Log Format: CLF, "referer" "user-agent", then any extra fields (extra1, extra2, ...)
    Combined,
    /// timestamp,key lines: Unix seconds or RFC 3339, and a key
    Csv,
    /// Envoy's default access log format, or --log-format's Envoy format string
    Envoy,
    /// One JSON object per line (Envoy, Caddy, Traefik; see --time-field)
    Json,
    /// nginx, in the log_format given with --log-format
    Nginx,
    /// Apache, in the LogFormat given with --log-format
    Apache,
}

impl TraceFormatArg {
    fn choice(self) -> FormatChoice {
        match self {
            TraceFormatArg::Auto => FormatChoice::Auto,
            TraceFormatArg::Clf => FormatChoice::Clf,
            TraceFormatArg::Combined => FormatChoice::Combined,
            TraceFormatArg::Csv => FormatChoice::Csv,
            TraceFormatArg::Envoy => FormatChoice::Envoy,
            TraceFormatArg::Json => FormatChoice::Json,
            TraceFormatArg::Nginx => FormatChoice::Nginx,
            TraceFormatArg::Apache => FormatChoice::Apache,
        }
    }
}

/// `--on-error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnErrorArg {
    /// Report the line on stderr (the first 20, then a count) and go on
    Skip,
    /// End the run with the line's file, number and reason
    Stop,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Aligned columns for people.
    Table,
    /// A header line and one line per row.
    Csv,
    /// A list of row objects.
    Json,
}

/// Runs the simulation and writes the rows to `out`; progress bars go to
/// stderr when it is a terminal.
pub(crate) fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    execute(args, out, std::io::stderr().is_terminal())
}

/// [`run`], with progress bars on stderr or not.
fn execute(args: &Args, out: &mut dyn Write, progress: bool) -> Result<()> {
    if !args.config.is_empty() {
        return whatif(args, out, progress);
    }
    let policies = policies(args)?;
    if !args.trace.is_empty() {
        return replay(args, &policies, out, progress);
    }
    let traffics = chosen(&args.traffic, &Traffic::NAMES)
        .iter()
        .map(|name| name.parse::<Traffic>())
        .collect::<Result<Vec<_>, _>>()?;
    let duration_ns = u64::try_from(args.duration.as_nanos())
        .map_err(|_| anyhow::anyhow!("invalid duration `{:?}`: too long", args.duration))?;
    let scenarios: Vec<Scenario> = traffics
        .into_iter()
        .map(|traffic| Scenario {
            traffic,
            duration_ns,
            clients: args.clients,
            seed: args.seed,
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let rows = slidegate_sim::run_many(&policies, &scenarios, threads)?;
    if let (Some(dir), Some(first)) = (&args.plot, policies.first()) {
        let traffics = scenarios
            .iter()
            .map(|s| Ok((s.traffic.name(), s.requests(first)?)))
            .collect::<Result<Vec<_>>>()?;
        let chosen = given_clients(&args.plot_client, &traffics)?;
        for ((name, requests), given) in traffics.iter().zip(&chosen) {
            let traffic_rows: Vec<Row> = rows.iter().filter(|r| r.traffic == *name).cloned().collect();
            let given = (!args.plot_client.is_empty()).then_some(given.as_slice());
            let files = crate::plots::traffic_plots(dir, name, requests, &policies, &traffic_rows, given)?;
            report_plots(&files);
        }
    }
    let heading = format!(
        "limit {} per {}, {} simulated, seed {}, {} clients in the `clients` model",
        args.limit,
        format_duration(args.window),
        format_duration(args.duration),
        args.seed,
        args.clients
    );
    write_rows(args.format, &heading, &rows, out)
}

/// The rows in `format`; `heading` above the table.
fn write_rows(format: Format, heading: &str, rows: &[Row], out: &mut dyn Write) -> Result<()> {
    match format {
        Format::Json => {
            let json = serde_json::to_string_pretty(rows).context("serialising the rows")?;
            writeln!(out, "{json}")?;
        }
        Format::Csv => write_csv(rows, out)?,
        Format::Table => {
            writeln!(out, "{heading}")?;
            write_table(rows, out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `--trace`: opens every file first (so that a missing file, an unknown
/// format or key fails before any long evaluation), then streams each
/// through every policy, one traffic row per file named by its file name.
fn replay(args: &Args, policies: &[Policy], out: &mut dyn Write, progress: bool) -> Result<()> {
    let options = TraceOptions {
        log: log_options(args),
        key_by: args.key_by.clone(),
        max_clients: args.max_clients,
    };
    let order = reorder_options(args);
    let paths = unique(&args.trace);
    let names = traffic_names(&paths);
    for path in &paths {
        check_trace_file(path, &options)?;
    }
    // The error-rate plot's policies go along in the same pass.
    let plotted = match (&args.plot, policies.first()) {
        (Some(_), Some(first)) => crate::plots::error_rate_policies(first)?,
        _ => Vec::new(),
    };
    let all: Vec<Policy> = policies.iter().chain(&plotted).copied().collect();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut rows = Vec::with_capacity(policies.len() * paths.len());
    let mut traces = Vec::with_capacity(paths.len());
    for (path, name) in paths.iter().zip(&names) {
        let (metrics, trace) = evaluate_trace_file(path, &options, order, &all, threads, progress)?;
        report_skipped(&trace);
        rows.extend(policies.iter().zip(&metrics).map(|(p, m)| Row::new(p, name, m.clone())));
        let error_rates = metrics.get(policies.len()..).unwrap_or_default().to_vec();
        // Where the run's algorithms disagree most, unless --plot-client.
        let run: Vec<&Metrics> = metrics.iter().take(policies.len()).collect();
        let counts = (0u32..).zip(trace.requests_per_client.iter().copied());
        let disagreed = crate::plots::most_disagreed(&run, counts, crate::plots::PLOTTED);
        traces.push((trace, error_rates, disagreed));
    }
    if let Some(dir) = &args.plot {
        let chosen = given_keys(&args.plot_client, &names, &traces)?;
        for ((path, name), ((trace, error_rates, disagreed), given)) in
            paths.iter().zip(&names).zip(traces.iter().zip(&chosen))
        {
            let clients = if args.plot_client.is_empty() { disagreed } else { given };
            let keyed: Vec<(String, u32)> = clients
                .iter()
                .map(|&c| (trace.keys.get(c as usize).cloned().unwrap_or_default(), c))
                .collect();
            let requests = trace_requests_file(path, &options, order, &keyed, progress)?;
            let inputs = crate::plots::PlotInputs {
                clients,
                requests: &requests,
                error_rates,
                time: slidegate_plot::TimeAxis::Clock {
                    start_unix_ns: trace.start_unix_ns,
                },
            };
            let traffic_rows: Vec<Row> = rows.iter().filter(|r| &r.traffic == name).cloned().collect();
            let key = |c: u32| trace.keys.get(c as usize).cloned().unwrap_or_else(|| c.to_string());
            let files = crate::plots::plots_of(dir, name, &inputs, policies, &traffic_rows, &key)?;
            report_plots(&files);
        }
    }
    let mut heading = format!(
        "limit {} per {}, traces keyed by {}",
        args.limit,
        format_duration(args.window),
        options.key_by
    );
    for ((trace, _, _), name) in traces.iter().zip(&names) {
        heading.push_str(&format!(
            "\n{name}: {}, {} requests from {} clients over {}",
            trace.format,
            trace.requests,
            trace.clients,
            format_span(trace.span_ns)
        ));
        if trace.skipped > 0 {
            heading.push_str(&format!(", {} malformed lines skipped", trace.skipped));
        }
        if trace.late > 0 {
            let s = if trace.late == 1 { "" } else { "s" };
            heading.push_str(&format!(
                ", {} line{s} out of order by up to {} (more than the {} reorder horizon), decided at the latest time",
                trace.late,
                format_span(trace.max_lateness_ns),
                format_duration(args.reorder_horizon)
            ));
        }
    }
    write_rows(args.format, &heading, &rows, out)
}

/// `--config`: the what-if replay of the `--trace` files, one log in the
/// order given, each streamed (nothing of a file is kept but what the
/// replay counts).
fn whatif(args: &Args, out: &mut dyn Write, progress: bool) -> Result<()> {
    let mut descriptors = vec![args.descriptor.clone()];
    descriptors.extend(args.other_descriptor.iter().cloned());
    let setup = slidegate_whatif::Setup {
        config: args.config.clone(),
        domain: args.domain.clone().unwrap_or_default(),
        descriptors,
        memory_bytes: (args.memory_mib as usize) << 20,
        order: reorder_options(args),
    };
    let mut replay = slidegate_whatif::Replay::new(&setup)?;
    let options = log_options(args);
    let mut files = Vec::new();
    for path in unique(&args.trace) {
        let (shown, input, consumed, bar) = open_trace(path, progress, "replaying")?;
        let mut reader = LogReader::new(&shown, input, &options).map_err(explain)?;
        let fields = setup
            .fields()
            .into_iter()
            .map(|name| reader.field(name).map(|field| (name, field)).map_err(explain))
            .collect::<Result<Vec<_>>>()?;
        let mut n = 0u64;
        while let Some(record) = reader.next_record().map_err(explain)? {
            replay.line(
                record.time_unix_ns(),
                &Resolved {
                    record: &record,
                    fields: &fields,
                },
            );
            n += 1;
            if n.is_multiple_of(4096) {
                bar.set_position(consumed.get());
            }
        }
        bar.finish_and_clear();
        if reader.records() == 0 {
            // The error shows the first malformed lines: not twice.
            return Err(explain(reader.no_requests()));
        }
        for bad in reader.bad_lines() {
            eprintln!("warning: {shown}:{}: {}: `{}`", bad.line, bad.error, bad.text);
        }
        let more = reader.skipped() - reader.bad_lines().len() as u64;
        if more > 0 {
            eprintln!(
                "warning: {shown}: {more} more malformed lines skipped, {} in all",
                reader.skipped()
            );
        }
        let format = reader.format().map_or_else(|| "log".to_owned(), ToString::to_string);
        let mut line = format!("{shown}: {format}, {} lines", reader.records());
        if reader.skipped() > 0 {
            line.push_str(&format!(", {} malformed lines skipped", reader.skipped()));
        }
        files.push(line);
    }
    let report = replay.finish();
    if let Some(dir) = &args.plot {
        report_plots(&crate::plots::whatif_plots(dir, &report)?);
    }
    let mut heading = format!(
        "what-if replay of domain `{}` of {}, descriptors {}",
        report.domain,
        args.config
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        setup.describe()
    );
    for line in files {
        heading.push('\n');
        heading.push_str(&line);
    }
    if let (Some(first), Some(last)) = (&report.first_line, &report.last_line) {
        heading.push_str(&format!("\n{} requests from {first} to {last}", report.requests));
    }
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
        Format::Csv => crate::whatif::write_csv(&report, out)?,
        Format::Table => crate::whatif::write_table(&report, &heading, out)?,
    }
    out.flush()?;
    Ok(())
}

/// A record's fields by name, resolved once per file.
struct Resolved<'r, 'a> {
    record: &'r slidegate_sim::Record<'a>,
    fields: &'r [(&'r str, slidegate_sim::Field)],
}

impl slidegate_whatif::Fields for Resolved<'_, '_> {
    fn field(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
        let (_, field) = self.fields.iter().find(|(n, _)| *n == name)?;
        self.record.get(field)
    }
}

/// How the `--trace` lines are put in time order.
fn reorder_options(args: &Args) -> ReorderOptions {
    ReorderOptions {
        horizon_ns: u64::try_from(args.reorder_horizon.as_nanos()).unwrap_or(u64::MAX),
        max_pending: REORDER_MAX_PENDING,
    }
}

/// How the `--trace` files are read.
fn log_options(args: &Args) -> LogOptions {
    LogOptions {
        format: args.trace_format.choice(),
        log_format: args.log_format.clone(),
        time_field: args.time_field.clone(),
        time_format: args.time_format.as_deref().and_then(TimeFormat::from_name),
        on_error: match args.on_error {
            OnErrorArg::Skip => OnError::Skip,
            OnErrorArg::Stop => OnError::Stop,
        },
    }
}

/// A trace error, with what to do about it where a flag helps.
fn explain(e: TraceError) -> anyhow::Error {
    const NAME_IT: &str = "name the format with --trace-format (and --log-format for an nginx or Apache format string)";
    match e {
        TraceError::TooManyClients { .. } => anyhow::anyhow!("{e}: raise --max-clients to replay it"),
        TraceError::NoRequests { malformed, .. } if malformed > 0 => anyhow::anyhow!("{e}; {NAME_IT}"),
        TraceError::UnknownFormat { .. } => anyhow::anyhow!("{e}; {NAME_IT}"),
        TraceError::MissingLogFormat { .. } => anyhow::anyhow!("{e}: give it with --log-format"),
        e => e.into(),
    }
}

/// The paths given, without repeats.
fn unique(paths: &[PathBuf]) -> Vec<&Path> {
    let mut seen: Vec<&Path> = Vec::new();
    for path in paths {
        if !seen.contains(&path.as_path()) {
            seen.push(path);
        }
    }
    seen
}

/// Each trace's row name: its file name, or its path as given when two
/// traces share a file name.
fn traffic_names(paths: &[&Path]) -> Vec<String> {
    let file_name = |p: &Path| {
        p.file_name()
            .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
    };
    paths
        .iter()
        .map(|&p| {
            let name = file_name(p);
            if paths.iter().filter(|&&q| file_name(q) == name).count() > 1 {
                p.display().to_string()
            } else {
                name
            }
        })
        .collect()
}

/// A `--trace` file opened (gzip or not) with a progress bar over its bytes
/// as stored, labelled `verb`: its name as shown, the input, how much of
/// it was read, the bar.
fn open_trace(
    path: &Path,
    progress: bool,
    verb: &str,
) -> Result<(
    String,
    slidegate_sim::LogInput,
    slidegate_sim::ByteCount,
    indicatif::ProgressBar,
)> {
    let shown = path.display().to_string();
    let input = slidegate_sim::open_log(path).with_context(|| format!("reading {shown}"))?;
    let consumed = input.consumed();
    let bar = crate::progress::bar(
        progress,
        input.len(),
        &format!("{verb} {{msg}} [{{bar:30}}] {{bytes}}/{{total_bytes}}"),
    );
    bar.set_message(shown.clone());
    Ok((shown, input, consumed, bar))
}

/// Opens one `--trace` file and finds its format and key field, reading
/// only its first lines.
#[allow(clippy::result_large_err)] // the library's error, made once per file
fn check_trace_file(path: &Path, options: &TraceOptions) -> Result<()> {
    let shown = path.display().to_string();
    let input = slidegate_sim::open_log(path).with_context(|| format!("reading {shown}"))?;
    let checked = slidegate_sim::LogReader::new(&shown, input, &options.log).and_then(|r| r.field(&options.key_by));
    checked.map(drop).map_err(explain)
}

/// Streams one `--trace` file (gzip or not) through every policy, with a
/// progress bar over its bytes as stored: the policies' metrics, in order,
/// and what the trace was.
#[allow(clippy::result_large_err)] // the library's error, made once per file
fn evaluate_trace_file(
    path: &Path,
    options: &TraceOptions,
    order: ReorderOptions,
    policies: &[Policy],
    threads: usize,
    progress: bool,
) -> Result<(Vec<Metrics>, TraceSummary)> {
    let (shown, input, consumed, bar) = open_trace(path, progress, "evaluating")?;
    let evaluated = slidegate_sim::evaluate_stream(policies, threads, |sink| {
        slidegate_sim::stream_trace(
            &shown,
            input,
            options,
            order,
            &mut |_| bar.set_position(consumed.get()),
            sink,
        )
    });
    bar.finish_and_clear();
    evaluated.map_err(explain)
}

/// The requests of `clients` (keys and client numbers) in one `--trace`
/// file, read again, with a progress bar.
fn trace_requests_file(
    path: &Path,
    options: &TraceOptions,
    order: ReorderOptions,
    clients: &[(String, u32)],
    progress: bool,
) -> Result<Vec<Request>> {
    let (shown, input, consumed, bar) = open_trace(path, progress, "plotting")?;
    let read = slidegate_sim::trace_requests_of(&shown, input, options, order, clients, &mut |_| {
        bar.set_position(consumed.get())
    });
    bar.finish_and_clear();
    read.map_err(explain)
}

/// Reports the malformed lines skipped on stderr: the first ones kept, then
/// how many more.
fn report_skipped(trace: &TraceSummary) {
    for bad in &trace.bad_lines {
        eprintln!("warning: {}:{}: {}: `{}`", trace.name, bad.line, bad.error, bad.text);
    }
    let more = trace.skipped - trace.bad_lines.len() as u64;
    if more > 0 {
        eprintln!(
            "warning: {}: {more} more malformed lines skipped, {} in all",
            trace.name, trace.skipped
        );
    }
}

/// `--plot-client` for the traffic models: each key is a client number,
/// plotted in every traffic that has requests from it (a warning for
/// those that have none); a key that is no number, or no traffic's
/// client, is an error before any plot is drawn. One list per traffic.
fn given_clients(given: &[String], traffics: &[(&str, Vec<Request>)]) -> Result<Vec<Vec<u32>>> {
    let mut chosen = vec![Vec::new(); traffics.len()];
    for key in given {
        let client: u32 = key
            .parse()
            .map_err(|_| anyhow::anyhow!("--plot-client {key}: a traffic model's clients are numbers (0, 1, …)"))?;
        let mut found = false;
        for ((name, requests), chosen) in traffics.iter().zip(&mut chosen) {
            if requests.iter().any(|r| r.client == client) {
                if !chosen.contains(&client) {
                    chosen.push(client);
                }
                found = true;
            } else {
                eprintln!("plots: no request from client {client} in the {name} traffic");
            }
        }
        anyhow::ensure!(
            found,
            "--plot-client {key}: no traffic of the run has requests from client {key}"
        );
    }
    Ok(chosen)
}

/// `--plot-client` for traces: each key's client number in every trace
/// that has it (a warning for those that do not); a key in no trace is an
/// error before any plot is drawn. One list per trace.
fn given_keys<A, B>(given: &[String], names: &[String], traces: &[(TraceSummary, A, B)]) -> Result<Vec<Vec<u32>>> {
    let mut chosen = vec![Vec::new(); traces.len()];
    for key in given {
        let mut found = false;
        for (((trace, _, _), name), chosen) in traces.iter().zip(names).zip(&mut chosen) {
            match trace.keys.iter().position(|k| k == key) {
                Some(c) => {
                    let c = c as u32;
                    if !chosen.contains(&c) {
                        chosen.push(c);
                    }
                    found = true;
                }
                None => eprintln!("plots: no request from `{key}` in {name}"),
            }
        }
        anyhow::ensure!(
            found,
            "--plot-client {key}: no request has this key (the --key-by field) in {}",
            names.join(", ")
        );
    }
    Ok(chosen)
}

/// Says on stderr which plot files were written.
fn report_plots(files: &[PathBuf]) {
    for file in files {
        eprintln!("wrote {}", file.display());
    }
}

/// A trace's span: as a duration when whole seconds, else in seconds with
/// milliseconds.
fn format_span(ns: u64) -> String {
    if ns.is_multiple_of(1_000_000_000) {
        format_duration(Duration::from_nanos(ns))
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

/// The names given, without repeats, or all of them when none was given.
fn chosen<'a>(given: &'a [String], all: &'a [&'static str]) -> Vec<&'a str> {
    if given.is_empty() {
        return all.to_vec();
    }
    let mut names: Vec<&str> = Vec::new();
    for name in given {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names
}

/// One validated policy per algorithm configuration, before anything runs,
/// so that a bad value fails fast with its name.
fn policies(args: &Args) -> Result<Vec<Policy>> {
    let mut algorithms = Vec::new();
    let mut buckets: Vec<u32> = Vec::new();
    for &n in &args.buckets {
        if !buckets.contains(&n) {
            buckets.push(n);
        }
    }
    // Every combination of the flags, each algorithm reading only its own.
    for name in chosen(&args.algorithm, &Algorithm::NAMES) {
        for &n in &buckets {
            for &weighting in args.weighting.weightings() {
                let spec = AlgorithmSpec {
                    name: Some(name),
                    buckets: Some(n),
                    weighting: Some(weighting),
                    burst: args.burst,
                    epsilon: Some(args.epsilon),
                };
                let algorithm = spec.only_applicable().algorithm(args.limit)?;
                if !algorithms.contains(&algorithm) {
                    algorithms.push(algorithm);
                }
            }
        }
    }
    algorithms
        .into_iter()
        .map(|a| Ok(Policy::new(args.limit, args.window, a)?))
        .collect()
}

const COLUMNS: [&str; 17] = [
    "algorithm",
    "buckets",
    "weighting",
    "burst",
    "epsilon",
    "traffic",
    "limit",
    "window_ns",
    "effective_window_ns",
    "clients",
    "requests",
    "admitted",
    "wrongly_allowed",
    "wrongly_denied",
    "max_window_admitted",
    "max_window_ratio",
    "mean_abs_error",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// Every field of every row, in [`COLUMNS`] order; no field holds a comma.
fn write_csv(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "{}", COLUMNS.join(","))?;
    for r in rows {
        let fields = [
            r.algorithm.to_string(),
            opt(r.buckets),
            opt(r.weighting.as_ref()),
            opt(r.burst),
            opt(r.epsilon),
            r.traffic.clone(),
            r.limit.to_string(),
            r.window_ns.to_string(),
            r.effective_window_ns.to_string(),
            r.clients.to_string(),
            r.requests.to_string(),
            r.admitted.to_string(),
            opt(r.wrongly_allowed),
            opt(r.wrongly_denied),
            r.max_window_admitted.to_string(),
            r.max_window_ratio.to_string(),
            opt(r.mean_abs_error),
        ];
        writeln!(out, "{}", fields.join(","))?;
    }
    Ok(())
}

/// The fields people compare, aligned: text to the left, numbers to the
/// right, `-` where a figure does not apply.
fn write_table(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    let header = [
        "traffic",
        "algorithm",
        "params",
        "requests",
        "admitted",
        "wrong_allow",
        "wrong_deny",
        "wrong_%",
        "max_ratio",
        "mean_err_%",
    ];
    let left = 3; // the first three columns are text
    let dash = || "-".to_string();
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        let params = match (r.buckets, &r.weighting, r.burst, r.epsilon) {
            (Some(n), Some(w), _, _) => format!("n={n} {w}"),
            (_, _, Some(burst), _) => format!("burst={burst}"),
            (_, _, _, Some(eps)) => format!("epsilon={eps}"),
            _ => dash(),
        };
        let wrong = match (r.wrongly_allowed, r.wrongly_denied) {
            (Some(a), Some(d)) if r.requests > 0 => format!("{:.3}", (a + d) as f64 * 100.0 / r.requests as f64),
            _ => dash(),
        };
        cells.push(vec![
            r.traffic.clone(),
            r.algorithm.to_string(),
            params,
            r.requests.to_string(),
            r.admitted.to_string(),
            r.wrongly_allowed.map_or_else(dash, |v| v.to_string()),
            r.wrongly_denied.map_or_else(dash, |v| v.to_string()),
            wrong,
            format!("{:.3}", r.max_window_ratio),
            r.mean_abs_error.map_or_else(dash, |e| format!("{:.2}", e * 100.0)),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|row| row[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                if i < left {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn output(argv: &[&str]) -> Result<String> {
        let cli = Cli::try_parse_from(std::iter::once("simulate").chain(argv.iter().copied()))?;
        let mut out = Vec::new();
        execute(&cli.args, &mut out, false)?;
        Ok(String::from_utf8(out)?)
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_configuration() {
        let csv = output(&[
            "--traffic",
            "poisson,adversary",
            "--algorithm",
            "sliding_window",
            "--algorithm",
            "gcra",
            "--format",
            "csv",
            "--duration",
            "2m",
        ])
        .unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], COLUMNS.join(","));
        // 2 traffic models × (the default sliding window + gcra).
        assert_eq!(lines.len(), 1 + 2 * 2);
        assert!(lines[1].starts_with("sliding_window,8,conservative,,,poisson,100,60000000000,"));
        assert!(lines[2].starts_with("gcra,,,100,,poisson,"));
        assert!(lines.iter().all(|l| l.split(',').count() == COLUMNS.len()));
    }

    #[test]
    fn table_is_aligned() {
        let table = output(&[
            "--traffic",
            "bursty",
            "--algorithm",
            "gcra,sliding_log,gcra",
            "--duration",
            "1m",
        ])
        .unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("limit 100 per 1m, 1m simulated, seed 1"));
        assert!(lines[1].starts_with("traffic  algorithm"));
        assert_eq!(lines.len(), 4, "{table}");
        assert_eq!(lines[2].len(), lines[3].len(), "{table}");
        assert!(lines[2].contains("burst=100"));
    }

    #[test]
    fn bad_values_are_named() {
        let err = |argv: &[&str]| format!("{:#}", output(argv).unwrap_err());
        assert_eq!(err(&["--limit", "0"]), "invalid limit `0`: must be at least 1");
        assert_eq!(
            err(&["--buckets", "1"]),
            "invalid buckets `1`: must be between 2 and 65536"
        );
        assert_eq!(
            err(&["--algorithm", "gcra", "--burst", "0"]),
            "invalid burst `0`: must be at least 1"
        );
        assert!(err(&["--epsilon", "2"]).starts_with("invalid epsilon `2`"));
        assert!(err(&["--window", "5parsecs"]).contains("'5parsecs'"));
        assert!(err(&["--duration", "0s"]).contains("must be longer than zero"));
        assert!(err(&["--clients", "0"]).contains("'0'"));
        assert!(err(&["--traffic", "flood"]).contains("'flood'"));
        assert!(err(&["--limit", "-3"]).contains("'-3'"));
        // Flags of algorithms not run are not checked.
        assert!(output(&["--algorithm", "sliding_log", "--buckets", "1", "--duration", "1m"]).is_ok());
        let e = err(&[
            "--limit",
            "4000000000",
            "--traffic",
            "poisson",
            "--algorithm",
            "sliding_log",
        ]);
        assert!(e.starts_with("traffic model `poisson` would send about"), "{e}");
    }

    const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../slidegate-sim/tests/data/access.log");

    #[test]
    fn several_bucket_counts_side_by_side() {
        let csv = output(&[
            "--trace",
            FIXTURE,
            "--algorithm",
            "sliding_window",
            "--buckets",
            "2,4",
            "--buckets",
            "8,2",
            "--weighting",
            "interpolated",
            "--limit",
            "5",
            "--window",
            "10s",
            "--format",
            "csv",
        ])
        .unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 1 + 3, "{csv}");
        for (line, n) in lines[1..].iter().zip([2, 4, 8]) {
            assert!(
                line.starts_with(&format!("sliding_window,{n},interpolated,,,access.log,5,10000000000,")),
                "{line}"
            );
        }
        // n = 2: 31 of the 36 requests admitted, one wrong decision each way,
        // 8 admitted in one window.
        // The mean relative error, recounted by hand: 0.12750535659626570…
        let (figures, mean) = lines[1].rsplit_once(',').unwrap();
        assert!(figures.ends_with(",3,36,31,1,1,8,1.6"), "{}", lines[1]);
        assert!(
            (mean.parse::<f64>().unwrap() - 0.127_505_356_596_265_7).abs() < 1e-12,
            "{mean}"
        );
    }

    #[test]
    fn traces_have_a_heading_and_one_row_set_each() {
        let dir = std::env::temp_dir().join(format!("slidegate-simulate-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        let csv = dir.join("a").join("access.log");
        std::fs::write(
            &csv,
            "timestamp,key\n1700000000,x\n1700000000.5,\"y,z\"\n1700000002,x\n",
        )
        .unwrap();
        let csv = csv.to_str().unwrap();
        let table = output(&[
            "--trace",
            FIXTURE,
            "--trace",
            csv,
            "--trace",
            FIXTURE,
            "--algorithm",
            "sliding_log",
            "--limit",
            "5",
            "--window",
            "10s",
        ])
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "limit 5 per 10s, traces keyed by client");
        // Two files called access.log: named by their paths.
        assert_eq!(
            lines[1],
            format!("{FIXTURE}: a combined log, 36 requests from 3 clients over 31s, 3 malformed lines skipped")
        );
        assert_eq!(
            lines[2],
            format!("{csv}: a `timestamp,key` CSV, 3 requests from 2 clients over 2s")
        );
        assert!(lines[3].starts_with("traffic"), "{table}");
        assert_eq!(lines.len(), 6, "{table}");
        assert!(lines[4].starts_with(FIXTURE) && lines[4].contains(" 36 "), "{table}");
        assert!(lines[5].starts_with(csv) && lines[5].contains(" 3 "), "{table}");
    }

    #[test]
    fn lines_later_than_the_reorder_horizon_are_counted_in_the_heading() {
        let dir = std::env::temp_dir().join(format!("slidegate-simulate-late-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("late.csv");
        // 1020 comes after 1111 released 1100: 80 s out of order.
        std::fs::write(&csv, "timestamp,key\n1000,a\n1100,a\n1111,b\n1020,b\n1112,a\n").unwrap();
        let csv = csv.to_str().unwrap();
        let run = |horizon: &str| {
            output(&[
                "--trace",
                csv,
                "--algorithm",
                "sliding_log",
                "--reorder-horizon",
                horizon,
            ])
            .unwrap()
        };
        let table = run("10s");
        assert_eq!(
            table.lines().nth(1),
            Some(
                "late.csv: a `timestamp,key` CSV, 5 requests from 2 clients over 112s, 1 line out of order by up \
                 to 80s (more than the 10s reorder horizon), decided at the latest time"
            ),
            "{table}"
        );
        // With the default 60 s, 1111 has not released 1100 yet when 1020
        // comes: it is put in its place.
        let table = run("60s");
        assert_eq!(
            table.lines().nth(1),
            Some("late.csv: a `timestamp,key` CSV, 5 requests from 2 clients over 112s"),
            "{table}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn explains_are_named() {
        let err = |argv: &[&str]| format!("{:#}", output(argv).unwrap_err());
        assert!(err(&["--trace", FIXTURE, "--on-error", "stop"]).starts_with(&format!(
            "{FIXTURE}:16: missing `[` before the time, found `10/Oct/2023:13:55:10` (read as a combined log): `"
        )));
        assert_eq!(
            err(&["--trace", FIXTURE, "--max-clients", "2"]),
            format!(
                "{FIXTURE} has 3 distinct keys by client, more than the 2 clients allowed: raise --max-clients to \
                 replay it"
            )
        );
        assert!(err(&["--trace", "/nonexistent/x.log"]).starts_with("reading /nonexistent/x.log: "));
        assert!(err(&["--trace", FIXTURE, "--key-by", "key"]).starts_with("field `key` is not in"));
        // Trace flags need --trace, and the traffic models' flags do not go
        // with it.
        assert!(err(&["--key-by", "user"]).contains("--trace"));
        for flag in [
            ["--traffic", "poisson"],
            ["--duration", "1m"],
            ["--clients", "3"],
            ["--seed", "2"],
        ] {
            let e = err(&["--trace", FIXTURE, flag[0], flag[1]]);
            assert!(e.contains("cannot be used with"), "{flag:?}: {e}");
        }
    }
}
