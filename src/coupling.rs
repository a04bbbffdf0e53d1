//! The coupling net `f`, the learned force of the query-key dynamics.

use crate::error::{ConfigError, or_panic};
use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::activation::silu;
use burn::tensor::module::linear;
use burn::tensor::{Tensor, backend::Backend};

/// Configuration of a [`CouplingNet`], built by [`init`](CouplingNetConfig::init).
#[derive(Config, Debug)]
pub struct CouplingNetConfig {
    /// The size of each head's query and key (`d_head`): the net's input and output width.
    pub d_head: usize,
    /// The hidden width. `None` means `d_head`, which keeps the extra parameters at ≈0.11% of
    /// the 60M model, as in the paper.
    #[config(default = "None")]
    pub d_hidden: Option<usize>,
    /// How many independent nets: 1 (one per layer, shared by all heads: the paper's setting) or
    /// the layer's number of heads (one per head).
    #[config(default = 1)]
    pub n_nets: usize,
    /// The initializer of the weights (biases start at zero). The default is the one of Burn's
    /// `Linear`: uniform in `±1/√fan_in` (gain `1/√3`).
    #[config(default = "Initializer::KaimingUniform{gain:0.5773502691896258, fan_out_only:false}")]
    pub initializer: Initializer,
}

/// The coupling net of *Coupled Query-Key Dynamics for Attention* (Gahtan & Bronstein, 2026):
/// a two-layer MLP `d_head → d_hidden → d_head` with SiLU,
///
/// ```text
/// f(q) = W₂·silu(W₁·q + b₁) + b₂
/// ```
///
/// applied to every token of every head. With one net (the default) its weights are shared by
/// all heads of a layer and it runs as one product over `[batch, seq·heads, d_head]` (batched over
/// `batch`, so that CPU backends can parallelise its weight gradient); with one net per head, as
/// a batched product over heads.
///
/// # Params
/// - `w1`: `[n_nets, d_head, d_hidden]`, `b1`: `[n_nets, d_hidden]`
/// - `w2`: `[n_nets, d_hidden, d_head]`, `b2`: `[n_nets, d_head]`
#[derive(Module, Debug)]
pub struct CouplingNet<B: Backend> {
    /// Input weights, `[n_nets, d_head, d_hidden]`.
    pub w1: Param<Tensor<B, 3>>,
    /// Input bias, `[n_nets, d_hidden]`.
    pub b1: Param<Tensor<B, 2>>,
    /// Output weights, `[n_nets, d_hidden, d_head]`.
    pub w2: Param<Tensor<B, 3>>,
    /// Output bias, `[n_nets, d_head]`.
    pub b2: Param<Tensor<B, 2>>,
}

impl CouplingNetConfig {
    /// Checks every field; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, value: usize, rule: &str| {
            Err(ConfigError::new("CouplingNetConfig", field, value, rule))
        };
        if self.d_head == 0 {
            return err("d_head", 0, "must be at least 1");
        }
        if self.d_hidden == Some(0) {
            return err("d_hidden", 0, "must be at least 1, or None for d_head");
        }
        if self.n_nets == 0 {
            return err(
                "n_nets",
                0,
                "must be 1 (shared by all heads) or the number of heads",
            );
        }
        Ok(())
    }

    /// The hidden width, with `None` resolved to `d_head`.
    pub fn hidden(&self) -> usize {
        self.d_hidden.unwrap_or(self.d_head)
    }

    /// Builds the net, or says which field is invalid.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<CouplingNet<B>, ConfigError> {
        self.validate()?;
        let (n, d, h) = (self.n_nets, self.d_head, self.hidden());
        Ok(CouplingNet {
            w1: self
                .initializer
                .init_with([n, d, h], Some(d), Some(h), device),
            b1: Initializer::Zeros.init([n, h], device),
            w2: self
                .initializer
                .init_with([n, h, d], Some(h), Some(d), device),
            b2: Initializer::Zeros.init([n, d], device),
        })
    }

    /// Builds the net.
    ///
    /// # Panics
    /// If a field is invalid (see [`validate`](Self::validate)).
    pub fn init<B: Backend>(&self, device: &B::Device) -> CouplingNet<B> {
        or_panic(self.try_init(device))
    }
}

impl<B: Backend> CouplingNet<B> {
    /// The number of independent nets (1 when shared by all heads).
    pub fn n_nets(&self) -> usize {
        self.w1.dims()[0]
    }

    /// Applies `f` to every token of every head.
    ///
    /// # Shapes
    /// - input: `[batch, seq, heads, d_head]` (token-major, as the projections produce it)
    /// - output: `[batch, seq, heads, d_head]`
    ///
    /// # Panics
    /// If the input's last dimension is not `d_head`, or the net is per head and the input's
    /// head count differs.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.apply(x, self.w2.val(), self.b2.val())
    }

    /// `scale·f(x)`, with the scale folded into the output layer (`scale·W₂`, `scale·b₂`): a
    /// product over the weights instead of one over every token. The coupled dynamics use it for
    /// `dt·f(q)`.
    ///
    /// # Shapes
    /// - input: `[batch, seq, heads, d_head]`; output: the same
    /// - `scale`: `[1]` (one scale for all nets) or `[n_nets]` (one per net)
    ///
    /// # Panics
    /// As [`forward`](Self::forward), or if `scale` has another length.
    pub fn forward_scaled(&self, x: Tensor<B, 4>, scale: Tensor<B, 1>) -> Tensor<B, 4> {
        let [s] = scale.dims();
        let n = self.n_nets();
        assert!(
            s == 1 || s == n,
            "CouplingNet::forward_scaled: the scale has {s} entries; expected 1 or n_nets = {n}"
        );
        let w2 = self.w2.val() * scale.clone().reshape([s, 1, 1]);
        let b2 = self.b2.val() * scale.reshape([s, 1]);
        self.apply(x, w2, b2)
    }

    /// `f` with the given output layer.
    fn apply(&self, x: Tensor<B, 4>, w2: Tensor<B, 3>, b2: Tensor<B, 2>) -> Tensor<B, 4> {
        let [n, d, h] = self.w1.dims();
        let [batch, seq, heads, d_in] = x.dims();
        assert_eq!(
            d_in,
            d,
            "CouplingNet: expected input [batch, seq, heads, d_head = {d}], got {:?}",
            [batch, seq, heads, d_in]
        );
        if n == 1 {
            // One product over all tokens of all heads: the cheap, shared case. Rows stay grouped
            // by batch: the weight gradient `xᵀ·grad` is then a batched product over `batch`
            // (parallel on CPU backends) rather than one product with 64 × 64 outputs and a
            // reduction over every token, which a CPU GEMM runs on one thread.
            let x = x.reshape([batch, seq * heads, d]);
            let w1 = self.w1.val().reshape([d, h]);
            let hidden = silu(linear(x, w1, Some(self.b1.val().reshape([h]))));
            linear(hidden, w2.reshape([h, d]), Some(b2.reshape([d])))
                .reshape([batch, seq, heads, d])
        } else {
            assert_eq!(
                heads,
                n,
                "CouplingNet: {n} per-head nets need input [batch, seq, heads = {n}, d_head], got {:?}",
                [batch, seq, heads, d_in]
            );
            let x = x.swap_dims(1, 2); // [batch, heads, seq, d]
            let w1 = self.w1.val().unsqueeze::<4>(); // [1, heads, d, h]
            let w2 = w2.unsqueeze::<4>(); // [1, heads, h, d]
            let b1 = self.b1.val().reshape([1, n, 1, h]);
            let b2 = b2.reshape([1, n, 1, d]);
            let hidden = silu(x.matmul(w1) + b1);
            (hidden.matmul(w2) + b2).swap_dims(1, 2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tolerance};

    type TestBackend = Flex;

    #[test]
    fn shared_net_has_the_papers_parameter_count() {
        // 64·64·2 + 64 + 64 per layer: one net shared by the heads, d_head → d_head → d_head.
        let net = CouplingNetConfig::new(64).init::<TestBackend>(&Default::default());
        assert_eq!(net.num_params(), 64 * 64 * 2 + 64 + 64);
    }

    #[test]
    fn per_head_nets_equal_their_shared_slices() {
        let device = Default::default();
        let per_head = CouplingNetConfig::new(4)
            .with_d_hidden(Some(6))
            .with_n_nets(3)
            .init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
        let out = per_head.forward(x.clone());
        for head in 0..3 {
            let shared = CouplingNet::<TestBackend> {
                w1: Param::from_tensor(per_head.w1.val().slice(head..head + 1)),
                b1: Param::from_tensor(per_head.b1.val().slice(head..head + 1)),
                w2: Param::from_tensor(per_head.w2.val().slice(head..head + 1)),
                b2: Param::from_tensor(per_head.b2.val().slice(head..head + 1)),
            };
            let expected = shared.forward(x.clone().slice([0..2, 0..5, head..head + 1]));
            out.clone()
                .slice([0..2, 0..5, head..head + 1])
                .into_data()
                .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
        }
    }

    #[test]
    fn forward_scaled_is_the_scale_times_forward() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
        for n_nets in [1, 3] {
            let net = CouplingNetConfig::new(4)
                .with_n_nets(n_nets)
                .init::<TestBackend>(&device);
            // One scale for every net, then (with per-head nets) one per net.
            let mut scales = vec![vec![0.37]];
            if n_nets == 3 {
                scales.push(vec![0.5, -2.0, 0.1]);
            }
            for scale in scales {
                let n = scale.len();
                let scale = Tensor::<TestBackend, 1>::from_floats(scale.as_slice(), &device);
                let expected = net.forward(x.clone()) * scale.clone().reshape([1, 1, n, 1]);
                net.forward_scaled(x.clone(), scale)
                    .into_data()
                    .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
            }
        }
    }

    #[test]
    #[should_panic(expected = "expected 1 or n_nets = 1")]
    fn a_scale_per_head_for_a_shared_net_panics() {
        let device = Default::default();
        let net = CouplingNetConfig::new(4).init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 4>::zeros([1, 2, 3, 4], &device);
        net.forward_scaled(x, Tensor::from_floats([0.1, 0.2, 0.3], &device));
    }

    #[test]
    fn zero_sizes_are_rejected_with_the_field_name() {
        let err = CouplingNetConfig::new(0)
            .try_init::<TestBackend>(&Default::default())
            .unwrap_err();
        assert_eq!(err.field, "d_head");
        let err = CouplingNetConfig::new(8)
            .with_d_hidden(Some(0))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("`d_hidden` = 0"), "{err}");
    }

    #[test]
    #[should_panic(expected = "d_head = 8")]
    fn wrong_width_panics_with_the_expected_shape() {
        let device = Default::default();
        let net = CouplingNetConfig::new(8).init::<TestBackend>(&device);
        net.forward(Tensor::zeros([1, 2, 3, 4], &device));
    }
}
