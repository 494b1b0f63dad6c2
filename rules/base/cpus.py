"""How many compiles may run at once: the CPUs this process may use, or what the user set.

A compile keeps one CPU busy: on the 2-core dev machine `doit -n 16` thrashed, 5.2x slower than `-n 2`. So `-n` is
capped at the affinity mask lowered by a cgroup CPU quota (`docker --cpus=2` on a 64-core host is 2).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

ENV = "KFORGE_MAX_COMPILES"   # the cap's environment twin of `doit max_compiles=N` (rules/base/settings.py)


def available() -> int:
    """CPUs this process may run on: the affinity mask, lowered by a cgroup (v2 or v1) CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The tightest CPU quota (rounded up to whole CPUs) on this process's cgroup path, or None if unlimited."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":   # v2: cpu.max is "<quota> <period>" or "max <period>", at every level
            limits += [_v2_limit(d / "cpu.max") for d in _levels(root, path)]
        elif "cpu" in controllers.split(","):   # v1
            mount = root / controllers if (root / controllers).is_dir() else root / "cpu"
            limits += [_v1_limit(d) for d in _levels(mount, path)]
    limits = [n for n in limits if n]
    return min(limits) if limits else None


def _levels(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and each of its parents up to the mount point (a parent's quota binds too)."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_limit(cpu_max: Path) -> int | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else math.ceil(int(quota) / int(period))


def _v1_limit(directory: Path) -> int | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else math.ceil(quota / period)
