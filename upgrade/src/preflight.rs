//! Is it safe to apply a release's CRDs over the installed ones? Pure
//! functions from both sets of CRDs to the changes that could lose stored
//! data, break clients, or make existing objects fail validation.
//!
//! Each CRD is compared by name, each version present in both by walking its
//! `openAPIV3Schema` through `properties`, `items` and `additionalProperties`.
//! Only narrowing is reported: new optional fields, added enum values,
//! relaxed limits and removed rules are safe. Where equivalence cannot be
//! proven (a CEL rule's text changed, a composition changed) the check is
//! conservative and reports it.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSON, JSONSchemaProps, JSONSchemaPropsOrArray,
    JSONSchemaPropsOrBool,
};

/// Why existing objects would not validate after a narrowing change.
const EXISTING_OBJECTS: &str = "existing objects may no longer validate";

/// One unsafe change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Finding {
    /// The CRD's name, e.g. `redisclusters.slotkeeper.io`.
    pub crd: String,
    /// The version, e.g. `v1alpha1`; empty for a finding about the whole CRD.
    pub version: String,
    /// Dotted field path, `[]` for array items and `{}` for map values, e.g.
    /// `status.nodes[].slots`; empty for a finding about a version or the CRD.
    pub path: String,
    pub kind: FindingKind,
    /// What changed and why it is unsafe, for a human.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    /// A version in `status.storedVersions` is gone: objects stored in etcd at it could not be read.
    StoredVersionRemoved,
    /// A served version (or the whole CRD) is gone or no longer served.
    VersionRemoved,
    FieldRemoved,
    NewRequiredField,
    EnumNarrowed,
    RangeNarrowed,
    ValidationTightened,
    TypeChanged,
    ScopeChanged,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.crd)?;
        for part in [&self.version, &self.path].into_iter().filter(|p| !p.is_empty()) {
            write!(f, " {part}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every unsafe change from `installed` to `new`, ordered by CRD, version, path and kind.
pub fn check(installed: &[CustomResourceDefinition], new: &[CustomResourceDefinition]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for old in installed {
        let mut recorder = Recorder { crd: crd_name(old), version: "", findings: &mut findings };
        match new.iter().find(|n| crd_name(n) == recorder.crd) {
            Some(new) => compare_crds(old, new, &mut recorder),
            None => recorder.report(
                "",
                FindingKind::VersionRemoved,
                "CRD not in the new release (deleting it deletes every object of its kind)",
            ),
        }
    }
    findings.sort();
    findings
}

/// Collects findings about one CRD (and version), so each check names only the path.
struct Recorder<'a> {
    crd: &'a str,
    version: &'a str,
    findings: &'a mut Vec<Finding>,
}

impl Recorder<'_> {
    fn report(&mut self, path: &str, kind: FindingKind, message: impl Into<String>) {
        self.findings.push(Finding {
            crd: self.crd.to_owned(),
            version: self.version.to_owned(),
            path: path.to_owned(),
            kind,
            message: message.into(),
        });
    }

    fn for_version<'b>(&'b mut self, version: &'b str) -> Recorder<'b> {
        Recorder { crd: self.crd, version, findings: &mut *self.findings }
    }
}

fn crd_name(crd: &CustomResourceDefinition) -> &str {
    crd.metadata.name.as_deref().unwrap_or_default()
}

fn find_version<'a>(crd: &'a CustomResourceDefinition, name: &str) -> Option<&'a CustomResourceDefinitionVersion> {
    crd.spec.versions.iter().find(|v| v.name == name)
}

fn schema_of(version: &CustomResourceDefinitionVersion) -> Option<&JSONSchemaProps> {
    version.schema.as_ref()?.open_api_v3_schema.as_ref()
}

fn compare_crds(old: &CustomResourceDefinition, new: &CustomResourceDefinition, recorder: &mut Recorder) {
    check_scope(old, new, recorder);
    check_stored_versions(old, new, recorder);
    check_served_versions(old, new, recorder);
    for old_version in &old.spec.versions {
        let Some(new_version) = find_version(new, &old_version.name) else { continue };
        // A version without a schema (not allowed in v1) has nothing to compare.
        if let (Some(old_schema), Some(new_schema)) = (schema_of(old_version), schema_of(new_version)) {
            compare_schemas(old_schema, new_schema, "", &mut recorder.for_version(&old_version.name));
        }
    }
}

fn check_scope(old: &CustomResourceDefinition, new: &CustomResourceDefinition, recorder: &mut Recorder) {
    if old.spec.scope != new.spec.scope {
        let message = format!(
            "scope changed from {} to {} (the API server refuses it, and existing objects cannot move)",
            old.spec.scope, new.spec.scope
        );
        recorder.report("", FindingKind::ScopeChanged, message);
    }
}

fn check_stored_versions(old: &CustomResourceDefinition, new: &CustomResourceDefinition, recorder: &mut Recorder) {
    let stored = old.status.iter().flat_map(|s| s.stored_versions.iter().flatten());
    for version in stored.filter(|v| find_version(new, v).is_none()) {
        recorder.for_version(version).report(
            "",
            FindingKind::StoredVersionRemoved,
            "stored version removed (objects stored in etcd at it could no longer be read; \
             migrate them and trim status.storedVersions first)",
        );
    }
}

fn check_served_versions(old: &CustomResourceDefinition, new: &CustomResourceDefinition, recorder: &mut Recorder) {
    for old_version in old.spec.versions.iter().filter(|v| v.served) {
        let message = match find_version(new, &old_version.name) {
            None => "served version removed (clients and manifests that use it would break)",
            Some(v) if !v.served => "version no longer served (clients and manifests that use it would break)",
            Some(_) => continue,
        };
        recorder.for_version(&old_version.name).report("", FindingKind::VersionRemoved, message);
    }
}

/// Compares the schemas of one field, then its children.
fn compare_schemas(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    if check_type(old, new, path, recorder) {
        // Every other keyword constrained values of the old type: comparing them would be noise.
        return;
    }
    check_required(old, new, path, recorder);
    check_enum(old, new, path, recorder);
    check_ranges(old, new, path, recorder);
    check_value_validations(old, new, path, recorder);
    check_cel_rules(old, new, path, recorder);
    check_nullable(old, new, path, recorder);
    check_preserve_unknown_fields(old, new, path, recorder);
    compare_properties(old, new, path, recorder);
    compare_items(old, new, path, recorder);
    compare_additional_properties(old, new, path, recorder);
}

/// Reports a narrowed type; true when it did.
fn check_type(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) -> bool {
    let type_name = |schema: &JSONSchemaProps| schema.type_.clone().unwrap_or_else(|| "any type".to_owned());
    let message = if is_on(old.x_kubernetes_int_or_string) && !is_on(new.x_kubernetes_int_or_string) {
        format!("no longer int-or-string but {} (stored values of the other type would not validate)", type_name(new))
    } else if new.type_.is_some() && old.type_ != new.type_ {
        format!("type changed from {} to {} (stored values would not validate)", type_name(old), type_name(new))
    } else {
        return false;
    };
    recorder.report(path, FindingKind::TypeChanged, message);
    true
}

fn check_required(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    let before: BTreeSet<&str> = old.required.iter().flatten().map(String::as_str).collect();
    for name in new.required.iter().flatten().filter(|n| !before.contains(n.as_str())) {
        recorder.report(
            &child_path(path, name),
            FindingKind::NewRequiredField,
            format!("{name} is now required (existing objects without it may no longer validate)"),
        );
    }
}

fn check_enum(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    let Some(new_values) = &new.enum_ else { return };
    let message = match &old.enum_ {
        None => format!("enum added, only {} allowed ({EXISTING_OBJECTS})", list_values(new_values)),
        Some(old_values) => {
            let removed: Vec<JSON> = old_values.iter().filter(|v| !new_values.contains(v)).cloned().collect();
            if removed.is_empty() {
                return;
            }
            format!("enum no longer allows {} ({EXISTING_OBJECTS})", list_values(&removed))
        }
    };
    recorder.report(path, FindingKind::EnumNarrowed, message);
}

fn list_values(values: &[JSON]) -> String {
    values.iter().map(|v| v.0.to_string()).collect::<Vec<_>>().join(", ")
}

fn check_ranges(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    let narrowed = [
        raised("minimum", old.minimum, new.minimum),
        lowered("maximum", old.maximum, new.maximum),
        turned_on("exclusiveMinimum", old.exclusive_minimum, new.exclusive_minimum),
        turned_on("exclusiveMaximum", old.exclusive_maximum, new.exclusive_maximum),
        multiple_of_narrowed(old.multiple_of, new.multiple_of),
        raised("minLength", old.min_length, new.min_length),
        lowered("maxLength", old.max_length, new.max_length),
        raised("minItems", old.min_items, new.min_items),
        lowered("maxItems", old.max_items, new.max_items),
        raised("minProperties", old.min_properties, new.min_properties),
        lowered("maxProperties", old.max_properties, new.max_properties),
    ];
    for change in narrowed.into_iter().flatten() {
        recorder.report(path, FindingKind::RangeNarrowed, format!("{change} ({EXISTING_OBJECTS})"));
    }
}

/// A lower bound added or raised.
fn raised<T: PartialOrd + fmt::Display>(keyword: &str, old: Option<T>, new: Option<T>) -> Option<String> {
    match (old, new) {
        (None, Some(new)) => Some(format!("{keyword} {new} added")),
        (Some(old), Some(new)) if new > old => Some(format!("{keyword} raised from {old} to {new}")),
        _ => None,
    }
}

/// An upper bound added or lowered.
fn lowered<T: PartialOrd + fmt::Display>(keyword: &str, old: Option<T>, new: Option<T>) -> Option<String> {
    match (old, new) {
        (None, Some(new)) => Some(format!("{keyword} {new} added")),
        (Some(old), Some(new)) if new < old => Some(format!("{keyword} lowered from {old} to {new}")),
        _ => None,
    }
}

fn turned_on(keyword: &str, old: Option<bool>, new: Option<bool>) -> Option<String> {
    (!is_on(old) && is_on(new)).then(|| format!("{keyword} turned on"))
}

/// Multiples of the old step stay valid only when the new step divides it.
fn multiple_of_narrowed(old: Option<f64>, new: Option<f64>) -> Option<String> {
    match (old, new) {
        (None, Some(new)) => Some(format!("multipleOf {new} added")),
        (Some(old), Some(new)) if old % new != 0.0 => Some(format!("multipleOf changed from {old} to {new}")),
        _ => None,
    }
}

fn is_on(flag: Option<bool>) -> bool {
    flag == Some(true)
}

/// Keywords whose new value may reject what the old one accepted; we cannot prove otherwise.
fn check_value_validations(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    let tightened = [
        string_keyword_changed("pattern", &old.pattern, &new.pattern),
        string_keyword_changed("format", &old.format, &new.format),
        turned_on("uniqueItems", old.unique_items, new.unique_items),
        list_type_tightened(old, new),
        composition_changed("allOf", &old.all_of, &new.all_of),
        composition_changed("anyOf", &old.any_of, &new.any_of),
        composition_changed("oneOf", &old.one_of, &new.one_of),
        composition_changed("not", &old.not, &new.not),
    ];
    for change in tightened.into_iter().flatten() {
        recorder.report(path, FindingKind::ValidationTightened, format!("{change} ({EXISTING_OBJECTS})"));
    }
}

fn string_keyword_changed(keyword: &str, old: &Option<String>, new: &Option<String>) -> Option<String> {
    match (old, new) {
        (None, Some(new)) => Some(format!("{keyword} `{new}` added")),
        (Some(old), Some(new)) if old != new => Some(format!("{keyword} changed from `{old}` to `{new}`")),
        _ => None,
    }
}

/// A `set` or `map` list rejects duplicates an `atomic` one (the default) accepted.
fn list_type_tightened(old: &JSONSchemaProps, new: &JSONSchemaProps) -> Option<String> {
    let list_type = |s: &JSONSchemaProps| s.x_kubernetes_list_type.clone().unwrap_or_else(|| "atomic".to_owned());
    let (old_type, new_type) = (list_type(old), list_type(new));
    if new_type == "atomic" {
        return None;
    }
    if old_type != new_type {
        return Some(format!("x-kubernetes-list-type changed from {old_type} to {new_type}"));
    }
    (new_type == "map" && old.x_kubernetes_list_map_keys != new.x_kubernetes_list_map_keys)
        .then(|| "x-kubernetes-list-map-keys changed".to_owned())
}

fn composition_changed<T: PartialEq>(keyword: &str, old: &Option<T>, new: &Option<T>) -> Option<String> {
    (new.is_some() && old != new).then(|| format!("{keyword} added or changed"))
}

fn check_cel_rules(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    let before: BTreeSet<&str> = old.x_kubernetes_validations.iter().flatten().map(|v| v.rule.as_str()).collect();
    let added = new.x_kubernetes_validations.iter().flatten().map(|v| &v.rule).filter(|r| !before.contains(r.as_str()));
    for rule in added {
        // Text comparison only: a rewritten rule may be equivalent, but we cannot prove it.
        let message = if is_transition_rule(rule) {
            format!("new or changed transition rule `{rule}` (updates of existing objects may be rejected)")
        } else {
            format!("new or changed validation rule `{rule}` ({EXISTING_OBJECTS})")
        };
        recorder.report(path, FindingKind::ValidationTightened, message);
    }
}

/// A rule that compares with the previous value, so it runs on updates only.
fn is_transition_rule(rule: &str) -> bool {
    rule.contains("oldSelf")
}

fn check_nullable(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    if is_on(old.nullable) && !is_on(new.nullable) {
        recorder.report(
            path,
            FindingKind::ValidationTightened,
            "nullable turned off (stored nulls would be dropped or rejected)",
        );
    }
}

fn check_preserve_unknown_fields(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    if is_on(old.x_kubernetes_preserve_unknown_fields) && !is_on(new.x_kubernetes_preserve_unknown_fields) {
        recorder.report(
            path,
            FindingKind::FieldRemoved,
            "x-kubernetes-preserve-unknown-fields turned off (unknown fields of existing objects would be pruned)",
        );
    }
}

fn compare_properties(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    for (name, old_child) in old.properties.iter().flatten() {
        let child = child_path(path, name);
        match new.properties.as_ref().and_then(|p| p.get(name)) {
            Some(new_child) => compare_schemas(old_child, new_child, &child, recorder),
            // The whole subtree goes with it: one finding is enough.
            None => recorder.report(
                &child,
                FindingKind::FieldRemoved,
                "field removed (its values in existing objects would be pruned)",
            ),
        }
    }
}

fn compare_items(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    // The tuple form (`Schemas`) is not allowed in structural schemas.
    if let (Some(JSONSchemaPropsOrArray::Schema(old_items)), Some(JSONSchemaPropsOrArray::Schema(new_items))) =
        (&old.items, &new.items)
    {
        compare_schemas(old_items, new_items, &format!("{path}[]"), recorder);
    }
}

fn compare_additional_properties(old: &JSONSchemaProps, new: &JSONSchemaProps, path: &str, recorder: &mut Recorder) {
    use JSONSchemaPropsOrBool::{Bool, Schema};
    let values_path = format!("{path}{{}}");
    match (&old.additional_properties, &new.additional_properties) {
        (Some(Schema(old_values)), Some(Schema(new_values))) => {
            compare_schemas(old_values, new_values, &values_path, recorder)
        }
        // Any value accepted before: compare against the empty schema.
        (Some(Bool(true)), Some(Schema(new_values))) => {
            compare_schemas(&JSONSchemaProps::default(), new_values, &values_path, recorder)
        }
        (Some(Schema(_) | Bool(true)), None | Some(Bool(false))) => recorder.report(
            &values_path,
            FindingKind::FieldRemoved,
            "map entries no longer allowed (entries of existing objects would be pruned)",
        ),
        _ => {}
    }
}

fn child_path(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_owned() } else { format!("{parent}.{name}") }
}

#[cfg(test)]
#[path = "preflight_tests.rs"]
mod tests;
