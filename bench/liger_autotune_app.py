"""An application of an autotuned library kernel: liger-kernel's DyT (@triton.autotune over 18 configs, keyed on
the hidden size), forward and backward, at two hidden sizes and 4 token counts. Nothing here knows about kforge.

Usage (on a GPU): python bench/liger_autotune_app.py [--out outputs.pt]
Prints one JSON line: seconds to all results (after torch import, CUDA init and input allocation), the ops run,
and how many configs Triton's autotuner benchmarked (0 when every choice was served from a record).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch


def digest(t) -> str:
    return hashlib.sha256(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the sha256 of every output tensor's bytes here (JSON), to "
                                                "compare runs")
    a = ap.parse_args()
    from liger_kernel.ops.dyt import LigerDyTFunction
    from triton.runtime.autotuner import Autotuner
    benchmarked = []
    bench = Autotuner._bench
    Autotuner._bench = lambda self, *args, **kw: benchmarked.append(1) or bench(self, *args, **kw)
    torch.cuda.init()
    cases = []
    for hidden in (1024, 4096):
        for tokens in (1, 7, 128, 1000):
            g = torch.Generator(device="cuda").manual_seed(hidden + tokens)
            r = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
            cases.append((f"dyt@{hidden}x{tokens}", r(tokens, hidden), r(1) * 0.5, r(hidden), r(hidden)))
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = {}
    for name, x, alpha, gamma, beta in cases:
        x, alpha, gamma, beta = [t.detach().clone().requires_grad_(True) for t in (x, alpha, gamma, beta)]
        y = LigerDyTFunction.apply(x, alpha, gamma, beta)
        y.float().sum().backward()
        outputs[name] = [digest(t) for t in (y, x.grad, alpha.grad, gamma.grad, beta.grad)]
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    if a.out:
        with open(a.out, "w") as f:
            json.dump(outputs, f, indent=1, sort_keys=True)
    print(json.dumps({"all_s": round(total, 4), "ops": len(outputs), "configs_benchmarked": len(benchmarked)}))


if __name__ == "__main__":
    main()
