"""The kernels of an installed library, Liger-Kernel, built from `module = "liger_kernel.ops..."` specs
(tests/liger_specs/): every kernel builds (one config each, the two vendors alternating), autotuned entries and
string / int-enum / float constexprs included; built from a copy of the package put ahead of the installed one on PYTHONPATH, an edit of one of
the copy's files rebuilds exactly the targets whose compile read it (liger_kernel/__init__.py imports every
op, so one op's file is read by every compile; a file no compile reads rebuilds nothing)."""
import ast
import importlib.util
import json
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.support import REPO, doit, make_project, statuses

SPECS = REPO / "tests" / "liger_specs"
ARCHS = ("sm_90a", "gfx942")
EDITED = "liger_kernel/ops/swiglu.py"
UNREAD = "liger_kernel/env_report.py"   # imported by no kernel module


def _liger_dir() -> Path:
    return Path(importlib.util.find_spec("liger_kernel").origin).parent


def _specs() -> dict[str, dict]:
    return {p.stem: tomllib.loads(p.read_text()) for p in sorted(SPECS.glob("*.toml"))}


def _autotuned(module: str, entry: str) -> bool:
    """Whether the entry is wrapped in @triton.autotune in the installed module's source."""
    from kforge.load import installed
    tree = ast.parse(installed.find(module).path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    return any("autotune" in ast.unparse(d) for d in fn.decorator_list)


def _listed(root: Path, kernels: dict[str, dict]) -> set[str]:
    """Every target of the liger specs' project at root, whose specs name sm_90a alone (1 to 4 a kernel)."""
    listed = {t for t in doit(root, "list", "--all", "--quiet").stdout.split() if "@" in t}
    assert {t.split(":")[0] for t in listed} == set(kernels) and {t.split("@")[1] for t in listed} == {"sm_90a"}
    assert len(kernels) <= len(listed) < 150
    return listed


def _loaded(root: Path, kernels: dict[str, dict]) -> set[str]:
    """Every target of the project at root, from the catalog loaded here as doit loads it, and saved for its next
    run as a build saves it (a `doit list` saves nothing, so the build after it would load every module again)."""
    from kforge.edge import dodo_tasks
    catalog = dodo_tasks.load_catalog(root)   # what dodo.py calls
    assert not catalog.broken, [b.line() for b in catalog.broken]
    catalog.save()
    listed = {t.name for t in catalog.targets}
    assert {t.split(":")[0] for t in listed} == set(kernels) and len(listed) >= 2 * len(kernels)
    return listed


@pytest.mark.slow
def test_every_liger_kernel_of_the_installed_package_builds(tmp_path):
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger_kernel is not installed")
    specs = _specs()
    kernels = {s["kernel"]["name"]: s["kernel"] for s in specs.values()}
    assert len(kernels) >= 13 and all(name.startswith("liger_") for name in kernels)
    assert all(k["module"].startswith("liger_kernel.") and set(k["archs"]) <= set(ARCHS) for k in kernels.values())
    autotuned = {n for n, k in kernels.items() if _autotuned(k["module"], k["entry"])}
    assert len(autotuned) >= 2, autotuned

    root = make_project(tmp_path / "p", specs={n: (SPECS / f"{n}.toml").read_text() for n in specs}, kernels={})
    every = _loaded(root, kernels)
    # every kernel built once, for one of the two vendors, alternating: each vendor still builds 11 or 12 of the
    # library's kernels, an autotuned one among them (a kernel's configs differ in values, not in kinds)
    one_arch = {name: ARCHS[i % 2] for i, name in enumerate(sorted(kernels))}
    assert {one_arch[name] for name in autotuned} == set(ARCHS)
    listed = {min(t for t in every if t.startswith(name + ":") and t.endswith("@" + one_arch[name]))
              for name in kernels}
    doit(root, "-n", "1", *sorted(listed))   # from the catalog _loaded saved: the library is not probed again
    report = json.loads((root / "out" / "build-report.json").read_text())
    assert report["counts"]["failed"] == 0 and statuses(root, "built") == listed
    assert {t.split("@")[1] for t in listed} == set(ARCHS)
    built_families = {t.split(":")[0] for t in listed}
    assert len(built_families) >= 13 and autotuned <= built_families
    constexpr_types = set()
    for target in listed:
        kernel, rest = target.split(":")
        cid, arch = rest.split("@")
        meta = json.loads((root / "out" / arch / kernel / cid / "meta.json").read_text())
        assert meta["source"]["module"].startswith("liger_kernel.") and meta["source"]["entry"] == \
            kernels[kernel]["entry"]
        assert (root / "out" / arch / kernel / cid / meta["binary"]).is_file()
        constexpr_types |= {(kernel, name, type(v).__name__) for name, v in meta["constexprs"].items()}
    assert ("liger_cross_entropy", "reduction", "str") in constexpr_types        # "mean" | "sum" | "none"
    assert ("liger_rms_norm_fwd", "casting_mode", "int") in constexpr_types      # int enum
    assert ("liger_jsd", "beta", "float") in constexpr_types
    assert ("liger_cross_entropy", "weight_ptr", "NoneType") in constexpr_types   # an optional input, None
    assert ("liger_rms_norm_bwd", "X_dtype", "str") in constexpr_types           # a dtype constexpr ("bf16")


# three families from three files, one autotuned (a cold build of every kernel is the test above; what a copy
# adds is which files an import finds and reads, the same question for every family)
SHADOWED = ("liger_cross_entropy", "liger_dyt_fwd", "liger_swiglu_fwd")


@pytest.mark.slow
def test_a_shadowing_copy_keeps_the_installed_builds_and_an_edit_rebuilds_exactly_what_read_it(tmp_path):
    """Built from the installed package, then a copy of it (and its dist-info) put ahead on PYTHONPATH, one of
    the copy's files that no compile read edited: the same contents of every file a compile read and the same
    distribution give the same keys (up to date; the saved catalog holds which copy an import finds), and the
    edit rebuilds nothing (either one failing rebuilds: one build checks both, each build loads the library
    again); an edit of one every compile reads (liger_kernel/__init__.py imports every op) rebuilds them all,
    from the copy, whose meta.json lists it."""
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger_kernel is not installed")
    specs = {name: spec for name, spec in _specs().items() if name in SHADOWED}
    kernels = {s["kernel"]["name"]: s["kernel"] for s in specs.values()}
    assert set(kernels) == set(SHADOWED) and any(_autotuned(k["module"], k["entry"]) for k in kernels.values())
    # which files an import finds and reads is the same question on every arch: the specs name one (a load
    # imports the library, and torch, once per arch its families name)
    root = make_project(tmp_path / "p", specs={n: _on_sm_90a((SPECS / f"{n}.toml").read_text()) for n in specs},
                        kernels={})
    doit(root, "-n", "1")                                                 # the installed package
    listed = _listed(root, kernels)   # after the build: the catalog it saved
    assert statuses(root, "built") == listed
    site = _shadowing_copy(tmp_path / "site")
    env = {"PYTHONPATH": str(site)}
    unread = site / UNREAD
    assert unread.read_text() == (_liger_dir().parent / UNREAD).read_text()   # a copy, of a file that is there
    unread.write_text(unread.read_text() + "\n# edited by tests/load/test_installed_liger.py\n")
    doit(root, "-n", "1", env=env)                                        # the copy: the same keys
    assert statuses(root, "up-to-date") == listed and statuses(root, "failed") == set()
    edited = site / EDITED
    edited.write_text(edited.read_text() + "\n# edited by tests/load/test_installed_liger.py\n")
    doit(root, "-n", "1", env=env)
    assert statuses(root, "built") == listed
    read = [dict(json.loads(m.read_text())["inputs"]) for m in (root / "out").glob("*/*/*/meta.json")]
    assert len(read) == len(listed) and all(EDITED in r and UNREAD not in r for r in read)
    assert all(any(k.startswith("liger_kernel/") and k != EDITED for k in r) for r in read)


def _on_sm_90a(spec: str) -> str:
    """A liger spec (tests/liger_specs/) for sm_90a alone: its archs, less the exclusions that name gfx942
    (kforge refuses an exclusion that matches no config)."""
    both = f"archs = {json.dumps(list(ARCHS))}\n"
    assert spec.count(both) == 1, spec
    head, *excludes = spec.replace(both, 'archs = ["sm_90a"]\n').split("[[exclude]]\n")
    return "[[exclude]]\n".join([head, *(e for e in excludes if not e.startswith('arch = "gfx942"\n'))])


def _shadowing_copy(site: Path) -> Path:
    """The installed liger_kernel package and its dist-info copied into site (PYTHONPATH=site shadows them)."""
    installed_dir = _liger_dir()
    shutil.copytree(installed_dir, site / "liger_kernel", ignore=shutil.ignore_patterns("__pycache__"))
    infos = sorted(installed_dir.parent.glob("liger_kernel-*.dist-info"))
    assert len(infos) == 1
    shutil.copytree(infos[0], site / infos[0].name)
    return site
