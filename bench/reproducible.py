"""Reproducible bytes: the same inputs built twice, in two directories at different paths, give the same bytes.

Usage: python bench/reproducible.py [--families softmax liger_softmax_fwd kfl_auto ...] [--archs sm_90a,gfx942]
                                    [--work DIR] [-n 2] [--json out.json]
Each build is a project of its own (DIR/a and DIR/b-somewhere/else/entirely): the checkout's kernels/,
dodo.py, pyproject.toml and the chosen families' specs (from specs/ and tests/liger_specs/), and a site/
folder holding a copy of liger_kernel with its dist-info when a spec names it, put on PYTHONPATH (a library
installed at another path; liger's autotuned entries are the wrapped ones). tests/test_observed.py does the
same for its own library (a helper through a module object, a generated source, a library's wrapper class). Before the second build
every one of its files gets another mtime (a day later). Both run `doit archs=...` (every chosen family and
the bundles), then every file under out/ but kforge's and doit's private state and the run's report and
trace is compared byte for byte, and each is searched for either directory's absolute path (a wheel's
members too). Triton, torch and the interpreter are the same virtualenv for both (its path is not varied).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FAMILIES = ("softmax", "liger_softmax_fwd", "liger_rms_norm_fwd", "liger_dyt_fwd")
PRIVATE = ("out/.kforge/", "out/.doit.sqlite3", "out/build-report.json", "out/build-trace.json")


def spec_files(families) -> dict[str, str]:
    """{family: spec text} from specs/ and tests/liger_specs/."""
    found = {p.stem: p.read_text() for folder in (REPO / "specs", REPO / "tests" / "liger_specs")
             for p in folder.glob("*.toml")}
    missing = [f for f in families if f not in found]
    if missing:
        raise SystemExit(f"reproducible.py: no spec for {', '.join(missing)}; families: {', '.join(sorted(found))}")
    return {f: found[f] for f in families}


def make(root: Path, families: dict[str, str]) -> Path:
    """A project at root with the chosen specs, the checkout's kernels and a site/ of library copies."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "specs").mkdir(parents=True)
    shutil.copytree(REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    for family, text in families.items():
        (root / "specs" / f"{family}.toml").write_text(text)
    site = root / "site"
    site.mkdir()
    liger = importlib.util.find_spec("liger_kernel")
    if liger is not None and any("liger_kernel" in t for t in families.values()):
        installed = Path(liger.origin).parent
        shutil.copytree(installed, site / "liger_kernel", ignore=shutil.ignore_patterns("__pycache__"))
        for info in installed.parent.glob("liger_kernel-*.dist-info"):
            shutil.copytree(info, site / info.name)
    return root


def build(root: Path, archs: str, jobs: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(root / "site"))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", str(jobs), f"archs={archs}"], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reproducible.py: the build in {root} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - start


def outputs(root: Path) -> dict[str, bytes]:
    found = {}
    for path in sorted((root / "out").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(PRIVATE):
            found[rel] = path.read_bytes()
    return found


def kind(rel: str) -> str:
    return ("binary" if rel.endswith((".cubin", ".hsaco")) else "meta.json" if rel.endswith("meta.json") else
            "wheel" if rel.endswith(".whl") else "manifest" if rel.endswith(".manifest.json") else "other")


def holds_path(data: bytes, needles: list[bytes], rel: str) -> bool:
    blobs = [data]
    if rel.endswith(".whl"):
        import io
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            blobs += [z.read(n) for n in z.namelist()]
    return any(n in b for b in blobs for n in needles)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES))
    ap.add_argument("--archs", default="sm_90a,gfx942")
    ap.add_argument("--work", type=Path, default=REPO / "out" / "bench-reproducible")
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    families = spec_files(args.families)
    first = make(args.work / "a", families)
    second = make(args.work / "b-somewhere" / "else" / "entirely", families)
    later = time.time() + 86400
    for path in second.rglob("*"):   # every source, spec and library file: another mtime
        os.utime(path, (later, later), follow_symlinks=False)
    seconds = [build(first, args.archs, args.n), build(second, args.archs, args.n)]
    a, b = outputs(first), outputs(second)
    needles = [str(first.resolve()).encode(), str(second.resolve()).encode()]
    rows: dict[str, dict] = {}
    for rel in sorted(set(a) | set(b)):
        row = rows.setdefault(kind(rel), {"files": 0, "different": 0, "only_one": 0, "absolute_paths": 0})
        row["files"] += 1
        if rel not in a or rel not in b:
            row["only_one"] += 1
            print(f"only in one build: {rel}")
        elif a[rel] != b[rel]:
            row["different"] += 1
            print(f"different: {rel}")
        if any(holds_path(side[rel], needles, rel) for side in (a, b) if rel in side):
            row["absolute_paths"] += 1
            print(f"holds an absolute path: {rel}")
    print(f"\nfamilies: {' '.join(args.families)}; archs: {args.archs}; builds: {seconds[0]:.1f} s, {seconds[1]:.1f} s")
    print(f"  {first}\n  {second}")
    print("| files | compared | different | in one build only | holding an absolute path |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['files']} | {row['different']} | {row['only_one']} | {row['absolute_paths']} |")
    if args.json:
        args.json.write_text(json.dumps({"families": args.families, "archs": args.archs, "seconds": seconds,
                                         "rows": rows}, indent=1))
    bad = sum(r["different"] + r["only_one"] + r["absolute_paths"] for r in rows.values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
