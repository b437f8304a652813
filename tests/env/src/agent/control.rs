//! The fault-injection API, on loopback only:
//!
//! - `POST /pods/{ns}/{pod}/containers/{c}/kill`: the container's process dies (SIGKILL)
//! - `POST /pods/{ns}/{pod}/freeze` / `thaw`: SIGSTOP / SIGCONT every container
//! - `GET  /pods/{ns}/{pod}`: the running containers' process ids
//! - `POST /nodes/{node}/stop` / `start`: a Node goes down (processes killed,
//!   `Ready=False`, heartbeats stop) or comes back

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::AgentContext;

type Reply = Result<Json<serde_json::Value>, (StatusCode, String)>;

pub async fn serve(ctx: Arc<AgentContext>, port: u16) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/pods/{ns}/{pod}", get(pod_processes))
        .route("/pods/{ns}/{pod}/containers/{container}/kill", post(kill_container))
        .route("/pods/{ns}/{pod}/freeze", post(freeze))
        .route("/pods/{ns}/{pod}/thaw", post(thaw))
        .route("/nodes/{node}/stop", post(stop_node))
        .route("/nodes/{node}/start", post(start_node))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

fn containers_of(ctx: &AgentContext, ns: &str, pod: &str) -> Result<BTreeMap<String, u32>, (StatusCode, String)> {
    let pods = ctx.pods.lock().unwrap();
    let handle = pods
        .get(&(ns.to_owned(), pod.to_owned()))
        .ok_or((StatusCode::NOT_FOUND, format!("pod {ns}/{pod} is not running on this agent")))?;
    Ok(handle.containers.lock().unwrap().clone())
}

fn signal_all(containers: &BTreeMap<String, u32>, signal: Signal) -> Reply {
    for pid in containers.values() {
        killpg(Pid::from_raw(*pid as i32), signal).map_err(|e| (StatusCode::CONFLICT, format!("{signal}: {e}")))?;
    }
    Ok(Json(serde_json::json!({ "signalled": containers })))
}

async fn pod_processes(State(ctx): State<Arc<AgentContext>>, Path((ns, pod)): Path<(String, String)>) -> Reply {
    Ok(Json(serde_json::json!({ "containers": containers_of(&ctx, &ns, &pod)? })))
}

async fn kill_container(
    State(ctx): State<Arc<AgentContext>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
) -> Reply {
    let containers = containers_of(&ctx, &ns, &pod)?;
    let pid = containers
        .get(&container)
        .ok_or((StatusCode::NOT_FOUND, format!("container {container} of {ns}/{pod} is not running")))?;
    signal_all(&BTreeMap::from([(container, *pid)]), Signal::SIGKILL)
}

async fn freeze(State(ctx): State<Arc<AgentContext>>, Path((ns, pod)): Path<(String, String)>) -> Reply {
    signal_all(&containers_of(&ctx, &ns, &pod)?, Signal::SIGSTOP)
}

async fn thaw(State(ctx): State<Arc<AgentContext>>, Path((ns, pod)): Path<(String, String)>) -> Reply {
    signal_all(&containers_of(&ctx, &ns, &pod)?, Signal::SIGCONT)
}

fn known_node(ctx: &AgentContext, node: &str) -> Result<(), (StatusCode, String)> {
    if ctx.nodes.contains_key(node) {
        Ok(())
    } else {
        Err((StatusCode::NOT_FOUND, format!("node {node} is not run by this agent")))
    }
}

async fn stop_node(State(ctx): State<Arc<AgentContext>>, Path(node): Path<String>) -> Reply {
    known_node(&ctx, &node)?;
    ctx.stopped_nodes.lock().unwrap().insert(node.clone());
    tracing::info!(%node, "node stopped");
    Ok(Json(serde_json::json!({ "node": node, "stopped": true })))
}

async fn start_node(State(ctx): State<Arc<AgentContext>>, Path(node): Path<String>) -> Reply {
    known_node(&ctx, &node)?;
    ctx.stopped_nodes.lock().unwrap().remove(&node);
    tracing::info!(%node, "node started");
    Ok(Json(serde_json::json!({ "node": node, "stopped": false })))
}
