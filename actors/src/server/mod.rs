//! What a node serves with: configuration, API keys, quotas, TLS, telemetry and metrics.

pub mod auth;
pub mod config;
pub mod conns;
mod database;
pub mod histogram;
pub mod log_limit;
pub mod metrics;
pub mod process;
pub mod quota;
pub mod recent;
pub mod requests;
pub mod telemetry;
pub mod tls;
