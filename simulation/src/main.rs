//! The seed runner: `kairos-simulation --seeds 1..1000`, `--seed N --trace`.
// Outside the simulation: the sweep's wall time and the livelock watchdog read the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: kairos-simulation (--seed N [--trace] | --seeds A..B) [--twice]\n  \
         --seed N     run one seed (--trace prints its event trace)\n  \
         --seeds A..B run seeds A to B-1 and sum up what they reached\n  \
         --twice      run each seed again in a fresh process and compare trace hashes\n  \
         --hash-only  print only the trace hash"
    );
    ExitCode::from(2)
}

/// The trace hash of `seed` run by a fresh process of this program.
fn replay_hash(seed: u64) -> Option<u64> {
    let exe = std::env::current_exe().ok()?;
    let out = std::process::Command::new(exe)
        .args(["--seed", &seed.to_string(), "--hash-only"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("hash "))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds: Vec<u64> = Vec::new();
    let (mut trace, mut twice, mut hash_only) = (false, false, false);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--seed" => {
                let Some(n) = args.get(i + 1).and_then(|s| s.parse().ok()) else { return usage() };
                seeds.push(n);
                i += 1;
            }
            "--seeds" => {
                let Some((a, b)) = args.get(i + 1).and_then(|s| s.split_once("..")) else {
                    return usage();
                };
                let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) else { return usage() };
                seeds.extend(a..b);
                i += 1;
            }
            "--trace" => trace = true,
            "--twice" => twice = true,
            "--hash-only" => hash_only = true,
            "--live" => {
                kairos_simulation::workload::LIVE.store(true, std::sync::atomic::Ordering::Relaxed)
            }
            _ => return usage(),
        }
        i += 1;
    }
    if seeds.is_empty() {
        return usage();
    }
    if std::env::var_os("KAIROS_SIM_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("KAIROS_SIM_LOG"))
            .init();
    }
    // A step that never ends is a livelock: some task spins without letting simulated time
    // advance (a bug: in production it burns a core). Nothing else can stop it.
    std::thread::spawn(|| {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
            let now = kairos_simulation::run::PROGRESS.load(std::sync::atomic::Ordering::Relaxed);
            if now == last {
                let seed = now >> 24;
                eprintln!(
                    "seed {seed}: LIVELOCK: simulated time stopped at {} s for a minute of wall time\nreplay: cargo run --release -p kairos-simulation -- --seed {seed} --live",
                    now & 0xFF_FFFF
                );
                std::process::exit(3);
            }
            last = now;
        }
    });
    let started = std::time::Instant::now();
    let (mut failed, mut simulated) = (Vec::new(), std::time::Duration::ZERO);
    let mut reached: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    for &seed in &seeds {
        if kairos_simulation::workload::LIVE.load(std::sync::atomic::Ordering::Relaxed) {
            eprint!("{}", kairos_simulation::plan::Plan::from_seed(seed).describe());
        }
        let out = kairos_simulation::run(seed);
        simulated += out.simulated;
        if trace {
            for line in &out.trace {
                println!("{line}");
            }
            print!("{}", out.plan.describe());
        }
        if hash_only {
            println!("hash {:016x}", out.hash);
            continue;
        }
        let mut ok = out.passed();
        if twice {
            // Replayed in a fresh process, as a replay is: a second run in this process can
            // differ (state some library keeps per process; see docs/simulation.md).
            let again = replay_hash(seed);
            if again != Some(out.hash) {
                ok = false;
                eprintln!(
                    "seed {seed}: NOT DETERMINISTIC: trace hash {:016x} then {again:016x?}\nreplay: cargo run --release -p kairos-simulation -- --seed {seed} --trace",
                    out.hash
                );
            }
        }
        for (k, n) in &out.reached {
            let e = reached.entry(k).or_default();
            e.0 += 1;
            e.1 += n;
        }
        for f in &out.plan.enabled {
            *faults.entry(f).or_default() += 1;
        }
        println!(
            "seed {seed}: {} hash {:016x} ({:.0} s simulated)",
            if out.passed() { "ok" } else { "FAILED" },
            out.hash,
            out.simulated.as_secs_f64()
        );
        if !out.passed() {
            eprint!("{}", out.report());
        }
        if !ok {
            failed.push(seed);
        }
    }
    println!(
        "\n{} seeds, {} failed, {:.1} s wall, {:.0} s simulated",
        seeds.len(),
        failed.len(),
        started.elapsed().as_secs_f64(),
        simulated.as_secs_f64()
    );
    println!("faults enabled (seeds):");
    for (f, n) in &faults {
        println!("  {f}: {n}");
    }
    println!("reached (seeds, total):");
    for (k, (s, n)) in &reached {
        println!("  {k}: {s} seeds, {n}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failed seeds: {failed:?}");
        ExitCode::FAILURE
    }
}
