//! The operator killed at any point of bootstrap and restarted converges to
//! one healthy cluster: no second cluster, no slot lost or assigned twice.

mod common;

use std::time::Duration;

use common::operator::*;
use common::*;
use kube::Api;
use slotkeeper_operator::api::{Phase, RedisCluster};
use slotkeeper_operator::failpoint;

#[tokio::test]
async fn crash_at_each_bootstrap_step_then_restart_converges() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    // 6.2 assigns slots in batches, so `mid-addslots` stops inside one shard's assignment.
    for (point, version) in
        [(failpoint::AFTER_MEET, "7.0.15"), (failpoint::MID_ADDSLOTS, "6.2.14"), (failpoint::MID_REPLICATE, "7.0.15")]
    {
        let ns = namespace(&client, &format!("crash-{point}")).await;
        let mut crashing = start_operator_with(env, "crash-test", &[(failpoint::ENV, point)]);
        apply_cluster_spec(
            env,
            &ns,
            "phoenix",
            &format!("masters: 3, replicasPerMaster: 1, redis: {{version: {version}}}"),
        );
        let exit = wait_until(&format!("the operator to crash at {point}"), Duration::from_secs(120), || {
            let status = crashing.process.exit_status();
            async move { status }
        })
        .await;
        eprintln!("{point}: operator exited with {exit}");
        assert!(exit.contains("SIGABRT") || exit.contains("signal: 6"), "{point}: the failpoint crashed it ({exit})");
        let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
        let phase = api.get("phoenix").await.unwrap().status.and_then(|s| s.phase);
        assert_ne!(phase, Some(Phase::Running), "crashed at {point} before the cluster was complete");
        drop(crashing);

        let _restarted = start_operator(env, "crash-test");
        let cluster = wait_running(&api, "phoenix", Duration::from_secs(120)).await;
        let status = cluster.status.unwrap();
        assert_eq!(status.slots_assigned, 16384, "{point}");
        let password = password(&client, &ns, "phoenix").await;
        for node in &status.nodes {
            let check = redis_cli_check(node.ip.as_deref().unwrap(), &password);
            assert!(check.contains("[OK] All 16384 slots covered."), "{point}: {check}");
            assert!(check.contains("[OK] All nodes agree about slots configuration."), "{point}: {check}");
            assert!(!check.contains("[WARNING]") && !check.contains("[ERR]"), "{point}: {check}");
            // One cluster: every node knows exactly the six nodes.
            let url = format!("redis://:{password}@{}:6379/", node.ip.as_deref().unwrap());
            let mut redis = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
            let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut redis).await.unwrap();
            assert!(info.contains("cluster_known_nodes:6\r\n"), "{point}: {} sees {info}", node.pod);
        }
    }
}
