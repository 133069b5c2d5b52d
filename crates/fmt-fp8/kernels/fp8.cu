// fmt-fp8 device kernels: per-tensor current scaling (`fp8`) and blockwise 1x128 / 128x128
// (`fp8-block`), quantize and dequantize. Each kernel mirrors a CPU function of
// crates/fmt-fp8/src (named in its comment) operation for operation; see docs/cuda.md.
#include "quantfmt_common.cuh"
#include "quantfmt_codecs.cuh"

// fmt_fp8::compute_scale_from_amax (TE recipe_common.cuh), line for line.
__device__ __forceinline__ float fp8_scale_from_amax(float amax, float max_fp8, int pow2, float eps,
                                                     float value_for_inf) {
    if (amax < eps) amax = eps;  // NaN compares false: not clamped
    if (qf_is_inf(amax) || amax == 0.0f || qf_is_nan(amax)) return 1.0f;
    float scale = qf_div(max_fp8, amax);
    if (qf_is_inf(scale)) scale = value_for_inf;
    if (pow2) scale = __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
    return scale;
}

// ============================================================================================
// Per-tensor current scaling: Fp8Quantizer::cast.
//
// scale = compute_scale_from_amax(amax, max, pow2, eps, FLT_MAX); q = fp8(float(x) * scale);
// scale_inv = 1 / scale. The columnwise buffer is the [K, M] transpose of the same bytes.
// One pass over x: each block encodes a 64x64 tile once and writes it rowwise (coalesced
// 4-byte stores) and, through shared memory, transposed (coalesced along M).
// ============================================================================================

#define FP8_TILE 64
#define FP8_THREADS 256

template <typename T>
__device__ void fp8_cast_impl(const T* __restrict__ x, qf_u64 m, qf_u64 k,
                              const qf_u32* __restrict__ amax_bits, float max_fp8, int e5m2,
                              int pow2, float eps, qf_u8* __restrict__ row_out,
                              qf_u8* __restrict__ col_out, float* __restrict__ scale_inv) {
    __shared__ qf_u8 tile[FP8_TILE][FP8_TILE + 4];  // [column in tile][row in tile]
    const float amax = __uint_as_float(*amax_bits);
    const float scale = fp8_scale_from_amax(amax, max_fp8, pow2, eps, qf_f32_max());
    if (blockIdx.x == 0 && threadIdx.x == 0) scale_inv[0] = qf_rcp(scale);

    const int tx = threadIdx.x % 16;  // columns 4*tx .. 4*tx+3 of the tile
    const int ty = threadIdx.x / 16;  // rows ty, ty+16, ty+32, ty+48
    const bool vec = (k % 4u) == 0u;  // rows 4-element aligned: vector loads and stores
    const qf_u64 ntc = (k + FP8_TILE - 1) / FP8_TILE;
    const qf_u64 ntiles = ntc * ((m + FP8_TILE - 1) / FP8_TILE);
    for (qf_u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const qf_u64 r0 = (t / ntc) * FP8_TILE;
        const qf_u64 c0 = (t % ntc) * FP8_TILE;
        const qf_u64 c = c0 + 4u * tx;
        const int nc = c < k ? (int)min((qf_u64)4, k - c) : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const qf_u64 r = r0 + ty + 16 * i;
            const int n = r < m ? nc : 0;
            float v[4];
            if (n == 4 && vec) qf_load4(x + r * k + c, v);
            else qf_load4_tail(x + r * k + c, n, v);
            const qf_u32 word =
                qf_fp8x4_encode_dt(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale, e5m2);
            if (row_out != nullptr && n > 0) {
                if (n == 4 && vec) {
                    *reinterpret_cast<qf_u32*>(row_out + r * k + c) = word;
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (j < n) row_out[r * k + c + j] = (qf_u8)(word >> (8 * j));
                }
            }
            if (col_out != nullptr) {
#pragma unroll
                for (int j = 0; j < 4; ++j) tile[4 * tx + j][ty + 16 * i] = (qf_u8)(word >> (8 * j));
            }
        }
        if (col_out != nullptr) {
            __syncthreads();
            // Column c0 + jj of x is row c0 + jj of col_out ([K, M]); 16 bytes per thread.
            const int jj = threadIdx.x / 4;
            const int part = threadIdx.x % 4;
            const qf_u64 orow = c0 + jj;
            const qf_u64 rr = r0 + 16 * part;
            if (orow < k && rr < m) {
                qf_u8* dst = col_out + orow * m + rr;
                if ((m % 4u) == 0u && rr + 16u <= m) {
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int s = 16 * part + 4 * q;
                        *reinterpret_cast<qf_u32*>(dst + 4 * q) =
                            (qf_u32)tile[jj][s] | ((qf_u32)tile[jj][s + 1] << 8) |
                            ((qf_u32)tile[jj][s + 2] << 16) | ((qf_u32)tile[jj][s + 3] << 24);
                    }
                } else {
                    for (int q = 0; q < 16 && rr + q < m; ++q) dst[q] = tile[jj][16 * part + q];
                }
            }
            __syncthreads();
        }
    }
}

#define FP8_CAST_KERNEL(name, T)                                                                \
    extern "C" __global__ void __launch_bounds__(FP8_THREADS)                                   \
        name(const T* __restrict__ x, qf_u64 m, qf_u64 k, const qf_u32* __restrict__ amax_bits, \
             float max_fp8, int e5m2, int pow2, float eps, qf_u8* __restrict__ row_out,         \
             qf_u8* __restrict__ col_out, float* __restrict__ scale_inv) {                      \
        fp8_cast_impl<T>(x, m, k, amax_bits, max_fp8, e5m2, pow2, eps, row_out, col_out,        \
                         scale_inv);                                                            \
    }
QF_FOR_INPUT_TYPES(FP8_CAST_KERNEL, fp8_cast)

// ============================================================================================
// Blockwise scaling: Fp8BlockQuantizer::cast (rowwise_1d, columnwise_1d, tile_scales + 2-D).
//
// One block per 128x128 tile of x, both directions: a first pass takes every block amax (row
// segments, columns, the tile), a second pass re-reads the tile (from L1/L2: the block just read
// it) and encodes it with the scales. Block amaxes are integer maxima of amax keys (NaN ignored,
// order-free); scale = compute_scale_from_amax(amax, max, pow2, eps, T::MAX_FINITE);
// scale_inv = 1 / scale.
//   1x128 rowwise:    block (row, kb),  scale_inv at rs[kb * rs_stride + row]   (rs_stride = roundup(M,4))
//   1x128 columnwise: block (mb, col),  scale_inv at cs[mb * cs_stride + col]   (cs_stride = roundup(K,4))
//   128x128:          tile (mb, kb),    rs[mb * rs_stride + kb], cs[kb * cs_stride + mb]
// Columnwise data is written transposed ([K, M]) through shared memory. Partial edge blocks
// take their amax over their valid elements only (the CPU's chunks(128)).
// ============================================================================================

#define FPB_TILE 128
#define FPB_THREADS 256
#define FPB_ROWS_PER_THREAD 16  // 128 rows / 8 warps

template <typename T>
__device__ __forceinline__ int fpb_load(const T* __restrict__ x, qf_u64 m, qf_u64 k, qf_u64 r,
                                        qf_u64 c, int nc, bool vec, float v[4]) {
    const int n = r < m ? nc : 0;
    if (n == 4 && vec) qf_load4(x + r * k + c, v);
    else qf_load4_tail(x + r * k + c, n, v);
    return n;
}

template <typename T>
__device__ void fp8_block_cast_impl(const T* __restrict__ x, qf_u64 m, qf_u64 k, int two_d,
                                    int e5m2, float max_fp8, int pow2, float eps,
                                    qf_u8* __restrict__ rd, float* __restrict__ rs, qf_u64 rs_stride,
                                    qf_u8* __restrict__ cd, float* __restrict__ cs, qf_u64 cs_stride) {
    __shared__ qf_u8 ct[FPB_TILE][FPB_TILE + 4];  // columnwise codes [column][row]
    __shared__ qf_u32 col_part[8][FPB_TILE];       // per-warp column amax keys
    __shared__ qf_u32 row_key[FPB_TILE];           // amax key of each 128-wide row segment
    __shared__ float col_scale_s[FPB_TILE];        // 1x128 columnwise scales of the tile

    const int lane = threadIdx.x & 31;  // columns 4*lane .. 4*lane+3
    const int warp = threadIdx.x >> 5;  // rows warp + 8*i, i = 0..15
    const bool vec = (k % 4u) == 0u;
    const float vinf = qf_max_finite<T>();
    const qf_u64 nkb = (k + FPB_TILE - 1) / FPB_TILE;
    const qf_u64 ntiles = nkb * ((m + FPB_TILE - 1) / FPB_TILE);

    for (qf_u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const qf_u64 mb = t / nkb, kb = t % nkb;
        const qf_u64 r0 = mb * FPB_TILE, c0 = kb * FPB_TILE;
        const qf_u64 c = c0 + 4u * lane;
        const int nc = c < k ? (int)min((qf_u64)4, k - c) : 0;

        // Pass 1: amax keys.
        qf_u32 ck[4] = {0u, 0u, 0u, 0u};
#pragma unroll 4
        for (int i = 0; i < FPB_ROWS_PER_THREAD; ++i) {
            float v[4];
            fpb_load(x, m, k, r0 + warp + 8 * i, c, nc, vec, v);
            qf_u32 lk = 0u;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const qf_u32 key = qf_amax_key(v[j]);
                lk = max(lk, key);
                ck[j] = max(ck[j], key);
            }
            lk = qf_warp_max_u32(lk);  // the whole 128-wide row segment
            if (lane == 0) row_key[warp + 8 * i] = lk;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) col_part[warp][4 * lane + j] = ck[j];
        __syncthreads();

        // Scales.
        float tile_scale = 1.0f;
        if (two_d) {
            qf_u32 tk = 0u;
            for (int r = 0; r < FPB_TILE; ++r) tk = max(tk, row_key[r]);
            tile_scale = fp8_scale_from_amax(__uint_as_float(tk), max_fp8, pow2, eps, vinf);
            if (threadIdx.x == 0) {
                const float sinv = qf_rcp(tile_scale);
                if (rs != nullptr) rs[mb * rs_stride + kb] = sinv;
                if (cs != nullptr) cs[kb * cs_stride + mb] = sinv;
            }
        } else {
            if (cd != nullptr && threadIdx.x < FPB_TILE) {
                const int cc = threadIdx.x;
                qf_u32 key = 0u;
#pragma unroll
                for (int w = 0; w < 8; ++w) key = max(key, col_part[w][cc]);
                const float s = fp8_scale_from_amax(__uint_as_float(key), max_fp8, pow2, eps, vinf);
                col_scale_s[cc] = s;
                if (c0 + cc < k) cs[mb * cs_stride + c0 + cc] = qf_rcp(s);
            }
            if (rd != nullptr && threadIdx.x < FPB_TILE) {
                const qf_u64 r = r0 + threadIdx.x;
                if (r < m) {
                    const float s =
                        fp8_scale_from_amax(__uint_as_float(row_key[threadIdx.x]), max_fp8, pow2, eps, vinf);
                    rs[kb * rs_stride + r] = qf_rcp(s);
                }
            }
            __syncthreads();
        }

        // Pass 2: encode both directions.
#pragma unroll 2
        for (int i = 0; i < FPB_ROWS_PER_THREAD; ++i) {
            const int rr = warp + 8 * i;
            const qf_u64 r = r0 + rr;
            float v[4];
            const int n = fpb_load(x, m, k, r, c, nc, vec, v);
            if (rd != nullptr && n > 0) {
                const float s = two_d ? tile_scale
                                      : fp8_scale_from_amax(__uint_as_float(row_key[rr]), max_fp8,
                                                            pow2, eps, vinf);
                const qf_u32 word = qf_fp8x4_encode_dt(v[0] * s, v[1] * s, v[2] * s, v[3] * s, e5m2);
                if (n == 4 && vec) {
                    *reinterpret_cast<qf_u32*>(rd + r * k + c) = word;
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (j < n) rd[r * k + c + j] = (qf_u8)(word >> (8 * j));
                }
            }
            if (cd != nullptr) {
                float sv[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) sv[j] = v[j] * (two_d ? tile_scale : col_scale_s[4 * lane + j]);
                const qf_u32 word = qf_fp8x4_encode_dt(sv[0], sv[1], sv[2], sv[3], e5m2);
#pragma unroll
                for (int j = 0; j < 4; ++j) ct[4 * lane + j][rr] = (qf_u8)(word >> (8 * j));
            }
        }

        // Columnwise: 128 consecutive rows of one column per block, written transposed.
        if (cd != nullptr) {
            __syncthreads();
            const int jj = threadIdx.x / 2;   // column of the tile = row of cd
            const int half = threadIdx.x % 2;  // rows 64*half .. 64*half+63
            const qf_u64 orow = c0 + jj;
            const qf_u64 rr = r0 + 64 * half;
            if (orow < k && rr < m) {
                qf_u8* dst = cd + orow * m + rr;
                if ((m % 4u) == 0u && rr + 64u <= m) {
#pragma unroll
                    for (int q = 0; q < 16; ++q) {
                        const int s = 64 * half + 4 * q;
                        *reinterpret_cast<qf_u32*>(dst + 4 * q) =
                            (qf_u32)ct[jj][s] | ((qf_u32)ct[jj][s + 1] << 8) |
                            ((qf_u32)ct[jj][s + 2] << 16) | ((qf_u32)ct[jj][s + 3] << 24);
                    }
                } else {
                    for (int q = 0; q < 64 && rr + q < m; ++q) dst[q] = ct[jj][64 * half + q];
                }
            }
        }
        __syncthreads();  // shared memory is reused by the next tile
    }
}

#define FP8_BLOCK_CAST_KERNEL(name, T)                                                          \
    extern "C" __global__ void __launch_bounds__(FPB_THREADS)                                   \
        name(const T* __restrict__ x, qf_u64 m, qf_u64 k, int two_d, int e5m2, float max_fp8,  \
             int pow2, float eps, qf_u8* __restrict__ rd, float* __restrict__ rs,               \
             qf_u64 rs_stride, qf_u8* __restrict__ cd, float* __restrict__ cs,                  \
             qf_u64 cs_stride) {                                                                \
        fp8_block_cast_impl<T>(x, m, k, two_d, e5m2, max_fp8, pow2, eps, rd, rs, rs_stride, cd, \
                               cs, cs_stride);                                                  \
    }
QF_FOR_INPUT_TYPES(FP8_BLOCK_CAST_KERNEL, fp8_block_cast)

// ============================================================================================
// Dequantization: x = OT(decode(q) * scale_inv) (Format::dequantize_into of both quantizers),
// one f32 multiply, one rounding to the output type. The logical [M, K] layout is written;
// columnwise data ([K, M]) is read transposed through a shared-memory tile.
//   mode 0: per-tensor (sinv[0])
//   mode 1: 1x128     rowwise sinv[(j/128) * stride + i]  columnwise sinv[(i/128) * stride + j]
//   mode 2: 128x128   rowwise sinv[(i/128) * stride + j/128]  columnwise sinv[(j/128) * stride + i/128]
// where (i, j) is the logical (row, column).
// ============================================================================================

__device__ __forceinline__ float fp8_dequant_scale(const float* __restrict__ sinv, int mode,
                                                   int columnwise, qf_u64 i, qf_u64 j,
                                                   qf_u64 stride) {
    if (mode == 0) return sinv[0];
    if (mode == 1) return columnwise ? sinv[(i / 128u) * stride + j] : sinv[(j / 128u) * stride + i];
    return columnwise ? sinv[(j / 128u) * stride + i / 128u] : sinv[(i / 128u) * stride + j / 128u];
}

template <typename OT>
__device__ void fp8_dequant_row_impl(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k,
                                     const float* __restrict__ sinv, int mode, qf_u64 stride,
                                     int e5m2, OT* __restrict__ out) {
    const qf_u64 n = m * k;
    if (k % 4u == 0u && qf_aligned16(q) && qf_aligned16(out)) {
        // A word of 4 codes per step (k % 4 == 0: a word never crosses a row or a 128-wide scale
        // block), consecutive threads on consecutive words, so loads and stores coalesce; the
        // (row, column) division only where the scale depends on it.
        const float s0 = sinv[0];
#pragma unroll 4
        for (qf_u64 t = qf_global_thread(); t < n / 4u; t += qf_grid_threads()) {
            const qf_u64 idx = 4u * t;
            float s = s0;
            if (mode != 0) {
                const qf_u64 i = qf_div_u64(idx, k);
                s = fp8_dequant_scale(sinv, mode, 0, i, idx - i * k, stride);
            }
            float v[4];
            qf_fp8x4_decode_dt(*reinterpret_cast<const qf_u32*>(q + idx), e5m2, v);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = v[j] * s;
            qf_store4(out + idx, v);
        }
        return;
    }
    for (qf_u64 idx = qf_global_thread(); idx < n; idx += qf_grid_threads()) {
        const qf_u64 i = idx / k, j = idx % k;
        const float s = fp8_dequant_scale(sinv, mode, 0, i, j, stride);
        qf_from_f32(out + idx, qf_fp8_decode_dt(q[idx], e5m2) * s);
    }
}

#define FP8_DEQUANT_ROW_KERNEL(name, OT)                                                        \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        name(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k, const float* __restrict__ sinv,   \
             int mode, qf_u64 stride, int e5m2, OT* __restrict__ out) {                         \
        fp8_dequant_row_impl<OT>(q, m, k, sinv, mode, stride, e5m2, out);                       \
    }
QF_FOR_INPUT_TYPES(FP8_DEQUANT_ROW_KERNEL, fp8_dequant_row)

// Columnwise: q is [K, M]; out[i * K + j] = OT(decode(q[j * M + i]) * scale(i, j)).
template <typename OT>
__device__ void fp8_dequant_col_impl(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k,
                                     const float* __restrict__ sinv, int mode, qf_u64 stride,
                                     int e5m2, OT* __restrict__ out) {
    __shared__ qf_u8 tile[32][33 * 4];  // [row of q in tile][column of q in tile], 32 x 128 bytes
    // Tile: 32 rows of q (= 32 logical columns j) x 128 columns of q (= 128 logical rows i).
    const qf_u64 ntj = (k + 31) / 32, nti = (m + 127) / 128;
    const qf_u64 ntiles = ntj * nti;
    for (qf_u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const qf_u64 j0 = (t % ntj) * 32, i0 = (t / ntj) * 128;
        // Read: 256 threads, 8 rows of q per pass, 32 threads x 4 bytes along M.
        for (int p = threadIdx.x / 32; p < 32; p += 8) {
            const qf_u64 j = j0 + p;
            const int a = 4 * (threadIdx.x % 32);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const qf_u64 i = i0 + a + b;
                tile[p][a + b] = (j < k && i < m) ? q[j * m + i] : (qf_u8)0;
            }
        }
        __syncthreads();
        // Write: each thread one logical column j (lane) of 16 logical rows.
        const int lane = threadIdx.x % 32;
        const int grp = threadIdx.x / 32;  // rows grp*16 .. grp*16+15 of the 128
        const qf_u64 j = j0 + lane;
        if (j < k) {
            for (int b = 0; b < 16; ++b) {
                const int ii = grp * 16 + b;
                const qf_u64 i = i0 + ii;
                if (i >= m) break;
                const float s = fp8_dequant_scale(sinv, mode, 1, i, j, stride);
                qf_from_f32(out + i * k + j, qf_fp8_decode_dt(tile[lane][ii], e5m2) * s);
            }
        }
        __syncthreads();
    }
}

#define FP8_DEQUANT_COL_KERNEL(name, OT)                                                        \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        name(const qf_u8* __restrict__ q, qf_u64 m, qf_u64 k, const float* __restrict__ sinv,   \
             int mode, qf_u64 stride, int e5m2, OT* __restrict__ out) {                         \
        fp8_dequant_col_impl<OT>(q, m, k, sinv, mode, stride, e5m2, out);                       \
    }
QF_FOR_INPUT_TYPES(FP8_DEQUANT_COL_KERNEL, fp8_dequant_col)
