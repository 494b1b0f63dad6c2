"""The catalog built through a Dask LocalCluster of 2 workers vs a local build: byte-identical? One run.

Usage: python bench/dask_build.py [--specs '*'] [--workers 2] [--json out.json]
Two fresh copies of the project: one `doit -n 2`, one `doit -n 8 -P thread executor=dask://...` whose
compiles all run on the cluster's workers. Compares every binary and meta.json, and the wall times.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import fresh_copy, report_counts, run_doit  # noqa: E402


def artifacts(project: Path) -> dict:
    return {p.relative_to(project / "out"): p.read_bytes() for p in (project / "out").glob("*/*/*/*")
            if p.suffix in (".cubin", ".hsaco", ".json")}


def main() -> None:
    from distributed import Client, LocalCluster
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default="*")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kforge-dask-bench-"))
    local = fresh_copy(work / "local", a.specs)
    remote = fresh_copy(work / "dask", a.specs)
    off = {"KFORGE_LOCAL_CACHE": "off"}   # each build compiles (else the second installs the first's from the cache)
    local_s = run_doit(local, "-n", str(a.workers), env=off)
    with LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            address = cluster.scheduler_address.replace("tcp://", "dask://")
            dask_s = run_doit(remote, "-n", str(4 * a.workers), "-P", "thread", f"executor={address}", env=off)
            workers = set(client.scheduler_info()["workers"])
    records = json.loads((remote / "out" / "build-report.json").read_text())["tasks"]
    on_cluster = sum(1 for r in records if r.get("compiled_on") in workers)
    mine, theirs = artifacts(local), artifacts(remote)
    same = mine == theirs
    print(f"| build | targets built | compiled on the cluster | wall s |\n|---|---|---|---|\n"
          f"| local, doit -n {a.workers} | {report_counts(local)['built']} | 0 | {local_s:.1f} |\n"
          f"| LocalCluster({a.workers} workers), doit -n {4 * a.workers} -P thread | "
          f"{report_counts(remote)['built']} | {on_cluster} | {dask_s:.1f} |\n")
    print(f"files compared (binaries + meta.json): {len(mine)}; byte-identical: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({"local_s": local_s, "dask_s": dask_s, "files": len(mine),
                                            "identical": same, "compiled_on_cluster": on_cluster}, indent=1))
    if not same:
        raise SystemExit(f"differences: {sorted(str(k) for k in set(mine) ^ set(theirs))[:10]} "
                         f"{[str(k) for k in mine if k in theirs and mine[k] != theirs[k]][:10]}")


if __name__ == "__main__":
    main()
