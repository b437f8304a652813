//! Helpers shared by the end-to-end tests: one environment per test binary,
//! a namespace per test, and polling with a deadline and a clear message.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
pub mod browser;
pub mod memory;
pub mod metrics;
pub mod operator;
pub mod release;
pub mod rollout;
pub mod upgrade;
pub mod writer;

use slotkeeper_env::{Environment, EnvironmentOptions, tools};

/// The environment shared by every test of this binary, started on first use.
/// Its state (and logs) stay in `target/e2e/<binary>` until the next run;
/// its processes die with the test binary (parent-death signal).
pub fn shared_env() -> &'static Environment {
    shared_env_with(Vec::new)
}

/// [`shared_env`] whose node agent also runs `extra_images` (node-agent
/// image table entries); the first call of a test binary decides.
pub fn shared_env_with(extra_images: impl FnOnce() -> Vec<serde_json::Value>) -> &'static Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let extra_images = extra_images();
        let dir = tools::repo_root().join("target/e2e").join(env!("CARGO_CRATE_NAME"));
        // A thread of its own: the caller may already be inside a runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let started = Instant::now();
            let env = runtime
                .block_on(Environment::start(EnvironmentOptions { dir: Some(dir), extra_images, ..Default::default() }))
                .unwrap_or_else(|e| panic!("the local environment did not start: {e}"));
            eprintln!(
                "apiserver /readyz after {:.1}s; environment ready in {:.1}s",
                env.control_plane().ready_after().as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            env
        })
        .join()
        .expect("environment start thread")
    })
}

/// Creates a namespace for one test and waits for its `default` ServiceAccount.
/// The Pod Security level every test namespace enforces unless a test of the
/// node agent itself asks for another: the apiserver's own admission then
/// checks every Pod the operator makes.
pub const POD_SECURITY: &str = "restricted";
/// Where the previous release runs clusters: its Pods carry no
/// securityContext, so they pass `baseline` only (the upgraded operator
/// restricts them at their next rollout, as the StatefulSets are OnDelete).
pub const PREVIOUS_RELEASE_POD_SECURITY: &str = "baseline";

pub async fn namespace(client: &Client, name: &str) -> String {
    namespace_with_pod_security(client, name, POD_SECURITY).await
}

/// A namespace whose Pods are admitted at `level` (`restricted`, `baseline`,
/// `privileged`) by the apiserver's Pod Security admission.
pub async fn namespace_with_pod_security(client: &Client, name: &str, level: &str) -> String {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_until(&format!("ServiceAccount {name}/default"), Duration::from_secs(30), || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
    name.to_owned()
}

/// Polls `check` every 200 ms until it yields a value; panics after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("pod has an IP")
}

/// Waits for a Pod to be Ready and returns it.
pub async fn ready_pod(api: &Api<Pod>, name: &str, timeout: Duration) -> Pod {
    wait_until(&format!("pod {name} Ready"), timeout, || async {
        api.get_opt(name).await.ok().flatten().filter(pod_ready)
    })
    .await
}

/// A connection to a Redis server on a Pod's address.
pub async fn redis_at(ip: &str, port: u16) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{ip}:{port}/")).expect("redis URL");
    client.get_multiplexed_async_connection().await.unwrap_or_else(|e| panic!("connect to redis at {ip}:{port}: {e}"))
}

/// The `redis_version` field of INFO server.
pub async fn redis_version(connection: &mut redis::aio::MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO").arg("server").query_async(connection).await.expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
        .expect("INFO has redis_version")
}

/// Runs the real `kubectl` against the environment; returns (success, stdout + stderr).
/// Loopback ports whose cluster-bus port (port + 10000) is free too, for
/// plain redis-server processes beside the environment.
pub fn free_cluster_ports(count: usize) -> Vec<u16> {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let start = 20000 + (std::process::id() % 10000) as u16;
    (start..start + 5000).filter(|p| free(*p) && free(p + 10000)).take(count).collect()
}

pub fn kubectl(env: &Environment, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    env.kubectl(args, stdin)
}

/// The bearer token of a token-file user of the environment (`alice`, `bob`).
pub fn user_token(env: &Environment, user: &str) -> String {
    let text = std::fs::read_to_string(env.kubeconfig()).expect("the admin kubeconfig");
    let config: serde_json::Value = serde_json::from_str(&text).expect("the kubeconfig is JSON");
    let users = config["users"].as_array().expect("users");
    let entry = users.iter().find(|u| u["name"] == user).unwrap_or_else(|| panic!("no user {user} in the kubeconfig"));
    entry["user"]["token"].as_str().expect("a token").to_owned()
}

/// Binds `user` to ClusterRole `role` in namespace `ns`.
pub fn bind(env: &Environment, ns: &str, user: &str, role: &str) {
    let (ok, out) = kubectl(
        env,
        &[
            "-n",
            ns,
            "create",
            "rolebinding",
            &format!("{user}-{role}"),
            &format!("--clusterrole={role}"),
            &format!("--user={user}"),
        ],
        None,
    );
    assert!(ok, "bind {user} to {role} in {ns}: {out}");
}

/// The port every operator of this test binary serves its conversion webhook
/// on (they share it, as replicas share a Service).
pub fn webhook_port() -> u16 {
    static PORT: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *PORT.get_or_init(|| slotkeeper_env::control_plane::free_port().expect("a free port"))
}

/// Installs the generated CRDs from deploy/crds, their conversion webhook at
/// this binary's operators, and waits until they are served.
pub fn install_crds(env: &Environment) {
    let url = slotkeeper_env::crds::webhook_url(webhook_port());
    let crds = slotkeeper_env::crds::with_webhook_url(&tools::repo_root(), &url).expect("deploy/crds reads");
    let (ok, out) = kubectl(env, &["apply", "--server-side", "-f", "-"], Some(&crds));
    assert!(ok, "kubectl apply of deploy/crds failed: {out}");
    let (ok, out) = kubectl(
        env,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/redisclusters.slotkeeper.io",
            "crd/redisoperations.slotkeeper.io",
        ],
        None,
    );
    assert!(ok, "CRD not established: {out}");
}
