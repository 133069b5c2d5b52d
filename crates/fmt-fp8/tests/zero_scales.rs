//! Stored scales of `+0`: what checkpoint producers that compute `amax / 448` with no
//! guard write for an all-zero block or tensor (TE itself never stores one). Such
//! buffers load, and every direction and output dtype dequantizes them to `code * 0` at
//! every SIMD level (the power-of-two fast paths must decline a zero scale, not read
//! its exponent). `-0`, negative, NaN and infinite scales are refused, naming the
//! buffer and the entry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_fp8::{BlockScaling, Fp8BlockQuantizer, Fp8Quantizer};
use quant_core::simd;
use quant_core::{Buffer, DType, Direction, Format, HostTensor, QuantizedTensor, Shape, Usage};

/// Ragged data, with a NaN and both zeros among ordinary values.
fn data(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| match i % 97 {
            3 => f32::NAN,
            5 => -0.0,
            7 => 0.0,
            _ => ((i * 37 % 1001) as f32 - 500.0) / 64.0,
        })
        .collect()
}

/// `q`'s buffers of `x` with entry `at` of each named f32 buffer set to `v`.
fn edited<F: Format>(q: &F, x: &HostTensor<'_>, names: &[&str], at: usize, v: f32) -> Vec<Buffer> {
    let t = quant_core::quantize(q, x).unwrap();
    t.buffers()
        .iter()
        .map(|b| {
            if !names.contains(&b.name()) {
                return b.clone();
            }
            let mut s = b.as_slice::<f32>().unwrap().to_vec();
            s[at] = v;
            Buffer::from_slice::<f32>(b.name(), b.shape(), &s).unwrap()
        })
        .collect()
}

/// Loads `bufs`, then checks that each direction's dequantization, into every output
/// dtype and at every SIMD level, equals `decode(code) * scale` computed here from the
/// f32 dequantization of the unedited tensor (`plain`): zero where `zeroed(dir, i, j)`
/// (the sign of the code kept, NaN codes staying NaN), `plain` elsewhere.
fn check_loads_and_decodes<F: Format>(
    q: F,
    shape: [usize; 2],
    x: &HostTensor<'_>,
    bufs: Vec<Buffer>,
    zeroed: impl Fn(Direction, usize, usize) -> bool,
) {
    let plain = quant_core::quantize(&q, x).unwrap();
    let t = QuantizedTensor::from_buffers(q, &Shape::new(&shape).unwrap(), DType::F32, bufs)
        .unwrap_or_else(|e| panic!("a +0 scale was refused: {e}"));
    let [m, k] = shape;
    simd::for_each_supported_level(|level| {
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            let want: Vec<f32> = plain
                .dequantize_as::<f32>(dir)
                .unwrap()
                .iter()
                .enumerate()
                .map(|(n, &v)| {
                    if zeroed(dir, n / k, n % k) {
                        v * 0.0
                    } else {
                        v
                    }
                })
                .collect();
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let got = t
                    .dequantize(dir, dtype)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                let want = HostTensor::f32(&want, &[m, k])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let want = want.to_dtype(DType::F32).unwrap();
                let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
                for (n, (g, w)) in g.iter().zip(&w).enumerate() {
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "level {level} {dir} {dtype} ({}, {}): got {g}, want {w}",
                        n / k,
                        n % k
                    );
                }
            }
        }
    });
}

#[test]
fn zero_block_scales_load_and_decode_to_zero_blocks() {
    // 300 x 400: partial blocks in both directions; entry (0, 1) of each scale matrix
    // gets +0.
    let shape = [300, 400];
    let v = data(300, 400);
    let x = HostTensor::f32(&v, &shape).unwrap();
    for (block, pow2) in [
        (BlockScaling::TwoD, true),
        (BlockScaling::TwoD, false),
        (BlockScaling::OneD, true),
        (BlockScaling::OneD, false),
    ] {
        let q = Fp8BlockQuantizer::new(block, Usage::BOTH).with_pow2_scales(pow2);
        let names = ["rowwise_scale_inv", "columnwise_scale_inv"];
        let bufs = edited(&q, &x, &names, 1, 0.0);
        // Entry 1 of each matrix: which elements it scales.
        let zeroed = move |dir: Direction, i: usize, j: usize| match (block, dir) {
            // 128x128: tile (0, 1) rowwise; columnwise [kb][mb] entry (0, 1) is tile
            // (mb 1, kb 0) of x.
            (BlockScaling::TwoD, Direction::Rowwise) => i < 128 && (128..256).contains(&j),
            (BlockScaling::TwoD, Direction::Columnwise) => (128..256).contains(&i) && j < 128,
            // 1x128 rowwise [kb][m]: entry (0, 1) is row 1's first block.
            (BlockScaling::OneD, Direction::Rowwise) => i == 1 && j < 128,
            // 1x128 columnwise [mb][k]: entry (0, 1) is column 1's first block.
            (BlockScaling::OneD, Direction::Columnwise) => j == 1 && i < 128,
        };
        check_loads_and_decodes(q, shape, &x, bufs, zeroed);
    }
}

#[test]
fn a_zero_per_tensor_scale_loads_and_decodes_to_zeros() {
    let shape = [48, 272];
    let v = data(48, 272);
    let x = HostTensor::f32(&v, &shape).unwrap();
    for pow2 in [false, true] {
        let q = Fp8Quantizer::new(Usage::BOTH).with_pow2_scales(pow2);
        let bufs = edited(&q, &x, &["scale_inv"], 0, 0.0);
        check_loads_and_decodes(q, shape, &x, bufs, |_, _, _| true);
    }
}

#[test]
fn negative_nan_and_infinite_scales_are_refused() {
    let shape = [300, 400];
    let v = data(300, 400);
    let x = HostTensor::f32(&v, &shape).unwrap();
    let s = Shape::new(&shape).unwrap();
    for bad in [-0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let q = Fp8BlockQuantizer::new(BlockScaling::TwoD, Usage::ROWWISE);
        let bufs = edited(&q, &x, &["rowwise_scale_inv"], 1, bad);
        let e = QuantizedTensor::from_buffers(q, &s, DType::F32, bufs)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rowwise_scale_inv") && e.contains("entry (0, 1)") && e.contains(">= +0"),
            "{bad}: {e}"
        );
        let q = Fp8Quantizer::new(Usage::ROWWISE);
        let bufs = edited(&q, &x, &["scale_inv"], 0, bad);
        let e = QuantizedTensor::from_buffers(q, &s, DType::F32, bufs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("scale_inv") && e.contains(">= +0"), "{bad}: {e}");
    }
}
