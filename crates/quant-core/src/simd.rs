//! Run-time SIMD dispatch: one portable kernel body, compiled three times.
//!
//! The default target is baseline x86-64 (SSE2), where the kernels' branchless loops
//! vectorize four lanes wide. Instead of hand-written intrinsics for every format,
//! [`dispatch`] runs a closure inside a function compiled with
//! `#[target_feature(enable = "avx2,fma,..")]` or `"avx512f,avx512bw,.."`, chosen once
//! from the CPU (`is_x86_feature_detected!`). Marked `#[inline(always)]`, the closure and
//! every `#[inline(always)]` helper it calls are compiled *into* that function, so LLVM
//! vectorizes the same loops 8 or 16 lanes wide.
//!
//! **Why the levels are bit-identical.** Rust never contracts `a * b + c` into a fused
//! multiply-add and never reassociates floating-point arithmetic; a vectorized loop
//! performs exactly the IEEE operations of the scalar one, lane by lane. Target features
//! change instruction selection, not results. The format crates still test every level
//! they can force against their scalar references ([`with_level`]).
//!
//! | level | needs | vector width of the portable loops |
//! |---|---|---|
//! | [`Level::Scalar`] | nothing (any target) | SSE2 on x86-64 (4 x f32), none elsewhere |
//! | [`Level::Avx2`] | AVX2, FMA, BMI1/2, F16C, LZCNT, POPCNT | 8 x f32 |
//! | [`Level::Avx512`] | the above + AVX-512 F, BW, CD, DQ, VL | 16 x f32 |
//!
//! The active level is the best the CPU has, unless the environment variable
//! `QUANTFMT_SIMD=scalar|avx2|avx512` (read once) asks for a lower one, or a test forces
//! one with [`with_level`]. A level the CPU lacks is never used: a request for it falls
//! back to the best level below it.
//!
//! ```
//! use quant_core::simd::{self, Level};
//! let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
//! let max_sq = |level| {
//!     simd::dispatch(level, #[inline(always)] || {
//!         xs.iter().map(|x| x * x).fold(0.0f32, f32::max)
//!     })
//! };
//! assert_eq!(max_sq(Level::Scalar), max_sq(simd::level()));
//! assert!(Level::Scalar.is_supported());
//! ```
#![allow(unsafe_code)]

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// An instruction-set level the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The build target's baseline (SSE2 on x86-64); the only level elsewhere.
    Scalar,
    /// AVX2 + FMA (Haswell, Zen 1 and later).
    Avx2,
    /// AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4 and later).
    Avx512,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 3] = [Level::Scalar, Level::Avx2, Level::Avx512];

    /// `scalar`, `avx2` or `avx512` (the spelling `QUANTFMT_SIMD` takes).
    pub const fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level. Inlined (one atomic load and a compare):
    /// kernels check it per call, and as a call across crates it was up to 1 % of a
    /// quantize profile.
    #[inline]
    pub fn is_supported(self) -> bool {
        self <= detected()
    }

    fn code(self) -> u8 {
        match self {
            Level::Scalar => 1,
            Level::Avx2 => 2,
            Level::Avx512 => 3,
        }
    }

    fn from_code(c: u8) -> Option<Level> {
        match c {
            1 => Some(Level::Scalar),
            2 => Some(Level::Avx2),
            3 => Some(Level::Avx512),
            _ => None,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = Error;
    fn from_str(s: &str) -> Result<Level> {
        Level::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::invalid("simd level", s, "must be scalar, avx2 or avx512"))
    }
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Level {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("bmi1")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("lzcnt")
        && is_x86_feature_detected!("popcnt");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512cd")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl");
    if avx512 {
        Level::Avx512
    } else if avx2 {
        Level::Avx2
    } else {
        Level::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> Level {
    Level::Scalar
}

/// The best level this CPU supports (probed once).
#[inline]
pub fn detected() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(probe)
}

/// What `QUANTFMT_SIMD` asked for, if set and valid.
fn requested() -> Option<Level> {
    static REQUESTED: OnceLock<Option<Level>> = OnceLock::new();
    *REQUESTED.get_or_init(|| std::env::var("QUANTFMT_SIMD").ok()?.parse().ok())
}

/// The level kernels use when nothing is forced: `QUANTFMT_SIMD` capped at [`detected`].
pub fn configured() -> Level {
    requested().map_or(detected(), |r| r.min(detected()))
}

/// 0: nothing forced; otherwise a [`Level::code`].
static FORCED: AtomicU8 = AtomicU8::new(0);

/// The level the kernels dispatch to now.
#[inline]
pub fn level() -> Level {
    Level::from_code(FORCED.load(Ordering::Relaxed)).unwrap_or_else(configured)
}

/// One line for logs and benchmark headers, e.g. `avx512 (cpu: avx512 + avx512bf16 +
/// avx512vbmi)`, `avx2 (cpu: avx512 + avx512bf16, QUANTFMT_SIMD=avx2)` or `avx512 (cpu:
/// avx512 + avx512bf16; hidden: avx512bf16, QUANTFMT_SIMD_HIDE=all)`.
pub fn describe() -> String {
    let mut s = format!("{} (cpu: {}", level(), detected());
    let names = |keep: fn(Ext) -> bool| {
        let v: Vec<&str> = Ext::ALL
            .into_iter()
            .filter(|&e| keep(e))
            .map(Ext::name)
            .collect();
        v.join(" + ")
    };
    let (cpu, hidden) = (names(Ext::detected), names(|e| e.detected() && !has(e)));
    if !cpu.is_empty() {
        s.push_str(&format!(" + {cpu}"));
    }
    if !hidden.is_empty() {
        s.push_str(&format!("; hidden: {hidden}"));
    }
    if let Ok(v) = std::env::var("QUANTFMT_SIMD") {
        s.push_str(&format!(", QUANTFMT_SIMD={v}"));
    }
    if let Ok(v) = std::env::var("QUANTFMT_SIMD_HIDE") {
        s.push_str(&format!(", QUANTFMT_SIMD_HIDE={v}"));
    }
    s.push(')');
    s
}

/// Runs `f` with every kernel dispatching to `level`, process-wide; `None` (without
/// running `f`) when the CPU lacks the level. Calls are serialized, so two forcing
/// callers never interleave; code running concurrently without forcing may also see the
/// forced level, which is harmless because every level computes the same bits. Meant
/// for tests that check each level against a reference.
pub fn with_level<R>(level: Level, f: impl FnOnce() -> R) -> Option<R> {
    static LOCK: Mutex<()> = Mutex::new(());
    if !level.is_supported() {
        return None;
    }
    Some(with_forced(&LOCK, &FORCED, level.code(), f))
}

/// Runs `f` with `slot` holding `code` (0 again afterwards, even if `f` panics), one
/// caller at a time under `lock`: the forcing pattern of [`with_level`] and
/// [`crate::stream::with_store_mode`].
pub(crate) fn with_forced<R>(
    lock: &Mutex<()>,
    slot: &AtomicU8,
    code: u8,
    f: impl FnOnce() -> R,
) -> R {
    let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    struct Reset<'a>(&'a AtomicU8);
    impl Drop for Reset<'_> {
        fn drop(&mut self) {
            self.0.store(0, Ordering::Relaxed);
        }
    }
    slot.store(code, Ordering::Relaxed);
    let reset = Reset(slot);
    let out = f();
    drop(reset);
    drop(guard);
    out
}

/// Runs `f` compiled for `level` (a level the CPU lacks runs the best one below it).
///
/// Mark the closure `#[inline(always)]` and keep the helpers it calls
/// `#[inline(always)]`: only code inlined into the dispatched function is compiled with
/// the level's instructions. Call it once per block of work (a row slab, a tile), not per
/// element, and not around a rayon call (rayon runs closures in other functions).
#[inline(always)]
pub fn dispatch<R>(level: Level, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match level.min(detected()) {
            // SAFETY: `detected()` confirmed every feature `avx512` enables.
            Level::Avx512 => unsafe { x86::avx512(f) },
            // SAFETY: `detected()` confirmed every feature `avx2` enables.
            Level::Avx2 => unsafe { x86::avx2(f) },
            Level::Scalar => f(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        f()
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128, _mm_unpackhi_epi8,
        _mm_unpacklo_epi8,
    };

    /// 16x16 byte transpose. Interleaving the bytes of rows `i` and `i + 8` into rows
    /// `2i` (low halves) and `2i + 1` (high halves) rotates the 8-bit element address
    /// `row:col` left by one bit; four rounds swap row and column.
    ///
    /// # Safety
    /// `src + i*ss .. + 16` must be readable and `dst + i*ds .. + 16` writable for
    /// `i < 16`.
    #[inline(always)]
    pub(super) unsafe fn transpose_16x16(src: *const u8, ss: usize, dst: *mut u8, ds: usize) {
        // SAFETY: SSE2 is part of the x86-64 baseline; the caller guarantees the rows.
        unsafe {
            let mut r = [_mm_setzero_si128(); 16];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm_loadu_si128(src.add(i * ss).cast::<__m128i>());
            }
            for _ in 0..4 {
                let mut t = [_mm_setzero_si128(); 16];
                for i in 0..8 {
                    t[2 * i] = _mm_unpacklo_epi8(r[i], r[i + 8]);
                    t[2 * i + 1] = _mm_unpackhi_epi8(r[i], r[i + 8]);
                }
                r = t;
            }
            for (i, v) in r.iter().enumerate() {
                _mm_storeu_si128(dst.add(i * ds).cast::<__m128i>(), *v);
            }
        }
    }

    /// `f` compiled with AVX2 + FMA and friends.
    #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
    pub(super) fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// `f` compiled with AVX-512 F/BW/CD/DQ/VL on top of AVX2.
    #[target_feature(
        enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"
    )]
    pub(super) fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// Transposes a `rows x cols` block of bytes: `dst[j * dst_stride + i] =
/// src[i * src_stride + j]`. Full 16x16 sub-blocks go through SSE2 byte unpacks (x86-64
/// baseline, so no dispatch is needed); edges and other targets use a scalar loop.
///
/// Always inlined, so that a caller [`dispatch`]ed at AVX-512 compiles the unpacks with
/// VEX encodings and 32 registers (as a baseline function it spilled its row addresses:
/// the FP8 columnwise dequantize into f32 measured x1.10 faster inlined).
///
/// Panics if a slice is too short for its block (an internal indexing bug).
///
/// ```
/// let src: Vec<u8> = (0..=255).collect(); // 16 x 16
/// let mut dst = vec![0u8; 256];
/// quant_core::simd::transpose_bytes(&src, 16, &mut dst, 16, 16, 16);
/// assert_eq!(dst[1], 16);
/// assert_eq!(dst[16], 1);
/// ```
#[inline(always)]
pub fn transpose_bytes(
    src: &[u8],
    src_stride: usize,
    dst: &mut [u8],
    dst_stride: usize,
    rows: usize,
    cols: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(src.len() >= (rows - 1) * src_stride + cols && cols <= src_stride);
    assert!(dst.len() >= (cols - 1) * dst_stride + rows && rows <= dst_stride);
    let (r16, c16) = (rows / 16 * 16, cols / 16 * 16);
    #[cfg(target_arch = "x86_64")]
    for i in (0..r16).step_by(16) {
        for j in (0..c16).step_by(16) {
            // SAFETY: rows i..i+16 of src cover bytes up to (i+15)*src_stride + j+16 <=
            // (rows-1)*src_stride + cols <= src.len(); likewise for dst with the roles
            // of rows and columns swapped (both asserted above).
            unsafe {
                x86::transpose_16x16(
                    src.as_ptr().add(i * src_stride + j),
                    src_stride,
                    dst.as_mut_ptr().add(j * dst_stride + i),
                    dst_stride,
                )
            }
        }
    }
    let scalar = |dst: &mut [u8], i0: usize, i1: usize, j0: usize, j1: usize| {
        for i in i0..i1 {
            for j in j0..j1 {
                dst[j * dst_stride + i] = src[i * src_stride + j];
            }
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    scalar(dst, 0, r16, 0, c16);
    scalar(dst, 0, r16, c16, cols);
    scalar(dst, r16, rows, 0, cols);
}

/// `dst.copy_from_slice(src)` for short runs: up to 64 bytes as two overlapping
/// fixed-size moves (the largest power of two not above the length), longer ones by
/// `copy_from_slice`.
///
/// `copy_from_slice` of a length known only at run time is a `memcpy` call. The kernels
/// copy many short runs of such lengths: the partial lines at the ends of each
/// streamed run (a columnwise quantize streams runs of 64-128 bytes, each with a head
/// and a tail) and a slab's scale codes per stored row. Those calls were 2-4 % of the
/// NVFP4 columnwise quantize's profile.
///
/// # Panics
///
/// If the lengths differ (as `copy_from_slice`).
///
/// ```
/// let src = [1u8, 2, 3, 4, 5, 6, 7];
/// let mut dst = [0u8; 7];
/// quant_core::simd::copy_short(&mut dst, &src);
/// assert_eq!(dst, src);
/// ```
#[inline(always)]
pub fn copy_short(dst: &mut [u8], src: &[u8]) {
    /// The first and the last `N` bytes (`N <= len <= 2N`: together all of them).
    #[inline(always)]
    fn both_ends<const N: usize>(dst: &mut [u8], src: &[u8]) {
        let n = dst.len();
        let at = |s: &[u8], i: usize| -> [u8; N] { s[i..i + N].try_into().unwrap_or([0; N]) };
        let (first, last) = (at(src, 0), at(src, n - N));
        dst[..N].copy_from_slice(&first);
        dst[n - N..].copy_from_slice(&last);
    }
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_short: dst and src lengths differ"
    );
    match dst.len() {
        0 => {}
        1 => dst[0] = src[0],
        2..4 => both_ends::<2>(dst, src),
        4..8 => both_ends::<4>(dst, src),
        8..16 => both_ends::<8>(dst, src),
        16..32 => both_ends::<16>(dst, src),
        32..=64 => both_ends::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// Hints the CPU to bring `data`'s cache lines into L1 (`prefetcht0`; no-op elsewhere).
///
/// The streaming kernels touch their input once, in spans of a few KiB, and spend as
/// long computing on a span as loading it; prefetching the span a few steps ahead
/// overlaps the two where the hardware prefetcher alone leaves the loads exposed (the
/// hottest instructions of the MXFP8 profile were the first loads of each span).
/// Never changes results.
///
/// ```
/// let xs = vec![1.0f32; 4096];
/// quant_core::simd::prefetch(&xs[1024..2048]);
/// ```
#[inline(always)]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// [`prefetch`] into L2 only (`prefetcht1`): for runs read a page apart, such as the
/// stored rows of a transposed operand. Their lines all fall in a few L1 sets, so
/// prefetched into L1 they evict each other (and the lines being read) before use: the
/// FP8 columnwise dequantize at AVX-512 ran x0.89 with [`prefetch`] against this one on
/// a Zen 4. Never changes results.
///
/// ```
/// let codes = vec![0u8; 1 << 16];
/// for row in 0..16 {
///     quant_core::simd::prefetch_l2(&codes[row * 4096..][..512]);
/// }
/// ```
#[inline(always)]
pub fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// One `prefetch` with `HINT` per 64-byte line of `data`: [`prefetch`] and
/// [`prefetch_l2`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32, T>(data: &[T]) {
    let bytes = std::mem::size_of_val(data);
    let p = data.as_ptr().cast::<i8>();
    for off in (0..bytes).step_by(64) {
        // SAFETY: `off < bytes`, so the address lies inside `data`; a prefetch never
        // faults and has no architectural effect.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.add(off)) }
    }
}

/// An optional AVX-512 extension that kernels use on top of [`Level::Avx512`], each
/// checked with [`has`] where it is used. Not every AVX-512 CPU has them: Ice Lake
/// servers have VBMI but not BF16, Skylake-SP and Cascade Lake neither; every kernel
/// has a route without them at each level, which [`for_each_supported_level`] also runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ext {
    /// AVX512_BF16: `vcvtne2ps2bf16`, f32 to bf16 in one instruction.
    Bf16,
    /// AVX512_VBMI: `vpermb`, `vpermt2b`, byte permutes across the vector.
    Vbmi,
}

impl Ext {
    /// Every extension.
    pub const ALL: [Ext; 2] = [Ext::Bf16, Ext::Vbmi];

    /// The name `is_x86_feature_detected!` and `QUANTFMT_SIMD_HIDE` use.
    pub const fn name(self) -> &'static str {
        match self {
            Ext::Bf16 => "avx512bf16",
            Ext::Vbmi => "avx512vbmi",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Ext::Bf16 => 1,
            Ext::Vbmi => 2,
        }
    }

    /// Whether the CPU has it (cached by `std`).
    #[inline]
    fn detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Ext::Bf16 => is_x86_feature_detected!("avx512bf16"),
                Ext::Vbmi => is_x86_feature_detected!("avx512vbmi"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

impl fmt::Display for Ext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The extensions [`with_extensions_hidden`] hides now (bits of [`Ext::bit`]).
static HIDDEN: AtomicU8 = AtomicU8::new(0);

/// The extensions `QUANTFMT_SIMD_HIDE` hides (read once): a comma-separated list of
/// [`Ext::name`]s, or `all`; unknown names are ignored.
fn env_hidden() -> u8 {
    static ENV: OnceLock<u8> = OnceLock::new();
    *ENV.get_or_init(|| hidden_bits(&std::env::var("QUANTFMT_SIMD_HIDE").unwrap_or_default()))
}

/// The bits of the extensions a `QUANTFMT_SIMD_HIDE` value names.
fn hidden_bits(list: &str) -> u8 {
    list.split(',')
        .map(str::trim)
        .flat_map(|name| {
            Ext::ALL
                .into_iter()
                .filter(move |e| name == "all" || name == e.name())
        })
        .fold(0, |m, e| m | e.bit())
}

/// Whether kernels may use `ext`: the CPU has it and it is not hidden, by
/// `QUANTFMT_SIMD_HIDE=avx512bf16,avx512vbmi` (or `all`, read once) or by
/// [`with_extensions_hidden`]. Never true for an extension the CPU lacks, so a kernel
/// compiled with the extension may run where it is. Hiding one makes the kernels take
/// the routes a CPU without it takes, with the same bits.
///
/// ```
/// use quant_core::simd::{Ext, has, with_extensions_hidden};
/// assert!(!with_extensions_hidden(&Ext::ALL, || has(Ext::Bf16) || has(Ext::Vbmi)));
/// assert!(!with_extensions_hidden(&[Ext::Bf16], || has(Ext::Bf16)));
/// ```
#[inline]
pub fn has(ext: Ext) -> bool {
    (HIDDEN.load(Ordering::Relaxed) | env_hidden()) & ext.bit() == 0 && ext.detected()
}

/// Runs `f` with the extensions `exts` hidden from [`has`], process-wide: the kernels
/// then run as on an AVX-512 CPU without them (all of them: Skylake-SP; BF16: Ice Lake;
/// VBMI: Cooper Lake). Calls are serialized; for tests.
pub fn with_extensions_hidden<R>(exts: &[Ext], f: impl FnOnce() -> R) -> R {
    static LOCK: Mutex<()> = Mutex::new(());
    let bits = exts.iter().fold(0, |m, e| m | e.bit());
    with_forced(&LOCK, &HIDDEN, bits, f)
}

/// Whether the walks that prefetch only where it pays ([`prefetch_pays`]) prefetch:
/// 0 nothing forced, 1 yes, 2 no.
static PREFETCH_FORCED: AtomicU8 = AtomicU8::new(0);

/// Whether a streaming walk should [`prefetch`] its input ahead where the choice is the
/// CPU's, not the walk's: on Intel cores, yes; elsewhere, no. The environment variable
/// `QUANTFMT_PREFETCH=always|never` (read once) or [`with_prefetch`] overrides it.
///
/// Measured on FP8's 1x128 rowwise walk (spans of 4 KiB read in a burst for the block
/// maxima, then encoded), 8192x8192, alternating in one process image: on two cores of
/// an Intel Xeon (Emerald Rapids, a KVM guest) prefetching two spans ahead ran x1.11
/// from bf16 and x1.21 from f32, x1.27 on one core, where one core's demand loads
/// leave the memory latency exposed; on two Zen 4 cores the same prefetches cost
/// x0.69-0.79 (one `prefetcht0` per line, issued while the hardware prefetcher already
/// streams the row). Walks where prefetching paid on both (MXFP8's) call [`prefetch`]
/// directly. Never changes results.
///
/// ```
/// use quant_core::simd::{prefetch_pays, with_prefetch};
/// assert!(with_prefetch(true, prefetch_pays));
/// assert!(!with_prefetch(false, prefetch_pays));
/// ```
#[inline]
pub fn prefetch_pays() -> bool {
    static CHOSEN: OnceLock<bool> = OnceLock::new();
    match PREFETCH_FORCED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => *CHOSEN.get_or_init(|| match std::env::var("QUANTFMT_PREFETCH").as_deref() {
            Ok("always") => true,
            Ok("never") => false,
            _ => cpu_vendor() == *b"GenuineIntel",
        }),
    }
}

/// Runs `f` with [`prefetch_pays`] answering `pays`, process-wide. Calls are
/// serialized; meant for tests that check both choices write the same bytes, and for
/// benchmarks comparing them.
pub fn with_prefetch<R>(pays: bool, f: impl FnOnce() -> R) -> R {
    static LOCK: Mutex<()> = Mutex::new(());
    with_forced(&LOCK, &PREFETCH_FORCED, if pays { 1 } else { 2 }, f)
}

/// The CPU's vendor string (`GenuineIntel`, `AuthenticAMD`, ...); zeros off x86-64.
fn cpu_vendor() -> [u8; 12] {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v = [0u8; 12];
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads registers
        // (the intrinsic is safe on newer toolchains, hence the allowance).
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        for (d, w) in v.chunks_exact_mut(4).zip([r.ebx, r.edx, r.ecx]) {
            d.copy_from_slice(&w.to_le_bytes());
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    [0u8; 12]
}

/// Runs `f` once per level this CPU supports, lowest first, printing a note for each
/// level it skips; returns the levels run. For tests of dispatch-level equality.
pub fn for_each_supported_level(mut f: impl FnMut(Level)) -> Vec<Level> {
    let mut ran = Vec::new();
    for l in Level::ALL {
        if with_level(l, || f(l)).is_some() {
            ran.push(l);
        } else {
            eprintln!(
                "note: skipping SIMD level {l}: this CPU only has {}",
                detected()
            );
        }
    }
    // AVX-512 again without each combination of the optional extensions the CPU has:
    // the routes of the AVX-512 CPUs that lack them.
    let have: Vec<Ext> = Ext::ALL.into_iter().filter(|&e| has(e)).collect();
    for mask in 1..1u32 << have.len() {
        let hide: Vec<Ext> = (have.iter().enumerate())
            .filter(|&(i, _)| mask >> i & 1 == 1)
            .map(|(_, &e)| e)
            .collect();
        let run = || with_extensions_hidden(&hide, || f(Level::Avx512));
        if with_level(Level::Avx512, run).is_some() {
            ran.push(Level::Avx512);
        }
    }
    ran
}

/// Runs `f` at [`Level::Scalar`], then at every level this CPU supports (as
/// [`for_each_supported_level`]), and returns the first level whose result differs from
/// the scalar one; `None` when all agree. For tests of dispatch-level equality. The
/// scalar level is always supported; were it not, `Some(Level::Scalar)` would report it.
///
/// ```
/// use quant_core::simd;
/// let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25).collect();
/// let sum_sq = || {
///     simd::dispatch(simd::level(), #[inline(always)] || {
///         xs.iter().map(|x| x * x).collect::<Vec<f32>>()
///     })
/// };
/// assert_eq!(simd::level_differing_from_scalar(sum_sq), None);
/// ```
pub fn level_differing_from_scalar<R: PartialEq>(mut f: impl FnMut() -> R) -> Option<Level> {
    let Some(want) = with_level(Level::Scalar, &mut f) else {
        return Some(Level::Scalar);
    };
    let mut first = None;
    for_each_supported_level(|level| {
        if first.is_none() && f() != want {
            first = Some(level);
        }
    });
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `copy_short` copies every length up to 80 (past the 64 it is made for) and
    /// touches nothing outside its destination.
    #[test]
    fn copy_short_copies_every_length() {
        let src: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(29) ^ 0x5A).collect();
        for len in 0..=80 {
            let mut buf = vec![0xAAu8; len + 2];
            copy_short(&mut buf[1..len + 1], &src[..len]);
            assert_eq!(&buf[1..len + 1], &src[..len], "length {len}");
            assert_eq!((buf[0], buf[len + 1]), (0xAA, 0xAA), "length {len}");
        }
    }

    #[test]
    fn level_differing_from_scalar_names_the_first_other_level() {
        let other = Level::ALL
            .into_iter()
            .find(|&l| l != Level::Scalar && l.is_supported());
        // `level()` is the forced level: it differs from the scalar run at every other level.
        assert_eq!(level_differing_from_scalar(level), other);
        assert_eq!(level_differing_from_scalar(|| 7), None);
    }

    #[test]
    fn levels_parse_and_order() {
        for l in Level::ALL {
            assert_eq!(l.name().parse::<Level>().unwrap(), l);
            assert_eq!(Level::from_code(l.code()), Some(l));
        }
        assert!("sse9".parse::<Level>().is_err());
        assert!(Level::Scalar < Level::Avx2 && Level::Avx2 < Level::Avx512);
        assert!(Level::Scalar.is_supported());
        assert!(configured() <= detected());
    }

    #[test]
    fn forcing_sets_and_restores() {
        let ran = for_each_supported_level(|l| assert_eq!(level(), l));
        assert_eq!(ran.first(), Some(&Level::Scalar));
        assert_eq!(ran.last(), Some(&detected()));
    }

    #[test]
    fn prefetch_choice_forces_and_restores() {
        let unforced = prefetch_pays();
        assert!(with_prefetch(true, prefetch_pays));
        assert!(!with_prefetch(false, prefetch_pays));
        assert_eq!(prefetch_pays(), unforced);
        if std::env::var_os("QUANTFMT_PREFETCH").is_none() {
            assert_eq!(unforced, cpu_vendor() == *b"GenuineIntel");
        }
    }

    #[test]
    fn hidden_extensions_parse_and_hide() {
        assert_eq!(hidden_bits(""), 0);
        assert_eq!(hidden_bits("avx512bf16"), Ext::Bf16.bit());
        assert_eq!(hidden_bits(" avx512vbmi , nonsense"), Ext::Vbmi.bit());
        assert_eq!(hidden_bits("all"), Ext::Bf16.bit() | Ext::Vbmi.bit());
        with_extensions_hidden(&Ext::ALL, || {
            assert!(Ext::ALL.iter().all(|&e| !has(e)));
            assert!(Ext::ALL.iter().all(|&e| !e.detected()) || describe().contains("hidden"));
        });
        for e in Ext::ALL {
            // Never claimed where the CPU lacks it.
            assert!(!has(e) || e.detected(), "{e}");
        }
    }

    #[test]
    fn cpu_vendor_is_printable_on_x86_64() {
        let v = cpu_vendor();
        if cfg!(target_arch = "x86_64") {
            assert!(v.iter().all(u8::is_ascii_graphic), "{v:?}");
        } else {
            assert_eq!(v, [0; 12]);
        }
    }

    #[test]
    fn byte_transpose_matches_scalar() {
        for (rows, cols) in [(16, 16), (1, 1), (17, 35), (64, 48), (3, 100), (100, 3)] {
            let (ss, ds) = (cols + 5, rows + 3);
            let src: Vec<u8> = (0..rows * ss).map(|i| (i * 7 + i / 11) as u8).collect();
            let mut dst = vec![0xAAu8; cols * ds];
            transpose_bytes(&src, ss, &mut dst, ds, rows, cols);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(dst[j * ds + i], src[i * ss + j], "{rows}x{cols} ({i},{j})");
                }
            }
            for j in 0..cols {
                assert!(dst[j * ds + rows..(j + 1) * ds].iter().all(|&v| v == 0xAA));
            }
        }
    }

    #[test]
    fn every_level_computes_the_same_bits() {
        let xs: Vec<f32> = (0..4099).map(|i| (i as f32 - 2000.0) * 0.37).collect();
        let run = |l| {
            dispatch(
                l,
                #[inline(always)]
                || {
                    xs.iter()
                        .map(|&x| (x * 1.5 + 0.25).to_bits())
                        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b))
                },
            )
        };
        let want = run(Level::Scalar);
        for l in Level::ALL {
            assert_eq!(run(l), want, "{l}");
        }
    }
}
