//! What was last observed of a cluster's Redis nodes, in the shape a reader
//! shows it: one [`NodeView`] per Pod, roles resolved to Pods, lag in bytes.

use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::capacity::MemoryFact;
use slotkeeper_api::topology::SlotRange;

/// One observation of a whole cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub at: Timestamp,
    /// Every Pod of the cluster, in name order.
    pub nodes: Vec<NodeView>,
    /// The step in progress, as the planner named it (`MoveSlots: moving …`);
    /// `None` when the cluster has converged or the observer does not plan.
    pub step: Option<String>,
    pub source: Source,
}

/// Who made the observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The leader's reconcile.
    Reconcile,
    /// A standby's read-only sampler.
    Sampler,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Master,
    Replica,
    /// The node did not answer, or has no cluster view yet.
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Replica => "replica",
            Role::Unknown => "unknown",
        }
    }
}

/// One Redis node as it reported itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeView {
    pub pod: String,
    pub shard: usize,
    pub ordinal: usize,
    /// The Kubernetes Node the Pod runs on.
    pub node: Option<String>,
    /// Its failure domain (the Node's value of the cluster's topology key).
    pub domain: Option<String>,
    pub ip: Option<String>,
    /// It answered this observation.
    pub reachable: bool,
    pub id: Option<String>,
    pub role: Option<Role>,
    /// The Pod of the master a replica follows.
    pub master_pod: Option<String>,
    pub slots: Vec<SlotRange>,
    pub importing: Vec<u16>,
    pub migrating: Vec<u16>,
    /// A replica's `master_link_status` is `up`.
    pub link_up: bool,
    /// Bytes a replica is behind its master (offsets from the same observation).
    pub lag_bytes: Option<u64>,
    /// Another node marks it `fail` or `fail?`.
    pub failing: bool,
    pub version: Option<String>,
    pub memory: MemoryFact,
    pub stats: StatsFact,
}

impl NodeView {
    pub fn role(&self) -> Role {
        self.role.unwrap_or(Role::Unknown)
    }

    pub fn is_master(&self) -> bool {
        self.role == Some(Role::Master)
    }

    /// Up, in its role, and not failing in anyone's view.
    pub fn healthy(&self) -> bool {
        self.reachable
            && !self.failing
            && match self.role() {
                Role::Master => true,
                Role::Replica => self.link_up,
                Role::Unknown => false,
            }
    }
}

/// Throughput figures from `INFO stats` and `INFO clients`; hits and misses
/// are counters since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsFact {
    pub ops_per_sec: u64,
    pub connected_clients: u64,
    pub keyspace_hits: u64,
    pub keyspace_misses: u64,
}

impl Observation {
    pub fn masters(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.iter().filter(|n| n.is_master())
    }

    /// Used memory and maxmemory summed over the masters (replicas mirror
    /// them); maxmemory 0 when any master is unlimited.
    pub fn memory(&self) -> (u64, u64) {
        let used = self.masters().map(|n| n.memory.used).sum();
        let unlimited = self.masters().any(|n| n.memory.maxmemory == 0);
        let max = if unlimited { 0 } else { self.masters().map(|n| n.memory.maxmemory).sum() };
        (used, max)
    }

    pub fn ops_per_sec(&self) -> u64 {
        self.nodes.iter().map(|n| n.stats.ops_per_sec).sum()
    }

    /// The distinct versions the nodes report, sorted.
    pub fn versions(&self) -> Vec<String> {
        let versions: std::collections::BTreeSet<&String> =
            self.nodes.iter().filter_map(|n| n.version.as_ref()).collect();
        versions.into_iter().cloned().collect()
    }

    /// The largest replica lag in bytes (only replicas have one).
    pub fn max_lag(&self) -> u64 {
        self.nodes.iter().filter_map(|n| n.lag_bytes).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pod: &str, role: Role, used: u64, max: u64) -> NodeView {
        NodeView {
            pod: pod.into(),
            reachable: true,
            role: Some(role),
            link_up: role == Role::Replica,
            version: Some(if pod.ends_with('1') { "7.0.15" } else { "6.2.14" }.into()),
            memory: MemoryFact { used, dataset: used / 2, maxmemory: max },
            stats: StatsFact { ops_per_sec: 10, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn memory_counts_masters_and_unlimited_wins() {
        let mut o = Observation {
            at: Timestamp::UNIX_EPOCH,
            nodes: vec![node("a-0", Role::Master, 10, 100), node("a-1", Role::Replica, 10, 100)],
            step: None,
            source: Source::Reconcile,
        };
        assert_eq!(o.memory(), (10, 100));
        assert_eq!(o.ops_per_sec(), 20);
        assert_eq!(o.versions(), vec!["6.2.14".to_owned(), "7.0.15".to_owned()]);
        o.nodes.push(node("b-0", Role::Master, 5, 0));
        assert_eq!(o.memory(), (15, 0));
    }

    #[test]
    fn a_replica_with_its_link_down_is_not_healthy() {
        let mut replica = node("a-1", Role::Replica, 1, 1);
        assert!(replica.healthy());
        replica.link_up = false;
        assert!(!replica.healthy());
        assert!(!NodeView { reachable: false, ..node("a-0", Role::Master, 1, 1) }.healthy());
    }
}
