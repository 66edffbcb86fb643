//! The API server: gRPC services (`kairos.v1`) and the HTTP/JSON API, both over [`Node`],
//! with errors mapped to codes in one place ([`errors`]).
//!
//! [`Node`]: crate::node::Node

pub mod convert;
pub mod errors;
pub mod grpc;
pub mod http;
pub mod json;
