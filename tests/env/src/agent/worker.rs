//! One task per Pod bound to one of our Nodes, doing what a kubelet does for
//! it: give it an address and its volumes, run its containers, probe them,
//! restart them with back-off, report status, and on deletion stop them
//! gracefully (SIGTERM, grace period, SIGKILL) before removing the object.
//!
//! The loop polls every [`TICK`]; with a few dozen Pods this costs nothing and
//! keeps every state transition in one place.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::container::Launch;
use super::expand::expand;
use super::probes::{ProbeTarget, ProbeTracker};
use super::spec::{self, Mount};
use super::{AgentContext, PodHandle};

const TICK: Duration = Duration::from_millis(100);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(20);
/// A container that ran this long without exiting starts its back-off afresh.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
const SETUP_RETRY: Duration = Duration::from_secs(1);
/// A worker never waits longer than this on one API call: a stuck request is
/// abandoned and the next tick tries again.
const API_TIMEOUT: Duration = Duration::from_secs(10);

enum State {
    Waiting { reason: String, message: Option<String>, retry_at: Instant },
    Running { child: tokio::process::Child, pid: u32, started_at: Time, since: Instant },
    Terminated { exit_code: i32, signal: Option<i32>, reason: String, started_at: Time, finished_at: Time },
}

struct ContainerRuntime {
    spec: Container,
    state: State,
    restart_count: i32,
    last_termination: Option<Value>,
    backoff: Duration,
    launch: Option<Launch>,
    readiness: Option<ProbeTracker>,
    liveness: Option<ProbeTracker>,
    startup: Option<ProbeTracker>,
    ready: bool,
    started: bool,
}

pub struct PodWorker {
    ctx: Arc<AgentContext>,
    pod_rx: watch::Receiver<Option<Pod>>,
    handle: Arc<PodHandle>,
    pod_dir: PathBuf,
    ip: Option<Ipv4Addr>,
    volumes: Option<HashMap<String, PathBuf>>,
    setup_error: Option<String>,
    setup_retry_at: Instant,
    containers: Vec<ContainerRuntime>,
    start_time: Time,
    transitions: BTreeMap<&'static str, (bool, Time)>,
    last_status: Option<Value>,
    node_was_stopped: bool,
}

fn now() -> Time {
    Time(Timestamp::now())
}

impl PodWorker {
    pub fn new(ctx: Arc<AgentContext>, pod_rx: watch::Receiver<Option<Pod>>, handle: Arc<PodHandle>) -> Self {
        let pod = pod_rx.borrow().clone().expect("a worker starts with its Pod");
        let containers = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| ContainerRuntime {
                spec: c.clone(),
                state: State::Waiting { reason: "ContainerCreating".into(), message: None, retry_at: Instant::now() },
                restart_count: 0,
                last_termination: None,
                backoff: BACKOFF_START,
                launch: None,
                readiness: None,
                liveness: None,
                startup: None,
                ready: false,
                started: false,
            })
            .collect();
        let pod_dir = ctx.state_dir.join("pods").join(format!("{}_{}_{}", handle.namespace, handle.name, handle.uid));
        let adopted =
            pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ctx.network.lock().unwrap().adopt(ip));
        Self {
            ctx,
            pod_rx,
            handle,
            pod_dir,
            ip: adopted,
            volumes: None,
            setup_error: None,
            setup_retry_at: Instant::now(),
            containers,
            start_time: now(),
            transitions: BTreeMap::new(),
            last_status: None,
            node_was_stopped: false,
        }
    }

    fn log_fields(&self) -> (String, String) {
        (self.handle.namespace.clone(), self.handle.name.clone())
    }

    pub async fn run(mut self) {
        loop {
            let Some(pod) = self.pod_rx.borrow_and_update().clone() else {
                // The object is gone (force-deleted): stop without touching the API.
                self.stop_containers(Duration::from_secs(2)).await;
                break;
            };
            if self.ctx.is_node_stopped(&self.handle.node) {
                if !self.node_was_stopped {
                    self.kill_for_node_stop();
                    self.node_was_stopped = true;
                }
            } else {
                self.node_was_stopped = false;
                if pod.metadata.deletion_timestamp.is_some() {
                    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0) as u64;
                    self.stop_containers(Duration::from_secs(grace)).await;
                    self.remove_object(&pod).await;
                    break;
                }
                self.step(&pod).await;
                self.report(&pod).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = self.pod_rx.changed() => {}
            }
        }
        self.cleanup();
    }

    /// One pass: set up the sandbox if needed, then drive each container.
    async fn step(&mut self, pod: &Pod) {
        if self.volumes.is_none() && Instant::now() >= self.setup_retry_at {
            match self.setup(pod).await {
                Ok(()) => self.setup_error = None,
                Err(message) => {
                    let (ns, name) = self.log_fields();
                    if self.setup_error.as_deref() != Some(message.as_str()) {
                        tracing::info!(namespace = %ns, pod = %name, %message, "pod sandbox not ready");
                    }
                    self.setup_error = Some(message);
                    self.setup_retry_at = Instant::now() + SETUP_RETRY;
                }
            }
        }
        if self.volumes.is_none() {
            return;
        }
        let restart_policy =
            pod.spec.as_ref().and_then(|s| s.restart_policy.clone()).unwrap_or_else(|| "Always".into());
        let pod_with_ip = self.pod_with_addresses(pod);
        for index in 0..self.containers.len() {
            self.drive_container(index, &pod_with_ip, &restart_policy).await;
        }
    }

    async fn setup(&mut self, pod: &Pod) -> Result<(), String> {
        if self.ip.is_none() {
            self.ip = Some(self.ctx.network.lock().unwrap().allocate().ok_or("the pod network is exhausted")?);
        }
        std::fs::create_dir_all(&self.pod_dir).map_err(|e| format!("cannot create {}: {e}", self.pod_dir.display()))?;
        if pod.spec.as_ref().and_then(|s| s.init_containers.as_ref()).is_some_and(|c| !c.is_empty()) {
            return Err("init containers are not supported by the node agent".into());
        }
        let volumes =
            tokio::time::timeout(API_TIMEOUT, spec::materialize_volumes(&self.ctx.client, pod, &self.pod_dir))
                .await
                .map_err(|_| format!("volumes not ready: no answer from the API in {API_TIMEOUT:?}"))??;
        spec::give_volumes_to_fs_group(pod, &volumes)?;
        self.volumes = Some(volumes);
        Ok(())
    }

    /// The Pod as a kubelet sees it once the sandbox exists: with its addresses.
    fn pod_with_addresses(&self, pod: &Pod) -> Pod {
        let mut pod = pod.clone();
        let status = pod.status.get_or_insert_with(Default::default);
        status.pod_ip = self.ip.map(|ip| ip.to_string());
        status.host_ip = Some(self.ctx.node_ip(&self.handle.node).to_string());
        pod
    }

    async fn drive_container(&mut self, index: usize, pod: &Pod, restart_policy: &str) {
        let now_i = Instant::now();
        // Exits first: they decide whether and when to restart.
        let exited = match &mut self.containers[index].state {
            State::Running { child, .. } => child.try_wait().ok().flatten(),
            _ => None,
        };
        if let Some(status) = exited {
            self.on_exit(index, status, restart_policy);
        }
        let c = &mut self.containers[index];
        match &c.state {
            State::Waiting { retry_at, .. } if now_i >= *retry_at => {
                let result = self.start_container(index, pod).await;
                if let Err((reason, message)) = result {
                    let c = &mut self.containers[index];
                    let backoff = c.backoff;
                    c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
                    c.state = State::Waiting { reason, message: Some(message), retry_at: now_i + backoff };
                }
            }
            State::Running { pid, since, .. } => {
                let (pid, since) = (*pid, *since);
                if now_i.duration_since(since) > BACKOFF_RESET_AFTER {
                    c.backoff = BACKOFF_START;
                }
                self.run_probes(index, pod, pid, now_i);
            }
            _ => {}
        }
    }

    fn on_exit(&mut self, index: usize, status: std::process::ExitStatus, restart_policy: &str) {
        use std::os::unix::process::ExitStatusExt as _;
        let c = &mut self.containers[index];
        let State::Running { started_at, .. } = &c.state else {
            return;
        };
        let exit_code = status.code().unwrap_or(128 + status.signal().unwrap_or(0));
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        let terminated = State::Terminated {
            exit_code,
            signal: status.signal(),
            reason: reason.into(),
            started_at: started_at.clone(),
            finished_at: now(),
        };
        let (ns, name) = (self.handle.namespace.clone(), self.handle.name.clone());
        tracing::info!(namespace = %ns, pod = %name, container = %c.spec.name, %status, "container exited");
        self.handle.containers.lock().unwrap().remove(&c.spec.name);
        c.readiness = None;
        c.liveness = None;
        c.startup = None;
        c.ready = false;
        let restart = match restart_policy {
            "Never" => false,
            "OnFailure" => exit_code != 0,
            _ => true,
        };
        c.last_termination = Some(state_json(&terminated));
        if restart {
            c.restart_count += 1;
            let backoff = c.backoff;
            c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
            c.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!("back-off {backoff:?} restarting failed container {}", c.spec.name)),
                retry_at: Instant::now() + backoff,
            };
        } else {
            c.state = terminated;
        }
    }

    /// Resolves the image, command, environment and mounts, then starts the
    /// process. Errors carry the waiting reason a kubelet would show.
    async fn start_container(&mut self, index: usize, pod: &Pod) -> Result<(), (String, String)> {
        let container = self.containers[index].spec.clone();
        let image_name = container.image.clone().unwrap_or_default();
        let image = self.ctx.images.resolve(&image_name).map_err(|m| {
            let reason = if self.containers[index].restart_count == 0 && self.containers[index].backoff == BACKOFF_START
            {
                "ErrImagePull"
            } else {
                "ImagePullBackOff"
            };
            (reason.to_string(), m)
        })?;
        let config_error = |m: String| ("CreateContainerConfigError".to_string(), m);
        let mut env = tokio::time::timeout(API_TIMEOUT, spec::resolve_env(&self.ctx.client, pod, &container))
            .await
            .map_err(|_| format!("no answer from the API in {API_TIMEOUT:?}"))
            .and_then(|r| r)
            .map_err(config_error)?;
        let hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone()).unwrap_or_else(|| self.handle.name.clone());
        for (k, v) in [
            ("HOSTNAME", hostname),
            ("KUBERNETES_SERVICE_HOST", self.ctx.apiserver_host.clone()),
            ("KUBERNETES_SERVICE_PORT", self.ctx.apiserver_port.to_string()),
        ] {
            if !env.iter().any(|(name, _)| name == k) {
                env.push((k.into(), v));
            }
        }
        if let Some(oci) = &image.oci {
            // The image's environment (its PATH among it) under the Pod's.
            let own: Vec<(String, String)> = oci
                .env
                .iter()
                .filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
                .filter(|(k, _)| !env.iter().any(|(name, _)| name == k))
                .collect();
            env.splice(0..0, own);
        }
        let vars: HashMap<String, String> = env.iter().cloned().collect();
        let (entrypoint, image_args) = match &image.oci {
            Some(oci) => (oci.entrypoint.clone(), oci.cmd.clone()),
            None => (image.entrypoint.clone(), Vec::new()),
        };
        // As a kubelet does: `command` replaces the image's entrypoint and its
        // arguments; `args` alone replace only the image's arguments.
        let given = |v: &Option<Vec<String>>| v.clone().filter(|c| !c.is_empty());
        let (command, args) = match (given(&container.command), given(&container.args)) {
            (Some(command), args) => (command, args.unwrap_or_default()),
            (None, Some(args)) => (entrypoint, args),
            (None, None) => (entrypoint, image_args),
        };
        let argv: Vec<String> = command.iter().chain(&args).map(|a| expand(a, &vars)).collect();
        if argv.is_empty() {
            return Err(config_error(format!(
                "container {} has no command and its image no entrypoint",
                container.name
            )));
        }
        let mounts: Vec<Mount> =
            spec::container_mounts(&container, self.volumes.as_ref().expect("set up")).map_err(config_error)?;
        let container_dir = self.pod_dir.join("containers").join(&container.name);
        let (bin_dir, work_dir) = Launch::prepare_dirs(&container_dir, &image.binaries)
            .map_err(|e| config_error(format!("cannot prepare {}: {e}", container_dir.display())))?;
        let root = match &image.oci {
            Some(oci) => {
                Some(spec::image_root(pod, &container, oci, &container_dir.join("rootfs")).map_err(config_error)?)
            }
            None => None,
        };
        let confinement = match &image.oci {
            Some(_) => spec::Confinement::default(),
            None => spec::host_confinement(pod, &container).map_err(config_error)?,
        };
        let image_dir = image.oci.as_ref().map(|oci| PathBuf::from(&oci.working_dir));
        // A confined container starts in `/`, as on a kubelet without an
        // image WORKDIR: the agent's directory may lie under one of its
        // volumes (an emptyDir at /tmp) and is not its user's to enter.
        let default_dir = if confinement.user.is_some() { PathBuf::from("/") } else { work_dir };
        let launch = Launch {
            argv,
            env,
            mounts,
            working_dir: container.working_dir.clone().map(PathBuf::from).or(image_dir).unwrap_or(default_dir),
            bin_dir,
            log_path: container_dir.join("output.log"),
            root,
            confinement,
        };
        let child = launch.spawn().map_err(|e| ("RunContainerError".to_string(), format!("cannot start: {e}")))?;
        let pid = child.id().unwrap_or(0);
        let since = Instant::now();
        let (ns, name) = self.log_fields();
        tracing::info!(namespace = %ns, pod = %name, container = %container.name, pid, "container started");
        self.handle.containers.lock().unwrap().insert(container.name.clone(), pid);
        let c = &mut self.containers[index];
        c.startup = container.startup_probe.as_ref().map(|p| ProbeTracker::new(p, since));
        c.readiness = container.readiness_probe.as_ref().map(|p| ProbeTracker::new(p, since));
        c.liveness = container.liveness_probe.as_ref().map(|p| ProbeTracker::new(p, since));
        c.started = c.startup.is_none();
        c.ready = c.readiness.is_none() && c.started;
        c.launch = Some(launch);
        c.state = State::Running { child, pid, started_at: now(), since };
        Ok(())
    }

    fn run_probes(&mut self, index: usize, pod: &Pod, pid: u32, now_i: Instant) {
        let c = &mut self.containers[index];
        let Some(launch) = c.launch.clone() else {
            return;
        };
        let target = ProbeTarget {
            pod_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            container: c.spec.clone(),
            launch,
            pid,
        };
        if let Some(startup) = c.startup.as_mut().filter(|_| !c.started) {
            startup.poll(now_i, &target);
            match startup.verdict {
                Some(true) => c.started = true,
                Some(false) => return self.kill_unhealthy(index, "startup"),
                None => return,
            }
        }
        if let Some(liveness) = c.liveness.as_mut() {
            liveness.poll(now_i, &target);
            if liveness.verdict == Some(false) {
                return self.kill_unhealthy(index, "liveness");
            }
        }
        match c.readiness.as_mut() {
            Some(readiness) => {
                readiness.poll(now_i, &target);
                c.ready = c.started && readiness.verdict == Some(true);
            }
            None => c.ready = c.started,
        }
    }

    fn kill_unhealthy(&mut self, index: usize, probe: &str) {
        let c = &mut self.containers[index];
        if let State::Running { pid, .. } = c.state {
            let (ns, name) = (self.handle.namespace.clone(), self.handle.name.clone());
            tracing::info!(namespace = %ns, pod = %name, container = %c.spec.name, probe, "probe failed, killing container");
            c.liveness = None;
            c.startup = None;
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }

    /// The node went down: its processes die at once and nothing is reported.
    fn kill_for_node_stop(&mut self) {
        for c in &mut self.containers {
            if let State::Running { pid, .. } = c.state {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }

    /// SIGTERM every container, wait up to `grace`, SIGKILL what is left.
    async fn stop_containers(&mut self, grace: Duration) {
        let (ns, name) = self.log_fields();
        tracing::info!(namespace = %ns, pod = %name, ?grace, "stopping pod");
        for c in &self.containers {
            if let State::Running { pid, .. } = c.state {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGCONT); // a frozen process must see it
            }
        }
        let deadline = Instant::now() + grace;
        for c in &mut self.containers {
            if let State::Running { child, pid, .. } = &mut c.state {
                let pid = *pid;
                if tokio::time::timeout_at(deadline, child.wait()).await.is_err() {
                    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                // The group may hold children of the container's main process.
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            c.state = State::Waiting { reason: "Terminated".into(), message: None, retry_at: Instant::now() };
        }
        self.handle.containers.lock().unwrap().clear();
    }

    /// The kubelet's last word on a deleted Pod: remove the object for good.
    async fn remove_object(&self, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.handle.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
            ..Default::default()
        };
        if let Ok(Err(error)) = tokio::time::timeout(API_TIMEOUT, api.delete(&self.handle.name, &params)).await {
            let (ns, name) = self.log_fields();
            tracing::debug!(namespace = %ns, pod = %name, %error, "final delete");
        }
    }

    fn cleanup(&mut self) {
        if let Some(ip) = self.ip.take() {
            self.ctx.network.lock().unwrap().release(ip);
        }
        // Volumes of the Pod itself go; claims live in their PV's directory.
        let _ = std::fs::remove_dir_all(&self.pod_dir);
    }

    /// Writes the Pod's status when it differs from what was last written.
    async fn report(&mut self, pod: &Pod) {
        let status = self.status_json(pod);
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.handle.namespace);
        let patch = Patch::Strategic(json!({ "status": status }));
        let result =
            tokio::time::timeout(API_TIMEOUT, api.patch_status(&self.handle.name, &PatchParams::default(), &patch))
                .await
                .map_err(|_| format!("no answer in {API_TIMEOUT:?}"))
                .and_then(|r| r.map_err(|e| e.to_string()));
        match result {
            Ok(_) => self.last_status = Some(status),
            Err(error) => {
                let (ns, name) = self.log_fields();
                tracing::debug!(namespace = %ns, pod = %name, %error, "status update failed; retrying");
            }
        }
    }

    fn condition(&mut self, kind: &'static str, value: bool) -> Value {
        let entry = self.transitions.entry(kind).or_insert_with(|| (value, now()));
        if entry.0 != value {
            *entry = (value, now());
        }
        json!({
            "type": kind,
            "status": if value { "True" } else { "False" },
            "lastTransitionTime": entry.1,
            "lastProbeTime": null,
        })
    }

    fn status_json(&mut self, pod: &Pod) -> Value {
        let sandbox = self.volumes.is_some();
        let all_ready = sandbox && !self.containers.is_empty() && self.containers.iter().all(|c| c.ready);
        let phase = self.phase(pod);
        let conditions = vec![
            self.condition("PodReadyToStartContainers", sandbox),
            self.condition("Initialized", true),
            self.condition("ContainersReady", all_ready),
            self.condition("Ready", all_ready),
        ];
        let container_statuses: Vec<Value> = self.containers.iter().map(|c| self.container_status(c)).collect();
        let host_ip = self.ctx.node_ip(&self.handle.node).to_string();
        let mut status = json!({
            "phase": phase,
            "hostIP": host_ip,
            "hostIPs": [{ "ip": host_ip }],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": container_statuses,
        });
        if let Some(ip) = self.ip.filter(|_| sandbox) {
            status["podIP"] = json!(ip.to_string());
            status["podIPs"] = json!([{ "ip": ip.to_string() }]);
        }
        if let Some(message) = &self.setup_error {
            status["message"] = json!(message);
        }
        status
    }

    fn phase(&self, pod: &Pod) -> &'static str {
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always");
        let running = self.containers.iter().any(|c| matches!(c.state, State::Running { .. }));
        let ever_started =
            self.containers.iter().any(|c| c.restart_count > 0 || !matches!(c.state, State::Waiting { .. }));
        let terminated: Vec<i32> = self
            .containers
            .iter()
            .filter_map(|c| match c.state {
                State::Terminated { exit_code, .. } => Some(exit_code),
                _ => None,
            })
            .collect();
        if running || (ever_started && policy == "Always") {
            return "Running";
        }
        if !self.containers.is_empty() && terminated.len() == self.containers.len() {
            return if terminated.iter().all(|c| *c == 0) { "Succeeded" } else { "Failed" };
        }
        if ever_started { "Running" } else { "Pending" }
    }

    fn container_status(&self, c: &ContainerRuntime) -> Value {
        let image = c.spec.image.clone().unwrap_or_default();
        let mut status = json!({
            "name": c.spec.name,
            "image": image,
            "imageID": format!("slotkeeper-local://{image}"),
            "ready": c.ready,
            "started": matches!(c.state, State::Running { .. }) && c.started,
            "restartCount": c.restart_count,
            "state": state_json(&c.state),
        });
        if let State::Running { pid, .. } = c.state {
            status["containerID"] = json!(format!("slotkeeper://{}", pid));
        }
        if let Some(last) = &c.last_termination {
            status["lastState"] = last.clone();
        }
        status
    }
}

fn state_json(state: &State) -> Value {
    match state {
        State::Waiting { reason, message, .. } => json!({ "waiting": { "reason": reason, "message": message } }),
        State::Running { started_at, .. } => json!({ "running": { "startedAt": started_at } }),
        State::Terminated { exit_code, signal, reason, started_at, finished_at } => json!({ "terminated": {
            "exitCode": exit_code,
            "signal": signal,
            "reason": reason,
            "startedAt": started_at,
            "finishedAt": finished_at,
        }}),
    }
}
