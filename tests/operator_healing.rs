//! Self-healing with a writer running (each write acknowledged only after
//! `WAIT 1`): a master process crash, a master Pod deleted, every Pod deleted
//! at once (all addresses change), a Node stopped, a master frozen. After
//! each: every acknowledged key reads back, `redis-cli --cluster check` is
//! clean, and status matches Redis.

mod common;

use std::time::{Duration, Instant};

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use slotkeeper_operator::api::{Phase, RedisCluster};

/// Waits until the cluster left Running (it noticed), then until it is
/// settled again; returns the phases seen.
async fn recovers(api: &Api<RedisCluster>, name: &str, step: &str) -> (Vec<Phase>, RedisCluster) {
    let mut phases = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "{step}: no recovery in 240s; phases {phases:?}");
        if let Ok(c) = api.get(name).await
            && let Some(phase) = c.status.as_ref().and_then(|s| s.phase)
        {
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
            let left_running = phases.iter().any(|p| *p != Phase::Running);
            let status = c.status.as_ref().unwrap();
            let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            if left_running && phase == Phase::Running && ready && status.nodes.len() == 6 && status.ready_masters == 3
            {
                return (phases, c);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Settled, with `victim` back as a replica, or as master again only where
/// spreading masters over the Nodes moved it back (said in an event).
async fn rejoined(api: &Api<RedisCluster>, kube: &kube::Client, ns: &str, victim: &str, step: &str) -> RedisCluster {
    let cluster = wait_settled(api, "sturdy", 3, 6, Duration::from_secs(120)).await;
    let role = cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().role.clone();
    if role.as_deref() != Some("replica") {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(kube.clone(), ns);
        let spread = events.list(&ListParams::default()).await.unwrap().items.into_iter().any(|e| {
            e.reason.as_deref() == Some("MastersSpread")
                && e.message.as_deref().is_some_and(|m| m.contains("promoted") && m.contains(victim))
        });
        assert!(spread, "{step}: {victim} is {role:?}, not a replica, and no MastersSpread event promoted it");
    }
    cluster
}

async fn verify(
    client: &mut ClusterClient,
    seeds: &[String],
    writer: &Writer,
    password: &str,
    cluster: &RedisCluster,
    step: &str,
) {
    let status = cluster.status.as_ref().unwrap();
    let check = redis_cli_check(status.nodes[0].ip.as_deref().unwrap(), password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{step}: {check}");
    assert!(!check.contains("[ERR]") && !check.contains("[WARNING]"), "{step}: {check}");
    assert_eq!(status.ready_replicas, 3, "{step}: every shard has its replica again");
    assert_all_read_back(client, seeds, writer, step).await;
}

#[tokio::test]
async fn the_cluster_heals_from_crashes_deletions_lost_nodes_and_freezes() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "healing").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &ns);
    apply_cluster_spec(
        env,
        &ns,
        "sturdy",
        "masters: 3, replicasPerMaster: 1, redis: {version: 7.0.15}, storage: {size: 1Gi}",
    );
    let cluster = wait_settled(&api, "sturdy", 3, 6, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "sturdy").await;
    let mut client = ClusterClient::new(node_ips(&api.get("sturdy").await.unwrap()), &password).await;
    let seeds = client.seed("seed", 20_000).await;
    let writer = Writer::start(node_ips(&api.get("sturdy").await.unwrap()), &password, "ack").await;

    // 1. A master process crashes. A single crash is restarted at once (as a
    //    kubelet does) and is back before cluster-node-timeout, so Redis keeps
    //    it as master; it crash-loops here until the node agent's back-off
    //    keeps it down long enough for Redis to promote its replica. It then
    //    comes back as a replica of the promoted node.
    let victim = master_pods(&cluster)[0].clone();
    let restarts = |p: Pod| p.status.and_then(|s| s.container_statuses).map_or(0, |c| c[0].restart_count);
    let mut phases = Vec::new();
    for crash in 0..6 {
        let before = restarts(pods.get(&victim).await.unwrap());
        env.crash_container(&ns, &victim, "redis").await.unwrap();
        let promoted = wait_until("the crashed master restarted or failed over", Duration::from_secs(90), || async {
            let c = api.get("sturdy").await.ok()?;
            let phase = c.status.as_ref()?.phase?;
            let promoted = !master_pods(&c).contains(&victim) && master_pods(&c).len() == 3;
            let restarted = restarts(pods.get(&victim).await.ok()?) > before;
            (promoted || restarted).then_some((promoted, phase))
        })
        .await;
        phases.push(promoted.1);
        eprintln!("master crash {crash}: promoted={}", promoted.0);
        if promoted.0 {
            break;
        }
        // Crash it again as soon as it is up.
        wait_until("the master is up again", Duration::from_secs(60), || async {
            let p = pods.get(&victim).await.ok()?;
            let ready = p.status?.container_statuses?.first()?.ready;
            ready.then_some(())
        })
        .await;
    }
    let (seen, _) = recovers(&api, "sturdy", "master crash").await;
    phases.extend(seen);
    assert!(phases.contains(&Phase::Recovering), "master crash: {phases:?}");
    let cluster = rejoined(&api, &kube, &ns, &victim, "master crash").await;
    verify(&mut client, &seeds, &writer, &password, &cluster, "master crash").await;

    // 2. A master Pod is deleted: the replacement rejoins with its node id (persistent storage).
    let victim = master_pods(&cluster)[0].clone();
    let old_id = cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().node_id.clone();
    pods.delete(&victim, &DeleteParams::default()).await.unwrap();
    let (_, cluster) = recovers(&api, "sturdy", "master Pod deleted").await;
    let new_id = cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().node_id.clone();
    assert_eq!(old_id, new_id, "the recreated Pod kept its node id from its volume");
    verify(&mut client, &seeds, &writer, &password, &cluster, "master Pod deleted").await;

    // 3. Every Pod deleted at once: all addresses change; the cluster re-forms
    //    from the volumes without manual steps.
    let before: Vec<String> = node_ips(&api.get("sturdy").await.unwrap());
    let started = Instant::now();
    pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("slotkeeper.io/cluster=sturdy"))
        .await
        .unwrap();
    let (_, cluster) = recovers(&api, "sturdy", "all Pods deleted").await;
    eprintln!("all Pods deleted → Running and Ready in {:.1}s", started.elapsed().as_secs_f64());
    let after: Vec<String> = node_ips(&api.get("sturdy").await.unwrap());
    assert!(after.iter().all(|ip| !before.contains(ip)), "every address changed: {before:?} → {after:?}");
    // Clients find the cluster again at its new addresses (as a Service would give them).
    writer.reseed(after.clone());
    client = ClusterClient::new(after, &password).await;
    verify(&mut client, &seeds, &writer, &password, &cluster, "all Pods deleted").await;

    // 4. A Node stops: its Pods are replaced elsewhere and the cluster recovers.
    let victim = master_pods(&cluster)[0].clone();
    let node = pods.get(&victim).await.unwrap().spec.unwrap().node_name.unwrap();
    env.stop_node(&node).await.unwrap();
    let (_, cluster) = recovers(&api, "sturdy", "node stopped").await;
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        assert_ne!(pod.spec.unwrap().node_name.as_deref(), Some(node.as_str()), "nothing left on the stopped Node");
    }
    verify(&mut client, &seeds, &writer, &password, &cluster, "node stopped").await;
    env.start_node(&node).await.unwrap();
    // Back, the Node gets its share of the Pods again (replicas recreated
    // there one at a time), and the cluster settles.
    let cluster = wait_until(&format!("{node} holds two Pods again"), Duration::from_secs(300), || async {
        let c = api.get("sturdy").await.ok()?;
        let status = c.status.as_ref()?;
        let on_node = status.nodes.iter().filter(|n| n.node.as_deref() == Some(node.as_str())).count();
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (on_node == 2 && ready && status.step.is_none() && status.nodes.len() == 6).then_some(c)
    })
    .await;
    verify(&mut client, &seeds, &writer, &password, &cluster, "node back").await;

    // 5. A frozen master is failed over and rejoins as a replica once thawed.
    let victim = master_pods(&cluster)[0].clone();
    // Its replica must be in sync (not still loading after step 4) to be elected.
    let victim_ip =
        cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().ip.clone().unwrap();
    wait_until("the frozen master's replica in sync", Duration::from_secs(60), || async {
        let url = format!("redis://:{password}@{victim_ip}:6379/");
        let mut c = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut c).await.ok()?;
        info.lines().any(|l| l.starts_with("slave0:") && l.contains("state=online")).then_some(())
    })
    .await;
    env.freeze_pod(&ns, &victim).await.unwrap();
    wait_until("the frozen master failed over", Duration::from_secs(60), || async {
        let c = api.get("sturdy").await.ok()?;
        let masters = master_pods(&c);
        (masters.len() == 3 && !masters.contains(&victim)).then_some(())
    })
    .await;
    env.thaw_pod(&ns, &victim).await.unwrap();
    let cluster = rejoined(&api, &kube, &ns, &victim, "master frozen and thawed").await;
    verify(&mut client, &seeds, &writer, &password, &cluster, "master frozen and thawed").await;

    let record = writer.stop().await;
    eprintln!(
        "writer: {} acknowledged, {} errors, longest gap {:?}",
        record.acknowledged.len(),
        record.errors,
        record.longest_gap
    );
}
