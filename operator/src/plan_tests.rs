//! Bootstrap planning walked through a small simulation of Redis: each
//! action's effect is applied to every node's view, and the plan is asked
//! again, as a reconciler restarted at that point would.

use std::collections::BTreeMap;

use crate::plan::{Action, Observed, PodFact, RedisFact, plan};
use crate::redis::topology::{ClusterNode, SLOTS, SlotRange, expand};

fn node(pod: &str) -> ClusterNode {
    ClusterNode {
        id: format!("id-{pod}"),
        ip: format!("ip-{pod}"),
        myself: false,
        master: true,
        master_id: None,
        flags: vec!["master".into()],
        connected: true,
        slots: vec![],
        open_slots: vec![],
    }
}

/// Fresh nodes: each knows only itself.
fn fresh(shards: usize, replicas: usize) -> Observed {
    let mut pods = Vec::new();
    let mut redis = BTreeMap::new();
    for shard in 0..shards {
        for ordinal in 0..=replicas {
            let name = format!("c-shard-{shard}-{ordinal}");
            let mut me = node(&name);
            me.myself = true;
            redis.insert(
                name.clone(),
                RedisFact {
                    nodes: vec![me],
                    cluster_state: "fail".into(),
                    version: "7.0.15".into(),
                    replication_offset: None,
                },
            );
            pods.push(PodFact { ip: Some(format!("ip-{name}")), name, shard, ordinal, node_name: None });
        }
    }
    Observed { shards, replicas_per_master: replicas, pods, redis }
}

/// The cluster's true state as one list of nodes, from the union of views.
fn truth(o: &Observed) -> Vec<ClusterNode> {
    o.redis.values().filter_map(|f| f.myself().cloned()).collect()
}

/// Every node learns the full, current membership (MEET and gossip finished).
fn gossip(o: &mut Observed) {
    let everyone = truth(o);
    for (pod, fact) in o.redis.iter_mut() {
        fact.nodes = everyone
            .iter()
            .cloned()
            .map(|mut n| {
                n.myself = n.id == format!("id-{pod}");
                n
            })
            .collect();
    }
    sync(o);
}

/// Nodes that know each other see each other's current state; nobody learns
/// of a new node. `cluster_state` is ok where a node's view covers every slot.
fn sync(o: &mut Observed) {
    let everyone = truth(o);
    for fact in o.redis.values_mut() {
        for n in &mut fact.nodes {
            let current = everyone.iter().find(|t| t.id == n.id).unwrap();
            *n = ClusterNode { myself: n.myself, ..current.clone() };
        }
        let covered: usize = fact.nodes.iter().map(|n| expand(&n.slots).len()).sum();
        fact.cluster_state = if covered == SLOTS as usize { "ok".into() } else { "fail".into() };
    }
}

fn apply(o: &mut Observed, action: &Action) {
    match action {
        Action::Meet { .. } => gossip(o),
        Action::AddSlots { pod, ranges, .. } => {
            let me = o.redis.get_mut(pod).unwrap().nodes.iter_mut().find(|n| n.myself).unwrap();
            me.slots.extend(ranges.iter().copied());
            sync(o);
        }
        Action::Replicate { pod, master_id, .. } => {
            let me = o.redis.get_mut(pod).unwrap().nodes.iter_mut().find(|n| n.myself).unwrap();
            me.master = false;
            me.master_id = Some(master_id.clone());
            sync(o);
        }
        Action::Wait(_) | Action::Converged => {}
    }
}

fn converge(o: &mut Observed) -> Vec<Action> {
    let mut steps = Vec::new();
    for _ in 0..50 {
        let action = plan(o);
        if action == Action::Converged {
            return steps;
        }
        assert!(!matches!(action, Action::Wait(_)), "stuck: {action:?}");
        apply(o, &action);
        steps.push(action);
    }
    panic!("no convergence in 50 steps: {steps:?}");
}

fn assert_healthy(o: &Observed) {
    let nodes = truth(o);
    let mut seen = std::collections::BTreeSet::new();
    for n in &nodes {
        for s in expand(&n.slots) {
            assert!(seen.insert(s), "slot {s} assigned twice");
        }
    }
    assert_eq!(seen.len(), SLOTS as usize);
    let masters = nodes.iter().filter(|n| n.master).count();
    assert_eq!(masters, o.shards);
    for n in nodes.iter().filter(|n| !n.master) {
        let master = nodes.iter().find(|m| Some(&m.id) == n.master_id.as_ref()).expect("replica of a known node");
        let shard_of = |id: &str| id.rsplit_once("-shard-").map(|(_, s)| s.split('-').next().unwrap().to_owned());
        assert_eq!(shard_of(&n.id), shard_of(&master.id), "replica {} follows its own shard's master", n.id);
    }
}

#[test]
fn fresh_nodes_wait_until_all_are_reachable() {
    let mut o = fresh(3, 1);
    o.redis.remove("c-shard-2-1");
    assert_eq!(plan(&o), Action::Wait("5 of 6 Redis nodes reachable".into()));
}

#[test]
fn bootstrap_assigns_slots_then_meets_then_replicates() {
    let mut o = fresh(3, 1);
    let steps = converge(&mut o);
    assert!(steps[..3].iter().all(|s| matches!(s, Action::AddSlots { .. })), "{steps:?}");
    assert!(matches!(steps[3], Action::Meet { ref targets, .. } if targets.len() == 5), "{:?}", steps[3]);
    assert!(steps[4..].iter().all(|s| matches!(s, Action::Replicate { .. })), "{steps:?}");
    assert_eq!(steps.len(), 7);
    assert_healthy(&o);
}

#[test]
fn waits_for_gossip_before_attaching_replicas() {
    let mut o = fresh(3, 1);
    let mut action = plan(&o);
    while matches!(action, Action::AddSlots { .. }) {
        apply(&mut o, &action);
        action = plan(&o);
    }
    let Action::Meet { via, .. } = action else { panic!("expected Meet, got {action:?}") };
    // Replicas are on the strangers' side: they have not heard of their masters.
    // The seed learned everyone, the others have not heard back yet.
    let everyone = truth(&o);
    let seed = o.redis.get_mut(&via).unwrap();
    seed.nodes = everyone
        .into_iter()
        .map(|mut n| {
            n.myself = n.id == format!("id-{via}");
            n
        })
        .collect();
    assert!(matches!(plan(&o), Action::Wait(ref m) if m.contains("handshake")), "{:?}", plan(&o));
}

#[test]
fn interrupted_slot_assignment_resumes_with_only_the_missing_slots() {
    let mut o = fresh(3, 1);
    let Action::AddSlots { pod, shard, ranges } = plan(&o) else { panic!("expected AddSlots") };
    assert_eq!(ranges, vec![SlotRange { start: 0, end: 5461 }]);
    // The operator died after the first half of the ADDSLOTS batches.
    apply(&mut o, &Action::AddSlots { pod: pod.clone(), shard, ranges: vec![SlotRange { start: 0, end: 2999 }] });
    assert_eq!(plan(&o), Action::AddSlots { pod, shard, ranges: vec![SlotRange { start: 3000, end: 5461 }] });
    converge(&mut o);
    assert_healthy(&o);
}

#[test]
fn a_restart_after_any_step_converges_to_one_healthy_cluster() {
    let mut reference = fresh(4, 2);
    let steps = converge(&mut reference);
    for stop_after in 0..steps.len() {
        let mut o = fresh(4, 2);
        for step in &steps[..stop_after] {
            apply(&mut o, step);
        }
        converge(&mut o); // a fresh plan from the state left behind
        assert_healthy(&o);
    }
}

#[test]
fn masters_found_by_slots_even_when_not_ordinal_zero() {
    let mut o = fresh(3, 1);
    converge(&mut o);
    // After a failover, ordinal 1 of shard 0 is the master with the slots.
    let before = truth(&o);
    let old = before.iter().find(|n| n.id == "id-c-shard-0-0").unwrap().clone();
    for fact in o.redis.values_mut() {
        for n in &mut fact.nodes {
            if n.id == "id-c-shard-0-1" {
                n.master = true;
                n.master_id = None;
                n.slots = old.slots.clone();
            } else if n.id == "id-c-shard-0-0" {
                n.master = false;
                n.master_id = Some("id-c-shard-0-1".into());
                n.slots.clear();
            }
        }
    }
    assert_eq!(plan(&o), Action::Converged);
}
