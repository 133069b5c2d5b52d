//! The bf16 quantize's batch kernel at AVX-512 with VBMI: up to 16 groups' extremes,
//! qparams and nibbles in one function, so that nothing but the loads and the nibble
//! stores leaves the registers between them.
//!
//! The group-by-group route ([`crate::kernels`]) spent more than half of its time
//! around the nibbles (single thread, 8192x8192: 18.9 ms, of which the nibble loop
//! 33 %): each group's 32-lane minimum and maximum folded to one lane by its own
//! five-step shuffle tree, the qparams' scalar chains, and a call into the nibble loop
//! that reloaded its constants every time. Here:
//!
//! * **extremes** ([`extremes`]): each group's bf16 bits become order-keeping i16 keys
//!   (as `qparams::min_max_bf16` makes them, one ternary-logic operation per 32 values)
//!   folded into one vector of 32 lanes per group; then the 16 groups' vectors are folded
//!   together ([`fold16`]): each step halves the lanes per group and the vectors in
//!   play, so 16 groups cost 47 operations where one group's own tree cost ten;
//! * **qparams** ([`qparams`]): the bf16 path's five roundings, 16 groups per operation,
//!   with the portable rounding's bits (`bf16_narrow::x86::narrow16_int`);
//! * **nibbles**: the step of `x86::nibbles_bf16` (or its twin without AVX-512 BF16),
//!   inlined, with each group's offset and reciprocal broadcast from the batch's arrays.
//!
//! A group whose scale or offset the fast nibbles do not cover (a NaN or infinite
//! scale, one below 2^-100, an infinite offset: `kernels::group_nibbles` names the
//! bounds) is left to the caller, flagged in [`Batch::done`].

use std::arch::x86_64::{
    __m512, __m512i, _CMP_GE_OQ, _CMP_LT_OQ, _CMP_NLT_UQ, _CMP_UNORD_Q, _MM_HINT_T0, _mm_prefetch,
    _mm_storeu_si128, _mm256_loadu_si256, _mm256_storeu_si256, _mm512_add_ps, _mm512_and_si512,
    _mm512_castps_si512, _mm512_castsi512_ps, _mm512_cmp_ps_mask, _mm512_cvtepi32_epi16,
    _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_div_ps, _mm512_loadu_si512, _mm512_mask_mov_ps,
    _mm512_max_epi16, _mm512_min_epi16, _mm512_mul_ps, _mm512_permutexvar_epi32, _mm512_set1_epi16,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setr_epi32, _mm512_shuffle_i64x2, _mm512_shuffle_ps,
    _mm512_slli_epi32, _mm512_srai_epi16, _mm512_srai_epi32, _mm512_srli_epi32, _mm512_storeu_ps,
    _mm512_sub_ps, _mm512_ternarylogic_epi32, _mm512_unpackhi_epi64, _mm512_unpacklo_epi64,
};

use quant_core::DType;
use quant_core::bf16_narrow::x86::narrow16_int;
use quant_core::simd::Level;

use crate::qparams::{GroupParams, RCP_15};
use crate::x86::nibbles16_f16;

/// The most groups one call takes: one f32 lane each in the qparam vectors.
pub(crate) const GROUPS: usize = 16;

/// The smallest scale whose nibbles the kernel computes: 2^-100, as
/// `kernels::group_nibbles` bounds its hardware route (the BF16 instructions flush
/// subnormals; above this bound that changes no nibble).
const MIN_SCALE: f32 = f32::from_bits(27 << 23);

/// Scales from here up have a reciprocal below `f32::MIN_POSITIVE`: 2^126.
const MAX_SCALE: f32 = f32::from_bits(253 << 23);

/// The qparams of one call's groups (lanes past its groups hold nothing useful).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Batch {
    /// Each group's scale, a bf16 value (`rb` of the bf16 path).
    pub scale: [f32; GROUPS],
    /// Each group's float zero point, a bf16 value.
    pub zero: [f32; GROUPS],
    /// Each group's offset `zero − 8·scale`, a bf16 value.
    pub min_val: [f32; GROUPS],
    /// Bit `i` set: group `i`'s nibbles are written. The others are the caller's (with
    /// [`Batch::params`]).
    pub done: u16,
}

impl Batch {
    /// Group `i`'s qparams as the portable route holds them.
    #[inline(always)]
    pub(crate) fn params(&self, i: usize) -> GroupParams {
        GroupParams::new(self.scale[i], self.zero[i], self.min_val[i])
    }
}

/// Proof that this CPU runs one of the batch kernels, for one input dtype: AVX-512 (F,
/// BW, DQ, VL), with VBMI for bf16. Found once per quantize task, like
/// `x86::Bf16Nibbles`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchKernel {
    /// bf16 input: [`batch_bf16`].
    Bf16,
    /// bf16 input on a CPU without AVX-512 BF16: [`batch_bf16_int`].
    Bf16Int,
    /// f16 input: [`batch_f16`].
    F16,
}

impl BatchKernel {
    /// The kernel for `level` and input of `dtype` (bf16 or f16), where it is AVX-512
    /// and this CPU has what the kernel needs.
    pub(crate) fn detect(level: Level, dtype: DType) -> Option<BatchKernel> {
        use quant_core::simd::{Ext, has};
        if level != Level::Avx512 || !level.is_supported() {
            return None;
        }
        match dtype {
            DType::BF16 if has(Ext::Vbmi) => Some(if has(Ext::Bf16) {
                BatchKernel::Bf16
            } else {
                BatchKernel::Bf16Int
            }),
            DType::F16 => Some(BatchKernel::F16),
            _ => None,
        }
    }

    /// The qparams of the groups of `g` values in `xs` (bf16 or f16 bit patterns, as
    /// the kernel's input dtype; at most [`GROUPS`] groups), on the path that dtype
    /// takes (bf16 and f32: `qparams::QParamsPath`), and the nibbles into `u` (as long
    /// as `xs`) of every group flagged in [`Batch::done`] (f16: all). `ahead` is input
    /// to hint into L1 as the groups go (one group's share per group; may be short or
    /// empty).
    ///
    /// The result goes to `out` (returned by value, it went through the stack twice).
    /// `false` (nothing written) unless `g` is a positive multiple of 32 and `xs`
    /// holds one to [`GROUPS`] whole groups, as many values as `u`.
    #[inline(always)]
    pub(crate) fn run(
        self,
        xs: &[u16],
        g: usize,
        eps: f32,
        u: &mut [u8],
        ahead: &[u16],
        out: &mut Batch,
    ) -> bool {
        let fits = g > 0
            && g.is_multiple_of(32)
            && xs.len().is_multiple_of(g)
            && (1..=GROUPS).contains(&(xs.len() / g))
            && u.len() == xs.len();
        if !fits {
            return false;
        }
        match self {
            // SAFETY: `Bf16` exists only where `detect` found AVX-512 F, BW, DQ, VL, BF16
            // and VBMI (AVX-512 level support covers F, BW, DQ and VL).
            BatchKernel::Bf16 => unsafe { batch_bf16(xs, g, eps, u, ahead, out) },
            // SAFETY: `Bf16Int` exists only where `detect` found AVX-512 F, BW, DQ, VL
            // and VBMI.
            BatchKernel::Bf16Int => unsafe { batch_bf16_int(xs, g, eps, u, ahead, out) },
            // SAFETY: `F16` exists only where `detect` found AVX-512 F, BW, DQ and VL.
            BatchKernel::F16 => unsafe { batch_f16(xs, g, eps, u, ahead, out) },
        }
        true
    }
}

macro_rules! batch_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $step:path) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(xs: &[u16], g: usize, eps: f32, u: &mut [u8], ahead: &[u16], b: &mut Batch) {
            let (lo, hi) = extremes(xs, g, |p| bf16_values(p));
            let (scale, zero, min_val) = qparams_bf16(lo, hi, eps);
            let done = fast_nibbles(scale, min_val) & groups_mask(xs.len() / g);
            store(b, (scale, zero, min_val), done);
            let mut r = [0f32; GROUPS];
            // SAFETY: 16 f32 (one unaligned 512-bit store).
            unsafe { _mm512_storeu_ps(r.as_mut_ptr(), _mm512_div_ps(_mm512_set1_ps(1.0), scale)) };
            let groups_of = xs.chunks_exact(g).zip(u.chunks_exact_mut(g));
            for (i, (x, o)) in groups_of.enumerate() {
                if let Some(lines) = ahead.get(i * g..(i + 1) * g) {
                    prefetch(lines);
                }
                if done & (1 << i) == 0 {
                    continue;
                }
                let (mv, rr) = (b.min_val[i], _mm512_set1_ps(r[i]));
                for (x, o) in x.chunks_exact(32).zip(o.chunks_exact_mut(32)) {
                    // SAFETY: `x` is 32 u16 (one unaligned 512-bit load).
                    let v = unsafe { _mm512_loadu_si512(x.as_ptr().cast()) };
                    let bytes = $step(v, mv, rr);
                    // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
                    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), bytes) };
                }
            }
        }
    };
}

batch_kernel!(
    /// The batch with the nibbles of `x86::nibbles_bf16` (AVX-512 BF16 roundings).
    batch_bf16,
    "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi",
    crate::x86::nibbles32_bf16
);
batch_kernel!(
    /// The batch with the nibbles of `x86::nibbles_bf16_int` (integer roundings), for
    /// CPUs without AVX-512 BF16.
    batch_bf16_int,
    "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi",
    crate::x86::nibbles32_bf16_int
);

/// The f16 batch: extremes from the keys as for bf16, the f32 path's qparams
/// ([`qparams_f32`]) and every group's nibbles by the step of `x86::nibbles_f16` (the
/// division itself, which needs no bounds).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn batch_f16(xs: &[u16], g: usize, eps: f32, u: &mut [u8], ahead: &[u16], b: &mut Batch) {
    let (lo, hi) = extremes(xs, g, |p| f16_values(p));
    let params = qparams_f32(lo, hi, eps);
    store(b, params, groups_mask(xs.len() / g));
    for (i, (x, o)) in xs.chunks_exact(g).zip(u.chunks_exact_mut(g)).enumerate() {
        if let Some(lines) = ahead.get(i * g..(i + 1) * g) {
            prefetch(lines);
        }
        let (mn, sc) = (_mm512_set1_ps(b.min_val[i]), _mm512_set1_ps(b.scale[i]));
        for (x, o) in x.chunks_exact(16).zip(o.chunks_exact_mut(16)) {
            // SAFETY: `x` is 16 u16 (one unaligned 256-bit load).
            let v = unsafe { _mm256_loadu_si256(x.as_ptr().cast()) };
            // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
            unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), nibbles16_f16(v, mn, sc)) };
        }
    }
}

/// The bits of a batch's first `groups` groups (`groups <= 16`).
#[inline(always)]
fn groups_mask(groups: usize) -> u16 {
    ((1u32 << groups) - 1) as u16
}

/// The qparams `(scale, zero, min_val)` and the `done` flags into `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store(b: &mut Batch, (scale, zero, min_val): (__m512, __m512, __m512), done: u16) {
    b.done = done;
    // SAFETY: each array is 16 f32 (one unaligned 512-bit store).
    unsafe {
        _mm512_storeu_ps(b.scale.as_mut_ptr(), scale);
        _mm512_storeu_ps(b.zero.as_mut_ptr(), zero);
        _mm512_storeu_ps(b.min_val.as_mut_ptr(), min_val);
    }
}

/// `data`'s lines hinted into L1.
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch(data: &[u16]) {
    let p = data.as_ptr().cast::<i8>();
    for off in (0..std::mem::size_of_val(data)).step_by(64) {
        // SAFETY: `off` is inside `data`; a prefetch never faults and has no
        // architectural effect.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) }
    }
}

/// The order-keeping i16 key of each bf16 lane: `b ^ ((b >> 15) & 0x7FFF)`
/// (sign-magnitude to two's complement, `qparams::min_max_bf16`'s map; its own inverse).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn keys(v: __m512i) -> __m512i {
    // A ^ (B & C) for A = v, B = its sign spread, C = 0x7FFF.
    _mm512_ternarylogic_epi32::<0x78>(v, _mm512_srai_epi16::<15>(v), _mm512_set1_epi16(0x7FFF))
}

/// The minimum and maximum of each group of `g` bf16 or f16 values in `xs` (one to 16
/// whole groups, `g` a multiple of 32), as f32 lanes in group order:
/// `qparams::min_max_bf16` (or `min_max_f16`) of each group, NaN in both lanes where the
/// group holds a NaN (the portable pair). Both formats are sign-magnitude, so one key
/// map orders them; `widen` turns the folded patterns into f32 ([`bf16_values`],
/// [`f16_values`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn extremes(xs: &[u16], g: usize, widen: impl Fn(__m512i) -> __m512) -> (__m512, __m512) {
    let mut lo = [_mm512_set1_epi16(0); GROUPS];
    let mut hi = lo;
    let mut groups = 0;
    for (i, group) in xs.chunks_exact(g).take(GROUPS).enumerate() {
        let mut steps = group.chunks_exact(32);
        let load = |s: &[u16]| {
            // SAFETY: `s` is 32 u16 (one unaligned 512-bit load).
            keys(unsafe { _mm512_loadu_si512(s.as_ptr().cast()) })
        };
        let first = steps.next().map_or(_mm512_set1_epi16(0), load);
        let (mut l, mut h) = (first, first);
        for s in steps {
            let k = load(s);
            l = _mm512_min_epi16(l, k);
            h = _mm512_max_epi16(h, k);
        }
        (lo[i], hi[i]) = (l, h);
        groups = i + 1;
    }
    // Missing groups repeat the first, so the folds take whole vectors.
    for i in groups..GROUPS {
        (lo[i], hi[i]) = (lo[0], hi[0]);
    }
    let lo = widen(patterns(fold16(&lo, |a, b| _mm512_min_epi16(a, b))));
    let hi = widen(patterns(fold16(&hi, |a, b| _mm512_max_epi16(a, b))));
    // A NaN key lies above +inf's or below -inf's, so it survives the fold on its side
    // and maps back to a NaN pattern; the portable pair is NaN on both sides.
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(lo, hi);
    let q = _mm512_set1_ps(f32::NAN);
    (
        _mm512_mask_mov_ps(lo, nan, q),
        _mm512_mask_mov_ps(hi, nan, q),
    )
}

/// `op` (lane-wise i16 min or max) of each of 16 vectors over its 32 lanes, all at once:
/// the low i16 of dword `4L + j` of the result is `v[L + 4j]`'s fold.
///
/// Each step pairs vectors and halves the lanes each group keeps: 512 to 256 bits (two
/// 256-bit halves swapped in by `vshufi64x2`), 256 to 128, 128 to 64
/// (`vpunpck[lh]qdq`), 64 to 32 (`vshufps`), then the two i16 of each dword. 47
/// operations for 16 groups, where a tree per group takes ten.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fold16(v: &[__m512i; GROUPS], op: impl Fn(__m512i, __m512i) -> __m512i) -> __m512i {
    // Pair (2a, 2a + 1): 256-bit half 0 is group 2a's, half 1 group 2a + 1's.
    let w: [__m512i; 8] = std::array::from_fn(|a| {
        let (x, y) = (v[2 * a], v[2 * a + 1]);
        op(
            _mm512_shuffle_i64x2::<0x44>(x, y),
            _mm512_shuffle_i64x2::<0xEE>(x, y),
        )
    });
    // 128-bit lane L of u[b] is group 4b + L's.
    let u: [__m512i; 4] = std::array::from_fn(|b| {
        let (x, y) = (w[2 * b], w[2 * b + 1]);
        op(
            _mm512_shuffle_i64x2::<0x88>(x, y),
            _mm512_shuffle_i64x2::<0xDD>(x, y),
        )
    });
    // In 128-bit lane L of t[c]: the low qword is group 8c + L's, the high 8c + 4 + L's.
    let t: [__m512i; 2] = std::array::from_fn(|c| {
        let (x, y) = (u[2 * c], u[2 * c + 1]);
        op(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
    });
    // Dword j of 128-bit lane L: group L + 4j's two i16.
    let (x, y) = (_mm512_castsi512_ps(t[0]), _mm512_castsi512_ps(t[1]));
    let s = op(
        _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(x, y)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(x, y)),
    );
    op(s, _mm512_srli_epi32::<16>(s))
}

/// The bit patterns of [`fold16`]'s keys, in group order, each in the high half of its
/// dword (the key map is its own inverse).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn patterns(folded: __m512i) -> __m512i {
    let t = _mm512_slli_epi32::<16>(folded);
    let bits = _mm512_ternarylogic_epi32::<0x78>(
        t,
        _mm512_srai_epi32::<31>(t),
        _mm512_set1_epi32(0x7FFF_0000),
    );
    // Group `i` sits in dword 4(i % 4) + i / 4.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(order, bits)
}

/// bf16 patterns in the high halves of dwords as f32: the dwords themselves.
#[inline]
#[target_feature(enable = "avx512f")]
fn bf16_values(patterns: __m512i) -> __m512 {
    _mm512_castsi512_ps(patterns)
}

/// f16 patterns in the high halves of dwords as f32: narrowed to 16 bits, `vcvtph2ps`
/// (exact; a NaN stays NaN).
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_values(patterns: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(patterns)))
}

/// `rb` of every lane: the nearest bf16 (ties to even, NaN quieted), widened back.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn rb(x: __m512) -> __m512 {
    let bits = _mm512_cvtepu16_epi32(narrow16_int(x));
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
}

/// `(scale, zero, min_val)` of 16 groups from their extremes: `qparams::scale_zero_min`
/// on the bf16 path, every operation rounded to bf16 as eager bf16 PyTorch does.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn qparams_bf16(lo: __m512, hi: __m512, eps: f32) -> (__m512, __m512, __m512) {
    let range = rb(_mm512_sub_ps(hi, lo));
    let q = rb(_mm512_mul_ps(range, _mm512_set1_ps(RCP_15)));
    // `torch.clamp(q, min = eps)`: NaN stays NaN.
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(q, _mm512_set1_ps(eps));
    let scale = rb(_mm512_mask_mov_ps(_mm512_set1_ps(eps), keep, q));
    let scale8 = rb(_mm512_mul_ps(scale, _mm512_set1_ps(8.0)));
    let zero = rb(_mm512_add_ps(lo, scale8));
    (scale, zero, rb(_mm512_sub_ps(zero, scale8)))
}

/// `(scale, zero, min_val)` of 16 groups on the f32 path (`qparams::scale_zero_min`):
/// the scale and the zero point in f32 (the zero from the unrounded scale), rounded to
/// bf16 at the end; `min_val` from the two bf16 values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn qparams_f32(lo: __m512, hi: __m512, eps: f32) -> (__m512, __m512, __m512) {
    let q = _mm512_mul_ps(_mm512_sub_ps(hi, lo), _mm512_set1_ps(RCP_15));
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(q, _mm512_set1_ps(eps));
    let scale_f = _mm512_mask_mov_ps(_mm512_set1_ps(eps), keep, q);
    let eight = _mm512_set1_ps(8.0);
    let zero = rb(_mm512_add_ps(lo, _mm512_mul_ps(scale_f, eight)));
    let scale = rb(scale_f);
    (
        scale,
        zero,
        rb(_mm512_sub_ps(zero, rb(_mm512_mul_ps(scale, eight)))),
    )
}

/// The groups whose nibbles the fast step computes: a scale in `[2^-100, 2^126)` (a
/// normal reciprocal, no subnormal flush that could matter) and a finite offset.
#[inline]
#[target_feature(enable = "avx512f")]
fn fast_nibbles(scale: __m512, min_val: __m512) -> u16 {
    let magnitude = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(min_val),
        _mm512_set1_epi32(0x7FFF_FFFF),
    ));
    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(scale, _mm512_set1_ps(MIN_SCALE))
        & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(scale, _mm512_set1_ps(MAX_SCALE))
        & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(magnitude, _mm512_set1_ps(f32::INFINITY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qparams::{
        QParamsPath, group_params, min_max_bf16, min_max_f16, rb as rb_scalar, to_nibble,
    };
    use half::{bf16, f16};
    use quantfmt_testkit::XorShift64;

    /// The kernels this CPU runs (bf16 with and without its BF16 rounding, f16), each
    /// with its input dtype; a note for what is skipped.
    fn kernels() -> Vec<(BatchKernel, DType)> {
        let mut ks = Vec::new();
        match BatchKernel::detect(Level::Avx512, DType::BF16) {
            Some(BatchKernel::Bf16) => ks.extend([
                (BatchKernel::Bf16, DType::BF16),
                (BatchKernel::Bf16Int, DType::BF16),
            ]),
            Some(k) => {
                eprintln!("note: no AVX-512 BF16 on this CPU: batch_bf16 not checked");
                ks.push((k, DType::BF16));
            }
            None => {
                eprintln!("note: no AVX-512 with VBMI here (or level forced lower): bf16 skipped")
            }
        }
        match BatchKernel::detect(Level::Avx512, DType::F16) {
            Some(k) => ks.push((k, DType::F16)),
            None => eprintln!("note: no AVX-512 here (or level forced lower): f16 skipped"),
        }
        ks
    }

    /// A value drawn to hit the kernels' edges, as the bits of `dtype`: ordinary values
    /// of magnitude up to `2^window`, or (`special`) NaNs of either sign, infinities,
    /// both zeros and subnormals.
    fn value(rng: &mut XorShift64, dtype: DType, window: i32, special: bool) -> u16 {
        let s = rng.next_u64();
        let x = match if special { s % 7 } else { 7 } {
            0 => f32::NAN,
            1 => -f32::NAN,
            2 => f32::INFINITY,
            3 => f32::NEG_INFINITY,
            4 => -0.0,
            5 => 0.0,
            6 => {
                let tiny = if dtype == DType::BF16 { 1e-39 } else { 6e-6 };
                tiny * ((s >> 8) as u16 as f32 / 65536.0 - 0.5)
            }
            _ => ((s >> 16) as u32 as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(window),
        };
        match dtype {
            DType::BF16 => bf16::from_f32(x).to_bits(),
            _ => f16::from_f32(x).to_bits(),
        }
    }

    /// Every kernel this CPU runs against the portable route, group by group: the
    /// extremes (`min_max_bf16`, `min_max_f16`), the qparams (`group_params` on the
    /// dtype's path), which groups it takes and their nibbles (bf16:
    /// `to_nibble(rb(rb(x − min_val) · r))`, the multiply form the portable route checks
    /// against the division; f16: the division), for every group size, one to 16
    /// groups, magnitudes from the format's subnormals to its overflow and the special
    /// values; eps as torchao v2 and v1 pass it and a huge one (infinite offsets).
    #[test]
    fn batches_equal_the_portable_groups() {
        let mut rng = XorShift64::new(0xBA7C_4ED5);
        for (k, dtype) in kernels() {
            let (mut checked, mut left) = (0, 0);
            for round in 0..600 {
                let g = [32, 64, 128, 256][round % 4];
                let groups = 1 + (rng.next_u64() as usize % GROUPS);
                let eps = [f32::MIN_POSITIVE, 1e-6, 1e38][(round / 4) % 3];
                let windows = match dtype {
                    DType::BF16 => [-140, -120, -100, -20, 0, 8, 60, 120],
                    _ => [-26, -20, -14, -6, 0, 8, 15, 17],
                };
                let window = windows[(round / 12) % 8];
                // A quarter of the groups draw special values (one value in 14 of them).
                let mut xs: Vec<u16> = (0..groups * g)
                    .map(|j| {
                        let special =
                            (j / g + round).is_multiple_of(4) && rng.next_u64().is_multiple_of(14);
                        value(&mut rng, dtype, window, special)
                    })
                    .collect();
                // Every fifth round, constant groups (a zero range: the scale is eps).
                if round.is_multiple_of(5) {
                    for group in xs.chunks_exact_mut(g) {
                        let first = group[0];
                        group.fill(first);
                    }
                }
                let mut u = vec![0xEEu8; xs.len()];
                let mut b = Batch::default();
                assert!(k.run(&xs, g, eps, &mut u, &xs, &mut b), "fits");
                for (i, (x, o)) in xs.chunks_exact(g).zip(u.chunks_exact(g)).enumerate() {
                    let (want, fast) = match dtype {
                        DType::BF16 => {
                            let (mn, mx) = min_max_bf16(x);
                            let p = group_params(QParamsPath::Bf16, mn, mx, eps);
                            let fast =
                                p.min_val.is_finite() && (MIN_SCALE..MAX_SCALE).contains(&p.scale);
                            (p, fast)
                        }
                        _ => {
                            let (mn, mx) = min_max_f16(x);
                            (group_params(QParamsPath::F32, mn, mx, eps), true)
                        }
                    };
                    let key = |p: GroupParams| {
                        let bits = (p.scale_bf16.to_bits(), p.zero_bf16.to_bits());
                        (p.scale.to_bits(), p.min_val.to_bits(), bits)
                    };
                    let got = b.params(i);
                    assert_eq!(key(got), key(want), "{k:?} g {g} group {i}: {x:04x?}");
                    assert_eq!(b.done & (1 << i) != 0, fast, "{k:?} g {g} group {i} taken");
                    if !fast {
                        assert!(o.iter().all(|&n| n == 0xEE), "{k:?}: a group left wrote");
                        left += 1;
                        continue;
                    }
                    for (&xb, &n) in x.iter().zip(o) {
                        let expect = match dtype {
                            DType::BF16 => {
                                let t = bf16::from_bits(xb).to_f32() - want.min_val;
                                to_nibble(rb_scalar(rb_scalar(t) * (1.0 / want.scale)))
                            }
                            _ => {
                                to_nibble((f16::from_bits(xb).to_f32() - want.min_val) / want.scale)
                            }
                        };
                        assert_eq!(n, expect, "{k:?} g {g} group {i} x {xb:#06x}");
                    }
                    checked += 1;
                }
                let past = u32::from(b.done) >> groups;
                assert_eq!(past, 0, "{k:?}: flags past the batch");
            }
            assert!(checked > 1000, "{k:?}: {checked} groups checked");
            if dtype == DType::BF16 {
                assert!(left > 100, "{k:?}: {left} groups left to the caller");
            }
        }
    }

    /// What does not fit is refused with nothing written.
    #[test]
    fn misfits_are_refused() {
        let xs = vec![0x3F80u16; 17 * 32];
        let mut u = vec![0xEEu8; xs.len()];
        for (k, _) in kernels() {
            let mut refused = |n: usize, g: usize, un: usize| {
                !k.run(&xs[..n], g, 1e-6, &mut u[..un], &[], &mut Batch::default())
            };
            assert!(refused(17 * 32, 32, 17 * 32), "{k:?}: 17 groups");
            assert!(refused(48, 48, 48), "{k:?}: g = 48");
            assert!(refused(64, 32, 32), "{k:?}: short u");
            assert!(refused(40, 32, 40), "{k:?}: ragged");
            assert!(refused(0, 32, 0), "{k:?}: empty");
            assert!(refused(64, 0, 64), "{k:?}: g = 0");
        }
        assert!(u.iter().all(|&b| b == 0xEE));
    }
}
