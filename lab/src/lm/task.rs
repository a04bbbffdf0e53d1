//! One training run as a [`MultiDeviceTask`]: what the programs that train a single run folder
//! (`wikitext_60m`, `retrofit`) hand to [`dispatch_devices`](crate::backend::dispatch_devices).

use super::{RunOptions, TrainConfig, train_on_devices};
use crate::backend::MultiDeviceTask;
use crate::data::TokenizedCorpus;
use coupled_qk::model::FusedOps;
use std::path::PathBuf;

/// Trains `config` on `corpus` into `out` on the backend and devices it is dispatched to, then
/// prints the run's summary as JSON on stdout.
pub struct TrainingRun {
    /// What to train.
    pub config: TrainConfig,
    /// On what.
    pub corpus: TokenizedCorpus,
    /// The run folder.
    pub out: PathBuf,
    /// Resume, force, stop and the changes a resume may make.
    pub options: RunOptions,
    /// Printed on stderr first when the backend is not a GPU one (e.g. that a large preset is
    /// slow on a CPU).
    pub cpu_note: Option<String>,
}

impl MultiDeviceTask for TrainingRun {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn run<B: FusedOps>(
        self,
        devices: Vec<B::Device>,
        _name: &'static str,
        gpu: bool,
    ) -> Self::Output {
        if let Some(note) = self.cpu_note.as_ref().filter(|_| !gpu) {
            eprintln!("note: {note}");
        }
        let summary = train_on_devices::<B>(
            &self.config,
            &self.corpus,
            &self.out,
            &self.options,
            &devices,
        )?;
        println!("{}", serde_json::to_string_pretty(&summary)?);
        Ok(())
    }
}
