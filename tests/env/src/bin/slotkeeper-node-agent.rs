//! `slotkeeper-node-agent`: registers Nodes and runs their Pods as local processes.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use slotkeeper_env::agent::{self, AgentConfig, images::ImageTable};
use slotkeeper_env::tools;

#[derive(Parser)]
#[command(about = "Plays kubelet for local Nodes: runs every Pod bound to them as local processes")]
struct Args {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Kubeconfig context to act as.
    #[arg(long)]
    context: Option<String>,
    /// Comma-separated Node names.
    #[arg(long, value_delimiter = ',', default_value = "node-1,node-2,node-3")]
    nodes: Vec<String>,
    #[arg(long)]
    state_dir: PathBuf,
    /// Image table (JSON); defaults to tests/env/images.json.
    #[arg(long)]
    images: Option<PathBuf>,
    /// Pods get addresses in 127.<block>.0.0/16.
    #[arg(long, default_value_t = 1)]
    network_block: u8,
    /// Port of the fault-injection API on 127.0.0.1.
    #[arg(long)]
    control_port: u16,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let root = tools::repo_root();
    let images_path = args.images.unwrap_or_else(|| root.join("tests/env/images.json"));
    let images = ImageTable::load(&images_path, &root).map_err(anyhow::Error::msg)?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let options = KubeConfigOptions { context: args.context, ..Default::default() };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
    let apiserver = config.cluster_url.clone();
    let client = kube::Client::try_from(config)?;
    std::fs::create_dir_all(&args.state_dir)?;
    let config = AgentConfig {
        nodes: args.nodes,
        state_dir: args.state_dir,
        images,
        network_block: args.network_block,
        control_port: args.control_port,
    };
    tokio::select! {
        result = agent::run(client, config, &apiserver) => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminated() => Ok(()),
    }
    // Pods die with the agent through their parent-death signal.
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut sig) => {
            sig.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
