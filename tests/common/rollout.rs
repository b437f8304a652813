//! Rollout helpers: a poller that asks every node its role every 100 ms,
//! a writer that follows recreated Pods, and waits on rollout outcomes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use slotkeeper_operator::api::RedisCluster;

use super::operator::node_ips;
use super::wait_until;
use super::writer::Writer;

/// Asks every Pod of the cluster `ROLE` every 100 ms; counts samples in which
/// a shard had no node answering as master (asked again, node after node,
/// from a fresh Pod list, before it counts), and notes every Pod made after
/// it started, in order (Events are aggregated per reason, so they cannot
/// tell the order).
pub struct Poller {
    samples: Arc<Mutex<(usize, Vec<String>)>>,
    appeared: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    /// Returns once the Pods that exist now have been listed: only Pods made
    /// after that count as made (the caller changes the cluster next).
    pub async fn start(pods: Api<Pod>, cluster: &str, password: &str, shards: usize) -> Self {
        let samples = Arc::new(Mutex::new((0, Vec::new())));
        let appeared = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let listed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, st, cluster, password) = (samples.clone(), stop.clone(), cluster.to_owned(), password.to_owned());
        let (made, first_list) = (appeared.clone(), listed_once.clone());
        let task = tokio::spawn(async move {
            let mut ips: BTreeMap<String, (usize, String)> = BTreeMap::new();
            let mut seen: Option<BTreeSet<String>> = None;
            let mut connections: BTreeMap<String, redis::aio::MultiplexedConnection> = BTreeMap::new();
            let mut listed = Instant::now() - Duration::from_secs(5);
            let selector = format!("slotkeeper.io/cluster={cluster}");
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                if listed.elapsed() > Duration::from_millis(500) {
                    if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                        let uids: BTreeSet<String> = list.items.iter().filter_map(|p| p.uid()).collect();
                        match &mut seen {
                            None => {
                                seen = Some(uids);
                                first_list.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                            Some(seen) => {
                                for pod in list.items.iter().filter(|p| p.uid().is_some_and(|u| !seen.contains(&u))) {
                                    made.lock().unwrap().push(pod.name_any());
                                }
                                seen.extend(uids);
                            }
                        }
                        ips = shard_and_ip(&list.items);
                    }
                    listed = Instant::now();
                }
                // Open connections are kept (as a client's would be), so a
                // busy machine does not read as a missing master.
                for (_, ip) in ips.values() {
                    if !connections.contains_key(ip)
                        && let Some(c) = connect(ip, &password).await
                    {
                        connections.insert(ip.clone(), c);
                    }
                }
                let asks = ips.iter().map(|(pod, (shard, ip))| {
                    let connection = connections.get(ip).cloned();
                    async move {
                        Answer { shard: *shard, pod: pod.clone(), ip: ip.clone(), role: ask_role(connection).await }
                    }
                });
                let answers = futures::future::join_all(asks).await;
                for answer in answers.iter().filter(|a| a.role.is_none()) {
                    connections.remove(&answer.ip);
                }
                let mut missing = Vec::new();
                let without: Vec<usize> = (0..shards).filter(|&s| !Answer::master_in(&answers, s)).collect();
                // The Pod list is up to 500 ms old: a Pod recreated since
                // (the new master, a moment after it came back) is not in it.
                let fresh = if without.is_empty() {
                    None
                } else {
                    pods.list(&ListParams::default().labels(&selector)).await.ok()
                };
                let now_ips = fresh.map_or_else(|| ips.clone(), |list| shard_and_ip(&list.items));
                for shard in without {
                    // The nodes answer concurrently, not at one instant: the
                    // new master may answer just before it takes over and the
                    // old one just after it steps down. Ask the shard again,
                    // one node after the other, before calling it a gap.
                    let mut again = Vec::new();
                    for (pod, (_, ip)) in now_ips.iter().filter(|(_, (s, _))| *s == shard) {
                        let connection = match connections.get(ip) {
                            Some(c) => Some(c.clone()),
                            None => connect(ip, &password).await,
                        };
                        let role = ask_role(connection).await;
                        again.push(Answer { shard, pod: pod.clone(), ip: ip.clone(), role });
                    }
                    if !Answer::master_in(&again, shard) {
                        let (first, second) = (Answer::said(&answers, shard), Answer::said(&again, shard));
                        missing.push(format!("shard {shard} had no master ({first}; again: {second})"));
                    }
                }
                {
                    let mut samples = s.lock().unwrap();
                    samples.0 += 1;
                    let sample = samples.0;
                    samples.1.extend(missing.into_iter().map(|m| format!("sample {sample}: {m}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let listed = wait_until("the poller's first listing", Duration::from_secs(30), || {
            let done = listed_once.load(std::sync::atomic::Ordering::Relaxed);
            async move { done.then_some(()) }
        });
        listed.await;
        Self { samples, appeared, stop, task }
    }

    /// Samples taken, samples that found a shard without a master, and the
    /// Pods made meanwhile in order.
    pub async fn stop(self) -> (usize, Vec<String>, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        let (samples, gaps) = self.samples.lock().unwrap().clone();
        (samples, gaps, self.appeared.lock().unwrap().clone())
    }
}

/// What one node answered to `ROLE` in a sample.
struct Answer {
    shard: usize,
    pod: String,
    ip: String,
    role: Option<String>,
}

impl Answer {
    fn master_in(answers: &[Answer], shard: usize) -> bool {
        answers.iter().any(|a| a.shard == shard && a.role.as_deref() == Some("master"))
    }

    /// `pod@ip role, ...` for the shard's nodes.
    fn said(answers: &[Answer], shard: usize) -> String {
        let each = answers.iter().filter(|a| a.shard == shard);
        let each = each.map(|a| format!("{}@{} {}", a.pod, a.ip, a.role.as_deref().unwrap_or("no answer")));
        each.collect::<Vec<_>>().join(", ")
    }
}

/// Each Pod's shard and address, by Pod name (Pods without an address yet left out).
fn shard_and_ip(pods: &[Pod]) -> BTreeMap<String, (usize, String)> {
    pods.iter()
        .filter_map(|p| {
            let shard = p.labels().get("slotkeeper.io/shard")?.parse().ok()?;
            Some((p.name_any(), (shard, p.status.as_ref()?.pod_ip.clone()?)))
        })
        .collect()
}

async fn connect(ip: &str, password: &str) -> Option<redis::aio::MultiplexedConnection> {
    let url = format!("redis://:{password}@{ip}:6379/");
    let open = async { redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok() };
    tokio::time::timeout(Duration::from_secs(1), open).await.ok().flatten()
}

/// What a node answers to `ROLE` ("master", "slave"), within a second.
async fn ask_role(connection: Option<redis::aio::MultiplexedConnection>) -> Option<String> {
    let ask = async {
        let mut c = connection?;
        match redis::cmd("ROLE").query_async(&mut c).await.ok()? {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            },
            _ => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(1), ask).await.ok().flatten()
}

/// Keeps the writer pointed at the Pods as they are recreated with new addresses.
pub fn follow_pods(writer: &Writer, pods: Api<Pod>, cluster: &str) -> tokio::task::JoinHandle<()> {
    let seeds = writer.seeds_handle();
    let selector = format!("slotkeeper.io/cluster={cluster}");
    tokio::spawn(async move {
        loop {
            if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                let ips: Vec<String> = list.items.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).collect();
                if !ips.is_empty() {
                    *seeds.lock().unwrap() = ips;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

pub fn condition<'a>(
    cluster: &'a RedisCluster,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    cluster.status.as_ref()?.conditions.iter().find(|c| c.type_ == kind)
}

/// What `kubectl wait --for=condition=Ready` waits for, after a version bump.
pub async fn wait_rolled_out(api: &Api<RedisCluster>, name: &str, engine: &str, version: &str) -> RedisCluster {
    wait_until(&format!("{name} runs {engine} {version} and is Ready"), Duration::from_secs(900), || async {
        let c = api.get(name).await.ok()?;
        let status = c.status.as_ref()?;
        let ready = condition(&c, "Ready").is_some_and(|r| r.status == "True");
        let there = status.current_version.as_deref() == Some(version)
            && status.current_engine.map(|e| e.to_string()).as_deref() == Some(engine);
        (ready && there && status.observed_generation == c.metadata.generation).then_some(c)
    })
    .await
}

pub async fn events(kube: &kube::Client, ns: &str) -> Vec<Event> {
    let mut list = Api::<Event>::namespaced(kube.clone(), ns).list(&ListParams::default()).await.unwrap().items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list
}

/// The messages of the namespace's events with `reason`, oldest first.
pub async fn event_messages(kube: &kube::Client, ns: &str, reason: &str) -> Vec<String> {
    events(kube, ns)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

/// Every node's server says it runs `engine` `version`.
pub async fn assert_every_node_runs(cluster: &RedisCluster, password: &str, engine: &str, version: &str) {
    for ip in node_ips(cluster) {
        let mut c = redis::Client::open(format!("redis://:{password}@{ip}:6379/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await.unwrap();
        let field = if engine == "valkey" { "valkey_version:" } else { "redis_version:" };
        let reported = info.lines().find_map(|l| l.strip_prefix(field)).map(str::trim);
        assert_eq!(reported, Some(version), "{ip}: INFO server says {info}");
    }
}

/// A cluster made for one test: settled, with keys seeded.
pub struct Seeded {
    pub ns: String,
    pub clusters: Api<RedisCluster>,
    pub pods: Api<Pod>,
    pub cluster: RedisCluster,
    pub password: String,
    pub seeds: Vec<String>,
}

/// Applies RedisCluster `name` (`spec` as for `apply_cluster_spec`) in a new
/// namespace, waits until it is settled with `nodes` nodes and seeds `keys` keys.
pub async fn seeded_cluster(
    env: &slotkeeper_env::Environment,
    kube: &kube::Client,
    namespace: &str,
    name: &str,
    spec: &str,
    nodes: usize,
    keys: usize,
) -> Seeded {
    let ns = super::namespace(kube, namespace).await;
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    super::operator::apply_cluster_spec(env, &ns, name, spec);
    let cluster = super::operator::wait_settled(&clusters, name, 3, nodes, Duration::from_secs(240)).await;
    let password = super::operator::password(kube, &ns, name).await;
    let seeds = super::writer::ClusterClient::new(node_ips(&cluster), &password).await.seed("seed", keys).await;
    Seeded { pods: Api::namespaced(kube.clone(), &ns), ns, clusters, cluster, password, seeds }
}

/// Of the Pods a 3×1 cluster's rollout made (`made`, in order): each of
/// `cluster`'s six recreated exactly once, and one temporary replica per shard.
/// A Pod a `PodMoved` event names (`moved`: those events' messages) may be
/// made once more: spreading recreates a crowded replica once it has run.
pub fn assert_recreated_once(made: &[String], cluster: &str, moved: &[String]) {
    let mut seen = std::collections::BTreeSet::new();
    let made: Vec<String> = made
        .iter()
        .filter(|pod| seen.insert(pod.to_string()) || !moved.iter().any(|m| m.contains(&format!("replica {pod} "))))
        .cloned()
        .collect();
    let mut distinct = made.to_vec();
    distinct.sort();
    distinct.dedup();
    // Ordinals 0 and 1 recreated, ordinal 2 the shard's temporary replica.
    let expected: Vec<String> = (0..3).flat_map(|s| (0..3).map(move |o| format!("{cluster}-shard-{s}-{o}"))).collect();
    assert_eq!((made.len(), distinct), (9, expected), "every Pod recreated exactly once: {made:?}");
}
