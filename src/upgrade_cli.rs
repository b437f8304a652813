//! `slotkeeper upgrade`: plan, apply, status, approve and rollback of an
//! upgrade of Slotkeeper itself to the release whose manifests (its
//! `deploy/` directory) are given.
//!
//! `apply` only prepares: the new RBAC and plan kind, the plan object, the
//! snapshot it restores on rollback, and a one-replica Deployment of the new
//! release that runs the plan (the previous release knows no plans). Every
//! step after that is the upgrade manager's, in the cluster.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use serde::Deserialize;
use serde_json::{Value, json};
use slotkeeper_api::self_upgrade::{
    CONDITION_ROLLED_BACK, MANAGER_DEPLOYMENT, OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE, SlotkeeperUpgrade,
    SlotkeeperUpgradeSpec, StepState, snapshot_name,
};
use slotkeeper_upgrade::installed;
use slotkeeper_upgrade::manager::snapshot::{Snapshot, apply_configuration, crd_configuration};
use slotkeeper_upgrade::manager::{UPGRADE_FIELD_MANAGER, observe, plural, rollback_allowed};
use slotkeeper_upgrade::plan::{self, Release};

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
        for document in serde_norway::Deserializer::from_str(&text) {
            let crd = CustomResourceDefinition::deserialize(document)
                .with_context(|| format!("{} is not a CustomResourceDefinition", file.path().display()))?;
            crds.push(crd);
        }
    }
    let operator = documents(&dir.join("operator.yaml"))?;
    let image = operator
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d.pointer("/spec/template/spec/containers/0/image")?.as_str().map(String::from))
        .context("operator.yaml has no Deployment with a container image")?;
    Ok(Release { version: plan::release_of(&image), image, crds })
}

/// Every YAML document of a file, as JSON.
fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).with_context(|| format!("{} is not valid YAML", path.display())))
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

fn crd_names(release: &Release) -> Vec<String> {
    release.crds.iter().filter_map(|c| c.metadata.name.clone()).collect()
}

/// Prints the plan; `Ok(false)` when it is refused.
pub async fn print_plan(client: &Client, manifests: &Path) -> anyhow::Result<bool> {
    let release = read_release(manifests)?;
    let installed = installed::read(client, &crd_names(&release)).await?;
    let plan = plan::plan(&installed, &release);
    print!("{}", plan::render(&plan.from, &plan.to, &plan.steps, &plan.findings, plan.refused.as_deref()));
    Ok(plan.refused.is_none())
}

/// The plan object's name for a release (`0.2.0` → `to-0-2-0`).
pub fn plan_name(release: &str) -> String {
    let name: String =
        release.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    format!("to-{name}")
}

/// `upgrade apply`: `Ok(false)` when the plan is refused (nothing changed).
pub async fn apply(client: &Client, manifests: &Path, gates: &[String]) -> anyhow::Result<bool> {
    let release = read_release(manifests)?;
    let installed = installed::read(client, &crd_names(&release)).await?;
    let mut planned = plan::plan(&installed, &release);
    let names: Vec<String> = planned.steps.iter().map(|s| s.name.clone()).collect();
    for gate in gates {
        let step =
            planned.steps.iter_mut().find(|s| &s.name == gate).with_context(|| {
                format!("--gate {gate}: the plan has no such step (its steps: {})", names.join(", "))
            })?;
        step.gated = true;
    }
    print!(
        "{}",
        plan::render(&planned.from, &planned.to, &planned.steps, &planned.findings, planned.refused.as_deref())
    );
    if planned.refused.is_some() {
        return Ok(false);
    }
    let name = plan_name(&release.version);
    let plans: Api<SlotkeeperUpgrade> = Api::all(client.clone());

    // What the new release's Pods need before they start: its RBAC and the plan kind.
    let rbac = manifests.join("rbac.yaml");
    if rbac.exists() {
        for object in documents(&rbac)? {
            apply_object(client, &with_rules_kept(client, object).await?).await?;
        }
    }
    let plan_crd = release
        .crds
        .iter()
        .find(|c| c.spec.names.kind == SlotkeeperUpgrade::kind(&()))
        .context("the release's CRDs have no SlotkeeperUpgrade kind: it cannot be upgraded to by a plan")?;
    apply_object(client, &serde_json::to_value(crd_configuration(plan_crd))?).await?;
    wait_established(client, plan_crd.metadata.name.as_deref().unwrap_or_default()).await?;

    if let Some(existing) = plans.get_opt(&name).await? {
        let conditions = existing.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
        let is = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
        if is("Succeeded") {
            println!("SlotkeeperUpgrade/{name} has already succeeded.");
            return Ok(true);
        }
        if !(is(CONDITION_ROLLED_BACK) || is("Failed")) {
            println!("SlotkeeperUpgrade/{name} is in progress: slotkeeper upgrade status {name}");
            return Ok(true);
        }
        // A finished attempt (rolled back or failed) makes way for this one.
        plans.delete(&name, &DeleteParams::foreground()).await?;
        wait_gone(&plans, &name).await?;
        println!("removed the finished SlotkeeperUpgrade/{name} of an earlier attempt");
    }

    // The snapshot is captured first, so the plan records its digest when it is created.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let previous_operator = match deployments.get_opt(OPERATOR_DEPLOYMENT).await? {
        Some(deployment) => Some(apply_configuration(&serde_json::to_value(&deployment)?)),
        None => None,
    };
    let next_operator = documents(&manifests.join("operator.yaml"))?;
    let snapshot = Snapshot {
        previous_crds: installed.crds.iter().map(crd_configuration).collect(),
        previous_operator,
        next_crds: release.crds.clone(),
        next_operator: next_operator.clone(),
    };
    let object = SlotkeeperUpgrade::new(
        &name,
        SlotkeeperUpgradeSpec {
            release: release.version.clone(),
            image: release.image.clone(),
            approved_steps: Vec::new(),
            gates: gates.to_vec(),
            rollback: false,
            snapshot_digest: Some(snapshot.digest()),
        },
    );
    let created = plans
        .create(&PostParams { field_manager: Some(UPGRADE_FIELD_MANAGER.into()), ..Default::default() }, &object)
        .await?;
    let owner = owner_of(&created);

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    config_maps
        .create(&PostParams::default(), &snapshot.to_config_map(&snapshot_name(&name), owner.clone()))
        .await
        .context("writing the snapshot")?;

    let deployment =
        next_operator.iter().find(|d| d["kind"] == "Deployment").context("operator.yaml has no Deployment")?;
    apply_object(client, &manager_deployment(deployment, owner)).await?;
    println!(
        "Created SlotkeeperUpgrade/{name}; the upgrade manager (Deployment {OPERATOR_NAMESPACE}/{MANAGER_DEPLOYMENT}) runs it."
    );
    println!("Follow it:  slotkeeper upgrade status {name}");
    println!("Wait on it: kubectl wait --for=condition=Succeeded slotkeeperupgrade/{name} --timeout=30m");
    Ok(true)
}

/// The new release's operator Deployment as the one-replica upgrade manager.
fn manager_deployment(operator: &Value, owner: OwnerReference) -> Value {
    let mut manager = operator.clone();
    manager["metadata"]["name"] = json!(MANAGER_DEPLOYMENT);
    manager["metadata"]["namespace"] = json!(OPERATOR_NAMESPACE);
    manager["metadata"]["ownerReferences"] = json!([owner]);
    manager["metadata"]["labels"]["app.kubernetes.io/name"] = json!(MANAGER_DEPLOYMENT);
    manager["spec"]["replicas"] = json!(1);
    manager["spec"]["selector"] = json!({ "matchLabels": { "app.kubernetes.io/name": MANAGER_DEPLOYMENT } });
    manager["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = json!(MANAGER_DEPLOYMENT);
    manager
}

fn owner_of(plan: &SlotkeeperUpgrade) -> OwnerReference {
    OwnerReference {
        api_version: SlotkeeperUpgrade::api_version(&()).into(),
        kind: SlotkeeperUpgrade::kind(&()).into(),
        name: plan.name_any(),
        uid: plan.uid().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: Some(true),
    }
}

/// Server-side applies one manifest object (cluster-scoped unless it names a namespace).
/// A role of the new release with the installed role's rules it drops
/// added back: until the upgrade is over, a rollback runs the previous
/// operator, which needs them (0.2.0 stopped listing Secrets, which 0.1.0
/// watches). Re-applying the release's `rbac.yaml` afterwards drops them.
async fn with_rules_kept(client: &Client, mut object: Value) -> anyhow::Result<Value> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    if kind != "ClusterRole" && kind != "Role" {
        return Ok(object);
    }
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", &kind),
        &plural(&kind),
    );
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let Some(installed) = api.get_opt(&name).await.with_context(|| format!("reading {kind} {name}"))? else {
        return Ok(object);
    };
    let new_rules = object["rules"].as_array().cloned().unwrap_or_default();
    let dropped: Vec<Value> = installed.data["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rule| !new_rules.contains(rule))
        .cloned()
        .collect();
    if !dropped.is_empty() {
        println!(
            "kept {} rule(s) of the installed {kind} {name} for a rollback; after the upgrade, `kubectl apply -f rbac.yaml` of the new release drops them",
            dropped.len()
        );
        object["rules"] = Value::Array(new_rules.into_iter().chain(dropped).collect());
    }
    Ok(object)
}

async fn apply_object(client: &Client, object: &Value) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().context("a manifest object has no metadata.name")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural(kind));
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(name, &PatchParams::apply(UPGRADE_FIELD_MANAGER).force(), &Patch::Apply(object))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

async fn wait_established(client: &Client, crd: &str) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for _ in 0..60 {
        let established = api.get(crd).await?.status.and_then(|s| s.conditions).unwrap_or_default();
        if established.iter().any(|c| c.type_ == "Established" && c.status == "True") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("CRD {crd} was not established within 30 s")
}

async fn wait_gone(plans: &Api<SlotkeeperUpgrade>, name: &str) -> anyhow::Result<()> {
    for _ in 0..120 {
        if plans.get_opt(name).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("SlotkeeperUpgrade {name} was not deleted within 60 s")
}

/// The named plan, or the only one there is.
async fn find_plan(client: &Client, name: Option<&str>) -> anyhow::Result<SlotkeeperUpgrade> {
    let plans: Api<SlotkeeperUpgrade> = Api::all(client.clone());
    if let Some(name) = name {
        return plans.get_opt(name).await?.with_context(|| format!("there is no SlotkeeperUpgrade {name}"));
    }
    let mut all = match plans.list(&Default::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    all.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    all.pop().context("there is no SlotkeeperUpgrade: start one with `slotkeeper upgrade apply --manifests DIR`")
}

/// A plan's status as text: the steps as `upgrade plan` prints them, then its conditions.
pub fn render_status(plan: &SlotkeeperUpgrade) -> String {
    let status = plan.status.clone().unwrap_or_default();
    let mut out = format!("SlotkeeperUpgrade/{}\n", plan.name_any());
    out +=
        &plan::render_steps(status.from.as_deref().unwrap_or("?"), &plan.spec.release, &status.steps, &status.findings);
    out += "Conditions:\n";
    for c in &status.conditions {
        let message = if c.message.is_empty() { String::new() } else { format!(": {}", c.message) };
        out += &format!("  {:<17} {:<5} {}{message}\n", c.type_, c.status, c.reason);
    }
    out
}

pub async fn status(client: &Client, name: Option<&str>) -> anyhow::Result<()> {
    print!("{}", render_status(&find_plan(client, name).await?));
    Ok(())
}

/// `upgrade approve`: approves the step awaiting approval (or `step`).
pub async fn approve(client: &Client, name: Option<&str>, step: Option<&str>) -> anyhow::Result<()> {
    let plan = find_plan(client, name).await?;
    let steps = plan.status.as_ref().map(|s| s.steps.clone()).unwrap_or_default();
    let step = match step {
        Some(step) => step.to_string(),
        None => steps
            .iter()
            .find(|s| s.state == StepState::AwaitingApproval)
            .or_else(|| steps.iter().find(|s| s.gated && s.state != StepState::Succeeded))
            .map(|s| s.name.clone())
            .context("no step of this plan needs approval")?,
    };
    if !steps.iter().any(|s| s.name == step && s.gated) {
        bail!("step {step:?} is not a gated step of {}", plan.name_any());
    }
    let mut approved = plan.spec.approved_steps.clone();
    if !approved.contains(&step) {
        approved.push(step.clone());
    }
    let plans: Api<SlotkeeperUpgrade> = Api::all(client.clone());
    plans
        .patch(
            &plan.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "approvedSteps": approved } })),
        )
        .await?;
    println!("approved step {step} of SlotkeeperUpgrade/{}", plan.name_any());
    Ok(())
}

/// `upgrade rollback`: `Ok(false)` when refused (the reason is printed).
pub async fn rollback(client: &Client, name: Option<&str>, timeout: Duration) -> anyhow::Result<bool> {
    let plan = find_plan(client, name).await?;
    let name = plan.name_any();
    let seen = observe::observe(client, &plan).await?;
    let status = plan.status.clone().unwrap_or_default();
    if let Err(why) = rollback_allowed(&status, &seen, seen.snapshot.as_ref().ok()) {
        println!("Rollback of SlotkeeperUpgrade/{name} refused: {why}");
        return Ok(false);
    }
    let plans: Api<SlotkeeperUpgrade> = Api::all(client.clone());
    plans.patch(&name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "rollback": true } }))).await?;
    println!("Rolling back SlotkeeperUpgrade/{name}: the previous operator first, then the previous CRDs.");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let plan = plans.get(&name).await?;
        let conditions = plan.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == CONDITION_ROLLED_BACK && c.status == "True") {
            print!("{}", render_status(&plan));
            return Ok(true);
        }
        if tokio::time::Instant::now() > deadline {
            print!("{}", render_status(&plan));
            bail!("the rollback did not finish within {timeout:?}; it goes on in the cluster");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_are_valid_object_names() {
        assert_eq!(plan_name("0.2.0"), "to-0-2-0");
        assert_eq!(plan_name("1.0.0-RC1"), "to-1-0-0-rc1");
    }

    #[test]
    fn the_manager_is_the_operator_deployment_with_one_replica_and_its_own_labels() {
        let operator = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "slotkeeper", "namespace": "slotkeeper-system", "labels": {"app.kubernetes.io/name": "slotkeeper"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app.kubernetes.io/name": "slotkeeper"}},
                "template": {"metadata": {"labels": {"app.kubernetes.io/name": "slotkeeper", "slotkeeper.io/webhook": "true"}},
                    "spec": {"containers": [{"image": "slotkeeper:0.2.0"}]}}}});
        let manager = manager_deployment(&operator, OwnerReference { name: "to-0-2-0".into(), ..Default::default() });
        assert_eq!(manager["metadata"]["name"], "slotkeeper-upgrade");
        assert_eq!(manager["spec"]["replicas"], 1);
        assert_eq!(manager["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "slotkeeper-upgrade");
        let labels = &manager["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/name"], "slotkeeper-upgrade", "not one of the operator's Pods");
        assert_eq!(labels["slotkeeper.io/webhook"], "true", "behind the webhook's Service");
        assert_eq!(manager["metadata"]["ownerReferences"][0]["name"], "to-0-2-0");
    }
}
