//! `slotkeeper upgrade rollback`: held at an extra gate before the storage
//! switch, the rollback brings back the previous CRDs and operator with the
//! cluster untouched and the previous operator acting again; a new attempt
//! past the switch is refused a rollback, with the reason, and finishes.

mod common;

use std::time::Duration;

use common::release::*;
use common::*;
use slotkeeper_api::v1alpha1;

const NS: &str = "rollback";
const CLUSTER: &str = "keep";

fn step_state(env: &slotkeeper_env::Environment, plan: &str, step: &str) -> Option<String> {
    let plan = plan_object(env, plan).ok()?;
    steps(&plan).into_iter().find(|(name, _)| name == step).map(|(_, state)| state)
}

async fn wait_step(env: &slotkeeper_env::Environment, plan: &str, step: &str, state: &str) {
    wait_until(&format!("step {step} of {plan} {state}"), Duration::from_secs(300), || async {
        (step_state(env, plan, step).as_deref() == Some(state)).then_some(())
    })
    .await;
}

fn crd_versions(env: &slotkeeper_env::Environment) -> (Vec<String>, Option<String>) {
    let crd = raw(env, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/redisclusters.slotkeeper.io").unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let names = versions.iter().map(|v| v["name"].as_str().unwrap().to_string()).collect();
    let strategy = crd["spec"]["conversion"]["strategy"].as_str().map(String::from);
    (names, strategy)
}

#[tokio::test]
async fn a_rollback_before_the_storage_switch_restores_the_previous_release_and_after_it_is_refused() {
    let env = release_env();
    let client = env.client().await.unwrap();
    install_previous(env);
    let (previous_versions, previous_strategy) = crd_versions(env);
    namespace(&client, NS).await;
    let cluster = format!(
        "apiVersion: {}\nkind: RedisCluster\nmetadata: {{name: {CLUSTER}, namespace: {NS}}}\nspec: {{masters: 3, version: 7.0.15}}\n",
        v1alpha1::API_VERSION
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster));
    assert!(ok, "{out}");
    wait_phase(env, "v1alpha1", NS, CLUSTER, "Running").await;
    let before = redis_pods(&client, &[(NS, CLUSTER)]).await;
    let plan = next_plan_name();
    let manifests = next_manifests();
    let dir = manifests.path().to_str().unwrap();

    // Held before the switch: the new operator runs, storage is still v1alpha1.
    let (code, out) = upgrade_cli(env, &["apply", "--manifests", dir, "--gate", "SwitchStorage"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SwitchStorage   Pending          [approval]"), "the extra gate is in the plan: {out}");
    wait_step(env, &plan, "SwitchStorage", "AwaitingApproval").await;
    let pods = operator_pods(&client).await;
    assert!(pods.values().any(|image| *image == next_image()), "the new operator runs: {pods:?}");
    assert_eq!(stored_versions(env, "redisclusters.slotkeeper.io"), ["v1alpha1"]);

    let (code, out) = upgrade_cli(env, &["rollback", &plan, "--timeout-seconds", "240"]);
    assert_eq!(code, Some(0), "{out}");
    println!("{out}");
    let object = plan_object(env, &plan).unwrap();
    assert!(condition_true(&object, "RolledBack"), "{object:#}");
    assert_eq!(crd_versions(env), (previous_versions.clone(), previous_strategy.clone()), "the previous CRD is back");
    rolled_out(env, "slotkeeper");
    wait_until("only the previous operator's Pods", Duration::from_secs(120), || async {
        let pods = operator_pods(&client).await;
        pods.values().all(|image| image == PREVIOUS_IMAGE).then_some(())
    })
    .await;
    assert_eq!(redis_pods(&client, &[(NS, CLUSTER)]).await, before, "the cluster was not touched");
    // The previous operator acts again: it takes a pause and says so in status.
    let (ok, out) =
        kubectl(env, &["-n", NS, "patch", "rdc", CLUSTER, "--type=merge", "-p", r#"{"spec":{"paused":true}}"#], None);
    assert!(ok, "{out}");
    let path = format!("/apis/slotkeeper.io/v1alpha1/namespaces/{NS}/redisclusters/{CLUSTER}");
    wait_until("the previous operator observes generation 2", Duration::from_secs(60), || async {
        (raw(env, &path).ok()?["status"]["observedGeneration"] == 2).then_some(())
    })
    .await;

    // A new attempt past the switch: rollback refused with the reason, and it finishes.
    let (code, out) = upgrade_cli(env, &["apply", "--manifests", dir]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("removed the finished"), "the rolled-back attempt makes way: {out}");
    wait_step(env, &plan, "Finalize", "AwaitingApproval").await;
    let (code, out) = upgrade_cli(env, &["rollback", &plan]);
    assert_eq!(code, Some(2), "refused rollbacks exit 2: {out}");
    assert!(out.contains("refused") && out.contains("storage version switched"), "{out}");
    let (code, out) = upgrade_cli(env, &["approve", &plan]);
    assert_eq!(code, Some(0), "{out}");
    let (ok, out) = kubectl(
        env,
        &["wait", "--for=condition=Succeeded", "--timeout=180s", &format!("slotkeeperupgrade/{plan}")],
        None,
    );
    assert!(ok, "{out}");
    assert_eq!(stored_versions(env, "redisclusters.slotkeeper.io"), ["v1"]);
    assert_eq!(redis_pods(&client, &[(NS, CLUSTER)]).await, before, "the cluster was not touched");
}
