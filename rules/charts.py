"""A tuning table as a picture: config x shape, each cell the config's time over the shape's best.

    python -m kforge.charts out/tune/sm_90a/gemm.json [-o out/tune/sm_90a/gemm.png] [--where dtype=bf16]

Reads a table `doit tune` wrote (checked as the loader checks one). Needs matplotlib, an optional extra:
pip install 'kforge[charts]'.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kforge_runtime.select import NoTunedConfig, check_table


def pyplot():
    """matplotlib's pyplot on a file backend, or SystemExit naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("kforge charts: matplotlib is not installed; pip install 'kforge[charts]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def by_where(shapes: list[dict]) -> dict[str, list[dict]]:
    """The table's shapes by their `where` values ("dtype=bf16"; "" for none): each is ranked over its own configs."""
    groups: dict[str, list[dict]] = {}
    for row in shapes:
        groups.setdefault(", ".join(f"{k}={v}" for k, v in row.get("where", {}).items()), []).append(row)
    return groups


def heat_grid(shapes: list[dict]) -> tuple[list[str], list[str], list[list[float]]]:
    """(configs, shape labels, grid[config][shape] = time / the shape's best, NaN where not timed), the best on
    average first (geometric mean of the slowdown; a shape not timed counts e^5)."""
    import math
    labels = ["x".join(map(str, row["shape"])) for row in shapes]
    times = [{r["config_id"]: r["us"] for r in row["ranking"]} for row in shapes]
    best = [min(t.values(), default=math.nan) for t in times]
    configs = sorted({c for t in times for c in t},
                     key=lambda c: sum(math.log(t[c] / b) if c in t else 5 for t, b in zip(times, best)))
    return configs, labels, [[t[c] / b if c in t else math.nan for t, b in zip(times, best)] for c in configs]


def tuning_heatmap(table: dict, out: Path, where: str | None = None) -> None:
    """One panel per `where` value (or only `where`'s): rows configs, columns shapes, cells time / best."""
    plt = pyplot()
    groups = by_where(table["shapes"])
    if where is not None:
        if where not in groups:
            raise ValueError(f"no shapes with where {where!r}; the table has: " + ", ".join(map(repr, groups)))
        groups = {where: groups[where]}
    grids = {name: heat_grid(rows) for name, rows in groups.items()}
    tallest = max(len(configs) for configs, _, _ in grids.values())
    widths = [len(labels) for _, labels, _ in grids.values()]
    fig, axes = plt.subplots(1, len(grids), squeeze=False, layout="constrained", gridspec_kw={"width_ratios": widths},
                             figsize=(max(6, 0.35 * sum(widths) + 4 * len(grids)), max(4, 0.2 * tallest + 2.5)))
    for ax, (name, (configs, labels, grid)) in zip(axes[0], grids.items()):
        image = ax.imshow(grid, aspect="auto", cmap="viridis_r", vmin=1.0, vmax=3.0, interpolation="nearest")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(configs)), configs, fontsize=7)
        ax.set_title(name or "all shapes", fontsize=10)
    fig.suptitle(f"{table.get('kernel', '?')} on {table.get('arch', '?')}: each config's time over the shape's "
                 "best (blank: not timed)")
    fig.colorbar(image, ax=axes[0].tolist(), label="x the best config for the shape (3 = 3x or slower)",
                 fraction=0.03)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kforge.charts", description=__doc__.splitlines()[0])
    ap.add_argument("table", help="a tuning table, e.g. out/tune/sm_90a/gemm.json")
    ap.add_argument("-o", "--out", help="the PNG (default: beside the table)")
    ap.add_argument("--where", help="only the shapes with these values, as the panel names them (dtype=bf16)")
    a = ap.parse_args(argv)
    path = Path(a.table)
    try:
        table = json.loads(path.read_text())
        check_table(table, str(path))
    except (OSError, ValueError, NoTunedConfig) as e:
        sys.stderr.write(f"kforge charts: {path}: {e}\n")
        return 2
    out = Path(a.out) if a.out else path.with_suffix(".png")
    try:
        tuning_heatmap(table, out, a.where)
    except ValueError as e:
        sys.stderr.write(f"kforge charts: {path}: {e}\n")
        return 2
    sys.stderr.write(f"kforge charts: {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
