//! The ValidatingAdmissionPolicy that keeps a `RedisCluster`'s author from
//! reaching, through the operator, what they could not reach themselves
//! (`deploy/admission.yaml`, generated from here and checked for drift).
//!
//! The apiserver evaluates it for the requesting user, with CEL's
//! `authorizer` asking RBAC about that user's own rights:
//! - `spec.auth.secretName`: the author may `get` that Secret, else the
//!   operator would read it with its own rights and hand its value to Pods
//!   the author controls;
//! - `spec.redis.image` outside the catalog: the author may `use`
//!   `redisclusters/customimage` (the program chosen receives the password);
//! - `spec.scheduling.priorityClassName`: the author may `use`
//!   `redisclusters/priorityclass` (priority evicts other tenants' Pods).
//!
//! An update that leaves a field as it was is not asked again, so clusters
//! created before the policy (or by someone else) keep working when an
//! operator-role user scales them.

use serde_json::{Value, json};

use crate::catalog::CATALOG;
use crate::names::{SUBRESOURCE_CUSTOM_IMAGE, SUBRESOURCE_PRIORITY_CLASS};

/// The policy's and its binding's name.
pub const POLICY_NAME: &str = "slotkeeper-rediscluster-author-rights";
/// Where the generated policy lives in the repository.
pub const ADMISSION_PATH: &str = "deploy/admission.yaml";

/// `true` when `field` (a path under `object`) is absent or unchanged by this update.
fn unchanged(field: &str) -> String {
    let parent = field.rsplit_once('.').expect("a nested field").0;
    format!(
        "!has(object.{parent}) || !has(object.{field}) || (oldObject != null && has(oldObject.{parent}) && has(oldObject.{field}) && oldObject.{field} == object.{field})",
    )
}

/// The RBAC check, for the requesting user, of `verb` on `redisclusters/<subresource>` in the object's namespace.
fn may_use(subresource: &str) -> String {
    format!(
        "authorizer.group('{group}').resource('redisclusters').subresource('{subresource}').namespace(object.metadata.namespace).check('use').allowed()",
        group = crate::GROUP
    )
}

fn validations() -> Vec<Value> {
    let images = CATALOG.iter().map(|e| format!("'{}'", e.image)).collect::<Vec<_>>().join(", ");
    let secret = "object.spec.auth.secretName";
    vec![
        json!({
            "expression": format!(
                "{} || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name({secret}).check('get').allowed()",
                unchanged("spec.auth.secretName")
            ),
            "messageExpression": format!(
                "'spec.auth.secretName: ' + request.userInfo.username + ' may not get Secret ' + object.metadata.namespace + '/' + {secret} + ', and a RedisCluster may only use a Secret its author can read: name a Secret you can read, or leave spec.auth out to have a password generated'"
            ),
            "reason": "Forbidden",
        }),
        json!({
            "expression": format!(
                "{} || object.spec.redis.image in [{images}] || {}",
                unchanged("spec.redis.image"),
                may_use(SUBRESOURCE_CUSTOM_IMAGE)
            ),
            "messageExpression": format!(
                "'spec.redis.image: ' + object.spec.redis.image + ' is not an image of the version catalog, and ' + request.userInfo.username + ' may not use redisclusters/{SUBRESOURCE_CUSTOM_IMAGE} in ' + object.metadata.namespace + ': remove spec.redis.image to run the catalog image, or ask for the slotkeeper-redis-custom-image role'"
            ),
            "reason": "Forbidden",
        }),
        json!({
            "expression": format!(
                "{} || {}",
                unchanged("spec.scheduling.priorityClassName"),
                may_use(SUBRESOURCE_PRIORITY_CLASS)
            ),
            "messageExpression": format!(
                "'spec.scheduling.priorityClassName: ' + request.userInfo.username + ' may not use redisclusters/{SUBRESOURCE_PRIORITY_CLASS} in ' + object.metadata.namespace + ': remove the priority class, or ask for the slotkeeper-redis-priority role'"
            ),
            "reason": "Forbidden",
        }),
    ]
}

/// The policy and its binding (every namespace, requests denied).
pub fn objects() -> Vec<Value> {
    let labels = json!({ crate::names::LABEL_NAME: "slotkeeper" });
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": POLICY_NAME, "labels": labels },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                // Equivalent: a v1alpha1 request is converted to v1 first, so one set of paths serves both.
                "matchPolicy": "Equivalent",
                "resourceRules": [{
                    "apiGroups": [crate::GROUP],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["redisclusters"],
                }],
            },
            "validations": validations(),
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": POLICY_NAME, "labels": labels },
        "spec": { "policyName": POLICY_NAME, "validationActions": ["Deny"] },
    });
    vec![policy, binding]
}

/// The policy and binding as the YAML committed in `deploy/admission.yaml`.
pub fn admission_yaml() -> String {
    let header = "# Generated from the Rust code (api/src/admission.rs) by `slotkeeper admission`; do not edit.\n";
    let documents: Vec<String> = objects().iter().map(crate::to_yaml).collect();
    format!("{header}{}", documents.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_policy_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(ADMISSION_PATH);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == admission_yaml(),
            "{ADMISSION_PATH} is out of date: run `cargo run -- admission > {ADMISSION_PATH}`"
        );
    }

    #[test]
    fn every_catalog_image_is_allowed_without_the_custom_image_right() {
        let text = serde_json::to_string(&objects()).unwrap();
        for entry in CATALOG {
            assert!(text.contains(&format!("'{}'", entry.image)), "{}", entry.image);
        }
    }

    #[test]
    fn an_unchanged_field_is_not_asked_again() {
        assert_eq!(
            unchanged("spec.auth.secretName"),
            "!has(object.spec.auth) || !has(object.spec.auth.secretName) || (oldObject != null && has(oldObject.spec.auth) && has(oldObject.spec.auth.secretName) && oldObject.spec.auth.secretName == object.spec.auth.secretName)"
        );
    }
}
