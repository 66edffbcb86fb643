//! What a node serves with: configuration, API keys, quotas, TLS, telemetry and metrics.

pub mod auth;
pub mod config;
pub mod conns;
mod database;
pub mod log_limit;
pub mod metrics;
pub mod quota;
pub mod recent;
pub mod telemetry;
pub mod tls;
