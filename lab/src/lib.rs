//! # coupled-qk-lab
//!
//! The experiment harness of [`coupled_qk`]: everything the example programs need to reproduce
//! *Coupled Query-Key Dynamics for Attention* (Gahtan & Bronstein, 2026) and that a model which
//! only uses the layer should not compile.
//!
//! - [`data`]: corpora (WikiText from the Hugging Face Hub, local files, JSONL), tokenizers
//!   (GPT-2 BPE, bytes), the token cache, document splits and batches.
//! - [`lm`]: language-model training: the run config, the training loop with exact resume,
//!   evaluation, checkpoints, metrics, data-parallel gradients and loss plots.
//! - [`suite`]: suites of training runs over variants and seeds (ablations, corpus sensitivity,
//!   compute-matched), their statistics and reports.
//! - [`dist`]: data-parallel training across processes and machines (MPI with the feature
//!   `mpi`).
//! - [`experiment`]: experiments as files (a program's flags as TOML, `experiments/*.toml`).
//! - [`mqar`]: multi-query associative recall (Zoology's synthetic benchmark).
//! - [`cli`]: what the programs tell their users: errors with advice in terms of their flags.
//! - [`backend`]: the backend a program runs on (`--backend flex|ndarray|wgpu|cuda`).
//! - [`pretrained`]: GPT-2 checkpoints from a folder or the Hub, and the config they fit.
//! - [`plot`], [`schedule`], [`atomic`], [`alloc`]: line charts as SVG, the learning-rate
//!   schedule, atomic file writes and the programs' allocator.

pub mod alloc;
pub mod atomic;
pub mod backend;
pub mod cli;
pub mod data;
pub mod dist;
pub mod experiment;
pub mod lm;
pub mod mqar;
pub mod plot;
pub mod pretrained;
pub mod schedule;
pub mod suite;
