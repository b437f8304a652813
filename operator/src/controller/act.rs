//! Act: carry out one planned step against Redis.

use std::collections::BTreeMap;

use super::Context;
use crate::api::catalog;
use crate::error::Result;
use crate::failpoint;
use crate::plan::{Action, PodFact};

/// Runs `action`; returns a sentence for the event, or `None` if it was only a wait.
/// A failed call drops the pooled connection it used.
pub async fn act(
    ctx: &Context,
    key: &str,
    action: &Action,
    pods: &[PodFact],
    password: &str,
    version: &str,
) -> Result<Option<(String, String)>> {
    let result = act_on(ctx, key, action, pods, password, version).await;
    if result.is_err() {
        for pod in action.pods() {
            if let Some(ip) = pods.iter().find(|p| p.name == pod).and_then(|p| p.ip.as_deref()) {
                ctx.redis.discard(key, ip);
            }
        }
    }
    result
}

async fn act_on(
    ctx: &Context,
    key: &str,
    action: &Action,
    pods: &[PodFact],
    password: &str,
    version: &str,
) -> Result<Option<(String, String)>> {
    let ip_of: BTreeMap<&str, &str> = pods.iter().filter_map(|p| Some((p.name.as_str(), p.ip.as_deref()?))).collect();
    let connect = |pod: &str| {
        let ip = ip_of.get(pod).copied().unwrap_or_default().to_owned();
        async move { ctx.redis.node(key, &ip, password).await }
    };
    match action {
        Action::Meet { via, targets } => {
            let mut node = connect(via).await?;
            for ip in targets {
                node.meet(ip).await?;
            }
            failpoint::hit(failpoint::AFTER_MEET);
            Ok(Some(("ClusterMeet".into(), format!("{via} met {} node(s): {}", targets.len(), targets.join(", ")))))
        }
        Action::AddSlots { pod, shard, ranges } => {
            let has_range = catalog::lookup(version).is_some_and(|e| e.has_addslotsrange);
            connect(pod).await?.add_slots(ranges, has_range, || failpoint::hit(failpoint::MID_ADDSLOTS)).await?;
            let list: Vec<String> = ranges.iter().map(ToString::to_string).collect();
            Ok(Some(("SlotsAssigned".into(), format!("shard {shard} master {pod} assigned slots {}", list.join(",")))))
        }
        Action::Replicate { pod, master_pod, master_id } => {
            connect(pod).await?.replicate(master_id).await?;
            failpoint::hit(failpoint::MID_REPLICATE);
            Ok(Some(("ReplicaAttached".into(), format!("{pod} now replicates {master_pod} ({master_id})"))))
        }
        Action::Wait(_) | Action::Converged => Ok(None),
    }
}
