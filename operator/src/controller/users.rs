//! A cluster's ACL users for one reconcile, read from Secrets by name: the
//! `default` user's password (the cluster password), the operator's and
//! replication's (generated once into `<cluster>-acl`) and each application
//! user's (its `passwordSecret`, which admission made sure its author may
//! read). What Redis is sent is decided in [`slotkeeper_api::acl`]; here
//! only Secrets are read and digested.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt as _};
use sha2::{Digest as _, Sha256};
use slotkeeper_api::acl::{self, AclSpec, Hashes, UserRules};

use crate::api::RedisCluster;
use crate::api::names::FIELD_MANAGER;
use crate::error::{Error, Result};
use crate::redis::client::{Login, Logins};
use crate::resources::{self, Names};

/// The keys of `<cluster>-acl`.
pub const OPERATOR_KEY: &str = "operator";
pub const REPLICATION_KEY: &str = "replication";

/// Everything about a cluster's users one reconcile needs. No `Debug`: it
/// holds passwords.
pub struct ClusterUsers {
    pub logins: Logins,
    /// Every user as the nodes should have it, `default` last.
    pub users: Vec<UserRules>,
    /// The password replicas sign in to their master with (`masterauth`).
    pub replication_password: String,
    /// A digest of all of it, keyed by the operator's own password (which
    /// nobody reading status knows), recorded in status once applied.
    pub revision: String,
    /// The application users' names.
    pub applications: Vec<String>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The users from their passwords: pure, so it is tested without a cluster.
pub fn build(acl: &AclSpec, default: &str, operator: &str, replication: &str, applications: &[String]) -> ClusterUsers {
    let hashes = Hashes {
        default: sha256_hex(default.as_bytes()),
        operator: sha256_hex(operator.as_bytes()),
        replication: sha256_hex(replication.as_bytes()),
        applications: applications.iter().map(|p| sha256_hex(p.as_bytes())).collect(),
    };
    let users = acl::users(acl, &hashes);
    let mut digest = Sha256::new();
    digest.update(operator.as_bytes());
    for user in &users {
        digest.update([0]);
        digest.update(user.name.as_bytes());
        user.rules.iter().for_each(|r| digest.update([&[1], r.as_bytes()].concat()));
    }
    digest.update([2]);
    digest.update(replication.as_bytes());
    let revision: String = digest.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    ClusterUsers {
        logins: Logins {
            own: Login { user: Some(acl::OPERATOR_USER.into()), password: operator.into() },
            fallback: Login { user: None, password: default.into() },
        },
        users,
        replication_password: replication.into(),
        revision,
        applications: acl.users.iter().map(|u| u.name.clone()).collect(),
    }
}

/// Reads (and on first use generates) every password the cluster's users need.
pub async fn read(client: &Client, cluster: &RedisCluster, namespace: &str) -> Result<ClusterUsers> {
    let default = super::apply::password(client, cluster, namespace).await?;
    let (operator, replication) = internal(client, cluster, namespace, true).await?;
    let acl = cluster.spec.acl.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut passwords = Vec::new();
    for (index, user) in acl.users.iter().enumerate() {
        let field = format!("spec.acl.users[{index}].passwordSecret");
        let (name, key) = (&user.password_secret.name, &user.password_secret.key);
        let secret = secrets.get_opt(name).await.map_err(Error::kube(format!("read Secret {namespace}/{name}")))?;
        let secret = secret.ok_or_else(|| {
            Error::InvalidSpec(format!("{field}: Secret {namespace}/{name} does not exist; create it with key {key:?}"))
        })?;
        passwords.push(value(&secret, key).ok_or_else(|| {
            Error::InvalidSpec(format!("{field}: Secret {namespace}/{name} has no non-empty key {key:?}"))
        })?);
    }
    Ok(build(&acl, &default, &operator, &replication, &passwords))
}

/// How to sign in to the cluster's nodes, for readers that never create
/// anything (the operation controller, the sampler): without `<cluster>-acl`
/// yet, both logins are the `default` user's.
pub async fn logins(client: &Client, cluster: &RedisCluster, namespace: &str) -> Result<Logins> {
    let (secret, _) = resources::password_source(cluster);
    let default = super::apply::existing_password(client, cluster, namespace)
        .await?
        .ok_or_else(|| Error::InvalidSpec(format!("Secret {namespace}/{secret} does not exist yet")))?;
    let fallback = Login { user: None, password: default };
    Ok(match internal(client, cluster, namespace, false).await {
        Ok((operator, _)) => {
            Logins { own: Login { user: Some(acl::OPERATOR_USER.into()), password: operator }, fallback }
        }
        Err(_) => Logins { own: fallback.clone(), fallback },
    })
}

/// Whether `cluster` (this very object, by uid) controls `secret`.
fn owned_by(secret: &Secret, cluster: &RedisCluster) -> bool {
    let uid = cluster.metadata.uid.as_deref();
    secret.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

fn value(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&bytes.0).into_owned()).filter(|v| !v.is_empty())
}

/// The operator's and replication's passwords from `<cluster>-acl`, made
/// once with random passwords when `create` and never rotated by the
/// operator. Deleting the Secret makes new ones, which reach the nodes only
/// through the `default` user: with it off, the operator is locked out
/// until the Secret is restored.
async fn internal(client: &Client, cluster: &RedisCluster, namespace: &str, create: bool) -> Result<(String, String)> {
    let name = Names(&cluster.name_any()).acl_secret();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read = |secret: &Secret| {
        value(secret, OPERATOR_KEY).zip(value(secret, REPLICATION_KEY)).ok_or_else(|| {
            Error::InvalidSpec(format!(
                "Secret {namespace}/{name} lacks {OPERATOR_KEY:?} or {REPLICATION_KEY:?}: delete it to have new ones made"
            ))
        })
    };
    if let Some(secret) =
        secrets.get_opt(&name).await.map_err(Error::kube(format!("read Secret {namespace}/{name}")))?
    {
        // Anyone who may create Secrets here could have made one by that
        // name: the operator's own password comes only from its own.
        if !owned_by(&secret, cluster) {
            return Err(Error::InvalidSpec(format!(
                "Secret {namespace}/{name} exists but this RedisCluster does not own it: the operator keeps its \
                 own and replication's passwords there; rename or delete that Secret"
            )));
        }
        return read(&secret);
    }
    if !create {
        return Err(Error::InvalidSpec(format!("Secret {namespace}/{name} does not exist yet")));
    }
    let (operator, replication) = (super::apply::random_password(), super::apply::random_password());
    let object: Secret =
        serde_json::from_value(resources::acl_secret(cluster, &operator, &replication)).expect("a valid Secret");
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match secrets.create(&params, &object).await {
        Ok(_) => {
            tracing::info!(namespace, secret = %name, "generated the operator's and replication's passwords");
            Ok((operator, replication))
        }
        // Made by a previous attempt: read what won.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            read(&secrets.get(&name).await.map_err(Error::kube(format!("read Secret {namespace}/{name}")))?)
        }
        Err(e) => Err(Error::kube(format!("create Secret {namespace}/{name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::acl::{AclUser, DefaultUser, SecretKeyRef};

    fn spec(off: bool) -> AclSpec {
        AclSpec {
            default_user: if off { DefaultUser::Disabled } else { DefaultUser::Enabled },
            users: vec![AclUser {
                name: "app".into(),
                password_secret: SecretKeyRef { name: "app".into(), key: "password".into() },
                rules: vec!["~*".into(), "+@read".into()],
            }],
        }
    }

    #[test]
    fn only_a_secret_this_very_cluster_controls_holds_the_operators_password() {
        let spec = serde_json::json!({"masters": 3, "redis": {"version": "7.0.15"}});
        let mut cluster = RedisCluster::new("cache", serde_json::from_value(spec).unwrap());
        cluster.metadata.uid = Some("uid-1".into());
        let secret = |uid: &str, controller: bool| {
            serde_json::from_value::<Secret>(serde_json::json!({"metadata": {"name": "cache-acl", "ownerReferences": [
                {"apiVersion": "slotkeeper.io/v1", "kind": "RedisCluster", "name": "cache", "uid": uid, "controller": controller}
            ]}}))
            .unwrap()
        };
        assert!(owned_by(&secret("uid-1", true), &cluster));
        assert!(!owned_by(&secret("uid-2", true), &cluster), "a cluster of the same name made before");
        assert!(!owned_by(&secret("uid-1", false), &cluster));
        assert!(!owned_by(&Secret::default(), &cluster), "a look-alike made by someone else");
    }

    #[test]
    fn the_revision_follows_every_user_rule_and_password_and_reveals_none() {
        let base = build(&spec(false), "d", "o", "r", &["a".into()]);
        assert_eq!(base.revision, build(&spec(false), "d", "o", "r", &["a".into()]).revision);
        for other in [
            build(&spec(true), "d", "o", "r", &["a".into()]),
            build(&spec(false), "d2", "o", "r", &["a".into()]),
            build(&spec(false), "d", "o2", "r", &["a".into()]),
            build(&spec(false), "d", "o", "r2", &["a".into()]),
            build(&spec(false), "d", "o", "r", &["a2".into()]),
        ] {
            assert_ne!(base.revision, other.revision);
        }
        assert_eq!(base.revision.len(), 16);
        assert_eq!(base.applications, ["app"]);
        assert_eq!(base.logins.own.user.as_deref(), Some(acl::OPERATOR_USER));
        assert_eq!((base.logins.fallback.user.as_deref(), base.logins.fallback.password.as_str()), (None, "d"));
        let app = base.users.iter().find(|u| u.name == "app").unwrap();
        assert!(app.rules.contains(&format!("#{}", sha256_hex(b"a"))));
    }
}
