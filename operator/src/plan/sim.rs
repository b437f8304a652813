//! A small simulation of Redis Cluster and of Kubernetes for planning tests:
//! each action's effect is applied to every node's view, Pods come and go as
//! the StatefulSets would make them, and the plan is asked again, as a
//! reconciler restarted at that point would.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::{Action, MemoryFact, Observed, PodFact, RedisFact, plan};
use crate::redis::topology::{ClusterNode, Direction, SLOTS, SlotRange, expand, to_ranges};

pub fn node(pod: &str) -> ClusterNode {
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

/// A fresh node that knows only itself.
pub fn add_fresh_pod(o: &mut Observed, shard: usize, ordinal: usize) {
    let name = format!("c-shard-{shard}-{ordinal}");
    let mut me = node(&name);
    me.myself = true;
    o.redis.insert(
        name.clone(),
        RedisFact {
            nodes: vec![me],
            cluster_state: "fail".into(),
            engine: slotkeeper_api::Engine::Redis,
            version: "7.0.15".into(),
            replication_offset: None,
            link_up: false,
            aof_rewriting: false,
            memory: MemoryFact { used: 2 << 20, dataset: 1 << 20, maxmemory: 0 },
            stats: Default::default(),
            stray_keys: BTreeMap::new(),
        },
    );
    o.pods.push(PodFact { ip: Some(format!("ip-{name}")), name, shard, ordinal, ..PodFact::default() });
}

/// Fresh nodes: each knows only itself.
pub fn fresh(shards: usize, replicas: usize) -> Observed {
    let mut o = Observed {
        shards,
        replicas_per_master: replicas,
        pods: Vec::new(),
        redis: BTreeMap::new(),
        surge: None,
        roles_held: false,
        user_placed: BTreeSet::new(),
        open_domains: BTreeSet::new(),
        movable_before: None,
        balance: Default::default(),
        users: Default::default(),
    };
    for shard in 0..shards {
        for ordinal in 0..=replicas {
            add_fresh_pod(&mut o, shard, ordinal);
        }
    }
    o
}

/// The cluster's true state as one list of nodes, from the union of views.
pub fn truth(o: &Observed) -> Vec<ClusterNode> {
    o.redis.values().filter_map(|f| f.myself().cloned()).collect()
}

pub fn myself_mut<'a>(o: &'a mut Observed, pod: &str) -> &'a mut ClusterNode {
    o.redis.get_mut(pod).unwrap().nodes.iter_mut().find(|n| n.myself).unwrap()
}

/// Every node learns the full, current membership (MEET and gossip finished).
pub fn gossip(o: &mut Observed) {
    let everyone = truth(o);
    for fact in o.redis.values_mut() {
        let me = fact.myself().unwrap().id.clone();
        let departed: Vec<ClusterNode> =
            fact.nodes.iter().filter(|n| !everyone.iter().any(|e| e.id == n.id)).cloned().collect();
        fact.nodes = everyone
            .iter()
            .cloned()
            .map(|mut n| {
                n.myself = n.id == me;
                n
            })
            .chain(departed)
            .collect();
    }
    sync(o);
}

/// Nodes that know each other see each other's current state; nobody learns
/// of a new node; nodes that are gone are marked failed. `cluster_state` is
/// ok where a node's view covers every slot.
pub fn sync(o: &mut Observed) {
    let everyone = truth(o);
    let claimed: BTreeSet<u16> = everyone.iter().flat_map(|n| expand(&n.slots)).collect();
    for fact in o.redis.values_mut() {
        for n in &mut fact.nodes {
            match everyone.iter().find(|t| t.id == n.id) {
                Some(current) => {
                    *n = ClusterNode { myself: n.myself, open_slots: n.open_slots.clone(), ..current.clone() }
                }
                None => {
                    // A departed master's slots pass to whoever claims them now.
                    n.slots = to_ranges(&expand(&n.slots).difference(&claimed).copied().collect());
                    if !n.flags.iter().any(|f| f == "fail") {
                        n.flags.push("fail".into());
                    }
                    n.connected = false;
                }
            }
        }
        let covered: usize = fact.nodes.iter().map(|n| expand(&n.slots).len()).sum();
        fact.cluster_state = if covered == SLOTS as usize { "ok".into() } else { "fail".into() };
        let me = fact.myself().unwrap().clone();
        fact.link_up = !me.master;
    }
}

/// What the StatefulSets do: staying shards get their Pods, extra ordinals go.
pub fn kubernetes(o: &mut Observed) {
    let sizes = o.shard_sizes();
    for (&shard, &size) in &sizes {
        for ordinal in 0..size {
            if !o.pods.iter().any(|p| p.shard == shard && p.ordinal == ordinal) {
                add_fresh_pod(o, shard, ordinal);
            }
        }
    }
    let removed: Vec<String> = o
        .pods
        .iter()
        .filter(|p| sizes.get(&p.shard).is_some_and(|&size| p.ordinal >= size))
        .map(|p| p.name.clone())
        .collect();
    remove_pods(o, &removed);
}

pub fn remove_pods(o: &mut Observed, names: &[String]) {
    o.pods.retain(|p| !names.contains(&p.name));
    for name in names {
        o.redis.remove(name);
    }
    sync(o);
}

fn move_slot(o: &mut Observed, slot: u16, from: &str, to: &str) {
    for (pod, change) in [(from, false), (to, true)] {
        let me = myself_mut(o, pod);
        let mut slots = expand(&me.slots);
        if change {
            slots.insert(slot);
        } else {
            slots.remove(&slot);
        }
        me.slots = to_ranges(&slots);
        me.open_slots.retain(|m| m.slot != slot);
    }
    // The target owns what it holds now.
    o.redis.get_mut(to).unwrap().stray_keys.remove(&slot);
}

thread_local! {
    static WEIGHTS: std::cell::RefCell<BTreeMap<u16, u64>> = const { std::cell::RefCell::new(BTreeMap::new()) };
}

/// The bytes each slot holds, as a memory rebalance reads them (this test's thread only).
pub fn set_weights(weights: BTreeMap<u16, u64>) {
    WEIGHTS.with(|w| *w.borrow_mut() = weights);
}

pub fn apply(o: &mut Observed, action: &Action) {
    match action {
        Action::Meet { .. } => gossip(o),
        Action::AddSlots { pod, ranges, .. } => {
            myself_mut(o, pod).slots.extend(ranges.iter().copied());
            sync(o);
        }
        Action::Replicate { pod, master_id, .. } => {
            let me = myself_mut(o, pod);
            me.master = false;
            me.master_id = Some(master_id.clone());
            sync(o);
        }
        Action::Forget { ids_by_pod } => {
            for (pod, ids) in ids_by_pod {
                o.redis.get_mut(pod).unwrap().nodes.retain(|n| !ids.contains(&n.id));
            }
        }
        Action::Failover { pod, .. } => {
            let master_id = myself_mut(o, pod).master_id.clone().unwrap();
            let master_pod = o.pods.iter().find(|p| format!("id-{}", p.name) == master_id).unwrap().name.clone();
            let slots = std::mem::take(&mut myself_mut(o, &master_pod).slots);
            let me = myself_mut(o, pod);
            (me.master, me.master_id, me.slots) = (true, None, slots);
            let new_id = me.id.clone();
            let followers: Vec<String> = truth(o)
                .iter()
                .filter(|n| n.master_id.as_deref() == Some(master_id.as_str()) || n.id == master_id)
                .map(|n| n.id.trim_start_matches("id-").to_owned())
                .collect();
            for f in followers {
                let n = myself_mut(o, &f);
                (n.master, n.master_id) = (false, Some(new_id.clone()));
            }
            sync(o);
        }
        Action::Stabilize { slots_by_pod } => {
            for (pod, slots) in slots_by_pod {
                myself_mut(o, pod).open_slots.retain(|m| !slots.contains(&m.slot));
            }
        }
        Action::MoveSlots { batches, .. } => {
            for b in batches {
                for s in &b.slots {
                    move_slot(o, s.slot, &b.source.pod, &b.target.pod);
                }
                // Redis's replica migration: a master that gave away its last
                // slot, and its replicas, follow the master that took it.
                if myself_mut(o, &b.source.pod).slots.is_empty() {
                    let (source_id, target_id) = (b.source.id.clone(), b.target.id.clone());
                    for name in o.redis.keys().cloned().collect::<Vec<_>>() {
                        let n = myself_mut(o, &name);
                        if n.id == source_id || n.master_id.as_deref() == Some(source_id.as_str()) {
                            (n.master, n.master_id) = (false, Some(target_id.clone()));
                        }
                    }
                }
            }
            sync(o);
        }
        Action::DeletePod { pod, .. } | Action::RecreatePod { pod, .. } => remove_pods(o, std::slice::from_ref(pod)),
        // A moved replica keeps its volume and comes back as the same node;
        // only where it runs changes (the scheduler places it again).
        Action::MovePod { pod, .. } => o.pods.iter_mut().find(|p| &p.name == pod).unwrap().domain = None,
        Action::RemoveShard { shard } => {
            let names: Vec<String> = o.pods.iter().filter(|p| p.shard == *shard).map(|p| p.name.clone()).collect();
            remove_pods(o, &names);
        }
        // As the controller does: the plan is made from each master's slots
        // (and bytes per slot, [`set_weights`]) and checkpointed.
        Action::PlanBalance { by, tolerance_percent, operation, staying, owned, .. } => {
            let weights = WEIGHTS.with(|w| w.borrow().clone());
            let (plan, _) =
                crate::plan::moves::make_plan(*by, *tolerance_percent, operation.clone(), *staying, owned, &weights);
            o.balance.plan = Some(crate::plan::PlanInProgress::of(&plan).unwrap());
        }
        Action::FinishBalance { operation, .. } => {
            o.balance.plan = None;
            if o.balance.operation == *operation {
                o.balance.operation = None;
            }
        }
        // As the report does: status records the revision applied.
        Action::ApplyUsers { .. } => o.users.pending = None,
        Action::Wait(_) | Action::Refused(_) | Action::Converged => {}
    }
}

/// Plans and applies until converged; Kubernetes acts between steps, and a
/// wait for departed nodes to be failed passes (the simulation fails them).
pub fn converge(o: &mut Observed) -> Vec<Action> {
    converge_with(o, |_| {})
}

/// [`converge`], with `scheduler` placing Pods after Kubernetes made them.
pub fn converge_with(o: &mut Observed, mut scheduler: impl FnMut(&mut Observed)) -> Vec<Action> {
    let mut steps = Vec::new();
    for _ in 0..300 {
        kubernetes(o);
        scheduler(o);
        let action = plan(o);
        if action == Action::Converged {
            return steps;
        }
        assert!(!matches!(action, Action::Wait(_) | Action::Refused(_)), "stuck: {action:?} after {steps:?}");
        apply(o, &action);
        steps.push(action);
    }
    panic!("no convergence in 300 steps: {steps:?}");
}

/// One cluster, every slot once, one master per staying shard, replicas of
/// their own shard's master, nothing left open.
pub fn assert_healthy(o: &Observed) {
    let nodes = truth(o);
    let mut seen = BTreeSet::new();
    for n in &nodes {
        for s in expand(&n.slots) {
            assert!(seen.insert(s), "slot {s} assigned twice");
        }
        assert!(n.open_slots.is_empty(), "{} has open slots", n.id);
    }
    assert_eq!(seen.len(), SLOTS as usize);
    let masters = nodes.iter().filter(|n| n.master).count();
    assert_eq!(masters, o.shards);
    assert_eq!(nodes.len(), o.shards * (o.replicas_per_master + 1));
    for n in nodes.iter().filter(|n| !n.master) {
        let master = nodes.iter().find(|m| Some(&m.id) == n.master_id.as_ref()).expect("replica of a known node");
        let shard_of = |id: &str| id.rsplit_once("-shard-").map(|(_, s)| s.split('-').next().unwrap().to_owned());
        assert_eq!(shard_of(&n.id), shard_of(&master.id), "replica {} follows its own shard's master", n.id);
    }
    for fact in o.redis.values() {
        assert_eq!(fact.nodes.len(), nodes.len(), "every node knows exactly the members, departed ones forgotten");
    }
}

/// Slot counts of the masters, by shard.
pub fn slot_counts(o: &Observed) -> BTreeMap<usize, usize> {
    let mut counts = BTreeMap::new();
    for p in &o.pods {
        let me = o.redis[&p.name].myself().unwrap();
        if me.master {
            counts.insert(p.shard, expand(&me.slots).len());
        }
    }
    counts
}

pub fn open_mark(slot: u16, direction: Direction, peer: &str) -> crate::redis::topology::OpenSlot {
    crate::redis::topology::OpenSlot { slot, direction, peer: peer.into() }
}

pub fn range(start: u16, end: u16) -> SlotRange {
    SlotRange { start, end }
}
