//! Crash points for tests: with `SLOTKEEPER_FAILPOINT=<name>` set, the
//! process aborts (as a crash would: no cleanup, no status write) the first
//! time it reaches that point. Unset, a failpoint costs one comparison.

use std::sync::OnceLock;

pub const ENV: &str = "SLOTKEEPER_FAILPOINT";

/// Points the reconciler passes: after a MEET step, after the first slot
/// batch of an assignment, after the first REPLICATE, and in a reshard
/// after keys moved but before slot ownership changed.
pub const AFTER_MEET: &str = "after-meet";
pub const MID_ADDSLOTS: &str = "mid-addslots";
pub const MID_REPLICATE: &str = "mid-replicate";
pub const MID_MIGRATION: &str = "mid-migration";
/// In a rollout: right after a Pod was deleted to be recreated, and right
/// after `CLUSTER FAILOVER` was sent (before the status says so).
pub const AFTER_RECREATE: &str = "after-recreate";
pub const AFTER_FAILOVER: &str = "after-failover";

/// `SLOTKEEPER_FAILPOINT=<name>` aborts the first time `name` is reached;
/// `<name>:<n>` the n-th time (a later step of the same kind).
pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<(String, usize)>> = OnceLock::new();
    static HITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let armed = ARMED.get_or_init(|| {
        let value = std::env::var(ENV).ok()?;
        Some(match value.split_once(':') {
            Some((point, n)) => (point.to_owned(), n.parse().unwrap_or(1)),
            None => (value, 1),
        })
    });
    let Some((point, nth)) = armed else { return };
    if point == name && HITS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == *nth {
        tracing::error!(failpoint = name, nth, "failpoint reached: aborting");
        std::process::abort();
    }
}
