//! `RedisOperation` failover: every shard handed over to a caught-up replica
//! with a writer running and nothing acknowledged lost; invalid requests fail
//! with a clear message and change nothing; events on both objects.

mod common;

use slotkeeper_api::API_VERSION;
use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use kube::Api;
use slotkeeper_env::Environment;
use slotkeeper_operator::api::{OperationPhase, RedisCluster, RedisOperation};

fn operation(ns: &str, name: &str, cluster: &str, failover: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: RedisOperation\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterName: {cluster}, type: Failover, failover: {failover}}}\n"
    )
}

async fn finished(api: &Api<RedisOperation>, name: &str) -> RedisOperation {
    wait_until(&format!("RedisOperation {name} finished"), Duration::from_secs(90), || async {
        let op = api.get(name).await.ok()?;
        matches!(op.status.as_ref()?.phase, Some(OperationPhase::Succeeded | OperationPhase::Failed)).then_some(op)
    })
    .await
}

fn masters(cluster: &RedisCluster) -> Vec<(String, Vec<String>)> {
    let mut m: Vec<(String, Vec<String>)> = cluster
        .status
        .as_ref()
        .unwrap()
        .nodes
        .iter()
        .filter(|n| n.role.as_deref() == Some("master"))
        .map(|n| (n.pod.clone(), n.slots.clone()))
        .collect();
    m.sort();
    m
}

fn apply(env: &Environment, yaml: &str) {
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(yaml));
    assert!(ok, "{out}");
}

#[tokio::test]
async fn failover_of_every_shard_keeps_every_acknowledged_write() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "failover").await;
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let operations: Api<RedisOperation> = Api::namespaced(kube.clone(), &ns);
    apply_cluster(env, &ns, "relay", 3, 1);
    let cluster = wait_settled(&clusters, "relay", 3, 6, Duration::from_secs(180)).await;
    let ips: Vec<String> = cluster.status.as_ref().unwrap().nodes.iter().filter_map(|n| n.ip.clone()).collect();
    let password = password(&kube, &ns, "relay").await;
    let mut client = ClusterClient::new(ips.clone(), &password).await;
    let seeds = client.seed("seed", 20_000).await;
    let writer = Writer::start(ips.clone(), &password, "ack").await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    for shard in 0..3 {
        let before = masters(&clusters.get("relay").await.unwrap());
        writer.take_gap();
        let name = format!("failover-shard-{shard}");
        apply(env, &operation(&ns, &name, "relay", &format!("{{shard: {shard}}}")));
        let op = finished(&operations, &name).await;
        let status = op.status.unwrap();
        assert_eq!(status.phase, Some(OperationPhase::Succeeded), "{name}: {:?}", status.message);
        assert!(status.start_time.is_some() && status.completion_time.is_some(), "{name}");
        let (from, to) = (status.from_pod.unwrap(), status.to_pod.unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let gap = writer.take_gap();
        eprintln!("{name}: {from} → {to}, longest write gap {} ms", gap.as_millis());
        // Status of the cluster shows the new roles, and the slots moved with the role.
        let after = wait_until("the cluster status shows the new roles", Duration::from_secs(10), || async {
            let c = clusters.get("relay").await.ok()?;
            let m = masters(&c);
            (m.iter().any(|(pod, _)| *pod == to) && !m.iter().any(|(pod, _)| *pod == from)).then_some(c)
        })
        .await;
        let after_masters = masters(&after);
        let slots_of =
            |m: &[(String, Vec<String>)], pod: &str| m.iter().find(|(p, _)| p == pod).map(|(_, s)| s.clone());
        assert_eq!(slots_of(&after_masters, &to), slots_of(&before, &from), "{to} serves {from}'s slots");
        let check = redis_cli_check(&ips[0], &password);
        assert!(check.contains("[OK] All 16384 slots covered.") && !check.contains("[ERR]"), "{check}");
    }
    assert_all_read_back(&mut client, &seeds, &writer, "after every shard's failover").await;
    let record = writer.stop().await;
    eprintln!("writer: {} acknowledged, {} errors", record.acknowledged.len(), record.errors);

    let described = kubectl(env, &["describe", "rdo", "failover-shard-0", "-n", &ns], None).1;
    assert!(described.contains("FailoverStarted") && described.contains("OperationSucceeded"), "{described}");
    let described = kubectl(env, &["describe", "rdc", "relay", "-n", &ns], None).1;
    assert!(described.contains("RedisOperation failover-shard-0"), "{described}");
}

#[tokio::test]
async fn invalid_operations_fail_with_a_clear_message_and_change_nothing() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "failover-invalid").await;
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let operations: Api<RedisOperation> = Api::namespaced(kube.clone(), &ns);
    apply_cluster(env, &ns, "solo", 3, 0);
    apply_cluster(env, &ns, "duo", 3, 1);
    let solo = wait_settled(&clusters, "solo", 3, 3, Duration::from_secs(180)).await;
    let duo = wait_settled(&clusters, "duo", 3, 6, Duration::from_secs(180)).await;

    let cases = [
        (
            "ghost",
            operation(&ns, "ghost", "nowhere", "{shard: 0}"),
            "spec.clusterName: RedisCluster nowhere does not exist",
        ),
        ("no-replica", operation(&ns, "no-replica", "solo", "{shard: 1}"), "shard 1 has no replica to promote"),
        (
            "out-of-range",
            operation(&ns, "out-of-range", "duo", "{shard: 7}"),
            "spec.failover.shard 7: cluster duo has shards 0 to 2",
        ),
        (
            "wrong-target",
            operation(&ns, "wrong-target", "duo", "{shard: 0, targetPod: duo-shard-1-1}"),
            "spec.failover.targetPod duo-shard-1-1 is not a replica of shard 0",
        ),
    ];
    for (name, yaml, expected) in &cases {
        apply(env, yaml);
        let status = finished(&operations, name).await.status.unwrap();
        assert_eq!(status.phase, Some(OperationPhase::Failed), "{name}");
        let message = status.message.unwrap();
        assert!(message.contains(expected), "{name}: {message}");
        assert!(status.failover_sent_time.is_none(), "{name}: nothing was sent");
    }
    // Two at once on one cluster: the second is refused while the first runs.
    apply(
        env,
        &(operation(&ns, "first", "duo", "{shard: 0}") + "---\n" + &operation(&ns, "second", "duo", "{shard: 1}")),
    );
    let first = finished(&operations, "first").await.status.unwrap();
    let second = finished(&operations, "second").await.status.unwrap();
    let phases = [first.phase, second.phase];
    assert!(
        phases.contains(&Some(OperationPhase::Succeeded)) && phases.contains(&Some(OperationPhase::Failed)),
        "{phases:?}"
    );
    let accepted = if first.phase == Some(OperationPhase::Succeeded) { &first } else { &second };
    let to = accepted.to_pod.clone().unwrap();
    let refused = if first.phase == Some(OperationPhase::Failed) { first } else { second };
    assert!(refused.message.as_deref().unwrap().contains("is running on cluster duo"), "{:?}", refused.message);

    // Nothing changed where the requests were refused.
    let solo_after = wait_settled(&clusters, "solo", 3, 3, Duration::from_secs(30)).await;
    assert_eq!(masters(&solo), masters(&solo_after));
    let promoted = wait_until("duo's status shows the accepted failover", Duration::from_secs(30), || async {
        let after = clusters.get("duo").await.ok()?;
        let before: Vec<String> = masters(&duo).into_iter().map(|(pod, _)| pod).collect();
        let promoted: Vec<String> =
            masters(&after).into_iter().map(|(pod, _)| pod).filter(|pod| !before.contains(pod)).collect();
        promoted.contains(&to).then_some(promoted)
    })
    .await;
    // Any master besides the accepted one is the spread of masters over the
    // Nodes moving around it, which says so in an event.
    let spread = kubectl(
        env,
        &["get", "events", "-n", &ns, "--field-selector", "reason=MastersSpread", "-o", "jsonpath={.items[*].message}"],
        None,
    )
    .1;
    for pod in promoted.iter().filter(|pod| **pod != to) {
        assert!(spread.contains(pod.as_str()), "{pod} became master without a MastersSpread event: {spread}");
    }
    // The spec is immutable once created.
    let (ok, out) = kubectl(
        env,
        &["patch", "rdo", "first", "-n", &ns, "--type=merge", "-p", r#"{"spec":{"clusterName":"solo"}}"#],
        None,
    );
    assert!(!ok && out.contains("immutable"), "{out}");
}

/// Without persistent storage a deleted master's Pod comes back empty, as a
/// new node: Redis promotes the replica, the operator makes the new node a
/// replica (never a master of nothing), every node forgets the dead id, and
/// nothing acknowledged is lost.
#[tokio::test]
async fn an_ephemeral_master_pod_deleted_comes_back_as_a_fresh_replica() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "ephemeral").await;
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(kube.clone(), &ns);
    apply_cluster(env, &ns, "fleeting", 3, 1);
    let cluster = wait_settled(&clusters, "fleeting", 3, 6, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "fleeting").await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    let seeds = client.seed("seed", 10_000).await;
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = common::rollout::follow_pods(&writer, pods.clone(), "fleeting");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let status = cluster.status.as_ref().unwrap();
    let victim = master_pods(&cluster)[0].clone();
    let old_id = status.nodes.iter().find(|n| n.pod == victim).unwrap().node_id.clone().unwrap();
    let slots = status.nodes.iter().find(|n| n.pod == victim).unwrap().slots.clone();
    pods.delete(&victim, &kube::api::DeleteParams::default()).await.unwrap();
    let back =
        wait_until(&format!("{victim} back as a new node, everything settled"), Duration::from_secs(180), || async {
            let c = clusters.get("fleeting").await.ok()?;
            let status = c.status.as_ref()?;
            let node = status.nodes.iter().find(|n| n.pod == victim)?;
            let settled = status.phase == Some(slotkeeper_operator::api::Phase::Running)
                && status.step.is_none()
                && status.ready_masters == 3
                && status.ready_replicas == 3;
            (settled && node.node_id.as_deref().is_some_and(|id| id != old_id)).then_some(c)
        })
        .await;
    let status = back.status.as_ref().unwrap();
    let node = status.nodes.iter().find(|n| n.pod == victim).unwrap();
    // Its shard's slots went to the promoted replica; the new node joined
    // as that replica's replica (or, later, took the role back by a
    // coordinated failover to spread masters, with the slots).
    let holder = status.nodes.iter().find(|n| n.slots == slots && n.role.as_deref() == Some("master")).unwrap();
    if node.role.as_deref() == Some("replica") {
        assert_eq!(node.master_id, holder.node_id, "{victim} replicates the master of its old slots");
    } else {
        assert_eq!(holder.pod, victim, "{victim} is master again only with its shard's slots");
    }
    // No node remembers the dead id.
    for ip in node_ips(&back) {
        let mut c = redis::Client::open(format!("redis://:{password}@{ip}:6379/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut c).await.unwrap();
        assert!(!nodes.contains(&old_id), "{ip} still knows the dead id {old_id}:\n{nodes}");
        assert_eq!(nodes.lines().count(), 6, "{ip}: {nodes}");
    }
    let check = redis_cli_check(&node_ips(&back)[0], &password);
    assert!(check.contains("[OK] All 16384 slots covered.") && !check.contains("[ERR]"), "{check}");
    client = ClusterClient::new(node_ips(&back), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "an ephemeral master Pod deleted").await;
    follower.abort();
    let record = writer.stop().await;
    eprintln!(
        "ephemeral master deleted: {} acknowledged, {} errors, all read back",
        record.acknowledged.len(),
        record.errors
    );
}
