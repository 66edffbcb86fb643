//! What the HTTP handlers answer with: JSON bodies, errors mapped in one place, and the hex
//! form of binary values in URLs.

use axum::response::{IntoResponse, Response};
use kairos_layer::ops;

use crate::api::errors::http_response;

/// A JSON response for `r`, or its error mapped in one place.
pub(super) fn respond<T: serde::Serialize>(r: Result<T, ops::Error>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => http_response(&e),
    }
}

/// Lower-case hex of `b`.
pub(super) fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of lower-case or upper-case hex `s`; `None` if it is not hex.
pub(super) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}
