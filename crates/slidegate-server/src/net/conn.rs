//! Connections with deadlines: the accept loop both front ends share
//! (each connection's TLS handshake in its own task, within the header
//! timeout), the serving of a connection on hyper's connection builders
//! (HTTP/1.1, with the header timeout `axum::serve` lacks; HTTP/2 for
//! gRPC) and the socket wrapper that closes a connection that says nothing
//! in time.

use crate::log_limit::LogLimit;
use crate::net::admission::{Admission, Close, Ticket, is_protocol_error};
use crate::net::listen::{Listener, Stream};
use crate::net::tls::{Alpn, Tls};
use crate::net::workers::Workers;
use hyper_util::server::graceful::GracefulConnection;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

/// How long a connection may take, and stay silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// HTTP/1.1: the longest wait for a request's headers, counted from
    /// when the connection opens or the previous answer is sent (so also
    /// the longest idle time between requests on a kept-alive connection);
    /// gRPC: the longest wait for the 24 bytes of the HTTP/2 preface. With
    /// TLS the handshake must also finish within it (for gRPC, the
    /// handshake and the preface together, counted from the connection
    /// opening).
    pub header: Duration,
    /// The longest time a connection may go without a byte read or
    /// written; it is then closed.
    pub idle: Duration,
    /// HTTP: the longest wait for a request body (then 408); gRPC: the
    /// longest a call may take (then `CANCELLED`, as tonic answers it), or
    /// the client's `grpc-timeout` if shorter.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            request: Duration::from_secs(10),
        }
    }
}

/// The length of the HTTP/2 client preface (`PRI * HTTP/2.0...`).
pub(crate) const HTTP2_PREFACE_LEN: usize = 24;

/// A socket that fails with [`io::ErrorKind::TimedOut`] once its first
/// `opening` bytes have not all arrived within `header` of the connection
/// opening, or once no byte has been read or written for `idle`. The
/// deadline is checked only when a read or write would wait, so an active
/// connection pays one clock read per read or write.
pub(crate) struct Guarded<T> {
    inner: T,
    timer: Pin<Box<Sleep>>,
    opening: usize,
    opened: Instant,
    last: Instant,
    header: Duration,
    idle: Duration,
}

impl<T> Guarded<T> {
    /// Wraps `inner`, opened at `opened` (when it was accepted).
    pub(crate) fn new(inner: T, opening: usize, timeouts: Timeouts, opened: Instant) -> Self {
        let now = Instant::now();
        let mut guarded = Guarded {
            inner,
            timer: Box::pin(tokio::time::sleep_until(now)),
            opening,
            opened,
            last: now,
            header: timeouts.header,
            idle: timeouts.idle,
        };
        let deadline = guarded.deadline();
        guarded.timer.as_mut().reset(deadline);
        guarded
    }

    fn deadline(&self) -> Instant {
        let idle = self.last.checked_add(self.idle).unwrap_or(self.last);
        if self.opening > 0 {
            let opening = self.opened.checked_add(self.header).unwrap_or(self.opened);
            opening.min(idle)
        } else {
            idle
        }
    }

    /// Whether the deadline has passed; if not, the task is woken when it
    /// does.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.deadline();
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }

    fn active(&mut self) {
        self.last = Instant::now();
    }

    fn timed_out(&self) -> io::Error {
        let what = if self.opening > 0 {
            "the connection did not open in time"
        } else {
            "the connection was idle for too long"
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len().saturating_sub(before);
                if read > 0 {
                    self.opening = self.opening.saturating_sub(read);
                    self.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.poll_expired(cx) => Poll::Ready(Err(self.timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.poll_expired(cx) => Poll::Ready(Err(self.timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.poll_expired(cx) => Poll::Ready(Err(self.timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts on `listener` until `stopped` turns true, then closes it (a
/// Unix socket's file is removed) and returns the connections' tasks still
/// running. Each connection is first admitted (`admission`: under the cap
/// on open connections, making room or shed at once as
/// [`crate::net::admission`] says), then gets a task of its own, in which it is
/// opened (the TLS handshake, with `tls`, on TCP only, within the header
/// timeout from when it was accepted; one that fails or is late is
/// dropped) and handed to `serve` with its ticket, guarded: its first
/// `opening` bytes within the header timeout of its acceptance, never the
/// idle timeout without a byte. When `accept` fails (out of descriptors,
/// most often) the loop backs off, 5 ms doubling to 100 ms, the connections
/// already open served meanwhile, and logs one line per 10 s at most.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn accept<F, Fut>(
    listener: Listener,
    tls: Option<(Arc<Tls>, Alpn)>,
    opening: usize,
    timeouts: Timeouts,
    admission: Arc<Admission>,
    mut stopped: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
    serve: F,
) -> JoinSet<()>
where
    F: Fn(Guarded<Stream>, Ticket) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let stop = async move {
        let _ = stopped.wait_for(|&s| s).await;
    };
    let mut stop = std::pin::pin!(stop);
    let mut backoff = ACCEPT_BACKOFF_FIRST;
    let accept_log = LogLimit::new(ACCEPT_LOG_EVERY);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff = ACCEPT_BACKOFF_FIRST;
                    let opened = Instant::now();
                    let Some(ticket) = admission.admit(opened, peer) else {
                        // Every place is taken by a connection with a call
                        // in flight: closed at once (counted).
                        drop(stream);
                        continue;
                    };
                    let acceptor = tls.as_ref().map(|(tls, alpn)| tls.acceptor(*alpn));
                    let serve = serve.clone();
                    let connection = move |stream| async move {
                        let deadline = opened.checked_add(timeouts.header).unwrap_or(opened);
                        match open(stream, acceptor, deadline).await {
                            Ok(stream) => serve(Guarded::new(stream, opening, timeouts, opened), ticket).await,
                            // A client's business, as in serving.
                            Err(e) => tracing::debug!(error = %e, "a TLS handshake failed"),
                        }
                    };
                    match workers.as_deref().and_then(Workers::next) {
                        None => {
                            connections.spawn(connection(stream));
                        }
                        Some(worker) => match stream.unregister() {
                            Ok(Ok(moved)) => {
                                // Registered, opened and served on the
                                // worker; dropping the set's task (a
                                // handshake under way when the server stops)
                                // drops the worker's too.
                                let task = worker.spawn(async move {
                                    match moved.register() {
                                        Ok(stream) => connection(stream).await,
                                        Err(e) => tracing::warn!(error = %e, "cannot register a connection with its worker"),
                                    }
                                });
                                let abort = AbortOnDrop(task.abort_handle());
                                connections.spawn(async move {
                                    let _abort = abort;
                                    let _ = task.await;
                                });
                            }
                            Ok(Err(e)) => tracing::warn!(error = %e, "cannot move a connection to its worker"),
                            Err(stream) => {
                                connections.spawn(connection(stream));
                            }
                        },
                    }
                }
                Err(e) => {
                    // Out of file descriptors, most likely: wait rather
                    // than spin, longer each time, the open connections
                    // served meanwhile.
                    admission.accept_error();
                    if let Some(more) = accept_log.hit(Instant::now().into_std()) {
                        tracing::warn!(error = %e, failed_since_last_line = more, "cannot accept connections; backing off");
                    }
                    let resume = Instant::now() + backoff;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MOST);
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep_until(resume) => break,
                            Some(_) = connections.join_next(), if !connections.is_empty() => {}
                        }
                    }
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut stop => break,
        }
    }
    drop(listener);
    connections
}

/// The first wait after a failed `accept`.
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// The longest wait after failed `accept`s.
const ACCEPT_BACKOFF_MOST: Duration = Duration::from_millis(100);
/// At most one log line per this long for failed `accept`s.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Aborts a task (on another runtime) when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The TLS handshake of a TCP connection, if `acceptor`, by `deadline`.
async fn open(stream: Stream, acceptor: Option<tokio_rustls::TlsAcceptor>, deadline: Instant) -> io::Result<Stream> {
    match (stream, acceptor) {
        (Stream::Tcp(tcp), Some(acceptor)) => match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => Ok(Stream::Tls(Box::new(tls))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the TLS handshake did not finish within the header timeout",
            )),
        },
        (stream, _) => Ok(stream),
    }
}

/// Serves HTTP/1.1 on `listener` until `stopped` turns true, then stops
/// accepting (the listener is closed at once) and lets every connection
/// finish the request in flight.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_http(
    listener: Listener,
    tls: Option<Arc<Tls>>,
    routes: crate::api::http::Routes,
    timeouts: Timeouts,
    admission: Arc<Admission>,
    stopped: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
) {
    let connection_stop = stopped.clone();
    let serve = move |stream, ticket: Ticket| {
        let io = hyper_util::rt::TokioIo::new(crate::net::canned::ProblemAnswers::new(stream));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(timeouts.header);
        let service = ticket.track(routes.clone(), crate::api::http::overloaded);
        serve_connection(
            builder.serve_connection(io, service),
            connection_stop.clone(),
            ticket,
            timeouts,
        )
    };
    let tls = tls.map(|tls| (tls, Alpn::Http1));
    serve_listener("HTTP", listener, tls, 0, timeouts, admission, stopped, workers, serve).await;
}

/// The flow-control window of each HTTP/2 stream: HTTP/2's own default
/// (hyper's is 1 MiB). A stream's unread data is bounded by it, and a
/// `ShouldRateLimit` request is a few hundred bytes.
const STREAM_WINDOW: u32 = 65_535;

/// The streams one HTTP/2 connection may make the server refuse or reset
/// (streams past `--max-concurrent-streams`, say) before it is closed
/// (`GOAWAY` `ENHANCE_YOUR_CALM`). hyper's default, 1,024, closes a
/// connection flooding streams after a few hundred of them, and the flood
/// goes on over new connections: each costs a handshake and its accepted
/// streams' bodies, and the churn cost the other clients more than the
/// refusals themselves (25,000 streams of 60 KB: 5 s of server CPU and a
/// legitimate client's p99 at 90 ms, against 1.2 s and 1.5 ms with the
/// flood kept on its connection and refused there).
const MAX_REFUSED_STREAMS: usize = 65_536;

/// Serves gRPC (HTTP/2 only, on hyper's connection builder, with
/// `max_streams` concurrent streams a connection, a 64 KiB window a
/// stream and [`MAX_REFUSED_STREAMS`], hyper's defaults otherwise) on `listener` until `stopped` turns
/// true, then stops accepting and lets every connection finish the calls
/// in flight (a `GOAWAY` first).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_grpc(
    listener: Listener,
    tls: Option<Arc<Tls>>,
    routes: crate::api::grpc_routes::GrpcRoutes,
    timeouts: Timeouts,
    admission: Arc<Admission>,
    stopped: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
) {
    let connection_stop = stopped.clone();
    let max_streams = admission.limits().max_streams;
    let serve = move |stream, ticket: Ticket| {
        let io = hyper_util::rt::TokioIo::new(stream);
        let mut builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .max_concurrent_streams(max_streams)
            .initial_stream_window_size(STREAM_WINDOW)
            .max_local_error_reset_streams(MAX_REFUSED_STREAMS);
        let service = ticket
            .track(routes.clone(), crate::api::grpc_routes::overloaded)
            .holding(|path| path.starts_with(crate::api::rlqs::RLQS_PATH));
        serve_connection(
            builder.serve_connection(io, service),
            connection_stop.clone(),
            ticket,
            timeouts,
        )
    };
    let tls = tls.map(|tls| (tls, Alpn::H2));
    serve_listener(
        "gRPC",
        listener,
        tls,
        HTTP2_PREFACE_LEN,
        timeouts,
        admission,
        stopped,
        workers,
        serve,
    )
    .await;
}

/// Accepts on `listener` (`accept`) until `stopped` turns true, then waits
/// for the connections still open.
#[allow(clippy::too_many_arguments)]
async fn serve_listener<F, Fut>(
    name: &'static str,
    listener: Listener,
    tls: Option<(Arc<Tls>, Alpn)>,
    opening: usize,
    timeouts: Timeouts,
    admission: Arc<Admission>,
    stopped: watch::Receiver<bool>,
    workers: Option<Arc<Workers>>,
    serve: F,
) where
    F: Fn(Guarded<Stream>, Ticket) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    // The workers run until the connections on them are done.
    let keep = workers.clone();
    let mut connections = accept(listener, tls, opening, timeouts, admission, stopped, workers, serve).await;
    tracing::info!(
        connections = connections.len(),
        "the {name} listener is closed: its open connections finish their requests"
    );
    while connections.join_next().await.is_some() {}
    drop(keep);
}

/// Drives `connection` until it ends, asking it to finish and close once
/// `stopped` turns true, or once its ticket's connection must close (no
/// call started in time, its place wanted, its maximum age: see
/// [`crate::net::admission`]); a connection asked to close gracefully that has
/// not within the request timeout is dropped. A connection that ends with
/// an HTTP/2 protocol error is counted, and logged at warn at most once
/// per 10 s for them all.
async fn serve_connection<G>(connection: G, mut stopped: watch::Receiver<bool>, ticket: Ticket, timeouts: Timeouts)
where
    G: GracefulConnection,
    G::Error: std::error::Error + 'static,
{
    let mut connection = std::pin::pin!(connection);
    let admission = Arc::clone(ticket.admission());
    let conn = Arc::clone(ticket.conn());
    let stop = async move {
        let _ = stopped.wait_for(|&s| s).await;
    };
    let watch = conn.watch(timeouts.header, timeouts.idle, admission.limits().max_age);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
        how = watch => {
            admission.closed(how);
            if how == Close::Now {
                return;
            }
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(timeouts.request, connection).await {
                Ok(result) => result,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = result {
        if is_protocol_error(&e)
            && let Some(more) = admission.protocol_error()
        {
            tracing::warn!(
                error = %e,
                connections_since_last_line = more,
                "HTTP/2 connections closed for protocol errors (a client breaking the protocol or flooding frames); counted in slidegate_connections_closed_total"
            );
        }
        // Timeouts, resets, malformed requests: the client's business.
        tracing::debug!(error = %e, "a connection ended with an error");
    }
    drop(ticket);
}
