"""What dodo.py yields: the catalog (specs -> targets) and its tasks. Generating tasks writes nothing."""
from __future__ import annotations

import sys
from pathlib import Path

from kforge.store import artifact
from kforge.edge.config import local_cache, option
from kforge.base.layout import Layout
from kforge.base.errors import SpecError
from kforge.plan.catalog import Catalog
from kforge.edge.tasks import broken_task, family_tasks, package_tasks


def load_specs(root: Path) -> list:
    """Every family of the project's specs (rules/plan/catalog.py says where they are)."""
    from kforge.plan.catalog import load_specs
    return load_specs(root)


def load_catalog(root: Path) -> Catalog:
    """The catalog for the archs chosen on the command line, or one clear error and exit code 2 (a catalog
    that cannot be found or read at all). A family that did not load is one line here and one failed task."""
    try:
        catalog = Catalog(root, option("archs"), option("max_configs")).load(keep_going=True)
    except (SpecError, ValueError) as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(2)
    for broken in catalog.broken:
        sys.stderr.write(f"kforge: {broken.line()}\n")
    return catalog


def compile_tasks(root: Path, catalog: Catalog):
    """All compile tasks, grouped by family (a generator for dodo.py)."""
    by_family: dict[str, list] = {f.name: [] for f in catalog.families}
    for t in catalog.targets:
        by_family[t.kernel].append(t)
    timeout, executor, url = option("timeout"), option("executor"), option("cache")
    cache = None
    if url:
        from kforge.share import remote_cache   # http.client and hmac: only where a cache is used
        from kforge.share.remote_cache import CacheConfig
        cache = CacheConfig(url, option("cache_readonly"), option("cache_timeout"), option("cache_key"),
                            option("cache_budget"))
        remote_cache.share_budget()   # here, in doit's master: every worker it forks counts against one budget
    built = artifact.KeyIndex.of(Layout(root).built_keys)   # saved by the reporter at the end of a run
    local = local_cache()   # None with local_cache=off
    for family in catalog.families:
        yield from family_tasks(family.name, family.description, by_family[family.name], str(root), timeout,
                                built, cache, executor, local)
    for broken in catalog.broken:
        yield broken_task(broken.name, broken.path, broken.error)


def bundle_tasks(root: Path, catalog: Catalog):
    """`doit package`: one wheel per arch (a generator for dodo.py)."""
    yield from package_tasks(catalog.targets, str(root), catalog.tuned)


def tuning_tasks(root: Path, catalog: Catalog):
    """`doit tune` (a generator for dodo.py); rules/tune/tasks.py says when a table is current."""
    from kforge.tune.tasks import tune_tasks
    yield from tune_tasks(catalog.families, catalog.targets, str(root))
