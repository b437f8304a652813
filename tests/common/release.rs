//! Slotkeeper's own upgrade, end to end: the previous release installed from
//! its commit's deploy/ and run as Pods by the node agent (its image mapped
//! to the cached build of that commit), and this checkout's deploy/ as the
//! new release (its image mapped to this build).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};
use slotkeeper_env::{Environment, tools};

use super::upgrade::*;
use super::*;

pub const PREVIOUS_IMAGE: &str = "slotkeeper:0.1.0";
pub const OPERATOR_NAMESPACE: &str = "slotkeeper-system";
pub const OPERATOR_USER: &str = "system:serviceaccount:slotkeeper-system:slotkeeper";

/// The new release's operator image, as this checkout's deploy/ names it.
pub fn next_image() -> String {
    let text = std::fs::read_to_string(tools::repo_root().join("deploy/operator.yaml")).unwrap();
    deployment_image(&text)
}

fn deployment_image(operator_yaml: &str) -> String {
    documents(operator_yaml)
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d.pointer("/spec/template/spec/containers/0/image")?.as_str().map(String::from))
        .expect("operator.yaml has a Deployment with an image")
}

/// The new release's plan object: `to-0-2-0` for `0.2.0`.
pub fn next_plan_name() -> String {
    let image = next_image();
    let release = image.rsplit(':').next().unwrap();
    format!("to-{}", release.replace('.', "-"))
}

/// The build of the previous release (tests/previous-release.sh made it).
pub fn previous_binary() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
    let path = cache.join("slotkeeper/releases").join(previous_release_commit()).join("slotkeeper");
    assert!(path.exists(), "the previous release is not built at {}: run tests/previous-release.sh", path.display());
    path
}

/// This binary's environment, its node agent running both releases' images.
pub fn release_env() -> &'static Environment {
    shared_env_with(|| {
        let entry = |image: &str, binary: &Path| json!({"pattern": image, "entrypoint": ["slotkeeper"], "binaries": {"slotkeeper": binary}});
        vec![
            entry(PREVIOUS_IMAGE, &previous_binary()),
            entry(&next_image(), Path::new(env!("CARGO_BIN_EXE_slotkeeper"))),
        ]
    })
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|d: &Value| !d.is_null())
        .collect()
}

/// operator.yaml as this environment can run it. Pods share the machine's
/// network here, so each replica listens at its own Pod address rather than
/// 0.0.0.0 (the previous release's manifest binds 0.0.0.0:8080, which two
/// replicas on one network cannot), and the webhook (`webhook`: the new
/// release) at the loopback URL the CRDs point at: EndpointSlices refuse
/// 127.0.0.0/8, so a Service cannot route to a Pod here.
pub fn runnable_operator(yaml: &str, webhook: bool) -> String {
    let mut out = Vec::new();
    for mut document in documents(yaml) {
        if document["kind"] == "Deployment" {
            let container = document.pointer_mut("/spec/template/spec/containers/0").expect("a container");
            for arg in container["args"].as_array_mut().expect("args") {
                if arg.as_str().is_some_and(|a| a.starts_with("--http-addr=0.0.0.0:")) {
                    *arg = json!("--http-addr=$(POD_IP):8080");
                }
            }
            let env = container["env"].as_array_mut().expect("env");
            if !env.iter().any(|e| e["name"] == "POD_IP") {
                env.insert(0, json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
            }
            if webhook {
                let port = webhook_port();
                env.push(json!({"name": "SLOTKEEPER_WEBHOOK_ADDR", "value": format!("127.0.0.1:{port}")}));
                env.push(json!({"name": "SLOTKEEPER_WEBHOOK_URL", "value": slotkeeper_env::crds::webhook_url(port)}));
            }
        }
        out.push(serde_norway::to_string(&document).unwrap());
    }
    out.join("---\n")
}

/// The previous release as its commit's deploy/ installs it, its operator
/// Deployment rolled out.
pub fn install_previous(env: &Environment) {
    for file in
        ["deploy/00-namespace.yaml", "deploy/crds/slotkeeper.io.yaml", "deploy/rbac.yaml", "deploy/console-rbac.yaml"]
    {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&previous_release_file(file)));
        assert!(ok, "previous {file}: {out}");
    }
    let (ok, out) = kubectl(env, &["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
    assert!(ok, "{out}");
    let operator = runnable_operator(&previous_release_file("deploy/operator.yaml"), false);
    assert_eq!(deployment_image(&operator), PREVIOUS_IMAGE, "the previous release's image");
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&operator));
    assert!(ok, "previous operator.yaml: {out}");
    rolled_out(env, "slotkeeper");
}

pub fn rolled_out(env: &Environment, deployment: &str) {
    let (ok, out) = kubectl(
        env,
        &["-n", OPERATOR_NAMESPACE, "rollout", "status", &format!("deployment/{deployment}"), "--timeout=180s"],
        None,
    );
    assert!(ok, "deployment {deployment} did not roll out: {out}");
}

/// The new release's manifests (this checkout's deploy/), runnable here.
pub fn next_manifests() -> tempfile::TempDir {
    let root = tools::repo_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("crds")).unwrap();
    for file in ["00-namespace.yaml", "rbac.yaml", "console-rbac.yaml", "admission.yaml"] {
        std::fs::copy(root.join("deploy").join(file), dir.path().join(file)).unwrap();
    }
    let url = slotkeeper_env::crds::webhook_url(webhook_port());
    let crds = slotkeeper_env::crds::with_webhook_url(&root, &url).expect("deploy/crds reads");
    std::fs::write(dir.path().join("crds/slotkeeper.io.yaml"), crds).unwrap();
    let operator = std::fs::read_to_string(root.join("deploy/operator.yaml")).unwrap();
    std::fs::write(dir.path().join("operator.yaml"), runnable_operator(&operator, true)).unwrap();
    dir
}

/// `slotkeeper upgrade <args>` as the admin; (exit code, stdout + stderr).
pub fn upgrade_cli(env: &Environment, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slotkeeper"))
        .arg("upgrade")
        .args(args)
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
        .output()
        .unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// GET of an API path as JSON, or why it failed.
pub fn raw(env: &Environment, path: &str) -> Result<Value, String> {
    raw_with_warnings(env, path).map(|(value, _)| value)
}

/// [`raw`] and the warnings kubectl printed after the body (for example a
/// deprecated version's).
pub fn raw_with_warnings(env: &Environment, path: &str) -> Result<(Value, Vec<String>), String> {
    let (ok, out) = kubectl(env, &["get", "--raw", path], None);
    if !ok {
        return Err(out);
    }
    let mut stream = serde_json::Deserializer::from_str(&out).into_iter::<Value>();
    let value = stream.next().ok_or("no body")?.map_err(|e| format!("{e}: {out}"))?;
    let rest = &out[stream.byte_offset()..];
    let warnings = rest.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    Ok((value, warnings))
}

/// A cluster's phase read at API `version`.
pub fn phase_at(env: &Environment, version: &str, ns: &str, name: &str) -> Option<String> {
    let object = raw(env, &format!("/apis/slotkeeper.io/{version}/namespaces/{ns}/redisclusters/{name}")).ok()?;
    object["status"]["phase"].as_str().map(String::from)
}

pub async fn wait_phase(env: &Environment, version: &str, ns: &str, name: &str, phase: &str) {
    wait_until(&format!("RedisCluster {ns}/{name} {phase} (read at {version})"), Duration::from_secs(300), || async {
        (phase_at(env, version, ns, name).as_deref() == Some(phase)).then_some(())
    })
    .await;
}

/// What must not change about a Redis Pod through Slotkeeper's upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisPodState {
    pub uid: String,
    pub restarts: i32,
    pub role: String,
}

/// Every Redis Pod of these clusters (`(namespace, cluster)`), by
/// `namespace/pod`, its role as Redis reports it.
pub async fn redis_pods(client: &kube::Client, clusters: &[(&str, &str)]) -> BTreeMap<String, RedisPodState> {
    let mut states = BTreeMap::new();
    for (ns, cluster) in clusters {
        let password = operator::password(client, ns, cluster).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let list = pods.list(&ListParams::default().labels(&format!("slotkeeper.io/cluster={cluster}"))).await.unwrap();
        for pod in list.items {
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            let url = format!("redis://:{password}@{}:6379/", pod_ip(&pod));
            let mut connection =
                redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.expect("Redis answers");
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut connection).await.unwrap();
            let role = info.lines().find_map(|l| l.strip_prefix("role:")).unwrap_or("?").trim().to_string();
            states.insert(
                format!("{ns}/{}", pod.name_any()),
                RedisPodState { uid: pod.uid().unwrap_or_default(), restarts, role },
            );
        }
    }
    states
}

/// The operator's Pods now (`name` → image).
pub async fn operator_pods(client: &kube::Client) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let list = pods.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .map(|p| {
            let image = p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone());
            (p.name_any(), image.unwrap_or_default())
        })
        .collect()
}

/// The output of every container of an operator Pod named `pod` (all its
/// incarnations), from the node agent's state directory.
pub fn operator_pod_logs(env: &Environment, pod: &str) -> String {
    let dir = tools::repo_root().join("target/e2e").join(env!("CARGO_CRATE_NAME")).join("node-agent/pods");
    let _ = env;
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{OPERATOR_NAMESPACE}_{pod}_")) {
            text += &std::fs::read_to_string(entry.path().join("containers/slotkeeper/output.log")).unwrap_or_default();
        }
    }
    text
}

/// The holder of a Lease in the operator's namespace.
pub fn lease_holder(env: &Environment, lease: &str) -> Option<String> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{lease}");
    raw(env, &path).ok()?["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(String::from)
}

/// The plan object, or why it cannot be read.
pub fn plan_object(env: &Environment, name: &str) -> Result<Value, String> {
    raw(env, &format!("/apis/slotkeeper.io/v1/slotkeeperupgrades/{name}"))
}

/// `(name, state)` of each step of a plan's status.
pub fn steps(plan: &Value) -> Vec<(String, String)> {
    plan["status"]["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| (s["name"].as_str().unwrap_or("").to_string(), s["state"].as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

pub fn condition_true(plan: &Value, type_: &str) -> bool {
    plan["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// storedVersions of one of our CRDs.
pub fn stored_versions(env: &Environment, crd: &str) -> Vec<String> {
    let crd = raw(env, &format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")).unwrap();
    crd["status"]["storedVersions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}
