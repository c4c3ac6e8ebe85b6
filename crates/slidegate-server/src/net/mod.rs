//! The network side: listeners (TCP and Unix sockets), TLS, the
//! connections' timeouts and caps, the canned answers to what is not HTTP,
//! the worker threads and the watching of files. It hands each
//! connection's calls to [`crate::api`], and nothing below imports it.

pub mod admission;
pub(crate) mod canned;
pub mod conn;
pub mod listen;
pub mod metrics_listener;
pub mod tls;
pub(crate) mod watch;
pub(crate) mod workers;
