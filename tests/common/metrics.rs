//! Reading the operator's /metrics in tests and benchmarks.

use std::collections::BTreeMap;

/// Sum of the samples whose line starts with `prefix`.
pub fn sum(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Cumulative histogram buckets (le → count) of the reconcile time.
pub fn reconcile_buckets(text: &str) -> BTreeMap<String, f64> {
    buckets(text, "controller_runtime_reconcile_time_seconds")
}

/// Cumulative buckets (le → count) of the histogram `name`.
pub fn buckets(text: &str, name: &str) -> BTreeMap<String, f64> {
    let prefix = format!("{name}_bucket");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?.to_owned();
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` of the observations
/// between two readings of a histogram.
pub fn quantile(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, q: f64) -> String {
    let mut rows: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| (le.parse::<f64>().unwrap_or(f64::INFINITY), n - before.get(le).copied().unwrap_or(0.0)))
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = rows.last().map(|r| r.1).unwrap_or(0.0);
    let bound = rows.iter().find(|(_, n)| *n >= q * total).map(|r| r.0).unwrap_or(f64::INFINITY);
    if bound.is_finite() { format!("<= {:.1} ms", bound * 1000.0) } else { "> largest bucket".into() }
}
