//! Security review finding 11: the control plane unreachable (kube-apiserver
//! stopped with SIGSTOP for longer than the Lease) at several points of a
//! scale out and of a scale in (before the first slot moves, with the first
//! batch open, with a later batch open), with a WAIT 1 writer running. The leader
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
use slotkeeper_operator::api::{RedisCluster, RedisClusterStatus};
use slotkeeper_operator::leader::LEASE_DURATION;

const SEED_KEYS: usize = 60_000;

/// Where in a scale the control plane goes away.
#[derive(Clone, Copy, Debug)]
enum Point {
    /// New nodes started and joined, no slot moved yet.
    BeforeTheFirstMove,
    /// The first batch of slots in flight (slots open on both ends).
    FirstBatch,
    /// A later batch in flight, the first ones done.
    AfterTheFirstBatch,
}

impl Point {
    fn reached(self, status: &RedisClusterStatus) -> bool {
        let step = status.step.as_ref().map(|s| s.name.as_str()).unwrap_or_default();
        let moved = status.reshard.as_ref().map(|r| r.slots_moved);
        match self {
            Self::BeforeTheFirstMove => matches!(step, "Wait" | "Meet" | "AttachReplica" | "PlanBalance"),
            Self::FirstBatch => step == "MoveSlots" && moved == Some(0),
            Self::AfterTheFirstBatch => step == "MoveSlots" && moved.is_some_and(|m| m > 0),
        }
    }
}

#[tokio::test]
async fn the_control_plane_gone_at_several_points_of_a_scale_loses_the_lease_and_the_cluster_still_converges() {
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

    for (masters, nodes, point) in [
        (4, 8, Point::BeforeTheFirstMove),
        (3, 6, Point::FirstBatch),
        (4, 8, Point::AfterTheFirstBatch),
        (3, 6, Point::AfterTheFirstBatch),
    ] {
        apply_cluster(env, &ns, "example", masters, 1);
        wait_until(&format!("{point:?} towards {masters} masters"), Duration::from_secs(180), || async {
            let cluster = api.get("example").await.ok()?;
            let current = cluster.status.as_ref()?.observed_generation == cluster.metadata.generation;
            (current && point.reached(cluster.status.as_ref()?)).then_some(())
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
            "{masters} masters, {point:?}, after {unreachable:?} without the control plane: {check}"
        );
        let when = format!("{masters} masters, {point:?}, after the lost Lease");
        assert_all_read_back(&mut client, &seeds, &writer, &when).await;
    }
    let record = writer.stop().await;
    assert!(record.acknowledged.len() > 100, "the writer wrote throughout: {}", record.acknowledged.len());
}
