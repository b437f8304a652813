//! Report: the status is computed from what was observed and planned (pure),
//! and written only when it differs from what is stored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::lag::ReplicationLag;
use crate::api::names::*;
use crate::api::rollout::RolloutPhase;
use crate::api::{
    BalancePlan, BalanceStatus, FailureDomainStatus, NodeStatus, Phase, RedisCluster, RedisClusterStatus,
    ReshardStatus, StepStatus,
};
use crate::plan::rollout::RolloutPlan;
use crate::plan::{Action, Observed, placement};
use crate::redis::topology::{SLOTS, count};

/// The status for this observation; `step_done` says whether the action
/// (begun at `step_started`) succeeded. `now` stamps conditions that changed.
pub fn build_status(
    cluster: &RedisCluster,
    observed: &Observed,
    action: &Action,
    rollout: &RolloutPlan,
    step_done: bool,
    step_started: Timestamp,
    now: Timestamp,
) -> RedisClusterStatus {
    let old = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let lag_before = |pod: &str| old.nodes.iter().find(|n| n.pod == pod).and_then(|n| n.replication_lag);
    let nodes: Vec<NodeStatus> = observed
        .pods
        .iter()
        .map(|pod| {
            let fact = observed.redis.get(&pod.name);
            let me = fact.and_then(|f| f.myself());
            NodeStatus {
                pod: pod.name.clone(),
                ip: pod.ip.clone(),
                node: pod.node_name.clone(),
                domain: pod.domain.clone(),
                node_id: me.map(|n| n.id.clone()),
                role: me.map(|n| if n.master { "master".into() } else { "replica".into() }),
                master_id: me.and_then(|n| n.master_id.clone()),
                slots: me.map(|n| n.slots.iter().map(ToString::to_string).collect()).unwrap_or_default(),
                engine: fact.map(|f| f.engine),
                version: fact.map(|f| f.version.clone()),
                // Raw offsets move with every write the master takes, which would
                // turn each resync into a status write: a bucket is reported instead.
                replication_offset: None,
                replication_lag: fact.zip(me).filter(|(_, me)| !me.master && me.master_id.is_some()).and_then(
                    |(f, _)| match (f.link_up, observed.lag_of(&pod.name)) {
                        (false, _) => Some(ReplicationLag::LinkDown),
                        (true, Some(lag)) => Some(ReplicationLag::of(Some(lag), lag_before(&pod.name))),
                        // Its master did not answer this time: what was reported stands.
                        (true, None) => lag_before(&pod.name),
                    },
                ),
            }
        })
        .collect();
    let myselves: Vec<_> = observed.redis.values().filter_map(|f| f.myself()).collect();
    let ready_masters = myselves.iter().filter(|n| n.master && !n.slots.is_empty()).count() as i32;
    let ready_replicas = myselves.iter().filter(|n| !n.master && n.master_id.is_some()).count() as i32;
    let slots_assigned = myselves.iter().map(|n| count(&n.slots)).sum::<usize>().min(SLOTS as usize) as i32;
    let states: Vec<&str> = observed.redis.values().map(|f| f.cluster_state.as_str()).collect();
    let cluster_state = if states.is_empty() {
        None
    } else if states.iter().all(|s| *s == "ok") {
        Some("ok".to_owned())
    } else {
        Some(states.iter().find(|s| **s != "ok").copied().unwrap_or("unknown").to_owned())
    };
    let (current_engine, current_version, current_image) = rollout.current.clone();
    let converged = *action == Action::Converged;
    let refused = matches!(action, Action::Refused(_));
    let was_running = matches!(old.phase, Some(Phase::Running | Phase::Recovering | Phase::Scaling));
    // A healthy cluster moving a master apart keeps serving: Running and
    // Ready. One still being created is not Running yet (so becoming Ready
    // is still told, by ClusterReady, once it has converged).
    let spreading = matches!(action, Action::Failover { spread: true, .. }) && was_running;
    let upgrade = rollout.status.clone();
    let upgrading = upgrade.as_ref().is_some_and(|u| u.phase.is_active());
    let halted = upgrade.as_ref().filter(|u| u.phase == RolloutPhase::Halted);
    let phase = match action {
        _ if upgrading => Phase::Upgrading,
        Action::Converged | Action::Refused(_) => Phase::Running,
        _ if spreading => Phase::Running,
        _ if was_running && scaling(observed, action) => Phase::Scaling,
        _ if was_running => Phase::Recovering,
        Action::Wait(_) if observed.redis.is_empty() => Phase::Pending,
        _ => Phase::Creating,
    };
    let (step_name, message) = describe(action);
    let serving = converged || refused || spreading;
    // Why the cluster is not where spec asks, though it serves: a rollout
    // running, halted or rolled back, or a version that cannot be reached.
    let version_gap: Option<(&str, String, bool)> = if let Some(reason) = &rollout.refusal {
        Some((REASON_VERSION_REFUSED, reason.clone(), true))
    } else if let Some(u) = halted {
        Some((REASON_ROLLOUT_HALTED, u.message.clone().unwrap_or_else(|| message.clone()), true))
    } else if upgrading {
        let u = upgrade.as_ref().expect("upgrading");
        let what = if u.phase == RolloutPhase::RollingBack { "rolling back" } else { "rolling out" };
        Some((REASON_UPGRADING, format!("{what} {} → {}: {message}", u.from, u.to), false))
    } else {
        rollout.held.as_ref().map(|held| (REASON_ROLLED_BACK, held.clone(), true))
    };
    let (progress_reason, degraded_reason) = match phase {
        _ if refused => (REASON_REFUSED, REASON_REFUSED),
        _ if spreading => (REASON_SPREADING_MASTERS, REASON_NONE),
        Phase::Scaling => (REASON_SCALING, REASON_NONE),
        Phase::Recovering => (REASON_RECOVERING, REASON_REDIS_UNREACHABLE),
        _ if converged => (REASON_CONVERGED, REASON_NONE),
        _ => (REASON_BOOTSTRAPPING, REASON_NONE),
    };
    let ready_now = serving && version_gap.is_none();
    let ready = match &version_gap {
        Some((reason, why, _)) if serving || upgrading => {
            condition(&old, CONDITION_READY, false, reason, why.clone(), generation, now)
        }
        _ => condition(
            &old,
            CONDITION_READY,
            ready_now,
            if ready_now { REASON_CLUSTER_HEALTHY } else { progress_reason },
            if ready_now { "all slots served, every shard has its replicas".into() } else { message.clone() },
            generation,
            now,
        ),
    };
    // Progressing is True while something moves; a halted or rolled-back
    // rollout (or a refused version) is not progressing, so a pipeline
    // waiting on Ready can fail fast on Progressing=False.
    let progressing = match &version_gap {
        Some((reason, why, true)) => {
            condition(&old, CONDITION_PROGRESSING, false, reason, why.clone(), generation, now)
        }
        Some((reason, why, false)) => {
            condition(&old, CONDITION_PROGRESSING, true, reason, why.clone(), generation, now)
        }
        None => condition(
            &old,
            CONDITION_PROGRESSING,
            !serving || spreading,
            progress_reason,
            if converged { "nothing to do".into() } else { message.clone() },
            generation,
            now,
        ),
    };
    // Serving, but one failure domain's loss would stop writes: said only
    // once the cluster has settled (a recovery moves roles for a while).
    let placement_risk = if converged || spreading { placement::risk(observed) } else { None };
    let degraded = match (&version_gap, placement_risk) {
        (Some((reason, why, true)), _) => {
            condition(&old, CONDITION_DEGRADED, true, reason, why.clone(), generation, now)
        }
        (_, Some(risk)) => condition(&old, CONDITION_DEGRADED, true, REASON_PLACEMENT_AT_RISK, risk, generation, now),
        _ => {
            let degraded_now = refused || phase == Phase::Recovering;
            condition(
                &old,
                CONDITION_DEGRADED,
                degraded_now,
                degraded_reason,
                if degraded_now { message.clone() } else { "no degradation".into() },
                generation,
                now,
            )
        }
    };
    let reshard = match action {
        Action::Converged => None,
        Action::MoveSlots { batches, remaining, repair: false, .. } => {
            let in_batch: usize = batches.iter().map(|b| b.slots.len()).sum();
            let left = remaining + if step_done { 0 } else { in_batch };
            let total = old.reshard.as_ref().map_or(0, |r| r.slots_total as usize).max(remaining + in_batch);
            Some(ReshardStatus {
                started_time: old
                    .reshard
                    .as_ref()
                    .and_then(|r| r.started_time.clone())
                    .or(Some(MicroTime(step_started))),
                slots_total: total as i32,
                slots_moved: (total - left) as i32,
                current_slot: batches.iter().flat_map(|b| b.slots.first()).map(|s| i32::from(s.slot)).min(),
                moving: batches
                    .iter()
                    .map(|b| format!("{} -> {}: {} slots", b.source.pod, b.target.pod, b.slots.len()))
                    .collect(),
                plan: old.reshard.as_ref().and_then(|r| r.plan.clone()),
            })
        }
        Action::FinishBalance { .. } => None,
        _ => old.reshard.clone(),
    };

    RedisClusterStatus {
        replication_lag: nodes.iter().filter_map(|n| n.replication_lag).max(),
        phase: Some(phase),
        observed_generation: generation,
        conditions: vec![ready, progressing, degraded],
        ready_masters,
        ready_replicas,
        slots_assigned,
        cluster_state,
        current_engine: Some(current_engine),
        current_version: Some(current_version),
        current_image: Some(current_image),
        upgrade,
        nodes,
        step: (!converged).then(|| StepStatus { name: step_name.into(), progress: Some(message) }),
        reshard,
        balance: old.balance.clone(),
        acl: old.acl.clone(),
        failure_domains: placement::census(observed)
            .into_iter()
            .map(|(name, d)| FailureDomainStatus { name, masters: d.masters, replicas: d.replicas })
            .collect(),
    }
}

/// A plan just made starts the reshard it describes (its checkpoint); a
/// finished one moves to `status.balance`, the record of the last rebalance.
pub fn record_balance(status: &mut RedisClusterStatus, action: &Action, planned: Option<BalancePlan>, now: Timestamp) {
    if let Some(plan) = planned {
        status.reshard = Some(ReshardStatus {
            started_time: Some(MicroTime(now)),
            slots_total: plan.slots() as i32,
            plan: Some(plan),
            ..ReshardStatus::default()
        });
    }
    if let Action::FinishBalance { by, operation, summary } = action {
        status.reshard = None;
        status.balance = Some(BalanceStatus {
            by: *by,
            operation: operation.clone(),
            completed_time: Some(Time(now)),
            message: Some(summary.clone()),
        });
    }
}

/// The status of a paused cluster: the last one, with Progressing saying why.
pub fn paused_status(cluster: &RedisCluster, now: Timestamp) -> RedisClusterStatus {
    let mut status = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let progressing = condition(
        &status,
        CONDITION_PROGRESSING,
        false,
        REASON_PAUSED,
        "spec.paused is true: the operator takes no action on this cluster".into(),
        generation,
        now,
    );
    status.conditions.retain(|c| c.type_ != CONDITION_PROGRESSING);
    status.conditions.push(progressing);
    status.observed_generation = generation;
    status
}

/// Whether the cluster is changing shape: slots moving, shards or replicas
/// coming or going.
fn scaling(observed: &Observed, action: &Action) -> bool {
    if matches!(
        action,
        Action::MoveSlots { repair: false, .. }
            | Action::RemoveShard { .. }
            | Action::Failover { .. }
            | Action::PlanBalance { .. }
            | Action::FinishBalance { .. }
    ) {
        return true;
    }
    let shards: std::collections::BTreeSet<usize> = observed.pods.iter().map(|p| p.shard).collect();
    let per_shard = |shard| observed.pods.iter().filter(|p| p.shard == shard).count();
    shards.len() != observed.shards
        || (0..observed.shards).any(|shard| per_shard(shard) != observed.replicas_per_master + 1)
}

pub fn describe(action: &Action) -> (&'static str, String) {
    match action {
        Action::Wait(reason) => ("Wait", reason.clone()),
        Action::Refused(reason) => ("Refused", reason.clone()),
        Action::Meet { targets, .. } => ("Meet", format!("joining {} node(s) into the cluster", targets.len())),
        Action::AddSlots { shard, .. } => ("AssignSlots", format!("assigning slots to shard {shard}")),
        Action::Replicate { pod, .. } => ("AttachReplica", format!("attaching replica {pod}")),
        Action::Forget { ids_by_pod } => {
            let ids: std::collections::BTreeSet<&String> = ids_by_pod.values().flatten().collect();
            ("ForgetNodes", format!("forgetting {} departed node(s)", ids.len()))
        }
        Action::Failover { pod, shard, reason, .. } => {
            ("Failover", format!("shard {shard}: promoting {pod}: {reason}"))
        }
        Action::Stabilize { slots_by_pod } => (
            "StabilizeSlots",
            format!("clearing {} orphaned migration mark(s)", slots_by_pod.values().flatten().count()),
        ),
        Action::MoveSlots { batches, remaining, repair, .. } => {
            let moving: usize = batches.iter().map(|b| b.slots.len()).sum();
            if *repair {
                ("RepairSlots", format!("finishing {moving} slot(s) left open by an interrupted migration"))
            } else {
                ("MoveSlots", format!("moving {moving} slot(s), {remaining} more to go"))
            }
        }
        Action::PlanBalance { by, operation, .. } => {
            let asked = operation.as_ref().map(|op| format!(" for RedisOperation {op}")).unwrap_or_default();
            ("PlanBalance", format!("deciding which slots move to balance the masters by {by}{asked}"))
        }
        Action::FinishBalance { summary, .. } => ("FinishBalance", format!("rebalanced: {summary}")),
        Action::RemoveShard { shard } => ("RemoveShard", format!("removing drained shard {shard}")),
        Action::ApplyUsers { pods, .. } => ("ApplyUsers", format!("applying the ACL users to {} node(s)", pods.len())),
        Action::DeletePod { pod, reason } => ("ReplacePod", format!("replacing {pod}: {reason}")),
        Action::RecreatePod { pod, reason, .. } => ("RecreatePod", format!("recreating {pod}: {reason}")),
        Action::MovePod { pod, reason, .. } => ("MovePod", format!("recreating replica {pod} elsewhere: {reason}")),
        Action::Converged => ("Converged", "converged".into()),
    }
}

/// A condition, keeping its transition time when its status did not change.
fn condition(
    old: &RedisClusterStatus,
    kind: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let previous = old.conditions.iter().find(|c| c.type_ == kind);
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Time(now),
    };
    Condition {
        type_: kind.into(),
        status,
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}
