//! Text generation with the cache: a small sampler (greedy, temperature, top-k, top-p, a seed,
//! stop tokens, a token budget) over [`Gpt::forward_cache`]. No tokenizer: ids in, ids out.

use super::gpt::{Gpt, GptCache};
use crate::error::ConfigError;
use burn::config::Config;
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

/// How [`Gpt::generate`] picks each next token.
#[derive(Config, Debug, PartialEq)]
pub struct SamplerConfig {
    /// At most this many new tokens.
    #[config(default = 64)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 picks the most likely token (greedy).
    #[config(default = 1.0)]
    pub temperature: f64,
    /// Sample only among the `k` most likely tokens.
    #[config(default = "None")]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to `p` (nucleus).
    #[config(default = "None")]
    pub top_p: Option<f64>,
    /// The seed of the sampler's own generator: the same seed gives the same tokens.
    #[config(default = 0)]
    pub seed: u64,
    /// Stop after generating any of these (it is included in the output).
    #[config(default = "Vec::new()")]
    pub stop_tokens: Vec<u32>,
}

const NAME: &str = "SamplerConfig";

impl SamplerConfig {
    /// Checks every field; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ConfigError::new(
                NAME,
                "temperature",
                self.temperature,
                "must be finite and >= 0 (0 is greedy)",
            ));
        }
        if self.top_k == Some(0) {
            return Err(ConfigError::new(NAME, "top_k", 0, "must be at least 1"));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ConfigError::new(NAME, "top_p", p, "must be in (0, 1]"));
        }
        Ok(())
    }

    /// The next token from `logits` (one per vocabulary entry), drawing from `rng`.
    fn pick(&self, logits: &[f32], rng: &mut SplitMix64) -> u32 {
        let argmax = || {
            logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i as u32)
        };
        if self.temperature == 0.0 {
            return argmax();
        }
        // Candidates by probability, most likely first.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut candidates: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l as f64 - max) / self.temperature).exp()))
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        if let Some(k) = self.top_k {
            candidates.truncate(k);
        }
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        if let Some(p) = self.top_p {
            let mut mass = 0.0;
            let keep = candidates
                .iter()
                .position(|c| {
                    mass += c.1 / total;
                    mass >= p
                })
                .map_or(candidates.len(), |i| i + 1);
            candidates.truncate(keep);
        }
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        if !(total.is_finite() && total > 0.0) {
            return argmax();
        }
        let mut draw = rng.next_f64() * total;
        for (id, weight) in &candidates {
            draw -= weight;
            if draw < 0.0 {
                return *id;
            }
        }
        candidates.last().map_or_else(argmax, |c| c.0)
    }
}

/// SplitMix64: a small, seedable generator, so that sampling depends on the seed alone (not on
/// the backend's generator, which training reseeds).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl<B: Backend> Gpt<B> {
    /// Continues `prompt` with up to `sampler.max_new_tokens` tokens, decoding incrementally with
    /// a cache (the prompt in one pass, then one token a step), and calls `on_token` with each new
    /// token as it is chosen. Stops early at a stop token or when the context is full. Returns the
    /// new tokens.
    ///
    /// # Errors
    /// An invalid sampler, an empty prompt, a prompt token outside the vocabulary or a prompt
    /// longer than the context; the error names which.
    pub fn generate(
        &self,
        prompt: &[u32],
        sampler: &SamplerConfig,
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, ConfigError> {
        sampler.validate()?;
        let vocab = self.tokens.weight.dims()[0];
        if prompt.is_empty() {
            return Err(ConfigError::new(
                "generate",
                "prompt",
                "[]",
                "give at least one token",
            ));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ConfigError::new(
                "generate",
                "prompt",
                bad,
                format!("token ids must be below the vocabulary size {vocab}"),
            ));
        }
        if prompt.len() > self.context {
            return Err(ConfigError::new(
                "generate",
                "prompt",
                format!("{} tokens", prompt.len()),
                format!("must fit the context of {}", self.context),
            ));
        }
        let device = self.tokens.weight.device();
        let ids = |tokens: &[u32]| {
            let data: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
            Tensor::<B, 2, Int>::from_data(TensorData::new(data, [1, tokens.len()]), &device)
        };
        let mut rng = SplitMix64(sampler.seed);
        let mut cache = GptCache::new();
        let mut input = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < sampler.max_new_tokens && cache.len() + input.len() <= self.context {
            let logits = self.forward_cache(ids(&input), &mut cache); // [1, n, vocab]
            let n = input.len();
            let last: Vec<f32> = logits
                .slice([0..1, n - 1..n])
                .into_data()
                .convert::<f32>()
                .to_vec()
                .expect("logits convert to f32");
            let next = sampler.pick(&last, &mut rng);
            on_token(next);
            out.push(next);
            if sampler.stop_tokens.contains(&next) {
                break;
            }
            input = vec![next];
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![0.1, 2.0, -1.0, 1.9, 0.5]
    }

    #[test]
    fn greedy_top_1_and_a_tiny_nucleus_pick_the_argmax() {
        let mut rng = SplitMix64(7);
        let greedy = SamplerConfig::new().with_temperature(0.0);
        let top1 = SamplerConfig::new().with_top_k(Some(1));
        let nucleus = SamplerConfig::new().with_top_p(Some(1e-6));
        for sampler in [greedy, top1, nucleus] {
            for _ in 0..20 {
                assert_eq!(sampler.pick(&logits(), &mut rng), 1, "{sampler:?}");
            }
        }
    }

    #[test]
    fn sampling_follows_the_softmax_and_top_k_cuts_the_tail() {
        let sampler = SamplerConfig::new();
        let mut rng = SplitMix64(1);
        let mut counts = [0usize; 5];
        let n = 20_000;
        for _ in 0..n {
            counts[sampler.pick(&logits(), &mut rng) as usize] += 1;
        }
        let z: f64 = logits().iter().map(|&l| (l as f64).exp()).sum();
        for (i, &l) in logits().iter().enumerate() {
            let expected = (l as f64).exp() / z;
            let got = counts[i] as f64 / n as f64;
            assert!(
                (got - expected).abs() < 0.015,
                "token {i}: {got} vs {expected}"
            );
        }
        let top2 = SamplerConfig::new().with_top_k(Some(2));
        for _ in 0..500 {
            assert!([1, 3].contains(&top2.pick(&logits(), &mut rng)));
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let field = |s: SamplerConfig| s.validate().unwrap_err().field;
        assert_eq!(
            field(SamplerConfig::new().with_temperature(-1.0)),
            "temperature"
        );
        assert_eq!(field(SamplerConfig::new().with_top_k(Some(0))), "top_k");
        assert_eq!(field(SamplerConfig::new().with_top_p(Some(1.5))), "top_p");
    }
}
