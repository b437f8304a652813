//! Recovery figures, side by side in one run:
//! - the write gap (longest interval without an acknowledged write, each
//!   write acknowledged after `WAIT 1`) during a `RedisOperation` failover,
//!   beside a master that dies and stays down (its process stopped with
//!   SIGSTOP, as a dead host looks; a killed process is restarted at once by
//!   the node agent, like a kubelet, before Redis would notice) and Redis
//!   detecting it with the operator's cluster-node-timeout (5000 ms);
//! - the time from "every Pod deleted" to Running and Ready with every key
//!   read back, on persistent volumes.
//!
//! The cluster is 3 masters × 2 replicas, so a shard that lost its master
//! still has a replica to acknowledge `WAIT 1` once it has failed over.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench recovery`

#[path = "../tests/common/mod.rs"]
mod common;

use slotkeeper_api::API_VERSION;
use std::time::{Duration, Instant};

use common::operator::*;
use common::writer::{ClusterClient, Writer, lost_after_settling};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use slotkeeper_operator::api::{OperationPhase, RedisCluster, RedisOperation};

const ROUNDS: usize = 3;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let _operator = shared_operator(env);
        let kube = env.client().await.unwrap();
        let ns = namespace(&kube, "bench-recovery").await;
        let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
        let operations: Api<RedisOperation> = Api::namespaced(kube.clone(), &ns);
        apply_cluster_spec(env, &ns, "gap", "masters: 3, replicasPerMaster: 2, redis: {version: 7.0.15}, storage: {size: 1Gi}");
        let cluster = wait_settled(&clusters, "gap", 3, 9, Duration::from_secs(180)).await;
        let password = password(&kube, &ns, "gap").await;
        let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
        let seeds = client.seed("seed", 20_000).await;
        let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        let (mut coordinated, mut detected): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // A RedisOperation failover of shard 0: the longest interval
            // without an acknowledged write to shard 0's keys.
            let cluster = clusters.get("gap").await.unwrap();
            let master = master_pods(&cluster).into_iter().find(|p| p.starts_with("gap-shard-0")).unwrap();
            let slots = slots_in(&cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == master).unwrap().slots);
            let since = Instant::now();
            let name = format!("gap-{round}");
            let op = format!("apiVersion: {API_VERSION}\nkind: RedisOperation\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterName: gap, type: Failover, failover: {{shard: 0}}}}\n");
            let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&op));
            assert!(ok, "{out}");
            wait_until("failover succeeded", Duration::from_secs(60), || async {
                let o = operations.get(&name).await.ok()?;
                (o.status?.phase? == OperationPhase::Succeeded).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            coordinated.push(writer.gap_within(&slots, since).as_secs_f64() * 1000.0);
            wait_settled(&clusters, "gap", 3, 9, Duration::from_secs(60)).await;

            // Shard 1's master goes silent; Redis detects it and fails it over.
            let cluster = clusters.get("gap").await.unwrap();
            let victim = master_pods(&cluster).into_iter().find(|p| p.starts_with("gap-shard-1")).unwrap();
            let slots = slots_in(&cluster.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == victim).unwrap().slots);
            let since = Instant::now();
            env.freeze_pod(&ns, &victim).await.unwrap();
            wait_until("Redis failed the master over", Duration::from_secs(60), || async {
                let c = clusters.get("gap").await.ok()?;
                (!master_pods(&c).contains(&victim) && master_pods(&c).len() == 3).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            detected.push(writer.gap_within(&slots, since).as_secs_f64() * 1000.0);
            env.thaw_pod(&ns, &victim).await.unwrap();
            wait_settled(&clusters, "gap", 3, 9, Duration::from_secs(120)).await;
            eprintln!("round {round}: RedisOperation gap {:.0} ms, dead-master gap {:.0} ms", coordinated[round], detected[round]);
        }
        let record = writer.stop().await;

        // Every Pod deleted at once, until Running, Ready and every key read back.
        let pods: Api<Pod> = Api::namespaced(kube.clone(), &ns);
        let started = Instant::now();
        pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("slotkeeper.io/cluster=gap"))
            .await
            .unwrap();
        wait_until("the cluster leaves Running", Duration::from_secs(60), || async {
            let c = clusters.get("gap").await.ok()?;
            (c.status?.phase != Some(slotkeeper_operator::api::Phase::Running)).then_some(())
        })
        .await;
        let cluster = wait_settled(&clusters, "gap", 3, 9, Duration::from_secs(300)).await;
        let ready = started.elapsed().as_secs_f64();
        // Keys may be briefly unreadable (a node still loading its AOF): a
        // key counts as lost only if it is still missing 20 s later.
        let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
        let unread = lost_after_settling(&mut client, &seeds, &record.acknowledged).await;
        let with_data = started.elapsed().as_secs_f64();
        let lost = unread.len();
        if lost > 0 {
            eprintln!("still missing, e.g. {:?}", &unread[..lost.min(5)]);
        }

        println!("write gap, longest interval without an acknowledged write to the shard's keys (median of {ROUNDS}):");
        println!("  RedisOperation failover: {:.0} ms (rounds {coordinated:.0?})", median(coordinated.clone()));
        println!("  master dead, Redis detects (cluster-node-timeout 5000 ms): {:.0} ms (rounds {detected:.0?})", median(detected.clone()));
        println!("all Pods deleted → Running and Ready: {ready:.1}s; every key read back at {with_data:.1}s ({} keys checked, {lost} missing)", seeds.len() + record.acknowledged.len());
        assert_eq!(lost, 0, "keys lost after every Pod was deleted");
    });
}
