//! Request metrics per gRPC method and HTTP route: count, errors by code and a latency
//! histogram. The HTTP middleware labels a request by its route template (`/executions/{id}`,
//! never the raw path), the gRPC layer by its method path; at most [`METRICS_ROUTES_MAX`] are
//! kept apart, the rest counted as `_other`. A call's latency runs until its response head:
//! for the `Work` stream, until the stream is open. A gRPC error is the `grpc-status` of a
//! trailers-only answer (how a handler's error is sent); a stream failing later is not counted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use super::histogram::{Histogram, HistogramSnapshot};
use crate::limits::METRICS_ROUTES_MAX;

/// The label of calls past [`METRICS_ROUTES_MAX`] routes.
pub const OTHER: &str = "_other";

/// A protocol's label set of one route: `[("method", …)]` for gRPC,
/// `[("method", "GET"), ("route", …)]` for HTTP.
type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Default)]
struct Route {
    requests: AtomicU64,
    latency: Histogram,
    /// Errors by code (a gRPC code name, an HTTP status).
    errors: Mutex<BTreeMap<String, u64>>,
}

/// The request metrics of one protocol.
#[derive(Debug, Default)]
struct Routes {
    by: Mutex<BTreeMap<Labels, Arc<Route>>>,
}

impl Routes {
    fn route(&self, labels: Labels, other: impl FnOnce() -> Labels) -> Arc<Route> {
        let mut m = self.by.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = m.get(&labels) {
            return r.clone();
        }
        let labels = if m.len() < METRICS_ROUTES_MAX { labels } else { other() };
        m.entry(labels).or_default().clone()
    }

    fn record(&self, r: &Route, error: Option<String>, took: Duration) {
        r.requests.fetch_add(1, Ordering::Relaxed);
        r.latency.observe(took);
        if let Some(code) = error {
            *r.errors.lock().unwrap_or_else(|e| e.into_inner()).entry(code).or_default() += 1;
        }
    }

    fn register(&self, reg: &mut Registry, prefix: &str, what: &str) {
        let m = self.by.lock().unwrap_or_else(|e| e.into_inner());
        let requests = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let mut latency = Vec::new();
        for (labels, r) in m.iter() {
            requests.get_or_create(labels).inc_by(r.requests.load(Ordering::Relaxed));
            for (code, n) in r.errors.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let mut l = labels.clone();
                l.push(("code", code.clone()));
                errors.get_or_create(&l).inc_by(*n);
            }
            latency.push((labels.clone(), r.latency.snapshot()));
        }
        reg.register(
            format!("{prefix}_requests"),
            format!("{what} handled, by {}", label_names(prefix)),
            requests,
        );
        reg.register(
            format!("{prefix}_request_errors"),
            format!("{what} answered with an error, by code"),
            errors,
        );
        reg.register_with_unit(
            format!("{prefix}_request_duration"),
            format!("Latency of {} until the response head", what.to_lowercase()),
            Unit::Seconds,
            Histograms(latency),
        );
    }
}

fn label_names(prefix: &str) -> &'static str {
    if prefix.contains("grpc") { "method" } else { "method and route template" }
}

/// Latency histograms by label set.
#[derive(Debug)]
struct Histograms(Vec<(Labels, HistogramSnapshot)>);

impl EncodeMetric for Histograms {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, h) in &self.0 {
            h.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The node's request metrics (one per node, in [`super::metrics::Metrics`]).
#[derive(Debug, Default)]
pub struct RequestMetrics {
    grpc: Routes,
    http: Routes,
}

impl RequestMetrics {
    /// Records a gRPC call of `method` (its path); `error`: its code's name.
    pub fn grpc(&self, method: &str, error: Option<String>, took: Duration) {
        let r = self
            .grpc
            .route(vec![("method", method.to_string())], || vec![("method", OTHER.to_string())]);
        self.grpc.record(&r, error, took);
    }

    /// Records an HTTP request of `method` on `route` (a template, or `_unmatched`) answered
    /// with `status`: an error when 400 or above.
    pub fn http(&self, method: &str, route: &str, status: u16, took: Duration) {
        let labels = vec![("method", method.to_string()), ("route", route.to_string())];
        let r = self
            .http
            .route(labels, || vec![("method", OTHER.to_string()), ("route", OTHER.to_string())]);
        self.http.record(&r, (status >= 400).then(|| status.to_string()), took);
    }

    /// Registers both protocols' metrics.
    pub fn register(&self, reg: &mut Registry) {
        self.grpc.register(reg, "kairos_grpc", "gRPC calls");
        self.http.register(reg, "kairos_http", "HTTP requests");
    }
}
