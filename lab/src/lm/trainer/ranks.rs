//! What the ranks of a group exchange beyond gradients: rank 0's state at the start, checks that
//! their weights agree, and rank 0's verdicts.

use super::*;

impl<B: FusedOps> Trainer<'_, B> {
    /// Rank 0's state for the other ranks: `1`, then the length-prefixed JSON of the
    /// checkpoint state, then the model's record (length-prefixed) and the optimiser's.
    pub(super) fn encode_state(&self) -> Result<Vec<u8>, TrainError> {
        let state = serde_json::to_vec(&self.state()).expect("a CheckpointState serialises");
        let (model, optimizer) = encode_records(self.model(), &self.optimizer, &self.out_dir)?;
        let mut bytes = vec![1u8];
        for part in [&state, &model] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part);
        }
        bytes.extend_from_slice(&optimizer);
        Ok(bytes)
    }

    /// Takes rank 0's state, as [`encode_state`](Self::encode_state) wrote it.
    pub(super) fn adopt_state(&mut self, message: Vec<u8>) -> Result<(), TrainError> {
        let malformed = || TrainError::Group("rank 0's state arrived cut short".into());
        let mut rest = message.get(1..).ok_or_else(malformed)?;
        let mut part = || -> Result<Vec<u8>, TrainError> {
            let (len, tail) = rest.split_first_chunk::<8>().ok_or_else(malformed)?;
            let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| malformed())?;
            let (part, tail) = tail.split_at_checked(len).ok_or_else(malformed)?;
            rest = tail;
            Ok(part.to_vec())
        };
        let state: CheckpointState = serde_json::from_slice(&part()?).map_err(|_| malformed())?;
        let model_bytes = part()?;
        let optimizer_bytes = rest.to_vec();
        let model = self
            .model
            .take()
            .expect("the model is only taken during an update");
        let optimizer = new_optimizer::<B>(&self.config);
        let origin = PathBuf::from("<rank 0>");
        let (model, optimizer) = decode_records(
            model,
            optimizer,
            model_bytes,
            optimizer_bytes,
            &origin,
            &self.devices[0],
        )?;
        self.model = Some(model);
        self.optimizer = optimizer;
        self.step = state.step;
        self.tokens = state.tokens;
        self.pending_losses = state.losses();
        self.elapsed_before = state.elapsed_s;
        self.resumed_step = (state.step > 0).then_some(state.step);
        self.progress.set_position(state.step as u64);
        Ok(())
    }

    /// Checks that every rank holds rank 0's weights, bit for bit (their digests): ranks that
    /// drifted apart would train different models without a word.
    ///
    /// # Errors
    /// [`TrainError::Group`] on every rank when one differs.
    pub(super) fn check_ranks_agree(&self) -> Result<(), TrainError> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        let digest = weights_digest(&self.model().valid()).to_le_bytes();
        let (_, differing) = compare_with_rank0(self.group, &digest)?;
        if differing > 0 {
            return Err(TrainError::Group(format!(
                "at step {}, {} of {} ranks hold other weights than rank 0: their MPI library \
                 gives ranks different sums, or a rank was disturbed; resume from the last \
                 checkpoint",
                self.step,
                differing,
                self.group.world_size()
            )));
        }
        Ok(())
    }

    /// Rank 0's `result` of something only it does (writing a file), on every rank: rank 0
    /// returns its own error, the others one that points at it, so that all stop together.
    ///
    /// # Errors
    /// Rank 0's error, and a collective that does not complete.
    pub(super) fn rank0_result(
        &self,
        result: Result<(), TrainError>,
        what: &str,
    ) -> Result<(), TrainError> {
        if self.group.world_size() == 1 {
            return result;
        }
        let ok = self.rank0_says(result.is_ok())?;
        match (self.group.rank(), ok) {
            (0, _) => result,
            (_, true) => Ok(()),
            (_, false) => Err(TrainError::Group(format!(
                "rank 0 could not {what} (see its message): training stopped on every rank"
            ))),
        }
    }

    /// Rank 0's `ok` on every rank (each other rank's own `ok` is ignored).
    pub(super) fn rank0_says(&self, ok: bool) -> Result<bool, TrainError> {
        if self.group.world_size() == 1 {
            return Ok(ok);
        }
        let mut flag = vec![u8::from(ok)];
        self.group.broadcast_bytes(&mut flag)?;
        Ok(flag == [1])
    }
}

/// Checks that every rank runs the same config on the same corpus with the same options (the
/// digest of rank 0's against each rank's own), before anything else: ranks that differ would
/// step to different schedules or batches and drift apart.
///
/// # Errors
/// [`TrainError::Group`] on every rank when one differs; a collective that does not complete.
pub(super) fn agree_on_run(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    options: &RunOptions,
    group: &dyn ProcessGroup,
) -> Result<(), TrainError> {
    // First how the ranks sum gradients, naming both choices: ranks that differ would issue
    // different collectives in the first step.
    let own = group.collective();
    let (rank0, differing) = compare_with_rank0(group, own.as_bytes())?;
    if differing > 0 {
        return Err(TrainError::Group(format!(
            "the ranks sum gradients differently: rank 0 with `--collective {}`, {differing} of \
             {} ranks with another (this rank: `{own}`); give every rank the same --collective",
            String::from_utf8_lossy(&rank0),
            group.world_size()
        )));
    }
    let what = format!(
        "{}\n{:?}",
        RunConfig::new(config, corpus).to_json(),
        (
            options.resume,
            options.stop_at,
            &options.allow_changes,
            options.allow_config_change,
            options.force
        )
    );
    let digest = twox_hash::XxHash64::oneshot(0, what.as_bytes()).to_le_bytes();
    let (_, differing) = compare_with_rank0(group, &digest)?;
    if differing > 0 {
        return Err(TrainError::Group(format!(
            "{} of {} ranks run another config, corpus or options than rank 0: give every rank \
             the same settings and the same data",
            differing,
            group.world_size()
        )));
    }
    Ok(())
}

/// Rank 0's `own`, and how many ranks hold another (the same count on every rank).
fn compare_with_rank0(
    group: &dyn ProcessGroup,
    own: &[u8],
) -> Result<(Vec<u8>, usize), TrainError> {
    let mut rank0 = own.to_vec();
    group.broadcast_bytes(&mut rank0)?;
    let mut differing = [f64::from(u8::from(rank0 != own))];
    group.all_reduce_sum_f64(&mut differing)?;
    Ok((rank0, differing[0] as usize))
}
