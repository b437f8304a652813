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
    println!("Logs: {}  (Pods: node-agent/pods/<ns>_<pod>_<uid>/containers/<c>/output.log)", dir.display());
    println!("Press Ctrl-C to stop everything.");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping ...");
    drop(env);
    eprintln!("stopped");
    Ok(())
}
