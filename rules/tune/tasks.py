"""`doit tune` (not a default task): one task per ([tune] family, arch), run on a GPU of that arch by
rules/tune/gpu_bench.py in a child process; up to date while its table holds the current tuning_key.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import kforge_runtime
from kforge.store import artifact, guard
from kforge.base import stamps
from kforge.base.archs import ARCHS
from kforge.base.layout import Layout
from kforge.base.target import Target

TUNE_SCHEMA = 1
HERE, RUNTIME = Path(__file__).resolve().parent, Path(kforge_runtime.__file__).resolve().parent
TUNER_FILES = (HERE / "gpu_bench.py", RUNTIME / "launch.py", RUNTIME / "select.py")


def local_vendors() -> set[str]:
    """Vendors whose GPU driver is present, from device nodes alone (no driver call while tasks are made)."""
    return {vendor for vendor, node in (("nvidia", "/dev/nvidiactl"), ("amd", "/dev/kfd")) if os.path.exists(node)}


def tune_tasks(families: list, targets: list[Target], root: str) -> Iterator[dict]:
    """The catalog's families' tuning tasks; a spec is loaded only by the task's actions (a no-op pays nothing)."""
    yield {"basename": "tune", "name": None,
           "doc": "benchmark each [tune] family's built configs on the local GPU; write out/tune/<arch>/<kernel>.json"}
    vendors = local_vendors()
    for family in families:
        if not family.tuned:
            continue
        for arch in sorted({t.arch for t in targets if t.kernel == family.name}):
            if vendors and ARCHS[arch].vendor not in vendors:
                continue
            mine = [t for t in targets if t.kernel == family.name and t.arch == arch]
            yield {
                "basename": "tune",
                "name": f"{family.name}@{arch}",
                "doc": f"tune {family.name} for {arch} on its [tune] shapes (needs a {arch} GPU)",
                "actions": [(run_tuning, [family.path, arch, mine, root])],
                "task_dep": [t.name for t in mine],
                "uptodate": [(is_current, [family.path, arch, mine, root])],
                "targets": [str(Layout.of(root).tuning_table(arch, family.name))],
                "clean": [(remove, [family.name, arch, root])],
                "meta": {"after_failed_deps": True},   # tune what did build; the rest is reported failed
                "verbosity": 2,
            }


def _spec(spec_path: str, root: str):
    from kforge.declare.spec import load_spec
    return load_spec(Path(root) / spec_path, Path(root))


def tuning_key(spec, arch: str, targets: list[Target], root: Path, gpu: dict) -> str:
    """What a tuning table depends on: the binaries' sha256, the shapes, the harness and tuner code, the GPU."""
    from kforge.load import sources   # (and ast) only where a tuning key is computed: never in a no-op build
    metas = ((t.config_id, artifact.current_meta(t.meta_path, t.key)) for t in targets)
    built = sorted((config_id, meta.get("sha256")) for config_id, meta in metas if meta is not None)
    harness = sources.local_closure(root / spec.tune.harness, root)
    payload = {"schema": TUNE_SCHEMA, "kernel": spec.name, "arch": arch, "artifacts": built,
               "shape_args": spec.tune.shape_args, "shapes": spec.tune.shapes,
               "harness": sources.digest_files(harness, root),
               "tuner": [artifact.sha256(f.read_bytes()) for f in TUNER_FILES], "gpu": gpu}
    return stamps.digest(payload)


@functools.lru_cache(maxsize=None)
def gpu_identity(root: str) -> dict:
    """The local GPU, asked in a child process (doit must not create a GPU context before it forks its workers);
    RuntimeError with the child's message when there is none."""
    proc = subprocess.run([sys.executable, "-m", "kforge_runtime.device"], cwd=root, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip() or f"kforge_runtime.device exited with {proc.returncode}")
    return json.loads(proc.stdout)


def is_current(spec_path: str, arch: str, targets: list[Target], root: str) -> bool:
    try:
        spec = _spec(spec_path, root)   # a SpecError (a ValueError): the run says so when it loads the catalog again
        table = json.loads(Layout.of(root).tuning_table(arch, spec.name).read_bytes())
        return table.get("key") == tuning_key(spec, arch, targets, Path(root), gpu_identity(root))
    except (OSError, ValueError, AttributeError, RuntimeError):
        return False


def run_tuning(spec_path: str, arch: str, targets: list[Target], root: str):
    from doit.exceptions import TaskFailed
    spec = _spec(spec_path, root)
    task = f"tune:{spec.name}@{arch}"
    try:
        gpu = gpu_identity(root)
    except RuntimeError as e:
        return TaskFailed(f"{task}: {e}")
    if arch not in gpu["archs"]:
        return TaskFailed(f"{task}: this GPU is {gpu['name']} (runs {', '.join(gpu['archs'])}); tune {arch} on a "
                          f"{arch} GPU, or choose archs here: `doit tune archs={gpu['archs'][0]}`")
    root_path = Path(root)
    key = tuning_key(spec, arch, targets, root_path, gpu)
    out = Layout.of(root).tuning_table(arch, spec.name).relative_to(root_path)
    proc = subprocess.run([sys.executable, "-m", "kforge.tune.gpu_bench", "--spec", spec.path, "--arch", arch,
                           "--key", key, "--out", str(out)], cwd=root)
    if proc.returncode != 0:
        return TaskFailed(f"{task}: the tuner exited with {proc.returncode} (its messages are above); "
                          f"{out} was left as it was")
    return None


def remove(kernel: str, arch: str, root: str) -> None:
    """`doit clean tune`."""
    from kforge.tune.gpu_bench import progress_path
    layout = Layout.of(root)
    guard.remove_file(layout.out, layout.tuning_table(arch, kernel))
    guard.remove_file(layout.out, progress_path(layout.tuning_table(arch, kernel)))   # a stopped run's rankings
