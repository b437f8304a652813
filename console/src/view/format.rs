//! How numbers, sizes and times read on a page.

use k8s_openapi::jiff::Timestamp;

/// `512 B`, `3.2 KiB`, `14.0 MiB`, `1.5 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `12.0 MiB of 96.0 MiB`, or `12.0 MiB (no limit)` when maxmemory is 0.
pub fn memory(used: u64, maxmemory: u64) -> String {
    match maxmemory {
        0 => format!("{} (no limit)", bytes(used)),
        max => format!("{} of {}", bytes(used), bytes(max)),
    }
}

/// `950`, `12.3k`, `4.1M`.
pub fn count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else if n >= 100.0 || n.fract() == 0.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.1}")
    }
}

/// How long ago, as `kubectl get` prints ages: `42s`, `7m`, `3h`, `12d`.
pub fn age(since: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(since).as_secs().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// A timestamp as UTC wall time, `2026-12-03 08:11:01Z`.
pub fn time(at: Timestamp) -> String {
    at.strftime("%Y-%m-%d %H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_counts_and_ages_read_like_kubectl() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 + 300), "3.3 KiB");
        assert_eq!(bytes(14 << 20), "14.0 MiB");
        assert_eq!(count(950.0), "950");
        assert_eq!(count(12_345.0), "12.3k");
        assert_eq!(count(2.5), "2.5");
        let now = Timestamp::from_second(1_000_000).unwrap();
        assert_eq!(age(Timestamp::from_second(1_000_000 - 42).unwrap(), now), "42s");
        assert_eq!(age(Timestamp::from_second(1_000_000 - 7 * 60).unwrap(), now), "7m");
        assert_eq!(age(Timestamp::from_second(1_000_000 - 3 * 3600).unwrap(), now), "3h");
        assert_eq!(time(Timestamp::from_second(0).unwrap()), "1970-01-01 00:00:00Z");
    }
}
