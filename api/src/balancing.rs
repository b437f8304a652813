//! How a cluster's slots are balanced over its masters (`spec.balance`),
//! the plan a rebalance follows (checkpointed in `status.reshard.plan`), and
//! the record of the last one finished (`status.balance`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The tolerance when `spec.balance.tolerancePercent` is absent.
pub const DEFAULT_TOLERANCE_PERCENT: i32 = 10;

/// What "balanced" means for a cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BalanceSpec {
    /// `Slots` (default): every master owns an even share of the 16384
    /// slots. `Memory`: scaling and `Rebalance` operations move slots so
    /// that the data each master holds ends within `tolerancePercent` of the
    /// mean, for keyspaces where a few slots hold most bytes.
    #[serde(default)]
    pub by: BalanceBy,
    /// For `Memory`: how far (in percent of the mean) a master's data may be
    /// from the mean. 10 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 50").message("spec.balance.tolerancePercent must be between 1 and 50"))]
    pub tolerance_percent: Option<i32>,
}

impl BalanceSpec {
    pub fn tolerance_percent(&self) -> u32 {
        self.tolerance_percent.unwrap_or(DEFAULT_TOLERANCE_PERCENT).clamp(1, 50) as u32
    }
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BalanceBy {
    #[default]
    Slots,
    Memory,
}

impl std::fmt::Display for BalanceBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BalanceBy::Slots => "slots",
            BalanceBy::Memory => "memory",
        })
    }
}

/// Where slots go in a rebalance, decided once from what the masters held
/// and followed to the end (a restarted operator resumes it).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BalancePlan {
    pub by: BalanceBy,
    /// The RedisOperation that asked for it; absent for a scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// `spec.masters` when it was made: a plan for another shape is replaced.
    pub masters: i32,
    /// The slots that move, by the shard that receives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<SlotTarget>,
    /// What it expects, e.g. `estimated data per master: 4.1, 3.9, 4.0 MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SlotTarget {
    pub shard: i32,
    /// Slot ranges such as `0-99` or `1234`.
    pub slots: Vec<String>,
}

/// The last rebalance that finished.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BalanceStatus {
    pub by: BalanceBy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    /// The outcome, e.g. `data per master: 4.0, 4.1, 3.9 MiB (within 10%)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl BalancePlan {
    /// The shard each moving slot goes to. A range that does not parse (a
    /// hand-edited status) is an error naming it, never a guess.
    pub fn target_of(&self) -> Result<std::collections::BTreeMap<u16, usize>, String> {
        let mut target = std::collections::BTreeMap::new();
        for t in &self.targets {
            for text in &t.slots {
                let range: crate::topology::SlotRange =
                    text.parse().map_err(|e| format!("status.reshard.plan.targets[shard {}]: {e}", t.shard))?;
                for slot in range.start..=range.end {
                    target.insert(slot, t.shard.max(0) as usize);
                }
            }
        }
        Ok(target)
    }

    /// Slots the plan moves in all.
    pub fn slots(&self) -> usize {
        self.targets
            .iter()
            .flat_map(|t| &t.slots)
            .filter_map(|text| text.parse::<crate::topology::SlotRange>().ok())
            .map(|r| usize::from(r.end - r.start) + 1)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_reads_back_the_slots_it_names() {
        let plan = BalancePlan {
            targets: vec![
                SlotTarget { shard: 3, slots: vec!["0-2".into(), "7".into()] },
                SlotTarget { shard: 1, slots: vec!["100".into()] },
            ],
            ..BalancePlan::default()
        };
        let target = plan.target_of().unwrap();
        assert_eq!(target.len(), 5);
        assert_eq!(plan.slots(), 5);
        assert_eq!((target[&0], target[&7], target[&100]), (3, 3, 1));
        let broken = BalancePlan { targets: vec![SlotTarget { shard: 0, slots: vec!["9-2".into()] }], ..plan };
        assert!(broken.target_of().unwrap_err().contains("status.reshard.plan.targets[shard 0]"));
    }
}
