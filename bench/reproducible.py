"""Reproducible bytes: the same inputs built twice, in two directories at different paths, give the same bytes.

Usage: python bench/reproducible.py [--families softmax liger_softmax_fwd kfl_auto ... | --all] [--archs sm_90a,gfx942|all]
                                    [--work DIR] [-n 2] [--json out.json] [--no-venv-copy]
--all: every spec of specs/ and tests/liger_specs/ (the whole catalog and liger's); --archs all: the catalog's
own archs (no archs= on the command line).
Each build is a project of its own (DIR/a and DIR/b-somewhere/else/entirely): the checkout's kernels/,
dodo.py, pyproject.toml and the chosen families' specs (from specs/ and tests/liger_specs/), and a site/
folder holding a copy of liger_kernel with its dist-info when a spec names it, put on PYTHONPATH (a library
installed at another path; liger's autotuned entries are the wrapped ones). tests/load/test_observe_edits.py does the
same for its own library (a helper through a module object, a generated source, a library's wrapper class). Before the second build
every one of its files gets another mtime (a day later). Both run `doit archs=...` (every chosen family and
the bundles), then every file under out/ but kforge's and doit's private state and the run's report and
trace is compared byte for byte, and each is searched for either directory's absolute path, either
virtualenv's and the home directory (a wheel's or bundle's members too). The second build runs from a copy of
the virtualenv at another path (hard links: the same Triton, torch and interpreter files under another name),
unless --no-venv-copy. Both builds run with the local and remote caches off: each compiles every target.
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


def venv_copy(where: Path) -> Path:
    """This virtualenv again at `where`, by hard links (seconds, no space): its interpreter, Triton and torch
    under another path. Python finds a virtualenv by the pyvenv.cfg beside the interpreter it was started as."""
    if sys.prefix == sys.base_prefix:
        raise SystemExit("reproducible.py: run it from a virtualenv (or pass --no-venv-copy)")
    shutil.rmtree(where, ignore_errors=True)
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", sys.prefix, str(where)], check=True)
    return where / "bin" / "python"


def build(root: Path, archs: str, jobs: int, python: str) -> float:
    # no cache: a hit would hand the second build the first one's bytes; the project's own copy of the libraries
    env = {k: v for k, v in os.environ.items() if k not in ("KFORGE_CACHE", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(root / "site"), KFORGE_LOCAL_CACHE="off")
    command = [python, "-m", "doit", "-n", str(jobs), *([] if archs == "all" else [f"archs={archs}"])]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
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


def held_path(data: bytes, needles: list[bytes], rel: str) -> str | None:
    """The first needle the file (a wheel's members too) holds, None when it holds none."""
    blobs = [data]
    if rel.endswith(".whl"):
        import io
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            blobs += [z.read(n) for n in z.namelist()]
    return next((n.decode() for n in needles for b in blobs if n in b), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES))
    ap.add_argument("--all", action="store_true", help="every spec of specs/ and tests/liger_specs/")
    ap.add_argument("--archs", default="sm_90a,gfx942", help="comma-separated, or all: the catalog's own")
    ap.add_argument("--no-venv-copy", action="store_true", help="build both from this virtualenv")
    ap.add_argument("--work", type=Path, default=REPO / "out" / "bench-reproducible")
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.all:
        args.families = sorted(p.stem for folder in (REPO / "specs", REPO / "tests" / "liger_specs")
                               for p in folder.glob("*.toml"))
    families = spec_files(args.families)
    first = make(args.work / "a", families)
    second = make(args.work / "b-somewhere" / "else" / "entirely", families)
    pythons = [sys.executable, sys.executable if args.no_venv_copy else
               str(venv_copy(args.work / "venv-elsewhere" / "env"))]
    later = time.time() + 86400
    for path in second.rglob("*"):   # every source, spec and library file: another mtime
        os.utime(path, (later, later), follow_symlinks=False)
    seconds = [build(first, args.archs, args.n, pythons[0]), build(second, args.archs, args.n, pythons[1])]
    a, b = outputs(first), outputs(second)
    venvs = {sys.prefix, str(Path(pythons[1]).parent.parent)}
    needles = sorted({str(first.resolve()), str(second.resolve()), *venvs, *map(os.path.realpath, venvs),
                      str(REPO), str(Path.home())}, key=len)
    print("searched for:", ", ".join(needles))
    needles = [n.encode() for n in needles]
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
        held = next(filter(None, (held_path(side[rel], needles, rel) for side in (a, b) if rel in side)), None)
        if held:
            row["absolute_paths"] += 1
            print(f"holds an absolute path: {rel} ({held})")
    print(f"\nfamilies: {' '.join(args.families)}; archs: {args.archs}; builds: {seconds[0]:.1f} s, {seconds[1]:.1f} s")
    print(f"  {first} ({pythons[0]})\n  {second} ({pythons[1]})")
    print("| files | compared | different | in one build only | holding an absolute path |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['files']} | {row['different']} | {row['only_one']} | {row['absolute_paths']} |")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", "bench/reproducible.py", *sys.argv[1:]]),
                                         "families": args.families, "archs": args.archs, "seconds": seconds,
                                         "projects": [str(first), str(second)], "pythons": pythons,
                                         "searched_for": [n.decode() for n in needles], "rows": rows}, indent=1))
    bad = sum(r["different"] + r["only_one"] + r["absolute_paths"] for r in rows.values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
