// Device self-test kernels: run the shared header's conversions over given inputs so a GPU
// test can compare them with quant_core::codec and the `half` crate value by value.
#include "quantfmt_common.cuh"
#include "quantfmt_codecs.cuh"
#include "quantfmt_layout.cuh"

// Element i encodes the f32 with bits `start + i * step` (wrapping) with every encoder.
extern "C" __global__ void qf_selftest_encode(qf_u32 start, qf_u32 step, qf_u64 n,
                                              qf_u8* e4m3, qf_u8* e5m2, qf_u8* e2m1,
                                              qf_u8* e8m0_ceil, qf_u8* e8m0_floor,
                                              qf_u16* bf16, qf_u16* f16, qf_u8* e4m3_dt,
                                              qf_u8* e5m2_dt) {
    for (qf_u64 i = qf_global_thread(); i < n; i += qf_grid_threads()) {
        const float x = __uint_as_float(start + (qf_u32)i * step);
        e4m3[i] = (qf_u8)qf_e4m3_encode(x);
        e5m2[i] = (qf_u8)qf_e5m2_encode(x);
        e4m3_dt[i] = (qf_u8)qf_fp8_encode_dt(x, 0);
        e5m2_dt[i] = (qf_u8)qf_fp8_encode_dt(x, 1);
        e2m1[i] = (qf_u8)qf_e2m1_encode(x);
        e8m0_ceil[i] = (qf_u8)qf_e8m0_from_f32_ceil(x);
        e8m0_floor[i] = (qf_u8)qf_e8m0_from_f32_floor(x);
        bf16[i] = qf_f32_to_bf16_bits(x);
        f16[i] = qf_f32_to_f16_bits(x);
    }
}

// Every code through every decoder (256 threads, one block).
extern "C" __global__ void qf_selftest_decode(float* e4m3, float* e5m2, float* e4m3_dt,
                                              float* e5m2_dt, float* e2m1, float* e8m0,
                                              float* e8m0_rcp) {
    const qf_u32 c = threadIdx.x;
    e4m3[c] = qf_e4m3_decode(c);
    e5m2[c] = qf_e5m2_decode(c);
    e4m3_dt[c] = qf_fp8_decode_dt(c, 0);
    e5m2_dt[c] = qf_fp8_decode_dt(c, 1);
    if (c < 16u) e2m1[c] = qf_e2m1_decode(c);
    e8m0[c] = qf_e8m0_decode(c);
    e8m0_rcp[c] = qf_e8m0_exp2_rcp(c);
}

// f64 -> f32 / bf16 / f16 (Element::from_f64) and 16-bit loads (Element::to_f32).
extern "C" __global__ void qf_selftest_convert(const double* in, qf_u64 n, float* f32,
                                               qf_u16* bf16, qf_u16* f16, const qf_u16* h_in,
                                               float* bf16_widened, float* f16_widened) {
    for (qf_u64 i = qf_global_thread(); i < n; i += qf_grid_threads()) {
        qf_from_f64(f32 + i, in[i]);
        bf16[i] = qf_f64_to_bf16_bits(in[i]);
        f16[i] = qf_f64_to_f16_bits(in[i]);
        bf16_widened[i] = qf_bf16_bits_to_f32(h_in[i]);
        f16_widened[i] = qf_f16_bits_to_f32(h_in[i]);
    }
}

// Swizzled positions of (i, j) for i < rows, j < cols (row-major over (i, j)).
extern "C" __global__ void qf_selftest_swizzle(qf_u64 rows, qf_u64 cols, qf_u64* out) {
    for (qf_u64 t = qf_global_thread(); t < rows * cols; t += qf_grid_threads())
        out[t] = qf_swizzled_index(t / cols, t % cols, cols);
}
