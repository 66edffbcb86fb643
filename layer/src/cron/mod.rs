//! The cron service's pure parts: expressions, occurrences in a time zone under DST policies,
//! the per-schedule policies and the decisions of a materialization round, input placeholders,
//! and the idempotency key of an occurrence. The transactions are in
//! [`crate::ops::cron`]; the actors that run schedules are in `kairos-actors`
//! (`cron_owner`). See docs/cron.md.

pub mod expr;
pub mod key;
pub mod placeholders;
pub mod plan;
pub mod policy;
pub mod zone;

pub use expr::{Expr, ExprError};
pub use key::{occurrence_key, parse_occurrence_key};
pub use policy::{MissedPolicy, OverlapPolicy, Policies};
pub use zone::{FoldPolicy, GapPolicy, Schedule, parse_zone, utc_rfc3339};
