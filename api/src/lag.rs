//! Replication lag as a bucket. A replica's offset moves with every write
//! its master takes, so reporting bytes would turn every resync into a
//! status write; a bucket changes only when a replica crosses a boundary,
//! and crossing back needs a margin, so a replica hovering at a boundary
//! does not flap.

use serde::{Deserialize, Serialize};

use crate::rollout::MAX_REPLICA_LAG_BYTES;

/// Beyond this a replica is far behind (a resync, or a master taking
/// writes faster than the link carries them).
pub const FAR_BEHIND_BYTES: u64 = 64 << 20;

/// How far a replica is behind its master.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReplicationLag {
    /// At most 1 MiB behind: caught up enough to take the master role
    /// over in a coordinated failover.
    InSync,
    /// Up to 64 MiB behind.
    Behind,
    /// More than 64 MiB behind.
    FarBehind,
    /// Its link to the master is down (syncing, or the master is unreachable).
    LinkDown,
}

impl ReplicationLag {
    /// The bucket for `lag` bytes (`None`: the link is down), given the
    /// bucket reported before. Moving to a worse bucket is immediate;
    /// moving to a better one needs the lag under half that bucket's bound.
    pub fn of(lag: Option<u64>, previous: Option<ReplicationLag>) -> ReplicationLag {
        let Some(lag) = lag else { return ReplicationLag::LinkDown };
        let raw = Self::raw(lag);
        match previous {
            // Better than before: judged as if twice as far behind, never worse than before.
            Some(previous) if previous != ReplicationLag::LinkDown && previous > raw => {
                Self::raw(lag.saturating_mul(2)).min(previous)
            }
            _ => raw,
        }
    }

    fn raw(lag: u64) -> ReplicationLag {
        if lag <= MAX_REPLICA_LAG_BYTES {
            ReplicationLag::InSync
        } else if lag <= FAR_BEHIND_BYTES {
            ReplicationLag::Behind
        } else {
            ReplicationLag::FarBehind
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicationLag::*;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn buckets_by_bytes_behind() {
        assert_eq!(ReplicationLag::of(Some(0), None), InSync);
        assert_eq!(ReplicationLag::of(Some(MIB), None), InSync);
        assert_eq!(ReplicationLag::of(Some(MIB + 1), None), Behind);
        assert_eq!(ReplicationLag::of(Some(64 * MIB), None), Behind);
        assert_eq!(ReplicationLag::of(Some(64 * MIB + 1), None), FarBehind);
        assert_eq!(ReplicationLag::of(None, Some(InSync)), LinkDown);
    }

    #[test]
    fn getting_worse_is_reported_at_once() {
        assert_eq!(ReplicationLag::of(Some(MIB + 1), Some(InSync)), Behind);
        assert_eq!(ReplicationLag::of(Some(100 * MIB), Some(InSync)), FarBehind);
    }

    #[test]
    fn getting_better_needs_a_margin_so_a_replica_at_a_bound_does_not_flap() {
        // Just under the bound: still Behind.
        assert_eq!(ReplicationLag::of(Some(MIB - 1), Some(Behind)), Behind);
        assert_eq!(ReplicationLag::of(Some(MIB / 2 + 1), Some(Behind)), Behind);
        assert_eq!(ReplicationLag::of(Some(MIB / 2), Some(Behind)), InSync);
        assert_eq!(ReplicationLag::of(Some(60 * MIB), Some(FarBehind)), FarBehind);
        assert_eq!(ReplicationLag::of(Some(30 * MIB), Some(FarBehind)), Behind);
        // From far behind straight to in sync once the margin is passed.
        assert_eq!(ReplicationLag::of(Some(100), Some(FarBehind)), InSync);
        // A link back up reports what it is, whatever it was.
        assert_eq!(ReplicationLag::of(Some(MIB - 1), Some(LinkDown)), InSync);
    }
}
