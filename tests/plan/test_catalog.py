"""The repository's own catalog loads: every spec in specs/ is valid and gives the targets README promises.
Building it is README's main command, which CI runs once before the tests (.ci/run checks its report);
the tests never build it again."""
from kforge.base.layout import Layout
from pathlib import Path
from kforge.plan.catalog import load_specs
from kforge.plan.targets import build_targets
from tests.support import REPO


def test_the_catalog_loads_into_unique_targets_inside_out():
    specs = load_specs(REPO)
    targets = build_targets(specs, REPO, None)
    names = [t.name for t in targets]
    assert len(names) == len(set(names)) > 1000
    assert {"gemm", "rmsnorm", "softmax", "moe_gemm", "fly_gemm", "fly_fp8_gemm", "fly_rmsnorm",
            "fly_softmax", "ep_dispatch", "ep_combine"} <= {t.kernel for t in targets}
    out = Layout(REPO).out
    assert all(out in Path(Layout(REPO).artifact_path(t.arch, t.kernel, t.config_id)).parents for t in targets)
    assert {t.toolchain for t in targets} == {"triton", "flydsl"}


# rules/plan/catalog.py: the catalog kept between runs is used only while nothing it came from changed.

import json  # noqa: E402
import textwrap  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from kforge.plan import catalog as catalog_module  # noqa: E402
from kforge.base.errors import SpecError  # noqa: E402
from tests.support import kernel_text, make_project, spec_text, write_files  # noqa: E402

HELPER = "FACTOR = 3\n"


@pytest.fixture
def project(tmp_path):
    kernel = kernel_text(factor="FACTOR", imports="from tk.helper import FACTOR")
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128, 256))},
                        kernels={"scale": kernel, "helper": HELPER})
    return root


def loaded(root, archs=None):
    return catalog_module.Catalog(root, archs, 50_000).load()


def load_watched(root, monkeypatch, archs=None):
    """(target name -> key, whether the load used the saved catalog rather than the specs)."""
    from kforge.declare import spec as spec_module
    from_specs = []
    real = spec_module.read_tables
    monkeypatch.setattr(spec_module, "read_tables", lambda *a: from_specs.append(1) or real(*a))
    found = loaded(root, archs)
    monkeypatch.setattr(spec_module, "read_tables", real)
    return {t.name: t.key for t in found.targets}, not from_specs


def later(path, text):
    """Rewrite a file so that its identity surely changes (a new mtime even on a coarse clock)."""
    time.sleep(0.01)
    path.write_text(text)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))


def test_an_unchanged_project_loads_the_saved_catalog_with_the_same_targets(project, monkeypatch):
    first = loaded(project)
    first.save()
    expected = {t.name: t for t in first.targets}
    keys, used_saved = load_watched(project, monkeypatch)
    assert used_saved and keys == {n: t.key for n, t in expected.items()}
    again = {t.name: t for t in loaded(project).targets}
    assert again == expected   # every field, with the tuples the fields hold


def in_place(path, old, new):
    """Rewrite a file in place, keeping its inode and size and putting its mtime back: only the ctime moves."""
    assert len(old) == len(new)
    st = path.stat()
    time.sleep(0.01)
    with open(path, "r+") as f:
        text = f.read()
        assert old in text
        f.seek(0)
        f.write(text.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


@pytest.mark.parametrize("edit", ["spec value", "kernel source", "helper module", "new spec", "kforge code",
                                  "kernel source in place", "helper module in place", "spec value in place",
                                  "corrupt catalog", "damaged catalog", "older format"])
def test_any_change_it_came_from_loads_the_catalog_again(project, monkeypatch, tmp_path, edit):
    before = {t.name: t.key for t in loaded(project).targets}
    first = loaded(project)
    first.save()
    if edit == "spec value":
        later(project / "specs" / "scale.toml", spec_text(blocks=(128, 512)))
    elif edit == "kernel source":
        later(project / "tk" / "scale.py", kernel_text(factor="FACTOR + 1", imports="from tk.helper import FACTOR"))
    elif edit == "helper module":
        later(project / "tk" / "helper.py", "FACTOR = 4\n")
    elif edit == "kernel source in place":
        in_place(project / "tk" / "scale.py", "* FACTOR)", "+ FACTOR)")
    elif edit == "helper module in place":
        in_place(project / "tk" / "helper.py", "3", "4")
    elif edit == "spec value in place":
        in_place(project / "specs" / "scale.toml", "256]", "512]")
    elif edit == "new spec":
        (project / "specs" / "other.toml").write_text(spec_text(name="other"))
    elif edit == "kforge code":
        code = tmp_path / "kforge_code"
        code.mkdir()
        (code / "x.py").write_text("")
        monkeypatch.setattr(catalog_module, "KFORGE_CODE", (code,))
        first = loaded(project)
        first.save()
        later(code / "x.py", "# edited\n")
    elif edit == "damaged catalog":   # valid JSON, the right stamp, targets that are not targets
        path = project / "out" / ".kforge" / "catalog.json"
        saved = json.loads(path.read_text())
        path.write_text(json.dumps({**saved, "targets": [["not", "a", "row"]], "groups": None}))
    elif edit == "older format":   # kforge-catalog-9 stored out/ paths where a target now carries its Layout
        path = project / "out" / ".kforge" / "catalog.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "format": "kforge-catalog-9"}))
    else:
        (project / "out" / ".kforge" / "catalog.json").write_text('{"format": "%s", "stamp"' % catalog_module.FORMAT)
    keys, used_saved = load_watched(project, monkeypatch)
    assert not used_saved
    if edit in ("kernel source", "helper module", "kernel source in place", "helper module in place"):
        assert set(keys) == set(before) and all(keys[n] != before[n] for n in before)
    elif edit in ("spec value", "spec value in place"):
        assert any("b512" in n for n in keys) and not any("b256" in n for n in keys)
    elif edit == "new spec":
        assert any(n.startswith("other:") for n in keys)
    else:
        assert keys == before


def test_a_run_that_finds_its_saved_catalog_imports_no_spec_machinery_and_no_compiler(tmp_path):
    """What a no-op run pays for: loading specs, computing targets and compilers are for a run that needs them."""
    import subprocess
    import sys

    from tests.support import REPO, doit
    project = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128, 256))})
    doit(project, "-n", "1")   # builds, and saves the catalog
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('MODULES', *sorted(sys.modules)))\n"
             "sys.argv = ['doit', '-n', '1']\n"
             "from doit.__main__ import main\n"
             "main()\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "built 0, up to date 2" in proc.stdout, proc.stdout + proc.stderr
    modules = set(proc.stdout.split("MODULES", 1)[1].split())
    assert "kforge.plan.catalog" in modules and "kforge.base.target" in modules   # really the run's modules
    heavy = {"kforge.declare.spec", "kforge.declare.spec_model", "kforge.declare.sweep", "kforge.plan.targets", "kforge.load.sources", "kforge.compile.action",
             "kforge.compile.core", "triton", "torch", "flydsl"}
    assert not heavy & modules, sorted(heavy & modules)


def kept_catalogs(root):
    return sorted((root / "out" / ".kforge" / "catalogs").glob("*.json"))


def test_a_catalog_is_kept_once_loaded_and_serves_any_of_its_archs(tmp_path, monkeypatch):
    """`doit list` (every arch) after a build for one arch, then builds for one arch again: one load from the specs
    per set of archs not held yet, whatever the command; the saved catalog serves a subset of its archs."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text(archs=("sm_90a", "gfx942"), blocks=(128, 256))})
    one, from_saved = load_watched(root, monkeypatch, ("sm_90a",))   # saved now: no run's end needed
    assert not from_saved and {n.split("@")[1] for n in one} == {"sm_90a"}
    assert load_watched(root, monkeypatch, ("sm_90a",)) == (one, True)
    every, from_saved = load_watched(root, monkeypatch)   # holds sm_90a only: every arch is loaded
    assert not from_saved and {n.split("@")[1] for n in every} == {"sm_90a", "gfx942"}
    assert load_watched(root, monkeypatch) == (every, True)
    assert load_watched(root, monkeypatch, ("sm_90a",)) == (one, True)   # a subset of what it holds
    assert load_watched(root, monkeypatch, ("gfx942",)) == ({n: k for n, k in every.items() if "gfx942" in n}, True)


def test_a_revert_of_the_sources_loads_the_kept_catalog_not_the_specs(project, monkeypatch):
    """The source edited (loaded from the specs), then put back as it was (new identity, the same bytes): the
    catalog kept from before the edit is used, and saved as the current one."""
    source = project / "tk" / "scale.py"
    original = source.read_text()
    first = loaded(project)
    first.save()
    before = {t.name: t for t in first.targets}
    later(source, original + "# an edit\n")
    keys, used_saved = load_watched(project, monkeypatch)
    assert not used_saved and keys.keys() == before.keys() and all(keys[n] != before[n].key for n in before)
    loaded(project).save()
    assert len(kept_catalogs(project)) == 2
    later(source, original)   # the revert
    keys, used_saved = load_watched(project, monkeypatch)
    assert used_saved and keys == {n: t.key for n, t in before.items()}
    reverted = loaded(project)
    assert {t.name: t for t in reverted.targets} == before   # every field
    reverted.save()
    assert catalog_module.Catalog(project, None, 50_000).load().loaded_from == "saved"   # by identity again


@pytest.mark.parametrize("damage", [
    lambda c: c["families"][0].__setitem__(2, 5),                     # a path that is a number
    lambda c: c["families"].__setitem__(0, "scale"),                  # a family that is no row
    lambda c: c.__setitem__("tuned", [5]),                            # a tuned pick that is no table
    lambda c: c.__setitem__("tuned", [{"arch": ["sm_90a"]}]),
    lambda c: c["per_family"][0].__setitem__("inputs", [[5, "x"]]),   # an input path that is a number
    lambda c: c.__setitem__("read", [5]),
])
def test_a_saved_catalog_damaged_inside_its_shape_is_loaded_again_never_a_traceback(project, monkeypatch, damage):
    """Valid JSON of the right fields and types, the right stamp, a row inside it of another shape: the state
    under out/ is untrusted (docs/threat_model.md); a path that was a number was an AttributeError traceback."""
    before = {t.name: t.key for t in loaded(project).targets}
    path = project / "out" / ".kforge" / "catalog.json"
    saved = json.loads(path.read_text())
    damage(saved)
    for archs in (None, ("sm_90a",)):
        path.write_text(json.dumps(saved))
        found = loaded(project, archs)
        assert {t.name: t.key for t in found.targets} == before and found.tuned == []
    path.write_text(json.dumps(saved))   # and family by family (a spec's other file changed): per_family is read
    (project / "specs" / "other.toml").write_text(spec_text(name="other"))
    assert {t.name: t.key for t in loaded(project).targets}.items() >= before.items()


@pytest.mark.parametrize("spoil", ["damaged", "copied under another name", "nested too deeply"])
def test_a_kept_catalog_is_used_only_whole_and_under_its_own_content(project, monkeypatch, spoil):
    """The source edited and put back, the catalog kept from before the edit spoiled meanwhile: the specs load."""
    source = project / "tk" / "scale.py"
    original = source.read_text()
    loaded(project).save()
    (kept,) = kept_catalogs(project)
    later(source, original + "# an edit\n")
    loaded(project).save()
    if spoil == "damaged":
        kept.write_text(json.dumps({**json.loads(kept.read_text()), "targets": [["not", "a", "row"]]}))
    elif spoil == "nested too deeply":   # a RecursionError in json.loads was a traceback
        kept.write_text("[" * 100_000 + "]" * 100_000)
    else:   # the edit's catalog under the name of the original's
        (edited,) = (k for k in kept_catalogs(project) if k != kept)
        kept.write_bytes(edited.read_bytes())
    later(source, original)
    keys, used_saved = load_watched(project, monkeypatch)
    assert not used_saved and keys == {t.name: t.key for t in loaded(project).targets}


# Keep going at load: a family that does not load is one failed entry; the others load and build.

from tests import tune_library  # noqa: E402
from tests.support import doit, statuses  # noqa: E402

BROKEN_MODULES = {
    # asks for a GPU at import, as a library may; the line that raises is named
    "nodevice": '''
        import triton
        import triton.language as tl

        raise RuntimeError("No device were detected")


        @triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])
        @triton.jit
        def lib_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            pass
        ''',
    "hangs": '''
        import time

        import triton
        import triton.language as tl

        time.sleep(3600)   # waits on something that never comes (a CPU-bound loop: tests/load/test_load_guard.py)


        @triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])
        @triton.jit
        def lib_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            pass
        ''',
}


def library_spec(name, module):
    return (f'[kernel]\nname = "{name}"\nmodule = "kforge_tunelib.ops.{module}"\nentry = "lib_kernel"\n'
            f'toolchain = "triton"\narchs = ["sm_90a"]\n\n[signature]\nx_ptr = "*fp32"\ny_ptr = "*fp32"\nn = "i32"\n'
            f'BLOCK = "constexpr"\n\n[sweep]\n')


def broken_project(tmp_path):
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    specs = {"scale": spec_text(), "lib_nodevice": library_spec("lib_nodevice", "nodevice"),
             "lib_hangs": library_spec("lib_hangs", "hangs"),
             "malformed": "[kernel\nname = 'x'\n",
             "twice_a": spec_text(name="dup"), "twice_b": spec_text(name="dup")}   # two files, one name
    root = make_project(tmp_path / "p", specs=specs)
    return root, {"PYTHONPATH": str(site), "KFORGE_CATALOG_TIMEOUT": "3"}


NODEVICE = ("specs/lib_nodevice.toml: reading kforge_tunelib.ops.nodevice.lib_kernel's autotune / heuristics (the "
            "module is imported in a child process): RuntimeError: No device were detected (in "
            "kforge_tunelib/ops/nodevice.py:5)")


@pytest.mark.slow
def test_a_family_that_does_not_load_is_one_failed_entry_and_the_others_build(tmp_path):
    root, env = broken_project(tmp_path)
    listed = doit(root, "list", env=env)   # lists the families, the broken ones marked
    rows = dict(line.split(None, 1) for line in listed.stdout.splitlines())
    assert rows["scale"] == "all scale targets"
    assert rows["lib_nodevice"] == f"BROKEN (did not load): {NODEVICE}"
    assert rows["lib_hangs"].startswith("BROKEN (did not load): specs/lib_hangs.toml: importing kforge_tunelib.ops."
                                        "hangs for sm_90a to read the entry's autotune / heuristics ran past "
                                        "catalog_timeout (3 s)")
    assert rows["malformed"].startswith("BROKEN (did not load): specs/malformed.toml: not valid TOML")
    # which of the two was meant? neither builds (the first to load took the name, the other's artifacts were
    # orphaned and its bundle silently short: an outside review)
    assert {rows["dup"], rows["dup_broken"]} == {
        "BROKEN (did not load): specs/twice_a.toml: kernel name 'dup' is also given by specs/twice_b.toml; target "
        "names must be unique: rename one [kernel] name (neither builds until then)",
        "BROKEN (did not load): specs/twice_b.toml: kernel name 'dup' is already used by specs/twice_a.toml; target "
        "names must be unique: rename one [kernel] name (neither builds until then)"}
    said = [line for line in listed.stderr.splitlines() if "did not load" in line]
    assert len(said) == 5 and f"kforge: family lib_nodevice did not load: {NODEVICE}" in said

    built = doit(root, "-n", "2", env=env, check=False)
    assert built.returncode != 0
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}
    assert statuses(root, "failed") == {"lib_nodevice", "lib_hangs", "malformed", "dup", "dup_broken"}
    replayed = (f"{NODEVICE} (replayed: it failed so from these inputs before; `doit forget lib_nodevice` loads it "
                f"again)")
    assert f"kforge: lib_nodevice failed with: {replayed}\n" in built.stdout   # `list` imported it: what it read holds
    assert "Traceback" not in built.stdout + built.stderr
    info = doit(root, "info", "lib_nodevice", env=env).stdout
    assert info == f"lib_nodevice\n  state: did not load: {replayed}\n"
    pruned = doit(root, "prune", env=env, check=False)   # its artifacts cannot be told from orphans
    assert pruned.returncode != 0 and "nothing pruned: families did not load" in pruned.stdout

    doit(root, "scale", env=env)   # a run of the families that load: they are up to date
    assert statuses(root, "up-to-date") == {"scale:fp16-b256-w4@sm_90a"}


def test_a_broken_family_is_not_kept_in_the_saved_catalog_so_a_fix_elsewhere_is_found(tmp_path):
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    root = make_project(tmp_path / "p", specs={"scale": spec_text(),
                                               "lib_nodevice": library_spec("lib_nodevice", "nodevice")})
    env = {"PYTHONPATH": str(site)}
    assert doit(root, "list", env=env).returncode == 0
    (site / "kforge_tunelib" / "ops" / "nodevice.py").write_text(   # the dependency installed, say
        textwrap.dedent(BROKEN_MODULES["nodevice"]).replace('raise RuntimeError("No device were detected")', ""))
    assert "did not load" not in doit(root, "list", env=env).stderr


def test_a_broken_family_keeps_the_others_saved_and_is_itself_loaded_again_each_time(project, monkeypatch):
    """The families that load are saved and taken next time, unprobed; the one that did not is computed again at
    every load (what fixes it may lie outside any file: an installed package), and a fix to its spec loads it."""
    from kforge.declare import spec as spec_module
    computed = []
    real = spec_module.spec_from_tables
    monkeypatch.setattr(spec_module, "spec_from_tables", lambda raw, *a, **k: computed.append(
        raw["kernel"]["name"]) or real(raw, *a, **k))
    good = project / "specs" / "good.toml"
    good.write_text(spec_text(name="good", blocks=(64,)))
    bad = project / "specs" / "bad.toml"
    bad.write_text(spec_text(name="bad").replace('toolchain = "triton"', 'toolchain = "cuda"'))
    first = catalog_module.Catalog(project, None, 50_000).load(keep_going=True)
    assert [b.name for b in first.broken] == ["bad"] and sorted(computed) == ["bad", "good", "scale"]
    computed.clear()
    again = catalog_module.Catalog(project, None, 50_000).load(keep_going=True)
    assert computed == ["bad"], computed   # the others are taken from the saved catalog
    assert [b.error for b in again.broken] == [b.error for b in first.broken]
    assert sorted(t.name for t in again.targets) == sorted(t.name for t in first.targets)
    later(bad, spec_text(name="bad"))
    computed.clear()
    fixed = catalog_module.Catalog(project, None, 50_000).load(keep_going=True)
    assert computed == ["bad"] and not fixed.broken and "bad:fp16-b256-w4@sm_90a" in {t.name for t in fixed.targets}
    assert catalog_module.Catalog(project, None, 50_000).load(keep_going=True).loaded_from == "saved"
    later(bad, spec_text(name="bad").replace('toolchain = "triton"', 'toolchain = "cuda"'))   # broken again:
    assert [b.name for b in catalog_module.Catalog(project, None, 50_000).load(keep_going=True).broken] == ["bad"]


def probes_started(monkeypatch) -> list:
    """The probe children the loads start from now on, as (family) names asked."""
    from kforge.load.entry_probe import Probe
    started, real = [], Probe._send
    monkeypatch.setattr(Probe, "_send", lambda self, request, where: started.append(request.get("family"))
                        or real(self, request, where))
    return started


def test_a_family_its_probe_failed_is_replayed_unprobed_while_what_it_read_holds(tmp_path, monkeypatch):
    """A family whose module's import fails was imported again at every load (mamba-ssm's broken family: a no-op
    of 0.5 s took 5-10 s); its failure is replayed while the files and variables the import read, the toolchain's
    versions, the module path and the archs hold, and `doit forget` (forget_unloaded) loads it again."""
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"scale": spec_text(),
                                               "lib_nodevice": library_spec("lib_nodevice", "nodevice")})
    started = probes_started(monkeypatch)

    def broken(archs=None) -> str:
        found = catalog_module.Catalog(root, archs, 50_000).load(keep_going=True)
        assert [b.name for b in found.broken] == ["lib_nodevice"]
        return found.broken[0].error

    assert broken() == NODEVICE and started == ["lib_nodevice"]
    replayed = (f"{NODEVICE} (replayed: it failed so from these inputs before; `doit forget lib_nodevice` loads it "
                f"again)")
    started.clear()
    assert broken() == replayed and started == []
    assert broken(("sm_90a",)) == replayed and started == []   # the archs the catalog holds: the same
    monkeypatch.syspath_prepend(str(tmp_path))   # a folder added to the module path may hold what was missing
    assert broken() == NODEVICE and started == ["lib_nodevice"]
    assert broken() == replayed
    module = site / "kforge_tunelib" / "ops" / "nodevice.py"
    later(module, module.read_text().replace("No device were detected", "No GPU"))   # a file the import read
    started.clear()
    assert broken() == NODEVICE.replace("No device were detected", "No GPU") and started == ["lib_nodevice"]
    started.clear()
    assert broken().endswith("(replayed: it failed so from these inputs before; `doit forget lib_nodevice` loads "
                             "it again)") and started == []
    catalog_module.forget_unloaded(root, {"scale"})   # another family's name: kept
    assert broken().endswith("loads it again)") and started == []
    catalog_module.forget_unloaded(root, {"lib_nodevice"})
    assert "(replayed" not in broken() and started == ["lib_nodevice"]


UNSTEADY_MODULES = {   # failures that may not follow from what the import read: never replayed
    "crashes": "import os\nos._exit(3)\n",
    "oserror": "open('/nonexistent-kforge-test/libfoo.so')\n",
    "memory": "raise MemoryError()\n",
    "hangs": "import time\ntime.sleep(3600)\n",
    "native": "from kforge_tunelib import native_ext\n",   # an extension whose own libraries do not load
}


HEURISTIC_MODULE = """
import triton
import triton.language as tl


@triton.heuristics({"BLOCK": lambda args: REASON})
@triton.jit
def lib_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass
"""


@pytest.mark.parametrize("module", sorted(UNSTEADY_MODULES) + ["heuristic"])
def test_a_probe_failure_that_may_not_follow_from_what_it_read_is_never_replayed(tmp_path, monkeypatch, module):
    """A heuristic or pruner that failed on the OS was replayed too (a critical read): only module imports were."""
    source = textwrap.dedent(BROKEN_MODULES["nodevice"]).replace('raise RuntimeError("No device were detected")\n',
                                                                 UNSTEADY_MODULES.get(module, ""))
    if module == "heuristic":
        source = HEURISTIC_MODULE.replace("REASON", "len(open('/nonexistent-kforge-test/table').read())")
    site = tune_library.install(tmp_path / "site", {module: source})
    import sysconfig
    (site / "kforge_tunelib" / f"native_ext{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"not ELF")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("KFORGE_CATALOG_TIMEOUT", "2")
    root = make_project(tmp_path / "p", specs={"lib": library_spec("lib", module) + "num_warps = [4]\n"})
    started = probes_started(monkeypatch)
    asked = []   # the questions each load asked (a heuristic's family: its import, then its heuristics)
    for _ in range(2):
        found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
        assert [b.name for b in found.broken] == ["lib"] and "(replayed" not in found.broken[0].error
        asked.append(len(started) - sum(asked))
    assert asked[0] == asked[1] > 0 and set(started) == {"lib"}
    if module == "heuristic":
        assert "heuristic BLOCK of kforge_tunelib.ops.heuristic.lib_kernel failed" in found.broken[0].error


def test_a_heuristics_failure_on_what_it_read_is_replayed_and_one_of_kforges_own_reading_never_is(tmp_path,
                                                                                                   monkeypatch):
    """What the probe's answer failed is replayed; an error kforge's own reading of the sources raised after the
    probe answered (a module the kernel's source imports that is not Python) names a file the probe never read:
    it was replayed after that file was fixed (a critical read)."""
    site = tune_library.install(tmp_path / "site", {
        "heur": HEURISTIC_MODULE.replace("REASON", "int('x')"),
        "badimport": BROKEN_MODULES["nodevice"].replace('raise RuntimeError("No device were detected")',
                                                         "def _unused():\n"
                                                         "            from kforge_tunelib import helper")})
    (site / "kforge_tunelib" / "helper.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"heur": library_spec("heur", "heur") + "num_warps = [4]\n",
                                               "badimport": library_spec("badimport", "badimport")}, kernels={})
    started = probes_started(monkeypatch)

    def errors() -> dict:
        return {b.name: b.error for b in catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken}
    first = errors()
    assert "heuristic BLOCK of kforge_tunelib.ops.heur.lib_kernel failed" in first["heur"]
    assert "kforge_tunelib/helper.py:1, a module its source imports, is not Python" in first["badimport"]
    started.clear()
    again = errors()
    assert again["heur"].endswith("`doit forget heur` loads it again)") and "(replayed" not in again["badimport"]
    assert started == ["badimport"]
    (site / "kforge_tunelib" / "helper.py").write_text("def fixed():\n    pass\n")
    assert "badimport" not in errors()


def test_a_name_a_python_module_lacks_is_replayed_until_that_module_changes(tmp_path, monkeypatch):
    """`cannot import name` (a library built for another Triton, say) carries the module's path and was taken for a
    native extension that did not load: imported again at every load (a critical read). The module's source is one
    of what the probe read."""
    site = tune_library.install(tmp_path / "site", {"lacking": BROKEN_MODULES["nodevice"].replace(
        'raise RuntimeError("No device were detected")', "from kforge_tunelib.ops.gemm import no_such_name")})
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"lib": library_spec("lib", "lacking")}, kernels={})
    started = probes_started(monkeypatch)
    errors = [catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken[0].error for _ in range(2)]
    assert "cannot import name 'no_such_name'" in errors[0] and "(replayed" in errors[1] and started == ["lib"]
    gemm = site / "kforge_tunelib" / "ops" / "gemm.py"
    later(gemm, gemm.read_text() + "\nno_such_name = 1\n")
    assert catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken == []


def test_a_dist_info_installed_on_the_module_path_loads_a_replayed_family_again(tmp_path, monkeypatch):
    """importlib.metadata.version() of a package not installed fails the same way until one is, in a folder of
    the module path whose listing the probe's reads do not hold (a critical read)."""
    site = tune_library.install(tmp_path / "site", {"versioned": BROKEN_MODULES["nodevice"].replace(
        'raise RuntimeError("No device were detected")', 'import importlib.metadata\n'
        '        importlib.metadata.version("kforge-test-dependency")')})
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"lib": library_spec("lib", "versioned")}, kernels={})
    started = probes_started(monkeypatch)
    for _ in range(2):
        catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert started == ["lib"]   # the second load replayed it
    info = site / "kforge_test_dependency-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kforge-test-dependency\nVersion: 1.0\n")
    found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert started == ["lib", "lib"] and found.broken == [], found.broken


def test_a_replayed_family_renamed_apart_is_forgotten_and_named_by_its_tasks_name(tmp_path, monkeypatch):
    """A broken family whose name a loading family has is listed as NAME_broken; the replayed line told to `doit
    forget NAME`, the other family's task, and forgetting NAME_broken kept the replay (a critical read)."""
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"a_good": spec_text(name="lib"),
                                               "z_bad": library_spec("lib", "nodevice")})
    started = probes_started(monkeypatch)

    def broken():
        return catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken
    assert [b.name for b in broken()] == ["lib_broken"]
    again = broken()
    assert again[0].error.endswith("`doit forget lib_broken` loads it again)") and started == ["lib"]
    catalog_module.forget_unloaded(root, {"lib"})   # the other family's task: kept
    assert "(replayed" in broken()[0].error
    catalog_module.forget_unloaded(root, {"lib_broken"})
    assert "(replayed" not in broken()[0].error and started == ["lib", "lib"]


def test_a_replay_lasts_replay_seconds_so_a_fix_the_probe_cannot_watch_is_seen_then(tmp_path, monkeypatch):
    """What a module's import may hang on is not all watched (a library a .pth or an import finder elsewhere maps,
    a tool it runs, a file it tests for: a critical read found five): a failure is replayed REPLAY_SECONDS at
    most, then the module is imported again; `doit forget` does it at once."""
    import time as clock
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    monkeypatch.syspath_prepend(str(site))
    root = make_project(tmp_path / "p", specs={"lib": library_spec("lib", "nodevice")}, kernels={})
    started = probes_started(monkeypatch)
    for _ in range(2):
        catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert started == ["lib"]
    now = clock.time()
    monkeypatch.setattr(catalog_module.time, "time", lambda: now + catalog_module.REPLAY_SECONDS)
    assert "(replayed" not in catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken[0].error
    assert started == ["lib", "lib"]


def test_two_broken_families_of_one_name_each_keep_their_own_replay_and_task(tmp_path, monkeypatch):
    """Replays were kept by the family's name: of two broken files naming one kernel, one was imported at every
    load and both lines said replayed, naming a task neither had (a critical read)."""
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    monkeypatch.syspath_prepend(str(site))
    other = library_spec("lib", "nodevice").replace("[kernel]\n", '[kernel]\ndescription = "b"\n')
    root = make_project(tmp_path / "p", specs={"a": library_spec("lib", "nodevice"), "b": other, "c": "[kernel\n"},
                        kernels={})
    (root / "specs" / "c.toml").rename(root / "specs" / "lib.toml")   # a malformed spec listed by its file: lib
    started = probes_started(monkeypatch)

    def broken() -> dict:
        return {b.name: b.error for b in catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken}
    first = broken()
    broken()   # the second of one name asked the probe under a name the first had asked with: saved this time
    asked = len(started)
    again = broken()
    assert len(started) == asked and sorted(again) == sorted(first)
    replayed = {name for name, error in again.items() if "(replayed" in error}
    assert len(replayed) == 2 and all(again[n].endswith(f"`doit forget {n}` loads it again)") for n in replayed)
    assert "not valid TOML" in next(e for n, e in again.items() if n not in replayed)
    gone = sorted(replayed)[0]
    catalog_module.forget_unloaded(root, {gone})
    assert {n for n, e in broken().items() if "(replayed" in e} == replayed - {gone}


def test_a_module_path_folder_inside_the_project_is_watched_for_a_dist_info(tmp_path, monkeypatch):
    """A virtualenv inside the project (uv's default) or `pip install --target ./deps`: a dist-info installed there
    was not seen, every folder under the project being left out (a critical read)."""
    root = make_project(tmp_path / "p", specs={"lib": library_spec("lib", "versioned")}, kernels={})
    site = tune_library.install(root / ".venv-site", {"versioned": BROKEN_MODULES["nodevice"].replace(
        'raise RuntimeError("No device were detected")', 'import importlib.metadata\n'
        '        importlib.metadata.version("kforge-test-dependency")')})
    monkeypatch.syspath_prepend(str(site))
    started = probes_started(monkeypatch)
    for _ in range(2):
        catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert started == ["lib"]
    info = site / "kforge_test_dependency-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kforge-test-dependency\nVersion: 1.0\n")
    assert catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken == []


def test_a_replayed_failure_names_the_line_its_python_catalog_declares_it_on_now(tmp_path, monkeypatch):
    site = tune_library.install(tmp_path / "site", BROKEN_MODULES)
    monkeypatch.syspath_prepend(str(site))
    call = ('from kforge.declare import family\n'
            'family(name="lib", module="kforge_tunelib.ops.nodevice", entry="lib_kernel", toolchain="triton", '
            'archs=["sm_90a"], signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, '
            'sweep={})\n')
    root = make_project(tmp_path / "p", specs={}, kernels={})
    catalog_file = root / "specs" / "lib.py"
    catalog_file.write_text(call)
    error = catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken[0].error
    assert error.startswith("specs/lib.py:2: family 'lib': reading kforge_tunelib.ops.nodevice.lib_kernel's")
    later(catalog_file, "# a line above it\n" + call)
    started = probes_started(monkeypatch)
    error = catalog_module.Catalog(root, None, 50_000).load(keep_going=True).broken[0].error
    assert error.startswith("specs/lib.py:3: family 'lib': reading kforge_tunelib.ops.nodevice.lib_kernel's")
    assert started == []
    assert "(replayed" in error


def test_the_archs_asked_for_hold_when_a_broken_family_joins_a_catalog_saved_for_every_arch(project):
    """`doit list` saves the catalog of every arch; a family that breaks after it must not make a build for one arch
    take the saved families' every arch (it did: archs=sm_90a built gfx942 too, found by an outside review)."""
    (project / "specs" / "scale.toml").write_text(spec_text(archs=("sm_90a", "gfx942")))
    every = catalog_module.Catalog(project, None, 50_000).load(keep_going=True)
    assert {t.arch for t in every.targets} == {"sm_90a", "gfx942"} and not every.broken
    (project / "specs" / "bad.toml").write_text(spec_text(name="bad").replace('toolchain = "triton"', 'toolchain = "cuda"'))
    for archs in (("sm_90a",), ("gfx942",)):
        one = catalog_module.Catalog(project, archs, 50_000).load(keep_going=True)
        assert [b.name for b in one.broken] == ["bad"]
        assert {t.arch for t in one.targets} == set(archs), (archs, sorted(t.name for t in one.targets))


@pytest.mark.parametrize("value", ["{4}", "object()", 'b"4"'])
def test_a_python_catalog_family_given_what_json_cannot_hold_is_broken_and_the_rest_saved(tmp_path, value):
    """A family() given a set, an object or bytes is a broken family (the spec's checks name it); its declaration
    is never kept as JSON: `object()` was a TypeError digesting it, and a set or bytes one writing the catalog
    once a catalog with a broken family is saved."""
    root = make_project(tmp_path / "p")   # specs/scale.toml, and a catalog file of two families
    (root / "specs" / "lib.py").write_text(textwrap.dedent(f'''
        from kforge.declare import family
        for name, value in (("good", [4]), ("bad", {value})):
            family(name=name, source="tk/scale.py", entry="scale_kernel", toolchain="triton", archs=["sm_90a"],
                   signature={{"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"}},
                   sweep={{"BLOCK": [128], "num_warps": value}})
        '''))
    for _ in range(2):
        found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
        assert [b.name for b in found.broken] == ["bad"] and "[sweep] num_warps: expected" in found.broken[0].error
        assert {t.kernel for t in found.targets} == {"scale", "good"}
        assert (root / "out" / ".kforge" / "catalog.json").is_file()


@pytest.mark.parametrize("where,said", [("description=10**5000", "[kernel] description: got an integer of 16610 bits"),
                                        ('sweep={"BLOCK": [10**5000]}', "[sweep] BLOCK: got an integer of 16610 bits")])
def test_a_python_catalog_family_given_an_integer_of_thousands_of_digits_is_one_broken_family(tmp_path, where, said):
    """Digesting 10**5000 (its declaration's key) raised Python's int-to-string limit out of the whole load, every
    family lost and neither the file nor the key named (a hostile-input review)."""
    root = make_project(tmp_path / "p")
    extra = "" if where.startswith("sweep") else ', sweep={"BLOCK": [128]}'
    (root / "specs" / "lib.py").write_text(
        'from kforge.declare import family\n'
        'family(name="huge", source="tk/scale.py", entry="scale_kernel", toolchain="triton", archs=["sm_90a"], '
        f'signature={{"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"}}, {where}{extra})\n')
    found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert [b.name for b in found.broken] == ["huge"] and found.broken[0].error.startswith(
        f"specs/lib.py:2: family 'huge': {said}"), found.broken
    assert {t.kernel for t in found.targets} == {"scale"}


@pytest.mark.parametrize("value", ["1979-05-27", "07:32:00", "1979-05-27T07:32:00Z"])
def test_a_toml_date_or_time_in_a_spec_is_one_broken_family_not_a_traceback(tmp_path, value):
    """TOML has dates and times, which no kernel argument takes: digesting the spec's tables for the saved catalog
    was a TypeError ('datetime.date' object is not iterable) out of the whole load."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), "dated": spec_text(name="dated").replace(
        "BLOCK = [256]", f"BLOCK = [{value}]")})
    for _ in range(2):
        found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
        assert [b.name for b in found.broken] == ["dated"] and {t.kernel for t in found.targets} == {"scale"}
        assert found.broken[0].error.startswith("specs/dated.toml: [sweep] BLOCK: expected non-empty list of values")


def test_the_catalog_stamp_covers_every_module_of_kforge():
    """The saved catalog is stale once any of kforge's own code changes: every module of every station and of
    the runtime is under the folders the stamp reads."""
    covered = {p.resolve() for folder in catalog_module.KFORGE_CODE for p in folder.rglob("*.py")}
    modules = {p.resolve() for p in (REPO / "rules").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= covered, sorted(str(p) for p in modules - covered)[:5]


# Per-family reuse: a family is taken from the saved catalog, unprobed, while its declaration and every file it
# was computed from (its sources, and all its module's probe process read) keep their content. A library that
# hides what a family depends on in several ways: each edit must recompute exactly the families that can depend
# on it, and the catalog must always be the one a load from nothing gives.

SCALE_KERNEL = textwrap.dedent('''
    @triton.jit
    def {name}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
''')
AUTOTUNED = "@triton.autotune(configs=[triton.Config({{'BLOCK': b}}, num_warps=4) for b in {blocks}], key=['n'])"
HEAD = "import triton\nimport triton.language as tl\n"

MFL = {   # the families: fa, fb, fc, fe probed (autotuned); fd read from its source only
    "mfl/__init__.py": "",
    "mfl/ops/__init__.py": "",
    # a helper module imported by the kernel module
    "mfl/ops/helper.py": "BLOCKS = [128, 256]\n",
    "mfl/ops/a.py": HEAD + "from mfl.ops.helper import BLOCKS\n" + AUTOTUNED.format(blocks="BLOCKS")
    + SCALE_KERNEL.format(name="a_kernel"),
    # a config file read at import
    "mfl/ops/b.json": "[64]\n",
    "mfl/ops/b.py": HEAD + "import json, os\nBLOCKS = json.load(open(os.path.join(os.path.dirname(__file__), "
    "'b.json')))\n" + AUTOTUNED.format(blocks="BLOCKS") + SCALE_KERNEL.format(name="b_kernel"),
    # a conditional import of a module that is not there (yet)
    "mfl/ops/c.py": HEAD + "try:\n    from mfl.ops.c_fast import BLOCKS\nexcept ImportError:\n    BLOCKS = [32]\n"
    + AUTOTUNED.format(blocks="BLOCKS") + SCALE_KERNEL.format(name="c_kernel"),
    # a plain kernel whose module imports a utility (no probe: its source closure)
    "mfl/ops/d_util.py": "SCALE = 2\n",
    "mfl/ops/d.py": HEAD + "from mfl.ops.d_util import SCALE  # noqa: F401\n" + SCALE_KERNEL.format(name="d_kernel"),
    # a module chosen by a setting read at import, imported by a computed name (no source can show which)
    "mfl/ops/e_mode.txt": "narrow\n",
    "mfl/ops/e_narrow.py": "BLOCKS = [16]\n",
    "mfl/ops/e_wide.py": "BLOCKS = [512]\n",
    "mfl/ops/e.py": HEAD + "import importlib, os\n"
    "MODE = open(os.path.join(os.path.dirname(__file__), 'e_mode.txt')).read().strip()\n"
    "BLOCKS = importlib.import_module('mfl.ops.e_' + MODE).BLOCKS\n"
    + AUTOTUNED.format(blocks="BLOCKS") + SCALE_KERNEL.format(name="e_kernel"),
}


def mfl_spec(name: str, module: str, entry: str, probed: bool) -> str:
    sweep = "" if probed else "BLOCK = [128]\nnum_warps = [4]\n"
    return textwrap.dedent(f'''
        [kernel]
        name = "{name}"
        module = "{module}"
        entry = "{entry}"
        toolchain = "triton"
        archs = ["sm_90a"]

        [signature]
        x_ptr = "*fp16"
        y_ptr = "*fp16"
        n = "i32"
        BLOCK = "constexpr"

        [sweep]
        ''') + sweep


@pytest.fixture
def mfl_project(tmp_path, monkeypatch):
    site = write_files(tmp_path / "site", MFL)
    monkeypatch.syspath_prepend(str(site))
    specs = {f"f{x}": mfl_spec(f"f{x}", f"mfl.ops.{x}", f"{x}_kernel", x != "d") for x in "abcde"}
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    return root, site


def computed_families(root, monkeypatch) -> tuple[set[str], dict]:
    """(the families the load computed rather than took from the saved catalog, {target: (key, config)})."""
    from kforge.declare import spec as spec_module
    names: list[str] = []
    real = spec_module.spec_from_tables
    monkeypatch.setattr(spec_module, "spec_from_tables", lambda raw, *a, **k: names.append(raw["kernel"]["name"])
                        or real(raw, *a, **k))
    try:
        found = loaded(root)
    finally:
        monkeypatch.setattr(spec_module, "spec_from_tables", real)
    return set(names), {t.name: (t.key, t.config) for t in found.targets}


def blocks(targets: dict, family: str) -> set[int]:
    return {dict(config)["BLOCK"] for name, (_, config) in targets.items() if name.startswith(family + ":")}


def from_nothing(root) -> dict:
    """The targets a load with no saved or kept catalog gives (and leaves saved)."""
    import shutil
    (root / "out" / ".kforge" / "catalog.json").unlink()
    shutil.rmtree(root / "out" / ".kforge" / "catalogs")
    return {t.name: (t.key, t.config) for t in loaded(root).targets}


def test_an_edit_recomputes_exactly_the_families_that_can_depend_on_it(mfl_project, monkeypatch):
    root, site = mfl_project
    ops = site / "mfl" / "ops"
    names, first = computed_families(root, monkeypatch)
    assert names == {"fa", "fb", "fc", "fd", "fe"} and len(first) == 6
    assert blocks(first, "fc") == {32} and blocks(first, "fe") == {16}
    edits = [   # (what is written, the families that can depend on it, the family's BLOCKs after)
        ("helper.py", "BLOCKS = [128, 1024]\n", {"fa"}, {128, 1024}),
        ("b.json", "[64, 2048]\n", {"fb"}, {64, 2048}),
        ("c_fast.py", "BLOCKS = [4096]\n", {"fc"}, {4096}),   # created: the import finds it now
        ("d_util.py", "SCALE = 3\n", {"fd"}, {128}),
        ("e_wide.py", "BLOCKS = [256]\n", set(), None),   # not what e.py imports now
        ("e_mode.txt", "wide\n", {"fe"}, {256}),
        ("e_narrow.py", "BLOCKS = [8]\n", set(), None),    # no longer imported
        ("__init__.py", "# the package's own\n", {"fa", "fb", "fc", "fd", "fe"}, None),
    ]
    for name, text, expected, after in edits:
        later(ops / name, text)
        names, targets = computed_families(root, monkeypatch)
        assert names == expected, name
        assert targets == from_nothing(root), name   # never a stale catalog
        assert after is None or blocks(targets, next(iter(expected))) == after, name
    # the same bytes again (a checkout touching every file): nothing is computed
    for path in ops.iterdir():
        if path.is_file():
            later(path, path.read_text())
    names, targets = computed_families(root, monkeypatch)
    assert names == set() and targets == from_nothing(root)


def test_list_info_and_prune_take_the_saved_catalog_whatever_archs_they_are_given(tmp_path):
    """`doit list`, `info` and `prune` load the catalog as a build does: once a load has held every arch, none of
    them loads a spec again (the saved catalog is not even rewritten), whatever archs= they are given; a build for
    one arch before them leaves a catalog the first `doit list` loads once, for every arch."""
    from kforge.base import stamps
    from tests.support import doit
    root = make_project(tmp_path / "p", specs={"scale": spec_text(archs=("sm_90a", "gfx942"))})
    assert loaded(root, ("sm_90a",)).loaded_from == "specs"   # a build's load, saved for sm_90a only
    saved = root / "out" / ".kforge" / "catalog.json"
    doit(root, "list")   # every arch: the specs once more, now saved for every arch
    assert json.loads(saved.read_bytes())["archs"] is None
    held = stamps.identity(str(saved))
    for args in (("list",), ("list", "--all", "archs=gfx942"), ("info", "scale"), ("info", "scale", "archs=sm_90a"),
                 ("prune",), ("prune", "archs=gfx942,sm_90a")):
        doit(root, *args)
        assert stamps.identity(str(saved)) == held, args
    for archs in (None, ("gfx942",), ("sm_90a",), ("gfx942", "sm_90a")):
        found = catalog_module.Catalog(root, archs, 50_000).load()
        assert found.loaded_from == "saved" and {t.arch for t in found.targets} == set(archs or ("sm_90a", "gfx942"))
    # an edit, loaded for one arch: the family is computed again for every arch the saved catalog held
    later(root / "tk" / "scale.py", kernel_text(factor="5"))
    assert loaded(root, ("gfx942",)).loaded_from == "specs"
    assert json.loads(saved.read_bytes())["archs"] is None
    assert catalog_module.Catalog(root, None, 50_000).load().loaded_from == "saved"


def test_a_recorded_target_another_family_built_comes_back_when_that_family_changes(tmp_path, monkeypatch):
    """A recorded line another family already builds is dropped from the catalog; its record family depends on
    that other family, so it is never taken from the saved catalog with that target missing."""
    record = {"format": "kforge-record-1", "kernel": "tk.scale:scale_kernel", "arch": "sm_90a",
              "signature": [["x_ptr", "*fp16"], ["y_ptr", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"]],
              "divisible_by_16": ["x_ptr", "y_ptr"], "options": {"num_warps": 4, "num_stages": 3}}
    lines = "".join(json.dumps({**record, "constexprs": {"BLOCK": b}}) + "\n" for b in (128, 256))
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128,))})
    (root / "specs" / "app.jsonl").write_text(lines)
    monkeypatch.syspath_prepend(str(root))
    recorded = lambda found: sorted(dict(t.constexprs)["BLOCK"] for t in found.targets if t.kernel.startswith("rec_"))
    assert recorded(loaded(root)) == [256]   # 128: the spec builds it
    later(root / "specs" / "scale.toml", spec_text(blocks=(512,)))
    assert recorded(loaded(root)) == [128, 256]


def test_a_project_and_its_environment_copied_elsewhere_take_the_catalog_by_content(tmp_path, monkeypatch):
    """A project restored at another path with its out/ (a CI cache in another checkout) computes no family, and
    the library's environment copied to another path too (a second virtualenv) computes only the family whose
    file was edited there; each time the catalog is the one a load from nothing gives, every field (its paths
    where the copies lie)."""
    import shutil
    import sys
    site = write_files(tmp_path / "env_a" / "site", MFL)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env_a"))
    specs = {f"f{x}": mfl_spec(f"f{x}", f"mfl.ops.{x}", f"{x}_kernel", x != "d") for x in "bd"}
    first = make_project(tmp_path / "a", specs=specs, kernels={})
    assert computed_families(first, monkeypatch)[0] == {"fb", "fd"}

    def from_nothing_whole(root) -> dict:
        for saved in (root / "out" / ".kforge").glob("catalog*"):
            shutil.rmtree(saved) if saved.is_dir() else saved.unlink()
        return {t.name: t for t in loaded(root).targets}

    moved = tmp_path / "b"
    shutil.copytree(first, moved, symlinks=True)
    assert computed_families(moved, monkeypatch)[0] == set()
    taken = {t.name: t for t in loaded(moved).targets}
    assert taken == from_nothing_whole(moved) and {t.layout.root for t in taken.values()} == {moved}
    shutil.copytree(tmp_path / "env_a", tmp_path / "env_b", symlinks=True)
    monkeypatch.syspath_prepend(str(tmp_path / "env_b" / "site"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env_b"))
    later(tmp_path / "env_b" / "site" / "mfl" / "ops" / "b.json", "[64, 2048]\n")
    assert computed_families(moved, monkeypatch)[0] == {"fb"}
    taken = {t.name: t for t in loaded(moved).targets}
    assert taken == from_nothing_whole(moved) and len(taken) == 3
    assert all(t.source.startswith(str(tmp_path / "env_b")) for t in taken.values())


def test_a_source_is_the_projects_own_inside_its_folder_by_real_path(tmp_path):
    """in_project decides whether a kernel module is an installed distribution's (fingerprinted in the catalog,
    torch imported first at compile): a sibling folder sharing the name's start is not the project, a link into
    the project is."""
    from kforge.plan.catalog import in_project
    (tmp_path / "proj" / "tk").mkdir(parents=True)
    (tmp_path / "proj2").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "proj")
    assert in_project(str(tmp_path / "proj" / "tk" / "scale.py"), tmp_path / "proj")
    assert in_project(str(tmp_path / "link" / "tk" / "scale.py"), str(tmp_path / "proj"))
    assert not in_project(str(tmp_path / "proj2" / "scale.py"), tmp_path / "proj")
    assert not in_project(str(tmp_path / "proj"), tmp_path / "proj")


# Hostile input at load: each one line naming the file and the key, never a traceback.

def test_a_spec_nested_too_deeply_is_one_broken_family_and_the_others_load(tmp_path):
    """`q = [[[...]]]` 600 deep: the spec's own message, then the broken family's name read again from the file
    raised RecursionError, a 3,000-line traceback, and no family loaded."""
    deep = spec_text(name="deep") + "\n[extra]\nq = " + "[" * 600 + "]" * 600 + "\n"
    root = make_project(tmp_path / "p", specs={"scale": spec_text(), "deep": deep})
    catalog = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert {t.kernel for t in catalog.targets} == {"scale"}
    (broken,) = catalog.broken
    assert broken.name == "deep" and "\n" not in broken.error
    assert broken.error.startswith("specs/deep.toml: not valid TOML: arrays or tables nested too deeply")


def test_a_broken_familys_name_is_read_from_no_file_past_a_specs_size(tmp_path, monkeypatch):
    """Its name is read again from a spec that did not load: a file too large for a spec is not read whole."""
    from kforge.declare import spec
    root = make_project(tmp_path / "p", specs={"big": spec_text(name="scale") + "# padding\n" * 100})
    monkeypatch.setattr(spec, "SPEC_LIMIT", 200)
    assert catalog_module._family_name(root / "specs" / "big.toml") == "big"
    monkeypatch.setattr(spec, "SPEC_LIMIT", 16 << 20)
    assert catalog_module._family_name(root / "specs" / "big.toml") == "scale"


def test_a_broken_familys_name_of_thousands_of_characters_is_its_files(tmp_path):
    """A name of 100,000 characters is no family's (at most 100): the broken task is named after the file."""
    root = make_project(tmp_path / "p", specs={"long": spec_text(name="x" * 100_000)})
    found = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert [b.name for b in found.broken] == ["long"] and len(found.broken[0].error) < 600


def with_catalog(root, line):
    with open(root / "pyproject.toml", "a") as f:
        f.write(f"\n[tool.kforge]\n{line}\n")
    return root


@pytest.mark.parametrize("entries, message", [
    ('["spe\\u0000cs"]', "pyproject.toml: [tool.kforge] catalog: 'spe\\x00cs' holds a NUL character; name a folder"),
    ('["."]', "pyproject.toml: [tool.kforge] catalog: '.' is the project's own folder, whose dodo.py and "
              "pyproject.toml are no specs; keep the specs in a folder of their own (e.g. specs/) and name that"),
    ('["./"]', "pyproject.toml: [tool.kforge] catalog: './' is the project's own folder"),
    (f'["{"a" * 5000}"]', "pyproject.toml: [tool.kforge] catalog: 'aaaa"),
    (f'["{"a/" * 1000}"]', "pyproject.toml: [tool.kforge] catalog: 'a/a/a/"),   # no file system limit: not found
    (f'"{"a" * 100_000}"', "pyproject.toml: [tool.kforge] catalog: expected a non-empty list of folders"),
    (f'["specs", {list(range(20_000))}]', "pyproject.toml: [tool.kforge] catalog: expected a non-empty list"),
])
def test_a_catalog_folder_that_cannot_be_one_is_one_line_naming_the_key(tmp_path, entries, message):
    """A NUL was `kforge: embedded null byte`; the project's root loaded dodo.py and pyproject.toml as catalogs;
    a name too long for the file system was an OSError."""
    root = with_catalog(make_project(tmp_path / "p"), f"catalog = {entries}")
    with pytest.raises(SpecError) as e:
        catalog_module.catalog_folders(root)
    assert str(e.value).startswith(message) and "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize("entries, twice", [('["specs", "./specs"]', "'./specs' is the folder 'specs'"),
                                            ('["specs", "lib", "specs/"]', "'specs/' is the folder 'specs'"),
                                            ('["lib", "specs", "lib"]', "'lib' is the folder 'lib'")])
def test_a_catalog_folder_named_twice_is_one_line_naming_both(tmp_path, entries, twice):
    """`catalog = ["specs", "./specs"]`: each spec clashed with itself ("kernel name 'scale' is already used"),
    then the folder was read once, a typo for another folder hidden; now one line names both entries."""
    root = with_catalog(make_project(tmp_path / "p"), f'catalog = {entries}')
    (root / "lib").mkdir()
    with pytest.raises(SpecError) as e:
        catalog_module.catalog_folders(root)
    assert str(e.value) == f"pyproject.toml: [tool.kforge] catalog: {twice} names too; name each folder once"
    root = with_catalog(make_project(tmp_path / "q"), 'catalog = ["specs", "lib"]')
    (root / "lib").mkdir()
    assert catalog_module.catalog_folders(root) == [(root / "specs").resolve(), (root / "lib").resolve()]


@pytest.mark.parametrize("archs, said", [
    ('["gfx942", "sm_90a", "gfx942"]', "record_archs: got 'gfx942'; allowed: each arch once (this one is listed "
                                       "twice)"),
    ('[["gfx942"]]', "record_archs: expected a list of archs"),   # was a TypeError (unhashable: list)
    ('[{a = 1}]', "record_archs: expected a list of archs"),
])
def test_record_archs_given_twice_or_not_as_names_are_one_line(tmp_path, archs, said):
    root = with_catalog(make_project(tmp_path / "p"), f"record_archs = {archs}")
    with pytest.raises(SpecError) as e:
        catalog_module.record_archs(root)
    assert str(e.value).startswith(f"pyproject.toml: [tool.kforge] {said}") and "\n" not in str(e.value)


def test_a_specs_folder_linked_inside_the_project_loads_and_one_linked_outside_is_refused_naming_the_link(tmp_path):
    """specs/ as a link to a folder elsewhere was 'neither a folder of the project nor an installed package';
    a link that stays inside the project is followed, one that leads out is refused in one line saying so."""
    import shutil
    from tests.support import doit
    root = make_project(tmp_path / "p")
    (root / "inner").mkdir()
    (root / "specs").rename(root / "inner" / "specs")
    (root / "specs").symlink_to("inner/specs")
    assert catalog_module.catalog_folders(root) == [(root / "inner" / "specs").resolve()]
    (root / "specs").unlink()
    shutil.move(root / "inner" / "specs", tmp_path / "real")
    (root / "specs").symlink_to(tmp_path / "real")
    with pytest.raises(SpecError) as e:
        catalog_module.catalog_folders(root)
    assert str(e.value).startswith(f"pyproject.toml: [tool.kforge] catalog: specs/ is a link to {tmp_path / 'real'}, "
                                   f"outside the project") and "move that folder into the project" in str(e.value)
    proc = doit(root, "list", check=False)
    assert proc.returncode == 2 and "specs/ is a link to" in proc.stderr and "neither" not in proc.stderr


def test_a_catalog_folder_holding_no_spec_is_one_line_naming_it(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "_helpers.py").write_text("")   # a helper, not a catalog
    with pytest.raises(SpecError) as e:
        catalog_module.Catalog(tmp_path, None, 50_000).load()
    assert str(e.value) == (f"{tmp_path / 'specs'}: no specs found (*.toml spec files, *.py catalogs or *.jsonl "
                            f"records); add one there, or name the folder holding them in pyproject.toml's "
                            f"[tool.kforge] catalog")


def test_a_configured_catalog_folder_holding_no_spec_is_named_not_specs(tmp_path):
    """`[tool.kforge] catalog = ["docs"]`, a folder with no specs, was reported as specs/: a folder the project
    had not named."""
    from tests.support import doit
    root = with_catalog(make_project(tmp_path / "p"), 'catalog = ["docs", "specs"]')
    (root / "docs").mkdir()
    (root / "specs" / "scale.toml").unlink()
    proc = doit(root, "list", check=False)
    assert proc.returncode == 2 and proc.stderr == (
        f"kforge: {root / 'docs'}, {root / 'specs'}: no specs found (*.toml spec files, *.py catalogs or *.jsonl "
        f"records); add one there, or name the folder holding them in pyproject.toml's [tool.kforge] catalog\n")
    assert not (root / "out" / "sm_90a").exists()


def test_a_catalog_entry_naming_a_module_not_a_package_is_one_line_naming_it(tmp_path, monkeypatch):
    """catalog.py 552-555 (`catalog = ["mylib.specs"]` where specs is a .py module): reachable from a project's
    pyproject.toml, never run in the whole suite's coverage."""
    site = write_files(tmp_path / "site", {"mylib/__init__.py": "",
                                           "mylib/specs.py": "from kforge.declare import family\n"})
    monkeypatch.syspath_prepend(str(site))
    root = with_catalog(make_project(tmp_path / "p"), 'catalog = ["mylib.specs"]')
    with pytest.raises(SpecError) as e:
        catalog_module.catalog_folders(root)
    assert str(e.value) == ("pyproject.toml: [tool.kforge] catalog: mylib.specs is a module, not a package; name the "
                            "package whose folder holds the spec files")
    root = with_catalog(make_project(tmp_path / "q"), 'catalog = ["mylib"]')
    assert catalog_module.catalog_folders(root) == [site / "mylib"]


def test_a_broken_family_whose_file_name_is_no_task_name_is_listed_under_one_made_of_it():
    """catalog.py 615 (a spec that did not load, named by its file: `Scale-v2.toml`, `2024.toml`): reachable from
    any spec file name, never run in the whole suite's coverage."""
    failed = [("Scale-v2", "specs/Scale-v2.toml", "not valid TOML"), ("2024", "specs/2024.toml", "x"),
              ("_2024", "specs/_2024.toml", "y"), ("scale_v2", "specs/scale_v2.toml", "specs/scale_v2.toml: z")]
    assert catalog_module._named_apart(failed, set()) == [
        catalog_module.Broken("scale_v2", "specs/Scale-v2.toml", "specs/Scale-v2.toml: not valid TOML"),
        catalog_module.Broken("family", "specs/2024.toml", "specs/2024.toml: x"),
        catalog_module.Broken("family_broken", "specs/_2024.toml", "specs/_2024.toml: y"),
        catalog_module.Broken("scale_v2_broken", "specs/scale_v2.toml", "specs/scale_v2.toml: z")]


def test_an_installed_library_named_as_a_catalog_is_one_line_and_none_of_its_modules_runs(tmp_path, monkeypatch):
    """`catalog = ["cut_cross_entropy"]` ran each of the library's modules as a catalog file (a module writing a
    file at import wrote it) and said, per module, to call kforge.declare.family in site-packages (two outside
    reviews: cut-cross-entropy, gemlite). A package holding specs still loads as a catalog."""
    site = write_files(tmp_path / "site", {"plainlib/__init__.py": "",
                                           "plainlib/ops.py": f"open({str(tmp_path / 'ran')!r}, 'w').close()\n",
                                           "speclib/__init__.py": "",
                                           "speclib/fams.py": "from kforge.declare import family\n"})
    monkeypatch.syspath_prepend(str(site))
    root = with_catalog(make_project(tmp_path / "p"), 'catalog = ["plainlib"]')
    with pytest.raises(SpecError) as e:
        catalog_module.catalog_folders(root)
    assert str(e.value) == (
        "pyproject.toml: [tool.kforge] catalog: plainlib is an installed package that holds no spec (no .toml or "
        ".jsonl, no .py importing kforge): a library, not a catalog; build its kernels from specs of your own that "
        "name them (`module = \"plainlib.<module>\"`, docs/libraries.md)")
    assert not (tmp_path / "ran").exists()
    root = with_catalog(make_project(tmp_path / "q"), 'catalog = ["speclib"]')
    assert catalog_module.catalog_folders(root) == [site / "speclib"]


# A variable that a family's module reads while the probe imports it (mamba-ssm's autotune_configs() keeps one config
# under MAMBA_DETERMINISTIC=1), or while the probe runs its pruner or a heuristic, is one of the saved catalog's
# inputs, as a file read there is and as it is of a compile: the targets follow the environment (an outside review:
# the first load's list was kept whatever the variable said later).

ENV_KERNEL = '''
import os

import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": b}) for b in (256, 512, 1024)]
if os.environ.get("KFT_DETERMINISTIC") == "1":   # as mamba_ssm.utils.determinism.autotune_configs
    CONFIGS = CONFIGS[:2]   # (mamba's keeps one; two are pruned as three are, so both read the same variables)
SEARCH = os.environ.get("PYTHONPATH")   # kforge sets it for the probe: not an input


def prune(configs, named_args, **kwargs):
    return configs[-1:] if os.getenv("KFT_PRUNE") == "big" else configs


@triton.autotune(configs=CONFIGS, key=["n"], prune_configs_by={"early_config_prune": prune})
@triton.heuristics({"EVEN": lambda args: "KFT_EVEN" in os.environ})
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
'''
ENV_SPEC = '''
[kernel]
name = "{name}"
source = "tk/det.py"
entry = "scale_kernel"
toolchain = "triton"
archs = ["sm_90a"]

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"
EVEN = "constexpr"

[sweep]
{env}'''
ENV_READ = ("KFT_DETERMINISTIC", "KFT_PRUNE", "KFT_EVEN")


@pytest.fixture
def env_project(tmp_path, monkeypatch):
    for name in ENV_READ:
        monkeypatch.delenv(name, raising=False)
    return make_project(tmp_path / "p", specs={"det": ENV_SPEC.format(name="det", env="")},
                        kernels={"det": ENV_KERNEL})


def test_a_variable_the_probes_import_reads_decides_the_targets_and_an_unchanged_one_takes_them_unprobed(
        env_project, monkeypatch):
    from kforge.load import entry_probe
    asked = []
    send = entry_probe.Probe._send
    monkeypatch.setattr(entry_probe.Probe, "_send", lambda self, *a: asked.append(1) or send(self, *a))

    def now() -> tuple[str, list[int], bool]:
        """(where the load found the catalog, the targets' BLOCKs, whether a probe was asked)"""
        before = len(asked)
        found = loaded(env_project)
        return found.loaded_from, sorted(dict(t.config)["BLOCK"] for t in found.targets), len(asked) > before

    assert now() == ("specs", [256, 512, 1024], True)
    assert now() == ("saved", [256, 512, 1024], False)
    monkeypatch.setenv("KFT_DETERMINISTIC", "1")   # unset -> set
    assert now() == ("specs", [256, 512], True)
    assert now() == ("saved", [256, 512], False)
    monkeypatch.delenv("KFT_DETERMINISTIC")   # set -> unset: the catalog of that environment, kept, unprobed
    assert now() == ("kept", [256, 512, 1024], False)
    assert now() == ("saved", [256, 512, 1024], False)
    monkeypatch.setenv("KFT_DETERMINISTIC", "")   # set, and empty: not what unset is
    assert now() == ("specs", [256, 512, 1024], True)
    assert now() == ("saved", [256, 512, 1024], False)


def test_a_variable_the_probes_pruner_or_heuristic_reads_is_an_input_and_one_the_familys_env_sets_is_not(
        env_project, monkeypatch):
    pinned = ENV_SPEC.format(name="pinned", env='\n[env]\nKFT_PRUNE = "big"\n')
    (env_project / "specs" / "pinned.toml").write_text(pinned)
    even = lambda family: {dict(t.constexprs)["EVEN"] for t in loaded(env_project).targets if t.kernel == family}
    names, targets = computed_families(env_project, monkeypatch)
    assert names == {"det", "pinned"} and even("det") == even("pinned") == {False}
    assert blocks(targets, "det") == {256, 512, 1024} and blocks(targets, "pinned") == {1024}
    monkeypatch.setenv("KFT_PRUNE", "big")   # read by det's pruner; pinned's [env] gives its probe its own
    names, targets = computed_families(env_project, monkeypatch)
    assert names == {"det"} and blocks(targets, "det") == {1024} and blocks(targets, "pinned") == {1024}
    monkeypatch.setenv("KFT_EVEN", "")   # read by both families' heuristic: unset -> set
    names, targets = computed_families(env_project, monkeypatch)
    assert names == {"det", "pinned"} and even("det") == even("pinned") == {True}
    names, _ = computed_families(env_project, monkeypatch)   # nothing changed (PYTHONPATH read too)
    assert names == set() and loaded(env_project).loaded_from == "saved"


def test_a_broken_familys_line_stays_one_line_whatever_its_file_is_named(tmp_path):
    """The hostile review, round three: a spec file whose name holds a line break printed its family's error, in the
    build's warning and in `doit list`, over two lines."""
    root = make_project(tmp_path, specs={})
    (root / "specs" / "a\nb.toml").write_text('[kernel]\nname = "x"\n')
    catalog = catalog_module.Catalog(root, None, 50_000).load(keep_going=True)
    assert [b.line() for b in catalog.broken] == ["family x did not load: specs/a\\nb.toml: missing table [signature]"]
