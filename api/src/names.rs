//! Every label, annotation, condition type and reason in one place.

pub const FIELD_MANAGER: &str = "slotkeeper";

/// The namespace `deploy/` runs the operator in, and the value of
/// [`LABEL_NAME`] on its Pods: Redis admits the operator by both.
pub const OPERATOR_NAMESPACE: &str = "slotkeeper-system";
pub const OPERATOR_APP: &str = "slotkeeper";
/// The ServiceAccount `deploy/` runs the operator as, in [`OPERATOR_NAMESPACE`].
pub const OPERATOR_SERVICE_ACCOUNT: &str = "slotkeeper";
/// Namespaces of the control plane itself, where the operator never writes.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];
/// The label every namespace carries with its own name (set by the apiserver, not by its owner).
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// The conversion webhook, as `deploy/` addresses it: a Service in the
/// operator's namespace, this path.
pub const WEBHOOK_NAMESPACE: &str = OPERATOR_NAMESPACE;
pub const WEBHOOK_SERVICE: &str = "slotkeeper-webhook";
pub const WEBHOOK_PATH: &str = "/convert";

/// Virtual subresources of `redisclusters` that RBAC grants with the verb
/// `use` (see `deploy/admission.yaml`): running an image outside the catalog,
/// and giving the Pods a priority class.
pub const SUBRESOURCE_CUSTOM_IMAGE: &str = "customimage";
pub const SUBRESOURCE_PRIORITY_CLASS: &str = "priorityclass";

pub const LABEL_CLUSTER: &str = "slotkeeper.io/cluster";
pub const LABEL_SHARD: &str = "slotkeeper.io/shard";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// On a `v1alpha1` object: the fields only `v1` has, as JSON, so that a
/// round trip through `v1alpha1` loses nothing.
pub const ANNOTATION_V1_FIELDS: &str = "conversion.slotkeeper.io/v1-fields";
/// Hash of the desired object, so unchanged objects are never re-applied.
pub const ANNOTATION_SPEC_HASH: &str = "slotkeeper.io/spec-hash";

pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_PROGRESSING: &str = "Progressing";
pub const CONDITION_DEGRADED: &str = "Degraded";

pub const REASON_CLUSTER_HEALTHY: &str = "ClusterHealthy";
pub const REASON_BOOTSTRAPPING: &str = "Bootstrapping";
pub const REASON_WAITING_FOR_PODS: &str = "WaitingForPods";
pub const REASON_PAUSED: &str = "Paused";
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
pub const REASON_REDIS_UNREACHABLE: &str = "RedisUnreachable";
pub const REASON_CONVERGED: &str = "Converged";
pub const REASON_REFUSED: &str = "ScaleInRefused";
pub const REASON_SCALING: &str = "Scaling";
pub const REASON_RECOVERING: &str = "Recovering";
pub const REASON_NONE: &str = "AsExpected";
pub const REASON_UPGRADING: &str = "Upgrading";
pub const REASON_ROLLOUT_HALTED: &str = "RolloutHalted";
pub const REASON_ROLLED_BACK: &str = "RolledBack";
pub const REASON_VERSION_REFUSED: &str = "VersionRefused";
/// Degraded: one failure domain holds a majority of the masters (or a whole
/// shard), so losing it stops writes until Pods are recreated elsewhere.
pub const REASON_PLACEMENT_AT_RISK: &str = "PlacementAtRisk";
/// Progressing: a healthy cluster's master moves to a less loaded failure domain.
pub const REASON_SPREADING_MASTERS: &str = "SpreadingMasters";
