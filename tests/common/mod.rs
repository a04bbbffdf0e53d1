//! Helpers shared by the integration tests.
// Each test binary mounts this module and uses a different subset of it.
#![allow(dead_code)]

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use coupled_qk::CouplingNet;

/// `module` with every parameter initialised. Burn initialises parameters lazily, and a clone
/// of an uninitialised parameter draws its own values: a module that is cloned to compare with
/// must have its values first.
pub fn materialised<B: Backend, M: Module<B>>(module: M) -> M {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
    module
}

/// The fast CPU backend, f32.
pub type Cpu = Flex;
/// With autodiff, for Jacobians and gradient checks on f64 tensors (Flex picks the element type
/// per tensor: see [`tensor`]).
pub type Ad64 = Autodiff<Flex>;
/// Without autodiff, for finite differences on f64 tensors.
pub type Cpu64 = Flex;

/// An f64 tensor (whatever the backend's default float type).
pub fn tensor<B: Backend, const D: usize>(
    values: &[f64],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), shape),
        (device, DType::F64),
    )
}

pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// How many weights a `d → h → d` coupling net has.
pub fn net_size(d: usize, h: usize) -> usize {
    2 * d * h + h + d
}

/// A shared coupling net `d → h → d` with the given weights, in the order w1, b1, w2, b2.
pub fn net<B: Backend>(d: usize, h: usize, w: &[f64], device: &B::Device) -> CouplingNet<B> {
    assert_eq!(w.len(), net_size(d, h));
    let (w1, rest) = w.split_at(d * h);
    let (b1, rest) = rest.split_at(h);
    let (w2, b2) = rest.split_at(h * d);
    CouplingNet {
        w1: Param::from_tensor(tensor(w1, [1, d, h], device)),
        b1: Param::from_tensor(tensor(b1, [1, h], device)),
        w2: Param::from_tensor(tensor(w2, [1, h, d], device)),
        b2: Param::from_tensor(tensor(b2, [1, d], device)),
    }
}

/// Determinant by Gaussian elimination with partial pivoting.
pub fn det(mut m: Vec<Vec<f64>>) -> f64 {
    let n = m.len();
    let mut det = 1.0;
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
            .unwrap();
        if m[pivot][col] == 0.0 {
            return 0.0;
        }
        if pivot != col {
            m.swap(pivot, col);
            det = -det;
        }
        det *= m[col][col];
        let pivot_row = m[col].clone();
        for row in m.iter_mut().skip(col + 1) {
            let factor = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= factor * p;
            }
        }
    }
    det
}

/// f32 values uniform in `[−half_width, half_width)` from `seed` alone (splitmix64), on
/// `device`: the backend's generator is global, and a test running at once in another thread
/// could reseed it between a seed and a draw.
pub fn fixed_uniform<B: Backend, const R: usize>(
    shape: [usize; R],
    seed: u64,
    half_width: f64,
    device: &B::Device,
) -> Tensor<B, R> {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let unit = (z >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            (half_width * (2.0 * unit - 1.0)) as f32
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}
