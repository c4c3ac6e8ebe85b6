//! Without an OpenTelemetry layer, a decision's span costs nothing: under
//! the binary's log (a `fmt` layer whose filter turns the decision target
//! off), the span is disabled by its callsite's cached interest, no
//! header is read and nothing is allocated. Measured with a counting
//! global allocator: the allocations of the thread opening and finishing
//! the spans (another thread, the test harness's, may allocate meanwhile:
//! the process-wide peak once rose by 900 bytes of it in CI).

use http::HeaderMap;
use slidegate_conformance::alloc::{Counting, allocations_here};
use slidegate_server::metrics::{Api, Outcome};
use slidegate_server::trace::{DECISION_TARGET, DecisionSpan};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

#[global_allocator]
static ALLOC: Counting = Counting::new();

#[test]
fn a_decision_span_without_a_tracing_layer_allocates_nothing() {
    let filter =
        tracing_subscriber::EnvFilter::new("info").add_directive(format!("{DECISION_TARGET}=off").parse().unwrap());
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_filter(filter);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(log)).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    headers.insert(
        "b3",
        "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1".parse().unwrap(),
    );
    // The first call registers the callsite (its interest is cached then).
    DecisionSpan::start(&headers, Api::Grpc, Some("d"), 1, "memory").finish(Outcome::Ok);
    tracing::info!("the log is on");
    let before = allocations_here();
    let start = std::time::Instant::now();
    const ROUNDS: u32 = 100_000;
    for i in 0..ROUNDS {
        let span = DecisionSpan::start(&headers, Api::Json, Some("domain"), 3, "memory");
        assert!(span.is_disabled());
        span.finish(if i % 2 == 0 { Outcome::Ok } else { Outcome::OverLimit });
    }
    let per_span = start.elapsed() / ROUNDS;
    assert_eq!(allocations_here(), before, "a disabled decision span allocated");
    eprintln!("a disabled decision span: {per_span:?} each");
}
