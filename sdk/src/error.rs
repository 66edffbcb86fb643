//! The SDK's error: what a call to the node, or a setting checked before calling, can fail with.
//! A leaf module: the client, the TLS settings and the worker all return it.

use std::time::Duration;

/// A client error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status (its message names the field at fault).
    #[error("{}", status_text(.0))]
    Status(tonic::Status),
    /// The server could not be reached.
    #[error("cannot reach {endpoint}: {reason}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// No answer in time; for a submit with an idempotency key the outcome is unknown until
    /// retried (the SDK retries by itself).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Bad input detected before sending.
    #[error("{0}")]
    Invalid(String),
}

/// An error with its causes (tonic's own message is just "transport error").
pub(crate) fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        // Layers that repeat their source's text ("tcp connect error: tcp connect error") are
        // said once.
        let text = c.to_string();
        if !reason.ends_with(&text) {
            reason.push_str(&format!(": {text}"));
        }
        cause = c.source();
    }
    reason
}

fn status_text(s: &tonic::Status) -> String {
    let mut text = format!("{}: {}", code_name(s.code()), s.message());
    // A status made on this side from a broken connection carries its causes (e.g. the
    // node's TLS alert refusing this client's certificate): show them.
    if let Some(cause) = std::error::Error::source(s) {
        text.push_str(&format!(": {}", causes(cause)));
    }
    text
}

fn code_name(c: tonic::Code) -> String {
    format!("{c:?}")
}

impl Error {
    /// The gRPC code (Unavailable for connection problems, DeadlineExceeded for time-outs).
    pub fn code(&self) -> tonic::Code {
        match self {
            Error::Status(s) => s.code(),
            Error::Connect { .. } => tonic::Code::Unavailable,
            Error::Timeout(_) => tonic::Code::DeadlineExceeded,
            Error::Invalid(_) => tonic::Code::InvalidArgument,
        }
    }

    /// Whether TLS failed in a way retrying does not mend: the node refused this client's
    /// certificate (none given, or one its client CA did not sign), or this client does not
    /// trust the node's certificate.
    pub fn is_tls_failure(&self) -> bool {
        let text = self.to_string();
        text.contains("received fatal alert") || text.contains("invalid peer certificate")
    }

    /// Whether retrying the same request may succeed: the node was unreachable, did not
    /// answer in time, or the connection broke mid-call (tonic reports a reset connection as
    /// `Unknown` / `Cancelled`). The outcome of such a call is unknown.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Aborted
        )
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn a_cause_repeated_by_its_wrapper_is_said_once() {
        let refused = Layer("Connection refused", None);
        let e = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer("tcp connect error", Some(Box::new(refused))))),
            ))),
        );
        assert_eq!(super::causes(&e), "transport error: tcp connect error: Connection refused");
    }
}
