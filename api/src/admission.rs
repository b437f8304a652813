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
//!
//! A second policy fences the operator's own writes (see [`fence`]): its
//! RBAC covers every namespace, the policy narrows what it may do there.

use serde_json::{Value, json};

use crate::catalog::CATALOG;
use crate::names::{
    LABEL_CLUSTER, OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, SUBRESOURCE_CUSTOM_IMAGE, SUBRESOURCE_PRIORITY_CLASS,
    SYSTEM_NAMESPACES,
};

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
            // Each application user's password Secret: one the author may
            // read, unless an earlier version of the object named it already.
            "expression": format!(
                "!has(object.spec.acl) || !has(object.spec.acl.users) || object.spec.acl.users.all(u, {known} || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name(u.passwordSecret.name).check('get').allowed())",
                known = "(oldObject != null && has(oldObject.spec.acl) && has(oldObject.spec.acl.users) && oldObject.spec.acl.users.exists(o, o.passwordSecret.name == u.passwordSecret.name))"
            ),
            "messageExpression": "'spec.acl.users[].passwordSecret: ' + request.userInfo.username + ' may not get a Secret named there (in ' + object.metadata.namespace + '), and a RedisCluster may only use Secrets its author can read: name Secrets you can read'",
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

/// The fence's policy and binding name.
pub const FENCE_POLICY_NAME: &str = "slotkeeper-operator-writes";

/// The operator's user name as the apiserver sees it.
pub fn operator_user() -> String {
    format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}")
}

/// Kinds the operator writes in the namespaces of the clusters it manages.
const FENCED: [(&str, &str); 9] = [
    ("", "configmaps"),
    ("", "services"),
    ("", "secrets"),
    ("", "pods"),
    ("", "persistentvolumeclaims"),
    ("apps", "statefulsets"),
    ("policy", "poddisruptionbudgets"),
    ("networking.k8s.io", "networkpolicies"),
    ("events.k8s.io", "events"),
];

/// What a Pod template must not ask for, as CEL over `spec` (a PodSpec).
fn confined(spec: &str) -> String {
    let unprivileged = |list: &str| {
        format!(
            "(!has({spec}.{list}) || {spec}.{list}.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged))"
        )
    };
    let host = ["hostNetwork", "hostPID", "hostIPC"].map(|f| format!("!(has({spec}.{f}) && {spec}.{f})")).join(" && ");
    format!(
        "(!has({spec}.volumes) || {spec}.volumes.all(v, !has(v.hostPath))) && {} && {} && {host}",
        unprivileged("containers"),
        unprivileged("initContainers")
    )
}

/// The operator's writes, fenced: its RBAC lets it write these kinds in any
/// namespace (it manages clusters everywhere), so this policy, bound to its
/// ServiceAccount alone, admits only what it does for a RedisCluster:
/// nothing in the control plane's namespaces; only objects that carry the
/// cluster label before and after the write (it cannot adopt or change
/// anyone else's ConfigMap, Secret or Service); no privileged, host-network
/// or hostPath Pod template. Its own namespace holds its Lease, keys and
/// webhook certificate, written by name under a Role.
fn fence() -> Vec<Value> {
    let system = SYSTEM_NAMESPACES.map(|n| format!("'{n}'")).join(", ");
    let labelled = |o: &str| format!("(has({o}.metadata.labels) && '{LABEL_CLUSTER}' in {o}.metadata.labels)");
    let owned = format!(
        "request.namespace == '{OPERATOR_NAMESPACE}' || request.resource.resource == 'events' || ((object == null || {}) && (oldObject == null || {}))",
        labelled("object"),
        labelled("oldObject")
    );
    let template = format!(
        "request.resource.resource != 'statefulsets' || object == null || {}",
        confined("object.spec.template.spec")
    );
    let rules: Vec<Value> = FENCED
        .iter()
        .map(|(group, resource)| {
            json!({
                "apiGroups": [group], "apiVersions": ["*"], "resources": [resource],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            })
        })
        .collect();
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": FENCE_POLICY_NAME, "labels": { crate::names::LABEL_NAME: "slotkeeper" } },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": rules },
            "matchConditions": [{ "name": "the-operator", "expression": format!("request.userInfo.username == '{}'", operator_user()) }],
            "validations": [
                {
                    "expression": format!("!(request.namespace in [{system}])"),
                    "messageExpression": "'the Slotkeeper operator never writes in ' + request.namespace",
                    "reason": "Forbidden",
                },
                {
                    "expression": owned,
                    "messageExpression": format!("'the Slotkeeper operator writes only objects labelled {LABEL_CLUSTER} (its own): refused ' + request.operation + ' of ' + request.resource.resource + ' ' + request.namespace + '/' + request.name"),
                    "reason": "Forbidden",
                },
                {
                    "expression": template,
                    "messageExpression": "'the Slotkeeper operator makes no privileged, host-namespace or hostPath Pod: refused StatefulSet ' + request.namespace + '/' + request.name",
                    "reason": "Forbidden",
                },
            ],
        },
    });
    vec![policy, binding(FENCE_POLICY_NAME)]
}

fn binding(policy: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": policy, "labels": { crate::names::LABEL_NAME: "slotkeeper" } },
        "spec": { "policyName": policy, "validationActions": ["Deny"] },
    })
}

/// Both policies and their bindings (every namespace, requests denied).
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
    let mut objects = vec![policy, binding(POLICY_NAME)];
    objects.extend(fence());
    objects
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
