//! `execution.type: command`: a process.

use tokio::io::AsyncWriteExt;

use crate::worker::{Task, TaskError};

/// The generic executor for definitions whose `execution.type` is `command`: runs
/// `execution.command` (argv), writes the inputs as JSON on stdin, parses stdout as the output
/// JSON (empty = none); exit code 0 is success, any other a retryable failure unless listed in
/// `execution.permanent_exit_codes`. Cancellation kills the process.
pub async fn run_command(task: Task) -> Result<serde_json::Value, TaskError> {
    let exec = &task.definition_execution;
    let argv: Vec<String> = exec
        .get("command")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return Err(TaskError::permanent("execution.command must be a non-empty list of strings"));
    };
    let permanent: Vec<i64> = exec
        .get("permanent_exit_codes")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|c| c.as_i64()).collect())
        .unwrap_or_default();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env("KAIROS_EXECUTION_ID", &task.task.execution_id)
        .env("KAIROS_ATTEMPT", task.task.attempt.to_string())
        .envs(Some(("TRACEPARENT", task.task.traceparent.as_str())).filter(|(_, t)| !t.is_empty()))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| TaskError::permanent(format!("cannot start {program:?}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(task.task.inputs_json.as_bytes()).await;
    }
    let mut cancelled = task.cancelled.clone();
    let out = tokio::select! {
        out = child.wait_with_output() => out.map_err(|e| TaskError::retryable(format!("{program}: {e}")))?,
        Ok(_) = cancelled.wait_for(|c| *c) => return Err(TaskError::cancelled()),
    };
    let code = out.status.code().unwrap_or(-1);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String =
            stderr.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
        let mut e = TaskError::retryable(format!("{program} exited with {code}: {}", tail.trim()));
        e.retryable = !permanent.contains(&i64::from(code));
        e.code = format!("exit:{code}");
        return Err(e);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(stdout.trim()).map_err(|e| {
        TaskError::permanent(format!("{program} printed output that is not JSON: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executors::test_task as task;

    #[tokio::test]
    async fn commands_succeed_fail_and_declare_permanent_codes() {
        let ok = run_command(task(
            serde_json::json!({"type": "command", "command": ["sh", "-c", "cat"]}),
        ))
        .await;
        assert_eq!(ok.unwrap(), serde_json::json!({"n": 1}), "stdin → stdout");
        let e = run_command(task(serde_json::json!({"type": "command", "command": ["sh", "-c", "echo oops >&2; exit 4"]})))
            .await
            .unwrap_err();
        assert!(e.retryable && e.code == "exit:4" && e.message.contains("oops"), "{e:?}");
        let e = run_command(task(serde_json::json!({"type": "command", "command": ["sh", "-c", "exit 4"], "permanent_exit_codes": [4]})))
            .await
            .unwrap_err();
        assert!(!e.retryable);
        let e = run_command(task(serde_json::json!({"type": "command", "command": []})))
            .await
            .unwrap_err();
        assert!(!e.retryable);
    }
}
