"""What a project's dodo.py imports to build its kernels with kforge:

    from kforge.dodo import *  # noqa: F401,F403

The project is the folder doit runs in (by default the dodo.py's own folder; `doit -d DIR` picks another): its
specs (specs/, or `[tool.kforge] catalog` in its pyproject.toml) are the catalog, and its out/ gets the builds.
"""
from pathlib import Path

from kforge.edge import config, dodo_tasks

__all__ = ["DOIT_CONFIG", "task_kernels", "task_package", "task_tune"]

ROOT = Path.cwd().resolve()
config.pause_gc_until_tasks_run()   # what is loaded now lives until exit: see rules/edge/config.py
config.check_settings()   # a malformed setting: one line and exit code 2, before anything is read
config.check_command(ROOT)   # doit's own forget/info/clean where kforge's were meant: one line, exit code 2
CATALOG = dodo_tasks.load_catalog(ROOT)   # specs -> families and targets (rules/plan/catalog.py)
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
