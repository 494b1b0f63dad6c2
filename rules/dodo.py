"""What a project's dodo.py imports to build its kernels with kforge:

    from kforge.dodo import *  # noqa: F401,F403

The project is the folder doit runs in (by default the dodo.py's own folder; `doit -d DIR` picks another): its
specs (specs/, or `[tool.kforge] catalog` in its pyproject.toml) are the catalog, and its out/ gets the builds.
"""
from pathlib import Path

from kforge.edge import config as doit_edge, dodo_tasks as project

__all__ = ["DOIT_CONFIG", "task_kernels", "task_package", "task_tune"]

ROOT = Path.cwd().resolve()
doit_edge.pause_gc_until_tasks_run()   # what is loaded now lives until exit: see rules/edge/config.py
CATALOG = project.load_catalog(ROOT)   # specs -> families and targets (rules/plan/catalog.py)
DOIT_CONFIG = doit_edge.config(ROOT, CATALOG)


def task_kernels():
    """One task per target, grouped by kernel family (`doit gemm`)."""
    yield from project.compile_tasks(ROOT, CATALOG)


def task_package():
    """One wheel per arch in out/dist/: the built artifacts, their manifest, and the runtime loader."""
    yield from project.bundle_tasks(ROOT, CATALOG)


def task_tune():
    """Not a default task: on a GPU, rank each [tune] family's configs per shape (out/tune/<arch>/)."""
    yield from project.tuning_tasks(ROOT, CATALOG)
