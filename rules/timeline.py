"""Render out/build-trace.json as an SVG picture (workers x time), for machines with no trace viewer.

    python -m kforge.timeline [out/build-trace.json] [-o out/build-timeline.svg]

A row per worker (and per other kind of task); a compile is a bar coloured by its family, its other phases drawn
lighter; the legend names the families with the most compile time. Stdlib only.
"""
from __future__ import annotations

import argparse
import colorsys
import hashlib
import json
import sys
from html import escape
from pathlib import Path

ROW, LEFT, TOP, WIDTH = 18, 140, 42, 1400   # pixels: a row's height, the label column, the axis, the plot
PHASE_ALPHA = {"compile": 1.0, "package": 1.0, "failed": 1.0, "write": 0.55, "cache lookup": 0.35,
               "cache upload": 0.35, "local cache lookup": 0.35, "local cache store": 0.35, "queue": 0.12}
LEGEND = 12   # families named in the legend


def colour(family: str) -> str:
    """A stable colour per family (the same in every picture)."""
    hue = int(hashlib.sha256(family.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    r, g, b = colorsys.hls_to_rgb(hue, 0.45, 0.65)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def render(trace: dict) -> str:
    """The SVG text of a Chrome trace written by kforge (rules/report/reporter.py's Trace)."""
    events = trace.get("traceEvents", [])
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X"]
    end = max((e["ts"] + e["dur"] for e in slices), default=1) / 1e6
    order = sorted(rows, key=lambda tid: (not rows[tid].startswith(("worker", "targets")), tid))   # workers first
    y_of = {tid: TOP + i * ROW for i, tid in enumerate(order)}
    scale = WIDTH / max(end, 1e-9)
    busy: dict[str, float] = {}
    for e in slices:
        if e["args"].get("phase") == "compile":
            family = e["args"].get("family", "")
            busy[family] = busy.get(family, 0.0) + e["dur"] / 1e6
    legend = sorted(busy, key=lambda f: -busy[f])[:LEGEND]
    height = TOP + len(order) * ROW + 24 + ROW * ((len(legend) + 3) // 4)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="4" y="14" font-weight="bold">kforge build: {len(slices)} slices, {end:.1f} s, '
           f'{len(order)} rows</text>']
    step = _tick(end)
    t = 0.0
    while t <= end + 1e-9:
        x = LEFT + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{TOP + len(order) * ROW}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{TOP - 6}" text-anchor="middle" fill="#555">{t:g} s</text>')
        t += step
    for tid in order:
        out.append(f'<text x="{LEFT - 6}" y="{y_of[tid] + ROW - 5}" text-anchor="end">{escape(rows[tid])}</text>')
    for e in slices:
        phase = e["args"].get("phase", "")
        family = e["args"].get("family", "") or phase
        x, w = LEFT + e["ts"] / 1e6 * scale, max(e["dur"] / 1e6 * scale, 0.5)
        fill = "#c0392b" if phase == "failed" else colour(family)
        out.append(f'<rect x="{x:.2f}" y="{y_of[e["tid"]] + 2}" width="{w:.2f}" height="{ROW - 4}" fill="{fill}" '
                   f'fill-opacity="{PHASE_ALPHA.get(phase, 0.5)}"><title>{escape(e["name"])}: {escape(phase)} '
                   f'{e["dur"] / 1e6:.3f} s</title></rect>')
    y = TOP + len(order) * ROW + 20
    for i, family in enumerate(legend):
        x = LEFT + (i % 4) * (WIDTH // 4)
        row_y = y + (i // 4) * ROW
        out.append(f'<rect x="{x}" y="{row_y - 10}" width="12" height="12" fill="{colour(family)}"/>'
                   f'<text x="{x + 16}" y="{row_y}">{escape(family)} ({busy[family]:.1f} s of compiles)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _tick(end: float) -> float:
    """A round axis step giving at most ~12 ticks."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600):
        if end / step <= 12:
            return step
    return end / 12


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kforge.timeline", description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default="out/build-trace.json")
    ap.add_argument("-o", "--out", default=None, help="the SVG file (default: beside the trace)")
    a = ap.parse_args(argv)
    path = Path(a.trace)
    try:
        trace = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.stderr.write(f"kforge timeline: cannot read {path} ({e}); run a build first (doit), which writes it\n")
        return 2
    out = Path(a.out) if a.out else path.with_name("build-timeline.svg")
    try:
        picture = render(trace)
    except (KeyError, TypeError, AttributeError) as e:
        sys.stderr.write(f"kforge timeline: {path} is not a trace kforge wrote ({e!r} missing or malformed); "
                         f"run a build again (doit), which rewrites it\n")
        return 2
    out.write_text(picture)
    sys.stderr.write(f"kforge timeline: {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
