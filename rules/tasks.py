"""Targets -> doit task dicts: one task per target, one group task per kernel family."""
from __future__ import annotations

from collections.abc import Iterator

from rules import artifact
from rules.build import compile_target
from rules.targets import Target


def family_tasks(family: str, description: str, targets: list[Target], root: str, timeout: float,
                 built: artifact.KeyIndex) -> Iterator[dict]:
    yield {"basename": family, "name": None, "doc": description or f"all {family} targets"}
    for t in targets:
        yield compile_task(t, root, timeout, built)


def compile_task(t: Target, root: str, timeout: float, built: artifact.KeyIndex) -> dict:
    return {
        "basename": t.kernel,
        "name": f"{t.config_id}@{t.arch}",
        "doc": f"{t.toolchain} {t.entry} {dict(t.config)} for {t.arch}",
        "actions": [(compile_target, [t, root, timeout])],
        "targets": [t.meta_path],
        # Up to date iff the artifact on disk was built from this exact key. No file_dep: sources are
        # content-hashed into the key, so a touch or a restored out/ with fresh mtimes rebuilds nothing,
        # and a killed run's finished artifacts count even though doit's DB was never written.
        "uptodate": [built.is_current(t.meta_path, t.key)],
        "clean": [(artifact.remove, [t.out_dir])],
        "verbosity": 0,
    }
