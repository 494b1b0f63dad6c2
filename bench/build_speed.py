"""Cold build of the whole catalog: `doit -n N` for several N, and an aiter-style ProcessPoolExecutor loop.

Usage: python bench/build_speed.py --jobs 1 2 [--pool 2] [--repeat 3] [--archs sm_90a,gfx942] [--specs 'fly_*']
       [--prefetch 0] [--pool-warm-parent] [--pool-server] [--pool-no-gc] [--json out.json]
A/B modes beside the defaults: --prefetch K adds `doit -n N prefetch=K` (0: doit's own scheduling, nothing
queued ahead of the workers); --pool-warm-parent adds a pool whose parent imports the compiler before
forking;
--pool-server adds a pool whose workers compile through kforge's compile server, as doit's workers do;
--pool-no-gc adds a pool whose workers run without the cyclic collector, as kforge's compile servers do.
Every run starts from an empty out/ in a fresh copy of the project, one after another in this process, after
one untimed run of every mode (without it, whichever mode ran first on a fresh machine paid for reading the
compiler from disk: that first pair was kforge's worst in each of this session's four H100 runs).
doit runs the kernel families by name: the same compile work as the pool, without `doit package`. Both are
timed as whole commands (a fresh interpreter each), so start-up and catalog loading count on both sides.
The pool loop compiles the same targets in-process in N pool workers, one pool per (toolchain, arch) whose
workers import the compiler once, one lower-and-write call per job, as aiter's and Inductor's precompile loops do.
Columns: CPU s = busy CPU seconds of the whole machine during the mode (kernel CPU s: the kernel's share;
the JSON also has user and steal seconds); page faults = the machine's, from /proc/vmstat; compiler s = seconds inside
triton.compile (or FlyDSL's compile), summed over targets; job s = seconds per job as its worker saw it
(doit: the task's action, the compile server's round trip and its import of the compiler included), summed;
jobs running, mean = job s / wall;
first / last artifact = seconds from the command's start until the first / last meta.json was written.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, run_doit  # noqa: E402
from kforge.base.archs import parse_arch_list  # noqa: E402
from kforge.plan.catalog import load_specs  # noqa: E402
from kforge.load import observe  # noqa: E402
from kforge.store import artifact  # noqa: E402
from kforge.compile import core as compile_core  # noqa: E402
from kforge.compile.action import DEFAULT_TIMEOUT_S  # noqa: E402
from kforge.plan.targets import build_targets  # noqa: E402

_worker: dict = {}


def _pool_init(toolchain: str, arch: str | None, root: str, variant: str) -> None:
    """Each pool worker imports its compiler once; FlyDSL workers serve one arch (it fixes it per process).
    variant "via compile server": each job goes through kforge's compile server (rules/compile_core.compile_here), as
    in a doit worker; "no gc": the worker runs without Python's cyclic collector, as kforge's servers do."""
    server = variant == "via compile server"
    if variant == "no gc":
        gc.freeze()
        gc.disable()
    backend = compile_core.backend_of(toolchain)
    backend.warm(root)
    if arch is not None and not server:
        backend.setup(arch)
    if not server:   # lower_and_check reads the files a compile opens through the recorder a compile server has
        observe.Recorder.install(root)
    _worker.update(backend=backend, root=root, server=server)


def pool_compile(target) -> tuple[bool, float, float]:
    """(ok, seconds of the job, seconds inside the compiler)."""
    start = time.perf_counter()
    if _worker.get("server"):   # kforge's compile path without doit: a warm compile server forked per worker
        outcome = compile_core.compile_here(target, _worker["root"], DEFAULT_TIMEOUT_S)
        if outcome.ok:   # written as the doit action writes it
            artifact.install(target, outcome.result)
        return outcome.ok, time.perf_counter() - start, outcome.result.result.compile_seconds if outcome.ok else 0.0
    scratch = tempfile.mkdtemp()
    try:
        candidate = compile_core.lower_and_check(_worker["backend"], (target, scratch, DEFAULT_TIMEOUT_S, None))
        artifact.install(target, candidate)
        return True, time.perf_counter() - start, candidate.result.compile_seconds
    except Exception:
        return False, time.perf_counter() - start, 0.0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pool_build(project: Path, workers: int, archs, variant: str = "") -> dict:
    """aiter-style: a ProcessPoolExecutor maps lower-and-write over the targets: one pool for all Triton targets
    (Triton takes the arch per compile), one per arch for FlyDSL (one arch per process). variant "warm parent":
    the parent imports the compiler before the pool forks its workers, as `doit -n N` does."""
    targets = build_targets(load_specs(project), project, archs)
    if variant == "warm parent":
        for toolchain in sorted({t.toolchain for t in targets}):
            compile_core.backend_of(toolchain).warm(str(project))
    groups: dict[tuple[str, str | None], list] = {}
    for t in targets:
        groups.setdefault((t.toolchain, t.arch if t.toolchain == "flydsl" else None), []).append(t)
    jobs = []
    for (toolchain, arch), group in groups.items():
        with ProcessPoolExecutor(max_workers=workers, initializer=_pool_init,
                                 initargs=(toolchain, arch, str(project), variant)) as pool:
            jobs += pool.map(pool_compile, group, chunksize=1)
    return {"targets": sum(ok for ok, _, _ in jobs), "job_seconds": sum(s for _, s, _ in jobs),
            "compile_seconds": sum(c for _, _, c in jobs)}


def time_pool(project: Path, workers: int, archs_text: str | None, variant: str) -> tuple[float, dict]:
    """The pool loop as a command of its own, timed from outside like `doit`: interpreter start, imports
    and loading the catalog count for both."""
    cmd = [sys.executable, __file__, "--pool-child", str(project), str(workers), "--pool-variant", variant] + \
        (["--archs", archs_text] if archs_text else [])
    started_at, start = time.time(), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, {**json.loads(out.stdout.strip().splitlines()[-1]),
                                         **artifact_span(project, started_at)}


def artifact_span(project: Path, started_at: float) -> dict:
    """Seconds from the command's start to the first and the last meta.json written (start-up and tail)."""
    times = sorted(m.stat().st_mtime for m in (project / "out").glob("*/*/*/meta.json"))
    return {"first_artifact_s": round(times[0] - started_at, 2), "last_artifact_s": round(times[-1] - started_at, 2)} \
        if times else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pool", type=int, nargs="*", default=[])
    ap.add_argument("--archs", default=None)
    ap.add_argument("--specs", default="*", help="glob of spec names to build, e.g. 'fly_*'")
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="repetitions, alternating the order of the modes")
    ap.add_argument("--prefetch", type=int, nargs="*", default=[], help="extra doit modes with prefetch=K")
    ap.add_argument("--pool-warm-parent", action="store_true",
                    help="pool modes whose parent imports the compiler before forking (as doit -n N does)")
    ap.add_argument("--pool-server", action="store_true",
                    help="also pool modes whose workers compile through kforge's compile server (no doit)")
    ap.add_argument("--pool-no-gc", action="store_true",
                    help="also pool modes whose workers run without Python's cyclic collector (as kforge's servers)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="one untimed run of every mode first (default; --no-warmup skips it)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--pool-child", nargs=2, default=None, metavar=("PROJECT", "WORKERS"))
    ap.add_argument("--pool-variant", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    archs = parse_arch_list(a.archs, "--archs") if a.archs else None
    if a.pool_child:
        print(json.dumps(pool_build(Path(a.pool_child[0]), int(a.pool_child[1]), archs, a.pool_variant)))
        return
    work = Path(a.workdir or tempfile.mkdtemp(prefix="kforge-bench-"))
    doit_envs = [{}]
    pool_variants = [""] + [v for v, on in (("warm parent", a.pool_warm_parent), ("via compile server", a.pool_server),
                                            ("no gc", a.pool_no_gc)) if on]
    runs = [("doit", (n, None, env)) for n in a.jobs for env in doit_envs] + \
        [("doit", (n, k, {})) for n in a.jobs for k in a.prefetch] + \
        [("pool", (n, variant)) for n in a.pool for variant in pool_variants]
    if len(pool_variants) > 1 and not a.pool:
        ap.error("--pool-warm-parent, --pool-server and --pool-no-gc need --pool N")
    if a.warmup:   # untimed: the first build on a fresh machine reads the compiler and Python's bytecode from disk
        for kind, n in runs:
            run_doit_mode(work, n, a) if kind == "doit" else run_pool_mode(work, n, a)
        print("warm-up round done (not counted)", flush=True)
    rows = []
    for rep in range(a.repeat):   # odd repetitions run the modes in reverse order: no mode always goes first
        for kind, n in (runs if rep % 2 == 0 else runs[::-1]):
            before = machine_counters()
            row = run_doit_mode(work, n, a) if kind == "doit" else run_pool_mode(work, n, a)
            after = machine_counters()
            row.update(repetition=rep + 1, **{k: round(after[k] - before[k], 1) for k in after})
            rows.append(row)
            print(f"{row['mode']} (repetition {rep + 1}): {row['seconds']:.1f} s, {row['targets']} built", flush=True)
            if a.json:   # after every row: a run cut short by a time limit keeps what it measured
                Path(a.json).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))
    print_table(rows)


def machine_counters() -> dict:
    """Busy CPU seconds of the whole machine so far (/proc/stat), user and kernel apart, and its page faults
    (/proc/vmstat): a mode's whole compile work (workers, compile servers, ptxas), whoever reaps its
    processes; the bench machines run nothing else meanwhile."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) / os.sysconf("SC_CLK_TCK") for f in fields[:8])
    vmstat = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {"cpu_seconds": user + nice + system + irq + softirq + steal, "cpu_user_seconds": user + nice,
            "cpu_kernel_seconds": system + irq + softirq, "cpu_steal_seconds": steal,   # steal: a VM's host took it
            "page_faults_k": int(vmstat.get("pgfault", 0)) / 1000}


def run_doit_mode(work: Path, mode: tuple[int, int | None, dict], a) -> dict:
    n, prefetch, env = mode
    project = fresh_copy(work / f"doit-n{n}", a.specs)
    extra = ([f"archs={a.archs}"] if a.archs else []) + ([f"prefetch={prefetch}"] if prefetch is not None else [])
    families = sorted(p.stem for p in (project / "specs").glob("*.toml"))   # the compiles, not `package`
    started_at = time.time()
    # the local cache off: a cold build compiles (else it installs what the build before it compiled)
    seconds = run_doit(project, "-n", str(n), *extra, *families, env={"KFORGE_LOCAL_CACHE": "off", **env})
    report = json.loads((project / "out" / "build-report.json").read_text())
    tasks = report["tasks"]
    label = f"doit -n {n}" + (f" prefetch={prefetch}" if prefetch is not None else "") + \
        "".join(f" {k}={v}" for k, v in env.items())
    return {"mode": label, "n": n, "seconds": seconds, "targets": report["counts"]["built"],
            "failed": report["counts"]["failed"], "job_seconds": sum(t["seconds"] for t in tasks),
            "compile_seconds": sum(t.get("compile_seconds", 0.0) for t in tasks), **artifact_span(project, started_at)}


def run_pool_mode(work: Path, mode: tuple[int, str], a) -> dict:
    n, variant = mode
    project = fresh_copy(work / f"pool-{n}", a.specs)
    seconds, result = time_pool(project, n, a.archs, variant)
    label = f"ProcessPoolExecutor({n})" + (f" {variant}" if variant else "")
    return {"mode": label, "n": n, "seconds": seconds, "failed": 0, **result}


def print_table(all_rows: list[dict]) -> None:
    """One table per repetition, then the median of each ratio over the repetitions."""
    ratios: dict[str, list[float]] = {}
    for rep in sorted({r["repetition"] for r in all_rows}):
        rows = [r for r in all_rows if r["repetition"] == rep]
        base = next((r["seconds"] for r in rows if r["mode"] == "doit -n 1"), None)
        print(f"\nrepetition {rep} on {platform.node()} {os.cpu_count()} CPUs, python {platform.python_version()}")
        print("| mode | targets | wall s | targets/s | CPU s | kernel CPU s | page faults, k | compiler s | job s "
              "| jobs running, mean | first / last artifact s | speedup vs -n 1 | speedup / N | vs pool at same N |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            pool = next((p for p in rows if p["mode"] == f"ProcessPoolExecutor({r['n']})"), None)
            speed = base / r["seconds"] if base else None
            vs_pool = (pool["seconds"] / r["seconds"]) if pool and r is not pool else None
            if speed and r["mode"].startswith("doit") and r["n"] > 1:
                ratios.setdefault(f"{r['mode']} speedup / N", []).append(speed / r["n"])
            if vs_pool:
                ratios.setdefault(f"{r['mode']} vs pool", []).append(vs_pool)
            if r["mode"].startswith(f"doit -n {r['n']} "):   # an A/B variant: the default's speed over this one's
                default = next((d for d in rows if d["mode"] == f"doit -n {r['n']}"), None)
                if default:
                    ratios.setdefault(f"doit -n {r['n']} vs {r['mode']}", []).append(r["seconds"] / default["seconds"])
            fmt = lambda x, f: f.format(x) if x is not None else "-"
            print(f"| {r['mode']} | {r['targets']} | {r['seconds']:.1f} | {r['targets'] / r['seconds']:.1f} | "
                  f"{r['cpu_seconds']} | {r.get('cpu_kernel_seconds', '-')} | {r.get('page_faults_k', '-')} | "
                  f"{r['compile_seconds']:.1f} | {r['job_seconds']:.1f} | "
                  f"{r['job_seconds'] / r['seconds']:.2f} | "
                  f"{r.get('first_artifact_s', '-')} / {r.get('last_artifact_s', '-')} | "
                  f"{fmt(speed, '{:.2f}')} | {fmt(speed / r['n'] if speed else None, '{:.2f}')} | "
                  f"{fmt(vs_pool, '{:.2f}')} |")
    for name, values in ratios.items():
        spread = ""
        if len(values) > 2:   # a 95% interval of the mean ratio (normal approximation)
            half = 1.96 * statistics.stdev(values) / len(values) ** 0.5
            spread = f", mean {statistics.mean(values):.3f} +- {half:.3f}"
        print(f"{name}: {', '.join(f'{v:.2f}' for v in values)}; median {statistics.median(values):.2f}{spread}")


if __name__ == "__main__":
    main()
