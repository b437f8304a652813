//! The operator's slot transfer (`redis::migrate`) against real servers of
//! every release it runs, without Kubernetes: keys and ownership move, the
//! target claims the batch with one broadcast instead of one per slot, and
//! every node agrees on the new owner with no slot left open.

mod common;

use std::time::Duration;

use common::wait_until;
use common::writer::{ClusterClient, assert_none_lost, slot_of};
use slotkeeper_env::agent::images::ImageTable;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_env::tools::repo_root;
use slotkeeper_operator::redis::client::{Login, Logins, REDIS_PORT, RedisNode};
use slotkeeper_operator::redis::migrate::{self, Pair, SlotTransfer};
use slotkeeper_operator::redis::topology::{ClusterNode, parse_cluster_nodes};

const PASSWORD: &str = "migrate-password";
const KEYS: usize = 3000;
/// Slots 0..MOVED, owned by the first master after `--cluster create`.
const MOVED: u16 = 1000;

/// redis-cli, given a minute: `--cluster create` waits forever for nodes
/// that cannot meet.
fn redis_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("timeout")
        .args(["60", "redis-cli", "-a", PASSWORD, "--no-auth-warning"])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn info_field(info: &str, field: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {info}"))
}

/// `ip`'s view of the cluster, parsed as the operator parses it.
fn view_from(ip: &str) -> Vec<ClusterNode> {
    let text = redis_cli(&["-h", ip, "cluster", "nodes"]);
    parse_cluster_nodes(&text).unwrap_or_else(|e| panic!("{ip}: {e}: {text}"))
}

/// The slot ranges node `id` serves in `view`.
fn ranges_of(view: &[ClusterNode], id: &str) -> Vec<(u16, u16)> {
    view.iter().filter(|n| n.id == id).flat_map(|n| n.slots.iter().map(|r| (r.start, r.end))).collect()
}

async fn moves_a_batch_on(image: &str) {
    let server = ImageTable::load(&repo_root().join("tests/env/images.json"), &repo_root())
        .and_then(|table| table.resolve(image))
        .unwrap_or_else(|e| panic!("{image}: {e}"))
        .binaries["redis-server"]
        .clone();
    // MIGRATE targets port 6379 as in a Pod: each server gets its own address.
    let (block, _block_lock) = slotkeeper_env::environment::lock_network_block().unwrap();
    let ips: Vec<String> = (1..=3).map(|i| format!("127.{block}.0.{i}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let _servers: Vec<ManagedProcess> = ips
        .iter()
        .map(|ip| {
            let data = dir.path().join(ip);
            std::fs::create_dir_all(&data).unwrap();
            let spec = ProcessSpec::new(format!("redis-{ip}"), &server, data.join("log"))
                .args(["--bind", ip, "--cluster-announce-ip", ip, "--port", &REDIS_PORT.to_string()])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-node-timeout", "5000", "--dir", data.to_str().unwrap(), "--appendonly", "yes"])
                .args(["--save", "", "--requirepass", PASSWORD, "--masterauth", PASSWORD]);
            ManagedProcess::spawn(spec).unwrap()
        })
        .collect();
    let addrs: Vec<String> = ips.iter().map(|ip| format!("{ip}:{REDIS_PORT}")).collect();
    for addr in &addrs {
        wait_until(&format!("{image}: {addr} up"), Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(addr.as_str()).await.ok().map(drop)
        })
        .await;
    }
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.push("--cluster-yes");
    redis_cli(&create);
    for ip in &ips {
        wait_until(&format!("{image}: {ip} sees cluster_state ok"), Duration::from_secs(30), || async {
            redis_cli(&["-h", ip, "cluster", "info"]).contains("cluster_state:ok").then_some(())
        })
        .await;
    }
    let mut client = ClusterClient::new(vec![addrs[0].clone()], PASSWORD).await;
    // Written one by one: `seed` waits for a replica, and there is none.
    let keys: Vec<String> = (0..KEYS).map(|i| format!("moved:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        client.set(key, &i.to_string()).await.unwrap_or_else(|e| panic!("{image}: SET {key}: {e}"));
    }
    let in_batch = keys.iter().filter(|k| slot_of(k) < MOVED).count();
    assert!(in_batch > 0, "{image}: some seeded keys fall in the batch");

    let mut nodes = Vec::new();
    // These nodes have only the `default` user.
    let login = Login { user: None, password: PASSWORD.into() };
    let logins = Logins { own: login.clone(), fallback: login };
    for ip in &ips {
        nodes.push(RedisNode::connect(ip, &logins).await.unwrap());
    }
    let ids: Vec<String> = ips.iter().map(|ip| redis_cli(&["-h", ip, "cluster", "myid"]).trim().to_owned()).collect();
    let source_ranges = ranges_of(&view_from(&ips[0]), &ids[0]);
    assert!(source_ranges.iter().any(|&(a, b)| a == 0 && b >= MOVED - 1), "{image}: the source serves the batch");
    let pongs = |ip: &str| info_field(&redis_cli(&["-h", ip, "cluster", "info"]), "cluster_stats_messages_pong_sent");
    let pongs_before = pongs(&ips[1]);

    let (first, rest) = nodes.split_at_mut(1);
    let slots: Vec<SlotTransfer> = (0..MOVED)
        .map(|slot| SlotTransfer { slot, open_target: true, open_source: true, target_owns: false })
        .collect();
    let pair = Pair {
        source: &mut first[0],
        source_id: &ids[0],
        target: &mut rest[0],
        target_id: &ids[1],
        target_ip: &ips[1],
    };
    let moved = migrate::transfer(pair, &slots, &|| {}).await.unwrap();
    assert_eq!((moved.slots, moved.keys), (MOVED as usize, in_batch), "{image}: slots and keys moved");

    // One broadcast for the claim (2 messages here) plus ordinary gossip;
    // a claim per importing slot sends 2 per slot on 6.2 and 7.0.
    let sent = pongs(&ips[1]) - pongs_before;
    assert!(sent < 100, "{image}: the target sent {sent} PONGs while claiming {MOVED} slots");
    let range = format!("0-{}", MOVED - 1);
    for ip in &ips {
        wait_until(&format!("{image}: {ip} sees the target own {range}"), Duration::from_secs(10), || async {
            let view = view_from(ip);
            let open = view.iter().any(|n| !n.open_slots.is_empty());
            (!open && ranges_of(&view, &ids[1]).contains(&(0, MOVED - 1))).then_some(())
        })
        .await;
    }
    let check = redis_cli(&["--cluster", "check", &addrs[0]]);
    assert!(check.contains("[OK] All 16384 slots covered"), "{image}: {check}");
    assert!(check.contains("[OK] All nodes agree about slots configuration."), "{image}: {check}");
    assert!(!check.contains("[WARNING]") && !check.contains("[ERR]"), "{image}: {check}");
    let mut counting = redis::pipe();
    for slot in 0..MOVED {
        counting.cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot);
    }
    let counts = nodes[1].pipeline("CLUSTER COUNTKEYSINSLOT", &counting, Duration::from_secs(10)).await.unwrap();
    let on_target: u64 = counts.into_iter().map(|n| redis::from_redis_value::<u64>(n).unwrap()).sum();
    assert_eq!(on_target as usize, in_batch, "{image}: the moved keys are on the target");
    client.refresh().await;
    assert_none_lost(&mut client, &keys, 0, image).await;
}

#[tokio::test]
async fn a_batch_moves_keys_and_ownership_on_redis_6_2() {
    moves_a_batch_on("redis:6.2.14").await;
}

#[tokio::test]
async fn a_batch_moves_keys_and_ownership_on_redis_7_0() {
    moves_a_batch_on("redis:7.0.15").await;
}

#[tokio::test]
async fn a_batch_moves_keys_and_ownership_on_valkey_8_1() {
    moves_a_batch_on("valkey/valkey:8.1.8").await;
}
