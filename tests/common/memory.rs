//! A process's resident memory, read from /proc: its current size, its
//! steady size (once it stops moving), and its peak while something runs
//! (sampled every 20 ms, and the kernel's own high-water mark, reset first).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1024 * 1024;

/// A field of /proc/`pid`/status in bytes (`VmRSS`, `VmHWM`); `None` once
/// the process is gone.
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// The resident size of `pid` now, in bytes.
pub fn rss(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS").unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// The pid of the program the operator's ManagedProcess runs: the process
/// starts as `setpriv`, which execs it in place (same pid).
pub fn operator_pid(process: &slotkeeper_env::process::ManagedProcess) -> u32 {
    let pid = process.pid();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "slotkeeper" {
            return pid;
        }
        assert!(Instant::now() < deadline, "process {pid} runs {comm:?}, not slotkeeper");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `pid` still runs (exists and is no zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|s| !s.lines().any(|l| l.starts_with("State:") && (l.contains('Z') || l.contains('X'))))
}

/// The resident size once it has moved less than `tolerance` over `window`
/// (jemalloc hands freed pages back after about a second, see
/// .cargo/config.toml), or, after `timeout`, the last reading.
pub async fn steady_rss(pid: u32, tolerance: u64, window: Duration, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    let mut readings: Vec<(Instant, u64)> = Vec::new();
    loop {
        let now = Instant::now();
        readings.push((now, rss(pid)));
        readings.retain(|(at, _)| now.duration_since(*at) <= window + Duration::from_millis(100));
        let span = now.duration_since(readings[0].0);
        let (low, high) = readings.iter().fold((u64::MAX, 0), |(l, h), (_, r)| (l.min(*r), h.max(*r)));
        if (span >= window && high - low <= tolerance) || now >= deadline {
            return readings.last().unwrap().1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The highest resident size of a process while it runs, sampled every
/// 20 ms on a thread of its own (the test's runtime may be busy), and the
/// kernel's VmHWM after resetting it (`echo 5 > /proc/PID/clear_refs`), which
/// misses no short peak between samples.
pub struct PeakSampler {
    pid: u32,
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    hwm_reset: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a [`PeakSampler`] saw.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// The highest VmRSS sampled.
    pub sampled: u64,
    /// VmHWM since the reset, when the kernel allowed the reset.
    pub high_water: Option<u64>,
    pub samples: u64,
}

impl Peak {
    /// The higher of the two readings.
    pub fn bytes(&self) -> u64 {
        self.sampled.max(self.high_water.unwrap_or(0))
    }
}

impl PeakSampler {
    pub fn start(pid: u32) -> Self {
        let hwm_reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss(pid)));
        let samples = Arc::new(AtomicU64::new(1));
        let thread = {
            let (stop, peak, samples) = (stop.clone(), peak.clone(), samples.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(now) = status_bytes(pid, "VmRSS") {
                        peak.fetch_max(now, Ordering::Relaxed);
                        samples.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Self { pid, stop, peak, samples, hwm_reset, thread: Some(thread) }
    }

    pub fn stop(mut self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the sampler thread");
        }
        let high_water = if self.hwm_reset { status_bytes(self.pid, "VmHWM") } else { None };
        Peak { sampled: self.peak.load(Ordering::Relaxed), high_water, samples: self.samples.load(Ordering::Relaxed) }
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `bytes` in MiB, one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// `after - before` in MiB, signed, one decimal.
pub fn growth(before: u64, after: u64) -> String {
    format!("{:+.1} MiB", (after as f64 - before as f64) / MIB as f64)
}
