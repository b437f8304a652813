use super::*;
use k8s_openapi::serde::Deserialize;
use serde_json::{Map, Value, json};

use FindingKind::*;

const CRD: &str = "redisclusters.example.io";
/// The `spec` schema of the first version, v1alpha1.
const SPEC: &str = "/spec/versions/0/schema/openAPIV3Schema/properties/spec";
const STATUS: &str = "/spec/versions/0/schema/openAPIV3Schema/properties/status";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["masters"],
                "x-kubernetes-validations": [{"rule": "self.masters <= 100", "message": "at most 100 masters"}],
                "properties": {
                    "masters": {"type": "integer", "minimum": 3},
                    "engine": {"type": "string", "enum": ["redis", "valkey"]},
                    "config": {"type": "object", "additionalProperties": {"type": "string"}},
                    "image": {"type": "string", "nullable": true},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "zones": {"type": "array", "items": {"type": "string"}},
                    "resources": {
                        "type": "object",
                        "properties": {"cpu": {"type": "string"}, "memory": {"type": "string"}}
                    }
                }
            },
            "status": {
                "type": "object",
                "properties": {
                    "nodes": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "pod": {"type": "string"},
                                "slots": {"type": "array", "items": {"type": "integer"}}
                            }
                        }
                    }
                }
            }
        }
    })
}

fn fixture() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": "example.io",
            "names": {"kind": "RedisCluster", "plural": "redisclusters", "singular": "rediscluster"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": true, "schema": {"openAPIV3Schema": schema()}},
                {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": schema()}}
            ]
        },
        "status": {"storedVersions": ["v1alpha1"]}
    })
}

fn crd(value: Value) -> CustomResourceDefinition {
    serde_json::from_value(value).expect("fixture is a CRD")
}

/// The findings of upgrading the fixture to the fixture after `edit`.
fn after(edit: impl FnOnce(&mut Value)) -> Vec<Finding> {
    let mut new = fixture();
    edit(&mut new);
    check(&[crd(fixture())], &[crd(new)])
}

/// The JSON object at `pointer`.
fn at<'a>(value: &'a mut Value, pointer: &str) -> &'a mut Map<String, Value> {
    value.pointer_mut(pointer).and_then(Value::as_object_mut).unwrap_or_else(|| panic!("no object at {pointer}"))
}

fn set(value: &mut Value, pointer: &str, key: &str, new: Value) {
    at(value, pointer).insert(key.to_owned(), new);
}

fn remove(value: &mut Value, pointer: &str, key: &str) {
    at(value, pointer).remove(key).unwrap_or_else(|| panic!("no {key} at {pointer}"));
}

/// (version, path, kind) of each finding: what the tests pin.
fn summary(findings: &[Finding]) -> Vec<(&str, &str, FindingKind)> {
    findings.iter().map(|f| (f.version.as_str(), f.path.as_str(), f.kind)).collect()
}

#[test]
fn an_identical_crd_gives_no_finding() {
    assert_eq!(after(|_| {}), vec![]);
}

#[test]
fn a_crd_missing_from_the_new_release_is_reported() {
    let findings = check(&[crd(fixture())], &[]);
    assert_eq!(summary(&findings), vec![("", "", VersionRemoved)]);
    assert!(findings[0].message.contains("CRD not in the new release"), "{}", findings[0]);
}

#[test]
fn a_crd_only_in_the_new_release_gives_no_finding() {
    assert_eq!(check(&[], &[crd(fixture())]), vec![]);
}

#[test]
fn a_removed_stored_version_is_reported_and_as_a_removed_served_version() {
    let findings = after(|v| {
        at(v, "/spec").get_mut("versions").and_then(Value::as_array_mut).expect("versions").remove(0);
    });
    assert_eq!(summary(&findings), vec![("v1alpha1", "", StoredVersionRemoved), ("v1alpha1", "", VersionRemoved)]);
    assert!(findings[0].message.contains("etcd"), "{}", findings[0]);
}

#[test]
fn a_version_no_longer_served_is_reported() {
    let findings = after(|v| set(v, "/spec/versions/1", "served", json!(false)));
    assert_eq!(summary(&findings), vec![("v1beta1", "", VersionRemoved)]);
}

#[test]
fn a_changed_scope_is_reported() {
    let findings = after(|v| set(v, "/spec", "scope", json!("Cluster")));
    assert_eq!(summary(&findings), vec![("", "", ScopeChanged)]);
    assert!(findings[0].message.contains("from Namespaced to Cluster"), "{}", findings[0]);
}

#[test]
fn a_removed_field_is_reported_once_at_its_path() {
    let findings = after(|v| {
        remove(v, &format!("{STATUS}/properties/nodes/items/properties"), "slots");
        // Its children `cpu` and `memory` go with it: one finding.
        remove(v, &format!("{SPEC}/properties"), "resources");
    });
    assert_eq!(
        summary(&findings),
        vec![("v1alpha1", "spec.resources", FieldRemoved), ("v1alpha1", "status.nodes[].slots", FieldRemoved)]
    );
}

#[test]
fn removed_map_values_are_reported_at_the_map_values_path() {
    let findings = after(|v| remove(v, &format!("{SPEC}/properties/config"), "additionalProperties"));
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.config{}", FieldRemoved)]);
}

#[test]
fn a_changed_type_is_reported_without_the_keywords_below_it() {
    let findings = after(|v| {
        set(v, &format!("{SPEC}/properties/config/additionalProperties"), "type", json!("integer"));
        // The old minimum constrained integers; a string has none to compare.
        *v.pointer_mut(&format!("{SPEC}/properties/masters")).expect("masters") = json!({"type": "string"});
    });
    assert_eq!(
        summary(&findings),
        vec![("v1alpha1", "spec.config{}", TypeChanged), ("v1alpha1", "spec.masters", TypeChanged)]
    );
    assert!(findings[0].message.contains("from string to integer"), "{}", findings[0]);
}

#[test]
fn a_field_no_longer_int_or_string_is_a_changed_type() {
    let mut old = fixture();
    set(&mut old, &format!("{SPEC}/properties/zones/items"), "x-kubernetes-int-or-string", json!(true));
    remove(&mut old, &format!("{SPEC}/properties/zones/items"), "type");
    let findings = check(&[crd(old)], &[crd(fixture())]);
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.zones[]", TypeChanged)]);
}

#[test]
fn a_new_required_field_of_an_existing_object_is_reported() {
    let findings = after(|v| {
        set(v, SPEC, "required", json!(["masters", "engine"]));
        // A new object may require its fields: no existing object has it.
        let tls = json!({"type": "object", "required": ["secret"], "properties": {"secret": {"type": "string"}}});
        set(v, &format!("{SPEC}/properties"), "tls", tls);
    });
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.engine", NewRequiredField)]);
}

#[test]
fn a_narrowed_or_added_enum_is_reported() {
    let findings = after(|v| {
        set(v, &format!("{SPEC}/properties/engine"), "enum", json!(["redis", "keydb"]));
        set(v, &format!("{SPEC}/properties/zones/items"), "enum", json!(["a", "b"]));
    });
    assert_eq!(
        summary(&findings),
        vec![("v1alpha1", "spec.engine", EnumNarrowed), ("v1alpha1", "spec.zones[]", EnumNarrowed)]
    );
    assert!(findings[0].message.contains(r#"no longer allows "valkey""#), "{}", findings[0]);
    assert!(!findings[0].message.contains("redis"), "{}", findings[0]);
}

#[test]
fn a_raised_minimum_is_reported_in_one_readable_line() {
    let findings = after(|v| set(v, &format!("{SPEC}/properties/masters"), "minimum", json!(5)));
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.masters", RangeNarrowed)]);
    assert_eq!(
        findings[0].to_string(),
        "redisclusters.example.io v1alpha1 spec.masters: minimum raised from 3 to 5 (existing objects may no longer validate)"
    );
}

#[test]
fn every_added_or_narrowed_limit_is_reported() {
    let masters = format!("{SPEC}/properties/masters");
    let image = format!("{SPEC}/properties/image");
    let zones = format!("{SPEC}/properties/zones");
    let config = format!("{SPEC}/properties/config");
    let cases = [
        (&masters, "maximum", json!(100), "maximum 100 added"),
        (&masters, "exclusiveMinimum", json!(true), "exclusiveMinimum turned on"),
        (&masters, "exclusiveMaximum", json!(true), "exclusiveMaximum turned on"),
        (&masters, "multipleOf", json!(2), "multipleOf 2 added"),
        (&image, "minLength", json!(1), "minLength 1 added"),
        (&image, "maxLength", json!(253), "maxLength 253 added"),
        (&zones, "minItems", json!(1), "minItems 1 added"),
        (&zones, "maxItems", json!(3), "maxItems 3 added"),
        (&config, "minProperties", json!(1), "minProperties 1 added"),
        (&config, "maxProperties", json!(64), "maxProperties 64 added"),
    ];
    for (pointer, keyword, value, message) in cases {
        let findings = after(|v| set(v, pointer, keyword, value));
        let path = pointer.trim_start_matches(SPEC).replace("/properties/", ".");
        assert_eq!(summary(&findings), vec![("v1alpha1", format!("spec{path}").as_str(), RangeNarrowed)], "{keyword}");
        assert!(findings[0].message.starts_with(message), "{keyword}: {}", findings[0]);
    }
    let mut old = fixture();
    set(&mut old, &zones, "maxItems", json!(5));
    let mut new = fixture();
    set(&mut new, &zones, "maxItems", json!(3));
    let findings = check(&[crd(old)], &[crd(new)]);
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.zones", RangeNarrowed)]);
    assert!(findings[0].message.starts_with("maxItems lowered from 5 to 3"), "{}", findings[0]);
}

#[test]
fn an_added_or_changed_pattern_or_format_is_a_tightened_validation() {
    let findings = after(|v| {
        set(v, &format!("{SPEC}/properties/image"), "pattern", json!("^[a-z]+$"));
        set(v, &format!("{SPEC}/properties/masters"), "format", json!("int32"));
    });
    assert_eq!(
        summary(&findings),
        vec![("v1alpha1", "spec.image", ValidationTightened), ("v1alpha1", "spec.masters", ValidationTightened)]
    );
    assert!(findings[0].message.contains("pattern `^[a-z]+$` added"), "{}", findings[0]);
}

#[test]
fn unique_items_list_types_and_compositions_are_tightened_validations() {
    let findings = after(|v| {
        set(v, &format!("{SPEC}/properties/zones"), "x-kubernetes-list-type", json!("set"));
        set(v, &format!("{STATUS}/properties/nodes"), "uniqueItems", json!(true));
        set(v, &format!("{SPEC}/properties/image"), "anyOf", json!([{"minLength": 1}]));
    });
    assert_eq!(
        summary(&findings),
        vec![
            ("v1alpha1", "spec.image", ValidationTightened),
            ("v1alpha1", "spec.zones", ValidationTightened),
            ("v1alpha1", "status.nodes", ValidationTightened)
        ]
    );
}

#[test]
fn a_new_or_changed_cel_rule_is_reported_and_a_transition_rule_says_so() {
    let findings = after(|v| {
        set(v, SPEC, "x-kubernetes-validations", json!([{"rule": "self.masters <= 50"}]));
        let transition = json!([{"rule": "self >= oldSelf", "message": "masters never shrink"}]);
        set(v, &format!("{SPEC}/properties/masters"), "x-kubernetes-validations", transition);
    });
    assert_eq!(
        summary(&findings),
        vec![("v1alpha1", "spec", ValidationTightened), ("v1alpha1", "spec.masters", ValidationTightened)]
    );
    assert!(findings[0].message.contains("validation rule `self.masters <= 50`"), "{}", findings[0]);
    assert!(findings[1].message.contains("transition rule `self >= oldSelf`"), "{}", findings[1]);
}

#[test]
fn nullable_turned_off_is_a_tightened_validation() {
    let findings = after(|v| set(v, &format!("{SPEC}/properties/image"), "nullable", json!(false)));
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.image", ValidationTightened)]);
}

#[test]
fn unknown_fields_no_longer_preserved_are_removed_fields() {
    let findings = after(|v| remove(v, &format!("{SPEC}/properties/extra"), "x-kubernetes-preserve-unknown-fields"));
    assert_eq!(summary(&findings), vec![("v1alpha1", "spec.extra", FieldRemoved)]);
    assert!(findings[0].message.contains("pruned"), "{}", findings[0]);
}

#[test]
fn widening_changes_give_no_finding() {
    let findings = after(|v| {
        let props = format!("{SPEC}/properties");
        set(v, &props, "paused", json!({"type": "boolean"}));
        set(v, &format!("{props}/engine"), "enum", json!(["redis", "valkey", "keydb"]));
        set(v, &format!("{props}/masters"), "minimum", json!(1));
        set(v, &format!("{props}/zones"), "x-kubernetes-list-type", json!("atomic"));
        set(v, &format!("{props}/resources"), "nullable", json!(true));
        set(v, &format!("{props}/resources"), "x-kubernetes-preserve-unknown-fields", json!(true));
        set(v, SPEC, "required", json!([]));
        remove(v, SPEC, "x-kubernetes-validations");
        let v1 = json!({"name": "v1", "served": true, "storage": false, "schema": {"openAPIV3Schema": schema()}});
        at(v, "/spec").get_mut("versions").and_then(Value::as_array_mut).expect("versions").push(v1);
    });
    assert_eq!(findings, vec![]);
    let mut narrow = fixture();
    set(&mut narrow, &format!("{SPEC}/properties/zones"), "maxItems", json!(3));
    set(&mut narrow, &format!("{SPEC}/properties/image"), "pattern", json!("^[a-z]+$"));
    let findings = check(&[crd(narrow)], &[crd(fixture())]);
    assert_eq!(findings, vec![]);
}

#[test]
fn findings_are_ordered_by_crd_version_path_and_kind_whatever_the_input_order() {
    let mut other = fixture();
    set(&mut other, "/metadata", "name", json!("redisoperations.example.io"));
    let edit = |v: &mut Value| {
        set(v, "/spec/versions/1/schema/openAPIV3Schema/properties/spec/properties/masters", "minimum", json!(5));
        set(v, &format!("{SPEC}/properties/masters"), "maximum", json!(9));
        set(v, SPEC, "required", json!(["masters", "zones"]));
        remove(v, &format!("{SPEC}/properties"), "image");
    };
    let mut new_other = other.clone();
    edit(&mut new_other);
    let mut new = fixture();
    edit(&mut new);
    let findings = check(&[crd(other.clone()), crd(fixture())], &[crd(new.clone()), crd(new_other.clone())]);
    let reversed = check(&[crd(fixture()), crd(other)], &[crd(new_other), crd(new)]);
    assert_eq!(findings, reversed);
    let keys: Vec<_> = findings.iter().map(|f| (f.crd.as_str(), f.version.as_str(), f.path.as_str(), f.kind)).collect();
    let one_crd = [
        ("v1alpha1", "spec.image", FieldRemoved),
        ("v1alpha1", "spec.masters", RangeNarrowed),
        ("v1alpha1", "spec.zones", NewRequiredField),
        ("v1beta1", "spec.masters", RangeNarrowed),
    ];
    let expected: Vec<_> = ["redisclusters.example.io", "redisoperations.example.io"]
        .into_iter()
        .flat_map(|name| one_crd.map(|(version, path, kind)| (name, version, path, kind)))
        .collect();
    assert_eq!(keys, expected);
}

#[test]
fn the_committed_crds_against_themselves_give_no_finding() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/slotkeeper.io.yaml");
    let yaml = std::fs::read_to_string(path).expect("read the committed CRDs");
    let crds: Vec<CustomResourceDefinition> = serde_norway::Deserializer::from_str(&yaml)
        .map(|document| CustomResourceDefinition::deserialize(document).expect("a CRD"))
        .collect();
    assert!(!crds.is_empty(), "no CRD in {path}");
    assert_eq!(check(&crds, &crds), vec![]);
}
