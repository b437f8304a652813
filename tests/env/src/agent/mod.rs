//! The node agent: plays kubelet for several Nodes on this one machine.
//!
//! Data flow: a watch on all Pods → one [`worker::PodWorker`] per Pod bound to
//! one of our Nodes (it owns that Pod's processes and status) ; a heartbeat task
//! per Node (status and Lease) ; a volume provisioner for PVCs ; a small HTTP
//! control API for fault injection (crash, freeze, node stop).
//!
//! Everything runs on one thread (a current-thread runtime), which is also
//! what makes the Pods' parent-death signal reliable: it fires when the forking
//! thread exits, and here that thread is the process.

pub mod container;
pub mod control;
pub mod expand;
pub mod images;
pub mod network;
pub mod nodes;
pub mod oci;
pub mod probes;
pub mod provisioner;
pub mod spec;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::watch;

use images::ImageTable;
use network::PodNetwork;

/// The field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "slotkeeper-node-agent";

pub struct AgentConfig {
    pub nodes: Vec<String>,
    pub state_dir: PathBuf,
    pub images: ImageTable,
    /// Second octet of the Pods' 127.X.0.0/16.
    pub network_block: u8,
    pub control_port: u16,
}

/// What the agent knows about one running Pod, shared with the control API.
pub struct PodHandle {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    /// Main process id per running container.
    pub containers: Mutex<BTreeMap<String, u32>>,
}

pub struct AgentContext {
    pub client: Client,
    pub state_dir: PathBuf,
    pub images: ImageTable,
    pub network: Mutex<PodNetwork>,
    /// Node name → 1-based index (its address is 127.X.255.index).
    pub nodes: BTreeMap<String, u8>,
    pub stopped_nodes: Mutex<BTreeSet<String>>,
    pub pods: Mutex<HashMap<(String, String), Arc<PodHandle>>>,
    pub apiserver_host: String,
    pub apiserver_port: u16,
}

impl AgentContext {
    pub fn node_ip(&self, node: &str) -> Ipv4Addr {
        self.network.lock().unwrap().node_ip(self.nodes.get(node).copied().unwrap_or(0))
    }

    pub fn is_node_stopped(&self, node: &str) -> bool {
        self.stopped_nodes.lock().unwrap().contains(node)
    }
}

/// Runs the agent until the Pod watch ends or a task fails.
pub async fn run(client: Client, config: AgentConfig, apiserver: &http::Uri) -> anyhow::Result<()> {
    let nodes: BTreeMap<String, u8> =
        config.nodes.iter().enumerate().map(|(i, n)| (n.clone(), (i + 1) as u8)).collect();
    let ctx = Arc::new(AgentContext {
        client: client.clone(),
        state_dir: config.state_dir.clone(),
        images: config.images,
        network: Mutex::new(PodNetwork::new(config.network_block)),
        nodes,
        stopped_nodes: Mutex::new(BTreeSet::new()),
        pods: Mutex::new(HashMap::new()),
        apiserver_host: apiserver.host().unwrap_or("127.0.0.1").to_owned(),
        apiserver_port: apiserver.port_u16().unwrap_or(443),
    });
    nodes::register(&ctx).await?;
    provisioner::ensure_storage_class(&client).await?;
    let heartbeats = tokio::spawn(nodes::heartbeat_loop(ctx.clone()));
    let provisioner = tokio::spawn(provisioner::run(client.clone(), ctx.state_dir.join("volumes")));
    let control = tokio::spawn(control::serve(ctx.clone(), config.control_port));
    tokio::select! {
        result = watch_pods(ctx.clone()) => result,
        result = heartbeats => Err(anyhow::anyhow!("node heartbeats stopped: {result:?}")),
        result = provisioner => Err(anyhow::anyhow!("volume provisioner stopped: {result:?}")),
        result = control => Err(anyhow::anyhow!("control API stopped: {result:?}")),
    }
}

/// Dispatches Pod events to one worker per Pod on our Nodes.
async fn watch_pods(ctx: Arc<AgentContext>) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let mut senders: HashMap<String, watch::Sender<Option<Pod>>> = HashMap::new();
    let mut relisted: Option<BTreeSet<String>> = None;
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "pod watch error; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        match event {
            Event::Init => relisted = Some(BTreeSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => {
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(pod.uid().unwrap_or_default());
                }
                dispatch(&ctx, &mut senders, pod);
            }
            Event::InitDone => {
                if let Some(seen) = relisted.take() {
                    // Pods that vanished while the watch was down are gone.
                    senders.retain(|uid, tx| {
                        let keep = seen.contains(uid);
                        if !keep {
                            let _ = tx.send(None);
                        }
                        keep
                    });
                }
            }
            Event::Delete(pod) => {
                if let Some(tx) = senders.remove(&pod.uid().unwrap_or_default()) {
                    let _ = tx.send(None);
                }
            }
        }
        senders.retain(|_, tx| !tx.is_closed());
    }
    Ok(())
}

fn dispatch(ctx: &Arc<AgentContext>, senders: &mut HashMap<String, watch::Sender<Option<Pod>>>, pod: Pod) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    if !ctx.nodes.contains_key(&node) {
        return;
    }
    let uid = pod.uid().unwrap_or_default();
    if let Some(tx) = senders.get(&uid) {
        let _ = tx.send(Some(pod));
        return;
    }
    let handle = Arc::new(PodHandle {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: uid.clone(),
        node,
        containers: Mutex::new(BTreeMap::new()),
    });
    let key = (handle.namespace.clone(), handle.name.clone());
    ctx.pods.lock().unwrap().insert(key.clone(), handle.clone());
    let (tx, rx) = watch::channel(Some(pod));
    senders.insert(uid.clone(), tx);
    let worker = worker::PodWorker::new(ctx.clone(), rx, handle);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        worker.run().await;
        let mut pods = ctx.pods.lock().unwrap();
        if pods.get(&key).is_some_and(|h| h.uid == uid) {
            pods.remove(&key);
        }
    });
}
