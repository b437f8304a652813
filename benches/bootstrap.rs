//! Bootstrap benchmark: time from `kubectl apply` of a 3×1 RedisCluster to
//! `Ready`, beside the floor measured in the same run: six redis-server
//! processes started by hand and joined with
//! `redis-cli --cluster create --cluster-replicas 1`, until every node reports
//! `cluster_state:ok`. Both include starting the processes.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench bootstrap`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::operator::*;
use common::*;
use kube::Api;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_operator::api::RedisCluster;

const ROUNDS: usize = 3;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn cluster_ok(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else { return false };
    let Ok(mut c) = client.get_multiplexed_async_connection().await else { return false };
    let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut c).await.unwrap_or_default();
    info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
}

/// The floor: fresh processes, `redis-cli --cluster create`, all nodes ok.
async fn floor_once(round: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_cluster_ports(6);
    let started = Instant::now();
    let _processes: Vec<ManagedProcess> = ports
        .iter()
        .map(|port| {
            let spec = ProcessSpec::new(
                format!("floor-{round}-{port}"),
                "/usr/bin/redis-server",
                dir.path().join(format!("{port}.log")),
            )
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf"), "--cluster-node-timeout", "5000"])
            .args(["--dir", dir.path().to_str().unwrap(), "--save", "", "--appendonly", "yes"])
            .args(["--appenddirname", &format!("aof-{port}")]);
            ManagedProcess::spawn(spec).unwrap()
        })
        .collect();
    for (port, process) in ports.iter().zip(&_processes) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", *port)).await.is_err() {
            assert!(Instant::now() < deadline, "redis-server on {port} did not start: {}", process.log_tail(10));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    for port in &ports {
        wait_until("floor cluster ok", Duration::from_secs(30), || async { cluster_ok(*port).await.then_some(()) })
            .await;
    }
    started.elapsed().as_secs_f64()
}

async fn slotkeeper_once(env: &'static slotkeeper_env::Environment, round: usize) -> f64 {
    let client = env.client().await.unwrap();
    let ns = namespace(&client, &format!("bench-bootstrap-{round}")).await;
    let started = Instant::now();
    apply_cluster(env, &ns, "bench", 3, 1);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_running(&api, "bench", Duration::from_secs(180)).await;
    let took = started.elapsed().as_secs_f64();
    // Free the CPU for the next round.
    kubectl(env, &["delete", "namespace", &ns, "--wait=true", "--timeout=60s"], None);
    took
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let _operator = shared_operator(env);
        let mut floor = Vec::new();
        let mut ours = Vec::new();
        for round in 0..ROUNDS {
            floor.push(floor_once(round).await);
            ours.push(slotkeeper_once(env, round).await);
            println!("round {round}: redis-cli --cluster create {:.2}s, slotkeeper {:.2}s", floor[round], ours[round]);
        }
        let (f, s) = (median(floor), median(ours));
        println!(
            "bootstrap 3x1 (median of {ROUNDS}): floor {f:.2}s, slotkeeper {s:.2}s, ratio {:.2}x (target <= 1.5x)",
            s / f
        );
    });
}
