//! `slotkeeper`: the operator binary. It wires the operator, the console and
//! the upgrade manager; their subcommands (`run`, `crd`, `upgrade`) arrive with
//! the issues that build them.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "slotkeeper",
    version,
    about = "Kubernetes operator for Redis Cluster"
)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    eprintln!(
        "slotkeeper {}: no subcommand is implemented yet; see README.md",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
