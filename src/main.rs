//! `slotkeeper`: the operator binary. It wires the operator, the read model,
//! the console and the upgrade manager behind subcommands.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand, ValueEnum};

use slotkeeper_operator::controller::cache::Caches;
use slotkeeper_operator::controller::{self, Context};
use slotkeeper_operator::leader::LeaderElector;
use slotkeeper_operator::metrics::{CountRequestsLayer, Metrics};
use slotkeeper_operator::sampler::Sampler;
use slotkeeper_operator::server::{self, ServerState};

#[derive(Parser)]
#[command(name = "slotkeeper", version, about = "Kubernetes operator for Redis Cluster")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (and its console).
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
    /// Where HTTP is served: /healthz, /readyz, /metrics and the console.
    #[arg(long, alias = "metrics-addr", default_value = "0.0.0.0:8080", env = "SLOTKEEPER_HTTP_ADDR")]
    http_addr: std::net::SocketAddr,
    /// Serve the web console (on every replica, leader or not).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "SLOTKEEPER_CONSOLE")]
    console: bool,
    /// Act only while holding the leader Lease (run two replicas safely).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// The operator's own namespace: the leader Lease and the console's session key live here.
    #[arg(long, env = "POD_NAMESPACE", default_value = "slotkeeper-system")]
    leader_election_namespace: String,
}

/// Serves `app` on a runtime of its own, one worker thread: however busy the
/// console gets (renders, a hundred live streams), it runs beside the
/// controller's runtime, not on its threads, and cannot delay a reconcile
/// by more than the machine's CPU share. Resolves if the server stops.
fn serve_apart(
    addr: std::net::SocketAddr,
    app: axum::Router,
) -> std::io::Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>> {
    let (stopped, server) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("http".into()).spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("http")
            .enable_all()
            .build()
            .and_then(|runtime| runtime.block_on(server::serve(addr, app)));
        let _ = stopped.send(result);
    })?;
    Ok(server)
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Pretty,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!("{}", slotkeeper_api::crds_yaml());
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
        kube::client::ClientBuilder::try_from(config.clone())?.with_layer(&CountRequestsLayer(metrics.clone())).build();
    let namespace = args.namespace.as_deref();
    // Fed on every replica: a standby serves the console too.
    let (readmodel, publisher) = slotkeeper_readmodel::start(client.clone(), namespace);

    let ready = Arc::new(AtomicBool::new(false));
    let mut app = server::router(ServerState { metrics: metrics.clone(), ready: ready.clone() });
    if args.console {
        app = app.merge(slotkeeper_console::router(slotkeeper_console::ConsoleConfig {
            readmodel: readmodel.clone(),
            client: client.clone(),
            user_config: config,
            key_namespace: args.leader_election_namespace.clone(),
        }));
    }
    let mut server = serve_apart(args.http_addr, app)?;
    tracing::info!(namespace = namespace.unwrap_or("<all>"), instance = %args.instance, console = args.console, "slotkeeper operator starting");

    let (caches, triggers) = Caches::new(&client, namespace);
    let ctx = Arc::new(Context::new(client.clone(), args.instance.clone(), metrics, caches, publisher.clone()));
    if !args.leader_elect {
        ready.store(true, Ordering::Relaxed);
        controller::run(ctx, triggers, namespace).await;
        tracing::info!("slotkeeper operator stopped");
        return Ok(());
    }
    let elector = LeaderElector::new(client.clone(), &args.leader_election_namespace, args.instance);
    // A standby is healthy and ready: it is waiting to take over, and serves the console.
    ready.store(true, Ordering::Relaxed);
    let sampler = Sampler::new(client, readmodel, publisher);
    tokio::select! {
        _ = elector.acquire() => {}
        _ = sampler.run() => {}
        _ = tokio::signal::ctrl_c() => return Ok(()),
        result = &mut server => anyhow::bail!("HTTP server stopped: {result:?}"),
    }
    // Leading now: reconciles publish what they observe; the sampler stops.
    drop(sampler);
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
