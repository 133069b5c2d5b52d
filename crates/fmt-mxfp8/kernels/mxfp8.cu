// fmt-mxfp8 device kernels: MXFP8 quantize (rowwise 1x32 and columnwise 32x1 blocks from one
// read, or 32x32 tiles with `2d`) writing compact or cuBLAS-swizzled E8M0 scales directly, and
// dequantize. Mirrors crates/fmt-mxfp8/src/kernels.rs and scale.rs; see docs/cuda.md.
#include "quantfmt_common.cuh"
#include "quantfmt_codecs.cuh"
#include "quantfmt_layout.cuh"

#define MX_THREADS 256
#define MX_TILE_COLS 128  // 32 lanes x 4 columns
#define MX_BLOCK 32

// ScaleRule::key: |x| as f32 bits; the TE rule maps NaN to 0 (NaN never wins), the OCP rule
// keeps NaN above infinity (it propagates into the scale).
__device__ __forceinline__ qf_u32 mx_key(float x, int ocp) {
    const qf_u32 a = __float_as_uint(x) & QF_F32_ABS_MASK;
    return (!ocp && a > QF_F32_INF_BITS) ? 0u : a;
}

// ScaleRule::code of a block whose key is `key`.
__device__ __forceinline__ qf_u32 mx_code(qf_u32 key, int ocp, int e5m2) {
    const float amax = __uint_as_float(key);
    if (!ocp) {
        // TE: one IEEE multiply by float(1/max), then round up to a power of two.
        const float max_rcp = __uint_as_float(e5m2 ? 0x37924925u : 0x3B124925u);
        return qf_e8m0_from_f32_ceil(amax * max_rcp);
    }
    if (qf_is_nan(amax) || qf_is_inf(amax)) return 0xFFu;
    const qf_u32 biased = qf_e8m0_from_f32_floor(amax);
    const qf_u32 emax = e5m2 ? 15u : 8u;
    return biased > emax ? biased - emax : 0u;  // saturating_sub
}

// Cfg::encode of four values (each with its multiplier) as one little-endian word: fp8(x * mult),
// or TE's fma(x, mult, +0) (an input -0.0 gives +0) when plus_zero is set.
__device__ __forceinline__ qf_u32 mx_encode4(const float v[4], const float mult[4], int plus_zero,
                                             int e5m2) {
    float p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = (plus_zero && v[j] == 0.0f) ? 0.0f : v[j] * mult[j];
    return qf_fp8x4_encode_dt(p[0], p[1], p[2], p[3], e5m2);
}

__device__ __forceinline__ qf_u64 mx_row_scale_index(qf_u64 r, qf_u64 kb, qf_u64 stride, int swz) {
    return swz ? qf_swizzled_index(r, kb, stride) : r * stride + kb;
}
// Columnwise scales are swizzled as their transpose ([roundup(K,128), roundup(M/32,4)]).
__device__ __forceinline__ qf_u64 mx_col_scale_index(qf_u64 mb, qf_u64 col, qf_u64 stride,
                                                     qf_u64 rows, int swz) {
    return swz ? qf_swizzled_index(col, mb, rows) : mb * stride + col;
}

// One block per 32-row x 128-column tile (M and K are multiples of 32, so a tile holds whole
// blocks; columns past K are idle). Warp w holds rows 4w..4w+3, lane l columns 4l..4l+3; the
// 8 lanes 8q..8q+7 cover rowwise block q of the tile. All 16 values stay in registers: both
// directions are written from one read.
template <typename T>
__device__ void mxfp8_cast_impl(const T* __restrict__ x, qf_u64 m, qf_u64 k, int e5m2, int ocp,
                                int two_d, int plus_zero, int swz, qf_u8* __restrict__ rd,
                                qf_u8* __restrict__ rs, qf_u64 rs_stride, qf_u8* __restrict__ cd,
                                qf_u8* __restrict__ cs, qf_u64 cs_stride, qf_u64 cs_rows) {
    __shared__ qf_u32 col_part[8][MX_TILE_COLS];
    __shared__ qf_u32 tile_part[8][4];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int q = lane / 8;  // rowwise block of the tile
    const qf_u64 nct = (k + MX_TILE_COLS - 1) / MX_TILE_COLS;
    const qf_u64 ntiles = nct * (m / MX_BLOCK);
    for (qf_u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const qf_u64 mb = t / nct;
        const qf_u64 r0 = mb * MX_BLOCK;
        const qf_u64 c = (t % nct) * MX_TILE_COLS + 4u * lane;
        const bool valid = c < k;
        const qf_u64 kb = c / MX_BLOCK;

        float v[4][4];
        qf_u32 rk[4];
        qf_u32 ck[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const qf_u64 r = r0 + 4 * warp + i;
            if (valid) qf_load4(x + r * k + c, v[i]);
            else qf_load4_tail(x, 0, v[i]);
            qf_u32 lk = 0u;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const qf_u32 key = mx_key(v[i][j], ocp);
                lk = max(lk, key);
                ck[j] = max(ck[j], key);
            }
            rk[i] = qf_group_max_u32<8>(lk);  // the 32-element rowwise block of row r
        }
        qf_u32 tile_code = 0u;
        if (two_d) {
            qf_u32 tk = max(max(rk[0], rk[1]), max(rk[2], rk[3]));
            if ((lane & 7) == 0) tile_part[warp][q] = tk;
        } else if (cd != nullptr) {
#pragma unroll
            for (int j = 0; j < 4; ++j) col_part[warp][4 * lane + j] = ck[j];
        }
        __syncthreads();

        if (two_d) {
            qf_u32 tk = 0u;
#pragma unroll
            for (int w = 0; w < 8; ++w) tk = max(tk, tile_part[w][q]);
            tile_code = mx_code(tk, ocp, e5m2);
            const float mult = qf_e8m0_exp2_rcp(tile_code);
            if (valid) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const qf_u64 r = r0 + 4 * warp + i;
                    const float m4[4] = {mult, mult, mult, mult};
                    const qf_u32 word = mx_encode4(v[i], m4, plus_zero, e5m2);
                    if (rd != nullptr) *reinterpret_cast<qf_u32*>(rd + r * k + c) = word;
                    if (cd != nullptr) *reinterpret_cast<qf_u32*>(cd + r * k + c) = word;
                    if (rs != nullptr && (lane & 7) == 0)
                        rs[mx_row_scale_index(r, kb, rs_stride, swz)] = (qf_u8)tile_code;
                }
                if (cs != nullptr && warp == 0) {
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        cs[mx_col_scale_index(mb, c + j, cs_stride, cs_rows, swz)] = (qf_u8)tile_code;
                }
            }
        } else {
            if (rd != nullptr && valid) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const qf_u64 r = r0 + 4 * warp + i;
                    const qf_u32 code_r = mx_code(rk[i], ocp, e5m2);
                    const float mult = qf_e8m0_exp2_rcp(code_r);
                    const float m4[4] = {mult, mult, mult, mult};
                    *reinterpret_cast<qf_u32*>(rd + r * k + c) = mx_encode4(v[i], m4, plus_zero, e5m2);
                    if ((lane & 7) == 0) rs[mx_row_scale_index(r, kb, rs_stride, swz)] = (qf_u8)code_r;
                }
            }
            if (cd != nullptr && valid) {
                float mult[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    qf_u32 key = 0u;
#pragma unroll
                    for (int w = 0; w < 8; ++w) key = max(key, col_part[w][4 * lane + j]);
                    const qf_u32 code_c = mx_code(key, ocp, e5m2);
                    mult[j] = qf_e8m0_exp2_rcp(code_c);
                    if (warp == 0) cs[mx_col_scale_index(mb, c + j, cs_stride, cs_rows, swz)] = (qf_u8)code_c;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const qf_u64 r = r0 + 4 * warp + i;
                    *reinterpret_cast<qf_u32*>(cd + r * k + c) = mx_encode4(v[i], mult, plus_zero, e5m2);
                }
            }
        }
        __syncthreads();  // shared memory is reused by the next tile
    }
}

#define MXFP8_CAST_KERNEL(name, T)                                                              \
    extern "C" __global__ void __launch_bounds__(MX_THREADS)                                    \
        name(const T* __restrict__ x, qf_u64 m, qf_u64 k, int e5m2, int ocp, int two_d,         \
             int plus_zero, int swz, qf_u8* __restrict__ rd, qf_u8* __restrict__ rs,             \
             qf_u64 rs_stride, qf_u8* __restrict__ cd, qf_u8* __restrict__ cs,                  \
             qf_u64 cs_stride, qf_u64 cs_rows) {                                                \
        mxfp8_cast_impl<T>(x, m, k, e5m2, ocp, two_d, plus_zero, swz, rd, rs, rs_stride, cd,    \
                           cs, cs_stride, cs_rows);                                             \
    }
QF_FOR_INPUT_TYPES(MXFP8_CAST_KERNEL, mxfp8_cast)

// Dequantize (kernels.rs dequantize_rowwise / dequantize_columnwise):
// out = OT(2^(e - 127) * decode(q)), one f32 multiply and one rounding. Four elements per
// thread (K is a multiple of 32, so a group of four never crosses a row or a block).
template <typename OT>
__device__ void mxfp8_dequant_impl(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k,
                                   const qf_u8* __restrict__ s, int columnwise, int swz,
                                   qf_u64 stride, qf_u64 rows, int e5m2, OT* __restrict__ out) {
    const qf_u64 n4 = m * k / 4u;
    const bool vec = qf_aligned16(out);
#pragma unroll 4
    for (qf_u64 g = qf_global_thread(); g < n4; g += qf_grid_threads()) {
        const qf_u64 idx = 4u * g;
        const qf_u64 r = qf_div_u64(idx, k), c = idx - r * k;
        const qf_u32 word = *reinterpret_cast<const qf_u32*>(q + idx);
        float v[4];
        qf_fp8x4_decode_dt(word, e5m2, v);
        if (columnwise) {
            // Four columns, four (possibly different) scales.
#pragma unroll
            for (int j = 0; j < 4; ++j)
                v[j] = qf_e8m0_decode(s[mx_col_scale_index(r / MX_BLOCK, c + j, stride, rows, swz)]) * v[j];
        } else {
            const float sc = qf_e8m0_decode(s[mx_row_scale_index(r, c / MX_BLOCK, stride, swz)]);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = sc * v[j];
        }
        if (vec) {
            qf_store4(out + idx, v);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) qf_from_f32(out + idx + j, v[j]);
        }
    }
}

#define MXFP8_DEQUANT_KERNEL(name, OT)                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        name(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k, const qf_u8* __restrict__ s,      \
             int columnwise, int swz, qf_u64 stride, qf_u64 rows, int e5m2,                     \
             OT* __restrict__ out) {                                                            \
        mxfp8_dequant_impl<OT>(q, m, k, s, columnwise, swz, stride, rows, e5m2, out);           \
    }
QF_FOR_INPUT_TYPES(MXFP8_DEQUANT_KERNEL, mxfp8_dequant)
