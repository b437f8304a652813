//! The operator, running as its ServiceAccount with exactly the RBAC in
//! deploy/, turns a RedisCluster into a working Redis Cluster of real
//! redis-server processes.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::operator::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use redis::AsyncCommands as _;
use slotkeeper_operator::api::RedisCluster;
use slotkeeper_operator::api::lag::ReplicationLag;

#[tokio::test]
async fn example_cluster_bootstraps_serves_keys_and_spreads_replicas() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "example").await;
    let example = std::fs::read_to_string(slotkeeper_env::tools::repo_root().join("deploy/examples/rediscluster.yaml"))
        .unwrap()
        .replace("namespace: default", &format!("namespace: {ns}"));
    let started = Instant::now();
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&example));
    assert!(ok, "{out}");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_running(&api, "example", Duration::from_secs(120)).await;
    eprintln!("example 3x1 Ready in {:.1}s", started.elapsed().as_secs_f64());
    let status = cluster.status.unwrap();
    assert_eq!(status.slots_assigned, 16384);
    assert_eq!((status.ready_masters, status.ready_replicas), (3, 3));
    assert_eq!(status.current_version.as_deref(), Some("7.0.15"));
    assert_eq!(status.cluster_state.as_deref(), Some("ok"));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pods = pods.list(&ListParams::default().labels("slotkeeper.io/cluster=example")).await.unwrap().items;
    let node_of: BTreeMap<String, String> =
        pods.iter().map(|p| (pod_ip(p), p.spec.as_ref().unwrap().node_name.clone().unwrap())).collect();
    let password = password(&client, &ns, "example").await;
    let any_ip = pod_ip(&pods[0]);
    let check = redis_cli_check(&any_ip, &password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{check}");
    assert!(!check.contains("[WARNING]") && !check.contains("[ERR]"), "{check}");

    // The namespace enforces Pod Security `restricted` (the apiserver refuses
    // a root Pod there), and the operator's Pods pass it: every redis-server
    // runs as its own non-root user on a read-only root file system.
    let (ok, out) = kubectl(env, &["-n", &ns, "run", "rooted", "--image=busybox:1.36", "--", "sleep", "60"], None);
    assert!(!ok && out.contains("violates PodSecurity \"restricted:latest\""), "{out}");
    for pod in &pods {
        let (uid, root) = redis_process_confinement(&pod_ip(pod), &password).await;
        assert_eq!(uid, "999", "{} runs redis-server as uid {uid}", pod.metadata.name.as_deref().unwrap());
        assert!(root.split(',').any(|o| o == "ro"), "{}: / is mounted {root}", pod.metadata.name.as_deref().unwrap());
    }

    // Each master's replica runs on another Kubernetes Node.
    for node in &status.nodes {
        if node.role.as_deref() == Some("replica") {
            let master = status.nodes.iter().find(|m| m.node_id == node.master_id).expect("master in status");
            let (replica_ip, master_ip) = (node.ip.clone().unwrap(), master.ip.clone().unwrap());
            assert_ne!(
                node_of[&replica_ip], node_of[&master_ip],
                "{} and its master {} share a Node",
                node.pod, master.pod
            );
        }
    }

    // 10,000 keys through a cluster-aware client read back.
    let urls: Vec<String> = pods.iter().map(|p| format!("redis://:{password}@{}:6379/", pod_ip(p))).collect();
    let cluster_client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut connection = cluster_client.get_async_connection().await.unwrap();
    for i in 0..10_000 {
        let _: () = connection.set(format!("key:{i}"), i).await.unwrap();
    }
    for i in 0..10_000 {
        let value: i64 = connection.get(format!("key:{i}")).await.unwrap();
        assert_eq!(value, i);
    }

    // Replication lag, as a bucket: every replica in sync, shown by `-o wide`.
    let lag_of = |c: &RedisCluster, pod: &str| {
        c.status.as_ref().unwrap().nodes.iter().find(|n| n.pod == pod).and_then(|n| n.replication_lag)
    };
    let replica = status.nodes.iter().find(|n| n.role.as_deref() == Some("replica")).unwrap().clone();
    wait_until("every replica reported InSync", Duration::from_secs(60), || async {
        let c = api.get("example").await.ok()?;
        let s = c.status.as_ref()?;
        let replicas: Vec<_> = s.nodes.iter().filter(|n| n.role.as_deref() == Some("replica")).collect();
        let all = replicas.len() == 3 && replicas.iter().all(|n| n.replication_lag == Some(ReplicationLag::InSync));
        (all && s.replication_lag == Some(ReplicationLag::InSync)).then_some(())
    })
    .await;
    let (ok, wide) = kubectl(env, &["-n", &ns, "get", "rdc", "example", "-o", "wide"], None);
    assert!(ok && wide.contains("LAG") && wide.contains("InSync"), "{wide}");
    // One replica loses its link (it can no longer authenticate to its
    // master): status says LinkDown for it and for the cluster, then InSync
    // once the link is back.
    let mut node = redis::Client::open(format!("redis://:{password}@{}:6379/", replica.ip.as_deref().unwrap()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () =
        redis::cmd("CONFIG").arg(&["SET", "masterauth", "not-the-password"]).query_async(&mut node).await.unwrap();
    let _: i64 = redis::cmd("CLIENT").arg(&["KILL", "TYPE", "master"]).query_async(&mut node).await.unwrap();
    wait_until("the replica reported LinkDown", Duration::from_secs(60), || async {
        let c = api.get("example").await.ok()?;
        let down = lag_of(&c, &replica.pod) == Some(ReplicationLag::LinkDown);
        (down && c.status.as_ref()?.replication_lag == Some(ReplicationLag::LinkDown)).then_some(())
    })
    .await;
    let (_, wide) = kubectl(env, &["-n", &ns, "get", "rdc", "example", "-o", "wide"], None);
    assert!(wide.contains("LinkDown"), "{wide}");
    // Replicas sign in to their master as the replication user.
    let replication = secret_value(&client, &ns, "example-acl", "replication").await;
    let _: () = redis::cmd("CONFIG").arg(&["SET", "masterauth", &replication]).query_async(&mut node).await.unwrap();
    wait_until("the replica reported InSync again", Duration::from_secs(60), || async {
        let c = api.get("example").await.ok()?;
        let back = lag_of(&c, &replica.pod) == Some(ReplicationLag::InSync);
        (back && c.status.as_ref()?.replication_lag == Some(ReplicationLag::InSync)).then_some(())
    })
    .await;

    // The story is told in events.
    let (_, described) = kubectl(env, &["-n", &ns, "describe", "rdc", "example"], None);
    for reason in ["Applied", "ClusterMeet", "SlotsAssigned", "ReplicaAttached", "ClusterReady"] {
        assert!(described.contains(reason), "event {reason} missing from describe:\n{described}");
    }
    assert!(!described.contains(&password), "the password leaked into describe output");
}

#[tokio::test]
async fn redis_6_2_cluster_forms_and_reports_its_version() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "old-redis").await;
    apply_cluster_spec(env, &ns, "legacy", "masters: 3, replicasPerMaster: 0, redis: {version: 6.2.14}");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_running(&api, "legacy", Duration::from_secs(120)).await;
    let status = cluster.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("6.2.14"));
    assert!(status.nodes.iter().all(|n| n.version.as_deref() == Some("6.2.14")));
    let password = password(&client, &ns, "legacy").await;
    let check = redis_cli_check(status.nodes[0].ip.as_deref().unwrap(), &password);
    assert!(check.contains("[OK] All 16384 slots covered."), "{check}");
}

/// The effective uid of the redis-server behind `ip` and the mount options of
/// the root file system it sees, read from /proc (Pods are local processes).
async fn redis_process_confinement(ip: &str, password: &str) -> (String, String) {
    let mut node = redis::Client::open(format!("redis://:{password}@{ip}:6379/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut node).await.unwrap();
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).expect("INFO server has process_id").trim();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid =
        status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().nth(1).unwrap().to_owned();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    // mountinfo: id parent major:minor root mount-point options ...
    let root = mounts
        .lines()
        .rev()
        .find_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            (fields.get(4) == Some(&"/")).then(|| fields[5].to_owned())
        })
        .expect("a mount at /");
    (uid, root)
}

/// A connection to `ip` signed in as `user`.
async fn sign_in(ip: &str, user: &str, password: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let encode = |text: &str| text.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    let client = redis::Client::open(format!("redis://{}:{}@{ip}:6379/", encode(user), encode(password)))?;
    client.get_multiplexed_async_connection().await
}

async fn secret_value(client: &kube::Client, ns: &str, name: &str, key: &str) -> String {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns).get(name).await.unwrap();
    String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
}

/// On how many of the nodes `user` signs in with `password`.
async fn signs_in_on(ips: &[String], user: &str, password: &str) -> usize {
    let mut count = 0;
    for ip in ips {
        count += usize::from(sign_in(ip, user, password).await.is_ok());
    }
    count
}

/// ACL users on 6.2, 7.0 and Valkey 8.1, with the `default` user off: the
/// operator forms and runs the cluster as its own user (it could not sign
/// in otherwise), replicas follow their masters as the replication user, an
/// application user with `-@dangerous` cannot FLUSHALL, and a user added,
/// changed and removed on the RedisCluster reaches every node live (no Pod
/// restarted) while a user made by hand stays.
#[tokio::test]
async fn acl_users_the_operator_its_own_an_application_only_its_rules() {
    let env = shared_env();
    shared_operator(env);
    let client = env.client().await.unwrap();
    let releases = [("redis", "7.0.15"), ("redis", "6.2.14"), ("valkey", "8.1.8")];
    futures::future::join_all(releases.iter().map(|(engine, version)| acl_users_on(env, &client, engine, version)))
        .await;
}

async fn acl_users_on(env: &slotkeeper_env::Environment, client: &kube::Client, engine: &str, version: &str) {
    let ns = namespace(client, &format!("acl-{engine}-{}", version.replace('.', ""))).await;
    // Any byte in an application's password: a quote, a space, a newline.
    let app_password = "p\"w d\nuser x";
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: app-redis, namespace: {ns}}}\nstringData: {{password: {}}}\n",
        serde_json::to_string(app_password).unwrap()
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&secret));
    assert!(ok, "{out}");
    let users = |extra: &str| {
        format!(
            "masters: 3, replicasPerMaster: 1, redis: {{engine: {engine}, version: {version}}}, acl: {{defaultUser: Disabled, users: [{{name: app, passwordSecret: {{name: app-redis}}, rules: ['~*', '+@all', '-@dangerous']}}{extra}]}}"
        )
    };
    apply_cluster_spec(env, &ns, "acl", &users(""));
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_running(&api, "acl", Duration::from_secs(180)).await;
    let status = cluster.status.unwrap();
    assert_eq!((status.ready_masters, status.ready_replicas), (3, 3), "{engine} {version}");
    let first_revision = status.acl.as_ref().map(|a| a.revision.clone()).expect("status.acl");
    let ips: Vec<String> = status.nodes.iter().map(|n| n.ip.clone().unwrap()).collect();
    let operator = secret_value(client, &ns, "acl-acl", "operator").await;
    let cluster_password = password(client, &ns, "acl").await;

    for ip in &ips {
        // The operator's own user: exactly its commands.
        let mut own = sign_in(ip, "slotkeeper-operator", &operator).await.unwrap();
        let whoami: String = redis::cmd("ACL").arg("WHOAMI").query_async(&mut own).await.unwrap();
        assert_eq!(whoami, "slotkeeper-operator");
        let flush: redis::RedisResult<()> = redis::cmd("FLUSHALL").query_async(&mut own).await;
        let flush = flush.unwrap_err().to_string();
        assert!(flush.contains("no permissions"), "{engine}: the operator's user may not FLUSHALL: {flush}");
        // Replicas sign in to their master as the replication user (a full
        // sync may still be waiting out its diskless delay).
        wait_until(&format!("{engine} {ip}: the replica's link up"), Duration::from_secs(60), || {
            let mut own = own.clone();
            async move {
                let info: String = redis::cmd("INFO").arg("replication").query_async(&mut own).await.ok()?;
                (info.contains("role:master") || info.contains("master_link_status:up")).then_some(())
            }
        })
        .await;
        // The application's user: its rules, less what is dangerous.
        let mut app = sign_in(ip, "app", app_password).await.unwrap();
        let whoami: String = redis::cmd("ACL").arg("WHOAMI").query_async(&mut app).await.unwrap();
        assert_eq!(whoami, "app");
        for command in [vec!["FLUSHALL"], vec!["CONFIG", "SET", "dir", "/tmp"], vec!["ACL", "SETUSER", "x", "on"]] {
            let refused: redis::RedisResult<redis::Value> =
                redis::cmd(command[0]).arg(&command[1..]).query_async(&mut app).await;
            assert!(refused.unwrap_err().to_string().contains("no permissions"), "{engine}: app ran {command:?}");
        }
        // The default user cannot sign in, with the cluster password or none.
        assert!(sign_in(ip, "default", &cluster_password).await.is_err(), "{engine}: default signed in");
    }
    // Writes work as the application, through the cluster.
    let check = std::process::Command::new("redis-cli")
        .args([
            "--user",
            "app",
            "--pass",
            app_password,
            "--no-auth-warning",
            "-c",
            "-h",
            &ips[0],
            "set",
            "greeting",
            "hello",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "OK", "{}", String::from_utf8_lossy(&check.stderr));

    // Someone adds a user by hand; the cluster gains a user and loses none of the Pods.
    for ip in &ips {
        let mut own = sign_in(ip, "slotkeeper-operator", &operator).await.unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("handmade")
            .arg("on")
            .arg(">x")
            .arg("+ping")
            .query_async(&mut own)
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let uids =
        |list: Vec<Pod>| list.into_iter().map(|p| p.metadata.uid.unwrap()).collect::<std::collections::BTreeSet<_>>();
    let before = uids(pods.list(&ListParams::default().labels("slotkeeper.io/cluster=acl")).await.unwrap().items);
    apply_cluster_spec(
        env,
        &ns,
        "acl",
        &users(", {name: reader, passwordSecret: {name: app-redis}, rules: ['~*', '+@read']}"),
    );
    wait_until(&format!("{engine}: the new user applied"), Duration::from_secs(60), || async {
        let acl = api.get("acl").await.ok()?.status?.acl?;
        (acl.revision != first_revision && acl.users == ["app", "reader"]).then_some(())
    })
    .await;
    assert_eq!(signs_in_on(&ips, "reader", app_password).await, ips.len(), "{engine}: reader missing");
    let mut reader = sign_in(&ips[0], "reader", app_password).await.unwrap();
    let write: redis::RedisResult<()> = redis::cmd("SET").arg("{greeting}x").arg("1").query_async(&mut reader).await;
    assert!(write.unwrap_err().to_string().contains("no permissions"), "{engine}: reader wrote");
    // And removed again: gone from every node; the hand-made user stays.
    apply_cluster_spec(env, &ns, "acl", &users(""));
    wait_until(&format!("{engine}: the removed user deleted"), Duration::from_secs(60), || async {
        let acl = api.get("acl").await.ok()?.status?.acl?;
        (acl.users == ["app"]).then_some(())
    })
    .await;
    assert_eq!(signs_in_on(&ips, "reader", app_password).await, 0, "{engine}: reader stayed");
    assert_eq!(signs_in_on(&ips, "handmade", "x").await, ips.len(), "{engine}: the hand-made user was lost");
    let after = uids(pods.list(&ListParams::default().labels("slotkeeper.io/cluster=acl")).await.unwrap().items);
    assert_eq!(before, after, "{engine}: users changed live, no Pod recreated");
}
