//! What the upgrade manager costs, in one run:
//!
//! 1. the conversion webhook, posted over HTTPS as the apiserver posts it:
//!    a `ConversionReview` of one RedisCluster to `v1alpha1` (what the 1.37
//!    apiserver sends: it keeps a watch cache per version, converting each
//!    object once as it changes, and serves lists from it), 2,000 times, and
//!    one of all 1,000 at once, 200 times: p50/p99 per request, as the
//!    bench saw it and as the webhook's histogram did; beside it, a client's
//!    list of the 1,000 at `v1` (stored) and at `v1alpha1`, and the reviews
//!    the apiserver sent meanwhile;
//! 2. storage migration of 1,000 RedisClusters stored at `v1alpha1`:
//!    Kubernetes' migrator vs `kubectl get -o json | kubectl replace -f -`,
//!    with the apiserver's 429 and 500 answers to a reader during each
//!    counted, and etcd read afterwards (every object `v1`).
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench upgrade`

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::operator::*;
use common::upgrade::*;
use common::*;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rustls::pki_types::pem::PemObject;
use slotkeeper_api::conversion::wire;
use slotkeeper_api::v1alpha1;
use slotkeeper_upgrade::storage::{with_storage, without_deprecation};

const OBJECTS: usize = 1000;
const REQUESTS: usize = 200;
const SINGLE_REQUESTS: usize = 2000;

fn percentile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

/// `count` paused RedisClusters at `api_version` in `ns`, in one apply.
fn create(env: &slotkeeper_env::Environment, ns: &str, count: usize, api_version: &str) {
    let spec = if api_version == v1alpha1::API_VERSION {
        "masters: 3, version: 7.0.15, paused: true, config: {maxmemory-policy: allkeys-lru}"
    } else {
        "masters: 3, redis: {version: 7.0.15, config: {maxmemory-policy: allkeys-lru}}, paused: true"
    };
    let manifests: String = (0..count)
        .map(|i| format!("---\napiVersion: {api_version}\nkind: RedisCluster\nmetadata: {{name: c{i:04}, namespace: {ns}}}\nspec: {{{spec}}}\n"))
        .collect();
    let (ok, out) = kubectl(env, &["apply", "--server-side", "-f", "-"], Some(&manifests));
    assert!(ok, "{}", &out[..out.len().min(2000)]);
}

/// Milliseconds of one read of every cluster in `ns` at `version`.
fn list_ms(env: &slotkeeper_env::Environment, ns: &str, version: &str) -> f64 {
    let path = format!("/apis/slotkeeper.io/{version}/namespaces/{ns}/redisclusters");
    let started = Instant::now();
    let (ok, out) = kubectl(env, &["get", "--raw", &path], None);
    assert!(ok && out.contains("RedisClusterList"), "{}", &out[..out.len().min(500)]);
    started.elapsed().as_secs_f64() * 1000.0
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One HTTPS connection to the webhook, verifying against the operator's CA.
async fn connect(port: u16, config: Arc<rustls::ClientConfig>) -> Sender {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // As the apiserver's Go client does by default.
    tcp.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// Posts `review` to the webhook `REQUESTS` times on a kept-alive HTTPS
/// connection (a new one, untimed, when the server closed it, as the
/// apiserver's client would); milliseconds per request, and how many
/// connections it took.
async fn post_reviews(port: u16, ca_pem: &str, review: String, requests: usize) -> (Vec<f64>, usize) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let mut sender = connect(port, config.clone()).await;
    let mut connections = 1;
    let body = Bytes::from(review);
    let mut samples = Vec::with_capacity(requests);
    for _ in 0..requests {
        if sender.ready().await.is_err() {
            sender = connect(port, config.clone()).await;
            connections += 1;
        }
        let request = hyper::Request::post("/convert")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let started = Instant::now();
        let response = sender.send_request(request).await.unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains(r#""status":"Success""#), "{}", &text[..text.len().min(500)]);
    }
    (samples, connections)
}

/// Reads every cluster at v1 and v1alpha1 in turn until stopped, counting
/// 429 and 500 answers.
struct Reader {
    stop: Arc<std::sync::atomic::AtomicBool>,
    reads: Arc<AtomicUsize>,
    too_many: Arc<AtomicUsize>,
    internal: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    fn start(client: kube::Client) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (reads, too_many, internal): (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>) = Default::default();
        let (s, r, t, i) = (stop.clone(), Arc::clone(&reads), Arc::clone(&too_many), Arc::clone(&internal));
        let task = tokio::spawn(async move {
            let mut n = 0usize;
            while !s.load(Ordering::Relaxed) {
                let version = if n.is_multiple_of(2) { "v1" } else { "v1alpha1" };
                n += 1;
                let request = hyper::Request::get(format!("/apis/slotkeeper.io/{version}/redisclusters?limit=100"))
                    .body(Vec::new())
                    .unwrap();
                let answer = client.request_text(request).await;
                r.fetch_add(1, Ordering::Relaxed);
                if let Err(kube::Error::Api(status)) = &answer {
                    match status.code {
                        429 => t.fetch_add(1, Ordering::Relaxed),
                        500 => i.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Reader { stop, reads, too_many, internal, task }
    }

    async fn finish(self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (
            self.reads.load(Ordering::Relaxed),
            self.too_many.load(Ordering::Relaxed),
            self.internal.load(Ordering::Relaxed),
        )
    }
}

fn stored_as_v1(env: &slotkeeper_env::Environment, ns: &str) -> (usize, usize) {
    let objects = etcd_objects(env, &format!("/registry/slotkeeper.io/redisclusters/{ns}/"));
    let v1 = objects.iter().filter(|(_, v)| v.contains(r#""apiVersion":"slotkeeper.io/v1""#)).count();
    (v1, objects.len())
}

/// Waits until a list at both versions answers (a CRD change makes the
/// apiserver re-initialize storage, answering 429 meanwhile).
async fn settled(env: &slotkeeper_env::Environment, ns: &str) {
    wait_until("the CRDs' storage re-initialized", Duration::from_secs(60), || async {
        let ok = ["v1", "v1alpha1"].iter().all(|v| {
            let path = format!("/apis/slotkeeper.io/{v}/namespaces/{ns}/redisclusters?limit=1");
            kubectl(env, &["get", "--raw", &path], None).0
        });
        ok.then_some(())
    })
    .await;
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = shared_env();
        let client = env.client().await.unwrap();
        let (ns_a, ns_b, ns_c) =
            (namespace_with_pod_security(&client, "mig-a", PREVIOUS_RELEASE_POD_SECURITY).await, namespace_with_pod_security(&client, "mig-b", PREVIOUS_RELEASE_POD_SECURITY).await, namespace_with_pod_security(&client, "convert", PREVIOUS_RELEASE_POD_SECURITY).await);
        // The previous release's CRDs, 1,000 objects stored at v1alpha1.
        apply_yaml(env, &previous_release_file("deploy/crds/slotkeeper.io.yaml"));
        let (ok, out) = kubectl(env, &["wait", "--for=condition=Established", "crd/redisclusters.slotkeeper.io"], None);
        assert!(ok, "{out}");
        create(env, &ns_a, OBJECTS, v1alpha1::API_VERSION);
        // The new operator (its webhook), watching another namespace so that
        // no status write rewrites the objects before the migrations do.
        let operator = spawn_operator(env, "bench-upgrade", &[("SLOTKEEPER_NAMESPACE", "bench-elsewhere")]);
        apply_yaml(env, &crds_yaml(slotkeeper_api::crds()));
        wait_crds_converting(env);
        settled(env, &ns_a).await;

        println!("1. migration of {OBJECTS} RedisClusters with Kubernetes' migrator");
        let reader = Reader::start(client.clone());
        let started = Instant::now();
        let crd = "redisclusters.slotkeeper.io";
        slotkeeper_upgrade::migrate::migrate_storage(&client, crd, Duration::from_millis(200), Duration::from_secs(600))
            .await
            .unwrap();
        let migrator = started.elapsed();
        let (reads, too_many, internal) = reader.finish().await;
        let (v1, all) = stored_as_v1(env, &ns_a);
        println!("   {:.1} s; stored as v1 after: {v1}/{all}; a reader's {reads} lists meanwhile: {too_many} answered 429, {internal} answered 500", migrator.as_secs_f64());

        println!("2. the same with kubectl get -o json | kubectl replace -f -");
        let old_storage = slotkeeper_api::crds().into_iter().map(|c| without_deprecation(with_storage(c, "v1alpha1")));
        apply_yaml(env, &crds_yaml(old_storage.collect()));
        settled(env, &ns_a).await;
        create(env, &ns_b, OBJECTS, v1alpha1::API_VERSION);
        apply_yaml(env, &crds_yaml(slotkeeper_api::crds()));
        settled(env, &ns_b).await;
        let (before, _) = stored_as_v1(env, &ns_b);
        assert_eq!(before, 0, "the peer starts from objects stored at v1alpha1");
        let reader = Reader::start(client.clone());
        let started = Instant::now();
        let (ok, objects) = kubectl(env, &["get", "redisclusters.v1.slotkeeper.io", "-n", &ns_b, "-o", "json"], None);
        assert!(ok, "{}", &objects[..objects.len().min(500)]);
        let (ok, out) = kubectl(env, &["replace", "-f", "-"], Some(&objects[objects.find('{').unwrap()..]));
        assert!(ok, "{}", &out[..out.len().min(2000)]);
        let replace = started.elapsed();
        let (reads, too_many, internal) = reader.finish().await;
        let (v1, all) = stored_as_v1(env, &ns_b);
        let (_, stored) = kubectl(env, &["get", "crd", crd, "-o", "jsonpath={.status.storedVersions}"], None);
        println!("   {:.1} s; stored as v1 after: {v1}/{all}; a reader's {reads} lists meanwhile: {too_many} answered 429, {internal} answered 500; storedVersions still {stored} (a rewrite does not trim it)", replace.as_secs_f64());
        println!("   migrator / replace: {:.2}x the time", migrator.as_secs_f64() / replace.as_secs_f64());

        println!("3. the conversion webhook: reviews of one RedisCluster and of all {OBJECTS}");
        create(env, &ns_c, OBJECTS, slotkeeper_api::API_VERSION);
        settled(env, &ns_c).await;
        let (mut at_v1, mut at_old): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        let reviews_in = |text: &str| common::metrics::sum(text, "slotkeeper_conversion_reviews_total");
        let objects_in = |text: &str| common::metrics::sum(text, "slotkeeper_conversion_objects_total");
        let before = operator.metrics().await;
        for _ in 0..20 {
            at_v1.push(list_ms(env, &ns_c, "v1"));
        }
        let between = operator.metrics().await;
        for _ in 0..20 {
            at_old.push(list_ms(env, &ns_c, "v1alpha1"));
        }
        let after = operator.metrics().await;
        // The only webhook replica here is this bench's operator.
        let (at_v1_reviews, lists_reviews) = (reviews_in(&between) - reviews_in(&before), reviews_in(&after) - reviews_in(&between));
        let lists_objects = objects_in(&after) - objects_in(&between);
        let (ok, list) = kubectl(env, &["get", "--raw", &format!("/apis/slotkeeper.io/v1/namespaces/{ns_c}/redisclusters")], None);
        assert!(ok);
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        let objects: Vec<serde_json::Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let mut o = o.clone();
                o["apiVersion"] = slotkeeper_api::API_VERSION.into();
                o["kind"] = "RedisCluster".into();
                o
            })
            .collect();
        let texts: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
        let mut alone: Vec<f64> = (0..REQUESTS)
            .map(|_| {
                let started = Instant::now();
                for text in &texts {
                    std::hint::black_box(wire::convert(text, v1alpha1::API_VERSION).unwrap());
                }
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        let review = serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "bench", "desiredAPIVersion": v1alpha1::API_VERSION, "objects": objects}});
        let review = review.to_string();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "slotkeeper-system");
        let ca = secrets.get("slotkeeper-webhook-tls").await.unwrap().data.unwrap()["ca.crt"].0.clone();
        let one_object = serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "bench", "desiredAPIVersion": v1alpha1::API_VERSION, "objects": [objects[0].clone()]}});
        let ca = String::from_utf8(ca).unwrap();
        let review_seconds = |text: &str| common::metrics::buckets(text, "slotkeeper_conversion_review_seconds");
        let before_single = operator.metrics().await;
        let (mut single, single_connections) = post_reviews(webhook_port(), &ca, one_object.to_string(), SINGLE_REQUESTS).await;
        let before_whole = operator.metrics().await;
        let (mut samples, connections) = post_reviews(webhook_port(), &ca, review.clone(), REQUESTS).await;
        let after_whole = operator.metrics().await;
        let (single_server, whole_server) = (
            (review_seconds(&before_single), review_seconds(&before_whole)),
            (review_seconds(&before_whole), review_seconds(&after_whole)),
        );
        println!(
            "   one review of one RedisCluster (what the apiserver sends), posted by this bench: p50 {:.2} ms, p99 {:.2} ms ({SINGLE_REQUESTS} requests on {single_connections} connection(s)); answered by the webhook in p50 {}, p99 {}",
            percentile(&mut single, 0.5),
            percentile(&mut single, 0.99),
            common::metrics::quantile(&single_server.0, &single_server.1, 0.5),
            common::metrics::quantile(&single_server.0, &single_server.1, 0.99),
        );
        println!(
            "   one review of all {OBJECTS} at once, {} KiB, posted by this bench: p50 {:.2} ms, p99 {:.2} ms ({REQUESTS} requests on {connections} connection(s)); answered by the webhook in p50 {}, p99 {}",
            review.len() / 1024,
            percentile(&mut samples, 0.5),
            percentile(&mut samples, 0.99),
            common::metrics::quantile(&whole_server.0, &whole_server.1, 0.5),
            common::metrics::quantile(&whole_server.0, &whole_server.1, 0.99),
        );
        println!(
            "   of which the conversion alone, in this process: p50 {:.2} ms, p99 {:.2} ms",
            percentile(&mut alone, 0.5),
            percentile(&mut alone, 0.99)
        );
        let (reviews_sent, objects_sent) = (reviews_in(&before_single), objects_in(&before_single));
        println!(
            "   the apiserver's reviews over this whole run (two migrations of {OBJECTS}, {OBJECTS} created, 40 lists): {reviews_sent} reviews of {objects_sent} objects, {:.2} objects per review",
            objects_sent / reviews_sent.max(1.0)
        );
        println!(
            "   a client's list of {OBJECTS}: at v1 p50 {:.0} ms, p99 {:.0} ms; at v1alpha1 (through the webhook) p50 {:.0} ms, p99 {:.0} ms (kubectl get --raw, 20 each)",
            percentile(&mut at_v1, 0.5),
            percentile(&mut at_v1, 0.99),
            percentile(&mut at_old, 0.5),
            percentile(&mut at_old, 0.99)
        );
        // Zero reviews for lists at v1alpha1 means the apiserver served them
        // from objects it had converted before (its watch cache per version).
        let how = if lists_reviews == 0.0 {
            "served from objects converted before".to_string()
        } else {
            format!("{:.0} objects per review", lists_objects / lists_reviews)
        };
        println!(
            "   the apiserver's reviews during those lists: {at_v1_reviews} for the 20 at v1; {lists_reviews} of {lists_objects} objects for the 20 at v1alpha1 ({how})"
        );
    });
}
