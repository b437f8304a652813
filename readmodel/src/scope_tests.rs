use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::reflector;

use super::*;

fn object(namespace: &str, name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { namespace: Some(namespace.into()), name: Some(name.into()), ..Default::default() },
        data: Some([("v".to_owned(), value.to_owned())].into()),
        ..Default::default()
    }
}

/// What a store fed by the merged stream holds: `namespace/name=value`, sorted.
fn held(store: &reflector::Store<ConfigMap>) -> Vec<String> {
    let mut all: Vec<String> = store
        .state()
        .iter()
        .map(|c| {
            format!(
                "{}/{}={}",
                c.metadata.namespace.as_deref().unwrap(),
                c.metadata.name.as_deref().unwrap(),
                c.data.as_ref().unwrap()["v"]
            )
        })
        .collect();
    all.sort();
    all
}

/// Feeds `script` (namespace index, event) through a round, into a store,
/// as the merged stream does; returns what was sent on.
fn run(count: usize, script: Vec<(usize, Event<ConfigMap>)>) -> (Vec<String>, reflector::Store<ConfigMap>, bool) {
    let (store, mut writer) = reflector::store();
    let mut round = Round::new(count);
    let mut sent = Vec::new();
    let mut again = false;
    for (namespace, event) in script {
        match round.step(namespace, event) {
            Step::Emit(events) => {
                for event in events {
                    sent.push(match &event {
                        Event::Init => "Init".to_owned(),
                        Event::InitApply(o) => format!("InitApply {}", o.metadata.name.as_deref().unwrap()),
                        Event::InitDone => "InitDone".to_owned(),
                        Event::Apply(o) => format!("Apply {}", o.metadata.name.as_deref().unwrap()),
                        Event::Delete(o) => format!("Delete {}", o.metadata.name.as_deref().unwrap()),
                    });
                    writer.apply_watcher_event(&event);
                }
            }
            Step::ListAgain => again = true,
        }
    }
    (sent, store, again)
}

#[test]
fn namespaces_are_checked_deduplicated_and_none_means_all() {
    let list = |names: &[&str]| Namespaces::parse(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>());
    assert_eq!(list(&[]), Ok(Namespaces::All));
    assert_eq!(list(&["", " "]), Ok(Namespaces::All));
    assert_eq!(list(&["a", "b-2", "a"]), Ok(Namespaces::Only(vec!["a".into(), "b-2".into()])));
    for bad in ["A", "a/b", "-a", "a-", "a b", &"x".repeat(64), "a,b"] {
        assert_eq!(list(&[bad]), Err(ScopeError::BadName(bad.trim().into())), "{bad:?}");
    }
    let only = list(&["a", "b"]).unwrap();
    assert!(only.contains("a") && !only.contains("c") && Namespaces::All.contains("c"));
    assert_eq!(only.describe(), "a,b");
}

#[test]
fn two_namespaces_list_as_one_and_init_done_waits_for_both() {
    let (sent, store, again) = run(
        2,
        vec![
            (0, Event::Init),
            (1, Event::Init),
            (0, Event::InitApply(object("a", "x", "1"))),
            (0, Event::InitDone),
            (1, Event::InitApply(object("b", "y", "1"))),
            (1, Event::InitDone),
            (1, Event::Apply(object("b", "y", "2"))),
        ],
    );
    assert!(!again);
    assert_eq!(sent, ["Init", "InitApply x", "InitApply y", "InitDone", "Apply y"]);
    assert_eq!(held(&store), ["a/x=1", "b/y=2"]);
}

/// A change in a namespace that listed, while another still lists, must
/// survive the listing: the store swaps in what was listed at `InitDone`.
#[test]
fn changes_while_another_namespace_lists_survive_its_end() {
    let (sent, store, _) = run(
        2,
        vec![
            (0, Event::Init),
            (0, Event::InitApply(object("a", "x", "1"))),
            (0, Event::InitApply(object("a", "gone", "1"))),
            (0, Event::InitApply(object("a", "back", "1"))),
            (0, Event::InitDone),
            (1, Event::Init),
            (0, Event::Apply(object("a", "x", "2"))),
            (0, Event::Delete(object("a", "gone", "1"))),
            (0, Event::Delete(object("a", "back", "1"))),
            (0, Event::Apply(object("a", "back", "2"))),
            (1, Event::InitDone),
        ],
    );
    assert_eq!(held(&store), ["a/back=2", "a/x=2"], "{sent:?}");
    let after_the_listing = &sent[sent.iter().position(|e| e == "InitDone").unwrap()..];
    assert_eq!(after_the_listing, ["InitDone", "Delete gone"], "{sent:?}");
    for made_now in ["Apply x", "Delete gone", "Delete back", "Apply back"] {
        assert!(sent.iter().any(|e| e == made_now), "{made_now} at once: {sent:?}");
    }
}

#[test]
fn a_namespace_listing_again_makes_every_namespace_list_again() {
    let script = vec![(0, Event::Init), (1, Event::Init), (0, Event::InitDone), (1, Event::InitDone), (1, Event::Init)];
    assert!(run(2, script).2, "after every namespace listed");
    assert!(run(2, vec![(0, Event::Init), (0, Event::Init)]).2, "twice in one listing");
}

/// The merged stream end to end: fake watches; the first namespace lists
/// again, keeping its own watch while the other is opened again; the store
/// ends with both namespaces' newest objects.
#[tokio::test]
async fn the_merged_stream_opens_the_others_again_when_one_lists_again() {
    let opened = Arc::new(Mutex::new([0, 0]));
    let times = opened.clone();
    let open = move |ns: usize| -> BoxStream<'static, Watched<ConfigMap>> {
        let mut times = times.lock().unwrap();
        times[ns] += 1;
        let events = match (ns, times[ns]) {
            (0, _) => vec![
                Event::Init,
                Event::InitApply(object("a", "x", "1")),
                Event::InitDone,
                Event::Init,
                Event::InitApply(object("a", "x", "2")),
                Event::InitDone,
            ],
            (_, n) => vec![Event::Init, Event::InitApply(object("b", "y", &n.to_string())), Event::InitDone],
        };
        futures::stream::iter(events.into_iter().map(Ok)).boxed()
    };
    let (store, writer) = reflector::store();
    let events: Vec<_> = merged(2, open).reflect(writer).collect().await;
    assert!(events.iter().all(Result::is_ok));
    assert_eq!(*opened.lock().unwrap(), [1, 2], "the one that asked kept its watch");
    assert_eq!(held(&store), ["a/x=2", "b/y=2"]);
}
