//! The conversion webhook between `slotkeeper.io/v1alpha1` and `v1`: served
//! over HTTPS by every replica, with certificates the operator issues,
//! renews and writes into the CRDs itself.

pub mod certs;
pub mod endpoint;
pub mod keeper;
pub mod probe;
pub mod review;
pub mod rotation;
pub mod tls;

pub use endpoint::{Endpoint, WebhookConfig};
pub use keeper::{Keeper, WebhookError};
