//! A tower layer over the gRPC services counting each call in the node's request metrics
//! ([`crate::server::requests`]): its method path, its latency until the response head and
//! the `grpc-status` of an error answered trailers-only.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::http;

use crate::server::metrics::Metrics;

/// The layer: [`Track`] around a service.
#[derive(Clone)]
pub struct TrackLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;
    fn layer(&self, inner: S) -> Track<S> {
        Track { inner, metrics: self.0.clone() }
    }
}

/// A service whose calls are counted.
#[derive(Clone)]
pub struct Track<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Track<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Boxed<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        let metrics = self.metrics.clone();
        #[allow(clippy::disallowed_methods)] // a request's latency: wall time of real I/O
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            let error = match &r {
                Ok(resp) => error_code(resp.headers()),
                Err(_) => Some(format!("{:?}", tonic::Code::Internal)),
            };
            metrics.requests.grpc(&method, error, start.elapsed());
            r
        })
    }
}

/// The code name of a trailers-only error answer (`grpc-status` in the head, not 0).
fn error_code(h: &http::HeaderMap) -> Option<String> {
    let n: i32 = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    (n != 0).then(|| format!("{:?}", tonic::Code::from_i32(n)))
}
