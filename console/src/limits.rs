//! Sign-in attempts, limited per client address and in total on each
//! replica: every attempt is a TokenReview the operator makes with its own
//! rights, so guessing tokens (or flooding the apiserver through us) is
//! slowed to a trickle. Token buckets: a burst, then a steady refill.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Per client: 5 attempts at once, then one every 12 s (5 a minute).
const PER_CLIENT: Rate = Rate { burst: 5.0, per_second: 1.0 / 12.0 };
/// All clients together on one replica: 20 at once, then one a second.
const TOTAL: Rate = Rate { burst: 20.0, per_second: 1.0 };
/// Clients remembered at most; a full bucket carries no information, so
/// those go first when the table is full.
const MAX_CLIENTS: usize = 10_000;

#[derive(Clone, Copy)]
struct Rate {
    burst: f64,
    per_second: f64,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self { tokens: rate.burst, at: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.at = now;
    }

    /// How long until one token is there (zero if it is).
    fn wait(&self, rate: Rate) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / rate.per_second).max(0.0))
    }
}

#[derive(Default)]
pub struct SignInLimiter {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    clients: HashMap<IpAddr, Bucket>,
    total: Option<Bucket>,
}

impl SignInLimiter {
    /// Takes one attempt for `client`, or says how long to wait.
    pub fn attempt(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().expect("limiter lock");
        let mut total = state.total.unwrap_or_else(|| Bucket::full(TOTAL, now));
        total.refill(TOTAL, now);
        let mut own = client.map(|ip| state.clients.get(&ip).copied().unwrap_or_else(|| Bucket::full(PER_CLIENT, now)));
        if let Some(own) = own.as_mut() {
            own.refill(PER_CLIENT, now);
        }
        let wait = total.wait(TOTAL).max(own.map_or(Duration::ZERO, |b| b.wait(PER_CLIENT)));
        if wait.is_zero() {
            total.tokens -= 1.0;
            if let Some(own) = own.as_mut() {
                own.tokens -= 1.0;
            }
        }
        state.total = Some(total);
        if let (Some(ip), Some(own)) = (client, own) {
            if state.clients.len() >= MAX_CLIENTS && !state.clients.contains_key(&ip) {
                state.clients.retain(|_, b| {
                    b.refill(PER_CLIENT, now);
                    b.tokens < PER_CLIENT.burst
                });
            }
            if state.clients.len() < MAX_CLIENTS {
                state.clients.insert(ip, own);
            }
        }
        if wait.is_zero() { Ok(()) } else { Err(wait) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_client_gets_a_burst_then_one_try_every_twelve_seconds() {
        let limiter = SignInLimiter::default();
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(limiter.attempt(ip(1), start), Ok(()));
        }
        let wait = limiter.attempt(ip(1), start).unwrap_err();
        assert!(wait > Duration::from_secs(11) && wait <= Duration::from_secs(12), "{wait:?}");
        // Another client is not held up by the first.
        assert_eq!(limiter.attempt(ip(2), start), Ok(()));
        assert_eq!(limiter.attempt(ip(1), start + Duration::from_secs(12)), Ok(()));
        assert!(limiter.attempt(ip(1), start + Duration::from_secs(13)).is_err());
    }

    #[test]
    fn many_clients_together_are_held_to_the_total() {
        let limiter = SignInLimiter::default();
        let start = Instant::now();
        let admitted = (0..100u8).filter(|i| limiter.attempt(ip(*i), start).is_ok()).count();
        assert_eq!(admitted, 20);
        let later = start + Duration::from_secs(10);
        let admitted = (100..200u8).filter(|i| limiter.attempt(ip(*i), later).is_ok()).count();
        assert_eq!(admitted, 10, "one a second refills the total");
    }

    #[test]
    fn the_client_table_stays_bounded() {
        let limiter = SignInLimiter::default();
        let start = Instant::now();
        for i in 0..(MAX_CLIENTS as u32 + 500) {
            let now = start + Duration::from_secs(u64::from(i));
            let _ = limiter.attempt(Some(IpAddr::from(i.to_be_bytes())), now);
        }
        assert!(limiter.state.lock().unwrap().clients.len() <= MAX_CLIENTS);
    }
}
