//! The upgrade manager. Today: the version rollout planner, pure functions
//! from the observed cluster and the rollout's checkpoint to the next step,
//! which the operator's reconcile executes through its one act layer.
#![forbid(unsafe_code)]

pub mod preflight;
pub mod rollout;
mod view;

pub use rollout::{Act, Decision, Target, next, start};
pub use view::{ClusterView, NodeView};

#[cfg(test)]
mod sim;
