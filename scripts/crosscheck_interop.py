#!/usr/bin/env python3
"""quantfmt's checkpoint reader against the golden producer models on random weights.

`tests/golden/interop.py` makes a few fixed checkpoints the way their producers make them
(NVIDIA ModelOpt, compressed-tensors, DeepSeek-V3), and `interop_golden.rs` checks that
quantfmt rebuilds the expected TransformerEngine buffers from each. This script draws
random ones instead: weight shapes, magnitudes from 1e-36 to 1e30 (tiny amaxes put the
producers' f32 scalars among the subnormals, where recovering the amax a scalar came from
is hardest), outlier columns and zero blocks, several weights per file. Each file is made
with the producer functions of `tests/golden/interop.py` (imported, not copied) and read by
`quantfmt convert --to native`; every rebuilt buffer is compared byte for byte with the
model's, and `quantfmt dequantize --dtype f32` value for value with TE's dequantization
of the model's buffers (`native_*` there). The producers' own dequantization is checked
too: within 4 ulps for NVFP4 (the roundings of the per-block factor differ,
`docs/interop.md`), exact for the others.

Some weights are all zero. The producers divide by the zero amax: the FP8 files then hold
a `+0` scale and NaN codes, which quantfmt reads as they are (`docs/interop.md`), and the
NVFP4 files hold NaN block scales, which quantfmt refuses. A file holding such a weight
must be refused with an error naming it and saying its amax is 0, and one without must
convert.

Not covered: the writers (`--to modelopt` etc.), whose round trip
`interop_roundtrip.rs` checks.

Needs numpy, ml_dtypes and safetensors (`pip install -r tests/golden/requirements.txt`)
and builds the release CLI. Exit status 1 on any mismatch or refusal.

    python3 scripts/crosscheck_interop.py                  # 200 files, seed 1
    python3 scripts/crosscheck_interop.py --files 2000 --seed 4 --layout deepseek
    python3 scripts/crosscheck_interop.py --file-seed 4000017   # replay one file
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import warnings

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn


# The other cross-check: its golden-module loader, safetensors reader and writer,
# comparison rules and CLI runner.
_spec = importlib.util.spec_from_file_location(
    "crosscheck_golden", os.path.join(ROOT, "scripts", "crosscheck_golden.py"))
CC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CC)
IO = CC.golden("interop")

MODELOPT = lambda algo, extra=None: {  # noqa: E731
    "producer": {"name": "modelopt", "version": "0.0.0-crosscheck"},
    "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": [],
                     **(extra or {})}}
CT = lambda fmt, extra=None: {  # noqa: E731
    "quant_method": "compressed-tensors", "format": fmt, **(extra or {})}
CT_NVFP4 = CT("nvfp4-pack-quantized", {
    "quantization_status": "compressed", "ignore": [],
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
                                  "weights": {"num_bits": 4, "type": "float",
                                              "strategy": "tensor_group", "group_size": 16,
                                              "symmetric": True, "dynamic": False}}}})
DEEPSEEK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]}

# layout -> (config, (row multiple, column multiple))
LAYOUTS = {
    # NVFP4 rows a multiple of 16 too: TE's shape rule, which quantfmt keeps (another row
    # count is refused with an error naming it).
    "modelopt_nvfp4": (MODELOPT("NVFP4", {"group_size": 16}), (16, 16)),
    "ct_nvfp4": (CT_NVFP4, (16, 16)),
    "modelopt_fp8": (MODELOPT("FP8"), (1, 1)),
    "ct_fp8": (CT("float-quantized"), (1, 1)),
    "ct_fp8_block": (CT("float-quantized"), (1, 1)),
    "deepseek": (DEEPSEEK, (1, 1)),
    "modelopt_mxfp8": (MODELOPT("MXFP8", {"group_size": 32}), (32, 32)),
    "ct_mxfp8": (CT("mxfp8-quantized"), (32, 32)),
}


def weights(rng, shape):
    """bf16 weights (as f32): Student-t values of a random magnitude, outlier columns,
    sometimes zero blocks; one in 25 all zero."""
    if rng.random() < 0.04:
        return np.zeros(shape, F32)
    std = F32(10.0 ** rng.uniform(-36, 30))
    zero = None
    if rng.random() < 0.4:
        m, k = shape
        zero = (int(rng.integers(0, m)), int(rng.integers(0, k)), int(rng.integers(1, 64)),
                int(rng.integers(1, 64)))
    outlier = shape[1] > 3 and rng.random() < 0.7
    x = IO.bf16_weights(rng, shape, std=std, outlier=outlier, zero_block=zero)
    if not np.abs(x).max() > 0:
        x.flat[0] = std
    return x


def make(layout, name, x):
    """The producer's tensors for weight `name` (name -> array), the native buffers the
    model expects quantfmt to rebuild, TE's dequantization of them, and the producer's
    own dequantization."""
    m, k = x.shape
    base = name[: -len(".weight")]
    if layout == "modelopt_nvfp4":
        packed, ws, s2, deq = IO.modelopt_nvfp4(x)
        amax = IO.amax_from(s2, lambda a: F32(a / F32(2688.0)), F32(s2 * F32(2688.0)),
                            float(s2) * 2688.0)
        bufs, native = IO.native_nvfp4(packed, ws, amax, m, k)
        t = {name: packed, name + "_scale": ws.view(E4M3), name + "_scale_2": np.array(s2, F32)}
        return t, bufs, native, deq
    if layout == "ct_nvfp4":
        packed, ws, gs, deq = IO.ct_nvfp4(x)
        if gs == 1.0 and not ws.any():
            amax = F32(0.0)
        else:
            amax = IO.amax_from(gs, IO.te_global_encode, F32(F32(2688.0) / gs),
                                2688.0 / float(gs))
        bufs, native = IO.native_nvfp4(packed, ws, amax, m, k)
        t = {base + ".weight_packed": packed, base + ".weight_scale": ws.view(E4M3),
             base + ".weight_global_scale": np.array([gs], F32)}
        return t, bufs, native, deq
    if layout in ("modelopt_fp8", "ct_fp8"):
        q, s, deq = IO.fp8_tensor(x)
        shape = () if layout == "modelopt_fp8" else (1,)
        t = {name: q.view(E4M3), name + "_scale": np.array(s, F32).reshape(shape)}
        return t, {"rowwise_data": q, "scale_inv": np.array([s], F32)}, deq, deq
    if layout in ("ct_fp8_block", "deepseek"):
        q, s, deq = IO.fp8_block(x)
        suffix = "_scale_inv" if layout == "deepseek" else "_scale"
        t = {name: q.view(E4M3), name + suffix: s}
        if layout == "ct_fp8_block" and s.size == 1:
            # One tile: compressed-tensors' one-element block scale reads as its
            # per-tensor scale (the same values; without a config naming the strategy
            # the two are one file), and becomes TE's per-tensor form.
            return t, {"rowwise_data": q, "scale_inv": s.reshape(1)}, deq, deq
        return t, IO.native_block(q, s), IO.fp8_dequant_block(q, s), deq
    producer = IO.modelopt_mxfp8 if layout == "modelopt_mxfp8" else IO.ct_mxfp8
    q, byte = producer(x)
    deq = IO.mx_dequant(q, byte)
    return {name: q.view(E4M3), name + "_scale": byte}, IO.native_mxfp8(q, byte), deq, deq


def nan_scale(tensors):
    """The first tensor of a producer's file whose scales hold a NaN (a producer's
    division by an all-zero weight's amax), or None."""
    for key, v in tensors.items():
        if v.dtype == E4M3 and "scale" in key and np.isnan(v.astype(F32)).any():
            return key
        if v.dtype == F32 and np.isnan(v).any():
            return key
    return None


NAMES = ["model.layers.{i}.mlp.up_proj.weight", "model.layers.{i}.mlp.down_proj.weight",
         "model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.o_proj.weight"]


def ulps(a, b):
    """Distance in f32 units in the last place (same-sign finite values)."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    return np.abs(ia - ib)


ZEROS = {"weights": 0, "refused files": 0}


def check_file(exe, layout, rng, seed, tmp, per_file):
    config, (rm, cm) = LAYOUTS[layout]
    tensors, expect, refused = {}, {}, []
    for w in range(per_file):
        name = NAMES[w % len(NAMES)].format(i=w // len(NAMES))
        shape = (rm * int(rng.integers(1, max(2, 400 // rm))),
                 cm * int(rng.integers(1, max(2, 700 // cm))))
        x = weights(rng, shape)
        ZEROS["weights"] += not x.any()
        t, bufs, native, deq = make(layout, name, x)
        tensors.update(t)
        if nan_scale(t):
            refused.append(name)
        expect[name] = (shape, bufs, native, deq)
    src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "native.safetensors")
    CC.save(src, tensors, {"quantization_config": json.dumps(config), "format": "pt"})
    rc, err = CC.run([exe, "convert", "--to", "native", "-o", dst, src])
    where = f"seed {seed} {layout}"
    if refused:
        # quantfmt checks the weights in the file's order, so the error names one of
        # those with a NaN scale; either way the file as a whole must be refused.
        if rc == 0:
            return 0, [f"{where}: converted, but {refused} hold NaN scales"]
        if not any(name in err for name in refused) or "amax is 0" not in err:
            return 0, [f"{where}: refused without naming one of {refused} "
                          f"and the zero amax: {err}"]
        ZEROS["refused files"] += 1
        return len(refused), []
    if rc != 0:
        return 0, [f"{where}: convert refused: {err}"]
    got = CC.load(dst)
    deq_path = os.path.join(tmp, "deq.safetensors")
    rc, err = CC.run([exe, "dequantize", "--dtype", "f32", "-o", deq_path, dst])
    if rc != 0:
        return 0, [f"{where}: dequantize failed: {err}"]
    deq_got = CC.load(deq_path)
    failures = []
    for name, (shape, bufs, native, deq) in expect.items():
        problems = []
        for b, want in bufs.items():
            key = f"{name}.{b}"
            if key not in got:
                problems.append(f"{b}: missing from the native file")
                continue
            d = CC.first_difference(got[key], want)
            if d:
                problems.append(f"{b}: {d}")
        values = deq_got.get(name)
        if values is None:
            problems.append("no dequantized tensor")
        else:
            d = CC.first_difference(values, native.astype(F32))
            if d:
                problems.append(f"dequantize (TE's arithmetic): {d}")
            tol = 4 if "nvfp4" in layout else 0
            far = ulps(values.astype(F32).ravel(), deq.astype(F32).ravel()) > tol
            if far.any():
                i = int(np.flatnonzero(far)[0])
                problems.append(f"{int(far.sum())} values more than {tol} ulps from the "
                                f"producer's dequantization; first at {i}: "
                                f"{values.ravel()[i]!r} against {deq.ravel()[i]!r}")
        if problems:
            failures.append(f"{where} {name} {list(shape)}\n    " + "\n    ".join(problems))
    return len(expect), failures


def main():
    # The models' numpy arithmetic overflows and divides by zero on purpose (saturation,
    # infinite amaxes); its warnings are not findings.
    warnings.simplefilter("ignore", RuntimeWarning)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200, help="checkpoint files (default 200)")
    ap.add_argument("--weights", type=int, default=4, help="weights per file (default 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layout", action="append", choices=sorted(LAYOUTS),
                    help="only these layouts (repeatable; default all)")
    ap.add_argument("--file-seed", type=int, help="replay the one file of this seed")
    ap.add_argument("--exe", help="quantfmt binary (default: build the release CLI)")
    args = ap.parse_args()
    exe = CC.cli(args.exe)
    layouts = args.layout or sorted(LAYOUTS)
    seeds = [args.file_seed] if args.file_seed is not None else [
        args.seed * 1_000_003 + i for i in range(args.files)]
    total, failures = 0, []
    tmp = tempfile.mkdtemp(prefix="quantfmt-interop-")
    try:
        for i, seed in enumerate(seeds):
            rng = np.random.default_rng(seed)
            n, f = check_file(exe, layouts[seed % len(layouts)], rng, seed, tmp, args.weights)
            total += n
            failures += f
            if (i + 1) % 50 == 0:
                print(f"{i + 1} files, {total} weights, {len(failures)} mismatches", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("MISMATCH " + f)
    print(f"{total} weights in {len(seeds)} files ({ZEROS['weights']} all zero, "
          f"{ZEROS['refused files']} files refused as they should be): "
          f"{len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
