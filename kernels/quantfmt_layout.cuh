// quantfmt shared CUDA header: scale-buffer layouts (quant_core::layout).
#pragma once
#include "quantfmt_common.cuh"

// quant_core::layout::swizzled_index: position of compact element (i, j) of a padded scale
// matrix with `cols` columns (a multiple of 4) in the cuBLAS 128x4-tile layout.
__device__ __forceinline__ qf_u64 qf_swizzled_index(qf_u64 i, qf_u64 j, qf_u64 cols) {
    qf_u64 tiles_x = cols / 4u;
    return ((i / 128u) * tiles_x + j / 4u) * 512u + (i % 32u) * 16u + ((i % 128u) / 32u) * 4u +
           (j % 4u);
}

// Compact (row-major, `stride` columns) or swizzled position of scale (i, j).
__device__ __forceinline__ qf_u64 qf_scale_index(qf_u64 i, qf_u64 j, qf_u64 stride, int swizzled) {
    return swizzled ? qf_swizzled_index(i, j, stride) : i * stride + j;
}
