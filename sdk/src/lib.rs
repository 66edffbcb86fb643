#![allow(clippy::disallowed_methods)] // the SDK runs in user processes: wall time and tokio timers are the truth there
//! kairos-sdk: a client and a worker for Kairos over gRPC, with the worker's built-in executors.
//! The `kairosctl` console and the load generator are the `kairos-ctl` crate (`sdk/ctl`). The
//! `cli` feature adds `TlsArgs`, the TLS flags of a clap command line.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kairos_sdk::Error> {
//! let client = kairos_sdk::Client::connect("http://127.0.0.1:7071").await?;
//! let s = client
//!     .submit("registry://jobs/generate-report", 3)
//!     .inputs(serde_json::json!({"dataset_uri": "s3://datasets/orders", "report_date": "2026-08-12"}))
//!     .after(std::time::Duration::from_secs(30))
//!     .idempotency_key("report-2026-08-12")
//!     .send()
//!     .await?;
//! let id = s.execution_id;
//! let done = client.wait(&id, std::time::Duration::from_secs(120)).await?;
//! # Ok(()) }
//! ```

pub mod client;
pub mod error;
pub mod executors;
pub mod limits;
pub mod tls;
pub mod views;
pub mod worker;

pub use client::{Client, SubmitBuilder, Submitted};
pub use error::Error;
pub use executors::{run_command, run_generic, run_http};
pub use kairos_proto::v1 as api;
pub use tls::Tls;
#[cfg(feature = "cli")]
pub use tls::TlsArgs;
pub use worker::{Handler, Task, TaskError, Worker};
