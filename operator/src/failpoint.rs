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

pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    if ARMED.get_or_init(|| std::env::var(ENV).ok()).as_deref() == Some(name) {
        tracing::error!(failpoint = name, "failpoint reached: aborting");
        std::process::abort();
    }
}
