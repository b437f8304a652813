//! How a version rollout is asked for (`spec.rollout`) and reported
//! (`status.upgrade`). The status is the rollout's checkpoint: what a
//! restarted operator needs beyond what it observes in Redis and Kubernetes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Bake time after the canary shard when `spec.upgrade.canaryBakeSeconds` is absent.
pub const DEFAULT_BAKE_SECONDS: i32 = 30;
/// How long one step (a Pod recreated, a replica catching up, a failover)
/// may take before its gate counts as failed.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: i32 = 180;

/// `spec.rollout` (`v1`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Seconds the cluster must stay healthy after the canary shard before
    /// the other shards follow; default 30, 0 for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 86400").message("spec.rollout.canaryBakeSeconds must be between 0 and 86400"))]
    pub canary_bake_seconds: Option<i32>,
    /// Seconds a step may take (a recreated Pod back, linked and caught up)
    /// before the rollout counts it failed; default 180.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("spec.rollout.stepTimeoutSeconds must be between 10 and 86400"))]
    pub step_timeout_seconds: Option<i32>,
}

/// `spec.upgrade`, the same settings under their `v1alpha1` name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// Seconds the cluster must stay healthy after the canary shard before
    /// the other shards follow; default 30, 0 for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 86400").message("spec.upgrade.canaryBakeSeconds must be between 0 and 86400"))]
    pub canary_bake_seconds: Option<i32>,
    /// Seconds a step may take (a recreated Pod back, linked and caught up)
    /// before the rollout counts it failed; default 180.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("spec.upgrade.stepTimeoutSeconds must be between 10 and 86400"))]
    pub step_timeout_seconds: Option<i32>,
}

/// A replica further behind its master than this is neither promoted nor
/// counted caught up (failovers and rollouts alike).
pub const MAX_REPLICA_LAG_BYTES: u64 = 1 << 20;

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RolloutPhase {
    /// Shards are being upgraded.
    #[default]
    Progressing,
    /// A gate failed before the point of no return: upgraded nodes go back.
    RollingBack,
    /// Every node is back on the old version; the target is remembered as failed.
    RolledBack,
    /// A gate failed after the point of no return: nothing more is done until it passes.
    Halted,
    /// Every node runs the target.
    Completed,
}

impl RolloutPhase {
    /// Still running: progressing, rolling back, or halted until its gates pass.
    pub fn is_active(self) -> bool {
        matches!(self, RolloutPhase::Progressing | RolloutPhase::RollingBack | RolloutPhase::Halted)
    }
}

/// One rollout from one catalog entry to the next (a multi-hop target is
/// several rollouts in a row).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    pub phase: RolloutPhase,
    /// The release the nodes ran, e.g. `redis 6.2.14`, and its image.
    pub from: String,
    pub from_image: String,
    /// This rollout's release and image.
    pub to: String,
    pub to_image: String,
    /// The RedisOperation this rollout runs for (a `RollingRestart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// What `spec` asks for in the end, when that is more than one hop away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_target: Option<String>,
    /// The step in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<RolloutStep>,
    /// When the step in progress began, and the containers' restarts then:
    /// a gate fails when they grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_time: Option<Time>,
    #[serde(default)]
    pub restarts_at_step_start: i32,
    pub shards_done: i32,
    pub shards_total: i32,
    /// The shard upgraded first; the others wait for it to bake.
    pub canary_shard: i32,
    /// When the canary's bake time ends (set once the canary shard is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_bake_until: Option<Time>,
    /// When a node on the new version first became master: no going back after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_of_no_return_time: Option<Time>,
    /// A shard without replicas gets a temporary replica on the new version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surge_shard: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<RollbackStatus>,
    /// Why the rollout is halted, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    pub shard: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `Recreate`, `Failover`, `Surge`, `Bake`, `Wait`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    /// The release that failed, e.g. `redis 7.0.15`, and its image: not
    /// tried again until `spec` asks for something else.
    pub target: String,
    pub target_image: String,
    /// The gate that failed: `ContainerRestarts`, `NodeHealthy`, `CaughtUp`.
    pub gate: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}
