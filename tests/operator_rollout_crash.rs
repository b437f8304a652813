//! The operator killed in the middle of a rollout (after a replica was
//! recreated, right after a failover, mid-way through the second shard) and
//! restarted finishes it: every Pod recreated exactly once, one failover
//! per shard, every seeded and acknowledged key read back.

mod common;

use std::time::Duration;

use common::operator::*;
use common::rollout::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use slotkeeper_operator::failpoint;

#[tokio::test]
async fn a_rollout_resumes_after_the_operator_crashes_at_any_step() {
    let env = shared_env();
    let kube = env.client().await.unwrap();
    let after_recreate_mid_shard = format!("{}:3", failpoint::AFTER_RECREATE);
    for point in [failpoint::AFTER_RECREATE, failpoint::AFTER_FAILOVER, after_recreate_mid_shard.as_str()] {
        let base = "masters: 3, replicasPerMaster: 1, rollout: {canaryBakeSeconds: 0}";
        let setup = start_operator(env, "rollout-crash");
        let namespace = format!("roll-crash-{}", point.replace(':', "-"));
        let spec = format!("{base}, redis: {{version: 6.2.14}}");
        let Seeded { ns, clusters, pods, cluster, password, seeds } =
            seeded_cluster(env, &kube, &namespace, "phoenix", &spec, 6, 20_000).await;
        drop(setup);
        let writer = Writer::start(node_ips(&cluster), &password, "ack").await;
        let follower = follow_pods(&writer, pods.clone(), "phoenix");
        let poller = Poller::start(pods.clone(), "phoenix", &password, 3).await;

        let mut crashing = start_operator_with(env, "rollout-crash", &[(failpoint::ENV, point)]);
        apply_cluster_spec(env, &ns, "phoenix", &format!("{base}, redis: {{version: 7.0.15}}"));
        let exit = wait_until(&format!("the operator to crash at {point}"), Duration::from_secs(240), || {
            let status = crashing.process.exit_status();
            async move { status }
        })
        .await;
        assert!(exit.contains("SIGABRT") || exit.contains("signal: 6"), "{point}: the failpoint crashed it ({exit})");
        drop(crashing);

        let _restarted = start_operator(env, "rollout-crash");
        let done = wait_rolled_out(&clusters, "phoenix", "redis", "7.0.15").await;
        let (samples, gaps, made) = poller.stop().await;
        assert!(gaps.is_empty(), "{point}: a shard without a reachable master: {:?}", &gaps[..gaps.len().min(10)]);
        let moved: Vec<String> = event_messages(&kube, &ns, "PodMoved").await;
        assert_recreated_once(&made, "phoenix", &moved);
        // One failover per shard: the replica that went first is the master,
        // unless spreading masters over the Nodes moved it back afterwards
        // (which it says in an event).
        let before = master_pods(&cluster);
        let settled = wait_settled(&clusters, "phoenix", 3, 6, Duration::from_secs(120)).await;
        let spread: Vec<String> = event_messages(&kube, &ns, "MastersSpread").await;
        for shard in 0..3 {
            let of_shard =
                |pods: &[String]| pods.iter().find(|p| p.starts_with(&format!("phoenix-shard-{shard}-"))).cloned();
            let (was, is) = (of_shard(&before), of_shard(&master_pods(&settled)));
            assert!(
                was != is || spread.iter().any(|m| m.starts_with(&format!("shard {shard}:"))),
                "{point}: shard {shard} master {was:?} before the rollout and {is:?} after; spread events {spread:?}"
            );
        }
        assert_every_node_runs(&done, &password, "redis", "7.0.15").await;
        follower.abort();
        let mut client = ClusterClient::new(node_ips(&done), &password).await;
        assert_all_read_back(&mut client, &seeds, &writer, &format!("crash at {point}")).await;
        let record = writer.stop().await;
        eprintln!("{point}: {samples} samples, {} acknowledged writes, all read back", record.acknowledged.len());
    }
}
