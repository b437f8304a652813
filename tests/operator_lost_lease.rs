//! Security review finding 11: the control plane unreachable (kube-apiserver
//! stopped with SIGSTOP for longer than the Lease) at several points of a
//! scale out and of a scale in (before the first slot moves, early in the
//! move, late in it), with a WAIT 1 writer running. The leader
//! cannot renew its Lease and stops acting; whichever replica leads next
//! finishes the move from what Redis shows, and the cluster converges with
//! every key and `--cluster check` clean. Its own binary: nothing else may
//! run while the apiserver is stopped.

mod common;

use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use futures::StreamExt as _;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use slotkeeper_operator::api::{RedisCluster, RedisClusterStatus};
use slotkeeper_operator::leader::LEASE_DURATION;

const SEED_KEYS: usize = 60_000;

/// Where in a scale the control plane goes away.
#[derive(Clone, Copy, Debug)]
enum Point {
    /// New nodes started and joined, no slot moved yet.
    NoSlotMovedYet,
    /// Slots moving, less than half of them moved.
    LessThanHalfMoved,
    /// Slots moving, half or more moved.
    HalfOrMoreMoved,
}

impl Point {
    fn reached(self, status: &RedisClusterStatus) -> bool {
        let step = status.step.as_ref().map(|s| s.name.as_str()).unwrap_or_default();
        let moved = status.reshard.as_ref().map(|r| (r.slots_moved, r.slots_total));
        let moving = step == "MoveSlots";
        match self {
            Self::NoSlotMovedYet => matches!(step, "Wait" | "Meet" | "AttachReplica" | "PlanBalance"),
            Self::LessThanHalfMoved => moving && moved.is_some_and(|(m, total)| m * 2 < total),
            Self::HalfOrMoreMoved => moving && moved.is_some_and(|(m, total)| m * 2 >= total && m < total),
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
        (4, 8, Point::NoSlotMovedYet),
        (3, 6, Point::LessThanHalfMoved),
        (4, 8, Point::HalfOrMoreMoved),
        (3, 6, Point::HalfOrMoreMoved),
    ] {
        // Watched, not polled: a batch may be open for less than a poll's interval.
        let config = watcher::Config::default().fields("metadata.name=example");
        let mut statuses = std::pin::pin!(watcher(api.clone(), config).default_backoff().applied_objects());
        apply_cluster(env, &ns, "example", masters, 1);
        let reached = async {
            while let Some(Ok(cluster)) = statuses.next().await {
                let Some(status) = cluster.status.as_ref() else { continue };
                if status.observed_generation == cluster.metadata.generation && point.reached(status) {
                    return;
                }
            }
        };
        let what = format!("{point:?} towards {masters} masters");
        tokio::time::timeout(Duration::from_secs(180), reached).await.unwrap_or_else(|_| panic!("no {what}"));
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
