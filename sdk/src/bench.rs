//! `kairosctl bench`: the load generator (placeholder; see docs/benchmarks.md).

/// Runs `kairosctl bench` with its arguments; returns the exit code.
pub async fn main(args: Vec<String>) -> i32 {
    let _ = args;
    eprintln!("kairosctl bench: not built yet");
    1
}
