//! A whole environment: control plane + node agent + Nodes Ready, with the
//! fault-injection calls tests use.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use nix::fcntl::{Flock, FlockArg};

use crate::control_client;
use crate::control_plane::{ControlPlane, ControlPlaneError, ControlPlaneOptions, NODE_AGENT_USER, free_port};
use crate::process::{ManagedProcess, ProcessSpec};
use crate::tools;

#[derive(Debug, Clone)]
pub struct EnvironmentOptions {
    /// Node names; the agent runs all of them.
    pub nodes: Vec<String>,
    /// Where state lives; a fresh temporary directory when `None`. An existing
    /// directory is wiped first, so a run after a crash starts clean.
    pub dir: Option<PathBuf>,
    pub control_plane: ControlPlaneOptions,
    /// Image table entries added to tests/env/images.json for this
    /// environment's node agent (e.g. an operator release's binary).
    pub extra_images: Vec<serde_json::Value>,
}

impl Default for EnvironmentOptions {
    fn default() -> Self {
        Self {
            nodes: (1..=3).map(|i| format!("node-{i}")).collect(),
            dir: None,
            control_plane: Default::default(),
            extra_images: Vec::new(),
        }
    }
}

/// The default image table with `extra` entries first, written to `path`.
fn write_image_table(path: &Path, extra: &[serde_json::Value]) -> Result<(), ControlPlaneError> {
    let base_path = tools::repo_root().join("tests/env/images.json");
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ControlPlaneError::Io { path, source }
    };
    let text = std::fs::read_to_string(&base_path).map_err(io(&base_path))?;
    let mut table: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ControlPlaneError::Io { path: base_path.clone(), source: std::io::Error::other(e) })?;
    let images = table["images"].as_array_mut().expect("images.json has an images list");
    images.splice(0..0, extra.iter().cloned());
    std::fs::write(path, serde_json::to_vec_pretty(&table).expect("JSON")).map_err(io(path))
}

pub struct Environment {
    // Field order is drop order: the agent (and so every Pod) before the control plane.
    agent: ManagedProcess,
    control_plane: ControlPlane,
    control_port: u16,
    nodes: Vec<String>,
    _network_lock: Flock<File>,
    _temp: Option<tempfile::TempDir>,
}

impl Environment {
    pub async fn start(options: EnvironmentOptions) -> Result<Self, ControlPlaneError> {
        let (dir, temp) = match &options.dir {
            Some(dir) => {
                if dir.exists() {
                    std::fs::remove_dir_all(dir)
                        .map_err(|source| ControlPlaneError::Io { path: dir.clone(), source })?;
                }
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("slotkeeper-env-")
                    .tempdir()
                    .map_err(|source| ControlPlaneError::Io { path: std::env::temp_dir(), source })?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        let agent_bin = tools::workspace_binary("slotkeeper-node-agent").map_err(ControlPlaneError::MissingBinary)?;
        let (network_block, network_lock) = lock_network_block()?;
        let control_plane = ControlPlane::start(&dir.join("control-plane"), &options.control_plane).await?;
        let control_port = free_port()?;
        let agent_dir = dir.join("node-agent");
        std::fs::create_dir_all(&agent_dir)
            .map_err(|source| ControlPlaneError::Io { path: agent_dir.clone(), source })?;
        let images = dir.join("images.json");
        write_image_table(&images, &options.extra_images)?;
        let agent = ManagedProcess::spawn(
            ProcessSpec::new("slotkeeper-node-agent", agent_bin, dir.join("node-agent.log"))
                .arg(format!("--images={}", images.display()))
                .arg(format!("--kubeconfig={}", control_plane.kubeconfig().display()))
                .arg(format!("--context={NODE_AGENT_USER}"))
                .arg(format!("--nodes={}", options.nodes.join(",")))
                .arg(format!("--state-dir={}", agent_dir.display()))
                .arg(format!("--network-block={network_block}"))
                .arg(format!("--control-port={control_port}")),
        )?;
        let mut env = Environment {
            agent,
            control_plane,
            control_port,
            nodes: options.nodes.clone(),
            _network_lock: network_lock,
            _temp: temp,
        };
        env.wait_for_nodes().await?;
        Ok(env)
    }

    async fn wait_for_nodes(&mut self) -> Result<(), ControlPlaneError> {
        let api: Api<Node> = Api::all(self.client().await?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.agent.exit_status() {
                return Err(self.agent_error(format!("exited with {status}")));
            }
            self.control_plane.check_alive()?;
            let ready = api
                .list(&Default::default())
                .await
                .map(|nodes| nodes.items.iter().filter(|n| node_ready(n) == Some(true)).count());
            if ready.as_ref().is_ok_and(|r| *r == self.nodes.len()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.agent_error(format!("Nodes not Ready after 60 s ({ready:?} ready)")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn agent_error(&self, reason: String) -> ControlPlaneError {
        ControlPlaneError::Component {
            component: "slotkeeper-node-agent".into(),
            reason,
            log: self.agent.log_path().to_owned(),
            tail: self.agent.log_tail(30),
        }
    }

    /// A new client acting as `admin`. Clients are bound to the async runtime
    /// they are first used on, so each test makes its own.
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        self.control_plane.client().await
    }

    /// A client acting as a token-file user, such as [`crate::TEST_USERS`].
    pub async fn client_as(&self, user: &str) -> Result<Client, ControlPlaneError> {
        self.control_plane.client_as(user).await
    }

    pub fn kubeconfig(&self) -> &Path {
        self.control_plane.kubeconfig()
    }

    pub fn audit_log(&self) -> &Path {
        self.control_plane.audit_log()
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// PIDs of the control plane and the agent (not of Pods).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = self.control_plane.pids();
        pids.push(self.agent.pid());
        pids
    }

    /// The main process id of each running container of a Pod.
    pub async fn pod_processes(&self, namespace: &str, pod: &str) -> Result<BTreeMap<String, u32>, String> {
        let body = control_client::call(self.control_port, "GET", &format!("/pods/{namespace}/{pod}")).await?;
        let value: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        serde_json::from_value(value["containers"].clone()).map_err(|e| e.to_string())
    }

    /// Kills a container's process (SIGKILL), as a crash would.
    pub async fn crash_container(&self, namespace: &str, pod: &str, container: &str) -> Result<(), String> {
        control_client::call(self.control_port, "POST", &format!("/pods/{namespace}/{pod}/containers/{container}/kill"))
            .await
            .map(drop)
    }

    /// SIGSTOP every container of the Pod.
    pub async fn freeze_pod(&self, namespace: &str, pod: &str) -> Result<(), String> {
        control_client::call(self.control_port, "POST", &format!("/pods/{namespace}/{pod}/freeze")).await.map(drop)
    }

    /// SIGCONT every container of the Pod.
    pub async fn thaw_pod(&self, namespace: &str, pod: &str) -> Result<(), String> {
        control_client::call(self.control_port, "POST", &format!("/pods/{namespace}/{pod}/thaw")).await.map(drop)
    }

    /// The Node goes down: its processes die, it reports `Ready=False` and its
    /// heartbeats stop, so the node-lifecycle controller takes over.
    pub async fn stop_node(&self, node: &str) -> Result<(), String> {
        control_client::call(self.control_port, "POST", &format!("/nodes/{node}/stop")).await.map(drop)
    }

    pub async fn start_node(&self, node: &str) -> Result<(), String> {
        control_client::call(self.control_port, "POST", &format!("/nodes/{node}/start")).await.map(drop)
    }
}

/// The Node's Ready condition, if it has one.
pub fn node_ready(node: &Node) -> Option<bool> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status == "True")
}

/// Picks a free /16 of 127.0.0.0/8 for Pod addresses, held with a file lock
/// for the environment's lifetime (or a test's own servers) so concurrent
/// users never overlap.
pub fn lock_network_block() -> Result<(u8, Flock<File>), ControlPlaneError> {
    let start = (std::process::id() % 254) as u8;
    for offset in 0..254u8 {
        let block = 1 + (start.wrapping_add(offset) % 254);
        let path = std::env::temp_dir().join(format!("slotkeeper-net-127.{block}.lock"));
        let file = File::create(&path).map_err(|source| ControlPlaneError::Io { path: path.clone(), source })?;
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            return Ok((block, lock));
        }
    }
    Err(ControlPlaneError::Io {
        path: std::env::temp_dir(),
        source: std::io::Error::other("every 127.X.0.0/16 pod network block is in use"),
    })
}

impl Environment {
    /// Runs the real `kubectl` against this environment as admin; returns
    /// (success, stdout and stderr).
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write as _;
        let kubectl = match tools::control_plane_binary("kubectl") {
            Ok(path) => path,
            Err(e) => return (false, e),
        };
        let child = std::process::Command::new(kubectl)
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => return (false, format!("cannot run kubectl: {e}")),
        };
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(input.as_bytes());
        }
        drop(child.stdin.take());
        match child.wait_with_output() {
            Ok(out) => (
                out.status.success(),
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            ),
            Err(e) => (false, format!("kubectl failed: {e}")),
        }
    }

    /// Runs the real `etcdctl` against this environment's etcd; returns
    /// (success, stdout and stderr).
    pub fn etcdctl(&self, args: &[&str]) -> (bool, String) {
        let etcdctl = match tools::control_plane_binary("etcdctl") {
            Ok(path) => path,
            Err(e) => return (false, e),
        };
        let endpoint = format!("--endpoints={}", self.control_plane().etcd_endpoint());
        match std::process::Command::new(etcdctl).arg(endpoint).args(args).output() {
            Ok(out) => (
                out.status.success(),
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            ),
            Err(e) => (false, format!("etcdctl failed: {e}")),
        }
    }

    /// Writes a kubeconfig at `path` that acts as ServiceAccount
    /// `namespace/name`, with a token from the TokenRequest API.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str, path: &Path) -> Result<(), String> {
        let (ok, token) = self.kubectl(&["-n", namespace, "create", "token", name, "--duration=24h"], None);
        if !ok {
            return Err(format!("cannot get a token for {namespace}/{name}: {token}"));
        }
        let admin: serde_json::Value = std::fs::read_to_string(self.kubeconfig())
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .ok_or("cannot read the admin kubeconfig")?;
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": name, "user": {"token": token.trim()}}],
            "contexts": [{"name": name, "context": {"cluster": "local", "user": name, "namespace": namespace}}],
            "current-context": name,
        });
        std::fs::write(path, config.to_string()).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}
