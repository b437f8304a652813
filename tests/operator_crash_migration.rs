//! The operator killed in the middle of a slot migration (keys moved,
//! ownership not yet handed over) and restarted: the open slots are finished
//! first and the scale-out completes with every key. Its own binary: no
//! other operator may hold the Lease while the crashing one runs.

mod common;

use std::time::Duration;

use common::operator::*;
use common::writer::{ClusterClient, assert_none_lost};
use common::*;
use kube::Api;
use slotkeeper_operator::api::RedisCluster;
use slotkeeper_operator::failpoint;

const SEED_KEYS: usize = 100_000;

#[tokio::test]
async fn operator_killed_mid_migration_resumes_and_repairs_open_slots() {
    let env = shared_env();
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "day2-crash").await;
    let api: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    let mut crashing = start_operator_with(env, "migration-crash", &[(failpoint::ENV, failpoint::MID_MIGRATION)]);
    apply_cluster(env, &ns, "phoenix", 3, 1);
    let cluster = wait_settled(&api, "phoenix", 3, 6, Duration::from_secs(180)).await;
    let password = password(&kube, &ns, "phoenix").await;
    let mut client = ClusterClient::new(node_ips(&cluster), &password).await;
    let seeds = client.seed("seed", SEED_KEYS).await;

    apply_cluster(env, &ns, "phoenix", 4, 1);
    let exit = wait_until("the operator to crash mid-migration", Duration::from_secs(180), || {
        let status = crashing.process.exit_status();
        async move { status }
    })
    .await;
    assert!(exit.contains("SIGABRT") || exit.contains("signal: 6"), "the failpoint crashed it ({exit})");
    // Keys moved, ownership not yet handed over: slots are left open.
    let check = redis_cli_check(&node_ips(&cluster)[0], &password);
    assert!(check.contains("The following slots are open"), "the crash left slots open: {check}");
    drop(crashing);

    let _restarted = start_operator(env, "migration-crash");
    let cluster = wait_settled(&api, "phoenix", 4, 8, Duration::from_secs(300)).await;
    let check = redis_cli_check(&node_ips(&cluster)[0], &password);
    assert!(
        check.contains("[OK] All 16384 slots covered.") && !check.contains("[ERR]") && !check.contains("[WARNING]"),
        "{check}"
    );
    assert_none_lost(&mut client, &seeds, 0, "after the interrupted migration").await;
    let events = kubectl(env, &["get", "events", "-n", &ns, "-o", "custom-columns=REASON:.reason"], None).1;
    assert!(events.contains("SlotsRepaired"), "the open slots were finished first: {events}");
}
