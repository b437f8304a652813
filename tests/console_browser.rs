//! The console in a real browser (Debian's headless Chromium, driven through
//! chromedriver), against the real control plane and the operator running
//! with deploy/'s RBAC: signing in, what a user sees, scaling and failing
//! over as that user (the apiserver's audit log names them), pages that
//! follow changes live, what a user without rights gets, and every action
//! without scripts. Screenshots land in target/screenshots/console_browser/.

mod common;

use std::time::Duration;

use common::browser::Browser;
use common::operator::*;
use common::writer::{ClusterClient, assert_none_lost};
use common::*;
use fantoccini::Locator;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use slotkeeper_api::RedisCluster;
use slotkeeper_console::session::SessionKey;

const OPERATOR_ROLE: &str = "slotkeeper-redis-operator";

/// Successful requests by `user` in the audit log: `verb resource[/subresource] name`.
fn audited(env: &slotkeeper_env::Environment, user: &str, ns: &str) -> Vec<String> {
    let log = std::fs::read_to_string(env.audit_log()).unwrap();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
        .filter(|e| e["objectRef"]["namespace"] == ns)
        .filter(|e| e["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300))
        .map(|e| {
            let object = &e["objectRef"];
            let sub = object["subresource"].as_str().map(|s| format!("/{s}")).unwrap_or_default();
            format!(
                "{} {}{sub} {}",
                e["verb"].as_str().unwrap_or(""),
                object["resource"].as_str().unwrap_or(""),
                object["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Every form control a person uses has a label, and the keyboard reaches
/// each enabled one.
async fn assert_keyboard_and_labels(browser: &Browser, page: &str) {
    let unlabelled = browser
        .js("return [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
               .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
               .map(e => e.outerHTML);")
        .await;
    assert_eq!(unlabelled, serde_json::json!([]), "{page}: unlabelled form fields");
    let wanted: Vec<String> = serde_json::from_value(
        browser
            .js("return [...document.querySelectorAll('main input:not([type=hidden]):not([disabled]), main select:not([disabled]), main button:not([disabled])')].map(e => e.id).filter(id => id);")
            .await,
    )
    .unwrap();
    browser.js("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);").await;
    let body = browser.client.find(Locator::Css("body")).await.unwrap();
    let mut reached = std::collections::BTreeSet::new();
    for _ in 0..80 {
        body.send_keys("\u{E004}").await.unwrap(); // Tab
        let id = browser.js("return document.activeElement ? document.activeElement.id : '';").await;
        if let Some(id) = id.as_str().filter(|id| !id.is_empty()) {
            reached.insert(id.to_owned());
        }
    }
    for id in &wanted {
        assert!(reached.contains(id), "{page}: #{id} cannot be reached with Tab (reached: {reached:?})");
    }
}

/// Records, in the page itself, what the phase badge and the reshard section
/// say after each live update, and marks the page so a reload would show.
async fn watch_live(browser: &Browser) {
    browser
        .js("window.__sameDocument = true; window.__seen = [];
             const record = () => window.__seen.push(
               (document.querySelector('#summary .phase') || {}).textContent + ' | ' +
               (document.querySelector('#reshard') || {}).textContent);
             record();
             new MutationObserver(record).observe(document.querySelector('main'), { childList: true, subtree: true });")
        .await;
}

async fn seen(browser: &Browser) -> Vec<String> {
    assert_eq!(browser.js("return window.__sameDocument === true;").await, true, "the page was reloaded");
    serde_json::from_value(browser.js("return window.__seen;").await).unwrap()
}

#[tokio::test]
async fn an_operator_signs_in_scales_out_and_fails_over_and_the_page_follows_live() {
    let env = shared_env();
    let operator = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "console-ops").await;
    bind(env, &ns, "alice", OPERATOR_ROLE);
    apply_cluster(env, &ns, "example", 3, 1);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = wait_settled(&api, "example", 3, 6, Duration::from_secs(180)).await;
    // Keys, so the reshard has data to move and lasts long enough to watch.
    let mut redis = ClusterClient::new(node_ips(&cluster), &password(&client, &ns, "example").await).await;
    let seeded = redis.seed("console", 100_000).await;

    let browser = Browser::start(operator.http_port, true).await;
    let page = format!("/clusters/{ns}/example");
    // Without a session, every page sends you to sign in, and back afterwards.
    browser.goto(&page).await;
    assert!(browser.path().await.starts_with("/signin?next="), "{}", browser.path().await);
    assert_keyboard_and_labels(&browser, "sign-in").await;
    browser.screenshot("01-sign-in").await;
    browser.fill("#token", "not-a-token-the-apiserver-knows").await;
    browser.click("#sign-in").await;
    browser.wait_for_text(".flash", "did not accept this token", Duration::from_secs(10)).await;
    assert!(browser.path().await.starts_with("/signin"), "a bad token is refused");
    browser.screenshot("02-sign-in-refused").await;
    browser.fill("#token", &user_token(env, "alice")).await;
    browser.click("#sign-in").await;
    browser.wait_for_text(".flash", "Signed in as alice", Duration::from_secs(10)).await;
    assert_eq!(browser.path().await, page, "back to the page asked for");

    // The clusters page lists it, Running, in words and colour.
    browser.goto("/").await;
    let row = browser.wait_for_text(&format!("[id='row:{ns}/example']"), "Running", Duration::from_secs(10)).await;
    assert!(row.contains("3 / 3") && row.contains("16384 / 16384"), "{row}");
    browser.screenshot("03-clusters").await;

    // The cluster: six nodes with the right roles, every slot on the map.
    browser.goto(&page).await;
    browser.wait_for_text("#summary .phase", "Running", Duration::from_secs(5)).await;
    assert_eq!(browser.count("table.nodes tbody tr").await, 6);
    assert_eq!(browser.count("table.nodes tbody tr[data-role='master']").await, 3);
    assert_eq!(browser.count("table.nodes tbody tr[data-role='replica']").await, 3);
    assert_eq!(browser.count("svg.topology g.node").await, 6);
    let slots = browser.text(".slot-summary").await;
    assert!(slots.contains("16384 of 16384 slots assigned"), "{slots}");
    assert!(browser.text("#live-state").await.contains("Live"), "the live stream connected");
    assert_keyboard_and_labels(&browser, "cluster").await;
    browser.screenshot("04-cluster").await;

    // A request Kubernetes rejects comes back in words, and changes nothing
    // (the browser's own check on the field is turned off, as a script could).
    browser.js("document.querySelector('#scale-masters').form.noValidate = true;").await;
    browser.fill("#scale-masters", "2").await;
    browser.click("#scale-submit").await;
    let rejected = browser.wait_for_text(".flash", "Nothing was changed", Duration::from_secs(10)).await;
    assert!(rejected.contains("spec.masters must be at least 3"), "{rejected}");
    browser.screenshot("045-cluster-rejected").await;
    assert_eq!(api.get("example").await.unwrap().spec.masters, 3);

    // Scale out 3 → 4 from the page; the page follows without a reload.
    browser.fill("#scale-masters", "4").await;
    browser.click("#scale-submit").await;
    browser.wait_for_text(".flash", "Asked Kubernetes as alice", Duration::from_secs(10)).await;
    watch_live(&browser).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let mut pictured = false;
    loop {
        if !pictured && browser.text("#reshard").await.contains("slots moved") {
            browser.screenshot("05-cluster-scaling").await;
            pictured = true;
        }
        let summary = browser.text("#summary").await;
        if summary.contains("4 of 4") && summary.contains("Running") && summary.contains("none: converged") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not 4 masters Running after 240 s: {summary}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let history = seen(&browser).await;
    // The first record is what the page showed when it loaded; the rest came live.
    let live = &history[1..];
    assert!(live.iter().any(|s| s.contains("Scaling")), "Scaling was shown live: {history:?}");
    assert!(live.iter().any(|s| s.contains("slots moved")), "reshard progress was shown live: {history:?}");
    assert_eq!(browser.count("table.nodes tbody tr[data-role='master']").await, 4);
    browser.screenshot("06-cluster-scaled").await;
    let by_alice = audited(env, "alice", &ns);
    assert!(by_alice.iter().any(|a| a == "patch redisclusters/scale example"), "audit log: {by_alice:?}");
    let cluster = wait_settled(&api, "example", 4, 8, Duration::from_secs(120)).await;
    assert_none_lost(&mut redis, &seeded, 0, "scale-out from the console").await;

    // Fail over shard 1 to its replica from the page; follow it live.
    let old_master = master_pods(&cluster).into_iter().find(|p| p.contains("-shard-1-")).expect("shard 1 master");
    let options = browser.client.find_all(Locator::Css("#failover-target option")).await.unwrap();
    let mut target = None;
    for option in options {
        let value = option.attr("value").await.unwrap().unwrap_or_default();
        if value.starts_with("1:") {
            target = Some(value);
        }
    }
    let target = target.expect("a replica of shard 1 is offered");
    let promoted = target.split_once(':').unwrap().1.to_owned();
    browser.client.find(Locator::Css("#failover-target")).await.unwrap().select_by_value(&target).await.unwrap();
    browser.click("#failover-submit").await;
    browser.wait_for_text(".flash", "Created RedisOperation", Duration::from_secs(10)).await;
    watch_live(&browser).await;
    browser.wait_for_text("#operations", "Succeeded", Duration::from_secs(60)).await;
    let row = format!("table.nodes tbody tr[data-pod='{promoted}'][data-role='master']");
    wait_until("the promoted replica drawn as master", Duration::from_secs(30), || async {
        (browser.count(&row).await == 1).then_some(())
    })
    .await;
    seen(&browser).await;
    browser.screenshot("07-cluster-failed-over").await;
    let by_alice = audited(env, "alice", &ns);
    assert!(by_alice.iter().any(|a| a.starts_with("create redisoperations")), "audit log: {by_alice:?}");
    let cluster = api.get("example").await.unwrap();
    assert!(master_pods(&cluster).contains(&promoted) && !master_pods(&cluster).contains(&old_master));

    // Signing out ends the session.
    browser.click("header .user button").await;
    browser.wait_for_text(".flash", "Signed out", Duration::from_secs(10)).await;
    browser.goto(&page).await;
    assert!(browser.path().await.starts_with("/signin"), "signed out: {}", browser.path().await);
}

#[tokio::test]
async fn a_user_without_rights_sees_nothing_and_changes_nothing() {
    let env = shared_env();
    let operator = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "console-deny").await;
    apply_cluster(env, &ns, "guarded", 3, 0);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_settled(&api, "guarded", 3, 3, Duration::from_secs(180)).await;
    let generation = api.get("guarded").await.unwrap().metadata.generation;

    let browser = Browser::start(operator.http_port, true).await;
    browser.sign_in(&user_token(env, "bob")).await;
    browser.wait_for_text(".flash", "Signed in as bob", Duration::from_secs(10)).await;
    browser.goto("/").await;
    assert_eq!(browser.count(&format!("[id='row:{ns}/guarded']")).await, 0, "bob sees no cluster");
    assert!(browser.text("#clusters").await.contains("No RedisCluster you may list"));
    browser.screenshot("11-no-rights").await;
    browser.goto(&format!("/clusters/{ns}/guarded")).await;
    assert!(browser.text("main").await.contains("does not exist, or bob may not see it"));

    // Bob posts the scale form anyway (as a hand-made form would): Kubernetes
    // refuses, the page says so in words, and nothing changes.
    browser.goto("/").await;
    browser
        .js(&format!(
            "const form = document.createElement('form'); form.method = 'post'; form.action = '/actions/scale';
             for (const [name, value] of [['namespace', '{ns}'], ['name', 'guarded'], ['masters', '5']]) {{
               const input = document.createElement('input'); input.type = 'hidden'; input.name = name; input.value = value; form.append(input);
             }}
             document.body.append(form); form.submit();"
        ))
        .await;
    let message = browser.wait_for_text(".flash", "Nothing was changed", Duration::from_secs(10)).await;
    assert!(message.contains("403 Forbidden") && message.contains("\"bob\""), "{message}");
    assert!(!message.contains("already has"), "nothing about the cluster is revealed: {message}");
    browser.screenshot("12-refused").await;
    // The same, asked of Kubernetes directly as bob.
    let bob = env.client_as("bob").await.unwrap();
    let as_bob: Api<RedisCluster> = Api::namespaced(bob, &ns);
    let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 5}}));
    let refused = as_bob.patch_scale("guarded", &Default::default(), &patch).await.unwrap_err();
    assert!(matches!(refused, kube::Error::Api(ref s) if s.code == 403), "{refused}");
    assert_eq!(api.get("guarded").await.unwrap().metadata.generation, generation, "nothing changed");
    assert!(audited(env, "bob", &ns).iter().all(|a| !a.starts_with("patch")), "no write by bob succeeded");

    // A page of another site posting to the console: refused, nothing changes.
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_port = evil.local_addr().unwrap().port();
    let console = operator.http_port;
    let form = format!(
        "<html><body><form id=f method=post action='http://127.0.0.1:{console}/actions/scale'>\
         <input name=namespace value={ns}><input name=name value=guarded><input name=masters value=6></form>\
         <script>document.getElementById('f').submit()</script></body></html>"
    );
    let app = axum::Router::new().route("/", axum::routing::get(move || async move { axum::response::Html(form) }));
    let server = tokio::spawn(async move { axum::serve(evil, app).await });
    // localhost is another site than 127.0.0.1 to the browser.
    browser.client.goto(&format!("http://localhost:{evil_port}/")).await.unwrap();
    let body = wait_until("the cross-site post answered", Duration::from_secs(10), || async {
        let text = browser.text("body").await;
        text.contains("Refused").then_some(text)
    })
    .await;
    assert!(body.contains("did not come from the console's own pages"), "{body}");
    server.abort();
    assert_eq!(api.get("guarded").await.unwrap().metadata.generation, generation, "nothing changed");

    // Without a session: pages go to sign-in, streams are refused.
    let fresh = Browser::start(operator.http_port, true).await;
    fresh.goto(&format!("/clusters/{ns}/guarded")).await;
    assert!(fresh.path().await.starts_with("/signin?next="));
    let (ok, _) = http_get(operator.http_port, "/live/clusters").await;
    assert!(!ok, "a live stream needs a session");
}

#[tokio::test]
async fn without_scripts_a_scale_in_is_previewed_confirmed_and_made() {
    let env = shared_env();
    let operator = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "console-noscript").await;
    bind(env, &ns, "alice", OPERATOR_ROLE);
    apply_cluster(env, &ns, "plain", 4, 0);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_settled(&api, "plain", 4, 4, Duration::from_secs(180)).await;

    let browser = Browser::start(operator.http_port, false).await;
    browser.sign_in(&user_token(env, "alice")).await;
    browser.wait_for_text(".flash", "Signed in as alice", Duration::from_secs(10)).await;
    browser.goto(&format!("/clusters/{ns}/plain")).await;
    assert!(browser.text("#live-state").await.contains("scripts disabled"), "the page says it is not live");
    browser.fill("#scale-masters", "3").await;
    browser.click("#scale-submit").await;
    // A scale-in is shown before it is made: what leaves, what moves, whether it fits.
    browser.wait_for_text("h1", "from 4 to 3 masters", Duration::from_secs(10)).await;
    assert!(browser.text(".leaving").await.contains("plain-shard-3-"));
    assert!(browser.text("#memory-verdict").await.contains("The data fits"));
    assert!(browser.text("#moves-title").await.contains("4096"));
    browser.screenshot("21-scale-in-preview").await;
    assert_eq!(api.get("plain").await.unwrap().spec.masters, 4, "nothing changed before confirming");
    browser.click("#confirm-scale-in").await;
    browser.wait_for_text(".flash", "4 → 3 masters", Duration::from_secs(10)).await;
    assert_eq!(api.get("plain").await.unwrap().spec.masters, 3);
    wait_settled(&api, "plain", 3, 3, Duration::from_secs(180)).await;
    // Not live without scripts: a reload shows the result.
    browser.goto(&format!("/clusters/{ns}/plain")).await;
    assert!(browser.text("#summary").await.contains("3 of 3"));
    browser.screenshot("22-scaled-in-no-script").await;
    assert!(audited(env, "alice", &ns).iter().any(|a| a == "patch redisclusters/scale plain"));

    // A version change: only reachable releases offered, the planned steps shown first.
    assert!(browser.text("#version").await.contains("redis 7.0.15"), "the Version fragment says what runs");
    let offered = browser.text("#version-target").await;
    assert!(offered.contains("valkey 8.1.8") && !offered.contains("6.2.14"), "{offered}");
    // From 7.0.15 the one reachable release, already selected.
    browser.click("#version-submit").await;
    browser.wait_for_text("h1", "to valkey 8.1.8?", Duration::from_secs(10)).await;
    let steps = browser.text("#planned-steps").await;
    assert!(steps.contains("Rollout 1 of 1: redis 7.0.15 → valkey 8.1.8"), "{steps}");
    assert!(steps.contains("a temporary replica plain-shard-0-1"), "no replicas: a surge per shard: {steps}");
    assert!(steps.contains("Point of no return"), "{steps}");
    browser.screenshot("23-version-plan").await;
    assert_eq!(api.get("plain").await.unwrap().spec.redis.version, "7.0.15", "nothing changed before confirming");
    browser.click("#confirm-version").await;
    browser.wait_for_text(".flash", "out to valkey 8.1.8", Duration::from_secs(10)).await;
    let asked = api.get("plain").await.unwrap().spec;
    assert_eq!((asked.redis.engine.to_string(), asked.redis.version.as_str()), ("valkey".to_owned(), "8.1.8"));
    assert!(audited(env, "alice", &ns).iter().any(|a| a == "patch redisclusters plain"));
    wait_until("the rollout to valkey completed", Duration::from_secs(300), || async {
        let c = api.get("plain").await.ok()?;
        let s = c.status?;
        (s.current_version.as_deref() == Some("8.1.8") && s.phase == Some(slotkeeper_api::Phase::Running)).then_some(())
    })
    .await;
    browser.goto(&format!("/clusters/{ns}/plain")).await;
    let version = browser.text("#version").await;
    assert!(version.contains("valkey 8.1.8") && version.contains("Completed"), "{version}");
    assert!(version.contains("Point of no return") && version.contains("passed"), "{version}");
    browser.screenshot("24-version-rolled-out").await;
}

#[tokio::test]
async fn a_standby_replica_serves_the_console_and_accepts_the_leaders_sessions() {
    let env = shared_env();
    let leader = shared_operator(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "console-standby").await;
    bind(env, &ns, "alice", OPERATOR_ROLE);
    apply_cluster(env, &ns, "spare", 3, 0);
    let api: Api<RedisCluster> = Api::namespaced(client.clone(), &ns);
    wait_settled(&api, "spare", 3, 3, Duration::from_secs(180)).await;
    let standby = start_operator(env, "slotkeeper-standby");
    wait_until("the standby serving HTTP", Duration::from_secs(30), || async {
        http_get(standby.http_port, "/healthz").await.0.then_some(())
    })
    .await;

    // A session begun on the leader...
    let token = user_token(env, "alice");
    let cookie = console_session("127.0.0.1", leader.http_port, &token).await;
    // ...opens on the standby, which shows the cluster from its own watches
    // and samples Redis itself while another replica leads.
    let page = format!("/clusters/{ns}/spare");
    let body = wait_until("the standby's sampler to observe the cluster", Duration::from_secs(60), || async {
        let (status, _, body) =
            http_request(standby.http_port, "GET", &page, std::slice::from_ref(&cookie), None).await;
        (status == 200 && body.contains("by this replica") && body.contains("sampler (it is not the leader)"))
            .then_some(body)
    })
    .await;
    assert!(body.contains("Signed in as <strong>alice</strong>"), "the leader's session opens on the standby");
    assert!(body.contains("3 of 3") && body.contains("16384 of 16384"), "status from the standby's watch");
    assert_eq!(body.matches("data-role=\"master\"").count(), 3, "roles from the standby's own observation");
    let metrics = standby.metrics().await;
    assert!(!metrics.contains(&format!("namespace=\"{ns}\"")), "the standby reconciles nothing");
    let replicas = [leader, &standby];
    session_ends_everywhere_and_no_secret_opens_its_cookie(&client, (&token, &cookie), replicas, &page).await;

    // Security review finding 8: sign-in guessing is slowed per client.
    // Every attempt would be a TokenReview made with the operator's rights;
    // after a burst of 5 from one address, the standby refuses at once,
    // even a good token, and says when to try again.
    let mut flashes = Vec::new();
    for token in ["guess-1", "guess-2", "guess-3", "guess-4", "guess-5", "guess-6", "guess-7"]
        .into_iter()
        .map(String::from)
        .chain([user_token(env, "alice")])
    {
        let headers = ["Sec-Fetch-Site: same-origin".to_owned(), "Accept: text/html".to_owned()];
        let form = format!("token={token}");
        let (status, head, _) =
            http_request_to("127.0.0.1", standby.http_port, "POST", "/actions/sign-in", &headers, Some(&form)).await;
        assert_eq!(status, 302, "{head}");
        let flash = head
            .lines()
            .filter_map(|l| l.strip_prefix("set-cookie: "))
            .find(|c| c.starts_with("slotkeeper_flash="))
            .and_then(|c| c.split(';').next())
            .expect("a one-time message")
            .to_owned();
        let (_, _, body) = http_request(standby.http_port, "GET", "/signin", &[format!("Cookie: {flash}")], None).await;
        flashes.push(body);
    }
    for (i, body) in flashes.iter().enumerate() {
        let limited = body.contains("Too many sign-in attempts; try again in");
        assert_eq!(limited, i >= 5, "attempt {}: limited {limited}", i + 1);
    }
    assert!(!flashes[7].contains("Signed in as"), "a good token waits its turn too");
}

/// Every way `sealed` could be opened with what the operator's namespace
/// holds: the shared console key and every 32-byte prefix of every value of
/// every Secret there (a session's own key is one of them while it is open).
async fn tokens_recovered(client: &kube::Client, sealed: &str) -> Vec<String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "slotkeeper-system");
    let mut found = Vec::new();
    for secret in secrets.list(&Default::default()).await.unwrap() {
        for bytes in secret.data.unwrap_or_default().into_values() {
            let Some(key) = bytes.0.get(..SessionKey::LEN).and_then(|k| SessionKey::new(k).ok()) else { continue };
            for part in [sealed, sealed.split_once('.').map_or(sealed, |(_, rest)| rest)] {
                if let Some(session) = key.open::<serde_json::Value>(part) {
                    found.push(session["token"].as_str().unwrap_or_default().to_owned());
                }
            }
        }
    }
    found
}

/// Security review finding 8: the session cookie used to be sealed under
/// one key in a Secret, so whoever could read that Secret recovered the
/// bearer token from any cookie ever captured, and signing out only deleted
/// the cookie in one browser. Now each session has its own key, deleted at
/// sign-out: the session ends on every replica, and a captured cookie opens
/// for nobody, even with every Secret of the operator's namespace in hand.
async fn session_ends_everywhere_and_no_secret_opens_its_cookie(
    client: &kube::Client,
    (token, cookie): (&str, &str),
    [leader, standby]: [&Operator; 2],
    page: &str,
) {
    let sealed = cookie.strip_prefix("Cookie: slotkeeper_session=").expect("a session cookie");
    // While it is open an administrator holding the Secrets does open it
    // (the search below can find a token), but not with the shared key.
    let recovered = tokens_recovered(client, sealed).await;
    assert_eq!(recovered, [token], "only the session's own key opens its cookie");
    // A session's id (which whoever reads the Secret sees) ends nothing by
    // itself: a sign-out carrying it with anything else is a no-op.
    let id = sealed.split_once('.').expect("ID.SEALED").0;
    let same_origin = ["Sec-Fetch-Site: same-origin".to_owned(), "Accept: text/html".to_owned()];
    let forged = [vec![format!("Cookie: slotkeeper_session={id}.forged")], same_origin.to_vec()].concat();
    let (status, head, _) =
        http_request_to("127.0.0.1", leader.http_port, "POST", "/actions/sign-out", &forged, Some("")).await;
    assert_eq!(status, 302, "{head}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, _, _) = http_request(standby.http_port, "GET", page, &[cookie.to_owned()], None).await;
    assert_eq!(status, 200, "a forged sign-out ended the session");

    let headers = [vec![cookie.to_owned()], same_origin.to_vec()].concat();
    let (status, head, _) =
        http_request_to("127.0.0.1", leader.http_port, "POST", "/actions/sign-out", &headers, Some("")).await;
    assert_eq!(status, 302, "{head}");
    assert!(head.contains("slotkeeper_session=; Path=/; Max-Age=0"), "the cookie is deleted: {head}");
    // The browser's copy is gone; a copy taken before no longer opens on the other replica.
    wait_until("the standby to refuse the signed-out session", Duration::from_secs(10), || async {
        let (status, head, _) = http_request(standby.http_port, "GET", page, &[cookie.to_owned()], None).await;
        (status == 303 && head.contains("location: /signin")).then_some(())
    })
    .await;
    let (status, _, _) = http_request(leader.http_port, "GET", page, &[cookie.to_owned()], None).await;
    assert_eq!(status, 303, "nor on the replica that signed it out");
    assert!(tokens_recovered(client, sealed).await.is_empty(), "no Secret opens the cookie after sign-out");
}
