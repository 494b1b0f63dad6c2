"""What dodo.py yields: the catalog (specs -> targets) and its tasks as doit task dicts, one per target, one group
per kernel family, one bundle per arch. Generating tasks writes nothing."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from kforge.store import artifact, guard
from kforge.ship import package
from kforge.base import settings
from kforge.edge.config import local_cache
from kforge.store.inputs import InputIndex
from kforge.base.layout import Layout
from kforge.base.errors import SpecError
from kforge.base.target import Target
from kforge.plan.catalog import Catalog
from kforge_runtime.schema import dist_name


def load_catalog(root: Path, project_tasks: set[str] = frozenset()) -> Catalog:
    """The catalog for the archs chosen, or one line and exit code 2 (a catalog that cannot be found or read). A
    family that did not load is one line here and one failed task; so is one named as a task the project's dodo.py
    defines (`project_tasks`: doit stopped every run on it, "Task names must be unique")."""
    try:
        catalog = Catalog(root, settings.get("archs"), settings.get("max_configs")).load(keep_going=True,
                                                                                        taken=frozenset(project_tasks))
    except (SpecError, ValueError) as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)
    catalog.refuse({name: f"[kernel] name: {name!r} is the name of a task the project's dodo.py defines "
                          f"(task_{name}); choose another, e.g. {name + '_kernel'!r}" for name in project_tasks},
                   project_tasks)
    for broken in catalog.broken:
        sys.stderr.write(f"kforge: {broken.line()}\n")
    given = settings.source("archs")
    if given is not None and not catalog.broken:   # a family that did not load may be the one for it
        built = {t.arch for t in catalog.targets}
        unbuilt = [a for a in settings.get("archs") if a not in built]
        if unbuilt:   # else it builds nothing for them, says nothing and exits 0: a CI job ships no bundle
            sys.stderr.write(f"kforge: {given}: no family builds {', '.join(unbuilt)}; add it to a spec's archs "
                             f"(`doit list --all` without archs= shows each target's arch), or leave it out\n")
            raise SystemExit(2)
    return catalog


def compile_tasks(root: Path, catalog: Catalog):
    """All compile tasks, grouped by family (a generator for dodo.py)."""
    by_family: dict[str, list] = {f.name: [] for f in catalog.families}
    for t in catalog.targets:
        by_family[t.kernel].append(t)
    timeout, executor, url = settings.get("timeout"), settings.get("executor"), settings.get("cache")
    if executor is not None:   # its build id made here, before doit forks its workers: one build, one id on a worker
        from kforge.share import dask_executor  # noqa: F401
    cache = None
    if url:
        from kforge.share import remote_cache   # http.client and hmac: only where a cache is used
        cache = remote_cache.CacheConfig(url, *map(settings.get, ("cache_readonly", "cache_timeout", "cache_key",
                                                                  "cache_budget")))
        remote_cache.share_budget()   # here, in doit's master: every worker it forks counts against one budget
    # what the last run's reporter saved: the keys built, the files each compile read
    built, read = artifact.KeyIndex.of(Layout(root).built_keys), InputIndex.of(Layout(root).observed_inputs)
    local = local_cache()   # None with local_cache=off
    outside = guard.Outside(Layout(root).out)
    for family in catalog.families:   # a group task per family, over its targets' tasks
        yield {"basename": family.name, "name": None, "doc": family.description or f"all {family.name} targets"}
        for t in by_family[family.name]:
            yield compile_task(t, str(root), timeout, built, cache, executor, local, read, outside)
    for broken in catalog.broken:
        yield broken_task(broken.name, broken.path, broken.error)


def compile_task(t: Target, root: str, timeout: float, built: artifact.KeyIndex, cache=None,
                 executor: str | None = None, local=None, read: InputIndex | None = None,
                 outside: guard.Outside | None = None) -> dict:
    """One target's task, with only what doit needs (a no-op run pays for every field of thousands). Up to date
    iff the artifact was built from this key and every file its compile read still has that content. No file_dep:
    sources are in the key by content, so a touch or a restored out/ rebuilds nothing. No targets or clean
    actions: forget, clean and prune find the artifact through the Target in the task's meta. A folder that leads
    outside out/ (a link: `outside`) is never current, never read: its compile fails naming the link, and the
    bundle lists it failed."""
    read = read if read is not None else InputIndex.of(Layout.of(root).observed_inputs)
    meta_path = t.meta_path
    away = (outside or guard.Outside(Layout.of(root).out)).why(t)
    current = not away and built.is_current(meta_path, t.key) and \
        read.unchanged(meta_path, built.meta_identity(meta_path))
    # a config of the library's autotuner skipped from this key and these inputs is up to date as it is
    skipped = None if current or away or "tuned" not in dict(t.notes) else artifact.skipped(t)
    return {
        "basename": t.kernel,
        "name": f"{t.config_id}@{t.arch}",
        "doc": f"{t.toolchain} {t.entry} for {t.arch}",
        "actions": [(compile_action, [t, root, timeout, cache, executor, local])],
        "uptodate": [current or skipped is not None],
        "meta": {"kforge_target": t, **({"kforge_skipped": skipped} if skipped is not None else {})},
        "verbosity": 0,
    }


def broken_task(name: str, path: str, error: str) -> dict:
    """A family that did not load: a task that fails with its error every run (the rest build); `doit list`
    marks it."""
    return {
        "basename": name,   # a task of its own (no subtasks): `doit NAME` runs it
        "doc": f"BROKEN (did not load): {error}",
        "actions": [(did_not_load, [name, path, error])],
        "meta": {"kforge_broken": error},
        "verbosity": 0,
    }


def did_not_load(name: str, path: str, error: str):
    from doit.exceptions import TaskFailed
    # a plain retry loads the same spec and fails the same way: the hint names the fix. Its 'retry alone:' prefix
    # is the reporter's (rules/report/reporter.py): error_line stops above it, the summary takes what follows
    return TaskFailed(f"{name} did not load\n  spec: {path}\n  error: {error}\n  retry alone: edit {path} (or the "
                      f"file the error names) to fix it, then run doit {name} again; unchanged, it fails the same way")


def compile_action(*args):
    """The doit action (imported where a compile runs: a no-op run never imports it)."""
    from kforge.compile.action import compile_target
    return compile_target(*args)


def package_tasks(targets: list[Target], root: str, tuned: list[dict] = (), broken=()) -> Iterator[dict]:
    """`doit package`: one bundle per arch, after all of that arch's compile tasks, failed ones included;
    `tuned`: the autotuners' recorded picks (catalog.tuned), each bundle gets its arch's; `broken`: the families
    that did not load (catalog.broken), listed failed in every bundle."""
    yield {"basename": "package", "name": None, "doc": "bundle every built artifact, one wheel per arch in out/dist/"}
    lost = package.did_not_load(broken, root)
    by_arch: dict[str, list[Target]] = {}
    for t in targets:
        by_arch.setdefault(t.arch, []).append(t)
    for arch, mine in sorted(by_arch.items()):
        picks = [{**{k: t[k] for k in ("kernel", "key", "config")}, "lines": t.get("lines", 1)} for t in tuned
                 if t["arch"] == arch]
        yield {
            "basename": "package",
            "name": arch,
            "doc": f"out/dist/{dist_name(arch)}-*.whl: the {arch} artifacts and their manifest",
            "actions": [(package.build_bundle, [arch, mine, root, picks, lost])],
            "task_dep": [t.name for t in mine],
            "uptodate": [(package.is_current, [arch, mine, root, picks, lost])],
            "targets": [str(Layout.of(root).manifest_copy(arch))],
            "clean": [(package.remove, [arch, root])],
            # runs when some compiles failed, and lists them: see rules/edge/config.py, _run_after_failed_deps
            "meta": {"after_failed_deps": True},
            "verbosity": 2,
        }
