//! `slotkeeper upgrade rollback`: held at an extra gate before the storage
//! switch, the rollback brings back the previous CRDs and operator with the
//! cluster untouched and the previous operator acting again; a new attempt
//! past the switch is refused a rollback, with the reason, and finishes once
//! approved in the console by a user bound to the approver role.

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

/// The value of the hidden input `name` in the form of a page.
fn hidden(body: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let start = body.find(&marker).unwrap_or_else(|| panic!("no input {name} in {body}")) + marker.len();
    let value = &body[start..start + body[start..].find('"').unwrap()];
    value.replace("&quot;", "\"").replace("&amp;", "&")
}

fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Alice, bound to deploy/'s approver role, signs in to the console of an
/// operator Pod, sees the plan awaiting approval and approves `step`.
async fn approve_in_the_console(env: &slotkeeper_env::Environment, client: &kube::Client, plan: &str, step: &str) {
    let rbac = slotkeeper_env::tools::repo_root().join("deploy/console-rbac.yaml");
    let (ok, out) = kubectl(env, &["apply", "-f", rbac.to_str().unwrap()], None);
    assert!(ok, "{out}");
    let role = "--clusterrole=slotkeeper-upgrade-approver";
    let (ok, out) = kubectl(env, &["create", "clusterrolebinding", "alice-approves", role, "--user=alice"], None);
    assert!(ok, "{out}");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let selector = kube::api::ListParams::default().labels("app.kubernetes.io/name=slotkeeper");
    let list = pods.list(&selector).await.unwrap();
    let ip = pod_ip(list.items.iter().find(|p| pod_ready(p)).expect("a ready operator Pod"));
    let cookie = operator::console_session(&ip, 8080, &user_token(env, "alice")).await;
    let (status, _, body) =
        operator::http_request_to(&ip, 8080, "GET", "/upgrades", std::slice::from_ref(&cookie), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(plan) && body.contains(&format!("Approve {step}")), "the page offers approval: {body}");
    let form = ["plan", "step", "approved", "resource_version"]
        .map(|name| format!("{name}={}", form_encode(&hidden(&body, name))))
        .join("&");
    let (status, head, _) = operator::http_request_to(
        &ip,
        8080,
        "POST",
        "/actions/approve-upgrade-step",
        &[cookie, "Sec-Fetch-Site: same-origin".into(), "Accept: text/html".into()],
        Some(&form),
    )
    .await;
    assert!(matches!(status, 302 | 303), "{head}");
    let approved = plan_object(env, plan).unwrap()["spec"]["approvedSteps"].clone();
    assert!(approved.as_array().unwrap().iter().any(|s| s == step), "{approved}");
    let audit = std::fs::read_to_string(env.audit_log()).unwrap();
    let by_alice = audit.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).any(|e| {
        e["verb"] == "patch" && e["objectRef"]["resource"] == "slotkeeperupgrades" && e["user"]["username"] == "alice"
    });
    assert!(by_alice, "the approval was made as alice (audit log)");
}

#[tokio::test]
async fn a_rollback_before_the_storage_switch_restores_the_previous_release_and_after_it_is_refused() {
    let env = release_env();
    let client = env.client().await.unwrap();
    install_previous(env);
    let (previous_versions, previous_strategy) = crd_versions(env);
    namespace_with_pod_security(&client, NS, PREVIOUS_RELEASE_POD_SECURITY).await;
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
    snapshot_edits_are_refused(env, &plan).await;

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
    // A fresh discovery cache: kubectl's would still map rdc to v1.
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = format!("--cache-dir={}", cache.path().display());
    let pause = ["-n", NS, "patch", "rdc", CLUSTER, "--type=merge", "-p", r#"{"spec":{"paused":true}}"#];
    let (ok, out) = kubectl(env, &[&[cache_dir.as_str()][..], &pause[..]].concat(), None);
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
    approve_in_the_console(env, &client, &plan, "Finalize").await;
    let (ok, out) = kubectl(
        env,
        &["wait", "--for=condition=Succeeded", "--timeout=180s", &format!("slotkeeperupgrade/{plan}")],
        None,
    );
    assert!(ok, "{out}");
    assert_eq!(stored_versions(env, "redisclusters.slotkeeper.io"), ["v1"]);
    assert_eq!(redis_pods(&client, &[(NS, CLUSTER)]).await, before, "the cluster was not touched");
}

/// Security review finding 6: someone who may edit ConfigMaps in
/// slotkeeper-system (and nothing cluster-wide) rewrites the plan's snapshot
/// so that a rollback would restore an operator of their choosing, and adds
/// a ClusterRoleBinding for themselves. The manager refuses the snapshot,
/// says why on the plan, and applies nothing; the original content (put
/// back by an administrator) is accepted again.
async fn snapshot_edits_are_refused(env: &slotkeeper_env::Environment, plan: &str) {
    let intern = "ops-intern";
    for args in [
        &["-n", "slotkeeper-system", "create", "role", "edit-config", "--verb=get,patch", "--resource=configmaps"][..],
        &[
            "-n",
            "slotkeeper-system",
            "create",
            "rolebinding",
            "intern-edits-config",
            "--role=edit-config",
            "--user=ops-intern",
        ],
    ] {
        let (ok, out) = kubectl(env, args, None);
        assert!(ok, "{out}");
    }
    let snapshot = format!("slotkeeper-upgrade-{plan}");
    let (ok, original) = kubectl(env, &["-n", "slotkeeper-system", "get", "configmap", &snapshot, "-o", "json"], None);
    assert!(ok, "{original}");
    let original: serde_json::Value = serde_json::from_str(&original).unwrap();
    let mut previous: serde_json::Value =
        serde_json::from_str(original["data"]["previous-operator.json"].as_str().unwrap()).unwrap();
    previous["spec"]["template"]["spec"]["containers"][0]["image"] = "attacker/slotkeeper:evil".into();
    let mut next: Vec<serde_json::Value> =
        serde_json::from_str(original["data"]["next-operator.json"].as_str().unwrap()).unwrap();
    next.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "intern-is-admin"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": intern}]}));
    let edit = serde_json::json!({"data": {
        "previous-operator.json": previous.to_string(),
        "next-operator.json": serde_json::to_string(&next).unwrap(),
    }});
    let as_intern = format!("--as={intern}");
    let (ok, out) = kubectl(
        env,
        &[
            "-n",
            "slotkeeper-system",
            &as_intern,
            "patch",
            "configmap",
            &snapshot,
            "--type=merge",
            "-p",
            &edit.to_string(),
        ],
        None,
    );
    assert!(ok, "the intern may edit ConfigMaps there: {out}");
    let refusal = wait_until("the plan refuses the edited snapshot", Duration::from_secs(60), || async {
        let object = plan_object(env, plan).ok()?;
        let steps = object["status"]["steps"].as_array()?.clone();
        steps
            .iter()
            .filter_map(|s| s["message"].as_str())
            .find(|m| m.contains("refusing the snapshot"))
            .map(String::from)
    })
    .await;
    assert!(refusal.contains("was changed after the plan was made"), "{refusal}");
    let (ok, out) = kubectl(env, &["get", "clusterrolebinding", "intern-is-admin"], None);
    assert!(!ok && out.contains("NotFound"), "{out}");
    let (ok, out) = kubectl(env, &["auth", "can-i", "create", "clusterrolebindings", &as_intern], None);
    assert!(!ok && out.lines().any(|l| l.trim() == "no"), "{out}");
    // An administrator puts the content back: the plan goes on as recorded.
    let restore = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(restore.path(), serde_json::json!({"data": original["data"]}).to_string()).unwrap();
    let patch_file = format!("--patch-file={}", restore.path().display());
    let (ok, out) =
        kubectl(env, &["-n", "slotkeeper-system", "patch", "configmap", &snapshot, "--type=merge", &patch_file], None);
    assert!(ok, "{out}");
    wait_until("the plan accepts the snapshot again", Duration::from_secs(60), || async {
        let object = plan_object(env, plan).ok()?;
        let steps = object["status"]["steps"].as_array()?.clone();
        (!steps.iter().filter_map(|s| s["message"].as_str()).any(|m| m.contains("refusing the snapshot"))).then_some(())
    })
    .await;
}
