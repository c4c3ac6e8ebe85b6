//! Where the service listens: a TCP address or a Unix domain socket
//! ([`Endpoint`]), the listeners bound on them and the streams they accept
//! (plain TCP, TLS over TCP, or a Unix socket).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
#[cfg(unix)]
use tokio::net::{UnixListener, UnixStream};

/// An address to listen on: `127.0.0.1:8081`, `[::1]:8081`, or
/// `unix:/run/slidegate.sock` for a Unix domain socket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// A TCP address (port 0 picks a free port).
    Tcp(SocketAddr),
    /// The path of a Unix domain socket.
    Unix(PathBuf),
}

impl Endpoint {
    /// The TCP address, if this is one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Endpoint::Tcp(addr) => Some(*addr),
            Endpoint::Unix(_) => None,
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Self {
        Endpoint::Tcp(addr)
    }
}

/// Why a text is not an [`Endpoint`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// `unix:` without a path.
    #[error("`unix:` needs the socket's path, as in `unix:/run/slidegate.sock`")]
    EmptyPath,
    /// Neither `unix:PATH` nor `IP:PORT`.
    #[error("`{0}` is neither IP:PORT nor unix:PATH")]
    Invalid(String),
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.strip_prefix("unix:") {
            Some("") => Err(EndpointError::EmptyPath),
            Some(path) => Ok(Endpoint::Unix(PathBuf::from(path))),
            None => text
                .parse()
                .map(Endpoint::Tcp)
                .map_err(|_| EndpointError::Invalid(text.to_owned())),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(addr) => addr.fmt(f),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A bound listener. A Unix socket's file is removed when the listener is
/// dropped.
pub(crate) enum Listener {
    Tcp(TcpListener),
    #[cfg(unix)]
    Unix(UnixListener, SocketFile),
}

impl Listener {
    /// Binds `endpoint`. A Unix socket's path may hold a socket left by a
    /// process that is gone (nothing accepts on it): it is replaced;
    /// anything else there is an error.
    pub(crate) async fn bind(endpoint: &Endpoint) -> io::Result<Listener> {
        match endpoint {
            Endpoint::Tcp(addr) => TcpListener::bind(addr).await.map(Listener::Tcp),
            #[cfg(unix)]
            Endpoint::Unix(path) => {
                remove_stale_socket(path).await?;
                let listener = UnixListener::bind(path)?;
                Ok(Listener::Unix(listener, SocketFile(path.clone())))
            }
            #[cfg(not(unix))]
            Endpoint::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "Unix domain sockets need a Unix system",
            )),
        }
    }

    /// Where it listens (with the port a port 0 was given).
    pub(crate) fn local(&self, asked: &Endpoint) -> Endpoint {
        match self {
            Listener::Tcp(listener) => listener.local_addr().map_or_else(|_| asked.clone(), Endpoint::Tcp),
            #[cfg(unix)]
            Listener::Unix(_, file) => Endpoint::Unix(file.0.clone()),
        }
    }

    /// The next connection, and the address of its peer (a TCP client's
    /// IP; none on a Unix socket).
    pub(crate) async fn accept(&self) -> io::Result<(Stream, Option<std::net::IpAddr>)> {
        match self {
            Listener::Tcp(listener) => listener.accept().await.map(|(stream, peer)| {
                // An answer goes out when written, not after the client's
                // delayed ACK (Nagle's algorithm): without this, a head and
                // a body written apart wait up to 40 ms.
                let _ = stream.set_nodelay(true);
                (Stream::Tcp(stream), Some(peer.ip()))
            }),
            #[cfg(unix)]
            Listener::Unix(listener, _) => listener.accept().await.map(|(stream, _)| (Stream::Unix(stream), None)),
        }
    }
}

/// Removes a socket file nothing accepts on; refuses a path that holds
/// anything else, or a socket that answers.
#[cfg(unix)]
async fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket",
        ));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another process accepts on this socket",
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(e),
    }
}

/// A Unix socket's path, removed on drop.
#[cfg(unix)]
pub(crate) struct SocketFile(PathBuf);

#[cfg(unix)]
impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "cannot remove the socket file");
        }
    }
}

/// An accepted connection.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// An accepted connection not yet registered with any runtime's reactor,
/// to be moved to another runtime.
pub(crate) enum Unregistered {
    Tcp(std::net::TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Unregistered {
    /// Registers the connection with the calling runtime's reactor.
    pub(crate) fn register(self) -> io::Result<Stream> {
        match self {
            Unregistered::Tcp(stream) => TcpStream::from_std(stream).map(Stream::Tcp),
            #[cfg(unix)]
            Unregistered::Unix(stream) => UnixStream::from_std(stream).map(Stream::Unix),
        }
    }
}

impl Stream {
    /// The connection taken off this runtime's reactor (still in
    /// non-blocking mode), to be registered with another's; a TLS stream,
    /// which is made on the runtime that serves it, is given back.
    pub(crate) fn unregister(self) -> Result<io::Result<Unregistered>, Stream> {
        match self {
            Stream::Tcp(stream) => Ok(stream.into_std().map(Unregistered::Tcp)),
            #[cfg(unix)]
            Stream::Unix(stream) => Ok(stream.into_std().map(Unregistered::Unix)),
            tls @ Stream::Tls(_) => Err(tls),
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Tcp($s) => $e,
            Stream::Tls($s) => $e,
            #[cfg(unix)]
            Stream::Unix($s) => $e,
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            #[cfg(unix)]
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print_back() {
        for text in [
            "127.0.0.1:8081",
            "[::1]:0",
            "unix:/run/slidegate.sock",
            "unix:relative.sock",
        ] {
            let endpoint: Endpoint = text.parse().unwrap();
            assert_eq!(endpoint.to_string(), text);
        }
        assert_eq!(
            "unix:/a b".parse::<Endpoint>().unwrap(),
            Endpoint::Unix(PathBuf::from("/a b"))
        );
        assert!(matches!("unix:".parse::<Endpoint>(), Err(EndpointError::EmptyPath)));
        let error = "localhost:80".parse::<Endpoint>().unwrap_err();
        assert_eq!(error.to_string(), "`localhost:80` is neither IP:PORT nor unix:PATH");
    }
}
