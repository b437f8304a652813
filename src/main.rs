//! `slotkeeper`: the operator binary. It wires the operator, the console and
//! the upgrade manager behind subcommands.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use std::sync::atomic::{AtomicBool, Ordering};

use slotkeeper_operator::controller::cache::Caches;
use slotkeeper_operator::controller::{self, Context};
use slotkeeper_operator::leader::LeaderElector;
use slotkeeper_operator::metrics::{CountRequestsLayer, Metrics};
use slotkeeper_operator::server::{self, ServerState};

#[derive(Parser)]
#[command(name = "slotkeeper", version, about = "Kubernetes operator for Redis Cluster")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator.
    Run(RunArgs),
    /// Print the CustomResourceDefinitions as YAML (what deploy/crds holds).
    Crd,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Kubeconfig to use; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Watch only this namespace; all namespaces when absent.
    #[arg(long, env = "SLOTKEEPER_NAMESPACE")]
    namespace: Option<String>,
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, env = "SLOTKEEPER_LOG_FORMAT")]
    log_format: LogFormat,
    /// This replica's identity (events, leader election); the Pod name in a cluster.
    #[arg(long, env = "POD_NAME", default_value = "slotkeeper-local")]
    instance: String,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, default_value = "0.0.0.0:8080", env = "SLOTKEEPER_METRICS_ADDR")]
    metrics_addr: std::net::SocketAddr,
    /// Act only while holding the leader Lease (run two replicas safely).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease; the operator's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "slotkeeper-system")]
    leader_election_namespace: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Pretty,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!("{}", slotkeeper_operator::api::crds_yaml());
            Ok(())
        }
        Command::Run(args) => tokio::runtime::Runtime::new()?.block_on(run(args)),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.init(),
    }
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let metrics = Arc::new(Metrics::default());
    let client =
        kube::client::ClientBuilder::try_from(config)?.with_layer(&CountRequestsLayer(metrics.clone())).build();
    let ready = Arc::new(AtomicBool::new(false));
    let state = ServerState { metrics: metrics.clone(), ready: ready.clone() };
    let server = tokio::spawn(server::serve(args.metrics_addr, state));
    tracing::info!(namespace = args.namespace.as_deref().unwrap_or("<all>"), instance = %args.instance, "slotkeeper operator starting");
    let namespace = args.namespace.as_deref();
    let (caches, triggers) = Caches::new(&client, namespace);
    let ctx = Arc::new(Context::new(client.clone(), args.instance.clone(), metrics, caches));
    if !args.leader_elect {
        ready.store(true, Ordering::Relaxed);
        controller::run(ctx, triggers, namespace).await;
        tracing::info!("slotkeeper operator stopped");
        return Ok(());
    }
    let elector = LeaderElector::new(client, &args.leader_election_namespace, args.instance);
    // A standby is healthy and ready: it is waiting to take over.
    ready.store(true, Ordering::Relaxed);
    tokio::select! {
        _ = elector.acquire() => {}
        _ = tokio::signal::ctrl_c() => return Ok(()),
        result = server => anyhow::bail!("metrics server stopped: {result:?}"),
    }
    tokio::select! {
        _ = controller::run(ctx, triggers, namespace) => {
            tracing::info!("slotkeeper operator stopped");
            Ok(())
        }
        _ = elector.hold() => {
            // Another replica may act now; stop at once rather than race it.
            tracing::error!("lost the leader Lease; exiting");
            std::process::exit(1);
        }
    }
}
