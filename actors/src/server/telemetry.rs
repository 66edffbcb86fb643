//! Logs and traces. Logs go to stderr (text or JSON, filtered by `log`). With the `otel` cargo
//! feature and `otlp_endpoint` set (a collector's OTLP/HTTP traces URL, e.g.
//! `http://127.0.0.1:4318/v1/traces`), the node's spans are also exported (protobuf), each
//! execution's spans as children of the trace context its submit carried (`traceparent`), so
//! one trace runs from the client's submit through the node to the worker's handler.
//!
//! The spans (target `kairos::trace`, level DEBUG, so they cost nothing unless exported or
//! asked for with `log: kairos::trace=debug`): `kairos.submit` (a submit call, with the
//! execution's id) and `kairos.dispatch` (an attempt handed to a worker). The worker continues
//! the trace from `Task.traceparent`.

use crate::server::config::{LogFormat, NodeConfig};

/// The target of the node's execution spans.
pub const TARGET: &str = "kairos::trace";

/// Keeps the exporter alive; flushes what is buffered when dropped.
pub struct Guard {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown_with_timeout(std::time::Duration::from_secs(5));
        }
    }
}

/// Installs the process's subscriber: the log layer, and the OTLP layer when configured.
pub fn init(config: &NodeConfig) -> anyhow::Result<Guard> {
    use std::io::IsTerminal;

    use anyhow::Context as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .with_context(|| format!("config log: bad filter {:?}", config.log))?;
    let fmt = tracing_subscriber::fmt::layer().with_target(false);
    let logs = match config.log_format {
        LogFormat::Text => fmt
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_writer(|| json_lines::NodeIdLine(std::io::stderr()))
            .with_filter(filter)
            .boxed(),
    };
    #[cfg(feature = "otel")]
    {
        let mut layers = vec![logs];
        let mut provider = None;
        if let Some(endpoint) = &config.otlp_endpoint {
            let (layer, p) = otel::layer(endpoint)?;
            layers.push(layer);
            provider = Some(p);
        }
        tracing_subscriber::registry().with(layers).init();
        Ok(Guard { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        if let Some(endpoint) = &config.otlp_endpoint {
            anyhow::bail!(
                "config otlp_endpoint: {endpoint:?} is set, but this binary was built without \
                 the `otel` feature (cargo build --release -p kairos-actors --features otel)"
            );
        }
        tracing_subscriber::registry().with(logs).init();
        Ok(Guard {})
    }
}

/// Sets the node id every JSON log line carries from here on (`"node_id"`, first).
pub fn set_node_id(id: &str) {
    let _ = json_lines::NODE_ID.set(format!("{{\"node_id\":{},", serde_json::Value::from(id)));
}

mod json_lines {
    use std::io::Write;

    /// `{"node_id":"…",` — what each JSON line starts with instead of `{`.
    pub(super) static NODE_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

    /// A JSON log line's writer: the node id added as the object's first field. The JSON
    /// formatter writes each line whole, in one `write_all`.
    pub(super) struct NodeIdLine<W: Write>(pub(super) W);

    impl<W: Write> Write for NodeIdLine<W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            match (NODE_ID.get(), buf.first()) {
                (Some(prefix), Some(b'{')) => {
                    let mut line = Vec::with_capacity(prefix.len() + buf.len());
                    line.extend_from_slice(prefix.as_bytes());
                    line.extend_from_slice(&buf[1..]);
                    self.0.write_all(&line)?;
                }
                _ => self.0.write_all(buf)?,
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
}

/// A span of an execution's trace (`name` is `kairos.submit` or `kairos.dispatch`; record
/// `execution_id` on it when known): a child of `traceparent` when spans are exported.
pub fn execution_span(name: &'static str, traceparent: &str) -> tracing::Span {
    let span = if name == "kairos.submit" {
        tracing::debug_span!(target: "kairos::trace", "kairos.submit", execution_id = tracing::field::Empty)
    } else {
        tracing::debug_span!(target: "kairos::trace", "kairos.dispatch", execution_id = tracing::field::Empty)
    };
    #[cfg(feature = "otel")]
    if !traceparent.is_empty() && !span.is_disabled() {
        otel::set_parent(&span, traceparent);
    }
    #[cfg(not(feature = "otel"))]
    let _ = traceparent;
    span
}

#[cfg(feature = "otel")]
mod otel {
    use anyhow::Context as _;
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::Layer as _;

    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

    /// The OTLP layer: the node's execution spans (and its info-level spans) to `endpoint`.
    pub(super) fn layer(
        endpoint: &str,
    ) -> anyhow::Result<(Boxed, opentelemetry_sdk::trace::SdkTracerProvider)> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("config otlp_endpoint {endpoint:?}"))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder().with_service_name("kairos").build(),
            )
            .build();
        let tracer = provider.tracer("kairos");
        let only = tracing_subscriber::filter::Targets::new()
            .with_target(super::TARGET, tracing::Level::DEBUG)
            .with_default(tracing::Level::INFO);
        let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(only).boxed();
        Ok((layer, provider))
    }

    /// Makes `span` a child of the W3C trace context `traceparent`.
    pub(super) fn set_parent(span: &tracing::Span, traceparent: &str) {
        let carrier =
            std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        let _ = span.set_parent(cx);
    }
}
