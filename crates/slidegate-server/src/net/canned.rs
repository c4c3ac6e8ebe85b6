//! hyper's own error answers, as problem documents. A request that does
//! not parse (400), whose header section is too large (431) or whose URI
//! is too long (414) is answered by hyper itself, before the router sees
//! it, with an empty body and `connection: close`. This socket wrapper
//! recognises such an answer as hyper writes it, and writes instead the
//! same head with an `application/problem+json` body, as every other
//! error of the HTTP API has.

use http::StatusCode;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What hyper's answers to requests it could not parse start with, and
/// what each means to the client.
const CANNED: [(&[u8], StatusCode, &str); 3] = [
    (
        b"HTTP/1.1 400 Bad Request\r\n",
        StatusCode::BAD_REQUEST,
        "the request is not valid HTTP/1.1 (request line or header)",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "the request's header section is too large: at most 100 header fields and about 400 KiB",
    ),
    (
        b"HTTP/1.1 414 URI Too Long\r\n",
        StatusCode::URI_TOO_LONG,
        "the request's URI is too long",
    ),
];

/// The empty body hyper's answers declare.
const EMPTY: &[u8] = b"\r\ncontent-length: 0\r\n";

/// The problem answer to write instead of `head`, if `head` is one of
/// hyper's own error answers (a whole head, with an empty body).
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (_, status, detail) = CANNED.iter().find(|(start, _, _)| head.starts_with(start))?;
    if !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let at = head.windows(EMPTY.len()).position(|w| w == EMPTY)?;
    let (before, after) = (head.get(..at)?, head.get(at + EMPTY.len()..)?);
    let body = crate::api::problem::problem_json(*status, detail);
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(before);
    out.extend_from_slice(b"\r\ncontent-type: application/problem+json\r\ncontent-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(after);
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

/// A server-side HTTP/1.1 socket on which hyper's own error answers are
/// replaced by problem answers. A write is looked at only when it starts
/// with `HTTP/1.1 4` (a head of a 4xx answer): the router's answers carry
/// a body, so only hyper's match.
pub(crate) struct ProblemAnswers<T> {
    inner: T,
    /// The replacement still to write, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> ProblemAnswers<T> {
    pub(crate) fn new(inner: T) -> Self {
        ProblemAnswers { inner, pending: None }
    }
}

impl<T: AsyncWrite + Unpin> ProblemAnswers<T> {
    /// Writes what is pending; ready when nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            let rest = bytes.get(*written..).unwrap_or_default();
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
            if *written >= bytes.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemAnswers<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemAnswers<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if buf.starts_with(b"HTTP/1.1 4")
            && let Some(bytes) = replacement(buf)
        {
            // The whole head is taken: the replacement goes out in its
            // place, on this call and the next ones.
            self.pending = Some((bytes, 0));
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper writes a head alone, as the first slice: look at it.
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(first) if first.starts_with(b"HTTP/1.1 4") => self.poll_write(cx, first),
            _ => {
                ready!(self.poll_pending(cx))?;
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_answers_get_a_problem_body_and_others_pass() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 15:26:17 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(head).unwrap()).unwrap();
        let (new_head, body) = out.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            new_head,
            "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-type: application/problem+json\r\ncontent-length: 185\r\ndate: Tue, 01 Dec 2026 15:26:17 GMT"
                .replace("185", &body.len().to_string())
        );
        let doc: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(doc["status"], 431);
        assert_eq!(doc["title"], "Request Header Fields Too Large");
        // An answer of the router's (a body), and a head cut short, pass.
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
