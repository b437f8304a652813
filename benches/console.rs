//! What the console costs, with 50 clusters of 3 masters, in one run:
//!
//! 1. the operator with the console off: resident memory and reconcile
//!    latency over a window;
//! 2. the operator with the console on, 100 live-update streams open (50 on
//!    the clusters page, 50 on cluster pages) and pages being requested:
//!    page render time (clusters page, a cluster page), the time from a
//!    status change in the API to the fragment arriving on the streams,
//!    resident memory and reconcile latency over the same length of window.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench console`

#[path = "../tests/common/mod.rs"]
mod common;

use slotkeeper_api::API_VERSION;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::metrics::{quantile, reconcile_buckets as buckets, sum};
use common::operator::*;
use common::*;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::Api;
use kube::api::{Patch, PatchParams};
use slotkeeper_api::RedisCluster;

const CLUSTERS: usize = 50;
const LIST_STREAMS: usize = 50;
const CLUSTER_STREAMS: usize = 50;
const WINDOW: Duration = Duration::from_secs(90);
const FLIPS: usize = 20;

type Http = HttpClient<HttpConnector, Full<Bytes>>;

fn percentile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// CPU seconds the operator has used so far: all threads, and its `http`
/// thread (the console and /metrics) alone, from /proc.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let ticks = |stat: &str| -> f64 {
        // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("").split_whitespace().collect();
        fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum::<f64>() / 100.0).unwrap_or(0.0)
    };
    let total = ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default());
    let mut http = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "http" {
            http += ticks(&std::fs::read_to_string(task.path().join("stat")).unwrap_or_default());
        }
    }
    (total, http)
}

/// Reconciles, p50/p99 and resident memory over one window.
async fn window(operator: &Operator, what: &str) -> (String, String, f64, f64) {
    let before = operator.metrics().await;
    let cpu_before = cpu_seconds(operator.process.pid());
    let mut rss_seen = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(WINDOW / 6).await;
        rss_seen.push(format!("{:.1}", sum(&operator.metrics().await, "process_resident_memory_bytes") / 1048576.0));
    }
    let after = operator.metrics().await;
    let cpu_after = cpu_seconds(operator.process.pid());
    println!("  {what}: resident memory through the window (MiB): {}", rss_seen.join(", "));
    println!(
        "  {what}: operator CPU {:.1} s over {:.0} s ({:.1} s of it on the http thread: console and /metrics)",
        cpu_after.0 - cpu_before.0,
        WINDOW.as_secs_f64(),
        cpu_after.1 - cpu_before.1
    );
    let (b, a) = (buckets(&before), buckets(&after));
    let reconciles =
        sum(&after, "controller_runtime_reconcile_total") - sum(&before, "controller_runtime_reconcile_total");
    let rss = sum(&after, "process_resident_memory_bytes") / (1024.0 * 1024.0);
    println!(
        "  {what}: {reconciles:.0} reconciles, p50 {}, p99 {}; resident memory {rss:.1} MiB",
        quantile(&b, &a, 0.5),
        quantile(&b, &a, 0.99)
    );
    (quantile(&b, &a, 0.5), quantile(&b, &a, 0.99), rss, reconciles)
}

fn request(
    method: &str,
    port: u16,
    path: &str,
    cookie: Option<&str>,
    body: Option<String>,
) -> hyper::Request<Full<Bytes>> {
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("accept", "text/html")
        .header("sec-fetch-site", "same-origin");
    if let Some(cookie) = cookie {
        builder = builder.header("cookie", cookie);
    }
    if body.is_some() {
        builder = builder.header("content-type", "application/x-www-form-urlencoded");
    }
    builder.body(Full::new(Bytes::from(body.unwrap_or_default()))).unwrap()
}

/// Signs in with `token`; returns the session cookie.
async fn sign_in(http: &Http, port: u16, token: &str) -> String {
    let body = format!("token={token}");
    let response = http.request(request("POST", port, "/actions/sign-in", None, Some(body))).await.unwrap();
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("slotkeeper_session="))
        .expect("a session cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// Fragments received on all streams, and those about the probe cluster
/// with their arrival time (kept small: the bench shares the machine).
#[derive(Default)]
struct Received {
    all: usize,
    probe: Vec<(Instant, String)>,
}

/// Opens a page as a browser does: renders it, then opens the live stream
/// it names (which starts from what the page shows), recording what arrives.
async fn open_page(http: &Http, port: u16, page: &str, cookie: &str, seen: Arc<Mutex<Received>>) {
    let response = http.request(request("GET", port, page, Some(cookie), None)).await.unwrap();
    let body = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let live = body.split("data-live=\"").nth(1).and_then(|r| r.split('"').next()).expect("the page names its stream");
    open_stream(http.clone(), port, live.replace("&amp;", "&"), cookie.to_owned(), seen);
}

/// Opens a live stream and records what arrives on it.
fn open_stream(http: Http, port: u16, path: String, cookie: String, seen: Arc<Mutex<Received>>) {
    tokio::spawn(async move {
        let response = http.request(request("GET", port, &path, Some(&cookie), None)).await.expect("stream opens");
        assert_eq!(response.status(), 200, "{path}");
        let mut body = response.into_body();
        let mut buffer = String::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Some(data) = frame.data_ref() else { continue };
            buffer.push_str(&String::from_utf8_lossy(data));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                if event.contains("event: fragment") {
                    let mut seen = seen.lock().unwrap();
                    seen.all += 1;
                    if event.contains("probe") || path.contains("/probe?") {
                        seen.probe.push((Instant::now(), event));
                    }
                }
            }
        }
    });
}

async fn page_times(http: &Http, port: u16, cookie: &str, paths: &[String], rounds: usize) -> Vec<f64> {
    let mut times = Vec::new();
    for round in 0..rounds {
        let path = &paths[round % paths.len()];
        let started = Instant::now();
        let response = http.request(request("GET", port, path, Some(cookie), None)).await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert!(body.len() > 1000, "{path} rendered a page");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    times
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let client = env.client().await.unwrap();
        let ns = namespace(&client, "bench-console").await;
        let http: Http = HttpClient::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();

        println!("phase 1: the operator without the console");
        let quiet = start_operator_with(env, "bench-no-console", &[("SLOTKEEPER_CONSOLE", "false")]);
        // A paused cluster whose status the bench changes by hand: the operator leaves a paused cluster's phase alone.
        let probe = format!("---\napiVersion: {API_VERSION}\nkind: RedisCluster\nmetadata: {{name: probe, namespace: {ns}}}\nspec: {{masters: 3, redis: {{version: 7.0.15}}, paused: true}}\n");
        let took = create_clusters(env, &ns, CLUSTERS, &probe).await;
        let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
        println!("  {CLUSTERS} clusters Running after {:.0}s", took.as_secs_f64());
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (_, p99_off, rss_off, _) = window(&quiet, "console off").await;
        drop(quiet);

        println!("phase 2: the operator with the console, {} live streams", LIST_STREAMS + CLUSTER_STREAMS);
        let serving = start_operator_with(env, "bench-console", &[]);
        let port = serving.http_port;
        wait_until("the console serving", Duration::from_secs(60), || async {
            let (ok, _) = http_get(port, "/signin").await;
            ok.then_some(())
        })
        .await;
        let cookie = sign_in(&http, port, &user_token(env, slotkeeper_env::ADMIN_USER)).await;
        // The new replica takes the Lease once the old one's expires (15 s),
        // then observes every cluster once, before the window opens.
        tokio::time::sleep(Duration::from_secs(40)).await;
        let rss = |text: String| sum(&text, "process_resident_memory_bytes") / 1048576.0;
        println!("  leading, serving, no page open: resident memory {:.1} MiB", rss(serving.metrics().await));
        let _ = page_times(&http, port, &cookie, &["/".to_owned(), format!("/clusters/{ns}/c01")], 20).await;
        println!("  after 20 page renders: resident memory {:.1} MiB", rss(serving.metrics().await));
        let seen: Arc<Mutex<Received>> = Arc::default();
        for _ in 0..LIST_STREAMS {
            open_page(&http, port, "/", &cookie, seen.clone()).await;
        }
        for i in 0..CLUSTER_STREAMS {
            let name = if i == 0 { "probe".to_owned() } else { format!("c{:02}", i % CLUSTERS) };
            open_page(&http, port, &format!("/clusters/{ns}/{name}"), &cookie, seen.clone()).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let initial = seen.lock().unwrap().all;
        println!(
            "  {} pages open, each with its live stream; {initial} fragments received since; resident memory {:.1} MiB",
            LIST_STREAMS + CLUSTER_STREAMS,
            rss(serving.metrics().await)
        );

        let measuring = {
            let (http, cookie, ns) = (http.clone(), cookie.clone(), ns.clone());
            tokio::spawn(async move {
                let list = page_times(&http, port, &cookie, &["/".to_owned()], 150).await;
                let pages: Vec<String> = (0..CLUSTERS).map(|i| format!("/clusters/{ns}/c{i:02}")).collect();
                let cluster = page_times(&http, port, &cookie, &pages, 150).await;
                (list, cluster)
            })
        };
        let flips = {
            let (api, seen, ns) = (api.clone(), seen.clone(), ns.clone());
            tokio::spawn(async move {
                let mut delays = Vec::new();
                let mut missed = 0;
                for flip in 0..FLIPS {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let phase = if flip % 2 == 0 { "Scaling" } else { "Creating" };
                    let patch = Patch::Merge(serde_json::json!({ "status": { "phase": phase } }));
                    api.patch_status("probe", &PatchParams::default(), &patch).await.unwrap();
                    let changed = Instant::now();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let marker = format!("data-phase=\"{phase}\"");
                    let row = format!("row:{ns}/probe");
                    let arrivals: Vec<f64> = seen
                        .lock()
                        .unwrap()
                        .probe
                        .iter()
                        .filter(|(at, _)| *at >= changed)
                        .filter(|(_, event)| {
                            // The probe's row on the list, or the probe's own summary.
                            let probe_row = event.find(&row).map(|i| &event[i..]).map(|r| &r[..r.find("</tr>").unwrap_or(r.len())]);
                            probe_row.is_some_and(|r| r.contains(&marker)) || (event.contains("data: summary") && event.contains(&marker) && event.contains("paused"))
                        })
                        .map(|(at, _)| at.duration_since(changed).as_secs_f64() * 1000.0)
                        .collect();
                    if arrivals.len() < LIST_STREAMS + 1 {
                        missed += LIST_STREAMS + 1 - arrivals.len();
                    }
                    delays.extend(arrivals);
                }
                (delays, missed)
            })
        };
        let (p50_on, p99_on, rss_on, _) = window(&serving, "console on").await;
        let (mut list, mut cluster) = measuring.await.unwrap();
        let (mut delays, missed) = flips.await.unwrap();
        let received = seen.lock().unwrap().all;

        println!();
        println!("results ({CLUSTERS} clusters of 3 masters, {} live streams):", LIST_STREAMS + CLUSTER_STREAMS);
        println!(
            "  clusters page render: p50 {:.1} ms, p99 {:.1} ms ({} requests; target p99 < 50 ms)",
            percentile(&mut list, 0.5),
            percentile(&mut list, 0.99),
            list.len()
        );
        println!(
            "  cluster page render: p50 {:.1} ms, p99 {:.1} ms ({} requests; target p99 < 50 ms)",
            percentile(&mut cluster, 0.5),
            percentile(&mut cluster, 0.99),
            cluster.len()
        );
        if delays.is_empty() {
            println!("  status change → fragment: nothing arrived");
        } else {
            println!(
                "  status change in the API → fragment on the streams: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} arrivals ({FLIPS} changes × {} streams; {missed} missing; target < 1 s)",
                percentile(&mut delays, 0.5),
                percentile(&mut delays, 0.99),
                percentile(&mut delays, 1.0),
                delays.len(),
                LIST_STREAMS + 1
            );
        }
        println!("  fragments received in all: {received}");
        println!(
            "  operator resident memory: {rss_off:.1} MiB without the console, {rss_on:.1} MiB with it: +{:.1} MiB (target < 20 MiB more)",
            rss_on - rss_off
        );
        println!("  reconcile p99: {p99_off} without the console, {p99_on} with it (p50 with it {p50_on})");
    });
}
