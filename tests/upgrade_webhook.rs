//! The conversion webhook with certificates that live 30 s (CA 60 s):
//! serving certificates and the CA rotate, the CRDs' caBundle follows, and
//! reads and writes at v1alpha1 (converted from and to v1 storage) never
//! fail meanwhile, per kubectl and per the apiserver's log.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::operator::*;
use common::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use slotkeeper_api::v1alpha1;

fn old_cluster(ns: &str, masters: i32) -> String {
    let api = v1alpha1::API_VERSION;
    format!(
        "apiVersion: {api}\nkind: RedisCluster\nmetadata: {{name: old, namespace: {ns}}}\nspec: {{masters: {masters}, version: 7.0.15, paused: true}}\n"
    )
}

fn bundle(crd: &CustomResourceDefinition) -> String {
    let config = crd.spec.conversion.as_ref().and_then(|c| c.webhook.as_ref()).and_then(|w| w.client_config.as_ref());
    config.and_then(|c| c.ca_bundle.as_ref()).map(|b| String::from_utf8_lossy(&b.0).into_owned()).unwrap_or_default()
}

#[tokio::test]
async fn certificates_rotate_and_the_ca_bundle_follows_with_no_conversion_failing() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    let short = [
        ("SLOTKEEPER_WEBHOOK_CERT_LIFETIME_SECONDS", "30"),
        ("SLOTKEEPER_WEBHOOK_CA_LIFETIME_SECONDS", "60"),
        ("SLOTKEEPER_WEBHOOK_RELOAD_SECONDS", "2"),
    ];
    let _operator = start_operator_with(env, "slotkeeper-0", &short);
    let ns = namespace(&client, "webhook-rotation").await;
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&old_cluster(&ns, 3)));
    assert!(ok, "a v1alpha1 write converts to v1: {out}");
    let (_, stored) =
        kubectl(env, &["get", "rdc.v1.slotkeeper.io", "old", "-n", &ns, "-o", "jsonpath={.spec.redis.version}"], None);
    assert_eq!(stored.trim(), "7.0.15", "stored as v1, spec.version under spec.redis");

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "slotkeeper-system");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let (mut serving, mut authorities, mut bundles) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let (mut reads, mut writes, mut failures) = (0, 0, Vec::new());
    let started = Instant::now();
    let mut masters = 3;
    let old_path = format!("/apis/slotkeeper.io/v1alpha1/namespaces/{ns}/redisclusters/old");
    while started.elapsed() < Duration::from_secs(100) {
        // By path: kubectl maps the short name to the preferred version.
        let (ok, out) = kubectl(env, &["get", "--raw", &old_path], None);
        reads += 1;
        if !ok || !out.contains(r#""apiVersion":"slotkeeper.io/v1alpha1""#) || !out.contains(r#""version":"7.0.15""#) {
            failures.push(format!("read at {:?}: {out}", started.elapsed()));
        }
        if reads % 10 == 0 {
            masters = if masters == 3 { 4 } else { 3 };
            let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&old_cluster(&ns, masters)));
            writes += 1;
            if !ok {
                failures.push(format!("write at {:?}: {out}", started.elapsed()));
            }
        }
        let secret = secrets.get("slotkeeper-webhook-tls").await.unwrap();
        let data = secret.data.unwrap();
        serving.insert(String::from_utf8_lossy(&data["tls.crt"].0).into_owned());
        authorities.insert(String::from_utf8_lossy(&data["ca.crt"].0).into_owned());
        bundles.insert(bundle(&crds.get("redisclusters.slotkeeper.io").await.unwrap()));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(failures.is_empty(), "{} of {reads} reads and {writes} writes failed: {failures:#?}", failures.len());
    assert!(serving.len() >= 4, "serving certificates rotated: {} seen", serving.len());
    assert!(authorities.len() >= 2, "the CA rotated: {} seen", authorities.len());
    assert!(bundles.len() >= 2, "the caBundle followed: {} seen", bundles.len());
    let secret = secrets.get("slotkeeper-webhook-tls").await.unwrap().data.unwrap();
    let current_ca = String::from_utf8_lossy(&secret["ca.crt"].0).into_owned();
    for name in ["redisclusters.slotkeeper.io", "redisoperations.slotkeeper.io"] {
        assert!(bundle(&crds.get(name).await.unwrap()).contains(current_ca.trim()), "{name} trusts the current CA");
    }
    let log = std::fs::read_to_string(env.control_plane().apiserver_log()).unwrap();
    let failed: Vec<&str> =
        log.lines().filter(|l| l.contains("conversion webhook") || l.contains("webhook-conversion")).collect();
    assert!(failed.is_empty(), "the apiserver logged conversion failures: {failed:#?}");
    println!(
        "{reads} reads and {writes} writes at v1alpha1 in 100 s, none failed; {} serving certificates, {} CAs, {} caBundles",
        serving.len(),
        authorities.len(),
        bundles.len()
    );
}
