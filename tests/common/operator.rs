//! Running the operator in end-to-end tests: as its ServiceAccount, with
//! exactly the RBAC in deploy/.

use slotkeeper_api::API_VERSION;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use slotkeeper_env::Environment;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_operator::api::{Phase, RedisCluster};

use super::*;

/// The operator of this test binary, started once: `slotkeeper run` with a
/// kubeconfig holding its ServiceAccount's token (so exactly deploy/'s RBAC).
pub fn shared_operator(env: &'static Environment) -> &'static Operator {
    static OPERATOR: std::sync::OnceLock<Operator> = std::sync::OnceLock::new();
    OPERATOR.get_or_init(|| start_operator(env, "slotkeeper-0"))
}

/// A running `slotkeeper run` and the port it serves HTTP on (/metrics,
/// /healthz, the console).
pub struct Operator {
    pub process: ManagedProcess,
    pub http_port: u16,
    /// A token RBAC lets `get` /metrics (the environment's administrator).
    pub metrics_token: String,
}

impl Operator {
    pub async fn metrics(&self) -> String {
        let auth = format!("Authorization: Bearer {}", self.metrics_token);
        let (status, _, body) = http_request(self.http_port, "GET", "/metrics", &[auth], None).await;
        assert_eq!(status, 200, "GET /metrics failed: {body}");
        body
    }
}

/// Installs CRDs, namespace and RBAC from deploy/ and starts an operator
/// replica acting as the `slotkeeper` ServiceAccount.
pub fn start_operator(env: &Environment, instance: &str) -> Operator {
    start_operator_with(env, instance, &[])
}

/// [`start_operator`] with extra environment variables (e.g. a failpoint).
pub fn start_operator_with(env: &Environment, instance: &str, vars: &[(&str, &str)]) -> Operator {
    install_crds(env);
    let operator = spawn_operator(env, instance, vars);
    wait_crds_converting(env);
    operator
}

/// Namespace and RBAC from deploy/ and an operator replica acting as the
/// `slotkeeper` ServiceAccount, whatever CRDs are installed.
pub fn spawn_operator(env: &Environment, instance: &str, vars: &[(&str, &str)]) -> Operator {
    spawn_operator_as(env, instance, "slotkeeper", &[], vars)
}

/// [`spawn_operator`] acting as `service_account` (of slotkeeper-system),
/// with `args` added to `slotkeeper run`'s.
pub fn spawn_operator_as(
    env: &Environment,
    instance: &str,
    service_account: &str,
    args: &[&str],
    vars: &[(&str, &str)],
) -> Operator {
    for manifest in
        ["deploy/00-namespace.yaml", "deploy/rbac.yaml", "deploy/console-rbac.yaml", "deploy/admission.yaml"]
    {
        let path = slotkeeper_env::tools::repo_root().join(manifest);
        let (ok, out) = kubectl(env, &["apply", "-f", path.to_str().unwrap()], None);
        assert!(ok, "{manifest}: {out}");
    }
    let dir = slotkeeper_env::tools::repo_root().join("target/e2e").join(env!("CARGO_CRATE_NAME"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join(format!("{instance}.kubeconfig"));
    env.service_account_kubeconfig("slotkeeper-system", service_account, &kubeconfig).unwrap();
    let http_port = slotkeeper_env::control_plane::free_port().unwrap();
    let log = dir.join(format!("{instance}.log"));
    // SLOTKEEPER_TEST_WRAPPER="heaptrack -o /tmp/op" runs the operator under a
    // profiler: the wrapper's words come first, then the operator's command.
    let wrapper = std::env::var("SLOTKEEPER_TEST_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut spec = match words.next() {
        Some(program) => ProcessSpec::new("slotkeeper", program, log).args(words).arg(env!("CARGO_BIN_EXE_slotkeeper")),
        None => ProcessSpec::new("slotkeeper", env!("CARGO_BIN_EXE_slotkeeper"), log),
    };
    spec = spec
        .args(["run", "--log-format", "json", "--instance", instance, "--kubeconfig"])
        .arg(&kubeconfig)
        .arg(format!("--http-addr=127.0.0.1:{http_port}"))
        .arg(format!("--webhook-addr=127.0.0.1:{}", webhook_port()))
        .arg(format!("--webhook-url={}", slotkeeper_env::crds::webhook_url(webhook_port())))
        .args(args.iter().copied());
    // SLOTKEEPER_TEST_LOG=<filter> makes the operators of a test run verbose.
    if let Ok(filter) = std::env::var("SLOTKEEPER_TEST_LOG") {
        spec = spec.env("RUST_LOG", &filter);
    }
    for (key, value) in vars {
        spec = spec.env(*key, *value);
    }
    let process = ManagedProcess::spawn(spec).expect("the operator starts");
    let metrics_token = user_token(env, slotkeeper_env::control_plane::ADMIN_USER);
    Operator { process, http_port, metrics_token }
}

/// Until a leader has pointed the CRDs' conversion at the webhook with its
/// CA: before that, reads and writes at `v1alpha1` fail. A bundle just set
/// takes the apiserver a moment to use (conversions failed for 0.9 s after
/// it here), so that moment is waited out too.
pub fn wait_crds_converting(env: &Environment) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut waited = false;
    for crd in ["redisclusters.slotkeeper.io", "redisoperations.slotkeeper.io"] {
        loop {
            let path = "jsonpath={.spec.conversion.webhook.clientConfig.caBundle}";
            let (ok, bundle) = kubectl(env, &["get", "crd", crd, "-o", path], None);
            if ok && !bundle.trim().is_empty() {
                break;
            }
            waited = true;
            assert!(std::time::Instant::now() < deadline, "no operator pointed {crd} at its webhook within 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    if waited {
        std::thread::sleep(Duration::from_secs(3));
    }
}

pub async fn wait_running(api: &Api<RedisCluster>, name: &str, timeout: Duration) -> RedisCluster {
    wait_until(&format!("RedisCluster {name} Running and Ready"), timeout, || async {
        let c = api.get(name).await.ok()?;
        let status = c.status.as_ref()?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (status.phase == Some(Phase::Running) && ready).then_some(c)
    })
    .await
}

/// Running and Ready for the current generation, with `masters` masters
/// and `pods` Redis nodes in status, and no reshard or spreading of masters
/// in progress.
pub async fn wait_settled(
    api: &Api<RedisCluster>,
    name: &str,
    masters: i32,
    pods: usize,
    timeout: Duration,
) -> RedisCluster {
    wait_until(&format!("RedisCluster {name} settled with {masters} masters and {pods} nodes"), timeout, || async {
        let c = api.get(name).await.ok()?;
        let status = c.status.as_ref()?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        let settled = status.phase == Some(Phase::Running)
            && ready
            && status.observed_generation == c.metadata.generation
            && status.ready_masters == masters
            && status.nodes.len() == pods
            && status.reshard.is_none()
            && !status.conditions.iter().any(|c| c.type_ == "Progressing" && c.reason == "SpreadingMasters");
        settled.then_some(c)
    })
    .await
}

/// The addresses of every Redis node in status.
pub fn node_ips(cluster: &RedisCluster) -> Vec<String> {
    cluster.status.as_ref().unwrap().nodes.iter().filter_map(|n| n.ip.clone()).collect()
}

/// The Pods status reports as masters.
pub fn master_pods(cluster: &RedisCluster) -> Vec<String> {
    let nodes = &cluster.status.as_ref().unwrap().nodes;
    nodes.iter().filter(|n| n.role.as_deref() == Some("master")).map(|n| n.pod.clone()).collect()
}

/// The slots of status-style ranges (`0-5460`, `7`).
pub fn slots_in(ranges: &[String]) -> std::collections::BTreeSet<u16> {
    ranges
        .iter()
        .flat_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            a.parse::<u16>().unwrap()..=b.parse::<u16>().unwrap()
        })
        .collect()
}

/// Applies a 7.0.15 RedisCluster with these counts.
pub fn apply_cluster(env: &Environment, ns: &str, name: &str, masters: i32, replicas: i32) {
    apply_cluster_spec(
        env,
        ns,
        name,
        &format!("masters: {masters}, replicasPerMaster: {replicas}, redis: {{version: 7.0.15}}"),
    );
}

/// Applies RedisCluster `name` with `spec`, the inside of a YAML flow
/// mapping (`masters: 3, version: 7.0.15, storage: {size: 1Gi}`).
pub fn apply_cluster_spec(env: &Environment, ns: &str, name: &str, spec: &str) {
    let manifest = format!(
        "apiVersion: {API_VERSION}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{{spec}}}\n"
    );
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&manifest));
    assert!(ok, "{out}");
}

/// Applies `count` clusters `c00`, `c01`, … of 3 masters (and any `extra`
/// manifests) in one `kubectl apply`, and waits until all are Running;
/// returns how long that took.
pub async fn create_clusters(env: &Environment, ns: &str, count: usize, extra: &str) -> Duration {
    let manifests: String = (0..count)
        .map(|i| format!("---\napiVersion: {API_VERSION}\nkind: RedisCluster\nmetadata: {{name: c{i:02}, namespace: {ns}}}\nspec: {{masters: 3, redis: {{version: 7.0.15}}}}\n"))
        .collect();
    let started = std::time::Instant::now();
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&format!("{manifests}{extra}")));
    assert!(ok, "{out}");
    let api: Api<RedisCluster> = Api::namespaced(env.client().await.unwrap(), ns);
    wait_until(&format!("{count} clusters Running"), Duration::from_secs(900), || async {
        let list = api.list(&Default::default()).await.ok()?;
        let running = list
            .items
            .iter()
            .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with('c')))
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running))
            .count();
        (running == count).then_some(())
    })
    .await;
    started.elapsed()
}

pub async fn password(client: &kube::Client, ns: &str, name: &str) -> String {
    let secret = Api::<Secret>::namespaced(client.clone(), ns).get(&format!("{name}-password")).await.unwrap();
    String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap()
}

pub fn redis_cli_check(ip: &str, password: &str) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-a", password, "--no-auth-warning", "--cluster", "check", &format!("{ip}:6379")])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with extra header lines (each
/// `Name: value`) and a form body; returns (status, head, body).
pub async fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[String],
    form: Option<&str>,
) -> (u16, String, String) {
    http_request_to("127.0.0.1", port, method, path, headers, form).await
}

/// [`http_request`] to `host` (e.g. a Pod's address).
pub async fn http_request_to(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[String],
    form: Option<&str>,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect((host, port)).await.expect("console listens");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n");
    for header in headers {
        request += &format!("{header}\r\n");
    }
    if let Some(form) = form {
        request += &format!("Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n", form.len());
    }
    request += "\r\n";
    request += form.unwrap_or_default();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// Signs in to the console at `host:port` with a bearer token, as a form
/// post from its own page; returns the `Cookie:` header of the session.
pub async fn console_session(host: &str, port: u16, token: &str) -> String {
    let (status, head, _) = http_request_to(
        host,
        port,
        "POST",
        "/actions/sign-in",
        &["Sec-Fetch-Site: same-origin".into(), "Accept: text/html".into()],
        Some(&format!("token={token}")),
    )
    .await;
    assert_eq!(status, 302, "{head}");
    let cookie = head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with("slotkeeper_session="))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie");
    format!("Cookie: {cookie}")
}

/// GET on 127.0.0.1:`port`; (2xx, body).
pub async fn http_get(port: u16, path: &str) -> (bool, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (false, format!("nothing listens on {port}"));
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let ok = text.starts_with("HTTP/1.1 2");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (ok, body)
}
