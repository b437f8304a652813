//! Steady-state cost with N clusters of 3 masters (50 unless given: `cargo
//! bench --bench scale -- 100`): operator resident memory, with the console's read model on,
//! reconcile latency (p50/p99 from the reconcile-time histogram) and API
//! requests per minute, writes counted from the apiserver's audit log,
//! over a 120 s window (about 200 reconciles, so p99 is not just the maximum).
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench scale -- 100`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::metrics::{quantile, reconcile_buckets as buckets, sum};
use common::operator::*;
use common::*;
use kube::Api;
use kube::api::ListParams;
use slotkeeper_operator::api::RedisCluster;

const DEFAULT_CLUSTERS: usize = 50;
const WINDOW: Duration = Duration::from_secs(120);

fn main() {
    // cargo passes `--bench`; the first number given is the cluster count.
    let clusters = std::env::args().skip(1).find_map(|a| a.parse::<usize>().ok()).unwrap_or(DEFAULT_CLUSTERS);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let operator = shared_operator(env);
        let client = env.client().await.unwrap();
        let ns = namespace(&client, "bench-scale").await;
        let took = create_clusters(env, &ns, clusters, "").await;
        let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
        println!("{clusters} clusters of 3 masters Running after {:.0}s", took.as_secs_f64());

        tokio::time::sleep(Duration::from_secs(10)).await;
        // The floor, measured beside the operator in the same window: the
        // round trip a reconcile cannot avoid (the same eight-command pipeline
        // to a cluster's three masters at once, over kept connections).
        let mut targets = Vec::new();
        for c in api.list(&ListParams::default()).await.unwrap().items {
            let name = c.metadata.name.clone().unwrap();
            let password = password(&client, &ns, &name).await;
            let mut connections = Vec::new();
            for ip in c.status.unwrap().nodes.iter().filter_map(|n| n.ip.clone()) {
                let url = format!("redis://:{password}@{ip}:6379/");
                connections.push(redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap());
            }
            targets.push(connections);
        }
        let floor = tokio::spawn(async move {
            let mut samples = Vec::new();
            let deadline = Instant::now() + WINDOW;
            let mut i = 0;
            while Instant::now() < deadline {
                let connections = &mut targets[i % clusters];
                i += 1;
                let started = Instant::now();
                let asks = connections.iter_mut().map(|c| async move {
                    let mut pipe = redis::pipe();
                    pipe.cmd("CLUSTER").arg("NODES").cmd("CLUSTER").arg("INFO");
                    pipe.cmd("INFO").arg("server").cmd("INFO").arg("replication").cmd("INFO").arg("memory");
                    pipe.cmd("INFO").arg("persistence").cmd("INFO").arg("stats").cmd("INFO").arg("clients");
                    let _: Vec<String> = pipe.query_async(c).await.unwrap();
                });
                futures::future::join_all(asks).await;
                samples.push(started.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        let before = operator.metrics().await;
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        tokio::time::sleep(WINDOW).await;
        let after = operator.metrics().await;
        let mut floor = floor.await.unwrap();
        floor.sort_by(f64::total_cmp);
        let pick = |q: f64| floor[((floor.len() - 1) as f64 * q) as usize];

        let rss = sum(&after, "process_resident_memory_bytes") / (1024.0 * 1024.0);
        let reconciles = sum(&after, "controller_runtime_reconcile_total") - sum(&before, "controller_runtime_reconcile_total");
        let requests = sum(&after, "rest_client_requests_total") - sum(&before, "rest_client_requests_total");
        let (b, a) = (buckets(&before), buckets(&after));
        let audit = std::fs::read_to_string(env.audit_log()).unwrap();
        let (mut writes, mut lease_writes) = (Vec::new(), 0);
        for event in audit.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
            let ours = event["user"]["username"] == "system:serviceaccount:slotkeeper-system:slotkeeper";
            let late = event["requestReceivedTimestamp"].as_str().is_some_and(|t| t > since.as_str());
            let write = matches!(event["verb"].as_str(), Some("create" | "update" | "patch" | "delete"));
            if ours && late && write && event["stage"] == "ResponseComplete" {
                if event["objectRef"]["resource"] == "leases" {
                    lease_writes += 1;
                } else {
                    writes.push(format!("{} {}", event["verb"], event["objectRef"]["resource"]));
                }
            }
        }
        let per_minute = 60.0 / WINDOW.as_secs_f64();
        println!("steady state over {WINDOW:?} with {clusters} clusters:");
        println!("  operator resident memory: {rss:.1} MiB (target < 50 MiB)");
        println!("  reconciles: {:.0}/min; reconcile p50 {}, p99 {} (target p99 < 20 ms)", reconciles * per_minute, quantile(&b, &a, 0.5), quantile(&b, &a, 0.99));
        println!(
            "  floor in the same window, the reconcile's Redis round trip alone from this process ({} samples): p50 {:.1} ms, p99 {:.1} ms",
            floor.len(),
            pick(0.5),
            pick(0.99)
        );
        println!("  API requests: {:.0}/min; writes other than Lease renewals: {} (target 0); Lease writes: {lease_writes}", requests * per_minute, writes.len());
        if !writes.is_empty() {
            println!("  writes: {writes:?}");
        }
    });
}
