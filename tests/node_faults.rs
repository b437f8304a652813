//! Faults that touch a whole environment get one of their own: stopping a
//! Node, and the environment leaving no process behind when dropped.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use slotkeeper_env::environment::node_ready;
use slotkeeper_env::{Environment, EnvironmentOptions};

fn alive(pid: u32) -> bool {
    // A zombie is dead for our purposes: it holds no resources but its entry.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[tokio::test]
async fn stopped_node_goes_not_ready_and_the_environment_leaves_no_process() {
    let env = Environment::start(EnvironmentOptions::default()).await.expect("environment starts");
    let client = env.client().await.unwrap();
    let ns = namespace_with_pod_security(&client, "node-stop", "baseline").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pinned"},
        "spec": {
            "nodeName": "node-3",
            "containers": [{"name": "sh", "image": "busybox:1.36", "command": ["sh", "-c", "while :; do sleep 1; done"]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    ready_pod(&pods, "pinned", Duration::from_secs(60)).await;
    let pod_pid = env.pod_processes(&ns, "pinned").await.unwrap()["sh"];
    assert!(alive(pod_pid));

    env.stop_node("node-3").await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until("node-3 Ready=False", Duration::from_secs(30), || async {
        nodes.get("node-3").await.ok().filter(|n| node_ready(n) == Some(false))
    })
    .await;
    wait_until("the node's processes stopped", Duration::from_secs(10), || async { (!alive(pod_pid)).then_some(()) })
        .await;
    // The real node-lifecycle controller takes over: it taints the Node.
    let taints = wait_until("node-lifecycle controller taints node-3", Duration::from_secs(60), || async {
        let node = nodes.get("node-3").await.ok()?;
        let taints: Vec<String> = node.spec?.taints?.into_iter().map(|t| t.key).collect();
        taints
            .iter()
            .any(|k| k == "node.kubernetes.io/not-ready" || k == "node.kubernetes.io/unreachable")
            .then_some(taints)
    })
    .await;
    eprintln!("node-3 taints: {taints:?}");

    env.start_node("node-3").await.unwrap();
    wait_until("node-3 Ready again", Duration::from_secs(30), || async {
        nodes.get("node-3").await.ok().filter(|n| node_ready(n) == Some(true))
    })
    .await;
    let restarted = ready_pod(&pods, "pinned", Duration::from_secs(60)).await;
    let new_pid = env.pod_processes(&ns, "pinned").await.unwrap()["sh"];
    assert!(alive(new_pid), "the Pod runs again after the node came back");
    assert!(restarted.status.unwrap().container_statuses.unwrap()[0].restart_count >= 1);

    let mut pids = env.pids();
    pids.push(new_pid);
    drop(env);
    let left: Vec<u32> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes left after the environment was dropped: {left:?}");
}
