"""kforge: `doit -n 16` compiles every (kernel, config, arch) declared in specs/. See README.md."""
from pathlib import Path

from kforge import project

ROOT = Path(__file__).resolve().parent
SPECS, TARGETS = project.load_catalog(ROOT)
DOIT_CONFIG = project.doit_config(ROOT, SPECS, TARGETS)


def task_kernels():
    """One task per target, grouped by kernel family (`doit gemm`)."""
    yield from project.compile_tasks(ROOT, SPECS, TARGETS)


def task_package():
    """One wheel per arch in out/dist/: the built artifacts, their manifest, and the runtime loader."""
    yield from project.bundle_tasks(ROOT, TARGETS)


def task_tune():
    """Not a default task: on a GPU, rank each [tune] family's configs per shape (out/tune/<arch>/)."""
    yield from project.tuning_tasks(ROOT, SPECS, TARGETS)


def task_verify_dispatch_combine():
    """The multi-GPU verify sweep of the MoE dispatch/combine kernels: one process per GPU (world=N)."""
    return project.verify_task(ROOT)
