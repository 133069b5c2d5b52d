#!/usr/bin/env python3
"""quantfmt against its golden numpy models on random inputs, byte for byte.

The golden data in `tests/golden/data/` are fixed cases: the shapes, options and
contents the scripts there chose. The library's own differential tests (`level_fuzz.rs`,
`concurrency.rs`) compare its SIMD levels and pool sizes with its scalar path, which they
take as the truth. This script closes the gap between the two: it draws random cases
(shapes, input dtypes, usages, every option the models cover, the contents of
`tests/golden/fp8.py`'s generators: ties, near-max amaxes, subnormals, NaN, infinities,
signed zeros, regions of each), quantizes them with the release `quantfmt` CLI and with
the golden models (`tests/golden/{fp8,mxfp8,nvfp4,int4tiled}.py`, imported, not copied),
and compares every stored buffer byte for byte and the dequantization (`quantfmt
dequantize --dtype` f32, bf16 and f16) element for element.

Comparison rules are the golden tests': quantized bytes exactly; a NaN in a float buffer
or a dequantized value is compared as "NaN with this sign" (NaN payloads are
implementation-defined, see `tests/golden/README.md`). Where the script departs from a
model, the function doing it says why (`nvfp4_dequantize`, `rht_inverse_f64`,
`Int4Tiled.compare`).

Rank-3 tensors are sometimes stored as grouped tensors (`--grouped`): each member is
then modelled alone and the buffers compared with the members' concatenated (the grouped
layout's definition); int4tiled's `[E, n, k]` experts likewise. int4tiled's dequantization
is the model's exact rational arithmetic, vectorized (`int4_dequant`).

Partly covered: NVFP4 stochastic rounding, which the model lacks (its Philox stream has
its own tests, `crates/fmt-nvfp4/tests/sr.rs`): its scales and amaxes must equal the
model's and each code must be the model's nearest code or a grid neighbour of it
(`Nvfp4.compare`).

Needs numpy, ml_dtypes and safetensors (`pip install -r tests/golden/requirements.txt`)
and builds the release CLI. Exit status 1 on any mismatch or refusal (the options drawn
are ones quantfmt must take); each is printed with its run's seed, spec, usage, dtype,
shape and content and the first differing element. `--run-seed N` replays one run.

    python3 scripts/crosscheck_golden.py                 # 200 runs of 6 tensors, seed 1
    python3 scripts/crosscheck_golden.py --batches 3000 --seed 3 --family nvfp4
"""

import argparse
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F32 = np.float32
BF16 = ml_dtypes.bfloat16


def golden(name):
    """tests/golden/<name>.py as a module."""
    path = os.path.join(ROOT, "tests", "golden", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"golden_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FP8 = golden("fp8")
MX = golden("mxfp8")
NV = golden("nvfp4")
I4 = golden("int4tiled")

# --- safetensors, by hand (the numpy binding has no bfloat16) --------------------------

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": BF16, "U8": np.uint8,
             "I32": np.int32, "U16": np.uint16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2, "I8": np.int8, "U32": np.uint32}
ST_NAMES = {np.dtype(v): k for k, v in ST_DTYPES.items()}


def save(path, tensors, metadata=None):
    """`tensors` (name -> array, dtype from ST_DTYPES) as a safetensors file."""
    header, blobs, off = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, a in tensors.items():
        # (np.ascontiguousarray would make a 0-d scalar [1].)
        a = np.asarray(a).copy(order="C")
        b = a.tobytes()
        header[name] = {"dtype": ST_NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load(path):
    """name -> numpy array in the stored dtype (shape kept)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        s, e = d["data_offsets"]
        dt = np.dtype(ST_DTYPES[d["dtype"]])
        out[name] = np.frombuffer(raw[base + s:base + e], dtype=dt).reshape(d["shape"])
    return out


# --- inputs ----------------------------------------------------------------------------

DT = {"f32": np.float32, "bf16": BF16, "f16": np.float16}
DEQUANT_DTYPES = ["f32", "bf16", "f16"]


def content(rng, kind, shape, dtype):
    """Values of `kind` (one of fp8.py's generators, or their regions) in `dtype`."""
    if kind == "mixed":
        block = "1x128" if rng.random() < 0.5 else "128x128"
        x = FP8.mixed(rng, list(shape), dtype, "e4m3", block)
    else:
        fmt = "e4m3" if rng.random() < 0.7 else "e5m2"
        x = FP8.fill(kind, rng, list(shape), dtype, fmt).reshape(shape)
    x = np.asarray(x).astype(DT[dtype]).reshape(shape)
    if rng.random() < 0.15:
        # A row or column of one value (a block whose values all round alike).
        x = x.copy()
        v = x.flat[int(rng.integers(0, x.size))]
        if rng.random() < 0.5:
            x.reshape(-1, shape[-1])[int(rng.integers(0, x.size // shape[-1]))] = v
        else:
            x.reshape(-1, shape[-1])[:, int(rng.integers(0, shape[-1]))] = v
    return x


KINDS = FP8.KINDS + ["mixed", "mixed"]


# --- one family per format: a random spec, shape and the model's buffers ---------------


class Family:
    """One format: `spec(rng)` draws a spec (and keeps its options), `usage`, `dtypes` and
    `shape` what to quantize, `model(x, dtype, usage)` the golden model's buffers and
    dequantizations, `compare(name, got, want)` one buffer's verdict."""

    def compare(self, name, got, want):
        return first_difference(got, want)

    def usage(self, rng):
        return str(rng.choice(["rowwise", "columnwise", "both"]))

    def dtypes(self):
        return ["f32", "bf16", "f16"]


class Fp8(Family):
    name = "fp8"

    def spec(self, rng):
        self.fmt = "e5m2" if rng.random() < 0.3 else "e4m3"
        self.pow2 = rng.random() < 0.4
        self.eps = F32(rng.choice([0.0, 0.0, 1.0, 3.0e4, np.uint32(1).view(F32), 1e-3]))
        opts = (["e5m2"] if self.fmt == "e5m2" else []) + (["pow2"] if self.pow2 else [])
        if self.eps != 0:
            opts.append(f"eps={self.eps}")
        return "fp8" + (":" + ",".join(opts) if opts else "")

    def shape(self, rng):
        return random_shape(rng, 1, 1)

    def model(self, x, dtype, usage):
        c = dict(fp8=self.fmt, pow2=self.pow2, eps=self.eps, usage=usage, dtype=dtype)
        bufs, deq = FP8.quantize_per_tensor(x, c)
        return bufs, {d: v for (d, dt), v in FP8.dequantize(bufs, deq, list(x.shape), c).items()
                      if dt == "f32"}


class Fp8Block(Fp8):
    name = "fp8-block"

    def spec(self, rng):
        self.block = "1x128" if rng.random() < 0.5 else "128x128"
        self.fmt = "e5m2" if rng.random() < 0.3 else "e4m3"
        self.pow2 = rng.random() < 0.6
        self.eps = F32(rng.choice([0.0, 0.0, 1.0, 3.0e4, np.uint32(1).view(F32)]))
        opts = [self.block] + (["e5m2"] if self.fmt == "e5m2" else [])
        if not self.pow2:
            opts.append("fp32-scales")
        if self.eps != 0:
            opts.append(f"eps={self.eps}")
        return "fp8-block:" + ",".join(opts)

    def model(self, x, dtype, usage):
        c = dict(block=self.block, fp8=self.fmt, pow2=self.pow2, eps=self.eps, usage=usage,
                 dtype=dtype)
        bufs, deq = FP8.quantize_block(x, c)
        return bufs, {d: v for (d, dt), v in FP8.dequantize(bufs, deq, list(x.shape), c).items()
                      if dt == "f32"}


class Mxfp8(Family):
    name = "mxfp8"

    def spec(self, rng):
        self.elem = "e5m2" if rng.random() < 0.3 else "e4m3"
        self.rule = "ocp" if rng.random() < 0.4 else "te"
        self.two_d = rng.random() < 0.3
        self.layout = "swizzled" if rng.random() < 0.4 else "compact"
        return MX.spec_of(self.elem, self.rule, self.two_d, self.layout)

    def shape(self, rng):
        return random_shape(rng, 32, 32)

    def model(self, x, dtype, usage):
        m, k = x.size // x.shape[-1], x.shape[-1]
        x32 = x.astype(F32).reshape(m, k)
        # The model's kernel choice (which decides the sign of a zero) is TE's for both
        # directions; TE's dispatch for one direction, as docs/formats/mxfp8.md quotes it:
        # rowwise only takes the cast-only kernel where K % 128 == 0 and ceil(M/4) <=
        # 65535, columnwise only never does.
        both = MX_FAST

        def fast(rule, two_d, in_dtype, rows):
            if usage == "both":
                return both(rule, two_d, in_dtype, rows)
            return (usage == "rowwise" and rule == "te" and not two_d
                    and in_dtype in ("bf16", "f16") and k % 128 == 0 and -(-rows // 4) <= 65535)

        MX.te_fast_kernel = fast
        try:
            bufs, (rc, cc) = MX.quantize(x32, m, k, self.elem, self.rule, self.two_d,
                                         self.layout, dtype)
        finally:
            MX.te_fast_kernel = both
        bufs = {n: (v.reshape(x.shape) if n.endswith("_data") else v) for n, v in bufs.items()
                if usage == "both" or n.startswith(usage)}
        deq = {}
        for d, codes in (("rowwise", rc), ("columnwise", cc)):
            if usage in ("both", d):
                deq[d] = MX.dequantize(bufs[f"{d}_data"].reshape(m, k), codes, d,
                                       self.elem).reshape(x.shape)
        return bufs, deq


MX_FAST = MX.te_fast_kernel


def nvfp4_dequantize(codes_packed, scales_compact, amax_vec, rows, cols, e4m3_max):
    """`tests/golden/nvfp4.py::dequantize` with quantfmt's documented change to TE's
    arithmetic (`fmt_nvfp4::scale::dequant_factor`): where the f32 factor `(sdb * amax) *
    (1 / (6 * e4m3_max))` overflows for a finite amax (an amax within 448x of f32::MAX),
    TE's infinite factor turns every zero code into NaN; quantfmt recomputes that factor
    in f64. Elsewhere the model's own result is returned unchanged."""
    out = NV_DEQUANTIZE(codes_packed, scales_compact, amax_vec, rows, cols, e4m3_max)
    sdb = scales_compact[:rows, : cols // NV.BLOCK]
    a = np.asarray(amax_vec, dtype=F32)
    a = a.reshape(-1, 1) if a.size > 1 else a.reshape(1, 1)
    with np.errstate(all="ignore"):
        f32 = (NV.e4m3_value(sdb) * a) * (F32(1.0) / F32(6 * e4m3_max))
        f64 = ((NV.e4m3_value(sdb).astype(np.float64) * a.astype(np.float64))
               * np.float64(F32(1.0) / F32(6 * e4m3_max))).astype(F32)
    redo = ~np.isfinite(f32) & np.isfinite(np.broadcast_to(a, f32.shape))
    if redo.any():
        vals = NV.E2M1_VALUES[NV.unpack(codes_packed)].reshape(rows, cols // NV.BLOCK, NV.BLOCK)
        fixed = (vals * np.where(redo, f64, f32)[:, :, None]).reshape(rows, cols).astype(F32)
        out = fixed
    return out


def rht_inverse_f64(y):
    """`tests/golden/nvfp4.py::inverse_rht_rows` without its last rounding: quantfmt
    rounds the f64 sums once to the output dtype, so a bf16 expectation must come from
    them, not from the f32 result (two roundings)."""
    rows, n = y.shape
    r = NV.rht_matrix().astype(np.float64)
    yb = y.astype(np.float64).reshape(rows, n // NV.BLOCK, NV.BLOCK)
    acc = np.zeros_like(yb)
    for j in range(NV.BLOCK):
        acc = acc + yb[:, :, j:j + 1] * r[:, j]
    out = acc.reshape(rows, n)
    assert (canon(out.astype(F32)) == canon(RHT_INVERSE(y))).all()
    return out


NV_DEQUANTIZE, RHT_INVERSE = NV.dequantize, NV.inverse_rht_rows
NV.dequantize, NV.inverse_rht_rows = nvfp4_dequantize, rht_inverse_f64


def narrow(v, dt):
    """f32 or f64 values rounded once to `dt` ("f32", "bf16" or "f16"): f64 through its
    round-to-odd f32 (at least two more bits than bf16 or f16 needs, in their whole
    range, so the second rounding is exact)."""
    v = np.asarray(v)
    if v.dtype == np.float64:
        with np.errstate(all="ignore"):
            r = v.astype(F32)
            inexact = np.isfinite(v) & (r.astype(np.float64) != v)
            away = inexact & (np.abs(r.astype(np.float64)) > np.abs(v))
            bits = r.view(np.uint32).copy()
            bits[away] -= np.uint32(1)
            bits[inexact] |= np.uint32(1)
            v = bits.view(F32)
    with np.errstate(all="ignore"):
        return v.astype(F32).astype(DT[dt])


class Nvfp4(Family):
    name = "nvfp4"

    def usage(self, rng):
        if "row-scaled" in self.opts:
            # TE's row-scaled NVFP4 needs rowwise usage, and its 4over6 kernel takes no
            # per-column amaxes (quantfmt refuses both, naming the rule).
            fos = any(o.startswith("4over6") for o in self.opts)
            return "rowwise" if fos else str(rng.choice(["rowwise", "both"]))
        if "2d" in self.opts and any(o.startswith("4over6") for o in self.opts):
            # TE's 4over6 2-D quantization needs rowwise output.
            return str(rng.choice(["rowwise", "both"]))
        return str(rng.choice(["rowwise", "columnwise", "both"]))

    def spec(self, rng):
        base = str(rng.choice(["1d", "1d", "2d", "rht", "row-scaled"]))
        opts = [] if base == "1d" else [base]
        fos = base != "rht" and rng.random() < 0.4
        if fos:
            opts.append(str(rng.choice(["4over6", "4over6=mse"])))
            if rng.random() < 0.3:
                opts.append("e4m3max=256")
        if rng.random() < 0.3:
            opts.append("swizzled")
        # The model's options; stochastic rounding is checked against its nearest codes
        # (not with row scaling or 4over6, which TE refuses).
        self.opts = opts
        self.sr = base != "row-scaled" and not fos and rng.random() < 0.25
        if self.sr:
            opts = opts + [str(rng.choice(["sr", f"seed={int(rng.integers(0, 2**63))}"]))]
        return "nvfp4" + (":" + ",".join(opts) if opts else "")

    def shape(self, rng):
        return random_shape(rng, 16, 16)

    def dtypes(self):
        return ["bf16"] if "rht" in self.opts else ["f32", "bf16", "f16"]

    def compare(self, name, got, want):
        """Stochastic rounding's codes come from a random stream the model lacks: each
        must be the model's nearest code or the grid value next to it on either side,
        with the same sign or zero (the two neighbours of the scaled value are the
        nearest and one of these). Everything else matches exactly."""
        if not (self.sr and name.endswith("_data")):
            return first_difference(got, want)
        g, w = np.asarray(got).view(np.uint8).ravel(), np.asarray(want).view(np.uint8).ravel()
        if g.size != w.size:
            return f"size {got.shape} against the model's {want.shape}"
        gc = np.stack([g & 0xF, g >> 4], axis=-1).ravel()
        wc = np.stack([w & 0xF, w >> 4], axis=-1).ravel()
        # Signed grid positions: codes 0..7 are +0..+6, 8..15 are -0..-6.
        pos = lambda c: np.where(c < 8, c.astype(int), -(c.astype(int) - 8))
        ok = np.abs(pos(gc) - pos(wc)) <= 1
        bad = np.flatnonzero(~ok)
        if bad.size == 0:
            return None
        i = int(bad[0])
        return (f"{bad.size} of {gc.size} codes are not the nearest or a neighbour; first, "
                f"value {i}: quantfmt code {int(gc[i]):#x}, model's nearest {int(wc[i]):#x}")

    def model(self, x, dtype, usage):
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        dirs = {"both": ("rowwise", "columnwise")}.get(usage, (usage,))
        out = NV.reference(x2, self.opts, dirs)
        bufs, deq = {}, {}
        for n, v in out.items():
            if n.startswith("dequant_"):
                deq[n[len("dequant_"):]] = v.reshape(x.shape)
            elif n == "rowwise_data":
                bufs[n] = v.reshape(list(x.shape[:-1]) + [k // 2])
            else:
                bufs[n] = v
        return bufs, deq


class Int4Tiled(Family):
    name = "int4tiled"

    def compare(self, name, got, want):
        """A NaN qparam (an infinite input: inf - inf) has the sign numpy's x86 arithmetic
        gives it, the default NaN, negative; torch converts every NaN to a positive bf16
        (0x7FC0 on the CPU, 0x7FFF through CUDA's __float2bfloat16), as quantfmt does. The
        sign of a computed NaN is not the reference's to define: only NaN-ness is
        compared, there and in the values decoded with such a qparam ("values")."""
        return first_difference(got, want, nan_sign=name not in ("scale_and_zero", "values"))

    def usage(self, rng):
        return "rowwise"

    def spec(self, rng):
        self.group = int(rng.choice([32, 64, 128, 256]))
        self.ikt = int(rng.choice([2, 4, 8]))
        self.pad = "torchao" if rng.random() < 0.3 else "kernel"
        self.eps = I4.EPS_V2 if rng.random() < 0.6 else 1e-6
        opts = []
        if self.group != 128:
            opts.append(f"g{self.group}")
        if self.ikt != 8:
            opts.append(f"k{self.ikt}")
        if self.pad != "kernel":
            opts.append(f"pad={self.pad}")
        if self.eps != I4.EPS_V2:
            opts.append(f"eps={self.eps}")
        return "int4tiled" + (":" + ",".join(opts) if opts else "")

    def shape(self, rng):
        n = int(rng.integers(1, 200))
        k = self.group * int(rng.integers(1, max(2, 1024 // self.group + 1)))
        # [E, n, k]: experts, each packed alone.
        return (int(rng.integers(2, 4)), n // 2 + 1, k) if rng.random() < 0.2 else (n, k)

    def model(self, x, dtype, usage):
        n, k = x.shape
        n_p = I4.find_multiple(n, 8)
        k_p = I4.find_multiple(k, 1024 if self.pad == "torchao" else self.ikt * 16)
        xp = np.zeros((n_p, k_p), dtype=F32)
        xp[:n, :k] = x.astype(F32)
        u, scale, zero = I4.qparams_and_quantize(xp, self.group, self.eps,
                                                 "bf16" if dtype == "bf16" else "f32")
        pre = ((u[:, ::2] << 4) | u[:, 1::2]).astype(np.uint8)
        sz = np.stack([scale, zero], axis=-1).transpose(1, 0, 2).astype(BF16)
        bufs = {"packed_weight": I4.kernel_pack(pre, self.ikt), "scale_and_zero": sz}
        return bufs, {"rowwise": int4_dequant(u[:n, :k], scale, zero, self.group)}


def int4_dequant(u, scale, zero, group):
    """`tests/golden/int4tiled.py::exact_dequant` (`(u - 8) * scale + zero`, exact, rounded
    once to the output dtype) for a whole tensor, as f64 values that `narrow` rounds once
    to each output dtype. In f64 the product is exact (a 5-bit integer times a bf16
    scale) and so is the sum, unless the two terms' exponents are about 40 apart: those
    elements (whose two-sum error is not zero) come from the model's exact rational sum,
    rounded to f64 by rounding to odd (`odd_f64`), which `narrow`'s rounding to odd and
    then to the output dtype keep a single rounding. (Rounded to nearest f32 instead,
    as before, a sum a hair below an f16 midpoint became the midpoint and then rounded
    to even: a double rounding of the model, found by seed 78, run 78000377.)"""
    n, k = u.shape
    s = np.repeat(scale[:n, : k // group].astype(np.float64), group, axis=1)
    z = np.repeat(zero[:n, : k // group].astype(np.float64), group, axis=1)
    with np.errstate(all="ignore"):
        p = (u.astype(np.float64) - 8.0) * s
        t = p + z
        back = t - z
        err = (p - back) + (z - (t - back))
    for i in np.flatnonzero(np.isfinite(t) & (err != 0)):
        r, c = divmod(int(i), k)
        sc, ze = float(scale[r, c // group]), float(zero[r, c // group])
        t[r, c] = odd_f64(Fraction(int(u[r, c]) - 8) * Fraction(sc) + Fraction(ze))
    return t


def odd_f64(fr):
    """The finite rational `fr` rounded to f64 by rounding to odd: toward zero, then the
    last bit set where that was inexact. Rounding to odd at 53 bits and then (as
    `narrow` does) at 24 is rounding to odd at 24, and a value rounded to odd with at
    least two more bits than the target rounds to nearest as the exact value would."""
    v = float(fr)  # nearest
    if Fraction(v) == fr:
        return v
    if abs(Fraction(v)) > abs(fr):
        v = math.nextafter(v, 0.0)
    (bits,) = struct.unpack("<Q", struct.pack("<d", v))
    return struct.unpack("<d", struct.pack("<Q", bits | 1))[0]


def random_shape(rng, m_mult, k_mult):
    """A 2-D (sometimes 3-D) shape whose rows are a multiple of `m_mult` and last
    dimension of `k_mult`, ragged against 128 where the multiples allow it; one in ten
    large enough for several parallel tasks and column chunks (up to 1100 x 2200)."""
    big = rng.random() < 0.1
    k = k_mult * int(rng.integers(1, max(2, (2200 if big else 640) // k_mult)))
    m = m_mult * int(rng.integers(1, max(2, (1100 if big else 400) // m_mult)))
    if rng.random() < 0.2:
        # [E, n, k], each member's rows a multiple too (a grouped run stores them apart).
        e = int(rng.integers(2, 5))
        return (e, m_mult * int(rng.integers(1, max(2, m // m_mult // e + 1))), k)
    return (m, k)


FAMILIES = {f.name: f for f in (Fp8(), Fp8Block(), Mxfp8(), Nvfp4(), Int4Tiled())}


# --- comparison ------------------------------------------------------------------------


def canon(a, nan_sign=True):
    """Float arrays as integers, every NaN as its sign's canonical NaN (or, without
    `nan_sign`, as the positive one)."""
    a = np.asarray(a)
    if a.dtype in (BF16, np.float16, np.float32, np.float64):
        f = a.astype(F32)
        bits = f.view(np.uint32).copy()
        nan = np.isnan(f)
        sign = np.uint32(0x80000000) if nan_sign else np.uint32(0)
        bits[nan] = (bits[nan] & sign) | np.uint32(0x7FC00000)
        return bits
    return a


def first_difference(got, want, nan_sign=True):
    """None if equal (shape and bytes, NaN canonical); else a description."""
    g, w = np.asarray(got), np.asarray(want)
    if g.size != w.size:
        return f"size {g.shape} against the model's {w.shape}"
    if g.dtype.itemsize != w.dtype.itemsize and not (g.dtype.kind == "f" or g.dtype == BF16):
        return f"dtype {g.dtype} against the model's {w.dtype}"
    if g.dtype != w.dtype:
        # Both floats of different widths never happens; raw bytes of one width compare
        # through their bit patterns.
        if g.dtype.itemsize == w.dtype.itemsize:
            w = w.view(g.dtype)
        else:
            return f"dtype {g.dtype} against the model's {w.dtype}"
    cg, cw = canon(g, nan_sign).ravel(), canon(w, nan_sign).ravel()
    bad = np.flatnonzero(cg != cw)
    if bad.size == 0:
        return None
    i = int(bad[0])
    idx = np.unravel_index(i, w.shape) if w.ndim else ()
    return (f"{bad.size} of {cw.size} differ; first at {tuple(int(j) for j in idx)}: "
            f"quantfmt {g.ravel()[i]!r} (bits {int(cg[i]):#x}), model {w.ravel()[i]!r} "
            f"(bits {int(cw[i]):#x})")


def members(fam, x, dtype, usage):
    """The model of a rank-3 tensor stored member by member (a grouped tensor, or
    int4tiled's experts): each member `[n, k]` alone, buffers concatenated (the grouped
    layout's definition, `docs/grouped-and-parallel.md`), values stacked."""
    parts = [fam.model(x[e], dtype, usage) for e in range(x.shape[0])]
    bufs = {b: np.concatenate([np.asarray(p[0][b]).ravel() for p in parts]) for b in parts[0][0]}
    dq = {d: np.stack([p[1][d] for p in parts]) for d in parts[0][1]}
    return bufs, dq


def cli(exe):
    """`exe`, or the release CLI, built for the purpose."""
    if exe is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "quantfmt-cli"], cwd=ROOT,
                       check=True)
        exe = os.path.join(ROOT, "target", "release", "quantfmt")
    return exe


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


def batch(exe, fam, rng, seed, tmp, tensors_per_batch):
    """One CLI run of one spec and usage over several tensors. Returns (cases, failures,
    refusal or None)."""
    spec = fam.spec(rng)
    usage = fam.usage(rng)
    # Every rank-3 tensor of the run as a grouped tensor of its E members.
    grouped = fam.name != "int4tiled" and rng.random() < 0.3
    cases = {}
    for t in range(tensors_per_batch):
        dtype = str(rng.choice(fam.dtypes()))
        shape = fam.shape(rng)
        kind = str(rng.choice(KINDS))
        cases[f"t{t}"] = (dtype, shape, kind, content(rng, kind, shape, dtype))
    src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    save(src, {n: c[3] for n, c in cases.items()})
    cmd = [exe, "quantize", "--all", "--strict", "--usage", usage, "--format", spec, "-o", dst,
           src] + (["--grouped"] if grouped else [])
    if grouped:
        spec += " --grouped"
    rc, err = run(cmd)
    if rc != 0:
        return 0, [], f"{spec} --usage {usage}: {err.splitlines()[-1] if err else rc}"
    got = load(dst)
    deq = {}
    for dt in DEQUANT_DTYPES:
        out = os.path.join(tmp, f"deq_{dt}.safetensors")
        rc, err = run([exe, "dequantize", "--dtype", dt, "-o", out, dst])
        if rc != 0:
            return 0, [f"{spec}: dequantize --dtype {dt} failed: {err}"], None
        deq[dt] = load(out)
    failures = []
    for n, (dtype, shape, kind, x) in cases.items():
        if len(shape) == 3 and (grouped or fam.name == "int4tiled"):
            bufs, dq = members(fam, x, dtype, usage)
        else:
            bufs, dq = fam.model(x, dtype, usage)
        where = f"seed {seed} {spec} --usage {usage} {dtype} {list(shape)} {kind}"
        problems = []
        for b, want in bufs.items():
            key = f"{n}.{b}"
            if key not in got:
                problems.append(f"{b}: missing from quantfmt's output")
                continue
            d = fam.compare(b, got[key], want)
            if d:
                problems.append(f"{b}: {d}")
        if dq and not getattr(fam, "sr", False):
            direction = "rowwise" if usage in ("rowwise", "both") else "columnwise"
            want = dq[direction]
            with np.errstate(all="ignore"):
                wants = [(dt, want.astype(F32) if dt == "f32" else narrow(want, dt))
                         for dt in DEQUANT_DTYPES]
            for dt, w in wants:
                d = fam.compare("values", deq[dt][n], w)
                if d:
                    problems.append(f"dequantize {direction} {dt}: {d}")
        if problems:
            failures.append(where + "\n    " + "\n    ".join(problems))
    return len(cases), failures, None


def main():
    # The models' numpy arithmetic overflows and divides by zero on purpose (saturation,
    # infinite amaxes); its warnings are not findings.
    warnings.simplefilter("ignore", RuntimeWarning)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=200, help="CLI runs (default 200)")
    ap.add_argument("--tensors", type=int, default=6, help="tensors per run (default 6)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES),
                    help="only these formats (repeatable; default all)")
    ap.add_argument("--run-seed", type=int, help="replay the one run of this seed (as printed)")
    ap.add_argument("--exe", help="quantfmt binary (default: build the release CLI)")
    args = ap.parse_args()
    exe = cli(args.exe)
    fams = [FAMILIES[f] for f in (args.family or sorted(FAMILIES))]
    total, failures, refusals = 0, [], {}
    tmp = tempfile.mkdtemp(prefix="quantfmt-crosscheck-")
    try:
        runs = [args.run_seed] if args.run_seed is not None else [
            args.seed * 1_000_003 + b for b in range(args.batches)]
        for b, seed in enumerate(runs):
            rng = np.random.default_rng(seed)
            # The family follows from the seed, so that --run-seed (with the same
            # --family list) replays it.
            fam = fams[seed % len(fams)]
            n, f, refused = batch(exe, fam, rng, seed, tmp, args.tensors)
            total += n
            failures += f
            if refused:
                refusals[refused] = refusals.get(refused, 0) + 1
            if (b + 1) % 50 == 0:
                print(f"{b + 1} runs, {total} tensors, {len(failures)} mismatches", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r, c in sorted(refusals.items()):
        print(f"refused ({c}x): {r}")
    for f in failures:
        print("MISMATCH " + f)
    print(f"{total} tensors in {len(runs)} runs: {len(failures)} mismatches, "
          f"{sum(refusals.values())} refused runs")
    sys.exit(1 if failures or refusals else 0)


if __name__ == "__main__":
    main()
