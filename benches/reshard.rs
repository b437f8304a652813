//! Resharding throughput, Slotkeeper beside `redis-cli --cluster rebalance`
//! in the same run, for the same data (100,000 small keys) and the same
//! movement (3 masters → 5: the two new masters receive 6,553 slots).
//!
//! Slotkeeper: from the first slot batch (status.reshard.startedTime) until
//! the status saying the reshard is done (no reshard, 5 balanced masters)
//! arrives through a watch.
//! redis-cli: the `rebalance --cluster-use-empty-masters` command alone, on a
//! cluster of plain processes already created and joined. Neither figure
//! includes starting processes or Pods.
//!
//! Write pauses: during each reshard one writer per original shard writes
//! keys of that shard's slots only (a SET every 2 ms, no WAIT as there are no
//! replicas, following MOVED and ASK as a cluster client does); the longest
//! interval without an accepted write is that shard's pause.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench reshard`

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::operator::*;
use common::writer::{ClusterClient, Writer};
use common::*;
use kube::Api;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_operator::api::RedisCluster;

const KEYS: usize = 100_000;
const PASSWORD: &str = "bench-password";

struct Figures {
    seconds: f64,
    keys: u64,
    bytes: u64,
    /// The longest pause without an accepted write, per original shard.
    pauses: Vec<Duration>,
}

impl Figures {
    fn show(&self, who: &str) -> String {
        let pauses: Vec<String> = self.pauses.iter().map(|p| format!("{}", p.as_millis())).collect();
        format!(
            "{who}: {:.2}s, {} keys moved, {:.0} keys/s, {:.2} MB/s; longest write pause per shard {} ms",
            self.seconds,
            self.keys,
            self.keys as f64 / self.seconds,
            self.bytes as f64 / self.seconds / 1e6,
            pauses.join(" / ")
        )
    }
}

/// The slots each master owns, in `CLUSTER NODES` order of their first slot.
async fn slots_by_master(addr: &str, password: &str) -> Vec<BTreeSet<u16>> {
    let client = redis::Client::open(format!("redis://:{password}@{addr}/")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut c).await.unwrap();
    let mut owned: Vec<BTreeSet<u16>> = nodes
        .lines()
        .map(|line| {
            let ranges = line.split(' ').skip(8).filter(|r| !r.starts_with('['));
            ranges
                .flat_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    a.parse::<u16>().unwrap()..=b.parse::<u16>().unwrap()
                })
                .collect::<BTreeSet<u16>>()
        })
        .filter(|slots| !slots.is_empty())
        .collect();
    owned.sort_by_key(|s| s.first().copied());
    owned
}

/// One writer per master now, each writing only keys of that master's slots.
async fn shard_writers(seeds: Vec<String>, password: &str) -> Vec<Writer> {
    let mut writers = Vec::new();
    for (shard, slots) in slots_by_master(&seeds[0], password).await.into_iter().enumerate() {
        writers.push(
            Writer::start_unreplicated_within(seeds.clone(), password, &format!("pause{shard}"), Some(slots)).await,
        );
    }
    // Each has written before the reshard starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    writers
}

async fn pauses(writers: Vec<Writer>, since: Instant) -> Vec<Duration> {
    let mut gaps = Vec::new();
    for (shard, writer) in writers.iter().enumerate() {
        let (gap, began) = writer.longest_accept_gap(since);
        gaps.push(gap);
        // Wall-clock, to be read beside the operator's log.
        let wall = std::time::SystemTime::now() - began.elapsed();
        let at = k8s_openapi::jiff::Timestamp::try_from(wall).map(|t| t.to_string()).unwrap_or_default();
        println!("    shard {shard}: longest pause {} ms from {at}", gap.as_millis());
        let record = writer.record.lock().unwrap();
        let during = record.error_log.iter().filter(|(t, _)| *t >= began && *t <= began + gap);
        for (t, error) in during.take(5) {
            println!("      +{} ms: {error}", (*t - began).as_millis());
        }
    }
    for writer in writers {
        writer.stop().await;
    }
    gaps
}

/// Keys (and their key+value bytes) held by the masters at `addresses`.
async fn held_by(addresses: &[String], password: &str) -> (u64, u64) {
    let mut keys = 0;
    for addr in addresses {
        let client = redis::Client::open(format!("redis://:{password}@{addr}/")).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let n: u64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
        keys += n;
    }
    // Every key is `seed:<i>` holding `<i>`: about 11 + 5 bytes.
    (keys, keys * 16)
}

fn redis_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-a", PASSWORD, "--no-auth-warning"])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn peer() -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_cluster_ports(5);
    let _processes: Vec<ManagedProcess> = ports
        .iter()
        .map(|port| {
            let spec = ProcessSpec::new(
                format!("peer-{port}"),
                "/usr/bin/redis-server",
                dir.path().join(format!("{port}.log")),
            )
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf"), "--cluster-node-timeout", "5000"])
            .args(["--dir", dir.path().to_str().unwrap(), "--save", "", "--appendonly", "yes"])
            .args([
                "--appenddirname",
                &format!("aof-{port}"),
                "--requirepass",
                PASSWORD,
                "--masterauth",
                PASSWORD,
            ]);
            ManagedProcess::spawn(spec).unwrap()
        })
        .collect();
    for port in &ports {
        wait_until("peer redis-server up", Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", *port)).await.ok().map(drop)
        })
        .await;
    }
    let addr = |p: &u16| format!("127.0.0.1:{p}");
    let first: Vec<String> = ports[..3].iter().map(addr).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(first.iter().map(String::as_str));
    create.push("--cluster-yes");
    redis_cli(&create);
    wait_until("peer cluster ok", Duration::from_secs(30), || async {
        let info = redis_cli(&["-p", &ports[0].to_string(), "cluster", "info"]);
        info.contains("cluster_state:ok").then_some(())
    })
    .await;
    let mut client = ClusterClient::new(vec![first[0].clone()], PASSWORD).await;
    client.seed("seed", KEYS).await;
    for port in &ports[3..] {
        redis_cli(&["--cluster", "add-node", &addr(port), &first[0]]);
    }
    wait_until("new masters known everywhere", Duration::from_secs(30), || async {
        let nodes = redis_cli(&["-p", &ports[0].to_string(), "cluster", "nodes"]);
        (nodes.lines().filter(|l| l.contains("master") && !l.contains("handshake")).count() == 5).then_some(())
    })
    .await;
    // Every node, the new ones too, must see the whole slot map first.
    for port in &ports {
        wait_until("every peer node reports cluster_state ok", Duration::from_secs(60), || async {
            let info = redis_cli(&["-p", &port.to_string(), "cluster", "info"]);
            info.contains("cluster_state:ok").then_some(())
        })
        .await;
    }
    let writers = shard_writers(first.clone(), PASSWORD).await;
    let started = Instant::now();
    redis_cli(&["--cluster", "rebalance", &first[0], "--cluster-use-empty-masters"]);
    let seconds = started.elapsed().as_secs_f64();
    let pauses = pauses(writers, started).await;
    let (keys, bytes) = held_by(&ports[3..].iter().map(addr).collect::<Vec<_>>(), PASSWORD).await;
    Figures { seconds, keys, bytes, pauses }
}

async fn slotkeeper() -> Figures {
    let env = shared_env();
    let _operator = shared_operator(env);
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "bench-reshard").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    apply_cluster(env, &ns, "wide", 3, 0);
    let cluster = wait_settled(&api, "wide", 3, 3, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "wide").await;
    let ips: Vec<String> = cluster.status.unwrap().nodes.iter().filter_map(|n| n.ip.clone()).collect();
    let seeds: Vec<String> = ips.iter().map(|ip| format!("{ip}:6379")).collect();
    let mut client = ClusterClient::new(ips, &password).await;
    client.seed("seed", KEYS).await;
    let writers = shard_writers(seeds, &password).await;
    let scaled = Instant::now();
    apply_cluster(env, &ns, "wide", 5, 0);
    // Watched, not polled: the end is when the status saying so arrives (a
    // poll would add up to its interval to the figure).
    let mut started = None;
    let params = kube::runtime::watcher::Config::default().fields("metadata.name=wide");
    let mut updates =
        std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(kube::runtime::watcher(api.clone(), params)));
    let done = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(Ok(c)) = futures::StreamExt::next(&mut updates).await {
            let Some(status) = c.status.as_ref() else { continue };
            if let Some(t) = status.reshard.as_ref().and_then(|r| r.started_time.clone()) {
                started = Some(t.0);
            }
            let settled = status.ready_masters == 5 && status.reshard.is_none() && status.nodes.len() == 5;
            if settled && started.is_some() {
                return k8s_openapi::jiff::Timestamp::now();
            }
        }
        panic!("the watch on RedisCluster wide ended");
    })
    .await
    .expect("reshard done within 300 s");
    let started = started.expect("a reshard was seen");
    let seconds = done.duration_since(started).as_secs_f64();
    let cluster = api.get("wide").await.unwrap();
    let new_masters: Vec<String> = cluster
        .status
        .unwrap()
        .nodes
        .iter()
        .filter(|n| n.pod.starts_with("wide-shard-3") || n.pod.starts_with("wide-shard-4"))
        .filter_map(|n| Some(format!("{}:6379", n.ip.clone()?)))
        .collect();
    let (keys, bytes) = held_by(&new_masters, &password).await;
    let pauses = pauses(writers, scaled).await;
    Figures { seconds, keys, bytes, pauses }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        println!("reshard 3→5 masters with {KEYS} keys (6553 slots move):");
        let ours = slotkeeper().await;
        println!("  {}", ours.show("slotkeeper"));
        let theirs = peer().await;
        println!("  {}", theirs.show("redis-cli --cluster rebalance"));
        println!(
            "  speed-up: {:.1}x keys/s (target >= 10x); write pauses: target < 200 ms per shard",
            (ours.keys as f64 / ours.seconds) / (theirs.keys as f64 / theirs.seconds)
        );
    });
}
