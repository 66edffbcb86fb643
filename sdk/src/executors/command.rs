//! `execution.type: command`: a process.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::worker::{Task, TaskError};

/// The generic executor for definitions whose `execution.type` is `command`: runs
/// `execution.command` (argv), writes the inputs as JSON on stdin, parses stdout as the output
/// JSON (empty = none); exit code 0 is success, any other a retryable failure unless listed in
/// `execution.permanent_exit_codes`. The command runs in its own process group; cancellation (a
/// client's cancel, a lost lease, the attempt's time-out) ends the whole group — SIGTERM, then
/// SIGKILL after [`KILL_GRACE`] — and so does the command's own exit (nothing it started
/// outlives it).
pub async fn run_command(task: Task) -> Result<serde_json::Value, TaskError> {
    run_command_with_grace(task, KILL_GRACE).await
}

/// How long a cancelled command's process group has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

async fn run_command_with_grace(
    task: Task,
    grace: Duration,
) -> Result<serde_json::Value, TaskError> {
    let (argv, permanent) = command_of(&task.definition_execution)?;
    let (program, args) = argv.split_first().expect("command_of returns a non-empty argv");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env("KAIROS_EXECUTION_ID", &task.task.execution_id)
        .env("KAIROS_ATTEMPT", task.task.attempt.to_string())
        .envs(Some(("TRACEPARENT", task.task.traceparent.as_str())).filter(|(_, t)| !t.is_empty()))
        .kill_on_drop(true);
    let mut group = Group::spawn(command, grace)
        .map_err(|e| TaskError::permanent(format!("cannot start {program:?}: {e}")))?;
    let child = group.child.as_mut().expect("a spawned group holds its child");
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let mut cancelled = task.cancelled.clone();
    let inputs = task.task.inputs_json.as_bytes();
    let finished = {
        let run = async {
            let feed = async {
                if let Some(mut stdin) = stdin {
                    let _ = stdin.write_all(inputs).await; // a command may not read its stdin
                }
            };
            let (_, out, err, status) =
                tokio::join!(feed, read_all(stdout), read_all(stderr), child.wait());
            (status, out, err)
        };
        tokio::select! {
            r = run => Some(r),
            Ok(_) = cancelled.wait_for(|c| *c) => None,
        }
    };
    let Some((status, stdout, stderr)) = finished else {
        group.terminate().await;
        return Err(TaskError::cancelled());
    };
    group.reaped();
    outcome(program, status, &stdout, &stderr, &permanent)
}

/// `execution.command` (argv, not empty) and `execution.permanent_exit_codes`.
fn command_of(exec: &serde_json::Value) -> Result<(Vec<String>, Vec<i64>), TaskError> {
    let argv: Vec<String> = exec
        .get("command")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    if argv.is_empty() {
        return Err(TaskError::permanent("execution.command must be a non-empty list of strings"));
    }
    let permanent: Vec<i64> = exec
        .get("permanent_exit_codes")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|c| c.as_i64()).collect())
        .unwrap_or_default();
    Ok((argv, permanent))
}

/// The task's result from the command's exit: its stdout as JSON on success, a failure with
/// stderr's tail otherwise.
fn outcome(
    program: &str,
    status: std::io::Result<std::process::ExitStatus>,
    stdout: &[u8],
    stderr: &[u8],
    permanent: &[i64],
) -> Result<serde_json::Value, TaskError> {
    let status = status.map_err(|e| TaskError::retryable(format!("{program}: {e}")))?;
    let code = status.code().unwrap_or(-1);
    if !status.success() {
        let stderr = String::from_utf8_lossy(stderr);
        let tail: String =
            stderr.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
        let mut e = TaskError::retryable(format!("{program} exited with {code}: {}", tail.trim()));
        e.retryable = !permanent.contains(&i64::from(code));
        e.code = format!("exit:{code}");
        return Err(e);
    }
    let stdout = String::from_utf8_lossy(stdout);
    if stdout.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(stdout.trim()).map_err(|e| {
        TaskError::permanent(format!("{program} printed output that is not JSON: {e}"))
    })
}

async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_end(&mut buf).await;
    }
    buf
}

/// A command running as the leader of its own process group, so that everything it starts
/// (`sh -c "sleep 30; …"` starts `sleep`) is ended with it: on cancellation, and when the
/// future running it is dropped (a worker shutting down). Ending a group is SIGTERM to the
/// group, then SIGKILL to the group after the grace period. The leader is reaped only after
/// the SIGKILL, so its id (the group's id) cannot be reused by another group in between.
struct Group {
    child: Option<tokio::process::Child>,
    pgid: i32,
    grace: Duration,
}

impl Group {
    fn spawn(mut command: tokio::process::Command, grace: Duration) -> std::io::Result<Group> {
        command.process_group(0);
        let child = command.spawn()?;
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        assert!(pgid > 0, "a child that was just spawned has a process id");
        Ok(Group { child: Some(child), pgid, grace })
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a negative id signals the process group; no memory is touched.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }

    /// Ends the whole group: SIGTERM, the grace period for the leader to exit, SIGKILL.
    async fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        if let Some(mut child) = self.child.take() {
            let _ = tokio::time::timeout(self.grace, child.wait()).await;
            self.signal(libc::SIGKILL);
            let _ = child.wait().await;
        }
    }

    /// The leader exited by itself and was reaped: what it left running in its group is ended
    /// now (a job's processes do not outlive it).
    fn reaped(&mut self) {
        if self.child.take().is_some() {
            self.signal(libc::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        self.signal(libc::SIGTERM);
        let (pgid, grace) = (self.pgid, self.grace);
        let kill = move || unsafe {
            // SAFETY: as in `signal`.
            libc::kill(-pgid, libc::SIGKILL);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = tokio::time::timeout(grace, child.wait()).await;
                    kill();
                    let _ = child.wait().await;
                });
            }
            Err(_) => kill(),
        }
    }
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

    /// A directory of its own for one test, removed at the end.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("kairos-cmd-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Whether a process is gone (exited; a zombie left to init counts as gone).
    fn gone(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => {
                stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
            }
        }
    }

    async fn pid_in(path: &std::path::Path) -> i32 {
        for _ in 0..200 {
            if let Ok(s) = std::fs::read_to_string(path)
                && let Ok(pid) = s.trim().parse()
            {
                return pid;
            }
            let _ =
                tokio::time::timeout(Duration::from_millis(20), std::future::pending::<()>()).await;
        }
        panic!("the command never wrote its child's pid to {}", path.display());
    }

    async fn until_gone(pid: i32, within: Duration) -> bool {
        let wait = async {
            while !gone(pid) {
                let _ =
                    tokio::time::timeout(Duration::from_millis(20), std::future::pending::<()>())
                        .await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    fn sleeper(dir: &std::path::Path, trap_term: bool) -> serde_json::Value {
        // The README's pattern, `sh -c "...; cmd"`: the shell starts a grandchild (sleep).
        let trap = if trap_term { "trap '' TERM; " } else { "" };
        let script = format!("{trap}sleep 30 & echo $! > {}/pid; wait; echo {{}}", dir.display());
        serde_json::json!({"type": "command", "command": ["sh", "-c", script]})
    }

    #[tokio::test]
    async fn a_cancelled_command_ends_with_everything_it_started() {
        let dir = TempDir::new();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut t = task(sleeper(dir.path(), false));
        t.cancelled = rx;
        let run = tokio::spawn(run_command_with_grace(t, Duration::from_secs(5)));
        let pid = pid_in(&dir.path().join("pid")).await;
        assert!(!gone(pid), "the grandchild runs");
        tx.send(true).unwrap();
        let e = run.await.unwrap().unwrap_err();
        assert_eq!(e.code, "cancelled");
        assert!(until_gone(pid, Duration::from_secs(3)).await, "sleep {pid} outlived the cancel");
    }

    #[tokio::test]
    async fn a_group_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = TempDir::new();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut t = task(sleeper(dir.path(), true));
        t.cancelled = rx;
        let run = tokio::spawn(run_command_with_grace(t, Duration::from_millis(300)));
        let pid = pid_in(&dir.path().join("pid")).await;
        tx.send(true).unwrap();
        run.await.unwrap().unwrap_err();
        assert!(until_gone(pid, Duration::from_secs(3)).await, "sleep {pid} survived SIGKILL");
    }

    #[tokio::test]
    async fn a_dropped_command_ends_with_everything_it_started() {
        // The worker shutting down, or a caller's time-out, drops the future running it.
        let dir = TempDir::new();
        let t = task(sleeper(dir.path(), false));
        let pid_file = dir.path().join("pid");
        let run = run_command_with_grace(t, Duration::from_millis(300));
        let _ = tokio::time::timeout(Duration::from_millis(1_500), async {
            tokio::join!(run, pid_in(&pid_file))
        })
        .await;
        let pid = pid_in(&pid_file).await;
        assert!(until_gone(pid, Duration::from_secs(3)).await, "sleep {pid} outlived the drop");
    }
}
