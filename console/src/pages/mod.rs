//! The pages, as pure functions from data (a snapshot of the read model,
//! what the user may do, the time) to HTML, so the live streams render the
//! very same fragments and tests render them from fixtures.

pub mod cluster;
pub mod clusters;
pub mod scale;
pub mod shell;
pub mod signin;
pub mod upgrades;
pub mod version;

/// The console's URLs, built in one place.
pub mod paths {
    use slotkeeper_readmodel::ClusterKey;

    pub const CLUSTERS: &str = "/";
    pub const SIGN_IN: &str = "/signin";
    /// Slotkeeper's own upgrade plans.
    pub const UPGRADES: &str = "/upgrades";

    pub fn cluster(key: &ClusterKey) -> String {
        format!("/clusters/{}/{}", encode(&key.namespace), encode(&key.name))
    }

    pub fn version_preview(key: &ClusterKey, target: &str) -> String {
        format!("{}/version?to={}", cluster(key), encode(target))
    }

    pub fn scale_preview(key: &ClusterKey, masters: i32, replicas: i32) -> String {
        format!("{}/scale?masters={masters}&replicas={replicas}", cluster(key))
    }

    /// A cluster page's stream; `seen` names the fragments the page shows.
    pub fn live_cluster(key: &ClusterKey, seen: &str) -> String {
        format!("/live{}?seen={seen}", cluster(key))
    }

    /// The clusters page's stream for a filter (`query`); `seen` names the table the page shows.
    pub fn live_clusters(query: &str, seen: &str) -> String {
        if query.is_empty() {
            format!("/live/clusters?seen={seen}")
        } else {
            format!("/live/clusters?{query}&seen={seen}")
        }
    }

    /// Everything but RFC 3986's unreserved characters is percent-encoded.
    const RESERVED: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

    pub fn encode(text: &str) -> String {
        percent_encoding::utf8_percent_encode(text, RESERVED).to_string()
    }
}

/// A fragment of a page: a section with an id that the live stream replaces whole.
pub fn fragment(id: &'static str, title: &'static str, content: leptos::prelude::AnyView) -> leptos::prelude::AnyView {
    use leptos::prelude::*;
    let (heading, labelled_by) = (format!("{id}-title"), format!("{id}-title"));
    view! {
        <section id=id aria-labelledby=labelled_by data-fragment="">
            <h2 id=heading>{title}</h2>
            {content}
        </section>
    }
    .into_any()
}
