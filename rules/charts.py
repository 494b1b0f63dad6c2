"""A tuning table as a picture: config x shape, each cell the config's time over the shape's best.

    python -m kforge.charts out/tune/sm_90a/gemm.json [-o out/tune/sm_90a/gemm.png]

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


def tuning_heatmap(table: dict, out: Path) -> None:
    """Rows: configs (best-on-average first); columns: shapes (and `where` values); cells: time / best."""
    import math
    plt = pyplot()
    shapes = table["shapes"]
    labels = ["x".join(map(str, row["shape"])) + "".join(f" {v}" for v in row.get("where", {}).values())
              for row in shapes]
    times = [{r["config_id"]: r["us"] for r in row["ranking"]} for row in shapes]
    configs = sorted({c for t in times for c in t},
                     key=lambda c: sum(math.log(t[c] / min(t.values())) if c in t else 5 for t in times))
    grid = [[t[c] / min(t.values()) if c in t else math.nan for t in times] for c in configs]
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(shapes) + 3), max(4, 0.22 * len(configs) + 2)))
    image = ax.imshow(grid, aspect="auto", cmap="viridis_r", vmin=1.0, vmax=3.0, interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(configs)), configs, fontsize=7)
    ax.set_title(f"{table.get('kernel', '?')} on {table.get('arch', '?')}: time / the shape's best (blank: not run)")
    fig.colorbar(image, ax=ax, label="x the best config for the shape (3 = 3x or slower)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kforge.charts", description=__doc__.splitlines()[0])
    ap.add_argument("table", help="a tuning table, e.g. out/tune/sm_90a/gemm.json")
    ap.add_argument("-o", "--out", help="the PNG (default: beside the table)")
    a = ap.parse_args(argv)
    path = Path(a.table)
    try:
        table = json.loads(path.read_text())
        check_table(table, str(path))
    except (OSError, ValueError, NoTunedConfig) as e:
        sys.stderr.write(f"kforge charts: {path}: {e}\n")
        return 2
    out = Path(a.out) if a.out else path.with_suffix(".png")
    tuning_heatmap(table, out)
    sys.stderr.write(f"kforge charts: {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
