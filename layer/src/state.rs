//! The Execution and Attempt state machines as pure functions.
//!
//! ```text
//! Execution: SCHEDULED --Fire--> READY --Claim--> RUNNING --Succeed--> SUCCEEDED
//!                                                 RUNNING --Retry--> RETRY_WAIT --RetryDue--> READY
//!                                                 RUNNING --Fail--> FAILED --Replay--> READY
//!            SCHEDULED | READY | RETRY_WAIT --Cancel--> CANCELLED
//! Attempt:   RUNNING --Succeed | Fail | TimeOut | Abandon--> SUCCEEDED | FAILED | TIMED_OUT | ABANDONED
//! ```
//! Invariants: SUCCEEDED and CANCELLED are final; FAILED leaves only by Replay (a new Attempt of
//! the same Execution); only the scheduler moves SCHEDULED → READY; RUNNING is entered only by
//! a claim, which creates an Attempt with a new fencing token. Each function is one exhaustive
//! `match` with no wildcard arm, so adding a state or event forces a decision here.

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
    /// It was given up without a result (e.g. its execution was cancelled or replaced).
    Abandon,
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
        (S::RetryWait, E::RetryDue) => Ok(S::Ready),
        (S::Scheduled | S::Ready | S::RetryWait, E::Cancel) => Ok(S::Cancelled),
        (S::Failed, E::Replay) => Ok(S::Ready),
        (S::Scheduled, E::Claim | E::Succeed | E::Retry | E::Fail | E::RetryDue | E::Replay)
        | (S::Ready, E::Fire | E::Succeed | E::Retry | E::Fail | E::RetryDue | E::Replay)
        | (S::Running, E::Fire | E::Claim | E::RetryDue | E::Cancel | E::Replay)
        | (S::RetryWait, E::Fire | E::Claim | E::Succeed | E::Retry | E::Fail | E::Replay)
        | (
            S::Unspecified | S::Succeeded | S::Cancelled,
            E::Fire
            | E::Claim
            | E::Succeed
            | E::Retry
            | E::Fail
            | E::RetryDue
            | E::Cancel
            | E::Replay,
        )
        | (
            S::Failed,
            E::Fire | E::Claim | E::Succeed | E::Retry | E::Fail | E::RetryDue | E::Cancel,
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
        (
            S::Unspecified | S::Succeeded | S::Failed | S::TimedOut | S::Abandoned,
            E::Succeed | E::Fail | E::TimeOut | E::Abandon,
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
    }
}

fn attempt_event_name(e: AttemptEvent) -> &'static str {
    match e {
        AttemptEvent::Succeed => "Succeed",
        AttemptEvent::Fail => "Fail",
        AttemptEvent::TimeOut => "TimeOut",
        AttemptEvent::Abandon => "Abandon",
    }
}

/// Whether an Execution in `state` will never change again (Replay aside).
pub fn is_terminal(state: ExecutionStatus) -> bool {
    matches!(
        state,
        ExecutionStatus::Succeeded | ExecutionStatus::Failed | ExecutionStatus::Cancelled
    )
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
    const EVENTS: [E; 8] =
        [E::Fire, E::Claim, E::Succeed, E::Retry, E::Fail, E::RetryDue, E::Cancel, E::Replay];

    /// The allowed edges, written out once more independently of the match.
    const ALLOWED: [(S, E, S); 10] = [
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
    fn cancel_of_running_is_rejected_with_a_clear_message() {
        let err = execution_transition(S::Running, E::Cancel).unwrap_err();
        assert_eq!(err.to_string(), "invalid transition: Cancel in state EXECUTION_STATUS_RUNNING");
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
        let events = [AE::Succeed, AE::Fail, AE::TimeOut, AE::Abandon];
        let ends = [AS::Succeeded, AS::Failed, AS::TimedOut, AS::Abandoned];
        for (e, end) in events.iter().zip(ends) {
            assert_eq!(attempt_transition(AS::Running, *e), Ok(end));
            for s in [AS::Unspecified, AS::Succeeded, AS::Failed, AS::TimedOut, AS::Abandoned] {
                assert!(attempt_transition(s, *e).is_err(), "{s:?} {e:?}");
            }
        }
    }
}
