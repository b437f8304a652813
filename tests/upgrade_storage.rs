//! From the previous release's CRDs (v1alpha1 only, objects stored at it) to
//! v1 stored, with Kubernetes' own storage-version migrator: both versions
//! are read through the conversion webhook on the way, and at the end etcd
//! holds every object as v1 (read with etcdctl, not trusted from a
//! condition) and storedVersions is exactly [v1].

mod common;

use std::time::Duration;

use common::operator::*;
use common::upgrade::*;
use common::*;
use slotkeeper_api::v1alpha1;
use slotkeeper_upgrade::storage::{with_storage, without_deprecation};

const CRDS: [&str; 2] = ["redisclusters.slotkeeper.io", "redisoperations.slotkeeper.io"];

fn old_cluster(ns: &str, name: &str, spec: &str) -> String {
    let api = v1alpha1::API_VERSION;
    format!("apiVersion: {api}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{{spec}}}\n")
}

fn stored_versions(env: &slotkeeper_env::Environment, crd: &str) -> String {
    let (ok, out) = kubectl(env, &["get", "crd", crd, "-o", "jsonpath={.status.storedVersions}"], None);
    assert!(ok, "{out}");
    out.trim().to_string()
}

/// Every cluster in `ns` read at `version`, as JSON (by path: kubectl's
/// cached discovery would not know a version added since).
fn clusters_at(env: &slotkeeper_env::Environment, ns: &str, version: &str) -> serde_json::Value {
    let path = format!("/apis/slotkeeper.io/{version}/namespaces/{ns}/redisclusters");
    let (ok, out) = kubectl(env, &["get", "--raw", &path], None);
    assert!(ok, "kubectl get --raw {path}: {out}");
    // The JSON, then any warning kubectl printed on stderr.
    let json = &out[out.find('{').unwrap()..];
    serde_json::Deserializer::from_str(json).into_iter().next().unwrap().unwrap()
}

/// kubectl with discovery read afresh (the CRDs changed versions meanwhile).
fn kubectl_fresh(env: &slotkeeper_env::Environment, args: &[&str]) -> (bool, String) {
    let cache = tempfile::tempdir().unwrap();
    let flag = format!("--cache-dir={}", cache.path().display());
    let args: Vec<&str> = std::iter::once(flag.as_str()).chain(args.iter().copied()).collect();
    kubectl(env, &args, None)
}

#[tokio::test]
async fn storage_moves_from_v1alpha1_to_v1_with_kubernetes_migrator_and_nothing_lost() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    // The previous release: its CRDs, objects written at v1alpha1.
    apply_yaml(env, &previous_release_file("deploy/crds/slotkeeper.io.yaml"));
    let (ok, out) = kubectl(env, &["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
    assert!(ok, "{out}");
    let ns = namespace_with_pod_security(&client, "upgrade-storage", PREVIOUS_RELEASE_POD_SECURITY).await;
    let specs = [
        (
            "orders",
            "masters: 3, replicasPerMaster: 1, version: 7.0.15, paused: true, config: {maxmemory-policy: allkeys-lru}, upgrade: {canaryBakeSeconds: 10}",
        ),
        ("frozen", "masters: 5, version: 6.2.14, paused: true, storage: {size: 1Gi, keepOnDelete: true}"),
        ("cache", "masters: 3, engine: valkey, version: 8.1.8, paused: true"),
    ];
    for (name, spec) in specs {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&old_cluster(&ns, name, spec)));
        assert!(ok, "{out}");
    }
    let operation = format!(
        "apiVersion: {}\nkind: RedisOperation\nmetadata: {{name: restart, namespace: {ns}}}\nspec: {{cluster: orders, type: RollingRestart}}\n",
        v1alpha1::API_VERSION
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&operation));
    assert!(ok, "{out}");
    let before = clusters_at(env, &ns, "v1alpha1");
    let prefix = "/registry/slotkeeper.io/";
    let stored = etcd_objects(env, prefix);
    assert_eq!(stored.len(), 4, "three clusters and one operation in etcd: {stored:?}");
    assert!(stored.iter().all(|(_, v)| v.contains(r#""apiVersion":"slotkeeper.io/v1alpha1""#)), "{stored:?}");

    // The new operator, then the new CRDs with storage still on v1alpha1:
    // the operator points them at its webhook, and both versions read.
    let _operator = spawn_operator(env, "slotkeeper-0", &[]);
    let intermediate = slotkeeper_api::crds().into_iter().map(|crd| without_deprecation(with_storage(crd, "v1alpha1")));
    apply_yaml(env, &crds_yaml(intermediate.collect()));
    wait_crds_converting(env);
    let path = format!("/apis/slotkeeper.io/v1/namespaces/{ns}/redisclusters");
    let read_back = wait_until("both versions read through the webhook", Duration::from_secs(30), || async {
        let (ok, out) = kubectl(env, &["get", "--raw", &path], None);
        ok.then(|| serde_json::from_str::<serde_json::Value>(&out).ok()).flatten()
    })
    .await;
    let orders = read_back["items"].as_array().unwrap().iter().find(|c| c["metadata"]["name"] == "orders").unwrap();
    assert_eq!(orders["apiVersion"], "slotkeeper.io/v1");
    assert_eq!(orders["spec"]["redis"]["config"]["maxmemory-policy"], "allkeys-lru");
    assert_eq!(orders["spec"]["rollout"]["canaryBakeSeconds"], 10);
    assert_eq!(clusters_at(env, &ns, "v1alpha1")["items"], before["items"], "v1alpha1 reads as it was written");
    for crd in CRDS {
        assert_eq!(stored_versions(env, crd), r#"["v1alpha1"]"#);
    }

    // The new CRDs as released (v1 stored, v1alpha1 deprecated); then the migrator.
    apply_yaml(env, &crds_yaml(slotkeeper_api::crds()));
    wait_crds_converting(env);
    for crd in CRDS {
        assert_eq!(stored_versions(env, crd), r#"["v1alpha1","v1"]"#);
        let made = slotkeeper_upgrade::migrate::migrate_storage(
            &client,
            crd,
            Duration::from_millis(500),
            Duration::from_secs(180),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!made.is_empty(), "a StorageVersionMigration was created for {crd}");
        assert_eq!(stored_versions(env, crd), r#"["v1"]"#, "{crd}: storedVersions is exactly [v1]");
    }
    let stored = etcd_objects(env, prefix);
    assert_eq!(stored.len(), 4, "{stored:?}");
    for (key, value) in &stored {
        assert!(value.contains(r#""apiVersion":"slotkeeper.io/v1""#), "{key} is stored as v1: {value}");
    }
    let orders_bytes = &stored.iter().find(|(k, _)| k.ends_with("/orders")).unwrap().1;
    assert!(orders_bytes.contains(r#""redis":{"#), "v1's shape in etcd: {orders_bytes}");

    // Nothing lost: v1alpha1 still reads as it was written (now converted
    // from v1), with kubectl's deprecation warning.
    assert_eq!(clusters_at(env, &ns, "v1alpha1")["items"].as_array().unwrap().len(), 3);
    let after = clusters_at(env, &ns, "v1alpha1");
    for (old, new) in before["items"].as_array().unwrap().iter().zip(after["items"].as_array().unwrap()) {
        assert_eq!(old["spec"], new["spec"], "{} kept every field", old["metadata"]["name"]);
    }
    let path = format!("/apis/slotkeeper.io/v1alpha1/namespaces/{ns}/redisclusters");
    let (ok, out) = kubectl(env, &["get", "--raw", &path], None);
    let warning = "Warning: slotkeeper.io/v1alpha1 RedisCluster is deprecated; use slotkeeper.io/v1 RedisCluster";
    assert!(ok && out.contains(warning), "kubectl prints the deprecation: {}", &out[out.len().saturating_sub(300)..]);
    let args = ["get", "redisoperations.v1.slotkeeper.io", "restart", "-n", &ns, "-o", "jsonpath={.spec.clusterName}"];
    let (_, operation) = kubectl_fresh(env, &args);
    assert_eq!(operation.trim(), "orders");
}
