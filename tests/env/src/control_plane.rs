//! A real Kubernetes control plane on loopback: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, built from the official Go
//! modules, each on free ports in one temporary directory.
//!
//! Identities come from a static token file: `admin` (system:masters), one for
//! each control-plane component and the node agent, and non-admin test users
//! (`alice`, `bob`) with no rights until a test binds some.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::pki::{Pki, PkiError};
use crate::process::{ManagedProcess, ProcessError, ProcessSpec};
use crate::tools;

/// Users without any rights until a test grants them some.
pub const TEST_USERS: [&str; 2] = ["alice", "bob"];
/// The user with `system:masters`.
pub const ADMIN_USER: &str = "admin";
/// The identity the node agent acts as.
pub const NODE_AGENT_USER: &str = "slotkeeper:node-agent";

const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("{0}")]
    MissingBinary(String),
    #[error("cannot prepare {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("cannot build a client from {kubeconfig}: {message}")]
    Client { kubeconfig: PathBuf, message: String },
    #[error("{component} failed: {reason}\n--- last lines of {log} ---\n{tail}")]
    Component { component: String, reason: String, log: PathBuf, tail: String },
}

/// Tuning of the control plane; the defaults suit tests.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// How long a node may miss heartbeats before the node-lifecycle controller
    /// marks it unknown (kube's default is 40-50 s; tests want it short).
    pub node_monitor_grace_period: Duration,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self { node_monitor_grace_period: Duration::from_secs(16) }
    }
}

/// The running control plane. Dropping it stops every component.
pub struct ControlPlane {
    // Stopped in reverse start order on drop: the components before etcd.
    processes: Vec<ManagedProcess>,
    dir: PathBuf,
    kubeconfig: PathBuf,
    audit_log: PathBuf,
    server: String,
    /// etcd's client URL (plain HTTP on loopback).
    etcd: String,
    pki: Pki,
    /// From the call to `start` to the apiserver's `/readyz` passing.
    ready_after: Duration,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ControlPlaneError + '_ {
    move |source| ControlPlaneError::Io { path: path.to_owned(), source }
}

fn write(path: &Path, contents: &str) -> Result<(), ControlPlaneError> {
    std::fs::write(path, contents).map_err(io_err(path))
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler in
    /// `dir` and waits until the apiserver's `/readyz` passes and the controller
    /// manager has created the `default` ServiceAccount.
    pub async fn start(dir: &Path, options: &ControlPlaneOptions) -> Result<Self, ControlPlaneError> {
        let started = Instant::now();
        let bin = |name: &str| tools::control_plane_binary(name).map_err(ControlPlaneError::MissingBinary);
        let (etcd_bin, apiserver_bin, kcm_bin, scheduler_bin) =
            (bin("etcd")?, bin("kube-apiserver")?, bin("kube-controller-manager")?, bin("kube-scheduler")?);
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let pki = Pki::generate(dir)?;
        let tokens = Tokens::generate();
        let token_file = dir.join("tokens.csv");
        write(&token_file, &tokens.csv())?;
        let audit_policy = dir.join("audit-policy.yaml");
        write(&audit_policy, AUDIT_POLICY)?;

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let apiserver_port = free_port()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        let kubeconfig = dir.join("kubeconfig");
        write(&kubeconfig, &kubeconfig_yaml(&server, &pki.ca_pem, &tokens))?;
        for (component, user) in
            [("kube-controller-manager", "system:kube-controller-manager"), ("kube-scheduler", "system:kube-scheduler")]
        {
            let path = dir.join(format!("{component}.kubeconfig"));
            write(&path, &single_user_kubeconfig_yaml(&server, &pki.ca_pem, user, tokens.token_of(user)))?;
        }

        let mut plane = ControlPlane {
            processes: Vec::new(),
            dir: dir.to_owned(),
            kubeconfig,
            audit_log: dir.join("audit.log"),
            server,
            etcd: format!("http://127.0.0.1:{etcd_client}"),
            pki,
            ready_after: Duration::ZERO,
        };

        let etcd_data = dir.join("etcd");
        plane.launch(ProcessSpec::new("etcd", etcd_bin, dir.join("etcd.log")).args([
            format!("--data-dir={}", etcd_data.display()),
            "--name=default".into(),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
            // Test data is disposable: skip fsync so etcd does not dominate test time.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ]))?;

        let sa_key = plane.pki.service_account_key.display().to_string();
        plane.launch(ProcessSpec::new("kube-apiserver", apiserver_bin, dir.join("kube-apiserver.log")).args([
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={apiserver_port}"),
            format!("--tls-cert-file={}", plane.pki.serving_cert.display()),
            format!("--tls-private-key-file={}", plane.pki.serving_key.display()),
            format!("--client-ca-file={}", plane.pki.ca_cert.display()),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={}", plane.pki.service_account_public_key.display()),
            format!("--service-account-signing-key-file={sa_key}"),
            format!("--api-audiences={SERVICE_ACCOUNT_ISSUER}"),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", token_file.display()),
            format!("--audit-log-path={}", plane.audit_log.display()),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            // Endpoints may not hold loopback addresses, so the `kubernetes`
            // Service's endpoints are not maintained; nothing here routes to it.
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            "-v=1".into(),
        ]))?;
        plane.wait_until_ready().await?;
        plane.ready_after = started.elapsed();

        let grace = format!("--node-monitor-grace-period={}s", options.node_monitor_grace_period.as_secs());
        let kcm_kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        plane.launch(
            ProcessSpec::new("kube-controller-manager", kcm_bin, dir.join("kube-controller-manager.log")).args([
                format!("--kubeconfig={}", kcm_kubeconfig.display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--controllers=*".into(),
                "--use-service-account-credentials=false".into(),
                format!("--service-account-private-key-file={sa_key}"),
                format!("--root-ca-file={}", plane.pki.ca_cert.display()),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                grace,
                "--node-monitor-period=2s".into(),
                "-v=1".into(),
            ]),
        )?;
        let scheduler_kubeconfig = dir.join("kube-scheduler.kubeconfig");
        plane.launch(ProcessSpec::new("kube-scheduler", scheduler_bin, dir.join("kube-scheduler.log")).args([
            format!("--kubeconfig={}", scheduler_kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "-v=1".into(),
        ]))?;
        plane.wait_for_controllers().await?;
        Ok(plane)
    }

    fn launch(&mut self, spec: ProcessSpec) -> Result<(), ControlPlaneError> {
        self.processes.push(ManagedProcess::spawn(spec)?);
        Ok(())
    }

    /// Fails with the component's name and log tail if any component exited.
    pub fn check_alive(&mut self) -> Result<(), ControlPlaneError> {
        for process in &mut self.processes {
            if let Some(status) = process.exit_status() {
                return Err(ControlPlaneError::Component {
                    component: process.name().to_owned(),
                    reason: format!("exited with {status}"),
                    log: process.log_path().to_owned(),
                    tail: process.log_tail(30),
                });
            }
        }
        Ok(())
    }

    async fn wait_until_ready(&mut self) -> Result<(), ControlPlaneError> {
        let client = self.client().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            let request = http::Request::get("/readyz").body(Vec::new()).expect("static request");
            let last = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(self
                    .component_error("kube-apiserver", format!("/readyz did not pass in {READY_TIMEOUT:?}: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The controller manager is working once its service-account controller has
    /// created `default/default`; the scheduler has no such mark, so it is only
    /// checked to be running.
    async fn wait_for_controllers(&mut self) -> Result<(), ControlPlaneError> {
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.client().await?, "default");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if accounts.get_opt("default").await.ok().flatten().is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.component_error(
                    "kube-controller-manager",
                    "did not create the default ServiceAccount in time".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn component_error(&self, component: &str, reason: String) -> ControlPlaneError {
        let process = self.processes.iter().find(|p| p.name() == component);
        ControlPlaneError::Component {
            component: component.to_owned(),
            reason,
            log: process.map(|p| p.log_path().to_owned()).unwrap_or_default(),
            tail: process.map(|p| p.log_tail(30)).unwrap_or_default(),
        }
    }

    /// A client acting as `admin`.
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        self.client_as(ADMIN_USER).await
    }

    /// A client acting as one of the token-file users (see [`TEST_USERS`]).
    pub async fn client_as(&self, user: &str) -> Result<Client, ControlPlaneError> {
        let err = |message: String| ControlPlaneError::Client { kubeconfig: self.kubeconfig.clone(), message };
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| err(e.to_string()))?;
        let options = KubeConfigOptions { context: Some(user.to_owned()), ..Default::default() };
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| err(e.to_string()))?;
        Client::try_from(config).map_err(|e| err(e.to_string()))
    }

    /// Kubeconfig with one context per user; `admin` is the current one.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver's audit log (JSON lines, `Metadata` level).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// etcd's client URL, for reading what the apiserver stored.
    pub fn etcd_endpoint(&self) -> &str {
        &self.etcd
    }

    /// The apiserver's log (conversion webhook failures show there).
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.join("kube-apiserver.log")
    }

    /// Time from the call to `start` to `/readyz` passing.
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops kube-controller-manager (SIGSTOP) or lets it go on (SIGCONT):
    /// meanwhile its controllers, the storage migrator among them, do
    /// nothing. It runs without leader election, so it resumes as it was.
    pub fn pause_controller_manager(&self, paused: bool) {
        self.pause("kube-controller-manager", paused);
    }

    /// Stops kube-apiserver (SIGSTOP) or lets it go on (SIGCONT): meanwhile
    /// the control plane is unreachable (connections hang, as behind a
    /// partition), and no Lease is renewed.
    pub fn pause_apiserver(&self, paused: bool) {
        self.pause("kube-apiserver", paused);
    }

    fn pause(&self, component: &str, paused: bool) {
        let process = self.processes.iter().find(|p| p.name() == component);
        let pid = process.unwrap_or_else(|| panic!("{component} runs")).pid().to_string();
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill").args([signal, &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid} failed");
    }

    /// PIDs of the running components, for leak checks.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(ManagedProcess::pid).collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
    }
}

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

/// One bearer token per identity, random per environment.
struct Tokens {
    entries: Vec<(String, String, &'static str)>, // (token, user, groups)
}

impl Tokens {
    fn generate() -> Self {
        let masters = "system:masters";
        let mut users = vec![
            (ADMIN_USER, masters),
            ("system:kube-controller-manager", masters),
            ("system:kube-scheduler", masters),
            (NODE_AGENT_USER, masters),
        ];
        users.extend(TEST_USERS.iter().map(|u| (*u, "")));
        Self { entries: users.into_iter().map(|(user, groups)| (random_token(), user.to_owned(), groups)).collect() }
    }

    fn csv(&self) -> String {
        self.entries.iter().map(|(token, user, groups)| format!("{token},{user},{user},\"{groups}\"\n")).collect()
    }

    fn token_of(&self, user: &str) -> &str {
        self.entries.iter().find(|(_, u, _)| u == user).map(|(t, _, _)| t.as_str()).expect("known user")
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 24];
    use std::io::Read;
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).expect("/dev/urandom is readable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, tokens: &Tokens) -> String {
    let users: Vec<(&str, &str)> =
        tokens.entries.iter().map(|(token, user, _)| (user.as_str(), token.as_str())).collect();
    kubeconfig_for(server, ca_pem, &users, ADMIN_USER)
}

fn single_user_kubeconfig_yaml(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    kubeconfig_for(server, ca_pem, &[(user, token)], user)
}

/// A kubeconfig with one context per (user, token), named after the user.
fn kubeconfig_for(server: &str, ca_pem: &str, users: &[(&str, &str)], current: &str) -> String {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": base64(ca_pem)}}],
        "users": users.iter().map(|(u, t)| serde_json::json!({"name": u, "user": {"token": t}})).collect::<Vec<_>>(),
        "contexts": users.iter().map(|(u, _)| serde_json::json!({"name": u, "context": {"cluster": "local", "user": u, "namespace": "default"}})).collect::<Vec<_>>(),
        "current-context": current,
    });
    // JSON is YAML; kubectl and kube-rs read it as such.
    serde_json::to_string_pretty(&config).expect("static JSON")
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A port that was free on 127.0.0.1 a moment ago.
pub fn free_port() -> Result<u16, ControlPlaneError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io_err(Path::new("127.0.0.1:0")))?;
    Ok(listener.local_addr().map_err(io_err(Path::new("127.0.0.1:0")))?.port())
}
