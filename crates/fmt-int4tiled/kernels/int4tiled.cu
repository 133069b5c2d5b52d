// fmt-int4tiled device kernels: torchao qparams + the tensor-core tiled packing of
// `_convert_weight_to_int4pack` (quantize), pack / unpack of plain nibbles, the kernel's
// single-rounding dequantization, and a weight-only int4 matmul for small m that reads the
// packed layout directly. Mirrors crates/fmt-int4tiled/src (qparams.rs, layout.rs,
// dequant.rs, format.rs); see docs/cuda.md.
#include "quantfmt_common.cuh"

#define I4_THREADS 256
#define I4_N_TILE 8
#define I4_LANES 32
#define I4_M_MAX 16
#define I4_RCP_15 __uint_as_float(0x3D888889u)  // qparams::RCP_15 = f32(1/15)

// ---- layout.rs -----------------------------------------------------------------------------

// NIBBLE_K_OFFSET[j]: k offset (from the lane's k0) of nibble j of a word.
__device__ __forceinline__ int i4_nibble_k(int j) { return (j & 3) * 8 + (j >> 2); }

// locate(n, k) for a k that is 2-aligned within its 32-column block (k0 of a lane): the
// flat word index (relative to one expert) holding the 8 nibbles at k0 + NIBBLE_K_OFFSET.
__device__ __forceinline__ qf_u64 i4_word_index(qf_u64 n, qf_u64 k0, qf_u64 k_padded, int ikt) {
    const qf_u64 slab = (qf_u64)ikt * 16u;
    const qf_u64 nt = n / I4_N_TILE, nr = n % I4_N_TILE;
    const qf_u64 kot = qf_div_u64(k0, slab), r = k0 - kot * slab;
    const qf_u64 p = r / 32u, kk = r % 32u;
    const qf_u64 t = nr * 4u + (kk / 2u) % 4u;
    const qf_u64 slabs = qf_div_u64(k_padded, slab);
    return ((nt * slabs + kot) * I4_LANES + t) * (qf_u64)(ikt / 2) + p;
}

// ---- qparams.rs --------------------------------------------------------------------------------

// rb: round to bf16 and back (each eager bf16 op rounds its f32 result).
__device__ __forceinline__ float i4_rb(float x) { return qf_bf16_bits_to_f32(qf_f32_to_bf16_bits(x)); }

// clamp_min: torch.clamp(x, min=eps), NaN stays NaN.
__device__ __forceinline__ float i4_clamp_min(float x, float eps) {
    return (qf_is_nan(x) || x >= eps) ? x : eps;
}

// to_nibble: clamp(round_half_even(q), 0, 15), NaN -> 0 (CUDA's cvt.rzi of NaN).
__device__ __forceinline__ qf_u32 i4_to_nibble(float q) {
    if (qf_is_nan(q)) return 0u;
    const float c = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
    return (qf_u32)rintf(c);
}

// One group's qparams (quantize_group): `scale`, `zero` and `min_val` of the chosen path.
struct I4Params {
    float scale, zero, min_val;
};

__device__ __forceinline__ I4Params i4_qparams(float mn, float mx, int bf16_path, float eps) {
    I4Params q;
    if (bf16_path) {
        const float range = i4_rb(mx - mn);
        q.scale = i4_rb(i4_clamp_min(i4_rb(range * I4_RCP_15), eps));
        const float scale8 = i4_rb(q.scale * 8.0f);
        q.zero = i4_rb(mn + scale8);
        q.min_val = i4_rb(q.zero - scale8);
    } else {
        const float scale_f = i4_clamp_min((mx - mn) * I4_RCP_15, eps);
        q.zero = i4_rb(mn + scale_f * 8.0f);
        q.scale = i4_rb(scale_f);
        q.min_val = i4_rb(q.zero - i4_rb(q.scale * 8.0f));
    }
    return q;
}

__device__ __forceinline__ qf_u32 i4_nibble_of(float x, const I4Params& q, int bf16_path) {
    if (bf16_path) return i4_to_nibble(i4_rb(qf_div(i4_rb(x - q.min_val), q.scale)));
    return i4_to_nibble(qf_div(x - q.min_val, q.scale));
}

// The bf16 bits of a stored scale or zero. A NaN here is the one place where NaN bits reach a
// quantized buffer, so they must be the CPU's: on x86 (SSE), a group holding a NaN makes
// `min_max` return Rust's f32::NAN (0x7FC00000), which every later op propagates unchanged,
// while without one a NaN can only come from an invalid operation (inf - inf of a group
// holding infinities), which SSE answers with its default NaN 0xFFC00000, propagated from
// there on. bf16::from_f32 keeps the top bits: 0x7FC0 or 0xFFC0. CUDA would produce
// 0x7FFFFFFF for both, hence the explicit rule.
__device__ __forceinline__ qf_u16 i4_store_qparam(float v, bool group_nan) {
    if (qf_is_nan(v)) return group_nan ? (qf_u16)0x7FC0u : (qf_u16)0xFFC0u;
    return qf_f32_to_bf16_bits(v);
}

// Quantize: one thread per (expert, row n < n_padded, group gi < k_padded/g); consecutive
// threads take consecutive groups of a row. Pass 1: NaN-propagating min/max of the group
// (zeros for padding rows and groups); pass 2: re-reads the group and writes its words.
template <typename T>
__device__ void int4_quant_impl(const T* __restrict__ x, qf_u64 experts, qf_u64 n, qf_u64 k,
                                qf_u64 n_padded, qf_u64 k_padded, int g, int ikt, int bf16_path,
                                float eps, qf_u32* __restrict__ packed, qf_u16* __restrict__ sz) {
    const qf_u64 groups = k_padded / (qf_u64)g;
    const qf_u64 logical_groups = k / (qf_u64)g;
    const qf_u64 total = experts * n_padded * groups;
    const qf_u64 expert_words = n_padded * k_padded / 8u;
    const qf_u64 expert_sz = groups * n_padded * 2u;
    for (qf_u64 i = qf_global_thread(); i < total; i += qf_grid_threads()) {
        const qf_u64 gi = i % groups;
        const qf_u64 row = (i / groups) % n_padded;
        const qf_u64 e = i / (groups * n_padded);
        const bool real = row < n && gi < logical_groups;
        const T* src = x + (e * n + row) * k + gi * (qf_u64)g;
        float mn = __uint_as_float(0x7F800000u), mx = __uint_as_float(0xFF800000u);
        bool nan = false;
        for (int j = 0; j < g; ++j) {
            const float v = real ? qf_to_f32(src[j]) : 0.0f;
            nan |= qf_is_nan(v);
            mn = fminf(mn, v);
            mx = fmaxf(mx, v);
        }
        if (nan) {
            mn = __uint_as_float(0x7FC00000u);
            mx = mn;
        }
        const I4Params q = i4_qparams(mn, mx, bf16_path, eps);
        qf_u32* words = packed + e * expert_words;
        for (int b = 0; b < g / 32; ++b) {
            const qf_u64 k32 = gi * (qf_u64)g + 32u * b;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const qf_u64 k0 = k32 + 2u * c;
                qf_u32 w = 0u;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const qf_u64 kk = k0 + i4_nibble_k(j);
                    const float v = real ? qf_to_f32(x[(e * n + row) * k + kk]) : 0.0f;
                    w |= i4_nibble_of(v, q, bf16_path) << (4 * j);
                }
                words[i4_word_index(row, k0, k_padded, ikt)] = w;
            }
        }
        qf_u16* s = sz + e * expert_sz + (gi * n_padded + row) * 2u;
        s[0] = i4_store_qparam(q.scale, nan);
        s[1] = i4_store_qparam(q.zero, nan);
    }
}

#define INT4_QUANT_KERNEL(name, T)                                                              \
    extern "C" __global__ void __launch_bounds__(I4_THREADS)                                    \
        name(const T* __restrict__ x, qf_u64 experts, qf_u64 n, qf_u64 k, qf_u64 n_padded,      \
             qf_u64 k_padded, int g, int ikt, int bf16_path, float eps,                         \
             qf_u32* __restrict__ packed, qf_u16* __restrict__ sz) {                            \
        int4_quant_impl<T>(x, experts, n, k, n_padded, k_padded, g, ikt, bf16_path, eps, packed, \
                           sz);                                                                 \
    }
QF_FOR_INPUT_TYPES(INT4_QUANT_KERNEL, int4_quant)

// Unpack (Int4TiledTensorExt::unpack): logical nibbles u8 [E, n, k] from the packed words.
extern "C" __global__ void __launch_bounds__(I4_THREADS)
    int4_unpack(const qf_u32* __restrict__ packed, qf_u64 experts, qf_u64 n, qf_u64 k,
                qf_u64 n_padded, qf_u64 k_padded, int ikt, qf_u8* __restrict__ out) {
    const qf_u64 total = experts * n * k;
    const qf_u64 expert_words = n_padded * k_padded / 8u;
    for (qf_u64 i = qf_global_thread(); i < total; i += qf_grid_threads()) {
        const qf_u64 kk = i % k, row = (i / k) % n, e = i / (n * k);
        const qf_u64 r32 = kk % 32u;
        const qf_u64 k0 = kk - r32 + 2u * ((r32 / 2u) % 4u);
        const int j = (int)(r32 / 8u) + 4 * (int)(r32 % 2u);
        const qf_u32 w = packed[e * expert_words + i4_word_index(row, k0, k_padded, ikt)];
        out[i] = (qf_u8)((w >> (4 * j)) & 0xFu);
    }
}

// Pack (layout::pack_tile over every tile): words from logical nibbles u8 [E, n, k] (masked
// to 4 bits); rows >= n and columns >= k get nibble 0. One thread per word.
extern "C" __global__ void __launch_bounds__(I4_THREADS)
    int4_pack(const qf_u8* __restrict__ u, qf_u64 experts, qf_u64 n, qf_u64 k, qf_u64 n_padded,
              qf_u64 k_padded, int ikt, qf_u32* __restrict__ packed) {
    const qf_u64 half = (qf_u64)(ikt / 2);
    const qf_u64 slab = (qf_u64)ikt * 16u;
    const qf_u64 slabs = k_padded / slab;
    const qf_u64 expert_words = n_padded * k_padded / 8u;
    const qf_u64 total = experts * expert_words;
    for (qf_u64 i = qf_global_thread(); i < total; i += qf_grid_threads()) {
        const qf_u64 e = i / expert_words, word = i % expert_words;
        const qf_u64 p = word % half;
        const qf_u64 t = (word / half) % I4_LANES;
        const qf_u64 rest = word / half / I4_LANES;
        const qf_u64 nt = rest / slabs, kot = rest % slabs;
        const qf_u64 row = nt * I4_N_TILE + t / 4u;
        const qf_u64 k0 = kot * slab + 32u * p + 2u * (t % 4u);
        qf_u32 w = 0u;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const qf_u64 kk = k0 + i4_nibble_k(j);
            const qf_u32 v = (row < n && kk < k) ? (qf_u32)(u[(e * n + row) * k + kk] & 0xFu) : 0u;
            w |= v << (4 * j);
        }
        packed[i] = w;
    }
}

// ---- dequant.rs ------------------------------------------------------------------------------

__device__ __forceinline__ float i4_next_up(float r) {
    const qf_u32 b = __float_as_uint(r);
    if (r == 0.0f) return __uint_as_float(1u);
    return (b >> 31) ? __uint_as_float(b - 1u) : __uint_as_float(b + 1u);
}
__device__ __forceinline__ float i4_next_down(float r) {
    const qf_u32 b = __float_as_uint(r);
    if (r == 0.0f) return __uint_as_float(0x80000001u);
    return (b >> 31) ? __uint_as_float(b + 1u) : __uint_as_float(b - 1u);
}

// round_sum: the exact p + z (TwoSum) rounded once: to nearest-even f32 for f32 output, to odd
// f32 then by the output type's from_f32 for bf16/f16.
__device__ __forceinline__ float i4_round_sum(double p, double z, int odd) {
    const double s = p + z;
    const double bb = s - p;
    const double e = (p - (s - bb)) + (z - bb);
    const float r = __double2float_rn(s);
    if (!(fabs(s) <= 1.7976931348623157e308)) return r;  // !s.is_finite()
    if (!(fabsf(r) <= qf_f32_max())) return r;           // !r.is_finite()
    if (!odd) {
        if (e == 0.0) return r;
        const double d = s - (double)r;
        if (d == 0.0) return r;
        const float nb = d > 0.0 ? i4_next_up(r) : i4_next_down(r);
        const double mid = ((double)r + (double)nb) * 0.5;
        return (s == mid && ((e > 0.0) == (d > 0.0))) ? nb : r;
    }
    const double diff = ((double)r - s) - e;
    if (diff == 0.0 || (__float_as_uint(r) & 1u) == 1u) return r;
    return diff > 0.0 ? i4_next_down(r) : i4_next_up(r);
}

template <typename OT> __device__ __forceinline__ int i4_round_odd();
template <> __device__ __forceinline__ int i4_round_odd<float>() { return 0; }
template <> __device__ __forceinline__ int i4_round_odd<qf_bf16>() { return 1; }
template <> __device__ __forceinline__ int i4_round_odd<qf_f16>() { return 1; }

// dequant_value: OT((u - 8) * scale + zero) rounded once; one thread per logical element.
template <typename OT>
__device__ void int4_dequant_impl(const qf_u32* __restrict__ packed, const qf_u16* __restrict__ sz,
                                  qf_u64 experts, qf_u64 n, qf_u64 k, qf_u64 n_padded,
                                  qf_u64 k_padded, int g, int ikt, OT* __restrict__ out) {
    const qf_u64 total = experts * n * k;
    const qf_u64 expert_words = n_padded * k_padded / 8u;
    const qf_u64 expert_sz = (k_padded / (qf_u64)g) * n_padded * 2u;
    const int odd = i4_round_odd<OT>();
    if (k % 32u == 0u && qf_aligned16(out)) {
        // One 32-column block of a row per step: its four words (word c holds columns
        // 2c + {0, 1} of each 8-column run q, in nibbles q and q + 4) and one scale/zero pair
        // (g is a multiple of 32), the (expert, row, block) division once per 32 values, the
        // values stored 4 at a time.
        const qf_u64 half = (qf_u64)(ikt / 2);
        const qf_u64 kbs = k / 32u;
        for (qf_u64 t = qf_global_thread(); t < total / 32u; t += qf_grid_threads()) {
            const qf_u64 er = qf_div_u64(t, kbs), base = 32u * (t - er * kbs);
            const qf_u64 e = qf_div_u64(er, n), row = er - e * n;
            const qf_u64 w0 = e * expert_words + i4_word_index(row, base, k_padded, ikt);
            qf_u32 w[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) w[c] = packed[w0 + (qf_u64)c * half];
            const qf_u16* s = sz + e * expert_sz + (qf_div_u64(base, (qf_u64)g) * n_padded + row) * 2u;
            const double scale = (double)qf_bf16_bits_to_f32(s[0]);
            const double z = (double)qf_bf16_bits_to_f32(s[1]);
            OT* o = out + er * k + base;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float v[8];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int u = (int)((w[c] >> (4 * (q + 4 * h))) & 0xFu);
                        v[2 * c + h] = i4_round_sum((double)(u - 8) * scale, z, odd);
                    }
                }
                qf_store4(o + 8 * q, v);
                qf_store4(o + 8 * q + 4, v + 4);
            }
        }
        return;
    }
    for (qf_u64 i = qf_global_thread(); i < total; i += qf_grid_threads()) {
        const qf_u64 kk = i % k, row = (i / k) % n, e = i / (n * k);
        const qf_u64 r32 = kk % 32u;
        const qf_u64 k0 = kk - r32 + 2u * ((r32 / 2u) % 4u);
        const int j = (int)(r32 / 8u) + 4 * (int)(r32 % 2u);
        const qf_u32 w = packed[e * expert_words + i4_word_index(row, k0, k_padded, ikt)];
        const int u = (int)((w >> (4 * j)) & 0xFu);
        const qf_u16* s = sz + e * expert_sz + ((kk / (qf_u64)g) * n_padded + row) * 2u;
        const double p = (double)(u - 8) * (double)qf_bf16_bits_to_f32(s[0]);
        const double z = (double)qf_bf16_bits_to_f32(s[1]);
        qf_from_f32(out + i, i4_round_sum(p, z, odd));
    }
}

#define INT4_DEQUANT_KERNEL(name, OT)                                                           \
    extern "C" __global__ void __launch_bounds__(I4_THREADS)                                    \
        name(const qf_u32* __restrict__ packed, const qf_u16* __restrict__ sz, qf_u64 experts,  \
             qf_u64 n, qf_u64 k, qf_u64 n_padded, qf_u64 k_padded, int g, int ikt,              \
             OT* __restrict__ out) {                                                            \
        int4_dequant_impl<OT>(packed, sz, experts, n, k, n_padded, k_padded, g, ikt, out);      \
    }
QF_FOR_INPUT_TYPES(INT4_DEQUANT_KERNEL, int4_dequant)

// ---- weight-only int4 matmul, small m ------------------------------------------------------

// y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]) for m <= 16, reading the packed words once.
// One block per n-tile (8 rows); warp w takes slabs w, w+8, ...; lane t takes row t/4 of the
// tile and its word(s) of each slab (the layout gives lane t row nt*8 + t/4). Per 32-column
// block (one group, one scale/zero pair) the factored form
//   scale * sum(x * (u - 8)) + zero * sum(x)
// is accumulated in f32 with the exact weights (no bf16 rounding of w: like the CPU
// int4_linear, unlike the bf16 weights of the tinygemm kernel). The 4 lanes of a row and the
// 8 warps are reduced in a fixed order, so a launch is deterministic; the result equals the
// CPU's up to f32 summation order (no int4 matmul is bit-reproducible across
// implementations).
template <typename T>
__device__ void int4_linear_impl(const T* __restrict__ x, qf_u64 m, const qf_u32* __restrict__ packed,
                                 const qf_u16* __restrict__ sz, qf_u64 n, qf_u64 k,
                                 qf_u64 n_padded, qf_u64 k_padded, int g, int ikt,
                                 const T* __restrict__ bias, T* __restrict__ y) {
    __shared__ float part[8][I4_N_TILE][I4_M_MAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = lane % 4;
    const qf_u64 half = (qf_u64)(ikt / 2);
    const qf_u64 slab = (qf_u64)ikt * 16u;
    const qf_u64 slabs = k_padded / slab;
    const qf_u64 n_tiles = n_padded / I4_N_TILE;
    for (qf_u64 nt = blockIdx.x; nt < n_tiles; nt += gridDim.x) {
        const qf_u64 row = nt * I4_N_TILE + (qf_u64)(lane / 4);
        float acc[I4_M_MAX];
#pragma unroll
        for (int mi = 0; mi < I4_M_MAX; ++mi) acc[mi] = 0.0f;
        for (qf_u64 kot = (qf_u64)warp; kot < slabs; kot += 8u) {
            const qf_u32* wp = packed + ((nt * slabs + kot) * I4_LANES + (qf_u64)lane) * half;
            for (qf_u64 p = 0; p < half; ++p) {
                const qf_u32 w = wp[p];
                const qf_u64 k32 = kot * slab + 32u * p;
                if (k32 >= k) break;  // padding columns: nibble 0 and no x
                const qf_u64 gi = k32 / (qf_u64)g;
                const qf_u16* s = sz + (gi * n_padded + row) * 2u;
                const float scale = qf_bf16_bits_to_f32(s[0]);
                const float zero = qf_bf16_bits_to_f32(s[1]);
                const qf_u64 k0 = k32 + 2u * (qf_u64)c;
#pragma unroll
                for (int mi = 0; mi < I4_M_MAX; ++mi) {
                    if ((qf_u64)mi < m) {
                        const T* xr = x + (qf_u64)mi * k;
                        float su = 0.0f, sx = 0.0f;
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            const float xv = qf_to_f32(xr[k0 + i4_nibble_k(j)]);
                            su += xv * (float)((int)((w >> (4 * j)) & 0xFu) - 8);
                            sx += xv;
                        }
                        acc[mi] += scale * su + zero * sx;
                    }
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < I4_M_MAX; ++mi) {
            float v = acc[mi];
            v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
            v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
            if (c == 0) part[warp][lane / 4][mi] = v;
        }
        __syncthreads();
        if (threadIdx.x < I4_N_TILE * I4_M_MAX) {
            const int r = threadIdx.x / I4_M_MAX, mi = threadIdx.x % I4_M_MAX;
            const qf_u64 rr = nt * I4_N_TILE + (qf_u64)r;
            if ((qf_u64)mi < m && rr < n) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < 8; ++w) v += part[w][r][mi];
                if (bias != nullptr) v += qf_to_f32(bias[rr]);
                qf_from_f32(y + (qf_u64)mi * n + rr, v);
            }
        }
        __syncthreads();
    }
}

#define INT4_LINEAR_KERNEL(name, T)                                                             \
    extern "C" __global__ void __launch_bounds__(I4_THREADS)                                    \
        name(const T* __restrict__ x, qf_u64 m, const qf_u32* __restrict__ packed,              \
             const qf_u16* __restrict__ sz, qf_u64 n, qf_u64 k, qf_u64 n_padded,                \
             qf_u64 k_padded, int g, int ikt, const T* __restrict__ bias, T* __restrict__ y) {  \
        int4_linear_impl<T>(x, m, packed, sz, n, k, n_padded, k_padded, g, ikt, bias, y);       \
    }
QF_FOR_INPUT_TYPES(INT4_LINEAR_KERNEL, int4_linear)
