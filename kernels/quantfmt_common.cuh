// quantfmt shared CUDA header: element types, exact conversions, IEEE helpers.
//
// Compiled by NVRTC with --fmad=false --ftz=false --prec-div=true --prec-sqrt=true, so every
// float operation below is one IEEE binary32 (or binary64) operation with round-to-nearest-even,
// exactly as the Rust CPU path computes it (Rust never contracts a*b+c into an fma). No standard
// header is included: NVRTC provides the CUDA built-ins (__float_as_uint, rintf, ...) itself.
//
// Element types are plain structs over their bits, so no cuda_fp16.h / cuda_bf16.h is needed and
// every conversion is spelled out bit for bit (the CPU path's Element conversions: the `half`
// crate's from_f32, and quant_core's round-once from_f64).
#pragma once

typedef unsigned char qf_u8;
typedef unsigned short qf_u16;
typedef unsigned int qf_u32;
typedef unsigned long long qf_u64;
typedef long long qf_i64;

// bf16 and f16 elements: 16-bit storage, converted by hand.
struct __align__(2) qf_bf16 {
    qf_u16 bits;
};
struct __align__(2) qf_f16 {
    qf_u16 bits;
};

#define QF_F32_MAX_BITS 0x7F7FFFFFu
#define QF_F32_INF_BITS 0x7F800000u
#define QF_F32_ABS_MASK 0x7FFFFFFFu

// Hardware conversions, where they compute the same bits as the software rule below them
// (tools/cuda-emu compiles the software rules; the device check's codec sweeps compare the
// hardware ones with quant_core::codec value by value):
// - QF_HW_BF16 (sm_80+): cvt.rn.bf16.f32 is round-to-nearest-even on the bits, as half's
//   from_f32; NaN, whose payload the two keep differently, stays on the software rule.
// - QF_HW_FP8 (sm_89+): cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (see quantfmt_codecs.cuh).
#if defined(__CUDA_ARCH__) && !defined(QF_HOST_EMU)
#if __CUDA_ARCH__ >= 800
#define QF_HW_BF16 1
#endif
#if __CUDA_ARCH__ >= 890
#define QF_HW_FP8 1
#endif
#endif

__device__ __forceinline__ float qf_f32_max() { return __uint_as_float(QF_F32_MAX_BITS); }
__device__ __forceinline__ bool qf_is_nan(float x) {
    return (__float_as_uint(x) & QF_F32_ABS_MASK) > QF_F32_INF_BITS;
}
__device__ __forceinline__ bool qf_is_inf(float x) {
    return (__float_as_uint(x) & QF_F32_ABS_MASK) == QF_F32_INF_BITS;
}
__device__ __forceinline__ float qf_abs(float x) {
    return __uint_as_float(__float_as_uint(x) & QF_F32_ABS_MASK);
}

// Correctly rounded IEEE division and reciprocal (what Rust's `a / b` and `1.0 / x` compute).
__device__ __forceinline__ float qf_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float qf_rcp(float x) { return __frcp_rn(x); }

// Rust `f32::min` / CUDA fminf: a NaN operand loses.
__device__ __forceinline__ float qf_fmin(float a, float b) { return fminf(a, b); }

// `fmax_ignore_nan(m, a)` of the CPU code: `if a > m { a } else { m }` (a NaN `a` loses).
__device__ __forceinline__ float qf_fmax_ignore_nan(float m, float a) { return a > m ? a : m; }

// The amax key of a value: |x| as its f32 bits, or 0 for NaN. Non-negative floats order like
// their bits, so max over keys (an integer max, order-independent) equals the NaN-ignoring amax
// of the CPU fold `fold(0.0, |m, v| if |v| > m { |v| } else { m })`.
__device__ __forceinline__ qf_u32 qf_amax_key(float x) {
    qf_u32 a = __float_as_uint(x) & QF_F32_ABS_MASK;
    return a > QF_F32_INF_BITS ? 0u : a;
}

// ---- loads: element -> f32 (exact) ----------------------------------------------------------

__device__ __forceinline__ float qf_bf16_bits_to_f32(qf_u16 b) {
    // half's bf16_to_f32: a NaN gets its quiet bit set.
    qf_u32 w = (qf_u32)b;
    if ((w & 0x7FFFu) > 0x7F80u) w |= 0x0040u;
    return __uint_as_float(w << 16);
}

__device__ __forceinline__ float qf_f16_bits_to_f32(qf_u16 h) {
#ifdef QF_HOST_EMU  // tools/cuda-emu: the same IEEE conversion on the host
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

__device__ __forceinline__ float qf_to_f32(float v) { return v; }
__device__ __forceinline__ float qf_to_f32(qf_bf16 v) { return qf_bf16_bits_to_f32(v.bits); }
__device__ __forceinline__ float qf_to_f32(qf_f16 v) { return qf_f16_bits_to_f32(v.bits); }

// ---- stores: f32 -> element, as half's `from_f32` rounds ---------------------------------------

// half::bf16::from_f32 (bfloat/convert.rs f32_to_bf16): round to nearest even on the bits;
// NaN keeps its high bits with the quiet bit set.
__device__ __forceinline__ qf_u16 qf_f32_to_bf16_bits(float value) {
    qf_u32 x = __float_as_uint(value);
    if ((x & QF_F32_ABS_MASK) > QF_F32_INF_BITS) return (qf_u16)((x >> 16) | 0x0040u);
#ifdef QF_HW_BF16
    qf_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(value));
    return h;
#else
    const qf_u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (qf_u16)((x >> 16) + 1u);
    return (qf_u16)(x >> 16);
#endif
}

// half::f16::from_f32 is IEEE round-to-nearest-even (F16C `vcvtps2ph`, or its software
// fallback); PTX cvt.rn.f16.f32 is the same rounding. (NaN payloads may differ: NaN bits are
// outside the byte-equality contract, see docs/cuda.md.)
__device__ __forceinline__ qf_u16 qf_f32_to_f16_bits(float value) {
    qf_u16 h;
#ifdef QF_HOST_EMU  // tools/cuda-emu: the same IEEE round-to-nearest-even on the host
    _Float16 v = (_Float16)value;
    __builtin_memcpy(&h, &v, 2);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(value));
#endif
    return h;
}

__device__ __forceinline__ void qf_from_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void qf_from_f32(qf_bf16* p, float v) { p->bits = qf_f32_to_bf16_bits(v); }
__device__ __forceinline__ void qf_from_f32(qf_f16* p, float v) { p->bits = qf_f32_to_f16_bits(v); }

// ---- stores from f64 (Element::from_f64) ------------------------------------------------------

// quant_core::dtype::f64_to_f32_round_odd: f64 -> f32 rounded to odd (exact when representable,
// else truncated toward zero with the last bit set). Rounding that to nearest-even in bf16 or
// f16 is one correct rounding of the f64, which is how Element::from_f64 narrows.
__device__ __forceinline__ float qf_f64_to_f32_round_odd(double v) {
    const float f = __double2float_rn(v);
    if (qf_is_nan(f) || (double)f == v) return f;
    qf_u32 bits = __float_as_uint(f);
    if (fabs((double)f) > fabs(v)) bits -= 1u;  // rounded away from zero (infinity included)
    return __uint_as_float(bits | 1u);
}

// <bf16 as Element>::from_f64 = bf16::from_f32(f64_to_f32_round_odd(v)).
__device__ __forceinline__ qf_u16 qf_f64_to_bf16_bits(double value) {
    return qf_f32_to_bf16_bits(qf_f64_to_f32_round_odd(value));
}

// <f16 as Element>::from_f64 = f16::from_f32(f64_to_f32_round_odd(v)).
__device__ __forceinline__ qf_u16 qf_f64_to_f16_bits(double value) {
    return qf_f32_to_f16_bits(qf_f64_to_f32_round_odd(value));
}

__device__ __forceinline__ void qf_from_f64(float* p, double v) { *p = __double2float_rn(v); }
__device__ __forceinline__ void qf_from_f64(qf_bf16* p, double v) { p->bits = qf_f64_to_bf16_bits(v); }
__device__ __forceinline__ void qf_from_f64(qf_f16* p, double v) { p->bits = qf_f64_to_f16_bits(v); }

// Largest finite value of an input element type (`Element::MAX_FINITE`).
template <typename T> __device__ __forceinline__ float qf_max_finite();
template <> __device__ __forceinline__ float qf_max_finite<float>() { return __uint_as_float(0x7F7FFFFFu); }
template <> __device__ __forceinline__ float qf_max_finite<qf_bf16>() { return __uint_as_float(0x7F7F0000u); }
template <> __device__ __forceinline__ float qf_max_finite<qf_f16>() { return 65504.0f; }

// ---- vector loads --------------------------------------------------------------------------

// Loads 4 consecutive elements starting at `p` (which must be aligned to 4 elements) as f32.
__device__ __forceinline__ void qf_load4(const float* p, float out[4]) {
    float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
}
__device__ __forceinline__ void qf_load4(const qf_bf16* p, float out[4]) {
    uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = qf_bf16_bits_to_f32((qf_u16)(v.x & 0xFFFFu));
    out[1] = qf_bf16_bits_to_f32((qf_u16)(v.x >> 16));
    out[2] = qf_bf16_bits_to_f32((qf_u16)(v.y & 0xFFFFu));
    out[3] = qf_bf16_bits_to_f32((qf_u16)(v.y >> 16));
}
__device__ __forceinline__ void qf_load4(const qf_f16* p, float out[4]) {
    uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = qf_f16_bits_to_f32((qf_u16)(v.x & 0xFFFFu));
    out[1] = qf_f16_bits_to_f32((qf_u16)(v.x >> 16));
    out[2] = qf_f16_bits_to_f32((qf_u16)(v.y & 0xFFFFu));
    out[3] = qf_f16_bits_to_f32((qf_u16)(v.y >> 16));
}

// Stores 4 values as consecutive elements at `p` (aligned to 4 elements), each rounded as
// qf_from_f32: one 16-byte (f32) or 8-byte (bf16, f16) store.
__device__ __forceinline__ void qf_store4(float* p, const float v[4]) {
    float4 w;
    w.x = v[0]; w.y = v[1]; w.z = v[2]; w.w = v[3];
    *reinterpret_cast<float4*>(p) = w;
}
__device__ __forceinline__ void qf_store4(qf_bf16* p, const float v[4]) {
    uint2 w;
    w.x = (qf_u32)qf_f32_to_bf16_bits(v[0]) | ((qf_u32)qf_f32_to_bf16_bits(v[1]) << 16);
    w.y = (qf_u32)qf_f32_to_bf16_bits(v[2]) | ((qf_u32)qf_f32_to_bf16_bits(v[3]) << 16);
    *reinterpret_cast<uint2*>(p) = w;
}
__device__ __forceinline__ void qf_store4(qf_f16* p, const float v[4]) {
    uint2 w;
    w.x = (qf_u32)qf_f32_to_f16_bits(v[0]) | ((qf_u32)qf_f32_to_f16_bits(v[1]) << 16);
    w.y = (qf_u32)qf_f32_to_f16_bits(v[2]) | ((qf_u32)qf_f32_to_f16_bits(v[3]) << 16);
    *reinterpret_cast<uint2*>(p) = w;
}

// Whether `p` is 16-byte aligned (vector paths check their buffers once, at the top).
__device__ __forceinline__ bool qf_aligned16(const void* p) {
    return (reinterpret_cast<qf_u64>(p) & 15u) == 0u;
}

// a / b, by a 32-bit division where both fit (a 64-bit division is a long software routine).
__device__ __forceinline__ qf_u64 qf_div_u64(qf_u64 a, qf_u64 b) {
    return ((a | b) >> 32) == 0u ? (qf_u64)((qf_u32)a / (qf_u32)b) : a / b;
}

// Loads up to 4 consecutive elements (`n` valid, the rest 0) without alignment requirement.
template <typename T>
__device__ __forceinline__ void qf_load4_tail(const T* p, int n, float out[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = i < n ? qf_to_f32(p[i]) : 0.0f;
}

// ---- reductions ----------------------------------------------------------------------------

__device__ __forceinline__ qf_u32 qf_warp_max_u32(qf_u32 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// Max over groups of `W` consecutive lanes (W = 2, 4, 8, 16, 32); every lane gets its group's max.
template <int W>
__device__ __forceinline__ qf_u32 qf_group_max_u32(qf_u32 v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// ---- grid helpers --------------------------------------------------------------------------

__device__ __forceinline__ qf_u64 qf_global_thread() {
    return (qf_u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ qf_u64 qf_grid_threads() { return (qf_u64)gridDim.x * blockDim.x; }

// Instantiates `extern "C"` entry points of a kernel template for the three input types.
// KERNEL(name, T) must expand to one entry point.
#define QF_FOR_INPUT_TYPES(KERNEL, name) \
    KERNEL(name##_f32, float)            \
    KERNEL(name##_bf16, qf_bf16)         \
    KERNEL(name##_f16, qf_f16)
