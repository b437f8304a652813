//! Least privilege, list mode: an operator given `--namespace a,b` watches
//! each listed namespace on its own, so rights granted there are all it
//! needs: its ServiceAccount holds `slotkeeper-managed-namespace` only
//! through RoleBindings in the listed namespaces (and its own), never
//! cluster-wide. It runs clusters in both, leaves one elsewhere alone, and
//! is never refused anything (its log holds no 403).

mod common;

use std::time::Duration;

use common::operator::*;
use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::api::ListParams;
use slotkeeper_api::RedisCluster;

const ACCOUNT: &str = "slotkeeper-listed";
const OPERATOR_NAMESPACE: &str = "slotkeeper-system";

fn can_i(env: &slotkeeper_env::Environment, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    let user = format!("--as=system:serviceaccount:{OPERATOR_NAMESPACE}:{ACCOUNT}");
    let mut args = vec!["auth", "can-i", verb, resource, &user];
    match namespace {
        Some(ns) => args.extend(["-n", ns]),
        None => args.push("--all-namespaces"),
    }
    let (_, out) = kubectl(env, &args, None);
    out.trim() == "yes"
}

#[tokio::test]
async fn an_operator_of_listed_namespaces_runs_their_clusters_with_rights_granted_there_only() {
    let env = shared_env();
    install_crds(env);
    let client = env.client().await.unwrap();
    let a = namespace(&client, "listed-a").await;
    let b = namespace(&client, "listed-b").await;
    let elsewhere = namespace(&client, "not-listed").await;
    // deploy/'s roles (applied by spawning), bound as the README's list mode says.
    let operator = {
        let subject = format!("--serviceaccount={OPERATOR_NAMESPACE}:{ACCOUNT}");
        let setup = |args: &[&str]| {
            let (ok, out) = kubectl(env, args, None);
            assert!(ok || out.contains("AlreadyExists"), "{args:?}: {out}");
        };
        for manifest in ["deploy/00-namespace.yaml", "deploy/rbac.yaml"] {
            let path = slotkeeper_env::tools::repo_root().join(manifest);
            setup(&["apply", "-f", path.to_str().unwrap()]);
        }
        setup(&["create", "serviceaccount", ACCOUNT, "-n", OPERATOR_NAMESPACE]);
        setup(&["create", "clusterrolebinding", ACCOUNT, "--clusterrole=slotkeeper", &subject]);
        for ns in [a.as_str(), b.as_str(), OPERATOR_NAMESPACE] {
            setup(&[
                "create",
                "rolebinding",
                ACCOUNT,
                "-n",
                ns,
                "--clusterrole=slotkeeper-managed-namespace",
                &subject,
            ]);
        }
        let leader = format!("{ACCOUNT}-leader-election");
        setup(&[
            "create",
            "rolebinding",
            &leader,
            "-n",
            OPERATOR_NAMESPACE,
            "--role=slotkeeper-leader-election",
            &subject,
        ]);
        let listed = format!("--namespace={a},{b}");
        spawn_operator_as(env, "slotkeeper-listed-0", ACCOUNT, &[&listed], &[])
    };
    wait_crds_converting(env);

    // What the apiserver's authorizer grants it: the listed namespaces, nothing across all.
    assert!(can_i(env, "patch", "statefulsets", Some(&a)) && can_i(env, "watch", "pods", Some(&b)));
    for (verb, resource) in [("list", "secrets"), ("get", "secrets"), ("watch", "pods"), ("patch", "statefulsets")] {
        assert!(!can_i(env, verb, resource, Some(&elsewhere)), "{verb} {resource} in {elsewhere}");
        assert!(!can_i(env, verb, resource, None), "{verb} {resource} in every namespace");
    }
    assert!(!can_i(env, "list", "redisclusters.slotkeeper.io", None), "RedisClusters everywhere");

    for ns in [&a, &b, &elsewhere] {
        apply_cluster(env, ns, "cache", 3, 0);
    }
    for ns in [&a, &b] {
        let api: Api<RedisCluster> = Api::namespaced(client.clone(), ns);
        wait_settled(&api, "cache", 3, 3, Duration::from_secs(240)).await;
    }
    let ignored: Api<RedisCluster> = Api::namespaced(client.clone(), &elsewhere);
    assert!(ignored.get("cache").await.unwrap().status.is_none(), "a cluster outside the list is left alone");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &elsewhere);
    assert!(sets.list(&ListParams::default()).await.unwrap().items.is_empty(), "nothing made outside the list");
    let metrics = operator.metrics().await;
    assert!(metrics.contains(&format!("namespace=\"{a}\"")) && metrics.contains(&format!("namespace=\"{b}\"")));
    assert!(!metrics.contains(&format!("namespace=\"{elsewhere}\"")), "nothing reported outside the list");

    // Every watch, read and write stayed within its rights.
    let log = std::fs::read_to_string(operator.process.log_path()).unwrap();
    // A refusal reads `… is forbidden: …` with `reason: "Forbidden", code: 403`.
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("orbidden") || l.contains("code: 403")).collect();
    assert!(refused.is_empty(), "the operator was refused: {refused:#?}");
}
