"""The dispatch/combine verify sweep: one process per GPU, every case of cases.matrix(world), each
checked against the all_to_all_single reference, verdicts ANDed over ranks, a watchdog for hangs.

    doit verify_dispatch_combine [world=N] [gpus=G]     or     python -m kernels.ep.verify [--world N] [--gpus G]

Rank r runs on GPU r % G (G: every GPU found, or the first `gpus`): W <= G ranks get a GPU each and symmetric
memory; W > G ranks share GPUs (evenly or not: world 3 on 2 GPUs) and reach each other through IPC.

Writes out/verify/dispatch_combine/report.json, report.md and report.html; exits non-zero if any case failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from kernels.ep.cases import Case, matrix
from kernels.ep.config import built_worlds
from kernels.ep.placement import placement, ranks_per_gpu

CASE_TIMEOUT_S = 180.0
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the parent: workers, watchdog, report

def run_sweep(world: int | None = None, out_dir: str = "out/verify/dispatch_combine",
              case_timeout: float = CASE_TIMEOUT_S, only: str | None = None, dist_dir: str | None = None,
              gpus: int | None = None) -> int:
    """dist_dir: kforge bundles (out/dist) to run the op's precompiled kernels from; None: Triton's JIT.
    gpus: use the first G GPUs only (default: all)."""
    found = _gpu_count()
    if gpus is not None and not 1 <= gpus <= found:
        sys.stderr.write(f"verify_dispatch_combine: gpus={gpus}, but this machine has {found} GPU(s): choose "
                         f"gpus=1..{found}\n")
        return 2
    gpus = gpus or found
    world = world or gpus
    if found < 1 or world < 2:
        sys.stderr.write(f"verify_dispatch_combine: found {found} GPU(s) and world={world}: it needs a GPU and "
                         f"world >= 2 ranks (choose world=N; ranks share GPUs when N is above the GPUs). Without "
                         f"a GPU: python -m kernels.ep.simulate --world N\n")
        return 2
    shared = ranks_per_gpu(world, gpus) if world > gpus else None
    if shared:
        sys.stderr.write(f"verify_dispatch_combine: {world} ranks on {gpus} GPU(s), round-robin ({shared} ranks per "
                         f"GPU): buffers through CUDA IPC, no performance numbers\n")
    out = Path(out_dir)
    (out / "progress").mkdir(parents=True, exist_ok=True)
    cases = [c for c in matrix(world) if only is None or only in c.name]
    results: dict[int, dict] = {}
    start = 0
    while start < len(cases):
        for f in (out / "progress").glob("*.jsonl"):
            f.unlink()
        procs = _launch(world, start, out, only, dist_dir, gpus)
        hung = _watch(procs, out, case_timeout)
        results.update(_read_results(out))
        if hung is None:
            break
        case_index, where = hung
        results[case_index] = {"case": cases[case_index].name, "ok": False, "error": f"hang: {where}"}
        start = case_index + 1
    report = [results.get(i, {"case": c.name, "ok": False, "error": "never ran (a worker died)"})
              for i, c in enumerate(cases)]
    if not dist_dir:
        kernels = "Triton JIT"
    elif world in built_worlds():
        kernels = f"bundles in {dist_dir}"
    else:
        kernels = f"Triton JIT (the bundles hold kernels for worlds {sorted(built_worlds())})"
    _write_report(out, world, report, kernels, shared,
                  {"gpus": gpus, "gpu_of_rank": [placement(r, gpus) for r in range(world)], "machine": _machine(gpus),
                   "command": _command()})
    failed = [r["case"] for r in report if not r["ok"]]
    print(f"verify_dispatch_combine: world {world}: {len(report) - len(failed)}/{len(report)} cases passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else "") + f"; report: {out / 'report.md'}")
    return 1 if failed else 0


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


def _command() -> str:
    """This run's command line as the user typed it (`python -m doit` runs doit's __main__.py)."""
    program = Path(sys.argv[0]).name
    return " ".join(["doit" if program in ("__main__.py", "doit") else f"python {program}"] + sys.argv[1:])


def _machine(gpus: int) -> str:
    """The GPUs the ranks ran on, e.g. "2 x NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0)"."""
    try:
        import torch
        import triton
        names = sorted({torch.cuda.get_device_name(g) for g in range(gpus)})
        return f"{gpus} x {' / '.join(names)} (torch {torch.__version__}, triton {triton.__version__})"
    except Exception as e:   # the report is still written
        return f"unknown ({e!r})"


def _launch(world: int, start: int, out: Path, only: str | None, dist_dir: str | None,
            gpus: int) -> list[subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-m", "kernels.ep.verify", "--worker", "--start", str(start), "--out", str(out),
               "--gpus", str(gpus)]
        cmd += (["--only", only] if only else []) + (["--dist", dist_dir] if dist_dir else [])
        procs.append(subprocess.Popen(cmd, env=env))
    return procs


def _watch(procs, out: Path, timeout: float):
    """None when every worker exited; (case index, where each rank is) when no rank progressed for `timeout`."""
    last = time.monotonic()
    seen = None
    while any(p.poll() is None for p in procs):
        time.sleep(0.5)
        state = _progress(out)
        if state != seen:
            seen, last = state, time.monotonic()
        elif time.monotonic() - last > timeout:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            case = min(s["case"] for s in state.values()) if state else 0
            where = ", ".join(f"rank {r} at case {s['case']} {s['stage']}" for r, s in sorted(state.items()))
            missing = [r for r in range(len(procs)) if r not in state]
            return case, (where or "no rank started") + (f"; ranks {missing} never reported" if missing else "") \
                + f" (no progress for {timeout:.0f} s; the workers were killed)"
    return None


def _progress(out: Path) -> dict[int, dict]:
    state = {}
    for f in (out / "progress").glob("rank*.jsonl"):
        lines = f.read_text().splitlines()
        if lines:
            state[int(f.stem[4:])] = json.loads(lines[-1])
    return state


def _read_results(out: Path) -> dict[int, dict]:
    path = out / "progress" / "results.jsonl"
    if not path.exists():
        return {}
    return {r["index"]: r for r in map(json.loads, path.read_text().splitlines())}


def _write_report(out: Path, world: int, report: list[dict], kernels: str, shared: list[int] | None = None,
                  where: dict | None = None) -> None:
    where = where or {}
    (out / "report.json").write_text(json.dumps({"world": world, "kernels": kernels, "ranks_per_gpu": shared,
                                                 **where, "cases": report}, indent=1) + "\n")
    used = sorted({k for r in report for k in r.get("kernel_sources", [])})
    placed = (f"Ranks share GPUs: {shared} ranks per GPU, buffers through CUDA IPC; no times (they would be "
              f"time slices of one GPU, not the op's speed)." if shared else "One rank per GPU, symmetric memory.")
    if "gpu_of_rank" in where:
        placed += f" GPU of each rank: {where['gpu_of_rank']}."
    lines = [f"# dispatch/combine verify sweep, world {world}", "",
             f"Machine: {where.get('machine', '-')}. Command: `{where.get('command', '-')}`.", "",
             f"Kernels: {kernels}; launched from: {', '.join(used) or '-'}.", "", placed, "",
             "Times: median over the case's eager iterations after the first, slowest rank; small cases, "
             "with checks in between: a smoke signal, not the benchmark (bench/ep_bandwidth.py is)."
             if not shared else "Case seconds: the whole case on rank 0 (building the ops, every call, the "
             "checks), to show that spin-waits progress when ranks time-share a GPU.", "",
             "| case | verdict | max diff | dispatch us | combine us | dispatch GB/s (logical / NVLink) | "
             "combine GB/s (logical / NVLink) | note |", "|---|---|---|---|---|---|---|---|"]
    if shared:
        lines[-2:] = ["| case | verdict | max diff | case seconds | note |", "|---|---|---|---|---|"]
    for r in report:
        if shared:
            lines.append(f"| {r['case']} | {'PASS' if r['ok'] else 'FAIL'} | {r.get('max_diff', '-')} | "
                         f"{r.get('seconds', '-')} | {r.get('error', '') or r.get('note', '')} |")
            continue
        m = r.get("metrics", {})
        lines.append(f"| {r['case']} | {'PASS' if r['ok'] else 'FAIL'} | {r.get('max_diff', '-')} | "
                     f"{m.get('dispatch_us', '-')} | {m.get('combine_us', '-')} | {_gbs(m, 'dispatch')} | "
                     f"{_gbs(m, 'combine')} | {r.get('error', '') or r.get('note', '')} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "report.html").write_text(report_html(world, report, kernels, placed))


def _gbs(metrics: dict, op: str) -> str:
    """An op's bandwidth cell: logical / NVLink GB/s, or - when the case reported no times."""
    if op + "_logical_gbs" not in metrics:
        return "-"
    return f"{metrics[op + '_logical_gbs']:.1f} / {metrics[op + '_remote_gbs']:.1f}"


def report_html(world: int, report: list[dict], kernels: str, placed: str) -> str:
    """The sweep as one HTML page (well-formed XHTML, no scripts, no outside files): a row per case, a cell
    per rank coloured by its verdict, then the worst difference, times and GB/s, and the note or error."""
    from html import escape
    cell = lambda ok: (f'<td class="{"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}</td>' if ok is not None
                       else '<td class="none">-</td>')
    passed = sum(r["ok"] for r in report)
    head = "".join(f"<th>rank {r}</th>" for r in range(world))
    rows = []
    for r in report:
        ranks = r.get("ranks") or [{"ok": None}] * world
        m = r.get("metrics", {})
        rows.append(f'<tr><th class="case">{escape(r["case"])}</th>{cell(r["ok"])}'
                    + "".join(cell(x.get("ok")) for x in ranks)
                    + f'<td>{escape(str(r.get("max_diff", "-")))}</td><td>{m.get("dispatch_us", "-")}</td>'
                    f'<td>{m.get("combine_us", "-")}</td><td>{_gbs(m, "dispatch")}</td><td>{_gbs(m, "combine")}</td>'
                    f'<td>{escape(str(r.get("seconds", "-")))}</td>'
                    f'<td class="note">{escape(r.get("error", "") or r.get("note", ""))}</td></tr>')
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:3px 8px;font-size:13px;text-align:center}th.case,td.note{text-align:left}"
             ".pass{background:#c8e6c9}.fail{background:#ef9a9a;font-weight:bold}.none{color:#999}")
    return (f'<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml"><head><meta charset="utf-8"/>'
            f"<title>dispatch/combine verify sweep, world {world}</title><style>{style}</style></head><body>"
            f"<h1>dispatch/combine verify sweep, world {world}: {passed}/{len(report)} cases passed</h1>"
            f"<p>Kernels: {escape(kernels)}. {escape(placed)}</p>"
            f"<table><tr><th>case</th><th>verdict</th>{head}<th>max diff</th><th>dispatch us</th>"
            f"<th>combine us</th><th>dispatch GB/s (logical / NVLink)</th><th>combine GB/s (logical / NVLink)</th>"
            f"<th>case s</th><th>note</th></tr>{''.join(rows)}</table></body></html>\n")


# ---------------------------------------------------------------- a worker: one rank, one GPU

def worker(start: int, out: Path, only: str | None, dist_dir: str | None, gpus: int | None = None) -> None:
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = gpus or torch.cuda.device_count()
    shared = world > gpus   # ranks round-robin on the GPUs; NCCL refuses two ranks on one GPU: gloo then
    device = placement(rank, gpus)
    torch.cuda.set_device(device)
    if shared:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", device))
    host = "cpu" if shared else "cuda"   # where the verdicts are reduced (gloo: on the host)
    progress = out / "progress" / f"rank{rank}.jsonl"
    library = None
    if dist_dir:
        from kforge_runtime import Library
        library = Library(dist_dir)
    cases = [c for c in matrix(world) if only is None or only in c.name]
    for index in range(start, len(cases)):
        case = cases[index]
        mark = lambda stage: _append(progress, {"case": index, "stage": stage})
        mark("start")
        began = time.monotonic()
        try:
            ok, diff, metrics, note, sources = _run_case(case, rank, world, mark, library, shared)
            error = ""
        except Exception as e:
            ok, diff, metrics, note, sources = False, float("inf"), {}, "", []
            error = f"rank {rank}: {e!r}"
            traceback.print_exc()
        mark("verdict")
        verdict = torch.tensor([1 if ok else 0, 0], dtype=torch.float64, device=host)
        verdict[1] = diff if diff != float("inf") else 1e30
        dist.all_reduce(verdict[:1], op=dist.ReduceOp.MIN)
        dist.all_reduce(verdict[1:], op=dist.ReduceOp.MAX)
        per_rank = [None] * world   # each rank's (error, verdict, worst difference): the report's cases x ranks
        dist.all_gather_object(per_rank, (error, bool(ok), diff if diff != float("inf") else None))
        errors = [e for e, _, _ in per_rank]
        all_metrics = [None] * world
        dist.all_gather_object(all_metrics, metrics)
        if rank == 0:
            _append(out / "progress" / "results.jsonl", {
                "index": index, "case": case.name, "ok": bool(verdict[0] == 1), "max_diff": float(verdict[1]),
                "error": "; ".join(e for e in errors if e), "note": note, "metrics": _merge(all_metrics),
                "kernel_sources": sources, "seconds": round(time.monotonic() - began, 2),
                "ranks": [{"ok": r_ok, "max_diff": r_diff} for _, r_ok, r_diff in per_rank]})
        mark("done")
    if shared:   # every op gone and its mappings of the peers closed (transport.py) before any rank exits
        import gc
        gc.collect()
        torch.cuda.synchronize()
        dist.barrier()
    dist.destroy_process_group()


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _merge(per_rank: list[dict]) -> dict:
    """The slowest rank's times; bandwidth = each rank's bytes over its own time, averaged."""
    per_rank = [m for m in per_rank if m]
    if not per_rank:
        return {}
    merged = {}
    for op in ("dispatch", "combine"):
        merged[f"{op}_us"] = round(max(m[f"{op}_us"] for m in per_rank), 1)
        for kind in ("logical", "remote"):
            merged[f"{op}_{kind}_gbs"] = statistics.mean(m[f"{op}_{kind}_bytes"] / (m[f"{op}_us"] * 1e3)
                                                         for m in per_rank)
    return merged


def _run_case(case: Case, rank: int, world: int, mark, library,
              shared: bool = False) -> tuple[bool, float, dict, str, list]:
    import torch
    from kernels.ep.op import EpDispatchCombine

    cfg, note = case_config(case, world)
    expert = _expert(rank, cfg)
    if world not in built_worlds():   # no bundle holds kernels for this W (the specs sweep W): Triton's JIT
        library = None
    ops = [EpDispatchCombine(cfg, library=library, shared_gpu=shared) for _ in range(2 if case.interleaved else 1)]
    mark("built")
    runs, times = [], {"dispatch": [], "combine": []}
    if case.graph:
        runs = _graph_runs(case, cfg, rank, ops[0], expert, mark)
    else:
        for it in range(case.iterations):
            feeds = [_feed(case, cfg, rank, it * len(ops) + j) for j in range(len(ops))]
            events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            ops[0].barrier()     # the ranks' streams start the timed span together: no waiting on a late peer
            events[0].record()
            sent = [op.dispatch(*feed) for op, feed in zip(ops, feeds)]
            events[1].record()   # the checks' copies and the stand-in expert are outside the timed spans
            snaps = [_snapshot(d) for d in sent]
            ys = [expert(d.x, d.x_scales) for d in sent]
            events[2].record()
            outs = [op.combine(y, d.handle) for op, y, d in zip(ops, ys, sent)]
            events[3].record()
            runs += list(zip(feeds, snaps, outs))
            times["dispatch"].append(events)
        mark("ran")
    for op in ops:
        op.close()
    torch.cuda.synchronize()
    ok, worst = check_runs(runs, cfg, expert, case.strict, "cpu" if shared else None)
    mark("checked")
    metrics = {}
    if times["dispatch"] and not case.interleaved and not shared:
        ev = times["dispatch"][1:] or times["dispatch"]   # the first call pays Triton's JIT compile
        d_us = statistics.median(e[0].elapsed_time(e[1]) for e in ev) * 1e3
        c_us = statistics.median(e[2].elapsed_time(e[3]) for e in ev) * 1e3
        snap = runs[0][1]
        n = int(snap["num_recv"])
        remote = int((snap["src"][:n] // cfg.max_tokens_per_rank != rank).sum())
        metrics = {"dispatch_us": d_us, "combine_us": c_us,
                   "dispatch_logical_bytes": n * cfg.row_bytes, "dispatch_remote_bytes": remote * cfg.row_bytes,
                   "combine_logical_bytes": n * cfg.combine_row_bytes,
                   "combine_remote_bytes": remote * cfg.combine_row_bytes}
    sources = sorted({s for op in ops for s in op.kernels.sources.values()})
    return ok, worst, metrics, note, sources


def case_config(case: Case, world: int):
    """(EpConfig, note) of a case: its receive capacity set as the case asks, from every rank's routing (the
    cases are seeded: every rank can compute every rank's)."""
    from kernels.ep.cases import inputs
    from kernels.ep.routing import destinations
    cfg = case.config(world)
    if case.capacity == "default":
        return cfg, ""
    arriving = [int(sum(destinations(inputs(case, cfg, s)[1], cfg.experts_per_rank, world).sum(0)[r]
                        for s in range(world))) for r in range(world)]
    cap = max(arriving) if case.capacity == "exact" else max(1, max(arriving) // 2)
    return case.config(world, cap), f"capacity {cap}, rows arriving per rank {arriving}"


def check_runs(runs, cfg, expert, strict: bool, device=None) -> tuple[bool, float]:
    """(all correct, worst combine difference) of one rank's calls [(inputs, snapshot, combined)], each against
    the reference (kernels/ep/reference.py, a collective: every rank checks its calls at once): the rows
    received byte for byte, num_recv and overflow, and combine (byte-exact for strict cases). device: where
    to check ("cpu" for a gloo group, whose all-to-all takes host tensors); None: where the tensors are."""
    import torch
    from kernels.ep import reference
    if device is not None:
        moved = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t
        runs = [(tuple(map(moved, feed)), {k: moved(v) for k, v in snap.items()}, moved(out))
                for feed, snap, out in runs]
    ok, worst = True, 0.0
    for (x, idx, w, scales), snap, out in runs:
        ref = reference.dispatch(x, idx, w, cfg, x_scales=scales)
        n = ref.num_recv
        ok &= int(snap["num_recv"]) == n and bool(snap["overflow"]) == (ref.total > cfg.capacity)
        ok &= all(_same_bytes(snap[k][:n], getattr(ref, k)) for k in ("x", "topk_idx", "topk_w", "src"))
        if scales is not None:
            ok &= _same_bytes(snap["x_scales"][:n], ref.x_scales)
        want = reference.combine(expert(ref.x, ref.x_scales), ref, x.shape[0], cfg)
        if x.shape[0]:
            worst = max(worst, (out.float() - want.float()).abs().max().item())
        ok &= torch.equal(out, want) if strict else torch.allclose(out.float(), want.float(), rtol=1e-2, atol=1e-2)
    return bool(ok), worst


def _snapshot(d) -> dict:
    return {"x": d.x.clone(), "topk_idx": d.topk_idx.clone(), "topk_w": d.topk_w.clone(), "src": d.src.clone(),
            "num_recv": d.num_recv.clone(), "overflow": d.overflow.clone(),
            "x_scales": d.x_scales.clone() if d.x_scales is not None else None}


def _feed(case, cfg, rank: int, iteration: int):
    """(x, topk_idx, topk_w, x_scales) on the GPU: fp8 cases quantize the case's rows per block."""
    from kernels.ep.cases import inputs, quantize_fp8
    x, idx, w = inputs(case, cfg, rank, iteration, device="cuda")
    if cfg.num_scales:
        x, scales = quantize_fp8(x, cfg.scale_block)
        return x, idx, w, scales
    return x, idx, w, None


def _expert(rank: int, cfg):
    """A destination-specific stand-in for the experts: rows (dequantized, for fp8) times rank + 1."""
    from kernels.ep.cases import dequantize_fp8
    from kernels.ep.op import DTYPES
    out = DTYPES[cfg.combine_dtype]

    def expert(rows, scales=None):
        values = dequantize_fp8(rows, scales) if scales is not None else rows.float()
        return (values * (rank + 1)).to(out)
    return expert


def _same_bytes(a, b) -> bool:
    """Byte-exact equality (also for fp8, which torch.equal does not take everywhere)."""
    import torch
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _graph_runs(case, cfg, rank, op, expert, mark):
    """Capture dispatch + combine once; replay with new inputs copied into the captured tensors."""
    import torch
    feed_s = _feed(case, cfg, rank, 0)
    d = op.dispatch(*feed_s)            # eager first: compiles the kernels outside the capture
    op.combine(expert(d.x, d.x_scales), d.handle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = op.dispatch(*feed_s)
        out_s = op.combine(expert(d.x, d.x_scales), d.handle)
    mark("captured")
    runs = []
    for it in range(1, 4):
        feed = _feed(case, cfg, rank, it)   # same T every iteration (tokens is an int)
        for captured, new in zip(feed_s, feed):
            if captured is not None:
                captured.copy_(new)
        graph.replay()
        runs.append((feed, _snapshot(d), out_s.clone()))
    mark("replayed")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=None)
    ap.add_argument("--gpus", type=int, default=None, help="use the first G GPUs (default: all)")
    ap.add_argument("--out", default="out/verify/dispatch_combine")
    ap.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S)
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--dist", default=None, help="run the precompiled kernels of these bundles (out/dist)")
    a = ap.parse_args()
    if a.worker:
        return worker(a.start, Path(a.out), a.only, a.dist, a.gpus)
    sys.exit(run_sweep(a.world, a.out, a.timeout, a.only, a.dist, a.gpus))


if __name__ == "__main__":
    main()
