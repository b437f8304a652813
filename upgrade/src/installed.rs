//! Reading the running installation: our CRDs as installed, the operator's
//! Deployment and Pods, and every RedisCluster (read at the installed
//! storage version and converted to v1 by the webhook's own functions, as the
//! installed CRDs may not serve v1 yet).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, Resource as _};
use slotkeeper_api::RedisCluster;
use slotkeeper_api::self_upgrade::{OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE};

use crate::plan::{Installed, InstalledCluster};
use crate::storage::storage_version;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("RedisCluster {name} cannot be converted to v1: {why}")]
    Convert { name: String, why: String },
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReadError {
    let what = what.into();
    move |source| ReadError::Kube { what, source }
}

/// The image of a Pod template's (or Pod's) first container.
pub fn image_of(spec: Option<&PodSpec>) -> Option<String> {
    spec.and_then(|s| s.containers.first()).and_then(|c| c.image.clone())
}

/// The installed CRDs among `names` (absent ones are skipped).
pub async fn crds(client: &Client, names: &[String]) -> Result<Vec<CustomResourceDefinition>, ReadError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut installed = Vec::new();
    for name in names {
        if let Some(crd) = api.get_opt(name).await.map_err(kube_err(format!("CustomResourceDefinition {name}")))? {
            installed.push(crd);
        }
    }
    Ok(installed)
}

/// The operator's own Pods (not the upgrade manager's), by their label.
pub async fn operator_pods(client: &Client) -> Result<Vec<Pod>, ReadError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/name={OPERATOR_DEPLOYMENT}"));
    let list = pods.list(&selector).await.map_err(kube_err("the operator's Pods"))?;
    Ok(list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
}

/// The running installation, as far as `crd_names` name it.
pub async fn read(client: &Client, crd_names: &[String]) -> Result<Installed, ReadError> {
    let crds = crds(client, crd_names).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let deployment = deployments.get_opt(OPERATOR_DEPLOYMENT).await.map_err(kube_err("the operator's Deployment"))?;
    let operator_image = deployment.and_then(|d| image_of(d.spec.template.spec.as_ref()));
    let pod_images = operator_pods(client).await?.iter().filter_map(|p| image_of(p.spec.as_ref())).collect();
    let clusters = clusters(client, &crds).await?;
    Ok(Installed { crds, operator_image, pod_images, clusters })
}

/// `crd`'s kind at `version`, for a dynamic client.
pub fn resource_at(crd: &CustomResourceDefinition, version: &str) -> ApiResource {
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.into(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

/// Every RedisCluster, read at the installed storage version and converted to v1.
pub async fn clusters(client: &Client, crds: &[CustomResourceDefinition]) -> Result<Vec<InstalledCluster>, ReadError> {
    let Some(crd) = crds.iter().find(|c| c.spec.names.kind == RedisCluster::kind(&())) else {
        return Ok(Vec::new());
    };
    // The apiserver refuses a CRD without exactly one storage version.
    let Some(version) = storage_version(crd) else { return Ok(Vec::new()) };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource_at(crd, version));
    let list = api.list(&ListParams::default()).await.map_err(kube_err(format!("RedisClusters at {version}")))?;
    let mut clusters = Vec::new();
    for object in list.items {
        let name = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        let convert = |why: String| ReadError::Convert { name: name.clone(), why };
        let value = serde_json::to_value(&object).map_err(|e| convert(e.to_string()))?;
        let v1 = slotkeeper_api::conversion::convert(value, &RedisCluster::api_version(&()))
            .map_err(|e| convert(e.to_string()))?;
        let cluster: RedisCluster = serde_json::from_value(v1).map_err(|e| convert(e.to_string()))?;
        clusters.push(InstalledCluster {
            namespace: cluster.metadata.namespace.clone().unwrap_or_default(),
            name: cluster.metadata.name.clone().unwrap_or_default(),
            engine: cluster.spec.redis.engine,
            version: cluster.spec.redis.version,
            config: cluster.spec.redis.config,
        });
    }
    Ok(clusters)
}
