//! `slotkeeper`: the operator binary. It wires the operator, the console and
//! the upgrade manager behind subcommands.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use slotkeeper_operator::controller::{self, Context};

#[derive(Parser)]
#[command(
    name = "slotkeeper",
    version,
    about = "Kubernetes operator for Redis Cluster"
)]
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
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
    let client = kube::Client::try_from(config)?;
    let ctx = Arc::new(Context::new(client, args.instance));
    tracing::info!(
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        "slotkeeper operator starting"
    );
    controller::run(ctx, args.namespace.as_deref()).await;
    tracing::info!("slotkeeper operator stopped");
    Ok(())
}
