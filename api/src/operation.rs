//! `RedisOperation` (`slotkeeper.io/v1`): a one-shot, audited action on
//! a `RedisCluster`, such as a coordinated failover of one shard. It runs
//! once; its status is the record of what happened.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// One operation on one cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "slotkeeper.io",
    version = "v1",
    kind = "RedisOperation",
    plural = "redisoperations",
    shortname = "rdo",
    namespaced,
    status = "RedisOperationStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.spec == oldSelf.spec").message("spec of a RedisOperation is immutable: create a new RedisOperation instead"),
    validation = Rule::new("self.spec.type != 'Failover' || has(self.spec.failover)").message("spec.failover is required when spec.type is Failover (set spec.failover.shard)")
)]
#[serde(rename_all = "camelCase")]
pub struct RedisOperationSpec {
    /// The `RedisCluster` in this namespace to act on.
    #[schemars(length(min = 1, max = 253))]
    pub cluster_name: String,
    #[serde(rename = "type")]
    pub type_: OperationType,
    /// For `Failover`: which shard, and optionally which replica to promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationType {
    /// Promote a caught-up replica of one shard with `CLUSTER FAILOVER`.
    Failover,
    /// Recreate every Pod once, replicas first, each master handing over by
    /// coordinated failover first (a rollout to the same version).
    RollingRestart,
    /// Move slots until the masters are balanced the cluster's way
    /// (`spec.balance`: even slot counts, or even memory within its tolerance).
    Rebalance,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    /// The shard whose master hands over, 0-based.
    #[x_kube(validation = Rule::new("self >= 0").message("spec.failover.shard must be 0 or more"))]
    pub shard: i32,
    /// The replica Pod to promote; the most caught-up replica when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pod: Option<String>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OperationPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RedisOperationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OperationPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// What happened, or why it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When `CLUSTER FAILOVER` was sent; absent until then (a restarted
    /// operator never sends it twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_sent_time: Option<Time>,
    /// The master that handed over and the replica promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_pod: Option<String>,
    /// A `Rebalance`'s progress, e.g. `1024 of 2310 slots moved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}
