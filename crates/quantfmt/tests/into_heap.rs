//! `quantize_into` and `dequantize_into` write into memory the caller owns. Issue 8's rule
//! for them: no intermediate allocation proportional to the tensor. Scratch sized by a
//! cache, a row or a fixed number of rows is fine; scratch that grows with the tensor
//! is not. And `quantize_into` must not reallocate the storage's buffers.
//!
//! Every recipe's kernels run here through the trait objects, in each usage, from each
//! input dtype, and back in each direction into each output dtype. Each path runs at
//! two tensor sizes, the second four times the first, under [`heap`]'s counting
//! allocator. The peak heap it adds may grow between the two by less than a quarter of
//! a byte per value of the larger tensor. So a tensor-sized buffer of one byte per
//! value or more (a copy of the codes, a widened or narrowed copy of the input) fails.
//! The largest growth measured when this test was written was 90 KiB against that
//! bound's 248 KiB: the RHT columnwise dequantize's scratch, from 1984 to 7936 rows
//! (`--nocapture` prints it).
//!
//! Two things keep the measure honest:
//! - **Buffers below the huge-page threshold.** A `HostBytes` of at least
//!   `pages::HUGE_MIN` (4 MiB) is an anonymous mapping that bypasses the global
//!   allocator. The larger tensor is under 4 MiB even in f32, so a tensor-sized
//!   `HostBytes` made inside a call would come from the heap and be counted.
//! - **One worker thread.** Every worker may hold its own scratch, so the peak depends
//!   on how the tasks overlap. One thread makes it a function of the path alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/families.rs"]
mod families;
#[path = "support/heap.rs"]
mod heap;

use families::FAMILIES;
use heap::measure;
use quantfmt::half::{bf16, f16};
use quantfmt::{
    DType, Direction, Element, FormatSpec, HostDataMut, HostTensor, Shape, Storage, Usage,
};
use quantfmt_testkit::XorShift64;

/// Columns: a multiple of every format's block (int4tiled's default group is 128).
const K: usize = 128;
/// Rows of the two sizes; the larger `[M, K]` in f32 is 3.9 MiB, under `HUGE_MIN`.
const ROWS: [usize; 2] = [1984, 7936];

/// Values spread over a few binades, signs mixed, with some exact zeros.
fn input(m: usize) -> Vec<f32> {
    let mut rng = XorShift64::new(m as u64);
    (0..m * K)
        .map(|i| {
            let v = (rng.next_f32() - 0.5) * 8.0;
            if i % 97 == 0 { 0.0 } else { v }
        })
        .collect()
}

/// The peak heap of `s.dequantize_into` in `dir` into `n` values of `T` (the output
/// allocated outside the measure); `None` where it refuses.
fn dequantize_peak<T: Element>(
    s: &dyn Storage,
    dir: Direction,
    zero: T,
    n: usize,
) -> Option<usize> {
    let mut out = vec![zero; n];
    let (r, peak) = measure(|| s.dequantize_into(dir, HostDataMut::from(&mut out[..])));
    r.ok().map(|()| peak)
}

/// The address of each buffer's bytes, to see that `quantize_into` kept them.
fn addresses(s: &dyn Storage) -> Vec<usize> {
    s.buffers()
        .iter()
        .map(|b| b.bytes().as_ptr() as usize)
        .collect()
}

/// The peak heap of every `_into` path of `spec` in `usage` at `m` rows, by path name.
/// Paths the format refuses (an input dtype RHT does not take, say) are left out.
fn peaks(spec: &FormatSpec, usage: Usage, m: usize) -> Vec<(String, usize)> {
    let q = spec.boxed(usage).unwrap();
    let shape = Shape::new(&[m, K]).unwrap();
    let x32 = input(m);
    let mut out = Vec::new();
    let mut stored = None;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let x = HostTensor::f32(&x32, &[m, K])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let Ok(mut s) = q.allocate(&shape, dtype) else {
            continue;
        };
        let before = addresses(&*s);
        let (r, peak) = measure(|| q.quantize_into(&x, &mut *s));
        if r.is_err() {
            continue;
        }
        assert_eq!(
            addresses(&*s),
            before,
            "{} {usage} from {dtype}: quantize_into moved a buffer",
            q.spec()
        );
        out.push((format!("quantize_into from {dtype}"), peak));
        stored = Some(s);
    }
    let stored = stored.unwrap_or_else(|| panic!("{}: no input dtype was taken", q.spec()));
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        let n = m * K;
        let peaks = [
            (DType::F32, dequantize_peak(&*stored, dir, 0.0f32, n)),
            (DType::BF16, dequantize_peak(&*stored, dir, bf16::ZERO, n)),
            (DType::F16, dequantize_peak(&*stored, dir, f16::ZERO, n)),
        ];
        for (dtype, peak) in peaks {
            if let Some(peak) = peak {
                out.push((format!("dequantize_into {dir:?} {dtype}"), peak));
            }
        }
    }
    out
}

#[test]
fn into_paths_use_no_tensor_sized_heap() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let bound = ROWS[1] * K / 4;
    let mut checked = 0;
    let mut most = (0, String::new());
    pool.install(|| {
        for spec in FAMILIES {
            let spec: FormatSpec = spec.parse().unwrap();
            for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
                if spec.boxed(usage).is_err() {
                    continue;
                }
                let small = peaks(&spec, usage, ROWS[0]);
                let large = peaks(&spec, usage, ROWS[1]);
                let names =
                    |p: &[(String, usize)]| p.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
                assert_eq!(
                    names(&small),
                    names(&large),
                    "{spec} {usage}: paths differ by size"
                );
                for ((path, a), (_, b)) in small.iter().zip(&large) {
                    assert!(
                        b.saturating_sub(*a) < bound,
                        "{spec} {usage} {path}: peak heap {a} bytes at {} rows, {b} at {} rows: \
                         it grows with the tensor (bound {bound})",
                        ROWS[0],
                        ROWS[1]
                    );
                    checked += 1;
                    if b.saturating_sub(*a) >= most.0 {
                        most = (b.saturating_sub(*a), format!("{spec} {usage} {path}"));
                    }
                }
            }
        }
    });
    eprintln!(
        "{checked} paths; the most growth: {} bytes ({}), bound {bound}",
        most.0, most.1
    );
    // 18 families, most in three usages, each with up to 3 quantizes and 6 dequantizes.
    assert!(checked > 250, "only {checked} paths checked");
}
