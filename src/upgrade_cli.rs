//! `slotkeeper upgrade plan --manifests DIR`: the plan of upgrading the
//! running installation to the release whose manifests are in DIR, with the
//! preflight's findings. Reads only; exits non-zero when the plan is refused.

use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};
use serde::Deserialize;
use slotkeeper_api::RedisCluster;
use slotkeeper_upgrade::plan::{self, Installed, InstalledCluster, Release};
use slotkeeper_upgrade::storage::storage_version;

const OPERATOR_NAMESPACE: &str = "slotkeeper-system";
const OPERATOR_NAME: &str = "slotkeeper";

/// The release in `dir`: its CRDs (`crds/*.yaml`) and operator image (`operator.yaml`).
pub fn read_release(dir: &Path) -> anyhow::Result<Release> {
    let mut crds = Vec::new();
    let crd_dir = dir.join("crds");
    let mut files: Vec<_> = std::fs::read_dir(&crd_dir)
        .with_context(|| format!("--manifests {}: no crds/ directory", dir.display()))?
        .collect::<Result<_, _>>()?;
    files.sort_by_key(|f| f.path());
    for file in files {
        let text = std::fs::read_to_string(file.path())?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let crd = CustomResourceDefinition::deserialize(document)
                .with_context(|| format!("{} is not a CustomResourceDefinition", file.path().display()))?;
            crds.push(crd);
        }
    }
    let operator = std::fs::read_to_string(dir.join("operator.yaml"))
        .with_context(|| format!("--manifests {}: no operator.yaml", dir.display()))?;
    let image = serde_yaml::Deserializer::from_str(&operator)
        .filter_map(|d| serde_yaml::Value::deserialize(d).ok())
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].as_str().map(String::from))
        .context("operator.yaml has no Deployment with a container image")?;
    Ok(Release { version: plan::release_of(&image), image, crds })
}

/// The running installation, as far as the release's CRDs name it.
pub async fn read_installed(client: &Client, release: &Release) -> anyhow::Result<Installed> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crds = Vec::new();
    for crd in &release.crds {
        if let Some(installed) = api.get_opt(crd.metadata.name.as_deref().unwrap_or_default()).await? {
            crds.push(installed);
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let image_of = |spec: Option<&k8s_openapi::api::core::v1::PodSpec>| {
        spec.and_then(|s| s.containers.first()).and_then(|c| c.image.clone())
    };
    let operator_image =
        deployments.get_opt(OPERATOR_NAME).await?.and_then(|d| image_of(d.spec.template.spec.as_ref()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/name={OPERATOR_NAME}"));
    let pod_images = pods.list(&selector).await?.items.iter().filter_map(|p| image_of(p.spec.as_ref())).collect();
    let clusters = read_clusters(client, &crds).await?;
    Ok(Installed { crds, operator_image, pod_images, clusters })
}

/// Every RedisCluster, read at the installed storage version and converted
/// to v1 by the same functions the webhook uses (the installed CRD may not
/// serve v1 yet).
async fn read_clusters(client: &Client, crds: &[CustomResourceDefinition]) -> anyhow::Result<Vec<InstalledCluster>> {
    use kube::Resource as _;
    let Some(crd) = crds.iter().find(|c| c.spec.names.kind == RedisCluster::kind(&())) else {
        return Ok(Vec::new());
    };
    let version = storage_version(crd).unwrap_or("v1alpha1");
    let resource = ApiResource {
        group: crd.spec.group.clone(),
        version: version.into(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut clusters = Vec::new();
    for object in api.list(&ListParams::default()).await?.items {
        let value = serde_json::to_value(&object)?;
        let v1 = slotkeeper_api::conversion::convert(value, &RedisCluster::api_version(&()))?;
        let cluster: RedisCluster = serde_json::from_value(v1)?;
        clusters.push(InstalledCluster {
            namespace: cluster.metadata.namespace.clone().unwrap_or_default(),
            name: cluster.metadata.name.clone().unwrap_or_default(),
            engine: cluster.spec.redis.engine,
            version: cluster.spec.redis.version,
        });
    }
    Ok(clusters)
}

/// Prints the plan; `Ok(false)` when it is refused.
pub async fn print_plan(client: &Client, manifests: &Path) -> anyhow::Result<bool> {
    let release = read_release(manifests)?;
    let installed = read_installed(client, &release).await?;
    let plan = plan::plan(&installed, &release);
    print!("{}", plan::render(&plan.from, &plan.to, &plan.steps, &plan.findings, plan.refused.as_deref()));
    Ok(plan.refused.is_none())
}
