"""Which output differences serving introduced, told apart from a kernel's own nondeterminism.

A kernel that accumulates with atomics (a weight gradient summed over rows, say) gives other bits from one
JIT run to the next. Comparing a served run with one JIT run would blame serving for that. So the served runs
are compared with several JIT runs: a tensor that differs between two JIT runs is the kernel's own
nondeterminism, whatever serving gave; a tensor on which every JIT run agrees and a served run differs is a
difference serving introduced.

Runs are what bench/liger_app.py saves: {op name: [tensors]} (torch.save).
"""
from __future__ import annotations


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
