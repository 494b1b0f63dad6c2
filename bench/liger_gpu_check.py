"""liger-kernel targets launched from kforge's bundle vs liger's own Triton JIT of the same specialization: every
buffer the kernel reads or writes must come out bit-identical.

Usage (on an NVIDIA GPU, after a project over tests/liger_specs/ ran `doit package`):
    python bench/liger_gpu_check.py DIST_DIR
The bundle side runs first, in this process, with a fresh empty Triton cache; the check fails if anything
was compiled for it (the JIT side is liger's own launch, compiled after: its cache entries are expected).
Each family below gets a problem of M rows; every pointer argument is a buffer of random values, the same
for both sides (seeded), and each side launches on its own copy. The same specialization on both sides: the
bundle's targets were built without divisibility hints, so the row length, the strides and the buffers'
addresses are chosen not divisible by 16 (the JIT then specializes on nothing either).
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = CACHE = tempfile.mkdtemp(prefix="triton-cache-")
import torch  # noqa: E402

from kforge_runtime import Library  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
M = 96   # rows


def scalars(family: str, c: dict) -> tuple[int, dict]:
    """(row stride, the runtime scalar arguments by name) for one config of a family."""
    if family == "liger_cross_entropy":   # optional inputs passed as None (weight, z-loss, softcap, ...)
        v = 32000 - 5   # the vocabulary: an odd row length, longer than one block
        return v, {"X_stride": v, "Y_stride": 1, "loss_stride": 1, "token_accuracy_stride": 0,
                   "predicted_tokens_stride": 0, "n_cols": v, "n_non_ignore": M, "sum_non_ignore_weight": float(M),
                   "weight_sum": 0.0, "ignore_index": -100}
    if family in ("liger_swiglu_fwd", "liger_geglu_fwd"):
        stride = c["n_cols"] + 1   # n_cols is a constexpr here; padded rows keep the stride odd
        return stride, {"stride": stride, "gate_multiplier": 1.0}
    n = min(c.get("BLOCK_SIZE", 4096), 4096) - 95   # odd, and shorter than the block: the mask is exercised
    return n, {"Y_row_stride": n, "X_row_stride": n, "W_row_stride": 0, "B_row_stride": 0, "RSTD_row_stride": 1,
               "Mean_row_stride": 1, "n_cols": n, "eps": 1e-6, "offset": 0.0}


def buffers(signature: list, stride: int, seed: int) -> dict:
    """One buffer per pointer argument, starting one element past an aligned allocation."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {a: (torch.randint(0, stride, (M * stride + 65,), device="cuda", generator=g) if t == "*i64" else
                torch.randn(M * stride + 65, device="cuda", dtype=DT[t[1:]], generator=g))[1:]
            for a, t in signature if t.startswith("*")}


def run(launch, signature: list, consts: dict, bufs: dict) -> None:
    """launch gets the runtime arguments by name, in the bundle's signature order."""
    launch({a: bufs[a] if t.startswith("*") else consts[a] for a, t in signature})
    torch.cuda.synchronize()


def same(x: dict, y: dict) -> bool:
    return all(torch.equal(x[a].view(torch.uint8), y[a].view(torch.uint8)) for a in x)


def main() -> int:
    dist = Path(sys.argv[1])
    lib = Library(dist)
    bundle = lib.bundles_for(["sm_90a"])[0]
    families = ("liger_rms_norm_fwd", "liger_layer_norm_fwd", "liger_softmax_fwd", "liger_swiglu_fwd",
                "liger_geglu_fwd", "liger_cross_entropy")
    plans = []
    for entry in sorted(bundle.artifacts, key=lambda e: e["target"]):
        if entry["kernel"] not in families:
            continue
        k = lib.load(entry["kernel"], entry["config_id"])
        c = k.entry["config"]
        signature = [(s["name"], s["type"]) for s in entry["signature"]]
        n, consts = scalars(entry["kernel"], c)
        mine = buffers(signature, n, seed=len(plans))
        run(lambda args, k=k: k((M,), *args.values()), signature, consts, mine)   # the bundle, before any JIT
        plans.append((entry, k, signature, consts, mine, n))
    compiled_by_bundle = sorted(str(p.relative_to(CACHE)) for p in Path(CACHE).rglob("*") if p.is_file())
    failures = 0
    for i, (entry, k, signature, consts, mine, n) in enumerate(plans):
        source = entry["source"]
        fn = getattr(importlib.import_module(source["module"]), source["entry"])
        options = {o: entry["config"][o] for o in ("num_warps", "num_stages") if o in entry["config"]}
        theirs = buffers(signature, n, seed=i)
        run(lambda args: fn[(M,)](**args, **entry["constexprs"], **options), signature, consts, theirs)
        ok = same(mine, theirs)
        failures += not ok
        print(f"{'identical' if ok else 'DIFFERENT'}  {entry['target']}  ({len(mine)} buffers, N={n})")
    print(f"\n{len(plans)} liger targets launched from the bundle and by liger's JIT; {failures} differ; files the "
          f"bundle side left in the Triton cache: {len(compiled_by_bundle)}")
    return 1 if failures or compiled_by_bundle or not plans else 0


if __name__ == "__main__":
    sys.exit(main())
