//! The last 15 minutes as small SVG line charts, drawn on the server from
//! the read model's samples: ops/s, memory used against maxmemory,
//! connected clients, keyspace hits and misses, replication lag.

use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_readmodel::Sample;
use slotkeeper_readmodel::samples::{WINDOW, rate};

use super::format;

const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 120.0;
const LEFT: f64 = 54.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 20.0;

/// One line: a name for the legend, a CSS class for its colour, points as
/// (seconds before now, value).
struct Series {
    name: &'static str,
    class: &'static str,
    points: Vec<(f64, f64)>,
}

fn seconds_ago(at: Timestamp, now: Timestamp) -> f64 {
    now.duration_since(at).as_secs_f64()
}

fn series(
    samples: &[Sample],
    now: Timestamp,
    name: &'static str,
    class: &'static str,
    value: impl Fn(&Sample) -> Option<f64>,
) -> Series {
    let points = samples.iter().filter_map(|s| Some((seconds_ago(s.at, now), value(s)?))).collect();
    Series { name, class, points }
}

/// Rates of a counter between consecutive samples, plotted at the later one.
fn rates(
    samples: &[Sample],
    now: Timestamp,
    name: &'static str,
    class: &'static str,
    counter: fn(&Sample) -> u64,
) -> Series {
    let points =
        samples.windows(2).filter_map(|w| Some((seconds_ago(w[1].at, now), rate(&w[0], &w[1], counter)?))).collect();
    Series { name, class, points }
}

pub fn charts(samples: &[Sample], now: Timestamp) -> AnyView {
    if samples.is_empty() {
        return view! { <p class="empty">"No samples yet: every observation of the cluster adds one (about every 10 s)."</p> }
            .into_any();
    }
    let limited = samples.iter().any(|s| s.maxmemory > 0);
    let charts = [
        chart(
            "Operations per second",
            vec![series(samples, now, "ops/s", "line-a", |s| Some(s.ops_per_sec as f64))],
            false,
        ),
        chart(
            if limited { "Memory used of maxmemory (masters)" } else { "Memory used (masters; no maxmemory set)" },
            vec![
                series(samples, now, "used", "line-a", |s| Some(s.used_memory as f64)),
                series(samples, now, "maxmemory", "line-limit", |s| (s.maxmemory > 0).then_some(s.maxmemory as f64)),
            ],
            true,
        ),
        chart(
            "Connected clients",
            vec![series(samples, now, "clients", "line-a", |s| Some(s.connected_clients as f64))],
            false,
        ),
        chart(
            "Keyspace hits and misses per second",
            vec![
                rates(samples, now, "hits/s", "line-a", |s| s.keyspace_hits),
                rates(samples, now, "misses/s", "line-b", |s| s.keyspace_misses),
            ],
            false,
        ),
        chart(
            "Replication lag (largest replica)",
            vec![series(samples, now, "lag", "line-a", |s| Some(s.max_lag_bytes as f64))],
            true,
        ),
    ];
    view! { <div class="charts">{charts.into_iter().collect_view()}</div> }.into_any()
}

fn chart(title: &'static str, lines: Vec<Series>, in_bytes: bool) -> impl IntoView + use<> {
    let label = |v: f64| if in_bytes { format::bytes(v as u64) } else { format::count(v) };
    let highest = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let top = if in_bytes { nice_bytes(highest) } else { nice(highest) };
    let window = WINDOW.as_secs_f64();
    let plot_width = WIDTH - LEFT - 6.0;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = move |ago: f64| LEFT + plot_width * (1.0 - (ago / window).clamp(0.0, 1.0));
    let y = move |value: f64| TOP + plot_height * (1.0 - value / top);
    let latest: Vec<String> = lines
        .iter()
        .map(|l| {
            let last = l.points.iter().min_by(|a, b| a.0.total_cmp(&b.0)).map(|p| label(p.1));
            format!("{}: {}", l.name, last.unwrap_or_else(|| "—".into()))
        })
        .collect();
    let description = format!("{title}, last 15 minutes; latest {}", latest.join(", "));
    let polylines = lines
        .iter()
        .map(|l| {
            let points: Vec<String> = l.points.iter().map(|(ago, v)| format!("{:.1},{:.1}", x(*ago), y(*v))).collect();
            view! { <polyline class=format!("series {}", l.class) points=points.join(" ")></polyline> }
        })
        .collect_view();
    let legend = lines
        .iter()
        .zip(&latest)
        .map(|(l, text)| view! { <li><span class=format!("key {}", l.class) aria-hidden="true"></span>{text.clone()}</li> })
        .collect_view();
    let baseline = TOP + plot_height;
    view! {
        <figure class="chart">
            <figcaption>{title}</figcaption>
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") width=WIDTH height=HEIGHT role="img" aria-label=description>
                <line class="axis" x1=LEFT y1=TOP x2=LEFT y2=baseline></line>
                <line class="axis" x1=LEFT y1=baseline x2=WIDTH - 6.0 y2=baseline></line>
                <line class="grid" x1=LEFT y1=TOP + plot_height / 2.0 x2=WIDTH - 6.0 y2=TOP + plot_height / 2.0></line>
                <text class="tick" x=LEFT - 4.0 y=TOP + 8.0 text-anchor="end">{label(top)}</text>
                <text class="tick" x=LEFT - 4.0 y=baseline text-anchor="end">"0"</text>
                <text class="tick" x=LEFT y=HEIGHT - 4.0>"−15 min"</text>
                <text class="tick" x=WIDTH - 6.0 y=HEIGHT - 4.0 text-anchor="end">"now"</text>
                {polylines}
            </svg>
            <ul class="chart-legend">{legend}</ul>
        </figure>
    }
}

/// The smallest of 1, 2, 2.5, 5 × 10ⁿ at or above `value` (1 for nothing),
/// so an axis reads `20k`, not `18.7k`.
pub fn nice(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|v| *v >= value).unwrap_or(10.0 * magnitude)
}

/// [`nice`] in the binary unit the value reads in (`30.0 MiB`, not `27.7 MiB`).
pub fn nice_bytes(value: f64) -> f64 {
    let mut unit = 1.0;
    while value / unit >= 1024.0 {
        unit *= 1024.0;
    }
    nice(value / unit) * unit
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::capacity::MemoryFact;
    use slotkeeper_readmodel::{NodeView, Observation, Role, Source, StatsFact};

    fn sample(second: i64, ops: u64, hits: u64) -> Sample {
        Sample::of(&Observation {
            at: Timestamp::from_second(second).unwrap(),
            nodes: vec![NodeView {
                pod: "c-shard-0-0".into(),
                reachable: true,
                id: Some("a".into()),
                role: Some(Role::Master),
                memory: MemoryFact { used: 10 << 20, dataset: 5 << 20, maxmemory: 100 << 20 },
                stats: StatsFact { ops_per_sec: ops, connected_clients: 3, keyspace_hits: hits, keyspace_misses: 0 },
                ..Default::default()
            }],
            step: None,
            source: Source::Reconcile,
        })
    }

    #[test]
    fn five_charts_with_lines_and_latest_values_in_words() {
        let samples: Vec<Sample> = (0..10).map(|i| sample(1000 + i * 10, 100 + i as u64, i as u64 * 50)).collect();
        let html = Owner::new().with(|| charts(&samples, Timestamp::from_second(1100).unwrap()).to_html());
        assert_eq!(html.matches("<figure class=\"chart\">").count(), 5);
        assert!(html.contains("ops/s: 109"), "{html}");
        assert!(html.contains("hits/s: 5,") || html.contains("hits/s: 5<"), "{html}");
        assert!(html.contains("used: 10.0 MiB") && html.contains("maxmemory: 100.0 MiB"), "{html}");
        assert!(html.matches("<polyline").count() >= 6);
    }

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice(18.7), 20.0);
        assert_eq!(nice(13_100.0), 20_000.0);
        assert_eq!(nice(2.2), 2.5);
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice_bytes(26.4 * 1048576.0), 50.0 * 1048576.0);
        assert_eq!(nice_bytes(873.5 * 1024.0), 1000.0 * 1024.0);
    }

    #[test]
    fn no_samples_says_why() {
        let html = Owner::new().with(|| charts(&[], Timestamp::UNIX_EPOCH).to_html());
        assert!(html.contains("No samples yet"));
    }
}
