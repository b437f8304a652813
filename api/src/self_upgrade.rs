//! `SlotkeeperUpgrade` (`slotkeeper.io/v1`, cluster-scoped): one upgrade of
//! Slotkeeper itself, from the installed release to a new one, as an
//! ordered plan whose status a pipeline can wait on
//! (`kubectl wait --for=condition=Succeeded slotkeeperupgrade/NAME`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Condition types of a `SlotkeeperUpgrade`.
pub const CONDITION_PLANNED: &str = "Planned";
pub const CONDITION_AWAITING_APPROVAL: &str = "AwaitingApproval";
pub const CONDITION_PROGRESSING: &str = "Progressing";
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
pub const CONDITION_FAILED: &str = "Failed";
pub const CONDITION_ROLLED_BACK: &str = "RolledBack";

/// Where the manager keeps what it restores on rollback and what it installs:
/// ConfigMap `slotkeeper-upgrade-<plan>` in the operator's namespace.
pub const OPERATOR_NAMESPACE: &str = crate::names::OPERATOR_NAMESPACE;
pub const OPERATOR_DEPLOYMENT: &str = "slotkeeper";
/// The one-replica Deployment of the new release that runs a plan until the
/// operator's own Deployment runs that release.
pub const MANAGER_DEPLOYMENT: &str = "slotkeeper-upgrade";
/// The Lease whose holder keeps the webhook's certificates and runs plans.
pub const MANAGER_LEASE: &str = "slotkeeper-upgrade-manager";
/// On the operator's leader Lease: the holder's release, and how many
/// clusters it has reconciled since it took the lease.
pub const LEASE_RELEASE_ANNOTATION: &str = "slotkeeper.io/release";
pub const LEASE_RECONCILED_ANNOTATION: &str = "slotkeeper.io/reconciled-clusters";
/// Who wrote the two above: an earlier holder's words do not count for the current one.
pub const LEASE_ANNOTATED_BY_ANNOTATION: &str = "slotkeeper.io/annotated-by";

pub fn snapshot_name(plan: &str) -> String {
    format!("slotkeeper-upgrade-{plan}")
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "slotkeeper.io",
    version = "v1",
    kind = "SlotkeeperUpgrade",
    plural = "slotkeeperupgrades",
    shortname = "skup",
    status = "SlotkeeperUpgradeStatus",
    printcolumn = r#"{"name":"From","type":"string","jsonPath":".status.from"}"#,
    printcolumn = r#"{"name":"To","type":"string","jsonPath":".spec.release"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.currentStep"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.spec.release == oldSelf.spec.release && self.spec.image == oldSelf.spec.image").message("spec.release and spec.image of a SlotkeeperUpgrade are immutable: create a new SlotkeeperUpgrade instead"),
    validation = Rule::new("!has(oldSelf.spec.snapshotDigest) || (has(self.spec.snapshotDigest) && self.spec.snapshotDigest == oldSelf.spec.snapshotDigest)").message("spec.snapshotDigest of a SlotkeeperUpgrade is immutable: it pins what the upgrade installs")
)]
#[serde(rename_all = "camelCase")]
pub struct SlotkeeperUpgradeSpec {
    /// The release upgraded to, e.g. `0.2.0`.
    #[schemars(length(min = 1, max = 64))]
    pub release: String,
    /// The operator image of that release, e.g. `slotkeeper:0.2.0`.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Names of the gated steps approved to run (`kubectl patch --type=merge
    /// -p '{"spec":{"approvedSteps":["Finalize"]}}'`, or the console's button).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub approved_steps: Vec<String>,
    /// Steps gated besides the default one (`Finalize`), e.g. `SwitchStorage`
    /// to look at the new operator before the point where rollback ends
    /// (`slotkeeper upgrade apply --gate SwitchStorage`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub gates: Vec<String>,
    /// Undo the upgrade: restore the previous CRDs and operator. Honoured
    /// only before the storage version switches (`slotkeeper upgrade rollback`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollback: bool,
    /// `sha256:<hex>` of the snapshot ConfigMap `slotkeeper-upgrade-<plan>`
    /// as `slotkeeper upgrade apply` wrote it. The manager applies the
    /// snapshot only while its content still has this digest, so whoever may
    /// edit ConfigMaps in the operator's namespace cannot change what an
    /// upgrade installs. Immutable once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 80))]
    pub snapshot_digest: Option<String>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StepState {
    #[default]
    Pending,
    Running,
    AwaitingApproval,
    Succeeded,
    Failed,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStep {
    /// `Preflight`, `InstallCRDs`, `RollOperator`, `SwitchStorage`, `MigrateStorage`, `Finalize`.
    pub name: String,
    /// What the step does, in a sentence.
    pub description: String,
    pub state: StepState,
    /// The step cannot start until its name is in `spec.approvedSteps`.
    #[serde(default)]
    pub gated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SlotkeeperUpgradeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The release installed when the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<UpgradeStep>,
    /// The step in progress, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    /// What the preflight found: unsafe CRD changes refuse the plan; clusters
    /// on a Redis version the new catalog no longer has are listed and left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
}
