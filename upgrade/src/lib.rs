//! The upgrade manager: the version rollout planner (pure functions from the
//! observed cluster and the rollout's checkpoint to the next step, which the
//! operator's reconcile executes through its one act layer), the CRD upgrade
//! preflight, and storage-version migration with Kubernetes' migrator.
#![forbid(unsafe_code)]

pub mod installed;
pub mod manager;
pub mod migrate;
pub mod plan;
pub mod preflight;
pub mod rollout;
pub mod storage;
mod view;

pub use rollout::{Act, Decision, Target, next, start};
pub use view::{ClusterView, NodeView};

#[cfg(test)]
mod sim;
