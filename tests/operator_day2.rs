//! Day-2 operations on a live cluster with a writer running: scale out and
//! in with resharding, replica scaling; after each step every acknowledged
//! key reads back, `redis-cli --cluster check` is clean, status matches Redis.

mod common;

use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use kube::Api;
use slotkeeper_operator::api::RedisCluster;

const SEED_KEYS: usize = 100_000;

/// Status agrees with Redis and `redis-cli --cluster check` is clean; the
/// masters are within 1% of the even share.
fn assert_clean(cluster: &RedisCluster, password: &str, masters: usize, step: &str) {
    let status = cluster.status.as_ref().unwrap();
    let ip = status.nodes[0].ip.as_deref().unwrap();
    let check = redis_cli_check(ip, password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{step}: {check}");
    assert!(check.contains("[OK] All nodes agree about slots configuration."), "{step}: {check}");
    assert!(!check.contains("[WARNING]") && !check.contains("[ERR]"), "{step}: {check}");
    assert!(
        check.contains(&format!("{masters} masters")) || check.matches("M: ").count() == masters,
        "{step}: {check}"
    );
    let share = 16384.0 / masters as f64;
    let owners: Vec<usize> =
        status.nodes.iter().filter(|n| n.role.as_deref() == Some("master")).map(|n| slots_in(&n.slots).len()).collect();
    assert_eq!(owners.len(), masters, "{step}: masters in status");
    for count in owners {
        assert!((count as f64 - share).abs() <= share * 0.01 + 1.0, "{step}: {count} slots vs share {share:.0}");
    }
    assert_eq!(status.slots_assigned, 16384, "{step}");
}

#[tokio::test]
async fn scaling_shards_and_replicas_keeps_every_acknowledged_write() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "day2-scale").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    apply_cluster(env, &ns, "elastic", 3, 1);
    let cluster = wait_settled(&api, "elastic", 3, 6, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "elastic").await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    let mut seeds = client.seed("seed-a", SEED_KEYS).await;
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;

    // Scale out through the scale subresource, as `kubectl scale` users do.
    let (ok, out) = kubectl(env, &["scale", "rdc/elastic", "-n", &ns, "--replicas=5"], None);
    assert!(ok, "{out}");
    let cluster = wait_settled(&api, "elastic", 5, 10, Duration::from_secs(300)).await;
    assert_clean(&cluster, &password, 5, "scale out 3→5");
    assert_all_read_back(&mut client, &seeds, &writer, "scale out 3→5").await;

    seeds.extend(client.seed("seed-b", SEED_KEYS).await);
    apply_cluster(env, &ns, "elastic", 3, 1);
    let cluster = wait_settled(&api, "elastic", 3, 6, Duration::from_secs(300)).await;
    assert_clean(&cluster, &password, 3, "scale in 5→3");
    assert_all_read_back(&mut client, &seeds, &writer, "scale in 5→3").await;
    let sets = kubectl(env, &["get", "statefulsets", "-n", &ns, "-o", "name"], None).1;
    assert_eq!(sets.lines().count(), 3, "drained shards removed: {sets}");

    let slots_before: Vec<(String, Vec<String>)> = cluster
        .status
        .unwrap()
        .nodes
        .into_iter()
        .filter(|n| n.role.as_deref() == Some("master"))
        .map(|n| (n.node_id.unwrap(), n.slots))
        .collect();
    for replicas in [2, 0, 1] {
        apply_cluster(env, &ns, "elastic", 3, replicas);
        let pods = 3 * (replicas as usize + 1);
        let cluster = wait_settled(&api, "elastic", 3, pods, Duration::from_secs(240)).await;
        let step = format!("replicasPerMaster → {replicas}");
        assert_clean(&cluster, &password, 3, &step);
        let status = cluster.status.unwrap();
        assert_eq!(status.ready_replicas, 3 * replicas, "{step}");
        for (id, slots) in &slots_before {
            let now = status.nodes.iter().filter(|n| n.role.as_deref() == Some("master")).find(|n| n.slots == *slots);
            assert!(now.is_some(), "{step}: the slots of {id} ({slots:?}) are still served together by one master");
        }
        if replicas > 0 {
            assert_all_read_back(&mut client, &seeds, &writer, &step).await;
        }
    }
    let record = writer.stop().await;
    eprintln!(
        "writer: {} acknowledged, {} without a replica ack, {} errors, longest gap {:?}",
        record.acknowledged.len(),
        record.unacknowledged,
        record.errors,
        record.longest_gap
    );
    assert!(record.acknowledged.len() > 1000, "the writer kept writing through all steps");
}

#[tokio::test]
async fn scale_in_is_refused_when_the_data_would_not_fit() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "day2-refuse").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let spec = |masters: i32| {
        format!("masters: {masters}, replicasPerMaster: 0, redis: {{version: 7.0.15, config: {{maxmemory: 8mb}}}}")
    };
    apply_cluster_spec(env, &ns, "tight", &spec(4));
    let cluster = wait_settled(&api, "tight", 4, 4, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "tight").await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    // About 5 MiB of values per master: 20 MiB cannot fit in 3 × 8 MiB × 90%.
    let value = "x".repeat(1000);
    for i in 0..20_000 {
        let key = format!("big:{i}");
        let build = |p: &mut redis::Pipeline| {
            p.cmd("SET").arg(&key).arg(&value);
        };
        let _: ((),) = client.routed(&key, &build).await.unwrap();
    }
    let owners_before: Vec<Vec<String>> =
        cluster.status.as_ref().unwrap().nodes.iter().map(|n| n.slots.clone()).collect();
    apply_cluster_spec(env, &ns, "tight", &spec(3));
    let refused = wait_until("the scale-in refused in status", Duration::from_secs(60), || async {
        let c = api.get("tight").await.ok()?;
        let degraded = c.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Degraded")?.clone();
        (degraded.status == "True" && degraded.reason == "ScaleInRefused").then_some(degraded.message)
    })
    .await;
    assert!(refused.contains("spec.masters back to 4"), "{refused}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = api.get("tight").await.unwrap();
    let owners_after: Vec<Vec<String>> = c.status.as_ref().unwrap().nodes.iter().map(|n| n.slots.clone()).collect();
    assert_eq!(owners_before, owners_after, "nothing moved");
    let events = kubectl(env, &["describe", "rdc", "tight", "-n", &ns], None).1;
    assert!(events.contains("ScaleInRefused"), "{events}");
}
