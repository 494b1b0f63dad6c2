"""The glue dodo.py calls: find specs, choose archs from the command line, configure doit."""
from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

from doit import get_var

from kforge import artifact, cpus, doit_runner, out_dir, remote_cache, report, settings
from kforge.doit_commands import run_after_failed_deps
from kforge.build import check_environment, warm_before_fork
from kforge.spec import SpecError, load_spec
from kforge.targets import build_targets
from kforge.tasks import family_tasks, package_tasks


def load_specs(root: Path) -> list:
    files = sorted((root / "specs").glob("*.toml"))
    if not files:
        raise SpecError(f"{root / 'specs'}: no *.toml specs found")
    return [load_spec(f, root) for f in files]


def arch_filter() -> tuple[str, ...] | None:
    return _setting("archs")


def _setting(name: str):
    """A setting's value (rules/settings.py), or one line naming it and exit code 2."""
    try:
        return settings.get(name)
    except ValueError as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)


def doit_config(root: Path, specs: list, targets: list) -> dict:
    out = root / "out"
    out.mkdir(exist_ok=True)
    orphans = functools.partial(out_dir.orphaned, out, [t.out_dir for t in targets], arch_filter())
    reporter = type("BuildReporter", (report.BuildReporter,), {"report_path": str(out / "build-report.json"),
                                                                "find_orphans": staticmethod(orphans)})
    _sigterm_as_interrupt()
    _interrupt_without_traceback()
    run_after_failed_deps()
    try:
        check_environment()
    except ValueError as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)
    max_workers, cap_reason = _compile_cap()
    doit_runner.install(before_fork=functools.partial(warm_before_fork, root=str(root)),
                        prefetch=_setting("prefetch"), max_workers=max_workers, cap_reason=cap_reason)
    return {
        "backend": "sqlite3",
        "dep_file": str(out / ".doit.sqlite3"),
        "continue": True,            # one failed target never stops the others
        "reporter": reporter,
        "default_tasks": [s.name for s in specs] + ["package"],
        "num_process": max_workers or cpus.available(),   # a plain `doit` compiles on every CPU it may use
    }


def _compile_cap() -> tuple[int | None, str]:
    """(most workers, why) for this run: None when compiles run on a cluster, not on this machine's CPUs."""
    if _setting("executor") is not None:
        return None, ""
    cap = _setting("max_compiles")
    return cap, settings.source("max_compiles") or f"the {report.plural(cap, 'CPU')} this process may use"


def load_catalog(root: Path) -> tuple[list, list]:
    """(specs, targets) for the archs chosen on the command line, or one clear error and exit code 2."""
    try:
        specs = load_specs(root)
        return specs, build_targets(specs, root, root / "out", arch_filter())
    except (SpecError, ValueError) as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)


def compile_tasks(root: Path, specs: list, targets: list):
    """All compile tasks, grouped by family (a generator for dodo.py)."""
    by_family: dict[str, list] = {s.name: [] for s in specs}
    for t in targets:
        by_family[t.kernel].append(t)
    timeout, executor, url = _setting("timeout"), _setting("executor"), _setting("cache")
    cache = remote_cache.CacheConfig(url, _setting("cache_readonly"), _setting("cache_timeout")) if url else None
    built = artifact.KeyIndex(root / "out" / ".kforge" / "built-keys.json")
    for spec in specs:
        yield from family_tasks(spec.name, spec.description, by_family[spec.name], str(root), timeout, built,
                                cache, executor)
    built.save()


def _sigterm_as_interrupt() -> None:
    """SIGTERM ends a build like Ctrl-C: doit stops its workers and saves its state.

    Only in the doit master. A forked worker restores the default action as it starts (rules/doit_runner.py);
    until then it inherits this handler, which must not raise there: the master stops its workers with
    SIGTERM and stops reading their queue, so a worker that raised KeyboardInterrupt would block on that
    queue at exit. A worker dies at once instead (its compile child follows, via PDEATHSIG).
    """
    master = os.getpid()

    def handler(signum, frame):
        if os.getpid() != master:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise KeyboardInterrupt
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, handler)


def _interrupt_without_traceback() -> None:
    """An interrupted build ends with one line, not a Python traceback from wherever doit was waiting. The
    exit status stays Python's for an unhandled KeyboardInterrupt (killed by SIGINT: 130 in a shell)."""
    default = sys.excepthook

    def hook(kind, value, traceback):
        if issubclass(kind, KeyboardInterrupt):
            sys.stderr.write("kforge: interrupted. Every task finished so far is kept; run the same command "
                             "again to do the rest.\n")
        else:
            default(kind, value, traceback)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = hook


def bundle_tasks(root: Path, targets: list):
    """`doit package`: one wheel per arch (a generator for dodo.py)."""
    yield from package_tasks(targets, str(root))


def tuning_tasks(root: Path, specs: list, targets: list):
    """`doit tune` (a generator for dodo.py); rules/tune.py says when a table is current."""
    from kforge.tune import tune_tasks
    yield from tune_tasks(specs, targets, str(root))


def verify_task(root: Path) -> dict:
    """`doit verify_dispatch_combine [world=N]`: the multi-GPU sweep (kernels/ep/verify.py); never up to date."""
    def run(world: str | None):
        from doit.exceptions import TaskFailed
        from kernels.ep.verify import run_sweep   # imports torch: only when the sweep runs
        dist_dir = root / "out" / "dist"   # the op runs the bundled ep_* kernels when `doit package` made them
        code = run_sweep(int(world) if world else None, str(root / "out" / "verify" / "dispatch_combine"),
                         dist_dir=str(dist_dir) if list(dist_dir.glob("*.whl")) else None)
        if code == 2:
            return TaskFailed("verify_dispatch_combine could not run (see the message above)")
        return None if code == 0 else TaskFailed("some cases failed: out/verify/dispatch_combine/report.md")
    return {"actions": [(run, [get_var("world", None)])], "uptodate": [False], "verbosity": 2}
