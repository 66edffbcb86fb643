//! A progress bar on stderr for long phases (submit, drain, preload): only when stderr is a
//! terminal or `--progress` is given.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether bars are drawn: `--progress`, or stderr is a terminal.
pub fn enabled(flag: bool) -> bool {
    flag || std::io::stderr().is_terminal()
}

/// One bar: a counter the phase advances, redrawn every 250 ms.
pub struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn render(label: &str, done: u64, total: u64, elapsed: Duration) -> String {
    const WIDTH: usize = 30;
    let frac = if total == 0 { 1.0 } else { (done as f64 / total as f64).min(1.0) };
    let filled = (frac * WIDTH as f64).round() as usize;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    let eta = if done > 0 && done < total {
        format!("  eta {:.0} s", (total - done) as f64 / rate.max(1e-9))
    } else {
        String::new()
    };
    format!(
        "\r{label:>9} [{}{}] {}/{} {:>3.0}%  {}/s  {:.1} s{eta}   ",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        super::stats::int(done),
        super::stats::int(total),
        frac * 100.0,
        super::stats::int(rate as u64),
        elapsed.as_secs_f64()
    )
}

impl Progress {
    /// Starts a bar of `total` steps (drawn only when `enabled`).
    pub fn start(label: &str, total: u64, enabled: bool) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = enabled.then(|| {
            let (done, stop, label) = (done.clone(), stop.clone(), label.to_string());
            tokio::spawn(async move {
                let t = Instant::now();
                loop {
                    let finished = stop.load(Ordering::Relaxed);
                    let line = render(&label, done.load(Ordering::Relaxed), total, t.elapsed());
                    {
                        let mut err = std::io::stderr().lock();
                        let _ = err.write_all(line.as_bytes());
                        if finished {
                            let _ = err.write_all(b"\n");
                        }
                        let _ = err.flush();
                    }
                    if finished {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        });
        Progress { done, stop, task }
    }

    /// The counter the phase advances.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    /// Sets the counter.
    pub fn set(&self, v: u64) {
        self.done.store(v, Ordering::Relaxed);
    }

    /// Draws the last state and ends the line.
    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
