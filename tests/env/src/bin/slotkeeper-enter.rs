//! `slotkeeper-enter`: the last step of starting a container from an image's
//! root filesystem, run by the node agent inside the container's mount
//! namespace once its volumes are mounted: change root, change to the
//! working directory, drop to the container's user, and become its process.
#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use clap::Parser;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Pid, Uid, getppid, setgid, setgroups, setuid};

#[derive(Parser)]
#[command(about = "Runs a command inside a root filesystem as a given user (the node agent's container start)")]
struct Args {
    #[arg(long)]
    root: PathBuf,
    #[arg(long, default_value = "/")]
    workdir: PathBuf,
    #[arg(long)]
    uid: u32,
    #[arg(long)]
    gid: u32,
    #[arg(last = true, required = true)]
    argv: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let fail = |what: String| -> ! {
        eprintln!("slotkeeper-enter: {what}");
        std::process::exit(127)
    };
    std::os::unix::fs::chroot(&args.root).unwrap_or_else(|e| fail(format!("chroot {}: {e}", args.root.display())));
    std::env::set_current_dir(&args.workdir)
        .unwrap_or_else(|e| fail(format!("working directory {}: {e}", args.workdir.display())));
    let program = resolve(&args.argv[0]).unwrap_or_else(|| fail(format!("{}: not found in the image", args.argv[0])));
    let (uid, gid) = (Uid::from_raw(args.uid), Gid::from_raw(args.gid));
    setgroups(&[])
        .and_then(|()| setgid(gid))
        .and_then(|()| setuid(uid))
        .unwrap_or_else(|e| fail(format!("cannot become user {}:{}: {e}", args.uid, args.gid)));
    // Changing the user clears the parent-death signal the agent set: set it
    // again, so the container still dies with the node agent.
    prctl::set_pdeathsig(Signal::SIGKILL).unwrap_or_else(|e| fail(format!("parent-death signal: {e}")));
    if getppid() == Pid::from_raw(1) {
        fail("the node agent is gone".into());
    }
    let error = std::process::Command::new(program).arg0(&args.argv[0]).args(&args.argv[1..]).exec();
    fail(format!("cannot start {}: {error}", args.argv[0]))
}

/// `program` as a path inside the new root: as given when it has a slash,
/// else the first match on the container's PATH.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}
