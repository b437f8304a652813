//! Redis 7.0.15 → Valkey 8.1.8, side by side in one run, same shape (3×1 on
//! persistent volumes), same data (100,000 keys), same `WAIT 1` writer:
//! - Slotkeeper's rollout (replicas first, coordinated failover, then the
//!   old master; canary bake 0 s so the comparison is of the steps alone);
//! - the way a plain StatefulSet rolls: the cluster's StatefulSets are
//!   handed over (Slotkeeper paused), their image changed in the pod
//!   template with `RollingUpdate`: highest ordinal first, masters restarted
//!   in place, as Redis operators without a rollout planner do it.
//!
//! Reported for each: acknowledged writes lost, the longest interval
//! without an acknowledged write per shard (one writer per shard, on that
//! shard's keys), full resyncs (`sync_full`
//! summed over every server process), total time. The reference for the
//! gaps is a single `RedisOperation` failover measured first.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench rollout`

#[path = "../tests/common/mod.rs"]
mod common;

use slotkeeper_api::API_VERSION;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::operator::*;
use common::rollout::*;
use common::writer::{ClusterClient, Writer, lost_after_settling};
use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use slotkeeper_operator::api::{OperationPhase, RedisCluster, RedisOperation};

const SPEC: &str = "masters: 3, replicasPerMaster: 1, storage: {size: 1Gi}, rollout: {canaryBakeSeconds: 0}";
const KEYS: usize = 100_000;

/// `sync_full` of every server process seen (keyed by `run_id`), sampled
/// every 500 ms: a restarted process starts its counter again.
struct SyncCounter {
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SyncCounter {
    fn start(pods: Api<Pod>, cluster: &str, password: &str) -> Self {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, selector, password) = (seen.clone(), format!("slotkeeper.io/cluster={cluster}"), password.to_owned());
        let task = tokio::spawn(async move {
            loop {
                let ips: Vec<String> = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map(|l| l.items.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).collect())
                    .unwrap_or_default();
                for ip in ips {
                    let ask = async {
                        let client = redis::Client::open(format!("redis://:{password}@{ip}:6379/")).ok()?;
                        let mut c = client.get_multiplexed_async_connection().await.ok()?;
                        let info: String = redis::cmd("INFO").arg("all").query_async(&mut c).await.ok()?;
                        let field =
                            |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned());
                        Some((field("run_id:")?, field("sync_full:")?.parse::<u64>().ok()?))
                    };
                    if let Ok(Some((run_id, full))) = tokio::time::timeout(Duration::from_millis(400), ask).await {
                        let mut seen = s.lock().unwrap();
                        let entry = seen.entry(run_id).or_insert(0);
                        *entry = (*entry).max(full);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { seen, task }
    }

    fn total(self) -> u64 {
        self.task.abort();
        self.seen.lock().unwrap().values().sum()
    }
}

struct Outcome {
    lost: usize,
    acknowledged: usize,
    gaps: Vec<f64>,
    sync_full: u64,
    seconds: f64,
}

/// Each shard's slots, keyed by shard.
fn shard_slots(cluster: &RedisCluster) -> BTreeMap<usize, BTreeSet<u16>> {
    let status = cluster.status.as_ref().unwrap();
    status
        .nodes
        .iter()
        .filter(|n| n.role.as_deref() == Some("master"))
        .map(|n| (n.pod.rsplit('-').nth(1).unwrap().parse().unwrap(), slots_in(&n.slots)))
        .collect()
}

async fn prepare(
    env: &'static slotkeeper_env::Environment,
    kube: &kube::Client,
    ns: &str,
) -> (RedisCluster, String, Vec<String>) {
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), ns);
    apply_cluster_spec(env, ns, "c", &format!("{SPEC}, redis: {{version: 7.0.15}}"));
    let cluster = wait_settled(&clusters, "c", 3, 6, Duration::from_secs(300)).await;
    let password = password(kube, ns, "c").await;
    let seeds = ClusterClient::new(node_ips(&cluster), &password).await.seed("seed", KEYS).await;
    (cluster, password, seeds)
}

/// Runs `roll` with the writer, counters and poller going; returns what they saw.
async fn measure<F, Fut>(
    kube: &kube::Client,
    ns: &str,
    cluster: &RedisCluster,
    password: &str,
    seeds: &[String],
    roll: F,
) -> Outcome
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let pods: Api<Pod> = Api::namespaced(kube.clone(), ns);
    // One writer per shard, each on its shard's keys: a stall of one shard's
    // writes does not show as a gap of the others.
    let slots = shard_slots(cluster);
    let mut writers = Vec::new();
    for (shard, owned) in &slots {
        let writer =
            Writer::start_within(node_ips(cluster), password, &format!("ack{shard}"), Some(owned.clone())).await;
        let follower = follow_pods(&writer, pods.clone(), "c");
        writers.push((writer, follower, owned.clone()));
    }
    let syncs = SyncCounter::start(pods.clone(), "c", password);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    roll().await;
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gaps: Vec<f64> = writers.iter().map(|(w, _, s)| w.gap_within(s, started).as_secs_f64() * 1000.0).collect();
    let mut acknowledged = Vec::new();
    for (writer, follower, _) in writers {
        follower.abort();
        acknowledged.extend(writer.stop().await.acknowledged);
    }
    let sync_full = syncs.total();
    // From the Pods themselves: a paused cluster's status keeps old addresses.
    let list = pods.list(&ListParams::default().labels("slotkeeper.io/cluster=c")).await.unwrap();
    let mut client = ClusterClient::new(list.items.iter().map(pod_ip).collect(), password).await;
    let lost = lost_after_settling(&mut client, seeds, &acknowledged).await;
    Outcome { lost: lost.len(), acknowledged: acknowledged.len(), gaps, sync_full, seconds }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let _operator = shared_operator(env);
        let kube = env.client().await.unwrap();
        let (ns_sk, ns_sts) = (namespace(&kube, "bench-rollout").await, namespace_with_pod_security(&kube, "bench-statefulset", "baseline").await);
        let (sk, sk_password, sk_seeds) = prepare(env, &kube, &ns_sk).await;
        let (sts, sts_password, sts_seeds) = prepare(env, &kube, &ns_sts).await;

        // The reference: one RedisOperation failover's gap on shard 0.
        let operations: Api<RedisOperation> = Api::namespaced(kube.clone(), &ns_sk);
        let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns_sk);
        let failover = measure(&kube, &ns_sk, &sk, &sk_password, &sk_seeds, || async {
            let op = format!("apiVersion: {API_VERSION}\nkind: RedisOperation\nmetadata: {{name: reference, namespace: {ns_sk}}}\nspec: {{clusterName: c, type: Failover, failover: {{shard: 0}}}}\n");
            let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&op));
            assert!(ok, "{out}");
            wait_until("the reference failover", Duration::from_secs(60), || async {
                (operations.get("reference").await.ok()?.status?.phase? == OperationPhase::Succeeded).then_some(())
            })
            .await;
        })
        .await;
        let sk = wait_settled(&clusters, "c", 3, 6, Duration::from_secs(60)).await;

        let slotkeeper = measure(&kube, &ns_sk, &sk, &sk_password, &sk_seeds, || async {
            apply_cluster_spec(env, &ns_sk, "c", &format!("{SPEC}, redis: {{engine: valkey, version: 8.1.8}}"));
            wait_rolled_out(&clusters, "c", "valkey", "8.1.8").await;
        })
        .await;

        // The plain StatefulSet way: Slotkeeper paused, each StatefulSet rolled by Kubernetes.
        let sts_clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns_sts);
        let sets: Api<StatefulSet> = Api::namespaced(kube.clone(), &ns_sts);
        let pods: Api<Pod> = Api::namespaced(kube.clone(), &ns_sts);
        let (ok, out) = kubectl(env, &["patch", "rdc", "c", "-n", &ns_sts, "--type=merge", "-p", r#"{"spec":{"paused":true}}"#], None);
        assert!(ok, "{out}");
        let plain = measure(&kube, &ns_sts, &sts, &sts_password, &sts_seeds, || async {
            for shard in 0..3 {
                let patch = serde_json::json!({"spec": {
                    "updateStrategy": {"type": "RollingUpdate"},
                    "template": {"spec": {"containers": [{"name": "redis", "image": "valkey/valkey:8.1.8"}]}},
                }});
                let params = PatchParams::apply("plain-statefulset-rollout").force();
                let patch = serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": patch["spec"]});
                sets.patch(&format!("c-shard-{shard}"), &params, &Patch::Apply(patch)).await.unwrap();
            }
            wait_until("every Pod on valkey and the cluster ok", Duration::from_secs(600), || async {
                let list = pods.list(&ListParams::default().labels("slotkeeper.io/cluster=c")).await.ok()?;
                let on_valkey = list.items.iter().all(|p| {
                    p.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some("valkey/valkey:8.1.8"))
                        && pod_ready(p)
                });
                if list.items.len() != 6 || !on_valkey {
                    return None;
                }
                for ip in list.items.iter().map(pod_ip) {
                    let client = redis::Client::open(format!("redis://:{sts_password}@{ip}:6379/")).ok()?;
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut c).await.ok()?;
                    info.contains("cluster_state:ok").then_some(())?;
                }
                Some(())
            })
            .await;
        })
        .await;
        let _ = sts_clusters;

        let worst = |o: &Outcome| o.gaps.iter().copied().fold(0.0, f64::max);
        let row = |name: &str, o: &Outcome| {
            let gaps: Vec<String> = o.gaps.iter().map(|g| format!("{g:.0}")).collect();
            println!(
                "  {name:<28} lost {:>5} of {:>6} acknowledged | longest gap per shard {} ms | sync_full {:>2} | total {:.1}s",
                o.lost,
                o.acknowledged,
                gaps.join(" / "),
                o.sync_full,
                o.seconds
            );
        };
        println!("7.0.15 → valkey 8.1.8, 3×1 on persistent volumes, {KEYS} keys, WAIT 1 writer:");
        row("Slotkeeper rollout", &slotkeeper);
        row("plain StatefulSet rolling", &plain);
        println!("  reference: one RedisOperation failover, shard 0 gap {:.0} ms", failover.gaps[0]);
        println!(
            "  Slotkeeper's longest per-shard gap / the failover's: {:.2} (target ≤ 2); plain StatefulSet's: {:.2}",
            worst(&slotkeeper) / failover.gaps[0],
            worst(&plain) / failover.gaps[0]
        );
        assert_eq!(slotkeeper.lost, 0, "Slotkeeper lost acknowledged writes");
    });
}
