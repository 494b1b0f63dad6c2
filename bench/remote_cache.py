"""Two fresh clones sharing one remote cache (nginx WebDAV on loopback, rules/share/nginx_cache.py): the first
compiles and uploads, the second fetches. One run, wall times side by side.

Usage: python bench/remote_cache.py [--jobs 2] [--specs '*'] [--json out.json]
Checks that the second clone compiled nothing (every target came from the cache) and that its artifacts
are byte-identical to the first's.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, report_counts, run_doit  # noqa: E402
from kforge.share import nginx_cache  # noqa: E402


def artifacts(project: Path) -> dict:
    return {p.relative_to(project / "out"): p.read_bytes()
            for p in (project / "out").glob("*/*/*/*") if p.suffix in (".cubin", ".hsaco")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--specs", default="*")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-cache-bench-"))
    rows = []
    with nginx_cache.serve(work / "nginx") as server:
        url, store = server.url, server.store
        for name in ("first clone (empty cache)", "second clone (warm cache)"):
            project = fresh_copy(work / name.split()[0], a.specs)
            families = sorted(p.stem for p in (project / "specs").glob("*.toml"))
            # the local cache off: the second clone's artifacts come from the remote cache, not the per-user one
            seconds = run_doit(project, "-n", str(a.jobs), f"cache={url}", *families, env={"KFORGE_LOCAL_CACHE": "off"})
            report = json.loads((project / "out" / "build-report.json").read_text())
            cached = sum(1 for t in report["tasks"] if t.get("from_cache"))
            rows.append({"run": name, "seconds": seconds, "counts": report_counts(project), "from_cache": cached,
                         "project": project})
        stored = sum(1 for _ in store.rglob("*") if _.is_file())
    first, second = rows
    identical = artifacts(first["project"]) == artifacts(second["project"])
    compiled_by_second = second["counts"]["built"] - second["from_cache"]
    print(f"doit -n {a.jobs}, cache entries + blobs on the server: {stored}\n")
    print("| run | targets | compiled here | from the cache | wall s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['counts']['built']} | {r['counts']['built'] - r['from_cache']} | "
              f"{r['from_cache']} | {r['seconds']:.1f} |")
    print(f"\nsecond / first wall time: {second['seconds'] / first['seconds']:.3f} "
          f"({first['seconds'] / second['seconds']:.1f} x faster); artifacts byte-identical: {identical}")
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "project"} for r in rows], indent=1))
    if compiled_by_second or not identical:
        raise SystemExit("the second clone compiled something, or its artifacts differ")


if __name__ == "__main__":
    main()
