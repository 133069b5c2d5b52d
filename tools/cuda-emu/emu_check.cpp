// Runs quantfmt's CUDA kernels in the host emulation (cuda_emu.h) on the cases written by
// cases.rs and compares every output byte with the CPU path. The launch sequence of each
// format mirrors its Rust `cuda.rs` (amax passes, argument values); grids are deliberately
// small (at most 3 blocks) so every grid-stride loop runs more than once.
//
//   g++ -std=c++20 -O1 -ffp-contract=off -I kernels tools/cuda-emu/emu_check.cpp -o emu_check
//   ./emu_check CASEDIR
#include "cuda_emu.h"

#include "../../crates/quant-core/kernels/core.cu"
#include "../../crates/fmt-fp8/kernels/fp8.cu"
#include "../../crates/fmt-mxfp8/kernels/mxfp8.cu"
#include "../../crates/fmt-nvfp4/kernels/nvfp4.cu"
#include "../../crates/fmt-int4tiled/kernels/int4tiled.cu"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

struct Buf {
    std::vector<float4> storage;  // 16-byte aligned
    size_t n = 0;
    qf_u8* p() { return reinterpret_cast<qf_u8*>(storage.data()); }
    void resize(size_t bytes) {
        n = bytes;
        storage.assign((bytes + 15) / 16 + 1, float4{0, 0, 0, 0});
    }
};

static bool read_file(const std::string& path, Buf& b) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    b.resize(s.size());
    std::memcpy(b.p(), s.data(), s.size());
    return true;
}

static unsigned grid_of(qf_u64 blocks) { return (unsigned)std::max<qf_u64>(1, std::min<qf_u64>(blocks, 3)); }
static void run(qf_u64 blocks, const std::function<void()>& k) { emu::launch({grid_of(blocks), 1, 1}, {256, 1, 1}, k); }

static size_t dsize(const std::string& dt) { return dt == "f32" ? 4 : 2; }

// Input-type dispatch: F(T) with T = float / qf_bf16 / qf_f16.
#define DISPATCH(dt, CALL)                                   \
    do {                                                     \
        if (dt == "f32") { using T = float; CALL; }          \
        else if (dt == "bf16") { using T = qf_bf16; CALL; }  \
        else { using T = qf_f16; CALL; }                     \
    } while (0)

static void amax(const float* x, qf_u64 n, qf_u32* o) { qf_amax_f32(x, n, o); }
static void amax(const qf_bf16* x, qf_u64 n, qf_u32* o) { qf_amax_bf16(x, n, o); }
static void amax(const qf_f16* x, qf_u64 n, qf_u32* o) { qf_amax_f16(x, n, o); }
static void row_amax(const float* x, qf_u64 r, qf_u64 c, qf_u32* o) { qf_row_amax_f32(x, r, c, o); }
static void row_amax(const qf_bf16* x, qf_u64 r, qf_u64 c, qf_u32* o) { qf_row_amax_bf16(x, r, c, o); }
static void row_amax(const qf_f16* x, qf_u64 r, qf_u64 c, qf_u32* o) { qf_row_amax_f16(x, r, c, o); }
static void col_amax(const float* x, qf_u64 r, qf_u64 c, qf_u64 rpb, qf_u32* o) { qf_col_amax_f32(x, r, c, rpb, o); }
static void col_amax(const qf_bf16* x, qf_u64 r, qf_u64 c, qf_u64 rpb, qf_u32* o) { qf_col_amax_bf16(x, r, c, rpb, o); }
static void col_amax(const qf_f16* x, qf_u64 r, qf_u64 c, qf_u64 rpb, qf_u32* o) { qf_col_amax_f16(x, r, c, rpb, o); }

#define CAST3(fn, base)                                                                            \
    template <typename... A> static void fn(const float* x, A... a) { base##_f32(x, a...); }       \
    template <typename... A> static void fn(const qf_bf16* x, A... a) { base##_bf16(x, a...); }    \
    template <typename... A> static void fn(const qf_f16* x, A... a) { base##_f16(x, a...); }
CAST3(fp8_cast, fp8_cast)
CAST3(fp8_block_cast, fp8_block_cast)
CAST3(mxfp8_cast, mxfp8_cast)
CAST3(nvfp4_quant, nvfp4_quant)
CAST3(nvfp4_rht_amax, nvfp4_rht_amax)
CAST3(int4_quant, int4_quant)
CAST3(int4_linear, int4_linear)

#define OUT3(fn, base)                                                                             \
    template <typename... A> static void fn(float* o, A... a) { base##_f32(a..., o); }            \
    template <typename... A> static void fn(qf_bf16* o, A... a) { base##_bf16(a..., o); }         \
    template <typename... A> static void fn(qf_f16* o, A... a) { base##_f16(a..., o); }
OUT3(fp8_dequant_row, fp8_dequant_row)
OUT3(fp8_dequant_col, fp8_dequant_col)
OUT3(mxfp8_dequant, mxfp8_dequant)
OUT3(nvfp4_dequant_row, nvfp4_dequant_row)
OUT3(nvfp4_dequant_col, nvfp4_dequant_col)
OUT3(int4_dequant, int4_dequant)

struct Case {
    int id;
    std::string fmt, dtype;
    qf_u64 m, k;
    bool row, col;
    std::map<std::string, std::string> a;
    qf_u64 u(const char* key) const { return std::stoull(a.at(key)); }
    int i(const char* key) const { return (int)std::stoll(a.at(key)); }
    float f(const char* key) const { return __uint_as_float((qf_u32)std::stoul(a.at(key))); }
};

static std::string dir_of;
static int failures = 0;

static void expect(const Case& c, const std::string& name, Buf& got) {
    Buf want;
    if (!read_file(dir_of + "/" + std::to_string(c.id) + "." + name, want)) {
        std::printf("case %d: missing expected %s\n", c.id, name.c_str());
        ++failures;
        return;
    }
    if (want.n != got.n || std::memcmp(want.p(), got.p(), want.n) != 0) {
        size_t i = 0;
        while (i < std::min(want.n, got.n) && want.p()[i] == got.p()[i]) ++i;
        std::printf("case %d %s:%s %llux%llu %s row=%d col=%d: %s differs at byte %zu (of %zu): want %02x got %02x\n",
                    c.id, c.fmt.c_str(), "", (unsigned long long)c.m, (unsigned long long)c.k, c.dtype.c_str(),
                    c.row, c.col, name.c_str(), i, want.n, i < want.n ? want.p()[i] : 0, i < got.n ? got.p()[i] : 0);
        ++failures;
    }
}

// Dequantized outputs: bytes equal, any NaN equal to any NaN.
static void expect_dense(const Case& c, const std::string& name, Buf& got, const std::string& odt) {
    Buf want;
    if (!read_file(dir_of + "/" + std::to_string(c.id) + "." + name, want)) {
        std::printf("case %d: missing expected %s\n", c.id, name.c_str());
        ++failures;
        return;
    }
    const size_t w = dsize(odt);
    auto is_nan = [&](const qf_u8* p) {
        if (w == 4) { qf_u32 v; std::memcpy(&v, p, 4); return (v & 0x7FFFFFFFu) > 0x7F800000u; }
        qf_u16 v; std::memcpy(&v, p, 2);
        return odt == "bf16" ? (v & 0x7FFFu) > 0x7F80u : (v & 0x7FFFu) > 0x7C00u;
    };
    for (size_t i = 0; i + w <= want.n; i += w) {
        if (std::memcmp(want.p() + i, got.p() + i, w) != 0 && !(is_nan(want.p() + i) && is_nan(got.p() + i))) {
            std::printf("case %d %s %llux%llu %s: %s differs at element %zu\n", c.id, c.fmt.c_str(),
                        (unsigned long long)c.m, (unsigned long long)c.k, c.dtype.c_str(), name.c_str(), i / w);
            ++failures;
            return;
        }
    }
}

static Buf load_expected(const Case& c, const std::string& name) {
    Buf b;
    read_file(dir_of + "/" + std::to_string(c.id) + "." + name, b);
    return b;
}

static Buf like(const Case& c, const std::string& name) {
    Buf b;
    b.resize(load_expected(c, name).n);
    return b;
}

template <typename T>
static void run_fp8(const Case& c, Buf& x) {
    const T* xp = reinterpret_cast<const T*>(x.p());
    const qf_u64 n = c.m * c.k;
    Buf am;
    am.resize(4);
    run((n / 4 + 255) / 256, [&] { amax(xp, n, reinterpret_cast<qf_u32*>(am.p())); });
    Buf rd = c.row ? like(c, "rowwise_data") : Buf{};
    Buf cd = c.col ? like(c, "columnwise_data") : Buf{};
    Buf si = like(c, "scale_inv");
    const qf_u64 tiles = ((c.m + 63) / 64) * ((c.k + 63) / 64);
    run(tiles, [&] {
        fp8_cast(xp, c.m, c.k, reinterpret_cast<const qf_u32*>(am.p()), c.f("max"), c.i("e5m2"), c.i("pow2"), c.f("eps"),
                 c.row ? rd.p() : nullptr, c.col ? cd.p() : nullptr, reinterpret_cast<float*>(si.p()));
    });
    if (c.row) expect(c, "rowwise_data", rd);
    if (c.col) expect(c, "columnwise_data", cd);
    expect(c, "scale_inv", si);
}

template <typename T>
static void run_fp8_block(const Case& c, Buf& x) {
    const T* xp = reinterpret_cast<const T*>(x.p());
    Buf rd = c.row ? like(c, "rowwise_data") : Buf{};
    Buf rs = c.row ? like(c, "rowwise_scale_inv") : Buf{};
    Buf cd = c.col ? like(c, "columnwise_data") : Buf{};
    Buf cs = c.col ? like(c, "columnwise_scale_inv") : Buf{};
    const qf_u64 tiles = ((c.m + 127) / 128) * ((c.k + 127) / 128);
    run(tiles, [&] {
        fp8_block_cast(xp, c.m, c.k, c.i("two_d"), c.i("e5m2"), c.f("max"), c.i("pow2"), c.f("eps"),
                       c.row ? rd.p() : nullptr, c.row ? reinterpret_cast<float*>(rs.p()) : nullptr, c.u("rs_stride"),
                       c.col ? cd.p() : nullptr, c.col ? reinterpret_cast<float*>(cs.p()) : nullptr, c.u("cs_stride"));
    });
    if (c.row) { expect(c, "rowwise_data", rd); expect(c, "rowwise_scale_inv", rs); }
    if (c.col) { expect(c, "columnwise_data", cd); expect(c, "columnwise_scale_inv", cs); }
}

template <typename T>
static void run_mxfp8(const Case& c, Buf& x) {
    const T* xp = reinterpret_cast<const T*>(x.p());
    Buf rd = c.row ? like(c, "rowwise_data") : Buf{};
    Buf rs = c.row ? like(c, "rowwise_scale_inv") : Buf{};
    Buf cd = c.col ? like(c, "columnwise_data") : Buf{};
    Buf cs = c.col ? like(c, "columnwise_scale_inv") : Buf{};
    const qf_u64 tiles = (c.m / 32) * ((c.k + 127) / 128);
    run(tiles, [&] {
        mxfp8_cast(xp, c.m, c.k, c.i("e5m2"), c.i("ocp"), c.i("two_d"), c.i("plus_zero"), c.i("swz"),
                   c.row ? rd.p() : nullptr, c.row ? rs.p() : nullptr, c.u("rs_stride"), c.col ? cd.p() : nullptr,
                   c.col ? cs.p() : nullptr, c.u("cs_stride"), c.u("cs_rows"));
    });
    if (c.row) { expect(c, "rowwise_data", rd); expect(c, "rowwise_scale_inv", rs); }
    if (c.col) { expect(c, "columnwise_data", cd); expect(c, "columnwise_scale_inv", cs); }
}

template <typename T>
static void run_nvfp4(const Case& c, Buf& x) {
    const T* xp = reinterpret_cast<const T*>(x.p());
    const qf_u64 m = c.m, k = c.k, n = m * k;
    const int per_row = c.i("per_row"), rht = c.i("rht");
    Buf ra, ca;
    auto quant = [&](int dir, Buf& am, Buf& d, Buf& s, qf_u64 stride) {
        const qf_u64 rows = dir ? k : m, cols = dir ? m : k;
        const qf_u64 groups = (rows / 16) * ((cols / 16 + 15) / 16);
        run(groups, [&] {
            nvfp4_quant(xp, m, k, dir, dir == 1 && rht, reinterpret_cast<const float*>(am.p()), per_row, c.i("two_d"),
                        c.i("e4m3max"), c.i("fos"), c.i("sr"), (qf_u64)c.u("seed"), c.i("swz"), d.p(), s.p(), stride);
        });
    };
    if (c.row) {
        ra = like(c, "amax_rowwise");
        if (per_row) run(m, [&] { row_amax(xp, m, k, reinterpret_cast<qf_u32*>(ra.p())); });
        else run((n / 4 + 255) / 256, [&] { amax(xp, n, reinterpret_cast<qf_u32*>(ra.p())); });
        Buf d = like(c, "rowwise_data"), s = like(c, "rowwise_scale_inv");
        quant(0, ra, d, s, c.u("ss_r"));
        expect(c, "amax_rowwise", ra);
        expect(c, "rowwise_data", d);
        expect(c, "rowwise_scale_inv", s);
    }
    if (c.col) {
        ca = like(c, "amax_columnwise");
        if (rht) {
            run((k * (m / 16) + 255) / 256, [&] { nvfp4_rht_amax(xp, m, k, reinterpret_cast<qf_u32*>(ca.p())); });
        } else if (per_row) {
            // Two 64-row chunks per column block (like the Rust launcher's rows_per_block >= 64).
            emu::launch({(unsigned)((k + 255) / 256), 2, 1}, {256, 1, 1},
                        [&] { col_amax(xp, m, k, (qf_u64)64, reinterpret_cast<qf_u32*>(ca.p())); });
        } else if (c.row) {
            std::memcpy(ca.p(), ra.p(), 4);
        } else {
            run((n / 4 + 255) / 256, [&] { amax(xp, n, reinterpret_cast<qf_u32*>(ca.p())); });
        }
        Buf d = like(c, "columnwise_data"), s = like(c, "columnwise_scale_inv");
        quant(1, ca, d, s, c.u("ss_c"));
        expect(c, "amax_columnwise", ca);
        expect(c, "columnwise_data", d);
        expect(c, "columnwise_scale_inv", s);
    }
}

static float widen(const float* p) { return *p; }
static float widen(const qf_bf16* p) { return qf_bf16_bits_to_f32(p->bits); }
static float widen(const qf_f16* p) { return qf_f16_bits_to_f32(p->bits); }

template <typename T>
static void run_int4(const Case& c, Buf& x) {
    const T* xp = reinterpret_cast<const T*>(x.p());
    const qf_u64 e = c.u("e"), n = c.u("n"), k = c.u("k"), np = c.u("np"), kp = c.u("kp");
    const int g = c.i("g"), ikt = c.i("ikt");
    const int bf16_path = c.dtype == "bf16";
    Buf packed = like(c, "packed_weight"), sz = like(c, "scale_and_zero");
    run((e * np * (kp / g) + 255) / 256, [&] {
        int4_quant(xp, e, n, k, np, kp, g, ikt, bf16_path, c.f("eps"), reinterpret_cast<qf_u32*>(packed.p()),
                   reinterpret_cast<qf_u16*>(sz.p()));
    });
    expect(c, "packed_weight", packed);
    expect(c, "scale_and_zero", sz);
    // unpack / pack against the CPU's unpack of the CPU's bytes.
    Buf want_packed = load_expected(c, "packed_weight");
    Buf unpacked = like(c, "unpacked");
    run((e * n * k + 255) / 256, [&] {
        int4_unpack(reinterpret_cast<const qf_u32*>(want_packed.p()), e, n, k, np, kp, ikt, unpacked.p());
    });
    expect(c, "unpacked", unpacked);
    Buf want_u = load_expected(c, "unpacked");
    Buf repacked = like(c, "packed_weight");
    run((e * np * kp / 8 + 255) / 256, [&] {
        int4_pack((const qf_u8*)want_u.p(), e, n, k, np, kp, ikt, reinterpret_cast<qf_u32*>(repacked.p()));
    });
    expect(c, "packed_weight", repacked);
    // The matmul, against the f64 reference with the exact-vs-bf16-weight tolerance.
    Buf lx, lref;
    if (read_file(dir_of + "/" + std::to_string(c.id) + ".lin.x", lx) &&
        read_file(dir_of + "/" + std::to_string(c.id) + ".lin.ref", lref)) {
        const qf_u64 m = 3;
        Buf y;
        y.resize(m * n * sizeof(T));
        Buf lp = load_expected(c, "lin.packed"), ls = load_expected(c, "lin.sz");
        run(np / 8, [&] {
            int4_linear(reinterpret_cast<const T*>(lx.p()), m, reinterpret_cast<const qf_u32*>(lp.p()),
                        reinterpret_cast<const qf_u16*>(ls.p()), n, k, np, kp, g, ikt, (const T*)nullptr,
                        reinterpret_cast<T*>(y.p()));
        });
        for (qf_u64 i = 0; i < m * n; ++i) {
            double ref, absw;
            std::memcpy(&ref, lref.p() + 16 * i, 8);
            std::memcpy(&absw, lref.p() + 16 * i + 8, 8);
            const double got = widen(reinterpret_cast<const T*>(y.p()) + i);
            const bool ok = std::isnan(ref) ? std::isnan(got)
                                            : std::fabs(got - ref) <= std::ldexp(absw, -8) + std::ldexp(std::fabs(ref), -8) + 1e-30;
            if (!ok) {
                std::printf("case %d int4 linear: y[%llu] = %g, reference %g (sum|x||w| %g)\n", c.id,
                            (unsigned long long)i, got, ref, absw);
                ++failures;
                break;
            }
        }
    }
}

template <typename OT>
static void dequant(const Case& c, const std::string& odt) {
    const qf_u64 m = c.m, k = c.k, n = m * k;
    for (int dir = 0; dir < 2; ++dir) {
        if (dir == 0 ? !c.row : !c.col) continue;
        Buf out;
        out.resize(n * sizeof(OT));
        OT* o = reinterpret_cast<OT*>(out.p());
        const std::string tag = dir == 0 ? "row" : "col";
        if (c.fmt == "int4tiled") {
            Buf q = load_expected(c, "packed_weight");
            Buf s = load_expected(c, "scale_and_zero");
            run((n + 255) / 256, [&] {
                int4_dequant(o, reinterpret_cast<const qf_u32*>(q.p()), reinterpret_cast<const qf_u16*>(s.p()), c.u("e"),
                             c.u("n"), c.u("k"), c.u("np"), c.u("kp"), c.i("g"), c.i("ikt"));
            });
        } else if (c.fmt == "fp8" || c.fmt == "fp8-block") {
            Buf q = load_expected(c, dir == 0 ? "rowwise_data" : "columnwise_data");
            const bool block = c.fmt == "fp8-block";
            Buf s = load_expected(c, block ? (dir == 0 ? "rowwise_scale_inv" : "columnwise_scale_inv") : "scale_inv");
            const int mode = block ? (c.i("two_d") ? 2 : 1) : 0;
            const qf_u64 stride = block ? (dir == 0 ? c.u("rs_stride") : c.u("cs_stride")) : 0;
            const float* sp = reinterpret_cast<const float*>(s.p());
            if (dir == 0) run((n + 255) / 256, [&] { fp8_dequant_row(o, (const qf_u8*)q.p(), m, k, sp, mode, stride, c.i("e5m2")); });
            else run(((k + 31) / 32) * ((m + 127) / 128), [&] { fp8_dequant_col(o, (const qf_u8*)q.p(), m, k, sp, mode, stride, c.i("e5m2")); });
        } else if (c.fmt == "mxfp8") {
            Buf q = load_expected(c, dir == 0 ? "rowwise_data" : "columnwise_data");
            Buf s = load_expected(c, dir == 0 ? "rowwise_scale_inv" : "columnwise_scale_inv");
            const qf_u64 stride = dir == 0 ? c.u("rs_stride") : c.u("cs_stride");
            const qf_u64 rows = dir == 0 ? ((m + 127) / 128) * 128 : c.u("cs_rows");
            run((n / 4 + 255) / 256, [&] { mxfp8_dequant(o, (const qf_u8*)q.p(), m, k, (const qf_u8*)s.p(), dir, c.i("swz"), stride, rows, c.i("e5m2")); });
        } else {
            Buf q = load_expected(c, dir == 0 ? "rowwise_data" : "columnwise_data");
            Buf s = load_expected(c, dir == 0 ? "rowwise_scale_inv" : "columnwise_scale_inv");
            Buf a = load_expected(c, dir == 0 ? "amax_rowwise" : "amax_columnwise");
            const float* ap = reinterpret_cast<const float*>(a.p());
            if (dir == 0)
                run((n / 2 + 255) / 256, [&] { nvfp4_dequant_row(o, (const qf_u8*)q.p(), m, k, (const qf_u8*)s.p(), c.u("ss_r"), c.i("swz"), ap, c.i("per_row"), c.i("e4m3max")); });
            else
                run((k * (m / 16) + 255) / 256, [&] { nvfp4_dequant_col(o, (const qf_u8*)q.p(), m, k, (const qf_u8*)s.p(), c.u("ss_c"), c.i("swz"), ap, c.i("per_row"), c.i("e4m3max"), c.i("rht")); });
        }
        expect_dense(c, "deq." + tag + "." + odt, out, odt);
    }
}

// The shared header's codecs against quant_core::codec / half on the sweep cases.rs wrote
// (13 bytes per value: f32 bits, e4m3, e5m2, e2m1, e8m0 ceil, e8m0 floor, bf16, f16).
static void codec_sweep() {
    Buf s;
    if (!read_file(dir_of + "/codec_sweep.bin", s)) {
        std::printf("codec sweep: codec_sweep.bin missing\n");
        ++failures;
        return;
    }
    size_t n = s.n / 13, bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const qf_u8* p = s.p() + 13 * i;
        qf_u32 bits;
        std::memcpy(&bits, p, 4);
        const float x = __uint_as_float(bits);
        qf_u16 bf, hf;
        std::memcpy(&bf, p + 9, 2);
        std::memcpy(&hf, p + 11, 2);
        const bool hnan = (hf & 0x7FFFu) > 0x7C00u;
        const qf_u16 ghf = qf_f32_to_f16_bits(x);
        const bool ok = qf_e4m3_encode(x) == p[4] && qf_fp8_encode_dt(x, 0) == p[4] &&
                        qf_e5m2_encode(x) == p[5] && qf_fp8_encode_dt(x, 1) == p[5] &&
                        qf_e2m1_encode(x) == p[6] && qf_e8m0_from_f32_ceil(x) == p[7] &&
                        qf_e8m0_from_f32_floor(x) == p[8] && qf_f32_to_bf16_bits(x) == bf &&
                        (hnan ? (ghf & 0x7FFFu) > 0x7C00u : ghf == hf);
        if (!ok && bad++ < 10) std::printf("codec sweep: f32 bits %08x differ\n", bits);
    }
    for (qf_u32 c = 0; c < 256; ++c) {
        if (__float_as_uint(qf_fp8_decode_dt(c, 0)) != __float_as_uint(qf_e4m3_decode(c)) ||
            __float_as_uint(qf_fp8_decode_dt(c, 1)) != __float_as_uint(qf_e5m2_decode(c))) {
            std::printf("codec sweep: decode of %02x differs between the two decoders\n", c);
            ++bad;
        }
    }
    std::printf("codec sweep: %zu values, %zu mismatches\n", n, bad);
    failures += (int)bad;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: emu_check CASEDIR [FIRST_ID]\n");
        return 2;
    }
    dir_of = argv[1];
    const int first = argc > 2 ? std::atoi(argv[2]) : 0;
    codec_sweep();
    std::ifstream man(dir_of + "/manifest.txt");
    std::string line;
    int cases = 0;
    while (std::getline(man, line)) {
        std::istringstream ss(line);
        Case c;
        int row, col;
        ss >> c.id >> c.fmt >> c.m >> c.k >> c.dtype >> row >> col;
        if (c.id < first) continue;
        c.row = row;
        c.col = col;
        std::string kv;
        while (ss >> kv) {
            auto eq = kv.find('=');
            c.a[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
        Buf x;
        read_file(dir_of + "/" + std::to_string(c.id) + ".in", x);
        const int before = failures;
        if (c.fmt == "fp8") DISPATCH(c.dtype, run_fp8<T>(c, x));
        else if (c.fmt == "fp8-block") DISPATCH(c.dtype, run_fp8_block<T>(c, x));
        else if (c.fmt == "mxfp8") DISPATCH(c.dtype, run_mxfp8<T>(c, x));
        else if (c.fmt == "nvfp4") DISPATCH(c.dtype, run_nvfp4<T>(c, x));
        else if (c.fmt == "int4tiled") DISPATCH(c.dtype, run_int4<T>(c, x));
        dequant<float>(c, "f32");
        dequant<qf_bf16>(c, "bf16");
        dequant<qf_f16>(c, "f16");
        if (failures != before) std::printf("  ^ case %d: %s\n", c.id, line.c_str());
        ++cases;
        std::fflush(stdout);
    }
    std::printf("%d cases emulated, %d mismatches\n", cases, failures);
    return failures == 0 && cases > 0 ? 0 : 1;
}
