"""A small application of liger-kernel ops, as an inference or training step would call them: RMSNorm,
SiLU-mul, GELU-mul, RoPE, cross-entropy and LayerNorm, forward and backward, at token counts 1, 7, 128 and
1000. Nothing here knows about kforge: bench/zero_jit.py records, builds and serves what it launches.

Usage (on a GPU): python bench/liger_app.py [--out outputs.pt] [--tokens 1 7 128 1000] [--warm-torch]
Prints one JSON line: the seconds to the first op's result and to all of them (after torch import, CUDA init
and input allocation), the seconds of a second pass over the same ops (every kernel in place: the steady
state), and the number of ops run. --warm-torch first runs every op once with Triton's
launches skipped (nothing compiled or launched), so that the timed part holds the kernels' cost and torch's
steady-state work, not torch's own first-use costs (its lazily loaded CUDA modules, autograd's set-up).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

H, V, HEADS, HEAD_DIM, INTER = 1024, 4096, 8, 64, 2816


def inputs(tokens: int, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
    return {"x": r(tokens, H), "w": r(H), "b": r(H), "gate": r(tokens, INTER), "up": r(tokens, INTER),
            "q": r(1, HEADS, tokens, HEAD_DIM), "k": r(1, HEADS, tokens, HEAD_DIM),
            "cos": r(1, tokens, HEAD_DIM), "sin": r(1, tokens, HEAD_DIM), "logits": r(tokens, V, dtype=torch.float32),
            "target": torch.randint(0, V, (tokens,), device="cuda", generator=g)}


def ops():
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    def with_grad(*tensors):
        return [t.detach().clone().requires_grad_(True) for t in tensors]

    def rms_norm(d):
        x, w = with_grad(d["x"], d["w"])
        y = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
        y.float().sum().backward()
        return [y, x.grad, w.grad]

    def silu_mul(d):
        a, b = with_grad(d["gate"], d["up"])
        y = LigerSiLUMulFunction.apply(a, b)
        y.float().sum().backward()
        return [y, a.grad, b.grad]

    def gelu_mul(d):
        a, b = with_grad(d["gate"], d["up"])
        y = LigerGELUMulFunction.apply(a, b)
        y.float().sum().backward()
        return [y, a.grad, b.grad]

    def rope(d):
        q, k = with_grad(d["q"], d["k"])
        qo, ko = LigerRopeFunction.apply(q, k, d["cos"], d["sin"])
        (qo.float().sum() + ko.float().sum()).backward()
        return [qo, ko, q.grad, k.grad]

    def cross_entropy(d):
        (x,) = with_grad(d["logits"])
        loss = LigerCrossEntropyFunction.apply(x, d["target"], None)[0]
        loss.backward()
        return [loss, x.grad]

    def layer_norm(d):
        x, w, b = with_grad(d["x"], d["w"], d["b"])
        y = LigerLayerNormFunction.apply(x, w, b, 1e-5)
        y.float().sum().backward()
        return [y, x.grad, w.grad, b.grad]

    return [rms_norm, silu_mul, gelu_mul, rope, cross_entropy, layer_norm]


def without_triton(work) -> None:
    """Run `work` with every Triton launch skipped: nothing is compiled, launched or autotuned."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction
    saved = JITFunction.run, Autotuner.run, Heuristics.run
    JITFunction.run = Autotuner.run = Heuristics.run = lambda self, *args, **kwargs: None
    try:
        work()
    finally:
        JITFunction.run, Autotuner.run, Heuristics.run = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="save every output tensor here (torch.save), to compare runs")
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 7, 128, 1000])
    ap.add_argument("--warm-torch", action="store_true", help="warm torch up first, with Triton launches skipped")
    a = ap.parse_args()
    torch.cuda.init()
    data = [inputs(t, seed=t) for t in a.tokens]
    run = ops()
    if a.warm_torch:
        without_triton(lambda: [t.detach().cpu() for d in data for op in run for t in op(d)])
    torch.cuda.synchronize()
    start = time.perf_counter()
    first, outputs = None, {}
    for i, d in enumerate(data):
        for op in run:
            outputs[f"{op.__name__}@{a.tokens[i]}"] = [t.detach().cpu() for t in op(d)]
            if first is None:
                torch.cuda.synchronize()
                first = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    start = time.perf_counter()   # again, every kernel in place: the steady state, the same in every mode
    for d in data:
        for op in run:
            [t.detach().cpu() for t in op(d)]
    torch.cuda.synchronize()
    again = time.perf_counter() - start
    if a.out:
        torch.save(outputs, a.out)
    print(json.dumps({"first_s": round(first, 4), "all_s": round(total, 4), "again_s": round(again, 4),
                      "ops": len(outputs)}))


if __name__ == "__main__":
    main()
