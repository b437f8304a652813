//! Masters over failure domains, end to end: 3 Nodes, the default topology
//! key (`kubernetes.io/hostname`), a 3×1 cluster with persistent storage and
//! a `WAIT 1` writer running throughout. After creation, every Pod deleted,
//! a master crash Redis fails over, and scaling 3 → 4 → 3, no Node holds
//! more than ⌈masters / 3⌉ masters within the bound below. Then each Node is
//! stopped in turn: every shard accepts writes again within
//! cluster-node-timeout plus a few seconds (printed per Node), the Node
//! comes back and gets its share of Pods and masters again, and nothing
//! acknowledged is lost. Last, the same stop with every master arranged on
//! one Node (the cluster paused meanwhile), for the figure beside it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::operator::*;
use common::rollout::{condition, follow_pods};
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use slotkeeper_env::Environment;
use slotkeeper_operator::api::RedisCluster;
use slotkeeper_operator::resources::CLUSTER_NODE_TIMEOUT_MS;

const NAME: &str = "apart";
/// How long after the cluster is Ready again the masters may take to be
/// spread (each move is one coordinated failover; a replica recreated
/// elsewhere must first run a minute and sync).
const SPREAD_BOUND: Duration = Duration::from_secs(180);

/// Masters per Node (its `kubernetes.io/hostname` is its name), from
/// status, checked against the roles and Nodes status lists per Pod.
fn masters_per_node(cluster: &RedisCluster) -> BTreeMap<String, usize> {
    let status = cluster.status.as_ref().unwrap();
    let by_domain: BTreeMap<String, usize> =
        status.failure_domains.iter().map(|d| (d.name.clone(), d.masters.len())).collect();
    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    for n in status.nodes.iter().filter(|n| n.role.as_deref() == Some("master") && !n.slots.is_empty()) {
        assert_eq!(n.domain, n.node, "{}: a Node's hostname label is its name", n.pod);
        *by_node.entry(n.node.clone().unwrap_or_default()).or_default() += 1;
    }
    let nonzero: BTreeMap<String, usize> = by_domain.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(nonzero, by_node, "status.failureDomains agrees with status.nodes");
    by_node
}

/// Running, Ready, `masters` masters and twice as many Pods, nothing moving.
fn settled(c: &RedisCluster, masters: i32) -> bool {
    let Some(status) = c.status.as_ref() else { return false };
    let ready = condition(c, "Ready").is_some_and(|r| r.status == "True");
    let moving = status.step.is_some() || status.reshard.is_some();
    ready
        && !moving
        && status.observed_generation == c.metadata.generation
        && status.ready_masters == masters
        && status.nodes.len() == masters as usize * 2
        && status.nodes.iter().all(|n| n.role.is_some())
}

/// Settled with `masters` masters, no Node holding more than its share of
/// them (⌈masters / 3⌉) or of the Pods; how long that took from `since`.
async fn wait_spread(api: &Api<RedisCluster>, masters: i32, since: Instant, step: &str) -> (RedisCluster, Duration) {
    let most = (masters as usize).div_ceil(3);
    let what = format!("{step}: settled with at most {most} master(s) per Node");
    let spread = wait_until(&what, SPREAD_BOUND + Duration::from_secs(240), || async {
        let c = api.get(NAME).await.ok()?;
        if !settled(&c, masters) {
            return None;
        }
        let per_node = masters_per_node(&c);
        let mut pods_per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &c.status.as_ref()?.nodes {
            *pods_per_node.entry(n.node.as_deref()?).or_default() += 1;
        }
        let pods_even =
            pods_per_node.len() == 3 && pods_per_node.values().all(|&n| n <= (masters as usize * 2).div_ceil(3));
        let masters_apart = per_node.len() == 3.min(masters as usize) && per_node.values().all(|&n| n <= most);
        (masters_apart && pods_even).then_some(c)
    })
    .await;
    let took = since.elapsed();
    eprintln!(
        "{step}: settled and spread {:?} after {:.1}s (unix {:.3})",
        masters_per_node(&spread),
        took.as_secs_f64(),
        unix_now()
    );
    (spread, took)
}

/// Wall-clock seconds, printed at each step to line up with the logs.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

fn master_ids(cluster: &RedisCluster) -> BTreeMap<String, String> {
    let nodes = &cluster.status.as_ref().unwrap().nodes;
    nodes
        .iter()
        .filter(|n| n.role.as_deref() == Some("master"))
        .map(|n| (n.pod.clone(), n.node.clone().unwrap_or_default()))
        .collect()
}

/// One writer per shard (keys in its slots only), so a stalled shard does
/// not hide the others; the slots come from status.
async fn shard_writers(cluster: &RedisCluster, password: &str, tag: &str) -> Vec<(String, Writer)> {
    let mut writers = Vec::new();
    for n in cluster.status.as_ref().unwrap().nodes.iter().filter(|n| n.role.as_deref() == Some("master")) {
        let slots: BTreeSet<u16> = slots_in(&n.slots);
        let writer = Writer::start_within(node_ips(cluster), password, &format!("{tag}-{}", n.pod), Some(slots)).await;
        writers.push((n.pod.clone(), writer));
    }
    writers
}

/// Stops `node` and measures how long the longest shard went without an
/// accepted write; waits until every shard writes again.
async fn stop_and_measure(env: &Environment, node: &str, writers: &[(String, Writer)]) -> Duration {
    let stopped = Instant::now();
    env.stop_node(node).await.unwrap();
    wait_until(&format!("every shard accepts writes after {node} stopped"), Duration::from_secs(180), || async {
        let now = Instant::now();
        let writing = writers.iter().all(|(_, w)| {
            let accepted = w.record.lock().unwrap().accepted_at.last().copied();
            accepted.is_some_and(|at| at > stopped && now - at < Duration::from_millis(500))
        });
        (writing && stopped.elapsed() > Duration::from_secs(2)).then_some(())
    })
    .await;
    writers.iter().map(|(_, w)| w.accept_gap(stopped).0).max().unwrap()
}

async fn wait_node_ready(env: &Environment, node: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client().await.unwrap());
    wait_until(&format!("{node} Ready"), Duration::from_secs(60), || async {
        let n = nodes.get(node).await.ok()?;
        (slotkeeper_env::environment::node_ready(&n) == Some(true)).then_some(())
    })
    .await;
}

/// Until the replica at `ip` has its link to its master up.
async fn wait_linked(ip: &str, password: &str) {
    wait_until(&format!("the replica at {ip} in sync"), Duration::from_secs(60), || async {
        let url = format!("redis://:{password}@{ip}:6379/");
        let mut c = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut c).await.ok()?;
        info.contains("master_link_status:up").then_some(())
    })
    .await;
}

async fn redis_failover(ip: &str, password: &str) {
    let mut c = redis::Client::open(format!("redis://:{password}@{ip}:6379/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLUSTER").arg("FAILOVER").query_async(&mut c).await.unwrap();
}

#[tokio::test]
async fn masters_stay_apart_and_losing_any_node_costs_seconds() {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "placement").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &ns);
    let spec = "masters: 3, replicasPerMaster: 1, redis: {version: 7.0.15}, storage: {size: 1Gi}";
    let created = Instant::now();
    apply_cluster_spec(env, &ns, NAME, spec);
    let mut bounds = Vec::new();
    let (cluster, took) = wait_spread(&api, 3, created, "created").await;
    bounds.push(("created", took));
    let password = password(&kube, &ns, NAME).await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    let seeds = client.seed("seed", 5_000).await;
    let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
    let follower = follow_pods(&writer, pods.clone(), NAME);

    // Every Pod deleted at once.
    let deleted = Instant::now();
    let selector = ListParams::default().labels(&format!("slotkeeper.io/cluster={NAME}"));
    pods.delete_collection(&DeleteParams::default(), &selector).await.unwrap();
    wait_until("the Pods recreated", Duration::from_secs(60), || async {
        let c = api.get(NAME).await.ok()?;
        (c.status.as_ref()?.ready_masters < 3).then_some(())
    })
    .await;
    let (cluster, took) = wait_spread(&api, 3, deleted, "every Pod deleted").await;
    bounds.push(("every Pod deleted", took));
    client = ClusterClient::new(node_ips(&cluster), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "every Pod deleted").await;

    // A master crash-loops until Redis promotes its replica (a single crash
    // is restarted before cluster-node-timeout and keeps its role).
    let victim = master_pods(&cluster)[0].clone();
    // Redis elects only a replica that has synced: wait for the link.
    let victim_id = cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().node_id.clone();
    let replica = cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.master_id == victim_id).unwrap();
    wait_linked(replica.ip.as_deref().unwrap(), &password).await;
    let crashed = Instant::now();
    wait_until(&format!("Redis fails {victim} over"), Duration::from_secs(120), || async {
        let _ = env.crash_container(&ns, &victim, "redis").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let c = api.get(NAME).await.ok()?;
        let failed_over = !master_pods(&c).contains(&victim) && master_pods(&c).len() == 3;
        failed_over.then_some(())
    })
    .await;
    let (cluster, took) = wait_spread(&api, 3, crashed, "a master crash failed over").await;
    bounds.push(("a master crash failed over", took));
    client = ClusterClient::new(node_ips(&cluster), &password).await;
    assert_all_read_back(&mut client, &seeds, &writer, "a master crash").await;

    // Scale 3 → 4 → 3.
    for masters in [4, 3] {
        let scaled = Instant::now();
        let spec =
            format!("masters: {masters}, replicasPerMaster: 1, redis: {{version: 7.0.15}}, storage: {{size: 1Gi}}");
        apply_cluster_spec(env, &ns, NAME, &spec);
        let step = format!("scaled to {masters} masters");
        let (_, took) = wait_spread(&api, masters, scaled, &step).await;
        bounds.push((if masters == 4 { "scaled 3 → 4" } else { "scaled 4 → 3" }, took));
        client = ClusterClient::new(node_ips(&api.get(NAME).await.unwrap()), &password).await;
        assert_all_read_back(&mut client, &seeds, &writer, &step).await;
    }
    for (step, took) in &bounds {
        assert!(*took < SPREAD_BOUND + Duration::from_secs(300), "{step}: {took:?}");
    }

    // Each Node stopped in turn, and started again before the next.
    let timeout = Duration::from_millis(u64::from(CLUSTER_NODE_TIMEOUT_MS));
    let mut figures = Vec::new();
    for node in env.nodes().to_vec() {
        let cluster = wait_spread(&api, 3, Instant::now(), &format!("before stopping {node}")).await.0;
        for replica in cluster.status.as_ref().unwrap().nodes.iter().filter(|n| n.role.as_deref() == Some("replica")) {
            wait_linked(replica.ip.as_deref().unwrap(), &password).await;
        }
        let writers = shard_writers(&cluster, &password, &format!("stop-{node}")).await;
        let held = master_ids(&cluster).values().filter(|n| **n == node).count();
        let gap = stop_and_measure(env, &node, &writers).await;
        eprintln!(
            "{node} stopped (held {held} master): every shard accepted writes again after {:.1}s",
            gap.as_secs_f64()
        );
        figures.push((node.clone(), held, gap));
        // The Pods it held are replaced on the two Nodes left: with three
        // masters on two Nodes, the cluster says it is at risk.
        let at_risk = wait_until("Degraded/PlacementAtRisk on two Nodes", Duration::from_secs(240), || async {
            let c = api.get(NAME).await.ok()?;
            let degraded = condition(&c, "Degraded")?;
            (c.status.as_ref()?.nodes.len() == 6 && degraded.status == "True" && degraded.reason == "PlacementAtRisk")
                .then(|| degraded.message.clone())
        })
        .await;
        assert!(at_risk.contains("holds 2 of 3 masters") && at_risk.contains("at least 3 are needed"), "{at_risk}");
        env.start_node(&node).await.unwrap();
        wait_node_ready(env, &node).await;
        let back = Instant::now();
        let (cluster, took) = wait_spread(&api, 3, back, &format!("{node} back")).await;
        let on_it = cluster.status.as_ref().unwrap().nodes.iter().filter(|n| n.node.as_deref() == Some(&node)).count();
        assert_eq!(on_it, 2, "{node} holds its share of Pods again");
        assert_ne!(condition(&cluster, "Degraded").unwrap().reason, "PlacementAtRisk");
        eprintln!("{node} back: Pods and masters spread again after {:.1}s", took.as_secs_f64());
        client = ClusterClient::new(node_ips(&cluster), &password).await;
        for (pod, w) in &writers {
            assert_all_read_back(&mut client, &[], w, &format!("{node} stopped: shard of {pod}")).await;
        }
        for (_, w) in writers {
            w.stop().await;
        }
        assert_all_read_back(&mut client, &seeds, &writer, &format!("{node} stopped")).await;
    }
    for (node, _, gap) in &figures {
        assert!(*gap < timeout + Duration::from_secs(10), "{node}: writes back after {gap:?}");
    }

    // The bad placement: the cluster paused, every master moved onto one
    // Node (its other shards' replicas are recreated there first), the
    // Node stopped, the operator let go at once.
    eprintln!("bad placement: pausing (unix {:.3})", unix_now());
    let (ok, out) =
        kubectl(env, &["patch", "rdc", NAME, "-n", &ns, "--type=merge", "-p", r#"{"spec":{"paused":true}}"#], None);
    assert!(ok, "{out}");
    let crowded = env.nodes()[0].clone();
    let others: Vec<String> = env.nodes()[1..].to_vec();
    for other in &others {
        assert!(kubectl(env, &["cordon", other], None).0);
    }
    let cluster = api.get(NAME).await.unwrap();
    let nodes = &cluster.status.as_ref().unwrap().nodes;
    let shard_of = |pod: &str| pod.rsplit('-').nth(1).unwrap().to_owned();
    let on_crowded: BTreeSet<String> =
        nodes.iter().filter(|n| n.node.as_deref() == Some(&crowded)).map(|n| shard_of(&n.pod)).collect();
    for n in nodes.iter().filter(|n| n.role.as_deref() == Some("replica") && !on_crowded.contains(&shard_of(&n.pod))) {
        pods.delete(&n.pod, &DeleteParams::default()).await.unwrap();
    }
    let arranged = wait_until(&format!("a Pod of every shard on {crowded}"), Duration::from_secs(120), || async {
        let list = pods.list(&selector).await.ok()?;
        let ready: Vec<&Pod> = list.items.iter().filter(|p| pod_ready(p)).collect();
        let here: BTreeSet<String> = ready
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(crowded.as_str()))
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        let shards: BTreeSet<String> = here.iter().map(|p| shard_of(p)).collect();
        (ready.len() == 6 && shards.len() == 3).then_some(here)
    })
    .await;
    for other in &others {
        assert!(kubectl(env, &["uncordon", other], None).0);
    }
    for pod in &arranged {
        let ip = pod_ip(&pods.get(pod).await.unwrap());
        let info = wait_until(&format!("{pod} is a linked replica or a master"), Duration::from_secs(60), || async {
            let url = format!("redis://:{password}@{ip}:6379/");
            let mut c = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut c).await.ok()?;
            // As the operator does: promote only a replica whose data is on
            // its disk (Redis rewrites its append-only file after a full
            // sync; killed before that ends, it restarts from the old file).
            let disk: String = redis::cmd("INFO").arg("persistence").query_async(&mut c).await.ok()?;
            let on_disk = disk.contains("aof_rewrite_in_progress:0") && disk.contains("aof_rewrite_scheduled:0");
            (on_disk && (info.contains("master_link_status:up") || info.contains("role:master"))).then_some(info)
        })
        .await;
        if info.contains("role:slave") {
            redis_failover(&ip, &password).await;
        }
    }
    let all_on_one = wait_until(&format!("every master on {crowded}"), Duration::from_secs(60), || async {
        let mut on = 0;
        for pod in &arranged {
            let ip = pod_ip(&pods.get(pod).await.ok()?);
            let url = format!("redis://:{password}@{ip}:6379/");
            let mut c = redis::Client::open(url).ok()?.get_multiplexed_async_connection().await.ok()?;
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.ok()?;
            on += usize::from(matches!(role.first(), Some(redis::Value::BulkString(w)) if w.as_slice() == b"master"));
        }
        (on == 3).then_some(on)
    })
    .await;
    let ips: Vec<String> = pods.list(&selector).await.unwrap().items.iter().map(pod_ip).collect();
    writer.reseed(ips.clone());
    let bad = {
        // Slots per shard from the nodes themselves (status is frozen while paused).
        let mut writers = Vec::new();
        let slots_of = redis_slots(&ips[0], &password).await;
        for (master_ip, slots) in slots_of {
            let w = Writer::start_within(ips.clone(), &password, &format!("bad-{master_ip}"), Some(slots)).await;
            writers.push((master_ip, w));
        }
        eprintln!("bad placement: masters on {crowded}, stopping it (unix {:.3})", unix_now());
        let stopped = Instant::now();
        env.stop_node(&crowded).await.unwrap();
        let (ok, out) = kubectl(
            env,
            &["patch", "rdc", NAME, "-n", &ns, "--type=merge", "-p", r#"{"spec":{"paused":false}}"#],
            None,
        );
        assert!(ok, "{out}");
        wait_until("every shard accepts writes after the crowded Node stopped", Duration::from_secs(300), || async {
            let now = Instant::now();
            writers
                .iter()
                .all(|(_, w)| {
                    let accepted = w.record.lock().unwrap().accepted_at.last().copied();
                    accepted.is_some_and(|at| at > stopped && now - at < Duration::from_millis(500))
                })
                .then_some(())
        })
        .await;
        let gap = writers.iter().map(|(_, w)| w.accept_gap(stopped).0).max().unwrap();
        eprintln!("bad placement: writes back, starting {crowded} (unix {:.3})", unix_now());
        env.start_node(&crowded).await.unwrap();
        wait_node_ready(env, &crowded).await;
        let (cluster, _) = wait_spread(&api, 3, Instant::now(), "after the bad placement").await;
        client = ClusterClient::new(node_ips(&cluster), &password).await;
        for (ip, w) in writers {
            assert_all_read_back(&mut client, &[], &w, &format!("bad placement: shard of {ip}")).await;
            w.stop().await;
        }
        gap
    };
    eprintln!(
        "bad placement: {all_on_one} masters on {crowded}; every shard accepted writes again after {:.1}s",
        bad.as_secs_f64()
    );
    for (node, held, gap) in &figures {
        eprintln!(
            "figure: {node} stopped, held {held} master(s): writes back after {:.1}s (cluster-node-timeout {:.0}s); all masters on one Node: {:.1}s",
            gap.as_secs_f64(),
            timeout.as_secs_f64(),
            bad.as_secs_f64()
        );
    }
    assert_all_read_back(&mut client, &seeds, &writer, "the end").await;
    follower.abort();
    let record = writer.stop().await;
    eprintln!("writer: {} acknowledged, {} errors, all read back", record.acknowledged.len(), record.errors);
    let events =
        kubectl(env, &["get", "events", "-n", &ns, "--field-selector", "reason=MastersSpread", "-o", "name"], None).1;
    assert!(!events.trim().is_empty(), "spreading said so in events");
}

/// Each master's address and slots, from `CLUSTER SLOTS`.
async fn redis_slots(ip: &str, password: &str) -> BTreeMap<String, BTreeSet<u16>> {
    let mut c = redis::Client::open(format!("redis://:{password}@{ip}:6379/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ranges: Vec<(u16, u16, (String, u16))> = {
        let raw: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await.unwrap();
        raw.into_iter()
            .map(|entry| {
                let redis::Value::Array(parts) = entry else { panic!("CLUSTER SLOTS entry") };
                let start: u16 = redis::from_redis_value(parts[0].clone()).unwrap();
                let end: u16 = redis::from_redis_value(parts[1].clone()).unwrap();
                let redis::Value::Array(master) = &parts[2] else { panic!("CLUSTER SLOTS master") };
                let host: String = redis::from_redis_value(master[0].clone()).unwrap();
                let port: u16 = redis::from_redis_value(master[1].clone()).unwrap();
                (start, end, (host, port))
            })
            .collect()
    };
    let mut by_master: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for (start, end, (host, _)) in ranges {
        by_master.entry(host).or_default().extend(start..=end);
    }
    by_master
}
