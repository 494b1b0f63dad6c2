"""A second virtualenv at another path, same sources: the same out/, and a restored out/ compiles nothing.

Usage: python bench/second_venv.py [--venv-a DIR] [--venv-b DIR] [--work DIR] [-n 2] [--archs sm_90a,gfx942]
                                   [--json docs/data/second_venv-dev.json]

What a user does, end to end. Two virtualenvs (made here if missing: `python -m venv DIR && DIR/bin/pip install
-e <this checkout>`; then `pip install liger-kernel==0.8.5 packaging fla-core==0.5.2 einops`, pip reaching its
index: liger-kernel 0.8.5 imports packaging without requiring it), each with tests/env_library.py's library
(envlib: guarded kernels, an autotuned kernel built by calls, a GPU lookup table and a torch operator made at
import, a FlyDSL path used whenever FlyDSL imports, its import's stack kept) pip-installed from one source tree
into its site-packages. One project (dodo.py, pyproject.toml, specs/ for envlib's families, two of
liger-kernel's and two of flash-linear-attention's) at WORK/a/project, and a copy at
WORK/b/somewhere/else/project. Then, each with its own empty local cache (XDG_CACHE_HOME) and its venv's own
`bin/doit` launcher, no PYTHONPATH:

1. venv A builds project A, venv B builds project B (`doit -n N archs=...`: every target and the wheels);
2. the two out/ are compared (bench/compare_out.py: every meta.json and binary byte for byte, every wheel member
   by member, its manifest.json key by key);
3. project B's out/ is replaced by a copy of A's and venv B runs doit again with an empty local cache: the
   restored targets must all be up to date (nothing compiled, nothing from a cache); then once more, a no-op;
4. project B's out/ is removed and venv B builds with venv A's local cache: every target comes from it.

Exits 1 if anything differs or compiles. The JSON holds each step's counts and wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.compare_out import compare  # noqa: E402

# the library and its specs are the tests' own (tests/env_library.py), read as a data file: one definition of it
env_library = SimpleNamespace(**runpy.run_path(str(REPO / "tests" / "env_library.py")))

LIGER = ("liger_rms_norm_fwd", "liger_softmax_fwd")
# flash-linear-attention's, written from its source: an autotuner whose configs depend on the vendor (IS_AMD, from
# the device at import), and one under heuristics and the library's own caching autotuner
FLA = {"fla_l2norm_fwd": '''[kernel]
name = "fla_l2norm_fwd"
module = "fla.modules.l2norm"
entry = "l2norm_fwd_kernel1"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
x = "*{dtype}"
y = "*{dtype}"
rstd = "*fp32"
eps = "fp32"
D = "i32"
BD = "constexpr"

[sweep]
dtype = ["bf16"]
BD = [128, 512]
''', "fla_cumsum": '''[kernel]
name = "fla_cumsum"
module = "fla.ops.utils.cumsum"
entry = "chunk_local_cumsum_scalar_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]

[signature]
s = "*{dtype}"
o = "*{dtype}"
scale = "none"
cu_seqlens = "none"
chunk_indices = "none"
T = "i32"
B = "constexpr"
H = "constexpr"
BT = "constexpr"
REVERSE = "constexpr"
HAS_SCALE = "constexpr"
IS_VARLEN = "constexpr"
HEAD_FIRST = "constexpr"

[constants]
B = 1
H = 16
HEAD_FIRST = false

[sweep]
dtype = ["fp32"]
BT = [64]
REVERSE = [false, true]
'''}
LIBRARIES = ("liger-kernel==0.8.5", "packaging", "fla-core==0.5.2", "einops")
PYPROJECT = '''[tool.kforge]
catalog = ["specs"]

[tool.doit.plugins.command]
forget = "kforge.edge.commands:Forget"
info = "kforge.edge.commands:Info"
clean = "kforge.edge.commands:Clean"
prune = "kforge.edge.commands:Prune"
cache = "kforge.edge.commands:Cache"
'''


def venv(path: Path, library: Path) -> Path:
    """A virtualenv with this checkout's kforge (editable), the LIBRARIES and envlib installed; made if missing."""
    if not (path / "bin" / "doit").exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(path / "bin" / "pip"), "install", "-q", "-e", str(REPO)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", *LIBRARIES], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", "--force-reinstall", "--no-build-isolation",
                    "--no-deps", str(library)], check=True)
    return path


def project(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    (root / "specs").mkdir(parents=True)
    (root / "dodo.py").write_text("from kforge.dodo import *  # noqa: F401,F403\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    for name, text in env_library.SPECS.items():
        (root / "specs" / f"{name}.toml").write_text(text)
    for name in LIGER:
        shutil.copy(REPO / "tests" / "liger_specs" / f"{name}.toml", root / "specs" / f"{name}.toml")
    for name, text in FLA.items():
        (root / "specs" / f"{name}.toml").write_text(text)
    return root


def doit(venv_dir: Path, root: Path, cache: Path, *args: str) -> dict:
    """venv's own bin/doit in the project, as a user runs it: its counts from out/build-report.json."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KFORGE_CACHE")}
    env.update(PATH=f"{venv_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv_dir),
               XDG_CACHE_HOME=str(cache))
    start = time.perf_counter()
    proc = subprocess.run([str(venv_dir / "bin" / "doit"), *args], cwd=root, env=env, capture_output=True, text=True)
    wall = round(time.perf_counter() - start, 1)
    summary = next((line for line in proc.stdout.splitlines()[::-1] + proc.stderr.splitlines()[::-1]
                    if line.startswith("kforge: built")), "")
    print(f"  {venv_dir}/bin/doit {' '.join(args)} in {root}: {summary} (exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    report = json.loads((root / "out" / "build-report.json").read_text())
    statuses: dict[str, int] = {}
    for task in report["tasks"]:
        if "@" in task["name"]:
            statuses[task["status"]] = statuses.get(task["status"], 0) + 1
    return {"exit": proc.returncode, "wall_s": wall, "summary": summary, "targets": statuses}


def identical(a: Path, b: Path) -> dict:
    """How many meta.json files, binaries, wheels and manifests are byte-identical between two out/."""
    import zipfile
    metas = sorted(p.relative_to(a) for p in a.glob("*/*/*/meta.json"))
    same_meta = sum((a / p).read_bytes() == (b / p).read_bytes() for p in metas if (b / p).exists())
    wheels_a, wheels_b = sorted((a / "dist").glob("*.whl")), sorted((b / "dist").glob("*.whl"))
    same_wheels = sum(x.name == y.name and x.read_bytes() == y.read_bytes() for x, y in zip(wheels_a, wheels_b))

    def manifest(wheel: Path) -> bytes:
        with zipfile.ZipFile(wheel) as z:
            return next(z.read(n) for n in z.namelist() if n.endswith("/manifest.json"))
    same_manifests = sum(manifest(x) == manifest(y) for x, y in zip(wheels_a, wheels_b))
    return {"meta.json": f"{same_meta} of {len(metas)}", "wheels": f"{same_wheels} of {len(wheels_a)}",
            "manifests": f"{same_manifests} of {len(wheels_a)}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv-a", type=Path, default=Path("/tmp/kf-venv-a"))
    parser.add_argument("--venv-b", type=Path, default=Path("/tmp/venv2"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/kf-second-venv"))
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--archs", default="sm_90a,gfx942")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    library = env_library.write_source(work / "envlib-src")
    print("virtualenvs:", flush=True)
    venv_a, venv_b = venv(args.venv_a.resolve(), library), venv(args.venv_b.resolve(), library)
    a, b = project(work / "a" / "project"), project(work / "b" / "somewhere" / "else" / "project")
    cache_a, cache_b, empty = work / "cache-a", work / "cache-b", work / "cache-empty"
    build = ("-n", str(args.n), f"archs={args.archs}")
    steps = {}
    print("1. each venv builds its project, each with its own empty local cache:", flush=True)
    steps["A builds"] = doit(venv_a, a, cache_a, *build)
    steps["B builds"] = doit(venv_b, b, cache_b, *build)
    print("2. A's out/ against B's:", flush=True)
    differences = compare(a / "out", b / "out")
    for line in differences[:20]:
        print("  " + line)
    same = identical(a / "out", b / "out")
    print(f"  identical: {same}", flush=True)
    print("3. A's out/ restored into B, venv B runs doit with an empty local cache:", flush=True)
    shutil.rmtree(b / "out")
    shutil.copytree(a / "out", b / "out", symlinks=True)
    steps["B on A's out/"] = doit(venv_b, b, empty, *build)
    # the same run once more: the catalog saved in out/ is the checkout's own (its stamp holds the project's
    # path), so the restored run above loaded the specs again; this one is a plain no-op, for comparison
    steps["B again (no-op)"] = doit(venv_b, b, empty, *build)
    print("4. B's out/ removed, venv B builds with A's local cache:", flush=True)
    shutil.rmtree(b / "out")
    steps["B with A's cache"] = doit(venv_b, b, cache_a, *build)
    built = steps["A builds"]["targets"]
    restored = steps["B on A's out/"]["targets"]
    from_cache = steps["B with A's cache"]
    ok = (not differences and all(s["exit"] == 0 for s in steps.values()) and set(built) == {"built"}
          and set(restored) == {"up-to-date"} and sum(restored.values()) == built["built"]
          and steps["B again (no-op)"]["targets"] == restored
          and f"({built['built']} from the local cache" in from_cache["summary"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    result = {"machine": f"dev, {os.cpu_count()} CPUs", "python": platform.python_version(), "kforge": commit,
              "command": "python bench/second_venv.py " + " ".join(sys.argv[1:]),
              "venv_a": str(venv_a), "venv_b": str(venv_b), "project_a": str(a), "project_b": str(b),
              "archs": args.archs, "steps": steps, "differences": differences, "identical": same, "ok": ok}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print("ok" if ok else "NOT OK")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
