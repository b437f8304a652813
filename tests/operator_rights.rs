//! Security review finding 3: the operator's ServiceAccount holds only the
//! rights it needs, and the admission fence narrows its writes further.
//! `kubectl auth can-i --list` as the operator, against the real apiserver
//! with exactly `deploy/`'s RBAC, must match the committed list; then the
//! writes the review found possible are tried as the operator and refused.

mod common;

use common::operator::*;
use common::*;
use slotkeeper_api::admission::operator_user;

/// The committed rows, per namespace asked about; `SLOTKEEPER_BLESS=1`
/// rewrites it (review the diff: every new row is a new right).
const RIGHTS_FILE: &str = "tests/operator_rights.txt";

fn install_deploy(env: &slotkeeper_env::Environment) {
    install_crds(env);
    let root = slotkeeper_env::tools::repo_root();
    for manifest in ["deploy/00-namespace.yaml", "deploy/rbac.yaml", "deploy/admission.yaml"] {
        let (ok, out) = kubectl(env, &["apply", "-f", root.join(manifest).to_str().unwrap()], None);
        assert!(ok, "{manifest}: {out}");
    }
}

/// `can-i --list` rows, whitespace collapsed and sorted (the order is not part of the answer).
fn rights_in(env: &slotkeeper_env::Environment, namespace: &str) -> Vec<String> {
    let (ok, out) =
        kubectl(env, &["auth", "can-i", "--list", "-n", namespace, &format!("--as={}", operator_user())], None);
    assert!(ok, "{out}");
    let mut rows: Vec<String> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn the_operator_holds_exactly_the_committed_rights_and_its_writes_are_fenced() {
    let env = shared_env();
    install_deploy(env);
    let client = env.client().await.unwrap();
    let tenant = namespace(&client, "tenant-app").await;

    // The rights, as the apiserver's authorizer answers them.
    let mut listed = String::new();
    // A tenant namespace reads the same as any other: the operator manages
    // clusters everywhere (its own namespace adds the Role's rows).
    for (label, ns) in [
        ("kube-system", "kube-system"),
        ("a-tenant-namespace", tenant.as_str()),
        ("slotkeeper-system", "slotkeeper-system"),
    ] {
        listed.push_str(&format!("# kubectl auth can-i --list -n {label} --as={}\n", operator_user()));
        for row in rights_in(env, ns) {
            listed.push_str(&row);
            listed.push('\n');
        }
    }
    let path = slotkeeper_env::tools::repo_root().join(RIGHTS_FILE);
    if std::env::var_os("SLOTKEEPER_BLESS").is_some() {
        std::fs::write(&path, &listed).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == listed,
        "the operator's rights differ from {RIGHTS_FILE} (SLOTKEEPER_BLESS=1 rewrites it; review every new row):\n{listed}"
    );
    for forbidden in ["secrets [] [] [get list", "secrets [] [] [list", "secrets [] [] [watch", "* [] [] [*]"] {
        assert!(!listed.contains(forbidden), "the operator may {forbidden}:\n{listed}");
    }

    // The fence is enforced once the apiserver has loaded the policy.
    let as_operator = format!("--as={}", operator_user());
    let attempt = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec![as_operator.as_str()];
        all.extend_from_slice(args);
        kubectl(env, &all, stdin)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (ok, out) = attempt(
            &["-n", "kube-system", "create", "configmap", "probe", "--dry-run=server", "--from-literal=a=b"],
            None,
        );
        if !ok && out.contains("slotkeeper-operator-writes") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the fence is not enforced after 30 s: {out}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }

    // What the review did as the operator, each refused.
    let (ok, out) = attempt(&["get", "secrets", "-A"], None);
    assert!(!ok && out.contains("cannot list resource \"secrets\""), "{out}");
    let (ok, out) = attempt(&["-n", &tenant, "get", "secrets"], None);
    assert!(!ok && out.contains("cannot list resource \"secrets\""), "{out}");
    let (ok, out) = attempt(&["-n", "kube-system", "create", "configmap", "planted", "--from-literal=a=b"], None);
    assert!(!ok && out.contains("never writes in kube-system"), "{out}");
    let labelled_sts = |ns: &str, extra: &str| {
        format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: planted, namespace: {ns}, labels: {{slotkeeper.io/cluster: planted}}}}\n\
             spec:\n  serviceName: planted\n  selector: {{matchLabels: {{app: planted}}}}\n  template:\n    metadata: {{labels: {{app: planted}}}}\n\
             \x20   spec:\n{extra}      containers: [{{name: c, image: 'busybox:1.36'}}]\n"
        )
    };
    let (ok, out) = attempt(
        &["apply", "--server-side", "--field-manager=slotkeeper", "-f", "-"],
        Some(&labelled_sts("kube-system", "")),
    );
    assert!(!ok && out.contains("never writes in kube-system"), "{out}");
    // A claim in kube-system, made by an administrator, is not the operator's to delete.
    let claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: precious, namespace: kube-system}\n\
                 spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(claim));
    assert!(ok, "{out}");
    let (ok, out) = attempt(&["-n", "kube-system", "delete", "pvc", "precious", "--wait=false"], None);
    assert!(!ok && out.contains("never writes in kube-system"), "{out}");
    // In a tenant's namespace: the application's own objects are not the operator's.
    let (ok, out) = kubectl(env, &["-n", &tenant, "create", "configmap", "app-settings", "--from-literal=a=b"], None);
    assert!(ok, "{out}");
    // (kubectl patch would read first, which the operator may not; server-side apply writes at once.)
    let config_map = |labels: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-settings, namespace: {tenant}{labels}}}\ndata: {{a: evil}}\n"
        )
    };
    let force = ["apply", "--server-side", "--field-manager=slotkeeper", "--force-conflicts", "-f", "-"];
    let (ok, out) = attempt(&force, Some(&config_map("")));
    assert!(!ok && out.contains("writes only objects labelled slotkeeper.io/cluster"), "{out}");
    let (ok, out) = attempt(&force, Some(&config_map(", labels: {slotkeeper.io/cluster: x}")));
    assert!(!ok && out.contains("writes only objects labelled slotkeeper.io/cluster"), "adopting by label: {out}");
    let (ok, out) = attempt(&["-n", &tenant, "create", "secret", "generic", "planted", "--from-literal=a=b"], None);
    assert!(!ok && out.contains("writes only objects labelled slotkeeper.io/cluster"), "{out}");
    let privileged = "      hostNetwork: true\n";
    let (ok, out) = attempt(
        &["apply", "--server-side", "--field-manager=slotkeeper", "-f", "-"],
        Some(&labelled_sts(&tenant, privileged)),
    );
    assert!(!ok && out.contains("no privileged, host-namespace or hostPath Pod"), "{out}");
    let host_path = "      volumes: [{name: root, hostPath: {path: /}}]\n";
    let (ok, out) = attempt(
        &["apply", "--server-side", "--field-manager=slotkeeper", "-f", "-"],
        Some(&labelled_sts(&tenant, host_path)),
    );
    assert!(!ok && out.contains("no privileged, host-namespace or hostPath Pod"), "{out}");
    let (_, out) = kubectl(env, &["-n", &tenant, "get", "configmap", "app-settings", "-o", "jsonpath={.data.a}"], None);
    assert_eq!(out.trim(), "b");

    // What the operator does for a cluster passes the same fence.
    let (ok, out) =
        attempt(&["apply", "--server-side", "--field-manager=slotkeeper", "-f", "-"], Some(&labelled_sts(&tenant, "")));
    assert!(ok, "the operator's own StatefulSet is refused: {out}");
    let owned = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: shop-auth-conf, namespace: {tenant}, labels: {{slotkeeper.io/cluster: shop}}}}\nstringData: {{a: b}}\n"
    );
    let (ok, out) = attempt(&["apply", "--server-side", "--field-manager=slotkeeper", "-f", "-"], Some(&owned));
    assert!(ok, "the operator's own Secret is refused: {out}");
}

/// `/metrics` names every namespace and cluster: it answers only a token
/// RBAC lets `get` it (TokenReview, then SubjectAccessReview, as
/// kube-rbac-proxy does), never an anonymous scraper or a tenant.
#[tokio::test]
async fn metrics_answer_only_a_token_allowed_to_read_them() {
    let env = shared_env();
    let operator = shared_operator(env);
    let alice = format!("Authorization: Bearer {}", user_token(env, "alice"));
    let get = |headers: Vec<String>| async move {
        let (status, _, body) = http_request(operator.http_port, "GET", "/metrics", &headers, None).await;
        (status, body)
    };
    let (status, body) = get(vec![]).await;
    assert_eq!(status, 401, "anonymous: {body}");
    assert!(!body.contains("slotkeeper_"), "no metric without a token");
    let (status, _) = get(vec!["Authorization: Bearer not-a-token".into()]).await;
    assert_eq!(status, 401, "a token the apiserver does not know");
    let (status, body) = get(vec![alice.clone()]).await;
    assert_eq!(status, 403, "alice may not get /metrics: {body}");
    // Granted to bob (the operator keeps alice's answer a minute).
    let bob = format!("Authorization: Bearer {}", user_token(env, "bob"));
    let (ok, out) = kubectl(
        env,
        &["create", "clusterrolebinding", "bob-metrics", "--clusterrole=slotkeeper-metrics-reader", "--user=bob"],
        None,
    );
    assert!(ok, "{out}");
    let (status, body) = get(vec![bob.clone()]).await;
    assert_eq!(status, 200, "bob, granted slotkeeper-metrics-reader: {body}");
    assert!(body.contains("slotkeeper_"), "{body}");
    // A flood of made-up tokens is not turned into a flood of TokenReviews
    // made with the operator's rights; a token already reviewed still works.
    let mut statuses = Vec::new();
    for i in 0..12 {
        statuses.push(get(vec![format!("Authorization: Bearer made-up-{i}")]).await.0);
    }
    assert!(statuses.contains(&429), "new tokens past the burst wait: {statuses:?}");
    assert!(statuses.iter().all(|s| [401, 429].contains(s)), "{statuses:?}");
    assert_eq!(get(vec![bob]).await.0, 200, "bob's answer is kept");
}
