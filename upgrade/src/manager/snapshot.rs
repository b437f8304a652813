//! What one upgrade restores and installs, captured by `slotkeeper upgrade
//! apply` into ConfigMap `slotkeeper-upgrade-<plan>` (owned by the plan):
//! the CRDs and operator Deployment as they were, and the new release's CRDs
//! and operator objects as the pipeline gave them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use slotkeeper_api::self_upgrade::OPERATOR_NAMESPACE;

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

    pub fn to_config_map(&self, name: &str, owner: OwnerReference) -> ConfigMap {
        let text = |v: &dyn erased::Json| v.json();
        let data = BTreeMap::from([
            (PREVIOUS_CRDS.to_string(), text(&self.previous_crds)),
            (PREVIOUS_OPERATOR.to_string(), text(&self.previous_operator)),
            (NEXT_CRDS.to_string(), text(&self.next_crds)),
            (NEXT_OPERATOR.to_string(), text(&self.next_operator)),
        ]);
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
