//! Sign-in with a Kubernetes bearer token.

use leptos::prelude::*;

use crate::actions::SignIn;

pub fn page(next: Option<String>) -> AnyView {
    let sign_in = ServerAction::<SignIn>::new();
    view! {
        <h1>"Sign in"</h1>
        <p>"Sign in with a Kubernetes bearer token. The console checks it with the apiserver (a TokenReview) and then makes every call with it, so you can see and do exactly what Kubernetes lets you."</p>
        <ActionForm action=sign_in>
            <label for="token">"Bearer token"</label>
            <textarea id="token" name="token" rows="4" cols="60" required=true autocomplete="off" spellcheck="false" aria-describedby="token-help"></textarea>
            {next.map(|n| view! { <input type="hidden" name="next" value=n/> })}
            <button type="submit" id="sign-in">"Sign in"</button>
        </ActionForm>
        <p class="hint" id="token-help">
            "For a ServiceAccount: "<code>"kubectl create token NAME -n NAMESPACE"</code>
            ". The token is kept only in an encrypted, HttpOnly cookie in this browser."
        </p>
    }
    .into_any()
}
