//! The local environment runs real Redis Pods: StatefulSets with persistent
//! volumes, both Redis versions, real RBAC, restarts and graceful deletion.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

const REDIS_PORT: u16 = 6379;

fn redis_container(image: &str) -> serde_json::Value {
    json!({
        "name": "redis",
        "image": image,
        "command": ["redis-server", "--bind", "$(POD_IP)", "--port", "6379", "--dir", "/data", "--appendonly", "yes", "--appendfsync", "always"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "redis", "containerPort": 6379}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    })
}

/// Output of `redis-server --version` of a real binary, e.g. "7.0.15".
fn binary_version(path: &str) -> String {
    let out = std::process::Command::new(path).arg("--version").output().expect("redis-server --version");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace().find_map(|w| w.strip_prefix("v=")).expect("version in output").to_owned()
}

#[tokio::test]
async fn statefulset_of_redis_becomes_ready_and_keeps_data_across_pod_recreation() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "sts-redis", "baseline").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "cache"},
        "spec": {
            "serviceName": "cache",
            "replicas": 3,
            "selector": {"matchLabels": {"app": "cache"}},
            "template": {
                "metadata": {"labels": {"app": "cache"}},
                "spec": {"containers": [redis_container("redis:7.0.15")]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        },
    }))
    .unwrap();
    let started = Instant::now();
    sets.create(&PostParams::default(), &set).await.expect("create StatefulSet");
    wait_until("StatefulSet cache with 3 ready replicas", Duration::from_secs(120), || async {
        let s = sets.get("cache").await.ok()?;
        (s.status?.ready_replicas? == 3).then_some(())
    })
    .await;
    eprintln!("StatefulSet of 3 Redis Pods Ready in {:.1}s", started.elapsed().as_secs_f64());

    let expected_version = binary_version("/usr/bin/redis-server");
    let mut addresses = std::collections::BTreeSet::new();
    for i in 0..3 {
        let pod = pods.get(&format!("cache-{i}")).await.unwrap();
        let ip = pod_ip(&pod);
        assert!(ip.starts_with("127.") && !ip.starts_with("127.0.0."), "pod IP {ip} is a private loopback address");
        addresses.insert(ip.clone());
        let mut redis = redis_at(&ip, REDIS_PORT).await;
        let pong: String = redis::cmd("PING").query_async(&mut redis).await.unwrap();
        assert_eq!(pong, "PONG");
        assert_eq!(redis_version(&mut redis).await, expected_version, "INFO reports the real binary's version");
    }
    assert_eq!(addresses.len(), 3, "every Pod has its own IP: {addresses:?}");

    let first = pods.get("cache-0").await.unwrap();
    let mut redis = redis_at(&pod_ip(&first), REDIS_PORT).await;
    let _: () = redis::cmd("SET").arg("survivor").arg("written-before-delete").query_async(&mut redis).await.unwrap();
    drop(redis);

    pods.delete("cache-0", &DeleteParams::default()).await.expect("delete cache-0");
    let old_uid = first.uid().unwrap();
    let recreated = wait_until("cache-0 recreated and Ready", Duration::from_secs(90), || async {
        pods.get_opt("cache-0").await.ok().flatten().filter(|p| p.uid().as_deref() != Some(&old_uid) && pod_ready(p))
    })
    .await;
    let mut redis = redis_at(&pod_ip(&recreated), REDIS_PORT).await;
    let value: Option<String> = redis::cmd("GET").arg("survivor").query_async(&mut redis).await.unwrap();
    assert_eq!(value.as_deref(), Some("written-before-delete"), "the key survived on the persistent volume");
}

#[tokio::test]
async fn redis_6_2_pod_reports_its_version() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "redis-62", "baseline").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut container = redis_container("redis:6.2.14");
    container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "old"},
        "spec": {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = ready_pod(&pods, "old", Duration::from_secs(60)).await;
    let mut redis = redis_at(&pod_ip(&pod), REDIS_PORT).await;
    let version = redis_version(&mut redis).await;
    assert!(version.starts_with("6.2."), "redis_version:{version}");
    assert_eq!(
        version,
        binary_version(
            slotkeeper_env::tools::repo_root().join("target/tools/redis-6.2/redis-server").to_str().unwrap()
        )
    );
}

#[tokio::test]
async fn unknown_image_cannot_be_pulled() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "bad-image", "baseline").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nginx"},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let (reason, message) = wait_until("ErrImagePull or ImagePullBackOff", Duration::from_secs(30), || async {
        let pod = pods.get("nginx").await.ok()?;
        let waiting = pod.status?.container_statuses?.first()?.state.clone()?.waiting?;
        Some((waiting.reason?, waiting.message.unwrap_or_default()))
            .filter(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
    })
    .await;
    assert!(message.contains("nginx:1.27") && message.contains("image table"), "{reason}: {message}");
}

#[tokio::test]
async fn rbac_denies_a_user_without_rights_until_bound() {
    let env = shared_env();
    let admin = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&admin, "rbac", "baseline").await;
    let alice = env.client_as("alice").await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "by-alice"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]},
    }))
    .unwrap();
    let as_alice: Api<Pod> = Api::namespaced(alice, &ns);
    match as_alice.create(&PostParams::default(), &pod).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("alice created a Pod without rights: {other:?}"),
    }
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(admin.clone(), &ns);
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "pod-creator"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = Api::namespaced(admin, &ns);
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "alice-creates-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-creator"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // RBAC changes reach the authorizer's cache within moments.
    wait_until("alice may create Pods", Duration::from_secs(10), || async {
        as_alice.create(&PostParams::default(), &pod).await.ok()
    })
    .await;
}

#[tokio::test]
async fn crashed_container_restarts_and_becomes_ready_again() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "crash", "baseline").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut container = redis_container("redis:7.0.15");
    container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "crashy"},
        "spec": {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    ready_pod(&pods, "crashy", Duration::from_secs(60)).await;
    let before = env.pod_processes(&ns, "crashy").await.unwrap()["redis"];

    env.crash_container(&ns, "crashy", "redis").await.unwrap();
    let restarted = wait_until("crashy restarted once and Ready", Duration::from_secs(60), || async {
        let pod = pods.get("crashy").await.ok()?;
        let count = pod.status.as_ref()?.container_statuses.as_ref()?.first()?.restart_count;
        (count == 1 && pod_ready(&pod)).then_some(pod)
    })
    .await;
    let after = env.pod_processes(&ns, "crashy").await.unwrap()["redis"];
    assert_ne!(before, after, "a new process runs the container");
    assert!(!std::path::Path::new(&format!("/proc/{before}")).exists(), "the crashed process is gone");
    let last = restarted.status.unwrap().container_statuses.unwrap()[0].last_state.clone().unwrap();
    assert!(last.terminated.is_some(), "lastState records the crash: {last:?}");
}

#[tokio::test]
async fn deleting_a_pod_sends_sigterm_and_removes_the_object() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "graceful", "baseline").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "evidence"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // The shell records the signal on a volume that outlives the Pod.
    let script = "trap 'echo SIGTERM > /evidence/signal; exit 0' TERM; echo started > /evidence/signal; while :; do sleep 0.1; done";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "listener"},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "containers": [{
                "name": "sh", "image": "busybox:1.36", "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "evidence", "mountPath": "/evidence"}],
            }],
            "volumes": [{"name": "evidence", "persistentVolumeClaim": {"claimName": "evidence"}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    ready_pod(&pods, "listener", Duration::from_secs(60)).await;
    let volume_name = claims.get("evidence").await.unwrap().spec.unwrap().volume_name.unwrap();
    let volume = Api::<PersistentVolume>::all(client.clone()).get(&volume_name).await.unwrap();
    let evidence = std::path::PathBuf::from(volume.spec.unwrap().host_path.unwrap().path).join("signal");
    wait_until("the container wrote its start mark", Duration::from_secs(10), || async {
        std::fs::read_to_string(&evidence).ok().filter(|s| s.trim() == "started")
    })
    .await;
    let pid = env.pod_processes(&ns, "listener").await.unwrap()["sh"];

    let started = Instant::now();
    pods.delete("listener", &DeleteParams::default()).await.unwrap();
    wait_until("Pod listener removed", Duration::from_secs(30), || async {
        pods.get_opt("listener").await.ok().and_then(|p| p.is_none().then_some(()))
    })
    .await;
    assert_eq!(std::fs::read_to_string(&evidence).unwrap().trim(), "SIGTERM", "the container saw SIGTERM");
    assert!(started.elapsed() < Duration::from_secs(20), "it exited on SIGTERM, not at the grace period's SIGKILL");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the process is gone");
}

#[tokio::test]
async fn pod_gets_env_from_secrets_config_maps_and_fields_and_private_volume_mounts() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "config", "baseline").await;
    let redis_conf = "maxmemory 10mb\nmaxmemory-policy allkeys-lru\n";
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "auth"}, "stringData": {"password": "s3cret-pass"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "conf"}, "data": {"redis.conf": redis_conf, "port": "6380"},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "configured"},
        "spec": {
            "containers": [{
                "name": "redis",
                "image": "redis:7.0.15",
                "command": ["redis-server", "/etc/redis/redis.conf", "--bind", "$(POD_IP)", "--port", "$(PORT)",
                            "--requirepass", "$(PASSWORD)", "--dir", "/data", "--logfile", "/data/$(POD_NAME).$(POD_NAMESPACE).log"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "auth", "key": "password"}}},
                    {"name": "PORT", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "port"}}},
                ],
                // Runs inside the Pod's mount namespace with its environment.
                "readinessProbe": {
                    "exec": {"command": ["sh", "-c", "test -f /etc/auth/password && redis-cli -h $POD_IP -p $PORT -a \"$(cat /etc/auth/password)\" --no-auth-warning ping | grep -q PONG"]},
                    "periodSeconds": 1,
                },
                "volumeMounts": [
                    {"name": "conf", "mountPath": "/etc/redis", "readOnly": true},
                    {"name": "auth", "mountPath": "/etc/auth", "readOnly": true},
                    {"name": "data", "mountPath": "/data"},
                ],
            }],
            "volumes": [
                {"name": "conf", "configMap": {"name": "conf", "items": [{"key": "redis.conf", "path": "redis.conf"}]}},
                {"name": "auth", "secret": {"secretName": "auth"}},
                {"name": "data", "emptyDir": {}},
            ],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = ready_pod(&pods, "configured", Duration::from_secs(60)).await;

    let client = redis::Client::open(format!("redis://:s3cret-pass@{}:6380/", pod_ip(&pod))).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.expect("AUTH with the Secret's password");
    let config = |key: &'static str| {
        let mut redis = redis.clone();
        async move {
            let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(key).query_async(&mut redis).await.unwrap();
            pair[1].clone()
        }
    };
    assert_eq!(config("maxmemory").await, "10485760", "redis.conf came from the ConfigMap volume");
    assert_eq!(config("logfile").await, format!("/data/configured.{ns}.log"), "fieldRef values expanded in args");
    let _: () = redis::cmd("PING").query_async(&mut redis).await.unwrap();
    let host_conf = std::fs::read_to_string("/etc/redis/redis.conf").unwrap_or_default();
    assert_ne!(host_conf, redis_conf, "the mount stayed inside the Pod's mount namespace");
}
