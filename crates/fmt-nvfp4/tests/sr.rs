//! Stochastic rounding: statistics (no golden bytes exist: TE's bits depend on its thread
//! mapping), determinism, thread-count independence and the documented stream layout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_nvfp4::{Nvfp4Quantizer, scale, sr};
use half::bf16;
use quant_core::codec::{e2m1, e4m3};
use quant_core::{Direction, Format, HostTensor, Usage};
use quantfmt_testkit::XorShift64;

fn q(opts: &[&str], usage: Usage) -> Nvfp4Quantizer {
    Nvfp4Quantizer::from_spec(opts, usage).unwrap()
}

/// Standard normal samples (Box-Muller over a xorshift stream).
fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = XorShift64::scrambled(seed);
    // The centre of one of 2^53 equal steps: never 0, which `ln` below cannot take.
    let mut next = move || ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// Per element: (dequantized - input) / block decode scale, for one direction.
fn relative_errors(x: &[f32], m: usize, k: usize, opts: &[&str], dir: Direction) -> Vec<f64> {
    let t = q(opts, Usage::BOTH)
        .quantize(&HostTensor::f32(x, &[m, k]).unwrap())
        .unwrap();
    let back = t.dequantize_as::<f32>(dir).unwrap();
    let (sname, aname, stride) = match dir {
        Direction::Rowwise => (
            "rowwise_scale_inv",
            "amax_rowwise",
            t.quantizer().scale_shapes(m, k).0[1],
        ),
        Direction::Columnwise => (
            "columnwise_scale_inv",
            "amax_columnwise",
            t.quantizer().scale_shapes(m, k).1[1],
        ),
    };
    let s = t.buffer(sname).unwrap().bytes();
    let amax = t.buffer(aname).unwrap().as_slice::<f32>().unwrap()[0];
    let mut out = Vec::with_capacity(m * k);
    for i in 0..m {
        for j in 0..k {
            let (r, b) = match dir {
                Direction::Rowwise => (i, j / 16),
                Direction::Columnwise => (j, i / 16),
            };
            let f = scale::dequant_factor(s[r * stride + b], amax, 448);
            if f > 0.0 {
                out.push((f64::from(back[i * k + j]) - f64::from(x[i * k + j])) / f64::from(f));
            }
        }
    }
    out
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn sr_is_unbiased_over_a_million_values() {
    let (m, k) = (1024, 1024);
    let x = normal(m * k, 1);
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        let sr_err = relative_errors(&x, m, k, &["sr", "seed=12345"], dir);
        assert!(sr_err.len() >= 1_000_000);
        let mu = mean(&sr_err);
        eprintln!(
            "{dir}: {} values, SR mean error {mu:+.2e} block scales",
            sr_err.len()
        );
        assert!(mu.abs() < 1e-3, "{dir}: SR mean error {mu} block scales");
        // SR trades bias for variance: its mean squared error exceeds RN's.
        let rn_err = relative_errors(&x, m, k, &[], dir);
        let mse = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>() / v.len() as f64;
        assert!(mse(&sr_err) > mse(&rn_err), "{dir}");
    }
}

#[test]
fn rn_is_biased_where_sr_is_not() {
    // One 2688 makes S_enc = 1; each other row holds a block [6, 2.25 x 15]: block scale
    // 1.0, enc 1, so 2.25 sits between grid points 2 and 3 with frac 1/4 (64/256 exactly).
    let (m, k) = (65536, 16);
    let mut x = vec![2.25f32; m * k];
    for r in 0..m {
        x[r * k] = 6.0;
    }
    x[k + 1] = 2688.0;
    let quant = |opts: &[&str]| {
        q(opts, Usage::ROWWISE)
            .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
            .unwrap()
            .dequantize_f32()
            .unwrap()
    };
    let (rn, srq) = (quant(&[]), quant(&["sr", "seed=99"]));
    let errs = |d: &[f32]| -> Vec<f64> {
        (0..m)
            .filter(|&r| r != 1)
            .flat_map(|r| (1..k).map(move |c| r * k + c))
            .map(|i| f64::from(d[i]) - 2.25)
            .collect()
    };
    let (rn_e, sr_e) = (errs(&rn), errs(&srq));
    assert!(rn_e.len() > 900_000);
    assert!(
        rn_e.iter().all(|&e| e == -0.25),
        "RN always rounds 2.25 down to 2"
    );
    let mu = mean(&sr_e);
    eprintln!(
        "constant 2.25: RN mean error -0.25, SR mean error {mu:+.2e} ({} values)",
        sr_e.len()
    );
    // Per value: 2 w.p. 3/4, 3 w.p. 1/4; the std of the mean is 0.43/sqrt(n) ~ 4.5e-4.
    assert!(mu.abs() < 2e-3, "SR mean error {mu}");
    let ups = sr_e.iter().filter(|&&e| e == 0.75).count() as f64 / sr_e.len() as f64;
    assert!((ups - 0.25).abs() < 2e-3, "P(up) = {ups}");
    assert!(sr_e.iter().all(|&e| e == -0.25 || e == 0.75));
}

#[test]
fn random_bits_are_uniform_given_the_rule() {
    // For every element the rule's expectation over all 256 bit patterns is known; the
    // stream must reproduce it on average (a test of the bits, not of the rule).
    let (m, k) = (512, 2048);
    let x = normal(m * k, 7);
    let t = q(&["sr", "seed=3"], Usage::ROWWISE)
        .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
        .unwrap();
    let back = t.dequantize_f32().unwrap();
    let s = t.buffer("rowwise_scale_inv").unwrap().bytes();
    let amax = t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap()[0];
    let s_enc = scale::global_encode_scale(amax, 448);
    let stride = t.quantizer().scale_shapes(m, k).0[1];
    let mut dev = 0.0f64;
    let mut bias = 0.0f64;
    for i in 0..m {
        for j in 0..k {
            let sdb = s[i * stride + j / 16];
            let enc = scale::block_encode_scale(sdb, scale::global_decode_scale(s_enc));
            let v = x[i * k + j] * enc;
            let expect: f64 = (0..256)
                .map(|r| f64::from(sr::stochastic_round_e2m1(v, r)))
                .sum::<f64>()
                / 256.0;
            let f = scale::dequant_factor(sdb, amax, 448);
            dev += f64::from(back[i * k + j]) / f64::from(f) - expect;
            bias += expect - f64::from(v);
        }
    }
    let n = (m * k) as f64;
    eprintln!(
        "stream mean deviation {:+.2e}, rule bias {:+.2e}",
        dev / n,
        bias / n
    );
    assert!((dev / n).abs() < 1e-3, "stream mean deviation {}", dev / n);
    // The rule's own bias (8 random bits) cancels for symmetric data.
    assert!((bias / n).abs() < 1e-3, "rule bias {}", bias / n);
}

#[test]
fn deterministic_per_seed_and_independent_of_threads() {
    let (m, k) = (144, 96);
    let x: Vec<bf16> = normal(m * k, 5).into_iter().map(bf16::from_f32).collect();
    let ht = HostTensor::bf16(&x, &[m, k]).unwrap();
    for opts in [
        &["sr", "seed=1"][..],
        &["sr", "seed=1", "2d"][..],
        &["sr", "seed=1", "rht"][..],
    ] {
        let qz = q(opts, Usage::BOTH);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let many = rayon::ThreadPoolBuilder::new()
            .num_threads(7)
            .build()
            .unwrap();
        let a = one.install(|| qz.quantize(&ht).unwrap());
        let b = many.install(|| qz.quantize(&ht).unwrap());
        let c = qz.quantize(&ht).unwrap();
        for ((x, y), z) in a.buffers().iter().zip(b.buffers()).zip(c.buffers()) {
            assert_eq!(x.bytes(), y.bytes(), "{opts:?} {}", x.name());
            assert_eq!(x.bytes(), z.bytes(), "{opts:?} {}", x.name());
        }
        let mut other = opts.to_vec();
        other[1] = "seed=2";
        let d = q(&other, Usage::BOTH).quantize(&ht).unwrap();
        assert_ne!(
            a.buffer("rowwise_data").unwrap().bytes(),
            d.buffer("rowwise_data").unwrap().bytes()
        );
        // Scales and amaxes do not depend on the rounding.
        let rn = q(&opts[2..], Usage::BOTH).quantize(&ht).unwrap();
        for name in [
            "rowwise_scale_inv",
            "columnwise_scale_inv",
            "amax_columnwise",
        ] {
            assert_eq!(
                a.buffer(name).unwrap().bytes(),
                rn.buffer(name).unwrap().bytes()
            );
        }
    }
}

#[test]
fn stream_layout_is_as_documented() {
    let (m, k) = (48, 64);
    let x = normal(m * k, 8);
    let seed = 0xDEAD_BEEF_0123_4567u64;
    let t = Nvfp4Quantizer::new(Usage::BOTH)
        .with_stochastic_rounding(Some(seed))
        .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
        .unwrap();
    let amax = t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap()[0];
    let s_enc = scale::global_encode_scale(amax, 448);
    let s_dec = scale::global_decode_scale(s_enc);
    let code = |bytes: &[u8], row: usize, col: usize, len: usize| {
        (bytes[(row * len + col) / 2] >> (4 * (col % 2))) & 0xF
    };
    let rd = t.buffer("rowwise_data").unwrap().bytes();
    let cd = t.buffer("columnwise_data").unwrap().bytes();
    for &(i, j) in &[(0, 0), (17, 35), (47, 63), (31, 16), (5, 3)] {
        // Rowwise: row i, block j / 16, element j % 16, direction 0.
        let blk: [f32; 16] = std::array::from_fn(|e| x[i * k + (j / 16) * 16 + e]);
        let sdb = scale::block_scale_code(scale::amax_of(blk), s_enc);
        let enc = scale::block_encode_scale(sdb, s_dec);
        let bits = sr::block_bits(seed, sr::DIR_ROWWISE, i as u64, (j / 16) as u32);
        let want = e2m1::encode(sr::stochastic_round_e2m1(
            x[i * k + j] * enc,
            sr::element_bits(&bits, j % 16),
        ));
        assert_eq!(code(rd, i, j, k), want, "rowwise ({i}, {j})");
        // Columnwise: row j of x^T, block i / 16, element i % 16, direction 1.
        let blk: [f32; 16] = std::array::from_fn(|e| x[((i / 16) * 16 + e) * k + j]);
        let sdb = scale::block_scale_code(scale::amax_of(blk), s_enc);
        let enc = scale::block_encode_scale(sdb, s_dec);
        let bits = sr::philox4x32_10(
            [(i / 16) as u32, j as u32, 0, 1],
            [seed as u32, (seed >> 32) as u32],
        );
        let want = e2m1::encode(sr::stochastic_round_e2m1(
            x[i * k + j] * enc,
            (bits[(i % 16) / 4] >> (8 * (i % 4))) & 0xFF,
        ));
        assert_eq!(code(cd, j, i, m), want, "columnwise ({i}, {j})");
        assert!(e4m3::decode(sdb) >= 0.0);
    }
}
