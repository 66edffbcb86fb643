//! The API server: gRPC services (`kairos.v1`) and the HTTP/JSON API, both over [`Node`],
//! with errors mapped to codes in one place ([`errors`]).
//!
//! [`Node`]: crate::node::Node

pub mod convert;
pub mod errors;
pub mod grpc;
pub mod http;
pub mod in_process;
pub mod json;

use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1::JobDefinition;

/// Parses a definition file on the blocking pool, off the runtime threads that serve requests
/// and renew leases (parsing is bounded, but it is the one CPU-heavy step a client controls).
pub async fn parse_definition(source: Vec<u8>) -> ops::Result<JobDefinition> {
    let parsed =
        tokio::task::spawn_blocking(move || kairos_layer::definition::parse_definition(&source))
            .await
            .map_err(|e| invalid("definition", format!("could not be parsed: {e}")))?;
    parsed.map_err(|e| invalid(e.field(), e.reason()))
}
