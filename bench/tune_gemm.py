"""Tuned selection vs the best single fixed config, for gemm, on the local GPU (issue 8).

Usage (on an H100/H200, after `doit tune archs=sm_90a && doit package archs=sm_90a`):
    python bench/tune_gemm.py [--dist out/dist] [--dtype bf16] [--json docs/data/tune_gemm-h100.json]

One run measures, side by side with the tuner's own timing (rules/tune/gpu_bench.py: median of per-launch event
times, launch overhead hidden, inputs rotated past L2):
- every tuned shape: the config the bundle's selection picks, the best fixed config, torch.matmul;
- held-out shapes (not in the table): the selection, the fixed config, torch.matmul, and every config of
  the dtype (the exhaustive best).
The best fixed config is the one with the lowest geometric-mean time over the tuned shapes in the table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")   # nothing may compile
import torch  # noqa: E402

from kernels import gemm_tune  # noqa: E402
from kforge_runtime import Library  # noqa: E402
from kforge_runtime.device import runnable_archs  # noqa: E402
from kforge.tune.gpu_bench import checked_time, make_launch, make_problems, median_us  # noqa: E402

# Not in specs/gemm.toml: other M (some not 16-divisible), other model widths. The second set was added
# after the first had been measured (docs/benchmarks.md gives each set's result; the earlier run: git history).
HELD_OUT = [[m, n, k] for m in (32, 128, 512, 2048, 3000) for n, k in ((5120, 5120), (3072, 8192))]
HELD_OUT += [[m, n, k] for m in (48, 768, 6000) for n, k in ((8192, 2048), (2560, 2560))]


def geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def best_fixed(table: dict, dtype: str) -> str:
    rows = [s for s in table["shapes"] if s["where"].get("dtype") == dtype]
    times: dict[str, list[float]] = {}
    for s in rows:
        for r in s["ranking"]:
            times.setdefault(r["config_id"], []).append(r["us"])
    everywhere = {c: t for c, t in times.items() if len(t) == len(rows)}
    return min(everywhere, key=lambda c: geomean(everywhere[c]))


class Runner:
    """Times kernels of the bundle and torch.matmul on one shape's rotated problems."""

    def __init__(self, bundle, shape: list[int], dtype: torch.dtype, loaded: dict):
        self.bundle, self.shape = bundle, dict(zip(("M", "N", "K"), shape))
        self.problems, self.expected = make_problems(gemm_tune, self.shape, {"dtype": dtype}, "cuda")
        self.loaded = loaded   # config id -> loaded kernel, shared by every shape

    def config(self, config_id: str) -> float:
        if config_id not in self.loaded:
            self.loaded[config_id] = self.bundle.load("gemm", config_id)
        launch = make_launch(gemm_tune, self.loaded[config_id], self.shape, self.problems)
        timed = checked_time(launch, self.problems, self.expected)
        if isinstance(timed, str):
            raise SystemExit(f"gemm {config_id} on {self.shape}: {timed}")
        return timed[0]

    def torch_matmul(self) -> float:
        ps = self.problems
        return median_us(lambda i: torch.matmul(ps[i]["args"]["a_ptr"], ps[i]["args"]["b_ptr"], out=ps[i]["output"]),
                         len(ps))[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dist", default="out/dist")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--json")
    args = p.parse_args()
    torch.empty(1, device="cuda")
    bundles = Library(args.dist).bundles_for(runnable_archs()[1])
    if not bundles:
        raise SystemExit(f"no bundle in {args.dist} runs on this GPU ({runnable_archs()[0]})")
    bundle = bundles[0]
    table = bundle.tuned("gemm")
    where = {"dtype": args.dtype}
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    fixed = best_fixed(table, args.dtype)
    tuned_shapes = [s["shape"] for s in table["shapes"] if s["where"] == where]
    assert not [s for s in HELD_OUT if s in tuned_shapes], "a held-out shape is in the tuning table"
    configs = sorted({r["config_id"] for s in table["shapes"] if s["where"] == where for r in s["ranking"]})
    rows, loaded = [], {}
    for shape, held_out in [(s, False) for s in tuned_shapes] + [(s, True) for s in HELD_OUT]:
        run = Runner(bundle, shape, dtype, loaded)
        entry, why = bundle.find_for_shape("gemm", run.shape, where)
        row = {"shape": shape, "held_out": held_out, "selected": entry["config_id"], "why": why,
               "selected_us": run.config(entry["config_id"]), "fixed_us": run.config(fixed),
               "torch_us": run.torch_matmul()}
        if held_out:
            every = {c: run.config(c) for c in configs}
            row["best"] = min(every, key=every.get)
            row["best_us"] = every[row["best"]]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del run
        torch.cuda.empty_cache()
    tuned = [r for r in rows if not r["held_out"]]
    held = [r for r in rows if r["held_out"]]
    summary = {
        "gpu": table["gpu"], "dtype": args.dtype, "fixed_config": fixed, "tuned_shapes": len(tuned),
        "held_out_shapes": len(held), "configs": len(configs),
        "tuned_speedup_over_fixed_geomean": geomean([r["fixed_us"] / r["selected_us"] for r in tuned]),
        "tuned_vs_torch_geomean": geomean([r["torch_us"] / r["selected_us"] for r in tuned]),
        "fixed_vs_torch_geomean": geomean([r["torch_us"] / r["fixed_us"] for r in tuned]),
        "held_out_selected_over_best_geomean": geomean([r["selected_us"] / r["best_us"] for r in held]),
        "held_out_selected_over_best_max": max(r["selected_us"] / r["best_us"] for r in held),
        "held_out_speedup_over_fixed_geomean": geomean([r["fixed_us"] / r["selected_us"] for r in held]),
    }
    print(json.dumps(summary, indent=1))
    print(markdown(rows, summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


def markdown(rows: list[dict], s: dict) -> str:
    lines = [f"fixed config (best geomean over the tuned shapes): `{s['fixed_config']}`", "",
             "| M, N, K | held out | selected | selected us | fixed us | torch us | fixed/selected | "
             "torch/selected | exhaustive best us |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {', '.join(map(str, r['shape']))} | {'yes' if r['held_out'] else ''} | `{r['selected']}` | "
                     f"{r['selected_us']:.1f} | {r['fixed_us']:.1f} | {r['torch_us']:.1f} | "
                     f"{r['fixed_us'] / r['selected_us']:.2f} | {r['torch_us'] / r['selected_us']:.2f} | "
                     + (f"{r['best_us']:.1f} (`{r['best']}`)" if r["held_out"] else "") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
