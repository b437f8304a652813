//! The operator, running as its ServiceAccount with exactly the RBAC in
//! deploy/, turns a RedisCluster into a working Redis Cluster of real
//! redis-server processes.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use redis::AsyncCommands as _;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_operator::api::{Phase, RedisCluster};

/// The operator of this test binary, started once: `slotkeeper run` with a
/// kubeconfig holding its ServiceAccount's token (so exactly deploy/'s RBAC).
fn shared_operator(env: &'static slotkeeper_env::Environment) -> &'static ManagedProcess {
    static OPERATOR: std::sync::OnceLock<ManagedProcess> = std::sync::OnceLock::new();
    OPERATOR.get_or_init(|| start_operator(env))
}

fn start_operator(env: &slotkeeper_env::Environment) -> ManagedProcess {
    install_crds(env);
    for manifest in ["deploy/00-namespace.yaml", "deploy/rbac.yaml"] {
        let path = slotkeeper_env::tools::repo_root().join(manifest);
        let (ok, out) = kubectl(env, &["apply", "-f", path.to_str().unwrap()], None);
        assert!(ok, "{manifest}: {out}");
    }
    let (ok, token) = kubectl(
        env,
        &[
            "-n",
            "slotkeeper-system",
            "create",
            "token",
            "slotkeeper",
            "--duration=2h",
        ],
        None,
    );
    assert!(ok, "token: {token}");
    let dir = slotkeeper_env::tools::repo_root()
        .join("target/e2e")
        .join(env!("CARGO_CRATE_NAME"));
    let kubeconfig = dir.join("operator.kubeconfig");
    let admin: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.kubeconfig()).unwrap()).unwrap();
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "slotkeeper", "user": {"token": token.trim()}}],
        "contexts": [{"name": "slotkeeper", "context": {"cluster": "local", "user": "slotkeeper"}}],
        "current-context": "slotkeeper",
    });
    std::fs::write(&kubeconfig, serde_json::to_string(&config).unwrap()).unwrap();
    ManagedProcess::spawn(
        ProcessSpec::new(
            "slotkeeper",
            env!("CARGO_BIN_EXE_slotkeeper"),
            dir.join("operator.log"),
        )
        .args(["run", "--log-format", "json", "--kubeconfig"])
        .arg(&kubeconfig),
    )
    .expect("the operator starts")
}

async fn wait_running(api: &Api<RedisCluster>, name: &str, timeout: Duration) -> RedisCluster {
    wait_until(
        &format!("RedisCluster {name} Running and Ready"),
        timeout,
        || async {
            let c = api.get(name).await.ok()?;
            let status = c.status.as_ref()?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (status.phase == Some(Phase::Running) && ready).then_some(c)
        },
    )
    .await
}

async fn password(client: &kube::Client, ns: &str, name: &str) -> String {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{name}-password"))
        .await
        .unwrap();
    String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap()
}

fn redis_cli_check(ip: &str, password: &str) -> String {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-a",
            password,
            "--no-auth-warning",
            "--cluster",
            "check",
            &format!("{ip}:6379"),
        ])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn example_cluster_bootstraps_serves_keys_and_spreads_replicas() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "example").await;
    let example = std::fs::read_to_string(
        slotkeeper_env::tools::repo_root().join("deploy/example-rediscluster.yaml"),
    )
    .unwrap()
    .replace("namespace: default", &format!("namespace: {ns}"));
    let started = Instant::now();
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&example));
    assert!(ok, "{out}");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_running(&api, "example", Duration::from_secs(120)).await;
    eprintln!(
        "example 3x1 Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let status = cluster.status.unwrap();
    assert_eq!(status.slots_assigned, 16384);
    assert_eq!((status.ready_masters, status.ready_replicas), (3, 3));
    assert_eq!(status.current_version.as_deref(), Some("7.0.15"));
    assert_eq!(status.cluster_state.as_deref(), Some("ok"));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pods = pods
        .list(&ListParams::default().labels("slotkeeper.io/cluster=example"))
        .await
        .unwrap()
        .items;
    let node_of: BTreeMap<String, String> = pods
        .iter()
        .map(|p| {
            (
                pod_ip(p),
                p.spec.as_ref().unwrap().node_name.clone().unwrap(),
            )
        })
        .collect();
    let password = password(&client, &ns, "example").await;
    let any_ip = pod_ip(&pods[0]);
    let check = redis_cli_check(&any_ip, &password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{check}");
    assert!(
        !check.contains("[WARNING]") && !check.contains("[ERR]"),
        "{check}"
    );

    // Each master's replica runs on another Kubernetes Node.
    for node in &status.nodes {
        if node.role.as_deref() == Some("replica") {
            let master = status
                .nodes
                .iter()
                .find(|m| m.node_id == node.master_id)
                .expect("master in status");
            let (replica_ip, master_ip) = (node.ip.clone().unwrap(), master.ip.clone().unwrap());
            assert_ne!(
                node_of[&replica_ip], node_of[&master_ip],
                "{} and its master {} share a Node",
                node.pod, master.pod
            );
        }
    }

    // 10,000 keys through a cluster-aware client read back.
    let urls: Vec<String> = pods
        .iter()
        .map(|p| format!("redis://:{password}@{}:6379/", pod_ip(p)))
        .collect();
    let cluster_client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut connection = cluster_client.get_async_connection().await.unwrap();
    for i in 0..10_000 {
        let _: () = connection.set(format!("key:{i}"), i).await.unwrap();
    }
    for i in 0..10_000 {
        let value: i64 = connection.get(format!("key:{i}")).await.unwrap();
        assert_eq!(value, i);
    }

    // The story is told in events.
    let (_, described) = kubectl(env, &["-n", &ns, "describe", "rdc", "example"], None);
    for reason in [
        "Applied",
        "ClusterMeet",
        "SlotsAssigned",
        "ReplicaAttached",
        "ClusterReady",
    ] {
        assert!(
            described.contains(reason),
            "event {reason} missing from describe:\n{described}"
        );
    }
    assert!(
        !described.contains(&password),
        "the password leaked into describe output"
    );
}

#[tokio::test]
async fn redis_6_2_cluster_forms_and_reports_its_version() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "old-redis").await;
    let manifest = format!(
        "apiVersion: slotkeeper.io/v1alpha1\nkind: RedisCluster\nmetadata: {{name: legacy, namespace: {ns}}}\nspec: {{masters: 3, replicasPerMaster: 0, version: 6.2.14}}\n"
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&manifest));
    assert!(ok, "{out}");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_running(&api, "legacy", Duration::from_secs(120)).await;
    let status = cluster.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("6.2.14"));
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.version.as_deref() == Some("6.2.14"))
    );
    let password = password(&client, &ns, "legacy").await;
    let check = redis_cli_check(status.nodes[0].ip.as_deref().unwrap(), &password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{check}");
}
