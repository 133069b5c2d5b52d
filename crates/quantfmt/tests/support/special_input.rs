//! The input generator shared by the device check (`tests/cuda_device.rs`) and the host
//! emulation's case writer (`tools/cuda-emu/cases.rs`), so both exercise the kernels on the
//! same values. Included with `#[path]`; not a test crate of its own (the including crate
//! needs the `quantfmt-testkit` dev-dependency).

/// Deterministic data over many magnitudes, with the special values salted in at fixed
/// positions and whole special blocks (zero, NaN, subnormal, huge) along the first rows.
pub fn input(dims: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = dims.iter().product();
    let k = *dims.last().unwrap();
    let mut rng = quantfmt_testkit::XorShift64::scrambled(seed);
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        f32::from_bits(1),
        -f32::from_bits(0x0040_0000),
        448.0,
        -464.0,
        57344.0,
        61440.0,
        6.0,
        -5.0,
        2.5,
        0.25,
        1e30,
        -3.0e38,
        65504.0,
        1e-30,
    ];
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            let r = rng.next_u64();
            if i % 53 == 7 {
                specials[(r % specials.len() as u64) as usize]
            } else {
                let mag = 10f32.powf(((r >> 8) % 1000) as f32 / 100.0 - 6.0);
                let sign = if r & 1 == 1 { -1.0 } else { 1.0 };
                sign * mag * (1.0 + ((r >> 20) % 1024) as f32 / 1024.0)
            }
        })
        .collect();
    // Special blocks: the first 32 elements of rows 0..4 (clipped to the row length).
    let blk = k.min(32);
    let rows = n / k;
    let fills: [fn(usize) -> f32; 4] = [
        |_| 0.0,
        |_| f32::NAN,
        |i| f32::from_bits(1 + i as u32),
        |i| if i % 2 == 0 { 1e38 } else { -2e-38 },
    ];
    for (r, fill) in fills.iter().enumerate().take(rows) {
        for j in 0..blk {
            v[r * k + j] = fill(j);
        }
    }
    v
}
