//! CPU building blocks that vectorize: block widening and NaN-ignoring amax.
//!
//! Kernels process their input in blocks of [`BLOCK`] elements: widen the block to f32
//! on the stack once ([`Element::widen_slice`]), then run branchless loops over it. The
//! amax here keeps 16 independent lanes so the compiler can use vector max instructions
//! (whose "NaN loses" behaviour is exactly CUDA `fmaxf`'s).
//!
//! Everything here is `#[inline(always)]` so that it compiles into the
//! [`simd::dispatch`]ed kernel that calls it, at that kernel's vector width.

use rayon::prelude::*;

use crate::dtype::{DType, Element};
use crate::simd;

/// Elements widened per step (fits L1 comfortably: 2 KiB of f32).
pub const BLOCK: usize = 512;

/// Elements per parallel work item of a streaming pass.
pub const PAR_CHUNK: usize = 1 << 16;

/// `fmaxf(m, a)` for `m >= 0`: a NaN `a` loses.
#[inline(always)]
pub fn fmax_nan_loses(m: f32, a: f32) -> f32 {
    if a > m { a } else { m }
}

/// `acc[j] = fmaxf(acc[j], |xs[j]|)` over the common length: running per-column
/// maxima, NaN ignored (the columnwise amax of a group of rows, one row at a time).
///
/// Each `acc[j]` must be `+0` or what this function or [`fmax_nan_loses`] folded from
/// `+0` (never NaN, never `-0`); then the result is [`fmax_nan_loses`]'s bit for bit.
///
/// It is written with [`f32::max`] (LLVM's `maxnum`, which returns the other operand of
/// a NaN) and not with [`fmax_nan_loses`]'s select, because a slice loop of the select
/// stores `select(x > acc, x, acc)` back where `acc` was loaded, which LLVM vectorizes
/// as a *conditional* store: `vmaskmovps` at AVX2. Zen 4 runs those stores slowly; they
/// were 45 % of the MXFP8 and NVFP4 columnwise quantizes from f32 at AVX2. `maxnum`
/// costs three plain vector operations (max, unordered compare, blend) and a store.
///
/// ```
/// use quant_core::cpu::fold_abs_max;
/// let mut acc = [0.0f32; 3];
/// fold_abs_max(&mut acc, &[-2.0, f32::NAN, 1.0]);
/// fold_abs_max(&mut acc, &[1.0, 5.0, f32::NEG_INFINITY]);
/// assert_eq!(acc, [2.0, 5.0, f32::INFINITY]);
/// ```
#[inline(always)]
pub fn fold_abs_max(acc: &mut [f32], xs: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(xs) {
        *a = a.max(x.abs());
    }
}

/// `max |x|` over f32 values, ignoring NaN, starting from 0 (CUDA `fmaxf` semantics).
///
/// ```
/// assert_eq!(quant_core::cpu::amax_f32(&[1.0, f32::NAN, -3.0, 2.0]), 3.0);
/// assert_eq!(quant_core::cpu::amax_f32(&[]), 0.0);
/// ```
#[inline(always)]
pub fn amax_f32(xs: &[f32]) -> f32 {
    // Same result as a sequential fold: the lanes hold no NaN, and max over non-NaN
    // values is associative.
    lane_fold(
        xs,
        0.0,
        #[inline(always)]
        |m, v| fmax_nan_loses(m, v.abs()),
        fmax_nan_loses,
    )
}

/// Folds `xs` with `step` in 16 independent lanes, then merges the lanes with `merge`
/// as a tree (halves, quarters, ...) and folds the remainder into the result.
///
/// The lanes are what vectorize: a single running accumulator is a loop-carried chain
/// that LLVM leaves scalar, and a lane-by-lane final fold was a 16-step chain, a
/// quarter of a 128-element block's cost. The result equals the sequential fold when
/// `merge` is associative and commutative over what `step` produces (a max that ignores
/// NaN, an integer max).
#[inline(always)]
pub(crate) fn lane_fold<A: Copy>(
    xs: &[f32],
    init: A,
    step: impl Fn(A, f32) -> A,
    merge: impl Fn(A, A) -> A,
) -> A {
    const LANES: usize = 16;
    let mut acc = [init; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = step(*a, v);
        }
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] = merge(acc[i], acc[i + w]);
        }
    }
    chunks.remainder().iter().fold(acc[0], |m, &v| step(m, v))
}

/// `max |x|` of any input element type, ignoring NaN (f32 read in place, 16-bit types
/// as bits): one [`LaneAmax`] fed the whole slice.
///
/// ```
/// use half::bf16;
/// let xs = [bf16::from_f32(-3.5), bf16::NAN, bf16::from_f32(2.0)];
/// assert_eq!(quant_core::cpu::amax(&xs), 3.5);
/// assert_eq!(quant_core::cpu::amax::<f32>(&[]), 0.0);
/// ```
#[inline(always)]
pub fn amax<T: Element>(xs: &[T]) -> f32 {
    let mut acc = LaneAmax::new();
    acc.add(xs);
    acc.get()
}

/// A running NaN-ignoring `max |x|` (CUDA `fmaxf` folded from 0) over any number of
/// slices, kept in vector lanes and reduced only when read.
///
/// Folding many short runs into one amax (the 128 rows of a 128x128 tile, a row's
/// chunk at a time) then pays one horizontal reduction in all instead of one per run.
///
/// f32 goes through 16 lanes of compare-and-select (a plain loop, not
/// `Iterator::fold`: LLVM left the fold's closure out of line, at the baseline SSE2
/// width under every dispatch level). bf16 and f16 are not widened at all: the
/// magnitude bits of non-NaN 16-bit floats order like their values, so the amax is an
/// integer max over 32 lanes of bits, NaN patterns (those above infinity's) mapped to
/// zero.
///
/// ```
/// use quant_core::cpu::LaneAmax;
/// let mut acc = LaneAmax::<f32>::new();
/// acc.add(&[1.0, -7.0, f32::NAN]);
/// acc.add(&[2.0; 40]);
/// assert_eq!(acc.get(), 7.0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LaneAmax<T> {
    /// 16-bit input: the largest magnitude bits per lane.
    bits: [u16; 32],
    /// f32 input: the largest magnitude per lane (never NaN).
    wide: [f32; 16],
    _t: std::marker::PhantomData<T>,
}

impl<T: Element> Default for LaneAmax<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Element> LaneAmax<T> {
    /// Nothing folded yet: the amax of no values is `+0`.
    #[inline(always)]
    pub fn new() -> Self {
        LaneAmax {
            bits: [0; 32],
            wide: [0.0; 16],
            _t: std::marker::PhantomData,
        }
    }

    /// The bits of infinity of a 16-bit `T`, `None` for f32.
    #[inline(always)]
    fn inf16() -> Option<u16> {
        match T::DTYPE {
            DType::BF16 => Some(0x7F80),
            DType::F16 => Some(0x7C00),
            _ => None,
        }
    }

    /// Folds `xs` in.
    #[inline(always)]
    pub fn add(&mut self, xs: &[T]) {
        if let (Some(inf), Ok(bits)) = (Self::inf16(), bytemuck::try_cast_slice::<T, u16>(xs)) {
            let mag = |b: u16| {
                let m = b & 0x7FFF;
                if m > inf { 0 } else { m }
            };
            let mut chunks = bits.chunks_exact(self.bits.len());
            for c in &mut chunks {
                for (a, &b) in self.bits.iter_mut().zip(c) {
                    *a = (*a).max(mag(b));
                }
            }
            for (a, &b) in self.bits.iter_mut().zip(chunks.remainder()) {
                *a = (*a).max(mag(b));
            }
        } else if let Some(fs) = crate::dtype::f32_slice(xs) {
            let mut chunks = fs.chunks_exact(self.wide.len());
            for c in &mut chunks {
                for (a, &v) in self.wide.iter_mut().zip(c) {
                    *a = fmax_nan_loses(*a, v.abs());
                }
            }
            fold_abs_max(&mut self.wide, chunks.remainder());
        }
    }

    /// The amax of everything folded so far.
    #[inline(always)]
    pub fn get(&self) -> f32 {
        if Self::inf16().is_some() {
            let m = self.bits.iter().copied().max().unwrap_or(0);
            return bytemuck::cast_slice::<u16, T>(&[m])[0].to_f32();
        }
        self.wide.iter().copied().fold(0.0, fmax_nan_loses)
    }
}

/// [`amax`] in parallel over chunks of the input, at the active [`simd::level`].
pub fn par_amax<T: Element>(xs: &[T]) -> f32 {
    let level = simd::level();
    xs.par_chunks(PAR_CHUNK)
        .map(|c| {
            simd::dispatch(
                level,
                #[inline(always)]
                || amax::<T>(c),
            )
        })
        .reduce(|| 0.0, fmax_nan_loses)
}

/// The memory traffic of a quantizer without its math: reads `src` `reads` times (2 for
/// per-tensor scaling, whose amax pass is inherent; see `Format::input_passes`) and
/// writes `dst` once, in parallel chunks on the current rayon pool. Benchmarks divide
/// by its time measured in the same run, so ratios survive noisy machines (the CLI's
/// `quantfmt bench` and every format crate's criterion bench use it).
///
/// ```
/// let src = vec![1u8; 1 << 20];
/// let mut dst = vec![0u8; 1 << 18];
/// quant_core::cpu::roofline(&src, &mut dst, 2);
/// ```
pub fn roofline(src: &[u8], dst: &mut [u8], reads: usize) {
    let n_chunks = src.len().div_ceil(PAR_CHUNK).max(1);
    let dst_chunk = dst.len().div_ceil(n_chunks).max(1);
    for r in 0..reads {
        let last = r + 1 == reads;
        let sum: u64 = src
            .par_chunks(PAR_CHUNK)
            .zip(dst.par_chunks_mut(dst_chunk))
            .map(|(s, d)| {
                let mut acc = 0u64;
                for w in s.chunks_exact(8) {
                    acc = acc.wrapping_add(u64::from_le_bytes([
                        w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
                    ]));
                }
                if last {
                    d.fill(acc as u8);
                }
                acc
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn amax_matches_a_sequential_fold() {
        let xs: Vec<f32> = (0..10_007)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => -0.0,
                _ => ((i * 7919) % 1000) as f32 - 500.0,
            })
            .collect();
        let seq = xs.iter().fold(0f32, |m, v| fmax_nan_loses(m, v.abs()));
        assert_eq!(amax_f32(&xs), seq);
        assert_eq!(par_amax(&xs), seq);
        let b: Vec<bf16> = xs.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(amax(&b), seq);
        assert_eq!(amax_f32(&[f32::NAN; 40]), 0.0);
        assert_eq!(amax_f32(&[f32::NEG_INFINITY]), f32::INFINITY);
    }

    /// The `maxnum` fold against `fmax_nan_loses`'s select, bit for bit, over rows
    /// holding NaN of both signs, infinities, subnormals and zeros of both signs, in
    /// every column position and with ragged lengths (the vector body and its tail).
    #[test]
    fn fold_abs_max_is_the_select_fold() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FC0_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(0x0040_0000),
            f32::MIN_POSITIVE,
            f32::MAX,
            -f32::MAX,
            1.5,
            -2.25,
        ];
        for len in [0, 1, 7, 8, 9, 31, 33, 100] {
            let mut fast = vec![0f32; len];
            let mut slow = vec![0f32; len];
            for row in 0..3 * specials.len() {
                let xs: Vec<f32> = (0..len)
                    .map(|j| specials[(j * 5 + row * 3) % specials.len()])
                    .collect();
                fold_abs_max(&mut fast, &xs);
                for (a, &x) in slow.iter_mut().zip(&xs) {
                    *a = fmax_nan_loses(*a, x.abs());
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&slow), "len {len}, row {row}");
            }
        }
    }

    /// The integer amax of 16-bit input against the f32 fold, on every bit pattern
    /// (NaN, infinities, subnormals, signed zeros) alone and in runs of every length up
    /// to 3 vectors, at every alignment of the 32-lane loop.
    #[test]
    fn half_amax_is_the_widened_fold_on_every_pattern() {
        fn check<T: Element>(from: fn(u16) -> T) {
            let all: Vec<T> = (0..=u16::MAX).map(from).collect();
            let fold = |xs: &[T]| {
                xs.iter()
                    .fold(0f32, |m, v| fmax_nan_loses(m, v.to_f32().abs()))
            };
            for x in all.chunks(1) {
                assert_eq!(amax(x).to_bits(), fold(x).to_bits());
            }
            // A stride coprime to 2^16 mixes NaN, large and tiny values in each run.
            let mixed: Vec<T> = (0..1 << 16).map(|i| all[(i * 40_503) & 0xFFFF]).collect();
            let mut start = 0;
            for len in (0..100).cycle().take(1300) {
                let run = &mixed[start..(start + len).min(mixed.len())];
                assert_eq!(amax(run).to_bits(), fold(run).to_bits(), "at {start}+{len}");
                start = (start + len + 1) % mixed.len();
            }
            assert_eq!(amax(&mixed).to_bits(), fold(&mixed).to_bits());
        }
        check(bf16::from_bits);
        check(half::f16::from_bits);
    }

    /// Feeding runs of every length (remainders land in different lanes each time)
    /// gives the sequential fold of their concatenation, for every element type.
    #[test]
    fn lane_amax_over_runs_is_the_amax_of_their_concatenation() {
        fn check<T: Element>(from: fn(f32) -> T) {
            let xs: Vec<T> = (0..4000)
                .map(|i| match i % 89 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 if i > 3000 => f32::NEG_INFINITY,
                    _ => (((i * 7919) % 2000) as f32 - 1000.0) / 7.0,
                })
                .map(from)
                .collect();
            let mut acc = LaneAmax::<T>::new();
            assert_eq!(acc.get().to_bits(), 0);
            let (mut start, mut len) = (0, 0);
            while start < xs.len() {
                let run = &xs[start..(start + len).min(xs.len())];
                acc.add(run);
                let seen = &xs[..start + run.len()];
                let fold = seen
                    .iter()
                    .fold(0f32, |m, v| fmax_nan_loses(m, v.to_f32().abs()));
                assert_eq!(acc.get().to_bits(), fold.to_bits(), "after {start}+{len}");
                start += run.len();
                len = (len + 7) % 101;
            }
            assert_eq!(acc.get(), f32::INFINITY);
        }
        check(|v| v);
        check(bf16::from_f32);
        check(half::f16::from_f32);
    }
}
