"""The example project's own doit task for its MoE dispatch/combine op; dodo.py picks it up when kernels/ep/
is there. Imports nothing heavy: torch is imported only when the sweep runs."""
from __future__ import annotations

from pathlib import Path

from doit import get_var

from kforge.base.layout import Layout
from kforge.store.guard import OutsideOut, guard

ROOT = Path(__file__).resolve().parents[2]


def task_verify_dispatch_combine():
    """The verify sweep of the MoE dispatch/combine kernels: one process per rank (world=N), on their own GPUs or
    sharing them round-robin when N is above the GPUs (gpus=G: use the first G GPUs only)."""
    def run(world: str | None, gpus: str | None):
        from doit.exceptions import TaskError, TaskFailed

        from kernels.ep.verify import run_sweep
        numbers = {}
        for name, value in (("world", world), ("gpus", gpus)):
            if value is not None and not value.isdigit():
                return TaskError(f"verify_dispatch_combine: {name}={value!r} is not a whole number (e.g. {name}=2)")
            numbers[name] = int(value) if value else None
        layout = Layout(ROOT)
        dist = layout.dist   # the op runs the bundled ep_* kernels when `doit package` made them
        report = layout.verify / "dispatch_combine"
        try:   # nothing written through a link under out/ that leads outside it
            for path in (report / "report.json", report / "progress" / "results.jsonl"):
                guard(layout.out, path)
        except OutsideOut as e:
            return TaskError(f"verify_dispatch_combine: {e}")
        code = run_sweep(numbers["world"], str(report),
                         dist_dir=str(dist) if list(dist.glob("*.whl")) else None, gpus=numbers["gpus"])
        if code == 2:
            return TaskFailed("verify_dispatch_combine could not run (see the message above)")
        return None if code == 0 else TaskFailed("some cases failed: out/verify/dispatch_combine/report.md")
    return {"actions": [(run, [get_var("world", None), get_var("gpus", None)])], "uptodate": [False],
            "verbosity": 2}
