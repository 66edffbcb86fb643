//! The node's process and build as metrics: `kairos_build_info{version,commit,backend}`, and
//! on Linux (read from `/proc/self` at each scrape) `process_cpu_seconds_total`,
//! `process_resident_memory_bytes` and `process_open_fds`, under the names Prometheus's own
//! clients use. Elsewhere the process series are absent.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// The commit the binary was built from (`build.rs`; `unknown` without git).
pub const COMMIT: &str = env!("KAIROS_BUILD_COMMIT");

/// Registers `kairos_build_info` (always 1) with the node's `backend`.
pub fn register_build_info(reg: &mut Registry, backend: &str) {
    let info = Family::<Vec<(&'static str, String)>, Gauge>::default();
    let labels = vec![
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("commit", COMMIT.to_string()),
        ("backend", backend.to_string()),
    ];
    info.get_or_create(&labels).set(1);
    reg.register(
        "kairos_build_info",
        "The binary's version and commit, and the node's store backend; always 1",
        info,
    );
}

/// The process's CPU time (s), resident memory (bytes) and open file descriptors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: i64,
    /// Open file descriptors.
    pub open_fds: i64,
}

/// This process's stats, read from `/proc/self`; `None` where there is no such thing.
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command (in parentheses, which may hold spaces): state is the 3rd
    // field, utime the 14th and stime the 15th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let (hz, page) =
        unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split(' ').nth(1)?.parse().ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    Some(ProcessStats {
        cpu_seconds: ticks / hz.max(1) as f64,
        resident_bytes: pages * page.max(1),
        open_fds,
    })
}

/// Registers the process metrics (none where [`read`] finds nothing).
pub fn register_process(reg: &mut Registry) {
    let Some(p) = read() else { return };
    let cpu = prometheus_client::metrics::counter::ConstCounter::new(p.cpu_seconds);
    reg.register(
        "process_cpu_seconds",
        "User and system CPU time of the node's process, in seconds",
        cpu,
    );
    reg.register(
        "process_resident_memory_bytes",
        "Resident memory of the node's process, in bytes",
        ConstGauge::new(p.resident_bytes),
    );
    reg.register(
        "process_open_fds",
        "File descriptors the node's process holds open",
        ConstGauge::new(p.open_fds),
    );
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn reads_this_process() {
        let a = super::read().expect("/proc/self on Linux");
        assert!(a.open_fds >= 3, "stdin, stdout, stderr at least: {a:?}");
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let c = super::read().unwrap();
        assert!(c.cpu_seconds > a.cpu_seconds, "{a:?} {c:?}");
        assert!(c.resident_bytes > 1 << 20, "{c:?}");
    }
}
