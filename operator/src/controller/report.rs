//! Report: the status is computed from what was observed and planned (pure),
//! and written only when it differs from what is stored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::names::*;
use crate::api::{NodeStatus, Phase, RedisCluster, RedisClusterStatus, StepStatus};
use crate::plan::{Action, Observed};
use crate::redis::topology::{SLOTS, expand};

/// The status for this observation. `now` stamps conditions that changed.
pub fn build_status(
    cluster: &RedisCluster,
    observed: &Observed,
    action: &Action,
    now: Timestamp,
) -> RedisClusterStatus {
    let old = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let nodes: Vec<NodeStatus> = observed
        .pods
        .iter()
        .map(|pod| {
            let fact = observed.redis.get(&pod.name);
            let me = fact.and_then(|f| f.myself());
            NodeStatus {
                pod: pod.name.clone(),
                ip: pod.ip.clone(),
                node_id: me.map(|n| n.id.clone()),
                role: me.map(|n| if n.master { "master".into() } else { "replica".into() }),
                master_id: me.and_then(|n| n.master_id.clone()),
                slots: me.map(|n| n.slots.iter().map(ToString::to_string).collect()).unwrap_or_default(),
                version: fact.map(|f| f.version.clone()),
                // Raw offsets move with every replication ping, which would turn each
                // resync into a status write; lag reporting comes with failover work.
                replication_offset: None,
            }
        })
        .collect();
    let myselves: Vec<_> = observed.redis.values().filter_map(|f| f.myself()).collect();
    let ready_masters = myselves.iter().filter(|n| n.master && !n.slots.is_empty()).count() as i32;
    let ready_replicas = myselves.iter().filter(|n| !n.master && n.master_id.is_some()).count() as i32;
    let slots_assigned = myselves.iter().map(|n| expand(&n.slots).len()).sum::<usize>().min(SLOTS as usize) as i32;
    let states: Vec<&str> = observed.redis.values().map(|f| f.cluster_state.as_str()).collect();
    let cluster_state = if states.is_empty() {
        None
    } else if states.iter().all(|s| *s == "ok") {
        Some("ok".to_owned())
    } else {
        Some(states.iter().find(|s| **s != "ok").copied().unwrap_or("unknown").to_owned())
    };
    let versions: std::collections::BTreeSet<&str> = observed.redis.values().map(|f| f.version.as_str()).collect();
    let current_version =
        if versions.len() == 1 { versions.first().map(|v| v.to_string()) } else { old.current_version.clone() };

    let converged = *action == Action::Converged;
    let was_running = matches!(old.phase, Some(Phase::Running | Phase::Recovering));
    let phase = match action {
        Action::Converged => Phase::Running,
        _ if was_running => Phase::Recovering,
        Action::Wait(_) if observed.redis.is_empty() => Phase::Pending,
        _ => Phase::Creating,
    };
    let (step_name, message) = describe(action);
    let ready = condition(
        &old,
        CONDITION_READY,
        converged,
        if converged { REASON_CLUSTER_HEALTHY } else { REASON_BOOTSTRAPPING },
        if converged { "all slots served, every shard has its replicas".into() } else { message.clone() },
        generation,
        now,
    );
    let progressing = condition(
        &old,
        CONDITION_PROGRESSING,
        !converged,
        if converged { REASON_CONVERGED } else { REASON_BOOTSTRAPPING },
        if converged { "nothing to do".into() } else { message.clone() },
        generation,
        now,
    );
    let degraded = condition(
        &old,
        CONDITION_DEGRADED,
        !converged && was_running,
        if !converged && was_running { REASON_REDIS_UNREACHABLE } else { REASON_NONE },
        if !converged && was_running { message.clone() } else { "no degradation".into() },
        generation,
        now,
    );

    RedisClusterStatus {
        phase: Some(phase),
        observed_generation: generation,
        conditions: vec![ready, progressing, degraded],
        ready_masters,
        ready_replicas,
        slots_assigned,
        cluster_state,
        current_version,
        nodes,
        step: (!converged).then(|| StepStatus { name: step_name.into(), progress: Some(message) }),
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

fn describe(action: &Action) -> (&'static str, String) {
    match action {
        Action::Wait(reason) => ("Wait", reason.clone()),
        Action::Meet { targets, .. } => ("Meet", format!("joining {} node(s) into the cluster", targets.len())),
        Action::AddSlots { shard, .. } => ("AssignSlots", format!("assigning slots to shard {shard}")),
        Action::Replicate { pod, .. } => ("AttachReplica", format!("attaching replica {pod}")),
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
