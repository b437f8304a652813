//! What the signed-in user may do, asked of the apiserver as that user
//! (SelfSubjectAccessReview) and kept for 30 s. The read model
//! holds everything the operator sees; a page shows only what the user may
//! `get`, and a button the user may not use is disabled with the reason.
//! The apiserver still decides every write: this only avoids offering what
//! it would refuse.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::Resource as _;
use kube::api::{Api, PostParams};
use slotkeeper_api::self_upgrade::SlotkeeperUpgrade;
use slotkeeper_api::{RedisCluster, RedisOperation};
use slotkeeper_readmodel::ClusterKey;

use crate::session::Session;
use crate::users::UserClients;

const KEEP: Duration = Duration::from_secs(30);
const MOST: usize = 20_000;

/// One question: may the user do `verb` on `resource` (in `namespace`, on `name`)?
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Check {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    pub subresource: Option<&'static str>,
    /// `None`: in every namespace (or no namespace, for a cluster-scoped kind).
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The kind has no namespace, so the check has no scope to name.
    pub cluster_scoped: bool,
}

impl Check {
    pub fn clusters(verb: &'static str, namespace: Option<&str>) -> Self {
        Self {
            verb,
            group: RedisCluster::group(&()).into_owned(),
            resource: RedisCluster::plural(&()).into_owned(),
            subresource: None,
            namespace: namespace.map(str::to_owned),
            name: None,
            cluster_scoped: false,
        }
    }

    pub fn cluster(verb: &'static str, key: &ClusterKey) -> Self {
        Self { name: Some(key.name.clone()), ..Self::clusters(verb, Some(&key.namespace)) }
    }

    pub fn scale(key: &ClusterKey) -> Self {
        Self { subresource: Some("scale"), ..Self::cluster("patch", key) }
    }

    pub fn operations(verb: &'static str, namespace: &str) -> Self {
        Self {
            verb,
            group: RedisOperation::group(&()).into_owned(),
            resource: RedisOperation::plural(&()).into_owned(),
            subresource: None,
            namespace: Some(namespace.into()),
            name: None,
            cluster_scoped: false,
        }
    }

    pub fn events(namespace: &str) -> Self {
        Self {
            verb: "list",
            group: String::new(),
            resource: "events".into(),
            subresource: None,
            namespace: Some(namespace.into()),
            name: None,
            cluster_scoped: false,
        }
    }

    /// Slotkeeper's own upgrade plans, which live outside any namespace.
    pub fn upgrades(verb: &'static str) -> Self {
        Self {
            verb,
            group: SlotkeeperUpgrade::group(&()).into_owned(),
            resource: SlotkeeperUpgrade::plural(&()).into_owned(),
            subresource: None,
            namespace: None,
            name: None,
            cluster_scoped: true,
        }
    }

    /// `patch redisclusters/scale "cache" in namespace apps`.
    pub fn describe(&self) -> String {
        let resource = match self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        };
        let name = self.name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default();
        let scope = match &self.namespace {
            _ if self.cluster_scoped => "(cluster-scoped)".into(),
            Some(ns) => format!("in namespace {ns}"),
            None => "in all namespaces".into(),
        };
        format!("{} {resource}{name} {scope}", self.verb)
    }
}

/// A verdict, with the sentence a disabled button shows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Permission {
    pub allowed: bool,
    pub why_not: String,
}

impl Permission {
    pub fn allowed() -> Self {
        Self { allowed: true, why_not: String::new() }
    }

    pub fn denied(why_not: impl Into<String>) -> Self {
        Self { allowed: false, why_not: why_not.into() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The apiserver no longer accepts the user's token.
    #[error("your token is no longer accepted; sign in again")]
    SignedOut,
    #[error("cannot ask the apiserver what you may do: {0}")]
    Kube(#[from] kube::Error),
}

#[derive(Default)]
pub struct Access {
    verdicts: Mutex<HashMap<(u64, Check), (Permission, Instant)>>,
}

impl Access {
    pub async fn check(&self, users: &UserClients, session: &Session, check: Check) -> Result<Permission, AccessError> {
        let key = (session.token_id(), check);
        if let Some((verdict, at)) = self.verdicts.lock().expect("access lock").get(&key)
            && at.elapsed() < KEEP
        {
            return Ok(verdict.clone());
        }
        let verdict = ask(users, session, &key.1).await?;
        let mut verdicts = self.verdicts.lock().expect("access lock");
        if verdicts.len() >= MOST {
            verdicts.retain(|_, (_, at)| at.elapsed() < KEEP);
        }
        verdicts.insert(key, (verdict.clone(), Instant::now()));
        Ok(verdict)
    }

    /// Several checks at once, in order.
    pub async fn check_all(
        &self,
        users: &UserClients,
        session: &Session,
        checks: Vec<Check>,
    ) -> Result<Vec<Permission>, AccessError> {
        futures::future::try_join_all(checks.into_iter().map(|c| self.check(users, session, c))).await
    }

    /// The namespaces (of `present`) where the user may list RedisClusters.
    pub async fn cluster_namespaces(
        &self,
        users: &UserClients,
        session: &Session,
        present: &BTreeSet<String>,
    ) -> Result<BTreeSet<String>, AccessError> {
        if self.check(users, session, Check::clusters("list", None)).await?.allowed {
            return Ok(present.clone());
        }
        let checks = present.iter().map(|ns| Check::clusters("list", Some(ns))).collect();
        let verdicts = self.check_all(users, session, checks).await?;
        Ok(present.iter().zip(verdicts).filter(|(_, v)| v.allowed).map(|(ns, _)| ns.clone()).collect())
    }
}

async fn ask(users: &UserClients, session: &Session, check: &Check) -> Result<Permission, AccessError> {
    let client = users.client(session)?;
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(check.verb.into()),
                group: Some(check.group.clone()),
                resource: Some(check.resource.clone()),
                subresource: check.subresource.map(str::to_owned),
                namespace: check.namespace.clone(),
                name: check.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    let answer = match api.create(&PostParams::default(), &review).await {
        Ok(answer) => answer,
        Err(kube::Error::Api(e)) if e.code == 401 => return Err(AccessError::SignedOut),
        Err(e) => return Err(e.into()),
    };
    let status = answer.status.unwrap_or_default();
    if status.allowed && !status.denied.unwrap_or(false) {
        return Ok(Permission::allowed());
    }
    let mut why = format!("{} may not {}", session.user, check.describe());
    if let Some(reason) = status.reason.filter(|r| !r.is_empty()) {
        why += &format!(" ({reason})");
    }
    Ok(Permission::denied(why))
}

/// What a user may do with one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterAccess {
    pub view: Permission,
    pub events: Permission,
    pub operations: Permission,
    pub scale: Permission,
    pub patch: Permission,
    pub fail_over: Permission,
}

impl ClusterAccess {
    pub async fn of(
        access: &Access,
        users: &UserClients,
        session: &Session,
        key: &ClusterKey,
    ) -> Result<Self, AccessError> {
        let checks = vec![
            Check::cluster("get", key),
            Check::events(&key.namespace),
            Check::operations("list", &key.namespace),
            Check::scale(key),
            Check::cluster("patch", key),
            Check::operations("create", &key.namespace),
        ];
        let mut verdicts = access.check_all(users, session, checks).await?.into_iter();
        let mut next = || verdicts.next().expect("one verdict per check");
        Ok(Self { view: next(), events: next(), operations: next(), scale: next(), patch: next(), fail_over: next() })
    }
}

/// Namespaces of the clusters the read model holds, with a count each.
pub fn namespaces_of(clusters: &[std::sync::Arc<RedisCluster>]) -> BTreeMap<String, usize> {
    let mut namespaces = BTreeMap::new();
    for cluster in clusters {
        *namespaces.entry(cluster.metadata.namespace.clone().unwrap_or_default()).or_default() += 1;
    }
    namespaces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_describe_themselves_as_rbac_reads_them() {
        let key = ClusterKey::new("apps", "cache");
        assert_eq!(Check::scale(&key).describe(), "patch redisclusters/scale \"cache\" in namespace apps");
        assert_eq!(Check::clusters("list", None).describe(), "list redisclusters in all namespaces");
        assert_eq!(Check::events("apps").describe(), "list events in namespace apps");
        assert_eq!(Check::operations("create", "apps").group, "slotkeeper.io");
        assert_eq!(Check::upgrades("patch").describe(), "patch slotkeeperupgrades (cluster-scoped)");
    }
}
