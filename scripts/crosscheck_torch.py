#!/usr/bin/env python3
"""quantfmt against the upstream Python itself: torch and torchao on CPU, byte for byte.

The golden data in `tests/golden/` come from numpy + ml_dtypes models written from the
upstream sources. This script runs the upstream code instead, on the same inputs as the
`quantfmt quantize` command, and compares every stored byte:

* `fp8`, `fp8:e5m2`: TransformerEngine's per-tensor current scaling written in torch ops
  (amax, `scale = max / amax` in f32, `x * scale` saturated and cast with torch's
  `.to(float8_*)`, `scale_inv = 1 / scale`). Checks quantfmt's casts against torch's.
* `mxfp8:ocp`, `mxfp8:ocp,e5m2`: torchao `to_mx(x, dtype, 32, ScaleCalculationMode.FLOOR)`,
  the OCP MX rule. Expected: identical.
* `mxfp8`, `mxfp8:e5m2` (TransformerEngine's rule, `float_to_e8m0(amax * max_norm_rcp)`):
  torchao `to_mx(..., ScaleCalculationMode.RCEIL)`, which is meant to be the same rule.
  Expected: identical except where torchao's CPU fallback differs from TE's kernel; each
  differing block is listed with its amax (see the notes printed with the result).
* `int4tiled:eps=1e-6` (f32 input): torchao's v1 path, `get_groupwise_affine_qparams`
  and `groupwise_affine_quantize_tensor_from_qparams`, packed the same way, with
  `tensor / number` evaluated as PyTorch's CUDA kernel does (a reciprocal multiply; CPU
  torch divides, which moves about one zero point in a thousand by a bf16 ulp).
* `int4tiled:pad=torchao` (bf16 input): torchao `_choose_qparams_affine_tinygemm` and
  `_quantize_affine_tinygemm`, exactly as `Int4TilePackedTo4dTensor.from_hp` calls them,
  then the CUDA packing kernel as ported in `tests/golden/int4tiled.py` (torch's
  `_convert_weight_to_int4pack` itself runs only on CUDA). scale_and_zero is compared as
  stored.

* `nvfp4[:2d],swizzled` (both directions): the swizzled scale layout only, as torchao's
  `to_blocked` of quantfmt's own compact scales. NVFP4's bytes are not compared with
  torchao's `nvfp4_quantize`: it is a different recipe from TE's (block scale
  `amax / 6 / per_tensor_scale`, data divided by the product of the scales), and quantfmt
  follows TE.

Needs torch, torchao, safetensors, numpy, ml_dtypes (`pip install torch torchao safetensors
numpy ml_dtypes`) and builds the release CLI. Exit status 1 on any unexplained mismatch.

    python3 scripts/crosscheck_torch.py             # 256 x 2048, bf16 and f32
    python3 scripts/crosscheck_torch.py --rows 1024 --seed 7
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def golden_int4():
    """tests/golden/int4tiled.py as a module (its packing-kernel port)."""
    path = os.path.join(ROOT, "tests", "golden", "int4tiled.py")
    spec = importlib.util.spec_from_file_location("golden_int4tiled", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- inputs ----------------------------------------------------------------------------


def make_input(rows, cols, seed):
    """f32 [rows, cols]: normal values whose row magnitudes sweep 2^-30 .. 2^30, and rows
    built to sit on the rules' edges (see each block below). No NaN or infinity: torch's
    amax propagates NaN, which the formats' rules handle each in their own way."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= np.exp2(np.linspace(-30, 30, rows, dtype=np.float32))[:, None]
    # Every 32-value block of row 1 has an amax that is an exact power of two, and of
    # row 2 an amax of 448 * 2^k (where amax / 448 is exactly a power of two: the
    # boundary of the ceiling rules). Row 3: 1.75 * 2^k (57344 / 2^15 = 1.75, E5M2's).
    for r, mant in ((1, 1.0), (2, 448.0), (3, 1.75)):
        blocks = x[r].reshape(-1, 32)
        for b, blk in enumerate(blocks):
            e = (b % 40) - 20
            blk[:] = np.clip(blk, -0.9, 0.9) * np.float32(mant * 2.0**e)
            blk[b % 32] = np.float32(mant * 2.0**e) * (1 if b % 2 else -1)
    # Row 4: zero blocks next to tiny ones (subnormal f32 amaxes).
    x[4] = 0.0
    x[4, 64:96] = np.float32(2.0**-140) * rng.integers(-8, 9, 32)
    # Row 5: integers, so that many scaled values fall exactly between two codes.
    x[5] = rng.integers(-448, 449, cols).astype(np.float32)
    # Row 6: signed zeros among ordinary values.
    x[6, ::7] = -0.0
    x[6, 3::7] = 0.0
    return x


def run_quantfmt(exe, spec, inputs, workdir, usage="rowwise"):
    """Quantizes every tensor of `inputs` (name -> torch tensor) with `spec` for `usage`;
    returns a function (name, buffer) -> torch tensor."""
    src = os.path.join(workdir, "in.safetensors")
    dst = os.path.join(workdir, "out.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, src)
    res = subprocess.run(
        [exe, "quantize", "--all", "--strict", "--usage", usage, "--format", spec, "-o", dst, src],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"quantfmt quantize --format {spec} --usage {usage} failed:\n{res.stderr}")
    f = safe_open(dst, "pt")
    return lambda name, buf: f.get_tensor(f"{name}.{buf}")


# --- references (upstream code) --------------------------------------------------------


FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def torch_fp8_per_tensor(x, dtype):
    """TE's per-tensor current scaling in torch ops: (codes as uint8, scale_inv)."""
    fp8, fmax = FP8[dtype]
    xf = x.float()
    amax = xf.abs().amax()
    scale = torch.tensor(fmax, dtype=torch.float32) / amax if amax > 0 else torch.tensor(1.0)
    data = (xf * scale).clamp(-fmax, fmax).to(fp8).view(torch.uint8)
    return data, (1.0 / scale).reshape(1)


def torchao_mx(x, dtype, mode):
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx

    fp8, _ = FP8[dtype]
    scale, data = to_mx(x, fp8, 32, getattr(ScaleCalculationMode, mode))
    return data.view(torch.uint8), scale.view(torch.uint8).reshape(x.shape[0], -1)


def torchao_int4(x, g, golden):
    """What Int4TilePackedTo4dTensor.from_hp computes before and after its CUDA-only pack."""
    from torchao.quantization.quant_primitives import (
        MappingType,
        _choose_qparams_affine_tinygemm,
        _quantize_affine_tinygemm,
    )

    n, k = x.shape
    k_p, n_p = golden.find_multiple(k, 1024), golden.find_multiple(n, 8)
    xp = torch.nn.functional.pad(x, (0, k_p - k, 0, n_p - n))
    scale, zero = _choose_qparams_affine_tinygemm(
        xp, MappingType.ASYMMETRIC, (1, g), torch.int32, 0, 15,
        scale_dtype=x.dtype, zero_point_dtype=x.dtype,
    )
    q = _quantize_affine_tinygemm(xp, [1, g], scale, zero, torch.int32, 0, 15)
    q = q.to(torch.uint8)
    prepacked = (q[:, ::2] << 4 | q[:, 1::2]).numpy()
    packed = golden.kernel_pack(prepacked, 8)
    sz = torch.stack([scale.reshape(n_p, -1), zero.reshape(n_p, -1)], -1).transpose(0, 1)
    return torch.from_numpy(packed), sz.contiguous()


def torchao_int4_v1(x, g, golden):
    """torchao's v1 int4 weight path on f32 (`Int4WeightOnlyConfig` before v2): qparams in
    f32 cast to bf16, the quantize from them, then the CUDA pack's port."""
    from torchao.quantization.utils import (
        get_groupwise_affine_qparams,
        groupwise_affine_quantize_tensor_from_qparams,
        pack_tinygemm_scales_and_zeros,
    )

    with cuda_scalar_division():
        scale, zero = get_groupwise_affine_qparams(x, 4, g, torch.bfloat16)
        q = groupwise_affine_quantize_tensor_from_qparams(x, scale, zero, 4, g)
    q = q.to(torch.uint8)  # on CPU the values come back unpacked
    packed = golden.kernel_pack((q[:, ::2] << 4 | q[:, 1::2]).numpy(), 8)
    return torch.from_numpy(packed), pack_tinygemm_scales_and_zeros(scale, zero)


class cuda_scalar_division:
    """Within this block, `tensor / python_number` follows PyTorch's CUDA kernel for f32:
    `tensor * (1.0f / number)` (`BinaryDivTrueKernel.cu`), where CPU torch divides. The
    tinygemm pipeline only runs on CUDA, so its f32 qparams (`(max - min) / 15.0`) are
    CUDA's, which quantfmt follows (`docs/formats/int4tiled.md`); for bf16 CPU torch
    already multiplies by the reciprocal."""

    def __enter__(self):
        self.div = torch.Tensor.__truediv__

        def div(a, b):
            if isinstance(b, (int, float)) and a.dtype == torch.float32:
                return a * torch.tensor(1.0 / b, dtype=torch.float32)
            return self.div(a, b)

        torch.Tensor.__truediv__ = div

    def __exit__(self, *exc):
        torch.Tensor.__truediv__ = self.div


def load_te_nvfp4_reference(checkout):
    """TransformerEngine's NVFP4 Python oracle (`custom_recipes/reference_nvfp4.py`) from a
    TE source checkout, without building TE: the two TE modules it imports only for its
    class bases and its GEMM helper are stubbed; `reference_utils.py` is loaded as is."""
    import types

    base = os.path.join(checkout, "transformer_engine", "pytorch", "custom_recipes")

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    class Quantizer:  # the oracle's base: only the usage flags are read
        def __init__(self, rowwise=True, columnwise=True):
            self.rowwise_usage, self.columnwise_usage = rowwise, columnwise

    for name in ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.custom_recipes"):
        sys.modules.setdefault(name, types.ModuleType(name))
    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")
    qt.Quantizer, qt.QuantizedTensorStorage = Quantizer, object
    sys.modules[qt.__name__] = qt
    class Anything:  # stands for the GEMM helper's names, which appear in signatures only
        def __getattr__(self, name):
            return Anything()

    gemm = types.ModuleType("gemm")
    gemm.__getattr__ = lambda name: Anything()
    sys.modules["transformer_engine.pytorch.custom_recipes.gemm"] = gemm
    utils = load("transformer_engine.pytorch.custom_recipes.reference_utils", os.path.join(base, "reference_utils.py"))
    sys.modules["transformer_engine.pytorch.custom_recipes"].reference_utils = utils
    sys.modules["transformer_engine.pytorch.custom_recipes"].gemm = sys.modules["transformer_engine.pytorch.custom_recipes.gemm"]
    return load("te_reference_nvfp4", os.path.join(base, "reference_nvfp4.py"))


# quantfmt spec -> the oracle's constructor arguments (and whether it needs bf16 input).
NVFP4_SPECS = {
    "nvfp4": (dict(quant_tile_shape=(1, 16)), False),
    "nvfp4:2d": (dict(quant_tile_shape=(16, 16)), False),
    "nvfp4:rht": (dict(quant_tile_shape=(1, 16), with_rht=True), True),
    "nvfp4:row-scaled": (dict(quant_tile_shape=(1, 16), row_scaled_nvfp4=True), False),
    "nvfp4:4over6": (dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True), False),
    "nvfp4:4over6=mse": (dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True, nvfp4_4over6_err_mode="MSE"), False),
    "nvfp4:4over6,e4m3max=256": (dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True, nvfp4_e4m3_max=256), False),
    "nvfp4:2d,4over6": (dict(quant_tile_shape=(16, 16), nvfp4_use_4over6=True), False),
}


def nvfp4_negative_zero_explained(x, transposed):
    """The one documented difference from TE's Python oracle in these checks
    (`docs/formats/nvfp4.md`): an input `-0.0` (not rotated) is code `0x8` in quantfmt and
    TE's kernels (`cvt.rn.satfinite.e2m1x2.f32` keeps the sign) and code 0 in the oracle,
    whose threshold table tests `x < -0.0`."""
    xs = x.t() if transposed else x

    def explain(what, i):
        if what != "data":
            return False
        r, byte = i
        pair = xs[r, 2 * byte : 2 * byte + 2].float()
        return bool(any(v == 0.0 and np.signbit(v) for v in pair.tolist()))

    return explain


def check_nvfp4(ref, exe, inputs, work):
    bad = 0
    for spec, (kwargs, bf16_only) in NVFP4_SPECS.items():
        ins = {k: v for k, v in inputs.items() if k == "bf16" or not bf16_only}
        got = run_quantfmt(exe, spec, ins, work, usage="both")
        for name, x in ins.items():
            q = ref.NVFP4QuantizerRef(ref.reference_utils.Fp4Formats.E2M1, **kwargs)
            qx, sx, qx_t, sx_t, amax_r, amax_c = q._quantize(x)
            pairs_r = [
                ("data", got(name, "rowwise_data"), qx),
                ("scales", logical(got(name, "rowwise_scale_inv"), sx).view(torch.float8_e4m3fn), sx),
                ("amax", got(name, "amax_rowwise").reshape(-1), amax_r.reshape(-1)),
            ]
            pairs_c = [
                ("data", got(name, "columnwise_data"), qx_t),
                ("scales", logical(got(name, "columnwise_scale_inv"), sx_t).view(torch.float8_e4m3fn), sx_t),
                ("amax", got(name, "amax_columnwise").reshape(-1), amax_c.reshape(-1)),
            ]
            rotated = kwargs.get("with_rht", False)
            bad += report(f"{spec} {name} rowwise", pairs_r, nvfp4_negative_zero_explained(x, False))
            bad += report(
                f"{spec} {name} columnwise",
                pairs_c,
                None if rotated else nvfp4_negative_zero_explained(x, True),
            )
    return bad


def load_te_blockwise_reference(checkout):
    """TE's FP8 block-scaling test reference (`tests/pytorch/references/
    blockwise_quantizer_reference.py`, with the `quantize_scale_calc.py` it imports)."""
    base = os.path.join(checkout, "tests", "pytorch", "references")
    loaded = {}
    for name in ("quantize_scale_calc", "blockwise_quantizer_reference"):
        full = f"references.{name}"
        spec = importlib.util.spec_from_file_location(full, os.path.join(base, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        loaded[name] = mod
    return loaded["blockwise_quantizer_reference"].BlockwiseQuantizerReference


def check_fp8_block(reference, exe, inputs, work):
    """fp8-block recipes against TE's reference, in the GEMM-ready (munged) scale shapes
    quantfmt stores: scale_inv per block, data in both directions."""
    bad = 0
    for tile in ("1x128", "128x128"):
        for opts, pow2, dtype in (("", True, "e4m3"), (",fp32-scales", False, "e4m3"), (",e5m2", True, "e5m2")):
            spec = f"fp8-block:{tile}{opts}"
            got = run_quantfmt(exe, spec, inputs, work, usage="both")
            shape = (1, 128) if tile == "1x128" else (128, 128)
            for name, x in inputs.items():
                r = reference().quantize(
                    x, FP8[dtype][0], return_transpose=True, pow_2_scales=pow2, quant_tile_shape=shape
                )
                bad += report(f"{spec} {name}", [
                    ("rowwise data", got(name, "rowwise_data"), r.data.view(torch.uint8)),
                    ("rowwise scale_inv", got(name, "rowwise_scale_inv"), r.scale),
                    ("columnwise data", got(name, "columnwise_data"), r.data_t.view(torch.uint8)),
                    ("columnwise scale_inv", got(name, "columnwise_scale_inv"), r.scale_t),
                ])
    return bad


# --- comparison ------------------------------------------------------------------------


def logical(scales, like):
    """The logical corner of a compact scale buffer: TE pads it to 128 rows and 4 columns
    (or 4 rows and 128 columns, columnwise), torchao does not."""
    return scales[: like.shape[0], : like.shape[1]]


def differing(a, b):
    """Indices where two same-shape tensors differ bitwise (floats compared as bits)."""
    a, b = a.contiguous(), b.contiguous()
    if a.shape != b.shape:
        raise SystemExit(f"shape mismatch: quantfmt {tuple(a.shape)} vs reference {tuple(b.shape)}")
    if a.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
        a, b = a.view(width), b.view(width)
    return torch.nonzero(a != b)


def report(label, pairs, explain=None):
    """Prints one line per check; returns the number of unexplained differences."""
    bad = 0
    parts = []
    for what, got, want in pairs:
        idx = [tuple(i.tolist()) for i in differing(got, want)]
        unexplained = [i for i in idx if explain is None or not explain(what, i)]
        explained = len(idx) - len(unexplained)
        note = f" ({explained} documented differences)" if explained else ""
        parts.append(f"{what} {got.numel() - len(idx)}/{got.numel()} equal{note}")
        for i in unexplained[:5]:
            print(f"    {label} {what} at {i}: quantfmt {got[i]!r}, reference {want[i]!r}")
        bad += len(unexplained)
    status = "ok" if bad == 0 else f"{bad} UNEXPLAINED"
    print(f"  {label:<34} {', '.join(parts)}: {status}")
    return bad


def ceil_code(v):
    """E8M0 code of the exact ceil(log2(v)) of an f32 `v >= 0` (TE's `float_to_e8m0`)."""
    if v == 0:
        return 0
    m, e = np.frexp(np.float64(v))  # v = m * 2^e, m in [0.5, 1)
    return int(np.clip((e if m > 0.5 else e - 1) + 127, 0, 254))


def rceil_codes(amax, fmax):
    """(TE's code, torchao's eager RCEIL code) of a block max: TE rounds
    `amax * float(1/max)` up to a power of two exactly; torchao's CPU fallback takes
    `ceil(torch.log2(amax / max))` in f32, whose log2 rounds to an integer (losing the
    ceiling) when the quotient lies less than about 2^-21 above a power of two."""
    a = np.float32(amax)
    te = ceil_code(a * (np.float32(1.0) / np.float32(fmax)))
    lg = torch.log2(torch.tensor(a / np.float32(fmax))).item()
    ao = 0 if lg == -np.inf else int(np.clip(np.ceil(lg), -127, 127)) + 127
    return te, ao


def mx_explained(x, scales, mode, fmax, flushes_negative_zero):
    """The documented differences of MXFP8 bytes from torchao's `to_mx`
    (`docs/formats/mxfp8.md`, "Against torchao"); nothing else is excused:

    * a block whose scale code is 0 (amax below about 2^(emax - 126)) and whose element is
      not zero: TE's `exp2f_rcp(0)` and the OCP spec multiply by 2^127, torchao FLOOR by
      2^126 (it clamps the scale to the smallest normal f32) and torchao RCEIL by 1;
    * an element `-0.0` under the TE rule where TE's cast-only kernel stores `+0`
      (`Mxfp8Quantizer::flushes_negative_zero`); torchao keeps the sign;
    * RCEIL: a block whose TE code and torchao code differ ([`rceil_codes`]), provided
      quantfmt stored TE's.
    """
    xf = x.float()
    amax = xf.abs().reshape(x.shape[0], -1, 32).amax(-1)

    def explain(what, i):
        r, c = i
        b = c // 32 if what == "data" else c
        if mode == "RCEIL":
            te, ao = rceil_codes(float(amax[r, b]), fmax)
            if te != ao and int(scales[r, b]) == te:
                return True
        if what != "data":
            return False
        v = float(xf[r, c])
        if v != 0.0 and int(scales[r, b]) == 0:
            return True
        negative_zero = v == 0.0 and np.signbit(v)
        return bool(mode == "RCEIL" and flushes_negative_zero and negative_zero)

    return explain


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--te-checkout",
        help="a TransformerEngine source checkout: also compare NVFP4 with its Python oracle",
    )
    a = ap.parse_args()
    if a.cols % 1024:
        raise SystemExit("--cols must be a multiple of 1024 (torchao's int4 padding)")

    subprocess.run(["cargo", "build", "--release", "-q", "-p", "quantfmt-cli"], cwd=ROOT, check=True)
    exe = os.path.join(ROOT, "target", "release", "quantfmt")
    import torchao

    print(f"torch {torch.__version__}, torchao {torchao.__version__}; input {a.rows}x{a.cols}, seed {a.seed}")
    x32 = torch.from_numpy(make_input(a.rows, a.cols, a.seed))
    inputs = {"f32": x32, "bf16": x32.to(torch.bfloat16)}
    golden = golden_int4()
    bad = 0
    with tempfile.TemporaryDirectory() as work:
        for dtype in ("e4m3", "e5m2"):
            spec = "fp8" if dtype == "e4m3" else "fp8:e5m2"
            got = run_quantfmt(exe, spec, inputs, work)
            for name, x in inputs.items():
                data, sinv = torch_fp8_per_tensor(x, dtype)
                bad += report(f"{spec} {name}", [
                    ("data", got(name, "rowwise_data"), data),
                    ("scale_inv", got(name, "scale_inv"), sinv),
                ])
        for dtype in ("e4m3", "e5m2"):
            for spec, mode in ((f"mxfp8:ocp,{dtype}", "FLOOR"), (f"mxfp8:{dtype}", "RCEIL")):
                got = run_quantfmt(exe, spec, inputs, work)
                for name, x in inputs.items():
                    data, scales = torchao_mx(x, dtype, mode)
                    ours = logical(got(name, "rowwise_scale_inv"), scales)
                    # TE's cast-only kernel (bf16 rowwise, K % 128 == 0) flushes -0.
                    flushes = name == "bf16" and a.cols % 128 == 0
                    bad += report(f"{spec} {name} vs to_mx {mode}", [
                        ("data", got(name, "rowwise_data"), data),
                        ("scales", ours, scales),
                    ], mx_explained(x, ours, mode, FP8[dtype][1], flushes))
        # Both directions and the swizzled scale layout (OCP rule, bit-exact with torchao
        # away from code-0 blocks): the columnwise operand is torchao's dim-1 cast
        # `to_mx(x.t())` stored untransposed ([M, K] data, [M/32, K] scales), and the
        # swizzled scales are torchao's `to_blocked` (cuBLAS's 128x4 layout) of the
        # rowwise [M, K/32] and columnwise [K, M/32] scale matrices.
        from torchao.prototype.mx_formats.utils import to_blocked

        for layout in ("compact", "swizzled"):
            spec = "mxfp8:ocp" + (",swizzled" if layout == "swizzled" else "")
            got = run_quantfmt(exe, spec, inputs, work, usage="both")
            for name, x in inputs.items():
                rd, rs = torchao_mx(x, "e4m3", "FLOOR")
                cd, cs = torchao_mx(x.t().contiguous(), "e4m3", "FLOOR")
                if layout == "swizzled":
                    pairs = [
                        ("rowwise scales", got(name, "rowwise_scale_inv").flatten(), to_blocked(rs)),
                        ("columnwise scales", got(name, "columnwise_scale_inv").flatten(), to_blocked(cs)),
                    ]
                else:
                    pairs = [
                        ("rowwise data", got(name, "rowwise_data"), rd),
                        ("rowwise scales", logical(got(name, "rowwise_scale_inv"), rs), rs),
                        ("columnwise data", got(name, "columnwise_data"), cd.t().contiguous()),
                        ("columnwise scales", logical(got(name, "columnwise_scale_inv"), cs.t()), cs.t().contiguous()),
                    ]
                bad += report(f"{spec} both {name} vs to_mx FLOOR", pairs)
        # NVFP4's swizzled scales are the same cuBLAS layout over 16-value blocks: torchao's
        # `to_blocked` of quantfmt's own compact scales (rowwise [M, K/16], columnwise of
        # the transpose [K, M/16]) must give quantfmt's swizzled bytes.
        for spec in ("nvfp4", "nvfp4:2d"):
            compact = run_quantfmt(exe, spec, inputs, work, usage="both")
            cols = {n: {d: compact(n, f"{d}_scale_inv").clone() for d in ("rowwise", "columnwise")} for n in inputs}
            swizzled = spec + (",swizzled" if ":" in spec else ":swizzled")
            swz = run_quantfmt(exe, swizzled, inputs, work, usage="both")
            for name, x in inputs.items():
                m, k = x.shape
                pairs = []
                for d, (r, c) in (("rowwise", (m, k // 16)), ("columnwise", (k, m // 16))):
                    want = to_blocked(cols[name][d][:r, :c].contiguous())
                    pairs.append((f"{d} scales", swz(name, f"{d}_scale_inv").flatten(), want))
                bad += report(f"{swizzled} both {name} vs to_blocked", pairs)
        got = run_quantfmt(exe, "int4tiled:pad=torchao", {"bf16": inputs["bf16"]}, work)
        packed, sz = torchao_int4(inputs["bf16"], 128, golden)
        bad += report("int4tiled:pad=torchao bf16", [
            ("packed_weight", got("bf16", "packed_weight"), packed.reshape(got("bf16", "packed_weight").shape)),
            ("scale_and_zero", got("bf16", "scale_and_zero"), sz),
        ])
        # f32 input: torchao's v1 path (`get_groupwise_affine_qparams`, eps 1e-6, then
        # `groupwise_affine_quantize_tensor_from_qparams`), which quantfmt follows for f32
        # (`docs/formats/int4tiled.md`); no padding at these shapes.
        got = run_quantfmt(exe, "int4tiled:eps=1e-6", {"f32": inputs["f32"]}, work)
        packed, sz = torchao_int4_v1(inputs["f32"], 128, golden)
        bad += report("int4tiled:eps=1e-6 f32 (v1, CUDA's x / 15)", [
            ("packed_weight", got("f32", "packed_weight"), packed.reshape(got("f32", "packed_weight").shape)),
            ("scale_and_zero", got("f32", "scale_and_zero"), sz),
        ])
        if a.te_checkout:
            bad += check_fp8_block(load_te_blockwise_reference(a.te_checkout), exe, inputs, work)
            bad += check_nvfp4(load_te_nvfp4_reference(a.te_checkout), exe, inputs, work)
        else:
            print("  fp8-block and nvfp4 against TE's references: skipped (pass --te-checkout)")
    print("all equal or explained" if bad == 0 else f"{bad} unexplained differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
