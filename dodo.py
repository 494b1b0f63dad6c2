"""kforge: `doit -n 16` compiles every (kernel, config, arch) declared in specs/. See README.md."""
from pathlib import Path

from kforge import doit_edge, project

ROOT = Path(__file__).resolve().parent
doit_edge.pause_gc_until_tasks_run()   # what is loaded now lives until exit: see rules/doit_edge.py
CATALOG = project.load_catalog(ROOT)   # specs -> families and targets (rules/catalog.py)
DOIT_CONFIG = doit_edge.config(ROOT, CATALOG)

if (ROOT / "kernels" / "ep" / "tasks.py").is_file():   # this checkout's example op: `doit verify_dispatch_combine`
    from kernels.ep.tasks import task_verify_dispatch_combine  # noqa: F401


def task_kernels():
    """One task per target, grouped by kernel family (`doit gemm`)."""
    yield from project.compile_tasks(ROOT, CATALOG)


def task_package():
    """One wheel per arch in out/dist/: the built artifacts, their manifest, and the runtime loader."""
    yield from project.bundle_tasks(ROOT, CATALOG)


def task_tune():
    """Not a default task: on a GPU, rank each [tune] family's configs per shape (out/tune/<arch>/)."""
    yield from project.tuning_tasks(ROOT, CATALOG)
