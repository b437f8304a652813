//! Two replicas, one acts: the Lease holder reconciles, and killing it hands
//! over to the other within the lease duration.

mod common;

use std::time::{Duration, Instant};

use common::operator::*;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use slotkeeper_operator::api::RedisCluster;
use slotkeeper_operator::leader::{LEASE_DURATION, LEASE_NAME, RENEW_PERIOD};

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt(LEASE_NAME).await.ok().flatten()?.spec?.holder_identity
}

#[tokio::test]
async fn only_the_leader_acts_and_killing_it_hands_over() {
    let env = shared_env();
    let first = start_operator(env, "replica-a");
    let client = env.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "slotkeeper-system");
    wait_until("replica-a leads", Duration::from_secs(30), || async {
        (holder(&leases).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let mut second = start_operator(env, "replica-b");
    let ns = namespace(&client, "leader").await;
    apply_cluster_spec(env, &ns, "before", "masters: 3, redis: {version: 7.0.15}");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_running(&api, "before", Duration::from_secs(120)).await;
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-a"), "the standby did not take the lease");
    // The standby serves /readyz and did no work: no reconcile counted.
    let standby_metrics = second.metrics().await;
    assert!(!standby_metrics.contains("controller_runtime_reconcile_total{"), "standby reconciled:\n{standby_metrics}");

    let mut first = first;
    let killed = Instant::now();
    first.process.stop(Duration::ZERO); // SIGKILL after no grace: a crash
    let took = wait_until("replica-b takes the lease", LEASE_DURATION + RENEW_PERIOD * 2, || async {
        (holder(&leases).await.as_deref() == Some("replica-b")).then(|| killed.elapsed())
    })
    .await;
    eprintln!("leadership handed over {:.1}s after the leader was killed", took.as_secs_f64());
    assert!(took <= LEASE_DURATION + RENEW_PERIOD, "hand-over took {took:?}");
    apply_cluster_spec(env, &ns, "after", "masters: 3, redis: {version: 7.0.15}");
    wait_running(&api, "after", Duration::from_secs(120)).await;
    assert!(second.process.exit_status().is_none(), "the new leader keeps running");
}
