//! Helpers of the integration tests (each test crate uses some of them).
#![allow(dead_code)]

pub mod corpus;

pub mod hub_server;
