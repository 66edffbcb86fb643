//! The Execution and Attempt state machines as pure functions.
//!
//! ```text
//! Execution: SCHEDULED --Fire--> READY --Claim--> RUNNING --Succeed--> SUCCEEDED
//!                                                 RUNNING --Retry--> RETRY_WAIT --RetryDue--> READY
//!                                                 RUNNING --Fail--> FAILED --Replay--> READY
//!                                                 RUNNING --Release--> READY
//!            SCHEDULED | READY | RETRY_WAIT | RUNNING --Cancel--> CANCELLED
//! Attempt:   RUNNING --Succeed | Fail | TimeOut | Abandon | Cancel-->
//!                      SUCCEEDED | FAILED | TIMED_OUT | ABANDONED | CANCELLED
//! ```
//! Invariants: SUCCEEDED and CANCELLED are final; FAILED leaves only by Replay (a new Attempt of
//! the same Execution); only the scheduler moves SCHEDULED → READY; RUNNING is entered only by
//! a claim, which creates an Attempt with a new fencing token. RUNNING → CANCELLED happens only
//! when the running attempt ends after a client asked for cancellation (the operations check
//! that; the machine only allows the edge), and such an execution is never retried. RUNNING →
//! READY (Release) gives back an attempt that never reached a handler; it does not count
//! against the retry budget. Each function is one exhaustive `match` with no wildcard arm, so
//! adding a state or event forces a decision here.

use kairos_proto::storage::v1::{AttemptStatus, ExecutionStatus};

/// Something that happens to an Execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionEvent {
    /// Its `execute_at` timer fired.
    Fire,
    /// A worker claimed it (a new Attempt starts).
    Claim,
    /// The current Attempt succeeded.
    Succeed,
    /// The current Attempt failed (or its lease expired) and another Attempt is allowed.
    Retry,
    /// The current Attempt failed and no other is allowed (permanent error or attempts
    /// exhausted).
    Fail,
    /// The retry back-off is over.
    RetryDue,
    /// A client cancelled it.
    Cancel,
    /// An operator replays a failed Execution.
    Replay,
    /// The running attempt is given back unstarted (it never reached a handler).
    Release,
}

/// Something that happens to an Attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEvent {
    /// The worker completed it.
    Succeed,
    /// The worker reported a failure.
    Fail,
    /// Its lease expired without a heartbeat.
    TimeOut,
    /// It was given up without a result (never reached a handler, or released by its worker).
    Abandon,
    /// Its execution was cancelled while it ran.
    Cancel,
}

/// An event not allowed in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid transition: {event} in state {state}")]
pub struct InvalidTransition {
    /// The state's name.
    pub state: &'static str,
    /// The event's name.
    pub event: &'static str,
}

fn invalid(state: &'static str, event: &'static str) -> InvalidTransition {
    InvalidTransition { state, event }
}

/// The Execution state after `event` in `state`.
pub fn execution_transition(
    state: ExecutionStatus,
    event: ExecutionEvent,
) -> Result<ExecutionStatus, InvalidTransition> {
    use ExecutionEvent as E;
    use ExecutionStatus as S;
    match (state, event) {
        (S::Scheduled, E::Fire) => Ok(S::Ready),
        (S::Ready, E::Claim) => Ok(S::Running),
        (S::Running, E::Succeed) => Ok(S::Succeeded),
        (S::Running, E::Retry) => Ok(S::RetryWait),
        (S::Running, E::Fail) => Ok(S::Failed),
        (S::Running, E::Release) => Ok(S::Ready),
        (S::RetryWait, E::RetryDue) => Ok(S::Ready),
        (S::Scheduled | S::Ready | S::RetryWait | S::Running, E::Cancel) => Ok(S::Cancelled),
        (S::Failed, E::Replay) => Ok(S::Ready),
        (
            S::Scheduled,
            E::Claim | E::Succeed | E::Retry | E::Fail | E::RetryDue | E::Replay | E::Release,
        )
        | (
            S::Ready,
            E::Fire | E::Succeed | E::Retry | E::Fail | E::RetryDue | E::Replay | E::Release,
        )
        | (S::Running, E::Fire | E::Claim | E::RetryDue | E::Replay)
        | (
            S::RetryWait,
            E::Fire | E::Claim | E::Succeed | E::Retry | E::Fail | E::Replay | E::Release,
        )
        | (
            S::Unspecified | S::Succeeded | S::Cancelled,
            E::Fire
            | E::Claim
            | E::Succeed
            | E::Retry
            | E::Fail
            | E::RetryDue
            | E::Cancel
            | E::Replay
            | E::Release,
        )
        | (
            S::Failed,
            E::Fire
            | E::Claim
            | E::Succeed
            | E::Retry
            | E::Fail
            | E::RetryDue
            | E::Cancel
            | E::Release,
        ) => Err(invalid(state.as_str_name(), event_name(event))),
    }
}

/// The Attempt state after `event` in `state`.
pub fn attempt_transition(
    state: AttemptStatus,
    event: AttemptEvent,
) -> Result<AttemptStatus, InvalidTransition> {
    use AttemptEvent as E;
    use AttemptStatus as S;
    match (state, event) {
        (S::Running, E::Succeed) => Ok(S::Succeeded),
        (S::Running, E::Fail) => Ok(S::Failed),
        (S::Running, E::TimeOut) => Ok(S::TimedOut),
        (S::Running, E::Abandon) => Ok(S::Abandoned),
        (S::Running, E::Cancel) => Ok(S::Cancelled),
        (
            S::Unspecified | S::Succeeded | S::Failed | S::TimedOut | S::Abandoned | S::Cancelled,
            E::Succeed | E::Fail | E::TimeOut | E::Abandon | E::Cancel,
        ) => Err(invalid(state.as_str_name(), attempt_event_name(event))),
    }
}

fn event_name(e: ExecutionEvent) -> &'static str {
    match e {
        ExecutionEvent::Fire => "Fire",
        ExecutionEvent::Claim => "Claim",
        ExecutionEvent::Succeed => "Succeed",
        ExecutionEvent::Retry => "Retry",
        ExecutionEvent::Fail => "Fail",
        ExecutionEvent::RetryDue => "RetryDue",
        ExecutionEvent::Cancel => "Cancel",
        ExecutionEvent::Replay => "Replay",
        ExecutionEvent::Release => "Release",
    }
}

fn attempt_event_name(e: AttemptEvent) -> &'static str {
    match e {
        AttemptEvent::Succeed => "Succeed",
        AttemptEvent::Fail => "Fail",
        AttemptEvent::TimeOut => "TimeOut",
        AttemptEvent::Abandon => "Abandon",
        AttemptEvent::Cancel => "Cancel",
    }
}

/// The short name of a status enum's value: `EXECUTION_STATUS_RUNNING` → `RUNNING` (execution,
/// attempt and cron job statuses alike). The one place status names are written.
pub fn short_name(full: &'static str) -> &'static str {
    full.split_once("_STATUS_").map_or(full, |(_, s)| s)
}

/// The short name of an execution status (`RUNNING`), for messages and metrics; `UNKNOWN` for a
/// number no status has.
pub fn status_name(status: i32) -> &'static str {
    ExecutionStatus::try_from(status).map(|s| short_name(s.as_str_name())).unwrap_or("UNKNOWN")
}

/// The execution status of a short name, any case (`running` → RUNNING).
pub fn parse_status(name: &str) -> Option<ExecutionStatus> {
    ExecutionStatus::from_str_name(&format!("EXECUTION_STATUS_{}", name.to_ascii_uppercase()))
}

/// The statuses an Execution never leaves (Replay aside).
pub const TERMINAL: [ExecutionStatus; 3] =
    [ExecutionStatus::Succeeded, ExecutionStatus::Failed, ExecutionStatus::Cancelled];

/// Whether an Execution in `state` will never change again (Replay aside).
pub fn is_terminal(state: ExecutionStatus) -> bool {
    TERMINAL.contains(&state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionEvent as E;
    use ExecutionStatus as S;

    const STATES: [S; 8] = [
        S::Unspecified,
        S::Scheduled,
        S::Ready,
        S::Running,
        S::RetryWait,
        S::Succeeded,
        S::Failed,
        S::Cancelled,
    ];
    const EVENTS: [E; 9] = [
        E::Fire,
        E::Claim,
        E::Succeed,
        E::Retry,
        E::Fail,
        E::RetryDue,
        E::Cancel,
        E::Replay,
        E::Release,
    ];

    /// The allowed edges, written out once more independently of the match.
    const ALLOWED: [(S, E, S); 12] = [
        (S::Scheduled, E::Fire, S::Ready),
        (S::Ready, E::Claim, S::Running),
        (S::Running, E::Succeed, S::Succeeded),
        (S::Running, E::Retry, S::RetryWait),
        (S::Running, E::Fail, S::Failed),
        (S::RetryWait, E::RetryDue, S::Ready),
        (S::Scheduled, E::Cancel, S::Cancelled),
        (S::Ready, E::Cancel, S::Cancelled),
        (S::RetryWait, E::Cancel, S::Cancelled),
        (S::Failed, E::Replay, S::Ready),
        (S::Running, E::Cancel, S::Cancelled),
        (S::Running, E::Release, S::Ready),
    ];

    #[test]
    fn every_execution_edge_allowed_or_rejected_as_specified() {
        let mut allowed = 0;
        for s in STATES {
            for e in EVENTS {
                let want = ALLOWED.iter().find(|(a, b, _)| *a == s && *b == e).map(|(_, _, t)| *t);
                match (execution_transition(s, e), want) {
                    (Ok(got), Some(t)) => {
                        assert_eq!(got, t, "{s:?} --{e:?}-->");
                        allowed += 1;
                    }
                    (Err(err), None) => {
                        assert_eq!(err.state, s.as_str_name());
                        assert_eq!(err.event, event_name(e));
                    }
                    (got, want) => panic!("{s:?} --{e:?}--> gave {got:?}, expected {want:?}"),
                }
            }
        }
        assert_eq!(allowed, ALLOWED.len());
    }

    #[test]
    fn rejections_name_the_state_and_event() {
        let err = execution_transition(S::Succeeded, E::Cancel).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid transition: Cancel in state EXECUTION_STATUS_SUCCEEDED"
        );
        assert_eq!(status_name(S::RetryWait as i32), "RETRY_WAIT");
        assert_eq!(status_name(99), "UNKNOWN");
        assert_eq!(parse_status("retry_wait"), Some(S::RetryWait));
        assert_eq!(parse_status("sleeping"), None);
        assert_eq!(short_name("ATTEMPT_STATUS_TIMED_OUT"), "TIMED_OUT");
    }

    #[test]
    fn terminal_states_accept_nothing_but_replay_of_failed() {
        for s in [S::Succeeded, S::Cancelled, S::Failed] {
            assert!(is_terminal(s));
            for e in EVENTS {
                let r = execution_transition(s, e);
                assert_eq!(r.is_ok(), s == S::Failed && e == E::Replay, "{s:?} {e:?}");
            }
        }
    }

    #[test]
    fn every_attempt_edge() {
        use AttemptEvent as AE;
        use AttemptStatus as AS;
        let events = [AE::Succeed, AE::Fail, AE::TimeOut, AE::Abandon, AE::Cancel];
        let ends = [AS::Succeeded, AS::Failed, AS::TimedOut, AS::Abandoned, AS::Cancelled];
        for (e, end) in events.iter().zip(ends) {
            assert_eq!(attempt_transition(AS::Running, *e), Ok(end));
            for s in [
                AS::Unspecified,
                AS::Succeeded,
                AS::Failed,
                AS::TimedOut,
                AS::Abandoned,
                AS::Cancelled,
            ] {
                assert!(attempt_transition(s, *e).is_err(), "{s:?} {e:?}");
            }
        }
    }
}
