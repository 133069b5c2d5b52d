// quantfmt shared CUDA header: the element and scale codecs, bit for bit the same functions as
// `quant_core::codec` (E4M3, E5M2, E2M1, E8M0). Each function names its Rust twin; the review
// rule is "same branches, same comparisons, same single float operations".
#pragma once
#include "quantfmt_common.cuh"

// ---- FP8 (quant_core::codec::fp8::encode / decode) -----------------------------------------

#ifdef QF_HW_FP8
// Two FP8 codes from the hardware (sm_89+): `lo`'s in bits 0..8, `hi`'s in bits 8..16.
// cvt.rn.satfinite rounds to nearest even, saturates +-inf and out-of-range values to +-max and
// keeps the sign of results that round to zero: the software rule of qf_fp8_encode. The one
// difference is NaN, which the rule maps to 0x7F whatever its sign; callers map it first.
__device__ __forceinline__ qf_u32 qf_fp8x2_hw(float lo, float hi, int e5m2) {
    qf_u16 r;
    if (e5m2) asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return (qf_u32)r;
}

// One code through qf_fp8x2_hw, NaN mapped to 0x7F as the rule does.
__device__ __forceinline__ qf_u32 qf_fp8_hw(float x, int e5m2) {
    return qf_is_nan(x) ? 0x7Fu : (qf_fp8x2_hw(x, 0.0f, e5m2) & 0xFFu);
}
#endif

// f32 -> FP8 with MBITS mantissa bits and exponent bias BIAS: round to nearest even, saturate to
// +-max (infinity too), NaN -> 0x7F, sign kept on values that round to zero.
template <int MBITS, int BIAS>
__device__ __forceinline__ qf_u32 qf_fp8_encode(float x, float maxv, qf_u32 max_code) {
#ifdef QF_HW_FP8
    (void)maxv;
    (void)max_code;
    return qf_fp8_hw(x, MBITS == 2);
#else
    qf_u32 bits = __float_as_uint(x);
    qf_u32 sign = (bits >> 24) & 0x80u;
    qf_u32 abits = bits & QF_F32_ABS_MASK;
    if (abits > QF_F32_INF_BITS) return 0x7Fu;
    float a = __uint_as_float(abits);
    if (a >= maxv) return sign | max_code;
    int f32_exp = (int)(abits >> 23);
    const int min_normal_exp = 128 - BIAS;
    qf_u32 code;
    if (f32_exp < min_normal_exp) {
        // Exact power-of-two scaling, then round-half-even to an integer (Rust round_ties_even).
        float scale = __uint_as_float(((qf_u32)(127 + BIAS - 1 + MBITS)) << 23);
        code = (qf_u32)rintf(a * scale);
    } else {
        const int shift = 23 - MBITS;
        qf_u32 mant = abits & 0x007FFFFFu;
        qf_u32 base = (((qf_u32)(f32_exp - 127 + BIAS)) << MBITS) | (mant >> shift);
        qf_u32 rem = mant & ((1u << shift) - 1u);
        qf_u32 half = 1u << (shift - 1);
        code = base + ((rem > half || (rem == half && (base & 1u) == 1u)) ? 1u : 0u);
    }
    return sign | min(code, max_code);
#endif
}

#define QF_E4M3_MAX 448.0f
#define QF_E5M2_MAX 57344.0f

// quant_core::codec::e4m3::encode
__device__ __forceinline__ qf_u32 qf_e4m3_encode(float x) {
    return qf_fp8_encode<3, 7>(x, QF_E4M3_MAX, 0x7Eu);
}
// quant_core::codec::e5m2::encode
__device__ __forceinline__ qf_u32 qf_e5m2_encode(float x) {
    return qf_fp8_encode<2, 15>(x, QF_E5M2_MAX, 0x7Bu);
}
// Fp8Dtype::encode: e5m2 != 0 selects E5M2. The same body as qf_fp8_encode with the format
// constants as run-time values: one copy of the code serves both formats (kernels that take the
// element type as a launch argument stay half the size, and NVRTC compiles them twice as fast).
__device__ __forceinline__ qf_u32 qf_fp8_encode_dt(float x, int e5m2) {
#ifdef QF_HW_FP8
    return qf_fp8_hw(x, e5m2);
#else
    const int mbits = e5m2 ? 2 : 3;
    const int bias = e5m2 ? 15 : 7;
    const float maxv = e5m2 ? QF_E5M2_MAX : QF_E4M3_MAX;
    const qf_u32 max_code = e5m2 ? 0x7Bu : 0x7Eu;
    qf_u32 bits = __float_as_uint(x);
    qf_u32 sign = (bits >> 24) & 0x80u;
    qf_u32 abits = bits & QF_F32_ABS_MASK;
    if (abits > QF_F32_INF_BITS) return 0x7Fu;
    float a = __uint_as_float(abits);
    if (a >= maxv) return sign | max_code;
    int f32_exp = (int)(abits >> 23);
    qf_u32 code;
    if (f32_exp < 128 - bias) {
        float scale = __uint_as_float(((qf_u32)(127 + bias - 1 + mbits)) << 23);
        code = (qf_u32)rintf(a * scale);
    } else {
        const int shift = 23 - mbits;
        qf_u32 mant = abits & 0x007FFFFFu;
        qf_u32 base = (((qf_u32)(f32_exp - 127 + bias)) << mbits) | (mant >> shift);
        qf_u32 rem = mant & ((1u << shift) - 1u);
        qf_u32 half = 1u << (shift - 1);
        code = base + ((rem > half || (rem == half && (base & 1u) == 1u)) ? 1u : 0u);
    }
    return sign | min(code, max_code);
#endif
}

// qf_fp8_encode_dt of two values: `a`'s code in bits 0..8, `b`'s in bits 8..16 (one hardware
// conversion where there is one).
__device__ __forceinline__ qf_u32 qf_fp8x2_encode_dt(float a, float b, int e5m2) {
#ifdef QF_HW_FP8
    const qf_u32 r = qf_fp8x2_hw(a, b, e5m2);
    return (qf_is_nan(a) ? 0x7Fu : (r & 0xFFu)) | (qf_is_nan(b) ? 0x7F00u : (r & 0xFF00u));
#else
    return qf_fp8_encode_dt(a, e5m2) | (qf_fp8_encode_dt(b, e5m2) << 8);
#endif
}

#ifdef QF_HW_FP8
// The values of two non-NaN FP8 codes (bits 0..8 and 8..16 of `codes`) from the hardware
// (sm_89+): every E4M3 and E5M2 value is an f16, so cvt.rn.f16x2.{e4m3,e5m2}x2 widens exactly
// (infinities too), and f16 -> f32 is exact. NaN codes stay with the caller: the rule's NaN is
// 0x7FC00000 with the code's sign.
__device__ __forceinline__ void qf_fp8x2_decode_hw(qf_u32 codes, int e5m2, float* lo, float* hi) {
    const qf_u16 c = (qf_u16)(codes & 0xFFFFu);
    qf_u32 h2;
    if (e5m2) asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(c));
    else asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
    *lo = qf_f16_bits_to_f32((qf_u16)(h2 & 0xFFFFu));
    *hi = qf_f16_bits_to_f32((qf_u16)(h2 >> 16));
}

__device__ __forceinline__ float qf_fp8_decode_hw(qf_u32 code, int e5m2) {
    float lo, hi;
    qf_fp8x2_decode_hw(code & 0xFFu, e5m2, &lo, &hi);
    return lo;
}
#endif

// Rust's f32::NAN with the sign of an FP8 code (what the decoders give for NaN codes).
__device__ __forceinline__ float qf_fp8_nan(qf_u32 code) {
    return __uint_as_float(0x7FC00000u | ((code & 0x80u) << 24));
}

// quant_core::codec::fp8::decode: NaN codes give Rust's f32::NAN (0x7FC00000) with the code's
// sign, infinities +-inf, the rest their exact value.
template <int MBITS, int BIAS>
__device__ __forceinline__ float qf_fp8_decode(qf_u32 code, bool nan, bool inf) {
#ifdef QF_HW_FP8
    (void)inf;
    return nan ? qf_fp8_nan(code) : qf_fp8_decode_hw(code, MBITS == 2);
#else
    bool neg = (code & 0x80u) != 0u;
    float mag;
    if (nan) {
        mag = __uint_as_float(0x7FC00000u);
    } else if (inf) {
        mag = __uint_as_float(QF_F32_INF_BITS);
    } else {
        int e = (int)((code & 0x7Fu) >> MBITS);
        qf_u32 m = code & ((1u << MBITS) - 1u);
        if (e == 0) {
            float unit = __uint_as_float(((qf_u32)(127 + 1 - BIAS - MBITS)) << 23);
            mag = (float)m * unit;
        } else {
            mag = __uint_as_float((((qf_u32)(e - BIAS + 127)) << 23) | (m << (23 - MBITS)));
        }
    }
    return neg ? -mag : mag;
#endif
}

// quant_core::codec::e4m3::decode (0x7F / 0xFF are NaN).
__device__ __forceinline__ float qf_e4m3_decode(qf_u32 code) {
    code &= 0xFFu;
    return qf_fp8_decode<3, 7>(code, (code & 0x7Fu) == 0x7Fu, false);
}
// quant_core::codec::e5m2::decode (0x7C inf, 0x7D..0x7F NaN).
__device__ __forceinline__ float qf_e5m2_decode(qf_u32 code) {
    code &= 0xFFu;
    qf_u32 m = code & 0x7Fu;
    return qf_fp8_decode<2, 15>(code, m > 0x7Cu, m == 0x7Cu);
}
// Fp8Dtype decode with the element type as a run-time value (one copy of the code).
__device__ __forceinline__ float qf_fp8_decode_dt(qf_u32 code, int e5m2) {
    code &= 0xFFu;
    const qf_u32 m7 = code & 0x7Fu;
    const bool nan = e5m2 ? m7 > 0x7Cu : m7 == 0x7Fu;
#ifdef QF_HW_FP8
    return nan ? qf_fp8_nan(code) : qf_fp8_decode_hw(code, e5m2);
#else
    const int mbits = e5m2 ? 2 : 3;
    const int bias = e5m2 ? 15 : 7;
    const bool inf = e5m2 ? m7 == 0x7Cu : false;
    bool neg = (code & 0x80u) != 0u;
    float mag;
    if (nan) {
        mag = __uint_as_float(0x7FC00000u);
    } else if (inf) {
        mag = __uint_as_float(QF_F32_INF_BITS);
    } else {
        int e = (int)(m7 >> mbits);
        qf_u32 m = code & ((1u << mbits) - 1u);
        if (e == 0) {
            float unit = __uint_as_float(((qf_u32)(127 + 1 - bias - mbits)) << 23);
            mag = (float)m * unit;
        } else {
            mag = __uint_as_float((((qf_u32)(e - bias + 127)) << 23) | (m << (23 - mbits)));
        }
    }
    return neg ? -mag : mag;
#endif
}

// Whether an FP8 code is a NaN of its format (E4M3: 0x7F / 0xFF; E5M2: 0x7D..0x7F, 0xFD..0xFF).
__device__ __forceinline__ bool qf_fp8_is_nan(qf_u32 code, int e5m2) {
    const qf_u32 m7 = code & 0x7Fu;
    return e5m2 ? m7 > 0x7Cu : m7 == 0x7Fu;
}

// qf_fp8_decode_dt of the codes in bits 0..8 (`lo`) and 8..16 (`hi`) of `codes` (one hardware
// conversion where there is one).
__device__ __forceinline__ void qf_fp8x2_decode_dt(qf_u32 codes, int e5m2, float* lo, float* hi) {
#ifdef QF_HW_FP8
    qf_fp8x2_decode_hw(codes, e5m2, lo, hi);
    if (qf_fp8_is_nan(codes, e5m2)) *lo = qf_fp8_nan(codes);
    if (qf_fp8_is_nan(codes >> 8, e5m2)) *hi = qf_fp8_nan(codes >> 8);
#else
    *lo = qf_fp8_decode_dt(codes & 0xFFu, e5m2);
    *hi = qf_fp8_decode_dt((codes >> 8) & 0xFFu, e5m2);
#endif
}

// The four codes of a little-endian word, decoded (qf_fp8_decode_dt).
__device__ __forceinline__ void qf_fp8x4_decode_dt(qf_u32 word, int e5m2, float v[4]) {
    qf_fp8x2_decode_dt(word, e5m2, &v[0], &v[1]);
    qf_fp8x2_decode_dt(word >> 16, e5m2, &v[2], &v[3]);
}

// qf_fp8_encode_dt of four values as one little-endian word (a's code in the low byte).
__device__ __forceinline__ qf_u32 qf_fp8x4_encode_dt(float a, float b, float c, float d, int e5m2) {
    return qf_fp8x2_encode_dt(a, b, e5m2) | (qf_fp8x2_encode_dt(c, d, e5m2) << 16);
}

// ---- E2M1 (quant_core::codec::e2m1) --------------------------------------------------------

// f32 -> 4-bit code: round to nearest even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating;
// NaN -> 7; negative values (also -0 and negatives rounding to 0) keep the sign bit.
__device__ __forceinline__ qf_u32 qf_e2m1_encode(float x) {
    qf_u32 bits = __float_as_uint(x);
    qf_u32 abits = bits & QF_F32_ABS_MASK;
    if (abits > QF_F32_INF_BITS) return 0x7u;
    float a = __uint_as_float(abits);
    qf_u32 sign = (bits >> 28) & 0x8u;
    qf_u32 code;
    if (a <= 0.25f) code = 0u;
    else if (a < 0.75f) code = 1u;
    else if (a <= 1.25f) code = 2u;
    else if (a < 1.75f) code = 3u;
    else if (a <= 2.5f) code = 4u;
    else if (a < 3.5f) code = 5u;
    else if (a <= 5.0f) code = 6u;
    else code = 7u;
    return sign | code;
}

// 4-bit code -> f32 (only the low nibble is read).
__device__ __forceinline__ float qf_e2m1_decode(qf_u32 code) {
    // {0, .5, 1, 1.5, 2, 3, 4, 6} from the exponent and mantissa bits (no table: a run-time
    // indexed array would live in local memory).
    qf_u32 e = (code >> 1) & 0x3u;
    qf_u32 m = code & 0x1u;
    float v = e == 0u ? (m ? 0.5f : 0.0f) : __uint_as_float(((126u + e) << 23) | (m << 22));
    return (code & 0x8u) ? -v : v;
}

// ---- E8M0 (quant_core::codec::e8m0) --------------------------------------------------------

// decode: 2^(code - 127); 0 -> 2^-127 (0x00400000), 0xFF -> NaN.
__device__ __forceinline__ float qf_e8m0_decode(qf_u32 code) {
    code &= 0xFFu;
    if (code == 0u) return __uint_as_float(0x00400000u);
    if (code == 0xFFu) return __uint_as_float(0x7FC00000u);
    return __uint_as_float(code << 23);
}

// exp2_rcp: 2^(127 - code); 0xFE -> 2^-127, 0xFF -> NaN.
__device__ __forceinline__ float qf_e8m0_exp2_rcp(qf_u32 code) {
    code &= 0xFFu;
    if (code == 0xFFu) return __uint_as_float(0x7FC00000u);
    if (code == 0xFEu) return __uint_as_float(0x00400000u);
    return __uint_as_float((254u - code) << 23);
}

// from_f32_ceil: TE's float_to_e8m0 (smallest power of two >= |val|, saturating at 2^127).
__device__ __forceinline__ qf_u32 qf_e8m0_from_f32_ceil(float val) {
    if (qf_is_nan(val)) return 0xFFu;
    if (qf_is_inf(val)) return 0xFEu;
    if (val == 0.0f) return 0x00u;
    qf_u32 bits = __float_as_uint(val);
    qf_u32 exp = (bits >> 23) & 0xFFu;
    qf_u32 man = bits & 0x7FFFFFu;
    if (man > 0u && exp != 0xFEu && !(exp == 0u && man <= 0x400000u)) exp += 1u;
    return exp & 0xFFu;
}

// from_f32_floor: the OCP rule, floor(log2(val)) as a biased exponent clamped to [0, 0xFE].
__device__ __forceinline__ qf_u32 qf_e8m0_from_f32_floor(float val) {
    if (qf_is_nan(val)) return 0xFFu;
    qf_u32 bits = __float_as_uint(val) & QF_F32_ABS_MASK;
    qf_u32 exp = bits >> 23;
    return min(exp, 0xFEu);
}
