//! Helpers of the integration tests.

pub mod hub_server;
