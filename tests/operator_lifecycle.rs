//! What a running operator costs and leaves behind: no API writes in steady
//! state, metrics that move, paused clusters left alone, clean deletion.

mod common;

use std::time::{Duration, Instant};

use common::operator::*;
use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use slotkeeper_operator::api::RedisCluster;

const OPERATOR_USER: &str = "system:serviceaccount:slotkeeper-system:slotkeeper";

/// The operator's write requests in `namespace` recorded in the audit log after `since`.
fn operator_writes(env: &slotkeeper_env::Environment, namespace: &str, since: &str) -> Vec<String> {
    let log = std::fs::read_to_string(env.audit_log()).unwrap();
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["user"]["username"] == OPERATOR_USER)
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete" | "deletecollection")))
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| e["requestReceivedTimestamp"].as_str().is_some_and(|t| t > since))
        .map(|e| format!("{} {} {}", e["verb"], e["objectRef"]["resource"], e["objectRef"]["name"]))
        .collect()
}

#[tokio::test]
async fn steady_state_makes_no_writes_and_metrics_move() {
    let env = shared_env();
    let operator = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "steady").await;
    let before = operator.metrics().await;
    apply_cluster(env, &ns, "quiet", 3, 1);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_running(&api, "quiet", Duration::from_secs(120)).await;

    let metrics = operator.metrics().await;
    let value = |text: &str, prefix: &str| -> f64 {
        text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    let gauge = format!("slotkeeper_cluster_slots_assigned{{namespace=\"{ns}\",cluster=\"quiet\"}}");
    assert_eq!(value(&metrics, &gauge), 16384.0, "{metrics}");
    assert!(
        value(&metrics, "controller_runtime_reconcile_total") > value(&before, "controller_runtime_reconcile_total")
    );
    assert!(value(&metrics, "rest_client_requests_total{method=\"PATCH\"") > 0.0, "{metrics}");
    for name in [
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "process_resident_memory_bytes",
        "controller_runtime_reconcile_errors_total{",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    for line in metrics.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let sample = line.rsplit(' ').next().unwrap();
        assert!(sample.parse::<f64>().is_ok(), "not Prometheus text: {line}");
    }

    // Steady state begins once the Pods are spread over the Nodes: a replica
    // the scheduler crowded onto one Node is recreated after it ran a minute.
    wait_until(
        "quiet's Pods two per Node, replicas in sync, nothing in progress",
        Duration::from_secs(240),
        || async {
            let c = api.get("quiet").await.ok()?;
            let status = c.status.as_ref()?;
            let mut per_node = std::collections::BTreeMap::new();
            for n in &status.nodes {
                *per_node.entry(n.node.clone()?).or_insert(0) += 1;
            }
            let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            // Replicas that finished their first sync (the status reports that
            // a moment after Running).
            let synced = status.replication_lag == Some(slotkeeper_api::lag::ReplicationLag::InSync);
            let spread = status.nodes.len() == 6 && per_node.values().all(|&n| n == 2);
            (ready && synced && status.step.is_none() && spread).then_some(())
        },
    )
    .await;
    // Let the last status write land, then watch a full minute of steady state.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let since = k8s_openapi::jiff::Timestamp::now().to_string();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let writes = operator_writes(env, &ns, &since);
    assert!(writes.is_empty(), "the operator wrote in steady state over {:?}: {writes:?}", window.elapsed());
    let resyncs = value(&operator.metrics().await, "controller_runtime_reconcile_total")
        - value(&metrics, "controller_runtime_reconcile_total");
    assert!(resyncs >= 1.0, "the operator reconciled during the window ({resyncs}), it just had nothing to write");
}

#[tokio::test]
async fn paused_cluster_is_left_alone_and_says_so() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "paused").await;
    apply_cluster_spec(env, &ns, "frozen", "masters: 3, replicasPerMaster: 1, redis: {version: 7.0.15}, paused: true");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_until("paused condition", Duration::from_secs(30), || async {
        let c = api.get("frozen").await.ok()?;
        let paused = c.status.as_ref()?.conditions.iter().any(|c| c.type_ == "Progressing" && c.reason == "Paused");
        paused.then_some(c)
    })
    .await;
    assert!(cluster.status.unwrap().conditions.iter().any(|c| c.message.contains("spec.paused")));
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(sets.list(&ListParams::default()).await.unwrap().items.is_empty(), "a paused cluster got StatefulSets");
    // Unpausing lets it form.
    api.patch("frozen", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    wait_running(&api, "frozen", Duration::from_secs(120)).await;
}

#[tokio::test]
async fn deleting_a_cluster_removes_everything_but_kept_volumes() {
    let env = shared_env();
    let operator = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "deletion").await;
    apply_cluster_spec(
        env,
        &ns,
        "gone",
        "masters: 3, replicasPerMaster: 1, redis: {version: 7.0.15}, storage: {size: 64Mi}",
    );
    apply_cluster_spec(
        env,
        &ns,
        "kept",
        "masters: 3, replicasPerMaster: 1, redis: {version: 7.0.15}, storage: {size: 64Mi, keepOnDelete: true}",
    );
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_running(&api, "gone", Duration::from_secs(120)).await;
    wait_running(&api, "kept", Duration::from_secs(120)).await;
    let series = |metrics: &str, name: &str| {
        let label = format!("namespace=\"{ns}\",cluster=\"{name}\"");
        metrics.lines().filter(|l| l.starts_with("slotkeeper_cluster_") && l.contains(&label)).count()
    };
    let metrics = operator.metrics().await;
    assert_eq!((series(&metrics, "gone"), series(&metrics, "kept")), (3, 3), "per-cluster gauges:\n{metrics}");
    // `gone` as `kubectl delete` does it (in the background: the object is
    // gone at once), `kept` in the foreground (it lingers with a deletionTimestamp).
    api.delete("gone", &DeleteParams::background()).await.unwrap();
    api.delete("kept", &DeleteParams::foreground()).await.unwrap();

    let count = |labels: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let lp = ListParams::default().labels(labels);
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len();
            let sets = Api::<StatefulSet>::namespaced(client.clone(), &ns).list(&lp).await.unwrap().items.len();
            let services = Api::<Service>::namespaced(client.clone(), &ns).list(&lp).await.unwrap().items.len();
            let maps = Api::<ConfigMap>::namespaced(client.clone(), &ns).list(&lp).await.unwrap().items.len();
            let secrets = Api::<Secret>::namespaced(client.clone(), &ns).list(&lp).await.unwrap().items.len();
            let claims =
                Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns).list(&lp).await.unwrap().items.len();
            (pods + sets + services + maps + secrets, claims)
        }
    };
    wait_until("everything of `gone` removed", Duration::from_secs(90), || async {
        (count("slotkeeper.io/cluster=gone").await == (0, 0)).then_some(())
    })
    .await;
    let (objects, claims) = wait_until("`kept` removed but its claims", Duration::from_secs(90), || async {
        let counts = count("slotkeeper.io/cluster=kept").await;
        (counts.0 == 0).then_some(counts)
    })
    .await;
    assert_eq!((objects, claims), (0, 6), "keepOnDelete keeps the 6 claims and nothing else");
    // Either way the operator forgets the deleted clusters' metric series.
    wait_until("deleted clusters' gauges gone", Duration::from_secs(30), || async {
        let metrics = operator.metrics().await;
        (series(&metrics, "gone") + series(&metrics, "kept") == 0).then_some(())
    })
    .await;
}
