//! `slotkeeper-env`: the local environment for a newcomer. Starts the control
//! plane and the node agent, prints how to reach them, and stops everything on
//! Ctrl-C (or SIGTERM), leaving no process behind.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};
use slotkeeper_env::{Environment, EnvironmentOptions, tools};

#[derive(Parser)]
#[command(about = "Runs Slotkeeper's local Kubernetes environment until Ctrl-C")]
struct Args {
    /// State directory; wiped at start so a run after a crash starts clean.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the control plane and the node agent: no operator, no sample cluster.
    #[arg(long)]
    no_operator: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = args.dir.unwrap_or_else(|| tools::repo_root().join("target/local-env"));
    eprintln!("starting the control plane and the node agent in {} ...", dir.display());
    let started = std::time::Instant::now();
    let env = Environment::start(EnvironmentOptions { dir: Some(dir.clone()), ..Default::default() }).await?;
    let kubectl = tools::control_plane_binary("kubectl").map_err(anyhow::Error::msg)?;
    println!(
        "apiserver /readyz after {:.1}s; {} Nodes Ready after {:.1}s",
        env.control_plane().ready_after().as_secs_f64(),
        env.nodes().len(),
        started.elapsed().as_secs_f64()
    );
    println!();
    println!("In another shell:");
    println!("  export KUBECONFIG={}", env.kubeconfig().display());
    println!("  export PATH={}:$PATH", kubectl.parent().expect("bin dir").display());
    println!("  kubectl get nodes,pods -A");
    println!();
    let operator = if args.no_operator { None } else { Some(start_operator(&env, &dir)?) };
    println!("Logs: {}  (Pods: node-agent/pods/<ns>_<pod>_<uid>/containers/<c>/output.log)", dir.display());
    println!("Press Ctrl-C to stop everything.");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping ...");
    drop(operator);
    drop(env);
    eprintln!("stopped");
    Ok(())
}

/// Where the console is served when the port is free (else any free port).
const CONSOLE_PORT: u16 = 8080;
/// Where the conversion webhook is served when the port is free (else any free port).
const WEBHOOK_PORT: u16 = 9443;
/// The ServiceAccount a newcomer signs in to the console as.
const DEMO_USER: &str = "console-demo";

/// Installs deploy/ (CRDs, namespace, RBAC), runs the operator as its
/// ServiceAccount, applies the example RedisCluster and waits for it, then
/// prints how to sign in to the console.
fn start_operator(env: &Environment, dir: &std::path::Path) -> anyhow::Result<ManagedProcess> {
    let root = tools::repo_root();
    let webhook_port = if std::net::TcpListener::bind(("127.0.0.1", WEBHOOK_PORT)).is_ok() {
        WEBHOOK_PORT
    } else {
        slotkeeper_env::control_plane::free_port()?
    };
    let webhook_url = slotkeeper_env::crds::webhook_url(webhook_port);
    let crds = slotkeeper_env::crds::with_webhook_url(&root, &webhook_url)?;
    let (ok, out) = env.kubectl(&["apply", "--server-side", "-f", "-"], Some(&crds));
    anyhow::ensure!(ok, "kubectl apply -f deploy/crds: {out}");
    for manifest in ["deploy/00-namespace.yaml", "deploy/rbac.yaml", "deploy/console-rbac.yaml"] {
        let (ok, out) = env.kubectl(&["apply", "--server-side", "-f", root.join(manifest).to_str().unwrap()], None);
        anyhow::ensure!(ok, "kubectl apply -f {manifest}: {out}");
    }
    let (ok, out) = env.kubectl(&["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
    anyhow::ensure!(ok, "CRD not established: {out}");
    let kubeconfig = dir.join("operator.kubeconfig");
    env.service_account_kubeconfig("slotkeeper-system", "slotkeeper", &kubeconfig).map_err(anyhow::Error::msg)?;
    let binary = tools::workspace_binary("slotkeeper").map_err(anyhow::Error::msg)?;
    let port = if std::net::TcpListener::bind(("127.0.0.1", CONSOLE_PORT)).is_ok() {
        CONSOLE_PORT
    } else {
        slotkeeper_env::control_plane::free_port()?
    };
    let operator = ManagedProcess::spawn(
        ProcessSpec::new("slotkeeper", binary, dir.join("operator.log"))
            .args(["run", "--instance", "slotkeeper-local", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg(format!("--http-addr=127.0.0.1:{port}"))
            .arg(format!("--webhook-addr=127.0.0.1:{webhook_port}"))
            .arg(format!("--webhook-url={webhook_url}")),
    )?;
    println!(
        "operator running as ServiceAccount slotkeeper-system/slotkeeper; metrics on http://127.0.0.1:{port}/metrics"
    );
    let example = root.join("deploy/examples/rediscluster.yaml");
    let (ok, out) = env.kubectl(&["apply", "-f", example.to_str().unwrap()], None);
    anyhow::ensure!(ok, "kubectl apply -f {}: {out}", example.display());
    eprintln!("waiting for RedisCluster default/example to be Running ...");
    let (ok, out) = env
        .kubectl(&["wait", "--for=jsonpath={.status.phase}=Running", "--timeout=180s", "rediscluster/example"], None);
    anyhow::ensure!(
        ok,
        "the example cluster did not reach Running: {out}\n(operator log: {})",
        dir.join("operator.log").display()
    );
    let (_, ip) = env.kubectl(&["get", "pod", "example-shard-0-0", "-o", "jsonpath={.status.podIP}"], None);
    println!("RedisCluster default/example is Running:");
    println!("  kubectl get rdc");
    println!("  kubectl describe rdc example");
    println!(
        "  redis-cli -c -h {ip} -a \"$(kubectl get secret example-password -o jsonpath='{{.data.password}}' | base64 -d)\" --no-auth-warning"
    );
    println!();
    let token = demo_user(env)?;
    println!("The console: http://127.0.0.1:{port}/");
    println!(
        "  Sign in as ServiceAccount default/{DEMO_USER} (role slotkeeper-redis-operator in namespace default) with this token:"
    );
    println!("  {token}");
    println!("  (another: kubectl create token {DEMO_USER} -n default)");
    println!();
    Ok(operator)
}

/// A ServiceAccount bound to the operator role in `default`, and a token for it.
fn demo_user(env: &Environment) -> anyhow::Result<String> {
    let manifest = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {DEMO_USER}, namespace: default}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {DEMO_USER}-redis-operator, namespace: default}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: slotkeeper-redis-operator}}\n\
         subjects: [{{kind: ServiceAccount, name: {DEMO_USER}, namespace: default}}]\n"
    );
    let (ok, out) = env.kubectl(&["apply", "-f", "-"], Some(&manifest));
    anyhow::ensure!(ok, "cannot create the console's demo user: {out}");
    let (ok, token) = env.kubectl(&["-n", "default", "create", "token", DEMO_USER, "--duration=24h"], None);
    anyhow::ensure!(ok, "cannot get a token for {DEMO_USER}: {token}");
    Ok(token.trim().to_owned())
}
