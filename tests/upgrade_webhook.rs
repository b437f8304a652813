//! The conversion webhook with certificates that live 30 s (CA 180 s):
//! serving certificates and the CA rotate and the CRDs' caBundle follows; a
//! storage migration running when the CA comes due holds its replacement
//! back (no CRD change while it runs, serving certificates renewed from the
//! trusted CA meanwhile), and reads and writes at v1alpha1 (converted from
//! and to v1 storage) never fail, per kubectl and per the apiserver's log.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::operator::*;
use common::upgrade::*;
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
};
use kube::Api;
use slotkeeper_api::v1alpha1;

const CRD: &str = "redisclusters.slotkeeper.io";

fn old_cluster(ns: &str, name: &str, masters: i32) -> String {
    let api = v1alpha1::API_VERSION;
    format!(
        "apiVersion: {api}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{masters: {masters}, version: 7.0.15, paused: true}}\n"
    )
}

fn bundle(crd: &CustomResourceDefinition) -> String {
    let config = crd.spec.conversion.as_ref().and_then(|c| c.webhook.as_ref()).and_then(|w| w.client_config.as_ref());
    config.and_then(|c| c.ca_bundle.as_ref()).map(|b| String::from_utf8_lossy(&b.0).into_owned()).unwrap_or_default()
}

/// `crd` converting through this binary's webhook URL, trusting `ca`.
fn with_webhook(mut crd: CustomResourceDefinition, ca: &[u8]) -> CustomResourceDefinition {
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                url: Some(slotkeeper_env::crds::webhook_url(webhook_port())),
                ca_bundle: Some(ByteString(ca.to_vec())),
                service: None,
            }),
            conversion_review_versions: vec!["v1".into()],
        }),
    });
    crd
}

/// What one round saw of the certificates and the CRD.
struct Seen {
    at: Instant,
    ca: String,
    serving: String,
    bundle: String,
    generation: i64,
}

/// Reads (and every tenth round writes) a cluster at v1alpha1 in rounds,
/// recording each failure and what the Secret and the CRD held.
struct Rounds<'a> {
    env: &'a slotkeeper_env::Environment,
    ns: String,
    secrets: Api<Secret>,
    crds: Api<CustomResourceDefinition>,
    seen: Vec<Seen>,
    reads: usize,
    writes: usize,
    failures: Vec<String>,
    masters: i32,
    started: Instant,
}

impl Rounds<'_> {
    async fn until(&mut self, deadline: Instant) {
        let path = format!("/apis/slotkeeper.io/v1alpha1/namespaces/{}/redisclusters/old", self.ns);
        while Instant::now() < deadline {
            // By path: kubectl maps the short name to the preferred version.
            let (ok, out) = kubectl(self.env, &["get", "--raw", &path], None);
            self.reads += 1;
            if !ok
                || !out.contains(r#""apiVersion":"slotkeeper.io/v1alpha1""#)
                || !out.contains(r#""version":"7.0.15""#)
            {
                self.failures.push(format!("read at {:?}: {out}", self.started.elapsed()));
            }
            if self.reads.is_multiple_of(10) {
                self.masters = if self.masters == 3 { 4 } else { 3 };
                let (ok, out) =
                    kubectl(self.env, &["apply", "-f", "-"], Some(&old_cluster(&self.ns, "old", self.masters)));
                self.writes += 1;
                if !ok {
                    self.failures.push(format!("write at {:?}: {out}", self.started.elapsed()));
                }
            }
            let data = self.secrets.get("slotkeeper-webhook-tls").await.unwrap().data.unwrap();
            let crd = self.crds.get(CRD).await.unwrap();
            self.seen.push(Seen {
                at: Instant::now(),
                ca: String::from_utf8_lossy(&data["ca.crt"].0).into_owned(),
                serving: String::from_utf8_lossy(&data["tls.crt"].0).into_owned(),
                bundle: bundle(&crd),
                generation: crd.metadata.generation.unwrap_or_default(),
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn between(&self, from: Instant, to: Instant) -> impl Iterator<Item = &Seen> {
        self.seen.iter().filter(move |s| s.at >= from && s.at <= to)
    }
}

#[tokio::test]
async fn certificates_rotate_the_ca_bundle_follows_and_no_ca_replacement_interrupts_a_storage_migration() {
    let env = shared_env();
    let client = env.client().await.unwrap();
    // Objects stored at v1alpha1 by the previous release's CRDs: "kept" is
    // never written again, so only the migration moves it to v1.
    apply_yaml(env, &previous_release_file("deploy/crds/slotkeeper.io.yaml"));
    let (ok, out) = kubectl(env, &["wait", "--for=condition=Established", &format!("crd/{CRD}")], None);
    assert!(ok, "{out}");
    let ns = namespace_with_pod_security(&client, "webhook-rotation", PREVIOUS_RELEASE_POD_SECURITY).await;
    for name in ["old", "kept"] {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&old_cluster(&ns, name, 3)));
        assert!(ok, "{out}");
    }
    let short = [
        ("SLOTKEEPER_WEBHOOK_CERT_LIFETIME_SECONDS", "30"),
        ("SLOTKEEPER_WEBHOOK_CA_LIFETIME_SECONDS", "180"),
        ("SLOTKEEPER_WEBHOOK_RELOAD_SECONDS", "2"),
    ];
    // As the upgrade plan does: the new release's webhook first, then its
    // CRDs pointing at it with its CA (conversion is needed at once).
    let operator = spawn_operator(env, "slotkeeper-0", &short);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "slotkeeper-system");
    let ca = wait_until("the webhook's Secret", Duration::from_secs(60), || async {
        let secret = secrets.get_opt("slotkeeper-webhook-tls").await.unwrap()?;
        Some(secret.data?.get("ca.crt")?.0.clone())
    })
    .await;
    apply_yaml(env, &crds_yaml(slotkeeper_api::crds().into_iter().map(|crd| with_webhook(crd, &ca)).collect()));
    wait_crds_converting(env);
    let (_, stored) = kubectl(env, &["get", "crd", CRD, "-o", "jsonpath={.status.storedVersions}"], None);
    assert_eq!(stored, r#"["v1alpha1","v1"]"#, "objects stored at both versions");

    let mut rounds = Rounds {
        env,
        ns: ns.clone(),
        secrets,
        crds: Api::all(client.clone()),
        seen: Vec::new(),
        reads: 0,
        writes: 0,
        failures: Vec::new(),
        masters: 3,
        started: Instant::now(),
    };
    // The first CA, issued as the operator started (a few seconds before its
    // first sighting), comes due 120 s later (two thirds of its life) and
    // expires at 180 s. A migration runs from 70 s to 125 s after the
    // sighting (the migrator, kube-controller-manager, held meanwhile), so
    // the CA comes due while it runs.
    rounds.until(Instant::now() + Duration::from_secs(1)).await;
    let first_ca = rounds.seen[0].ca.clone();
    let issued = rounds.seen[0].at;
    rounds.until(issued + Duration::from_secs(70)).await;
    let generation = rounds.seen.last().unwrap().generation;
    assert_eq!(rounds.seen.last().unwrap().ca, first_ca, "no CA replaced before the migration");
    assert!(rounds.seen.last().unwrap().bundle.contains(first_ca.trim()), "the CRD trusts the CA");

    env.control_plane().pause_controller_manager(true);
    let migrating_client = client.clone();
    let migration = tokio::spawn(async move {
        slotkeeper_upgrade::migrate::migrate_storage(
            &migrating_client,
            CRD,
            Duration::from_millis(500),
            Duration::from_secs(300),
        )
        .await
    });
    let held_from = Instant::now();
    rounds.until(issued + Duration::from_secs(125)).await;
    env.control_plane().pause_controller_manager(false);
    let created = migration.await.unwrap().expect("the migration finishes once the migrator runs");
    let migrated = Instant::now();
    assert_eq!(created.len(), 1, "one migration: {created:?}");

    let during: Vec<&Seen> = rounds.between(held_from, migrated).collect();
    assert!(during.iter().all(|s| s.ca == first_ca), "no CA replaced during the migration");
    assert!(during.iter().all(|s| s.generation == generation), "the CRD was not changed during the migration");
    let renewed: BTreeSet<&str> = during.iter().map(|s| s.serving.as_str()).collect();
    assert!(renewed.len() >= 2, "serving certificates renewed from the trusted CA meanwhile: {}", renewed.len());
    let log = std::fs::read_to_string(operator.process.log_path()).unwrap();
    assert!(
        log.contains("its replacement waits for the storage migration"),
        "the CA came due during the migration and its replacement waited"
    );

    // After the migration the CA is replaced before the old one expires.
    rounds.until(issued + Duration::from_secs(190)).await;
    let after: Vec<&Seen> = rounds.between(migrated, Instant::now()).collect();
    let new_ca = &after.last().unwrap().ca;
    assert_ne!(new_ca, &first_ca, "the CA was replaced once the migration ended");
    assert!(after.last().unwrap().bundle.contains(new_ca.trim()), "the caBundle followed");
    for name in [CRD, "redisoperations.slotkeeper.io"] {
        assert!(bundle(&rounds.crds.get(name).await.unwrap()).contains(new_ca.trim()), "{name} trusts the current CA");
    }

    let Rounds { reads, writes, failures, seen, .. } = rounds;
    assert!(failures.is_empty(), "{} of {reads} reads and {writes} writes failed: {failures:#?}", failures.len());
    let serving: BTreeSet<&str> = seen.iter().map(|s| s.serving.as_str()).collect();
    let authorities: BTreeSet<&str> = seen.iter().map(|s| s.ca.as_str()).collect();
    let bundles: BTreeSet<&str> = seen.iter().map(|s| s.bundle.as_str()).collect();
    assert!(serving.len() >= 6, "serving certificates rotated: {} seen", serving.len());
    let log = std::fs::read_to_string(env.control_plane().apiserver_log()).unwrap();
    let failed: Vec<&str> =
        log.lines().filter(|l| l.contains("conversion webhook") || l.contains("webhook-conversion")).collect();
    assert!(failed.is_empty(), "the apiserver logged conversion failures: {failed:#?}");

    // The migration's result, from etcd itself.
    let (_, stored) = kubectl(env, &["get", "crd", CRD, "-o", "jsonpath={.status.storedVersions}"], None);
    assert_eq!(stored, r#"["v1"]"#);
    let objects = etcd_objects(env, &format!("/registry/slotkeeper.io/redisclusters/{ns}/"));
    assert_eq!(objects.len(), 2);
    assert!(objects.iter().all(|(_, v)| v.contains(r#""apiVersion":"slotkeeper.io/v1""#)), "{objects:?}");
    println!(
        "{reads} reads and {writes} writes at v1alpha1, none failed; {} serving certificates, {} CAs, {} caBundles; migration held {:.0} s across the CA's renewal point, no CRD change meanwhile",
        serving.len(),
        authorities.len(),
        bundles.len(),
        (migrated - held_from).as_secs_f64()
    );
}
