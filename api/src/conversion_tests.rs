//! Round trips over random objects both ways, and the objects the previous
//! release wrote, converted as the apiserver would send them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

use super::*;
use crate::catalog::Engine;
use crate::cluster::{AuthSpec, NodeStatus, RedisClusterStatus, SchedulingSpec, StorageSpec};
use crate::operation::{FailoverSpec, OperationPhase, OperationType, RedisOperationStatus};
use crate::{BalanceBy, Phase, v1alpha1};

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,20}"
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map("[a-z][a-z./-]{0,12}", "[a-zA-Z0-9 {}\":,._-]{0,16}", 0..4)
}

/// Metadata; `carried` is the annotation a `v1alpha1` object may hold for `v1`.
fn metadata(carried: Option<String>) -> impl Strategy<Value = ObjectMeta> {
    (name(), name(), option::of(labels()), option::of(labels()), option::of(1i64..100)).prop_map(
        move |(name, namespace, labels, annotations, generation)| {
            // The apiserver never stores an empty map: it omits it.
            let mut annotations = annotations.filter(|map| !map.is_empty());
            if let Some(text) = &carried {
                annotations.get_or_insert_with(BTreeMap::new).insert(ANNOTATION_V1_FIELDS.into(), text.clone());
            }
            ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                labels: labels.filter(|map| !map.is_empty()),
                annotations,
                generation,
                uid: Some("0b6f9a4e-5d0b-4c4e-9a51-000000000001".into()),
                ..Default::default()
            }
        },
    )
}

fn engine() -> impl Strategy<Value = Engine> {
    prop_oneof![Just(Engine::Redis), Just(Engine::Valkey)]
}

fn storage() -> impl Strategy<Value = Option<StorageSpec>> {
    option::of(("[1-9][0-9]?Gi", option::of(name()), any::<bool>()).prop_map(|(size, class, keep)| StorageSpec {
        size,
        storage_class_name: class,
        keep_on_delete: keep,
    }))
}

fn auth() -> impl Strategy<Value = Option<AuthSpec>> {
    option::of((name(), name()).prop_map(|(secret_name, key)| AuthSpec { secret_name, key }))
}

fn resources() -> impl Strategy<Value = Option<ResourceRequirements>> {
    option::of("[1-9][0-9]{0,3}Mi".prop_map(|memory| ResourceRequirements {
        limits: Some(BTreeMap::from([("memory".to_string(), Quantity(memory))])),
        ..Default::default()
    }))
}

fn scheduling() -> impl Strategy<Value = Option<SchedulingSpec>> {
    option::of((option::of(name()), labels()).prop_map(|(priority_class_name, node_selector)| SchedulingSpec {
        priority_class_name,
        node_selector,
        ..Default::default()
    }))
}

fn status() -> impl Strategy<Value = Option<RedisClusterStatus>> {
    let node = (name(), option::of(prop_oneof![Just("master"), Just("replica")]), vec("[0-9]{1,4}-[0-9]{1,5}", 0..3))
        .prop_map(|(pod, role, slots)| NodeStatus { pod, role: role.map(Into::into), slots, ..Default::default() });
    let phase = prop_oneof![Just(Phase::Running), Just(Phase::Scaling), Just(Phase::Upgrading)];
    option::of((option::of(phase), 0i32..6, vec(node, 0..4), option::of("[0-9]\\.[0-9]\\.[0-9]{1,2}")).prop_map(
        |(phase, ready_masters, nodes, current_version)| RedisClusterStatus {
            phase,
            ready_masters,
            nodes,
            current_version,
            ..Default::default()
        },
    ))
}

fn seconds() -> impl Strategy<Value = Option<i32>> {
    option::of(0i32..86400)
}

fn config() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map("[a-z-]{1,16}", "[a-z0-9 ]{0,8}", 0..4)
}

prop_compose! {
    fn old_spec()(masters in 3i32..20, replicas_per_master in 0i32..6, engine in engine(), version in "[0-9]\\.[0-9]\\.[0-9]{1,2}",
        image in option::of("[a-z/:.0-9]{1,20}"), resources in resources(), storage in storage(), auth in auth(),
        config in config(), upgrade in option::of((seconds(), seconds())), paused in any::<bool>(), scheduling in scheduling(),
        acl in option::of((any::<bool>(), "[a-z]{1,8}", "[+~][a-z*]{1,8}")))
        -> v1alpha1::RedisClusterSpec {
        let upgrade = upgrade.map(|(canary_bake_seconds, step_timeout_seconds)| UpgradeSpec { canary_bake_seconds, step_timeout_seconds });
        let acl = acl.map(|(off, name, rule)| crate::acl::AclSpec {
            default_user: if off { crate::acl::DefaultUser::Disabled } else { crate::acl::DefaultUser::Enabled },
            users: vec![crate::acl::AclUser {
                name,
                password_secret: crate::acl::SecretKeyRef { name: "app".into(), key: "password".into() },
                rules: vec![rule],
            }],
        });
        v1alpha1::RedisClusterSpec { masters, replicas_per_master, engine, version, image, resources, storage, auth, acl, config, upgrade, paused, scheduling }
    }
}

prop_compose! {
    fn new_spec()(old in old_spec(), topology_key in option::of(option::of("[a-z./-]{1,30}")),
        balance in option::of((any::<bool>(), option::of(1i32..=50))))
        -> RedisClusterSpec {
        let mut spec = cluster_to_v1(v1alpha1::RedisCluster::new("x", old)).spec;
        spec.placement = topology_key.map(|topology_key| PlacementSpec { topology_key });
        spec.balance = balance.map(|(memory, tolerance_percent)| BalanceSpec {
            by: if memory { BalanceBy::Memory } else { BalanceBy::Slots },
            tolerance_percent,
        });
        spec
    }
}

/// A `v1alpha1` object as the previous release or a newer one wrote it:
/// sometimes carrying a `v1` placement in the annotation.
fn old_cluster() -> impl Strategy<Value = v1alpha1::RedisCluster> {
    let carried = option::of("[a-z./-]{1,30}".prop_map(|key| {
        serde_json::to_string(&V1OnlyFields {
            placement: Some(PlacementSpec { topology_key: Some(key) }),
            balance: None,
        })
        .unwrap()
    }));
    carried
        .prop_flat_map(|carried| (metadata(carried), old_spec(), status()))
        .prop_map(|(metadata, spec, status)| v1alpha1::RedisCluster { metadata, spec, status })
}

fn new_cluster() -> impl Strategy<Value = RedisCluster> {
    (metadata(None), new_spec(), status()).prop_map(|(metadata, spec, status)| RedisCluster { metadata, spec, status })
}

fn operation_parts()
-> impl Strategy<Value = (ObjectMeta, String, OperationType, Option<FailoverSpec>, Option<RedisOperationStatus>)> {
    let type_ =
        prop_oneof![Just(OperationType::Failover), Just(OperationType::RollingRestart), Just(OperationType::Rebalance)];
    let failover =
        option::of((0i32..10, option::of(name())).prop_map(|(shard, target_pod)| FailoverSpec { shard, target_pod }));
    let status = option::of(
        (option::of(Just(OperationPhase::Succeeded)), option::of("[ -~]{0,30}"))
            .prop_map(|(phase, message)| RedisOperationStatus { phase, message, ..Default::default() }),
    );
    (metadata(None), name(), type_, failover, status)
}

proptest! {
    #[test]
    fn a_v1alpha1_cluster_survives_a_round_trip_through_v1(old in old_cluster()) {
        prop_assert_eq!(json(cluster_to_v1alpha1(cluster_to_v1(old.clone()))), json(old));
    }

    #[test]
    fn a_v1_cluster_survives_a_round_trip_through_v1alpha1(new in new_cluster()) {
        prop_assert_eq!(json(cluster_to_v1(cluster_to_v1alpha1(new.clone()))), json(new));
    }

    #[test]
    fn a_v1_cluster_survives_the_webhooks_json_both_ways(new in new_cluster()) {
        let json = serde_json::to_value(&new).unwrap();
        let old = convert(json.clone(), &v1alpha1::RedisCluster::api_version(&())).unwrap();
        prop_assert_eq!(&old["apiVersion"], &serde_json::json!(v1alpha1::RedisCluster::api_version(&())));
        prop_assert_eq!(convert(old, &RedisCluster::api_version(&())).unwrap(), json);
    }

    #[test]
    fn operations_survive_round_trips_both_ways((metadata, cluster, type_, failover, status) in operation_parts()) {
        let old = v1alpha1::RedisOperation { metadata: metadata.clone(), spec: v1alpha1::RedisOperationSpec { cluster: cluster.clone(), type_, failover: failover.clone() }, status: status.clone() };
        prop_assert_eq!(json(operation_to_v1alpha1(operation_to_v1(old.clone()))), json(old));
        let new = RedisOperation { metadata, spec: RedisOperationSpec { cluster_name: cluster, type_, failover }, status };
        prop_assert_eq!(json(operation_to_v1(operation_to_v1alpha1(new.clone()))), json(new));
    }
}

/// What the typed functions make of an object, as JSON with its type.
fn typed<K: Resource<DynamicType = ()> + Serialize>(object: K) -> serde_json::Value {
    let mut value = json(&object);
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    without_nulls(value)
}

/// What the webhook's JSON conversion makes of the typed object `sent`.
fn by_wire<K: Resource<DynamicType = ()> + Serialize>(sent: K, desired: &str) -> serde_json::Value {
    let converted = wire::convert(&typed(sent).to_string(), desired).unwrap();
    without_nulls(serde_json::from_str(converted.get()).unwrap())
}

proptest! {
    #[test]
    fn the_webhooks_json_conversion_to_v1_is_the_typed_one(old in old_cluster()) {
        prop_assert_eq!(by_wire(old.clone(), &RedisCluster::api_version(&())), typed(cluster_to_v1(old)));
    }

    #[test]
    fn the_webhooks_json_conversion_to_v1alpha1_is_the_typed_one(new in new_cluster()) {
        let desired = v1alpha1::RedisCluster::api_version(&());
        prop_assert_eq!(by_wire(new.clone(), &desired), typed(cluster_to_v1alpha1(new)));
    }

    #[test]
    fn the_webhooks_json_conversion_of_operations_is_the_typed_one((metadata, cluster, type_, failover, status) in operation_parts()) {
        let old = v1alpha1::RedisOperation { metadata: metadata.clone(), spec: v1alpha1::RedisOperationSpec { cluster: cluster.clone(), type_, failover: failover.clone() }, status: status.clone() };
        prop_assert_eq!(by_wire(old.clone(), &RedisOperation::api_version(&())), typed(operation_to_v1(old)));
        let new = RedisOperation { metadata, spec: RedisOperationSpec { cluster_name: cluster, type_, failover }, status };
        prop_assert_eq!(by_wire(new.clone(), &v1alpha1::RedisOperation::api_version(&())), typed(operation_to_v1alpha1(new)));
    }
}

/// Metadata and status the conversion has no reason to read reach the
/// apiserver as it sent them, fields this release does not know included.
#[test]
fn metadata_and_status_pass_through_as_sent() {
    let sent = r#"{"apiVersion":"slotkeeper.io/v1","kind":"RedisCluster","metadata":{"name":"c","managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}],"futureField":1},"spec":{"masters":3,"redis":{"version":"7.0.15"}},"status":{"phase":"Running","futureStatus":true}}"#;
    let converted = wire::convert(sent, "slotkeeper.io/v1alpha1").unwrap();
    let text = converted.get();
    assert!(text.contains(r#""metadata":{"name":"c","managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}],"futureField":1}"#), "{text}");
    assert!(text.contains(r#""status":{"phase":"Running","futureStatus":true}"#), "{text}");
    assert!(text.contains(r#""spec":{"masters":3"#) && text.contains(r#""version":"7.0.15""#), "{text}");
    let not_an_object = wire::convert("[1]", "slotkeeper.io/v1").unwrap_err();
    assert!(matches!(not_an_object, ConversionError::MissingTypeMeta), "{not_an_object}");
    let no_spec = wire::convert(
        r#"{"apiVersion":"slotkeeper.io/v1","kind":"RedisCluster","metadata":{"name":"c"}}"#,
        "slotkeeper.io/v1alpha1",
    );
    assert!(
        no_spec
            .unwrap_err()
            .to_string()
            .contains("RedisCluster c is not a valid slotkeeper.io/v1 object: missing field `spec`")
    );
}

#[test]
fn v1_groups_the_servers_settings_and_renames_upgrade_to_rollout() {
    let old: v1alpha1::RedisCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "slotkeeper.io/v1alpha1", "kind": "RedisCluster",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {"masters": 3, "engine": "valkey", "version": "8.1.8", "config": {"hz": "20"}, "upgrade": {"canaryBakeSeconds": 0}}
    }))
    .unwrap();
    let new = serde_json::to_value(cluster_to_v1(old)).unwrap();
    assert_eq!(new["apiVersion"], "slotkeeper.io/v1");
    assert_eq!(
        new["spec"]["redis"],
        serde_json::json!({"engine": "valkey", "version": "8.1.8", "config": {"hz": "20"}})
    );
    assert_eq!(new["spec"]["rollout"], serde_json::json!({"canaryBakeSeconds": 0}));
    assert!(new["spec"]["version"].is_null() && new["spec"]["upgrade"].is_null());
}

#[test]
fn a_placement_rides_through_v1alpha1_in_an_annotation() {
    let mut new = RedisCluster::new("c", cluster_to_v1(v1alpha1::RedisCluster::new("c", old_spec_fixture())).spec);
    new.spec.placement = Some(PlacementSpec { topology_key: Some("topology.kubernetes.io/zone".into()) });
    let old = cluster_to_v1alpha1(new.clone());
    let carried = &old.metadata.annotations.as_ref().unwrap()[ANNOTATION_V1_FIELDS];
    assert_eq!(carried, r#"{"placement":{"topologyKey":"topology.kubernetes.io/zone"}}"#);
    let back = cluster_to_v1(old);
    assert_eq!(json(&back), json(&new));
    assert!(back.metadata.annotations.is_none(), "the annotation is not left on the v1 object");
}

#[test]
fn an_unreadable_carried_annotation_is_kept_and_the_object_still_converts() {
    let mut old = v1alpha1::RedisCluster::new("c", old_spec_fixture());
    old.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_V1_FIELDS.to_string(), "not json".to_string())]));
    let new = cluster_to_v1(old.clone());
    assert_eq!(new.spec.placement, None);
    assert_eq!(new.metadata.annotations, old.metadata.annotations);
}

/// Kinds compare as their JSON (the derived root types have no `PartialEq`).
fn json(object: impl Serialize) -> serde_json::Value {
    serde_json::to_value(object).unwrap()
}

fn old_spec_fixture() -> v1alpha1::RedisClusterSpec {
    serde_json::from_value(serde_json::json!({"masters": 3, "version": "7.0.15"})).unwrap()
}

#[test]
fn the_webhook_refuses_what_it_does_not_know_with_the_reason() {
    let object = serde_json::json!({"apiVersion": "slotkeeper.io/v1alpha1", "kind": "RedisCluster", "metadata": {"name": "c"}, "spec": {"masters": 3, "version": "7.0.15"}});
    let error = convert(object.clone(), "slotkeeper.io/v2").unwrap_err().to_string();
    assert!(
        error.contains("slotkeeper.io/v2") && error.contains("slotkeeper.io/v1alpha1 and slotkeeper.io/v1"),
        "{error}"
    );
    let other = serde_json::json!({"apiVersion": "slotkeeper.io/v1alpha1", "kind": "Other", "metadata": {"name": "c"}});
    assert!(convert(other, "slotkeeper.io/v1").unwrap_err().to_string().contains("kind Other"));
    let broken = serde_json::json!({"apiVersion": "slotkeeper.io/v1alpha1", "kind": "RedisCluster", "metadata": {"name": "c"}, "spec": {"masters": "three"}});
    let error = convert(broken, "slotkeeper.io/v1").unwrap_err().to_string();
    assert!(error.contains("RedisCluster c is not a valid slotkeeper.io/v1alpha1 object"), "{error}");
    assert_eq!(convert(object.clone(), "slotkeeper.io/v1alpha1").unwrap(), object, "same version: unchanged");
}

/// Objects exactly as the previous release wrote them (read back from its
/// apiserver): each converts to `v1` and back to the same JSON.
#[test]
fn objects_the_previous_release_wrote_convert_to_v1_and_back_unchanged() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v1alpha1");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("api/fixtures/v1alpha1 exists") {
        let path = entry.unwrap().path();
        let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let kind = written["kind"].as_str().unwrap().to_string();
        let new_version = served(&kind).unwrap()[1].clone();
        let new = convert(written.clone(), &new_version).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(new["apiVersion"], new_version.as_str());
        let back = convert(new, &served(&kind).unwrap()[0]).unwrap();
        assert_eq!(without_nulls(back), without_nulls(written), "{} changed in a round trip", path.display());
        seen += 1;
    }
    assert!(seen >= 3, "the fixtures hold a cluster, a paused cluster and an operation ({seen} found)");
}

/// JSON without `null` members: a typed object omits absent fields the
/// apiserver may have spelled out.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect()
        }
        serde_json::Value::Array(items) => items.into_iter().map(without_nulls).collect(),
        other => other,
    }
}
