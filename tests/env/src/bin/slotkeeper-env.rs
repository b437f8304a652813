//! `slotkeeper-env`: the local environment for a newcomer. Starts the control
//! plane and the node agent, prints how to reach them, and stops everything on
//! Ctrl-C (or SIGTERM), leaving no process behind.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
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
    let webhook_port = if std::net::TcpListener::bind(("127.0.0.1", WEBHOOK_PORT)).is_ok() {
        WEBHOOK_PORT
    } else {
        slotkeeper_env::control_plane::free_port()?
    };
    let (image, operator_yaml) = runnable_operator(&tools::repo_root(), webhook_port)?;
    let extra_images = vec![operator_image(&image)?];
    let options = EnvironmentOptions { dir: Some(dir.clone()), extra_images, ..Default::default() };
    let env = Environment::start(options).await?;
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
    if !args.no_operator {
        start_operator(&env, webhook_port, &operator_yaml)?;
    }
    println!("Logs: {}  (Pods: node-agent/pods/<ns>_<pod>_<uid>/containers/<c>/output.log)", dir.display());
    println!("Press Ctrl-C to stop everything.");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping ...");
    // The node agent stops every Pod (the operator's too) as it goes.
    drop(env);
    eprintln!("stopped");
    Ok(())
}

/// Where the conversion webhook is served when the port is free (else any free port).
const WEBHOOK_PORT: u16 = 9443;
/// The ServiceAccount a newcomer signs in to the console as.
const DEMO_USER: &str = "console-demo";

/// deploy/operator.yaml's Deployment as this environment runs it: its image
/// is this build (the node agent maps it), and its webhook listens at the
/// loopback URL the CRDs name (a Service cannot route to a Pod here).
fn runnable_operator(root: &std::path::Path, webhook_port: u16) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(root.join("deploy/operator.yaml"))?;
    let mut image = None;
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let mut document: serde_json::Value = serde::Deserialize::deserialize(document)?;
        if document["kind"] == "Deployment" {
            let container = document
                .pointer_mut("/spec/template/spec/containers/0")
                .ok_or_else(|| anyhow::anyhow!("deploy/operator.yaml: the Deployment has no container"))?;
            image = container["image"].as_str().map(String::from);
            let env = container["env"].as_array_mut().ok_or_else(|| anyhow::anyhow!("the container has no env"))?;
            let url = slotkeeper_env::crds::webhook_url(webhook_port);
            env.push(
                serde_json::json!({"name": "SLOTKEEPER_WEBHOOK_ADDR", "value": format!("127.0.0.1:{webhook_port}")}),
            );
            env.push(serde_json::json!({"name": "SLOTKEEPER_WEBHOOK_URL", "value": url}));
        }
        documents.push(serde_norway::to_string(&document)?);
    }
    let image = image.ok_or_else(|| anyhow::anyhow!("deploy/operator.yaml has no Deployment with an image"))?;
    Ok((image, documents.join("---\n")))
}

/// The image table entry that runs `image` as this build of the operator.
fn operator_image(image: &str) -> anyhow::Result<serde_json::Value> {
    let binary = tools::workspace_binary("slotkeeper").map_err(anyhow::Error::msg)?;
    Ok(serde_json::json!({"pattern": image, "entrypoint": ["slotkeeper"], "binaries": {"slotkeeper": binary}}))
}

/// Installs deploy/ (CRDs, namespace, RBAC, the operator's Deployment: two
/// Pods run by the node agent as its ServiceAccount), applies the example
/// RedisCluster and waits for it, then prints how to sign in to the console.
fn start_operator(env: &Environment, webhook_port: u16, operator_yaml: &str) -> anyhow::Result<()> {
    let root = tools::repo_root();
    let webhook_url = slotkeeper_env::crds::webhook_url(webhook_port);
    let crds = slotkeeper_env::crds::with_webhook_url(&root, &webhook_url)?;
    let (ok, out) = env.kubectl(&["apply", "--server-side", "-f", "-"], Some(&crds));
    anyhow::ensure!(ok, "kubectl apply -f deploy/crds: {out}");
    for manifest in
        ["deploy/00-namespace.yaml", "deploy/rbac.yaml", "deploy/console-rbac.yaml", "deploy/admission.yaml"]
    {
        let (ok, out) = env.kubectl(&["apply", "--server-side", "-f", root.join(manifest).to_str().unwrap()], None);
        anyhow::ensure!(ok, "kubectl apply -f {manifest}: {out}");
    }
    let (ok, out) = env.kubectl(&["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
    anyhow::ensure!(ok, "CRD not established: {out}");
    let (ok, out) = env.kubectl(&["apply", "--server-side", "-f", "-"], Some(operator_yaml));
    anyhow::ensure!(ok, "kubectl apply -f deploy/operator.yaml: {out}");
    let rollout = ["-n", "slotkeeper-system", "rollout", "status", "deployment/slotkeeper", "--timeout=180s"];
    let (ok, out) = env.kubectl(&rollout, None);
    anyhow::ensure!(ok, "the operator's Deployment did not roll out: {out}");
    println!("operator running as Deployment slotkeeper-system/slotkeeper (2 Pods, ServiceAccount slotkeeper)");
    // The example cluster's Pods are admitted by Pod Security `restricted`.
    let (ok, out) = env.kubectl(
        &["label", "--overwrite", "namespace", "default", "pod-security.kubernetes.io/enforce=restricted"],
        None,
    );
    anyhow::ensure!(ok, "kubectl label namespace default: {out}");
    let example = root.join("deploy/examples/rediscluster.yaml");
    let (ok, out) = env.kubectl(&["apply", "-f", example.to_str().unwrap()], None);
    anyhow::ensure!(ok, "kubectl apply -f {}: {out}", example.display());
    eprintln!("waiting for RedisCluster default/example to be Running ...");
    let (ok, out) = env
        .kubectl(&["wait", "--for=jsonpath={.status.phase}=Running", "--timeout=180s", "rediscluster/example"], None);
    anyhow::ensure!(
        ok,
        "the example cluster did not reach Running: {out}\n(operator logs: node-agent/pods/slotkeeper-system_*)"
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
    let selector = "-lapp.kubernetes.io/name=slotkeeper";
    let (_, ips) = env.kubectl(
        &["-n", "slotkeeper-system", "get", "pods", selector, "-o", "jsonpath={.items[*].status.podIP}"],
        None,
    );
    let consoles: Vec<String> = ips.split_whitespace().map(|ip| format!("http://{ip}:8080/")).collect();
    println!("The console (on every operator Pod, at its own address): {}", consoles.join("  "));
    println!(
        "  Sign in as ServiceAccount default/{DEMO_USER} (role slotkeeper-redis-operator in namespace default) with this token:"
    );
    println!("  {token}");
    println!("  (another: kubectl create token {DEMO_USER} -n default)");
    println!();
    Ok(())
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
