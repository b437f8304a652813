//! Security review finding 11: the control plane unreachable (kube-apiserver
//! stopped with SIGSTOP for longer than the Lease) while slots move, in a
//! scale out and then a scale in, with a WAIT 1 writer running. The leader
//! cannot renew its Lease and stops acting; whichever replica leads next
//! finishes the move from what Redis shows, and the cluster converges with
//! every key and `--cluster check` clean. Its own binary: nothing else may
//! run while the apiserver is stopped.

mod common;

use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use kube::Api;
use slotkeeper_operator::api::RedisCluster;
use slotkeeper_operator::leader::LEASE_DURATION;

const SEED_KEYS: usize = 60_000;

#[tokio::test]
async fn the_control_plane_gone_mid_move_loses_the_lease_and_the_cluster_still_converges() {
    let env = shared_env();
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "lost-lease").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let _first = start_operator(env, "replica-a");
    let _second = start_operator(env, "replica-b");
    apply_cluster(env, &ns, "example", 3, 1);
    let cluster = wait_settled(&api, "example", 3, 6, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "example").await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    let seeds = client.seed("seed", SEED_KEYS).await;
    let writer = Writer::start(node_ips(&cluster), &password, "w").await;

    for (masters, nodes) in [(4, 8), (3, 6)] {
        apply_cluster(env, &ns, "example", masters, 1);
        wait_until(&format!("slots moving towards {masters} masters"), Duration::from_secs(180), || async {
            let step = api.get("example").await.ok()?.status?.step?;
            matches!(step.name.as_str(), "MoveSlots" | "RepairSlots").then_some(())
        })
        .await;
        // Longer than the Lease: no replica can renew or take it meanwhile.
        let unreachable = LEASE_DURATION + Duration::from_secs(5);
        env.control_plane().pause_apiserver(true);
        tokio::time::sleep(unreachable).await;
        env.control_plane().pause_apiserver(false);
        let cluster = wait_settled(&api, "example", masters, nodes, Duration::from_secs(300)).await;
        let check = redis_cli_check(&node_ips(&cluster)[0], &password);
        assert!(
            check.contains("[OK] All 16384 slots covered.") && !check.contains("[ERR]") && !check.contains("[WARNING]"),
            "{masters} masters, after {unreachable:?} without the control plane: {check}"
        );
        assert_all_read_back(&mut client, &seeds, &writer, &format!("{masters} masters, after the lost Lease")).await;
    }
    let record = writer.stop().await;
    assert!(record.acknowledged.len() > 100, "the writer wrote throughout: {}", record.acknowledged.len());
}
