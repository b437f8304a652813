//! Act: carry out one planned step against Redis (or, for a drained shard,
//! against Kubernetes).

use std::collections::BTreeMap;

use futures::future::{join_all, try_join_all};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams};

use super::Context;
use super::users::ClusterUsers;
use crate::api::catalog;
use crate::error::{Error, Result};
use crate::failpoint;
use crate::plan::{Action, Batch, PodFact};
use crate::redis::client::RedisNode;
use crate::redis::migrate::{self, Moved, Pair};
use crate::resources::Names;
use slotkeeper_api::acl::REPLICATION_USER;

/// Redis's own limit for a manual failover (`CLUSTER_MF_TIMEOUT`): past it
/// the replica gives up, and a later plan may ask again.
const PROMOTION_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Polls the promoted node until it says it is a master; how long it took.
async fn wait_until_master(node: &mut crate::redis::client::RedisNode) -> Option<std::time::Duration> {
    let started = std::time::Instant::now();
    while started.elapsed() < PROMOTION_WAIT {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if node.is_master().await.unwrap_or(false) {
            return Some(started.elapsed());
        }
    }
    None
}

/// Who the action is for.
pub struct Target<'a> {
    pub namespace: &'a str,
    pub cluster: &'a str,
    /// The key of the cluster's pooled connections.
    pub key: &'a str,
    /// How to sign in, the users every node should have, and application
    /// users status says were applied before (one no longer declared is deleted).
    pub users: &'a ClusterUsers,
    pub applied_before: &'a [String],
    /// The release the nodes run (what commands they understand).
    pub release: Option<&'static catalog::CatalogEntry>,
}

/// Runs `action`; returns the reason and sentence for an event, or `None`
/// if it was only a wait. A failed call drops the pooled connections it used.
pub async fn act(
    ctx: &Context,
    target: &Target<'_>,
    action: &Action,
    pods: &[PodFact],
) -> Result<Option<(String, String)>> {
    let result = act_on(ctx, target, action, pods).await;
    if result.is_err() {
        for pod in action.pods() {
            if let Some(ip) = pods.iter().find(|p| p.name == pod).and_then(|p| p.ip.as_deref()) {
                ctx.redis.discard(target.key, ip);
            }
        }
    }
    result
}

async fn act_on(
    ctx: &Context,
    target: &Target<'_>,
    action: &Action,
    pods: &[PodFact],
) -> Result<Option<(String, String)>> {
    let ip_of: BTreeMap<&str, &str> = pods.iter().filter_map(|p| Some((p.name.as_str(), p.ip.as_deref()?))).collect();
    let connect = |pod: &str| {
        let ip = ip_of.get(pod).copied().unwrap_or_default().to_owned();
        async move { ctx.redis.node(target.key, &ip, &target.users.logins).await }
    };
    let event = |reason: &str, note: String| Ok(Some((reason.to_owned(), note)));
    match action {
        Action::Meet { via, targets } => {
            let mut node = connect(via).await?;
            for ip in targets {
                node.meet(ip).await?;
            }
            failpoint::hit(failpoint::AFTER_MEET);
            event("ClusterMeet", format!("{via} met {} node(s): {}", targets.len(), targets.join(", ")))
        }
        Action::AddSlots { pod, shard, ranges } => {
            let has_range = target.release.is_some_and(|e| e.has_addslotsrange);
            connect(pod).await?.add_slots(ranges, has_range, || failpoint::hit(failpoint::MID_ADDSLOTS)).await?;
            let list: Vec<String> = ranges.iter().map(ToString::to_string).collect();
            event("SlotsAssigned", format!("shard {shard} master {pod} assigned slots {}", list.join(",")))
        }
        Action::Replicate { pod, master_pod, master_id } => {
            connect(pod).await?.replicate(master_id).await?;
            failpoint::hit(failpoint::MID_REPLICATE);
            event("ReplicaAttached", format!("{pod} now replicates {master_pod} ({master_id})"))
        }
        Action::Forget { ids_by_pod } => {
            // All at once: a node that still knows an id would gossip it back.
            try_join_all(ids_by_pod.iter().map(|(pod, ids)| async move {
                let mut node = connect(pod).await?;
                for id in ids {
                    node.forget(id).await?;
                }
                Ok::<_, Error>(())
            }))
            .await?;
            let ids: std::collections::BTreeSet<&String> = ids_by_pod.values().flatten().collect();
            let list: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
            event("NodesForgotten", format!("forgot departed node(s) {}", list.join(", ")))
        }
        Action::Failover { pod, shard, reason, force, spread, .. } => {
            let mut node = connect(pod).await?;
            if *force {
                node.failover_force().await?
            } else {
                node.failover().await?
            };
            failpoint::hit(failpoint::AFTER_FAILOVER);
            let how = if *force { "CLUSTER FAILOVER FORCE (the master is unreachable)" } else { "CLUSTER FAILOVER" };
            // A coordinated failover finishes in well under a second; waiting
            // for it here keeps the next plan from seeing it half done and
            // sending it again (which would restart it).
            let took = if *force { None } else { wait_until_master(&mut node).await };
            let outcome = match took {
                Some(took) => format!(", master after {} ms", took.as_millis()),
                None if *force => String::new(),
                None => format!(", not yet master after {} s", PROMOTION_WAIT.as_secs()),
            };
            let kind = if *spread { "MastersSpread" } else { "FailedOver" };
            event(kind, format!("shard {shard}: {pod} promoted by {how} ({reason}){outcome}"))
        }
        Action::Stabilize { slots_by_pod } => {
            for (pod, slots) in slots_by_pod {
                let mut node = connect(pod).await?;
                for slot in slots {
                    node.stabilize(*slot).await?;
                }
            }
            event("SlotsStabilized", format!("cleared migration marks whose other node is gone: {slots_by_pod:?}"))
        }
        Action::MoveSlots { batches, others, remaining, repair } => {
            let moved = try_join_all(batches.iter().map(|b| move_batch(ctx, target, b))).await?;
            // Best effort: the others learn by gossip anyway.
            join_all(others.iter().map(|pod| async move {
                let Ok(mut node) = connect(pod).await else { return };
                for b in batches {
                    let slots: Vec<u16> = b.slots.iter().map(|s| s.slot).collect();
                    if let Err(error) = migrate::announce(&mut node, &slots, &b.target.id).await {
                        tracing::debug!(%error, pod, "announcing new slot owners failed");
                    }
                }
            }))
            .await;
            let total =
                moved.iter().fold(Moved::default(), |a, m| Moved { slots: a.slots + m.slots, keys: a.keys + m.keys });
            let pairs: Vec<String> =
                batches.iter().map(|b| format!("{} → {}: {}", b.source.pod, b.target.pod, b.slots.len())).collect();
            let (reason, verb) = if *repair { ("SlotsRepaired", "finished") } else { ("SlotsMoved", "moved") };
            event(
                reason,
                format!(
                    "{verb} {} slot(s), {} key(s) ({}); {remaining} slot(s) to go",
                    total.slots,
                    total.keys,
                    pairs.join(", ")
                ),
            )
        }
        Action::DeletePod { pod, reason } => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), target.namespace);
            let force = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            match pods.delete(pod, &force).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete Pod {}/{pod}", target.namespace))(e)),
            }
            event("PodReplaced", format!("force-deleted {pod} ({reason}); its StatefulSet recreates it elsewhere"))
        }
        Action::MovePod { pod, shard, reason } => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), target.namespace);
            match pods.delete(pod, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete Pod {}/{pod}", target.namespace))(e)),
            }
            event("PodMoved", format!("shard {shard}: recreating replica {pod} so it can land elsewhere ({reason})"))
        }
        Action::RecreatePod { pod, shard, reason, fresh_data } => {
            if *fresh_data {
                // Deleted with the Pod (the claim is protected while in use);
                // the StatefulSet makes a new, empty one for the new Pod.
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), target.namespace);
                let claim = format!("{}-{pod}", crate::resources::DATA_CLAIM);
                match claims.delete(&claim, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(Error::kube(format!("delete PersistentVolumeClaim {}/{claim}", target.namespace))(
                            e,
                        ));
                    }
                }
            }
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), target.namespace);
            match pods.delete(pod, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete Pod {}/{pod}", target.namespace))(e)),
            }
            failpoint::hit(failpoint::AFTER_RECREATE);
            // Its own reason: a replaced volume is worth finding on its own
            // (events of one reason are aggregated under the first message).
            let reason_name = if *fresh_data { "RolloutVolumeReplaced" } else { "RolloutPodRecreated" };
            event(reason_name, format!("shard {shard}: recreating {pod}: {reason}"))
        }
        Action::RemoveShard { shard } => {
            let name = Names(target.cluster).shard(*shard);
            let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), target.namespace);
            match sets.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete StatefulSet {}/{name}", target.namespace))(e)),
            }
            event("ShardRemoved", format!("shard {shard} drained of all slots; deleted StatefulSet {name}"))
        }
        Action::ApplyUsers { pods, .. } => {
            let mut nodes = try_join_all(pods.iter().map(|pod| connect(pod))).await?;
            apply_users(&mut nodes, target.users, target.applied_before).await?;
            // Connections signed in as `default` reconnect as the operator's own user.
            ctx.redis.forget_cluster(target.key);
            let names: Vec<&str> = target.users.users.iter().map(|u| u.name.as_str()).collect();
            event("UsersApplied", format!("applied ACL users {} to {} node(s)", names.join(", "), pods.len()))
        }
        // Reading and deciding only: see `balance::plan` and `report::record_balance`.
        Action::PlanBalance { .. } | Action::FinishBalance { .. } => Ok(None),
        Action::Wait(_) | Action::Refused(_) | Action::Converged => Ok(None),
    }
}

/// Every node in three rounds, so nothing signs in with what is not there
/// yet: the users (but `default`) on every node; then replicas sign in to
/// their master as the replication user; then the `default` user, which
/// may be turning off. Application users declared before and gone now are
/// deleted; users made by hand are not touched.
async fn apply_users(nodes: &mut [RedisNode], users: &ClusterUsers, applied_before: &[String]) -> Result<()> {
    let (default, others) = users.users.split_last().expect("the default user is always there");
    let gone: Vec<&String> = applied_before.iter().filter(|name| !users.applications.contains(name)).collect();
    let gone = &gone;
    try_join_all(nodes.iter_mut().map(|node| async move {
        for user in others {
            node.set_user(&user.name, &user.rules).await?;
        }
        for name in gone {
            node.delete_user(name).await?;
        }
        Ok::<_, Error>(())
    }))
    .await?;
    try_join_all(nodes.iter_mut().map(|node| node.sign_in_to_master(REPLICATION_USER, &users.replication_password)))
        .await?;
    try_join_all(nodes.iter_mut().map(|node| node.set_user(&default.name, &default.rules))).await?;
    Ok(())
}

async fn move_batch(ctx: &Context, target: &Target<'_>, batch: &Batch) -> Result<Moved> {
    let mut source = ctx.redis.node(target.key, &batch.source.ip, &target.users.logins).await?;
    let mut destination = ctx.redis.node(target.key, &batch.target.ip, &target.users.logins).await?;
    let pair = Pair {
        source: &mut source,
        source_id: &batch.source.id,
        target: &mut destination,
        target_id: &batch.target.id,
        target_ip: &batch.target.ip,
    };
    Ok(migrate::transfer(pair, &batch.slots, &|| failpoint::hit(failpoint::MID_MIGRATION)).await?)
}
