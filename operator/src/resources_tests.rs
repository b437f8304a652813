use super::*;
use crate::api::{RedisClusterSpec, StorageSpec};

fn r70() -> &'static CatalogEntry {
    catalog::lookup(crate::api::Engine::Redis, "7.0.15").unwrap()
}

fn cluster(yaml_spec: serde_json::Value) -> RedisCluster {
    let mut c = RedisCluster::new("cache", serde_json::from_value::<RedisClusterSpec>(yaml_spec).unwrap());
    c.metadata.namespace = Some("apps".into());
    c.metadata.uid = Some("uid-1".into());
    c
}

#[test]
fn one_stateful_set_per_shard_with_owner_and_anti_affinity() {
    let c = cluster(json!({"masters": 3, "replicasPerMaster": 1, "redis": {"version": "7.0.15"}}));
    let shape = |image: &str| ShardShape { pods: 2, image: image.into(), conf: "redis-7.0.15.conf".into() };
    let shards = BTreeMap::from([(0, shape("redis:7.0.15")), (1, shape("valkey/valkey:8.1.8")), (2, shape("x"))]);
    let objects = desired_objects(&c, &shards, &[r70()]);
    let sets: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "StatefulSet").collect();
    assert_eq!(sets.len(), 3);
    let set = sets[1];
    assert_eq!(set["metadata"]["name"], "cache-shard-1");
    assert_eq!(set["spec"]["replicas"], 2);
    assert_eq!(set["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(
        set["spec"]["template"]["spec"]["containers"][0]["image"], "valkey/valkey:8.1.8",
        "each shard its own image"
    );
    assert_eq!(set["spec"]["updateStrategy"]["type"], "OnDelete", "Pods are recreated by the operator, one at a time");
    let term = &set["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(term["podAffinityTerm"]["labelSelector"]["matchLabels"][LABEL_SHARD], "1");
    assert_eq!(term["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname", "Nodes by default");
    let spread = &set["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [1];
    assert_eq!(spread["podAffinityTerm"]["labelSelector"]["matchLabels"], json!({ LABEL_CLUSTER: "cache" }));
    assert!(spread["weight"].as_i64() < term["weight"].as_i64(), "a shard apart first, then the cluster spread");
    assert!(set["spec"]["volumeClaimTemplates"].is_null(), "ephemeral without storage");
}

#[test]
fn a_shards_pods_are_kept_apart_by_the_placement_topology_key() {
    let zoned = json!({"masters": 3, "redis": {"version": "7.0.15"}, "placement": {"topologyKey": "topology.kubernetes.io/zone"}});
    let shards = BTreeMap::from([(0, ShardShape { pods: 2, image: "redis:7.0.15".into(), conf: "c".into() })]);
    let objects = desired_objects(&cluster(zoned), &shards, &[r70()]);
    let set = objects.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
    let term = &set["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(term["podAffinityTerm"]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(term["podAffinityTerm"]["labelSelector"]["matchLabels"][LABEL_SHARD], "0");
}

#[test]
fn storage_adds_claims_and_retention_follows_keep_on_delete() {
    let mut c = cluster(
        json!({"masters": 3, "redis": {"version": "6.2.14"}, "storage": {"size": "2Gi", "keepOnDelete": true}}),
    );
    let one = ShardShape { pods: 1, image: image(&c), conf: "redis-6.2.14.conf".into() };
    let set = stateful_set(&c, 0, &one);
    assert_eq!(set["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"], "2Gi");
    assert_eq!(set["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"], "Retain");
    assert_eq!(set["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"], "Retain");
    assert_eq!(set["spec"]["template"]["spec"]["containers"][0]["image"], "redis:6.2.14");
    c.spec.storage = Some(StorageSpec { size: "2Gi".into(), storage_class_name: None, keep_on_delete: false });
    let policy = &stateful_set(&c, 0, &one)["spec"]["persistentVolumeClaimRetentionPolicy"];
    assert_eq!((&policy["whenDeleted"], &policy["whenScaled"]), (&json!("Delete"), &json!("Delete")));
}

#[test]
fn config_puts_operator_keys_first_and_derives_maxmemory() {
    let c = cluster(json!({
        "masters": 3, "redis": {"version": "7.0.15", "config": {"maxmemory-policy": "allkeys-lru"}},
        "resources": {"limits": {"memory": "1Gi"}},
    }));
    let conf = redis_conf(&c, r70(), &[r70()]);
    assert!(conf.contains("cluster-enabled yes\n") && conf.contains("include /etc/redis-auth/auth.conf\n"));
    assert!(conf.contains(&format!("maxmemory {}\n", (1u64 << 30) / 4 * 3)), "{conf}");
    assert!(conf.ends_with("maxmemory-policy allkeys-lru\n"));
    let explicit = cluster(
        json!({"masters": 3, "redis": {"version": "7.0.15", "config": {"maxmemory": "100mb"}}, "resources": {"limits": {"memory": "1Gi"}}}),
    );
    assert!(!redis_conf(&explicit, r70(), &[r70()]).contains("maxmemory 805306368"));
}

#[test]
fn auth_conf_holds_users_by_hash_and_quotes_the_replication_password() {
    let users = crate::controller::users::build(&Default::default(), "pw\nuser x", "op", "re\"pl\nuser y", &[]);
    let conf = auth_conf(&users);
    let lines: Vec<&str> = conf.lines().collect();
    assert_eq!(lines.len(), 5, "{conf}");
    assert!(lines[0].starts_with("user slotkeeper-operator reset on \"#"), "{conf}");
    assert!(lines[1].starts_with("user slotkeeper-replication reset on \"#"), "{conf}");
    assert!(lines[2].starts_with("user default reset on \"#") && lines[2].ends_with(" \"~*\" \"&*\" +@all"), "{conf}");
    // A newline in a password must not end the line and start a directive;
    // only replication's is in the clear, quoted.
    assert_eq!(lines[3..], ["masteruser slotkeeper-replication", "masterauth \"re\\\"pl\\x0auser y\""]);
    assert!(!conf.contains("pw") && !conf.contains("op\n"));
}

#[test]
fn budget_follows_replicas() {
    let with = cluster(json!({"masters": 3, "replicasPerMaster": 1, "redis": {"version": "7.0.15"}}));
    let without = cluster(json!({"masters": 3, "redis": {"version": "7.0.15"}}));
    assert_eq!(disruption_budget(&with)["spec"]["maxUnavailable"], 1);
    assert_eq!(disruption_budget(&without)["spec"]["maxUnavailable"], 0);
}

#[test]
fn one_file_per_release_in_use_and_redis_conf_for_older_pods() {
    let c =
        cluster(json!({"masters": 3, "redis": {"version": "6.2.14", "config": {"hash-max-listpack-entries": "256"}}}));
    let r62 = catalog::lookup(crate::api::Engine::Redis, "6.2.14").unwrap();
    let map = config_map(&c, &[r62, r70()]);
    let data = map["data"].as_object().unwrap();
    let keys: Vec<&str> = data.keys().map(String::as_str).collect();
    assert_eq!(keys, ["redis-6.2.14.conf", "redis-7.0.15.conf", "redis.conf"]);
    assert!(data["redis-6.2.14.conf"].as_str().unwrap().contains("hash-max-ziplist-entries 256"));
    assert!(data["redis-7.0.15.conf"].as_str().unwrap().contains("hash-max-listpack-entries 256"));
    assert_eq!(data["redis.conf"], data["redis-6.2.14.conf"], "the release that runs");
}

#[test]
fn an_owner_reference_at_another_version_of_our_api_hashes_the_same() {
    let c = cluster(json!({"masters": 3, "redis": {"version": "7.0.15"}}));
    let object = config_map(&c, &[r70()]);
    assert_eq!(object["metadata"]["ownerReferences"][0]["apiVersion"], crate::api::API_VERSION);
    let mut as_previously_written = object.clone();
    as_previously_written["metadata"]["ownerReferences"][0]["apiVersion"] = json!(crate::api::v1alpha1::API_VERSION);
    assert_eq!(with_hash(object.clone()).1, with_hash(as_previously_written).1, "an upgrade rewrites nothing");
    let mut another_owner = object.clone();
    another_owner["metadata"]["ownerReferences"][0]["uid"] = json!("uid-2");
    assert_ne!(with_hash(object.clone()).1, with_hash(another_owner).1);
    let mut foreign = object.clone();
    foreign["metadata"]["ownerReferences"][0]["apiVersion"] = json!("apps/v1");
    assert_ne!(with_hash(object).1, with_hash(foreign).1, "only our own group's versions are one owner");
}

#[test]
fn hashes_change_only_with_content() {
    let c = cluster(json!({"masters": 3, "redis": {"version": "7.0.15"}}));
    let (_, a) = with_hash(config_map(&c, &[r70()]));
    let (_, b) = with_hash(config_map(&c, &[r70()]));
    assert_eq!(a, b);
    let d = cluster(json!({"masters": 3, "redis": {"version": "7.0.15", "config": {"hz": "20"}}}));
    assert_ne!(a, with_hash(config_map(&d, &[r70()])).1);
}

/// Security review finding 9: a tenant labels its own namespace
/// `slotkeeper.io/operator=true`; that must not admit its Pods to Redis.
#[test]
fn redis_admits_the_operator_by_namespace_name_and_pod_label_only() {
    let policy = network_policy(&cluster(json!({"masters": 3, "redis": {"version": "7.0.15"}})));
    let peers = policy["spec"]["ingress"][0]["from"].as_array().unwrap();
    let outside: Vec<&Value> = peers.iter().filter(|p| p.get("namespaceSelector").is_some()).collect();
    assert_eq!(outside.len(), 1, "{peers:?}");
    assert_eq!(
        outside[0]["namespaceSelector"],
        json!({"matchLabels": {"kubernetes.io/metadata.name": "slotkeeper-system"}})
    );
    assert_eq!(outside[0]["podSelector"], json!({"matchLabels": {"app.kubernetes.io/name": "slotkeeper"}}));
    assert!(!policy.to_string().contains("slotkeeper.io/operator"));
}
