//! The version intent over a simulated healthy cluster: when a rollout
//! starts, what is refused, what is held.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::api::RedisClusterSpec;
use crate::plan::sim::{converge, fresh};

fn cluster(engine: &str, version: &str, current: Option<(&str, &str)>) -> RedisCluster {
    let spec = json!({"masters": 3, "replicasPerMaster": 1, "redis": {"engine": engine, "version": version}});
    let mut c = RedisCluster::new("c", serde_json::from_value::<RedisClusterSpec>(spec).unwrap());
    c.metadata.namespace = Some("apps".into());
    if let Some((engine, version)) = current {
        let engine = if engine == "valkey" { Engine::Valkey } else { Engine::Redis };
        c.status = Some(RedisClusterStatus {
            current_engine: Some(engine),
            current_version: Some(version.into()),
            ..Default::default()
        });
    }
    c
}

/// Converged, every Pod on redis 6.2.14's image.
fn healthy_cluster() -> Observed {
    let mut o = fresh(3, 1);
    converge(&mut o);
    o.pods.iter_mut().for_each(|p| p.image = Some("redis:6.2.14".into()));
    for fact in o.redis.values_mut() {
        fact.replication_offset = Some(5000);
        fact.link_up = fact.myself().is_some_and(|n| !n.master);
    }
    o
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

#[test]
fn a_new_cluster_runs_what_spec_asks_and_has_no_rollout() {
    let plan = plan(&cluster("redis", "7.0.15", None), &healthy_cluster(), Ok(()), None, now());
    assert_eq!(plan.current, (Engine::Redis, "7.0.15".into(), "redis:7.0.15".into()));
    assert_eq!(plan.images, vec!["redis:7.0.15"; 3]);
    assert_eq!((plan.action, plan.refusal, plan.status), (None, None, None));
}

#[test]
fn a_version_bump_starts_a_rollout_once_healthy_hop_by_hop() {
    let c = cluster("valkey", "8.1.8", Some(("redis", "6.2.14")));
    let waiting = plan(&c, &healthy_cluster(), Err("2 of 6 Redis nodes reachable".into()), None, now());
    assert!(waiting.status.is_none(), "not started while unhealthy");
    assert_eq!(waiting.images, vec!["redis:6.2.14"; 3]);
    let started = plan(&c, &healthy_cluster(), Ok(()), None, now());
    let status = started.status.expect("started");
    assert_eq!((status.from.as_str(), status.to.as_str()), ("redis 6.2.14", "redis 7.0.15"), "one hop at a time");
    assert_eq!(status.final_target.as_deref(), Some("valkey 8.1.8"));
    assert_eq!(status.phase, RolloutPhase::Progressing);
    assert_eq!(started.current.1, "6.2.14", "current moves only when the rollout completes");
}

#[test]
fn a_downgrade_is_refused_naming_spec_version() {
    let c = cluster("redis", "6.2.14", Some(("redis", "7.0.15")));
    let plan = plan(&c, &healthy_cluster(), Ok(()), None, now());
    let refusal = plan.refusal.expect("refused");
    assert!(refusal.starts_with("spec.redis.version"), "{refusal}");
    assert!(refusal.contains("redis 6.2.14 cannot be reached from redis 7.0.15"), "{refusal}");
    assert_eq!(plan.images, vec!["redis:7.0.15"; 3], "nothing changes");
    assert!(plan.status.is_none());
}

fn running(c: &mut RedisCluster, point_of_no_return: bool) {
    let target = target(
        c,
        entry_named("redis 6.2.14").unwrap(),
        "redis:6.2.14".into(),
        entry_named("redis 7.0.15").unwrap(),
        "redis:7.0.15".into(),
    );
    let mut status = slotkeeper_upgrade::start(&target, 3, None, 0, now());
    if point_of_no_return {
        status.point_of_no_return_time = Some(Time(now()));
    }
    c.status.as_mut().unwrap().upgrade = Some(status);
}

#[test]
fn setting_the_version_back_cancels_before_the_point_of_no_return_and_is_refused_after() {
    let mut c = cluster("redis", "6.2.14", Some(("redis", "6.2.14")));
    running(&mut c, false);
    let cancel = plan(&c, &healthy_cluster(), Ok(()), None, now());
    let status = cancel.status.expect("still tracked");
    assert_eq!(status.phase, RolloutPhase::RolledBack, "nothing was upgraded yet: back at once");
    assert_eq!(status.last_rollback.unwrap().gate, GATE_CANCELLED);
    assert!(cancel.refusal.is_none());

    running(&mut c, true);
    let refused = plan(&c, &healthy_cluster(), Ok(()), None, now());
    let reason = refused.refusal.expect("refused");
    assert!(reason.starts_with("spec.redis.version 6.2.14: going back to redis 6.2.14 is refused"), "{reason}");
    assert!(matches!(refused.action, Some(Action::Wait(_))), "the rollout holds");
}

#[test]
fn a_rolled_back_target_is_held_until_spec_changes() {
    let mut c = cluster("redis", "7.0.15", Some(("redis", "6.2.14")));
    running(&mut c, false);
    let upgrade = c.status.as_mut().unwrap().upgrade.as_mut().unwrap();
    upgrade.phase = RolloutPhase::RolledBack;
    upgrade.last_rollback = Some(RollbackStatus {
        target: "redis 7.0.15".into(),
        target_image: "redis:7.0.15".into(),
        gate: "ContainerRestarts".into(),
        reason: "c-shard-0-1 restarted".into(),
        time: None,
    });
    let held = plan(&c, &healthy_cluster(), Ok(()), None, now());
    assert!(held.held.expect("held").contains("gate ContainerRestarts failed"));
    assert!(held.action.is_none());
    // Another image for the same version is another target: it starts.
    c.spec.redis.image = Some("redis:7.0.15-fixed".into());
    let retried = plan(&c, &healthy_cluster(), Ok(()), None, now());
    assert_eq!(retried.status.expect("started").to_image, "redis:7.0.15-fixed");
}

/// Security review finding 10: a RollingRestart that rolled back does not
/// make the version the nodes run look failed; the next one runs.
#[test]
fn a_failed_restart_holds_nothing_and_the_next_restart_runs() {
    let mut c = cluster("redis", "6.2.14", Some(("redis", "6.2.14")));
    let current = entry_named("redis 6.2.14").unwrap();
    let restart = target(&c, current, "redis:6.2.14".into(), current, "redis:6.2.14".into());
    let mut status = slotkeeper_upgrade::start(&restart, 3, None, 0, now());
    status.operation = Some("restart-1".into());
    status.phase = RolloutPhase::RolledBack;
    status.last_rollback = Some(RollbackStatus {
        target: "redis 6.2.14".into(),
        target_image: "redis:6.2.14".into(),
        gate: "NodeHealthy".into(),
        reason: "during the canary's bake: 1 departed node(s) not yet marked failed by the cluster".into(),
        time: None,
    });
    c.status.as_mut().unwrap().upgrade = Some(status);
    let at_rest = plan(&c, &healthy_cluster(), Ok(()), None, now());
    assert_eq!((at_rest.held, at_rest.refusal, at_rest.action), (None, None, None), "Ready follows health");
    let again = plan(&c, &healthy_cluster(), Ok(()), Some("restart-2"), now());
    assert!(again.held.is_none());
    let started = again.status.expect("the second restart starts");
    assert_eq!((started.operation.as_deref(), started.phase), (Some("restart-2"), RolloutPhase::Progressing));
}

#[test]
fn the_view_reads_roles_versions_and_lag() {
    let mut o = healthy_cluster();
    for (name, fact) in o.redis.iter_mut() {
        fact.replication_offset = Some(if name.ends_with("-0") { 5000 } else { 4000 });
        fact.link_up = !name.ends_with("-0");
    }
    o.pods.iter_mut().for_each(|p| p.image = Some("redis:7.0.15".into()));
    let view = view(&o, Ok(()));
    let node = |pod: &str| view.nodes.iter().find(|n| n.pod == pod).unwrap().clone();
    assert!(node("c-shard-0-0").master && node("c-shard-0-0").lag.is_none());
    assert_eq!(node("c-shard-0-1").lag, Some(1000));
    assert_eq!(node("c-shard-0-1").release.unwrap().to_string(), "redis 7.0.15");
}

#[test]
fn a_rolling_restart_is_a_rollout_to_what_runs_once_per_operation() {
    let c = cluster("redis", "6.2.14", Some(("redis", "6.2.14")));
    let started = plan(&c, &healthy_cluster(), Ok(()), Some("restart-1"), now());
    let status = started.status.expect("started");
    assert_eq!((status.from.as_str(), status.to.as_str()), ("redis 6.2.14", "redis 6.2.14"));
    assert_eq!(status.operation.as_deref(), Some("restart-1"));
    // Done once: the same operation does not start it again.
    let mut done = c.clone();
    let mut completed = status.clone();
    completed.phase = RolloutPhase::Completed;
    done.status.as_mut().unwrap().upgrade = Some(completed);
    assert!(
        plan(&done, &healthy_cluster(), Ok(()), Some("restart-1"), now()).status.unwrap().phase
            == RolloutPhase::Completed
    );
    assert!(plan(&done, &healthy_cluster(), Ok(()), Some("restart-1"), now()).action.is_none());
}
