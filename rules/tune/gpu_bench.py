"""The GPU half of `doit tune`, a process of its own (rules/tune/tasks.py starts it): benchmark every built config
of one family on its [tune] shapes on the local GPU, launched from their checked artifacts through the runtime
loader as an application would, and write the ranking to out/tune/<arch>/<kernel>.json. A config's time counts
only once it reproduced torch's result on the shape.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import gc
import importlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

from kforge.store import artifact
from kforge.load import sources
from kforge.store.files import write_inside
from kforge.store.guard import OutsideOut, guard, remove_file
from kforge.base.layout import Layout
from kforge_runtime.device import identity
from kforge_runtime.launch import TORCH_DTYPES, Kernel
from kforge_runtime.schema import TUNE_FORMAT
from kforge_runtime.select import handles
from kforge.declare.spec import load_spec
from kforge.plan.targets import spec_targets

WARMUP = 3
BUDGET_MS = 25.0                 # GPU time spent timing one config on one shape...
MIN_RUNS, MAX_RUNS = 7, 100      # ...within these bounds
BATCH = 25                       # launches queued behind one GPU sleep
ROTATE_BYTES_OVER_L2 = 2         # input copies rotated so one launch's data left L2 before it runs again
MAX_COPIES = 64
GIVE_UP_OVER_BEST = 3.0          # a config whose first run is 3x the best so far is ranked by that run alone


def median_us(launch, copies: int, give_up_over_us: float = math.inf) -> tuple[float, int]:
    """(median GPU time of launch(i) in microseconds, runs timed), launch(i) on copy i % copies so that consecutive
    runs read different memory. A first run slower than give_up_over_us is returned alone: it cannot win."""
    for i in range(WARMUP):
        launch(i % copies)
    first_us = _timed_batch(launch, copies, 0, 1)[0]
    if first_us > give_up_over_us:
        return first_us, 1
    runs = int(min(MAX_RUNS, max(MIN_RUNS, BUDGET_MS * 1e3 / max(first_us, 1e-3))))
    times: list[float] = []
    for first in range(0, runs, BATCH):
        times += _timed_batch(launch, copies, first, min(BATCH, runs - first))
    return statistics.median(times), runs


class TimingUnsettled(RuntimeError):
    """The GPU kept waking before a batch was queued: the CPU was too busy to time this config just now."""


def _timed_batch(launch, copies: int, first: int, n: int) -> list[float]:
    """Per-launch GPU times of n launches queued behind a GPU sleep that outlasts queueing them (no CPU launch
    overhead in the times); if the GPU woke first anyway, redone behind a sleep twice as long."""
    import torch
    clock = _clock()
    margin = 2.0
    for _ in range(BATCH_TRIES):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        awake = torch.cuda.Event()
        sleep_us = min(SLEEP_CAP_US, margin * n * _queue_us["per_launch"] + 20)
        gc.disable()   # a collection mid-batch would stall the queueing
        try:
            torch.cuda._sleep(int(sleep_us * clock))
            awake.record()
            start = time.perf_counter()
            for j, (begin, end) in enumerate(events):
                begin.record()
                launch((first + j) % copies)
                end.record()
            queued_us = (time.perf_counter() - start) * 1e6 / n
            woke_early = awake.query()
        finally:
            gc.enable()
        torch.cuda.synchronize()
        _queue_us["per_launch"] = max(queued_us, 0.8 * _queue_us["per_launch"])
        if not woke_early:
            return [begin.elapsed_time(end) * 1e3 for begin, end in events]
        margin *= 2
    raise TimingUnsettled(f"the GPU woke before {n} launches were queued, {BATCH_TRIES} times, behind sleeps of "
                          f"up to {sleep_us / 1e3:.0f} ms; is the CPU overloaded?")


BATCH_TRIES = 8          # fresh batches behind ever longer sleeps before a config's timing is put off
SLEEP_CAP_US = 500_000   # the longest sleep a batch waits behind
CONFIG_TRIES = 3         # a config whose timing stayed unsettled is timed again, after a pause, this often


_queue_us = {"per_launch": 100.0}   # CPU time to queue one launch and its events, as last measured


@functools.cache
def _clock() -> float:
    """GPU clock cycles per microsecond as torch.cuda._sleep counts them, measured once."""
    import torch
    cycles = 20_000_000
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (begin.elapsed_time(end) * 1e3)


def copies_needed(problem: dict) -> int:
    """How many input sets to rotate through so that consecutive runs of a small shape miss in L2."""
    import torch
    tensors = [v for v in problem["args"].values() if isinstance(v, torch.Tensor)]
    size = sum(t.numel() * t.element_size() for t in tensors) or 1
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES_OVER_L2 * l2 / size)))


def check_result(problem: dict, want) -> str | None:
    """None when the output matches torch's result `want` within the problem's tolerance, else why not."""
    got = problem["output"].float()
    err = (got - want).abs()
    bad = err > problem["atol"] + problem["rtol"] * want.abs()
    if bool(bad.any()) or not bool(got.isfinite().all()):
        return f"wrong result: max abs error {float(err.max()):.3g}, {int(bad.sum())} of {bad.numel()} values off"
    return None


def make_launch(harness, kernel, shape: dict, problems: list[dict]):
    """launch(i): one run of the kernel on problems[i], after the harness's prepare (timed too: callers pay it)."""
    config = kernel.entry["config"]
    grid = harness.grid(shape, config)
    order = [a["name"] for a in kernel.entry["signature"]]
    arg_lists = [[p["args"][name] for name in order] for p in problems]
    prepare = getattr(harness, "prepare", None)

    def launch(i: int) -> None:
        if prepare is not None:
            prepare(problems[i], config)
        kernel(grid, *arg_lists[i])
    return launch


def make_problems(harness, shape: dict, types: dict, device) -> tuple[list[dict], object]:
    """The shape's problem, copied as often as rotation past L2 needs, and torch's result for the first."""
    problems = [harness.problem(shape, types, device)]
    problems += [harness.problem(shape, types, device) for _ in range(copies_needed(problems[0]) - 1)]
    return problems, problems[0]["reference"]()


def checked_time(launch, problems: list[dict], expected, give_up_over_us: float = math.inf):
    """(median us, runs) of launch once its first run reproduced `expected`; else why not, as a string."""
    import torch
    try:
        problems[0]["output"].fill_(float("nan"))
        launch(0)
        torch.cuda.synchronize()
        wrong = check_result(problems[0], expected)
    except Exception as e:   # a refused launch (resources, arguments) rejects this config; a fault that
        wrong = f"launch failed: {e}"   # breaks the CUDA context fails the next call, and the run, loudly
    return wrong or median_us(launch, len(problems), give_up_over_us)


def tune_shape(harness, shape: dict, where: dict, kernels: list, device) -> dict:
    """One tuned shape: every config's median time, fastest first, and the configs that may not win."""
    import torch
    types = {name: getattr(torch, TORCH_DTYPES[value].split(".")[1]) for name, value in where.items()}
    problems, expected = make_problems(harness, shape, types, device)
    ranking, rejected = [], []
    for kernel in kernels:
        entry = kernel.entry
        if not handles(entry, shape):
            rejected.append({"config_id": entry["config_id"], "why": "its divisibility promises exclude this shape"})
            continue
        best = min((r["us"] for r in ranking), default=math.inf)
        timed = _settled(lambda: checked_time(make_launch(harness, kernel, shape, problems), problems, expected,
                                              GIVE_UP_OVER_BEST * best))
        if isinstance(timed, str):
            rejected.append({"config_id": entry["config_id"], "why": timed})
            continue
        us, runs = timed
        ranking.append({"config_id": entry["config_id"], "us": round(us, 3), "runs": runs})
    ranking.sort(key=lambda r: r["us"])
    return {"shape": list(shape.values()), "where": where, "copies": len(problems), "ranking": ranking,
            "rejected": rejected}


def _settled(time_it):
    """time_it(), again after a pause when it was TimingUnsettled; after CONFIG_TRIES, the reason (rejected)."""
    for attempt in range(CONFIG_TRIES):
        try:
            return time_it()
        except TimingUnsettled as e:
            reason = f"not timed: {e}"
            sys.stderr.write(f"kforge: tune: {e} (try {attempt + 1} of {CONFIG_TRIES})\n")
            time.sleep(0.5 * (attempt + 1))
    return reason


def progress_path(out: Path) -> Path:
    """Where finished rankings are kept while a tuning runs: a run that stopped resumes from them."""
    return out.with_name(f".{out.name}.partial")


def load_progress(path: Path, key: str) -> dict[str, dict]:
    """The rankings a stopped run of the same tuning key finished, by shape and where; {} for any other."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        saved = json.loads(path.read_bytes())
        if saved.get("key") == key and isinstance(saved.get("shapes"), dict):
            return saved["shapes"]
    return {}


def save_progress(path: Path, key: str, shapes: dict[str, dict]) -> None:
    write_inside(Layout.holding(path).out, path, json.dumps({"key": key, "shapes": shapes}).encode())


def shape_id(shape: dict, where: dict) -> str:
    return json.dumps([shape, where], sort_keys=True)


def load_kernels(spec, arch: str, root: Path) -> list:
    """Every config of the family built for `arch` from its current key, loaded from its checked artifact."""
    kernels = []
    for t in spec_targets(spec, root, (arch,)):
        try:
            meta, binary = artifact.load(Path(t.out_dir))
        except artifact.ArtifactError:
            continue   # not built (or failed): it is not in the bundle either
        if meta.get("key") == t.key:
            kernels.append(Kernel(meta, binary, meta["vendor"]))
    return kernels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--key", required=True, help="the tuning key rules/tune/tasks.py computed (stored in the table)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    root = Path.cwd()
    spec = load_spec(root / args.spec, root)
    gpu = identity()
    if args.arch not in gpu["archs"]:
        sys.stderr.write(f"kforge: tuning {spec.name} for {args.arch} needs a GPU that runs it; this is "
                         f"{gpu['name']} ({', '.join(gpu['archs'])})\n")
        return 2
    import torch
    torch.empty(1, device="cuda")   # torch's context first: the loader then launches into the same one
    sys.path.insert(0, str(root))
    harness = importlib.import_module(sources.module_name(root / spec.tune.harness, root))
    kernels = load_kernels(spec, args.arch, root)
    if not kernels:
        sys.stderr.write(f"kforge: no built {spec.name} artifacts for {args.arch}; build them first "
                         f"(`doit {spec.name} archs={args.arch}`)\n")
        return 2
    groups: dict[tuple, list] = {}
    for k in kernels:   # one ranking per value of the type variables (dtype): the caller's data fixes those
        groups.setdefault(tuple((v, k.entry["config"][v]) for v in spec.type_vars), []).append(k)
    device = torch.device("cuda", torch.cuda.current_device())
    shapes = []
    out, out_root = root / args.out, Layout(root).out
    try:
        guard(out_root, out)   # before the hours of timing: out/tune must not lead outside out/
        guard(out_root, Layout(root).tune / ".gpu.lock")
    except OutsideOut as e:
        sys.stderr.write(f"kforge: {e}\n")
        return 2
    progress = progress_path(out)
    done = load_progress(progress, args.key)
    if done:
        sys.stderr.write(f"kforge: tune {spec.name}@{args.arch}: resuming; {len(done)} rankings kept from a "
                         f"run that stopped\n")
    lock = _hold_gpu(Layout(root).tune, device.index)   # another tuning on this GPU would skew both
    started = time.perf_counter()
    for values in spec.tune.shapes:
        shape = dict(zip(spec.tune.shape_args, values))
        for where, mine in sorted(groups.items()):
            sid = shape_id(shape, dict(where))
            if sid not in done:
                began = time.perf_counter()
                done[sid] = result = tune_shape(harness, shape, dict(where), mine, device)
                save_progress(progress, args.key, done)
                best = result["ranking"][0] if result["ranking"] else None
                sys.stderr.write(f"kforge: tune {spec.name}@{args.arch} {shape} {dict(where)}: "
                                 + (f"best {best['config_id']} {best['us']:.1f} us" if best else "no config passed")
                                 + f" ({len(result['rejected'])} rejected, {time.perf_counter() - began:.1f} s)\n")
                torch.cuda.empty_cache()
            shapes.append(done[sid])
    table = {"format": TUNE_FORMAT, "kernel": spec.name, "arch": args.arch, "key": args.key, "gpu": gpu,
             "torch": torch.__version__, "shape_args": list(spec.tune.shape_args), "where_args": list(spec.type_vars),
             "method": {"warmup": WARMUP, "budget_ms": BUDGET_MS, "runs": [MIN_RUNS, MAX_RUNS],
                        "single_run_when_over_best": GIVE_UP_OVER_BEST,
                        "statistic": "median of per-launch CUDA event times, launch overhead hidden",
                        "rotation": f"inputs rotated over >= {ROTATE_BYTES_OVER_L2}x L2"},
             "seconds": round(time.perf_counter() - started, 1), "shapes": shapes}
    lock.close()
    write_inside(out_root, out, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode())
    remove_file(out_root, progress)
    return 0


def _hold_gpu(directory: Path, index: int):
    """An exclusive lock per GPU, held until the returned file is closed: another tuning waits its turn."""
    lock = guard(directory.parent, directory / f".gpu{index}.lock")   # directory: out/tune
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


if __name__ == "__main__":
    sys.exit(main())
