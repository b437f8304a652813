//! Observe: everything a plan's next step depends on, read in one pass.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use slotkeeper_api::self_upgrade::{
    LEASE_ANNOTATED_BY_ANNOTATION, LEASE_RECONCILED_ANNOTATION, LEASE_RELEASE_ANNOTATION, MANAGER_DEPLOYMENT,
    OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, SlotkeeperUpgrade, snapshot_name,
};

use super::ManagerError;
use super::snapshot::Snapshot;
use crate::installed::{self, image_of};
use crate::plan::InstalledCluster;
use crate::storage::storage_version;

/// The operator's leader Lease (the operator crate's name for it).
pub const LEADER_LEASE: &str = "slotkeeper-leader";

#[derive(Debug, Clone)]
pub struct Observed {
    /// What `upgrade apply` captured, or why it cannot be read (not written yet).
    pub snapshot: Result<Snapshot, String>,
    /// Our CRDs as installed now, among the new release's.
    pub crds: Vec<CustomResourceDefinition>,
    pub clusters: Vec<InstalledCluster>,
    pub operator: Option<OperatorState>,
    pub leader: Option<LeaderState>,
    /// Whether RedisClusters can be listed at the new release's storage version.
    pub next_served: bool,
    /// Whether the upgrade manager's own Deployment still exists.
    pub manager_present: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorState {
    pub image: Option<String>,
    /// Every replica updated, ready and available; no Pod of an older template left.
    pub rolled_out: bool,
    /// The image of each of the operator's Pods.
    pub pod_images: Vec<String>,
    /// e.g. "1 of 2 replicas updated, 1 ready".
    pub summary: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaderState {
    pub holder: String,
    /// The holder's release, from its Lease annotation (absent before 0.2.0).
    pub release: Option<String>,
    /// Clusters the holder has reconciled since it took the Lease.
    pub reconciled: usize,
}

pub async fn observe(client: &Client, plan: &SlotkeeperUpgrade) -> Result<Observed, ManagerError> {
    let name = plan.metadata.name.clone().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let snapshot_name = snapshot_name(&name);
    let snapshot = match config_maps.get_opt(&snapshot_name).await.map_err(ManagerError::kube("the snapshot"))? {
        Some(config_map) => Snapshot::verified(&config_map, plan),
        None => Err(format!(
            "waiting for ConfigMap {OPERATOR_NAMESPACE}/{snapshot_name} (written by `slotkeeper upgrade apply`)"
        )),
    };
    let names = snapshot.as_ref().map(Snapshot::next_crd_names).unwrap_or_default();
    let crds = installed::crds(client, &names).await?;
    let clusters = installed::clusters(client, &crds).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let deployment =
        deployments.get_opt(OPERATOR_DEPLOYMENT).await.map_err(ManagerError::kube("the operator's Deployment"))?;
    let pod_images: Vec<String> =
        installed::operator_pods(client).await?.iter().filter_map(|p| image_of(p.spec.as_ref())).collect();
    let operator = deployment.map(|d| operator_state(&d, pod_images));
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let leader = leases.get_opt(LEADER_LEASE).await.map_err(ManagerError::kube("the leader Lease"))?.map(|lease| {
        let annotations = lease.metadata.annotations.unwrap_or_default();
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        // A previous holder's annotations stay on the Lease (an older release keeps them).
        let own = annotations.get(LEASE_ANNOTATED_BY_ANNOTATION) == Some(&holder);
        LeaderState {
            release: annotations.get(LEASE_RELEASE_ANNOTATION).filter(|_| own).cloned(),
            reconciled: annotations
                .get(LEASE_RECONCILED_ANNOTATION)
                .filter(|_| own)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            holder,
        }
    });
    let next_served =
        match snapshot.as_ref().ok().and_then(|s| s.next_crds.iter().find(|c| c.spec.names.kind == "RedisCluster")) {
            Some(crd) => lists_at(client, crd, storage_version(crd).unwrap_or_default()).await,
            None => false,
        };
    let manager_present = deployments
        .get_opt(MANAGER_DEPLOYMENT)
        .await
        .map_err(ManagerError::kube("the manager's Deployment"))?
        .is_some();
    Ok(Observed { snapshot, crds, clusters, operator, leader, next_served, manager_present })
}

fn operator_state(deployment: &Deployment, pod_images: Vec<String>) -> OperatorState {
    let spec = &deployment.spec;
    let wanted = spec.replicas.unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let updated = status.updated_replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let current = status.observed_generation >= deployment.metadata.generation;
    OperatorState {
        image: image_of(spec.template.spec.as_ref()),
        rolled_out: current
            && updated == wanted
            && ready == wanted
            && available == wanted
            && status.replicas.unwrap_or(0) == wanted,
        pod_images,
        summary: format!(
            "{updated} of {wanted} replicas updated, {ready} ready, {} in all",
            status.replicas.unwrap_or(0)
        ),
    }
}

/// Whether the apiserver answers a list of `crd`'s kind at `version`.
async fn lists_at(client: &Client, crd: &CustomResourceDefinition, version: &str) -> bool {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &installed::resource_at(crd, version));
    api.list(&ListParams::default().limit(1)).await.is_ok()
}
