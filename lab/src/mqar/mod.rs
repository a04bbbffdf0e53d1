//! The MQAR benchmark: data, one training run, the sweep and its report.

mod data;
mod error;
mod report;
mod sweep;
mod train;

pub use data::{IGNORE, MqarBatch, MqarTask};
pub use error::{MqarError, TaskRule};
pub use report::{write_markdown, write_plot};
pub use sweep::{RunKey, RunResult, Sweep, SweepResults};
pub use train::{MqarRun, batch_gradients, train};
