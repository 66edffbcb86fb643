//! Injected nondeterminism: the clock and the random source.
//!
//! Nothing in the core crates reads the wall clock or an OS random source directly (clippy's
//! `disallowed-methods` enforces it); they take a [`Clock`] and a [`Rng`] so the deterministic
//! simulation can replay any seed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A point in time: nanoseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From nanoseconds since the epoch.
    pub const fn from_nanos(nanos: i64) -> Self {
        Timestamp(nanos)
    }
    /// From milliseconds since the epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis.saturating_mul(1_000_000))
    }
    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> i64 {
        self.0
    }
    /// Milliseconds since the epoch (floor).
    pub const fn as_millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }
    /// This time plus `d` (saturating).
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }
    /// The time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// The source of time.
///
/// # Contract
/// `now` never goes backwards for one clock; `sleep(d)` completes once `now` has advanced by
/// at least `d`.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
    /// Waits for `d` of this clock's time.
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock: wall time for `now`, tokio's timer for `sleep`.
#[derive(Debug, Clone, Default)]
pub struct SystemClock {
    last: Arc<AtomicI64>,
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    fn now(&self) -> Timestamp {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        // Monotonic even if the wall clock steps back.
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        Timestamp(prev.max(wall))
    }

    #[allow(clippy::disallowed_methods)]
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock driven by tokio's timer: `now` is a fixed start time plus the elapsed tokio
/// time. Under a paused runtime (`start_paused`) or turmoil, time is simulated and
/// deterministic.
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: Timestamp,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start` now. Must be created inside a tokio runtime.
    #[allow(clippy::disallowed_methods)]
    pub fn starting_at(start: Timestamp) -> Self {
        TokioClock { start, origin: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> Timestamp {
        self.start.plus(tokio::time::Instant::now().duration_since(self.origin))
    }

    #[allow(clippy::disallowed_methods)]
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock moved only by hand (`advance`, `set`); `sleep` advances it by the slept time and
/// returns at once. For pure unit tests.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock { now: Arc::new(AtomicI64::new(start.as_nanos())) }
    }
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let nanos = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        self.now.fetch_add(nanos, Ordering::SeqCst);
    }
    /// Sets the clock to `t` if that is later than now.
    pub fn set(&self, t: Timestamp) {
        self.now.fetch_max(t.as_nanos(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        self.advance(d);
        Box::pin(std::future::ready(()))
    }
}

/// A seeded random source (SplitMix64): the same seed gives the same sequence on every
/// platform and version, which keeps simulation traces replayable. Cheap to clone; clones
/// share one sequence.
#[derive(Debug, Clone)]
pub struct Rng {
    state: Arc<Mutex<u64>>,
    /// Seeded from the OS: [`secret`](Rng::secret) then reads the OS's random source too.
    entropy: bool,
}

impl Rng {
    /// A source seeded with `seed`.
    pub fn seeded(seed: u64) -> Self {
        Rng { state: Arc::new(Mutex::new(seed)), entropy: false }
    }

    /// `n` bytes for a key that must not be predictable from values this generator hands out
    /// (ids): from the OS's random source when this source came from [`from_entropy`]
    /// (production), from the sequence otherwise (tests and the simulation stay replayable).
    ///
    /// [`from_entropy`]: Rng::from_entropy
    pub fn secret(&self, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        if self.entropy && getrandom::fill(&mut out).is_ok() {
            return out;
        }
        for chunk in out.chunks_mut(8) {
            let b = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        out
    }

    /// A source seeded from the OS (for production use only; tests and the simulation seed
    /// explicitly).
    #[allow(clippy::disallowed_methods)]
    pub fn from_entropy() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let seed = RandomState::new().hash_one(std::time::SystemTime::now());
        Rng { entropy: true, ..Rng::seeded(seed) }
    }

    /// An independent source derived from this one (for a sub-component).
    pub fn fork(&self) -> Rng {
        Rng::seeded(self.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `[0, bound)`; `bound` must be positive.
    pub fn below(&self, bound: u64) -> u64 {
        assert!(bound > 0, "Rng::below needs a positive bound");
        // Lemire's multiply-shift; the bias is below 2^-64 * bound, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniform integer in `[lo, hi]` (inclusive).
    pub fn between(&self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "Rng::between needs lo <= hi");
        if hi - lo == u64::MAX {
            return self.next_u64();
        }
        lo + self.below(hi - lo + 1)
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Runs blocking work (a read that may wait on the disk, a long computation) in place where
/// the runtime can move its other tasks to another thread meanwhile ([`block_in_place`]: a
/// multi-threaded runtime), inline otherwise (a one-thread runtime, as in the simulation, which
/// stays deterministic).
///
/// [`block_in_place`]: tokio::task::block_in_place
pub fn in_place<T>(f: impl FnOnce() -> T) -> T {
    if on_many_threads() { tokio::task::block_in_place(f) } else { f() }
}

/// Whether the current task runs on a multi-threaded tokio runtime (a node; not the
/// simulation's one-thread hosts).
fn on_many_threads() -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    matches!(Handle::try_current().map(|h| h.runtime_flavor()), Ok(RuntimeFlavor::MultiThread))
}

/// Runs CPU-heavy work a client controls (parsing a definition, previewing a schedule) on the
/// blocking pool of a multi-threaded runtime, off the threads that serve requests and renew
/// leases; inline on a one-thread runtime, as in the simulation: a task finishing on another
/// OS thread wakes its caller at a moment of real time, which would make a seed's trace depend
/// on the machine's load.
pub async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, tokio::task::JoinError> {
    if on_many_threads() { tokio::task::spawn_blocking(f).await } else { Ok(f()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulation's one-thread runtime runs blocking work inline, on the caller's thread
    /// (nothing finishes at a moment of real time); a node's multi-threaded runtime runs it on
    /// the blocking pool.
    #[test]
    fn off_runtime_is_inline_on_one_thread_and_pooled_on_many() {
        fn here() -> std::thread::ThreadId {
            std::thread::current().id()
        }
        let one = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (caller, ran) = one.block_on(async { (here(), off_runtime(here).await.unwrap()) });
        assert_eq!(caller, ran, "inline on a one-thread runtime");
        let many = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        let (caller, ran) = many.block_on(async {
            tokio::spawn(async { (here(), off_runtime(here).await.unwrap()) }).await.unwrap()
        });
        assert_ne!(caller, ran, "on the blocking pool of a multi-threaded runtime");
    }

    #[test]
    fn rng_is_deterministic_and_spread() {
        let a = Rng::seeded(7);
        let b = Rng::seeded(7);
        let xs: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(10)).collect();
        assert_eq!(xs, ys);
        let mut counts = [0u32; 10];
        for x in xs {
            counts[x as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 0), "degenerate distribution: {counts:?}");
        assert!((0..1000).map(|_| a.between(3, 5)).all(|x| (3..=5).contains(&x)));
    }

    #[test]
    fn manual_clock_moves_only_by_hand() {
        let c = ManualClock::new(Timestamp::from_millis(1_000));
        assert_eq!(c.now().as_millis(), 1_000);
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now().as_millis(), 1_005);
        c.set(Timestamp::from_millis(10));
        assert_eq!(c.now().as_millis(), 1_005, "set never moves back");
        assert_eq!(c.now().since(Timestamp::from_millis(1_000)), Duration::from_millis(5));
    }
}
