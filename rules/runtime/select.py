"""Tuned selection: which prebuilt config to run for a problem shape, from a tuning table (schema.py's TUNE_FORMAT).

For a tuned shape its best config; for another, the winner of the nearest tuned shape (L1 distance between log2
sizes, as PyTorch Inductor's size hints), going down its ranking and then to farther shapes while a config cannot
handle the shape (its divisibility promises). Between equally near tuned shapes, the config closest to each one's best.
"""
from __future__ import annotations

import json
import math

from .schema import TUNE_FORMAT, few


class NoTunedConfig(LookupError):
    pass


def distance(a: list[int], b: list[int]) -> float:
    """L1 distance between log2 sizes: 1024 vs 2048 is as far as 16 vs 32."""
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


def check_table(table: dict, where: str) -> None:
    """NoTunedConfig unless every row has the shape choose() reads: a table comes from a bundle (untrusted)."""
    if not isinstance(table, dict) or table.get("format") != TUNE_FORMAT:
        raise NoTunedConfig(f"{where}: not a {TUNE_FORMAT} tuning table")
    args, shapes, kernel = table.get("shape_args"), table.get("shapes"), table.get("kernel")
    if not (isinstance(args, list) and 0 < len(args) <= MAX_SHAPE_ARGS and all(_name(a) for a in args)
            and isinstance(shapes, list) and shapes):
        raise NoTunedConfig(f"{where}: a tuning table needs 'shape_args' (1 to {MAX_SHAPE_ARGS} argument names) and "
                            f"a non-empty 'shapes' list; re-run the tuning or rebuild the bundle")
    if kernel is not None and not _name(kernel):   # it names the kernel in every message: a name, not text
        raise NoTunedConfig(f"{where}: 'kernel' must be the kernel's name; re-run the tuning or rebuild the bundle")
    for i, row in enumerate(shapes):
        problem = _row_problem(row, len(args))
        if problem:
            raise NoTunedConfig(f"{where}: shapes[{i}] {problem}; re-run the tuning or rebuild the bundle")


MAX_SHAPE_ARGS = 16


def _name(value) -> bool:
    return isinstance(value, str) and value.isidentifier() and value.isascii() and len(value) <= 128


def _row_problem(row, n_args: int) -> str | None:
    if not isinstance(row, dict):
        return "is not an object"
    shape = row.get("shape")
    if not (isinstance(shape, list) and len(shape) == n_args
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        return f"needs 'shape': {n_args} positive integers"
    if not isinstance(row.get("where", {}), dict):
        return "has a 'where' that is not an object"
    ranking = row.get("ranking")
    if not isinstance(ranking, list):
        return "needs a 'ranking' list"
    for r in ranking:
        us = r.get("us") if isinstance(r, dict) else None
        if not (isinstance(r, dict) and isinstance(r.get("config_id"), str) and _positive_time(us)):
            return "has a ranking row without a 'config_id' string and a positive 'us' time"
    return None


def _positive_time(us) -> bool:
    """A finite time above zero, as a float can hold it (a JSON integer may have 400 digits)."""
    if not isinstance(us, (int, float)) or isinstance(us, bool):
        return False
    try:
        return math.isfinite(float(us)) and us > 0
    except OverflowError:
        return False


def handles(entry: dict, shape: dict[str, int]) -> bool:
    """False when a shape value breaks a divisibility the config's binary was compiled to assume."""
    return all(shape[name] % 16 == 0 for name in entry.get("divisible_by_16", ()) if name in shape)


def choose(table: dict, shape: dict[str, int], entries: dict[str, dict],
           where: dict | None = None) -> tuple[str, str]:
    """(config_id, why) for `shape` (arg name -> size); `entries`: the bundle's artifacts by config id; `where`: the
    values the caller's data fixes (e.g. {"dtype": "bf16"}), each ranked apart."""
    args = table["shape_args"]
    missing = [a for a in args if a not in shape]
    if missing:
        raise NoTunedConfig(f"{table.get('kernel')}: the shape needs {args}; missing {missing}")
    wanted = [shape[a] for a in args]
    tuned = sorted(_rows_for(table, where or {}), key=lambda s: distance(s["shape"], wanted))
    nearest = distance(tuned[0]["shape"], wanted)
    tied = [s for s in tuned if math.isclose(distance(s["shape"], wanted), nearest)]
    if len(tied) > 1:
        pick = _best_across(tied, shape, entries)
        if pick is not None:
            config_id, slowdown = pick
            return config_id, (f"equally near tuned shapes {few(s['shape'] for s in tied)} (log2 L1 "
                               f"distance {nearest:.2f}): the config closest to each "
                               f"one's best across them ({slowdown:.2f}x their best, geometric mean)")
    for s in tuned:
        for rank, row in enumerate(s["ranking"]):
            entry = entries.get(row["config_id"])
            if entry is not None and handles(entry, shape):
                how = "tuned for this shape" if s["shape"] == wanted else \
                    f"nearest tuned shape {s['shape']} (log2 L1 distance {distance(s['shape'], wanted):.2f})"
                return row["config_id"], f"{how}, rank {rank + 1} there"
    tried = few(s["shape"] for s in tuned) or "none"
    raise NoTunedConfig(f"{table.get('kernel')} {dict(zip(args, wanted))}: no ranked config can handle this shape "
                        f"(tuned shapes: {tried}); sizes must meet the configs' divisibility (16) promises")


def _best_across(rows: list[dict], shape: dict[str, int], entries: dict[str, dict]) -> tuple[str, float] | None:
    """The config ranked on all the rows with the least geometric-mean slowdown to each one's best."""
    times = [{r["config_id"]: r["us"] for r in s["ranking"]} for s in rows if s["ranking"]]
    if len(times) < 2:   # a tuned shape where every config was rejected ranks nothing
        return None
    common = [c for c in times[0] if all(c in t for t in times) and c in entries and handles(entries[c], shape)]
    if not common:
        return None
    slowdown = {c: math.exp(sum(math.log(t[c] / min(t.values())) for t in times) / len(times)) for c in common}
    best = min(common, key=slowdown.get)
    return best, slowdown[best]


def _rows_for(table: dict, where: dict) -> list[dict]:
    rows = [s for s in table["shapes"] if all(s.get("where", {}).get(k) == v for k, v in where.items())]
    kinds = sorted({json.dumps(s.get("where", {}), sort_keys=True) for s in rows})
    if not rows:
        have = sorted({json.dumps(s.get("where", {}), sort_keys=True) for s in table["shapes"]})
        raise NoTunedConfig(f"{table.get('kernel')}: nothing tuned where {where}; the table has: {few(have)}")
    if len(kinds) > 1:
        raise NoTunedConfig(f"{table.get('kernel')} is ranked separately for each of {few(kinds)}: "
                            f"say which with where=, e.g. where={kinds[0]}")
    return rows
