//! The API server: gRPC services (`kairos.v1`) and the HTTP/JSON API, both over [`Node`],
//! with errors mapped to codes in one place ([`errors`]).
//!
//! [`Node`]: crate::node::Node

pub mod console;
pub mod convert;
pub mod errors;
pub mod grpc;
pub mod http;
pub mod in_process;
pub mod json;

use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1::JobDefinition;

/// Parses a definition file on the blocking pool, off the runtime threads that serve requests
/// and renew leases (parsing is bounded, but it is the one CPU-heavy step a client controls);
/// inline in the simulation ([`kairos_layer::env::off_runtime`]).
pub async fn parse_definition(source: Vec<u8>) -> ops::Result<JobDefinition> {
    let parsed =
        kairos_layer::env::off_runtime(move || kairos_layer::definition::parse_definition(&source))
            .await
            .map_err(|e| invalid("definition", format!("could not be parsed: {e}")))?;
    parsed.map_err(|e| invalid(e.field(), e.reason()))
}

/// A page of attempts asked for: the cursor (`attemptsCursor`: the number of the last attempt
/// of the page before) and the limit (`attemptsLimit`, 1 to 100; none: 100).
pub(crate) fn attempts_page(
    c: Option<&str>,
    limit: Option<u64>,
) -> ops::Result<(Option<u32>, usize)> {
    use kairos_layer::limits::ATTEMPTS_PAGE_MAX;
    let after = match c.filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => Some(
            c.parse()
                .map_err(|_| invalid("attemptsCursor", "is not a cursor this API returned"))?,
        ),
    };
    let limit = match limit {
        None => ATTEMPTS_PAGE_MAX,
        Some(n) if (1..=ATTEMPTS_PAGE_MAX as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(invalid("attemptsLimit", format!("{n}: must be 1 to {ATTEMPTS_PAGE_MAX}")));
        }
    };
    Ok((after, limit))
}
