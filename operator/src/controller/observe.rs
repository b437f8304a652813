//! Observe: the cluster's Pods from Kubernetes and each Redis node's view.

use std::collections::BTreeMap;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::Context;
use crate::api::names::{LABEL_CLUSTER, LABEL_SHARD};
use crate::error::{Error, Result};
use crate::plan::{PodFact, RedisFact};
use crate::redis::client::{RedisNode, info_field};

pub async fn pods(ctx: &Context, namespace: &str, cluster: &str) -> Result<Vec<PodFact>> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_CLUSTER}={cluster}")))
        .await
        .map_err(Error::kube(format!("list Pods of {namespace}/{cluster}")))?;
    Ok(list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).filter_map(pod_fact).collect())
}

fn pod_fact(pod: &Pod) -> Option<PodFact> {
    let name = pod.metadata.name.clone()?;
    let shard = pod.metadata.labels.as_ref()?.get(LABEL_SHARD)?.parse().ok()?;
    let ordinal = name.rsplit_once('-')?.1.parse().ok()?;
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    Some(PodFact {
        ip: status.and_then(|s| s.pod_ip.clone()).filter(|_| running),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        name,
        shard,
        ordinal,
    })
}

/// Asks every Pod with an address, concurrently; unreachable ones are left out.
pub async fn redis(pods: &[PodFact], password: &str) -> BTreeMap<String, RedisFact> {
    let asks = pods.iter().filter_map(|p| Some((p.name.clone(), p.ip.clone()?))).map(|(name, ip)| async move {
        match ask(&ip, password).await {
            Ok(fact) => Some((name, fact)),
            Err(error) => {
                tracing::debug!(pod = %name, %error, "redis not reachable");
                None
            }
        }
    });
    join_all(asks).await.into_iter().flatten().collect()
}

async fn ask(ip: &str, password: &str) -> Result<RedisFact> {
    let mut node = RedisNode::connect(ip, password).await?;
    let nodes = node.cluster_nodes().await?;
    let info = node.cluster_info().await?;
    let server = node.info("server").await?;
    let replication = node.info("replication").await?;
    let offset_field =
        if nodes.iter().any(|n| n.myself && n.master) { "master_repl_offset" } else { "slave_repl_offset" };
    Ok(RedisFact {
        nodes,
        cluster_state: info_field(&info, "cluster_state").unwrap_or("unknown").to_owned(),
        version: info_field(&server, "redis_version").unwrap_or("unknown").to_owned(),
        replication_offset: info_field(&replication, offset_field).and_then(|v| v.parse().ok()),
    })
}
