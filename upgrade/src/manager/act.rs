//! Act: one idempotent change per call, each a server-side apply (field
//! manager `slotkeeper-upgrade`, beside the webhook keeper's `slotkeeper`,
//! which owns only the CRDs' conversion settings) or a replace to restore.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::Value;
use slotkeeper_api::self_upgrade::{MANAGER_DEPLOYMENT, OPERATOR_NAMESPACE};

use super::decide::Action;
use super::snapshot::{Snapshot, apply_configuration, crd_configuration};
use super::{ConversionSource, ManagerError};
use crate::migrate::migrate_storage;
use crate::storage::{storage_version, stored_versions, with_storage, without_deprecation};

pub const UPGRADE_FIELD_MANAGER: &str = "slotkeeper-upgrade";

/// How long one storage migration may take before the step reports it and retries.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(600);

pub async fn act(
    client: &Client,
    action: Action,
    snapshot: &Snapshot,
    conversion: &ConversionSource,
) -> Result<(), ManagerError> {
    match action {
        Action::InstallCrds => {
            let conversion = conversion().await.map_err(ManagerError::Webhook)?;
            for next in &snapshot.next_crds {
                let name = next.metadata.name.as_deref().unwrap_or_default();
                let storage = snapshot.previous(name).and_then(storage_version).or_else(|| storage_version(next));
                let crd = with_storage(without_deprecation(next.clone()), storage.unwrap_or_default());
                apply_crd(client, crd, &conversion).await?;
            }
        }
        Action::SwitchStorage => {
            let conversion = conversion().await.map_err(ManagerError::Webhook)?;
            for next in &snapshot.next_crds {
                apply_crd(client, without_deprecation(next.clone()), &conversion).await?;
            }
        }
        Action::Finalize => {
            let conversion = conversion().await.map_err(ManagerError::Webhook)?;
            for next in &snapshot.next_crds {
                apply_crd(client, next.clone(), &conversion).await?;
            }
        }
        Action::MigrateStorage => {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            for next in &snapshot.next_crds {
                let name = next.metadata.name.clone().unwrap_or_default();
                let installed = crds.get(&name).await.map_err(ManagerError::kube(format!("CRD {name}")))?;
                let storage = storage_version(&installed).unwrap_or_default().to_string();
                if stored_versions(&installed) != [storage] {
                    migrate_storage(client, &name, Duration::from_secs(2), MIGRATION_TIMEOUT).await?;
                }
            }
        }
        Action::RollOperator => {
            for object in &snapshot.next_operator {
                apply_object(client, object).await?;
            }
        }
        Action::RestoreOperator => {
            let previous = snapshot
                .previous_operator
                .as_ref()
                .ok_or_else(|| ManagerError::Snapshot("it holds no previous operator Deployment to restore".into()))?;
            apply_object(client, &apply_configuration(previous)).await?;
        }
        Action::RestoreCrds => {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            for previous in &snapshot.previous_crds {
                let name = previous.metadata.name.clone().unwrap_or_default();
                forget_unserved_managers(client, previous).await?;
                let mut current = crds.get(&name).await.map_err(ManagerError::kube(format!("CRD {name}")))?;
                current.spec = previous.spec.clone();
                crds.replace(
                    &name,
                    &PostParams { field_manager: Some(UPGRADE_FIELD_MANAGER.into()), ..Default::default() },
                    &current,
                )
                .await
                .map_err(ManagerError::kube(format!("restoring CRD {name}")))?;
            }
        }
        Action::RemoveManager => {
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
            match deployments.delete(MANAGER_DEPLOYMENT, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(ManagerError::Kube { what: "deleting the manager's Deployment".into(), source });
                }
            }
        }
    }
    Ok(())
}

/// Drops, from every object of the CRD, the managedFields entries of
/// versions the previous CRD does not serve (the new release's writes at
/// v1): the apiserver cannot convert them once v1 is gone, and every
/// server-side apply of the previous release would then fail.
async fn forget_unserved_managers(client: &Client, previous: &CustomResourceDefinition) -> Result<(), ManagerError> {
    let group = &previous.spec.group;
    let served: Vec<String> =
        previous.spec.versions.iter().filter(|v| v.served).map(|v| format!("{group}/{}", v.name)).collect();
    let Some(version) = storage_version(previous) else { return Ok(()) };
    let gvk = GroupVersionKind::gvk(group, version, &previous.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &previous.spec.names.plural);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let what = format!("{} objects", previous.spec.names.plural);
    for object in all.list(&Default::default()).await.map_err(ManagerError::kube(what.clone()))?.items {
        let fields = object.metadata.managed_fields.clone().unwrap_or_default();
        let unserved = |f: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            f.api_version.as_ref().is_some_and(|v| !served.contains(v))
        };
        if !fields.iter().any(unserved) {
            continue;
        }
        let kept: Vec<_> = fields.into_iter().filter(|f| !unserved(f)).collect();
        // An empty list leaves managedFields as they are; one empty entry clears them.
        let kept =
            if kept.is_empty() { serde_json::json!([{}]) } else { serde_json::to_value(kept).expect("serializes") };
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        let patch = serde_json::json!({"metadata": {"managedFields": kept}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(ManagerError::kube(format!("{what}: managedFields of {namespace}/{name}")))?;
    }
    Ok(())
}

/// Applies a CRD, with `conversion` (the webhook's, with its CA) when it
/// serves more than one version.
async fn apply_crd(client: &Client, crd: CustomResourceDefinition, conversion: &Value) -> Result<(), ManagerError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(crd_configuration(&crd)).expect("a CRD serializes");
    if crd.spec.versions.len() > 1 {
        value["spec"]["conversion"] = conversion.clone();
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(&name, &PatchParams::apply(UPGRADE_FIELD_MANAGER).force(), &Patch::Apply(value))
        .await
        .map_err(ManagerError::kube(format!("applying CRD {name}")))?;
    tracing::info!(crd = %name, "CRD applied");
    Ok(())
}

/// Applies one object of the operator's manifests (namespaced, in the operator's namespace).
async fn apply_object(client: &Client, object: &Value) -> Result<(), ManagerError> {
    let (api_version, kind) =
        (object["apiVersion"].as_str().unwrap_or_default(), object["kind"].as_str().unwrap_or_default());
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or(OPERATOR_NAMESPACE);
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural(kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    api.patch(&name, &PatchParams::apply(UPGRADE_FIELD_MANAGER).force(), &Patch::Apply(object))
        .await
        .map_err(ManagerError::kube(format!("applying {kind} {namespace}/{name}")))?;
    tracing::info!(%kind, %name, "applied");
    Ok(())
}

/// The resource name of a kind (`NetworkPolicy` → `networkpolicies`).
pub fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None if lower.ends_with('s') => format!("{lower}es"),
        None => format!("{lower}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn plurals_of_the_operators_kinds() {
        assert_eq!(super::plural("NetworkPolicy"), "networkpolicies");
        assert_eq!(super::plural("PodDisruptionBudget"), "poddisruptionbudgets");
        assert_eq!(super::plural("Deployment"), "deployments");
        assert_eq!(super::plural("Service"), "services");
    }
}
