//! Kairos's write and read pattern, generated deterministically: every key of an execution is
//! derived from its number, so nothing but four counters is kept in memory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::stores::{Store, Write};

/// Executions numbered from here are the preloaded ones (scheduled far ahead, never fired).
const PRELOAD_BASE: u64 = 1 << 40;
/// Shards (the embedded node's default).
const SHARDS: u64 = 64;
/// Executions per timer bucket (a minute's worth at ~170/s... the due region's width).
const BUCKET_EXECUTIONS: u64 = 10_000;
/// How far each stage trails the one before (executions).
const FIRE_LAG: u64 = 20_000;
const COMPLETE_LAG: u64 = 2_000;
const RETIRE_LAG: u64 = 50_000;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn id(n: u64) -> String {
    format!("{:012x}{:012x}", 0x0190_0000_0000 + n, mix(n) >> 16 & 0xffff_ffff_ffff)
}

fn shard(n: u64) -> u64 {
    mix(n) % SHARDS
}

fn exec_key(n: u64) -> Vec<u8> {
    format!("e/default/{:02x}/{}", shard(n), id(n)).into_bytes()
}

fn idem_key(n: u64) -> Vec<u8> {
    format!("i/default/client-{:016x}{:016x}", mix(n ^ 0xabc), mix(n ^ 0xdef)).into_bytes()
}

fn bucket(n: u64) -> u64 {
    if n >= PRELOAD_BASE {
        0xff00_0000 + (n - PRELOAD_BASE) / BUCKET_EXECUTIONS
    } else {
        n / BUCKET_EXECUTIONS
    }
}

fn timer_key(n: u64) -> Vec<u8> {
    format!("t/{:016x}/{:02x}/{:016x}/{}", bucket(n), shard(n), n, id(n)).into_bytes()
}

fn bucket_prefix(b: u64) -> Vec<u8> {
    format!("t/{b:016x}/").into_bytes()
}

fn attempt_key(n: u64) -> Vec<u8> {
    format!("a/default/{}/1", id(n)).into_bytes()
}

fn counter_key(n: u64) -> Vec<u8> {
    format!("c/default/{:02x}", shard(n)).into_bytes()
}

/// Bytes of the stored files under `dir` (allocated blocks, so a sparse file counts as it is).
pub fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        total += if m.is_dir() { disk_bytes(&e.path()) } else { m.blocks() * 512 };
    }
    total
}

/// CPU time (user + system) of this process, or of the calling thread, in seconds.
pub fn cpu_seconds(thread: bool) -> f64 {
    // SAFETY: `getrusage` fills the zeroed out-parameter; RUSAGE_SELF / RUSAGE_THREAD are valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    let who = if thread { libc::RUSAGE_THREAD } else { libc::RUSAGE_SELF };
    unsafe { libc::getrusage(who, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// (VmHWM, VmRSS) of this process, KiB.
pub fn rss_kib() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

pub struct LifecycleStats {
    pub txns_per_s: f64,
    pub commits_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub reader_ops_per_s: f64,
    pub reader_get_us: f64,
    pub reader_scan_us: f64,
    /// CPU of the whole process but the reader thread (the committer and the engine's own
    /// background work: flushes, compactions), µs per committed transaction.
    pub engine_cpu_us_per_txn: f64,
}

pub struct IdleStats {
    pub get_us: f64,
    pub scan_us: f64,
    pub rev_us: f64,
}

#[derive(Default)]
struct Progress {
    submitted: AtomicU64,
    fired: AtomicU64,
    completed: AtomicU64,
    retired: AtomicU64,
    /// `submitted` as of the last durable commit (what readers may expect to find).
    durable_submitted: AtomicU64,
}

pub struct Workload {
    /// Records of ~1 KiB on average (the large crash store) instead of the usual mix.
    pub big_values: bool,
    filler: Vec<u8>,
    progress: Arc<Progress>,
    preloaded: u64,
    version: u64,
    seed: u64,
}

enum Stage {
    Submit,
    Fire,
    Complete,
    Retire,
}

impl Workload {
    pub fn new(seed: u64) -> Self {
        // Record bytes: half random, half text-like (protobuf with JSON inputs compresses some).
        let mut filler = Vec::with_capacity(72 * 1024);
        let mut z = seed;
        while filler.len() < 72 * 1024 {
            z = mix(z);
            filler.extend_from_slice(&z.to_le_bytes());
            filler.extend_from_slice(b"{\"in\":1}");
        }
        Workload {
            big_values: false,
            filler,
            progress: Arc::new(Progress::default()),
            preloaded: 0,
            version: 0,
            seed,
        }
    }

    fn record(&self, n: u64, version: usize) -> Vec<u8> {
        let h = mix(n ^ self.seed);
        let r = h % 1_000;
        let size = if self.big_values {
            100 + (h >> 10) as usize % 1_900
        } else if r < 10 {
            32 * 1024
        } else if r < 300 {
            300 + (h >> 10) as usize % 1_748
        } else {
            100 + (h >> 10) as usize % 200
        } + version * 30;
        let at = (h >> 20) as usize % (self.filler.len() - size);
        self.filler[at..at + size].to_vec()
    }

    fn stage(&self, n: u64, stage: &Stage, out: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>) {
        match stage {
            Stage::Submit => {
                out.insert(exec_key(n), Some(self.record(n, 0)));
                out.insert(idem_key(n), Some(id(n).into_bytes()));
                out.insert(timer_key(n), Some(vec![1]));
            }
            Stage::Fire => {
                out.insert(timer_key(n), None);
                out.insert(exec_key(n), Some(self.record(n, 1)));
            }
            Stage::Complete => {
                out.insert(exec_key(n), Some(self.record(n, 2)));
                out.insert(attempt_key(n), Some(self.filler[..100].to_vec()));
            }
            Stage::Retire => {
                out.insert(exec_key(n), None);
                out.insert(idem_key(n), None);
                out.insert(attempt_key(n), None);
            }
        }
        // The shard's status counter (an atomic add in the real transactions).
        out.insert(counter_key(n), Some((n as i64).to_le_bytes().to_vec()));
    }

    fn commit(&mut self, store: &dyn Store, writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>, txns: u64) {
        self.version += txns;
        let writes: Vec<Write> = writes.into_iter().collect();
        store.commit(&writes, self.version);
    }

    /// Submits `n` executions scheduled far ahead, `batch` per commit.
    pub fn preload(&mut self, store: &dyn Store, n: u64, batch: u64) {
        let mut done = 0;
        while done < n {
            let mut w = BTreeMap::new();
            let k = batch.min(n - done);
            for i in 0..k {
                self.stage(PRELOAD_BASE + self.preloaded + i, &Stage::Submit, &mut w);
            }
            self.commit(store, w, k);
            self.preloaded += k;
            done += k;
        }
    }

    /// The next transaction of the pipeline, if its stage has work (`which` rotates).
    fn next_txn(&self, which: u64, w: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> bool {
        let p = &self.progress;
        let (s, f, c, r) = (
            p.submitted.load(Ordering::Relaxed),
            p.fired.load(Ordering::Relaxed),
            p.completed.load(Ordering::Relaxed),
            p.retired.load(Ordering::Relaxed),
        );
        let (stage, counter, n) = match which % 4 {
            0 => (Stage::Submit, &p.submitted, s),
            1 if s >= f + FIRE_LAG => (Stage::Fire, &p.fired, f),
            2 if f >= c + COMPLETE_LAG => (Stage::Complete, &p.completed, c),
            3 if c >= r + RETIRE_LAG => (Stage::Retire, &p.retired, r),
            _ => return false,
        };
        self.stage(n, &stage, w);
        counter.store(n + 1, Ordering::Relaxed);
        true
    }

    /// One commit of `batch` lifecycle transactions.
    fn lifecycle_commit(&mut self, store: &dyn Store, batch: usize, turn: &mut u64) {
        let mut w = BTreeMap::new();
        let mut txns = 0;
        while txns < batch as u64 {
            if self.next_txn(*turn, &mut w) {
                txns += 1;
            }
            *turn += 1;
        }
        self.commit(store, w, txns);
        let p = &self.progress;
        p.durable_submitted.store(p.submitted.load(Ordering::Relaxed), Ordering::Release);
    }

    /// Fills the pipeline so every stage has work from the first measured commit.
    fn warm(&mut self, store: &dyn Store) {
        if self.progress.submitted.load(Ordering::Relaxed) > 0 {
            return;
        }
        let mut turn = 0;
        let filled = FIRE_LAG + COMPLETE_LAG + RETIRE_LAG + 1_000;
        while self.progress.retired.load(Ordering::Relaxed) == 0
            || self.progress.submitted.load(Ordering::Relaxed) < filled
        {
            self.lifecycle_commit(store, 8_000, &mut turn);
        }
    }

    /// Commits lifecycle batches of `batch` transactions for `run`, with a reader alongside.
    pub fn lifecycle(
        &mut self,
        store: &Arc<dyn Store>,
        batch: usize,
        run: Duration,
    ) -> LifecycleStats {
        self.warm(&**store);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (store, stop, p) = (store.clone(), stop.clone(), self.progress.clone());
            std::thread::spawn(move || {
                let reader_cpu_start = cpu_seconds(true);
                let mut ops = 0u64;
                let (mut get_ns, mut scan_ns) = (0u128, 0u128);
                let mut z = 99u64;
                while !stop.load(Ordering::Relaxed) {
                    z = mix(z);
                    let (lo, hi) = (
                        p.retired.load(Ordering::Relaxed),
                        p.durable_submitted.load(Ordering::Acquire),
                    );
                    let n = lo + z % (hi - lo).max(1);
                    let t = Instant::now();
                    let (v, found) = store.get(&exec_key(n));
                    get_ns += t.elapsed().as_nanos();
                    assert!(v > 0 && (found.is_some() || n < p.retired.load(Ordering::Relaxed)));
                    let b = bucket(p.fired.load(Ordering::Relaxed));
                    let (begin, end) = (bucket_prefix(b), bucket_prefix(b + 1));
                    let t = Instant::now();
                    store.scan(&begin, &end, 100, false);
                    scan_ns += t.elapsed().as_nanos();
                    ops += 1;
                }
                (ops, get_ns, scan_ns, cpu_seconds(true) - reader_cpu_start)
            })
        };
        let start = Instant::now();
        let cpu_start = cpu_seconds(false);
        let mut latencies = Vec::new();
        let mut turn = 0;
        while start.elapsed() < run {
            let t = Instant::now();
            self.lifecycle_commit(&**store, batch, &mut turn);
            latencies.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let elapsed = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let (reads, get_ns, scan_ns, reader_cpu) = reader.join().unwrap();
        let engine_cpu = cpu_seconds(false) - cpu_start - reader_cpu;
        latencies.sort_by(f64::total_cmp);
        let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        LifecycleStats {
            txns_per_s: (latencies.len() * batch) as f64 / elapsed,
            commits_per_s: latencies.len() as f64 / elapsed,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            reader_ops_per_s: reads as f64 / elapsed,
            reader_get_us: get_ns as f64 / 1e3 / reads.max(1) as f64,
            reader_scan_us: scan_ns as f64 / 1e3 / reads.max(1) as f64,
            engine_cpu_us_per_txn: engine_cpu * 1e6 / (latencies.len() * batch) as f64,
        }
    }

    /// One lifecycle commit (the crash phase's endless writing).
    pub fn lifecycle_until_killed(&mut self, store: &dyn Store, batch: usize) {
        self.warm(store);
        let mut turn = 0;
        self.lifecycle_commit(store, batch, &mut turn);
    }

    /// Mean latencies of reads on an idle store: records and timer scans of the preloaded set.
    pub fn idle_reads(&self, store: &dyn Store) -> IdleStats {
        let mut z = 5u64;
        let mut pick = || {
            z = mix(z);
            PRELOAD_BASE + z % self.preloaded
        };
        let t = Instant::now();
        let gets = 50_000;
        for _ in 0..gets {
            let (v, found) = store.get(&exec_key(pick()));
            assert!(v > 0 && found.is_some());
        }
        let get_us = t.elapsed().as_secs_f64() * 1e6 / gets as f64;
        let mut scan = |reverse: bool| {
            let t = Instant::now();
            let scans = 10_000;
            for _ in 0..scans {
                let n = pick();
                let (begin, end) = (timer_key(n), bucket_prefix(0xff00_0000 + 0xfff));
                let (begin, end) =
                    if reverse { (bucket_prefix(0xff00_0000), begin) } else { (begin, end) };
                store.scan(&begin, &end, 100, reverse);
            }
            t.elapsed().as_secs_f64() * 1e6 / scans as f64
        };
        IdleStats { get_us, scan_us: scan(false), rev_us: scan(true) }
    }

    /// Deletes every key still stored (retention of everything), `batch` keys per commit;
    /// returns the keys deleted.
    pub fn retire_everything(&mut self, store: &dyn Store, batch: usize) -> u64 {
        let p = self.progress.clone();
        let (s, f, c, r) = (
            p.submitted.load(Ordering::Relaxed),
            p.fired.load(Ordering::Relaxed),
            p.completed.load(Ordering::Relaxed),
            p.retired.load(Ordering::Relaxed),
        );
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for n in r..s {
            keys.extend([exec_key(n), idem_key(n)]);
            if n >= f {
                keys.push(timer_key(n));
            }
            if n < c {
                keys.push(attempt_key(n));
            }
        }
        for n in PRELOAD_BASE..PRELOAD_BASE + self.preloaded {
            keys.extend([exec_key(n), idem_key(n), timer_key(n)]);
        }
        let total = keys.len() as u64;
        for chunk in keys.chunks(batch) {
            let w: BTreeMap<Vec<u8>, Option<Vec<u8>>> =
                chunk.iter().map(|k| (k.clone(), None)).collect();
            self.commit(store, w, chunk.len() as u64 / 3);
        }
        total
    }
}
