//! Multi-query associative recall (MQAR), after Zoology's `multiquery_ar` (Arora et al., 2023).

use super::error::{MqarError, TaskRule};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// The label of a position that is not scored (Zoology's `-100`).
pub const IGNORE: i64 = -100;

/// One MQAR task: vocabulary, sequence length, key-value pairs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MqarTask {
    /// The vocabulary size `V`: keys come from `[1, V/2)`, values from `[V/2, V)`.
    pub vocab: usize,
    /// The sequence length `L` of the inputs.
    pub seq_len: usize,
    /// The number of key-value pairs `D`, each queried once.
    pub kv_pairs: usize,
    /// Zoology's `power_a`: query gaps are drawn with probability ∝ `a·i^(a−1)`.
    pub power_a: f64,
    /// Fill the positions that are neither context nor query with uniform random tokens.
    pub random_non_queries: bool,
}

/// A batch of examples: inputs and labels, row-major `[n, seq_len]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MqarBatch {
    /// The number of examples.
    pub n: usize,
    /// The sequence length.
    pub seq_len: usize,
    /// Token ids.
    pub inputs: Vec<i64>,
    /// The value to predict at each query position, [`IGNORE`] elsewhere.
    pub labels: Vec<i64>,
}

impl MqarTask {
    /// A task with Zoology's defaults (`power_a = 0.01`, random non-query tokens).
    pub fn new(vocab: usize, seq_len: usize, kv_pairs: usize) -> Self {
        Self {
            vocab,
            seq_len,
            kv_pairs,
            power_a: 0.01,
            random_non_queries: true,
        }
    }

    /// Checks Zoology's constraints.
    ///
    /// # Errors
    /// [`MqarError::Task`] naming the rule broken.
    pub fn validate(&self) -> Result<(), MqarError> {
        let Self {
            vocab: v,
            seq_len: l,
            kv_pairs: d,
            ..
        } = *self;
        let rule = if l == 0 || l % 2 != 0 {
            Some(TaskRule::SeqLen)
        } else if v <= l {
            Some(TaskRule::Vocab)
        } else if d == 0 || 4 * d > l {
            Some(TaskRule::KvPairs)
        } else {
            None
        };
        match rule {
            None => Ok(()),
            Some(rule) => Err(MqarError::Task {
                vocab: v,
                seq_len: l,
                kv_pairs: d,
                rule,
            }),
        }
    }

    /// `n` examples drawn with `seed` (train and test sets use disjoint seeds).
    ///
    /// # Panics
    /// If the task is invalid (see [`validate`](Self::validate)).
    pub fn generate(&self, n: usize, seed: u64) -> MqarBatch {
        self.validate().unwrap_or_else(|e| panic!("{e}"));
        let mut rng = StdRng::seed_from_u64(seed);
        let (v, l, d) = (self.vocab, self.seq_len, self.kv_pairs);
        let context = 2 * d;
        let space = (l - context) / 2;
        // p(i) ∝ a·i^(a−1), i = 1..=space.
        let weights: Vec<f64> = (1..=space)
            .map(|i| self.power_a * (i as f64).powf(self.power_a - 1.0))
            .collect();
        let key_vocab = v / 2;
        let mut inputs = Vec::with_capacity(n * l);
        let mut labels = Vec::with_capacity(n * l);
        for _ in 0..n {
            let keys: Vec<i64> = sample(&mut rng, key_vocab - 1, d)
                .into_iter()
                .map(|i| 1 + i as i64)
                .collect();
            let values: Vec<i64> = sample(&mut rng, v - key_vocab, d)
                .into_iter()
                .map(|i| (key_vocab + i) as i64)
                .collect();
            let gaps = weighted_sample_without_replacement(&mut rng, &weights, d);
            // The full sequence has L + 1 tokens; inputs drop the last, labels the first.
            let mut example = vec![0i64; l + 1];
            let mut label = vec![IGNORE; l + 1];
            for j in 0..d {
                example[2 * j] = keys[j];
                example[2 * j + 1] = values[j];
                example[context + 2 * gaps[j]] = keys[j];
                label[context + 2 * gaps[j] + 1] = values[j];
            }
            let mut x = example[..l].to_vec();
            if self.random_non_queries {
                for t in x.iter_mut().filter(|t| **t == 0) {
                    *t = rng.random_range(0..v as i64);
                }
            }
            inputs.extend(x);
            labels.extend_from_slice(&label[1..]);
        }
        MqarBatch {
            n,
            seq_len: l,
            inputs,
            labels,
        }
    }
}

/// `k` distinct indices of `weights`, drawn one after another with probability proportional to
/// the weights that remain (numpy's `choice(replace=False, p=…)`).
fn weighted_sample_without_replacement(rng: &mut StdRng, weights: &[f64], k: usize) -> Vec<usize> {
    let mut remaining = weights.to_vec();
    let mut picked = Vec::with_capacity(k);
    for _ in 0..k {
        let total: f64 = remaining.iter().sum();
        let mut target = rng.random::<f64>() * total;
        let mut choice = remaining.iter().rposition(|&w| w > 0.0).unwrap();
        for (i, &w) in remaining.iter().enumerate() {
            if w > 0.0 && target < w {
                choice = i;
                break;
            }
            target -= w;
        }
        remaining[choice] = 0.0;
        picked.push(choice);
    }
    picked
}

impl MqarBatch {
    /// Examples `range` of the batch.
    pub fn slice(&self, range: std::ops::Range<usize>) -> MqarBatch {
        let (a, b) = (range.start * self.seq_len, range.end * self.seq_len);
        MqarBatch {
            n: range.len(),
            seq_len: self.seq_len,
            inputs: self.inputs[a..b].to_vec(),
            labels: self.labels[a..b].to_vec(),
        }
    }
}
