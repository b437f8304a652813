//! What the rollout planner needs to know about the cluster: per node its
//! Pod's image and restarts, and what Redis says (role, version, link, lag).
//! The operator builds it from its observation; tests build it by hand.

use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::catalog::Release;

#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub pod: String,
    pub shard: usize,
    pub ordinal: usize,
    /// The image in the Pod's spec.
    pub image: Option<String>,
    /// When the Pod was created (a rolling restart recreates every Pod once).
    pub created: Option<Timestamp>,
    /// Its containers' restarts since the Pod was created.
    pub restarts: i32,
    /// Redis answered.
    pub reachable: bool,
    /// It owns slots.
    pub master: bool,
    /// What the server reports about itself.
    pub release: Option<Release>,
    /// A replica's link to its master is up and its data is on its disk (no
    /// append-only rewrite pending after a sync): it may be promoted.
    pub link_up: bool,
    /// Bytes a replica is behind its master; `None` when unknown.
    pub lag: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterView {
    /// Staying shards (`spec.masters`).
    pub shards: usize,
    pub replicas_per_master: usize,
    pub nodes: Vec<NodeView>,
    /// `Ok` when the cluster planner has nothing to do (every node reachable,
    /// `cluster_state:ok`, all 16384 slots served, nothing failing), else
    /// what it is waiting for.
    pub healthy: Result<(), String>,
}

impl ClusterView {
    pub fn shard(&self, shard: usize) -> impl Iterator<Item = &NodeView> {
        self.nodes.iter().filter(move |n| n.shard == shard)
    }

    /// A rollout's temporary replica: an ordinal beyond the shard's own.
    pub fn is_temporary(&self, node: &NodeView) -> bool {
        node.ordinal > self.replicas_per_master
    }

    pub fn restarts(&self) -> i32 {
        self.nodes.iter().map(|n| n.restarts).sum()
    }
}
