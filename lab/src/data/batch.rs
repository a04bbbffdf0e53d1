//! Batches of token windows: random contiguous windows for training, a fixed walk for evaluation.

use super::{DataError, TokenStream};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A batch of windows, row-major `[rows, seq_len]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBatch {
    /// Input ids, `[rows, seq_len]` flattened.
    pub inputs: Vec<i64>,
    /// Target ids (the inputs shifted by one), `[rows, seq_len]` flattened.
    pub targets: Vec<i64>,
    /// Rows in the batch.
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// UTF-8 bytes of the text the targets encode (for bits per byte).
    pub target_bytes: u64,
}

impl TokenBatch {
    fn from_starts(stream: &TokenStream, starts: &[usize], seq_len: usize) -> Self {
        let mut window = Vec::with_capacity(seq_len + 1);
        let mut inputs = Vec::with_capacity(starts.len() * seq_len);
        let mut targets = Vec::with_capacity(starts.len() * seq_len);
        let mut target_bytes = 0;
        for &start in starts {
            window.clear();
            stream.ids.extend_i64(start, seq_len + 1, &mut window);
            inputs.extend_from_slice(&window[..seq_len]);
            targets.extend_from_slice(&window[1..]);
            target_bytes += stream.bytes_of(start + 1, seq_len);
        }
        TokenBatch {
            inputs,
            targets,
            rows: starts.len(),
            seq_len,
            target_bytes,
        }
    }
}

/// Random contiguous windows of `seq_len + 1` tokens from a training stream.
///
/// The batch of index `i` (the harness's micro-batch counter) depends only on `(seed, i)`, so a
/// resumed run sees exactly the batches the uninterrupted run would have.
#[derive(Clone, Debug)]
pub struct TrainWindows<'a> {
    stream: &'a TokenStream,
    seq_len: usize,
    seed: u64,
}

impl<'a> TrainWindows<'a> {
    /// Windows of `seq_len` inputs (and `seq_len` targets) from `stream`.
    ///
    /// # Errors
    /// If the stream is shorter than one window.
    pub fn new(stream: &'a TokenStream, seq_len: usize, seed: u64) -> Result<Self, DataError> {
        check_window("the training split", stream, seq_len)?;
        Ok(TrainWindows {
            stream,
            seq_len,
            seed,
        })
    }

    /// Batch number `index`: `rows` windows at uniformly random starts.
    pub fn batch(&self, index: u64, rows: usize) -> TokenBatch {
        // SplitMix-style mixing so neighbouring steps get unrelated generators.
        let mut rng = StdRng::seed_from_u64(mix(self.seed, index));
        let last_start = self.stream.len() - self.seq_len - 1;
        let starts: Vec<usize> = (0..rows)
            .map(|_| rng.random_range(0..=last_start))
            .collect();
        TokenBatch::from_starts(self.stream, &starts, self.seq_len)
    }
}

/// The evaluation walk: non-overlapping windows of the stream, in batches of `rows`. With
/// `max_windows` smaller than the windows that fit, that many are taken evenly spaced over the
/// whole stream (not the first ones: a corpus's validation documents differ, e.g. by genre).
/// The same on every call.
///
/// # Errors
/// If the stream is shorter than one window.
pub fn eval_batches(
    stream: &TokenStream,
    seq_len: usize,
    rows: usize,
    max_windows: Option<usize>,
) -> Result<Vec<TokenBatch>, DataError> {
    check_window("the validation split", stream, seq_len)?;
    let fit = (stream.len() - 1) / seq_len;
    let windows = max_windows.map_or(fit, |m| m.min(fit));
    // Window w of `windows` is the (w·fit/windows)-th of the `fit` non-overlapping ones.
    let starts: Vec<usize> = (0..windows).map(|w| w * fit / windows * seq_len).collect();
    Ok(starts
        .chunks(rows.max(1))
        .map(|chunk| TokenBatch::from_starts(stream, chunk, seq_len))
        .collect())
}

/// Checks that `stream` (described by `what`) holds one window of `seq_len` inputs and targets.
pub(crate) fn check_window(
    what: &str,
    stream: &TokenStream,
    seq_len: usize,
) -> Result<(), DataError> {
    if seq_len == 0 {
        return Err(DataError::Invalid(
            "a window needs seq_len ≥ 1 (got 0)".to_string(),
        ));
    }
    if stream.len() < seq_len + 1 {
        return Err(DataError::TooShort {
            what: what.to_string(),
            tokens: stream.len(),
            needed: seq_len + 1,
        });
    }
    Ok(())
}

fn mix(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
