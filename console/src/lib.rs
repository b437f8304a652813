//! The web console served by the operator process. Empty until its issue lands.
#![forbid(unsafe_code)]
