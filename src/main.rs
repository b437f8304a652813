//! `slotkeeper`: the operator binary. It wires the operator, the console and
//! the upgrade manager behind subcommands.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

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
    /// Print the CustomResourceDefinitions as YAML (what deploy/crds holds).
    Crd,
}

fn main() {
    match Cli::parse().command {
        Command::Crd => print!("{}", slotkeeper_operator::api::crds_yaml()),
    }
}
