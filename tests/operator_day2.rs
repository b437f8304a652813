//! Day-2 operations on a live cluster with a writer running: scale out and
//! in with resharding, replica scaling; after each step every acknowledged
//! key reads back, `redis-cli --cluster check` is clean, status matches Redis.

mod common;

use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use kube::Api;
use slotkeeper_operator::api::{OperationPhase, RedisCluster};

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

/// A connection to one node, authenticated.
async fn node(ip: &str, password: &str) -> redis::aio::MultiplexedConnection {
    let mut c = common::redis_at(ip, 6379).await;
    let () = redis::cmd("AUTH").arg(password).query_async(&mut c).await.unwrap();
    c
}

/// Bytes each master holds, counted by the test itself: `MEMORY USAGE` of
/// every key (SCAN), not the operator's sampled estimate. Keyed by Pod.
async fn bytes_per_master(cluster: &RedisCluster, password: &str) -> std::collections::BTreeMap<String, (u64, usize)> {
    let mut out = std::collections::BTreeMap::new();
    for n in cluster.status.as_ref().unwrap().nodes.iter().filter(|n| n.role.as_deref() == Some("master")) {
        let mut c = node(n.ip.as_deref().unwrap(), password).await;
        let (mut cursor, mut bytes, mut keys) = (0u64, 0u64, 0usize);
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) =
                redis::cmd("SCAN").arg(cursor).arg("COUNT").arg(1000).query_async(&mut c).await.unwrap();
            let mut pipe = redis::pipe();
            for key in &batch {
                pipe.cmd("MEMORY").arg("USAGE").arg(key);
            }
            let sizes: Vec<Option<u64>> = pipe.query_async(&mut c).await.unwrap();
            bytes += sizes.into_iter().flatten().sum::<u64>();
            keys += batch.len();
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        out.insert(n.pod.clone(), (bytes, keys));
    }
    out
}

/// The largest distance of a master's bytes from the mean, in percent.
fn spread_percent(bytes: &std::collections::BTreeMap<String, (u64, usize)>) -> f64 {
    let mean = bytes.values().map(|(b, _)| *b as f64).sum::<f64>() / bytes.len() as f64;
    bytes.values().map(|(b, _)| (*b as f64 - mean).abs() / mean * 100.0).fold(0.0, f64::max)
}

#[tokio::test]
async fn balancing_by_memory_evens_a_skewed_keyspace_on_demand_and_when_scaling() {
    const TOLERANCE: f64 = 10.0;
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "day2-memory").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let spec = |masters: i32| {
        format!(
            "masters: {masters}, replicasPerMaster: 0, redis: {{version: 7.0.15}}, balance: {{by: Memory, tolerancePercent: 10}}"
        )
    };
    apply_cluster_spec(env, &ns, "skewed", &spec(3));
    let cluster = wait_settled(&api, "skewed", 3, 3, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "skewed").await;

    // Small keys everywhere, written to the master owning each key's slot.
    let masters = master_slots(&cluster);
    let small: Vec<String> = (0..30_000).map(|i| format!("small:{i}")).collect();
    for (ip, slots) in &masters {
        let mut c = node(ip, &password).await;
        let mut pipe = redis::pipe();
        for key in small.iter().filter(|k| slots.contains(&common::writer::slot_of(k))) {
            pipe.cmd("SET").arg(key).arg(format!("{key}:{}", "s".repeat(40))).ignore();
        }
        let () = pipe.query_async(&mut c).await.unwrap();
    }
    // And a few slots of the first master holding most bytes: 12 hash tags,
    // 40 values of 8 KB each.
    let (first_ip, first_slots) = &masters[0];
    let tags: Vec<String> = (0..)
        .map(|i| format!("hot{i}"))
        .filter(|t| first_slots.contains(&common::writer::slot_of(t)))
        .take(12)
        .collect();
    let big_value = |key: &str| format!("{key}:{}", "b".repeat(8000));
    let big: Vec<String> = tags.iter().flat_map(|t| (0..40).map(move |i| format!("{{{t}}}:{i}"))).collect();
    let mut c = node(first_ip, &password).await;
    let mut pipe = redis::pipe();
    for key in &big {
        pipe.cmd("SET").arg(key).arg(big_value(key)).ignore();
    }
    let () = pipe.query_async(&mut c).await.unwrap();
    let before = bytes_per_master(&cluster, &password).await;
    assert!(spread_percent(&before) > 50.0, "the keyspace starts skewed: {before:?}");

    // Balanced by slot count, so nothing moves until asked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(api.get("skewed").await.unwrap().status.unwrap().reshard.is_none(), "memory mode does not churn");

    let op = format!(
        "apiVersion: {}\nkind: RedisOperation\nmetadata: {{name: even-out, namespace: {ns}}}\nspec: {{clusterName: skewed, type: Rebalance}}\n",
        slotkeeper_api::API_VERSION
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&op));
    assert!(ok, "{out}");
    let ops: Api<slotkeeper_operator::api::RedisOperation> = Api::namespaced(kube.clone(), &ns);
    let done = wait_until("RedisOperation even-out finished", Duration::from_secs(120), || async {
        let o = ops.get("even-out").await.ok()?;
        let s = o.status?;
        matches!(s.phase, Some(OperationPhase::Succeeded | OperationPhase::Failed)).then_some(s)
    })
    .await;
    assert_eq!(done.phase, Some(OperationPhase::Succeeded), "{done:?}");
    let message = done.message.unwrap_or_default();
    assert!(message.contains("data per master") && message.contains("planned"), "{message}");
    let cluster = wait_settled(&api, "skewed", 3, 3, Duration::from_secs(60)).await;
    let record = cluster.status.as_ref().unwrap().balance.clone().expect("status.balance");
    assert_eq!(record.operation.as_deref(), Some("even-out"));
    let after = bytes_per_master(&cluster, &password).await;
    // The plan samples up to 16 keys per slot; counted key by key, the data
    // per master is within the tolerance, with 1% for that estimate.
    assert!(spread_percent(&after) <= TOLERANCE + 1.0, "after the Rebalance: {after:?} ({message})");
    let keys: usize = after.values().map(|(_, k)| k).sum();
    assert_eq!(keys, small.len() + big.len(), "every key is still there");
    let events = kubectl(env, &["get", "events", "-n", &ns, "-o", "custom-columns=R:.reason,M:.message"], None).1;
    assert!(events.contains("RebalancePlanned") && events.contains("for RedisOperation even-out"), "{events}");

    // Scaling out keeps it even by memory too.
    apply_cluster_spec(env, &ns, "skewed", &spec(4));
    let cluster = wait_settled(&api, "skewed", 4, 4, Duration::from_secs(240)).await;
    let scaled = bytes_per_master(&cluster, &password).await;
    assert_eq!(scaled.len(), 4);
    assert!(spread_percent(&scaled) <= TOLERANCE + 1.0, "after scaling out: {scaled:?}");
    assert_eq!(scaled.values().map(|(_, k)| k).sum::<usize>(), small.len() + big.len());
    // Every big key and a sample of the small ones read back whole from
    // the master status says owns its slot.
    let owners = master_slots(&cluster);
    for (ip, slots) in &owners {
        let mut c = node(ip, &password).await;
        for key in big.iter().chain(small.iter().step_by(97)).filter(|k| slots.contains(&hash_slot(k))) {
            let value: Option<String> = redis::cmd("GET").arg(key).query_async(&mut c).await.unwrap();
            let value = value.unwrap_or_else(|| panic!("{key} lost"));
            assert!(value.starts_with(&format!("{key}:")), "{key}: {}", &value[..40.min(value.len())]);
        }
    }
    println!(
        "memory balance: spread before {:.1}%, after Rebalance {:.1}%, after scale out {:.1}% (tolerance {TOLERANCE}%)",
        spread_percent(&before),
        spread_percent(&after),
        spread_percent(&scaled)
    );
}

/// Each master's address and the slots status says it owns.
fn master_slots(cluster: &RedisCluster) -> Vec<(String, std::collections::BTreeSet<u16>)> {
    let nodes = &cluster.status.as_ref().unwrap().nodes;
    nodes
        .iter()
        .filter(|n| n.role.as_deref() == Some("master"))
        .map(|n| (n.ip.clone().unwrap(), slots_in(&n.slots)))
        .collect()
}

/// The slot of a key, honouring a `{hash tag}`.
fn hash_slot(key: &str) -> u16 {
    let tag = key.find('{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.find('}').filter(|&close| close > 0).map(|close| &rest[..close])
    });
    common::writer::slot_of(tag.unwrap_or(key))
}
