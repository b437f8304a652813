//! The real apiserver rejects bad RedisClusters with a message naming the
//! field, from the CEL rules and schema in the generated CRD.

mod common;

use common::*;

fn cluster(ns: &str, name: &str, spec: &str) -> String {
    let api_version = <slotkeeper_api::RedisCluster as kube::Resource>::api_version(&());
    format!("apiVersion: {api_version}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}")
}

#[tokio::test]
async fn bad_input_is_rejected_with_a_message_naming_the_field() {
    let env = shared_env();
    install_crds(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "crd-validation").await;
    let cases = [
        ("  masters: 2\n  redis: {version: 7.0.15}\n", "spec.masters must be at least 3"),
        (
            "  masters: 3\n  replicasPerMaster: 6\n  redis: {version: 7.0.15}\n",
            "spec.replicasPerMaster must be between 0 and 5",
        ),
        ("  masters: 3\n  redis: {version: seven}\n", "spec.redis.version must be a semantic version"),
        (
            "  masters: 3\n  redis: {version: 7.2.4}\n",
            "spec.redis.engine and spec.redis.version must name an entry of the operator's version catalog: redis 6.2.14, redis 7.0.15, valkey 8.1.8",
        ),
        (
            "  masters: 3\n  redis: {engine: valkey, version: 7.0.15}\n",
            "must name an entry of the operator's version catalog",
        ),
        ("  masters: 3\n  redis: {engine: keydb, version: 6.3.4}\n", "spec.redis.engine"),
        (
            "  masters: 3\n  redis: {version: 7.0.15, config: {port: '7000'}}\n",
            "spec.redis.config sets a key the operator manages",
        ),
        (
            "  masters: 3\n  redis: {version: 7.0.15, config: {rename-command: 'FLUSHALL \"\"'}}\n",
            "spec.redis.config sets a key",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: lots}\n", "spec.storage.size must be a quantity"),
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  balance: {by: Memory, tolerancePercent: 0}\n",
            "spec.balance.tolerancePercent must be between 1 and 50",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n  balance: {by: Bytes}\n", "spec.balance.by"),
    ];
    for (spec, message) in cases {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "bad", spec)));
        assert!(!ok, "accepted:\n{spec}");
        assert!(out.contains(message), "for\n{spec}expected {message:?} in: {out}");
    }

    // Immutable fields: the first apply is valid, the changes are not.
    let good = "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 1Gi, storageClassName: standard}\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", good)));
    assert!(ok, "{out}");
    let changes = [
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 500Mi, storageClassName: standard}\n",
            "spec.storage.size cannot shrink",
        ),
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 1Gi, storageClassName: fast}\n",
            "spec.storage.storageClassName is immutable",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n", "spec.storage cannot be added or removed"),
    ];
    for (spec, message) in changes {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", spec)));
        assert!(!ok, "accepted change:\n{spec}");
        assert!(out.contains(message), "for\n{spec}expected {message:?} in: {out}");
    }
    // Growing the volume is allowed, and `kubectl scale` drives spec.masters.
    let grown = "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 2Gi, storageClassName: standard}\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", grown)));
    assert!(ok, "{out}");
    let (ok, out) = kubectl(env, &["-n", &ns, "scale", "rdc/stable", "--replicas=5"], None);
    assert!(ok, "{out}");
    let (_, masters) = kubectl(env, &["-n", &ns, "get", "rdc", "stable", "-o", "jsonpath={.spec.masters}"], None);
    assert_eq!(masters.trim(), "5");
}

#[tokio::test]
async fn deploy_manifests_pass_server_side_dry_run() {
    let env = shared_env();
    install_crds(env);
    let root = slotkeeper_env::tools::repo_root();
    // The namespace must exist for a dry run of the objects inside it.
    let (ok, out) = kubectl(env, &["apply", "-f", root.join("deploy/00-namespace.yaml").to_str().unwrap()], None);
    assert!(ok, "{out}");
    // deploy/crds is installed already (its webhook at a loopback URL, which
    // a dry run of the Service-addressed original would conflict with).
    let mut args = vec!["apply".to_string(), "--dry-run=server".into()];
    for manifest in ["00-namespace.yaml", "console-rbac.yaml", "operator.yaml", "rbac.yaml", "examples"] {
        args.extend(["-f".into(), root.join("deploy").join(manifest).to_str().unwrap().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = kubectl(env, &args, None);
    assert!(ok, "kubectl apply --dry-run=server -f deploy/ failed:\n{out}");
    for kind in [
        "deployment.apps/slotkeeper",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper",
        "networkpolicy.networking.k8s.io/slotkeeper",
        "service/slotkeeper",
        "service/slotkeeper-webhook",
        "poddisruptionbudget.policy/slotkeeper",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-redis-viewer",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-redis-operator",
        "rediscluster.slotkeeper.io/example",
    ] {
        assert!(out.contains(kind), "{kind} not in dry run output:\n{out}");
    }
}
