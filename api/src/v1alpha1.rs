//! `slotkeeper.io/v1alpha1`, exactly as the previous release served it: kept
//! served (deprecated) so that manifests and clients written for it still
//! work, converted to and from `v1` by [`crate::conversion`]. Only the shapes
//! that differ from `v1` live here; the rest is shared.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::catalog::Engine;
use crate::cluster::{AuthSpec, CATALOG_RULE, RedisClusterStatus, SchedulingSpec, StorageSpec, VERSION_RULE};
use crate::operation::{FailoverSpec, OperationType, RedisOperationStatus};
use crate::rollout::UpgradeSpec;

/// This version, for manifests written as text.
pub const API_VERSION: &str = "slotkeeper.io/v1alpha1";

const CATALOG_MESSAGE: &str = "spec.engine and spec.version must name an entry of the operator's version catalog: redis 6.2.14, redis 7.0.15, valkey 8.1.8";

/// A Redis Cluster: `masters` shards, each with `replicasPerMaster` replicas.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "slotkeeper.io",
    version = "v1alpha1",
    kind = "RedisCluster",
    plural = "redisclusters",
    shortname = "rdc",
    namespaced,
    deprecated,
    status = "RedisClusterStatus",
    scale(spec_replicas_path = ".spec.masters", status_replicas_path = ".status.readyMasters"),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Masters","type":"integer","jsonPath":".spec.masters"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","description":"replicas per master","jsonPath":".spec.replicasPerMaster"}"#,
    printcolumn = r#"{"name":"Engine","type":"string","jsonPath":".status.currentEngine"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion"}"#,
    printcolumn = r#"{"name":"Target","type":"string","priority":1,"jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("has(self.spec.storage) == has(oldSelf.spec.storage)").message("spec.storage cannot be added or removed after creation: a cluster is either ephemeral or persistent; create a new RedisCluster instead")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(CATALOG_RULE).message(CATALOG_MESSAGE))]
pub struct RedisClusterSpec {
    /// Number of master shards; at least 3, so a majority survives the loss of one.
    #[x_kube(validation = Rule::new("self >= 3").message("spec.masters must be at least 3: Redis Cluster needs a majority of masters to fail over"))]
    pub masters: i32,

    /// Replicas of each master, 0 to 5.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 5").message("spec.replicasPerMaster must be between 0 and 5"))]
    pub replicas_per_master: i32,

    /// The server: `redis` (default) or `valkey`.
    #[serde(default)]
    pub engine: Engine,

    /// The engine's version (semver), one of the operator's version catalog.
    /// Changing it rolls the cluster out to it along the catalog's edges.
    #[x_kube(validation = Rule::new(VERSION_RULE).message("spec.version must be a semantic version such as 7.0.15"))]
    #[schemars(length(max = 32))]
    pub version: String,

    /// Overrides the catalog's image for `engine` and `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Resources of each Redis container; `maxmemory` derives from the memory limit unless configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Persistent storage per node; absent means ephemeral (emptyDir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// Where the password lives; a random one is generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// ACL users (see `v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<crate::acl::AclSpec>,

    /// redis.conf overrides (allow-listed keys only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "config_schema")]
    pub config: BTreeMap<String, String>,

    /// How version rollouts go (canary bake time, step timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,

    /// Stops every action on this cluster while true; a rollout holds
    /// between steps and resumes from its checkpoint.
    #[serde(default)]
    pub paused: bool,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
}

/// One operation on one cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "slotkeeper.io",
    version = "v1alpha1",
    kind = "RedisOperation",
    plural = "redisoperations",
    shortname = "rdo",
    namespaced,
    deprecated,
    status = "RedisOperationStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
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
    pub cluster: String,
    #[serde(rename = "type")]
    pub type_: OperationType,
    /// For `Failover`: which shard, and optionally which replica to promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,
}

/// The schema of `spec.config`: the allow-list's rules (see [`crate::redis_config`]).
fn config_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let description = "redis.conf overrides: allow-listed keys only, each value checked by type.";
    schemars::Schema::try_from(crate::redis_config::schema("spec.config", description)).expect("an object schema")
}
