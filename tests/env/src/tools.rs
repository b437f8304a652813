//! Where the environment's executables live. Every path can be overridden by an
//! environment variable; defaults follow the layout the set-up script creates.

use std::path::{Path, PathBuf};

/// The repository's root directory (this crate lives in `tests/env`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// A control-plane binary (`etcd`, `kube-apiserver`, ..., `kubectl`) built by
/// `tests/k8s/build.sh`.
pub fn control_plane_binary(name: &str) -> Result<PathBuf, String> {
    let dir =
        std::env::var_os("SLOTKEEPER_K8S_BIN").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/k8s/bin"));
    existing(dir.join(name), "run tests/setup.sh (it builds the control plane with tests/k8s/build.sh)")
}

/// A binary of this workspace (the node agent, the operator), looked up beside
/// the running executable: `target/<profile>/` for binaries, its parent for tests.
pub fn workspace_binary(name: &str) -> Result<PathBuf, String> {
    let override_var = format!("SLOTKEEPER_BIN_{}", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&override_var) {
        return existing(PathBuf::from(path), &format!("{override_var} points at a missing file"));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        let candidate = d.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
        if d.file_name().is_some_and(|n| n == "target") {
            break;
        }
        dir = d.parent();
    }
    Err(format!(
        "cannot find the {name} binary beside {}; build it first (cargo build --workspace --bins) or set {override_var}",
        exe.display()
    ))
}

fn existing(path: PathBuf, hint: &str) -> Result<PathBuf, String> {
    if path.is_file() { Ok(path) } else { Err(format!("{} does not exist: {hint}", path.display())) }
}
