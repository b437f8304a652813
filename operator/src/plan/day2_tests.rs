//! Day-2 planning through the simulation: scaling shards and replicas,
//! repairs of interrupted migrations, departed nodes, refusals.

use super::sim::*;
use crate::plan::{Action, MemoryFact, SLOTS_PER_SOURCE_PER_STEP, plan, targets};
use crate::redis::topology::Direction;

fn healthy(shards: usize, replicas: usize) -> crate::plan::Observed {
    let mut o = fresh(shards, replicas);
    converge(&mut o);
    assert_healthy(&o);
    o
}

fn counts_match_targets(o: &crate::plan::Observed) {
    let counts: Vec<usize> = slot_counts(o).into_values().collect();
    assert_eq!(counts, targets(o.shards));
}

#[test]
fn scale_out_adds_shards_then_moves_slots_in_batches_until_balanced() {
    let mut o = healthy(3, 1);
    o.shards = 5;
    let steps = converge(&mut o);
    assert_healthy(&o);
    counts_match_targets(&o);
    let moves: Vec<&Action> = steps.iter().filter(|s| matches!(s, Action::MoveSlots { .. })).collect();
    assert!(moves.len() > 1, "batched, not one giant step");
    for step in &moves {
        let Action::MoveSlots { batches, repair, .. } = step else { unreachable!() };
        assert!(!repair);
        let mut given: std::collections::BTreeMap<&str, usize> = Default::default();
        for b in batches {
            *given.entry(b.source.pod.as_str()).or_default() += b.slots.len();
        }
        assert!(given.values().all(|&n| n <= SLOTS_PER_SOURCE_PER_STEP), "{given:?}");
        assert!(batches.iter().all(|b| b.target.pod.starts_with("c-shard-3") || b.target.pod.starts_with("c-shard-4")));
    }
    // New masters are attached and replicated before any slot moves to them.
    let first_move = steps.iter().position(|s| matches!(s, Action::MoveSlots { .. })).unwrap();
    assert!(steps[..first_move].iter().any(|s| matches!(s, Action::Meet { .. })));
    assert!(steps[first_move..].iter().all(|s| matches!(s, Action::MoveSlots { .. })), "{steps:?}");
}

#[test]
fn scale_in_drains_before_removing_and_forgets_the_departed() {
    let mut o = healthy(5, 1);
    o.shards = 3;
    let steps = converge(&mut o);
    assert_healthy(&o);
    counts_match_targets(&o);
    let last_move = steps.iter().rposition(|s| matches!(s, Action::MoveSlots { .. })).unwrap();
    let first_removal = steps.iter().position(|s| matches!(s, Action::RemoveShard { .. })).unwrap();
    assert!(last_move < first_removal, "drain first, then remove: {steps:?}");
    assert!(steps.iter().any(|s| matches!(s, Action::Forget { .. })));
    for step in &steps {
        if let Action::MoveSlots { batches, .. } = step {
            assert!(
                batches.iter().all(|b| b.source.pod.starts_with("c-shard-3") || b.source.pod.starts_with("c-shard-4"))
            );
        }
    }
}

#[test]
fn scale_in_is_refused_when_the_data_does_not_fit() {
    let mut o = healthy(5, 0);
    for fact in o.redis.values_mut() {
        fact.memory = MemoryFact { used: 90 << 20, dataset: 80 << 20, maxmemory: 100 << 20 };
    }
    o.shards = 3;
    let action = plan(&o);
    let Action::Refused(reason) = action else { panic!("expected a refusal, got {action:?}") };
    assert!(reason.contains("spec.masters back to 5") && reason.contains("maxmemory"), "{reason}");
    // Room enough: the same scale-in goes ahead.
    for fact in o.redis.values_mut() {
        fact.memory.maxmemory = 1 << 30;
    }
    assert!(matches!(plan(&o), Action::MoveSlots { .. }));
}

#[test]
fn an_interrupted_migration_is_finished_before_anything_else() {
    let mut o = healthy(3, 1);
    // Died after IMPORTING/MIGRATING on slot 100 (owned by shard 0), and
    // after IMPORTING only on slot 101.
    let (source, target) = ("c-shard-0-0", "c-shard-1-0");
    myself_mut(&mut o, source).open_slots.push(open_mark(100, Direction::Migrating, &format!("id-{target}")));
    myself_mut(&mut o, target).open_slots.push(open_mark(100, Direction::Importing, &format!("id-{source}")));
    myself_mut(&mut o, target).open_slots.push(open_mark(101, Direction::Importing, &format!("id-{source}")));
    o.shards = 4; // a pending scale-out must wait for the repair
    add_fresh_pod(&mut o, 3, 0);
    add_fresh_pod(&mut o, 3, 1);
    let mut action = plan(&o);
    if matches!(action, Action::Meet { .. }) {
        apply(&mut o, &action);
        action = plan(&o);
    }
    let Action::MoveSlots { batches, repair: true, .. } = &action else { panic!("expected a repair, got {action:?}") };
    assert_eq!(batches.len(), 1);
    let transfers = &batches[0].slots;
    assert_eq!((transfers[0].slot, transfers[0].open_target, transfers[0].open_source), (100, false, false));
    assert_eq!((transfers[1].slot, transfers[1].open_target, transfers[1].open_source), (101, false, true));
    apply(&mut o, &action);
    converge(&mut o);
    assert_healthy(&o);
}

#[test]
fn a_migration_interrupted_after_the_targets_claim_is_handed_over_without_reopening() {
    let mut o = healthy(3, 1);
    // Died between the target's claim of slot 100 and the source's SETSLOT
    // NODE: the target owns it, the source still marks it migrating.
    let (source, target) = ("c-shard-0-0", "c-shard-1-0");
    myself_mut(&mut o, source).open_slots.push(open_mark(100, Direction::Migrating, &format!("id-{target}")));
    myself_mut(&mut o, target).slots.push(crate::redis::topology::SlotRange { start: 100, end: 100 });
    let action = plan(&o);
    let Action::MoveSlots { batches, repair: true, .. } = &action else { panic!("expected a repair, got {action:?}") };
    let t = &batches[0].slots[0];
    // The target's epoch was bumped by that claim: no slot of the batch
    // needs to be claimed while importing again.
    assert_eq!((t.slot, t.open_target, t.open_source, t.target_owns), (100, false, false, true));
}

#[test]
fn a_mark_whose_peer_is_gone_is_cleared() {
    let mut o = healthy(3, 1);
    myself_mut(&mut o, "c-shard-0-0").open_slots.push(open_mark(7, Direction::Migrating, "id-long-gone"));
    let action = plan(&o);
    assert!(
        matches!(&action, Action::Stabilize { slots_by_pod } if slots_by_pod["c-shard-0-0"] == vec![7]),
        "{action:?}"
    );
}

#[test]
fn replicas_scale_up_down_and_up_without_moving_slots() {
    let mut o = healthy(3, 1);
    let before = slot_counts(&o);
    for replicas in [2, 0, 1] {
        o.replicas_per_master = replicas;
        let steps = converge(&mut o);
        assert_healthy(&o);
        assert!(!steps.iter().any(|s| matches!(s, Action::MoveSlots { .. } | Action::AddSlots { .. })), "{steps:?}");
        assert_eq!(slot_counts(&o), before);
    }
}

#[test]
fn shrinking_replicas_fails_over_a_master_on_a_removed_ordinal_first() {
    let mut o = healthy(3, 1);
    // Shard 0's master is ordinal 1 after an earlier failover.
    apply(
        &mut o,
        &Action::Failover {
            pod: "c-shard-0-1".into(),
            shard: 0,
            reason: "test".into(),
            force: false,
            operation: None,
            spread: false,
        },
    );
    o.replicas_per_master = 0;
    assert_eq!(o.shard_sizes()[&0], 2, "shard 0 keeps its master's Pod for now");
    assert_eq!(o.shard_sizes()[&1], 1);
    kubernetes(&mut o);
    let steps = converge(&mut o);
    let failover =
        steps.iter().position(|s| matches!(s, Action::Failover { pod, .. } if pod == "c-shard-0-0")).expect("failover");
    let forgotten = steps
        .iter()
        .position(|s| matches!(s, Action::Forget { ids_by_pod } if ids_by_pod.values().flatten().any(|id| id == "id-c-shard-0-1")))
        .expect("the old master's node is forgotten once its Pod is gone");
    assert!(failover < forgotten, "the staying replica is promoted before its master's Pod goes: {steps:?}");
    assert_healthy(&o);
}

#[test]
fn a_leaving_pod_that_never_answered_goes_but_one_seen_owning_slots_stays() {
    let mut o = healthy(3, 1);
    // A temporary replica on an image that cannot start: never answered.
    let mut stray = o.pods.iter().find(|p| p.name == "c-shard-0-1").unwrap().clone();
    (stray.name, stray.ordinal, stray.ip) = ("c-shard-0-2".into(), 2, Some("10.99.0.1".into()));
    o.pods.push(stray);
    assert_eq!(o.shard_sizes()[&0], 2, "it holds nothing only it has");
    // A leaving Pod that stops answering while a node that answers still
    // sees it owning slots is kept.
    let mut o = healthy(3, 1);
    o.replicas_per_master = 0;
    o.redis.remove("c-shard-0-1");
    let ip = o.pods.iter().find(|p| p.name == "c-shard-0-1").unwrap().ip.clone().unwrap();
    let slots = o.redis["c-shard-0-0"].myself().unwrap().slots.clone();
    let seen = o.redis.get_mut("c-shard-1-0").unwrap().nodes.iter_mut().find(|n| n.ip == ip).unwrap();
    (seen.master, seen.slots) = (true, slots);
    assert_eq!(o.shard_sizes()[&0], 2, "never guess about the data");
}

#[test]
fn replicas_of_an_unreachable_master_wait_for_redis_to_fail_over() {
    let mut o = healthy(3, 1);
    // The master Pod of shard 0 is recreated empty (ephemeral) before Redis promoted its replica.
    remove_pods(&mut o, &["c-shard-0-0".into()]);
    add_fresh_pod(&mut o, 0, 0);
    myself_mut(&mut o, "c-shard-0-0").id = "id-c-shard-0-0-new".into();
    let action = plan(&o);
    let stray = matches!(&action, Action::Replicate { pod, .. } if pod == "c-shard-0-1");
    assert!(!stray, "the replica holding the data must never follow the empty node: {action:?}");
    if let Action::Meet { .. } = action {
        apply(&mut o, &action);
    }
    assert!(matches!(plan(&o), Action::Wait(ref m) if m.contains("fail over")), "{:?}", plan(&o));
    // Redis promotes the replica; the empty node then follows it.
    let me = myself_mut(&mut o, "c-shard-0-1");
    me.master = true;
    me.master_id = None;
    me.slots = vec![range(0, 5461)];
    sync(&mut o);
    converge(&mut o);
    assert_healthy(&o);
}

#[test]
fn pods_recreated_with_new_addresses_are_met_again() {
    let mut o = healthy(3, 1);
    for pod in o.pods.iter_mut() {
        pod.ip = Some(format!("new-{}", pod.name));
    }
    for (name, fact) in o.redis.iter_mut() {
        for n in fact.nodes.iter_mut().filter(|n| n.myself) {
            n.ip = format!("new-{name}");
        }
    }
    let action = plan(&o);
    let Action::Meet { targets, .. } = &action else { panic!("expected Meet, got {action:?}") };
    assert_eq!(targets.len(), 5, "every node but the seed, at its new address");
}

#[test]
fn a_pod_on_a_lost_node_is_replaced_only_when_it_does_not_answer() {
    let mut o = healthy(3, 1);
    let victim = o.pods.iter_mut().find(|p| p.name == "c-shard-1-0").unwrap();
    victim.node_lost = true;
    victim.node_name = Some("node-2".into());
    assert!(!matches!(plan(&o), Action::DeletePod { .. }), "it still answers: the Node may be flapping");
    o.redis.remove("c-shard-1-0");
    let action = plan(&o);
    assert!(
        matches!(&action, Action::DeletePod { pod, reason } if pod == "c-shard-1-0" && reason.contains("node-2")),
        "{action:?}"
    );
    // On a healthy Node an unanswered Pod is waited for, not deleted.
    o.pods.iter_mut().find(|p| p.name == "c-shard-1-0").unwrap().node_lost = false;
    assert!(matches!(plan(&o), Action::Wait(_)), "{:?}", plan(&o));
}

#[test]
fn a_node_holding_an_old_address_is_told_the_new_one_and_nothing_converges_before() {
    let mut o = healthy(3, 1);
    // c-shard-2-1 came back with its peers' old addresses, marked failing.
    for n in o.redis.get_mut("c-shard-2-1").unwrap().nodes.iter_mut().filter(|n| n.id == "id-c-shard-0-0") {
        n.ip = "old-address".into();
        n.flags.push("fail?".into());
    }
    let action = plan(&o);
    assert_eq!(action, Action::Meet { via: "c-shard-2-1".into(), targets: vec!["ip-c-shard-0-0".into()] });
    // Address learnt, failure flag not yet cleared: still not converged.
    for n in o.redis.get_mut("c-shard-2-1").unwrap().nodes.iter_mut().filter(|n| n.id == "id-c-shard-0-0") {
        n.ip = "ip-c-shard-0-0".into();
    }
    assert!(matches!(plan(&o), Action::Wait(ref m) if m.contains("failing")), "{:?}", plan(&o));
}

/// Every slot 100 bytes; 24 slots of shard 0 hold 40,000 each.
fn skewed_weights() -> std::collections::BTreeMap<u16, u64> {
    let mut weights: std::collections::BTreeMap<u16, u64> = (0..16384).map(|s| (s, 100)).collect();
    for i in 0..24 {
        weights.insert(i * 200, 40_000);
    }
    weights
}

fn bytes_per_master(o: &crate::plan::Observed, weights: &std::collections::BTreeMap<u16, u64>) -> Vec<u64> {
    (0..o.shards)
        .map(|shard| {
            let master = o
                .redis
                .values()
                .filter_map(|f| f.myself())
                .find(|n| n.master && !n.slots.is_empty() && n.id.starts_with(&format!("id-c-shard-{shard}-")));
            master.map_or(0, |n| crate::redis::topology::expand(&n.slots).iter().map(|s| weights[s]).sum())
        })
        .collect()
}

fn within(bytes: &[u64], percent: f64) -> bool {
    let mean = bytes.iter().sum::<u64>() as f64 / bytes.len() as f64;
    bytes.iter().all(|&b| (b as f64 - mean).abs() <= mean * percent / 100.0)
}

#[test]
fn scale_out_by_memory_plans_once_then_follows_the_plan_to_even_bytes() {
    let weights = skewed_weights();
    set_weights(weights.clone());
    let mut o = healthy(3, 1);
    o.balance.by = crate::plan::BalanceBy::Memory;
    o.balance.tolerance_percent = 10;
    assert!(!within(&bytes_per_master(&o, &weights), 10.0), "the fixture starts skewed");
    o.shards = 4;
    let steps = converge(&mut o);
    assert_healthy(&o);
    let plans = steps.iter().filter(|s| matches!(s, Action::PlanBalance { .. })).count();
    assert_eq!(plans, 1, "one plan, followed to the end: {steps:?}");
    let last = steps.iter().rposition(|s| matches!(s, Action::MoveSlots { .. })).unwrap();
    assert!(matches!(steps[last + 1], Action::FinishBalance { .. }), "{:?}", &steps[last..]);
    let bytes = bytes_per_master(&o, &weights);
    assert!(within(&bytes, 10.0), "{bytes:?}");
    // Not slot counts: balanced by memory, the counts differ by far more than 1%.
    let counts: Vec<usize> = slot_counts(&o).into_values().collect();
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() > 100, "{counts:?}");
    // And stays so: no count balancing undoes it.
    assert_eq!(plan(&o), Action::Converged);
}

#[test]
fn a_rebalance_operation_by_memory_evens_a_skewed_cluster_and_is_recorded() {
    let weights = skewed_weights();
    set_weights(weights.clone());
    let mut o = healthy(3, 0);
    o.balance.by = crate::plan::BalanceBy::Memory;
    o.balance.tolerance_percent = 10;
    // Balanced by slots, so nothing happens until asked.
    assert_eq!(plan(&o), Action::Converged);
    o.balance.operation = Some("even-out".into());
    let Action::PlanBalance { operation, .. } = plan(&o) else { panic!("expected a plan") };
    assert_eq!(operation.as_deref(), Some("even-out"));
    let steps = converge(&mut o);
    let finish = steps.iter().find_map(|s| match s {
        Action::FinishBalance { operation, summary, .. } => Some((operation.clone(), summary.clone())),
        _ => None,
    });
    let (operation, summary) = finish.expect("finished");
    assert_eq!(operation.as_deref(), Some("even-out"));
    assert!(summary.contains("data per master") && summary.contains("planned"), "{summary}");
    assert!(within(&bytes_per_master(&o, &weights), 10.0));
}

#[test]
fn a_rebalance_operation_by_slots_reaches_the_exact_share() {
    set_weights(Default::default());
    let mut o = healthy(3, 0);
    // 30 slots off: within the 1% that scaling lets be.
    let (from, to) = ("c-shard-0-0", "c-shard-1-0");
    let to_id = format!("id-{to}");
    for slot in 5400..5430u16 {
        let batch = crate::plan::Batch {
            source: crate::plan::NodeRef { pod: from.into(), id: format!("id-{from}"), ip: String::new() },
            target: crate::plan::NodeRef { pod: to.into(), id: to_id.clone(), ip: String::new() },
            slots: vec![crate::redis::migrate::SlotTransfer {
                slot,
                open_target: true,
                open_source: true,
                target_owns: false,
            }],
        };
        apply(&mut o, &Action::MoveSlots { batches: vec![batch], others: vec![], remaining: 0, repair: false });
    }
    assert_eq!(plan(&o), Action::Converged, "within 1%: scaling leaves it");
    o.balance.operation = Some("exact".into());
    converge(&mut o);
    counts_match_targets(&o);
    assert!(o.balance.operation.is_none() && o.balance.plan.is_none());
}

#[test]
fn a_plan_for_another_shape_is_replaced() {
    set_weights(skewed_weights());
    let mut o = healthy(3, 0);
    o.balance.by = crate::plan::BalanceBy::Memory;
    o.balance.tolerance_percent = 10;
    o.shards = 4;
    kubernetes(&mut o);
    let mut steps = Vec::new();
    while !matches!(steps.last(), Some(Action::PlanBalance { .. })) {
        kubernetes(&mut o);
        let action = plan(&o);
        apply(&mut o, &action);
        steps.push(action);
        assert!(steps.len() < 50, "{steps:?}");
    }
    // The user scales to 5 before the plan for 4 has run.
    o.shards = 5;
    let steps = converge(&mut o);
    let Some(Action::PlanBalance { staying, .. }) = steps.iter().find(|s| matches!(s, Action::PlanBalance { .. }))
    else {
        panic!("re-planned: {steps:?}")
    };
    assert_eq!(*staying, 5);
    assert_healthy(&o);
}

/// The master of `shard` now.
fn master_of(o: &crate::plan::Observed, shard: usize) -> String {
    o.pods
        .iter()
        .filter(|p| p.shard == shard)
        .find(|p| o.redis[&p.name].myself().is_some_and(|n| n.master))
        .map(|p| p.name.clone())
        .unwrap()
}

/// Promotes the other Pod of `shard` (one replica per master), as Redis or
/// an operator that has since lost its Lease might have.
fn fail_over(o: &mut crate::plan::Observed, shard: usize) {
    let master = master_of(o, shard);
    let replica = o.pods.iter().find(|p| p.shard == shard && p.name != master).unwrap().name.clone();
    let stray = o.redis[&master].stray_keys.clone();
    let failover = Action::Failover {
        pod: replica.clone(),
        shard,
        reason: "test".into(),
        force: false,
        operation: None,
        spread: false,
    };
    apply(o, &failover);
    // It replicated everything its master held, keys of slots it did not own too.
    o.redis.get_mut(&replica).unwrap().stray_keys = stray;
}

/// A move's first half as a leader that lost its Lease left it: both ends
/// marked, and some keys already on the target.
fn half_apply(o: &mut crate::plan::Observed, action: &Action) -> Vec<(usize, usize)> {
    let Action::MoveSlots { batches, .. } = action else { panic!("{action:?}") };
    let shard_of = |o: &crate::plan::Observed, pod: &str| o.pods.iter().find(|p| p.name == pod).unwrap().shard;
    let mut pairs = Vec::new();
    for b in batches {
        for s in &b.slots {
            myself_mut(o, &b.source.pod).open_slots.push(open_mark(s.slot, Direction::Migrating, &b.target.id));
            myself_mut(o, &b.target.pod).open_slots.push(open_mark(s.slot, Direction::Importing, &b.source.id));
            o.redis.get_mut(&b.target.pod).unwrap().stray_keys.insert(s.slot, 3);
        }
        pairs.push((shard_of(o, &b.source.pod), shard_of(o, &b.target.pod)));
    }
    pairs
}

/// Every slot once, owned by a master; no master marks a slot open and none
/// holds keys of a slot it does not own. (Replicas may keep marks Redis
/// lets only masters clear.)
fn assert_masters_settled(o: &crate::plan::Observed) {
    let mut seen = std::collections::BTreeSet::new();
    for fact in o.redis.values() {
        let me = fact.myself().unwrap();
        if me.master {
            assert!(me.open_slots.is_empty(), "{} marks {:?}", me.id, me.open_slots);
            assert!(fact.stray_keys.is_empty(), "{} holds keys of slots it does not own: {:?}", me.id, fact.stray_keys);
            for s in crate::redis::topology::expand(&me.slots) {
                assert!(seen.insert(s), "slot {s} twice");
            }
        }
    }
    assert_eq!(seen.len(), crate::redis::topology::SLOTS as usize);
}

#[test]
fn a_move_whose_masters_both_failed_over_is_finished_between_the_new_masters() {
    let mut o = healthy(4, 1);
    let (source, target) = (master_of(&o, 0), master_of(&o, 3));
    let slot = o.redis[&source].myself().unwrap().slots[0].start;
    let id = |pod: &str| format!("id-{pod}");
    myself_mut(&mut o, &source).open_slots.push(open_mark(slot, Direction::Migrating, &id(&target)));
    myself_mut(&mut o, &target).open_slots.push(open_mark(slot, Direction::Importing, &id(&source)));
    o.redis.get_mut(&target).unwrap().stray_keys.insert(slot, 41_309);
    fail_over(&mut o, 0);
    fail_over(&mut o, 3);
    let (new_source, new_target) = (master_of(&o, 0), master_of(&o, 3));
    assert!(new_source != source && new_target != target);
    // What Redis shows now: the marks on replicas, the keys on a master that does not own the slot.
    let action = plan(&o);
    let Action::MoveSlots { batches, repair: true, .. } = &action else { panic!("expected a repair, got {action:?}") };
    assert_eq!(
        (batches[0].source.pod.as_str(), batches[0].target.pod.as_str()),
        (new_source.as_str(), new_target.as_str())
    );
    let t = &batches[0].slots[0];
    assert_eq!((t.slot, t.open_target, t.open_source, t.target_owns), (slot, true, true, false));
    let steps = converge(&mut o);
    assert_masters_settled(&o);
    assert!(o.redis[&new_target].myself().unwrap().slots.iter().any(|r| r.start <= slot && slot <= r.end));
    let repairs = steps.iter().filter(|s| matches!(s, Action::MoveSlots { repair: true, .. })).count();
    assert_eq!(repairs, 1, "the stale replica marks moved nothing more: {steps:?}");
}

#[test]
fn stale_marks_on_a_replica_move_nothing() {
    let mut o = healthy(3, 1);
    let replica = o.pods.iter().find(|p| p.shard == 0 && p.name != master_of(&o, 0)).unwrap().name.clone();
    let target = master_of(&o, 1);
    let slot = o.redis[&master_of(&o, 0)].myself().unwrap().slots[0].start;
    myself_mut(&mut o, &replica).open_slots.push(open_mark(slot, Direction::Migrating, &format!("id-{target}")));
    assert_eq!(plan(&o), Action::Converged, "its master's peer holds no key of the slot");
}

#[test]
fn a_role_change_between_any_two_steps_of_a_scale_out_still_converges_with_no_role_moved_while_open() {
    let reference = {
        let mut o = healthy(3, 1);
        o.shards = 4;
        converge(&mut o)
    };
    let moves = reference.iter().filter(|s| matches!(s, Action::MoveSlots { .. })).count();
    assert!(moves > 0);
    for interrupted in 0..moves {
        let mut o = healthy(3, 1);
        o.shards = 4;
        let mut seen = 0;
        for _ in 0..300 {
            kubernetes(&mut o);
            let action = plan(&o);
            if action == Action::Converged {
                break;
            }
            let open_on_masters = crate::plan::moves::slots_open(&o);
            assert!(
                !(open_on_masters && matches!(action, Action::Replicate { .. } | Action::Failover { .. })),
                "a role moved while a slot is open: {action:?}"
            );
            if matches!(action, Action::MoveSlots { repair: false, .. }) {
                if seen == interrupted {
                    // The leader dies half way; roles change before the next one plans.
                    for (from, to) in half_apply(&mut o, &action) {
                        fail_over(&mut o, from);
                        fail_over(&mut o, to);
                    }
                    seen += 1;
                    continue;
                }
                seen += 1;
            }
            apply(&mut o, &action);
        }
        assert_eq!(plan(&o), Action::Converged, "interrupted at move {interrupted}");
        assert_masters_settled(&o);
        counts_match_targets(&o);
    }
}
