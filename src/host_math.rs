//! Vector math for the kernels of backends whose tensors live in host memory (Flex, NdArray):
//! strided matrix products on `gemm` and a vectorised exponential on `pulp`, shared by the flash
//! scorer's kernel (`attention::host`) and the fused dynamics (`dynamics::fused`).

/// A matrix read from a slice with a row and a column stride.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with `cols` columns.
    pub(crate) fn rows(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub(crate) fn transposed(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            row_stride: 1,
            col_stride: cols,
        }
    }

    /// Whether a `rows × cols` matrix fits in the slice (false where its last element's offset
    /// does not fit a `usize`, which release builds would otherwise wrap).
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || last_offset(rows, cols, self.row_stride, self.col_stride)
                .is_some_and(|last| last < self.data.len())
    }
}

/// The offset of the last element of a non-empty `rows × cols` matrix with these strides, or
/// `None` where it overflows.
fn last_offset(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> Option<usize> {
    (rows - 1)
        .checked_mul(row_stride)?
        .checked_add((cols - 1).checked_mul(col_stride)?)
}

/// `dst = alpha·dst + beta·(a·b)` over `[m, n, k]` (`a`: `m × k`, `b`: `k × n`), `dst` row-major
/// with row stride `dst_stride`; `alpha` is 1 if `accumulate`, else `dst` is overwritten.
///
/// # Panics
/// If a matrix does not fit in its slice.
pub(crate) fn gemm(
    dst: &mut [f32],
    dst_stride: usize,
    accumulate: bool,
    a: Mat<'_>,
    b: Mat<'_>,
    [m, n, k]: [usize; 3],
    beta: f32,
) {
    // Rows of dst must not overlap (a stride below n would make gemm write one element twice).
    assert!(
        m <= 1 || dst_stride >= n,
        "gemm: dst's row stride {dst_stride} is below its {n} columns"
    );
    let fits =
        m == 0 || n == 0 || last_offset(m, n, dst_stride, 1).is_some_and(|last| last < dst.len());
    assert!(
        fits && a.holds(m, k) && b.holds(k, n),
        "gemm: a [{m}, {k}] · b [{k}, {n}] does not fit its slices"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|r| dst[r * dst_stride..][..n].fill(0.0));
        }
        return;
    }
    // SAFETY: the asserts above keep every element gemm reads or writes inside its slice: rows
    // `0..m` and columns `0..n` of dst, `0..m × 0..k` of a, `0..k × 0..n` of b, each at
    // `row·row_stride + col·col_stride`; dst is borrowed mutably, so no other matrix aliases it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `eˣ` lane by lane, within 2 ulp: Cody–Waite reduction `x = n·ln 2 + r` and a degree-6
/// polynomial for `eʳ` (Cephes' `expf` coefficients), `2ⁿ` built in the exponent bits. `−∞` and
/// anything below `ln` of the smallest normal float give 0; NaN stays NaN; above `ln f32::MAX` it
/// saturates near `f32::MAX`, not at `∞`, which keeps `1/(1 + eˣ)` (SiLU's σ, the affine scale's
/// tanh) at its limit 0 for large arguments.
#[inline(always)]
pub(crate) fn exp<S: pulp::Simd>(simd: S, x: S::f32s) -> S::f32s {
    const LOWEST: f32 = -87.33; // just above ln(f32::MIN_POSITIVE)
    const HIGHEST: f32 = 88.37; // just below ln(f32::MAX)
    // 1.5·2²³: adding it rounds to an integer n, which the sum holds in its low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let splat = |c: f32| simd.splat_f32s(c);
    let clamped = simd.min_f32s(simd.max_f32s(x, splat(LOWEST)), splat(HIGHEST));
    let rounded = simd.mul_add_f32s(clamped, splat(std::f32::consts::LOG2_E), splat(ROUND));
    let n = simd.sub_f32s(rounded, splat(ROUND));
    let r = simd.mul_add_f32s(n, splat(-0.693_359_4), clamped);
    let r = simd.mul_add_f32s(n, splat(2.121_944_4e-4), r);
    let mut p = splat(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = simd.mul_add_f32s(p, r, splat(c));
    }
    let p = simd.mul_add_f32s(simd.mul_f32s(p, r), r, simd.add_f32s(r, splat(1.0)));
    // `rounded`'s bits are 0x4B40_0000 + n for n in −126..=127; 2ⁿ's are (n + 127)·2²³.
    let exponent = simd.sub_u32s(
        simd.transmute_u32s_f32s(rounded),
        simd.splat_u32s(0x4B40_0000 - 127),
    );
    let two_n = simd.transmute_f32s_u32s(simd.mul_u32s(exponent, simd.splat_u32s(1 << 23)));
    let y = simd.mul_f32s(p, two_n);
    let y = simd.select_f32s(simd.less_than_f32s(x, splat(LOWEST)), splat(0.0), y);
    // NaN is the one value unequal to itself.
    simd.select_f32s(simd.equal_f32s(x, x), y, x)
}

/// `x ← eˣ` over a slice, a vector of the machine's width at a time ([`exp`]'s accuracy).
pub(crate) fn exp_in_place(values: &mut [f32]) {
    struct ExpInPlace<'a>(&'a mut [f32]);
    impl pulp::WithSimd for ExpInPlace<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, simd: S) {
            let (vectors, tail) = S::as_mut_simd_f32s(self.0);
            for x in vectors {
                *x = exp(simd, *x);
            }
            let scalar = pulp::Scalar::new();
            for x in tail {
                *x = exp(scalar, *x);
            }
        }
    }
    pulp::Arch::new().dispatch(ExpInPlace(values));
}

/// `erf(x)` lane by lane, within 1e-6: `x·P(x²)/Q(x²)` on `x` clamped to `[−4, 4]`, the rational
/// approximation of Eigen's `generic_fast_erf_float`. Beyond the clamp it gives `±0.9999999`
/// (true `erf` is `±1` in `f32` there), so exact GELU at `x ≤ −5.7` is `~6e-8·x`, not 0.
#[inline(always)]
pub(crate) fn erf<S: pulp::Simd>(simd: S, x: S::f32s) -> S::f32s {
    let splat = |c: f32| simd.splat_f32s(c);
    let x = simd.min_f32s(simd.max_f32s(x, splat(-4.0)), splat(4.0));
    let x2 = simd.mul_f32s(x, x);
    let mut p = splat(-2.726_142_3e-10);
    for c in [
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_5e-5,
        -7.349_906_3e-4,
        -2.954_600_1e-3,
        -1.609_603_3e-2,
    ] {
        p = simd.mul_add_f32s(x2, p, splat(c));
    }
    let p = simd.mul_f32s(x, p);
    let mut q = splat(-1.456_607_2e-5);
    for c in [-2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = simd.mul_add_f32s(x2, q, splat(c));
    }
    simd.div_f32s(p, q)
}

/// GELU and its derivative at `x`, lane by lane: the exact form `x·Φ(x)` or GPT-2's tanh
/// approximation.
#[inline(always)]
fn gelu_and_slope<S: pulp::Simd>(simd: S, x: S::f32s, approximate: bool) -> (S::f32s, S::f32s) {
    let splat = |c: f32| simd.splat_f32s(c);
    let half = splat(0.5);
    if approximate {
        // u = c·(x + a·x³), t = tanh(u) = 1 − 2/(e^{2u} + 1), y = x·(1 + t)/2,
        // y' = (1 + t)/2 + x·(1 − t²)·c·(1 + 3a·x²)/2.
        const C: f32 = 0.797_884_6; // √(2/π)
        const A: f32 = 0.044_715;
        let x2 = simd.mul_f32s(x, x);
        let u = simd.mul_f32s(
            simd.mul_f32s(splat(C), x),
            simd.mul_add_f32s(splat(A), x2, splat(1.0)),
        );
        let e = exp(simd, simd.add_f32s(u, u));
        let t = simd.sub_f32s(
            splat(1.0),
            simd.div_f32s(splat(2.0), simd.add_f32s(e, splat(1.0))),
        );
        let one_plus_t = simd.add_f32s(splat(1.0), t);
        let y = simd.mul_f32s(simd.mul_f32s(half, x), one_plus_t);
        let du = simd.mul_f32s(splat(C), simd.mul_add_f32s(splat(3.0 * A), x2, splat(1.0)));
        let sech2 = simd.sub_f32s(splat(1.0), simd.mul_f32s(t, t));
        let slope = simd.mul_add_f32s(
            simd.mul_f32s(half, x),
            simd.mul_f32s(sech2, du),
            simd.mul_f32s(half, one_plus_t),
        );
        (y, slope)
    } else {
        // Φ = (1 + erf(x/√2))/2, φ = e^{−x²/2}/√(2π); y = x·Φ, y' = Φ + x·φ.
        let cdf = simd.mul_f32s(
            half,
            simd.add_f32s(
                splat(1.0),
                erf(
                    simd,
                    simd.mul_f32s(x, splat(std::f32::consts::FRAC_1_SQRT_2)),
                ),
            ),
        );
        let minus_half_x2 = simd.mul_f32s(simd.mul_f32s(x, x), splat(-0.5));
        let pdf = simd.mul_f32s(exp(simd, minus_half_x2), splat(0.398_942_3)); // 1/√(2π)
        (simd.mul_f32s(x, cdf), simd.mul_add_f32s(x, pdf, cdf))
    }
}

/// `out = gelu(x)`, or with `slope` the derivative times `out`'s values in place (`out ←
/// out·gelu'(x)`, the backward pass).
struct Gelu<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
    approximate: bool,
    slope: bool,
}

impl pulp::WithSimd for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let Gelu {
            x,
            out,
            approximate,
            slope,
        } = self;
        let (x_vectors, x_tail) = S::as_simd_f32s(x);
        let (out_vectors, out_tail) = S::as_mut_simd_f32s(out);
        for (x, out) in x_vectors.iter().zip(out_vectors) {
            let (y, dy) = gelu_and_slope(simd, *x, approximate);
            *out = if slope { simd.mul_f32s(*out, dy) } else { y };
        }
        let scalar = pulp::Scalar::new();
        for (&x, out) in x_tail.iter().zip(out_tail) {
            let (y, dy) = gelu_and_slope(scalar, x, approximate);
            *out = if slope { *out * dy } else { y };
        }
    }
}

/// `out = gelu(x)` (exact, or the tanh approximation), vectorised.
///
/// # Panics
/// If the slices' lengths differ.
pub(crate) fn gelu(x: &[f32], out: &mut [f32], approximate: bool) {
    assert_eq!(x.len(), out.len(), "gelu: input and output lengths");
    pulp::Arch::new().dispatch(Gelu {
        x,
        out,
        approximate,
        slope: false,
    });
}

/// `grad ← grad·gelu'(x)` in place, vectorised: the backward pass of [`gelu`].
///
/// # Panics
/// If the slices' lengths differ.
pub(crate) fn gelu_backward(x: &[f32], grad: &mut [f32], approximate: bool) {
    assert_eq!(
        x.len(),
        grad.len(),
        "gelu_backward: input and gradient lengths"
    );
    pulp::Arch::new().dispatch(Gelu {
        x,
        out: grad,
        approximate,
        slope: true,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised exponential is within 2 ulp of the standard library's over the range the
    /// kernel feeds it, and exact at its edges.
    #[test]
    fn exp_matches_the_standard_library() {
        let mut worst = 0.0f64;
        let exp = |x: f32| exp(pulp::Scalar::new(), x);
        for i in 0..=200_000 {
            let x = -87.0 + 97.0 * i as f32 / 200_000.0;
            let (got, expected) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - expected) / expected).abs());
        }
        assert!(worst < 2.5e-7, "largest relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// The vectorised erf is within 1e-6 of erf in f64, out to where it is ±1 in f32.
    #[test]
    fn erf_matches_the_reference() {
        let erf = |x: f32| erf(pulp::Scalar::new(), x);
        let mut worst = 0.0f64;
        for i in 0..=120_000 {
            let x = -6.0 + 12.0 * i as f64 / 120_000.0;
            worst = worst.max((erf(x as f32) as f64 - libm_erf(x)).abs());
        }
        assert!(worst < 1e-6, "largest error {worst}");
        assert_eq!(erf(0.0), 0.0);
        assert!((erf(30.0) - 1.0).abs() < 1e-6 && (erf(-30.0) + 1.0).abs() < 1e-6);
    }

    /// erf in f64 from its Maclaurin series (|x| ≤ 3) and continued fraction (beyond), each
    /// accurate to far below f32's precision there.
    fn libm_erf(x: f64) -> f64 {
        let a = x.abs();
        let value = if a <= 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = e^{−a²}/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + 2/(a + …)))))
            let mut fraction = a;
            for k in (1..60).rev() {
                fraction = a + (k as f64 / 2.0) / fraction;
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / fraction
        };
        value.copysign(x)
    }

    /// GELU and its derivative, both forms, against the formulas in f64 (the derivative also by
    /// central differences).
    #[test]
    fn gelu_and_its_slope_match_the_formulas() {
        let xs: Vec<f32> = (0..2001).map(|i| -10.0 + i as f32 * 0.01).collect();
        for approximate in [false, true] {
            let reference = |x: f64| {
                if approximate {
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
                } else {
                    0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2))
                }
            };
            let mut y = vec![0.0; xs.len()];
            gelu(&xs, &mut y, approximate);
            let mut slope = vec![1.0; xs.len()];
            gelu_backward(&xs, &mut slope, approximate);
            for ((&x, &y), &dy) in xs.iter().zip(&y).zip(&slope) {
                let x64 = x as f64;
                let expected = reference(x64);
                assert!(
                    (y as f64 - expected).abs() < 2e-6 * (1.0 + expected.abs()),
                    "gelu({x}) = {y}, expected {expected}"
                );
                let h = 1e-4;
                let numeric = (reference(x64 + h) - reference(x64 - h)) / (2.0 * h);
                assert!(
                    (dy as f64 - numeric).abs() < 2e-5,
                    "gelu'({x}) = {dy}, expected {numeric} (approximate {approximate})"
                );
            }
        }
    }

    /// `exp_in_place` exponentiates every element, the remainder past the last full vector too.
    #[test]
    fn exp_in_place_covers_every_element() {
        let mut values: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 4.0).collect();
        exp_in_place(&mut values);
        for (i, x) in values.iter().enumerate() {
            let expected = (i as f32 * 0.25 - 4.0).exp();
            assert!(
                (x - expected).abs() <= 1e-6 * expected,
                "element {i}: {x} vs {expected}"
            );
        }
    }

    /// The product's bounds are checked without wrapping, and a destination whose rows overlap
    /// is refused rather than written twice.
    #[test]
    fn gemm_refuses_what_does_not_fit() {
        let a = [1.0f32; 4];
        let b = [1.0f32; 4];
        let mut dst = [0.0f32; 8];
        gemm(
            &mut dst,
            2,
            false,
            Mat::rows(&a, 2),
            Mat::rows(&b, 2),
            [2, 2, 2],
            1.0,
        );
        assert_eq!(&dst[..4], [2.0; 4]);
        assert_eq!(last_offset(usize::MAX, 2, 2, 1), None);
        assert_eq!(last_offset(3, 4, 10, 1), Some(23));
        // A stride so large that the last offset wraps to a small number in release builds.
        let huge = Mat {
            data: &a,
            row_stride: usize::MAX / 2 + 1,
            col_stride: 1,
        };
        assert!(!huge.holds(3, 1));
        let overlapping = std::panic::catch_unwind(|| {
            let mut dst = [0.0f32; 8];
            gemm(
                &mut dst,
                1,
                false,
                Mat::rows(&a, 2),
                Mat::rows(&b, 2),
                [2, 2, 2],
                1.0,
            );
        });
        let message = overlapping.unwrap_err();
        let message = message.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("row stride 1 is below its 2 columns"),
            "{message}"
        );
    }
}
