//! The cluster's version intent: which release and image its nodes run, which
//! `spec` asks for, and, while they differ, the rollout between them (planned
//! hop by hop by `slotkeeper_upgrade`). Pure: the reconcile executes what it
//! returns through the one act layer.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::catalog::{self, CatalogEntry, Engine, Release};
use slotkeeper_api::rollout::{
    DEFAULT_BAKE_SECONDS, DEFAULT_STEP_TIMEOUT_SECONDS, RollbackStatus, RolloutPhase, UpgradeStatus,
};
use slotkeeper_api::{RedisCluster, RedisClusterStatus};
use slotkeeper_upgrade::{Act, ClusterView, NodeView, Target};

use super::{Action, Observed};
use crate::resources;

/// A cancelled rollout is rolled back like a failed one, but not remembered
/// as failed: asking for its target again starts it again.
pub const GATE_CANCELLED: &str = "Cancelled";

/// What the version intent asks of this reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutPlan {
    /// `status.upgrade` to write.
    pub status: Option<UpgradeStatus>,
    /// The release and image every node runs (they move when a rollout completes).
    pub current: (Engine, String, String),
    /// Each staying shard's image and the release it runs.
    pub images: Vec<String>,
    pub releases: Vec<&'static CatalogEntry>,
    /// Every release the nodes may run now (one configuration file each).
    pub in_use: Vec<&'static CatalogEntry>,
    pub surge: Option<usize>,
    /// The rollout's step while one runs (`None`: no rollout now).
    pub action: Option<Action>,
    /// `spec` asks for something that cannot be done; nothing changes.
    pub refusal: Option<String>,
    /// A rollout rolled back and its target is not retried: why.
    pub held: Option<String>,
}

/// The release of a `status.upgrade` field such as `redis 7.0.15`.
fn entry_named(text: &str) -> Option<&'static CatalogEntry> {
    let (engine, version) = text.split_once(' ')?;
    catalog::lookup(engine.parse().ok()?, version)
}

/// What the nodes run: from status, else (a new cluster) what spec asks.
fn current(cluster: &RedisCluster) -> (&'static CatalogEntry, String) {
    let status = cluster.status.clone().unwrap_or_default();
    let spec_entry = catalog::lookup(cluster.spec.redis.engine, &cluster.spec.redis.version);
    let entry = status
        .current_version
        .as_deref()
        .and_then(|v| catalog::lookup(status.current_engine.unwrap_or_default(), v))
        .or(spec_entry)
        .unwrap_or(&catalog::CATALOG[0]);
    let image = status
        .current_image
        .clone()
        .unwrap_or_else(|| if Some(entry) == spec_entry { resources::image(cluster) } else { entry.image.to_owned() });
    (entry, image)
}

fn target(
    cluster: &RedisCluster,
    from: &'static CatalogEntry,
    from_image: String,
    to: &'static CatalogEntry,
    to_image: String,
) -> Target {
    let upgrade = cluster.spec.rollout.clone().unwrap_or_default();
    let seconds = |value: Option<i32>, default: i32| Duration::from_secs(value.unwrap_or(default).max(0) as u64);
    Target {
        from,
        from_image,
        to,
        to_image,
        bake: seconds(upgrade.canary_bake_seconds, DEFAULT_BAKE_SECONDS),
        step_timeout: seconds(upgrade.step_timeout_seconds, DEFAULT_STEP_TIMEOUT_SECONDS),
    }
}

fn is_active(status: &UpgradeStatus) -> bool {
    status.phase.is_active()
}

/// What the rollout planner sees of the cluster.
pub fn view(observed: &Observed, healthy: Result<(), String>) -> ClusterView {
    let nodes = observed
        .pods
        .iter()
        .map(|pod| {
            let fact = observed.redis.get(&pod.name);
            let me = fact.and_then(|f| f.myself());
            let master = me.is_some_and(|n| n.master && !n.slots.is_empty());
            let lag = observed.lag_of(&pod.name);
            NodeView {
                pod: pod.name.clone(),
                shard: pod.shard,
                ordinal: pod.ordinal,
                image: pod.image.clone(),
                created: pod.created,
                restarts: pod.restarts,
                reachable: fact.is_some(),
                master,
                release: fact.and_then(|f| Release::parse(f.engine, &f.version)),
                link_up: fact.is_some_and(|f| f.promotable()),
                lag,
            }
        })
        .filter(|n| n.shard < observed.shards)
        .collect();
    ClusterView { shards: observed.shards, replicas_per_master: observed.replicas_per_master, nodes, healthy }
}

/// The version intent for this reconcile. `healthy` is whether the cluster
/// planner has nothing to do (a rollout starts and steps only then).
pub fn plan(
    cluster: &RedisCluster,
    observed: &Observed,
    healthy: Result<(), String>,
    restart: Option<&str>,
    now: Timestamp,
) -> RolloutPlan {
    let status = cluster.status.clone().unwrap_or_default();
    let (current, current_image) = current(cluster);
    let at_rest = |refusal: Option<String>, held: Option<String>| RolloutPlan {
        status: status.upgrade.clone(),
        current: (current.engine, current.version.to_owned(), current_image.clone()),
        images: vec![current_image.clone(); observed.shards],
        releases: vec![current; observed.shards],
        in_use: vec![current],
        surge: None,
        action: None,
        refusal,
        held,
    };
    let Some(desired) = catalog::lookup(cluster.spec.redis.engine, &cluster.spec.redis.version) else {
        return at_rest(
            Some(format!(
                "spec.redis.version: {} {} is not in the operator's catalog ({})",
                cluster.spec.redis.engine,
                cluster.spec.redis.version,
                catalog::describe()
            )),
            None,
        );
    };
    let desired_image = resources::image(cluster);

    if let Some(running) = status.upgrade.clone().filter(is_active) {
        let (Some(from), Some(to)) = (entry_named(&running.from), entry_named(&running.to)) else {
            return at_rest(
                Some(format!("status.upgrade names an unknown release: {} → {}", running.from, running.to)),
                None,
            );
        };
        let target = target(cluster, from, running.from_image.clone(), to, running.to_image.clone());
        let mut checkpoint = running.clone();
        let mut refusal = None;
        let going_back = desired == from && desired_image == running.from_image && from != to;
        if going_back && checkpoint.phase == RolloutPhase::Progressing {
            match &running.point_of_no_return_time {
                Some(at) => {
                    refusal = Some(format!(
                        "spec.redis.version {}: going back to {} is refused: a node on {} has been master since {} (the point of no return), and an older replica cannot take a full sync from it; set spec.redis.version back to {} to finish the rollout",
                        cluster.spec.redis.version, running.from, running.to, at.0, to.version
                    ));
                }
                None => {
                    checkpoint.phase = RolloutPhase::RollingBack;
                    checkpoint.last_rollback = Some(RollbackStatus {
                        target: running.to.clone(),
                        target_image: running.to_image.clone(),
                        gate: GATE_CANCELLED.into(),
                        reason: format!(
                            "spec.redis.version set back to {} before the point of no return",
                            from.version
                        ),
                        time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                    });
                }
            }
        }
        let decision = slotkeeper_upgrade::next(&view(observed, healthy), &target, &checkpoint, now);
        let action = match (&refusal, decision.act) {
            (Some(reason), _) => Action::Wait(format!("rollout held: {reason}")),
            (None, Act::Wait(reason)) => Action::Wait(reason),
            (None, Act::Recreate { shard, pod, reason, fresh_data }) => {
                Action::RecreatePod { pod, shard, reason, fresh_data }
            }
            (None, Act::Failover { shard, pod, reason, .. }) => {
                Action::Failover { pod, shard, reason, force: false, operation: None, spread: false }
            }
            (None, Act::Done) => Action::Converged,
        };
        let current = match decision.status.phase {
            RolloutPhase::Completed => (to.engine, to.version.to_owned(), running.to_image.clone()),
            _ => (from.engine, from.version.to_owned(), running.from_image.clone()),
        };
        let releases = decision.images.iter().map(|i| if *i == running.to_image { to } else { from }).collect();
        let in_use = if from == to { vec![from] } else { vec![from, to] };
        return RolloutPlan {
            status: Some(decision.status),
            current,
            releases,
            in_use,
            images: decision.images,
            surge: decision.surge,
            action: Some(action),
            refusal,
            held: None,
        };
    }

    // A RollingRestart asks for a rollout to what runs, once per operation.
    let restart = restart.filter(|op| status.upgrade.as_ref().and_then(|u| u.operation.as_deref()) != Some(*op));
    if desired == current && desired_image == current_image && restart.is_none() {
        return at_rest(None, None);
    }
    let Some(path) = catalog::path(current, desired) else {
        let ways: Vec<String> = catalog::reachable_from(current).iter().map(|e| e.release().to_string()).collect();
        let ways = if ways.is_empty() { "none".to_owned() } else { ways.join(", ") };
        return at_rest(
            Some(format!(
                "spec.redis.version: {} cannot be reached from {} (the nodes run it): a downgrade or an unknown upgrade edge; reachable: {ways}. Set spec.redis.engine and spec.redis.version back to {}",
                desired.release(),
                current.release(),
                current.release()
            )),
            None,
        );
    };
    // Same release, another image: a rollout onto it (every Pod recreated once).
    let hop = path.first().copied().unwrap_or(desired);
    let hop_image = if hop == desired { desired_image } else { hop.image.to_owned() };
    // A failed restart (onto what runs) does not make the running version
    // look failed: the nodes run it, and the next RollingRestart may try again.
    let restart_of_current = hop == current && hop_image == current_image;
    if let Some(failed) = status.upgrade.as_ref().and_then(|u| u.last_rollback.as_ref())
        && status.upgrade.as_ref().is_some_and(|u| u.phase == RolloutPhase::RolledBack)
        && !restart_of_current
        && failed.gate != GATE_CANCELLED
        && failed.target == hop.release().to_string()
        && failed.target_image == hop_image
    {
        return at_rest(
            None,
            Some(format!(
                "the rollout to {} ({hop_image}) was rolled back: gate {} failed: {}; it is not retried until spec.redis.version or spec.redis.image changes",
                failed.target, failed.gate, failed.reason
            )),
        );
    }
    let both = if hop == current { vec![current] } else { vec![current, hop] };
    if let Err(reason) =
        both.iter().try_for_each(|e| crate::config::user_lines(&cluster.spec.redis.config, e, &both).map(drop))
    {
        return at_rest(Some(format!("the rollout to {} cannot start: {reason}", hop.release())), None);
    }
    if let Err(reason) = healthy {
        let mut plan = at_rest(None, None);
        plan.action = Some(Action::Wait(format!(
            "the rollout to {} starts once the cluster is healthy: {reason}",
            hop.release()
        )));
        return plan;
    }
    let view = view(observed, Ok(()));
    let target = target(cluster, current, current_image.clone(), hop, hop_image);
    let final_target = (hop != desired).then(|| desired.release().to_string());
    let started = slotkeeper_upgrade::start(&target, observed.shards, final_target, view.restarts(), now);
    let mut plan = at_rest(None, None);
    let mut started = started;
    started.operation = restart.filter(|_| hop == current && target.is_restart()).map(str::to_owned);
    plan.status = Some(started);
    let images = slotkeeper_upgrade::next(&view, &target, plan.status.as_ref().expect("set"), now).images;
    // The first step comes at the next reconcile, after the checkpoint is written.
    plan.releases = images.iter().map(|i| if *i == target.to_image { hop } else { current }).collect();
    plan.in_use = both;
    plan.images = images;
    plan.action = Some(Action::Wait(format!("rollout {} → {} started", target.from.release(), target.to.release())));
    plan
}

/// `status.upgrade` tells a running rollout (`Upgrading`) from one at rest.
pub fn in_progress(status: &RedisClusterStatus) -> bool {
    status.upgrade.as_ref().is_some_and(is_active)
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
