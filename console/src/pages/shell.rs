//! The document every page shares: head, a header with who is signed in and
//! a sign-out button, the one-time message, and the page's own content. The
//! only script is our own file (with this response's nonce); pages work
//! without it.

use leptos::prelude::*;

use super::paths;
use crate::actions::SignOut;
use crate::session::{Flash, Session};

pub struct Shell<'a> {
    pub title: String,
    pub session: Option<&'a Session>,
    pub nonce: &'a str,
    pub flash: Option<Flash>,
    /// The Server-Sent Events stream that keeps this page live, if any.
    pub live: Option<String>,
}

/// Renders a whole page; `content` is built inside the render's reactive owner.
pub fn document(shell: Shell<'_>, content: impl FnOnce() -> AnyView) -> String {
    let Shell { title, session, nonce, flash, live } = shell;
    let user = session.map(|s| s.display_name());
    let nonce = nonce.to_owned();
    let body = Owner::new().with(move || {
        let sign_out = ServerAction::<SignOut>::new();
        let header_user = user.map(|user| {
            view! {
                <div class="user">
                    <span>"Signed in as "<strong>{user}</strong></span>
                    <ActionForm action=sign_out>
                        <button type="submit" class="link">"Sign out"</button>
                    </ActionForm>
                </div>
            }
        });
        let flash = flash.map(|f| {
            let class = if f.ok { "flash ok" } else { "flash error" };
            let role = if f.ok { "status" } else { "alert" };
            let prefix = if f.ok { "✔ " } else { "✖ " };
            view! { <div class=class role=role><span aria-hidden="true">{prefix}</span>{f.text}</div> }
        });
        let live_note = live.is_some().then(|| {
            view! { <p class="live-note" id="live-state" aria-live="polite">"Live updates are off (scripts disabled); reload to refresh."</p> }
        });
        view! {
            <a class="skip" href="#content">"Skip to content"</a>
            <header class="top">
                <a class="brand" href="/">"Slotkeeper"</a>
                <nav aria-label="Main"><a href=paths::CLUSTERS>"Clusters"</a><a href=paths::UPGRADES>"Upgrades"</a></nav>
                {header_user}
            </header>
            <main id="content" data-live=live.clone()>
                {flash}
                {content()}
                {live_note}
            </main>
        }
        .to_html()
    });
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Slotkeeper</title>\
         <link rel=\"stylesheet\" href=\"/assets/console.css\">\
         <script src=\"/assets/console.js\" nonce=\"{nonce}\" defer></script>\
         </head><body>{body}</body></html>",
        escape(&title),
    )
}

/// Text for an HTML text node or attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_names_the_user_offers_sign_out_and_shows_the_message_once() {
        let session = Session::new("alice".into(), vec![], "t".into(), 0);
        let html = document(
            Shell {
                title: "Clusters <x>".into(),
                session: Some(&session),
                nonce: "abc",
                flash: Some(Flash { ok: false, text: "Kubernetes refused".into() }),
                live: Some("/live/clusters".into()),
            },
            || view! { <p>"content"</p> }.into_any(),
        );
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>Clusters &lt;x&gt; · Slotkeeper</title>"));
        assert!(html.contains("nonce=\"abc\"") && html.contains("Signed in as <strong>alice</strong>"));
        assert!(html.contains("action=\"/actions/sign-out\""), "{html}");
        assert!(html.contains("<a href=\"/upgrades\">Upgrades</a>"), "the upgrades page is in the navigation: {html}");
        assert!(html.contains("role=\"alert\"") && html.contains("Kubernetes refused"));
        assert!(html.contains("data-live=\"/live/clusters\""));
        assert!(!html.contains("<script>"), "no inline script");
    }
}
