//! The plan of one upgrade of Slotkeeper itself: a pure function of what is
//! installed (CRDs, the operator's Pods, the clusters) and the new release's
//! manifests, printed the same way by the CLI and from a plan's status.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use slotkeeper_api::catalog::{self, Engine};
use slotkeeper_api::self_upgrade::{StepState, UpgradeStep};

use crate::preflight;
use crate::storage::storage_version;

const CLUSTERS_CRD: &str = "redisclusters.slotkeeper.io";

/// The gated step: after it the previous release's CRDs can no longer be applied.
pub const FINALIZE: &str = "Finalize";

/// What the running installation is.
#[derive(Debug, Clone, Default)]
pub struct Installed {
    pub crds: Vec<CustomResourceDefinition>,
    /// The operator Deployment's image (its tag names the release).
    pub operator_image: Option<String>,
    /// The image of each running operator Pod.
    pub pod_images: Vec<String>,
    pub clusters: Vec<InstalledCluster>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledCluster {
    pub namespace: String,
    pub name: String,
    pub engine: Engine,
    pub version: String,
    /// `spec.redis.config`, as the cluster sets it.
    pub config: BTreeMap<String, String>,
}

/// The new release, from its manifests.
#[derive(Debug, Clone)]
pub struct Release {
    pub version: String,
    pub image: String,
    pub crds: Vec<CustomResourceDefinition>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub from: String,
    pub to: String,
    pub steps: Vec<UpgradeStep>,
    /// Every finding, refusing ones first.
    pub findings: Vec<String>,
    /// Why the plan may not run, if it may not.
    pub refused: Option<String>,
}

/// The release an image's tag names (`slotkeeper:0.1.0` → `0.1.0`).
pub fn release_of(image: &str) -> String {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split_once(':').map(|(_, tag)| tag.to_string()).unwrap_or_else(|| "unknown".into())
}

pub fn plan(installed: &Installed, release: &Release) -> Plan {
    let from = installed.operator_image.as_deref().map(release_of).unwrap_or_else(|| "none".into());
    let mut refusing = preflight_findings(&installed.crds, &release.crds, &installed.clusters);
    let mut images: Vec<&String> = installed.pod_images.iter().collect();
    images.sort();
    images.dedup();
    if images.len() > 1 {
        let list: Vec<&str> = images.iter().map(|s| s.as_str()).collect();
        refusing.push(format!(
            "operator replicas run different images ({}): finish or undo that rollout first",
            list.join(", ")
        ));
    }
    let unsupported: Vec<String> = installed
        .clusters
        .iter()
        .filter(|c| catalog::lookup(c.engine, &c.version).is_none())
        .map(|c| {
            format!(
                "RedisCluster {}/{} runs {} {}, which release {} no longer supports: it is left as it is, and no rollout starts by itself",
                c.namespace, c.name, c.engine, c.version, release.version
            )
        })
        .collect();
    let refused = (!refusing.is_empty()).then(|| format!("{} unsafe change(s) found by the preflight", refusing.len()));
    let steps = steps(installed, release);
    Plan {
        from,
        to: release.version.clone(),
        steps,
        findings: refusing.into_iter().chain(unsupported).collect(),
        refused,
    }
}

/// A tightened rule on redis.conf settings (`spec.config` at v1alpha1,
/// `spec.redis.config` at v1): the allow-list of `slotkeeper_api::redis_config`.
fn is_config_rule(finding: &preflight::Finding) -> bool {
    finding.crd == CLUSTERS_CRD
        && matches!(finding.kind, preflight::FindingKind::ValidationTightened | preflight::FindingKind::RangeNarrowed)
        && ["spec.config", "spec.redis.config"].iter().any(|p| {
            finding.path == *p || finding.path.strip_prefix(p).is_some_and(|rest| rest.starts_with(['.', '{']))
        })
}

/// The preflight's unsafe changes from `installed` to `new` CRDs, less the
/// new redis.conf rules when every installed cluster's settings pass the
/// allow-list they are generated from (this binary's): then those rules,
/// new as they are, refuse no existing object.
pub fn preflight_findings(
    installed: &[CustomResourceDefinition],
    new: &[CustomResourceDefinition],
    clusters: &[InstalledCluster],
) -> Vec<String> {
    let config_holds = clusters.iter().all(|c| slotkeeper_api::redis_config::validate(&c.config).is_ok());
    preflight::check(installed, new)
        .iter()
        .filter(|f| !(config_holds && is_config_rule(f)))
        .map(ToString::to_string)
        .collect()
}

fn step(name: &str, description: String) -> UpgradeStep {
    UpgradeStep {
        name: name.into(),
        description,
        state: StepState::Pending,
        gated: name == FINALIZE,
        ..Default::default()
    }
}

fn steps(installed: &Installed, release: &Release) -> Vec<UpgradeStep> {
    // Every kind with an older version moves together; RedisCluster speaks for them.
    let clusters = |crds: &[CustomResourceDefinition]| {
        let name = Some(CLUSTERS_CRD);
        crds.iter().find(|c| c.metadata.name.as_deref() == name).and_then(storage_version).unwrap_or("none").to_string()
    };
    let (installed_storage, new_storage) = (clusters(&installed.crds), clusters(&release.crds));
    let names: Vec<&str> = release.crds.iter().filter_map(|c| c.metadata.name.as_deref()).collect();
    let mut steps = vec![
        step(
            "Preflight",
            "check the new CRDs against the installed ones and that every operator replica runs one release".into(),
        ),
        step(
            "InstallCRDs",
            format!(
                "apply the new CRDs ({}) with every version served and storage still on {installed_storage}, once the conversion webhook has answered",
                names.join(", ")
            ),
        ),
        step(
            "RollOperator",
            format!(
                "roll Deployment slotkeeper-system/slotkeeper to {} and wait until the new leader has reconciled every cluster ({})",
                release.image,
                installed.clusters.len()
            ),
        ),
        step("SwitchStorage", format!("make {new_storage} the storage version")),
        step(
            "MigrateStorage",
            format!(
                "rewrite every stored object at {new_storage} with Kubernetes' storage-version migrator; verify storedVersions is [{new_storage}]"
            ),
        ),
        step(
            FINALIZE,
            format!(
                "after approval: confirm storedVersions is [{new_storage}] and mark {installed_storage} deprecated; the previous release's CRDs can no longer be applied after this"
            ),
        ),
    ];
    if installed_storage == new_storage {
        for s in steps.iter_mut().filter(|s| s.name == "SwitchStorage" || s.name == "MigrateStorage") {
            s.state = StepState::Succeeded;
            s.message = Some(format!("objects are stored at {new_storage} already"));
        }
    }
    steps
}

/// The plan as text: the CLI prints it, and prints a plan object's status the same way.
pub fn render(from: &str, to: &str, steps: &[UpgradeStep], findings: &[String], refused: Option<&str>) -> String {
    let mut out = render_steps(from, to, steps, findings);
    match refused {
        Some(why) => out += &format!("Refused: {why}; nothing was changed.\n"),
        None => out += "Safe to apply.\n",
    }
    out
}

/// The steps and findings, without the verdict (a running plan's status).
pub fn render_steps(from: &str, to: &str, steps: &[UpgradeStep], findings: &[String]) -> String {
    let mut out = format!("Slotkeeper {from} -> {to}\n");
    for (i, s) in steps.iter().enumerate() {
        let gate = if s.gated { " [approval]" } else { "" };
        out += &format!("  {}. {:<15} {:<16}{gate} {}\n", i + 1, s.name, format!("{:?}", s.state), s.description);
        if let Some(message) = &s.message {
            out += &format!("     {message}\n");
        }
    }
    if !findings.is_empty() {
        out += "Findings:\n";
        for f in findings {
            out += &format!("  - {f}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crds(storage: &str) -> Vec<CustomResourceDefinition> {
        slotkeeper_api::crds().into_iter().map(|c| crate::storage::with_storage(c, storage)).collect()
    }

    fn installed() -> Installed {
        // The previous release: the kinds with a v1alpha1, at v1alpha1 only.
        let previous: Vec<CustomResourceDefinition> = slotkeeper_api::crds()
            .into_iter()
            .filter(|c| c.spec.versions.iter().any(|v| v.name == "v1alpha1"))
            .map(|mut c| {
                c.spec.versions.retain(|v| v.name == "v1alpha1");
                c.spec.versions[0].storage = true;
                c.spec.conversion = None;
                c.status = Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionStatus {
                    stored_versions: Some(vec!["v1alpha1".into()]),
                    ..Default::default()
                });
                c
            })
            .collect();
        Installed {
            crds: previous,
            operator_image: Some("slotkeeper:0.1.0".into()),
            pod_images: vec!["slotkeeper:0.1.0".into(), "slotkeeper:0.1.0".into()],
            clusters: vec![InstalledCluster {
                namespace: "n".into(),
                name: "c".into(),
                engine: Engine::Redis,
                version: "7.0.15".into(),
                config: BTreeMap::new(),
            }],
        }
    }

    fn release() -> Release {
        Release { version: "0.2.0".into(), image: "slotkeeper:0.2.0".into(), crds: crds("v1") }
    }

    /// The allow-list of redis.conf settings came as new CEL rules: they
    /// refuse an upgrade only when an installed cluster's settings fail them.
    #[test]
    fn new_config_rules_refuse_only_clusters_whose_settings_fail_them() {
        let mut before = installed();
        for crd in before.crds.iter_mut().filter(|c| c.metadata.name.as_deref() == Some(CLUSTERS_CRD)) {
            let schema = crd.spec.versions[0].schema.as_mut().unwrap().open_api_v3_schema.as_mut().unwrap();
            let spec = schema.properties.as_mut().unwrap().get_mut("spec").unwrap();
            let config = spec.properties.as_mut().unwrap().get_mut("config").unwrap();
            config.x_kubernetes_validations = None;
        }
        let settled = plan(&before, &release());
        assert!(settled.refused.is_none(), "{:?}", settled.findings);
        before.clusters[0].config = BTreeMap::from([("maxmemory-policy".into(), "allkeys-lru".into())]);
        assert!(plan(&before, &release()).refused.is_none());
        before.clusters[0].config = BTreeMap::from([("REQUIREPASS".into(), String::new())]);
        let refused = plan(&before, &release());
        assert!(refused.refused.is_some());
        assert!(
            refused.findings.iter().any(|f| f.contains("spec.config") && f.contains("new or changed validation rule"))
        );
    }

    #[test]
    fn the_plan_has_the_seeds_steps_in_order_with_only_the_last_gated() {
        let plan = plan(&installed(), &release());
        let names: Vec<&str> = plan.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["Preflight", "InstallCRDs", "RollOperator", "SwitchStorage", "MigrateStorage", "Finalize"]);
        assert_eq!(plan.steps.iter().filter(|s| s.gated).map(|s| s.name.as_str()).collect::<Vec<_>>(), ["Finalize"]);
        assert_eq!((plan.from.as_str(), plan.to.as_str()), ("0.1.0", "0.2.0"));
        assert_eq!(plan.refused, None, "{:?}", plan.findings);
        assert!(plan.steps[1].description.contains("storage still on v1alpha1"));
        assert!(plan.steps[4].description.contains("storedVersions is [v1]"));
    }

    #[test]
    fn a_removed_field_refuses_the_plan_naming_it() {
        let mut release = release();
        let spec = release.crds[0].spec.versions.iter_mut().find(|v| v.name == "v1alpha1").unwrap();
        let schema = spec.schema.as_mut().unwrap().open_api_v3_schema.as_mut().unwrap();
        let properties = schema.properties.as_mut().unwrap().get_mut("spec").unwrap().properties.as_mut().unwrap();
        properties.remove("paused");
        let plan = plan(&installed(), &release);
        assert!(plan.refused.is_some());
        assert!(plan.findings.iter().any(|f| f.contains("v1alpha1 spec.paused")), "{:?}", plan.findings);
        let text = render(&plan.from, &plan.to, &plan.steps, &plan.findings, plan.refused.as_deref());
        assert!(text.contains("Refused:") && text.contains("spec.paused"), "{text}");
    }

    #[test]
    fn operators_on_two_images_and_clusters_off_the_catalog_are_findings() {
        let mut installed = installed();
        installed.pod_images.push("slotkeeper:0.0.9".into());
        installed.clusters.push(InstalledCluster {
            namespace: "n".into(),
            name: "old".into(),
            engine: Engine::Redis,
            version: "5.0.14".into(),
            config: BTreeMap::new(),
        });
        let plan = plan(&installed, &release());
        assert!(plan.refused.is_some(), "skew refuses");
        assert!(plan.findings.iter().any(|f| f.contains("different images (slotkeeper:0.0.9, slotkeeper:0.1.0)")));
        assert!(plan.findings.iter().any(|f| f.contains("n/old runs redis 5.0.14") && f.contains("no rollout starts")));
    }

    #[test]
    fn the_text_lists_each_step_with_its_state_and_the_gate() {
        let plan = plan(&installed(), &release());
        let text = render(&plan.from, &plan.to, &plan.steps, &plan.findings, plan.refused.as_deref());
        assert!(text.starts_with("Slotkeeper 0.1.0 -> 0.2.0\n"), "{text}");
        assert!(text.contains("  6. Finalize        Pending          [approval]"), "{text}");
        assert!(text.ends_with("Safe to apply.\n"), "{text}");
    }
}
