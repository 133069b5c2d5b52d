//! Writes the cases of the host emulation check (`tools/cuda-emu/run.sh`): inputs, the CPU
//! path's buffers and dequantized outputs, and a manifest with the launch arguments the
//! device code derives from each quantizer.
//!
//! ```text
//! cargo run -p quantfmt --example cuda_emu_cases -- OUTDIR
//! ```
//!
//! Manifest lines: `id format m k dtype rowwise columnwise key=value...`; files
//! `id.in` (input bytes), `id.<buffer>` (CPU buffers), `id.deq.<row|col>.<dtype>` (CPU
//! dequantization).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quantfmt::fmt_int4tiled::Int4TiledTensorExt;
use quantfmt::fmt_mxfp8::layout::{columnwise_scale_shape, rowwise_scale_shape};
use quantfmt::fmt_nvfp4::FourOverSix;
use quantfmt::{
    BlockScaling, DType, Direction, Element, Format, Fp8BlockQuantizer, Fp8Dtype, Fp8Quantizer,
    HostTensor, Int4TiledQuantizer, Mxfp8Dtype, Mxfp8Quantizer, Nvfp4Quantizer, QuantizedTensor,
    ScaleLayout, ScaleRule, Usage,
};

const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const USAGES: [Usage; 3] = [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH];

/// The device check's generator (many magnitudes, specials salted in, special blocks
/// along the first rows), shared so both check the kernels on the same values.
#[path = "../../crates/quantfmt/tests/support/special_input.rs"]
mod special_input;
use special_input::input;

struct Writer {
    dir: PathBuf,
    manifest: String,
    next: usize,
}

impl Writer {
    fn case<F: Format>(&mut self, q: &F, x: &HostTensor<'_>, args: &str) {
        let Ok(t) = quantfmt::quantize(q, x) else {
            return; // refused on the CPU path (e.g. rht with f32): nothing to emulate
        };
        let id = self.next;
        self.next += 1;
        let (m, k) = x.shape().as_2d();
        let u = q.usage();
        writeln!(
            self.manifest,
            "{id} {} {m} {k} {} {} {} {args}",
            F::NAME,
            x.dtype(),
            u8::from(u.rowwise),
            u8::from(u.columnwise)
        )
        .unwrap();
        std::fs::write(self.dir.join(format!("{id}.in")), x.as_bytes()).unwrap();
        write_expected(&self.dir, id, &t);
    }
}

fn write_expected<F: Format>(dir: &Path, id: usize, t: &QuantizedTensor<F>) {
    for b in t.buffers() {
        std::fs::write(dir.join(format!("{id}.{}", b.name())), b.bytes()).unwrap();
    }
    for d in [Direction::Rowwise, Direction::Columnwise] {
        if !t.usage().has(d) {
            continue;
        }
        let tag = match d {
            Direction::Rowwise => "row",
            Direction::Columnwise => "col",
        };
        for dt in DTYPES {
            let out = t.dequantize(d, dt).unwrap();
            std::fs::write(dir.join(format!("{id}.deq.{tag}.{dt}")), out.as_bytes()).unwrap();
        }
    }
}

fn bits(f: f32) -> u32 {
    f.to_bits()
}

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .expect("usage: cuda_emu_cases OUTDIR"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = Writer {
        dir: dir.clone(),
        manifest: String::new(),
        next: 0,
    };
    let fp8_shapes: &[&[usize]] = &[
        &[1, 1],
        &[3, 5],
        &[67, 129],
        &[130, 257],
        &[1, 300],
        &[33, 272],
    ];
    for spec in ["", "e5m2", "e5m2,pow2", "eps=0.5"] {
        let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
        for usage in USAGES {
            let q = Fp8Quantizer::from_spec(&opts, usage).unwrap();
            let args = format!(
                "e5m2={} pow2={} eps={} max={}",
                u8::from(q.dtype() == Fp8Dtype::E5M2),
                u8::from(q.pow2_scales()),
                bits(q.amax_epsilon()),
                bits(q.dtype().max())
            );
            for (si, dims) in fp8_shapes.iter().enumerate() {
                let v = input(dims, si as u64 * 31 + spec.len() as u64 + 1);
                for dt in DTYPES {
                    let x = HostTensor::f32(&v, dims).unwrap().to_dtype(dt).unwrap();
                    w.case(&q, &x, &args);
                }
            }
        }
    }
    for spec in [
        "128x128",
        "1x128",
        "1x128,fp32-scales,e5m2",
        "128x128,fp32-scales,eps=1e-3",
    ] {
        let opts: Vec<&str> = spec.split(',').collect();
        for usage in USAGES {
            let q = Fp8BlockQuantizer::from_spec(&opts, usage).unwrap();
            for (si, dims) in fp8_shapes
                .iter()
                .chain([&[256usize, 130][..]].iter())
                .enumerate()
            {
                let (m, k) = (dims[0], dims[1]);
                let (sr, sc) = q.scale_shapes(m, k);
                let args = format!(
                    "two_d={} e5m2={} pow2={} eps={} max={} rs_stride={} cs_stride={}",
                    u8::from(q.block() == BlockScaling::TwoD),
                    u8::from(q.dtype() == Fp8Dtype::E5M2),
                    u8::from(q.pow2_scales()),
                    bits(q.amax_epsilon()),
                    bits(q.dtype().max()),
                    sr[1],
                    sc[1]
                );
                let v = input(dims, si as u64 * 37 + spec.len() as u64);
                for dt in DTYPES {
                    let x = HostTensor::f32(&v, dims).unwrap().to_dtype(dt).unwrap();
                    w.case(&q, &x, &args);
                }
            }
        }
    }
    let mx_shapes: &[&[usize]] = &[&[32, 32], &[64, 96], &[96, 160], &[64, 288]];
    for spec in [
        "",
        "e5m2",
        "2d",
        "ocp",
        "swizzled",
        "2d,swizzled,e5m2",
        "ocp,swizzled",
    ] {
        let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
        for usage in USAGES {
            let q = Mxfp8Quantizer::from_spec(&opts, usage).unwrap();
            for (si, dims) in mx_shapes.iter().enumerate() {
                let (m, k) = (dims[0], dims[1]);
                let (rs, cs) = (rowwise_scale_shape(m, k), columnwise_scale_shape(m, k));
                let v = input(dims, si as u64 * 41 + spec.len() as u64);
                for dt in DTYPES {
                    let args = format!(
                        "e5m2={} ocp={} two_d={} plus_zero={} swz={} rs_stride={} cs_stride={} cs_rows={}",
                        u8::from(q.dtype() == Mxfp8Dtype::E5M2),
                        u8::from(q.scale_rule() == ScaleRule::Ocp),
                        u8::from(q.is_2d()),
                        u8::from(q.flushes_negative_zero(dt, m, k)),
                        u8::from(q.scale_layout() == ScaleLayout::Swizzled),
                        rs[1],
                        cs[1],
                        cs[0]
                    );
                    let x = HostTensor::f32(&v, dims).unwrap().to_dtype(dt).unwrap();
                    w.case(&q, &x, &args);
                }
            }
        }
    }
    let nv_shapes: &[&[usize]] = &[&[16, 16], &[48, 80], &[32, 272]];
    for spec in [
        "",
        "2d",
        "rht",
        "sr,seed=12345678901",
        "row-scaled",
        "4over6",
        "4over6=mse,e4m3max=256",
        "4over6,2d",
        "2d,swizzled",
        "rht,sr,swizzled",
        "row-scaled,swizzled,4over6",
    ] {
        let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
        for usage in USAGES {
            let Ok(q) = Nvfp4Quantizer::from_spec(&opts, usage) else {
                continue;
            };
            for (si, dims) in nv_shapes.iter().enumerate() {
                let (m, k) = (dims[0], dims[1]);
                let (sr, sc) = q.scale_shapes(m, k);
                let fos = match q.four_over_six() {
                    None => 0,
                    Some(FourOverSix::Mae) => 1,
                    Some(FourOverSix::Mse) => 2,
                };
                let args = format!(
                    "two_d={} rht={} sr={} seed={} per_row={} fos={fos} e4m3max={} swz={} ss_r={} ss_c={}",
                    u8::from(q.is_2d()),
                    u8::from(q.rht()),
                    u8::from(q.stochastic_rounding().is_some()),
                    q.stochastic_rounding().unwrap_or(0),
                    u8::from(q.row_scaled()),
                    q.e4m3_max(),
                    u8::from(q.swizzled()),
                    sr[1],
                    sc[1]
                );
                let v = input(dims, si as u64 * 43 + spec.len() as u64);
                for dt in DTYPES {
                    let x = HostTensor::f32(&v, dims).unwrap().to_dtype(dt).unwrap();
                    w.case(&q, &x, &args);
                }
            }
        }
    }
    // int4tiled: quantize (qparams + packing), dequantize, unpack/pack and the matmul.
    let i4_shapes: &[&[usize]] = &[&[8, 256], &[13, 256], &[2, 9, 256], &[24, 512]];
    for spec in [
        "g32",
        "g64,k4",
        "g128,k2",
        "g256",
        "g32,pad=torchao",
        "g64,eps=1e-6",
    ] {
        let opts: Vec<&str> = spec.split(',').collect();
        let q = Int4TiledQuantizer::from_spec(&opts, Usage::ROWWISE).unwrap();
        for (si, dims) in i4_shapes.iter().enumerate() {
            let shape = quantfmt::Shape::new(dims).unwrap();
            let Ok(geo) = q.geometry(&shape) else {
                continue;
            };
            let v = input(dims, si as u64 * 47 + spec.len() as u64);
            for dt in DTYPES {
                let args = format!(
                    "e={} n={} k={} np={} kp={} g={} ikt={} eps={}",
                    geo.num_experts(),
                    geo.n,
                    geo.k,
                    geo.n_padded,
                    geo.k_padded,
                    geo.group_size,
                    geo.inner_k_tiles,
                    bits(q.eps())
                );
                let x = HostTensor::f32(&v, dims).unwrap().to_dtype(dt).unwrap();
                let id = w.next;
                w.case(&q, &x, &args);
                if w.next == id {
                    continue;
                }
                let t = q.quantize(&x).unwrap();
                std::fs::write(dir.join(format!("{id}.unpacked")), t.unpack().unwrap()).unwrap();
                if geo.experts.is_none() {
                    // y = x W^T for 3 activation rows, on a moderate weight of the same
                    // geometry (the special values above would overflow f32 sums and f16
                    // outputs, where no two summation orders agree); the f64 reference.
                    let wv: Vec<f32> = (0..geo.n * geo.k)
                        .map(|i| ((i * 4793 % 2001) as f32 - 1000.0) / 700.0)
                        .collect();
                    let wt = HostTensor::f32(&wv, dims).unwrap().to_dtype(dt).unwrap();
                    let t = q.quantize(&wt).unwrap();
                    std::fs::write(
                        dir.join(format!("{id}.lin.packed")),
                        t.buffer("packed_weight").unwrap().bytes(),
                    )
                    .unwrap();
                    std::fs::write(
                        dir.join(format!("{id}.lin.sz")),
                        t.buffer("scale_and_zero").unwrap().bytes(),
                    )
                    .unwrap();
                    let m = 3;
                    let xa: Vec<f32> = (0..m * geo.k)
                        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
                        .collect();
                    let xa = HostTensor::f32(&xa, &[m, geo.k])
                        .unwrap()
                        .to_dtype(dt)
                        .unwrap();
                    let yref = quantfmt::dispatch_elements!(xa, |xs| {
                        quantfmt::fmt_int4tiled::int4_linear_reference(xs, m, &t, None).unwrap()
                    });
                    let absw = quantfmt::dispatch_elements!(xa, |xs| {
                        // sum_k |x| |w|, the scale of the summation error
                        let wd = t.dequantize_as::<f32>(Direction::Rowwise).unwrap();
                        (0..m * geo.n)
                            .map(|i| {
                                let (r, j) = (i / geo.n, i % geo.n);
                                (0..geo.k)
                                    .map(|kk| {
                                        f64::from(xs[r * geo.k + kk].to_f32()).abs()
                                            * f64::from(wd[j * geo.k + kk]).abs()
                                    })
                                    .sum::<f64>()
                            })
                            .collect::<Vec<f64>>()
                    });
                    let mut bytes = Vec::new();
                    for (a, b) in yref.iter().zip(&absw) {
                        bytes.extend_from_slice(&a.to_le_bytes());
                        bytes.extend_from_slice(&b.to_le_bytes());
                    }
                    std::fs::write(dir.join(format!("{id}.lin.x")), xa.as_bytes()).unwrap();
                    std::fs::write(dir.join(format!("{id}.lin.ref")), bytes).unwrap();
                }
            }
        }
    }
    // Codec sweep: every 4099th f32 bit pattern plus dense runs at the interesting
    // boundaries, through quant_core::codec and half (what the shared header must equal).
    let mut patterns: Vec<u32> = (0..(1u64 << 32) / 4099)
        .map(|i| (i * 4099) as u32)
        .collect();
    for start in [
        0x3E80_0000u32,
        0x43DF_0000,
        0x475F_0000,
        0x7F7F_F000,
        0x8000_0000,
        0x0000_0000,
    ] {
        patterns.extend((0..65_536u32).map(|i| start.wrapping_add(i)));
    }
    let mut sweep = Vec::with_capacity(patterns.len() * 13);
    for &b in &patterns {
        let x = f32::from_bits(b);
        sweep.extend_from_slice(&b.to_le_bytes());
        sweep.push(quantfmt::codec::e4m3::encode(x));
        sweep.push(quantfmt::codec::e5m2::encode(x));
        sweep.push(quantfmt::codec::e2m1::encode(x));
        sweep.push(quantfmt::codec::e8m0::from_f32_ceil(x));
        sweep.push(quantfmt::codec::e8m0::from_f32_floor(x));
        sweep.extend_from_slice(&quantfmt::half::bf16::from_f32(x).to_bits().to_le_bytes());
        sweep.extend_from_slice(&quantfmt::half::f16::from_f32(x).to_bits().to_le_bytes());
    }
    std::fs::write(dir.join("codec_sweep.bin"), &sweep).unwrap();
    std::fs::write(dir.join("manifest.txt"), &w.manifest).unwrap();
    println!("{} cases written to {}", w.next, dir.display());
}
