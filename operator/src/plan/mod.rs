//! Diagnose and plan: from what was observed (Pods and each Redis node's view
//! of the cluster) to the one next step that brings the cluster closer to the
//! spec. Pure functions over data; the reconciler does the IO. The reason a
//! reconcile was triggered never matters: the same observation always yields
//! the same step, so a restart at any point resumes where it stopped.
//!
//! The steps, in [`STEPS`] order, one file per concern (membership, slots,
//! moves, replicas, gossip; the rollout and intents beside them), each
//! idempotent and safe to repeat after a crash:
//! 1. every member Pod reachable (members: the kept Pods of staying shards,
//!    and all Pods of leaving shards until they are drained); then the ACL
//!    users, where status does not say every node has them;
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
//! 9. remove drained leaving shards;
//! 10. spread masters over failure domains (a fresh shard's master was
//!     already chosen by domain), then the Pods themselves (a replica is
//!     recreated so it can land in an emptier domain, such as a Node back
//!     from a stop); then converged.

mod gossip;
pub mod intents;
mod membership;
pub mod moves;
pub mod placement;
mod replicas;
pub mod rollout;
mod slots;

use std::collections::{BTreeMap, BTreeSet};

use crate::redis::migrate::SlotTransfer;
use crate::redis::topology::{ClusterNode, SlotMap, SlotRange};
pub use slotkeeper_api::BalanceBy;
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
    /// Its failure domain: that Node's value of the cluster's topology key.
    pub domain: Option<String>,
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
    /// An append-only-file rewrite is running or scheduled. After a full
    /// sync Redis turns its AOF back on with a rewrite; until that ends, a
    /// node killed restarts from its old file (empty after a first sync).
    pub aof_rewriting: bool,
    pub memory: MemoryFact,
    /// Throughput, for the read model only: no plan depends on it.
    pub stats: slotkeeper_readmodel::StatsFact,
    /// Keys a master holds in slots it does not own, per slot; asked only
    /// for slots some node marks open (keys a half-made move left behind).
    pub stray_keys: BTreeMap<u16, u64>,
}

impl RedisFact {
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.myself)
    }

    /// A replica that may be made a master: its link is up and what it
    /// holds is on its disk, so a crash right after the promotion cannot
    /// bring it back empty with its replicas syncing from it.
    pub fn promotable(&self) -> bool {
        self.link_up && !self.aof_rewriting
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
    /// A rollout or a RedisOperation is moving master roles: the spread
    /// over failure domains waits until it is done.
    pub roles_held: bool,
    /// Pods a user made master (a succeeded Failover operation that still
    /// exists): the spread moves other shards, not these.
    pub user_placed: BTreeSet<String>,
    /// Failure domains a Pod of this cluster could be scheduled to now (a
    /// Ready Node without taints); empty when the spec's own scheduling
    /// rules decide where Pods go, which turns re-placing Pods off.
    pub open_domains: BTreeSet<String>,
    /// Pods created before this have run long enough to be moved to another
    /// domain (a Pod is not moved twice in a row); `None`: none may move.
    pub movable_before: Option<k8s_openapi::jiff::Timestamp>,
    /// What balanced means for this cluster, and the rebalance asked for or under way.
    pub balance: BalanceIntent,
    /// The ACL users every node should have, when status does not say they were applied.
    pub users: UsersIntent,
}

/// ACL users to apply: `pending` is the revision of the users the spec and
/// Secrets ask for, `None` when status says every node has them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsersIntent {
    pub pending: Option<String>,
}

/// `spec.balance`, a `Rebalance` operation waiting for its plan, and the
/// plan being followed (from `status.reshard.plan`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BalanceIntent {
    pub by: BalanceBy,
    pub tolerance_percent: u32,
    /// A running `Rebalance` operation that has not finished yet.
    pub operation: Option<String>,
    pub plan: Option<PlanInProgress>,
}

/// A checkpointed plan: where each moving slot goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanInProgress {
    pub by: BalanceBy,
    pub operation: Option<String>,
    /// `spec.masters` it was made for.
    pub masters: usize,
    pub target: BTreeMap<u16, usize>,
    pub expected: Option<String>,
}

impl PlanInProgress {
    /// The plan as `status.reshard.plan` holds it; an error names a range
    /// that does not parse.
    pub fn of(plan: &slotkeeper_api::BalancePlan) -> Result<Self, String> {
        Ok(Self {
            by: plan.by,
            operation: plan.operation.clone(),
            masters: plan.masters.max(0) as usize,
            target: plan.target_of()?,
            expected: plan.expected.clone(),
        })
    }
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
    /// RedisOperation that asked for it, whose status records it as sent;
    /// `spread`: it moves a master to a less loaded failure domain on a
    /// healthy cluster (which stays Ready meanwhile).
    Failover { pod: String, shard: usize, reason: String, force: bool, operation: Option<String>, spread: bool },
    /// Decide where slots go (reading each master's bytes per slot when
    /// balancing by memory); the plan is checkpointed in status and followed
    /// by `MoveSlots` steps. `owned`: each shard's slots now.
    PlanBalance {
        by: BalanceBy,
        tolerance_percent: u32,
        operation: Option<String>,
        staying: usize,
        masters: BTreeMap<usize, NodeRef>,
        owned: BTreeMap<usize, Vec<SlotRange>>,
    },
    /// Every slot of the plan is where it was planned: the rebalance is
    /// recorded as done (`summary` says how even the masters are now).
    FinishBalance { by: BalanceBy, operation: Option<String>, summary: String },
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
    /// `fresh_data`: its volume is replaced too (see the rollout planner).
    RecreatePod { pod: String, shard: usize, reason: String, fresh_data: bool },
    /// Delete a replica's Pod (gracefully) so its StatefulSet recreates it
    /// and the scheduler places it in a less crowded failure domain.
    MovePod { pod: String, shard: usize, reason: String },
    /// Delete a drained leaving shard's StatefulSet.
    RemoveShard { shard: usize },
    /// Give every node that answers the cluster's ACL users (`ACL SETUSER`,
    /// and `masteruser`); status then records `revision` as applied.
    ApplyUsers { revision: String, pods: Vec<String> },
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
            Action::PlanBalance { masters, .. } => masters.values().map(|m| m.pod.as_str()).collect(),
            Action::ApplyUsers { pods, .. } => pods.iter().map(String::as_str).collect(),
            Action::Wait(_)
            | Action::FinishBalance { .. }
            | Action::Refused(_)
            | Action::RemoveShard { .. }
            | Action::DeletePod { .. }
            | Action::RecreatePod { .. }
            | Action::MovePod { .. }
            | Action::Converged => vec![],
        }
    }
}

/// Slots each giving master moves per step: large enough that round trips
/// and the step's own observe and checkpoint are amortised over hundreds of
/// slots, small enough that status (the checkpoint users watch) moves every
/// second or so.
pub const SLOTS_PER_SOURCE_PER_STEP: usize = 1024;

impl Observed {
    /// How many Pods each staying shard keeps: `replicas + 1`, but a shard
    /// shrinks only once its master is on a Pod that stays (it is failed over
    /// first) and every Pod it has either answered or holds nothing only it
    /// has: never guess about the data.
    pub fn shard_sizes(&self) -> BTreeMap<usize, usize> {
        (0..self.shards)
            .map(|shard| {
                let wanted = self.replicas_per_master + 1 + usize::from(self.surge == Some(shard));
                let pods: Vec<&PodFact> = self.pods.iter().filter(|p| p.shard == shard).collect();
                let current = pods.iter().map(|p| p.ordinal + 1).max().unwrap_or(0);
                if current <= wanted {
                    return (shard, wanted);
                }
                // A leaving Pod that does not answer (a temporary replica on
                // an image that cannot start) may go if no node that answers
                // sees it owning slots: a replica's data is on its master.
                let accounted_for = |p: &&PodFact| {
                    self.redis.contains_key(&p.name)
                        || (p.ordinal >= wanted
                            && p.ip.as_deref().is_none_or(|ip| {
                                !self.redis.values().flat_map(|f| &f.nodes).any(|n| n.ip == ip && owns_slots(n))
                            }))
                };
                let master_stays = pods
                    .iter()
                    .find(|p| self.redis.get(&p.name).and_then(|f| f.myself()).is_some_and(owns_slots))
                    .is_some_and(|p| p.ordinal < wanted);
                (shard, if pods.iter().all(accounted_for) && master_stays { wanted } else { current })
            })
            .collect()
    }

    /// Pods that are part of the cluster now.
    fn members(&self) -> Vec<&PodFact> {
        let sizes = self.shard_sizes();
        self.pods.iter().filter(|p| sizes.get(&p.shard).is_none_or(|&size| p.ordinal < size)).collect()
    }

    /// How many bytes `pod`, a replica, is behind the master it follows, by
    /// the offsets both reported; `None` for a master, or when either of
    /// them did not answer.
    pub fn lag_of(&self, pod: &str) -> Option<u64> {
        let fact = self.redis.get(pod)?;
        let me = fact.myself().filter(|me| !owns_slots(me))?;
        let master_id = me.master_id.as_deref()?;
        let master = self.redis.values().find(|f| f.myself().is_some_and(|m| m.id == master_id))?;
        Some(master.replication_offset?.saturating_sub(fact.replication_offset?).max(0) as u64)
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

/// What every step reads: the observation, and what is derived from it once.
pub struct Planning<'a> {
    observed: &'a Observed,
    /// Pods the cluster should have now (staying shards' sizes plus every
    /// Pod of a leaving shard until it is removed).
    expected: usize,
    members: Vec<&'a PodFact>,
    reachable: Vec<&'a PodFact>,
    masters: BTreeMap<usize, Option<&'a PodFact>>,
    owned: SlotMap,
    owned_count: usize,
    /// Ids of the reachable members, and of every node that answered.
    member_ids: BTreeSet<&'a str>,
    live_ids: BTreeSet<&'a str>,
}

impl<'a> Planning<'a> {
    fn new(observed: &'a Observed) -> Self {
        let sizes = observed.shard_sizes();
        let leaving = observed.pods.iter().filter(|p| p.shard >= observed.shards).count();
        let members = observed.members();
        let reachable: Vec<&PodFact> =
            members.iter().copied().filter(|p| observed.redis.contains_key(&p.name)).collect();
        let owned = SlotMap::of(observed.redis.values().flat_map(|f| f.nodes.iter()).flat_map(|n| n.slots.iter()));
        Self {
            expected: sizes.values().sum::<usize>() + leaving,
            masters: shard_masters(observed, &reachable),
            owned_count: owned.len(),
            owned,
            member_ids: reachable.iter().filter_map(|p| observed.id_of(&p.name)).collect(),
            live_ids: observed.redis.values().filter_map(|f| f.myself()).map(|n| n.id.as_str()).collect(),
            members,
            reachable,
            observed,
        }
    }
}

type Step = fn(&Planning) -> Option<Action>;

/// The steps in order: the first with something to do decides. Each is
/// idempotent and safe to repeat after a crash.
const STEPS: &[Step] = &[
    membership::replace_stranded_pod,
    membership::wait_for_members,
    apply_users,
    slots::assign_unowned,
    membership::meet_strangers,
    membership::meet_at_new_addresses,
    |p| moves::repair_open_slots(p.observed, &p.reachable),
    replicas::attach,
    gossip::wait_for_gossip,
    gossip::forget_departed,
    gossip::wait_for_departed,
    gossip::wait_for_health,
    replicas::fail_over_off_removed_ordinals,
    |p| moves::rebalance(p.observed, &p.masters),
    remove_drained_shard,
    placement::restore_spread,
    placement::move_crowded_replica,
];

pub fn plan(observed: &Observed) -> Action {
    let planning = Planning::new(observed);
    STEPS.iter().find_map(|step| step(&planning)).unwrap_or(Action::Converged)
}

/// Users before anything else once every member answers: a node started
/// from its users file has them already, and one that ran before them (an
/// operator upgrade, a changed user) gets them live, so Pods are never
/// restarted for it. Every node that answers gets them, leaving Pods too.
fn apply_users(p: &Planning) -> Option<Action> {
    let revision = p.observed.users.pending.clone()?;
    let pods =
        p.observed.pods.iter().filter(|pod| p.observed.redis.contains_key(&pod.name)).map(|pod| pod.name.clone());
    Some(Action::ApplyUsers { revision, pods: pods.collect() })
}

/// A leaving shard whose slots are all gone: its StatefulSet goes.
fn remove_drained_shard(p: &Planning) -> Option<Action> {
    p.observed.leaving_shards().first().map(|&shard| Action::RemoveShard { shard })
}

/// The master of each shard present: the shard's node that owns slots, else
/// one its shard-mates replicate, else, if nobody in the shard follows anyone
/// (a fresh shard), the Pod in the failure domain holding the fewest masters
/// so far; `None` when its nodes follow a master that is not reachable (Redis
/// is failing over, or must).
fn shard_masters<'a>(observed: &Observed, reachable: &[&'a PodFact]) -> BTreeMap<usize, Option<&'a PodFact>> {
    let shards: BTreeSet<usize> = reachable.iter().map(|p| p.shard).collect();
    let myself = |p: &PodFact| observed.redis[&p.name].myself().cloned();
    let mut fresh = Vec::new();
    let mut masters: BTreeMap<usize, Option<&'a PodFact>> = BTreeMap::new();
    for shard in shards {
        let members: Vec<&PodFact> = reachable.iter().copied().filter(|p| p.shard == shard).collect();
        let master = if let Some(owner) = members.iter().find(|p| myself(p).is_some_and(|n| owns_slots(&n))) {
            Some(*owner)
        } else {
            let followed: BTreeSet<String> = members.iter().filter_map(|p| myself(p)?.master_id).collect();
            let leader = members.iter().find(|p| observed.id_of(&p.name).is_some_and(|id| followed.contains(id)));
            if leader.is_none() && followed.is_empty() {
                fresh.push((shard, members));
                continue;
            }
            leader.copied()
        };
        masters.insert(shard, master);
    }
    for (shard, members) in fresh {
        let chosen: Vec<&PodFact> = masters.values().flatten().copied().collect();
        masters.insert(shard, placement::choose_fresh_master(&members, reachable, &chosen));
    }
    masters
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod bootstrap_tests;
#[cfg(test)]
#[path = "day2_tests.rs"]
mod day2_tests;
#[cfg(test)]
#[path = "placement_tests.rs"]
mod placement_tests;
#[cfg(test)]
pub(crate) mod sim;
