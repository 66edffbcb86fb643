//! The one place where operation errors become gRPC statuses and HTTP responses. Messages are
//! the operations' own, which name the field and the reason.

use crate::limits::ERROR_MESSAGE_BYTES_MAX;
use axum::http::StatusCode;
use kairos_layer::kv;
use kairos_layer::ops::Error;
use serde::Serialize;

/// The gRPC code and HTTP status of an error.
pub fn classify(e: &Error) -> (tonic::Code, StatusCode) {
    use tonic::Code;
    match e {
        Error::InvalidArgument { .. } => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
        Error::NotFound { .. } => (Code::NotFound, StatusCode::NOT_FOUND),
        Error::IdempotencyConflict { .. } | Error::AlreadyExists { .. } => {
            (Code::AlreadyExists, StatusCode::CONFLICT)
        }
        Error::FailedPrecondition(_) | Error::InvalidTransition(_) | Error::FencedOut { .. } => {
            (Code::FailedPrecondition, StatusCode::CONFLICT)
        }
        Error::OwnershipLost { .. } | Error::LeaseHeld { .. } => {
            (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE)
        }
        Error::Kv(k) => match k {
            kv::Error::KeyTooLarge { .. }
            | kv::Error::ValueTooLarge { .. }
            | kv::Error::TransactionTooLarge { .. }
            | kv::Error::InvertedRange
            | kv::Error::InvalidOperation(_) => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
            k if k.is_retryable() => (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            kv::Error::DatabaseClosed => (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            kv::Error::StorageFull(_) => {
                (Code::ResourceExhausted, StatusCode::INSUFFICIENT_STORAGE)
            }
            _ => (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
        },
        Error::Corrupt(_) => (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
        Error::QuotaExceeded { .. } => (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
        Error::Unauthenticated(_) => (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
        Error::PermissionDenied(_) => (Code::PermissionDenied, StatusCode::FORBIDDEN),
    }
}

/// Seconds a client should wait before retrying, for errors that pass with time (a full disk,
/// a node between owners); `None` for errors a retry will not fix.
pub fn retry_after_secs(e: &Error) -> Option<u64> {
    match e {
        Error::Kv(kv::Error::StorageFull(_)) => Some(30),
        Error::QuotaExceeded { retry_after_ms, .. } => Some(retry_after_ms.div_ceil(1000).max(1)),
        Error::Kv(kv::Error::DatabaseClosed)
        | Error::OwnershipLost { .. }
        | Error::LeaseHeld { .. } => Some(1),
        Error::Kv(k) if k.is_retryable() => Some(1),
        _ => None,
    }
}

/// An error as a gRPC status (with a `retry-after` metadata entry, in seconds, when waiting
/// helps).
pub fn status(e: &Error) -> tonic::Status {
    let mut s = tonic::Status::new(classify(e).0, shorten(e.to_string()));
    if let Some(secs) = retry_after_secs(e) {
        s.metadata_mut().insert("retry-after", secs.into());
    }
    s
}

/// The JSON body of an HTTP error.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Details of an HTTP error.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorDetail {
    /// gRPC-style code name (`INVALID_ARGUMENT`, `NOT_FOUND`, …).
    pub code: String,
    /// The offending field, when one is at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What went wrong.
    pub message: String,
}

/// An error as an HTTP status and JSON body.
pub fn http(e: &Error) -> (StatusCode, ErrorBody) {
    let (code, status) = classify(e);
    let field = match e {
        Error::InvalidArgument { field, .. } => Some(field.clone()),
        _ => None,
    };
    (status, body(code, field, shorten(e.to_string())))
}

/// `m`, cut at [`ERROR_MESSAGE_BYTES_MAX`] bytes (on a character boundary) with the length said.
pub fn shorten(m: String) -> String {
    if m.len() <= ERROR_MESSAGE_BYTES_MAX {
        return m;
    }
    let mut cut = ERROR_MESSAGE_BYTES_MAX - 40;
    while !m.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &m[..cut], m.len())
}

/// An HTTP error body.
pub fn body(code: tonic::Code, field: Option<String>, message: String) -> ErrorBody {
    let code = format!("{code:?}");
    // CamelCase enum name → SCREAMING_SNAKE (InvalidArgument → INVALID_ARGUMENT).
    let mut name = String::new();
    for (i, ch) in code.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(ch.to_ascii_uppercase());
    }
    ErrorBody { error: ErrorDetail { code: name, field, message } }
}

/// An error as an HTTP answer: its status, the JSON error body and, when waiting helps,
/// `Retry-After`.
pub(crate) fn http_response(e: &Error) -> axum::response::Response {
    let (status, body) = http(e);
    let mut r = axum::response::IntoResponse::into_response((status, axum::Json(body)));
    if let Some(secs) = retry_after_secs(e) {
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_4xx_and_names_the_field() {
        let e =
            kairos_layer::ops::error::invalid("executeAt", "is more than 10 years in the future");
        let (status, body) = http(&e);
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body.error.code, "INVALID_ARGUMENT");
        assert_eq!(body.error.field.as_deref(), Some("executeAt"));
        assert_eq!(self::status(&e).code(), tonic::Code::InvalidArgument);
        assert!(self::status(&e).message().starts_with("executeAt: "));
        let conflict = Error::IdempotencyConflict { key: "k".into(), execution_id: "E".into() };
        assert_eq!(http(&conflict).0, StatusCode::CONFLICT);
        let too_big = Error::Kv(kv::Error::ValueTooLarge { size: 1, limit: 0 });
        assert_eq!(http(&too_big).0, StatusCode::BAD_REQUEST);
        assert_eq!(http(&Error::Kv(kv::Error::NotCommitted)).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn a_full_disk_is_resource_exhausted_with_a_retry_after() {
        let full = Error::Kv(kv::Error::StorageFull("the disk holding /d/kv.redb is full".into()));
        assert_eq!(http(&full).0, StatusCode::INSUFFICIENT_STORAGE);
        let s = self::status(&full);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(s.message().contains("storage_full (9003)"), "{}", s.message());
        assert_eq!(s.metadata().get("retry-after").and_then(|v| v.to_str().ok()), Some("30"));
        assert_eq!(retry_after_secs(&kairos_layer::ops::error::invalid("f", "bad")), None);
    }
}
