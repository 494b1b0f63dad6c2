"""The verify sweep's case matrix at any world size, on a CPU: every rank's kernels run by Triton's interpreter
in one process, the ranks simulated, checked by the same oracle and comparison as the GPU sweep.

    python -m kernels.ep.simulate --world 8 [--world 16] [--only NAME]      (sets TRITON_INTERPRET=1 itself)

Each call runs the op's kernels in the op's order, a phase at a time over all ranks: route, exchange_counts
(the real kernel: block bases, and this rank's totals written into every peer's count matrix), dispatch,
dispatch_done (num_recv, overflow), the stand-in experts, combine between two barrier kernels. A phase ends when
every rank has run it, which is what the kernels' flag barriers guarantee on GPUs; here each rank's flag table
points its signals at its own slots, so its barriers pass at once. The ranks' buffers are CPU tensors reached
through the same int64 pointer tables the GPUs use. The oracle, kernels/ep/reference.py, runs unchanged: its
all_to_all_single is served by threads standing in for the ranks (ThreadedCollectives); the comparison is
verify.check_runs. Cases are shrunk to fit a CPU (shrink()).

It catches routing, ordering, count, capacity and overflow bugs at any world size. It cannot catch: memory
ordering between GPUs, real concurrency (a spin-wait that never ends, a race between ranks), bf16 / fp8
rounding as the GPU does it, CUDA graph capture (graph cases run eagerly here), performance.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import types
from dataclasses import replace

from kernels.ep.cases import Case, matrix


def _interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter turns a runtime scalar used as a loop bound (exchange_counts_kernel's
    `range(0, NB, BLOCKS)`) into an int with int() of a one-element array, which NumPy 2 refuses: the same
    conversion through .item()."""
    from triton.runtime import interpreter
    patch = interpreter._patch_lang_tensor
    if getattr(patch, "loop_bounds", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))
    patched.loop_bounds = True
    interpreter._patch_lang_tensor = patched


# the row chunk a dispatch / combine program moves: the GPUs' 1,024 would make every interpreted step handle
# 1,024-wide arrays for rows of 64; the kernels take any power of two
BLOCK_H = 64


def shrink(case: Case, world: int) -> Case:
    """The case at CPU size: H 64 (fp8: 128, two chunks of one scale block), at most 64 / world tokens a
    rank (8 at world 8, 4 at 16: an interpreted dispatch program costs world^2 steps) and 2 calls (1 above
    world 8); every other axis (routing, K, experts per rank, weights, capacity, strictness, dtype) as the
    GPU sweep has it."""
    hidden = 128 if case.dtype == "fp8_e4m3" else 64
    m = min(case.max_tokens, max(2, 64 // world))
    tokens = case.tokens if case.tokens == "mixed" else min(case.tokens, m)
    return replace(case, hidden=hidden, max_tokens=m, tokens=tokens,
                   iterations=min(case.iterations, 2 if world <= 8 else 1), graph=False)


class ThreadedCollectives:
    """torch.distributed's calls the reference makes (get_rank, all_to_all_single), for one thread per rank."""

    def __init__(self, world: int):
        self.world, self.local = world, threading.local()
        self.barrier = threading.Barrier(world, timeout=600)
        self.sent: list = [None] * world
        self.group = types.SimpleNamespace(WORLD="simulated")

    def get_rank(self, group=None) -> int:
        return self.local.rank

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None):
        import torch
        rank = self.local.rank
        sizes = input_split_sizes or [input.shape[0] // self.world] * self.world
        self.sent[rank] = list(torch.split(input, sizes))
        self.barrier.wait()
        output.copy_(torch.cat([self.sent[s][rank] for s in range(self.world)]))
        self.barrier.wait()

    def run(self, work) -> list:
        """work(rank) on one thread per rank, as ranks would run it; the results in rank order. One rank's
        error stops the others (the barrier breaks) and is raised."""
        results, errors = [None] * self.world, []

        def body(rank: int):
            self.local.rank = rank
            try:
                results[rank] = work(rank)
            except BaseException as e:   # noqa: BLE001 - re-raised below, in the caller's thread
                errors.append(e)
                self.barrier.abort()
        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return results


@contextlib.contextmanager
def oracle_on_threads(world: int):
    """The reference's torch.distributed calls answered by ThreadedCollectives while the block runs."""
    from kernels.ep import reference
    collectives = ThreadedCollectives(world)
    saved, reference.dist = reference.dist, collectives
    try:
        yield collectives
    finally:
        reference.dist = saved


class World:
    """W ranks' op buffers on the CPU, with the pointer tables the kernels take."""

    def __init__(self, cfg):
        import torch
        from kernels.ep.op import DTYPES
        W = cfg.world_size
        self.cfg, self.W = cfg, W
        self.buf = {name: [torch.zeros(shape, dtype=DTYPES[kind]) for _ in range(W)]
                    for name, (shape, kind) in cfg.peer_buffers().items()}
        self.table = {name: torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
                      for name, bufs in self.buf.items()}
        # rank r's signal to peer p lands at table[p] + r: with table[p] = own flags + (p - r) it lands in r's
        # own slot p, so r's wait on its own W slots is satisfied by its own signals
        self.flag_table = [torch.tensor([self.buf["flags"][r].data_ptr() + 4 * (p - r) for p in range(W)],
                                        dtype=torch.int64) for r in range(W)]
        self.epoch = [torch.zeros(1, dtype=torch.int32) for _ in range(W)]
        self.num_recv = [torch.zeros((), dtype=torch.int32) for _ in range(W)]
        self.overflow = [torch.zeros((), dtype=torch.uint8) for _ in range(W)]


def run_calls(world: World, feeds: list, tk) -> list:
    """One dispatch + experts + combine call of every rank (feeds[r] = (x, idx, w, scales)), the op's kernels
    phase by phase; [(snapshot, combined)] per rank. tk: the kernels module (a planted bug goes there)."""
    import torch
    from kernels.ep.launch import CONSTANTS
    from kernels.ep.op import wire
    from kernels.ep.verify import _expert
    cfg, W, b = world.cfg, world.W, world.buf
    K, E, H, R = cfg.topk, cfg.experts_per_rank, cfg.hidden, cfg.capacity
    block_t, blocks_at_once = CONSTANTS["ep_route"]["BLOCK_T"], CONSTANTS["ep_exchange_counts"]["BLOCKS"]
    chunks = -(-H // BLOCK_H)
    T = [f[0].shape[0] for f in feeds]
    nb = [-(-t // block_t) for t in T]
    pos = [torch.full((t, W), -9, dtype=torch.int32) for t in T]
    counts = [torch.zeros(max(n, 1), W, dtype=torch.int32) for n in nb]
    base = [torch.full((max(n, 1), W), -9, dtype=torch.int32) for n in nb]
    handle = [torch.full((t, W), -9, dtype=torch.int32) for t in T]
    for r in range(W):
        if T[r]:
            tk.route_kernel[(nb[r],)](feeds[r][1], pos[r], counts[r], T[r], E, K=K, W=W, BLOCK_T=block_t)
    for r in range(W):
        tk.exchange_counts_kernel[(1,)](counts[r], base[r], nb[r], world.table["matrix"], world.flag_table[r],
                                        world.epoch[r], r, W=W, BLOCKS=blocks_at_once)
    for r in range(W):
        x, idx, w, scales = feeds[r]
        if w is None:
            b["w"][r].zero_()
        if T[r]:
            tk.dispatch_kernel[(T[r], chunks)](
                wire(x), idx, w if w is not None else b["w"][r], scales if scales is not None else b["scales"][r],
                pos[r], base[r], b["matrix"][r], handle[r], world.table["x"], world.table["idx"], world.table["w"],
                world.table["scales"], world.table["src"], r, H, cfg.max_tokens_per_rank, R, cfg.num_scales,
                cfg.scale_stride, W=W, K=K, HAS_W=w is not None, HAS_SCALES=scales is not None,
                BLOCK_H=BLOCK_H, BLOCK_T=block_t)
    for r in range(W):
        tk.dispatch_done_kernel[(1,)](world.flag_table[r], world.epoch[r], b["matrix"][r], world.num_recv[r],
                                      world.overflow[r], r, R, W=W)
    snaps = []
    for r in range(W):
        scales = b["scales"][r][:, :cfg.num_scales] if cfg.num_scales else None
        snaps.append({"x": b["x"][r].clone(), "topk_idx": b["idx"][r].clone(), "topk_w": b["w"][r].clone(),
                      "src": b["src"][r].clone(), "num_recv": world.num_recv[r].clone(),
                      "overflow": world.overflow[r].clone().bool(),
                      "x_scales": scales.clone() if scales is not None else None})
        b["y"][r].copy_(_expert(r, cfg)(b["x"][r], scales))   # every received row, as the sweep's expert does
    for r in range(W):
        tk.barrier_kernel[(1,)](world.flag_table[r], world.epoch[r], r, W=W)
    outs = []
    for r in range(W):
        out = torch.zeros(T[r], H, dtype=b["y"][r].dtype)
        if T[r]:
            tk.combine_kernel[(T[r], chunks)](out, handle[r], world.table["y"], H, W=W,
                                                           BLOCK_H=BLOCK_H)
        outs.append(out)
    return list(zip(snaps, outs))   # as the op: the next call's count exchange is the barrier after combine


def run_case(case: Case, world_size: int, tk=None) -> dict:
    """One shrunk case at `world_size` simulated ranks: {"case", "ok", "worst", "note", "seconds"}."""
    from kernels.ep import triton_kernels
    from kernels.ep.cases import quantize_fp8, inputs
    from kernels.ep.verify import _expert, case_config, check_runs
    tk = tk or triton_kernels
    _interpreter_loop_bounds()
    start = time.perf_counter()
    case = shrink(case, world_size)
    cfg, note = case_config(case, world_size)
    world = World(cfg)
    runs: list[list] = [[] for _ in range(world_size)]
    for it in range(case.iterations):
        feeds = []
        for r in range(world_size):
            x, idx, w = inputs(case, cfg, r, it)
            x, scales = quantize_fp8(x, cfg.scale_block) if cfg.num_scales else (x, None)
            feeds.append((x, idx, w, scales))
        for r, (snap, out) in enumerate(run_calls(world, feeds, tk)):
            runs[r].append((feeds[r], snap, out))
    with oracle_on_threads(world_size) as collectives:
        verdicts = collectives.run(lambda r: check_runs(runs[r], cfg, _expert(r, cfg), case.strict))
    return {"case": case.name, "ok": all(ok for ok, _ in verdicts), "worst": max(w for _, w in verdicts),
            "note": note, "seconds": round(time.perf_counter() - start, 2)}


def sweep(world_size: int, only: str | None = None, tk=None):
    """run_case's result for each case of the matrix, as each finishes."""
    for case in matrix(world_size):
        if only is None or only in case.name:
            yield run_case(case, world_size, tk)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, action="append", help="simulated ranks (repeatable); default 8 and 16")
    ap.add_argument("--only", help="only the cases whose name contains this")
    a = ap.parse_args(argv)
    failed = 0
    for world in a.world or [8, 16]:
        for result in sweep(world, a.only):
            failed += not result["ok"]
            print(f"world {world:>2}  {'ok  ' if result['ok'] else 'FAIL'}  {result['case']:<40} "
                  f"{result['seconds']:>6.1f} s  {result['note']}", flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":   # the interpreter is chosen when Triton is imported
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "kernels.ep.simulate", *sys.argv[1:]])
    sys.exit(main())
