"""The verify sweep's case matrix at any world size, on a CPU: every rank's kernels run by Triton's interpreter
in one process, the ranks simulated, checked by the same oracle and comparison as the GPU sweep.

    python -m kernels.ep.simulate                    the whole matrix at world 8 and 16 (sets TRITON_INTERPRET=1)
    python -m kernels.ep.simulate --world 4 [--world 32] [--only NAME]

The tests run it a case a test (tests/kernels/ep/test_simulate.py): by default a representative part of the
matrix at world 8 and 16 (its docstring says which and why), every case with `pytest --simulate-all`.

Each call runs the op's kernels in the op's order, a phase at a time over all ranks: route, dispatch (the real
kernel in two phases: every rank's program (0, 0) writing its tagged totals into every peer's count matrix, then
every rank's grid, which waits for the counts, sends the rows and sets num_recv, overflow and the row starts),
dispatch_done, the stand-in experts, combine (every rank's pushers, then every rank's reducers). A phase ends
when every rank has run it, which is what the kernels' flag barriers and combine's arrival flags guarantee on
GPUs; here each rank's flag table points its signals at its own slots, so its barriers pass at once. The
ranks' buffers are CPU tensors reached through the same int64 pointer tables the GPUs use. The oracle,
kernels/ep/reference.py, runs unchanged: its all_to_all_single is served by threads standing in for the ranks
(ThreadedCollectives); the comparison is verify.check_runs. Cases are shrunk to fit a CPU (shrink()).

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

if __name__ == "__main__" and os.environ.get("TRITON_INTERPRET") != "1":
    # the interpreter is chosen when Triton is imported: start again with it, before torch and Triton are imported
    os.environ["TRITON_INTERPRET"] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "kernels.ep.simulate", *sys.argv[1:]])

from kernels.ep.cases import Case, matrix  # noqa: E402


def interpreter_patches() -> None:
    """Triton 3.6's interpreter with one fix and less wasted work per step; what the kernels
    compute is unchanged (tests/kernels/ep/test_simulate.py holds the internals these rely on):
    - a runtime scalar used as a loop bound (dispatch_kernel's `range(0, b, BLOCKS)`) becomes an int
      through int() of a one-element array, which NumPy 2 refuses: the same conversion through .item();
    - every call of a @triton.jit helper inside a kernel patches triton.language again (inspect.getmembers
      of five namespaces: about a quarter of a dispatch program's time): skipped where this launch patched the
      same modules already (patching twice changes nothing: the second finds the first's functions);
    - _get_np_dtype builds a 20-entry dict at every call (about a tenth): cached per element type;
    - every integer add, sub and mul is done again in int64 to check for overflow, whose verdict goes to
      device_assert, which does nothing without debug (off in the interpreter): skipped (about a
      quarter of what is left). Together: a case takes about half the CPU time it took."""
    import dataclasses

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    if getattr(interpreter, "kforge_patched", False):
        return
    interpreter.kforge_patched = True

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))
    interpreter._patch_lang_tensor = patch_tensor_index

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: list[set] = []   # the language modules this launch has patched (empty outside a launch)

    def patch_lang_once(fn):
        langs = {id(m) for m in fn.__globals__.values() if m is tl or m is tl.core}
        if patched and langs <= patched[-1]:
            return interpreter._LangPatchScope()   # nothing to undo
        if patched:
            patched[-1] |= langs
        return patch_lang(fn)

    def launch_patching_once(self, *args, **kwargs):
        patched.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()
    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch_patching_once

    np_dtype, by_type = interpreter._get_np_dtype, {}

    def np_dtype_cached(ty):
        ty = ty.element_ty if isinstance(ty, tl.block_type) else ty
        if isinstance(ty, tl.pointer_type):   # unhashable; a pointer is a uint64 address
            return np.dtype(np.uint64)
        if ty not in by_type:
            by_type[ty] = np_dtype(ty)
        return by_type[ty]
    interpreter._get_np_dtype = np_dtype_cached

    builder = interpreter.interpreter_builder
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


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
        flags = self.buf["flags"]
        self.flag_table = [torch.tensor([flags[r].data_ptr() + flags[r].element_size() * (p - r) for p in range(W)],
                                        dtype=torch.int64) for r in range(W)]
        self.epoch = [torch.zeros(1, dtype=torch.int64) for _ in range(W)]
        self.num_recv = [torch.zeros((), dtype=torch.int32) for _ in range(W)]
        self.overflow = [torch.zeros((), dtype=torch.uint8) for _ in range(W)]
        self.recv_start = [torch.zeros(W + 1, dtype=torch.int32) for _ in range(W)]
        self.y = [torch.zeros(cfg.capacity, cfg.hidden, dtype=DTYPES[cfg.combine_dtype]) for _ in range(W)]


def run_calls(world: World, feeds: list, tk) -> list:
    """One dispatch + experts + combine call of every rank (feeds[r] = (x, idx, w, scales)), the op's kernels
    phase by phase; [(snapshot, combined)] per rank. tk: the kernels module (a planted bug goes there)."""
    import torch
    from kernels.ep.launch import CONSTANTS
    from kernels.ep.op import dispatch_sources
    from kernels.ep.verify import _expert
    cfg, W, b = world.cfg, world.W, world.buf
    K, E, H, R = cfg.topk, cfg.experts_per_rank, cfg.hidden, cfg.capacity
    block_t, blocks_at_once = CONSTANTS["ep_route"]["BLOCK_T"], CONSTANTS["ep_dispatch"]["BLOCKS"]
    chunks = -(-H // BLOCK_H)
    T = [f[0].shape[0] for f in feeds]
    nb = [-(-t // block_t) for t in T]
    pos = [torch.full((max(t, 1), W), -9, dtype=torch.int32) for t in T]
    counts = [torch.zeros(max(n, 1), W, dtype=torch.int32) for n in nb]
    handle = [torch.full((t, W), -9, dtype=torch.int32) for t in T]
    for r in range(W):
        if feeds[r][2] is None:
            b["w"][r].zero_()
        if T[r]:
            tk.route_kernel[(nb[r],)](feeds[r][1], pos[r], counts[r], T[r], E, K=K, W=W, BLOCK_T=block_t,
                                      PDL=False)
    for roles in (1, 2):   # every rank's counts out, then every rank's rows (whose wait passes: all are in)
        for r in range(W):
            x, idx, w, scales = feeds[r]
            x_, idx_, w_, scales_, handle_ = dispatch_sources(x, idx, w, scales, handle[r], pos[r],
                                                              {name: b[name][r] for name in ("x", "idx", "w", "scales")})
            grid = (1, 1) if roles == 1 else (max(T[r], 1), chunks)
            tk.dispatch_kernel[grid](
                x_, idx_, w_, scales_, pos[r], counts[r], nb[r], world.table["matrix"], world.epoch[r],
                world.num_recv[r], world.overflow[r], world.recv_start[r], handle_, world.table["x"],
                world.table["idx"], world.table["w"], world.table["scales"], world.table["src"], r, T[r], H,
                cfg.max_tokens_per_rank, R, cfg.num_scales, cfg.scale_stride, roles, W=W, K=K,
                HAS_W=w is not None, HAS_SCALES=scales is not None, BLOCK_H=BLOCK_H, BLOCK_T=block_t,
                BLOCKS=blocks_at_once, PDL=False, STORE_SIGNAL=False)
    for r in range(W):
        tk.dispatch_done_kernel[(1,)](world.flag_table[r], world.epoch[r], r, W=W, STORE_SIGNAL=False, PDL=False)
    snaps = []
    for r in range(W):
        scales = b["scales"][r][:, :cfg.num_scales] if cfg.num_scales else None
        snaps.append({"x": b["x"][r].clone(), "topk_idx": b["idx"][r].clone(), "topk_w": b["w"][r].clone(),
                      "src": b["src"][r].clone(), "num_recv": world.num_recv[r].clone(),
                      "overflow": world.overflow[r].clone().bool(),
                      "x_scales": scales.clone() if scales is not None else None})
        world.y[r].copy_(_expert(r, cfg)(b["x"][r], scales))   # every received row, as the sweep's expert does
    outs = [torch.zeros(T[r], H, dtype=world.y[r].dtype) for r in range(W)]
    for roles in (1, 2):   # every rank's pushers, then every rank's reducers (which skip the wait: all has landed)
        for r in range(W):
            grid = cfg.max_tokens_per_rank if roles == 1 else T[r]
            if grid:
                tk.combine_kernel[(grid,)](
                    outs[r], world.y[r], R, handle[r], b["src"][r], world.recv_start[r], world.table["back"],
                    world.table["arrived"], world.epoch[r], r, T[r], H, cfg.max_tokens_per_rank, R, roles, W=W,
                    BLOCK_H=BLOCK_H, QB=1, LAG=0, STORE_SIGNAL=False)
    return list(zip(snaps, outs))   # as the op: the next call's count exchange is the barrier after combine


def run_case(case: Case, world_size: int, tk=None) -> dict:
    """One shrunk case at `world_size` simulated ranks: {"case", "ok", "worst", "note", "seconds", "cpu_seconds"}
    (cpu: this process's CPU time, which a loaded machine does not inflate)."""
    from kernels.ep import triton_kernels
    from kernels.ep.cases import quantize_fp8, inputs
    from kernels.ep.verify import _expert, case_config, check_runs
    tk = tk or triton_kernels
    interpreter_patches()
    start, cpu = time.perf_counter(), time.process_time()
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
            "note": note, "seconds": round(time.perf_counter() - start, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2)}


def sweep(world_size: int, only: str | None = None, tk=None):
    """run_case's result for each case of the matrix, as each finishes."""
    for case in matrix(world_size):
        if only is None or only in case.name:
            yield run_case(case, world_size, tk)


def serve(requests=sys.stdin, answers=sys.stdout) -> int:
    """`--serve`, for the tests (tests/kernels/ep/test_simulate.py): a request a line, {"world": W, "case": NAME,
    "kernels": PATH or null (a copy of triton_kernels.py, e.g. with a planted bug)}, answered by run_case's
    result as a line of JSON; an error is answered too ({"case", "ok": false, "error"}), and serving goes on.
    Python, torch and Triton are imported once for many cases, not once a case."""
    import importlib.util
    import json
    import traceback
    sys.stdout = sys.stderr   # what anything prints stays out of the answers
    kernels: dict[str, types.ModuleType] = {}
    for line in requests:
        request = json.loads(line)
        try:
            path, tk = request.get("kernels"), None
            if path:
                if path not in kernels:
                    spec = importlib.util.spec_from_file_location(f"kernels_{len(kernels)}", path)
                    kernels[path] = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(kernels[path])
                tk = kernels[path]
            named = {c.name: c for c in matrix(request["world"])}
            if request["case"] not in named:
                raise KeyError(f"no case {request['case']!r} at world {request['world']}: {', '.join(named)}")
            result = run_case(named[request["case"]], request["world"], tk)
        except Exception:   # noqa: BLE001 - the answer carries it
            result = {"case": request.get("case"), "ok": False, "error": traceback.format_exc()}
        answers.write(json.dumps(result) + "\n")
        answers.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, action="append", help="simulated ranks (repeatable); default 8 and 16")
    ap.add_argument("--only", help="only the cases whose name contains this")
    ap.add_argument("--serve", action="store_true", help="run the cases asked on stdin (JSON lines; see serve())")
    a = ap.parse_args(argv)
    if a.serve:
        return serve()
    failed, cpu = 0, 0.0
    for world in a.world or [8, 16]:
        for result in sweep(world, a.only):
            failed += not result["ok"]
            cpu += result["cpu_seconds"]
            print(f"world {world:>2}  {'ok  ' if result['ok'] else 'FAIL'}  {result['case']:<40} "
                  f"{result['seconds']:>6.1f} s ({result['cpu_seconds']:>5.1f} s cpu)  {result['note']}", flush=True)
    print(f"{failed} failed ({cpu:.0f} s cpu)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
