"""A build's outcome as Markdown, for a CI job summary ($GITHUB_STEP_SUMMARY, a merge request note):

    python -m kforge.ci_summary [out/build-report.json]

The counts, the packages' states and the failures grouped by cause (as the build's summary). Exits 0: the build
step is what fails a job.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kforge.report.reporter import failure_groups


def markdown(report: dict) -> str:
    counts = report.get("counts", {})
    failed = [t for t in report.get("tasks", []) if t.get("status") == "failed"]
    packages = report.get("packages", [])
    lines = ["## kforge build", "",
             f"**{counts.get('built', 0)} built, {counts.get('up-to-date', 0)} up to date, "
             f"{counts.get('failed', 0)} failed** in {report.get('wall_seconds', 0):.0f} s; packages: "
             + (", ".join(f"{p['name']} {p['status']}" for p in packages) or "none")]
    if failed:
        lines += ["", "```", *[line for line in failure_groups(failed) if line], "```"]
    for p in packages:
        if p.get("status") == "failed":
            lines += ["", f"{p['name']} failed:", "```", p.get("error", ""), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    path = Path((argv if argv is not None else sys.argv[1:] or ["out/build-report.json"])[0])
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.stdout.write(f"## kforge build\n\nNo build report ({path}: {e}): the build did not get to run.\n")
        return 0
    sys.stdout.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
