// quant-core kernels shared by the formats: NaN-ignoring amax reductions.
//
// Every amax is accumulated as `qf_amax_key` bits (|x| as u32, NaN -> 0) with an integer max,
// which is associative and commutative: the result does not depend on the grid, the block size
// or the order of the atomics, and equals the CPU fold `if |v| > m { |v| } else { m }` from 0.
// `out` buffers must be zero-filled before the launch (a zero key is +0.0).
#include "quantfmt_common.cuh"

#define QF_AMAX_THREADS 256

// Block-wide max of `v` over QF_AMAX_THREADS threads; the result is valid in thread 0.
__device__ __forceinline__ qf_u32 qf_block_max_u32(qf_u32 v) {
    __shared__ qf_u32 warp_max[QF_AMAX_THREADS / 32];
    v = qf_warp_max_u32(v);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) warp_max[warp] = v;
    __syncthreads();
    qf_u32 r = 0u;
    if (warp == 0) {
        r = lane < QF_AMAX_THREADS / 32 ? warp_max[lane] : 0u;
        r = qf_warp_max_u32(r);
    }
    __syncthreads();
    return r;
}

// The largest amax key of the elements in one 16-byte word of a tensor.
__device__ __forceinline__ qf_u32 qf_amax_key16(uint4 w, const float*) {
    const qf_u32 k0 = max(qf_amax_key(__uint_as_float(w.x)), qf_amax_key(__uint_as_float(w.y)));
    const qf_u32 k1 = max(qf_amax_key(__uint_as_float(w.z)), qf_amax_key(__uint_as_float(w.w)));
    return max(k0, k1);
}
// bf16: a value's key is its magnitude bits shifted up 16 (0 for NaN), so the maximum is taken on
// the 16-bit magnitudes and shifted once.
__device__ __forceinline__ qf_u32 qf_amax_key16(uint4 w, const qf_bf16*) {
    const qf_u32 words[4] = {w.x, w.y, w.z, w.w};
    qf_u32 m = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const qf_u32 h = (words[i / 2] >> (16 * (i % 2))) & 0x7FFFu;
        m = max(m, h > 0x7F80u ? 0u : h);
    }
    return m << 16;
}
__device__ __forceinline__ qf_u32 qf_amax_key16(uint4 w, const qf_f16*) {
    const qf_u32 words[4] = {w.x, w.y, w.z, w.w};
    qf_u32 m = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        m = max(m, qf_amax_key(qf_f16_bits_to_f32((qf_u16)(words[i / 2] >> (16 * (i % 2))))));
    return m;
}

// Tensor amax: `*out = max(*out, amax(x[0..n]))` as f32 bits. Grid-stride over 16-byte words
// (4 f32 or 8 bf16/f16 elements) when `x` is 16-byte aligned, then the tail; element by element
// otherwise.
template <typename T>
__device__ void qf_amax_impl(const T* __restrict__ x, qf_u64 n, qf_u32* __restrict__ out) {
    qf_u32 m = 0u;
    const qf_u64 stride = qf_grid_threads();
    const qf_u64 t = qf_global_thread();
    if (qf_aligned16(x)) {
        const qf_u64 per = 16u / sizeof(T);
        const qf_u64 nw = n / per;
        const uint4* __restrict__ xw = reinterpret_cast<const uint4*>(x);
#pragma unroll 4
        for (qf_u64 i = t; i < nw; i += stride) m = max(m, qf_amax_key16(xw[i], x));
        if (t < n - per * nw) m = max(m, qf_amax_key(qf_to_f32(x[per * nw + t])));
    } else {
        for (qf_u64 i = t; i < n; i += stride) m = max(m, qf_amax_key(qf_to_f32(x[i])));
    }
    m = qf_block_max_u32(m);
    if (threadIdx.x == 0 && m != 0u) atomicMax(out, m);
}

#define QF_AMAX_KERNEL(name, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(QF_AMAX_THREADS)                               \
        name(const T* __restrict__ x, qf_u64 n, qf_u32* __restrict__ out) {                     \
        qf_amax_impl<T>(x, n, out);                                                             \
    }
QF_FOR_INPUT_TYPES(QF_AMAX_KERNEL, qf_amax)

// Per-row amax of a [rows, cols] matrix: out[r] = amax(row r) as f32 bits. One block per row
// (grid-stride over rows); plain writes, no atomics.
template <typename T>
__device__ void qf_row_amax_impl(const T* __restrict__ x, qf_u64 rows, qf_u64 cols,
                                 qf_u32* __restrict__ out) {
    for (qf_u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * cols;
        qf_u32 m = 0u;
        for (qf_u64 c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, qf_amax_key(qf_to_f32(row[c])));
        m = qf_block_max_u32(m);
        if (threadIdx.x == 0) out[r] = m;
    }
}

#define QF_ROW_AMAX_KERNEL(name, T)                                                             \
    extern "C" __global__ void __launch_bounds__(QF_AMAX_THREADS)                               \
        name(const T* __restrict__ x, qf_u64 rows, qf_u64 cols, qf_u32* __restrict__ out) {     \
        qf_row_amax_impl<T>(x, rows, cols, out);                                                \
    }
QF_FOR_INPUT_TYPES(QF_ROW_AMAX_KERNEL, qf_row_amax)

// Per-column amax of a [rows, cols] matrix: out[c] = max(out[c], amax(column c over this block's
// rows)). Threads along x cover columns (coalesced reads), blockIdx.y covers chunks of
// `rows_per_block` rows; partial maxima meet in atomicMax.
template <typename T>
__device__ void qf_col_amax_impl(const T* __restrict__ x, qf_u64 rows, qf_u64 cols,
                                 qf_u64 rows_per_block, qf_u32* __restrict__ out) {
    const qf_u64 c = (qf_u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (qf_u64 r0 = (qf_u64)blockIdx.y * rows_per_block; r0 < rows; r0 += (qf_u64)gridDim.y * rows_per_block) {
        const qf_u64 r1 = min(rows, r0 + rows_per_block);
        qf_u32 m = 0u;
        for (qf_u64 r = r0; r < r1; ++r) m = max(m, qf_amax_key(qf_to_f32(x[r * cols + c])));
        if (m != 0u) atomicMax(out + c, m);
    }
}

#define QF_COL_AMAX_KERNEL(name, T)                                                             \
    extern "C" __global__ void __launch_bounds__(QF_AMAX_THREADS)                               \
        name(const T* __restrict__ x, qf_u64 rows, qf_u64 cols, qf_u64 rows_per_block,          \
             qf_u32* __restrict__ out) {                                                        \
        qf_col_amax_impl<T>(x, rows, cols, rows_per_block, out);                                \
    }
QF_FOR_INPUT_TYPES(QF_COL_AMAX_KERNEL, qf_col_amax)
