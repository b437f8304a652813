//! Every action is a server function behind a plain form: without scripts
//! the form posts, the function makes one Kubernetes call *as the signed-in
//! user*, and the browser is redirected back to the page with a one-time
//! message saying what happened (or what Kubernetes refused, and why).
//!
//! Nothing here changes a cluster by itself: it asks the apiserver, whose
//! RBAC, admission (the CRD's rules) and audit log see the user.

use leptos::prelude::*;

/// Changes masters (through the scale subresource) and replicas per master.
/// A scale-in is shown (what moves, whether the data fits) before it is made.
#[server(prefix = "/actions", endpoint = "scale")]
pub async fn scale(
    namespace: String,
    name: String,
    masters: Option<String>,
    replicas: Option<String>,
    confirmed: Option<String>,
) -> Result<(), ServerFnError> {
    server::scale(Scale { namespace, name, masters, replicas, confirmed }).await;
    Ok(())
}

/// Creates a `RedisOperation` failing shard `target`'s master over to its replica.
#[server(prefix = "/actions", endpoint = "fail-over")]
pub async fn fail_over(namespace: String, name: String, target: String) -> Result<(), ServerFnError> {
    server::fail_over(namespace, name, target).await;
    Ok(())
}

/// Sets `spec.paused`.
#[server(prefix = "/actions", endpoint = "pause")]
pub async fn pause(namespace: String, name: String, paused: String) -> Result<(), ServerFnError> {
    server::pause(namespace, name, paused).await;
    Ok(())
}

/// Sets `spec.redis.engine` and `spec.redis.version` (a rollout along the catalog's edges).
#[server(prefix = "/actions", endpoint = "change-version")]
pub async fn change_version(namespace: String, name: String, target: String) -> Result<(), ServerFnError> {
    server::change_version(namespace, name, target).await;
    Ok(())
}

/// Approves gated step `step` of the `SlotkeeperUpgrade` `plan`: `approved`
/// (JSON) and `resource_version` are the plan's as the page showed it.
#[server(prefix = "/actions", endpoint = "approve-upgrade-step")]
pub async fn approve_upgrade_step(
    plan: String,
    step: String,
    approved: String,
    resource_version: String,
) -> Result<(), ServerFnError> {
    crate::upgrade_plans::approve(plan, step, approved, resource_version).await;
    Ok(())
}

/// Checks a bearer token with a TokenReview and starts a session.
#[server(prefix = "/actions", endpoint = "sign-in")]
pub async fn sign_in(token: String, next: Option<String>) -> Result<(), ServerFnError> {
    server::sign_in(token, next).await;
    Ok(())
}

#[server(prefix = "/actions", endpoint = "sign-out")]
pub async fn sign_out() -> Result<(), ServerFnError> {
    server::sign_out().await;
    Ok(())
}

pub(crate) mod server {
    use std::sync::Arc;

    use http::header::SET_COOKIE;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;
    use serde_json::json;
    use slotkeeper_api::{FailoverSpec, MIN_MASTERS, OperationType, RedisCluster, RedisOperation, RedisOperationSpec};
    use slotkeeper_readmodel::ClusterKey;

    use crate::Console;
    use crate::access::Check;
    use crate::pages::paths;
    use crate::session::{FLASH_COOKIE, Flash, SESSION_COOKIE, SESSION_SECONDS, Session, over_tls, set_cookie};
    use crate::session_store::StoreError;

    /// The field manager of changes made from the console (the user is in the audit log).
    pub const FIELD_MANAGER: &str = "slotkeeper-console";

    pub(crate) struct Request {
        console: Arc<Console>,
        session: Option<Session>,
        secure: bool,
    }

    pub(crate) fn request() -> Request {
        let console = expect_context::<Arc<Console>>();
        let session = use_context::<Session>();
        let secure = use_context::<http::request::Parts>().is_some_and(|p| over_tls(&p.headers));
        Request { console, session, secure }
    }

    /// Ends the post: a one-time message, then back to `to`.
    pub(crate) fn finish(request: &Request, to: &str, flash: Option<Flash>) {
        if let (Some(flash), Some(key)) = (flash, request.console.keys.get()) {
            let sealed = key.seal(&flash);
            expect_context::<ResponseOptions>()
                .append_header(SET_COOKIE, set_cookie(FLASH_COOKIE, &sealed, 60, request.secure));
        }
        // A target that is no valid header value would make the redirect panic.
        let to = if http::HeaderValue::from_str(to).is_ok() { to } else { paths::CLUSTERS };
        leptos_axum::redirect(to);
    }

    pub(crate) fn ok(text: impl Into<String>) -> Option<Flash> {
        Some(Flash { ok: true, text: text.into() })
    }

    pub(crate) fn refused(text: impl Into<String>) -> Option<Flash> {
        Some(Flash { ok: false, text: text.into() })
    }

    /// The signed-in user, or a redirect to sign in.
    pub(crate) fn signed_in(request: &Request) -> Option<Session> {
        match &request.session {
            Some(session) => Some(session.clone()),
            None => {
                finish(request, paths::SIGN_IN, refused("Sign in first; nothing was changed."));
                None
            }
        }
    }

    /// A client acting as the user, or the refusal shown on `page`.
    pub(crate) fn client_as(request: &Request, session: &Session, page: &str) -> Option<kube::Client> {
        match request.console.users.client(session) {
            Ok(client) => Some(client),
            Err(e) => {
                finish(request, page, refused(format!("Cannot act as {}: {e}; nothing was changed.", session.user)));
                None
            }
        }
    }

    /// What Kubernetes said, in a sentence that says nothing was changed when nothing was.
    pub fn explain(error: &kube::Error, what: &str) -> String {
        match error {
            kube::Error::Api(e) if e.code == 403 => {
                format!("Kubernetes refused to {what} (403 Forbidden): {}. Nothing was changed.", e.message)
            }
            kube::Error::Api(e) if e.code == 422 || e.code == 400 => {
                format!("Kubernetes rejected the request to {what}: {}. Nothing was changed.", e.message)
            }
            kube::Error::Api(e) if e.code == 404 => format!("Cannot {what}: {}.", e.message),
            kube::Error::Api(e) if e.code == 401 => {
                "Your token is no longer accepted by Kubernetes; sign in again. Nothing was changed.".into()
            }
            kube::Error::Api(e) => {
                format!("Kubernetes answered {} to {what}: {}. Nothing was changed.", e.code, e.message)
            }
            other => format!("Could not reach Kubernetes to {what}: {other}. Nothing was changed."),
        }
    }

    fn number(field: &str, text: Option<&str>) -> Result<Option<i32>, String> {
        match text.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(t) => t.parse().map(Some).map_err(|_| format!("{field} must be a whole number, not {t:?}")),
        }
    }

    pub async fn scale(form: super::Scale) {
        let super::Scale { namespace, name, masters, replicas, confirmed } = form;
        let request = request();
        let Some(session) = signed_in(&request) else { return };
        let key = ClusterKey::new(&namespace, &name);
        let page = paths::cluster(&key);
        let (masters, replicas) = match (number("masters", masters.as_deref()), number("replicas", replicas.as_deref()))
        {
            (Ok(m), Ok(r)) => (m, r),
            (Err(e), _) | (_, Err(e)) => return finish(&request, &page, refused(format!("{e}; nothing was changed."))),
        };
        // What the read model knows is used only for a user who may see it;
        // anyone else's request goes to Kubernetes as asked, and its answer is shown.
        let console = &request.console;
        let may_see =
            console.access.check(&console.users, &session, Check::cluster("get", &key)).await.is_ok_and(|p| p.allowed);
        let current =
            console.readmodel.cluster(&key).filter(|_| may_see).map(|c| (c.spec.masters, c.spec.replicas_per_master));
        let (masters, replicas) = match current {
            Some((current_masters, current_replicas)) => {
                let masters = masters.filter(|m| *m != current_masters);
                let replicas = replicas.filter(|r| *r != current_replicas);
                if masters.is_none() && replicas.is_none() {
                    let text = format!(
                        "Nothing to change: {key} already has {current_masters} masters and {current_replicas} replicas per master."
                    );
                    return finish(&request, &page, ok(text));
                }
                if let Some(m) = masters
                    && m < current_masters
                    && m >= MIN_MASTERS
                    && confirmed.as_deref() != Some("yes")
                {
                    // Show what a scale-in moves, and whether the data fits, before it is made
                    // (one below the minimum goes straight to Kubernetes, which says why not).
                    let preview = paths::scale_preview(&key, m, replicas.unwrap_or(current_replicas));
                    return finish(&request, &preview, None);
                }
                (masters, replicas)
            }
            None if masters.is_none() && replicas.is_none() => {
                return finish(&request, &page, refused("Give masters or replicas per master; nothing was changed."));
            }
            None => (masters, replicas),
        };
        let Some(client) = client_as(&request, &session, &page) else { return };
        let api: Api<RedisCluster> = Api::namespaced(client, &namespace);
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let mut done = Vec::new();
        if let Some(m) = masters {
            let what = format!("scale {key} to {m} masters");
            match api.patch_scale(&name, &params, &Patch::Merge(json!({ "spec": { "replicas": m } }))).await {
                Ok(_) => done.push(match current {
                    Some((before, _)) => format!("{before} → {m} masters"),
                    None => format!("{m} masters"),
                }),
                Err(e) => return finish(&request, &page, refused(explain(&e, &what))),
            }
        }
        if let Some(r) = replicas {
            let what = format!("set {key} to {r} replicas per master");
            match api.patch(&name, &params, &Patch::Merge(json!({ "spec": { "replicasPerMaster": r } }))).await {
                Ok(_) => done.push(match current {
                    Some((_, before)) => format!("{before} → {r} replicas per master"),
                    None => format!("{r} replicas per master"),
                }),
                Err(e) => {
                    let before = if done.is_empty() { String::new() } else { format!("Done: {}. ", done.join(", ")) };
                    return finish(&request, &page, refused(format!("{before}{}", explain(&e, &what))));
                }
            }
        }
        tracing::info!(user = %session.user, cluster = %name, namespace = %namespace, change = %done.join(", "), "console: scale");
        finish(
            &request,
            &page,
            ok(format!("Asked Kubernetes as {} to scale {key}: {}. Follow it below.", session.user, done.join(", "))),
        );
    }

    pub async fn fail_over(namespace: String, name: String, target: String) {
        let request = request();
        let Some(session) = signed_in(&request) else { return };
        let key = ClusterKey::new(&namespace, &name);
        let page = paths::cluster(&key);
        let Some((shard, pod)) = target.split_once(':').and_then(|(s, p)| Some((s.parse::<i32>().ok()?, p.to_owned())))
        else {
            return finish(
                &request,
                &page,
                refused(format!("target {target:?} is not `shard:pod`; choose a replica from the list.")),
            );
        };
        let Some(client) = client_as(&request, &session, &page) else { return };
        let mut operation = RedisOperation::new(
            "",
            RedisOperationSpec {
                cluster_name: name.clone(),
                type_: OperationType::Failover,
                failover: Some(FailoverSpec { shard, target_pod: Some(pod.clone()) }),
            },
        );
        operation.metadata.name = None;
        operation.metadata.generate_name = Some(format!("{name}-failover-{shard}-"));
        let api: Api<RedisOperation> = Api::namespaced(client, &namespace);
        let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let what = format!("create a RedisOperation failing shard {shard} of {key} over to {pod}");
        match api.create(&params, &operation).await {
            Ok(created) => {
                let created = created.metadata.name.unwrap_or_default();
                tracing::info!(user = %session.user, cluster = %name, namespace = %namespace, operation = %created, "console: failover");
                let text = format!(
                    "Created RedisOperation {created} as {}: shard {shard} fails over to {pod}. Follow it below.",
                    session.user
                );
                finish(&request, &page, ok(text));
            }
            Err(e) => finish(&request, &page, refused(explain(&e, &what))),
        }
    }

    pub async fn change_version(namespace: String, name: String, target: String) {
        let request = request();
        let Some(session) = signed_in(&request) else { return };
        let key = ClusterKey::new(&namespace, &name);
        let page = paths::cluster(&key);
        let Some(entry) = crate::pages::version::entry_of(&target) else {
            return finish(&request, &page, refused(format!("{target:?} is not in the catalog; nothing was changed.")));
        };
        let Some(client) = client_as(&request, &session, &page) else { return };
        let api: Api<RedisCluster> = Api::namespaced(client, &namespace);
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let patch = json!({ "spec": { "redis": { "engine": entry.engine, "version": entry.version } } });
        match api.patch(&name, &params, &Patch::Merge(patch)).await {
            Ok(_) => {
                tracing::info!(user = %session.user, cluster = %name, namespace = %namespace, target = %entry.release(), "console: change version");
                let text = format!(
                    "Asked Kubernetes as {} to roll {key} out to {}. Follow it below.",
                    session.user,
                    entry.release()
                );
                finish(&request, &page, ok(text));
            }
            Err(e) => finish(&request, &page, refused(explain(&e, &format!("roll {key} out to {}", entry.release())))),
        }
    }

    pub async fn pause(namespace: String, name: String, paused: String) {
        let request = request();
        let Some(session) = signed_in(&request) else { return };
        let key = ClusterKey::new(&namespace, &name);
        let page = paths::cluster(&key);
        let paused = match paused.as_str() {
            "true" => true,
            "false" => false,
            other => return finish(&request, &page, refused(format!("paused must be true or false, not {other:?}."))),
        };
        let Some(client) = client_as(&request, &session, &page) else { return };
        let api: Api<RedisCluster> = Api::namespaced(client, &namespace);
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let verb = if paused { "pause" } else { "resume" };
        match api.patch(&name, &params, &Patch::Merge(json!({ "spec": { "paused": paused } }))).await {
            Ok(_) => {
                tracing::info!(user = %session.user, cluster = %name, namespace = %namespace, paused, "console: pause");
                let text = if paused {
                    format!("Paused {key} as {}: the operator takes no action on it until it is resumed.", session.user)
                } else {
                    format!("Resumed {key} as {}.", session.user)
                };
                finish(&request, &page, ok(text));
            }
            Err(e) => finish(&request, &page, refused(explain(&e, &format!("{verb} {key}")))),
        }
    }

    /// Where to go after signing in: a path of ours, never another site.
    /// Only visible ASCII is kept as it is: browsers drop tabs and newlines
    /// from a Location (so `/\t/evil` is read as `//evil`), and a control
    /// byte cannot be sent in a header at all.
    pub fn safe_next(next: Option<&str>) -> String {
        let visible = |path: &str| path.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
        match next {
            Some(path) if path.starts_with('/') && !path.starts_with("//") && visible(path) => path.to_owned(),
            _ => paths::CLUSTERS.to_owned(),
        }
    }

    pub async fn sign_in(token: String, next: Option<String>) {
        let request = request();
        let back = match &next {
            Some(next) => format!("{}?next={}", paths::SIGN_IN, paths::encode(next)),
            None => paths::SIGN_IN.to_owned(),
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            return finish(&request, &back, refused("Paste a bearer token to sign in."));
        }
        if request.console.keys.get().is_none() {
            return finish(&request, &back, refused("The console is still starting; try again in a moment."));
        }
        // Each attempt is a TokenReview made with the operator's rights.
        let client = use_context::<http::request::Parts>().and_then(|p| {
            p.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|info| info.0.ip())
        });
        if let Err(wait) = request.console.sign_ins.attempt(client, std::time::Instant::now()) {
            tracing::warn!(client = ?client, "console: sign-in attempts limited");
            let seconds = wait.as_secs().max(1);
            return finish(&request, &back, refused(format!("Too many sign-in attempts; try again in {seconds} s.")));
        }
        let review =
            TokenReview { spec: TokenReviewSpec { token: token.clone(), audiences: None }, ..Default::default() };
        let api: Api<TokenReview> = Api::all(request.console.client.clone());
        let status = match api.create(&PostParams::default(), &review).await {
            Ok(review) => review.status.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "console: TokenReview failed");
                return finish(&request, &back, refused(format!("Cannot check the token with Kubernetes: {e}")));
            }
        };
        let user = status.user.unwrap_or_default();
        let Some(username) = user.username.filter(|_| status.authenticated == Some(true)) else {
            let why = status.error.filter(|e| !e.is_empty()).map(|e| format!(" ({e})")).unwrap_or_default();
            tracing::info!("console: sign-in refused");
            return finish(
                &request,
                &back,
                refused(format!("Kubernetes did not accept this token{why}. Check it and try again.")),
            );
        };
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let session = Session::new(username.clone(), user.groups.unwrap_or_default(), token, now);
        let sealed = match request.console.sessions.begin(&session, now).await {
            Ok(sealed) => sealed,
            Err(StoreError::Expired) => {
                return finish(&request, &back, refused("This token has expired; make a new one and sign in."));
            }
            Err(error) => {
                tracing::warn!(user = %username, %error, "console: cannot begin a session");
                let text = "The console cannot record your session now; try again in a moment.";
                return finish(&request, &back, refused(text));
            }
        };
        let max_age = (session.expires - now).clamp(0, SESSION_SECONDS);
        let cookie = set_cookie(SESSION_COOKIE, &sealed, max_age, request.secure);
        expect_context::<ResponseOptions>().append_header(SET_COOKIE, cookie);
        tracing::info!(user = %username, "console: signed in");
        finish(&request, &safe_next(next.as_deref()), ok(format!("Signed in as {username}.")));
    }

    /// Ends the session on every replica (its key is deleted), then the cookie.
    pub async fn sign_out() {
        let request = request();
        // Only a session that opened is ended: a cookie alone ends nothing.
        if let Some(session) = &request.session
            && let Err(error) = request.console.sessions.end(session).await
        {
            tracing::warn!(user = %session.user, %error, "console: cannot end a session");
            let text = "Not signed out: the console cannot end your session now; try again in a moment.";
            return finish(&request, paths::CLUSTERS, refused(text));
        }
        let options = expect_context::<ResponseOptions>();
        options.append_header(SET_COOKIE, set_cookie(SESSION_COOKIE, "", 0, request.secure));
        if let Some(session) = &request.session {
            tracing::info!(user = %session.user, "console: signed out");
        }
        finish(&request, paths::SIGN_IN, ok("Signed out."));
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn sign_in_returns_only_to_our_own_paths() {
            assert_eq!(safe_next(Some("/clusters/apps/cache")), "/clusters/apps/cache");
            assert_eq!(safe_next(Some("//evil.example/x")), "/");
            assert_eq!(safe_next(Some("https://evil.example")), "/");
            assert_eq!(safe_next(Some("/\\evil")), "/");
            assert_eq!(safe_next(None), "/");
            // Security review finding 8: read as //example.org/ by URL parsing, and a header-breaking byte.
            assert_eq!(safe_next(Some("/\t/example.org/")), "/");
            assert_eq!(safe_next(Some("/\n/example.org/")), "/");
            assert_eq!(safe_next(Some("/\n")), "/");
            assert_eq!(safe_next(Some("/ /x")), "/");
            assert_eq!(safe_next(Some("/clusters?x=é")), "/");
            proptest::proptest!(|(next in proptest::prelude::any::<String>())| {
                let to = safe_next(Some(&next));
                proptest::prop_assert!(http::HeaderValue::from_str(&to).is_ok());
                proptest::prop_assert!(to.starts_with('/') && !to.starts_with("//") && !to.starts_with("/\\"));
            });
        }

        #[test]
        fn refusals_say_what_kubernetes_said_and_that_nothing_changed() {
            let forbidden = kube::Error::Api(Box::new(kube::core::Status {
                message: "User \"bob\" cannot patch resource \"redisclusters/scale\"".into(),
                reason: "Forbidden".into(),
                code: 403,
                ..Default::default()
            }));
            let text = explain(&forbidden, "scale apps/cache to 4 masters");
            assert!(
                text.contains("403 Forbidden") && text.contains("bob") && text.contains("Nothing was changed"),
                "{text}"
            );
        }

        #[test]
        fn numbers_name_their_field() {
            assert_eq!(number("masters", Some(" 4 ")), Ok(Some(4)));
            assert_eq!(number("masters", Some("")), Ok(None));
            assert!(number("replicas", Some("two")).unwrap_err().contains("replicas"));
        }
    }
}
