//! Masters over failure domains, through the simulation: chosen apart at
//! creation, moved back apart after Redis moved them, never flapping, and
//! the risk named when the Nodes cannot give it.

use std::collections::BTreeMap;

use super::placement::{census, risk};
use super::sim::*;
use crate::plan::{Action, Observed, plan};

/// Each Pod's domain by shard and ordinal, as a scheduler might have put them.
type Layout = fn(usize, usize) -> &'static str;

/// Every shard's ordinal 0 on node-a: the layout where "lowest ordinal is
/// master" puts every master on one Node.
fn ordinal_zero_on_a(shard: usize, ordinal: usize) -> &'static str {
    match (shard, ordinal) {
        (_, 0) => "node-a",
        (s, _) if s % 2 == 0 => "node-b",
        _ => "node-c",
    }
}

fn place(o: &mut Observed, layout: Layout) {
    for pod in &mut o.pods {
        pod.domain = Some(layout(pod.shard, pod.ordinal).to_owned());
    }
}

/// [`converge`], with the scheduler placing every new Pod by `layout`.
fn converge_placed(o: &mut Observed, layout: Layout) -> Vec<Action> {
    converge_with(o, |o| place(o, layout))
}

fn masters_per_domain(o: &Observed) -> BTreeMap<String, usize> {
    census(o).into_iter().map(|(d, c)| (d, c.masters.len())).collect()
}

fn spreading_failovers(steps: &[Action]) -> Vec<&Action> {
    steps.iter().filter(|s| matches!(s, Action::Failover { reason, .. } if reason.starts_with("spreading"))).collect()
}

/// Redis fails shard `shard` over to `pod` by itself (a crash, a freeze).
fn redis_fails_over(o: &mut Observed, pod: &str, shard: usize) {
    apply(
        o,
        &Action::Failover {
            pod: pod.into(),
            shard,
            reason: "redis".into(),
            force: true,
            operation: None,
            spread: false,
        },
    );
}

#[test]
fn a_new_cluster_chooses_its_masters_one_per_domain() {
    let mut o = fresh(3, 1);
    let steps = converge_placed(&mut o, ordinal_zero_on_a);
    assert_healthy(&o);
    let load = masters_per_domain(&o);
    assert!(load.values().all(|&n| n == 1), "one master per domain: {load:?}");
    assert!(spreading_failovers(&steps).is_empty(), "chosen at creation, not failed over after: {steps:?}");
    assert_eq!(risk(&o), None);
}

#[test]
fn masters_moved_together_by_redis_are_moved_apart_one_shard_at_a_time() {
    let mut o = fresh(3, 1);
    converge_placed(&mut o, ordinal_zero_on_a);
    // Redis promotes whatever replica it elects: put every master on node-a.
    for shard in 0..3 {
        let on_a = format!("c-shard-{shard}-0");
        if !o.redis[&on_a].myself().unwrap().master {
            redis_fails_over(&mut o, &on_a, shard);
        }
    }
    assert_eq!(masters_per_domain(&o)["node-a"], 3);
    assert!(risk(&o).is_some_and(|r| r.contains("node-a holds 3 of 3 masters")), "{:?}", risk(&o));

    let first = plan(&o);
    let Action::Failover { force, reason, operation, .. } = &first else { panic!("a failover: {first:?}") };
    assert!(!force && operation.is_none());
    assert!(reason.contains("node-a holds 3 of 3 masters"), "{reason}");
    let steps = converge_placed(&mut o, ordinal_zero_on_a);
    assert_eq!(spreading_failovers(&steps).len(), 2, "two shards move, one at a time: {steps:?}");
    assert!(masters_per_domain(&o).values().all(|&n| n == 1), "{:?}", masters_per_domain(&o));
    assert_healthy(&o);
    assert_eq!(risk(&o), None);
}

#[test]
fn nothing_moves_while_a_rollout_or_an_operation_holds_the_roles() {
    let mut o = fresh(3, 1);
    converge_placed(&mut o, ordinal_zero_on_a);
    redis_fails_over(&mut o, "c-shard-1-0", 1);
    redis_fails_over(&mut o, "c-shard-2-0", 2);
    o.roles_held = true;
    assert_eq!(plan(&o), Action::Converged);
    o.roles_held = false;
    assert!(matches!(plan(&o), Action::Failover { .. }));
}

#[test]
fn a_lagging_replica_is_waited_for_not_promoted() {
    let mut o = fresh(3, 1);
    converge_placed(&mut o, ordinal_zero_on_a);
    redis_fails_over(&mut o, "c-shard-1-0", 1);
    redis_fails_over(&mut o, "c-shard-2-0", 2);
    assert!(matches!(plan(&o), Action::Failover { .. }));
    // Every master 50 MiB ahead of its replicas.
    for fact in o.redis.values_mut() {
        if fact.myself().unwrap().master {
            fact.replication_offset = Some(50 << 20);
        }
    }
    assert!(matches!(plan(&o), Action::Wait(w) if w.contains("bytes behind")), "{:?}", plan(&o));
}

#[test]
fn nodes_that_cannot_hold_masters_apart_are_reported_and_nothing_flaps() {
    // Two Nodes for three shards: one of them must hold two masters.
    let two_nodes: Layout = |_, ordinal| if ordinal == 0 { "node-a" } else { "node-b" };
    let mut o = fresh(3, 1);
    converge_placed(&mut o, two_nodes);
    let load = masters_per_domain(&o);
    assert_eq!(load.values().max(), Some(&2), "{load:?}");
    let said = risk(&o).expect("at risk");
    assert!(said.contains("holds 2 of 3 masters") && said.contains("at least 3 are needed"), "{said}");
    // Redis moves a master; the spread comes back to 2/1, not to and fro.
    let on_b = o
        .pods
        .iter()
        .find(|p| p.domain.as_deref() == Some("node-b") && !o.redis[&p.name].myself().unwrap().master)
        .unwrap()
        .clone();
    redis_fails_over(&mut o, &on_b.name, on_b.shard);
    let steps = converge_placed(&mut o, two_nodes);
    assert!(spreading_failovers(&steps).len() <= 1, "{steps:?}");
    assert_eq!(masters_per_domain(&o).values().max(), Some(&2));
}

#[test]
fn a_shard_whose_pods_share_a_domain_is_at_risk() {
    let one_shard_together: Layout = |shard, ordinal| match (shard, ordinal) {
        (0, _) => "node-a",
        (1, 0) => "node-b",
        (2, 0) => "node-c",
        (1, _) => "node-c",
        _ => "node-b",
    };
    let mut o = fresh(3, 1);
    converge_placed(&mut o, one_shard_together);
    let said = risk(&o).expect("at risk");
    assert!(said.starts_with("shard 0: all its Pods are in failure domain node-a"), "{said}");
}

#[test]
fn a_master_a_user_placed_stays_and_other_shards_move_around_it() {
    let mut o = fresh(3, 1);
    converge_placed(&mut o, ordinal_zero_on_a);
    // Shard 0's master was on node-a; a user moves it to node-b, where
    // shard 2's master already is.
    let replica = o.pods.iter().find(|p| p.shard == 0 && !o.redis[&p.name].myself().unwrap().master).unwrap().clone();
    redis_fails_over(&mut o, &replica.name, 0);
    o.user_placed.insert(replica.name.clone());
    let steps = converge_placed(&mut o, ordinal_zero_on_a);
    assert!(o.redis[&replica.name].myself().unwrap().master, "{} stays master: {steps:?}", replica.name);
    assert!(
        spreading_failovers(&steps).iter().all(|s| matches!(s, Action::Failover { shard, .. } if *shard != 0)),
        "{steps:?}"
    );
    assert!(masters_per_domain(&o).values().all(|&n| n == 1), "{:?}", masters_per_domain(&o));
}

/// A scheduler for new Pods (no domain yet): a domain without the shard's
/// Pods first, then the one holding the fewest of the cluster's Pods.
fn schedule(o: &mut Observed, open: &[&str]) {
    let old = k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap();
    for i in 0..o.pods.len() {
        if o.pods[i].domain.is_some() {
            continue;
        }
        let shard = o.pods[i].shard;
        let score = |d: &str| {
            let has_shard = o.pods.iter().any(|p| p.shard == shard && p.domain.as_deref() == Some(d));
            (has_shard, o.pods.iter().filter(|p| p.domain.as_deref() == Some(d)).count(), d.to_owned())
        };
        let domain = open.iter().min_by_key(|d| score(d)).unwrap().to_string();
        o.pods[i].domain = Some(domain);
        o.pods[i].created = Some(old);
    }
}

fn converge_scheduled(o: &mut Observed, open: &[&str]) -> Vec<Action> {
    o.open_domains = open.iter().map(|d| d.to_string()).collect();
    converge_with(o, |o| schedule(o, open))
}

fn pods_per_domain(o: &Observed) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for p in &o.pods {
        *n.entry(p.domain.clone().unwrap()).or_default() += 1;
    }
    n
}

#[test]
fn a_node_back_from_a_stop_gets_replicas_and_masters_again() {
    let mut o = fresh(3, 1);
    o.movable_before = Some(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
    // node-a stopped: every Pod went to node-b and node-c.
    converge_scheduled(&mut o, &["node-b", "node-c"]);
    assert_healthy(&o);
    assert_eq!(masters_per_domain(&o).values().max(), Some(&2));
    assert!(risk(&o).is_some());
    // node-a is back: replicas move there one at a time, then masters follow.
    let steps = converge_scheduled(&mut o, &["node-a", "node-b", "node-c"]);
    let moved: Vec<&Action> = steps.iter().filter(|s| matches!(s, Action::MovePod { .. })).collect();
    assert_eq!(moved.len(), 2, "{steps:?}");
    assert_healthy(&o);
    assert_eq!(pods_per_domain(&o).values().copied().collect::<Vec<_>>(), [2, 2, 2], "{:?}", pods_per_domain(&o));
    assert!(masters_per_domain(&o).values().all(|&n| n == 1), "{:?}", masters_per_domain(&o));
    assert_eq!(risk(&o), None);
    // Converged stays converged: nothing more moves.
    assert_eq!(plan(&o), Action::Converged);
}

#[test]
fn young_pods_and_clusters_with_their_own_scheduling_rules_are_not_moved() {
    let mut o = fresh(3, 1);
    o.movable_before = Some(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
    converge_scheduled(&mut o, &["node-b", "node-c"]);
    o.open_domains = ["node-a", "node-b", "node-c"].iter().map(|d| d.to_string()).collect();
    assert!(matches!(plan(&o), Action::MovePod { .. }));
    o.movable_before = Some(k8s_openapi::jiff::Timestamp::from_second(500).unwrap());
    assert_eq!(plan(&o), Action::Converged, "every Pod is younger than the wait");
    o.movable_before = Some(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
    o.open_domains.clear();
    assert_eq!(plan(&o), Action::Converged, "no open domains given: the spec schedules");
}
