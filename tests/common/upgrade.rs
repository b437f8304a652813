//! The previous release (this repository at the commit upgrade/PREVIOUS_RELEASE
//! names) and the CRD states an upgrade goes through.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use slotkeeper_env::Environment;

use super::*;

/// The commit of the release Slotkeeper's own upgrade is tested from.
pub fn previous_release_commit() -> String {
    let text = std::fs::read_to_string(tools::repo_root().join("upgrade/PREVIOUS_RELEASE")).unwrap();
    text.lines().map(str::trim).rfind(|l| !l.is_empty() && !l.starts_with('#')).unwrap().to_string()
}

/// A file of the previous release, as its commit has it.
pub fn previous_release_file(path: &str) -> String {
    let commit = previous_release_commit();
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(tools::repo_root())
        .args(["show", &format!("{commit}:{path}")])
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git show {commit}:{path}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The CRDs as YAML, their conversion webhook at this binary's operators.
pub fn crds_yaml(crds: Vec<CustomResourceDefinition>) -> String {
    let url = slotkeeper_env::crds::webhook_url(webhook_port());
    let documents: Vec<String> = crds
        .into_iter()
        .map(|mut crd| {
            let config =
                crd.spec.conversion.as_mut().and_then(|c| c.webhook.as_mut()).and_then(|w| w.client_config.as_mut());
            if let Some(config) = config {
                config.service = None;
                config.url = Some(url.clone());
            }
            serde_norway::to_string(&crd).unwrap()
        })
        .collect();
    documents.join("---\n")
}

pub fn apply_yaml(env: &Environment, yaml: &str) {
    let (ok, out) = kubectl(env, &["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(yaml));
    assert!(ok, "kubectl apply: {out}");
}

/// Every object etcd holds under `prefix`, key and value (the bytes the
/// apiserver stored), read with etcdctl.
pub fn etcd_objects(env: &Environment, prefix: &str) -> Vec<(String, String)> {
    let (ok, out) = env.etcdctl(&["get", "--prefix", prefix]);
    assert!(ok, "etcdctl get --prefix {prefix}: {out}");
    let mut objects: Vec<(String, String)> = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        match objects.last_mut() {
            Some((_, value)) if value.is_empty() && !line.starts_with(prefix) => value.push_str(line),
            _ => objects.push((line.to_string(), String::new())),
        }
    }
    objects
}
