//! torchao's tinygemm qparams and quantization, emulated operation by operation.
//!
//! torchao (`quant_primitives.py`: `_choose_qparams_affine_tinygemm`,
//! `_quantize_affine_tinygemm`) computes, per group of `g` consecutive k:
//!
//! ```text
//! mn = amin(group); mx = amax(group)          # no forced 0 (preserve_zero = False)
//! scale = clamp((mx - mn) / 15, min = eps)
//! zero  = mn + scale * 8                      # float zero point, mid_point = 8
//! min_val = zero - scale * 8
//! u = clamp(round_half_even((x - min_val) / scale), 0, 15)
//! ```
//!
//! The bits depend on the dtype each eager PyTorch op runs in, so both entry points are
//! reproduced exactly:
//!
//! * [`QParamsPath::Bf16`] (bf16 input; `Int4TilePackedTo4dTensor.from_hp`, torchao v2):
//!   every elementwise op computes in f32 and rounds its result to bf16.
//! * [`QParamsPath::F32`] (f32 input; `get_groupwise_affine_qparams(w, dtype=bf16)` +
//!   `groupwise_affine_quantize_tensor_from_qparams`, the v1 / gpt-fast path): scale and
//!   zero are computed in f32 (the zero from the *unrounded* scale) and only then rounded to
//!   bf16; quantization runs in f32 with the bf16 scale, except `min_val = zero − scale·8`,
//!   which PyTorch evaluates on two bf16 tensors and so rounds to bf16.
//!
//! `x / 15.0` divides by a CPU scalar, which PyTorch's CUDA kernel (`BinaryDivTrueKernel.cu`)
//! evaluates as `x * (1.0f / 15.0f)`. The whole tinygemm pipeline runs on CUDA (there is no
//! CPU `_convert_weight_to_int4pack`), so that is what is emulated. On bf16 data it equals
//! a true division (checked over every bf16 value); on f32 data it can differ from a CPU
//! run by one f32 ulp of the scale.
//!
//! NaN: `amin`/`amax` propagate it, so a group holding a NaN gets a NaN scale and zero, and
//! `clamp(NaN)` stays NaN; the cast of NaN to int32 on CUDA (`cvt.rzi.s32.f32`) gives 0,
//! so its nibbles are 0. Infinities follow IEEE arithmetic (a group holding ±∞ gets an
//! infinite scale and its nibbles become 0 through `∞ − ∞ = NaN`).
//!
//! ```
//! use fmt_int4tiled::qparams::{quantize_group, QParamsPath, EPS_V2};
//! let xs: Vec<f32> = (0..32).map(|i| i as f32 / 2.0).collect(); // bf16-exact values
//! let mut u = [0u8; 32];
//! let (scale, zero) = quantize_group(QParamsPath::Bf16, &xs, EPS_V2, &mut u);
//! assert_eq!(scale.to_f32(), 1.03125); // bf16(15.5 / 15)
//! assert_eq!(zero.to_f32(), 8.25);    // bf16(0 + 8 * scale)
//! assert_eq!((u[0], u[31]), (0, 15));
//! ```

use half::bf16;

/// `1.0f / 15.0f`, the reciprocal PyTorch's CUDA division by the scalar 15 multiplies by.
pub const RCP_15: f32 = 1.0 / 15.0;

/// The default eps of torchao v2 (`Int4TilePackedTo4dTensor`): it passes none, so
/// `torch.finfo(torch.bfloat16).smallest_normal` = 2⁻¹²⁶.
pub const EPS_V2: f32 = f32::MIN_POSITIVE;

/// The eps of torchao v1 (`get_groupwise_affine_qparams`, `Int4CPULayout`): `1e-6`.
pub const EPS_V1: f32 = 1e-6;

/// Which PyTorch dtype semantics the qparam arithmetic follows (chosen by the input dtype:
/// bf16 → [`QParamsPath::Bf16`], f32 and f16 → [`QParamsPath::F32`]).
///
/// f16 input is widened exactly to f32 and takes the f32 path. torchao v2 refuses f16,
/// and v1 would run every op in f16; that path is not emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QParamsPath {
    /// Eager bf16 ops: each op in f32, its result rounded to bf16.
    Bf16,
    /// f32 ops, scale and zero rounded to bf16 at the end.
    F32,
}

impl QParamsPath {
    /// The path for an input of `dtype` (bf16 -> `Bf16`, anything else -> `F32`).
    ///
    /// ```
    /// use fmt_int4tiled::qparams::QParamsPath;
    /// use quant_core::DType;
    /// assert_eq!(QParamsPath::for_input(DType::BF16), QParamsPath::Bf16);
    /// assert_eq!(QParamsPath::for_input(DType::F16), QParamsPath::F32);
    /// ```
    pub fn for_input(dtype: quant_core::DType) -> QParamsPath {
        if dtype == quant_core::DType::BF16 {
            QParamsPath::Bf16
        } else {
            QParamsPath::F32
        }
    }
}

/// Rounds to bf16 and back (what every eager bf16 op does to its result): round to
/// nearest even, NaN stays NaN (quiet bit set, as `bf16::from_f32`). Branchless, so
/// loops over it vectorize.
///
/// ```
/// use fmt_int4tiled::qparams::rb;
/// for x in [1.0f32 + f32::EPSILON, 3.14159, -65504.5, f32::MAX, f32::NAN, f32::INFINITY] {
///     let want = half::bf16::from_f32(x).to_f32();
///     assert_eq!(rb(x).to_bits(), want.to_bits());
/// }
/// ```
#[inline(always)]
pub fn rb(x: f32) -> f32 {
    quant_core::dtype::f32_from_bf16_bits(quant_core::dtype::bf16_bits(x))
}

/// `amin` / `amax` with NaN propagation, as `torch.amin` / `torch.amax` do.
///
/// Sixteen independent lanes of compare-and-select, folded at the end: a single running
/// `f32::min` is a loop-carried reduction LLVM leaves scalar (the hottest line of the
/// int4 quantize profile). NaN is tracked on the side, so the selects never see it win.
/// The sign of a zero extreme may differ from a sequential fold; no qparam depends on it
/// (`mn + 8·scale` and `mx − mn` are the same for `±0`).
#[inline(always)]
pub fn min_max(xs: &[f32]) -> (f32, f32) {
    const L: usize = 16;
    let mut mn = [f32::INFINITY; L];
    let mut mx = [f32::NEG_INFINITY; L];
    let mut nan = [false; L];
    let mut chunks = xs.chunks_exact(L);
    for c in &mut chunks {
        for (l, &x) in c.iter().enumerate() {
            nan[l] |= x.is_nan();
            mn[l] = if x < mn[l] { x } else { mn[l] };
            mx[l] = if x > mx[l] { x } else { mx[l] };
        }
    }
    let (mut lo, mut hi, mut any_nan) = (f32::INFINITY, f32::NEG_INFINITY, false);
    for &x in chunks.remainder() {
        any_nan |= x.is_nan();
        lo = if x < lo { x } else { lo };
        hi = if x > hi { x } else { hi };
    }
    // Fold the lanes as a tree (halves, quarters, ...): four vector steps where a
    // lane-by-lane fold was a 32-step scalar chain per group. The lanes hold no NaN, and
    // min/max over non-NaN values are associative.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            mn[l] = if mn[l + w] < mn[l] { mn[l + w] } else { mn[l] };
            mx[l] = if mx[l + w] > mx[l] { mx[l + w] } else { mx[l] };
        }
    }
    any_nan |= nan.iter().any(|&b| b);
    lo = if mn[0] < lo { mn[0] } else { lo };
    hi = if mx[0] > hi { mx[0] } else { hi };
    if any_nan {
        (f32::NAN, f32::NAN)
    } else {
        (lo, hi)
    }
}

/// [`min_max`] of bf16 values given as bits, without widening them.
///
/// Each bf16 pattern maps to an i16 that orders like its value (`b ^ ((b >> 15) &
/// 0x7FFF)`: sign-magnitude to two's complement), so 32 lanes of integer min/max do the
/// work of 16 lanes of float compares on widened input. NaN patterns map above `+inf`'s
/// key or below `-inf`'s, so one look at the two extremes finds them. As in [`min_max`],
/// the sign of a zero extreme may differ from a sequential fold.
///
/// ```
/// use half::bf16;
/// use fmt_int4tiled::qparams::{min_max, min_max_bf16};
/// let xs = [1.5f32, -3.0, 0.25, 7.0];
/// let bits: Vec<u16> = xs.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
/// assert_eq!(min_max_bf16(&bits), min_max(&xs));
/// ```
#[inline(always)]
pub fn min_max_bf16(bits: &[u16]) -> (f32, f32) {
    min_max_bits::<0x7F80>(bits, quant_core::dtype::f32_from_bf16_bits)
}

/// [`min_max_bf16`] for f16 values given as bits: the same integer keys (f16 is
/// sign-magnitude too), `+inf` at `0x7C00`.
///
/// ```
/// use half::f16;
/// use fmt_int4tiled::qparams::{min_max, min_max_f16};
/// let xs = [1.5f32, -3.0, 6e-8, 65504.0];
/// let bits: Vec<u16> = xs.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
/// let wide: Vec<f32> = bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
/// assert_eq!(min_max_f16(&bits), min_max(&wide));
/// ```
#[inline(always)]
pub fn min_max_f16(bits: &[u16]) -> (f32, f32) {
    min_max_bits::<0x7C00>(bits, |b| half::f16::from_bits(b).to_f32())
}

/// The fold of [`min_max_bf16`] and [`min_max_f16`]: `POS_INF` is the format's `+inf`
/// pattern, `widen` its exact conversion to f32 (called twice per call, on the
/// extremes).
#[inline(always)]
fn min_max_bits<const POS_INF: i16>(bits: &[u16], widen: impl Fn(u16) -> f32) -> (f32, f32) {
    const L: usize = 32;
    let neg_inf = (POS_INF as u16 | 0x8000) ^ 0x7FFF;
    let neg_inf = neg_inf as i16;
    let key = |b: u16| (b ^ (((b as i16) >> 15) as u16 & 0x7FFF)) as i16;
    let mut mn = [i16::MAX; L];
    let mut mx = [i16::MIN; L];
    let mut chunks = bits.chunks_exact(L);
    for c in &mut chunks {
        for ((lo, hi), &b) in mn.iter_mut().zip(mx.iter_mut()).zip(c) {
            let k = key(b);
            *lo = (*lo).min(k);
            *hi = (*hi).max(k);
        }
    }
    let (mut lo, mut hi) = (i16::MAX, i16::MIN);
    for &b in chunks.remainder() {
        lo = lo.min(key(b));
        hi = hi.max(key(b));
    }
    let lo = mn.into_iter().fold(lo, i16::min);
    let hi = mx.into_iter().fold(hi, i16::max);
    if bits.is_empty() {
        return min_max(&[]);
    }
    if hi > POS_INF || lo < neg_inf {
        return (f32::NAN, f32::NAN);
    }
    // The key map is its own inverse.
    let value = |k: i16| widen(k as u16 ^ (((k >> 15) as u16) & 0x7FFF));
    (value(lo), value(hi))
}

/// `torch.clamp(x, min=eps)`: NaN stays NaN.
#[inline(always)]
pub(crate) fn clamp_min(x: f32, eps: f32) -> f32 {
    if x.is_nan() || x >= eps { x } else { eps }
}

/// `clamp(round_half_even(q), 0, 15)` then the CUDA cast to int (NaN → 0).
///
/// Rounding is monotonic, so clamping first gives the same result. Branch- and
/// conversion-free so that loops vectorize: the selects send NaN (every compare false)
/// and `-0` to 0, and on `[0, 15]` adding 2²³ rounds half to even in hardware, leaving
/// the integer in the low mantissa bits.
#[inline(always)]
pub fn to_nibble(q: f32) -> u8 {
    const TWO23: f32 = 8_388_608.0;
    // Two selects in sequence, each the pattern of one `vmaxps` / `vminps` (a nested
    // select compiled to two compares, an add and a blend). NaN fails `q > 0`: 0.
    let a = if q > 0.0 { q } else { 0.0 };
    let c = if a < 15.0 { a } else { 15.0 };
    ((c + TWO23).to_bits() & 0xF) as u8
}

/// What quantizing the elements of one group needs: `u = to_nibble(op((x - min_val) / scale))`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupParams {
    /// The divisor (a bf16 value).
    pub scale: f32,
    /// The offset subtracted first (a bf16 value).
    pub min_val: f32,
    /// The stored scale.
    pub scale_bf16: bf16,
    /// The stored float zero point.
    pub zero_bf16: bf16,
}

/// The group's qparams from its `amin` / `amax` (NaN if the group holds one), in the
/// eager op order of `path`.
#[inline(always)]
pub fn group_params(path: QParamsPath, mn: f32, mx: f32, eps: f32) -> GroupParams {
    let (scale, zero, min_val) = scale_zero_min(path, mn, mx, eps);
    GroupParams::new(scale, zero, min_val)
}

/// `(scale, zero, min_val)` of a group with extremes `mn`, `mx`, each a bf16 value held
/// in an f32: the arithmetic of [`group_params`] and [`group_params_batch`].
#[inline(always)]
fn scale_zero_min(path: QParamsPath, mn: f32, mx: f32, eps: f32) -> (f32, f32, f32) {
    match path {
        QParamsPath::Bf16 => {
            let range = rb(mx - mn);
            let scale = rb(clamp_min(rb(range * RCP_15), eps));
            let scale8 = rb(scale * 8.0);
            let zero = rb(mn + scale8);
            (scale, zero, rb(zero - scale8))
        }
        QParamsPath::F32 => {
            let scale_f = clamp_min((mx - mn) * RCP_15, eps);
            let zero = rb(mn + scale_f * 8.0);
            let scale = rb(scale_f);
            (scale, zero, rb(zero - rb(scale * 8.0)))
        }
    }
}

impl GroupParams {
    /// The params of `scale`, `zero` and `min_val`, each already rounded to bf16 ([`rb`]):
    /// their top halves are the bf16 bits (what `bf16::from_f32` gives them, NaN
    /// included, without its NaN branch).
    #[inline(always)]
    pub(crate) fn new(scale: f32, zero: f32, min_val: f32) -> GroupParams {
        let bits = |x: f32| bf16::from_bits((x.to_bits() >> 16) as u16);
        GroupParams {
            scale,
            min_val,
            scale_bf16: bits(scale),
            zero_bf16: bits(zero),
        }
    }
}

/// Chooses the group's `(scale, zero)` and quantizes it into `u` (same length as `xs`).
///
/// `xs` holds the group's values widened to f32 (for [`QParamsPath::Bf16`] they must be
/// bf16 values). `eps` is the clamp floor of the scale ([`EPS_V2`] or [`EPS_V1`]). This
/// is the scalar specification; the quantizer's kernels compute the same nibbles
/// without a division per element.
pub fn quantize_group(path: QParamsPath, xs: &[f32], eps: f32, u: &mut [u8]) -> (bf16, bf16) {
    let (mn, mx) = min_max(xs);
    let p = group_params(path, mn, mx, eps);
    match path {
        QParamsPath::Bf16 => {
            for (o, &x) in u.iter_mut().zip(xs) {
                let t = rb(x - p.min_val);
                *o = to_nibble(rb(t / p.scale));
            }
        }
        QParamsPath::F32 => {
            for (o, &x) in u.iter_mut().zip(xs) {
                *o = to_nibble((x - p.min_val) / p.scale);
            }
        }
    }
    (p.scale_bf16, p.zero_bf16)
}

/// [`group_params`] of `N` groups at once (`lo[i]`, `hi[i]` the extremes of group `i`):
/// the same operations, lane by lane over arrays, so the compiler keeps them in vector
/// registers; one group's scalar chain of roundings otherwise costs as much as a
/// quarter of its 128 nibbles.
#[inline(always)]
pub(crate) fn group_params_batch<const N: usize>(
    path: QParamsPath,
    lo: &[f32; N],
    hi: &[f32; N],
    eps: f32,
) -> [GroupParams; N] {
    let (mut scale, mut zero, mut min_val) = ([0f32; N], [0f32; N], [0f32; N]);
    for i in 0..N {
        (scale[i], zero[i], min_val[i]) = scale_zero_min(path, lo[i], hi[i], eps);
    }
    std::array::from_fn(|i| GroupParams::new(scale[i], zero[i], min_val[i]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfmt_testkit::XorShift64;

    #[test]
    fn all_equal_and_zero_groups() {
        let mut u = [9u8; 32];
        let (s, z) = quantize_group(QParamsPath::Bf16, &[0.0; 32], EPS_V2, &mut u);
        assert_eq!(s.to_f32(), EPS_V2);
        assert_eq!(z.to_f32(), EPS_V2 * 8.0);
        assert!(u.iter().all(|&v| v == 0));
        let (s, z) = quantize_group(QParamsPath::F32, &[0.75; 32], EPS_V1, &mut u);
        assert_eq!(s, bf16::from_f32(EPS_V1));
        assert_eq!(z.to_f32(), 0.75);
        assert!(u.iter().all(|&v| v == 0));
    }

    #[test]
    fn nan_and_inf_groups() {
        let mut xs = [1.0f32; 32];
        xs[3] = f32::NAN;
        let mut u = [7u8; 32];
        let (s, z) = quantize_group(QParamsPath::Bf16, &xs, EPS_V2, &mut u);
        assert!(s.is_nan() && z.is_nan());
        assert!(u.iter().all(|&v| v == 0));
        xs[3] = f32::INFINITY;
        let (s, z) = quantize_group(QParamsPath::F32, &xs, EPS_V2, &mut u);
        assert!(s.is_infinite() && z.is_infinite());
        assert!(u.iter().all(|&v| v == 0));
    }

    #[test]
    fn min_max_bits_equal_min_max_of_the_widened_values() {
        type Format = (fn(&[u16]) -> (f32, f32), fn(u16) -> f32, [u16; 10]);
        let formats: [Format; 2] = [
            (
                min_max_bf16,
                |b| f32::from_bits(u32::from(b) << 16),
                [
                    0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8001, 0x7F7F, 0xFF7F,
                ],
            ),
            (
                min_max_f16,
                |b| half::f16::from_bits(b).to_f32(),
                [
                    0x7E00, 0xFC01, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x8001, 0x7BFF, 0xFBFF,
                ],
            ),
        ];
        for (min_max_of, widen, specials) in formats {
            let mut st = XorShift64::new(0x9E37_79B9_7F4A_7C15);
            let mut next = move || st.next_u64();
            for len in [0usize, 1, 5, 31, 32, 33, 64, 128, 200] {
                for round in 0..300 {
                    let bits: Vec<u16> = (0..len)
                        .map(|i| {
                            let r = next();
                            if (round % 3 == 0 && i % 17 == 3) || r % 61 == 0 {
                                specials[(r >> 20) as usize % specials.len()]
                            } else {
                                (r >> 8) as u16
                            }
                        })
                        .collect();
                    let wide: Vec<f32> = bits.iter().map(|&b| widen(b)).collect();
                    let (a, b) = min_max_of(&bits);
                    let (c, d) = min_max(&wide);
                    // Equal as values (NaN with NaN); a zero extreme's sign may differ.
                    let same = |x: f32, y: f32| (x.is_nan() && y.is_nan()) || x == y;
                    assert!(
                        same(a, c) && same(b, d),
                        "{bits:04x?}: ({a}, {b}) vs ({c}, {d})"
                    );
                }
            }
        }
    }

    #[test]
    fn min_max_lanes_match_a_fold() {
        // Lengths with and without a remainder; NaN in a lane, in the remainder, or absent.
        for len in [1usize, 15, 16, 17, 32, 47, 128] {
            let xs: Vec<f32> = (0..len).map(|i| ((i * 37) % 23) as f32 - 11.5).collect();
            let (mn, mx) = min_max(&xs);
            assert_eq!(mn, xs.iter().copied().fold(f32::INFINITY, f32::min));
            assert_eq!(mx, xs.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            for at in [0, len / 2, len - 1] {
                let mut ys = xs.clone();
                ys[at] = f32::NAN;
                let (mn, mx) = min_max(&ys);
                assert!(mn.is_nan() && mx.is_nan(), "len {len} NaN at {at}");
            }
        }
        assert_eq!(min_max(&[f32::NEG_INFINITY, 3.0]), (f32::NEG_INFINITY, 3.0));
    }

    #[test]
    fn batched_params_equal_one_group_at_a_time() {
        let mut st = XorShift64::new(0x9E37_79B9_7F4A_7C15);
        let mut next = || st.next_u64();
        let specials = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            1e-40,
            -1e-45,
        ];
        for round in 0..2000 {
            let pick = |r: u64| {
                if r.is_multiple_of(5) {
                    specials[(r >> 8) as usize % specials.len()]
                } else {
                    f32::from_bits((r >> 16) as u32)
                }
            };
            let a: [f32; 16] = std::array::from_fn(|_| pick(next()));
            let b: [f32; 16] = std::array::from_fn(|_| pick(next()));
            let lo: [f32; 16] = std::array::from_fn(|i| a[i].min(b[i]));
            let hi: [f32; 16] =
                std::array::from_fn(|i| if a[i].is_nan() { a[i] } else { a[i].max(b[i]) });
            let eps = [EPS_V1, EPS_V2, 1e-45, 1.0, f32::MAX][round % 5];
            for path in [QParamsPath::Bf16, QParamsPath::F32] {
                let got = group_params_batch(path, &lo, &hi, eps);
                for i in 0..16 {
                    let want = group_params(path, lo[i], hi[i], eps);
                    let g = got[i];
                    // NaN payloads and signs are not part of the contract (the order of
                    // an operation's NaN operands is the compiler's): NaN matches NaN.
                    let same =
                        |a: f32, b: f32| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                    let ctx = format!("{path:?} lo {} hi {} eps {eps:e}", lo[i], hi[i]);
                    assert!(same(g.scale, want.scale), "scale: {ctx}");
                    assert!(same(g.min_val, want.min_val), "min_val: {ctx}");
                    assert!(
                        same(g.scale_bf16.to_f32(), want.scale_bf16.to_f32()),
                        "scale bf16: {ctx}"
                    );
                    assert!(
                        same(g.zero_bf16.to_f32(), want.zero_bf16.to_f32()),
                        "zero bf16: {ctx}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounding_is_half_even() {
        assert_eq!(to_nibble(2.5), 2);
        assert_eq!(to_nibble(3.5), 4);
        assert_eq!(to_nibble(-0.5), 0);
        assert_eq!(to_nibble(15.5), 15);
        assert_eq!(to_nibble(f32::NEG_INFINITY), 0);
        assert_eq!(to_nibble(f32::INFINITY), 15);
        assert_eq!(to_nibble(f32::NAN), 0);
        assert_eq!(to_nibble(-0.0), 0);
        assert_eq!(to_nibble(14.5), 14);
        assert_eq!(to_nibble(14.500001), 15);
        // agrees with round_ties_even + clamp on a dense grid
        for i in -4000..4000 {
            let q = i as f32 / 128.0;
            let want = q.round_ties_even().clamp(0.0, 15.0) as u8;
            assert_eq!(to_nibble(q), want, "{q}");
        }
    }
}
