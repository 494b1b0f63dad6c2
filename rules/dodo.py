"""What a project's dodo.py imports to build its kernels with kforge:

    from kforge.dodo import *  # noqa: F401,F403

The project is the folder doit runs in (by default the dodo.py's own folder; `doit -d DIR` picks another): its
specs (specs/, or `[tool.kforge] catalog` in its pyproject.toml) are the catalog, and its out/ gets the builds.
"""
import sys
from pathlib import Path

from kforge.edge import config, dodo_tasks

__all__ = ["DOIT_CONFIG", "task_kernels", "task_package", "task_tune"]



def _importers_tasks() -> set[str]:
    """The tasks the project's dodo.py defines itself (`def task_x`, `from m import task_x`, under an `if` too): the
    task_* names its module code binds (stores: an attribute `helpers.task_x` is none), read off that code while it
    runs this import (the rest of it has not run yet). Empty where no module's top level imports this one (a test,
    a script)."""
    import dis
    frame = sys._getframe(2)   # below this module's own code: the import system, then the importer
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "<module>":
        return set()
    bound = {i.argval for i in dis.get_instructions(frame.f_code) if i.opname in ("STORE_NAME", "STORE_GLOBAL")}
    return {name[5:] for name in bound if name.startswith("task_") and len(name) > 5}


ROOT = Path.cwd().resolve()
config.pause_gc_until_tasks_run()   # what is loaded now lives until exit: see rules/edge/config.py
config.check_settings()   # a malformed setting: one line and exit code 2, before anything is read
config.check_command(ROOT)   # doit's own forget/info/clean where kforge's were meant: one line, exit code 2
CATALOG = dodo_tasks.load_catalog(ROOT, _importers_tasks())   # specs -> families, targets (rules/plan/catalog.py)
DOIT_CONFIG = config.config(ROOT, CATALOG)


def task_kernels():
    """One task per target, grouped by kernel family (`doit gemm`)."""
    yield from dodo_tasks.compile_tasks(ROOT, CATALOG)


def task_package():
    """One wheel per arch in out/dist/: the built artifacts, their manifest, and the runtime loader."""
    yield from dodo_tasks.package_tasks(CATALOG.targets, str(ROOT), CATALOG.tuned, CATALOG.broken)


def task_tune():
    """Not a default task: on a GPU, rank each [tune] family's configs per shape (out/tune/<arch>/)."""
    from kforge.tune.tasks import tune_tasks
    yield from tune_tasks(CATALOG.families, CATALOG.targets, str(ROOT))
