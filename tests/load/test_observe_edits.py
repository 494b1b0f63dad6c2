"""Up to date means correct for a library whose inputs reading its source cannot find (issue 32): what the probe
and each compile actually read decides (rules/load/observe.py, rules/store/inputs.py), and the same inputs give the same
bytes wherever they lie. The library is tests/observed_library.py, on PYTHONPATH from a tmp site folder; beside
it the project has a kernel of its own that reads none of the library's files."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import observed_library
from tests.support import REPO, built_once, copy_built, doit, make_project, spec_text, statuses

WRAPPED = "kfl_wrap:fp32-block128@sm_90a"


def _project(tmp_path: Path) -> tuple[Path, dict]:
    site = observed_library.write(tmp_path / "site")
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), **observed_library.specs()})
    return root, {"PYTHONPATH": str(site)}


def _build_cold(folder: Path) -> None:
    """The library in folder/site and the project in folder/p, built from nothing: every listed target built."""
    root, env = _project(folder)
    doit(root, "-n", "1", env=env)
    assert statuses(root, "built") == _listed(root, env)   # listed after: from the catalog the build saved


@pytest.fixture
def built_copy(tmp_path_factory, tmp_path) -> tuple[Path, dict]:
    """A copy (at tmp_path/site and tmp_path/p) of the project built once for the whole run (_build_cold)."""
    copy_built(built_once(tmp_path_factory, "observed", _build_cold), tmp_path / "copy")
    return tmp_path / "copy" / "p", {"PYTHONPATH": str(tmp_path / "copy" / "site")}


def _artifacts(root: Path) -> dict[str, bytes]:
    """Every artifact file (binaries, meta.json) by its path under out/."""
    return {p.relative_to(root / "out").as_posix(): p.read_bytes()
            for arch in ("sm_90a", "gfx942") for p in sorted((root / "out" / arch).rglob("*")) if p.is_file()}


def _readers(root: Path, name: str) -> set[str]:
    """The targets whose compile read `name`, from their meta.json."""
    found = set()
    for meta in (root / "out").glob("*/*/*/meta.json"):
        m = json.loads(meta.read_text())
        if name in dict(m["inputs"]):
            found.add(m["target"])
    return found


def _listed(root: Path, env: dict) -> set[str]:
    return {t for t in doit(root, "list", "--all", "--quiet", env=env).stdout.split() if "@" in t}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


EDITS = {   # the library's file, and an edit that changes what is built
    "kfl/ops/scale_utils.py": ("else 128", "else 64"),            # imported by name after a sys.path insert
    "kfl/configs.json": (',\n {\n  "BLOCK": 512,\n  "num_warps": 4\n }', ""),   # read at import: a config goes
    "kfl/helpers.py": ("tl.program_id(0) * BLOCK", "tl.program_id(0).to(tl.int64) * BLOCK"),   # kfl.helpers.offsets
    "kfl/_gen/act.py": ("x * 2", "x * 4"),                        # loaded with spec_from_file_location
}


@pytest.mark.slow
def test_an_edit_rebuilds_exactly_the_targets_that_read_it_and_a_revert_gives_the_earlier_bytes(built_copy):
    """Each edit of EDITS in turn, on one built copy: a revert leaves it as built, so each edit starts from the
    cold build's state (the artifacts are compared to it)."""
    root, env = built_copy
    listed = _listed(root, env)
    assert statuses(root, "built") == listed   # the copied report: its cold build built each
    before = _artifacts(root)
    library = {t for t in listed if t.startswith("kfl_")}   # every compile of kfl.ops.scale reads the file
    for edited, change in EDITS.items():
        path = root.parent / "site" / edited
        original = path.read_text()
        _edit(path, *change)
        doit(root, "-n", "1", env=env)
        now = _listed(root, env)   # after the build: the catalog it loaded and saved
        rebuilt = library & now
        assert statuses(root, "built") == rebuilt and statuses(root, "up-to-date") == now - rebuilt, edited
        assert _readers(root, edited) & now == rebuilt and "scale:fp16-b256-w4@sm_90a" in now - rebuilt, edited
        if edited == "kfl/configs.json":   # the config is gone from the catalog
            assert listed - now == {"kfl_auto:fp32-block512-num_warps4-num_stages3@sm_90a"}
        else:
            assert now == listed, edited
        if edited == "kfl/ops/scale_utils.py":   # the heuristic's new value (the probe read the module again)
            meta = json.loads((root / "out/sm_90a/kfl_heur/fp32-n1024/meta.json").read_text())
            assert meta["constexprs"]["BLOCK"] == 64
        if edited in ("kfl/helpers.py", "kfl/_gen/act.py"):   # the kernel that calls it compiled to other code
            cubin = "sm_90a/kfl_auto/fp32-block128-num_warps4-num_stages3/auto_kernel.cubin"
            assert _artifacts(root)[cubin] != before[cubin], edited

        path.write_text(original)   # the config comes back; its artifact, never pruned, is up to date again
        doit(root, "-n", "1", env=env)
        # every target of the cold build's list ran, none else: the catalog is the cold build's again
        assert statuses(root, "built") == rebuilt and statuses(root, "up-to-date") == listed - rebuilt, edited
        assert _artifacts(root) == before, edited


def test_the_same_library_at_other_paths_with_other_mtimes_builds_the_same_bytes_with_no_path_in_them(
        tmp_path_factory, built_copy, tmp_path):
    """Autotuned, heuristics and a library's own wrapper class: every function the kernels reach (the helper
    through a module object, the generated one) is named <package>/<file>, and no mtime gets in (ptxas)."""
    first, env = built_copy
    built = built_once(tmp_path_factory, "observed", _build_cold)   # where first's artifacts were compiled
    other = tmp_path / "elsewhere" / "b"
    shutil.copytree(first.parent, other, ignore=shutil.ignore_patterns("out", "__pycache__"))
    later = time.time() + 86400
    for path in other.rglob("*"):
        os.utime(path, (later, later))
    second = other / "p"
    doit(second, "-n", "1", env={"PYTHONPATH": str(other / "site")})
    a, b = _artifacts(first), _artifacts(second)
    assert len(a) == 2 * len(_listed(first, env)) and a == b
    for name, data in a.items():
        assert str(built).encode() not in data and str(tmp_path).encode() not in data, name
    assert b"helpers.py" in a["sm_90a/kfl_auto/fp32-block128-num_warps4-num_stages3/auto_kernel.cubin"]


def test_a_touch_rebuilds_nothing_and_doit_info_names_what_the_compile_read_and_what_changed(built_copy):
    root, env = built_copy
    listed = _listed(root, env)
    later = time.time() + 100
    for path in (root.parent / "site").rglob("*.py"):
        os.utime(path, (later, later))
    doit(root, "-n", "1", env=env)
    assert statuses(root, "up-to-date") == listed
    saved = json.loads((root / "out/.kforge/observed-inputs.json").read_text())
    assert len(saved["sets"]) == 2 and len(saved["targets"]) == len(listed)   # the library's, the project's

    info = doit(root, "info", WRAPPED, env=env).stdout
    read = [line.split() for line in info.split("inputs its compile read")[1].splitlines()[1:] if line[:4] == "    "]
    assert sorted(name for name, _ in read) == sorted([*observed_library.FILES, "kfl/configs.json"])
    assert "state: up to date" in info
    _edit(root.parent / "site/kfl/helpers.py", *EDITS["kfl/helpers.py"])
    info = doit(root, "info", WRAPPED, env=env).stdout
    assert "kfl/helpers.py  " in info and info.count("(changed since)") == 1
    assert "state: stale: kfl/helpers.py changed since it was built (its compile read it)" in info


@pytest.mark.slow
def test_a_config_file_added_to_a_listed_folder_rebuilds_the_targets_that_listed_it_and_a_removed_one_leaves(tmp_path):
    """kfl.ops.tiled gets one autotune config per file of kfl/tiles/ (pathlib's glob): the probe and each of
    its compiles listed the folder, so the listing (its names) is their input, beside the files they read."""
    site = observed_library.write(tmp_path / "site", tiled=True)
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), **observed_library.specs(tiled=True)})
    env = {"PYTHONPATH": str(site)}
    tile = lambda block: f"kfl_tiles:fp32-block{block}-num_warps4-num_stages3@sm_90a"
    doit(root, "-n", "1", env=env)
    listed = _listed(root, env)   # each list after a build: the catalog it saved
    assert {t for t in listed if t.startswith("kfl_tiles:")} == {tile(128), tile(256)}
    assert _readers(root, "kfl/tiles/") == {tile(128), tile(256)}   # the library's scale kernels listed nothing
    before = _artifacts(root)

    observed_library.write_tile(site, "block512.json", {"BLOCK": 512, "num_warps": 4})
    doit(root, "-n", "1", env=env)
    now = _listed(root, env)
    assert now == listed | {tile(512)}
    assert statuses(root, "built") == {tile(128), tile(256), tile(512)}   # the listing they read changed
    assert statuses(root, "up-to-date") == listed - {tile(128), tile(256)}
    after = _artifacts(root)
    binaries = lambda found: {k: v for k, v in found.items() if k.endswith(".cubin") and k in before}
    assert binaries(after) == binaries(before)   # the same code: only their inputs (in meta.json) moved

    (site / "kfl" / "tiles" / "block256.json").unlink()
    doit(root, "-n", "1", env=env)
    now = _listed(root, env)
    assert now == listed - {tile(256)} | {tile(512)}
    assert statuses(root, "built") == {tile(128), tile(512)} and statuses(root, "up-to-date") == now - statuses(root, "built")
    info = doit(root, "info", tile(128), env=env).stdout
    assert "kfl/tiles/  " in info and "kfl/tiles/block128.json  " in info and "state: up to date" in info
    (site / "kfl" / "tiles" / "README").write_text("a file the library's glob does not match\n")
    info = doit(root, "info", tile(128), env=env).stdout   # the listing is what it read, not what it kept
    assert "state: stale: kfl/tiles/ changed since it was built (its compile listed it: a name was added or " \
           "removed)" in info


LINKED_KERNEL = '''
import json, os
import triton
import triton.language as tl
from tk.helper import scale
with open(os.path.join(os.path.dirname(__file__), "cfg.json")) as f:
    FACTOR = tl.constexpr(json.load(f)["factor"])


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, scale(tl.load(x_ptr + i, mask=m) * FACTOR).to(y_ptr.dtype.element_ty), mask=m)
'''


def test_links_leading_out_of_the_project_are_inputs_by_their_names_in_it_and_two_checkouts_build_the_same_bytes(
        tmp_path):
    """tk/cfg.json (read at import) and tk/helper.py (a @triton.jit helper) are links to ../../shared/: each is an
    input under its project name, so an edit of the shared file rebuilds, and a copy of the tree elsewhere builds
    the same bytes (no absolute path in meta.json, the manifest or the wheel)."""
    one = tmp_path / "one"
    (one / "shared").mkdir(parents=True)
    (one / "shared" / "cfg.json").write_text('{"factor": 5}')
    (one / "shared" / "helper.py").write_text("import triton\n\n\n@triton.jit\ndef scale(x):\n    return x * 2\n")
    root = make_project(one / "p", specs={"scale": spec_text()}, kernels={"scale": LINKED_KERNEL})
    for name in ("cfg.json", "helper.py"):
        (root / "tk" / name).symlink_to(Path("..", "..", "shared", name))
    two = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(one, two, symlinks=True)
    for project in (root, two / "p"):
        doit(project, "-n", "1")
    target = "scale:fp16-b256-w4@sm_90a"
    assert statuses(root, "built") == {target}
    meta = json.loads((root / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "meta.json").read_text())
    assert [n for n, _ in meta["inputs"]] == ["tk/__init__.py", "tk/cfg.json", "tk/helper.py", "tk/scale.py"]
    wheels = [sorted((project / "out" / "dist").glob("*.whl")) for project in (root, two / "p")]
    assert [w.name for w in wheels[0]] == [w.name for w in wheels[1]] and len(wheels[0]) == 1
    assert wheels[0][0].read_bytes() == wheels[1][0].read_bytes()
    (one / "shared" / "cfg.json").write_text('{"factor": 6}')
    doit(root, "-n", "1")
    assert statuses(root, "built") == {target}
    (one / "shared" / "helper.py").write_text("import triton\n\n\n@triton.jit\ndef scale(x):\n    return x * 3\n")
    doit(root, "-n", "1")
    assert statuses(root, "built") == {target}


STACK_READER = "import traceback\n_CALLED_FROM = traceback.format_stack()   # libraries do, for warnings and op registries\n"


def test_the_launcher_that_started_the_build_is_never_an_input(tmp_path):
    """A kernel module that reads its import's stack reads the script that started the process: a virtualenv's
    bin/doit, whose first line names that virtualenv. Two launchers at two paths (two virtualenvs) give the same
    meta.json, and neither is an input."""
    metas = []
    for venv in ("venv_a", "venv_b"):
        launcher = tmp_path / venv / "bin" / "doit"
        launcher.parent.mkdir(parents=True)
        launcher.write_text(f"#!{sys.executable}\n# {launcher.parent.parent}\nimport sys\nfrom doit.__main__ import main\n"
                            "sys.exit(main())\n")
        root = make_project(tmp_path / venv / "p", specs={"scale": spec_text()})
        kernel = root / "tk" / "scale.py"
        kernel.write_text(STACK_READER + kernel.read_text())
        env = {**os.environ, "PYTHONPATH": str(REPO), "KFORGE_LOCAL_CACHE": "off"}
        subprocess.run([sys.executable, str(launcher), "-n", "1"], cwd=root, env=env, check=True,
                       capture_output=True)
        meta = (root / "out/sm_90a/scale/fp16-b256-w4/meta.json").read_bytes()
        assert [name for name, _ in json.loads(meta)["inputs"]] == ["tk/__init__.py", "tk/scale.py"]
        metas.append(meta)
    assert metas[0] == metas[1]


GENERATOR = ('import os\n'
             'with open(os.path.join(os.path.dirname(__file__), "_generated.py"), "w") as _f:   # the same bytes each time\n'
             '    _f.write("FACTOR = 2\\n")\n'
             'from tk import _generated  # noqa: E402,F401\n')


def test_a_module_that_generates_a_file_it_imports_reaches_a_no_op(tmp_path):
    """The import writes tk/_generated.py (the same bytes each run) and imports it: the file changed while the
    compile read it, because the compile wrote it. What it wrote is the input, so the build settles: the first
    build creates the file (a source the catalog found missing: the second build has the key that names it),
    and from then on every run is a no-op (it rebuilt on every run, forever)."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text()})
    kernel = root / "tk" / "scale.py"
    kernel.write_text(GENERATOR + kernel.read_text())
    env = {"KFORGE_LOCAL_CACHE": "off"}
    for _ in range(2):
        doit(root, "-n", "1", env=env)
        assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}
    meta = json.loads((root / "out/sm_90a/scale/fp16-b256-w4/meta.json").read_text())
    assert "tk/_generated.py" in dict(meta["inputs"])
    for _ in range(2):
        doit(root, "-n", "1", env=env)
        assert statuses(root, "up-to-date") == {"scale:fp16-b256-w4@sm_90a"}
