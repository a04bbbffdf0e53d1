//! The experiment harness shared by the example programs.
#![allow(dead_code, unused_imports)]

pub mod alloc;
pub mod atomic;
pub mod backend;
pub mod data;
pub mod lm;
pub mod mqar;
pub mod schedule;
pub mod suite;
