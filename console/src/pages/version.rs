//! Versions: the release every node runs, a rollout in progress shard by
//! shard (which node runs which version, the step, the canary's bake, the
//! point of no return, the last rollback), and a version change that shows
//! its planned steps before it is confirmed.

use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_api::catalog::{self, CatalogEntry};
use slotkeeper_api::rollout::{DEFAULT_BAKE_SECONDS, RolloutPhase, UpgradeStatus};
use slotkeeper_api::{NodeStatus, RedisCluster};
use slotkeeper_readmodel::ClusterKey;

use super::paths;
use crate::access::Permission;
use crate::actions::ChangeVersion;
use crate::view::format;

/// The catalog entry a form value such as `valkey-8.1.8` names.
pub fn entry_of(value: &str) -> Option<&'static CatalogEntry> {
    let (engine, version) = value.split_once('-')?;
    catalog::lookup(engine.parse().ok()?, version)
}

pub fn value_of(entry: &CatalogEntry) -> String {
    format!("{}-{}", entry.engine, entry.version)
}

/// What the nodes run (status), else what spec asks (a cluster being created).
pub fn current(cluster: &RedisCluster) -> Option<&'static CatalogEntry> {
    let status = cluster.status.as_ref();
    let version = status.and_then(|s| s.current_version.clone()).unwrap_or_else(|| cluster.spec.redis.version.clone());
    let engine = status.and_then(|s| s.current_engine).unwrap_or(cluster.spec.redis.engine);
    catalog::lookup(engine, &version)
}

/// Releases a version change may go to from what the nodes run.
pub fn choices(cluster: &RedisCluster) -> Vec<&'static CatalogEntry> {
    current(cluster).map(catalog::reachable_from).unwrap_or_default()
}

/// The steps a change to `to` takes, in order, as the operator plans them.
pub fn planned_steps(cluster: &RedisCluster, to: &CatalogEntry) -> Result<Vec<String>, String> {
    let from = current(cluster).ok_or("the cluster's current version is not in the catalog")?;
    let hops = catalog::path(from, to).ok_or_else(|| {
        format!("{} cannot be reached from {}: a downgrade or an unknown edge", to.release(), from.release())
    })?;
    if hops.is_empty() {
        return Err(format!("the nodes already run {}", to.release()));
    }
    let shards = cluster.spec.masters.max(0) as usize;
    let replicas = cluster.spec.replicas_per_master.max(0) as usize;
    let bake = cluster.spec.rollout.as_ref().and_then(|u| u.canary_bake_seconds).unwrap_or(DEFAULT_BAKE_SECONDS);
    let name = &cluster.metadata.name.clone().unwrap_or_default();
    let mut steps = Vec::new();
    let mut at = from;
    for (i, hop) in hops.iter().enumerate() {
        steps.push(format!(
            "Rollout {} of {}: {} → {} ({})",
            i + 1,
            hops.len(),
            at.release(),
            hop.release(),
            hop.image
        ));
        for shard in 0..shards {
            let canary = if shard == 0 { " (the canary)" } else { "" };
            let pod = |ordinal: usize| format!("{name}-shard-{shard}-{ordinal}");
            if replicas == 0 {
                steps.push(format!(
                    "Shard {shard}{canary}: a temporary replica {} on {} joins and takes over; {} is recreated and takes back; the temporary replica leaves",
                    pod(1),
                    hop.release(),
                    pod(0)
                ));
            } else {
                let others: Vec<String> = (1..=replicas).map(pod).collect();
                steps.push(format!(
                    "Shard {shard}{canary}: a temporary replica {} on {} joins; recreate replica(s) {} on it, each back and caught up; fail over to {}; recreate {}; the temporary replica leaves",
                    pod(replicas + 1),
                    hop.release(),
                    others.join(", "),
                    pod(1),
                    pod(0)
                ));
            }
            if shard == 0 && shards > 1 && bake > 0 {
                steps.push(format!("Bake {bake}s: every gate must hold before shard 1 starts"));
            }
        }
        if hop.rdb_format > at.rdb_format {
            steps.push(format!(
                "Point of no return: once a {} node is master, {} replicas cannot take a full sync from it; going back is refused after it",
                hop.release(),
                at.release()
            ));
        }
        at = hop;
    }
    Ok(steps)
}

/// The live "Version" fragment.
pub fn rollout(cluster: &RedisCluster, now: Timestamp) -> AnyView {
    let status = cluster.status.clone().unwrap_or_default();
    let running = current(cluster).map(|e| e.release().to_string()).unwrap_or_else(|| "unknown".into());
    let image = status.current_image.clone().unwrap_or_default();
    let asked = format!("{} {}", cluster.spec.redis.engine, cluster.spec.redis.version);
    let summary = view! {
        <dl class="facts">
            <dt>"Nodes run"</dt><dd id="version-current">{running}</dd>
            <dt>"Image"</dt><dd>{image}</dd>
            <dt>"Spec asks for"</dt><dd>{asked}</dd>
        </dl>
    };
    let upgrade = status.upgrade.clone().map(|u| rollout_details(&u, now));
    view! { {summary} {upgrade} {nodes_by_shard(&status.nodes)} }.into_any()
}

fn rollout_details(u: &UpgradeStatus, now: Timestamp) -> AnyView {
    let phase = format!("{:?}", u.phase);
    let step = u
        .step
        .as_ref()
        .map(|s| {
            let pod = s.pod.as_ref().map(|p| format!(" {p}")).unwrap_or_default();
            let detail = s.detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default();
            let shard = if s.shard >= 0 { format!("shard {} · ", s.shard) } else { String::new() };
            format!("{shard}{}{pod}{detail}", s.action)
        })
        .unwrap_or_else(|| "none".into());
    let ago = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.as_ref().map(|t| format!("{} ago", format::age(t.0, now))).unwrap_or_else(|| "—".into())
    };
    let bake = match &u.canary_bake_until {
        Some(until) if until.0 > now => {
            let left = until.0.duration_since(now).as_secs();
            format!("shard {} bakes until {} ({left}s left)", u.canary_shard, format::time(until.0))
        }
        Some(until) => format!("shard {}; baked until {}", u.canary_shard, format::time(until.0)),
        None => format!("shard {}; not upgraded yet", u.canary_shard),
    };
    let no_return = match &u.point_of_no_return_time {
        Some(t) => format!("passed {} ago ({} became master)", format::age(t.0, now), u.to),
        None => "not reached: a failed gate rolls back".into(),
    };
    let rollback = u.last_rollback.as_ref().map(|r| {
        let text = format!("{} rolled back: gate {} failed: {}", r.target, r.gate, r.reason);
        view! { <p class="verdict bad" id="rollout-rollback">{text}</p> }
    });
    let class = match u.phase {
        RolloutPhase::Completed => "verdict good",
        RolloutPhase::Progressing => "verdict",
        _ => "verdict bad",
    };
    view! {
        <h3>{format!("Rollout {} → {}", u.from, u.to)}</h3>
        <p class=class id="rollout-phase">{phase}{u.message.clone().map(|m| format!(": {m}")).unwrap_or_default()}</p>
        <dl class="facts" id="rollout">
            <dt>"Step"</dt><dd id="rollout-step">{step}</dd>
            <dt>"Shards done"</dt><dd id="rollout-shards">{format!("{} of {}", u.shards_done, u.shards_total)}</dd>
            <dt>"Canary"</dt><dd id="rollout-canary">{bake}</dd>
            <dt>"Point of no return"</dt><dd id="rollout-no-return">{no_return}</dd>
            <dt>"Then"</dt><dd>{u.final_target.clone().map(|t| format!("on to {t}")).unwrap_or_else(|| "nothing more".into())}</dd>
            <dt>"Started"</dt><dd>{ago(&u.start_time)}</dd>
            <dt>"Completed"</dt><dd>{ago(&u.completion_time)}</dd>
        </dl>
        {rollback}
    }
    .into_any()
}

/// Each shard's nodes with the version each runs.
fn nodes_by_shard(nodes: &[NodeStatus]) -> AnyView {
    let rows = nodes
        .iter()
        .map(|n| {
            let shard = n.pod.rsplit('-').nth(1).unwrap_or("?").to_owned();
            let release = match (n.engine, &n.version) {
                (Some(engine), Some(version)) => format!("{engine} {version}"),
                (None, Some(version)) => version.clone(),
                _ => "not answering".into(),
            };
            view! {
                <tr><td>{shard}</td><td>{n.pod.clone()}</td><td>{n.role.clone().unwrap_or_default()}</td><td class="node-version">{release}</td></tr>
            }
        })
        .collect_view();
    view! {
        <table class="versions">
            <thead><tr><th scope="col">"Shard"</th><th scope="col">"Pod"</th><th scope="col">"Role"</th><th scope="col">"Runs"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

/// Before a version change: the steps, then a confirmation.
pub fn page(
    key: &ClusterKey,
    to: &CatalogEntry,
    steps: &Result<Vec<String>, String>,
    permission: &Permission,
) -> AnyView {
    let change = ServerAction::<ChangeVersion>::new();
    let cancel = paths::cluster(key);
    let (namespace, name, target) = (key.namespace.clone(), key.name.clone(), value_of(to));
    let (title, button) = (format!("Move {key} to {}?", to.release()), format!("Roll out {}", to.release()));
    let crumbs = (paths::cluster(key), key.to_string());
    let listed = match steps {
        Ok(steps) => steps.iter().map(|s| view! { <li>{s.clone()}</li> }).collect_view().into_any(),
        Err(why) => view! { <li class="verdict bad">{why.clone()}</li> }.into_any(),
    };
    let blocked = steps.is_err() || !permission.allowed;
    let why = (!permission.allowed).then(|| format!("Disabled: {}.", permission.why_not));
    view! {
        <nav class="crumbs" aria-label="Breadcrumb"><a href="/">"Clusters"</a>" / "<a href=crumbs.0>{crumbs.1}</a></nav>
        <h1>{title}</h1>
        <section aria-labelledby="steps-title">
            <h2 id="steps-title">"Planned steps"</h2>
            <ol class="planned-steps" id="planned-steps">{listed}</ol>
            <p class="hint">"Pods are recreated one at a time, replicas first; each must come back, link up and catch up before the next step. Every acknowledged write is kept."</p>
        </section>
        <ActionForm action=change>
            <input type="hidden" name="namespace" value=namespace/>
            <input type="hidden" name="name" value=name/>
            <input type="hidden" name="target" value=target/>
            <button type="submit" id="confirm-version" disabled=blocked aria-describedby="version-why">{button}</button>
            " "
            <a href=cancel>"Cancel"</a>
        </ActionForm>
        {why.map(|w| view! { <p class="why-not" id="version-why">{w}</p> })}
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::RedisClusterSpec;

    fn cluster(replicas: i32, current: (&str, &str)) -> RedisCluster {
        let spec = serde_json::json!({"masters": 3, "replicasPerMaster": replicas, "redis": {"version": current.1, "engine": current.0}});
        let mut c = RedisCluster::new("cache", serde_json::from_value::<RedisClusterSpec>(spec).unwrap());
        c.metadata.namespace = Some("apps".into());
        c
    }

    #[test]
    fn only_reachable_releases_are_offered() {
        let offered: Vec<String> = choices(&cluster(1, ("redis", "6.2.14"))).iter().map(|e| value_of(e)).collect();
        assert_eq!(offered, ["redis-7.0.15", "valkey-8.1.8"]);
        assert!(choices(&cluster(1, ("valkey", "8.1.8"))).is_empty());
        assert_eq!(entry_of("valkey-8.1.8").map(|e| e.image), Some("valkey/valkey:8.1.8"));
        assert!(entry_of("valkey-9").is_none());
    }

    #[test]
    fn the_plan_lists_hops_shards_canary_bake_and_point_of_no_return() {
        let c = cluster(1, ("redis", "6.2.14"));
        let steps = planned_steps(&c, entry_of("valkey-8.1.8").unwrap()).unwrap();
        assert!(steps[0].starts_with("Rollout 1 of 2: redis 6.2.14 → redis 7.0.15"), "{steps:?}");
        assert!(
            steps[1].starts_with("Shard 0 (the canary): a temporary replica cache-shard-0-2 on redis 7.0.15 joins; recreate replica(s) cache-shard-0-1"),
            "{steps:?}"
        );
        assert!(steps[2].starts_with("Bake 30s"), "{steps:?}");
        assert!(steps.iter().any(|s| s.starts_with("Point of no return")));
        assert!(steps.iter().any(|s| s.starts_with("Rollout 2 of 2: redis 7.0.15 → valkey 8.1.8")));
        let surge = planned_steps(&cluster(0, ("redis", "7.0.15")), entry_of("valkey-8.1.8").unwrap()).unwrap();
        assert!(surge[1].contains("a temporary replica cache-shard-0-1"), "{surge:?}");
        let back = planned_steps(&cluster(1, ("redis", "7.0.15")), entry_of("redis-6.2.14").unwrap());
        assert!(back.unwrap_err().contains("cannot be reached"));
    }

    #[test]
    fn the_confirmation_is_disabled_without_the_right_to_patch() {
        let key = ClusterKey::new("apps", "cache");
        let to = entry_of("redis-7.0.15").unwrap();
        let steps = planned_steps(&cluster(1, ("redis", "6.2.14")), to);
        let html = Owner::new().with(|| page(&key, to, &steps, &Permission::allowed()).to_html());
        assert!(html.contains("name=\"target\" value=\"redis-7.0.15\"") && html.contains("Planned steps"), "{html}");
        let denied = Permission { allowed: false, why_not: "you may not patch redisclusters".into() };
        let html = Owner::new().with(|| page(&key, to, &steps, &denied).to_html());
        assert!(html.contains("id=\"confirm-version\" disabled"), "{html}");
    }
}
