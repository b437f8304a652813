//! Slotkeeper upgrades itself from the previous release (this repository at
//! the commit upgrade/PREVIOUS_RELEASE names, run as Pods from that commit's
//! deploy/) by `slotkeeper upgrade apply` and approval: three clusters (one
//! with a WAIT 1 writer and 100,000 seeded keys, one paused, one with a
//! finished RedisOperation) keep every Redis Pod and role, both API versions
//! read at every step, the upgrade manager killed at each step resumes at
//! its checkpoint, and afterwards etcd holds every object as v1.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::release::*;
use common::upgrade::*;
use common::writer::{ClusterClient, Writer, assert_all_read_back};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use slotkeeper_api::v1alpha1;

const CLUSTERS: [(&str, &str); 3] = [("up-busy", "busy"), ("up-idle", "idle"), ("up-ops", "ops")];

fn apply_old(env: &slotkeeper_env::Environment, yaml: &str) {
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(yaml));
    assert!(ok, "{out}\n{yaml}");
}

/// Every RedisCluster listed at `version` (all namespaces): the names, or why not.
fn listed_at(env: &slotkeeper_env::Environment, version: &str) -> Result<BTreeSet<String>, String> {
    let list = raw(env, &format!("/apis/slotkeeper.io/{version}/redisclusters"))?;
    let items = list["items"].as_array().ok_or("no items")?;
    let wanted = format!("slotkeeper.io/{version}");
    if let Some(other) = items.iter().find(|i| i["apiVersion"] != wanted.as_str()) {
        return Err(format!("an item at {}", other["apiVersion"]));
    }
    Ok(items.iter().filter_map(|i| i["metadata"]["name"].as_str().map(String::from)).collect())
}

/// The clusters `kubectl get <resource> -A` lists, as a user types it; with
/// `version`, every item must be at it. kubectl honors the version of
/// `redisclusters.<version>.<group>`, but drops it from the short name's
/// `rdc.<version>.<group>` and reads at the preferred version of its
/// discovery cache: those are checked for answering with every cluster.
fn listed_by_kubectl(
    env: &slotkeeper_env::Environment,
    resource: &str,
    version: Option<&str>,
) -> Result<BTreeSet<String>, String> {
    let columns = r#"jsonpath={range .items[*]}{.apiVersion} {.metadata.name}{"\n"}{end}"#;
    let (ok, out) = kubectl(env, &["get", resource, "-A", "-o", columns], None);
    if !ok {
        return Err(out);
    }
    let wanted = version.map(|v| format!("{}/{v}", slotkeeper_api::GROUP));
    let mut names = BTreeSet::new();
    for line in out.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("Warning:")) {
        match line.split_once(' ') {
            Some((api_version, name)) if wanted.as_ref().is_none_or(|w| w == api_version) => {
                names.insert(name.to_string())
            }
            _ => return Err(format!("kubectl get {resource}: {line:?}")),
        };
    }
    Ok(names)
}

#[tokio::test]
async fn slotkeeper_upgrades_itself_from_the_previous_release_with_redis_untouched() {
    let env = release_env();
    let client = env.client().await.unwrap();
    install_previous(env);
    let old = v1alpha1::API_VERSION;
    for (ns, name) in CLUSTERS {
        namespace_with_pod_security(&client, ns, PREVIOUS_RELEASE_POD_SECURITY).await;
        let replicas = if name == "idle" { 0 } else { 1 };
        apply_old(
            env,
            &format!(
                "apiVersion: {old}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{masters: 3, replicasPerMaster: {replicas}, version: 7.0.15}}\n"
            ),
        );
    }
    for (ns, name) in CLUSTERS {
        wait_phase(env, "v1alpha1", ns, name, "Running").await;
    }
    let (ok, out) = kubectl(
        env,
        &["-n", "up-idle", "patch", "rdc", "idle", "--type=merge", "-p", r#"{"spec":{"paused":true}}"#],
        None,
    );
    assert!(ok, "{out}");
    apply_old(
        env,
        &format!(
            "apiVersion: {old}\nkind: RedisOperation\nmetadata: {{name: handover, namespace: up-ops}}\nspec: {{cluster: ops, type: Failover, failover: {{shard: 0}}}}\n"
        ),
    );
    let operation = "/apis/slotkeeper.io/v1alpha1/namespaces/up-ops/redisoperations/handover";
    wait_until("RedisOperation handover Succeeded", Duration::from_secs(120), || async {
        (raw(env, operation).ok()?["status"]["phase"] == "Succeeded").then_some(())
    })
    .await;
    wait_phase(env, "v1alpha1", "up-ops", "ops", "Running").await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "up-busy");
    let busy = pods.list(&ListParams::default().labels("slotkeeper.io/cluster=busy")).await.unwrap();
    let password = operator::password(&client, "up-busy", "busy").await;
    let ips: Vec<String> = busy.items.iter().map(pod_ip).collect();
    let seeds = ClusterClient::new(ips.clone(), &password).await.seed("seed", 100_000).await;
    let writer = Writer::start(ips.clone(), &password, "acked").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = redis_pods(&client, &CLUSTERS).await;
    let previous_pods: Vec<String> = operator_pods(&client).await.into_keys().collect();
    assert_eq!(previous_pods.len(), 2, "the previous release runs two replicas: {previous_pods:?}");

    // Apply: the plan, printed; the manager Deployment of the new release runs it.
    let manifests = next_manifests();
    let (code, out) = upgrade_cli(env, &["apply", "--manifests", manifests.path().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    println!("{out}");
    let plan_name = next_plan_name();
    assert!(out.contains(&format!("SlotkeeperUpgrade/{plan_name}")), "{out}");

    // Follow it: reads at both versions every round, the manager killed once
    // in each step, approval when asked.
    let started = Instant::now();
    let mut crashed: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut read_failures = Vec::new();
    let mut reads = 0;
    let mut v1_served = false;
    let mut approved = false;
    let mut timeline = Vec::new();
    // The node agent removes a deleted Pod's directory: keep the previous
    // operator's output while its Pods live.
    let mut previous_logs: BTreeMap<String, String> = BTreeMap::new();
    // When a process of the new release first took the operator's leader Lease.
    let release = next_image().rsplit(':').next().unwrap().to_string();
    let mut new_leader_since: Option<String> = None;
    loop {
        if new_leader_since.is_none() {
            let path = format!("/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/slotkeeper-leader");
            if let Ok(lease) = raw(env, &path) {
                let annotations = &lease["metadata"]["annotations"];
                if annotations["slotkeeper.io/release"] == release.as_str()
                    && annotations["slotkeeper.io/annotated-by"] == lease["spec"]["holderIdentity"]
                {
                    new_leader_since = lease["spec"]["acquireTime"].as_str().map(String::from);
                }
            }
        }
        for pod in &previous_pods {
            let log = operator_pod_logs(env, pod);
            if !log.is_empty() {
                previous_logs.insert(pod.clone(), log);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(900), "the upgrade did not finish in 15 min: {timeline:#?}");
        let Ok(plan) = plan_object(env, &plan_name) else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let steps = steps(&plan);
        let current = plan["status"]["currentStep"].as_str().map(String::from);
        let line = format!("{:>5.1}s {current:?} {steps:?}", started.elapsed().as_secs_f64());
        if timeline.last().map(|(_, s): &(String, _)| s != &steps).unwrap_or(true) {
            println!("{line}");
            timeline.push((line, steps.clone()));
        }
        reads += 1;
        let expected: BTreeSet<String> = CLUSTERS.iter().map(|(_, n)| n.to_string()).collect();
        v1_served |= steps.iter().any(|(n, s)| n == "InstallCRDs" && s == "Succeeded");
        let versions: &[&str] = if v1_served { &["v1alpha1", "v1"] } else { &["v1alpha1"] };
        for version in versions {
            match listed_at(env, version) {
                Ok(names) if names == expected => {}
                other => read_failures.push(format!("{version} at {current:?}: {other:?}")),
            }
            let group = slotkeeper_api::GROUP;
            let by_name = [
                (format!("redisclusters.{version}.{group}"), Some(*version)),
                (format!("rdc.{version}.{group}"), None),
            ];
            for (resource, at) in by_name {
                match listed_by_kubectl(env, &resource, at) {
                    Ok(names) if names == expected => {}
                    other => read_failures.push(format!("kubectl get {resource} at {current:?}: {other:?}")),
                }
            }
        }
        if condition_true(&plan, "Succeeded") {
            break;
        }
        assert!(!condition_true(&plan, "Failed"), "the plan failed: {plan:#}");
        let Some(current) = current else { continue };
        let state = steps.iter().find(|(n, _)| *n == current).map(|(_, s)| s.as_str()).unwrap_or_default();
        if state == "AwaitingApproval" && !approved {
            let (code, out) = upgrade_cli(env, &["approve", &plan_name]);
            assert_eq!(code, Some(0), "{out}");
            approved = true;
        }
        if state == "Running"
            && !crashed.contains_key(&current)
            && let Some(holder) = lease_holder(env, "slotkeeper-upgrade-manager")
            && env.crash_container(OPERATOR_NAMESPACE, &holder, "slotkeeper").await.is_ok()
        {
            println!("killed the upgrade manager {holder} in step {current}");
            let done: BTreeMap<String, String> = plan["status"]["steps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["state"] == "Succeeded")
                .map(|s| (s["name"].as_str().unwrap().into(), s["completionTime"].to_string()))
                .collect();
            crashed.insert(current.clone(), done);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let took = started.elapsed();
    let (ok, out) =
        kubectl(env, &["wait", "--for=condition=Succeeded", &format!("slotkeeperupgrade/{plan_name}")], None);
    assert!(ok, "kubectl wait on the plan: {out}");
    assert!(approved, "the gated step was approved");

    // The checkpoint held: what had succeeded before each kill stayed so,
    // with the same completion time.
    let plan = plan_object(env, &plan_name).unwrap();
    let final_steps: BTreeMap<String, String> = plan["status"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().into(), s["completionTime"].to_string()))
        .collect();
    for (step, done) in &crashed {
        for (name, completed) in done {
            assert_eq!(final_steps.get(name), Some(completed), "{name} was redone after the kill in {step}");
        }
    }
    let killed: Vec<&String> = crashed.keys().collect();
    for step in ["InstallCRDs", "RollOperator", "MigrateStorage", "Finalize"] {
        assert!(crashed.contains_key(step), "the manager was killed in {step} (killed in {killed:?})");
    }
    assert!(read_failures.is_empty(), "{} of {reads} reads failed: {read_failures:#?}", read_failures.len());

    // v1alpha1 is deprecated now: kubectl says so.
    let (_, warnings) = raw_with_warnings(env, "/apis/slotkeeper.io/v1alpha1/redisclusters").unwrap();
    assert!(
        warnings.iter().any(|w| w.contains("v1alpha1 RedisCluster is deprecated")),
        "kubectl warns of the deprecated version: {warnings:?}"
    );

    // Storage: storedVersions [v1], and etcd's bytes say v1 for every object.
    for crd in ["redisclusters.slotkeeper.io", "redisoperations.slotkeeper.io"] {
        assert_eq!(stored_versions(env, crd), ["v1"], "{crd}");
    }
    let v1 = format!(r#""apiVersion":"{}""#, slotkeeper_api::API_VERSION);
    for (resource, count) in [("redisclusters", 3), ("redisoperations", 1)] {
        let objects = etcd_objects(env, &format!("/registry/slotkeeper.io/{resource}/"));
        assert_eq!(objects.len(), count, "{resource} in etcd: {objects:?}");
        for (key, value) in &objects {
            assert!(value.contains(&v1), "{key} is stored as {}", &value[..value.len().min(120)]);
        }
    }

    // Redis untouched: the same Pods, no restart, the same roles; nothing lost.
    // The new release spreads masters and Pods over the Nodes, which the
    // previous one did not: a shard it changes is named in a MastersSpread
    // (coordinated failover) or PodMoved (a replica recreated) event. Every
    // other shard is exactly as before, and nothing restarted.
    let after = redis_pods(&client, &CLUSTERS).await;
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    let mut placed = String::new();
    for ns in before.keys().filter_map(|k| k.split_once('/')).map(|(ns, _)| ns).collect::<BTreeSet<_>>() {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns);
        for e in events.list(&ListParams::default()).await.unwrap().items {
            if matches!(e.reason.as_deref(), Some("MastersSpread" | "PodMoved")) {
                placed.push_str(&format!("{ns}: {}\n", e.message.unwrap_or_default()));
            }
        }
    }
    for (pod, was) in &before {
        let is = &after[pod];
        assert_eq!(is.restarts, 0, "{pod} restarted");
        if was != is {
            let (ns, name) = pod.split_once('/').unwrap();
            let shard = name.rsplit('-').nth(1).unwrap();
            let said = placed.lines().any(|l| l.starts_with(&format!("{ns}: shard {shard}:")));
            assert!(said, "{pod} changed ({was:?} → {is:?}) without a placement event; events: {placed}");
        }
    }
    eprintln!("placement changes by the new release:\n{placed}");
    // The nodes the previous release started got their ACL users live (no
    // restart, checked above); a paused cluster is left as it is, users too.
    let running = before.keys().filter_map(|k| k.split_once('/')).map(|(ns, _)| ns).filter(|ns| *ns != "up-idle");
    for ns in running.collect::<BTreeSet<_>>() {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns);
        let applied = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .any(|e| e.reason.as_deref() == Some("UsersApplied"));
        assert!(applied, "{ns}: no UsersApplied event after the upgrade");
    }
    let mut reader = ClusterClient::new(ips, &password).await;
    assert_all_read_back(&mut reader, &seeds, &writer, "after the upgrade").await;
    let record = writer.stop().await;
    assert!(record.acknowledged.len() > 100, "the writer wrote through the upgrade: {}", record.acknowledged.len());

    // The operator is the new release; the previous one logged no error.
    let now = operator_pods(&client).await;
    assert!(now.values().all(|image| *image == next_image()), "{now:?}");
    assert!(previous_pods.iter().all(|p| !now.contains_key(p)), "the previous operator's Pods are gone: {now:?}");
    for pod in &previous_pods {
        let log = previous_logs.get(pod).cloned().unwrap_or_default();
        assert!(!log.is_empty(), "the previous operator {pod} logged");
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(r#""level":"ERROR""#)).collect();
        assert!(errors.is_empty(), "the previous operator {pod} logged errors: {errors:#?}");
    }

    // The new release's first reconciles (from when it first led) write
    // nothing but status, events, and the placement moves named above.
    let acquired = new_leader_since.expect("a process of the new release led");
    let log = std::fs::read_to_string(env.audit_log()).unwrap();
    let namespaces: BTreeSet<&str> = CLUSTERS.iter().map(|(ns, _)| *ns).collect();
    let writes: Vec<String> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["user"]["username"] == OPERATOR_USER && e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete" | "deletecollection")))
        .filter(|e| e["objectRef"]["namespace"].as_str().is_some_and(|ns| namespaces.contains(ns)))
        .filter(|e| e["requestReceivedTimestamp"].as_str().is_some_and(|t| *t > *acquired))
        .map(|e| {
            format!(
                "{} {}/{} {}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["subresource"].as_str().unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    // Besides status: the events it reports, and a replica deleted only where
    // a PodMoved event (checked above against every Pod) said so.
    let moved = |write: &str| {
        write.strip_prefix("delete pods/ ").is_some_and(|pod| placed.contains(&format!("recreating replica {pod} ")))
    };
    let reported = |write: &str| write.starts_with("create events/") || write.starts_with("patch events/");
    // This release renders the auth config quoted with ACL users, gives Redis
    // Pods a securityContext and admits the operator to Redis by namespace
    // name: it rewrites those objects once each (the StatefulSets are
    // OnDelete: no Pod changes until a rollout; checked above), and makes
    // each cluster's `<cluster>-acl` Secret once (the users go to the running
    // nodes live, with ACL SETUSER).
    let rerendered = |write: &str| {
        (write.starts_with("patch secrets/ ") && write.ends_with("-auth-conf"))
            || (write.starts_with("create secrets/ ") && write.ends_with("-acl"))
            || (write.starts_with("patch statefulsets/ ") && write.contains("-shard-"))
            || write.starts_with("patch networkpolicies/ ")
    };
    for write in writes.iter().filter(|w| rerendered(w)) {
        assert_eq!(writes.iter().filter(|w| *w == write).count(), 1, "rewritten more than once: {write}");
    }
    let not_status: Vec<&String> =
        writes.iter().filter(|w| !w.contains("/status ") && !reported(w) && !moved(w) && !rerendered(w)).collect();
    assert!(not_status.is_empty(), "the new leader wrote more than status, events and placement: {not_status:#?}");
    println!(
        "upgraded in {:.0} s (manager killed in {killed:?}); {reads} rounds of reads at both versions, none failed; \
         {} Redis Pods unchanged; {} seeded and {} acknowledged keys read back; the new release's leaders' writes in \
         the clusters' namespaces since it first led ({acquired}): {writes:?}",
        took.as_secs_f64(),
        after.len(),
        seeds.len(),
        record.acknowledged.len()
    );
}
