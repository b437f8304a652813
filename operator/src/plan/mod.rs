//! Diagnose and plan: from what was observed (Pods and each Redis node's view
//! of the cluster) to the one next step that brings the cluster closer to the
//! spec. Pure functions over data; the reconciler does the IO. The reason a
//! reconcile was triggered never matters: the same observation always yields
//! the same step, so a restart at any point resumes where it stopped.
//!
//! Order, each step idempotent and safe to repeat after a crash:
//! 1. every member Pod reachable (members: the kept Pods of staying shards,
//!    and all Pods of leaving shards until they are drained);
//! 2. ADDSLOTS for slots nobody owns (bootstrap: each shard master its even
//!    share, before MEET, so fresh masters skip Redis's rejoin delay);
//! 3. MEET every node the seed does not know, or knows at an old address
//!    (all Pods recreated with new IPs re-form this way);
//! 4. finish any slot left importing/migrating, before anything else moves;
//! 5. REPLICATE: each shard's other Pods follow its master (never while a
//!    replica still follows an unreachable master: Redis must fail over first);
//! 6. wait for gossip; FORGET ids of nodes that are gone;
//! 7. fail over a shard whose master sits on a Pod about to be removed;
//! 8. move slots until balanced (leaving shards drained first), refused when
//!    the staying masters' maxmemory cannot hold the data;
//! 9. remove drained leaving shards; then converged.

pub mod intents;
pub mod moves;
pub mod rollout;

use std::collections::{BTreeMap, BTreeSet};

use crate::redis::migrate::SlotTransfer;
use crate::redis::topology::{ClusterNode, SLOTS, SlotMap, SlotRange, shard_range, to_ranges};
pub use slotkeeper_api::balance::targets;
pub use slotkeeper_api::capacity::MemoryFact;

/// A Pod of the cluster as Kubernetes reports it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFact {
    pub name: String,
    pub shard: usize,
    pub ordinal: usize,
    pub ip: Option<String>,
    /// The Kubernetes Node it runs on.
    pub node_name: Option<String>,
    /// That Node is not Ready (the node controller gave up on it): the Pod
    /// will not come back by itself.
    pub node_lost: bool,
    /// The Redis container's image (a rollout recreates Pods onto a new one).
    pub image: Option<String>,
    /// The Redis container's restarts since the Pod was created.
    pub restarts: i32,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

/// What one Redis node said about itself and the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisFact {
    /// `CLUSTER NODES` from this node; exactly one entry has `myself`.
    pub nodes: Vec<ClusterNode>,
    /// `cluster_state` from `CLUSTER INFO`.
    pub cluster_state: String,
    /// The server and its version (`valkey_version` on Valkey, whose
    /// `redis_version` is a compatibility figure).
    pub engine: slotkeeper_api::Engine,
    pub version: String,
    pub replication_offset: Option<i64>,
    /// `master_link_status:up` on a replica.
    pub link_up: bool,
    pub memory: MemoryFact,
    /// Throughput, for the read model only: no plan depends on it.
    pub stats: slotkeeper_readmodel::StatsFact,
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
    /// Staying shards (`spec.masters`).
    pub shards: usize,
    pub replicas_per_master: usize,
    /// Every Pod of the cluster that is not being deleted.
    pub pods: Vec<PodFact>,
    /// Facts per Pod name; a Pod missing here could not be asked.
    pub redis: BTreeMap<String, RedisFact>,
    /// A shard that runs one Pod more than its replicas ask for: the
    /// temporary replica of a rollout's surge.
    pub surge: Option<usize>,
}

/// A node addressed by Pod, id and IP, as an action needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub pod: String,
    pub id: String,
    pub ip: String,
}

/// Slots moving from one master to another in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub source: NodeRef,
    pub target: NodeRef,
    pub slots: Vec<SlotTransfer>,
}

/// The next step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing to do but wait; the reason goes to status.
    Wait(String),
    /// The spec asks for something unsafe; nothing is done until it changes.
    Refused(String),
    /// Ask the seed node to meet the given addresses.
    Meet { via: String, targets: Vec<String> },
    /// Assign slot ranges to a shard's master.
    AddSlots { pod: String, shard: usize, ranges: Vec<SlotRange> },
    /// Make a node replicate its shard's master.
    Replicate { pod: String, master_pod: String, master_id: String },
    /// Every listed node forgets the listed ids of nodes that are gone.
    Forget { ids_by_pod: BTreeMap<String, Vec<String>> },
    /// Promote a caught-up replica with `CLUSTER FAILOVER` (coordinated;
    /// FORCE only when the master cannot be reached). `operation` names the
    /// RedisOperation that asked for it, whose status records it as sent.
    Failover { pod: String, shard: usize, reason: String, force: bool, operation: Option<String> },
    /// Move slots, pairs of masters in parallel; `repair` when finishing
    /// slots something left open. `remaining` counts slots still to move
    /// after this step; `others` hear the new owners at once.
    MoveSlots { batches: Vec<Batch>, others: Vec<String>, remaining: usize, repair: bool },
    /// `CLUSTER SETSLOT <slot> STABLE` where a mark's other end is gone.
    Stabilize { slots_by_pod: BTreeMap<String, Vec<u16>> },
    /// Force-delete a Pod stranded on a lost Node, so its StatefulSet
    /// recreates it on a Node that works.
    DeletePod { pod: String, reason: String },
    /// Delete a Pod so its StatefulSet (`OnDelete`) recreates it on the
    /// shard's current image: a rollout's step.
    RecreatePod { pod: String, shard: usize, reason: String },
    /// Delete a drained leaving shard's StatefulSet.
    RemoveShard { shard: usize },
    /// The cluster matches the spec.
    Converged,
}

impl Action {
    /// The Pods this action sends commands to.
    pub fn pods(&self) -> Vec<&str> {
        match self {
            Action::Meet { via, .. } => vec![via],
            Action::AddSlots { pod, .. } | Action::Replicate { pod, .. } | Action::Failover { pod, .. } => vec![pod],
            Action::Forget { ids_by_pod } => ids_by_pod.keys().map(String::as_str).collect(),
            Action::Stabilize { slots_by_pod } => slots_by_pod.keys().map(String::as_str).collect(),
            Action::MoveSlots { batches, others, .. } => batches
                .iter()
                .flat_map(|b| [b.source.pod.as_str(), b.target.pod.as_str()])
                .chain(others.iter().map(String::as_str))
                .collect(),
            Action::Wait(_)
            | Action::Refused(_)
            | Action::RemoveShard { .. }
            | Action::DeletePod { .. }
            | Action::RecreatePod { .. }
            | Action::Converged => vec![],
        }
    }
}

/// Slots moved per pair of masters per step: large enough that round trips
/// are amortised over hundreds of slots, small enough that status (the
/// checkpoint users watch) moves every second or so.
pub const SLOTS_PER_PAIR_PER_STEP: usize = 512;

impl Observed {
    /// How many Pods each staying shard keeps: `replicas + 1`, but a shard
    /// shrinks only once every Pod it has answered and its master is on a Pod
    /// that stays (it is failed over first): never guess about the data.
    pub fn shard_sizes(&self) -> BTreeMap<usize, usize> {
        (0..self.shards)
            .map(|shard| {
                let wanted = self.replicas_per_master + 1 + usize::from(self.surge == Some(shard));
                let pods: Vec<&PodFact> = self.pods.iter().filter(|p| p.shard == shard).collect();
                let current = pods.iter().map(|p| p.ordinal + 1).max().unwrap_or(0);
                if current <= wanted {
                    return (shard, wanted);
                }
                let all_answer = pods.iter().all(|p| self.redis.contains_key(&p.name));
                let master_stays = pods
                    .iter()
                    .find(|p| self.redis.get(&p.name).and_then(|f| f.myself()).is_some_and(owns_slots))
                    .is_some_and(|p| p.ordinal < wanted);
                (shard, if all_answer && master_stays { wanted } else { current })
            })
            .collect()
    }

    /// Pods that are part of the cluster now.
    fn members(&self) -> Vec<&PodFact> {
        let sizes = self.shard_sizes();
        self.pods.iter().filter(|p| sizes.get(&p.shard).is_none_or(|&size| p.ordinal < size)).collect()
    }

    fn id_of(&self, pod: &str) -> Option<&str> {
        self.redis.get(pod)?.myself().map(|n| n.id.as_str())
    }

    fn leaving_shards(&self) -> BTreeSet<usize> {
        self.pods.iter().map(|p| p.shard).filter(|&s| s >= self.shards).collect()
    }
}

fn owns_slots(node: &ClusterNode) -> bool {
    node.master && !node.slots.is_empty()
}

pub fn plan(observed: &Observed) -> Action {
    let sizes = observed.shard_sizes();
    let expected: usize =
        sizes.values().sum::<usize>() + observed.pods.iter().filter(|p| p.shard >= observed.shards).count();
    let members = observed.members();
    let reachable: Vec<&PodFact> = members.iter().copied().filter(|p| observed.redis.contains_key(&p.name)).collect();
    // A Pod on a lost Node never answers again, and its StatefulSet waits for
    // the Pod object to go before it makes a new one: remove it.
    if let Some(stranded) = observed.pods.iter().find(|p| p.node_lost && !observed.redis.contains_key(&p.name)) {
        let node = stranded.node_name.as_deref().unwrap_or("?");
        return Action::DeletePod {
            pod: stranded.name.clone(),
            reason: format!("its Node {node} is not Ready and it does not answer"),
        };
    }
    let present = members.len().min(expected);
    if present < expected || reachable.len() < expected {
        return Action::Wait(format!("{} of {expected} Redis nodes reachable", reachable.len()));
    }

    // Slots nobody owns go to the staying shard whose bootstrap share holds
    // them. While masters are still alone this is the bootstrap assignment,
    // done before MEET so fresh masters skip Redis's rejoin delay.
    let masters = shard_masters(observed, &reachable);
    let owned = SlotMap::of(observed.redis.values().flat_map(|f| f.nodes.iter()).flat_map(|n| n.slots.iter()));
    let owned_count = owned.len();
    if owned_count < SLOTS as usize {
        for (&shard, master) in masters.range(..observed.shards) {
            let Some(master) = master else { continue };
            let target = shard_range(shard, observed.shards);
            let missing: BTreeSet<u16> = (target.start..=target.end).filter(|s| !owned.contains(*s)).collect();
            if !missing.is_empty() {
                return Action::AddSlots { pod: master.name.clone(), shard, ranges: to_ranges(&missing) };
            }
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
    let strangers: Vec<String> = reachable
        .iter()
        .filter(|p| p.name != seed.name)
        .filter(|p| {
            let Some(id) = observed.id_of(&p.name) else { return false };
            // Unknown, or known at an address it no longer has (Pod recreated).
            seed_fact.nodes.iter().find(|n| n.id == id).is_none_or(|n| Some(&n.ip) != p.ip.as_ref())
        })
        .filter_map(|p| p.ip.clone())
        .collect();
    if !strangers.is_empty() {
        return Action::Meet { via: seed.name.clone(), targets: strangers };
    }
    // Every node must reach every member at its current address: one that
    // still holds an old address (its peers were all recreated) and has no
    // live link to learn the new one from is told it directly.
    for pod in &reachable {
        let fact = &observed.redis[&pod.name];
        let stale: Vec<String> = reachable
            .iter()
            .filter(|other| other.name != pod.name)
            .filter_map(|other| {
                let (id, ip) = (observed.id_of(&other.name)?, other.ip.as_ref()?);
                fact.nodes.iter().find(|n| n.id == id).is_some_and(|n| &n.ip != ip).then(|| ip.clone())
            })
            .collect();
        if !stale.is_empty() {
            return Action::Meet { via: pod.name.clone(), targets: stale };
        }
    }

    if let Some(action) = moves::repair_open_slots(observed, &reachable) {
        return action;
    }

    // Leaving shards only drain: once a master gives its last slot away Redis
    // turns it (and its replicas) into replicas of the receiving master.
    for (&shard, master) in masters.range(..observed.shards) {
        let members_of_shard: Vec<&&PodFact> = reachable.iter().filter(|p| p.shard == shard).collect();
        let Some(master) = master else {
            return Action::Wait(format!(
                "shard {shard}: its replicas follow a master that is unreachable; waiting for Redis to fail over"
            ));
        };
        let master_id = observed.id_of(&master.name).expect("reachable").to_owned();
        for pod in members_of_shard.into_iter().filter(|p| p.name != master.name) {
            let fact = &observed.redis[&pod.name];
            let me = fact.myself().expect("reachable");
            if me.master_id.as_deref() == Some(master_id.as_str()) {
                continue;
            }
            if owns_slots(me) {
                return Action::Wait(format!("shard {shard}: {} and {} both own slots", pod.name, master.name));
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

    let all_ids: BTreeSet<&str> = reachable.iter().filter_map(|p| observed.id_of(&p.name)).collect();
    let still_gossiping = reachable.iter().filter(|p| !all_ids.is_subset(&observed.redis[&p.name].known_ids())).count();
    if still_gossiping > 0 {
        return Action::Wait(format!("cluster handshake in progress on {still_gossiping} nodes"));
    }
    if let Some(action) = forget_departed(observed, &reachable) {
        return action;
    }
    let live: BTreeSet<&str> = observed.redis.values().filter_map(|f| f.myself()).map(|n| n.id.as_str()).collect();
    let departed: BTreeSet<&str> = observed
        .redis
        .values()
        .flat_map(|f| f.nodes.iter())
        .filter(|n| !live.contains(n.id.as_str()) && !n.in_handshake())
        .map(|n| n.id.as_str())
        .collect();
    if !departed.is_empty() {
        return Action::Wait(format!("{} departed node(s) not yet marked failed by the cluster", departed.len()));
    }
    if owned_count < SLOTS as usize {
        return Action::Wait(format!("{owned_count} of {SLOTS} slots assigned"));
    }
    // A node that still marks a member failing has not heard from it yet:
    // its `cluster_state` may say ok while it is cut off from its peers.
    for pod in &reachable {
        let fact = &observed.redis[&pod.name];
        if let Some(n) = fact.nodes.iter().find(|n| all_ids.contains(n.id.as_str()) && !n.myself && n.failing()) {
            return Action::Wait(format!("{} still sees node {} as failing", pod.name, n.id));
        }
    }
    if let Some(p) = reachable.iter().find(|p| observed.redis[&p.name].cluster_state != "ok") {
        return Action::Wait(format!("{} reports cluster_state {}", p.name, observed.redis[&p.name].cluster_state));
    }
    if let Some(action) = failover_off_removed_ordinals(observed, &masters) {
        return action;
    }
    if let Some(action) = moves::rebalance(observed, &masters) {
        return action;
    }
    if let Some(&shard) = observed.leaving_shards().iter().next() {
        return Action::RemoveShard { shard };
    }
    Action::Converged
}

/// The master of each shard present: the shard's node that owns slots, else
/// one its shard-mates replicate, else its lowest ordinal if nobody in the
/// shard follows anyone (a fresh shard); `None` when its nodes follow a
/// master that is not reachable (Redis is failing over, or must).
fn shard_masters<'a>(observed: &Observed, reachable: &[&'a PodFact]) -> BTreeMap<usize, Option<&'a PodFact>> {
    let shards: BTreeSet<usize> = reachable.iter().map(|p| p.shard).collect();
    shards
        .into_iter()
        .map(|shard| {
            let members: Vec<&PodFact> = reachable.iter().copied().filter(|p| p.shard == shard).collect();
            let myself = |p: &PodFact| observed.redis[&p.name].myself().cloned();
            if let Some(owner) = members.iter().find(|p| myself(p).is_some_and(|n| owns_slots(&n))) {
                return (shard, Some(*owner));
            }
            let followed: BTreeSet<String> = members.iter().filter_map(|p| myself(p)?.master_id).collect();
            if let Some(master) =
                members.iter().find(|p| observed.id_of(&p.name).is_some_and(|id| followed.contains(id)))
            {
                return (shard, Some(*master));
            }
            if !followed.is_empty() {
                return (shard, None);
            }
            (shard, members.iter().min_by_key(|p| p.ordinal).copied())
        })
        .collect()
}

/// Ids that reachable nodes still list but no member has any more: failed,
/// owning no slots, and not the master the listing node follows. Only when
/// every Pod that exists answered, so a Pod on its way back is not forgotten.
fn forget_departed(observed: &Observed, reachable: &[&PodFact]) -> Option<Action> {
    if observed.pods.iter().any(|p| !observed.redis.contains_key(&p.name)) {
        return None;
    }
    let live: BTreeSet<&str> = observed.redis.values().filter_map(|f| f.myself()).map(|n| n.id.as_str()).collect();
    let mut ids_by_pod = BTreeMap::new();
    for pod in reachable {
        let fact = &observed.redis[&pod.name];
        let me = fact.myself()?;
        let gone: Vec<String> = fact
            .nodes
            .iter()
            .filter(|n| !live.contains(n.id.as_str()) && !n.in_handshake())
            .filter(|n| n.flags.iter().any(|f| f == "fail" || f == "noaddr") && n.slots.is_empty())
            .filter(|n| me.master_id.as_deref() != Some(n.id.as_str()))
            .map(|n| n.id.clone())
            .collect();
        if !gone.is_empty() {
            ids_by_pod.insert(pod.name.clone(), gone);
        }
    }
    (!ids_by_pod.is_empty()).then_some(Action::Forget { ids_by_pod })
}

/// A shard shrinking its replicas keeps its highest ordinals until its
/// master is on a Pod that stays: promote a caught-up replica that stays.
fn failover_off_removed_ordinals(observed: &Observed, masters: &BTreeMap<usize, Option<&PodFact>>) -> Option<Action> {
    for (&shard, master) in masters {
        let wanted = observed.replicas_per_master + 1 + usize::from(observed.surge == Some(shard));
        let master = (*master)?;
        if shard >= observed.shards || master.ordinal < wanted {
            continue;
        }
        let master_id = observed.id_of(&master.name)?;
        let candidate = observed.pods.iter().filter(|p| p.shard == shard && p.ordinal < wanted).find(|p| {
            observed
                .redis
                .get(&p.name)
                .is_some_and(|f| f.link_up && f.myself().is_some_and(|n| n.master_id.as_deref() == Some(master_id)))
        });
        return Some(match candidate {
            Some(pod) => Action::Failover {
                force: false,
                operation: None,
                pod: pod.name.clone(),
                shard,
                reason: format!("{} is removed by replicasPerMaster {}", master.name, observed.replicas_per_master),
            },
            None => Action::Wait(format!("shard {shard}: waiting for a replica that stays to catch up")),
        });
    }
    None
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod bootstrap_tests;
#[cfg(test)]
#[path = "day2_tests.rs"]
mod day2_tests;
#[cfg(test)]
pub(crate) mod sim;
