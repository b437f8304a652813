//! The one step of a rebalance that reads before it decides: by memory, each
//! master's bytes per slot; then where every moving slot goes. The result is
//! the plan checkpointed in `status.reshard.plan`, followed by the planner's
//! `MoveSlots` steps (no Redis state changes here).

use std::collections::BTreeMap;

use futures::future::try_join_all;

use super::Context;
use super::act::Target;
use crate::api::{BalanceBy, BalancePlan};
use crate::error::Result;
use crate::plan::Action;
use crate::plan::moves::make_plan;
use crate::redis::topology::expand;
use crate::redis::weights;

/// The plan for a `PlanBalance` step, and a sentence for its event.
pub async fn plan(ctx: &Context, target: &Target<'_>, action: &Action) -> Result<Option<(BalancePlan, String)>> {
    let Action::PlanBalance { by, tolerance_percent, operation, staying, masters, owned } = action else {
        return Ok(None);
    };
    let weights: BTreeMap<u16, u64> = match by {
        BalanceBy::Slots => BTreeMap::new(),
        BalanceBy::Memory => try_join_all(masters.iter().map(|(shard, node)| {
            let slots: Vec<u16> = owned.get(shard).map(|r| expand(r).into_iter().collect()).unwrap_or_default();
            async move {
                let mut connection = ctx.redis.node(target.key, &node.ip, &target.users.logins).await?;
                Ok::<_, crate::error::Error>(weights::slot_bytes(&mut connection, &slots).await?)
            }
        }))
        .await?
        .into_iter()
        .flatten()
        .collect(),
    };
    let (plan, moves) = make_plan(*by, *tolerance_percent, operation.clone(), *staying, owned, &weights);
    let asked = operation.as_ref().map(|op| format!(" for RedisOperation {op}")).unwrap_or_default();
    let expected = plan.expected.clone().unwrap_or_default();
    let note = format!("rebalancing by {by}{asked}: {moves} slot(s) to move; {expected}");
    Ok(Some((plan, note)))
}
