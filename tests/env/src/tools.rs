//! Where the environment's executables live. Every path can be overridden by an
//! environment variable; defaults follow the layout the set-up script creates.

use std::path::{Path, PathBuf};

/// The repository's root directory: the checkout the process runs in (cargo
/// runs tests and benches from their package's directory, and the scripts
/// `cd` to the root first), else the one this crate was built from. Found at
/// run time because one build cache serves several checkouts (CI clones):
/// the compile-time path would point every one of them at whichever checkout
/// built the crate last — its manifests, its control plane, its screenshots.
pub fn repo_root() -> PathBuf {
    let is_root = |dir: &Path| dir.join("tests/k8s/build.sh").is_file() && dir.join("deploy").is_dir();
    let running_in =
        std::env::current_dir().ok().and_then(|cwd| cwd.ancestors().find(|d| is_root(d)).map(Path::to_owned));
    running_in.unwrap_or_else(|| {
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        built_from.canonicalize().unwrap_or(built_from)
    })
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
