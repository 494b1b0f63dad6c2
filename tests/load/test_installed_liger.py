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

from tests.support import REPO, built_once, copy_built, doit, make_project, statuses

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


def _listed(root: Path, kernels: dict[str, dict], env: dict[str, str]) -> set[str]:
    """Every target of the liger specs' project at root, whose specs name sm_90a alone (1 to 4 a kernel); listed
    with the build's own PYTHONPATH, from the catalog it saved (another path to the library would load it again)."""
    listed = {t for t in doit(root, "list", "--all", "--quiet", env=env).stdout.split() if "@" in t}
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


def _kernels() -> dict[str, dict]:
    return {s["kernel"]["name"]: s["kernel"] for s in _specs().values()}


def _one_arch(kernels) -> dict[str, str]:
    """The arch each kernel is built for: the two vendors alternating in name order."""
    return {name: ARCHS[i % 2] for i, name in enumerate(sorted(kernels))}


def _build_every_kernel(folder: Path) -> None:
    """The project of every liger spec at folder/p (both archs each), one config of each kernel built for the arch
    _one_arch gives it (the first of its targets there); their names in folder/built.json."""
    specs, kernels = _specs(), _kernels()
    root = make_project(folder / "p", specs={n: (SPECS / f"{n}.toml").read_text() for n in specs}, kernels={})
    every = _loaded(root, kernels)
    one_arch = _one_arch(kernels)
    built = {min(t for t in every if t.startswith(name + ":") and t.endswith("@" + one_arch[name]))
             for name in kernels}
    doit(root, "-n", "1", *sorted(built))   # from the catalog _loaded saved: the library is not probed again
    (folder / "built.json").write_text(json.dumps(sorted(built)))


@pytest.fixture
def every_kernel_built(tmp_path_factory) -> Path:
    """The folder _build_every_kernel filled, once for the whole run: tests read it, or change a copy of it."""
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger_kernel is not installed")
    return built_once(tmp_path_factory, "liger-every-kernel", _build_every_kernel)


@pytest.mark.slow
def test_every_liger_kernel_of_the_installed_package_builds(every_kernel_built):
    kernels = _kernels()
    assert len(kernels) >= 13 and all(name.startswith("liger_") for name in kernels)
    assert all(k["module"].startswith("liger_kernel.") and set(k["archs"]) <= set(ARCHS) for k in kernels.values())
    autotuned = {n for n, k in kernels.items() if _autotuned(k["module"], k["entry"])}
    assert len(autotuned) >= 2, autotuned

    root = every_kernel_built / "p"
    listed = set(json.loads((every_kernel_built / "built.json").read_text()))
    # every kernel built once, for one of the two vendors, alternating: each vendor still builds 11 or 12 of the
    # library's kernels, an autotuned one among them (a kernel's configs differ in values, not in kinds)
    one_arch = _one_arch(kernels)
    assert {one_arch[name] for name in autotuned} == set(ARCHS)
    assert sorted(t.split(":")[0] for t in listed) == sorted(kernels)   # one target each
    assert all(t.endswith("@" + one_arch[t.split(":")[0]]) for t in listed)
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


# three families from three files, one autotuned, that the every-kernel build built for sm_90a (a cold build of
# every kernel is the test above; what a copy adds is which files an import finds and reads, the same question
# for every family); EDITED is none of their modules' files, and every compile reads it
SHADOWED = ("liger_cross_entropy", "liger_dyt_fwd", "liger_rope")


@pytest.mark.slow
def test_a_shadowing_copy_keeps_the_installed_builds_and_an_edit_rebuilds_exactly_what_read_it(every_kernel_built,
                                                                                                tmp_path):
    """Built from the installed package (a copy of the every-kernel build, its specs cut to the shadowed families on
    sm_90a), then a copy of the package (and its dist-info) put ahead on PYTHONPATH, one of the copy's files that
    no compile read edited: the same contents of every file a compile read and the same distribution give the same
    keys (up to date; the saved catalog holds which copy an import finds), and the edit rebuilds nothing (either
    one failing rebuilds: one build checks both, each build loads the library again); an edit of one every compile
    reads (liger_kernel/__init__.py imports every op) rebuilds them all, from the copy, whose meta.json lists it."""
    kernels = {name: k for name, k in _kernels().items() if name in SHADOWED}
    assert set(kernels) == set(SHADOWED) and any(_autotuned(k["module"], k["entry"]) for k in kernels.values())
    root = copy_built(every_kernel_built, tmp_path / "copy") / "p"
    # which files an import finds and reads is the same question on every arch: the specs name one (a load
    # imports the library, and torch, once per arch its families name)
    for spec in (root / "specs").glob("*.toml"):
        if spec.stem in SHADOWED:
            spec.write_text(_on_sm_90a(spec.read_text()))
        else:
            spec.unlink()
    listed = {t for t in json.loads((tmp_path / "copy" / "built.json").read_text()) if t.split(":")[0] in SHADOWED}
    assert len(listed) == len(SHADOWED) and {t.split("@")[1] for t in listed} == {"sm_90a"}
    assert listed <= statuses(root, "built")   # the copied report: built from the installed package
    site = _shadowing_copy(tmp_path / "site")
    env = {"PYTHONPATH": str(site)}
    unread = site / UNREAD
    assert unread.read_text() == (_liger_dir().parent / UNREAD).read_text()   # a copy, of a file that is there
    unread.write_text(unread.read_text() + "\n# edited by tests/load/test_installed_liger.py\n")
    doit(root, "-n", "1", *sorted(listed), env=env)                       # the copy: the same keys
    assert statuses(root, "up-to-date") == listed and statuses(root, "failed") == set()
    assert listed <= _listed(root, kernels, env)   # after the build: the catalog it saved
    edited = site / EDITED
    edited.write_text(edited.read_text() + "\n# edited by tests/load/test_installed_liger.py\n")
    doit(root, "-n", "1", *sorted(listed), env=env)
    assert statuses(root, "built") == listed
    metas = [json.loads((root / "out" / t.split("@")[1] / t.split(":")[0] / t.split(":")[1].split("@")[0]
                         / "meta.json").read_text()) for t in sorted(listed)]
    assert [m["target"] for m in metas] == sorted(listed)
    read = [dict(m["inputs"]) for m in metas]
    assert all(EDITED in r and UNREAD not in r for r in read)
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
