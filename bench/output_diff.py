"""Which output differences serving introduced, told apart from a kernel's own nondeterminism.

A kernel that accumulates with atomics (a weight gradient summed over rows, say) gives other bits from one
JIT run to the next. Comparing a served run with one JIT run would blame serving for that. So the served runs
are compared with several JIT runs: a tensor that differs between two JIT runs is the kernel's own
nondeterminism, whatever serving gave; a tensor on which every JIT run agrees and a served run differs is a
difference serving introduced.

Runs are what bench/liger_app.py and bench/light_app.py save: {op name: [tensors]} (torch.save).

Usage: python bench/output_diff.py --jit A.pt B.pt [...] --served C.pt [...]
Prints the classification as JSON; exits 1 if serving introduced a difference.
"""
from __future__ import annotations

import argparse
import json
import sys


def raw(t):
    """A tensor's bytes, so that NaNs and signed zeros compare too."""
    import torch
    t = t.detach().contiguous().reshape(-1)
    return t if t.dtype == torch.bool else t.view(torch.uint8)


def same(p, q) -> bool:
    import torch
    return (q is not None and p.dtype == q.dtype and tuple(p.shape) == tuple(q.shape)
            and torch.equal(raw(p), raw(q)))


def flatten(run: dict) -> dict:
    """{"op[i]": tensor} of one run's {op: [tensors]}."""
    return {f"{op}[{i}]": t for op, tensors in run.items() for i, t in enumerate(tensors)}


def classify(jit_runs: list[dict], served_runs: list[dict]) -> dict:
    """The tensors of the first JIT run, each: identical everywhere, nondeterministic (two JIT runs differ),
    or a serving difference (every JIT run agrees, a served run differs or lacks it)."""
    if len(jit_runs) < 2:
        raise ValueError("two JIT runs at least: one run cannot tell a kernel's nondeterminism from serving's")
    reference, others, served = flatten(jit_runs[0]), [flatten(r) for r in jit_runs[1:]], map(flatten, served_runs)
    served = list(served)
    nondeterministic, introduced = [], []
    for name, t in reference.items():
        if not all(same(t, run.get(name)) for run in others):
            nondeterministic.append(name)
        elif not all(same(t, run.get(name)) for run in served):
            introduced.append(name)
    extra = sorted({name for run in served for name in run} - set(reference))   # a served run made more outputs
    return {"tensors": len(reference), "jit_runs": len(jit_runs), "served_runs": len(served),
            "identical": len(reference) - len(nondeterministic) - len(introduced),
            "kernel_nondeterminism": nondeterministic, "serving_differences": introduced + extra}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jit", nargs="+", required=True, help="outputs of two JIT runs or more")
    ap.add_argument("--served", nargs="*", default=[], help="outputs of served runs")
    a = ap.parse_args()
    import torch
    result = classify([torch.load(p) for p in a.jit], [torch.load(p) for p in a.served])
    print(json.dumps(result))
    return 1 if result["serving_differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
