//! Preparing a [`Trainer`]: alone, or as one rank of a group.

use super::*;

impl<'a, B: FusedOps> Trainer<'a, B> {
    /// Checks the config against the corpus and the devices, decides between a fresh run and a
    /// resume (see [`RunOptions`]), writes `config.json`, and builds or loads the model and the
    /// optimiser.
    ///
    /// # Errors
    /// An invalid config, no device, a `batch_size` not divisible by the device count, a folder
    /// holding another run (or, on resume, a config that differs from it), and I/O errors.
    pub fn prepare(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
    ) -> Result<Self, TrainError> {
        Self::prepare_in_group(config, corpus, out_dir, options, devices, &SingleProcess)
    }

    /// [`prepare`](Self::prepare) as one rank of `group`: every rank of the group calls it with
    /// the same config, corpus and options. Rank 0 prepares the run folder as one process would
    /// and broadcasts its state (weights with their parameter ids, AdamW's moments, the step);
    /// the other ranks take it and never touch the folder, so a resume needs the folder on rank
    /// 0's machine only. Each micro-batch's `batch_size` rows are split into one equal share per
    /// rank (and each share over the rank's devices): the ranks together compute the gradient
    /// one process would compute over the whole micro-batch.
    ///
    /// # Errors
    /// Those of [`prepare`](Self::prepare) (on rank 0; the others then fail with
    /// [`TrainError::Group`] naming rank 0's error), a `batch_size` not divisible by the ranks
    /// times the devices, and a collective that does not complete.
    pub fn prepare_in_group(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
        group: &'a dyn ProcessGroup,
    ) -> Result<Self, TrainError> {
        if group.world_size() > 1 {
            super::ranks::agree_on_run(config, corpus, options, group)?;
        }
        config.validate_for(corpus)?;
        if devices.is_empty() {
            return Err(TrainError::Config {
                field: "devices".into(),
                value: "[]".into(),
                message: "at least one device is needed".into(),
            });
        }
        let shares = devices.len() * group.world_size();
        if !config.batch_size.is_multiple_of(shares) {
            let message = if group.world_size() == 1 {
                format!(
                    "must be divisible by the number of devices ({shares}): each device takes \
                     batch_size / {shares} rows of every micro-batch"
                )
            } else {
                format!(
                    "must be divisible by the ranks times the devices of each ({} × {} = \
                     {shares}): each device of each rank takes batch_size / {shares} rows of \
                     every micro-batch",
                    group.world_size(),
                    devices.len()
                )
            };
            return Err(TrainError::Config {
                field: "batch_size".into(),
                value: config.batch_size.to_string(),
                message,
            });
        }
        if options.stop_at == Some(0) {
            return Err(TrainError::Config {
                field: "stop_at".into(),
                value: "0".into(),
                message: "must be at least 1".into(),
            });
        }
        if group.world_size() == 1 {
            return Self::prepare_rank(config, corpus, out_dir, options, devices, group);
        }
        let quiet = RunOptions {
            quiet: true,
            ..options.clone()
        };
        let options = if group.rank() == 0 { options } else { &quiet };
        let mut local = Self::prepare_rank(config, corpus, out_dir, options, devices, group);
        // Rank 0 sends its state, or its error, which every rank then returns.
        let mut message = Vec::new();
        if group.rank() == 0 {
            match local.as_ref().map(Self::encode_state) {
                Ok(Ok(bytes)) => message = bytes,
                Ok(Err(e)) => local = Err(e),
                Err(_) => {}
            }
            if let Err(e) = &local {
                message = [&[0u8][..], e.to_string().as_bytes()].concat();
            }
        }
        group.broadcast_bytes(&mut message)?;
        if let Some((0, error)) = message.split_first() {
            return match group.rank() {
                0 => local,
                _ => Err(TrainError::Group(format!(
                    "rank 0 could not start the run: {}",
                    String::from_utf8_lossy(error)
                ))),
            };
        }
        let ready = match group.rank() {
            0 => local,
            _ => local.and_then(|mut trainer| trainer.adopt_state(message).map(|()| trainer)),
        };
        // Every rank learns whether every other could start, so none waits alone.
        let mut failed = [f64::from(u8::from(ready.is_err()))];
        group.all_reduce_sum_f64(&mut failed)?;
        let trainer = match ready {
            Err(e) => return Err(e),
            Ok(_) if failed[0] > 0.0 => {
                return Err(TrainError::Group(format!(
                    "{} rank(s) could not start the run (see their messages)",
                    failed[0]
                )));
            }
            Ok(trainer) => trainer,
        };
        trainer.check_ranks_agree()?;
        Ok(trainer)
    }

    /// One rank's preparation: rank 0's (or a single process's) with the run folder, the others'
    /// without (a fresh model and optimiser, replaced by rank 0's state).
    pub(super) fn prepare_rank(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
        group: &'a dyn ProcessGroup,
    ) -> Result<Self, TrainError> {
        let device = &devices[0];
        let main = group.rank() == 0;
        let say = |message: String| {
            if !options.quiet {
                eprintln!("{message}");
            }
        };
        let stop = options
            .stop_at
            .map_or(config.max_steps, |s| s.min(config.max_steps));
        let mut run_config = RunConfig::new(config, corpus);
        run_config.backend = Some(B::name(device));
        run_config.dynamics_path = Some(coupled_qk::dynamics::dynamics_path::<B>().to_string());
        let (lock, start) = if main {
            let (lock, start) = open_run_folder(out_dir, &run_config, options, &say)?;
            (Some(lock), start)
        } else {
            (None, Start::fresh())
        };

        let windows = TrainWindows::new(&corpus.train, config.seq_len, config.seed)?;
        let eval_set = eval_batches(
            &corpus.valid,
            config.seq_len,
            config.eval_batch,
            config.eval_windows,
        )?;

        B::seed(device, config.seed);
        coupled_qk::attention::register_flash_attention::<B>();
        let mut model: Gpt<B> = config
            .model
            .try_init(device)?
            .with_attention_kernel(config.attention_kernel);
        if start.checkpoints.is_none() && main {
            model = match &config.init_weights {
                None => model,
                Some(InitWeights::Safetensors(path)) => model.load_safetensors(path)?,
                Some(InitWeights::Gpt2(path)) => model.load_gpt2_safetensors(path)?,
            };
        }
        let (params, extra_params) = (model.num_params(), model.extra_num_params());
        let new_optimizer = || new_optimizer::<B>(config);

        let metrics_path = out_dir.join("metrics.csv");
        let (model, optimizer, state, rows, resumed_step) = match &start.checkpoints {
            Some(checkpoints) => {
                let (model, optimizer, state, dir) =
                    load_newest_good(out_dir, checkpoints, model, new_optimizer, device, &say)?;
                if state.step > config.max_steps {
                    return Err(TrainError::Config {
                        field: "max_steps".into(),
                        value: config.max_steps.to_string(),
                        message: format!(
                            "the run resumes from step {} ({}): give max_steps of at least {}, \
                             or train into a new folder",
                            state.step,
                            dir.display(),
                            state.step
                        ),
                    });
                }
                let changes = state.model_changes(&config.model);
                if !changes.is_empty() && !options.allow_config_change {
                    return Err(TrainError::CheckpointMismatch {
                        checkpoint: dir,
                        config: out_dir.join("config.json"),
                        changes,
                    });
                }
                let rows: Vec<MetricsRow> = if metrics_path.is_file() {
                    read_metrics_until(&metrics_path, state.step)?
                } else {
                    say(format!(
                        "{} is missing: starting a new one",
                        metrics_path.display()
                    ));
                    Vec::new()
                };
                say(format!(
                    "resuming from step {} ({})",
                    state.step,
                    dir.display()
                ));
                if !start.changes.is_empty() {
                    let list: Vec<String> = start.changes.iter().map(|c| c.to_string()).collect();
                    say(format!(
                        "resuming from step {} with changed settings: {}",
                        state.step,
                        list.join(", ")
                    ));
                }
                let step = state.step;
                (model, optimizer, state, rows, Some(step))
            }
            None => (
                model,
                new_optimizer(),
                CheckpointState::new(0, 0, 0.0, &[], &config.model),
                Vec::new(),
                None,
            ),
        };
        let (log, probes) = if main {
            run_config.changes = match resumed_step {
                Some(step) => history_from(start.history, step),
                None => Vec::new(),
            };
            if let Some(step) = resumed_step {
                mark_summary_unfinished(out_dir)?;
                run_config
                    .changes
                    .extend(start.changes.into_iter().map(|c| RecordedChange {
                        step,
                        field: c.field,
                        old: c.old,
                        new: c.new,
                    }));
            }
            // Written once the checkpoint has loaded: a resume that fails leaves the run's record.
            let config_path = out_dir.join("config.json");
            atomic::write(&config_path, run_config.to_json().as_bytes())
                .map_err(|e| TrainError::io("write", &config_path, e))?;
            let log = MetricsLog::create(&metrics_path, &rows)?;
            let probes = ProbeLogs::open(out_dir, resumed_step)?;
            (Some(log), Some(probes))
        } else {
            (None, None)
        };
        say(format!(
            "training {} parameters ({} added by the attention variant) on {} ({} training \
             tokens, `{}` tokenizer): {} steps of {} tokens into {}",
            params,
            extra_params,
            corpus.name,
            corpus.train.len(),
            corpus.tokenizer,
            config.max_steps,
            config.tokens_per_step(),
            out_dir.display()
        ));
        if group.world_size() > 1 {
            say(format!(
                "data-parallel over {} ranks ({} rows each per micro-batch)",
                group.world_size(),
                config.batch_size / group.world_size()
            ));
        }
        if devices.len() > 1 {
            say(format!(
                "data-parallel over {} devices {:?} ({} rows each per micro-batch; main device \
                 {:?})",
                devices.len(),
                devices,
                config.batch_size / group.world_size() / devices.len(),
                device
            ));
        }
        let last_val = rows.iter().rev().find_map(|r| r.val);
        Ok(Self {
            config: config.clone(),
            corpus,
            devices,
            group,
            out_dir: out_dir.to_path_buf(),
            stop,
            windows,
            eval_set,
            model: Some(model),
            optimizer,
            params,
            extra_params,
            log,
            rows,
            resumed_step,
            step: state.step,
            tokens: state.tokens,
            pending_losses: state.losses(),
            elapsed_before: state.elapsed_s,
            started: Instant::now(),
            progress: progress_bar(options.quiet, stop, state.step),
            schedule: config.schedule(),
            plot_title: format!("{} on {}", config.model.attention, corpus.name),
            interval: (Duration::ZERO, 0),
            total: (Duration::ZERO, 0),
            pending_checkpoint: None,
            last_val,
            probes,
            _lock: lock,
        })
    }
}

/// The change history of a run resumed from `step`: changes recorded at later steps (by a
/// resume whose progress a fallback to an older checkpoint discarded) now apply from `step`,
/// merged per field (the first old value, the last new one; dropped where they are equal).
pub(super) fn history_from(history: Vec<RecordedChange>, step: usize) -> Vec<RecordedChange> {
    let (mut kept, later): (Vec<_>, Vec<_>) = history.into_iter().partition(|c| c.step <= step);
    let mut merged: Vec<RecordedChange> = Vec::new();
    for change in later {
        match merged.iter_mut().find(|m| m.field == change.field) {
            Some(m) => m.new = change.new,
            None => merged.push(RecordedChange { step, ..change }),
        }
    }
    kept.extend(merged.into_iter().filter(|m| m.old != m.new));
    kept
}

/// Marks a resumed run's `summary.json` (where a finished or stopped run left one) unfinished
/// until the resume writes its own.
fn mark_summary_unfinished(out_dir: &Path) -> Result<(), TrainError> {
    let path = out_dir.join("summary.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let Ok(mut summary) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(());
    };
    if summary.get("finished") != Some(&serde_json::Value::Bool(true)) {
        return Ok(());
    }
    summary["finished"] = false.into();
    let json = serde_json::to_string_pretty(&summary).expect("a JSON value serialises");
    atomic::write(&path, json.as_bytes()).map_err(|e| TrainError::io("write", &path, e))
}

/// The optimiser of every run, as `config` sets it: PyTorch's ε (Burn's default is 1e-5); no
/// clipping here, `clip_global_norm` does it.
pub(super) fn new_optimizer<B: FusedOps>(config: &TrainConfig) -> Adam<B> {
    AdamWConfig::new()
        .with_beta_1(config.betas.0 as f32)
        .with_beta_2(config.betas.1 as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(config.weight_decay as f32)
        .init::<B, Gpt<B>>()
}

#[cfg(test)]
mod tests {
    use super::history_from;
    use crate::lm::RecordedChange;

    fn change(step: usize, field: &str, old: &str, new: &str) -> RecordedChange {
        RecordedChange {
            step,
            field: field.into(),
            old: old.into(),
            new: new.into(),
        }
    }

    #[test]
    fn a_fallback_moves_the_changes_it_discarded_to_its_step() {
        let history = vec![
            change(100, "lr", "0.001", "0.0005"),
            change(200, "max_steps", "400", "600"),
            change(300, "lr", "0.0005", "0.0002"),
            change(300, "max_steps", "600", "400"),
        ];
        // Resumed from step 100 after the checkpoints of 200 and 300 failed: the run's settings
        // now (config.json's) apply from step 100, the round trip of max_steps is no change.
        assert_eq!(
            history_from(history.clone(), 150),
            [
                change(100, "lr", "0.001", "0.0005"),
                change(150, "lr", "0.0005", "0.0002"),
            ]
        );
        assert_eq!(history_from(history.clone(), 300), history);
    }
}
