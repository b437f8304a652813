//! Diagnose and plan: from what was observed (Pods and each Redis node's view
//! of the cluster) to the one next step that brings the cluster closer to the
//! spec. Pure functions over data; the reconciler does the IO.
//!
//! Bootstrap order, each step idempotent and safe to repeat after a crash:
//! all Pods reachable → ADDSLOTS per shard master (its own even share, only
//! slots no node claims) → MEET every node into the seed's cluster → every
//! node knows every other → REPLICATE the other Pods of each shard. Shares are
//! disjoint by construction and every stranger joins the one seed's cluster,
//! so a restart at any point cannot form a second cluster or assign a slot twice.

use std::collections::{BTreeMap, BTreeSet};

use crate::redis::topology::{ClusterNode, SLOTS, SlotRange, expand, shard_range, to_ranges};

/// A Pod of the cluster as Kubernetes reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFact {
    pub name: String,
    pub shard: usize,
    pub ordinal: usize,
    pub ip: Option<String>,
    /// The Kubernetes Node it runs on.
    pub node_name: Option<String>,
}

/// What one Redis node said about itself and the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisFact {
    /// `CLUSTER NODES` from this node; exactly one entry has `myself`.
    pub nodes: Vec<ClusterNode>,
    /// `cluster_state` from `CLUSTER INFO`.
    pub cluster_state: String,
    pub version: String,
    pub replication_offset: Option<i64>,
}

impl RedisFact {
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.myself)
    }

    /// Ids of the nodes it knows and has finished the handshake with.
    fn known_ids(&self) -> BTreeSet<&str> {
        self.nodes.iter().filter(|n| !n.in_handshake()).map(|n| n.id.as_str()).collect()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub shards: usize,
    pub replicas_per_master: usize,
    pub pods: Vec<PodFact>,
    /// Facts per Pod name; a Pod missing here could not be asked.
    pub redis: BTreeMap<String, RedisFact>,
}

/// The next step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing to do but wait; the reason goes to status.
    Wait(String),
    /// Ask the seed node to meet the given addresses.
    Meet { via: String, targets: Vec<String> },
    /// Assign slot ranges to a shard's master.
    AddSlots { pod: String, shard: usize, ranges: Vec<SlotRange> },
    /// Make a node replicate its shard's master.
    Replicate { pod: String, master_pod: String, master_id: String },
    /// The cluster matches the spec.
    Converged,
}

impl Action {
    /// The Pods this action sends commands to.
    pub fn pods(&self) -> Vec<&str> {
        match self {
            Action::Meet { via, .. } => vec![via],
            Action::AddSlots { pod, .. } | Action::Replicate { pod, .. } => vec![pod],
            Action::Wait(_) | Action::Converged => vec![],
        }
    }
}

impl Observed {
    fn desired_pods(&self) -> impl Iterator<Item = &PodFact> {
        self.pods.iter().filter(|p| p.shard < self.shards && p.ordinal <= self.replicas_per_master)
    }

    fn id_of(&self, pod: &str) -> Option<&str> {
        self.redis.get(pod)?.myself().map(|n| n.id.as_str())
    }
}

pub fn plan(observed: &Observed) -> Action {
    let expected = observed.shards * (observed.replicas_per_master + 1);
    let desired: Vec<&PodFact> = observed.desired_pods().collect();
    let reachable: Vec<&PodFact> = desired.iter().copied().filter(|p| observed.redis.contains_key(&p.name)).collect();
    if desired.len() < expected || reachable.len() < expected {
        return Action::Wait(format!("{} of {expected} Redis nodes reachable", reachable.len()));
    }

    // Slots first, while fresh masters are still alone: a master that learns
    // of other slot owners before owning all of its own counts itself in a
    // minority and waits cluster-node-timeout before reporting ok (Redis's
    // rejoin delay), which is what `redis-cli --cluster create` avoids the same way.
    let masters = shard_masters(observed, &reachable);
    // A slot counts as owned if any node says so, its owner first: gossip of a
    // fresh assignment may not have reached the seed yet.
    let owned: BTreeSet<u16> =
        observed.redis.values().flat_map(|f| f.nodes.iter()).flat_map(|n| expand(&n.slots)).collect();
    for (shard, master) in masters.iter().enumerate() {
        let target = shard_range(shard, observed.shards);
        let missing: BTreeSet<u16> = (target.start..=target.end).filter(|s| !owned.contains(s)).collect();
        if !missing.is_empty() {
            return Action::AddSlots { pod: master.name.clone(), shard, ranges: to_ranges(&missing) };
        }
    }

    // Seed: the node that already knows most of the cluster (owning slots wins ties).
    let seed = reachable
        .iter()
        .max_by_key(|p| {
            let fact = &observed.redis[&p.name];
            let owns = fact.myself().is_some_and(|n| !n.slots.is_empty());
            (fact.known_ids().len(), owns, std::cmp::Reverse(p.name.clone()))
        })
        .expect("at least one reachable pod");
    let seed_fact = &observed.redis[&seed.name];
    let seed_known: BTreeSet<&str> = seed_fact.nodes.iter().map(|n| n.id.as_str()).collect();
    let strangers: Vec<String> = reachable
        .iter()
        .filter(|p| observed.id_of(&p.name).is_some_and(|id| !seed_known.contains(id)))
        .filter_map(|p| p.ip.clone())
        .collect();
    if !strangers.is_empty() {
        return Action::Meet { via: seed.name.clone(), targets: strangers };
    }
    let all_ids: BTreeSet<&str> = reachable.iter().filter_map(|p| observed.id_of(&p.name)).collect();

    for (shard, master) in masters.iter().enumerate() {
        let master_id = observed.id_of(&master.name).expect("reachable").to_owned();
        for pod in reachable.iter().filter(|p| p.shard == shard && p.name != master.name) {
            let fact = &observed.redis[&pod.name];
            let me = fact.myself().expect("reachable");
            if me.master_id.as_deref() == Some(master_id.as_str()) {
                continue;
            }
            // REPLICATE needs only the master to be known, not the whole cluster.
            if !fact.known_ids().contains(master_id.as_str()) {
                return Action::Wait(format!(
                    "cluster handshake in progress: {} does not know its master yet",
                    pod.name
                ));
            }
            return Action::Replicate { pod: pod.name.clone(), master_pod: master.name.clone(), master_id };
        }
    }

    let still_gossiping = reachable.iter().filter(|p| !all_ids.is_subset(&observed.redis[&p.name].known_ids())).count();
    if still_gossiping > 0 {
        return Action::Wait(format!("cluster handshake in progress on {still_gossiping} nodes"));
    }
    if owned.len() < SLOTS as usize {
        return Action::Wait(format!("{} of {SLOTS} slots assigned", owned.len()));
    }
    if let Some(p) = reachable.iter().find(|p| observed.redis[&p.name].cluster_state != "ok") {
        return Action::Wait(format!("{} reports cluster_state {}", p.name, observed.redis[&p.name].cluster_state));
    }
    Action::Converged
}

/// The master of each shard: the shard's node that owns slots, else one its
/// shard-mates replicate, else ordinal 0 (a fresh shard).
fn shard_masters<'a>(observed: &Observed, reachable: &[&'a PodFact]) -> Vec<&'a PodFact> {
    (0..observed.shards)
        .map(|shard| {
            let members: Vec<&PodFact> = reachable.iter().copied().filter(|p| p.shard == shard).collect();
            let myself = |p: &PodFact| observed.redis[&p.name].myself().cloned();
            if let Some(owner) = members.iter().find(|p| myself(p).is_some_and(|n| n.master && !n.slots.is_empty())) {
                return *owner;
            }
            let replicated: BTreeSet<String> = members.iter().filter_map(|p| myself(p)?.master_id).collect();
            if let Some(master) =
                members.iter().find(|p| observed.id_of(&p.name).is_some_and(|id| replicated.contains(id)))
            {
                return *master;
            }
            members.iter().min_by_key(|p| p.ordinal).copied().expect("every shard has pods")
        })
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
