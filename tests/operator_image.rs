//! The operator image built from scratch by deploy/image/build.sh (buildah,
//! a static binary, a non-root user entry) and run by the node agent from the
//! image's own root filesystem, as deploy/operator.yaml asks: both replicas
//! run /slotkeeper as user 65532 with a read-only root, and the leader brings
//! a RedisCluster up. The distroless Dockerfile declares the same user and
//! entrypoint (its base image cannot be pulled here, so it is read, not built).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::operator::{apply_cluster, wait_settled};
use common::release::{OPERATOR_NAMESPACE, next_image, next_manifests, operator_pods, rolled_out};
use common::*;
use kube::Api;
use serde_json::{Value, json};
use slotkeeper_env::{Environment, tools};
use slotkeeper_operator::api::RedisCluster;

const LAYOUT: &str = "target/image/slotkeeper";
const NONROOT: u32 = 65532;

fn image_env() -> &'static Environment {
    shared_env_with(|| vec![json!({"pattern": next_image(), "oci": LAYOUT})])
}

/// The built image's config, read from its OCI layout.
fn image_config() -> Value {
    let layout = tools::repo_root().join(LAYOUT);
    let read = |path: PathBuf| -> Value {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (build the image: bash deploy/image/build.sh)", path.display()));
        serde_json::from_str(&text).unwrap()
    };
    let blob =
        |digest: &Value| layout.join("blobs/sha256").join(digest.as_str().unwrap().trim_start_matches("sha256:"));
    let index = read(layout.join("index.json"));
    let manifest = read(blob(&index["manifests"][0]["digest"]));
    read(blob(&manifest["config"]["digest"]))
}

/// Processes whose root directory is an operator Pod's unpacked image.
fn operator_processes() -> Vec<u32> {
    let pods = tools::repo_root().join("target/e2e/operator_image/node-agent/pods");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/root"))
                .is_ok_and(|root| root.starts_with(&pods) && root.ends_with("containers/slotkeeper/rootfs"))
        })
        .collect()
}

fn status_ids(pid: u32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {status}"));
    line.split_whitespace().skip(1).map(|n| n.parse().unwrap()).collect()
}

/// The mount options of `/` as the process itself sees it.
fn root_mount_options(pid: u32) -> String {
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.get(4) == Some(&"/"))
        .unwrap_or_else(|| panic!("no / in the mount table of {pid}:\n{mounts}"));
    root[5].to_owned()
}

#[tokio::test]
async fn the_scratch_image_runs_the_operator_as_non_root_on_a_read_only_root() {
    let config = image_config();
    assert_eq!(config["config"]["Entrypoint"], json!(["/slotkeeper"]), "{config}");
    assert_eq!(config["config"]["User"], json!(format!("{NONROOT}:{NONROOT}")), "{config}");

    let env = image_env();
    let manifests = next_manifests();
    for file in [
        "00-namespace.yaml",
        "crds/slotkeeper.io.yaml",
        "rbac.yaml",
        "console-rbac.yaml",
        "admission.yaml",
        "operator.yaml",
    ] {
        let path = manifests.path().join(file);
        let (ok, out) = kubectl(env, &["apply", "--server-side", "-f", path.to_str().unwrap()], None);
        assert!(ok, "{file}: {out}");
    }
    rolled_out(env, "slotkeeper");

    let processes = operator_processes();
    assert_eq!(processes.len(), 2, "one process per replica, each in its own copy of the image: {processes:?}");
    for pid in &processes {
        let argv = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(argv.starts_with("/slotkeeper\0run\0"), "the image's entrypoint with the Deployment's args: {argv:?}");
        assert_eq!(status_ids(*pid, "Uid:"), [NONROOT; 4], "process {pid} runs as the non-root user");
        assert_eq!(status_ids(*pid, "Gid:"), [NONROOT; 4], "process {pid} runs in the non-root group");
        let options = root_mount_options(*pid);
        assert!(options.split(',').any(|o| o == "ro"), "process {pid} sees / read-only: {options}");
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert!(exe.ends_with("rootfs/slotkeeper"), "the image's own binary runs: {}", exe.display());
    }

    // The leader does its work from inside the image.
    let kube = env.client().await.unwrap();
    let ns = namespace(&kube, "image").await;
    apply_cluster(env, &ns, "boxed", 3, 1);
    let clusters: Api<RedisCluster> = Api::namespaced(kube.clone(), &ns);
    wait_settled(&clusters, "boxed", 3, 6, Duration::from_secs(240)).await;
    let holder = "jsonpath={.spec.holderIdentity}";
    let (ok, leader) =
        kubectl(env, &["get", "lease", "slotkeeper-leader", "-n", OPERATOR_NAMESPACE, "-o", holder], None);
    let replicas = operator_pods(&kube).await;
    assert!(ok && replicas.contains_key(leader.trim()), "one of {replicas:?} holds the leader Lease: {leader}");
}

/// Both recipes make the same promise: /slotkeeper as the entrypoint and a
/// non-root user. The Dockerfile's base (distroless `:nonroot`) cannot be
/// pulled here; what it declares is checked.
#[test]
fn both_image_recipes_start_the_operator_as_a_non_root_user() {
    let root = tools::repo_root();
    let stage = |file: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<String> =
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect();
        let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).expect("a FROM");
        lines[last_from..].to_vec()
    };
    let docker = stage(&root.join("Dockerfile"));
    assert!(docker[0].ends_with(":nonroot"), "the distroless nonroot base: {docker:?}");
    assert!(docker.contains(&"USER nonroot:nonroot".to_string()), "{docker:?}");
    assert!(docker.contains(&r#"ENTRYPOINT ["/slotkeeper"]"#.to_string()), "{docker:?}");
    let scratch = stage(&root.join("deploy/image/Containerfile"));
    assert_eq!(scratch[0], "FROM scratch", "{scratch:?}");
    assert!(scratch.contains(&format!("USER {NONROOT}:{NONROOT}")), "{scratch:?}");
    assert!(scratch.contains(&r#"ENTRYPOINT ["/slotkeeper"]"#.to_string()), "{scratch:?}");
    let passwd = std::fs::read_to_string(root.join("deploy/image/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with(&format!("nonroot:x:{NONROOT}:{NONROOT}:"))), "{passwd}");
    // The Deployment runs either image as that user, on a read-only root.
    let operator = std::fs::read_to_string(root.join("deploy/operator.yaml")).unwrap();
    for setting in [format!("runAsUser: {NONROOT}"), "runAsNonRoot: true".into(), "readOnlyRootFilesystem: true".into()]
    {
        assert!(operator.contains(&setting), "deploy/operator.yaml sets {setting}");
    }
}
