//! A real browser for end-to-end tests: Debian's headless Chromium driven
//! through Debian's chromedriver (WebDriver) with fantoccini. Both die with
//! the test: chromedriver is a managed process, and Chromium starts through
//! `setpriv --pdeathsig KILL`, so it goes when chromedriver goes.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use slotkeeper_env::process::{ManagedProcess, ProcessSpec};

use super::wait_until;

pub struct Browser {
    pub client: Client,
    /// The console's base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    _driver: ManagedProcess,
    _profile: tempfile::TempDir,
}

/// Where screenshots go: `target/screenshots/<test binary>/`.
pub fn screenshot_dir() -> PathBuf {
    slotkeeper_env::tools::repo_root().join("target/screenshots").join(env!("CARGO_CRATE_NAME"))
}

impl Browser {
    /// A fresh browser (own profile: no cookies) for the console on `port`;
    /// `scripts: false` starts it with JavaScript disabled.
    pub async fn start(port: u16, scripts: bool) -> Browser {
        let chromium = which("chromium");
        let chromedriver = which("chromedriver");
        let profile = tempfile::Builder::new().prefix("slotkeeper-browser-").tempdir().expect("temp dir");
        // Chromium outlives a killed chromedriver unless told to die with it.
        let wrapper = profile.path().join("chromium");
        std::fs::write(&wrapper, format!("#!/bin/sh\nexec setpriv --pdeathsig KILL {} \"$@\"\n", chromium.display()))
            .expect("write the chromium wrapper");
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let driver_port = slotkeeper_env::control_plane::free_port().unwrap();
        let log = screenshot_dir().join(format!("chromedriver-{driver_port}.log"));
        std::fs::create_dir_all(screenshot_dir()).unwrap();
        let driver = ManagedProcess::spawn(
            ProcessSpec::new("chromedriver", chromedriver, log).arg(format!("--port={driver_port}")),
        )
        .expect("chromedriver starts");
        let mut options = json!({
            "binary": wrapper,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1400,1000", format!("--user-data-dir={}", profile.path().join("data").display()),
            ],
        });
        if !scripts {
            options["prefs"] = json!({ "profile.managed_default_content_settings.javascript": 2 });
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{driver_port}");
        let client = wait_until("chromedriver to start a session", Duration::from_secs(30), || {
            let capabilities = capabilities.clone();
            let url = url.clone();
            async move {
                let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                ClientBuilder::new(connector).capabilities(capabilities).connect(&url).await.ok()
            }
        })
        .await;
        Browser { client, base: format!("http://127.0.0.1:{port}"), _driver: driver, _profile: profile }
    }

    pub async fn goto(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.client.goto(&url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.unwrap();
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The visible text of the first element matching `css`, or "" if none.
    pub async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.map(|e| e.len()).unwrap_or(0)
    }

    /// Waits until the text of `css` contains `wanted`; returns that text.
    /// On time-out, says where the browser is and what the page says.
    pub async fn wait_for_text(&self, css: &str, wanted: &str, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let text = self.text(css).await;
            if text.contains(wanted) {
                return text;
            }
            if std::time::Instant::now() > deadline {
                let page = self.text("body").await;
                panic!(
                    "timed out after {timeout:?} waiting for {css} to say {wanted:?}; at {}, {css} says {text:?}; the page says:\n{page}",
                    self.path().await
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn fill(&self, css: &str, value: &str) {
        let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        element.clear().await.unwrap();
        element.send_keys(value).await.unwrap();
    }

    pub async fn click(&self, css: &str) {
        let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        element.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Signs in with `token` on the sign-in page and waits for the clusters page.
    pub async fn sign_in(&self, token: &str) {
        self.goto("/signin").await;
        self.fill("#token", token).await;
        self.click("#sign-in").await;
    }

    /// Saves a PNG of the whole page (the window grown to its height) as
    /// `<name>.png`; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        // Scripts may be off for the page; then the window keeps its height.
        let height = self.client.execute("return document.documentElement.scrollHeight;", vec![]).await;
        let height = height.ok().and_then(|h| h.as_u64()).unwrap_or(1000);
        let height = height.clamp(1000, 8000) as u32;
        self.client.set_window_size(1400, height + 140).await.ok();
        let png = self.client.screenshot().await.expect("screenshot");
        self.client.set_window_size(1400, 1000).await.ok();
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    pub async fn js(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }
}

fn which(program: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!("{program} is not installed: run tests/setup.sh (it installs Debian's chromium and chromium-driver)")
    })
}
