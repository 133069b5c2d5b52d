// A host emulation of the small CUDA subset quantfmt's kernels use, so the kernel sources can
// be compiled by g++ and run on a CPU (each CUDA thread a fiber, switching at __syncthreads
// and the warp shuffles). It exists to check the kernels' logic (indexing,
// reductions, layouts, arithmetic order) against the Rust CPU path on machines without a GPU;
// it is no substitute for running them on a device (no memory model, no timing).
//
// Arithmetic: compile with -ffp-contract=off and without fast-math on x86-64 (SSE), so every
// float operation is one IEEE operation, as NVRTC's --fmad=false --ftz=false builds do.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cfloat>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define QF_HOST_EMU 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

// Every CUDA thread of a block is a fiber (ucontext) of one OS thread; the fibers switch only
// at __syncthreads and warp shuffles, so a block runs deterministically.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 gridDim;
inline dim3 blockDim;

namespace emu {
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
};
inline std::vector<Fiber> fibers;
inline ucontext_t scheduler;
inline unsigned current = 0;
inline const std::function<void()>* body = nullptr;

struct Barrier {
    unsigned expected = 0, arrived = 0, generation = 0;
};
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
inline std::vector<std::vector<uint32_t>> warp_xchg;

inline void yield() { swapcontext(&fibers[current].ctx, &scheduler); }

inline void wait(Barrier& b) {
    const unsigned g = b.generation;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.generation;
        return;
    }
    while (b.generation == g) yield();
}

inline void trampoline() {
    (*body)();
    fibers[current].done = true;
    swapcontext(&fibers[current].ctx, &scheduler);
}
}  // namespace emu

inline void __syncthreads() { emu::wait(emu::block_barrier); }

inline uint32_t __shfl_xor_sync(uint32_t, uint32_t v, int o) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu::warp_xchg[w][l] = v;
    emu::wait(emu::warp_barriers[w]);
    const uint32_t r = emu::warp_xchg[w][l ^ (unsigned)o];
    emu::wait(emu::warp_barriers[w]);
    return r;
}

// CUDA's float overload exchanges the bits, not a converted value.
inline float __shfl_xor_sync(uint32_t mask, float v, int o) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b = __shfl_xor_sync(mask, b, o);
    float r;
    std::memcpy(&r, &b, 4);
    return r;
}

inline uint32_t atomicMax(uint32_t* p, uint32_t v) {
    const uint32_t old = *p;
    if (v > old) *p = v;
    return old;
}

template <typename T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
    return a < b ? b : a;
}

inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline long long __double_as_longlong(double d) {
    long long u;
    std::memcpy(&u, &d, 8);
    return u;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __double2float_rn(double d) { return (float)d; }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }





namespace emu {
// Runs `kernel` over a grid, one block at a time, each block as blockDim.x fibers.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x;
    body = &kernel;
    fibers.resize(n);
    for (auto& f : fibers)
        if (f.stack.empty()) f.stack.resize(256 * 1024);
    block_barrier.expected = n;
    warp_barriers.assign((n + 31) / 32, Barrier{});
    for (unsigned w = 0; w < warp_barriers.size(); ++w) warp_barriers[w].expected = std::min(32u, n - 32 * w);
    warp_xchg.assign((n + 31) / 32, std::vector<uint32_t>(32, 0));
    for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            blockIdx = {bx, by, 0};
            for (unsigned t = 0; t < n; ++t) {
                Fiber& f = fibers[t];
                f.done = false;
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = f.stack.data();
                f.ctx.uc_stack.ss_size = f.stack.size();
                f.ctx.uc_link = nullptr;
                makecontext(&f.ctx, trampoline, 0);
            }
            unsigned live = n;
            while (live > 0) {
                live = 0;
                for (unsigned t = 0; t < n; ++t) {
                    if (fibers[t].done) continue;
                    current = t;
                    threadIdx = {t, 0, 0};
                    swapcontext(&scheduler, &fibers[t].ctx);
                    if (!fibers[t].done) ++live;
                }
            }
        }
    }
    body = nullptr;
}
}  // namespace emu
