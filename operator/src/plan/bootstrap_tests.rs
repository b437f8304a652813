//! Bootstrap planning walked through the simulation in `sim.rs`.

use super::sim::*;
use crate::plan::{Action, plan};
use crate::redis::topology::SlotRange;

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
