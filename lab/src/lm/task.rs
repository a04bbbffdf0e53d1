//! One training run as a [`MultiDeviceTask`]: what the programs that train a single run folder
//! (`wikitext_60m`, `retrofit`) hand to [`dispatch_devices`](crate::backend::dispatch_devices).

use super::{RunOptions, TrainConfig, train_in_group};
use crate::backend::MultiDeviceTask;
use crate::data::TokenizedCorpus;
use crate::dist::{ProcessGroup, SingleProcess};
use coupled_qk::model::FusedOps;
use std::path::PathBuf;

/// Trains `config` on `corpus` into `out` on the backend and devices it is dispatched to, as one
/// rank of `group`, then prints the run's summary as JSON on stdout (rank 0 only).
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
    /// The data-parallel ranks this process is one of ([`SingleProcess`] alone).
    pub group: Box<dyn ProcessGroup>,
}

impl TrainingRun {
    /// The run of `config` on `corpus` into `out`, in this process alone, without a note.
    pub fn new(
        config: TrainConfig,
        corpus: TokenizedCorpus,
        out: PathBuf,
        options: RunOptions,
    ) -> Self {
        TrainingRun {
            config,
            corpus,
            out,
            options,
            cpu_note: None,
            group: Box::new(SingleProcess),
        }
    }
}

impl MultiDeviceTask for TrainingRun {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn run<B: FusedOps>(
        self,
        devices: Vec<B::Device>,
        _name: &'static str,
        gpu: bool,
    ) -> Self::Output {
        let main = self.group.rank() == 0;
        if let Some(note) = self.cpu_note.as_ref().filter(|_| !gpu && main) {
            eprintln!("note: {note}");
        }
        let trained = train_in_group::<B>(
            &self.config,
            &self.corpus,
            &self.out,
            &self.options,
            &devices,
            &*self.group,
        );
        let summary = match trained {
            Ok(summary) => summary,
            // Said here, then the whole job ended: an error of one rank must not leave the others
            // waiting for it (and MPI must not be finalised under them).
            Err(e) if self.group.world_size() > 1 => {
                eprintln!("error ({}): {e}", self.group.describe());
                if let Some(advice) = crate::cli::advice(&e) {
                    eprintln!("{advice}");
                }
                self.group.abort(1)
            }
            Err(e) => return Err(e.into()),
        };
        if main {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        }
        Ok(())
    }
}
