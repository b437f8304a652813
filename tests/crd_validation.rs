//! The real apiserver rejects bad RedisClusters with a message naming the
//! field, from the CEL rules and schema in the generated CRD.

mod common;

use common::*;

fn cluster(ns: &str, name: &str, spec: &str) -> String {
    let api_version = <slotkeeper_api::RedisCluster as kube::Resource>::api_version(&());
    format!("apiVersion: {api_version}\nkind: RedisCluster\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}")
}

#[tokio::test]
async fn bad_input_is_rejected_with_a_message_naming_the_field() {
    let env = shared_env();
    install_crds(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "crd-validation").await;
    let cases = [
        ("  masters: 2\n  redis: {version: 7.0.15}\n", "spec.masters must be at least 3"),
        (
            "  masters: 3\n  replicasPerMaster: 6\n  redis: {version: 7.0.15}\n",
            "spec.replicasPerMaster must be between 0 and 5",
        ),
        ("  masters: 3\n  redis: {version: seven}\n", "spec.redis.version must be a semantic version"),
        (
            "  masters: 3\n  redis: {version: 7.2.4}\n",
            "spec.redis.engine and spec.redis.version must name an entry of the operator's version catalog: redis 6.2.14, redis 7.0.15, valkey 8.1.8",
        ),
        (
            "  masters: 3\n  redis: {engine: valkey, version: 7.0.15}\n",
            "must name an entry of the operator's version catalog",
        ),
        ("  masters: 3\n  redis: {engine: keydb, version: 6.3.4}\n", "spec.redis.engine"),
        (
            "  masters: 3\n  redis: {version: 7.0.15, config: {port: '7000'}}\n",
            "spec.redis.config.port: not a redis.conf key a RedisCluster may set",
        ),
        (
            "  masters: 3\n  redis: {version: 7.0.15, config: {rename-command: 'FLUSHALL \"\"'}}\n",
            "spec.redis.config.rename-command: not a redis.conf key",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: lots}\n", "spec.storage.size must be a quantity"),
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  balance: {by: Memory, tolerancePercent: 0}\n",
            "spec.balance.tolerancePercent must be between 1 and 50",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n  balance: {by: Bytes}\n", "spec.balance.by"),
    ];
    for (spec, message) in cases {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "bad", spec)));
        assert!(!ok, "accepted:\n{spec}");
        assert!(out.contains(message), "for\n{spec}expected {message:?} in: {out}");
    }

    // Immutable fields: the first apply is valid, the changes are not.
    let good = "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 1Gi, storageClassName: standard}\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", good)));
    assert!(ok, "{out}");
    let changes = [
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 500Mi, storageClassName: standard}\n",
            "spec.storage.size cannot shrink",
        ),
        (
            "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 1Gi, storageClassName: fast}\n",
            "spec.storage.storageClassName is immutable",
        ),
        ("  masters: 3\n  redis: {version: 7.0.15}\n", "spec.storage cannot be added or removed"),
    ];
    for (spec, message) in changes {
        let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", spec)));
        assert!(!ok, "accepted change:\n{spec}");
        assert!(out.contains(message), "for\n{spec}expected {message:?} in: {out}");
    }
    // Growing the volume is allowed, and `kubectl scale` drives spec.masters.
    let grown = "  masters: 3\n  redis: {version: 7.0.15}\n  storage: {size: 2Gi, storageClassName: standard}\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "stable", grown)));
    assert!(ok, "{out}");
    let (ok, out) = kubectl(env, &["-n", &ns, "scale", "rdc/stable", "--replicas=5"], None);
    assert!(ok, "{out}");
    let (_, masters) = kubectl(env, &["-n", &ns, "get", "rdc", "stable", "-o", "jsonpath={.spec.masters}"], None);
    assert_eq!(masters.trim(), "5");
}

#[tokio::test]
async fn deploy_manifests_pass_server_side_dry_run() {
    let env = shared_env();
    install_crds(env);
    let root = slotkeeper_env::tools::repo_root();
    // The namespace must exist for a dry run of the objects inside it.
    let (ok, out) = kubectl(env, &["apply", "-f", root.join("deploy/00-namespace.yaml").to_str().unwrap()], None);
    assert!(ok, "{out}");
    // deploy/crds is installed already (its webhook at a loopback URL, which
    // a dry run of the Service-addressed original would conflict with).
    let mut args = vec!["apply".to_string(), "--dry-run=server".into()];
    for manifest in
        ["00-namespace.yaml", "admission.yaml", "console-rbac.yaml", "operator.yaml", "rbac.yaml", "examples"]
    {
        args.extend(["-f".into(), root.join("deploy").join(manifest).to_str().unwrap().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = kubectl(env, &args, None);
    assert!(ok, "kubectl apply --dry-run=server -f deploy/ failed:\n{out}");
    for kind in [
        "deployment.apps/slotkeeper",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper",
        "networkpolicy.networking.k8s.io/slotkeeper",
        "service/slotkeeper",
        "service/slotkeeper-webhook",
        "poddisruptionbudget.policy/slotkeeper",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-redis-viewer",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-redis-operator",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-redis-custom-image",
        "validatingadmissionpolicy.admissionregistration.k8s.io/slotkeeper-rediscluster-author-rights",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/slotkeeper-rediscluster-author-rights",
        "validatingadmissionpolicy.admissionregistration.k8s.io/slotkeeper-operator-writes",
        "clusterrole.rbac.authorization.k8s.io/slotkeeper-managed-namespace",
        "rediscluster.slotkeeper.io/example",
    ] {
        assert!(out.contains(kind), "{kind} not in dry run output:\n{out}");
    }
}

/// Applies deploy/'s admission policy and waits until the apiserver enforces
/// it (it loads a new policy within a second or two): until `refused` is.
fn install_admission(env: &slotkeeper_env::Environment, refused: impl Fn() -> (bool, String)) {
    let root = slotkeeper_env::tools::repo_root();
    let (ok, out) = kubectl(env, &["apply", "-f", root.join("deploy/admission.yaml").to_str().unwrap()], None);
    assert!(ok, "deploy/admission.yaml: {out}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (ok, out) = refused();
        if !ok && out.contains("ValidatingAdmissionPolicy") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the admission policy is not enforced after 30 s: {out}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Security review findings 1 and 2, as written: a ServiceAccount bound to
/// `slotkeeper-redis-operator` (it may patch RedisClusters, not read Secrets)
/// points a cluster at another application's Secret, picks the image and a
/// priority, and injects redis.conf directives. Each is refused by the real
/// apiserver naming the field; with the right granted, the same change passes.
#[tokio::test]
async fn a_cluster_author_cannot_reach_what_they_could_not_reach_themselves() {
    let env = shared_env();
    install_crds(env);
    let client = env.client().await.unwrap();
    let ns = namespace(&client, "spec-escalation").await;
    let root = slotkeeper_env::tools::repo_root();
    let (ok, out) = kubectl(env, &["apply", "-f", root.join("deploy/console-rbac.yaml").to_str().unwrap()], None);
    assert!(ok, "{out}");
    let (ok, out) =
        kubectl(env, &["-n", &ns, "create", "secret", "generic", "other-app", "--from-literal=password=s3cret"], None);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(env, &["-n", &ns, "create", "serviceaccount", "tenant"], None);
    assert!(ok, "{out}");
    let tenant = format!("system:serviceaccount:{ns}:tenant");
    bind(env, &ns, &tenant, "slotkeeper-redis-operator");
    // The cluster was created by an administrator with a catalog image it set explicitly.
    let spec = "  masters: 3\n  redis: {version: 7.0.15, image: 'redis:7.0.15'}\n  paused: true\n";
    let (ok, out) = kubectl(env, &["apply", "-f", "-"], Some(&cluster(&ns, "shop", spec)));
    assert!(ok, "{out}");
    let as_tenant = format!("--as={tenant}");
    let patch =
        |body: &str| kubectl(env, &["-n", &ns, &as_tenant, "patch", "rdc/shop", "--type=merge", "-p", body], None);
    install_admission(env, || {
        let body = r#"{"spec":{"auth":{"secretName":"other-app"}}}"#;
        kubectl(
            env,
            &["-n", &ns, &as_tenant, "patch", "rdc/shop", "--dry-run=server", "--type=merge", "-p", body],
            None,
        )
    });

    // What the role allows goes through: scaling a cluster whose image it did not choose.
    let (ok, out) = patch(r#"{"spec":{"masters":4}}"#);
    assert!(ok, "the operator role may scale: {out}");

    let refused = [
        (
            r#"{"spec":{"auth":{"secretName":"other-app"}}}"#,
            format!("spec.auth.secretName: {tenant} may not get Secret {ns}/other-app"),
        ),
        (
            r#"{"spec":{"redis":{"image":"attacker/redis:latest"}}}"#,
            "spec.redis.image: attacker/redis:latest is not an image of the version catalog".into(),
        ),
        (
            r#"{"spec":{"scheduling":{"priorityClassName":"system-cluster-critical"}}}"#,
            format!("spec.scheduling.priorityClassName: {tenant} may not use redisclusters/priorityclass"),
        ),
        (
            r#"{"spec":{"acl":{"users":[{"name":"app","passwordSecret":{"name":"other-app"}}]}}}"#,
            format!("spec.acl.users[].passwordSecret: {tenant} may not get a Secret named there (in {ns})"),
        ),
        (
            r#"{"spec":{"acl":{"users":[{"name":"app","passwordSecret":{"name":"shop-password"},"rules":[">backdoor","+@all"]}]}}}"#,
            "spec.acl.users[].rules: each rule is one token".into(),
        ),
        (
            r#"{"spec":{"acl":{"users":[{"name":"slotkeeper-operator","passwordSecret":{"name":"shop-password"}}]}}}"#,
            "spec.acl.users[].name: 1 to 64 letters".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"REQUIREPASS":""}}}}"#,
            "spec.redis.config.REQUIREPASS: not a redis.conf key".into(),
        ),
        (r#"{"spec":{"redis":{"config":{" dir":"/"}}}}"#, "spec.redis.config. dir: not a redis.conf key".into()),
        (
            r#"{"spec":{"redis":{"config":{"user":"backdoor on >pw +@all"}}}}"#,
            "spec.redis.config.user: not a redis.conf key".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"loadmodule":"/tmp/evil.so"}}}}"#,
            "spec.redis.config.loadmodule: not a redis.conf key".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"enable-debug-command":"yes"}}}}"#,
            "spec.redis.config.enable-debug-command: not a redis.conf key".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"maxmemory-policy":"allkeys-lru\nrequirepass \"\""}}}}"#,
            "spec.redis.config.maxmemory-policy: must be one of".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"hz":"1000"}}}}"#,
            "spec.redis.config.hz: must be an integer from 1 to 500".into(),
        ),
        (
            r#"{"spec":{"redis":{"config":{"save":"60 1\ninclude /etc/x"}}}}"#,
            "spec.redis.config.save: must be empty or pairs".into(),
        ),
    ];
    for (body, message) in &refused {
        let (ok, out) = patch(body);
        assert!(!ok, "accepted {body}");
        assert!(out.contains(message.as_str()), "for {body} expected {message:?} in: {out}");
    }
    let (ok, out) = kubectl(env, &["-n", &ns, "get", "rdc/shop", "-o", "jsonpath={.spec}"], None);
    assert!(ok && !out.contains("other-app") && !out.contains("attacker") && !out.contains("REQUIREPASS"), "{out}");
    // Allowed values of allowed keys pass.
    let (ok, out) =
        patch(r#"{"spec":{"redis":{"config":{"maxmemory-policy":"allkeys-lru","save":"3600 1 300 100","hz":"50"}}}}"#);
    assert!(ok, "{out}");

    // With the rights granted, the same changes are admitted.
    let (ok, out) = kubectl(
        env,
        &[
            "-n",
            &ns,
            "create",
            "role",
            "read-other-app",
            "--verb=get",
            "--resource=secrets",
            "--resource-name=other-app",
        ],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        env,
        &[
            "-n",
            &ns,
            "create",
            "rolebinding",
            "tenant-reads-other-app",
            "--role=read-other-app",
            &format!("--serviceaccount={ns}:tenant"),
        ],
        None,
    );
    assert!(ok, "{out}");
    bind(env, &ns, &tenant, "slotkeeper-redis-custom-image");
    bind(env, &ns, &tenant, "slotkeeper-redis-priority");
    for (body, _) in &refused[..3] {
        // RBAC changes reach the authorizer at once; a retry covers its cache.
        let mut last = String::new();
        let admitted = (0..20).any(|_| {
            let (ok, out) = patch(body);
            last = out;
            ok || {
                std::thread::sleep(std::time::Duration::from_millis(250));
                false
            }
        });
        assert!(admitted, "with the right granted, {body} is admitted: {last}");
    }
}
