//! Readiness, liveness and startup probes (exec, tcpSocket, httpGet), with the
//! kubelet's thresholds: a result flips after `successThreshold` successes or
//! `failureThreshold` failures in a row, probing every `periodSeconds`.

use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::container::Launch;

/// One probe of one container: its schedule, counters and current verdict.
pub struct ProbeTracker {
    probe: Probe,
    next_at: Instant,
    successes: i32,
    failures: i32,
    /// `None` until the thresholds decide; then the probe's verdict.
    pub verdict: Option<bool>,
    in_flight: Option<JoinHandle<bool>>,
}

/// Where and how to probe a running container.
#[derive(Clone)]
pub struct ProbeTarget {
    pub pod_ip: String,
    pub container: Container,
    pub launch: Launch,
    pub pid: u32,
}

impl ProbeTracker {
    pub fn new(probe: &Probe, started: Instant) -> Self {
        let delay = Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        Self {
            probe: probe.clone(),
            next_at: started + delay,
            successes: 0,
            failures: 0,
            verdict: None,
            in_flight: None,
        }
    }

    /// Collects a finished probe and starts the next one when due. Returns true
    /// when the verdict changed.
    pub fn poll(&mut self, now: Instant, target: &ProbeTarget) -> bool {
        let before = self.verdict;
        if let Some(result) = self.in_flight.as_mut().and_then(|handle| handle.now_or_never()) {
            self.in_flight = None;
            self.record(result.unwrap_or(false));
        }
        if self.in_flight.is_none() && now >= self.next_at {
            let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
            self.next_at = now + period;
            self.in_flight = Some(tokio::spawn(run_probe(self.probe.clone(), target.clone())));
        }
        before != self.verdict
    }

    fn record(&mut self, success: bool) {
        if success {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= self.probe.success_threshold.unwrap_or(1).max(1) {
                self.verdict = Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= self.probe.failure_threshold.unwrap_or(3).max(1) {
                self.verdict = Some(false);
            }
        }
    }
}

impl Drop for ProbeTracker {
    fn drop(&mut self) {
        if let Some(handle) = self.in_flight.take() {
            handle.abort();
        }
    }
}

/// Runs one probe; true on success. Anything unsupported fails.
pub async fn run_probe(probe: Probe, target: ProbeTarget) -> bool {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let attempt = async {
        if let Some(exec) = &probe.exec {
            // As the kubelet does, only variables with literal values expand here.
            let statics: std::collections::HashMap<String, String> = target
                .container
                .env
                .iter()
                .flatten()
                .filter_map(|v| v.value.clone().map(|value| (v.name.clone(), value)))
                .collect();
            let argv: Vec<String> = exec.command.iter().flatten().map(|a| super::expand::expand(a, &statics)).collect();
            let Ok(mut child) = target.launch.exec(target.pid, &argv) else {
                return false;
            };
            let status = child.wait().await;
            tracing::debug!(?argv, ?status, "exec probe");
            return status.map(|s| s.success()).unwrap_or(false);
        }
        if let Some(tcp) = &probe.tcp_socket {
            let host = tcp.host.clone().unwrap_or_else(|| target.pod_ip.clone());
            let Some(port) = resolve_port(&tcp.port, &target.container) else {
                return false;
            };
            return TcpStream::connect((host.as_str(), port)).await.is_ok();
        }
        if let Some(http) = &probe.http_get {
            let host = http.host.clone().unwrap_or_else(|| target.pod_ip.clone());
            let Some(port) = resolve_port(&http.port, &target.container) else {
                return false;
            };
            return http_get(&host, port, http.path.as_deref().unwrap_or("/")).await;
        }
        false
    };
    // Dropping the attempt on timeout kills an exec probe's process (kill_on_drop).
    let result = tokio::time::timeout(timeout, attempt).await;
    tracing::debug!(?result, "probe");
    result.unwrap_or(false)
}

fn resolve_port(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

async fn http_get(host: &str, port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect((host, port)).await else {
        return false;
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/slotkeeper\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 64];
    let Ok(n) = stream.read(&mut head).await else {
        return false;
    };
    let line = String::from_utf8_lossy(&head[..n]);
    let code: Option<u16> = line.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    code.is_some_and(|c| (200..400).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(success: i32, failure: i32) -> ProbeTracker {
        let probe = Probe { success_threshold: Some(success), failure_threshold: Some(failure), ..Default::default() };
        ProbeTracker::new(&probe, Instant::now())
    }

    #[test]
    fn verdict_flips_only_after_thresholds() {
        let mut t = tracker(2, 3);
        t.record(true);
        assert_eq!(t.verdict, None);
        t.record(true);
        assert_eq!(t.verdict, Some(true));
        t.record(false);
        t.record(false);
        assert_eq!(t.verdict, Some(true));
        t.record(false);
        assert_eq!(t.verdict, Some(false));
    }

    #[tokio::test]
    async fn tcp_probe_succeeds_on_listening_port_and_fails_otherwise() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port() as i32;
        let target = ProbeTarget {
            pod_ip: "127.0.0.1".into(),
            container: Container::default(),
            launch: Launch {
                argv: vec![],
                env: vec![],
                mounts: vec![],
                working_dir: "/".into(),
                bin_dir: "/".into(),
                log_path: "/dev/null".into(),
                root: None,
                confinement: Default::default(),
            },
            pid: 0,
        };
        let probe = |port| Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction { port: IntOrString::Int(port), host: None }),
            ..Default::default()
        };
        assert!(run_probe(probe(port), target.clone()).await);
        drop(listener);
        assert!(!run_probe(probe(port), target).await);
    }
}
