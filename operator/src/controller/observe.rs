//! Observe: the cluster's Pods from the watch cache and each Redis node's view
//! (and figures the console charts, in the same round trip).

use std::collections::BTreeMap;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

use super::Context;
use crate::api::Engine;
use crate::api::names::LABEL_SHARD;
use crate::error::Result;
use crate::plan::{MemoryFact, PodFact, RedisFact};
use crate::redis::client::{Logins, info_field};
use crate::redis::pool::Pool;
use slotkeeper_readmodel::StatsFact;

pub fn pods(ctx: &Context, namespace: &str, cluster: &str) -> Vec<PodFact> {
    let mut pods: Vec<PodFact> = ctx.caches.pods_of(namespace, cluster).iter().filter_map(|p| pod_fact(p)).collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

fn pod_fact(pod: &Pod) -> Option<PodFact> {
    let name = pod.metadata.name.clone()?;
    let shard = pod.metadata.labels.as_ref()?.get(LABEL_SHARD)?.parse().ok()?;
    let ordinal = name.rsplit_once('-')?.1.parse().ok()?;
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let container = pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == "redis"));
    let container_status =
        status.and_then(|s| s.container_statuses.as_ref()).and_then(|cs| cs.iter().find(|c| c.name == "redis"));
    Some(PodFact {
        image: container.and_then(|c| c.image.clone()),
        restarts: container_status.map_or(0, |c| c.restart_count),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ip: status.and_then(|s| s.pod_ip.clone()).filter(|_| running),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        node_lost: false,
        domain: None,
        name,
        shard,
        ordinal,
    })
}

/// Each Node's labels, read once and kept a while: a Node's failure domain
/// (its zone, its hostname) does not change under a running Pod, so a
/// steady-state reconcile reads no Node.
#[derive(Default)]
pub struct NodeLabels {
    known: std::sync::Mutex<BTreeMap<String, (std::time::Instant, Labels)>>,
}

type Labels = BTreeMap<String, String>;

/// How long a Node's labels are trusted before they are read again.
const NODE_LABELS_TTL: std::time::Duration = std::time::Duration::from_secs(300);

impl NodeLabels {
    /// Sets each Pod's failure domain from its Node's `topology_key` label.
    pub async fn fill_domains(&self, client: &kube::Client, pods: &mut [PodFact], topology_key: &str) {
        let nodes: Api<Node> = Api::all(client.clone());
        for pod in pods.iter_mut() {
            let Some(node) = pod.node_name.clone() else { continue };
            let cached = {
                let known = self.known.lock().expect("node labels lock");
                known.get(&node).filter(|(at, _)| at.elapsed() < NODE_LABELS_TTL).map(|(_, labels)| labels.clone())
            };
            let labels = match cached {
                Some(labels) => labels,
                None => match nodes.get_metadata_opt(&node).await {
                    Ok(meta) => {
                        let labels = meta.and_then(|m| m.metadata.labels).unwrap_or_default();
                        let entry = (std::time::Instant::now(), labels.clone());
                        self.known.lock().expect("node labels lock").insert(node.clone(), entry);
                        labels
                    }
                    Err(error) => {
                        tracing::debug!(%node, %error, "cannot read Node labels");
                        continue;
                    }
                },
            };
            pod.domain = labels.get(topology_key).cloned();
        }
    }
}

/// The failure domains with a Node a Pod could go to now (Ready,
/// schedulable, untainted), listed at most every [`OPEN_DOMAINS_TTL`] and
/// shared by every cluster with the same topology key.
#[derive(Default)]
pub struct OpenDomains {
    listed: tokio::sync::Mutex<Option<(std::time::Instant, Vec<Node>)>>,
}

const OPEN_DOMAINS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

impl OpenDomains {
    pub async fn of(&self, client: &kube::Client, topology_key: &str) -> std::collections::BTreeSet<String> {
        let mut listed = self.listed.lock().await;
        if listed.as_ref().is_none_or(|(at, _)| at.elapsed() > OPEN_DOMAINS_TTL) {
            let nodes: Api<Node> = Api::all(client.clone());
            match nodes.list(&Default::default()).await {
                Ok(list) => *listed = Some((std::time::Instant::now(), list.items)),
                Err(error) => {
                    tracing::debug!(%error, "cannot list Nodes");
                    return Default::default();
                }
            }
        }
        let nodes = listed.as_ref().map(|(_, nodes)| nodes.as_slice()).unwrap_or_default();
        nodes
            .iter()
            .filter(|n| node_open(n))
            .filter_map(|n| n.metadata.labels.as_ref()?.get(topology_key).cloned())
            .collect()
    }
}

fn node_open(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute"));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready && !tainted && !spec.and_then(|s| s.unschedulable).unwrap_or(false)
}

/// Asks every Pod with an address, concurrently; unreachable ones are left out.
pub async fn redis(pool: &Pool, key: &str, pods: &[PodFact], logins: &Logins) -> BTreeMap<String, RedisFact> {
    let asks = pods.iter().filter_map(|p| Some((p.name.clone(), p.ip.clone()?))).map(|(name, ip)| async move {
        // A pooled connection may have died with its process: one fresh try.
        let pooled = pool.contains(key, &ip);
        let mut result = ask(pool, key, &ip, logins).await;
        if result.is_err() {
            pool.discard(key, &ip);
            if pooled {
                result = ask(pool, key, &ip, logins).await;
            }
        }
        match result {
            Ok(fact) => Some((name, fact)),
            Err(error) => {
                pool.discard(key, &ip);
                tracing::debug!(pod = %name, %error, "redis not reachable");
                None
            }
        }
    });
    let mut facts = join_all(asks).await.into_iter().flatten().collect();
    stray_keys(pool, key, pods, logins, &mut facts).await;
    facts
}

/// Marks Pods that did not answer and whose Node has not been Ready for
/// [`NODE_LOST_AFTER`]. Only
/// unanswered Pods cost a request: a healthy cluster reads no Node.
pub async fn lost_nodes(ctx: &Context, pods: &mut [PodFact], answered: &BTreeMap<String, RedisFact>) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut verdicts: BTreeMap<String, bool> = BTreeMap::new();
    for pod in pods.iter_mut().filter(|p| !answered.contains_key(&p.name)) {
        let Some(node) = pod.node_name.clone() else { continue };
        if !verdicts.contains_key(&node) {
            let lost = match nodes.get_opt(&node).await {
                Ok(Some(n)) => !node_counts_as_up(&n),
                Ok(None) => true,
                Err(error) => {
                    tracing::debug!(%node, %error, "cannot read Node");
                    false
                }
            };
            verdicts.insert(node.clone(), lost);
        }
        pod.node_lost = verdicts[&node];
    }
}

/// How long a Node must have been not Ready before its Pods are given up:
/// a Node that flaps (a slow heartbeat) keeps them.
const NODE_LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

fn node_counts_as_up(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let Some(ready) = conditions.and_then(|c| c.iter().find(|c| c.type_ == "Ready")) else { return false };
    if ready.status == "True" {
        return true;
    }
    let since = ready.last_transition_time.as_ref().map(|t| t.0);
    since.is_some_and(|t| {
        k8s_openapi::jiff::Timestamp::now().duration_since(t).as_secs_f64() < NODE_LOST_AFTER.as_secs_f64()
    })
}

async fn ask(pool: &Pool, key: &str, ip: &str, logins: &Logins) -> Result<RedisFact> {
    let facts = pool.node(key, ip, logins).await?.facts().await?;
    // Valkey reports `redis_version` 7.2.4 for clients' sake; its own is `valkey_version`.
    let (engine, version) = match info_field(&facts.server_info, "valkey_version") {
        Some(version) => (Engine::Valkey, Some(version)),
        None => (Engine::Redis, info_field(&facts.server_info, "redis_version")),
    };
    let offset_field =
        if facts.nodes.iter().any(|n| n.myself && n.master) { "master_repl_offset" } else { "slave_repl_offset" };
    Ok(RedisFact {
        cluster_state: info_field(&facts.cluster_info, "cluster_state").unwrap_or("unknown").to_owned(),
        engine,
        version: version.unwrap_or("unknown").to_owned(),
        replication_offset: info_field(&facts.replication_info, offset_field).and_then(|v| v.parse().ok()),
        link_up: info_field(&facts.replication_info, "master_link_status") == Some("up"),
        aof_rewriting: ["aof_rewrite_in_progress", "aof_rewrite_scheduled"]
            .iter()
            .any(|field| info_field(&facts.persistence_info, field) == Some("1")),
        memory: MemoryFact {
            used: number(&facts.memory_info, "used_memory"),
            dataset: number(&facts.memory_info, "used_memory_dataset"),
            maxmemory: number(&facts.memory_info, "maxmemory"),
        },
        stats: StatsFact {
            ops_per_sec: number(&facts.stats_info, "instantaneous_ops_per_sec"),
            connected_clients: number(&facts.clients_info, "connected_clients"),
            keyspace_hits: number(&facts.stats_info, "keyspace_hits"),
            keyspace_misses: number(&facts.stats_info, "keyspace_misses"),
        },
        nodes: facts.nodes,
        stray_keys: BTreeMap::new(),
    })
}

/// For slots some node marks open, how many keys each master holds in those
/// of them it does not own (a move half made before roles changed leaves
/// keys there). Nothing is asked while no slot is open.
async fn stray_keys(
    pool: &Pool,
    key: &str,
    pods: &[PodFact],
    logins: &Logins,
    facts: &mut BTreeMap<String, RedisFact>,
) {
    let marked: std::collections::BTreeSet<u16> =
        facts.values().filter_map(|f| f.myself()).flat_map(|me| me.open_slots.iter().map(|o| o.slot)).collect();
    if marked.is_empty() {
        return;
    }
    let asks = facts.iter_mut().filter_map(|(name, fact)| {
        let me = fact.myself().filter(|me| me.master)?;
        let ip = pods.iter().find(|p| &p.name == name)?.ip.clone()?;
        let owned: std::collections::BTreeSet<u16> = crate::redis::topology::expand(&me.slots);
        let slots: Vec<u16> = marked.iter().copied().filter(|s| !owned.contains(s)).collect();
        Some(async move {
            let counted = async {
                let mut node = pool.node(key, &ip, logins).await?;
                crate::redis::weights::keys_per_slot(&mut node, &slots).await
            };
            match counted.await {
                Ok(counts) => fact.stray_keys = counts.into_iter().filter(|(_, n)| *n > 0).collect(),
                Err(error) => tracing::debug!(pod = %name, %error, "counting keys in open slots failed"),
            }
        })
    });
    join_all(asks).await;
}

fn number(info: &str, field: &str) -> u64 {
    info_field(info, field).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Pod as the apiserver sends it: far more than observing reads.
    fn full_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "c-shard-1-0", "namespace": "ns", "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"slotkeeper.io/cluster": "c", "slotkeeper.io/shard": "1"},
                "annotations": {"slotkeeper.io/config-hash": "abc"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "c-shard-1", "uid": "u"}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "node-b",
                "containers": [
                    {"name": "redis", "image": "redis:7.0", "env": [{"name": "A", "value": "b"}],
                     "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}}},
                    {"name": "exporter", "image": "exporter:1"}
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-c-shard-1-0"}}]
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "hostIP": "192.168.0.2",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": "redis", "restartCount": 3, "ready": true, "image": "redis:7.0", "imageID": "x"},
                    {"name": "exporter", "restartCount": 0, "ready": true, "image": "exporter:1", "imageID": "y"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_pod_keeps_the_facts_and_drops_the_rest() {
        let full = full_pod();
        let mut slim = full.clone();
        crate::controller::cache::slim_pod(&mut slim);
        assert_eq!(pod_fact(&slim), pod_fact(&full));
        let fact = pod_fact(&slim).unwrap();
        assert_eq!((fact.shard, fact.ordinal, fact.restarts), (1, 0, 3));
        assert_eq!(
            (fact.image.as_deref(), fact.ip.as_deref(), fact.node_name.as_deref()),
            (Some("redis:7.0"), Some("10.0.0.7"), Some("node-b"))
        );
        // The store and the triggers still find it and its cluster.
        assert_eq!(slim.metadata.labels, full.metadata.labels);
        assert_eq!(slim.metadata.owner_references, full.metadata.owner_references);
        // What observing never reads is gone from the cache.
        let spec = slim.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none());
        assert!(spec.containers.iter().all(|c| c.env.is_none() && c.readiness_probe.is_none()));
        let status = slim.status.as_ref().unwrap();
        assert!(status.conditions.is_none() && status.host_ip.is_none());
        assert!(slim.metadata.managed_fields.is_none() && slim.metadata.annotations.is_none());
    }
}
