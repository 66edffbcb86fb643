//! The transaction retry loop (FoundationDB's `run` / `on_error`).

use std::future::Future;
use std::time::Duration;

use super::{CommitInfo, Database, Error, Transaction, TxnError};

/// Receives what the retry loop sees (for metrics). Called inline: keep it cheap.
pub trait RunObserver: Send + Sync + 'static {
    /// A `run` committed, `latency` after it started (retries included).
    fn committed(&self, latency: Duration);
    /// A try failed with a retryable error and will be retried.
    fn retrying(&self, error: &Error);
}

/// Options of the retry loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    /// Retries after the first try before giving up with the last error (FoundationDB's
    /// default is unlimited; a bound keeps a livelock visible).
    pub retry_limit: u32,
    /// First back-off delay after a retryable error.
    pub backoff_initial: Duration,
    /// Largest back-off delay.
    pub backoff_max: Duration,
    /// Longest a `run` keeps retrying, by the injected clock (FoundationDB's `timeout`
    /// option): past it, the next retryable error ends the loop with `TimedOut` (1031).
    pub deadline: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            retry_limit: 1_000,
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1_000),
            deadline: Duration::from_secs(30),
        }
    }
}

impl Database {
    /// Runs `f` in a transaction and commits it, retrying on retryable errors
    /// (`not_committed`, `commit_unknown_result`, `transaction_too_old`) with capped
    /// exponential back-off and full jitter.
    ///
    /// `f` may run more than once, even after a commit that was in fact applied
    /// (`commit_unknown_result`): it must be idempotent — generate ids outside, re-read and
    /// re-check state inside.
    pub async fn run<F, Fut, T, E>(&self, f: F) -> Result<T, E>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: TxnError,
    {
        self.run_with_info(f).await.map(|(v, _)| v)
    }

    /// Like [`run`](Database::run), also returning the commit's version and versionstamp.
    pub async fn run_with_info<F, Fut, T, E>(&self, mut f: F) -> Result<(T, CommitInfo), E>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: TxnError,
    {
        let mut retries = 0u32;
        let mut backoff = self.options.backoff_initial;
        let started = self.clock.now();
        loop {
            let tx = self.begin()?;
            let err: E = match f(tx.clone()).await {
                Ok(value) => match tx.commit().await {
                    Ok(info) => {
                        if let Some(o) = &self.observer {
                            o.committed(self.clock.now().since(started));
                        }
                        return Ok((value, info));
                    }
                    Err(e) => E::from(e),
                },
                Err(e) => e,
            };
            let retryable = err.kv_error().filter(|e| e.is_retryable());
            let Some(kv_err) = retryable else { return Err(err) };
            if retries >= self.options.retry_limit {
                return Err(err);
            }
            if self.clock.now().since(started) >= self.options.deadline {
                return Err(E::from(Error::TimedOut));
            }
            if let Some(o) = &self.observer {
                o.retrying(kv_err);
            }
            retries += 1;
            if let Some(wait) = tx.on_error(kv_err) {
                // The backend's own back-off (FoundationDB's `on_error`).
                wait.await.map_err(E::from)?;
                continue;
            }
            // Full jitter: a uniform delay in [0, backoff].
            let cap = u64::try_from(backoff.as_micros()).unwrap_or(u64::MAX);
            let delay = Duration::from_micros(self.rng.between(0, cap));
            self.clock.sleep(delay).await;
            backoff = (backoff * 2).min(self.options.backoff_max);
        }
    }
}
