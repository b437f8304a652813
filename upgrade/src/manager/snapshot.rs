//! What one upgrade restores and installs, captured by `slotkeeper upgrade
//! apply` into ConfigMap `slotkeeper-upgrade-<plan>` (owned by the plan):
//! the CRDs and operator Deployment as they were, and the new release's CRDs
//! and operator objects as the pipeline gave them.
//!
//! The manager applies it with the operator's rights, so it trusts it only
//! as far as it can check it: the content must still have the digest the
//! plan recorded when it was made, and every object must be one the plan
//! names (our CRDs; the operator's Deployment, Services, budget and policy
//! in its namespace, the Deployment running the plan's image).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use slotkeeper_api::self_upgrade::{OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, SlotkeeperUpgrade};

const PREVIOUS_CRDS: &str = "previous-crds.json";
const PREVIOUS_OPERATOR: &str = "previous-operator.json";
const NEXT_CRDS: &str = "next-crds.json";
const NEXT_OPERATOR: &str = "next-operator.json";

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Our CRDs as installed before the upgrade (spec and names only).
    pub previous_crds: Vec<CustomResourceDefinition>,
    /// The operator Deployment as it was (an apply configuration), if any.
    pub previous_operator: Option<Value>,
    pub next_crds: Vec<CustomResourceDefinition>,
    /// Every object of the new release's operator.yaml, Deployment first.
    pub next_operator: Vec<Value>,
}

impl Snapshot {
    pub fn previous(&self, crd: &str) -> Option<&CustomResourceDefinition> {
        self.previous_crds.iter().find(|c| c.metadata.name.as_deref() == Some(crd))
    }

    pub fn next_crd_names(&self) -> Vec<String> {
        self.next_crds.iter().filter_map(|c| c.metadata.name.clone()).collect()
    }

    /// The image the operator Deployment had.
    pub fn previous_image(&self) -> Option<&str> {
        self.previous_operator.as_ref()?.pointer("/spec/template/spec/containers/0/image")?.as_str()
    }

    fn data(&self) -> BTreeMap<String, String> {
        let text = |v: &dyn erased::Json| v.json();
        BTreeMap::from([
            (PREVIOUS_CRDS.to_string(), text(&self.previous_crds)),
            (PREVIOUS_OPERATOR.to_string(), text(&self.previous_operator)),
            (NEXT_CRDS.to_string(), text(&self.next_crds)),
            (NEXT_OPERATOR.to_string(), text(&self.next_operator)),
        ])
    }

    /// `sha256:<hex>` over the ConfigMap's data, key by key.
    pub fn digest(&self) -> String {
        digest_of(&self.data())
    }

    pub fn to_config_map(&self, name: &str, owner: OwnerReference) -> ConfigMap {
        let data = self.data();
        ConfigMap {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(OPERATOR_NAMESPACE.into()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    /// The snapshot of `plan`, if its content is what the plan recorded and
    /// it names only objects an upgrade of Slotkeeper may touch.
    pub fn verified(config_map: &ConfigMap, plan: &SlotkeeperUpgrade) -> Result<Self, String> {
        let name = config_map.metadata.name.as_deref().unwrap_or_default();
        let Some(recorded) = plan.spec.snapshot_digest.as_deref() else {
            return Err(
                "refusing the snapshot: the plan records no spec.snapshotDigest (made by an older `slotkeeper upgrade apply`); delete the plan and run `slotkeeper upgrade apply` again"
                    .into(),
            );
        };
        let data = config_map.data.clone().unwrap_or_default();
        let found = digest_of(&data);
        if found != recorded {
            return Err(format!(
                "refusing the snapshot: ConfigMap {OPERATOR_NAMESPACE}/{name} was changed after the plan was made (digest {found}, the plan recorded {recorded}); nothing is applied from it"
            ));
        }
        let snapshot = Self::from_config_map(config_map)?;
        snapshot.names_only_ours(&plan.spec.image).map_err(|why| format!("refusing the snapshot: {why}"))?;
        Ok(snapshot)
    }

    /// Every object is one an upgrade of Slotkeeper installs or restores.
    fn names_only_ours(&self, image: &str) -> Result<(), String> {
        let ours: Vec<String> = slotkeeper_api::crds().iter().filter_map(|c| c.metadata.name.clone()).collect();
        for crd in self.previous_crds.iter().chain(&self.next_crds) {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            if !ours.iter().any(|o| o == name) || crd.spec.group != slotkeeper_api::GROUP {
                return Err(format!("CRD {name:?} is not one of Slotkeeper's ({})", ours.join(", ")));
            }
        }
        if let Some(previous) = &self.previous_operator {
            allowed_operator_object(previous)?;
            if previous["kind"] != "Deployment" {
                return Err("the previous operator is not a Deployment".into());
            }
        }
        for object in &self.next_operator {
            allowed_operator_object(object)?;
        }
        let deployments: Vec<&Value> = self.next_operator.iter().filter(|o| o["kind"] == "Deployment").collect();
        let next_image = deployments.first().and_then(|d| d.pointer("/spec/template/spec/containers/0/image"));
        let images: Vec<&str> = deployments
            .iter()
            .flat_map(|d| d.pointer("/spec/template/spec/containers").and_then(Value::as_array).into_iter().flatten())
            .filter_map(|c| c["image"].as_str())
            .collect();
        if deployments.len() != 1
            || next_image.and_then(Value::as_str) != Some(image)
            || images.iter().any(|i| *i != image)
        {
            return Err(format!("the new operator must be one Deployment running only the plan's image {image}"));
        }
        Ok(())
    }

    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self, String> {
        let data = config_map.data.clone().unwrap_or_default();
        fn field<T: serde::de::DeserializeOwned>(data: &BTreeMap<String, String>, key: &str) -> Result<T, String> {
            let text = data.get(key).ok_or_else(|| format!("the snapshot has no {key}"))?;
            serde_json::from_str(text).map_err(|e| format!("the snapshot's {key} is unreadable: {e}"))
        }
        Ok(Self {
            previous_crds: field(&data, PREVIOUS_CRDS)?,
            previous_operator: field(&data, PREVIOUS_OPERATOR)?,
            next_crds: field(&data, NEXT_CRDS)?,
            next_operator: field(&data, NEXT_OPERATOR)?,
        })
    }
}

/// The kinds and names of `deploy/operator.yaml`, the only objects an upgrade applies besides CRDs.
const OPERATOR_OBJECTS: [(&str, &str, &str); 5] = [
    ("apps/v1", "Deployment", OPERATOR_DEPLOYMENT),
    ("v1", "Service", "slotkeeper"),
    ("v1", "Service", slotkeeper_api::names::WEBHOOK_SERVICE),
    ("policy/v1", "PodDisruptionBudget", "slotkeeper"),
    ("networking.k8s.io/v1", "NetworkPolicy", "slotkeeper"),
];

fn allowed_operator_object(object: &Value) -> Result<(), String> {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
    let namespace = object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(OPERATOR_NAMESPACE);
    let known = OPERATOR_OBJECTS.iter().any(|(v, k, n)| *v == api_version && *k == kind && *n == name);
    if !known || namespace != OPERATOR_NAMESPACE {
        let names: Vec<String> = OPERATOR_OBJECTS.iter().map(|(_, k, n)| format!("{k} {n}")).collect();
        return Err(format!(
            "{kind} {namespace}/{name} ({api_version}) is not an object of Slotkeeper's operator.yaml ({} in {OPERATOR_NAMESPACE})",
            names.join(", ")
        ));
    }
    Ok(())
}

fn digest_of(data: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (key, value) in data {
        // Lengths first: no two different maps hash the same bytes.
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value.as_bytes());
    }
    let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// An object as something to apply again: its identity, labels and spec,
/// without what the apiserver adds (status, uid, managedFields, ...).
pub fn apply_configuration(object: &Value) -> Value {
    let mut out = json!({
        "apiVersion": object["apiVersion"],
        "kind": object["kind"],
        "metadata": { "name": object["metadata"]["name"] },
    });
    for key in ["namespace", "labels"] {
        if let Some(value) = object["metadata"].get(key) {
            out["metadata"][key] = value.clone();
        }
    }
    if let Some(annotations) = object["metadata"]["annotations"].as_object() {
        // kubectl's own bookkeeping is not part of what the object is.
        let kept: serde_json::Map<String, Value> = annotations
            .iter()
            .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io/") && !k.starts_with("deployment.kubernetes.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() {
            out["metadata"]["annotations"] = Value::Object(kept);
        }
    }
    for (key, value) in object.as_object().into_iter().flatten() {
        if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            out[key] = value.clone();
        }
    }
    out
}

/// A CRD reduced to what installs it.
pub fn crd_configuration(crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    let value = serde_json::to_value(crd).expect("a CRD serializes");
    serde_json::from_value(apply_configuration(&value)).expect("a CRD's apply configuration is a CRD")
}

mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).expect("serializable")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_its_config_map() {
        let snapshot = Snapshot {
            previous_crds: slotkeeper_api::crds().iter().map(crd_configuration).collect(),
            previous_operator: Some(
                json!({"spec": {"template": {"spec": {"containers": [{"image": "slotkeeper:0.1.0"}]}}}}),
            ),
            next_crds: slotkeeper_api::crds(),
            next_operator: vec![json!({"kind": "Deployment"})],
        };
        let owner = OwnerReference { name: "to-0-2-0".into(), ..Default::default() };
        let back = Snapshot::from_config_map(&snapshot.to_config_map("slotkeeper-upgrade-to-0-2-0", owner)).unwrap();
        assert_eq!(back, snapshot);
        assert_eq!(back.previous_image(), Some("slotkeeper:0.1.0"));
    }

    fn plan_of(snapshot: &Snapshot, image: &str) -> SlotkeeperUpgrade {
        let spec = slotkeeper_api::self_upgrade::SlotkeeperUpgradeSpec {
            release: "0.2.0".into(),
            image: image.into(),
            approved_steps: vec![],
            gates: vec![],
            rollback: false,
            snapshot_digest: Some(snapshot.digest()),
        };
        SlotkeeperUpgrade::new("to-0-2-0", spec)
    }

    fn release_snapshot() -> Snapshot {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "slotkeeper", "namespace": "slotkeeper-system"},
            "spec": {"template": {"spec": {"containers": [{"image": "slotkeeper:0.2.0"}]}}}});
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "slotkeeper-webhook", "namespace": "slotkeeper-system"}});
        Snapshot {
            previous_crds: slotkeeper_api::crds().iter().map(crd_configuration).collect(),
            previous_operator: Some(deployment.clone()),
            next_crds: slotkeeper_api::crds(),
            next_operator: vec![deployment, service],
        }
    }

    fn config_map(snapshot: &Snapshot) -> ConfigMap {
        snapshot.to_config_map("slotkeeper-upgrade-to-0-2-0", OwnerReference::default())
    }

    #[test]
    fn the_snapshot_the_plan_recorded_is_applied() {
        let snapshot = release_snapshot();
        let plan = plan_of(&snapshot, "slotkeeper:0.2.0");
        assert_eq!(Snapshot::verified(&config_map(&snapshot), &plan), Ok(snapshot));
    }

    /// Security review finding 6: whoever may edit ConfigMaps in the
    /// operator's namespace adds an object to the snapshot.
    #[test]
    fn a_snapshot_changed_after_the_plan_is_refused() {
        let snapshot = release_snapshot();
        let plan = plan_of(&snapshot, "slotkeeper:0.2.0");
        let mut edited = config_map(&snapshot);
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "pwned"}, "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}});
        let mut objects = snapshot.next_operator.clone();
        objects.push(binding);
        edited.data.as_mut().unwrap().insert(NEXT_OPERATOR.into(), serde_json::to_string(&objects).unwrap());
        let refused = Snapshot::verified(&edited, &plan).unwrap_err();
        assert!(refused.contains("was changed after the plan was made"), "{refused}");
        let mut unpinned = plan.clone();
        unpinned.spec.snapshot_digest = None;
        let refused = Snapshot::verified(&config_map(&snapshot), &unpinned).unwrap_err();
        assert!(refused.contains("records no spec.snapshotDigest"), "{refused}");
    }

    /// Even as recorded, a snapshot may hold only what an upgrade of Slotkeeper touches.
    #[test]
    fn a_snapshot_naming_other_objects_is_refused() {
        type Change = Box<dyn Fn(&mut Snapshot)>;
        let cases: Vec<(Change, &str)> = vec![
            (
                Box::new(|s| {
                    s.next_operator.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "x"}}))
                }),
                "ClusterRoleBinding slotkeeper-system/x",
            ),
            (
                Box::new(|s| s.next_operator[1]["metadata"]["namespace"] = json!("kube-system")),
                "Service kube-system/slotkeeper-webhook",
            ),
            (
                Box::new(|s| s.next_crds[0].metadata.name = Some("clusterroles.rbac.example.com".into())),
                "is not one of Slotkeeper's",
            ),
            (
                Box::new(|s| {
                    s.next_operator[0]["spec"]["template"]["spec"]["containers"][0]["image"] = json!("attacker:latest")
                }),
                "running only the plan's image slotkeeper:0.2.0",
            ),
        ];
        for (change, message) in cases {
            let mut snapshot = release_snapshot();
            change(&mut snapshot);
            let plan = plan_of(&snapshot, "slotkeeper:0.2.0");
            let refused = Snapshot::verified(&config_map(&snapshot), &plan).unwrap_err();
            assert!(refused.contains(message), "expected {message:?} in {refused}");
        }
    }

    #[test]
    fn an_apply_configuration_drops_what_the_apiserver_added() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "slotkeeper", "namespace": "slotkeeper-system", "uid": "u", "resourceVersion": "7",
                "managedFields": [], "labels": {"a": "b"},
                "annotations": {"deployment.kubernetes.io/revision": "2", "team": "sre"}},
            "spec": {"replicas": 2}, "status": {"replicas": 2}
        });
        assert_eq!(
            apply_configuration(&live),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "slotkeeper", "namespace": "slotkeeper-system", "labels": {"a": "b"},
                    "annotations": {"team": "sre"}},
                "spec": {"replicas": 2}})
        );
    }
}
