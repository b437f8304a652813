//! Node registration and heartbeats: status conditions every
//! [`STATUS_PERIOD`] and the `kube-node-lease` Lease every [`LEASE_PERIOD`],
//! which is what the node-lifecycle controller watches. A stopped Node reports
//! `Ready=False` once and then falls silent, as a machine going down would.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::{AgentContext, FIELD_MANAGER};

const STATUS_PERIOD: Duration = Duration::from_secs(10);
const LEASE_PERIOD: Duration = Duration::from_secs(2);
const LEASE_DURATION_SECONDS: i32 = 40;
const KUBELET_VERSION: &str = "v1.37.2";

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Creates (or takes over) every Node with labels, capacity and a Ready status.
pub async fn register(ctx: &AgentContext) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    for (name, index) in &ctx.nodes {
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "topology.kubernetes.io/zone": format!("zone-{index}"),
                    "node.kubernetes.io/instance-type": "slotkeeper-local",
                },
            },
        });
        api.patch(name, &apply(), &Patch::Apply(node)).await?;
        post_status(ctx, name, true).await?;
        tracing::info!(node = %name, ip = %ctx.node_ip(name), "node registered");
    }
    Ok(())
}

fn condition(kind: &str, status: bool, reason: &str, message: &str, now: &Time) -> Value {
    json!({
        "type": kind,
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    })
}

/// Writes the Node's status; `ready` false marks it down.
pub async fn post_status(ctx: &AgentContext, name: &str, ready: bool) -> kube::Result<()> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let now = Time(Timestamp::now());
    let ip = ctx.node_ip(name).to_string();
    let resources = json!({ "cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi" });
    let (reason, message) = if ready {
        ("KubeletReady", "node agent is posting ready status")
    } else {
        ("NodeStopped", "node stopped by the node agent (fault injection)")
    };
    let status = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{ "type": "InternalIP", "address": ip }, { "type": "Hostname", "address": name }],
            "conditions": [
                condition("MemoryPressure", false, "KubeletHasSufficientMemory", "no memory pressure", &now),
                condition("DiskPressure", false, "KubeletHasNoDiskPressure", "no disk pressure", &now),
                condition("PIDPressure", false, "KubeletHasSufficientPID", "no PID pressure", &now),
                condition("Ready", ready, reason, message, &now),
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 0 } },
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name,
                "kernelVersion": "local", "osImage": "slotkeeper node agent",
                "containerRuntimeVersion": "slotkeeper-local://0.1.0",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    });
    // Conditions carry a fresh heartbeat time on every write; transition times
    // are kept by the apiserver only if we keep them, which a heartbeat every
    // 10 s makes harmless for this environment's purposes.
    api.patch_status(name, &apply(), &Patch::Apply(status)).await.map(|_| ())
}

async fn renew_lease(ctx: &AgentContext, name: &str) -> kube::Result<()> {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": name, "namespace": "kube-node-lease" },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": MicroTime(Timestamp::now()),
        },
    });
    api.patch(name, &apply(), &Patch::Apply(lease)).await.map(|_| ())
}

/// Keeps every running Node alive; a Node just stopped gets one last
/// `Ready=False` status, a Node started again a `Ready=True` one at once.
pub async fn heartbeat_loop(ctx: Arc<AgentContext>) {
    let mut reported_down = std::collections::BTreeSet::new();
    let mut ticks: u64 = 0;
    let every = (STATUS_PERIOD.as_secs() / LEASE_PERIOD.as_secs()).max(1);
    loop {
        for name in ctx.nodes.keys() {
            let stopped = ctx.is_node_stopped(name);
            let result = if stopped {
                if reported_down.contains(name) {
                    continue;
                }
                post_status(&ctx, name, false).await.map(|_| {
                    reported_down.insert(name.clone());
                })
            } else {
                let came_back = reported_down.remove(name);
                let mut r = renew_lease(&ctx, name).await;
                if r.is_ok() && (came_back || ticks.is_multiple_of(every)) {
                    r = post_status(&ctx, name, true).await;
                }
                r
            };
            if let Err(error) = result {
                tracing::warn!(node = %name, %error, "heartbeat failed");
            }
        }
        ticks += 1;
        tokio::time::sleep(LEASE_PERIOD).await;
    }
}
