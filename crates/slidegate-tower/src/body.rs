//! The response body of a rate-limited service: the inner service's body,
//! or the layer's own refusal.

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// The body of a [`RateLimitService`](crate::RateLimitService)'s
    /// response: the inner service's body when the request was admitted,
    /// the refusal's problem document (or nothing, for gRPC) when it was
    /// not. Works wherever the inner body does (axum, hyper, tonic), since
    /// it needs no conversion from text.
    pub struct Body<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        Refusal {
            bytes: Option<Bytes>,
        },
    }
}

impl<B> Body<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        Body {
            kind: Kind::Inner { body },
        }
    }

    /// A refusal's body (empty bytes make an empty body).
    pub(crate) fn refusal(bytes: Bytes) -> Self {
        Body {
            kind: Kind::Refusal {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    /// The inner service's body, if the request was admitted.
    pub fn into_inner(self) -> Option<B> {
        match self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Refusal { .. } => None,
        }
    }
}

impl<B> http_body::Body for Body<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Refusal { bytes } => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Refusal { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Refusal { bytes } => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use std::task::Waker;

    fn frames<B: http_body::Body<Data = Bytes> + Unpin>(mut body: B) -> Vec<Bytes>
    where
        B::Error: std::fmt::Debug,
    {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(frame.expect("no error").into_data().expect("a data frame"));
        }
        out
    }

    #[test]
    fn a_refusal_is_one_frame_of_known_size() {
        let body: Body<String> = Body::refusal(Bytes::from_static(b"{}"));
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        assert_eq!(frames(body), vec![Bytes::from_static(b"{}")]);
        let empty: Body<String> = Body::refusal(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(frames(empty).is_empty());
    }

    #[test]
    fn the_inner_body_passes_through() {
        let body = Body::inner(String::from("hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(frames(body), vec![Bytes::from_static(b"hello")]);
        assert_eq!(Body::inner(String::from("x")).into_inner().as_deref(), Some("x"));
        assert!(Body::<String>::refusal(Bytes::new()).into_inner().is_none());
    }
}
