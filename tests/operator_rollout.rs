//! Version rollouts against real servers: redis 6.2.14 → 7.0.15 → valkey
//! 8.1.8 (one `spec` change, two consecutive rollouts) with persistent
//! volumes, a WAIT 1 writer throughout and a poller asking every node its
//! role every 100 ms; a shard without replicas upgraded with a surge; a
//! canary that cannot run rolled back by itself; a downgrade refused; a
//! rollout held by `spec.paused`.

mod common;

use slotkeeper_api::API_VERSION;
use std::collections::BTreeSet;
use std::time::Duration;

use common::operator::*;
use common::rollout::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use slotkeeper_operator::api::Phase;
use slotkeeper_operator::api::rollout::RolloutPhase;

#[tokio::test]
async fn redis_6_2_to_valkey_8_1_in_two_rollouts_with_nothing_lost_and_a_pause_held() {
    let env = shared_env();
    let operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let base = "masters: 3, replicasPerMaster: 1, storage: {size: 1Gi}, rollout: {canaryBakeSeconds: 3}";
    let spec = format!("{base}, redis: {{version: 6.2.14}}");
    let Seeded { ns, clusters, pods, cluster, password, seeds } =
        seeded_cluster(env, &kube, "rollout", "roll", &spec, 6, 100_000).await;
    assert_every_node_runs(&cluster, &password, "redis", "6.2.14").await;
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = follow_pods(&writer, pods.clone(), "roll");
    let poller = Poller::start(pods.clone(), "roll", &password, 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // One spec change, two hops: 6.2.14 → 7.0.15, then 7.0.15 → valkey 8.1.8.
    apply_cluster_spec(env, &ns, "roll", &format!("{base}, redis: {{engine: valkey, version: 8.1.8}}"));
    let upgrading = wait_until("the rollout started", Duration::from_secs(60), || async {
        let c = clusters.get("roll").await.ok()?;
        let up = c.status.as_ref()?.upgrade.clone()?;
        (up.phase == RolloutPhase::Progressing && c.status.as_ref()?.phase == Some(Phase::Upgrading)).then_some(up)
    })
    .await;
    assert_eq!((upgrading.from.as_str(), upgrading.to.as_str()), ("redis 6.2.14", "redis 7.0.15"));
    assert_eq!(upgrading.final_target.as_deref(), Some("valkey 8.1.8"));
    let not_ready = clusters.get("roll").await.unwrap();
    assert_eq!(condition(&not_ready, "Ready").map(|c| c.status.as_str()), Some("False"), "not Ready mid-rollout");

    // Paused after the first recreate: nothing is recreated for 30 s.
    wait_until("the canary's replica recreated", Duration::from_secs(120), || async {
        let history = events(&kube, &ns).await;
        history.iter().any(|e| e.reason.as_deref() == Some("RolloutPodRecreated")).then_some(())
    })
    .await;
    let (ok, out) =
        kubectl(env, &["patch", "rdc", "roll", "-n", &ns, "--type=merge", "-p", r#"{"spec":{"paused":true}}"#], None);
    assert!(ok, "{out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let uids = |list: Vec<Pod>| list.iter().map(|p| p.uid().unwrap()).collect::<BTreeSet<_>>();
    let held = uids(pods.list(&ListParams::default()).await.unwrap().items);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(held, uids(pods.list(&ListParams::default()).await.unwrap().items), "no Pod recreated while paused");
    let paused = clusters.get("roll").await.unwrap();
    let progressing = condition(&paused, "Progressing").unwrap();
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("False", "Paused"));
    let (ok, out) =
        kubectl(env, &["patch", "rdc", "roll", "-n", &ns, "--type=merge", "-p", r#"{"spec":{"paused":false}}"#], None);
    assert!(ok, "{out}");

    // The first hop completes before the second starts; Ready stays False between.
    let middle = wait_until("the second hop started", Duration::from_secs(600), || async {
        let c = clusters.get("roll").await.ok()?;
        (c.status.as_ref()?.upgrade.as_ref()?.to == "valkey 8.1.8").then_some(c)
    })
    .await;
    let between = middle.status.as_ref().unwrap();
    assert_eq!(between.current_version.as_deref(), Some("7.0.15"), "the first hop completed first");
    assert_eq!(between.upgrade.as_ref().unwrap().from, "redis 7.0.15");
    assert_eq!(condition(&middle, "Ready").unwrap().status, "False");
    let done = wait_rolled_out(&clusters, "roll", "valkey", "8.1.8").await;
    let status = done.status.clone().unwrap();
    let upgrade = status.upgrade.clone().unwrap();
    assert_eq!(upgrade.phase, RolloutPhase::Completed);
    assert_eq!((upgrade.from.as_str(), upgrade.to.as_str()), ("redis 7.0.15", "valkey 8.1.8"));
    assert!(upgrade.point_of_no_return_time.is_some() && upgrade.canary_bake_until.is_some());
    let each = |n: &slotkeeper_operator::api::NodeStatus| (n.engine.map(|e| e.to_string()), n.version.clone());
    assert!(
        status.nodes.iter().all(|n| each(n) == (Some("valkey".into()), Some("8.1.8".into()))),
        "{:?}",
        status.nodes
    );
    assert_every_node_runs(&done, &password, "valkey", "8.1.8").await;
    let (ok, printed) = kubectl(env, &["get", "rdc", "roll", "-n", &ns], None);
    assert!(
        ok && printed.contains("valkey") && printed.contains("8.1.8"),
        "kubectl get rdc shows engine and version: {printed}"
    );

    let (samples, gaps, order) = poller.stop().await;
    assert!(samples > 300, "the poller sampled ({samples})");
    assert!(gaps.is_empty(), "a shard without a reachable master: {:?}", &gaps[..gaps.len().min(10)]);
    let history = events(&kube, &ns).await;
    // The canary shard first: its temporary replica (ordinal 2) joins, then
    // whichever of ordinals 0 and 1 is a replica at that moment is recreated,
    // then the other after the failover. Which one is the replica is not fixed:
    // spreading masters over the Nodes (at creation, and between the hops) may
    // hand the master role to either.
    assert_eq!(order.len(), 18, "each Pod recreated once per hop, one temporary replica per shard: {order:?}");
    let pods = |ordinals: [u8; 3]| ordinals.map(|o| format!("roll-shard-0-{o}")).to_vec();
    for hop in order.chunks(9) {
        assert!(hop[..3] == pods([2, 0, 1]) || hop[..3] == pods([2, 1, 0]), "canary shard first: {order:?}");
    }
    let metrics = operator.metrics().await;
    let steps =
        common::metrics::sum(&metrics, "slotkeeper_rollout_steps_total{namespace=\"rollout\",cluster=\"roll\"}");
    assert!(steps >= 18.0, "12 Pods recreated and 6 failovers counted as rollout steps ({steps})");
    for reason in ["RolloutStarted", "CanaryBaking", "PointOfNoReturn", "RolloutCompleted"] {
        assert!(history.iter().any(|e| e.reason.as_deref() == Some(reason)), "event {reason}");
    }
    let check = redis_cli_check(&node_ips(&done)[0], &password);
    assert!(check.contains("[OK] All 16384 slots covered.") && !check.contains("[ERR]"), "{check}");
    follower.abort();
    // Every Pod has a new address now: a client that starts from them.
    let mut client = ClusterClient::new(node_ips(&done), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "after 6.2.14 → 7.0.15 → valkey 8.1.8").await;
    let record = writer.stop().await;
    eprintln!(
        "writer: {} acknowledged, {} unacknowledged, {} errors, longest gap {} ms; poller: {samples} samples",
        record.acknowledged.len(),
        record.unacknowledged,
        record.errors,
        record.longest_gap.as_millis()
    );

    // Back to redis 7.0.15 after the point of no return: refused, nothing changes.
    apply_cluster_spec(env, &ns, "roll", &format!("{base}, redis: {{engine: redis, version: 7.0.15}}"));
    let refused = wait_until("the downgrade refused", Duration::from_secs(60), || async {
        let c = clusters.get("roll").await.ok()?;
        let degraded = condition(&c, "Degraded")?.clone();
        (degraded.status == "True" && degraded.reason == "VersionRefused").then_some((c, degraded))
    })
    .await;
    assert!(refused.1.message.starts_with("spec.redis.version"), "{}", refused.1.message);
    assert!(refused.1.message.contains("cannot be reached from valkey 8.1.8"), "{}", refused.1.message);
    assert_eq!(condition(&refused.0, "Ready").unwrap().status, "False");
    assert_eq!(refused.0.status.as_ref().unwrap().current_version.as_deref(), Some("8.1.8"));
    let warned = events(&kube, &ns).await;
    assert!(
        warned.iter().any(|e| e.reason.as_deref() == Some("VersionRefused") && e.type_.as_deref() == Some("Warning"))
    );
}

#[tokio::test]
async fn a_shard_without_replicas_is_upgraded_with_a_surge_replica() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let base = "masters: 3, replicasPerMaster: 0, storage: {size: 1Gi}, rollout: {canaryBakeSeconds: 0}";
    let spec = format!("{base}, redis: {{version: 7.0.15}}");
    let Seeded { ns, clusters, pods, password, seeds, .. } =
        seeded_cluster(env, &kube, "rollout-surge", "lone", &spec, 3, 30_000).await;
    let poller = Poller::start(pods.clone(), "lone", &password, 3).await;
    apply_cluster_spec(env, &ns, "lone", &format!("{base}, redis: {{engine: valkey, version: 8.1.8}}"));
    let done = wait_rolled_out(&clusters, "lone", "valkey", "8.1.8").await;
    let (samples, gaps, made) = poller.stop().await;
    assert!(gaps.is_empty(), "a shard without a reachable master: {:?}", &gaps[..gaps.len().min(10)]);
    assert!(samples > 50, "the poller sampled ({samples})");
    // Per shard: the temporary replica (ordinal 1), then the old node recreated.
    let expected: Vec<String> =
        (0..3).flat_map(|s| [format!("lone-shard-{s}-1"), format!("lone-shard-{s}-0")]).collect();
    assert_eq!(made, expected, "a surge replica per shard, one shard at a time");
    assert_eq!(done.status.as_ref().unwrap().nodes.len(), 3, "the temporary replicas left");
    assert_every_node_runs(&done, &password, "valkey", "8.1.8").await;
    let mut client = ClusterClient::new(node_ips(&done), &password).await;
    common::writer::assert_none_lost(&mut client, &seeds, 0, "after the surge rollout").await;
}

#[tokio::test]
async fn a_canary_that_cannot_run_is_rolled_back_and_not_retried() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let base = "masters: 3, replicasPerMaster: 1, rollout: {canaryBakeSeconds: 0, stepTimeoutSeconds: 60}";
    let spec = format!("{base}, redis: {{version: 6.2.14}}");
    let Seeded { ns, clusters, pods, cluster, password, seeds } =
        seeded_cluster(env, &kube, "rollout-back", "back", &spec, 6, 20_000).await;
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = follow_pods(&writer, pods.clone(), "back");
    apply_cluster_spec(
        env,
        &ns,
        "back",
        &format!("{base}, redis: {{version: 7.0.15, image: 'slotkeeper.test/exits-at-once:1'}}"),
    );
    let rolled_back = wait_until("the rollout rolled back", Duration::from_secs(300), || async {
        let c = clusters.get("back").await.ok()?;
        let ready = condition(&c, "Ready")?;
        (ready.reason == "RolledBack").then_some(c)
    })
    .await;
    let status = rolled_back.status.clone().unwrap();
    let rollback = status.upgrade.clone().unwrap().last_rollback.expect("recorded");
    assert_eq!(rollback.gate, "ContainerRestarts", "{rollback:?}");
    assert!(rollback.reason.contains("back-shard-0-2"), "the canary's temporary replica: {}", rollback.reason);
    assert_eq!(status.current_version.as_deref(), Some("6.2.14"));
    let progressing = condition(&rolled_back, "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "RolledBack"),
        "a pipeline can fail fast"
    );
    let settled = wait_until("every node back on 6.2.14", Duration::from_secs(60), || async {
        let c = clusters.get("back").await.ok()?;
        let nodes = &c.status.as_ref()?.nodes;
        (nodes.len() == 6 && nodes.iter().all(|n| n.version.as_deref() == Some("6.2.14"))).then_some(c)
    })
    .await;
    assert_every_node_runs(&settled, &password, "redis", "6.2.14").await;
    // No retry loop: the failed target is remembered.
    let before = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.uid().unwrap())
        .collect::<BTreeSet<_>>();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.uid().unwrap())
        .collect::<BTreeSet<_>>();
    assert_eq!(before, after, "no Pod recreated after the rollback");
    let history = events(&kube, &ns).await;
    let warning = history.iter().find(|e| e.reason.as_deref() == Some("RolloutRolledBack")).expect("an event");
    assert!(warning.message.as_deref().unwrap_or_default().contains("gate ContainerRestarts"), "{warning:?}");
    assert_eq!(history.iter().filter(|e| e.reason.as_deref() == Some("RolloutStarted")).count(), 1, "started once");
    follower.abort();
    let mut client = ClusterClient::new(node_ips(&settled), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "after the rollback").await;
    writer.stop().await;
}

/// Security review finding 10, as it was found: a version rollout (redis
/// 7.0.15 → valkey 8.1.8), then a RollingRestart, then a second one, with a
/// canary bake and a WAIT 1 writer throughout. Right after a restart step a
/// recreated Pod's old node id is still listed (departed, not yet failed):
/// the bake waits for it instead of failing, every Pod is recreated once per
/// restart, Ready comes back each time and nothing is lost.
#[tokio::test]
async fn a_rolling_restart_after_a_rollout_and_again_recreates_every_pod_once_with_nothing_lost() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let base = "masters: 3, replicasPerMaster: 1, rollout: {canaryBakeSeconds: 5}";
    let spec = format!("{base}, redis: {{version: 7.0.15}}");
    let Seeded { ns, clusters, pods, cluster, password, seeds } =
        seeded_cluster(env, &kube, "rollout-restart", "again", &spec, 6, 20_000).await;
    let operations: Api<slotkeeper_operator::api::RedisOperation> = Api::namespaced(kube.clone(), &ns);
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = follow_pods(&writer, pods.clone(), "again");
    tokio::time::sleep(Duration::from_secs(1)).await;

    apply_cluster_spec(env, &ns, "again", &format!("{base}, redis: {{engine: valkey, version: 8.1.8}}"));
    wait_rolled_out(&clusters, "again", "valkey", "8.1.8").await;

    for name in ["restart-1", "restart-2"] {
        let poller = Poller::start(pods.clone(), "again", &password, 3).await;
        let op = format!(
            "apiVersion: {API_VERSION}\nkind: RedisOperation\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterName: again, type: RollingRestart}}\n"
        );
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&op));
        assert!(ok, "{out}");
        let finished = wait_until(&format!("{name} finished"), Duration::from_secs(600), || async {
            let op = operations.get(name).await.ok()?;
            let phase = op.status.as_ref()?.phase?;
            matches!(
                phase,
                slotkeeper_operator::api::OperationPhase::Succeeded | slotkeeper_operator::api::OperationPhase::Failed
            )
            .then_some(op)
        })
        .await;
        let status = finished.status.unwrap();
        assert_eq!(
            status.phase,
            Some(slotkeeper_operator::api::OperationPhase::Succeeded),
            "{name}: {:?}",
            status.message
        );
        let (_, gaps, made) = poller.stop().await;
        assert!(gaps.is_empty(), "{name}: a shard without a reachable master: {:?}", &gaps[..gaps.len().min(10)]);
        let moved: Vec<String> = event_messages(&kube, &ns, "PodMoved").await;
        assert_recreated_once(&made, "again", &moved);
        let done = wait_settled(&clusters, "again", 3, 6, Duration::from_secs(120)).await;
        assert_eq!(condition(&done, "Ready").map(|c| c.status.as_str()), Some("True"), "{name}: Ready again");
        let current = done.status.as_ref().unwrap();
        assert_eq!(current.current_version.as_deref(), Some("8.1.8"), "{name}: the version stays");
    }
    follower.abort();
    let done = clusters.get("again").await.unwrap();
    let mut client = ClusterClient::new(node_ips(&done), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "after a rollout and two rolling restarts").await;
    writer.stop().await;
}

/// `INFO` `section` of the node at `ip`, or `None` while it does not answer.
async fn info(ip: &str, password: &str, section: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://:{password}@{ip}:6379/")).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("INFO").arg(section).query_async(&mut c).await.ok()
}

#[tokio::test]
async fn a_rollout_cancelled_after_a_replica_saved_in_valkeys_format_goes_back_with_nothing_lost() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let base = "masters: 3, replicasPerMaster: 1, storage: {size: 1Gi}, rollout: {canaryBakeSeconds: 0}";
    let Seeded { ns, clusters, pods, cluster, password, seeds } =
        seeded_cluster(env, &kube, "rollout-cancel", "undo", &format!("{base}, redis: {{version: 7.0.15}}"), 6, 20_000)
            .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(kube.clone(), &ns);
    let claim_before = claims.get("data-undo-shard-0-1").await.unwrap().uid().unwrap();
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = follow_pods(&writer, pods.clone(), "undo");
    apply_cluster_spec(env, &ns, "undo", &format!("{base}, redis: {{engine: valkey, version: 8.1.8}}"));

    // Held right after the canary's replica was recreated on valkey 8.1.8.
    wait_until("the canary's replica recreated", Duration::from_secs(180), || async {
        let history = events(&kube, &ns).await;
        history.iter().any(|e| e.reason.as_deref() == Some("RolloutPodRecreated")).then_some(())
    })
    .await;
    let paused = r#"{"spec":{"paused":true}}"#;
    let (ok, out) = kubectl(env, &["patch", "rdc", "undo", "-n", &ns, "--type=merge", "-p", paused], None);
    assert!(ok, "{out}");
    // Generous: under CI's load (five rollouts at once on two cores) its
    // start and full sync once took longer than two minutes.
    let replica_ip = wait_until("undo-shard-0-1 back on valkey 8.1.8, linked", Duration::from_secs(240), || async {
        let pod = pods.get("undo-shard-0-1").await.ok()?;
        let ip = pod.status.as_ref()?.pod_ip.clone()?;
        let server = info(&ip, &password, "server").await?;
        let linked = info(&ip, &password, "replication").await?.contains("master_link_status:up");
        (server.contains("valkey_version:8.1.8") && linked).then_some(ip)
    })
    .await;
    // It saves its data in valkey's format (RDB 11), which redis 7.0 cannot read.
    let mut c = redis::Client::open(format!("redis://:{password}@{replica_ip}:6379/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // After its full sync it may be rewriting already: that is the same file.
    let asked: redis::RedisResult<redis::Value> = redis::cmd("BGREWRITEAOF").query_async(&mut c).await;
    assert!(asked.is_ok() || format!("{asked:?}").contains("already in progress"), "{asked:?}");
    wait_until("the replica's AOF rewritten by valkey", Duration::from_secs(60), || async {
        let persistence = info(&replica_ip, &password, "persistence").await?;
        let done = persistence.contains("aof_rewrite_in_progress:0")
            && persistence.contains("aof_last_bgrewrite_status:ok")
            && !persistence.contains("aof_rewrites:0\r");
        done.then_some(())
    })
    .await;

    // Back to 7.0.15 before the point of no return: the rollout is cancelled.
    apply_cluster_spec(env, &ns, "undo", &format!("{base}, redis: {{version: 7.0.15}}, paused: false"));
    let back = wait_until("every node back on redis 7.0.15", Duration::from_secs(300), || async {
        let c = clusters.get("undo").await.ok()?;
        let status = c.status.as_ref()?;
        let rolled_back = status.upgrade.as_ref()?.phase == RolloutPhase::RolledBack;
        let nodes = &status.nodes;
        let all_old = nodes.len() == 6 && nodes.iter().all(|n| n.version.as_deref() == Some("7.0.15"));
        let ready = condition(&c, "Ready").is_some_and(|r| r.status == "True");
        (rolled_back && all_old && ready).then_some(c)
    })
    .await;
    let rollback = back.status.as_ref().unwrap().upgrade.clone().unwrap().last_rollback.expect("recorded");
    assert!(rollback.reason.contains("set back to 7.0.15"), "{rollback:?}");
    assert_every_node_runs(&back, &password, "redis", "7.0.15").await;
    let claim_after = claims.get("data-undo-shard-0-1").await.unwrap().uid().unwrap();
    assert_ne!(claim_before, claim_after, "the replica came back on a new, empty volume");
    let history = events(&kube, &ns).await;
    assert!(
        history.iter().any(|e| e.reason.as_deref() == Some("RolloutVolumeReplaced")
            && e.message
                .as_deref()
                .unwrap_or_default()
                .contains("undo-shard-0-1 to redis 7.0.15 (redis:7.0.15) with a fresh volume")),
        "an event says why the volume was replaced"
    );
    follower.abort();
    let mut client = ClusterClient::new(node_ips(&back), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "after the cancelled rollout").await;
    writer.stop().await;
}
