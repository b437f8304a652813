//! `slotkeeper`: the operator binary. It wires the operator, the read model,
//! the console and the upgrade manager behind subcommands.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand, ValueEnum};

mod upgrade_cli;

use slotkeeper_api::self_upgrade::{
    LEASE_ANNOTATED_BY_ANNOTATION, LEASE_RECONCILED_ANNOTATION, LEASE_RELEASE_ANNOTATION, MANAGER_LEASE,
};
use slotkeeper_operator::controller::cache::Caches;
use slotkeeper_operator::controller::{self, Context};
use slotkeeper_operator::leader::LeaderElector;
use slotkeeper_operator::metrics::{CountRequestsLayer, Metrics};
use slotkeeper_operator::sampler::Sampler;
use slotkeeper_operator::server::{self, ServerState};
use slotkeeper_operator::webhook::certs::Lifetimes;
use slotkeeper_operator::webhook::{Endpoint, Keeper, WebhookConfig};
use slotkeeper_readmodel::scope::Namespaces;
use slotkeeper_upgrade::manager::{ConversionSource, Manager};

/// jemalloc, configured in `.cargo/config.toml` to hand freed pages back
/// within a second. glibc's malloc keeps a long-running process at its
/// high-water mark (the startup lists, the resharding bursts), fragmented:
/// at 100 clusters it held ~5 MiB more than jemalloc for the same work.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// This binary's release; an upgrade plan names the release it goes to.
const RELEASE: &str = env!("CARGO_PKG_VERSION");

#[derive(Parser)]
#[command(name = "slotkeeper", version, about = "Kubernetes operator for Redis Cluster")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (and its console).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML (what deploy/crds holds).
    Crd,
    /// Print the admission policy as YAML (what deploy/admission.yaml holds).
    Admission,
    /// Upgrade Slotkeeper itself.
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
}

#[derive(Subcommand)]
enum UpgradeCommand {
    /// Print the plan and the preflight's findings for upgrading the running
    /// installation to the release in --manifests; changes nothing, and
    /// exits 2 when the plan is refused.
    Plan {
        /// The new release's deploy/ directory (crds/ and operator.yaml).
        #[arg(long)]
        manifests: PathBuf,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Start the upgrade: the new RBAC and plan kind, the plan object
    /// (`SlotkeeperUpgrade/to-<release>`), what a rollback restores, and the
    /// new release's upgrade manager, which runs the plan. Exits 2 when the
    /// plan is refused (nothing is changed).
    Apply {
        /// The new release's deploy/ directory (crds/, operator.yaml, rbac.yaml).
        #[arg(long)]
        manifests: PathBuf,
        /// Also wait for approval before this step (repeatable), e.g.
        /// SwitchStorage: the last point a rollback can undo.
        #[arg(long = "gate")]
        gates: Vec<String>,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Print a plan's steps and conditions (the newest plan when no name is given).
    Status {
        name: Option<String>,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Approve the plan's gated step (the one awaiting approval, or --step).
    Approve {
        name: Option<String>,
        #[arg(long)]
        step: Option<String>,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Restore the previous CRDs and operator, before the storage version
    /// switched; refused with the reason after it (exit 2). Waits until done.
    Rollback {
        name: Option<String>,
        /// How long to wait for the rollback, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Kubeconfig to use; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Watch and manage only these namespaces (comma-separated; rights
    /// granted there suffice, e.g. RoleBindings); all namespaces when absent.
    #[arg(long, env = "SLOTKEEPER_NAMESPACE", value_delimiter = ',')]
    namespace: Vec<String>,
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
    #[command(flatten)]
    webhook: WebhookArgs,
}

/// The conversion webhook (every replica serves it).
#[derive(clap::Args)]
struct WebhookArgs {
    /// Where the conversion webhook is served over HTTPS.
    #[arg(long, default_value = "0.0.0.0:9443", env = "SLOTKEEPER_WEBHOOK_ADDR")]
    webhook_addr: std::net::SocketAddr,
    /// The Service in the operator's namespace that the CRDs send conversions to (port 443).
    #[arg(long, default_value = "slotkeeper-webhook")]
    webhook_service: String,
    /// Point the CRDs at this https:// URL instead of the Service (where the
    /// apiserver cannot route to a Service, as in the local environment).
    #[arg(long, env = "SLOTKEEPER_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// The Secret in the operator's namespace holding the webhook's CA and certificate.
    #[arg(long, default_value = "slotkeeper-webhook-tls")]
    webhook_secret: String,
    /// Lifetime of a new webhook CA, in seconds (default one year).
    #[arg(long, default_value_t = 365 * 24 * 3600, env = "SLOTKEEPER_WEBHOOK_CA_LIFETIME_SECONDS")]
    webhook_ca_lifetime_seconds: u64,
    /// Lifetime of a new serving certificate, in seconds (default 90 days);
    /// each is renewed when a third of it is left.
    #[arg(long, default_value_t = 90 * 24 * 3600, env = "SLOTKEEPER_WEBHOOK_CERT_LIFETIME_SECONDS")]
    webhook_cert_lifetime_seconds: u64,
    /// How often each replica re-reads the webhook Secret, in seconds.
    #[arg(long, default_value_t = 10, env = "SLOTKEEPER_WEBHOOK_RELOAD_SECONDS")]
    webhook_reload_seconds: u64,
}

impl WebhookArgs {
    fn config(&self, namespace: &str) -> anyhow::Result<WebhookConfig> {
        let endpoint = match &self.webhook_url {
            Some(url) => Endpoint::url(url).map_err(anyhow::Error::msg)?,
            None => Endpoint::Service { namespace: namespace.into(), name: self.webhook_service.clone(), port: 443 },
        };
        let seconds = std::time::Duration::from_secs;
        anyhow::ensure!(
            self.webhook_cert_lifetime_seconds >= 30
                && self.webhook_ca_lifetime_seconds >= self.webhook_cert_lifetime_seconds,
            "--webhook-cert-lifetime-seconds must be at least 30 and at most --webhook-ca-lifetime-seconds"
        );
        Ok(WebhookConfig {
            listen: self.webhook_addr,
            endpoint,
            secret_namespace: namespace.into(),
            secret_name: self.webhook_secret.clone(),
            lifetimes: Lifetimes {
                ca: seconds(self.webhook_ca_lifetime_seconds),
                serving: seconds(self.webhook_cert_lifetime_seconds),
            },
            reload_every: seconds(self.webhook_reload_seconds.max(1)),
        })
    }
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
        let result = tokio::runtime::Builder::new_current_thread()
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
        Command::Admission => {
            print!("{}", slotkeeper_api::admission::admission_yaml());
            Ok(())
        }
        Command::Crd => {
            print!("{}", slotkeeper_api::crds_yaml());
            Ok(())
        }
        Command::Run(args) => tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run(*args)),
        Command::Upgrade(command) => {
            let done = tokio::runtime::Runtime::new()?.block_on(upgrade(command))?;
            if !done {
                std::process::exit(2);
            }
            Ok(())
        }
    }
}

/// Runs an `upgrade` subcommand; `Ok(false)` when it was refused.
async fn upgrade(command: UpgradeCommand) -> anyhow::Result<bool> {
    let client = |kubeconfig: Option<PathBuf>| async move {
        anyhow::Ok(kube::Client::try_from(client_config(kubeconfig.as_deref()).await?)?)
    };
    match command {
        UpgradeCommand::Plan { manifests, kubeconfig } => {
            upgrade_cli::print_plan(&client(kubeconfig).await?, &manifests).await
        }
        UpgradeCommand::Apply { manifests, gates, kubeconfig } => {
            upgrade_cli::apply(&client(kubeconfig).await?, &manifests, &gates).await
        }
        UpgradeCommand::Status { name, kubeconfig } => {
            upgrade_cli::status(&client(kubeconfig).await?, name.as_deref()).await.map(|_| true)
        }
        UpgradeCommand::Approve { name, step, kubeconfig } => {
            upgrade_cli::approve(&client(kubeconfig).await?, name.as_deref(), step.as_deref()).await.map(|_| true)
        }
        UpgradeCommand::Rollback { name, timeout_seconds, kubeconfig } => {
            let timeout = std::time::Duration::from_secs(timeout_seconds);
            upgrade_cli::rollback(&client(kubeconfig).await?, name.as_deref(), timeout).await
        }
    }
}

/// The kubeconfig at `path`, or the in-cluster configuration ($KUBECONFIG).
async fn client_config(path: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    Ok(match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    })
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.init(),
    }
    let config = client_config(args.kubeconfig.as_deref()).await?;
    let metrics = Arc::new(Metrics::default());
    let client =
        kube::client::ClientBuilder::try_from(config.clone())?.with_layer(&CountRequestsLayer(metrics.clone())).build();
    // First, before any cache: the apiserver may need conversions to list
    // what the caches are about to watch.
    let webhook_config = args.webhook.config(&args.leader_election_namespace)?;
    let keeper = Keeper::start(client.clone(), webhook_config).await?;
    let mut webhook = tokio::spawn(keeper.clone().serve(metrics.clone()));
    tokio::spawn(keeper.clone().follow());
    tokio::spawn(manage_upgrades(
        client.clone(),
        keeper.clone(),
        args.instance.clone(),
        args.leader_election_namespace.clone(),
        args.leader_elect,
    ));
    let namespaces = Namespaces::parse(&args.namespace)?;
    // Fed on every replica: a standby serves the console too.
    let (readmodel, publisher) = slotkeeper_readmodel::start(client.clone(), &namespaces);

    let ready = Arc::new(AtomicBool::new(false));
    let metrics_auth = Some(Arc::new(slotkeeper_operator::metrics_auth::MetricsAuth::new(client.clone())));
    let mut app = server::router(ServerState { metrics: metrics.clone(), ready: ready.clone(), metrics_auth });
    if args.console {
        app = app.merge(slotkeeper_console::router(slotkeeper_console::ConsoleConfig {
            readmodel: readmodel.clone(),
            client: client.clone(),
            user_config: config,
            key_namespace: args.leader_election_namespace.clone(),
        }));
    }
    let mut server = serve_apart(args.http_addr, app)?;
    tracing::info!(namespaces = namespaces.describe(), instance = %args.instance, console = args.console, "slotkeeper operator starting");

    let (caches, triggers) = Caches::new(&client, &namespaces);
    let ctx = Arc::new(Context::new(client.clone(), args.instance.clone(), metrics, caches, publisher.clone()));
    if !args.leader_elect {
        ready.store(true, Ordering::Relaxed);
        controller::run(ctx, triggers, &namespaces).await;
        tracing::info!("slotkeeper operator stopped");
        return Ok(());
    }
    let reconciled = ctx.reconciled_counter();
    let identity = args.instance.clone();
    let elector = LeaderElector::new(client.clone(), &args.leader_election_namespace, args.instance).annotate(
        Box::new(move || {
            std::collections::BTreeMap::from([
                (LEASE_RELEASE_ANNOTATION.to_string(), RELEASE.to_string()),
                (LEASE_RECONCILED_ANNOTATION.to_string(), reconciled().to_string()),
                (LEASE_ANNOTATED_BY_ANNOTATION.to_string(), identity.clone()),
            ])
        }),
    );
    // A standby is healthy and ready: it is waiting to take over, and serves the console.
    ready.store(true, Ordering::Relaxed);
    let sampler = Sampler::new(client, readmodel, publisher);
    tokio::select! {
        // A release newer than the installed CRDs (the upgrade manager's
        // Pod, before the plan installs them) serves the webhook and waits.
        _ = async { wait_until_served(&ctx.client).await; elector.acquire().await } => {}
        _ = sampler.run() => {}
        _ = tokio::signal::ctrl_c() => return Ok(()),
        result = &mut server => anyhow::bail!("HTTP server stopped: {result:?}"),
        result = &mut webhook => anyhow::bail!("conversion webhook stopped: {result:?}"),
    }
    // Leading now: reconciles publish what they observe; the sampler stops.
    drop(sampler);
    tokio::select! {
        _ = controller::run(ctx, triggers, &namespaces) => {
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

/// Waits until the installed RedisCluster CRD serves this release's API version.
async fn wait_until_served(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let version = slotkeeper_api::API_VERSION.rsplit('/').next().unwrap_or_default();
    let mut said = false;
    loop {
        match crds.get_opt("redisclusters.slotkeeper.io").await {
            Ok(Some(crd)) if crd.spec.versions.iter().any(|v| v.name == version && v.served) => return,
            Ok(_) if !said => {
                tracing::info!(%version, "the installed CRDs do not serve this release's version yet: serving the conversion webhook and waiting (an upgrade plan installs them)");
                said = true;
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "reading the RedisCluster CRD failed"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// The upgrade manager's role: the holder of its Lease keeps the webhook's
/// certificates and the CRDs' conversion, and advances upgrade plans to this
/// release. Held apart from the operator's Lease, so a new release's Pod can
/// run a plan while the previous release still operates the clusters.
async fn manage_upgrades(
    client: kube::Client,
    keeper: Arc<Keeper>,
    instance: String,
    namespace: String,
    leader_elect: bool,
) {
    let conversion: ConversionSource = {
        let keeper = keeper.clone();
        Arc::new(move || {
            let keeper = keeper.clone();
            Box::pin(async move { keeper.ready_conversion().await.map_err(|e| e.to_string()) })
        })
    };
    let manager = Manager { client: client.clone(), release: RELEASE.into(), conversion };
    if !leader_elect {
        tokio::spawn(keeper.lead());
        return manager.run().await;
    }
    let elector = LeaderElector::new(client, &namespace, instance).lease(MANAGER_LEASE);
    elector.acquire().await;
    tokio::spawn(keeper.lead());
    tokio::select! {
        _ = manager.run() => {}
        _ = elector.hold() => {
            tracing::error!("lost the upgrade manager Lease; exiting");
            std::process::exit(1);
        }
    }
}
