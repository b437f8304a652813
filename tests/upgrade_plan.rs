//! `slotkeeper upgrade plan --manifests DIR` against the previous release's
//! installation: the plan in the seed's order for this repository's deploy/,
//! and a refusal naming the field for manifests that remove one; nothing is
//! applied either way.

mod common;

use common::upgrade::*;
use common::*;
use slotkeeper_api::v1alpha1;

fn plan(env: &slotkeeper_env::Environment, manifests: &std::path::Path) -> (Option<i32>, String) {
    common::release::upgrade_cli(env, &["plan", "--manifests", manifests.to_str().unwrap()])
}

fn resource_version(env: &slotkeeper_env::Environment) -> String {
    let (ok, out) = kubectl(
        env,
        &["get", "crd", "redisclusters.slotkeeper.io", "-o", "jsonpath={.metadata.resourceVersion}"],
        None,
    );
    assert!(ok, "{out}");
    out
}

#[tokio::test]
async fn the_plan_for_the_previous_release_and_a_refusal_that_names_the_removed_field() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    apply_yaml(env, &previous_release_file("deploy/crds/slotkeeper.io.yaml"));
    let (ok, out) = kubectl(env, &["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
    assert!(ok, "{out}");
    let ns = namespace_with_pod_security(&client, "upgrade-plan", PREVIOUS_RELEASE_POD_SECURITY).await;
    let old = format!(
        "apiVersion: {}\nkind: RedisCluster\nmetadata: {{name: legacy, namespace: {ns}}}\nspec: {{masters: 3, version: 6.2.14, paused: true}}\n",
        v1alpha1::API_VERSION
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&old));
    assert!(ok, "{out}");
    let before = resource_version(env);

    let deploy = slotkeeper_env::tools::repo_root().join("deploy");
    let (code, out) = plan(env, &deploy);
    assert_eq!(code, Some(0), "{out}");
    let steps: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().split_once(". ").map(|(_, rest)| rest.split_whitespace().next().unwrap()))
        .collect();
    assert_eq!(
        steps,
        ["Preflight", "InstallCRDs", "RollOperator", "SwitchStorage", "MigrateStorage", "Finalize"],
        "{out}"
    );
    assert!(
        out.contains("storage still on v1alpha1") && out.contains("[approval]") && out.ends_with("Safe to apply.\n"),
        "{out}"
    );
    assert!(out.contains("reconciled every cluster (1)"), "the plan counts the installed clusters: {out}");

    // A release whose v1alpha1 drops spec.paused: refused, the field named.
    let bad = tempfile::tempdir().unwrap();
    std::fs::create_dir(bad.path().join("crds")).unwrap();
    std::fs::copy(deploy.join("operator.yaml"), bad.path().join("operator.yaml")).unwrap();
    let crds = std::fs::read_to_string(deploy.join("crds/slotkeeper.io.yaml")).unwrap();
    let mut documents: Vec<serde_norway::Value> =
        serde_norway::Deserializer::from_str(&crds).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect();
    let versions = documents[0]["spec"]["versions"].as_sequence_mut().unwrap();
    let old_version = versions.iter_mut().find(|v| v["name"] == "v1alpha1").unwrap();
    let spec = &mut old_version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert!(spec.as_mapping_mut().unwrap().remove("paused").is_some());
    let text: Vec<String> = documents.iter().map(|d| serde_norway::to_string(d).unwrap()).collect();
    std::fs::write(bad.path().join("crds/slotkeeper.io.yaml"), text.join("---\n")).unwrap();
    let (code, out) = plan(env, bad.path());
    assert_eq!(code, Some(2), "refused plans exit 2: {out}");
    assert!(out.contains("redisclusters.slotkeeper.io v1alpha1 spec.paused"), "{out}");
    assert!(out.contains("Refused:") && out.contains("nothing was changed"), "{out}");
    assert_eq!(resource_version(env), before, "the CRD was not touched");
    let (_, versions) =
        kubectl(env, &["get", "crd", "redisclusters.slotkeeper.io", "-o", "jsonpath={.spec.versions[*].name}"], None);
    assert_eq!(versions.trim(), "v1alpha1", "still the previous release's CRD");
}
