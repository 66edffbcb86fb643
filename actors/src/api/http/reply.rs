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

/// Lower-case hex of `b` (the SDK's cursor text).
pub(super) fn hex_encode(b: &[u8]) -> String {
    kairos_sdk::views::cursor_text(b).unwrap_or_default()
}

/// The bytes of lower-case or upper-case hex `s`; `None` if it is not hex.
pub(super) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    kairos_sdk::views::parse_cursor(s)
}
