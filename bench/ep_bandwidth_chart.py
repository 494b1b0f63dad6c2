"""bench/ep_bandwidth.py's results as a picture: GB/s against tokens per rank, the op vs the NCCL
all_to_all_single path, dispatch and combine side by side.

Usage: python bench/ep_bandwidth_chart.py RESULTS.json [-o chart.png]   (needs matplotlib: pip install 'kforge[charts]')
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kforge.charts import pyplot  # noqa: E402


def chart(results: dict, out: Path) -> None:
    plt = pyplot()
    rows = [r for r in results["rows"] if not r.get("graph")]   # eager calls: what both paths do
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, op in zip(axes, ("dispatch", "combine")):
        tokens = [r["tokens"] for r in rows]
        for path, style in (("op", "o-"), ("nccl", "s--")):
            gbs = [r[f"{op}_logical_bytes"] / r[f"{path}_{op}_s"] / 1e9 for r in rows]
            ax.plot(tokens, gbs, style, label="kforge op (symmetric memory)" if path == "op" else "NCCL all_to_all_single")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per rank")
        ax.set_title(op)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s per rank (logical bytes)")
    axes[0].legend()
    fig.suptitle(f"MoE {results.get('dtype', '')} dispatch / combine, world {results.get('world', '?')}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    path = Path(a.results)
    out = Path(a.out) if a.out else path.with_suffix(".png")
    chart(json.loads(path.read_text()), out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
