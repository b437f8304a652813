//! `RedisCluster` (`slotkeeper.io/v1`, the version stored and the one the
//! operator works with): what the user asks for, and what it reports. Validation lives in the schema as CEL rules, so the
//! apiserver itself rejects bad input with a message naming the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::balancing::{BalancePlan, BalanceSpec, BalanceStatus};
pub use crate::catalog::Engine;
use crate::lag::ReplicationLag;
use crate::rollout::{RolloutSpec, UpgradeStatus};

/// The CEL rule that `spec.redis.engine` and `spec.redis.version` name a
/// catalog entry (both API versions); a test keeps it equal to
/// [`crate::catalog::cel_rule`].
pub(crate) const CATALOG_RULE: &str = "(self.engine == 'redis' && self.version in ['6.2.14', '7.0.15']) || (self.engine == 'valkey' && self.version in ['8.1.8'])";
const CATALOG_MESSAGE: &str = "spec.redis.engine and spec.redis.version must name an entry of the operator's version catalog: redis 6.2.14, redis 7.0.15, valkey 8.1.8";

/// The CEL rule that the version is semver-shaped (both API versions).
pub(crate) const VERSION_RULE: &str = "self.matches('^[0-9]+\\\\.[0-9]+\\\\.[0-9]+$')";
/// The schema of `spec.redis.config`: the allow-list's rules (see [`crate::redis_config`]).
fn config_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let description = "redis.conf overrides: allow-listed keys only, each value checked by type.";
    schemars::Schema::try_from(crate::redis_config::schema("spec.redis.config", description)).expect("an object schema")
}

/// The fewest masters a cluster may have (the CRD's rule on `spec.masters`
/// says the same; a test keeps them equal).
pub const MIN_MASTERS: i32 = 3;

/// Where a cluster's Pods are spread when `spec.placement.topologyKey` is absent.
pub const DEFAULT_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// A Redis Cluster: `masters` shards, each with `replicasPerMaster` replicas.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "slotkeeper.io",
    version = "v1",
    kind = "RedisCluster",
    plural = "redisclusters",
    shortname = "rdc",
    namespaced,
    status = "RedisClusterStatus",
    scale(spec_replicas_path = ".spec.masters", status_replicas_path = ".status.readyMasters"),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Masters","type":"integer","jsonPath":".spec.masters"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","description":"replicas per master","jsonPath":".spec.replicasPerMaster"}"#,
    printcolumn = r#"{"name":"Engine","type":"string","jsonPath":".status.currentEngine"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion"}"#,
    printcolumn = r#"{"name":"Target","type":"string","priority":1,"jsonPath":".spec.redis.version"}"#,
    printcolumn = r#"{"name":"Lag","type":"string","priority":1,"description":"the furthest replica behind its master","jsonPath":".status.replicationLag"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("has(self.spec.storage) == has(oldSelf.spec.storage)").message("spec.storage cannot be added or removed after creation: a cluster is either ephemeral or persistent; create a new RedisCluster instead")
)]
#[serde(rename_all = "camelCase")]
pub struct RedisClusterSpec {
    /// Number of master shards; at least 3, so a majority survives the loss of one.
    #[x_kube(validation = Rule::new("self >= 3").message("spec.masters must be at least 3: Redis Cluster needs a majority of masters to fail over"))]
    pub masters: i32,

    /// Replicas of each master, 0 to 5.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 5").message("spec.replicasPerMaster must be between 0 and 5"))]
    pub replicas_per_master: i32,

    /// The server every node runs: engine, version, image and redis.conf settings.
    pub redis: RedisSpec,

    /// Resources of each Redis container; `maxmemory` derives from the memory limit unless configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Persistent storage per node; absent means ephemeral (emptyDir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// Where the password lives; a random one is generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// ACL users: applications' own users, and whether the `default` user may sign in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<crate::acl::AclSpec>,

    /// How version rollouts go (canary bake time, step timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,

    /// How the cluster's Pods are spread over failure domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementSpec>,

    /// What balanced means: even slot counts (default) or even memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceSpec>,

    /// Stops every action on this cluster while true; a rollout holds
    /// between steps and resumes from its checkpoint.
    #[serde(default)]
    pub paused: bool,

    /// Kubernetes scheduling of the Redis Pods (affinity, tolerations, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
}

impl RedisClusterSpec {
    /// The label that names a failure domain: a shard's Pods are kept in different ones.
    pub fn topology_key(&self) -> &str {
        self.placement.as_ref().and_then(|p| p.topology_key.as_deref()).unwrap_or(DEFAULT_TOPOLOGY_KEY)
    }
}

/// The server: which engine at which version, from which image, with which settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(CATALOG_RULE).message(CATALOG_MESSAGE))]
pub struct RedisSpec {
    /// `redis` (default) or `valkey`.
    #[serde(default)]
    pub engine: Engine,

    /// The engine's version (semver), one of the operator's version catalog.
    /// Changing it rolls the cluster out to it along the catalog's edges.
    #[x_kube(validation = Rule::new(VERSION_RULE).message("spec.redis.version must be a semantic version such as 7.0.15"))]
    #[schemars(length(max = 32))]
    pub version: String,

    /// Overrides the catalog's image for `engine` and `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// redis.conf overrides (allow-listed keys only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "config_schema")]
    pub config: BTreeMap<String, String>,
}

/// How a cluster's Pods are spread.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// The Node label whose values are failure domains (for example
    /// `topology.kubernetes.io/zone`); a shard's Pods go to different ones.
    /// `kubernetes.io/hostname` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub topology_key: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("spec.storage.storageClassName is immutable"))]
#[x_kube(validation = Rule::new("quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0").message("spec.storage.size cannot shrink"))]
pub struct StorageSpec {
    /// Volume size per node, a quantity such as 1Gi.
    #[x_kube(validation = Rule::new("isQuantity(self)").message("spec.storage.size must be a quantity such as 1Gi"))]
    #[schemars(length(max = 32))]
    pub size: String,
    /// StorageClass; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Keep the PersistentVolumeClaims when the RedisCluster is deleted.
    #[serde(default)]
    pub keep_on_delete: bool,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// Secret in the cluster's namespace holding the password.
    pub secret_name: String,
    /// Key of the password in that Secret.
    #[serde(default = "default_password_key")]
    pub key: String,
}

fn default_password_key() -> String {
    "password".into()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    Pending,
    Creating,
    Running,
    Scaling,
    Upgrading,
    Recovering,
    Failed,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RedisClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub ready_masters: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// Slots served by some master, of 16384.
    #[serde(default)]
    pub slots_assigned: i32,
    /// `cluster_state` as the nodes report it (`ok` or `fail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_state: Option<String>,
    /// The engine and version every node runs (they change only when a
    /// rollout has finished on every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_engine: Option<Engine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// The image every node runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_image: Option<String>,
    /// The version rollout in progress, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeStatus>,
    /// The step in progress, for anything that takes more than one reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepStatus>,
    /// The slot movement in progress (scale out or in), while there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard: Option<ReshardStatus>,
    /// The last rebalance that finished (scale or `Rebalance` operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceStatus>,
    /// The masters and replicas each failure domain (a value of
    /// `spec.placement.topologyKey` on the Pods' Nodes) holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomainStatus>,
    /// The furthest any replica is behind its master (`kubectl get rdc -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_lag: Option<ReplicationLag>,
    /// The ACL users every node was last given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<AclStatus>,
}

/// What the operator last applied to every node's users (`ACL SETUSER`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AclStatus {
    /// A digest of the users, their rules and passwords (keyed by the
    /// operator's own secret password, so it reveals nothing).
    pub revision: String,
    /// The application users applied; one removed from the spec is deleted
    /// from the nodes, while users made by hand are left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainStatus {
    /// The domain: the Nodes' value of the topology key, e.g. `node-1` or `eu-west-1a`.
    pub name: String,
    /// Pods serving as masters there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masters: Vec<String>,
    /// Pods serving as replicas there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReshardStatus {
    /// When the first batch started, to the microsecond (a reshard may take
    /// under a second, and `Rebalanced` reports how long it took).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_time: Option<MicroTime>,
    /// Slots this reshard moves in all.
    pub slots_total: i32,
    pub slots_moved: i32,
    /// The first slot of the batch moving now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_slot: Option<i32>,
    /// The batch moving now, per pair of masters, e.g. `c-shard-0-0 -> c-shard-3-0: 512 slots`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving: Vec<String>,
    /// Where the slots go, when decided up front (by memory, or asked for
    /// by a `Rebalance` operation); absent when even slot counts are the goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<BalancePlan>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The Kubernetes Node the Pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its failure domain: that Node's value of the topology key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// `master` or `replica`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_id: Option<String>,
    /// Slot ranges such as `0-5460`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<String>,
    /// The server and version it runs (they change node by node in a rollout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_offset: Option<i64>,
    /// A replica's distance behind its master, as a bucket (it changes only
    /// when the replica crosses one, so a busy master is not a status write
    /// per resync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_lag: Option<ReplicationLag>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    /// What is being done, e.g. `AssignSlots`.
    pub name: String,
    /// Human-readable progress, e.g. `shard 2 of 3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

impl StepStatus {
    /// The step as one line: `MoveSlots: moving 512 slot(s), 1024 more to go`.
    pub fn summary(&self) -> String {
        match &self.progress {
            Some(progress) => format!("{}: {progress}", self.name),
            None => self.name.clone(),
        }
    }
}
