// fmt-nvfp4 device kernels: NVFP4 quantize (1-D, 2-D, RHT columnwise, stochastic rounding with
// the CPU path's Philox stream, row-scaled, 4over6), the RHT amax pass, and dequantize
// (including the inverse Hadamard transform). Each function names its twin in
// crates/fmt-nvfp4/src (scale.rs, kernel.rs, sr.rs, rht.rs, dequant.rs); see docs/cuda.md.
#include "quantfmt_common.cuh"
#include "quantfmt_codecs.cuh"
#include "quantfmt_layout.cuh"

#define NV_BLOCK 16
#define NV_THREADS 256

// ---- scale.rs --------------------------------------------------------------------------------

#define NV_RCP_6 __uint_as_float(0x3E2AAAABu)  // scale::RCP_6 = f32(1/6)

// global_encode_scale: S_enc = fminf(e4m3_max * 6 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0.
__device__ __forceinline__ float nv_global_encode_scale(float amax, int e4m3_max) {
    float s = qf_div((float)e4m3_max * 6.0f, amax);
    s = qf_fmin(s, qf_f32_max());
    return (amax == 0.0f || s == 0.0f) ? 1.0f : s;
}

// block_scale_code: e4m3(fminf(block_amax * (S_enc * (1/6)), FLT_MAX)).
__device__ __forceinline__ qf_u32 nv_block_scale_code(float block_amax, float s_enc) {
    const float multiplier = s_enc * NV_RCP_6;
    return qf_e4m3_encode(qf_fmin(block_amax * multiplier, qf_f32_max()));
}

// block_encode_scale: fminf(1 / (float(sdb) * S_dec), FLT_MAX).
__device__ __forceinline__ float nv_block_encode_scale(qf_u32 sdb, float s_dec) {
    return qf_fmin(qf_rcp(qf_e4m3_decode(sdb) * s_dec), qf_f32_max());
}

// dequant_factor: (float(sdb) * amax) * rcp, rcp = f32(1 / (6 * e4m3_max)), TE's f32 arithmetic; where
// that overflows for a finite amax (above f32::MAX / 448), the same expression in double,
// rounded once to f32 (scale.rs `dequant_factor`: zero codes must not become 0 * inf = NaN).
__device__ __forceinline__ float nv_dequant_factor_rcp(qf_u32 sdb, float amax, float rcp) {
    const float sf = qf_e4m3_decode(sdb);
    const float f = (sf * amax) * rcp;
    const bool f_finite = fabsf(f) <= qf_f32_max();
    const bool amax_finite = fabsf(amax) <= qf_f32_max();
    if (f_finite || !amax_finite) {
        return f;
    }
    return __double2float_rn(((double)sf * (double)amax) * (double)rcp);
}
// The same with `rcp = f32(1 / (6 * e4m3_max))` computed here.
__device__ __forceinline__ float nv_dequant_factor(qf_u32 sdb, float amax, int e4m3_max) {
    return nv_dequant_factor_rcp(sdb, amax, qf_rcp(6.0f * (float)e4m3_max));
}

// ---- sr.rs -------------------------------------------------------------------------------------

// philox4x32_10 (Random123 / curand Philox4x32-10).
__device__ __forceinline__ void nv_philox4x32_10(qf_u32 c[4], qf_u32 k0, qf_u32 k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const qf_u32 lo0 = 0xD2511F53u * c[0], hi0 = __umulhi(0xD2511F53u, c[0]);
        const qf_u32 lo1 = 0xCD9E8D57u * c[2], hi1 = __umulhi(0xCD9E8D57u, c[2]);
        const qf_u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

// stochastic_round_e2m1: TE's software rounding of an already scaled value onto the grid.
__device__ __forceinline__ float nv_stochastic_round_e2m1(float v, qf_u32 rbits8) {
    const float u = (float)(rbits8 & 0xFFu) * (1.0f / 256.0f);
    const float a = qf_abs(v);
    const float step = a >= 4.0f ? 2.0f : (a >= 2.0f ? 1.0f : 0.5f);
    const float t = a + u * step;
    float step_t, inv_step_t;
    if (t >= 4.0f) {
        step_t = 2.0f;
        inv_step_t = 0.5f;
    } else if (t >= 2.0f) {
        step_t = 1.0f;
        inv_step_t = 1.0f;
    } else {
        step_t = 0.5f;
        inv_step_t = 2.0f;
    }
    const float q = qf_fmin(floorf(t * inv_step_t) * step_t, 6.0f);
    return copysignf(q, qf_is_nan(v) ? 1.0f : v);
}

// ---- rht.rs ------------------------------------------------------------------------------------

// R[i][j] = s_i * (-1)^popcount(i & j) * 0.25, sign mask 0xD7E8 (compile-time constants once
// the loops are unrolled).
__device__ __forceinline__ float nv_rht_entry(int i, int j) {
    const int neg = (__popc((unsigned)(i & j)) + ((0xD7E8 >> i) & 1)) & 1;
    return neg ? -0.25f : 0.25f;
}

__device__ __forceinline__ float nv_round_bf16(float v) {
    return qf_bf16_bits_to_f32(qf_f32_to_bf16_bits(v));
}

// Operand row r, block b of bf16(RHT(x^T)) (transposed_rht + forward_16): column r of x, rows
// 16b .. 16b+15, narrowed to bf16, rotated with fp32 accumulation in index order from +0,
// rounded to bf16.
template <typename T>
__device__ __forceinline__ void nv_load_rht(const T* __restrict__ x, qf_u64 k, qf_u64 r, qf_u64 b,
                                            float y[NV_BLOCK]) {
    float w[NV_BLOCK];
#pragma unroll
    for (int i = 0; i < NV_BLOCK; ++i) w[i] = nv_round_bf16(qf_to_f32(x[(NV_BLOCK * b + i) * k + r]));
#pragma unroll
    for (int j = 0; j < NV_BLOCK; ++j) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) acc += w[i] * nv_rht_entry(i, j);
        y[j] = nv_round_bf16(acc);
    }
}

// Operand row r, block b: rowwise (dir 0) x[r][16b..], columnwise (dir 1) x[16b..][r], or the
// Hadamard-rotated columnwise operand.
template <typename T>
__device__ __forceinline__ void nv_load_block(const T* __restrict__ x, qf_u64 k, int dir, int rht,
                                              qf_u64 r, qf_u64 b, float v[NV_BLOCK]) {
    if (dir == 0) {
        const T* p = x + r * k + NV_BLOCK * b;  // 16-element aligned: K % 16 == 0
#pragma unroll
        for (int q = 0; q < 4; ++q) qf_load4(p + 4 * q, v + 4 * q);
    } else if (rht) {
        nv_load_rht(x, k, r, b, v);
    } else {
#pragma unroll
        for (int i = 0; i < NV_BLOCK; ++i) v[i] = qf_to_f32(x[(NV_BLOCK * b + i) * k + r]);
    }
}

// ---- kernel.rs -----------------------------------------------------------------------------------

__device__ __forceinline__ qf_u64 nv_pack16(const qf_u32 c[NV_BLOCK]) {
    qf_u64 w = 0u;
#pragma unroll
    for (int p = 0; p < NV_BLOCK / 2; ++p)
        w |= (qf_u64)((c[2 * p] & 0xFu) | ((c[2 * p + 1] & 0xFu) << 4)) << (8 * p);
    return w;
}

// One 4over6 candidate (four_over_six_candidates' `make`): codes and summed error.
__device__ __forceinline__ float nv_fos_candidate(const float v[NV_BLOCK], float sf, float s_dec,
                                                  float amax, float denom, int mse, qf_u32* sdb,
                                                  qf_u32 codes[NV_BLOCK]) {
    *sdb = qf_e4m3_encode(qf_fmin(sf, QF_E4M3_MAX));
    const float inv = nv_block_encode_scale(*sdb, s_dec);
    const float sdb_f = qf_e4m3_decode(*sdb);
    float err = 0.0f;
#pragma unroll
    for (int i = 0; i < NV_BLOCK; ++i) {
        codes[i] = qf_e2m1_encode(v[i] * inv);
        const float val = qf_div((qf_e2m1_decode(codes[i]) * sdb_f) * amax, denom);
        const float d = val - v[i];
        err += mse ? d * d : qf_abs(d);
    }
    return err;
}

// tree_sum_16: v[i] += v[i + half] for half = 8, 4, 2, 1 (the CUDA warp reduction's order).
__device__ __forceinline__ float nv_tree_sum_16(const float* e) {
    float v[NV_BLOCK];
#pragma unroll
    for (int i = 0; i < NV_BLOCK; ++i) v[i] = e[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] += v[i + 8];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] += v[i + 4];
#pragma unroll
    for (int i = 0; i < 2; ++i) v[i] += v[i + 2];
    v[0] += v[1];
    return v[0];
}

// quantize_rows / quantize_slab: the operand is [rows, cols] (rowwise: x as [M, K]; columnwise:
// x^T as [K, M], optionally Hadamard-rotated). A block of 256 threads takes 16 operand rows x
// 16 blocks of 16; each thread one 16-element block (the rowwise layout gives consecutive
// threads consecutive blocks of a row, the columnwise one consecutive operand rows = columns of
// x, so reads are coalesced either way). 2-D tiles (16 rows of one block column) share their
// amax and, with 4over6, their candidate choice through shared memory.
//   amax: one f32, or one per operand row (per_row); fos: 0 off, 1 MAE, 2 MSE.
template <typename T>
__device__ void nvfp4_quant_impl(const T* __restrict__ x, qf_u64 m, qf_u64 k, int dir, int rht,
                                 const float* __restrict__ amax, int per_row, int two_d,
                                 int e4m3_max, int fos, int sr, qf_u64 seed, int swz,
                                 qf_u8* __restrict__ data, qf_u8* __restrict__ scales,
                                 qf_u64 stride) {
    __shared__ qf_u32 tile_key[NV_BLOCK];
    __shared__ float err4[NV_BLOCK][NV_BLOCK + 1];
    __shared__ float err6[NV_BLOCK][NV_BLOCK + 1];
    __shared__ int pick4[NV_BLOCK];
    __shared__ qf_u64 stage[NV_BLOCK][NV_BLOCK];  // packed codes [row in slab][block in group]
    __shared__ qf_u8 stage_sdb[NV_BLOCK][NV_BLOCK];

    const qf_u64 rows = dir ? k : m;
    const qf_u64 cols = dir ? m : k;
    const qf_u64 nb = cols / NV_BLOCK;
    const qf_u64 nbg = (nb + NV_BLOCK - 1) / NV_BLOCK;
    const qf_u64 groups = (rows / NV_BLOCK) * nbg;
    const int t = threadIdx.x;
    const int rl = dir ? t % NV_BLOCK : t / NV_BLOCK;
    const int bl = dir ? t / NV_BLOCK : t % NV_BLOCK;

    for (qf_u64 g = blockIdx.x; g < groups; g += gridDim.x) {
        const qf_u64 r = (g / nbg) * NV_BLOCK + rl;
        const qf_u64 b = (g % nbg) * NV_BLOCK + bl;
        const bool active = b < nb;
        float v[NV_BLOCK];
        if (active) {
            nv_load_block(x, k, dir, rht, r, b, v);
        } else {
#pragma unroll
            for (int e = 0; e < NV_BLOCK; ++e) v[e] = 0.0f;
        }
        qf_u32 key = 0u;
#pragma unroll
        for (int e = 0; e < NV_BLOCK; ++e) key = max(key, qf_amax_key(v[e]));
        if (two_d) {
            if (rl == 0) tile_key[bl] = 0u;
            __syncthreads();
            atomicMax(&tile_key[bl], key);
            __syncthreads();
            key = tile_key[bl];
        }
        const float block_amax = __uint_as_float(key);
        const float a = active ? amax[per_row ? r : 0] : 0.0f;

        qf_u32 codes[NV_BLOCK];
        qf_u32 sdb;
        if (fos == 0) {
            const float s_enc = nv_global_encode_scale(a, e4m3_max);
            const float s_dec = qf_rcp(s_enc);
            sdb = nv_block_scale_code(block_amax, s_enc);
            const float enc = nv_block_encode_scale(sdb, s_dec);
            if (sr) {
                qf_u32 bits[4] = {(qf_u32)b, (qf_u32)r, (qf_u32)(r >> 32), (qf_u32)dir};
                nv_philox4x32_10(bits, (qf_u32)seed, (qf_u32)(seed >> 32));
#pragma unroll
                for (int e = 0; e < NV_BLOCK; ++e) {
                    const qf_u32 rb = (bits[e / 4] >> (8 * (e % 4))) & 0xFFu;
                    codes[e] = qf_e2m1_encode(nv_stochastic_round_e2m1(v[e] * enc, rb));
                }
            } else {
#pragma unroll
                for (int e = 0; e < NV_BLOCK; ++e) codes[e] = qf_e2m1_encode(v[e] * enc);
            }
        } else {
            // four_over_six_candidates: map-to-4 (scale 1.5x) and map-to-6.
            const float s_enc = nv_global_encode_scale(a, e4m3_max);
            const float s_dec = qf_rcp(s_enc);
            const float base = qf_div(block_amax, 6.0f) * s_enc;
            const float denom = 6.0f * (float)e4m3_max;
            qf_u32 c4[NV_BLOCK], c6[NV_BLOCK], s4, s6;
            const float e4 = nv_fos_candidate(v, base * 1.5f, s_dec, a, denom, fos == 2, &s4, c4);
            const float e6 = nv_fos_candidate(v, base, s_dec, a, denom, fos == 2, &s6, c6);
            bool pick_map4;
            if (two_d) {
                err4[bl][rl] = e4;
                err6[bl][rl] = e6;
                __syncthreads();
                if (rl == 0) pick4[bl] = nv_tree_sum_16(err4[bl]) < nv_tree_sum_16(err6[bl]);
                __syncthreads();
                pick_map4 = pick4[bl] != 0;
            } else {
                pick_map4 = e4 < e6;  // ties (and NaN errors) keep map-to-6
            }
            sdb = pick_map4 ? s4 : s6;
#pragma unroll
            for (int e = 0; e < NV_BLOCK; ++e) codes[e] = pick_map4 ? c4[e] : c6[e];
        }
        // Stage the block's codes and scale, then write them row-major: consecutive threads
        // store consecutive 8-byte blocks of one operand row (coalesced in both directions).
        stage[rl][bl] = nv_pack16(codes);
        stage_sdb[rl][bl] = (qf_u8)sdb;
        __syncthreads();
        {
            const int wr = t / NV_BLOCK, wb = t % NV_BLOCK;
            const qf_u64 rw = (g / nbg) * NV_BLOCK + wr;
            const qf_u64 bw = (g % nbg) * NV_BLOCK + wb;
            if (bw < nb) {
                *reinterpret_cast<qf_u64*>(data + rw * (cols / 2u) + (NV_BLOCK / 2) * bw) = stage[wr][wb];
                scales[qf_scale_index(rw, bw, stride, swz)] = stage_sdb[wr][wb];
            }
        }
        __syncthreads();  // shared memory is reused by the next group
    }
}

#define NVFP4_QUANT_KERNEL(name, T)                                                             \
    extern "C" __global__ void __launch_bounds__(NV_THREADS)                                    \
        name(const T* __restrict__ x, qf_u64 m, qf_u64 k, int dir, int rht,                     \
             const float* __restrict__ amax, int per_row, int two_d, int e4m3_max, int fos,     \
             int sr, qf_u64 seed, int swz, qf_u8* __restrict__ data, qf_u8* __restrict__ scales, \
             qf_u64 stride) {                                                                   \
        nvfp4_quant_impl<T>(x, m, k, dir, rht, amax, per_row, two_d, e4m3_max, fos, sr, seed,   \
                            swz, data, scales, stride);                                         \
    }
QF_FOR_INPUT_TYPES(NVFP4_QUANT_KERNEL, nvfp4_quant)

// The amax of bf16(RHT(x^T)) (kernel::tensor_amax of transposed_rht): one thread per (column
// of x, 16-row block), integer max of amax keys, one atomicMax per block. `out` starts zeroed.
template <typename T>
__device__ void nvfp4_rht_amax_impl(const T* __restrict__ x, qf_u64 m, qf_u64 k,
                                    qf_u32* __restrict__ out) {
    __shared__ qf_u32 warp_max[NV_THREADS / 32];
    const qf_u64 n = k * (m / NV_BLOCK);
    qf_u32 mx = 0u;
    for (qf_u64 i = qf_global_thread(); i < n; i += qf_grid_threads()) {
        const qf_u64 r = i % k, b = i / k;
        float y[NV_BLOCK];
        nv_load_rht(x, k, r, b, y);
#pragma unroll
        for (int e = 0; e < NV_BLOCK; ++e) mx = max(mx, qf_amax_key(y[e]));
    }
    mx = qf_warp_max_u32(mx);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        qf_u32 b = 0u;
        for (int w = 0; w < NV_THREADS / 32; ++w) b = max(b, warp_max[w]);
        if (b != 0u) atomicMax(out, b);
    }
}

#define NVFP4_RHT_AMAX_KERNEL(name, T)                                                          \
    extern "C" __global__ void __launch_bounds__(NV_THREADS)                                    \
        name(const T* __restrict__ x, qf_u64 m, qf_u64 k, qf_u32* __restrict__ out) {           \
        nvfp4_rht_amax_impl<T>(x, m, k, out);                                                   \
    }
QF_FOR_INPUT_TYPES(NVFP4_RHT_AMAX_KERNEL, nvfp4_rht_amax)

// ---- dequant.rs ----------------------------------------------------------------------------------

// Rowwise: out[r][2p], out[r][2p+1] = OT(e2m1(lo/hi nibble) * factor(r, block)), one thread per
// byte of rowwise_data ([M, K/2]).
template <typename OT>
__device__ void nvfp4_dequant_row_impl(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k,
                                       const qf_u8* __restrict__ scales, qf_u64 stride, int swz,
                                       const float* __restrict__ amax, int per_row, int e4m3_max,
                                       OT* __restrict__ out) {
    const qf_u64 half_k = k / 2u;
    const qf_u64 n = m * half_k;
    const float rcp = qf_rcp(6.0f * (float)e4m3_max);
    if (qf_aligned16(q) && qf_aligned16(out)) {
        // A word of 4 bytes (8 values) per step, consecutive threads on consecutive words so
        // loads and stores coalesce; k % 16 == 0, so a word lies in one row and one block.
#pragma unroll 4
        for (qf_u64 t = qf_global_thread(); t < n / 4u; t += qf_grid_threads()) {
            const qf_u64 i = 4u * t;
            const qf_u64 r = qf_div_u64(i, half_k), p = i - r * half_k;
            const float f = nv_dequant_factor_rcp(
                scales[qf_scale_index(r, p / (NV_BLOCK / 2), stride, swz)], amax[per_row ? r : 0], rcp);
            const qf_u32 w = *reinterpret_cast<const qf_u32*>(q + i);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = qf_e2m1_decode(w >> (16 * h + 4 * e)) * f;
                qf_store4(out + r * k + 2u * p + 4 * h, v);
            }
        }
        return;
    }
    for (qf_u64 i = qf_global_thread(); i < n; i += qf_grid_threads()) {
        const qf_u64 r = i / half_k, p = i % half_k;
        const qf_u64 b = p / (NV_BLOCK / 2);
        const float f = nv_dequant_factor_rcp(scales[qf_scale_index(r, b, stride, swz)],
                                              amax[per_row ? r : 0], rcp);
        const qf_u32 byte = q[i];
        qf_from_f32(out + r * k + 2u * p, qf_e2m1_decode(byte & 0xFu) * f);
        qf_from_f32(out + r * k + 2u * p + 1u, qf_e2m1_decode(byte >> 4) * f);
    }
}

#define NVFP4_DEQUANT_ROW_KERNEL(name, OT)                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        name(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k, const qf_u8* __restrict__ scales, \
             qf_u64 stride, int swz, const float* __restrict__ amax, int per_row, int e4m3_max,  \
             OT* __restrict__ out) {                                                            \
        nvfp4_dequant_row_impl<OT>(q, m, k, scales, stride, swz, amax, per_row, e4m3_max, out); \
    }
QF_FOR_INPUT_TYPES(NVFP4_DEQUANT_ROW_KERNEL, nvfp4_dequant_row)

// Columnwise: the stored operand is x^T ([K, M/2] codes, scales of [K, M]); one thread per
// (column c of x, 16-row block b) writes out[16b + i][c]: OT(y_i), or with RHT the inverse
// transform v_i = sum_j y_j * R[i][j] in f64, index order from 0, rounded once (from_f64).
template <typename OT>
__device__ void nvfp4_dequant_col_impl(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k,
                                       const qf_u8* __restrict__ scales, qf_u64 stride, int swz,
                                       const float* __restrict__ amax, int per_row, int e4m3_max,
                                       int rht, OT* __restrict__ out) {
    const qf_u64 n = k * (m / NV_BLOCK);
    for (qf_u64 i = qf_global_thread(); i < n; i += qf_grid_threads()) {
        const qf_u64 c = i % k, b = i / k;
        const float f = nv_dequant_factor(scales[qf_scale_index(c, b, stride, swz)],
                                          amax[per_row ? c : 0], e4m3_max);
        const qf_u8* bytes = q + c * (m / 2u) + (NV_BLOCK / 2) * b;
        float y[NV_BLOCK];
#pragma unroll
        for (int p = 0; p < NV_BLOCK / 2; ++p) {
            const qf_u32 byte = bytes[p];
            y[2 * p] = qf_e2m1_decode(byte & 0xFu) * f;
            y[2 * p + 1] = qf_e2m1_decode(byte >> 4) * f;
        }
        if (rht) {
#pragma unroll
            for (int ii = 0; ii < NV_BLOCK; ++ii) {
                double acc = 0.0;
#pragma unroll
                for (int j = 0; j < NV_BLOCK; ++j) acc += (double)y[j] * (double)nv_rht_entry(ii, j);
                qf_from_f64(out + (NV_BLOCK * b + ii) * k + c, acc);
            }
        } else {
#pragma unroll
            for (int ii = 0; ii < NV_BLOCK; ++ii) qf_from_f32(out + (NV_BLOCK * b + ii) * k + c, y[ii]);
        }
    }
}

#define NVFP4_DEQUANT_COL_KERNEL(name, OT)                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        name(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k, const qf_u8* __restrict__ scales, \
             qf_u64 stride, int swz, const float* __restrict__ amax, int per_row, int e4m3_max,  \
             int rht, OT* __restrict__ out) {                                                   \
        nvfp4_dequant_col_impl<OT>(q, m, k, scales, stride, swz, amax, per_row, e4m3_max, rht,  \
                                   out);                                                        \
    }
QF_FOR_INPUT_TYPES(NVFP4_DEQUANT_COL_KERNEL, nvfp4_dequant_col)
