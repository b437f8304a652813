//! The standby's sampler: while another replica leads, nothing here
//! reconciles, yet the console this replica serves should show live Redis
//! figures too. Every [`PERIOD`] it asks each cluster's nodes (from status)
//! the same read-only questions a reconcile asks (`CLUSTER NODES`, `INFO`)
//! and publishes the answers. It sends no command that changes anything:
//! the leader's planner remains the one writer to Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt as _};
use slotkeeper_api::{RedisCluster, StepStatus};
use slotkeeper_readmodel::{ClusterKey, Publisher, ReadModel, Source};

use crate::controller::observe;
use crate::plan::PodFact;
use crate::redis::client::Logins;
use crate::redis::pool::Pool;

/// How often each cluster is sampled; a reconcile's observation counts too.
pub const PERIOD: Duration = Duration::from_secs(10);

pub struct Sampler {
    client: Client,
    readmodel: ReadModel,
    publisher: Publisher,
    redis: Pool,
    /// Logins read once per cluster; dropped when a cluster stops answering.
    logins: Mutex<HashMap<ClusterKey, Logins>>,
}

impl Sampler {
    pub fn new(client: Client, readmodel: ReadModel, publisher: Publisher) -> Self {
        Self { client, readmodel, publisher, redis: Pool::default(), logins: Default::default() }
    }

    /// Samples until dropped (the replica became leader, or stops).
    pub async fn run(&self) {
        self.readmodel.synced().await;
        loop {
            let due: Vec<_> = self.readmodel.clusters().into_iter().filter(|c| self.due(c)).collect();
            futures::future::join_all(due.iter().map(|c| self.sample(c))).await;
            tokio::time::sleep(PERIOD).await;
        }
    }

    fn due(&self, cluster: &RedisCluster) -> bool {
        let key = key_of(cluster);
        self.publisher
            .last(&key)
            .is_none_or(|last| Timestamp::now().duration_since(last.at).as_secs_f64() >= PERIOD.as_secs_f64() * 0.9)
    }

    async fn sample(&self, cluster: &RedisCluster) {
        let key = key_of(cluster);
        let pods = pods_in_status(cluster);
        if pods.is_empty() {
            return;
        }
        let Some(logins) = self.logins(cluster, &key).await else { return };
        let pool_key = key.to_string();
        let redis = observe::redis(&self.redis, &pool_key, &pods, &logins).await;
        if redis.is_empty() {
            // A rotated password looks like this too: read it again next time.
            self.logins.lock().expect("logins lock").remove(&key);
        }
        // Idle until the next sample, connections would only hold buffers.
        self.redis.forget_cluster(&pool_key);
        let step = cluster.status.as_ref().and_then(|s| s.step.as_ref()).map(StepStatus::summary);
        let observation = crate::publish::observation(&pods, &redis, step, Source::Sampler, Timestamp::now());
        self.publisher.publish(&key, observation);
    }

    async fn logins(&self, cluster: &RedisCluster, key: &ClusterKey) -> Option<Logins> {
        if let Some(logins) = self.logins.lock().expect("logins lock").get(key) {
            return Some(logins.clone());
        }
        let found = crate::controller::users::logins(&self.client, cluster, &key.namespace).await;
        let logins = found
            .inspect_err(|error| {
                tracing::debug!(cluster = %key.name, namespace = %key.namespace, %error, "sampler cannot read the cluster's logins");
            })
            .ok()?;
        self.logins.lock().expect("logins lock").insert(key.clone(), logins.clone());
        Some(logins)
    }
}

fn key_of(cluster: &RedisCluster) -> ClusterKey {
    ClusterKey::new(cluster.namespace().unwrap_or_default(), cluster.name_any())
}

/// The Pods the leader last reported, with their addresses.
fn pods_in_status(cluster: &RedisCluster) -> Vec<PodFact> {
    let nodes = cluster.status.as_ref().map(|s| s.nodes.as_slice()).unwrap_or_default();
    nodes
        .iter()
        .filter_map(|n| {
            let (rest, ordinal) = n.pod.rsplit_once('-')?;
            let shard = rest.rsplit_once('-')?.1;
            Some(PodFact {
                name: n.pod.clone(),
                shard: shard.parse().ok()?,
                ordinal: ordinal.parse().ok()?,
                ip: n.ip.clone(),
                node_name: n.node.clone(),
                domain: n.domain.clone(),
                ..PodFact::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::{NodeStatus, RedisClusterSpec, RedisClusterStatus};

    #[test]
    fn pods_come_from_status_with_shard_ordinal_and_node() {
        let spec: RedisClusterSpec =
            serde_json::from_value(serde_json::json!({"masters": 3, "redis": {"version": "7.0.15"}})).unwrap();
        let mut cluster = RedisCluster::new("my-cache", spec);
        let node = |pod: &str, ip: &str| NodeStatus {
            pod: pod.into(),
            ip: Some(ip.into()),
            node: Some("node-2".into()),
            ..Default::default()
        };
        cluster.status = Some(RedisClusterStatus {
            nodes: vec![
                node("my-cache-shard-0-0", "127.1.0.1"),
                node("my-cache-shard-12-1", "127.1.0.2"),
                node("odd", "x"),
            ],
            ..Default::default()
        });
        let pods = pods_in_status(&cluster);
        assert_eq!(pods.len(), 2);
        assert_eq!((pods[1].shard, pods[1].ordinal), (12, 1));
        assert_eq!(pods[1].node_name.as_deref(), Some("node-2"));
    }
}
