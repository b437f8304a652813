//! Security issue 27, bounded inputs, against the real operator process
//! (`slotkeeper run`: controller, read model, console and webhook in one):
//!
//! 1. an Event flood: 100 Events of 1 MB in a namespace without a cluster
//!    (about a RedisCluster of the same name as a managed one), 100 of 1 MB
//!    about a managed cluster, and Events filed in that other namespace
//!    about the managed cluster (the apiserver caps those at 1 KiB: an Event
//!    naming another namespace's object must carry `eventTime`, whose
//!    message the apiserver limits). The operator's resident memory grows
//!    by no more than the read model's budget plus the watch's transient
//!    buffers; the console still renders the cluster's page, with the
//!    managed namespace's Events cut and nothing filed from elsewhere.
//! 2. the conversion webhook under 8 parallel reviews just under its size
//!    limit and 8 just over it (refused): the peak stays within what the
//!    reviews in flight can hold.
//!
//! Each prints `figure:` lines (before, peak, after, growth) before it
//! asserts, so a run against an older build reports its figures too.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::memory::{self, MIB, Peak, PeakSampler, growth, mib};
use common::operator::*;
use common::*;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, EventSource, Namespace, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use slotkeeper_api::RedisCluster;

/// The read model's budget for Event text (`readmodel/src/events.rs`).
const EVENT_BUDGET: u64 = slotkeeper_readmodel::events::BUDGET_BYTES as u64;
/// The largest conversion review the webhook reads, and how many it reads
/// at once (`operator/src/webhook/review.rs`).
const REVIEW_LIMIT: usize = slotkeeper_operator::webhook::review::MAX_REVIEW_BYTES;
const REVIEWS_IN_FLIGHT: u64 = slotkeeper_operator::webhook::review::MAX_REVIEWS_IN_FLIGHT as u64;

/// Events per flood, each message this long (under etcd's 1.5 MiB request limit).
const FLOOD: usize = 100;
const MESSAGE_BYTES: usize = 1_000_000;
/// Events created at once: 200 MB through the apiserver in a few seconds.
const PARALLEL_CREATES: usize = 8;
/// Events filed from the other namespace about the managed cluster.
const CROSS: usize = 10;
/// The apiserver's limit on an Event with `eventTime` (NoteLengthLimit).
const CROSS_MESSAGE_BYTES: usize = 1024;

/// What the watch of one Event kind holds beyond the read model when a
/// 1 MB Event passes (kube-client's watch: tokio-util's `LinesCodec` over
/// the response body): its line buffer, grown by doubling to hold the
/// watch event and kept at that capacity (up to 2 MiB), and, while the
/// Event is handled, the line copied out of it (1 MiB) and the Event parsed
/// from that (1 MiB); hyper's read buffer is at most ~400 KiB. 4 MiB: a
/// settled process holds at most the read model's budget plus these.
const WATCH_TRANSIENT: u64 = 4 * MIB;
/// While the flood passes, more is resident than once it has: the Events
/// in flight (the watch's buffers above, for each of the few watch events
/// hyper has read ahead) and the buffers already freed, which jemalloc
/// keeps until its decay hands them back (`dirty_decay_ms:1000`, see
/// .cargo/config.toml) but reuses for the next Event of the same size, so
/// they do not pile up: 8 MiB more at the peak. A read model that keeps
/// what the flood sends (200 MB, or the 50 newest per object: 100 MB)
/// fails both bounds many times over.
const IN_FLIGHT_ALLOWANCE: u64 = 8 * MIB;

/// The two measurements share the operator: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const OPERATOR_ROLE: &str = "slotkeeper-redis-operator";

fn event(ns: &str, name: &str, about_ns: &str, about: &str, message: String) -> Event {
    let now = Time(Timestamp::now());
    Event {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        involved_object: ObjectReference {
            api_version: Some(slotkeeper_api::API_VERSION.into()),
            kind: Some("RedisCluster".into()),
            name: Some(about.into()),
            namespace: Some(about_ns.into()),
            ..Default::default()
        },
        reason: Some("Flood".into()),
        message: Some(message),
        type_: Some("Warning".into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource { component: Some("event-flood".into()), host: None }),
        ..Default::default()
    }
}

/// An Event in `ns` about an object of `about_ns`: the apiserver takes it
/// only as a "new" Event (with `eventTime`, reporter and action), whose
/// message it limits to 1 KiB.
fn cross_namespace_event(ns: &str, name: &str, about_ns: &str, message: String) -> Event {
    let mut event = event(ns, name, about_ns, "cache", message);
    event.first_timestamp = None;
    event.last_timestamp = None;
    event.count = None;
    event.source = None;
    event.event_time = Some(MicroTime(Timestamp::now()));
    event.reporting_component = Some("flood.example/attacker".into());
    event.reporting_instance = Some("attacker-0".into());
    event.action = Some("File".into());
    event
}

/// A message of exactly `bytes` bytes: a marker, then `fill` repeated.
fn message(marker: &str, fill: char, bytes: usize) -> String {
    let head = format!("{marker} ");
    head.clone() + &fill.to_string().repeat(bytes - head.len())
}

/// Creates a large Event from its JSON text (`message` needs no escaping),
/// without a typed round trip: serializing and parsing 1 MB strings in a
/// debug build of the test would dominate the flood's time.
async fn create_event(client: &kube::Client, event: &Event, message: &str) {
    let ns = event.metadata.namespace.as_deref().unwrap();
    let name = event.metadata.name.as_deref().unwrap();
    assert!(message.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b' '));
    let placeholder = "@MESSAGE@";
    let mut typed = event.clone();
    typed.message = Some(placeholder.into());
    let body = serde_json::to_string(&typed).unwrap().replacen(placeholder, message, 1).into_bytes();
    let request = hyper::Request::post(format!("/api/v1/namespaces/{ns}/events"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap();
    client.request_text(request).await.unwrap_or_else(|e| panic!("create Event {ns}/{name}: {e}"));
}

/// The longest run of `fill` in `text`.
fn longest_run(text: &str, fill: char) -> usize {
    text.split(|c| c != fill).map(str::len).max().unwrap_or(0)
}

/// Deletes the test's namespaces, their Events first: each delete reaches
/// the operator's Event watch with the whole 1 MB object, so they are gone
/// before the other measurement starts (the namespace controller takes
/// 10–15 s to get to them). The rest (the Pods' shutdown) is not waited for.
async fn delete_namespaces(client: &kube::Client, names: &[&str]) {
    for name in names {
        let events: Api<Event> = Api::namespaced(client.clone(), name);
        let listed = events.list_metadata(&ListParams::default()).await.unwrap();
        let deletes = listed.items.into_iter().filter_map(|e| e.metadata.name).map(|event| {
            let events = events.clone();
            async move {
                events.delete(&event, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("delete {event}: {e}"));
            }
        });
        futures::stream::iter(deletes).buffer_unordered(PARALLEL_CREATES).collect::<Vec<()>>().await;
    }
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        api.delete(name, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("delete namespace {name}: {e}"));
    }
}

fn figure(what: &str, before: u64, peak: Peak, after: u64) {
    println!(
        "figure: {what}: RSS before {}, peak {} (sampled {} in {} samples, VmHWM {}), after {}; growth at peak {}, settled {}",
        mib(before),
        mib(peak.bytes()),
        mib(peak.sampled),
        peak.samples,
        peak.high_water.map(mib).unwrap_or_else(|| "n/a".into()),
        mib(after),
        growth(before, peak.bytes()),
        growth(before, after),
    );
}

/// One measurement at a time, of the shared operator's process.
struct Measured {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    started: Instant,
    env: &'static slotkeeper_env::Environment,
    operator: &'static Operator,
    pid: u32,
    client: kube::Client,
}

impl Measured {
    async fn start() -> Self {
        let _serial = SERIAL.lock().await;
        let started = Instant::now();
        let env = shared_env();
        let operator = shared_operator(env);
        let pid = memory::operator_pid(&operator.process);
        let client = env.client().await.unwrap();
        Self { _serial, started, env, operator, pid, client }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_flood_stays_within_the_read_models_budget_and_the_page_shows_only_its_own_events() {
    let Measured { _serial, started, env, operator, pid, client } = Measured::start().await;
    let home = namespace(&client, "flood-home").await;
    let tenant = namespace(&client, "flood-tenant").await;
    bind(env, &home, "alice", OPERATOR_ROLE);
    // `cache` runs; `probe`, paused, only carries the sentinel Event: every
    // RedisCluster Event comes through one watch in order, so once its page
    // shows the sentinel the read model has seen the whole flood.
    apply_cluster(env, &home, "cache", 3, 0);
    apply_cluster_spec(env, &home, "probe", "masters: 3, redis: {version: 7.0.15}, paused: true");
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &home);
    wait_settled(&api, "cache", 3, 3, Duration::from_secs(180)).await;
    let cookie = console_session("127.0.0.1", operator.http_port, &user_token(env, "alice")).await;
    let probe_page = format!("/clusters/{home}/probe");
    wait_until("the probe's console page", Duration::from_secs(30), || async {
        let (status, _, _) =
            http_request(operator.http_port, "GET", &probe_page, std::slice::from_ref(&cookie), None).await;
        (status == 200).then_some(())
    })
    .await;
    eprintln!("cluster Ready and signed in after {:.1}s", started.elapsed().as_secs_f64());

    let before = memory::steady_rss(pid, MIB / 2, Duration::from_secs(2), Duration::from_secs(15)).await;
    let sampler = PeakSampler::start(pid);
    let flood_started = Instant::now();
    // 100 + 100 Events of 1 MB, interleaved, several at once.
    let creates = (0..FLOOD).flat_map(|i| [(&tenant, 'T', i), (&home, 'H', i)]);
    let created: Vec<()> = futures::stream::iter(creates)
        .map(|(ns, fill, i)| {
            let client = client.clone();
            async move {
                let name = format!("{ns}-{i:03}");
                create_event(
                    &client,
                    &event(ns, &name, ns, "cache", String::new()),
                    &message(&name, fill, MESSAGE_BYTES),
                )
                .await
            }
        })
        .buffer_unordered(PARALLEL_CREATES)
        .collect()
        .await;
    let flood_seconds = flood_started.elapsed().as_secs_f64();
    let tenant_events: Api<Event> = Api::namespaced(client.clone(), &tenant);
    for i in 0..CROSS {
        let name = format!("flood-cross-{i:03}");
        let text = message(&name, 'C', CROSS_MESSAGE_BYTES);
        let cross = cross_namespace_event(&tenant, &name, &home, text);
        tenant_events.create(&PostParams::default(), &cross).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
    // Over the limit, the apiserver refuses it: the flood cannot come this way.
    let long = cross_namespace_event(&tenant, "flood-cross-long", &home, message("long", 'C', MESSAGE_BYTES));
    let refused = tenant_events.create(&PostParams::default(), &long).await.expect_err("a 1 MB cross-namespace Event");
    assert!(refused.to_string().contains("can have at most 1024 characters"), "{refused}");
    let sentinel = event(&home, "flood-sentinel", &home, "probe", "flood-sentinel: the flood has passed".into());
    Api::<Event>::namespaced(client.clone(), &home).create(&PostParams::default(), &sentinel).await.unwrap();
    wait_until("the read model saw the sentinel", Duration::from_secs(60), || async {
        let (status, _, body) =
            http_request(operator.http_port, "GET", &probe_page, std::slice::from_ref(&cookie), None).await;
        (status == 200 && body.contains("the flood has passed")).then_some(())
    })
    .await;
    let seen_seconds = flood_started.elapsed().as_secs_f64();
    let after = memory::steady_rss(pid, MIB / 2, Duration::from_secs(2), Duration::from_secs(20)).await;
    let peak = sampler.stop();
    println!(
        "flood: {} Events of {MESSAGE_BYTES} bytes created in {flood_seconds:.1}s ({PARALLEL_CREATES} at once), seen by the read model after {seen_seconds:.1}s",
        created.len()
    );
    figure("read model, 100+100 Events of 1 MB", before, peak, after);

    // The console renders the cluster's page: the managed namespace's
    // Events, cut; nothing filed from the other namespace.
    let page_started = Instant::now();
    let (status, _, body) = http_request(
        operator.http_port,
        "GET",
        &format!("/clusters/{home}/cache"),
        std::slice::from_ref(&cookie),
        None,
    )
    .await;
    let page_seconds = page_started.elapsed().as_secs_f64();
    let after_page = memory::rss(pid);
    let longest = longest_run(&body, 'H');
    let (own, cross) = (body.matches("flood-home-").count(), body.matches("flood-cross-").count());
    println!(
        "figure: console page of the flooded cluster: HTTP {status}, {} bytes in {page_seconds:.2}s; RSS right after {}; shows {own} Events of its namespace's flood (longest message {longest} bytes), {cross} filed from the other namespace",
        body.len(),
        mib(after_page)
    );
    let deleting = Instant::now();
    delete_namespaces(&client, &[&home, &tenant]).await;
    println!(
        "event flood test: {:.1}s in all ({:.1}s deleting the namespaces' Events)",
        started.elapsed().as_secs_f64(),
        deleting.elapsed().as_secs_f64()
    );

    let settled_bound = EVENT_BUDGET + WATCH_TRANSIENT;
    let peak_bound = settled_bound + IN_FLIGHT_ALLOWANCE;
    assert!(
        after.saturating_sub(before) <= settled_bound,
        "settled growth {} exceeds the read model's budget + the watch's transient buffers ({})",
        growth(before, after),
        mib(settled_bound)
    );
    assert!(
        peak.bytes().saturating_sub(before) <= peak_bound,
        "peak growth {} exceeds {}",
        growth(before, peak.bytes()),
        mib(peak_bound)
    );
    assert!(memory::alive(pid), "the operator survived the flood");
    assert_eq!(status, 200, "the console renders the flooded cluster's page");
    assert!(body.contains("Events") && own > 0, "the managed namespace's Events are shown");
    assert!(longest < 1024, "a message of {longest} bytes was shown: messages are cut at 1 KiB");
    assert!(body.contains("H…"), "a cut message ends with an ellipsis");
    assert_eq!(cross, 0, "Events filed from another namespace are shown on the page");
    assert!(!body.contains("flood-tenant-"));
    assert!(body.len() < 2 * 1024 * 1024, "the page is {} bytes", body.len());
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>;

/// One HTTPS connection to the webhook, trusting the operator's CA.
async fn connect(config: Arc<rustls::ClientConfig>) -> Result<Sender, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", webhook_port())).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| e.to_string())?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}

/// What a review got: the HTTP status and body, or the transport error
/// (a server that refuses a body before reading it may close the
/// connection while it is still being sent).
async fn post_review(config: Arc<rustls::ClientConfig>, review: hyper::body::Bytes) -> Result<(u16, Vec<u8>), String> {
    use http_body_util::BodyExt as _;
    let mut sender = connect(config).await?;
    let request = hyper::Request::post(slotkeeper_api::names::WEBHOOK_PATH)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(review))
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, body.to_vec()))
}

/// A ConversionReview to `v1alpha1` of as many v1 RedisClusters as fit
/// under `max` bytes (or the first count past `min`); its text and count.
fn review(min: usize, max: usize) -> (String, usize) {
    let object = |i: usize| {
        format!(
            r#"{{"apiVersion":"{}","kind":"RedisCluster","metadata":{{"name":"c{i:06}","namespace":"flood","uid":"00000000-0000-4000-8000-{i:012}","resourceVersion":"{i}","generation":1,"creationTimestamp":"2026-01-01T00:00:00Z","labels":{{"team":"flood"}}}},"spec":{{"masters":3,"replicasPerMaster":1,"redis":{{"version":"7.0.15","config":{{"maxmemory-policy":"allkeys-lru"}}}},"paused":true}},"status":{{"phase":"Running","readyMasters":3,"readyReplicas":3,"slotsAssigned":16384,"clusterState":"ok","currentVersion":"7.0.15"}}}}"#,
            slotkeeper_api::API_VERSION
        )
    };
    let head = format!(
        r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{{"uid":"flood","desiredAPIVersion":"{}","objects":["#,
        slotkeeper_api::v1alpha1::API_VERSION
    );
    let tail = "]}}";
    let mut text = head;
    let mut count = 0;
    loop {
        let next = object(count);
        let grown = text.len() + usize::from(count > 0) + next.len() + tail.len();
        if grown > max || (min > 0 && text.len() + tail.len() > min) {
            break;
        }
        if count > 0 {
            text.push(',');
        }
        text.push_str(&next);
        count += 1;
    }
    text.push_str(tail);
    (text, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_under_parallel_maximum_size_reviews_holds_its_bound() {
    let Measured { _serial, started, pid, client, .. } = Measured::start().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "slotkeeper-system");
    let ca = wait_until("the webhook's CA", Duration::from_secs(60), || async {
        Some(secrets.get_opt("slotkeeper-webhook-tls").await.ok()??.data?.get("ca.crt")?.0.clone())
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    // Just under the limit, and past it by 1 MiB: both valid reviews.
    let (under, under_objects) = review(0, REVIEW_LIMIT - 1024);
    let (over, _) = review(REVIEW_LIMIT + MIB as usize, usize::MAX);
    assert!(under.len() <= REVIEW_LIMIT && over.len() > REVIEW_LIMIT);
    let first = serde_json::from_str::<serde_json::Value>(&under).unwrap()["request"]["objects"][0].to_string();
    slotkeeper_api::conversion::wire::convert(&first, slotkeeper_api::v1alpha1::API_VERSION)
        .expect("the objects convert");
    let (under, over) = (hyper::body::Bytes::from(under), hyper::body::Bytes::from(over));
    // The webhook answers before anything is posted.
    let (status, _) = post_review(config.clone(), hyper::body::Bytes::from(review(0, 4096).0)).await.unwrap();
    assert_eq!(status, 200);

    let before = memory::steady_rss(pid, MIB / 2, Duration::from_secs(2), Duration::from_secs(15)).await;
    let sampler = PeakSampler::start(pid);
    let posted = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let body = if i % 2 == 0 { under.clone() } else { over.clone() };
            let config = config.clone();
            tokio::spawn(async move {
                let result = post_review(config, body).await;
                (i % 2 == 0, result, posted.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let took = posted.elapsed();
    let after = memory::steady_rss(pid, MIB / 2, Duration::from_secs(2), Duration::from_secs(15)).await;
    let peak = sampler.stop();

    let mut converted = Vec::new();
    let mut refused = Vec::new();
    for (is_under, result, at) in &results {
        let outcome = match result {
            Ok((status, body)) => {
                let text = String::from_utf8_lossy(body);
                let objects = text.matches(slotkeeper_api::v1alpha1::API_VERSION).count();
                let success = text.contains(r#""status":"Success""#);
                format!("HTTP {status}, {} bytes, {objects} objects converted, success {success}", body.len())
            }
            Err(error) => format!("connection error: {error}"),
        };
        let line = format!("{:.1}s {outcome}", at.as_secs_f64());
        if *is_under { converted.push(line) } else { refused.push(line) }
    }
    println!(
        "webhook: 8 reviews of {} bytes ({under_objects} objects) and 8 of {} bytes, in parallel, all answered in {:.1}s",
        under.len(),
        over.len(),
        took.as_secs_f64()
    );
    println!("webhook: under the limit: {converted:#?}\nwebhook: over the limit: {refused:#?}");
    figure("webhook, 8 parallel reviews of 8 MiB and 8 over the limit", before, peak, after);
    println!("webhook test: {:.1}s in all", started.elapsed().as_secs_f64());

    // Each review in flight holds its body (8 MiB; while it is read, also
    // the chunks it is gathered from), the converted objects (about as many
    // bytes) and the serialized answer (as many again): at most 4 × 8 MiB.
    // Reviews waiting for a turn hold no more than a connection's buffers
    // (hyper's read buffer, at most ~400 KiB; rustls's, ~32 KiB): 16 of
    // them, 8 MiB. Without the cap, 16 reviews of 8–9 MiB at once hold 3–4
    // times that much each (several hundred MiB).
    let bound = REVIEWS_IN_FLIGHT * 4 * REVIEW_LIMIT as u64 + 8 * MIB;
    assert!(memory::alive(pid), "the operator survived the reviews");
    for (is_under, result, _) in &results {
        match (is_under, result) {
            (true, Ok((200, body))) => {
                let answer: serde_json::Value = serde_json::from_slice(body).unwrap();
                assert_eq!(answer["response"]["result"]["status"], "Success");
                assert_eq!(answer["response"]["convertedObjects"].as_array().map(Vec::len), Some(under_objects));
            }
            (true, Ok((status, body))) => {
                panic!(
                    "a review under the limit got HTTP {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(500)])
                )
            }
            (true, Err(error)) => panic!("a review under the limit failed: {error}"),
            (false, Ok((status, _))) => assert_eq!(*status, 413, "a review over the limit was not refused"),
            // Refused before its body was read: the server closed the connection.
            (false, Err(_)) => {}
        }
    }
    assert!(
        peak.bytes().saturating_sub(before) <= bound,
        "peak growth {} exceeds {} ({REVIEWS_IN_FLIGHT} reviews in flight × 4 × {} + 8 MiB)",
        growth(before, peak.bytes()),
        mib(bound),
        mib(REVIEW_LIMIT as u64)
    );
}
