//! Generic executors for definitions that declare how to run: `command` (a process) and
//! `http` (a request). `kairos worker` dispatches on `execution.type` to these.

mod command;
mod http;

pub use self::command::run_command;
pub use self::http::{SIGNATURE_HEADER, run_http, signature};

use crate::worker::{Task, TaskError};

/// Runs a task with the executor its definition's `execution.type` names.
pub async fn run_generic(task: Task) -> Result<serde_json::Value, TaskError> {
    match task.definition_execution.get("type").and_then(|t| t.as_str()) {
        Some("command") => run_command(task).await,
        Some("http") => run_http(task).await,
        Some(other) => Err(TaskError::permanent(format!(
            "no executor for execution.type {other:?} (supported: command, http)"
        ))),
        None => Err(TaskError::permanent("definition has no execution.type")),
    }
}

#[cfg(test)]
pub(crate) fn test_task(exec: serde_json::Value) -> Task {
    let (_tx, rx) = tokio::sync::watch::channel(false);
    Task {
        task: kairos_proto::v1::Task {
            execution_id: "E1".into(),
            inputs_json: r#"{"n":1}"#.into(),
            attempt: 1,
            ..Default::default()
        },
        definition_execution: exec,
        cancelled: rx,
    }
}
