//! The local Kubernetes environment Slotkeeper is tested in, and that the
//! README's first command starts: a real control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler built from the official Go
//! modules) and a node agent that plays kubelet, running each Pod as local
//! processes.
//!
//! [`Environment::start`] → [`control_plane::ControlPlane`] (processes on free
//! loopback ports, one temp dir) → the `slotkeeper-node-agent` binary
//! ([`agent`]) → Nodes Ready. Every process dies with the environment: on drop,
//! on panic, and when the owning process is killed (see [`process`]).
#![forbid(unsafe_code)]

pub mod agent;
mod control_client;
pub mod control_plane;
pub mod crds;
pub mod environment;
pub mod pki;
pub mod process;
pub mod tools;

pub use control_plane::{ADMIN_USER, ControlPlane, ControlPlaneOptions, TEST_USERS};
pub use environment::{Environment, EnvironmentOptions};
