//! Streaming (non-temporal) stores for outputs too large to stay in cache.
//!
//! An ordinary store to a line that is not in cache first reads the line from memory
//! ("read for ownership"), so writing `n` bytes costs `2n` bytes of memory traffic.
//! Dequantize outputs are two to eight times the size of their input, so on a large
//! tensor that hidden read is the largest single cost (the copy roofline's `memset`
//! does not pay it). A non-temporal store writes a whole line without reading it, but
//! also leaves it out of cache, a loss when the consumer reads the output right away:
//! [`StoreMode::for_output_bytes`] streams only outputs of at least [`STREAM_MIN_BYTES`].
//!
//! Streaming stores must be whole, aligned lines, and a kernel's output rarely starts on
//! a line (a large `Vec` from the system allocator sits 16 bytes past a page). The
//! AVX-512 kernels therefore hand their 64-byte result vectors, in order, to an
//! [`x86::LineWriter`], which re-cuts them into aligned lines (one permute per line) and
//! writes the partial lines at either end with ordinary stores. Staging spans in a
//! buffer and streaming them out afterwards was measured and is slower: the copy's
//! burst of stores cannot overlap the next span's arithmetic the way stores issued
//! between the lookups do. The bytes written are the same in either mode; only the
//! cache behaviour differs.
//!
//! Decoders that build a run of f32 values in cache write it with [`write_f32`]. A
//! decoder that writes many short runs (a columnwise dequantize writes 0.5-2 KiB of each
//! of hundreds of output rows per step) also needs two things from this module: column
//! ranges that start on output lines ([`line_chunks`]), so that no line is split between
//! two runs and written half by ordinary stores, and one fence per task ([`Fence`])
//! instead of one per run, since a fence waits for every streamed line in flight.
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::Element;
#[cfg(target_arch = "x86_64")]
use crate::dtype::FloatsMut;
use crate::simd::Level;

/// Outputs at least this large are written with streaming stores by
/// [`StoreMode::for_output_bytes`]: larger than the last-level cache of the machines this
/// library is tuned on (32 MiB), so a consumer could not have found them in cache anyway.
pub const STREAM_MIN_BYTES: usize = 32 << 20;

/// How a kernel writes its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreMode {
    /// Ordinary stores: the output stays in cache for whoever reads it next.
    Cached,
    /// Non-temporal stores for whole cache lines (no read for ownership).
    Streaming,
}

impl StoreMode {
    /// The mode for an output of `bytes` bytes: [`StoreMode::Streaming`] from
    /// [`STREAM_MIN_BYTES`] up, unless the environment variable
    /// `QUANTFMT_STREAM=always|never` (read once) or [`with_store_mode`] says otherwise.
    ///
    /// ```
    /// use quant_core::stream::{StoreMode, STREAM_MIN_BYTES};
    /// if std::env::var_os("QUANTFMT_STREAM").is_none() {
    ///     assert_eq!(StoreMode::for_output_bytes(4096), StoreMode::Cached);
    ///     assert_eq!(StoreMode::for_output_bytes(STREAM_MIN_BYTES), StoreMode::Streaming);
    /// }
    /// ```
    pub fn for_output_bytes(bytes: usize) -> StoreMode {
        if let Some(mode) = StoreMode::from_code(FORCED.load(Ordering::Relaxed)) {
            return mode;
        }
        match requested() {
            Some(mode) => mode,
            None if bytes >= STREAM_MIN_BYTES => StoreMode::Streaming,
            None => StoreMode::Cached,
        }
    }

    fn code(self) -> u8 {
        match self {
            StoreMode::Cached => 1,
            StoreMode::Streaming => 2,
        }
    }

    fn from_code(code: u8) -> Option<StoreMode> {
        match code {
            1 => Some(StoreMode::Cached),
            2 => Some(StoreMode::Streaming),
            _ => None,
        }
    }
}

/// What `QUANTFMT_STREAM` asked for: `always`, `never`, or nothing (`auto` or unset).
fn requested() -> Option<StoreMode> {
    static REQUESTED: OnceLock<Option<StoreMode>> = OnceLock::new();
    *REQUESTED.get_or_init(|| match std::env::var("QUANTFMT_STREAM").as_deref() {
        Ok("always") => Some(StoreMode::Streaming),
        Ok("never") => Some(StoreMode::Cached),
        _ => None,
    })
}

/// 0: nothing forced; otherwise a [`StoreMode::code`].
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Runs `f` with [`StoreMode::for_output_bytes`] answering `mode` for every size,
/// process-wide. Calls are serialized; meant for tests that check both modes write the
/// same bytes (and for benchmarks comparing them).
///
/// ```
/// use quant_core::stream::{with_store_mode, StoreMode};
/// let mode = with_store_mode(StoreMode::Streaming, || StoreMode::for_output_bytes(64));
/// assert_eq!(mode, StoreMode::Streaming);
/// ```
pub fn with_store_mode<R>(mode: StoreMode, f: impl FnOnce() -> R) -> R {
    static LOCK: Mutex<()> = Mutex::new(());
    crate::simd::with_forced(&LOCK, &FORCED, mode.code(), f)
}

/// One `sfence` for many streamed runs, when it is dropped.
///
/// Streaming stores are weakly ordered: before another thread may rely on them (a rayon
/// task reporting that it is done), a fence must order them. A [`x86::LineWriter`] fences
/// when it is dropped, which costs a wait for every streamed line still in flight; a
/// decoder that streams short runs (512 bytes of each of 16 output rows) spent a third
/// of its time there. Writers built with [`x86::LineWriter::fenced_by`] borrow a `Fence`
/// instead and leave the fence to it: create one per task, before its writers.
///
/// ```
/// use quant_core::simd;
/// use quant_core::stream::{write_f32, Fence, StoreMode};
/// let fence = Fence::new();
/// let mut out = [0f32; 40];
/// for run in out.chunks_mut(20) {
///     write_f32(simd::level(), &[1.5; 20], run, StoreMode::Streaming, &fence);
/// }
/// drop(fence); // the streamed stores are ordered from here on
/// assert_eq!(out, [1.5; 40]);
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    _private: (),
}

impl Fence {
    /// A fence for the writers of one task.
    pub fn new() -> Fence {
        Fence { _private: () }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `sfence` has no operands and is part of SSE (baseline on x86-64).
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
    }
}

/// Writes the f32 values `src` into `dst` (the same length) as `T`, rounded to nearest
/// even where `T` is narrower ([`Element::narrow_slice`]). In [`StoreMode::Streaming`],
/// with `level` at [`Level::Avx512`], the whole lines of `dst` are written with
/// streaming stores through an [`x86::LineWriter`] that leaves its fence to `fence`; at
/// [`Level::Avx2`] too ([`avx2`]: the lines between the run's first and last line
/// boundary, the ends with ordinary stores); otherwise with ordinary stores. The bytes
/// are the same either way. A `level` this CPU lacks takes the ordinary stores.
///
/// Decoders that build a run of f32 values in cache and then write it to a large output
/// end with this call.
///
/// ```
/// use half::bf16;
/// use quant_core::simd;
/// use quant_core::stream::{write_f32, Fence, StoreMode};
/// let src = [1.0f32, 1.00390625, -0.5];
/// let mut out = [bf16::ZERO; 3];
/// write_f32(simd::level(), &src, &mut out, StoreMode::Streaming, &Fence::new());
/// assert_eq!(out.map(f32::from), [1.0, 1.0, -0.5]); // 1 + 2^-8 ties to even
/// ```
#[inline]
pub fn write_f32<T: Element>(
    level: Level,
    src: &[f32],
    dst: &mut [T],
    mode: StoreMode,
    fence: &Fence,
) {
    #[cfg(target_arch = "x86_64")]
    if mode == StoreMode::Streaming && level.is_supported() && src.len() == dst.len() {
        let bf16_hw = crate::simd::has(crate::simd::Ext::Bf16);
        match (level, FloatsMut::of(dst)) {
            // f32 output is a byte copy, streamed at either level.
            (_, Some(FloatsMut::F32(d))) => {
                let (s, d) = (bytemuck::cast_slice(src), bytemuck::cast_slice_mut(d));
                return write_bytes(level, s, d, mode, fence);
            }
            (Level::Avx512, Some(FloatsMut::Bf16(d))) if bf16_hw => {
                // SAFETY: the CPU has AVX-512 F and BW (checked: `Level::Avx512`
                // includes both) and BF16 (`bf16_hw`).
                return unsafe { x86::write_bf16(src, d, fence) };
            }
            (Level::Avx512, Some(FloatsMut::Bf16(d))) => {
                // SAFETY: as above; the integer narrowing needs no BF16.
                return unsafe { x86::write_bf16_int(src, d, fence) };
            }
            (Level::Avx512, Some(FloatsMut::F16(d))) => {
                // SAFETY: as above.
                return unsafe { x86::write_f16(src, d, fence) };
            }
            // SAFETY: the CPU has AVX2 (checked).
            (Level::Avx2, Some(FloatsMut::Bf16(d))) => return unsafe { avx2::write_bf16(src, d) },
            // SAFETY: as above (`Level::Avx2` includes F16C).
            (Level::Avx2, Some(FloatsMut::F16(d))) => return unsafe { avx2::write_f16(src, d) },
            _ => {}
        }
    }
    let _ = (level, mode, fence);
    T::narrow_slice(src, dst);
}

/// Copies `src` into `dst` (the same length). In [`StoreMode::Streaming`] at
/// [`Level::Avx512`] or [`Level::Avx2`] the whole lines of `dst` are written with
/// streaming stores (the fence left to `fence`); otherwise (or at a level this CPU lacks)
/// it is `copy_from_slice`.
///
/// A columnwise quantize writes its transposed codes as short runs of thousands of rows
/// (64 or 128 bytes of each stored row per task): with ordinary stores each of those
/// lines is first read from memory, and runs a page apart defeat the prefetchers that
/// would hide it (one thread, 128-byte runs of 8192 rows: 10.8 ms with ordinary stores
/// against 3.1 ms streamed per 64 MiB on a Zen 4).
///
/// ```
/// use quant_core::simd;
/// use quant_core::stream::{write_bytes, Fence, StoreMode};
/// let src: Vec<u8> = (0..200).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 200];
/// write_bytes(simd::level(), &src, &mut dst, StoreMode::Streaming, &Fence::new());
/// assert_eq!(dst, src);
/// ```
#[inline]
pub fn write_bytes(level: Level, src: &[u8], dst: &mut [u8], mode: StoreMode, fence: &Fence) {
    #[cfg(target_arch = "x86_64")]
    if mode == StoreMode::Streaming && level.is_supported() && src.len() == dst.len() {
        match level {
            // SAFETY: the CPU has AVX-512 F and BW (checked: `Level::Avx512` includes
            // both).
            Level::Avx512 => return unsafe { x86::write_bytes(src, dst, fence) },
            // SAFETY: the CPU has AVX2 (checked).
            Level::Avx2 => return unsafe { avx2::write_bytes(src, dst) },
            Level::Scalar => {}
        }
    }
    let _ = (level, mode, fence);
    dst.copy_from_slice(src);
}

/// Writes the transpose of a block of codes into a column strip: column `j` of the
/// `rows x cols` bytes of `src` (row stride `stride`), that is `rows` bytes, becomes row
/// `j0 + j` of `strip` (whose width is `rows`), with the level and store mode given
/// (streamed lines fenced by `fence`). `scratch` holds `rows * cols` bytes.
///
/// Where the fused kernels run (streaming mode, [`Level::Avx512`] or [`Level::Avx2`],
/// `rows` of 64 or 128, every destination row on a 64-byte line), whole 16-column
/// blocks are transposed in registers and streamed straight into the strip: 64 rows x
/// 16 columns per 512-bit transpose (four 16x16 byte transposes side by side, one per
/// 128-bit lane), each register one whole output line; at AVX2, 32 rows per 256-bit
/// transpose, two registers per line. The rest (and everything elsewhere) goes through
/// `scratch` ([`crate::simd::transpose_bytes`]) and [`write_bytes`] per row, whose
/// 16-byte stores into the scratch bound the transpose on Zen 4
/// (`benchmarks-history.md`). The bytes are the same either way.
///
/// ```
/// use quant_core::simd;
/// use quant_core::stream::{transpose_to_strip, Fence, StoreMode};
/// use quant_core::strips::column_strips;
/// use rayon::prelude::*;
/// let (rows, cols) = (128, 40);
/// let src: Vec<u8> = (0..rows * cols).map(|i| (i * 7) as u8).collect();
/// // A 64-byte-aligned [cols, rows] matrix (one strip of full width).
/// let mut out = quant_core::HostBytes::zeroed(cols * rows);
/// let mut strips: Vec<_> = column_strips(out.as_mut_slice(), rows, rows).unwrap().collect();
/// let fence = Fence::new();
/// let mut scratch = vec![0u8; rows * cols];
/// transpose_to_strip(
///     (simd::level(), StoreMode::Streaming, &fence),
///     (&src, cols, rows, cols),
///     (&mut strips[0], 0),
///     &mut scratch,
/// );
/// drop(strips);
/// drop(fence);
/// for j in 0..cols {
///     for i in 0..rows {
///         assert_eq!(out.as_slice()[j * rows + i], src[i * cols + j]);
///     }
/// }
/// ```
///
/// Always inlined, as [`crate::simd::transpose_bytes`] is: a caller dispatched at a
/// vector level then compiles the scratch route with that level's encodings.
#[inline(always)]
pub fn transpose_to_strip(
    (level, mode, fence): (Level, StoreMode, &Fence),
    (src, stride, rows, cols): (&[u8], usize, usize, usize),
    (strip, j0): (&mut crate::strips::Strip<'_, u8>, usize),
    scratch: &mut [u8],
) {
    let done = transpose_fused(level, mode, (src, stride, rows, cols), (strip, j0));
    crate::simd::transpose_bytes(&src[done..], stride, scratch, rows, rows, cols - done);
    for (jj, run) in scratch.chunks_exact(rows).take(cols - done).enumerate() {
        write_bytes(level, run, strip.row_mut(j0 + done + jj), mode, fence);
    }
}

/// The fused kernels of [`transpose_to_strip`]: writes the leading whole 16-column
/// blocks and returns how many columns that is, or 0 where they do not run.
#[inline]
fn transpose_fused(
    level: Level,
    mode: StoreMode,
    (src, stride, rows, cols): (&[u8], usize, usize, usize),
    (strip, j0): (&mut crate::strips::Strip<'_, u8>, usize),
) -> usize {
    let whole = cols / 16 * 16;
    let fits = mode == StoreMode::Streaming
        && level != Level::Scalar
        && level.is_supported()
        && (rows == 64 || rows == 128)
        && whole > 0
        && cols <= stride
        && src.len() >= (rows - 1) * stride + cols
        && j0 + whole <= strip.rows()
        && strip.col_range().len() == rows;
    if !fits || (0..whole).any(|j| strip.row_mut(j0 + j).as_ptr().align_offset(64) != 0) {
        return 0;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let out = (strip, j0);
        // SAFETY: the CPU has the level (checked above): AVX-512 F and BW, or AVX2;
        // `src` holds `rows` (64 or 128) rows of `whole <= cols <= stride` columns, and
        // rows `j0..j0 + whole` of the strip are `rows` bytes on 64-byte lines (all
        // checked).
        unsafe {
            match level {
                Level::Avx512 => x86::transpose_to_strip(src, stride, rows, whole, out),
                _ => avx2::transpose_to_strip(src, stride, rows, whole, out),
            }
        };
        whole
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = j0;
        0
    }
}

/// Fills `scratch[..dst.len()]` with f32 values by `fill` and writes them into `dst`
/// as [`write_f32`] does in `mode` (its fence left to `fence`): the way for a portable
/// decode loop to stream a large output, where ordinary stores read each output line
/// first. In [`StoreMode::Cached`] it is [`crate::narrowed`], which fills f32 output in
/// place. The bits are those of [`crate::Element::narrow_slice`] either way.
///
/// ```
/// use half::bf16;
/// use quant_core::simd;
/// use quant_core::stream::{Fence, StoreMode, write_filled};
/// let mut out = [bf16::ZERO; 40];
/// let mut scratch = [0f32; 64];
/// let fence = Fence::new();
/// let how = (simd::level(), StoreMode::Streaming, &fence);
/// write_filled(how, &mut out, &mut scratch, |w| {
///     for (i, v) in w.iter_mut().enumerate() {
///         *v = i as f32 / 3.0;
///     }
/// });
/// assert_eq!(out[7], bf16::from_f32(7.0 / 3.0));
/// ```
///
/// Panics if `scratch` is shorter than `dst` (an indexing bug of the caller).
#[inline(always)]
pub fn write_filled<T: Element>(
    (level, mode, fence): (Level, StoreMode, &Fence),
    dst: &mut [T],
    scratch: &mut [f32],
    fill: impl FnOnce(&mut [f32]),
) {
    let scratch = &mut scratch[..dst.len()];
    let in_place = mode == StoreMode::Cached && T::DTYPE == crate::DType::F32;
    // One call of `fill`, so that it inlines into the caller's (dispatched) loop: with
    // two calls, as through `narrowed` and a second branch, LLVM kept the closure out
    // of line, compiled without the caller's target features (x0.35 on an FP8 decode).
    let values: &mut [f32] = match bytemuck::try_cast_slice_mut::<T, f32>(dst) {
        Ok(f) if in_place => f,
        _ => scratch,
    };
    fill(values);
    if !in_place {
        write_f32(level, scratch, dst, mode, fence);
    }
}

/// The column ranges in which a tiled decoder writes `0..k` of rows that start where
/// `row` does: runs of `cols` (at least one line's worth of `T`), except that the first
/// is cut short so that every later one starts on a 64-byte line. Each streamed run then
/// ends where the next begins, so no line is split between two runs, whose halves would
/// otherwise be written with ordinary stores, each missing in cache (on every row when
/// a row is a whole number of lines, as at `k = 8192`; on the first only otherwise).
///
/// ```
/// use quant_core::stream::line_chunks;
/// let buf = vec![0u16; 4096 + 64];
/// let at = buf.as_ptr().align_offset(64) + 8; // 8 elements past a line
/// let runs: Vec<_> = line_chunks(&buf[at..], 4096, 1024).collect();
/// assert_eq!(runs[0], 0..1024 - 8);
/// assert_eq!(runs[1], 1024 - 8..2048 - 8);
/// assert_eq!(runs.last(), Some(&(4096 - 8..4096)));
/// ```
pub fn line_chunks<T>(
    row: &[T],
    k: usize,
    cols: usize,
) -> impl Iterator<Item = Range<usize>> + use<T> {
    let line = 64 / std::mem::size_of::<T>().clamp(1, 64);
    let lead = row.as_ptr().align_offset(64).min(line);
    let first = if lead > 0 && cols > line {
        cols - line + lead
    } else {
        cols.max(1)
    };
    let mut at = 0;
    std::iter::from_fn(move || {
        (at < k).then(|| {
            let width = if at == 0 { first } else { cols.max(1) };
            let run = at..(at + width).min(k);
            at = run.end;
            run
        })
    })
}

/// The spans of `0..k` outside `done`, non-empty, in order: the columns a register route
/// left (it wrote `done`, whole blocks from the first line on) for a decoder's general
/// route.
///
/// ```
/// use quant_core::stream::spans_around;
/// assert_eq!(spans_around(8..72, 80).collect::<Vec<_>>(), [0..8, 72..80]);
/// assert_eq!(spans_around(0..0, 80).collect::<Vec<_>>(), [0..80]);
/// assert_eq!(spans_around(0..80, 80).count(), 0);
/// ```
pub fn spans_around(done: Range<usize>, k: usize) -> impl Iterator<Item = Range<usize>> {
    [0..done.start, done.end..k]
        .into_iter()
        .filter(|s| !s.is_empty())
}

/// `[$f(0), $f(1), .., $f(15)]`: sixteen vectors as an array literal, which LLVM keeps
/// in registers (a loop filling or reassigning an array of vectors compiled to `memcpy`
/// calls in [`transpose_to_strip`]'s kernels).
#[cfg(target_arch = "x86_64")]
macro_rules! sixteen {
    ($f:expr) => {{
        let f = $f;
        [
            f(0),
            f(1),
            f(2),
            f(3),
            f(4),
            f(5),
            f(6),
            f(7),
            f(8),
            f(9),
            f(10),
            f(11),
            f(12),
            f(13),
            f(14),
            f(15),
        ]
    }};
}

/// One round of the 16x16 byte transpose of `crate::simd` on 16 vectors, per 128-bit
/// lane, with the byte interleaves `$lo` and `$hi` of the register width: vector `2i`
/// interleaves the low halves of vectors `i` and `i + 8`, vector `2i + 1` the high ones.
#[cfg(target_arch = "x86_64")]
macro_rules! interleave {
    ($lo:ident, $hi:ident, $r:expr) => {{
        let r = $r;
        sixteen!(|j: usize| if j % 2 == 0 {
            $lo(r[j / 2], r[j / 2 + 8])
        } else {
            $hi(r[j / 2], r[j / 2 + 8])
        })
    }};
}

/// Rows and bytes per block of the transposed walks ([`x86::transposed_blocks`],
/// [`avx2::transposed_blocks`]).
#[cfg(target_arch = "x86_64")]
const WALK: usize = 64;

/// A 64 x 64 byte block of the transposed walks, each stored row's 64 bytes on a line.
#[cfg(target_arch = "x86_64")]
#[repr(align(64))]
struct Stage([u8; WALK * WALK]);

/// The walk both levels' `transposed_blocks` share: for every block of 64 stored rows
/// `j0..j0 + 64` (of `rows`) and 64 bytes `at..at + 64` (of `bytes`), in order of `j0`
/// then `at`, it fetches into L2 its share of the next row block's runs (a row's whole
/// run at a time), copies the block's rows into the stage (`copy(src, line)`, 64 bytes
/// each, in the level's width) and calls `block(stage, j0, at)`, which transposes it.
///
/// Panics as the walks document.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn staged_blocks(
    q: &[u8],
    stride: usize,
    (rows, bytes): (std::ops::Range<usize>, std::ops::Range<usize>),
    copy: impl Fn(&[u8], &mut [u8]),
    mut block: impl FnMut(&Stage, usize, usize),
) {
    const B: usize = WALK;
    assert!(
        rows.len().is_multiple_of(B)
            && bytes.len().is_multiple_of(B)
            && bytes.end <= stride
            && rows.end.checked_mul(stride).is_some_and(|n| n <= q.len()),
        "transposed_blocks: rows {rows:?} and bytes {bytes:?} must be whole blocks of \
         64 inside {} bytes of stride {stride}",
        q.len()
    );
    let mut stage = Stage([0; B * B]);
    let share = B.div_ceil((bytes.len() / B).max(1));
    for j0 in rows.clone().step_by(B) {
        let next = j0 + B;
        for (b, at) in bytes.clone().step_by(B).enumerate() {
            if next < rows.end {
                for j in b * share..((b + 1) * share).min(B) {
                    let run = &q[(next + j) * stride + bytes.start..][..bytes.len()];
                    crate::simd::prefetch_l2(run);
                }
            }
            for (j, line) in stage.0.chunks_exact_mut(B).enumerate() {
                copy(&q[(j0 + j) * stride + at..][..B], line);
            }
            block(&stage, j0, at);
        }
    }
}

/// The AVX2 streamed writes: runs from slices, so unlike the AVX-512
/// [`x86::LineWriter`] they need no re-cutting of vectors. The values up to the run's
/// first 64-byte line boundary and after its last are written with ordinary stores, the
/// whole lines between with two 32-byte streaming stores each (`vmovntdq`, the pair
/// merged in the write-combining buffer). Every function leaves the fence to the
/// caller's [`Fence`].
///
/// Before these, the AVX2 level wrote every large output with ordinary stores, each line
/// read from memory first: the columnwise quantizes, whose transposed runs are short and
/// a page apart, ran at 0.25-0.35 of the copy roofline on Zen 4 with `QUANTFMT_SIMD=avx2`.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::{
        __m128i, __m256, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_stream_si128,
        _mm_unpackhi_epi64, _mm256_castsi128_si256, _mm256_castsi256_si128, _mm256_cvtepu8_epi32,
        _mm256_cvtps_ph, _mm256_extracti128_si256, _mm256_inserti128_si256, _mm256_loadu_ps,
        _mm256_loadu_si256, _mm256_set_m128i, _mm256_setzero_si256, _mm256_store_si256,
        _mm256_storeu_ps, _mm256_storeu_si256, _mm256_stream_ps, _mm256_stream_si256,
        _mm256_unpackhi_epi8, _mm256_unpacklo_epi8,
    };

    use super::StoreMode;

    use crate::bf16_narrow::avx2::narrow16;
    use crate::dtype::bf16_bits;

    /// `dst` as (head, lines, tail): `lines` the whole 64-byte lines of the run, as
    /// elements (`lines.len()` a multiple of `64 / size_of::<T>()`); everything in the
    /// head where the run has no whole line (or its elements sit off their alignment).
    #[inline(always)]
    fn split_lines<T>(dst: &mut [T]) -> (&mut [T], &mut [T], &mut [T]) {
        let per_line = 64 / std::mem::size_of::<T>();
        let lead = dst.as_ptr().align_offset(64);
        if lead >= dst.len() {
            return (dst, &mut [], &mut []);
        }
        let (head, rest) = dst.split_at_mut(lead);
        let whole = rest.len() / per_line * per_line;
        let (lines, tail) = rest.split_at_mut(whole);
        (head, lines, tail)
    }

    /// 32 bytes to `p` with a streaming store.
    ///
    /// # Safety
    /// `p` must be valid for 32 bytes of writes and 32-byte aligned; the CPU must have
    /// AVX.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn stream32(p: *mut u8, v: __m256i) {
        // SAFETY: as the caller promises.
        unsafe { _mm256_stream_si256(p.cast(), v) }
    }

    /// Columns `0..16` of rows `0..32` at `$src` (row stride `$stride`) transposed, as a
    /// `[__m256i; 16]`: vector `j` holds column `j`, rows 0..32 (the AVX-512 kernel's
    /// scheme with two lanes: lane `l` of loaded vector `i` is row `16l + i`).
    ///
    /// Expand only inside an `unsafe` block of code compiled with AVX2, with `$src + i *
    /// $stride .. + 16` readable for `i < 32`.
    macro_rules! transpose_32x16 {
        ($src:expr, $stride:expr) => {{
            let (src, stride): (*const u8, usize) = ($src, $stride);
            let row = |i: usize| _mm_loadu_si128(src.add(i * stride).cast::<__m128i>());
            let lanes = |i: usize| {
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(row(i)), row(16 + i))
            };
            let r = sixteen!(lanes);
            let round =
                |r: [__m256i; 16]| interleave!(_mm256_unpacklo_epi8, _mm256_unpackhi_epi8, r);
            round(round(round(round(r))))
        }};
    }

    /// [`super::transpose_to_strip`] at AVX2 after its checks: columns `0..whole` (a
    /// multiple of 16) of the `rows` (64 or 128) rows of `src`, 32 rows per transpose;
    /// each output row's run written whole, its 32-byte pieces back to back.
    ///
    /// # Safety
    /// The CPU must have AVX2; `src` must hold `(rows - 1) * stride + whole` bytes
    /// (`whole <= stride`); rows `j0..j0 + whole` of `strip` must be `rows` bytes
    /// starting on 64-byte lines.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose_to_strip(
        src: &[u8],
        stride: usize,
        rows: usize,
        whole: usize,
        (strip, j0): (&mut crate::strips::Strip<'_, u8>, usize),
    ) {
        let mut stage = [[_mm256_setzero_si256(); 2]; 16];
        for c0 in (0..whole).step_by(16) {
            let at = |q: usize| src.as_ptr().wrapping_add(32 * q * stride + c0);
            // SAFETY: rows `32q..32q + 32` (`32q + 32 <= rows`) of columns `c0..c0 + 16`
            // lie inside `src` for every `at(q)` used (contract); the CPU has AVX2.
            let (a, b) = unsafe {
                (
                    transpose_32x16!(at(0), stride),
                    transpose_32x16!(at(1), stride),
                )
            };
            if rows == 64 {
                for (j, (a, b)) in a.into_iter().zip(b).enumerate() {
                    let row = &mut strip.row_mut(j0 + c0 + j)[..64];
                    // SAFETY: `row` is 64 bytes on a line (contract).
                    unsafe {
                        stream32(row.as_mut_ptr(), a);
                        stream32(row.as_mut_ptr().add(32), b);
                    }
                }
            } else {
                // The first 64 rows wait in `stage` (16 registers hold one transpose).
                for (st, (a, b)) in stage.iter_mut().zip(a.into_iter().zip(b)) {
                    *st = [a, b];
                }
                // SAFETY: as above, `rows == 128`.
                let (c, d) = unsafe {
                    (
                        transpose_32x16!(at(2), stride),
                        transpose_32x16!(at(3), stride),
                    )
                };
                for (j, (st, (c, d))) in stage.iter().zip(c.into_iter().zip(d)).enumerate() {
                    let row = &mut strip.row_mut(j0 + c0 + j)[..128];
                    // SAFETY: `row` is 128 bytes on a line (contract).
                    unsafe {
                        stream32(row.as_mut_ptr(), st[0]);
                        stream32(row.as_mut_ptr().add(32), st[1]);
                        stream32(row.as_mut_ptr().add(64), c);
                        stream32(row.as_mut_ptr().add(96), d);
                    }
                }
            }
        }
    }

    /// The AVX2 twin of [`super::x86::transposed_blocks`]: the same walk (stored rows
    /// `rows` of `q`, row stride `stride`, bytes `bytes` of each, both whole blocks of 64;
    /// the next row block's runs fetched into L2 a row's run at a time; each 64 x 64
    /// block copied into a contiguous stage in L1), transposed 32 rows at a time, since
    /// a 256-bit vector holds 32 bytes. `visit(j0, at, v)` gets, for every block of 64
    /// stored rows `j0..j0 + 64` and every 16 bytes `at..at + 16`, sixteen pairs of
    /// vectors: `v[t][h]` holds byte `at + t` of rows `j0 + 32h .. j0 + 32h + 32` in
    /// order. Both halves come together so that a decoder writes each output row's 64
    /// values at once, its lines back to back: handed out one half at a time (an output
    /// row's two lines 16 rows' stores apart), the FP8 columnwise dequantize into bf16
    /// and f16 ran x0.87-0.89 against this form (8192x8192 on a 2-vCPU Zen 4). Blocks
    /// come in order of `j0`, then of `at`.
    ///
    /// ```
    /// use quant_core::simd::Level;
    /// # #[cfg(target_arch = "x86_64")] {
    /// if Level::Avx2.is_supported() {
    ///     let (rows, stride) = (128, 192);
    ///     let q: Vec<u8> = (0..rows * stride).map(|i| (i % 251) as u8).collect();
    ///     let mut seen = 0;
    ///     // SAFETY: the CPU has AVX2 (checked above).
    ///     unsafe {
    ///         quant_core::stream::avx2::transposed_blocks(&q, stride, 64..128, 64..192, |j0, at, v| {
    ///             for (t, pair) in v.into_iter().enumerate() {
    ///                 for (h, v) in pair.into_iter().enumerate() {
    ///                     // SAFETY: both types are 32 bytes of plain data.
    ///                     let v: [u8; 32] = std::mem::transmute(v);
    ///                     let row = |j: usize| j0 + 32 * h + j;
    ///                     assert!((0..32).all(|j| v[j] == q[row(j) * stride + at + t]));
    ///                 }
    ///                 seen += 1;
    ///             }
    ///         })
    ///     };
    ///     assert_eq!(seen, 128);
    /// }
    /// # }
    /// ```
    ///
    /// # Panics
    /// As [`super::x86::transposed_blocks`].
    ///
    /// # Safety
    /// The CPU must have AVX2 (code compiled with it calls it safely, and inlines it
    /// there, `visit` too).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn transposed_blocks(
        q: &[u8],
        stride: usize,
        rows: std::ops::Range<usize>,
        bytes: std::ops::Range<usize>,
        mut visit: impl FnMut(usize, usize, [[__m256i; 2]; 16]),
    ) {
        let copy = |src: &[u8], line: &mut [u8]| {
            // SAFETY: `src` and `line` are 64 bytes, `line` on a line (two unaligned
            // loads, two aligned stores).
            unsafe {
                let (lo, hi) = (
                    _mm256_loadu_si256(src.as_ptr().cast()),
                    _mm256_loadu_si256(src.as_ptr().add(32).cast()),
                );
                _mm256_store_si256(line.as_mut_ptr().cast(), lo);
                _mm256_store_si256(line.as_mut_ptr().add(32).cast(), hi);
            }
        };
        super::staged_blocks(q, stride, (rows, bytes), copy, |stage, j0, at| {
            const B: usize = super::WALK;
            for c in (0..B).step_by(16) {
                // SAFETY: the stage holds 64 rows of 64 bytes, so columns `c..c + 16` of
                // its rows `0..32` and `32..64` lie inside it; the CPU has AVX2.
                let (a, b) = unsafe {
                    (
                        transpose_32x16!(stage.0.as_ptr().add(c), B),
                        transpose_32x16!(stage.0.as_ptr().add(32 * B + c), B),
                    )
                };
                visit(j0, at + c, sixteen!(|t: usize| [a[t], b[t]]));
            }
        });
    }

    /// The 32 bytes of `v` zero-extended to u32 lanes, 8 per vector in order: the codes
    /// of a [`transposed_blocks`] vector as its decoder's four steps take them.
    ///
    /// # Safety
    /// The CPU must have AVX2 (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn widen_u8x32(v: __m256i) -> [__m256i; 4] {
        let [a, b, c, d] = eighths_u8x32(v);
        [
            _mm256_cvtepu8_epi32(a),
            _mm256_cvtepu8_epi32(b),
            _mm256_cvtepu8_epi32(c),
            _mm256_cvtepu8_epi32(d),
        ]
    }

    /// The 32 bytes of `v` as four 8-byte pieces, in order, each in the low half of a
    /// 128-bit vector (the high half unspecified): for decoders that widen codes
    /// themselves (sign-extending, say).
    ///
    /// # Safety
    /// The CPU must have AVX2 (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn eighths_u8x32(v: __m256i) -> [__m128i; 4] {
        let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        [
            lo,
            _mm_unpackhi_epi64(lo, lo),
            hi,
            _mm_unpackhi_epi64(hi, hi),
        ]
    }

    /// `src[..32]` in four vectors, in order: a run of 32 scales or factors.
    ///
    /// # Panics
    /// If `src` is shorter than 32.
    ///
    /// # Safety
    /// The CPU must have AVX (code compiled with AVX2 calls it safely).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn load_f32x32(src: &[f32]) -> [__m256; 4] {
        let s = &src[..32];
        // SAFETY: `s` is 32 f32 (four unaligned 256-bit loads).
        unsafe {
            [
                _mm256_loadu_ps(s.as_ptr()),
                _mm256_loadu_ps(s.as_ptr().add(8)),
                _mm256_loadu_ps(s.as_ptr().add(16)),
                _mm256_loadu_ps(s.as_ptr().add(24)),
            ]
        }
    }

    /// 32 f32 values (four vectors, in order) narrowed to bf16 bits, two vectors of 16
    /// (one 64-byte line): [`narrow16`], or [`crate::bf16_narrow::avx2::narrow16_no_nan`]
    /// where `no_nan` (no lane is NaN; the caller knows). The bits of [`bf16_bits`].
    ///
    /// # Safety
    /// The CPU must have AVX2 (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn bf16_line(v: [__m256; 4], no_nan: bool) -> [__m256i; 2] {
        use crate::bf16_narrow::avx2::narrow16_no_nan;
        if no_nan {
            [narrow16_no_nan(v[0], v[1]), narrow16_no_nan(v[2], v[3])]
        } else {
            [narrow16(v[0], v[1]), narrow16(v[2], v[3])]
        }
    }

    /// 32 f32 values narrowed to f16 bits by `vcvtps2ph` (round to nearest even, as
    /// [`write_u16_steps`]' f16 callers narrow), two vectors of 16 (one 64-byte line).
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C (both part of `Level::Avx2`).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub fn f16_line(v: [__m256; 4]) -> [__m256i; 2] {
        let half = |v| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        [
            _mm256_set_m128i(half(v[1]), half(v[0])),
            _mm256_set_m128i(half(v[3]), half(v[2])),
        ]
    }

    /// Streams `v` (32-byte pieces) to `dst` back to back: the whole lines of one output
    /// row's run that a [`transposed_blocks`] decoder computed.
    ///
    /// # Safety
    /// `dst` must be valid for `32 * N` bytes of writes and start on a 64-byte line; the
    /// CPU must have AVX.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn stream_lines<const N: usize>(dst: *mut u8, v: [__m256i; N]) {
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: piece `i` lies inside the caller's `32 * N` bytes, 32-byte aligned.
            unsafe { stream32(dst.add(32 * i), v) }
        }
    }

    /// [`super::write_bytes`], streamed (AVX2).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn write_bytes(src: &[u8], dst: &mut [u8]) {
        let (head, lines, tail) = split_lines(dst);
        let (h, l) = (head.len(), lines.len());
        crate::simd::copy_short(head, &src[..h]);
        for (s, d) in src[h..h + l]
            .chunks_exact(32)
            .zip(lines.chunks_exact_mut(32))
        {
            // SAFETY: `s` is 32 bytes (one unaligned load); `d` is 32 bytes starting on a
            // line or half a line (`lines` starts on a line and is whole lines), so the
            // streaming store is aligned and in bounds; the CPU has AVX2 (this
            // function's feature).
            unsafe { stream32(d.as_mut_ptr(), _mm256_loadu_si256(s.as_ptr().cast())) };
        }
        crate::simd::copy_short(tail, &src[h + l..]);
    }

    /// [`super::write_f32`] into bf16 bits: 16 values per 32-byte streaming store,
    /// narrowed by [`narrow16`]; the ends by [`bf16_bits`] (the same bits).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn write_bf16(src: &[f32], dst: &mut [u16]) {
        let (head, lines, tail) = split_lines(dst);
        let (h, l) = (head.len(), lines.len());
        for (o, &x) in head.iter_mut().zip(src) {
            *o = bf16_bits(x);
        }
        for (s, d) in src[h..h + l]
            .chunks_exact(16)
            .zip(lines.chunks_exact_mut(16))
        {
            // SAFETY: `s` is 16 f32 (two unaligned loads); `d` is 16 u16 = 32 bytes on a
            // line or half a line, as in `write_bytes`; the CPU has AVX2.
            unsafe {
                let v = narrow16(
                    _mm256_loadu_ps(s.as_ptr()),
                    _mm256_loadu_ps(s[8..].as_ptr()),
                );
                stream32(d.as_mut_ptr().cast(), v);
            }
        }
        for (o, &x) in tail.iter_mut().zip(&src[h + l..]) {
            *o = bf16_bits(x);
        }
    }

    /// Fills `out` in `mode` from `step(j)`, the values `j .. j + 8` in a register, for
    /// every whole 8 of them (in [`StoreMode::Streaming`], those of the whole lines
    /// between the run's first and last line boundary, two steps per line), the rest
    /// one by one from `one(j)`: the loop of a decoder that computes a run of f32 values
    /// in registers (each step must equal `one` lane for lane). The fence is left to the
    /// caller's [`super::Fence`].
    ///
    /// Carries the AVX2 level's features, as the dispatched caller's closures do (a
    /// function with fewer features could not inline them).
    ///
    /// # Safety
    /// The CPU must have the AVX2 level's features (code compiled with them calls it
    /// safely).
    #[inline]
    #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
    pub fn write_f32_steps(
        out: &mut [f32],
        mode: StoreMode,
        step: impl Fn(usize) -> __m256,
        one: impl Fn(usize) -> f32,
    ) {
        steps(out, mode, 8, one, |j, d: &mut [f32], stream| {
            // SAFETY: `d` is 8 f32 = 32 bytes (an unaligned store); streamed, it starts
            // on a line or half a line inside the run's whole lines (`steps`), so the
            // streaming store is aligned and in bounds; the CPU has AVX2.
            unsafe {
                let v = step(j);
                if stream {
                    _mm256_stream_ps(d.as_mut_ptr(), v);
                } else {
                    _mm256_storeu_ps(d.as_mut_ptr(), v);
                }
            }
        });
    }

    /// [`write_f32_steps`] for 16-bit output: `step(j)` gives the bits of the values
    /// `j .. j + 16`, `one(j)` those of value `j`.
    ///
    /// # Safety
    /// As [`write_f32_steps`].
    #[inline]
    #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
    pub fn write_u16_steps(
        out: &mut [u16],
        mode: StoreMode,
        step: impl Fn(usize) -> __m256i,
        one: impl Fn(usize) -> u16,
    ) {
        steps(out, mode, 16, one, |j, d: &mut [u16], stream| {
            // SAFETY: `d` is 16 u16 = 32 bytes, as in `write_f32_steps`.
            unsafe {
                let v = step(j);
                if stream {
                    stream32(d.as_mut_ptr().cast(), v);
                } else {
                    _mm256_storeu_si256(d.as_mut_ptr().cast(), v);
                }
            }
        });
    }

    /// The loop of the step writers: `store(j, out[j..j + per], stream)` for each
    /// 32-byte step (`per` elements), `out[j] = one(j)` for the rest. Streamed, the
    /// steps are the whole lines of [`split_lines`] and the ends go one by one; cached,
    /// every whole step from the start.
    #[inline(always)]
    fn steps<T: Copy>(
        out: &mut [T],
        mode: StoreMode,
        per: usize,
        one: impl Fn(usize) -> T,
        mut store: impl FnMut(usize, &mut [T], bool),
    ) {
        let (stream, h, len) = match mode {
            StoreMode::Streaming => {
                let (head, lines, _) = split_lines(out);
                (true, head.len(), lines.len())
            }
            StoreMode::Cached => (false, 0, out.len() / per * per),
        };
        let (head, rest) = out.split_at_mut(h);
        let (body, tail) = rest.split_at_mut(len);
        for (j, o) in head.iter_mut().enumerate() {
            *o = one(j);
        }
        for (s, d) in body.chunks_exact_mut(per).enumerate() {
            store(h + s * per, d, stream);
        }
        for (j, o) in (h + len..).zip(tail) {
            *o = one(j);
        }
    }

    /// [`super::write_f32`] into f16 bits: 8 values per 16-byte streaming store,
    /// narrowed by `vcvtps2ph` with round-to-nearest-even (the instruction
    /// [`crate::Element::narrow_slice`] uses for f16); the ends by that narrowing.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C (both part of `Level::Avx2`).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn write_f16(src: &[f32], dst: &mut [u16]) {
        use crate::Element;
        let (head, lines, tail) = split_lines(dst);
        let (h, l) = (head.len(), lines.len());
        let narrow = |s: &[f32], d: &mut [u16]| {
            half::f16::narrow_slice(s, bytemuck::cast_slice_mut(d));
        };
        narrow(&src[..h], head);
        for (s, d) in src[h..h + l].chunks_exact(8).zip(lines.chunks_exact_mut(8)) {
            // SAFETY: `s` is 8 f32 (one unaligned load); `d` is 8 u16 = 16 bytes at a
            // 16-byte multiple past a line, inside `lines`; the CPU has AVX2 and F16C.
            unsafe {
                let v = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_stream_si128(d.as_mut_ptr().cast(), v);
            }
        }
        narrow(&src[h + l..], tail);
    }
}

/// The AVX-512 line writer, and the register walk of transposed bytes (x86-64 only).
///
/// [`x86::transposed_blocks`] hands a decoder 64 stored rows' bytes transposed:
///
/// ```
/// use quant_core::simd::{self, Level};
/// # #[cfg(target_arch = "x86_64")] {
/// if simd::level() == Level::Avx512 {
///     let (rows, stride) = (128, 192);
///     let q: Vec<u8> = (0..rows * stride).map(|i| (i % 251) as u8).collect();
///     let mut seen = 0;
///     // SAFETY: the CPU has AVX-512 F and BW (the level says so).
///     unsafe {
///         quant_core::stream::x86::transposed_blocks(&q, stride, 64..128, 64..192, |j0, at, v| {
///             for (t, v) in v.into_iter().enumerate() {
///                 // SAFETY: both types are 64 bytes of plain data.
///                 let v: [u8; 64] = std::mem::transmute(v);
///                 assert!((0..64).all(|j| v[j] == q[(j0 + j) * stride + at + t]));
///                 seen += 1;
///             }
///         })
///     };
///     assert_eq!(seen, 128);
/// }
/// # }
/// ```
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::{
        __m128i, __m512, __m512i, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128,
        _mm_sfence, _mm512_castps_si512, _mm512_castsi128_si512, _mm512_castsi256_si512,
        _mm512_castsi512_si128, _mm512_cvtepu8_epi32, _mm512_cvtps_ph, _mm512_extracti32x4_epi32,
        _mm512_inserti32x4, _mm512_inserti64x4, _mm512_loadu_ps, _mm512_loadu_si512,
        _mm512_permutex2var_epi16, _mm512_setzero_si512, _mm512_store_si512, _mm512_storeu_si512,
        _mm512_stream_si512, _mm512_unpackhi_epi8, _mm512_unpacklo_epi8,
    };

    use super::{Fence, StoreMode};
    use crate::dtype::bf16_bits;

    /// Columns `0..16` of rows `0..64` at `$src` (row stride `$stride`) transposed, as a
    /// `[__m512i; 16]`: vector `j` holds column `j`, rows 0..64 in order. Lane `l` of the
    /// loaded vector `i` is row `16l + i`, so the 16x16 byte transpose of
    /// [`crate::simd`] (four rounds of byte interleaves), run on 512-bit vectors,
    /// transposes the four row blocks side by side: lane `l` of result `j` is column `j`
    /// of rows `16l..16l + 16`. A macro, not a function: a `#[target_feature]` function
    /// cannot be forced inline, and out of line its results went through memory.
    ///
    /// Expand only inside an `unsafe` block of code compiled with AVX-512 F and BW, with
    /// `$src + i * $stride .. + 16` readable for `i < 64`.
    macro_rules! transpose_64x16 {
        ($src:expr, $stride:expr) => {{
            let (src, stride): (*const u8, usize) = ($src, $stride);
            let row = |i: usize| _mm_loadu_si128(src.add(i * stride).cast::<__m128i>());
            let lanes = |i: usize| {
                let a = _mm512_castsi128_si512(row(i));
                let a = _mm512_inserti32x4::<1>(a, row(16 + i));
                let a = _mm512_inserti32x4::<2>(a, row(32 + i));
                _mm512_inserti32x4::<3>(a, row(48 + i))
            };
            let r = sixteen!(lanes);
            let round =
                |r: [__m512i; 16]| interleave!(_mm512_unpacklo_epi8, _mm512_unpackhi_epi8, r);
            round(round(round(round(r))))
        }};
    }

    /// The register walk of a transposed byte operand, for decoders that write it back
    /// in the logical layout: stored rows `rows` of `q` (row stride `stride`), bytes
    /// `bytes` of each, both whole blocks of 64. `visit(j0, at, v)` gets, for every
    /// block of 64 stored rows `j0..j0 + 64` and every 16 bytes `at..at + 16` in
    /// `bytes`, sixteen vectors: `v[t]` holds byte `at + t` of those rows in order, the
    /// next 64 values (or pairs of nibbles) of the logical row that byte stands for.
    /// Blocks come in order of `j0`, then of `at`. (One call per vector instead, the
    /// FP8 decoder loading its scales per call, ran x0.95.)
    ///
    /// Per block of 64 stored rows and 64 bytes, the walk
    /// - prefetches into L2 its share of the next row block's bytes, a row's whole run at
    ///   a time (the rows are `stride` apart, which no hardware prefetcher follows; one
    ///   line of each of the 64 rows per 64-byte block instead ran x0.80 in the FP8
    ///   columnwise dequantize on a 2-vCPU Zen 4);
    /// - copies the 64 x 64 bytes into a contiguous stage in L1: read in place, at a
    ///   stride of a power of two, all 64 rows fall in one L1 set (x0.62);
    /// - transposes the stage in four 64 x 16 blocks in registers (`transpose_64x16!`).
    ///
    /// The module's example walks one. (Rustdoc does not run examples on functions with
    /// `#[target_feature]`.)
    ///
    /// # Panics
    /// If `rows` or `bytes` is not whole blocks of 64, `bytes` runs past `stride`, or the
    /// rows past `q`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW (code compiled with them calls it safely, and
    /// inlines it there, `visit` too).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub fn transposed_blocks(
        q: &[u8],
        stride: usize,
        rows: std::ops::Range<usize>,
        bytes: std::ops::Range<usize>,
        mut visit: impl FnMut(usize, usize, [__m512i; 16]),
    ) {
        let copy = |src: &[u8], line: &mut [u8]| {
            // SAFETY: `src` and `line` are 64 bytes, `line` on a line (an unaligned
            // load, an aligned store).
            unsafe {
                let v = _mm512_loadu_si512(src.as_ptr().cast());
                _mm512_store_si512(line.as_mut_ptr().cast(), v)
            }
        };
        super::staged_blocks(q, stride, (rows, bytes), copy, |stage, j0, at| {
            const B: usize = super::WALK;
            for c in (0..B).step_by(16) {
                // SAFETY: the stage holds 64 rows of 64 bytes, so columns `c..c + 16` of
                // its rows `0..64` lie inside it; the CPU has AVX-512 F and BW.
                let v = unsafe { transpose_64x16!(stage.0.as_ptr().add(c), B) };
                visit(j0, at + c, v);
            }
        });
    }

    /// The 64 bytes of `v` zero-extended to u32 lanes, 16 per vector in order: the codes
    /// of a [`transposed_blocks`] vector as its decoder's four steps take them.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn widen_u8x64(v: __m512i) -> [__m512i; 4] {
        [
            _mm512_cvtepu8_epi32(_mm512_castsi512_si128(v)),
            _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32::<1>(v)),
            _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32::<2>(v)),
            _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32::<3>(v)),
        ]
    }

    /// `src[..64]` in four vectors, in order: a run of 64 scales or factors, or a row
    /// of 64 results, for the line helpers below. (Spelled out, not `array::map`: kernels
    /// keep `map` out of their hot loops, where a build without LTO may leave it a call.)
    ///
    /// # Panics
    /// If `src` is shorter than 64.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn load_f32x64(src: &[f32]) -> [__m512; 4] {
        let s = &src[..64];
        // SAFETY: `s` is 64 f32 (four unaligned 512-bit loads).
        unsafe {
            [
                _mm512_loadu_ps(s.as_ptr()),
                _mm512_loadu_ps(s.as_ptr().add(16)),
                _mm512_loadu_ps(s.as_ptr().add(32)),
                _mm512_loadu_ps(s.as_ptr().add(48)),
            ]
        }
    }

    /// 64 f32 values (four vectors, in order) as four 64-byte lines of f32, for kernels
    /// that stream whole lines themselves ([`transposed_blocks`]' decoders).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn f32_lines(v: [__m512; 4]) -> [__m512i; 4] {
        [
            _mm512_castps_si512(v[0]),
            _mm512_castps_si512(v[1]),
            _mm512_castps_si512(v[2]),
            _mm512_castps_si512(v[3]),
        ]
    }

    /// [`f32_lines`] into two lines of bf16 bits, narrowed by
    /// [`crate::bf16_narrow::x86::narrow32_exact`]: the bits of [`bf16_bits`].
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, DQ and BF16 (code compiled with them calls it
    /// safely).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
    pub fn bf16_lines(v: [__m512; 4]) -> [__m512i; 2] {
        use crate::bf16_narrow::x86::narrow32_exact;
        [narrow32_exact(v[0], v[1]), narrow32_exact(v[2], v[3])]
    }

    /// [`f32_lines`] into two lines of f16 bits, narrowed by `vcvtps2ph` as
    /// [`write_f16_steps`] narrows.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (code compiled with it calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn f16_lines(v: [__m512; 4]) -> [__m512i; 2] {
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let pair = |lo, hi| {
            let lo = _mm512_cvtps_ph::<NEAREST>(lo);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm512_cvtps_ph::<NEAREST>(hi))
        };
        [pair(v[0], v[1]), pair(v[2], v[3])]
    }

    /// [`super::transpose_to_strip`] after its checks: columns `0..whole` (a multiple
    /// of 16) of the `rows` (64 or 128) rows of `src`. Each output row's run is
    /// written whole, its lines back to back.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src` must hold `(rows - 1) * stride +
    /// whole` bytes (`whole <= stride`); rows `j0..j0 + whole` of `strip` must be `rows`
    /// bytes starting on 64-byte lines.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn transpose_to_strip(
        src: &[u8],
        stride: usize,
        rows: usize,
        whole: usize,
        (strip, j0): (&mut crate::strips::Strip<'_, u8>, usize),
    ) {
        for c0 in (0..whole).step_by(16) {
            // SAFETY: rows `0..64` of columns `c0..c0 + 16` lie inside `src` (contract);
            // the CPU has AVX-512 F and BW (this function's features).
            let first = unsafe { transpose_64x16!(src.as_ptr().add(c0), stride) };
            if rows == 64 {
                for (j, line) in first.into_iter().enumerate() {
                    let row = &mut strip.row_mut(j0 + c0 + j)[..64];
                    // SAFETY: `row` is 64 bytes on a line (contract).
                    unsafe { _mm512_stream_si512(row.as_mut_ptr().cast(), line) };
                }
            } else {
                // SAFETY: rows `64..128` of columns `c0..c0 + 16` lie inside `src`
                // (contract, `rows == 128`); the CPU has AVX-512 F and BW.
                let second =
                    unsafe { transpose_64x16!(src.as_ptr().add(64 * stride + c0), stride) };
                for (j, (a, b)) in first.into_iter().zip(second).enumerate() {
                    let row = &mut strip.row_mut(j0 + c0 + j)[..128];
                    // SAFETY: `row` is 128 bytes on a line (contract).
                    unsafe {
                        _mm512_stream_si512(row.as_mut_ptr().cast(), a);
                        _mm512_stream_si512(row.as_mut_ptr().add(64).cast(), b);
                    }
                }
            }
        }
    }

    /// How a [`LineWriter`] stores.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Cut {
        /// Ordinary unaligned stores (cached mode, or an odd start address).
        Plain,
        /// Streaming stores of the vectors as they come (the span starts on a line).
        Aligned,
        /// Streaming stores of lines re-cut from consecutive vectors (the span starts an
        /// even number of bytes past a line).
        Recut,
    }

    /// Writes 64-byte vectors to consecutive positions of a byte span: vector `i` goes to
    /// bytes `64·i .. 64·i + 64`, in the [`StoreMode`] given.
    ///
    /// Streaming, the span's whole lines are written with non-temporal stores: where the
    /// span starts `o` bytes past a line (`o` even), each line is the last `o` bytes of
    /// one vector followed by the first `64 - o` of the next (one `vpermt2w`), and the
    /// partial lines at the two ends take ordinary byte stores. An odd start writes
    /// ordinary stores throughout. Dropping the writer stores the last partial line and
    /// fences, so the bytes are visible to other threads in the usual way afterwards.
    ///
    /// Construct it and push only inside code compiled with AVX-512 F and BW (the
    /// methods carry those target features).
    pub struct LineWriter<'a> {
        dst: &'a mut [u8],
        /// Whether dropping the writer fences (no [`Fence`] took that over).
        fences: bool,
        /// Bytes pushed so far.
        at: usize,
        cut: Cut,
        /// [`Cut::Recut`]: bytes from the span's start to its first line boundary.
        lead: usize,
        /// [`Cut::Recut`]: the last vector pushed.
        prev: __m512i,
        /// [`Cut::Recut`]: `vpermt2w` indices joining `prev` and the next vector.
        index: __m512i,
    }

    impl<'a> LineWriter<'a> {
        /// A writer of `dst` in `mode`.
        ///
        /// # Safety
        ///
        /// The CPU must have AVX-512 F and BW. Code compiled with both calls it as a
        /// safe function; elsewhere the call is `unsafe`.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        pub fn new(mode: StoreMode, dst: &'a mut [u8]) -> LineWriter<'a> {
            let lead = dst.as_ptr().align_offset(64);
            let cut = match mode {
                StoreMode::Cached => Cut::Plain,
                StoreMode::Streaming if lead == 0 => Cut::Aligned,
                StoreMode::Streaming if lead.is_multiple_of(2) && lead < dst.len() => Cut::Recut,
                StoreMode::Streaming => Cut::Plain,
            };
            let h = (lead / 2) as i16;
            let idx: [i16; 32] = std::array::from_fn(|l| h + l as i16);
            LineWriter {
                dst,
                fences: true,
                at: 0,
                cut,
                lead,
                prev: _mm512_setzero_si512(),
                // SAFETY: `idx` is 32 i16 = 64 bytes (one unaligned 512-bit load).
                index: unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) },
            }
        }

        /// A writer of `dst` in `mode` that does not fence when dropped: `fence`, which
        /// outlives it, does.
        ///
        /// # Safety
        ///
        /// As for [`LineWriter::new`].
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        pub fn fenced_by(fence: &'a Fence, mode: StoreMode, dst: &'a mut [u8]) -> LineWriter<'a> {
            let _ = fence;
            let mut w = LineWriter::new(mode, dst);
            w.fences = false;
            w
        }

        /// Writes `v` to the next 64 bytes of the span.
        ///
        /// # Panics
        ///
        /// If the span has no 64 bytes left.
        ///
        /// # Safety
        ///
        /// As for [`LineWriter::new`] (a writer exists only where it held).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        pub fn push(&mut self, v: __m512i) {
            let at = self.at;
            assert!(
                at + 64 <= self.dst.len(),
                "LineWriter::push past the end of its span"
            );
            let p = self.dst.as_mut_ptr();
            match self.cut {
                // SAFETY: bytes `at .. at + 64` lie inside `dst` (asserted above).
                Cut::Plain => unsafe { _mm512_storeu_si512(p.add(at).cast(), v) },
                // SAFETY: as above, and `p + at` is 64-byte aligned (`dst` starts on a
                // line and `at` is a multiple of 64).
                Cut::Aligned => unsafe { _mm512_stream_si512(p.add(at).cast(), v) },
                Cut::Recut if at == 0 => self.head(v),
                Cut::Recut => {
                    let line = _mm512_permutex2var_epi16(self.prev, self.index, v);
                    // SAFETY: the line is bytes `lead + at - 64 .. lead + at` of `dst`,
                    // inside it (`lead < 64` and `at + 64 <= dst.len()`), and starts on
                    // a line boundary (`p + lead` is aligned, `at` a multiple of 64).
                    unsafe { _mm512_stream_si512(p.add(self.lead + at - 64).cast(), line) };
                }
            }
            self.prev = v;
            self.at = at + 64;
        }

        /// [`LineWriter::push`] of a recut span's first vector: its first `lead` bytes
        /// end the line before the span's first boundary. Plain byte stores: an AVX-512
        /// masked store to a line not in cache cost more than the streaming saved (Zen
        /// 4). Out of line, once per span, so that `push` stays small enough to inline
        /// into the decode loops (where it was a call, every vector register was
        /// caller-saved around it).
        #[cold]
        #[inline(never)]
        fn head(&mut self, v: __m512i) {
            let lead = self.lead;
            crate::simd::copy_short(&mut self.dst[..lead], &bytes(v)[..lead]);
        }
    }

    /// The 64 bytes of `v`, in memory order.
    #[inline(always)]
    fn bytes(v: __m512i) -> [u8; 64] {
        // SAFETY: both types are 64 bytes of plain data; every bit pattern is valid for
        // either.
        unsafe { std::mem::transmute::<__m512i, [u8; 64]>(v) }
    }

    /// [`super::write_bytes`], streamed.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn write_bytes(src: &[u8], dst: &mut [u8], fence: &Fence) {
        let main = src.len() / 64 * 64;
        let (head, tail) = dst.split_at_mut(main);
        {
            let mut w = LineWriter::fenced_by(fence, StoreMode::Streaming, head);
            for s in src[..main].chunks_exact(64) {
                // SAFETY: `s` is 64 bytes (one unaligned 512-bit load).
                w.push(unsafe { _mm512_loadu_si512(s.as_ptr().cast()) });
            }
        }
        crate::simd::copy_short(tail, &src[main..]);
    }

    /// [`super::write_f32`] into bf16 bits, narrowed in registers and streamed.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
    pub(super) fn write_bf16(src: &[f32], dst: &mut [u16], fence: &Fence) {
        let how = (StoreMode::Streaming, fence);
        write_bf16_steps(dst, how, |j| load16(src, j), |j| src[j]);
    }

    /// [`write_bf16`] on a CPU without AVX-512 BF16 (the same bits), streamed.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn write_bf16_int(src: &[f32], dst: &mut [u16], fence: &Fence) {
        let how = (StoreMode::Streaming, fence);
        write_bf16_int_steps(dst, how, |j| load16(src, j), |j| src[j]);
    }

    /// [`super::write_f32`] into f16 bits, narrowed in registers and streamed.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn write_f16(src: &[f32], dst: &mut [u16], fence: &Fence) {
        let how = (StoreMode::Streaming, fence);
        write_f16_steps(dst, how, |j| load16(src, j), |j| src[j]);
    }

    /// `src[j .. j + 16]` in a register: the step of the narrowing writes of a run.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load16(src: &[f32], j: usize) -> __m512 {
        let s = &src[j..j + 16];
        // SAFETY: `s` is 16 f32 (one unaligned 512-bit load).
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// Fills `out` through a [`LineWriter`] in `mode` (its fence left to `fence`): the
    /// values `j .. j + 16` from `step(j)` for every whole 16 of them, the rest one by
    /// one from `one(j)`. The shared loop of the decoders that compute a run of f32
    /// values in registers (each step must equal `one` lane for lane).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW (code compiled with them calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub fn write_f32_steps(
        out: &mut [f32],
        (mode, fence): (StoreMode, &Fence),
        step: impl Fn(usize) -> __m512,
        one: impl Fn(usize) -> f32,
    ) {
        let main = out.len() / 16 * 16;
        let (head, tail) = out.split_at_mut(main);
        {
            let mut w = LineWriter::fenced_by(fence, mode, bytemuck::cast_slice_mut(head));
            for j in (0..main).step_by(16) {
                w.push(_mm512_castps_si512(step(j)));
            }
        }
        for (j, o) in (main..).zip(tail) {
            *o = one(j);
        }
    }

    /// The bf16 step writers: one loop, two narrowings, each function with the target
    /// features of its narrowing (a function compiled without a callee's features cannot
    /// inline it).
    macro_rules! bf16_steps {
        ($(#[$doc:meta])* $name:ident, $features:literal, $narrow:path) => {
            $(#[$doc])*
            #[inline]
            #[target_feature(enable = $features)]
            pub fn $name(
                out: &mut [u16],
                (mode, fence): (StoreMode, &Fence),
                step: impl Fn(usize) -> __m512,
                one: impl Fn(usize) -> f32,
            ) {
                let main = out.len() / 32 * 32;
                let (head, tail) = out.split_at_mut(main);
                {
                    let mut w =
                        LineWriter::fenced_by(fence, mode, bytemuck::cast_slice_mut(head));
                    for j in (0..main).step_by(32) {
                        w.push($narrow(step(j), step(j + 16)));
                    }
                }
                for (j, o) in (main..).zip(tail) {
                    *o = bf16_bits(one(j));
                }
            }
        };
    }

    bf16_steps!(
        /// [`write_f32_steps`] into bf16 bits: 32 values per step, `step(j)` and
        /// `step(j + 16)` narrowed by [`crate::bf16_narrow::x86::narrow32_exact`], the
        /// rest by [`bf16_bits`] of `one(j)`; the bits of `bf16_bits` throughout.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F, BW, DQ and BF16 (code compiled with them calls it
        /// safely).
        write_bf16_steps,
        "avx512f,avx512bw,avx512dq,avx512bf16",
        crate::bf16_narrow::x86::narrow32_exact
    );

    bf16_steps!(
        /// [`write_bf16_steps`] for CPUs without AVX-512 BF16: the steps narrowed by
        /// [`crate::bf16_narrow::x86::narrow32_int`] (integer rounding, the same bits).
        ///
        /// # Safety
        /// The CPU must have AVX-512 F and BW (code compiled with them calls it safely).
        write_bf16_int_steps,
        "avx512f,avx512bw",
        crate::bf16_narrow::x86::narrow32_int
    );

    /// [`write_f32_steps`] into f16 bits: 32 values per step, `step(j)` and
    /// `step(j + 16)` narrowed by `vcvtps2ph` (round to nearest even; subnormal results
    /// kept, NaN quieted), the rest by `f16::from_f32(one(j))`: the bits of
    /// [`crate::Element::narrow_slice`] for f16 throughout, which narrows with the same
    /// instruction (or `half`'s equal software rounding without F16C).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW (code compiled with them calls it safely).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub fn write_f16_steps(
        out: &mut [u16],
        (mode, fence): (StoreMode, &Fence),
        step: impl Fn(usize) -> __m512,
        one: impl Fn(usize) -> f32,
    ) {
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let main = out.len() / 32 * 32;
        let (head, tail) = out.split_at_mut(main);
        {
            let mut w = LineWriter::fenced_by(fence, mode, bytemuck::cast_slice_mut(head));
            for j in (0..main).step_by(32) {
                let lo = _mm512_cvtps_ph::<NEAREST>(step(j));
                let hi = _mm512_cvtps_ph::<NEAREST>(step(j + 16));
                w.push(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
            }
        }
        for (j, o) in (main..).zip(tail) {
            *o = half::f16::from_f32(one(j)).to_bits();
        }
    }

    impl Drop for LineWriter<'_> {
        fn drop(&mut self) {
            if self.cut == Cut::Plain {
                return;
            }
            if self.cut == Cut::Recut && self.at > 0 {
                // The tail: the rest of the last vector, past the last line boundary.
                let (lead, last) = (self.lead, self.at - 64);
                crate::simd::copy_short(
                    &mut self.dst[last + lead..last + 64],
                    &bytes(self.prev)[lead..],
                );
            }
            if self.fences {
                // SAFETY: `sfence` has no operands and is part of SSE (baseline on
                // x86-64). It orders the streaming stores before every later store, such
                // as the one that tells another thread this task is done.
                unsafe { _mm_sfence() }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `transpose_fused` writes exactly the transpose, in the rows it says it wrote, at
    /// every level (it runs at AVX-512 and AVX2) and store mode, and `transpose_to_strip`
    /// (the fused kernels, then the scratch route for the rest) writes every column: 64-
    /// and 128-row blocks (and 96, which the kernels decline), column counts with and
    /// without a partial last 16-column block, the second strip of a matrix (its rows
    /// start mid-row) and a destination row offset; rows not written keep their bytes.
    #[test]
    fn transpose_to_strip_writes_the_transpose() {
        use crate::strips::column_strips;
        use rayon::prelude::*;
        let mut rng = quantfmt_testkit::XorShift32::new(11);
        let mut ran_fused = false;
        crate::simd::for_each_supported_level(|level| {
            for (mode, whole_call) in [StoreMode::Streaming, StoreMode::Cached]
                .into_iter()
                .flat_map(|m| [(m, false), (m, true)])
            {
                for rows in [64usize, 128, 96] {
                    for cols in [16usize, 40, 130] {
                        let stride = cols + 24;
                        let src: Vec<u8> =
                            (0..rows * stride).map(|_| rng.next_u32() as u8).collect();
                        // A [j0 + cols + 5, 2 * rows] matrix: the second strip is this
                        // block's, its rows starting `rows` bytes into each matrix row.
                        let (j0, n) = (3, 3 + cols + 5);
                        let mut m = crate::HostBytes::zeroed(n * 2 * rows);
                        m.as_mut_slice().fill(0xA5);
                        // Streamed lines are ordered by the fence's drop.
                        let fence = Fence::new();
                        let done = {
                            let mut strips: Vec<_> =
                                column_strips(m.as_mut_slice(), 2 * rows, rows)
                                    .unwrap()
                                    .collect();
                            let out = (&mut strips[1], j0);
                            let block = (&src[..], stride, rows, cols);
                            if whole_call {
                                let mut scratch = vec![0u8; rows * cols];
                                let how = (level, mode, &fence);
                                transpose_to_strip(how, block, out, &mut scratch);
                                cols
                            } else {
                                transpose_fused(level, mode, block, out)
                            }
                        };
                        drop(fence);
                        let fused =
                            level != Level::Scalar && mode == StoreMode::Streaming && rows != 96;
                        if !whole_call {
                            assert_eq!(
                                done,
                                if fused { cols / 16 * 16 } else { 0 },
                                "{level} {mode:?} {rows}x{cols}"
                            );
                            ran_fused |= done > 0;
                        }
                        let m = m.as_slice();
                        for r in 0..n {
                            for i in 0..rows {
                                let got = m[r * 2 * rows + rows + i];
                                let want = if (j0..j0 + done).contains(&r) {
                                    src[i * stride + r - j0]
                                } else {
                                    0xA5
                                };
                                assert_eq!(
                                    got, want,
                                    "{level} {mode:?} {rows}x{cols}: row {r} byte {i}"
                                );
                            }
                            assert!(
                                m[r * 2 * rows..r * 2 * rows + rows]
                                    .iter()
                                    .all(|&b| b == 0xA5)
                            );
                        }
                    }
                }
            }
        });
        if !ran_fused {
            eprintln!("SKIPPED the fused transpose: this CPU lacks AVX2");
        }
    }

    /// `write_f32`, and `write_filled` through a scratch, give `T::from_f32`'s bits in
    /// both modes at every level, for lengths with every tail and starts at every offset
    /// of a line, on values that include subnormals (which the hardware bf16 narrowing
    /// would flush), NaN and ties.
    #[test]
    fn write_f32_equals_from_f32() {
        use half::bf16;
        let mut rng = quantfmt_testkit::XorShift32::new(7);
        let src: Vec<f32> = (0..300)
            .map(|i| match i % 9 {
                0 => f32::from_bits(0x0001_8000),
                1 => f32::NAN,
                2 => 1.0 + f32::EPSILON * 65536.0,
                // f16's corners: a subnormal result, a tie, overflow to infinity.
                3 if i % 4 == 0 => 3.0e-6,
                3 if i % 4 == 1 => 1.0 + 1.0 / 2048.0,
                3 => 65520.0,
                _ => f32::from_bits(rng.next_u32()),
            })
            .collect();
        fn check<T: Element>(src: &[f32], fill: T, bits: impl Fn(T) -> u32) {
            crate::simd::for_each_supported_level(|level| {
                for mode in [StoreMode::Cached, StoreMode::Streaming] {
                    for at in 0..32 {
                        for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, src.len() - at] {
                            // Element by element: independent of the slice narrowing,
                            // which shares the vector step.
                            let want: Vec<T> =
                                src[at..at + len].iter().map(|&x| T::from_f32(x)).collect();
                            let want: Vec<u32> = want.iter().map(|&v| bits(v)).collect();
                            let run = &src[at..at + len];
                            // `write_f32`, then `write_filled` with `fill` copying the run
                            // into a scratch with room to spare.
                            for filled in [false, true] {
                                let mut buf = vec![fill; len + 64 + 32];
                                let start = buf.as_ptr().align_offset(64) + at;
                                let (fence, dst) = (Fence::new(), &mut buf[start..start + len]);
                                if filled {
                                    let mut scratch = vec![0f32; len + 7];
                                    write_filled((level, mode, &fence), dst, &mut scratch, |w| {
                                        w.copy_from_slice(run)
                                    });
                                } else {
                                    write_f32(level, run, dst, mode, &fence);
                                }
                                let case = format!("{level} {mode:?} {at}+{len} filled {filled}");
                                let got: Vec<u32> =
                                    buf[start..start + len].iter().map(|&v| bits(v)).collect();
                                assert_eq!(got, want, "{case}");
                                let mut outside = buf[..start].iter().chain(&buf[start + len..]);
                                assert!(outside.all(|&v| bits(v) == bits(fill)), "{case}");
                            }
                        }
                    }
                }
            });
        }
        check(&src, f32::from_bits(0x7F80_0001), f32::to_bits);
        check(&src, bf16::from_bits(0x7F81), |v: bf16| {
            u32::from(v.to_bits())
        });
        check(&src, half::f16::ONE, |v: half::f16| u32::from(v.to_bits()));
    }

    /// `write_bytes` copies exactly the run, in both modes at every level, for lengths
    /// with every tail and starts at every offset of a line.
    #[test]
    fn write_bytes_copies_the_run() {
        let src: Vec<u8> = (0..400u32).map(|i| (i * 37 % 251) as u8).collect();
        crate::simd::for_each_supported_level(|level| {
            for mode in [StoreMode::Cached, StoreMode::Streaming] {
                for at in 0..64 {
                    for len in [0, 1, 63, 64, 65, 128, 129, 200, 300] {
                        let mut buf = vec![0xAAu8; 400 + 128];
                        let start = buf.as_ptr().align_offset(64) + at;
                        let fence = Fence::new();
                        write_bytes(
                            level,
                            &src[..len],
                            &mut buf[start..start + len],
                            mode,
                            &fence,
                        );
                        drop(fence);
                        let case = format!("{level} {mode:?} {at}+{len}");
                        assert_eq!(&buf[start..start + len], &src[..len], "{case}");
                        let outside = buf[..start].iter().chain(&buf[start + len..]);
                        assert!(outside.into_iter().all(|&b| b == 0xAA), "{case}");
                    }
                }
            }
        });
    }

    /// The runs cover `0..k` in order, none longer than `cols`, and every run after the
    /// first starts on a line of the row.
    #[test]
    fn line_chunks_start_on_lines() {
        let buf = vec![0u16; 5000];
        for at in 0..40 {
            for (k, cols) in [
                (4096, 1024),
                (1000, 256),
                (33, 1024),
                (0, 64),
                (70, 8),
                (100, 32),
            ] {
                let row = &buf[at..];
                let runs: Vec<Range<usize>> = line_chunks(row, k, cols).collect();
                let mut next = 0;
                for (i, r) in runs.iter().enumerate() {
                    assert_eq!(r.start, next, "{at} {k} {cols}");
                    assert!(!r.is_empty() && r.len() <= cols, "{at} {k} {cols}: {r:?}");
                    if i > 0 && cols > 32 {
                        assert_eq!(
                            row[r.start..].as_ptr().align_offset(64),
                            0,
                            "{at} {k} {cols}"
                        );
                    }
                    next = r.end;
                }
                assert_eq!(next, k);
            }
        }
    }

    #[test]
    fn forcing_overrides_the_size_rule() {
        let cached = with_store_mode(StoreMode::Cached, || {
            StoreMode::for_output_bytes(STREAM_MIN_BYTES * 4)
        });
        assert_eq!(cached, StoreMode::Cached);
        let streaming = with_store_mode(StoreMode::Streaming, || StoreMode::for_output_bytes(0));
        assert_eq!(streaming, StoreMode::Streaming);
    }

    /// Every start offset (odd ones fall back to ordinary stores) and every vector count
    /// up to a few lines, in both modes: the bytes pushed land where they belong and
    /// nothing around them moves.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn line_writer_places_every_byte() {
        if !crate::simd::Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let src: Vec<u8> = (0..64 * 6u32).map(|i| (i * 37 % 251) as u8).collect();
        let mut buf = vec![0u8; 64 * 9];
        for mode in [StoreMode::Cached, StoreMode::Streaming] {
            for start in 0..130 {
                for n in 0..=6 {
                    buf.fill(0xAA);
                    let len = 64 * n + 7;
                    // SAFETY: the CPU has AVX-512 F and BW (checked above).
                    unsafe { push_all(mode, &src[..64 * n], &mut buf[start..start + len]) };
                    let at = format!("{mode:?} start {start} vectors {n}");
                    assert_eq!(&buf[start..start + 64 * n], &src[..64 * n], "{at}");
                    assert!(buf[..start].iter().all(|&b| b == 0xAA), "before, {at}");
                    assert!(
                        buf[start + 64 * n..].iter().all(|&b| b == 0xAA),
                        "after, {at}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn push_all(mode: StoreMode, src: &[u8], dst: &mut [u8]) {
        use std::arch::x86_64::_mm512_loadu_si512;
        let mut w = x86::LineWriter::new(mode, dst);
        for v in src.chunks_exact(64) {
            // SAFETY: `v` is 64 bytes (one unaligned 512-bit load).
            w.push(unsafe { _mm512_loadu_si512(v.as_ptr().cast()) });
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[should_panic(expected = "past the end")]
    fn pushing_past_the_span_panics() {
        if !crate::simd::Level::Avx512.is_supported() {
            panic!("past the end (skipped: no AVX-512)");
        }
        // SAFETY: the CPU has AVX-512 F and BW (checked above).
        unsafe { push_all(StoreMode::Streaming, &[0u8; 128], &mut [0u8; 100]) };
    }
}
