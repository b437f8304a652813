//! The upgrade manager (CRD upgrades, storage-version migration, Redis
//! rollouts). Empty until its issue lands.
#![forbid(unsafe_code)]
