"""rules/runtime/jit.py: the opt-in JIT fallback's recipe comes from a bundle (untrusted): each way it cannot be
used is one LaunchError naming the target, and nothing the checks did not clear is imported. No GPU: the modules
here import nothing and no kernel is called."""
import hashlib
import importlib.util
import sys
import types

import pytest

from kforge_runtime.jit import FIX, JitKernel, import_checked
from kforge_runtime.launch import LaunchError


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder on sys.path holding the package jitpkg (its __init__ empty) with jitpkg/mod.py and the
    module jitmod.py; every module imported here is forgotten after."""
    (tmp_path / "jitpkg").mkdir()
    (tmp_path / "jitpkg" / "__init__.py").write_text("")
    (tmp_path / "jitpkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "jitmod.py").write_text("y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.split(".")[0] in ("jitpkg", "jitmod")]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] in ("jitpkg", "jitmod")]:
        del sys.modules[name]


def recipe(project, **more) -> dict:
    source = {"module": "jitpkg.mod", "entry": "x", "digests": {"jitpkg/mod.py": digest(project / "jitpkg/mod.py")}}
    return {"target": "k:c@sm_90a", "toolchain": "triton", "source": source, "constexprs": {}, "options": {}, **more}


@pytest.mark.parametrize("change, said", [
    ({"toolchain": "flydsl"}, "k:c@sm_90a: only Triton kernels can fall back to a JIT compile; build it (doit) and "
                              "package it (doit package) for this GPU's arch"),
    ({"source": []}, "k:c@sm_90a: the bundle's recipe needs 'source', 'constexprs' and 'options' objects; rebuild "
                     "the bundle with `doit package`"),
    ({"options": "x"}, "k:c@sm_90a: the bundle's recipe needs 'source', 'constexprs' and 'options' objects"),
])
def test_a_recipe_of_the_wrong_toolchain_or_shape_is_one_line(project, change, said):
    """jit.py 35-39: reachable from an altered or FlyDSL bundle, never run in the whole suite's coverage."""
    with pytest.raises(LaunchError) as e:
        JitKernel(recipe(project, **change))
    assert str(e.value).startswith(said) and "jitpkg" not in sys.modules


def test_a_checked_module_without_the_entry_is_one_line_naming_it(project):
    """jit.py 43-44: the module the recipe names matches its digests but has no such function."""
    assert JitKernel(recipe(project)).fn == 1   # the entry found: jitpkg.mod.x
    broken = recipe(project)
    broken["source"]["entry"] = "nope"
    with pytest.raises(LaunchError) as e:
        JitKernel(broken)
    assert str(e.value) == f"k:c@sm_90a: jitpkg.mod has no kernel 'nope'; {FIX}"


@pytest.mark.parametrize("module", ["jitpkg..mod", "os.path; x", 7])
def test_a_module_name_that_is_no_dotted_name_is_one_line(project, module):
    """jit.py 62."""
    with pytest.raises(LaunchError) as e:
        import_checked({"module": module, "digests": {"a.py": "0"}}, "k")
    assert str(e.value).startswith("k: the bundle names no importable kernel module (") and "rebuild" in str(e.value)


def test_a_package_whose_path_was_changed_is_refused_before_anything_is_imported(project, monkeypatch):
    """jit.py 74: jitpkg already imported with its __path__ pointing elsewhere, where a mod.py lies."""
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "mod.py").write_text("x = 3\n")
    package = types.ModuleType("jitpkg")
    package.__path__ = [str(project / "elsewhere")]
    monkeypatch.setitem(sys.modules, "jitpkg", package)
    with pytest.raises(LaunchError) as e:
        import_checked(recipe(project)["source"], "k")
    assert str(e.value) == (f"k: jitpkg.mod is loaded from {project / 'elsewhere' / 'mod.py'}, not from a "
                            f"jitpkg/mod.py of a project; {FIX}")
    assert "jitpkg.mod" not in sys.modules


def test_a_module_another_finder_loads_from_another_file_is_refused_after_its_import(project, monkeypatch):
    """jit.py 95-97: a finder ahead of the path finder (an editable install's) loads the checked name from another
    file."""
    (project / "other.py").write_text("x = 4\n")

    class Elsewhere:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "jitpkg.mod":
                return importlib.util.spec_from_file_location(name, project / "other.py")
            return None
    monkeypatch.setattr(sys, "meta_path", [Elsewhere, *sys.meta_path])
    with pytest.raises(LaunchError) as e:
        import_checked(recipe(project)["source"], "k")
    assert str(e.value) == (f"k: jitpkg.mod was imported from {project / 'other.py'}, not from the checked "
                            f"{project / 'jitpkg' / 'mod.py'}; {FIX}")


def test_a_module_already_imported_not_from_a_file_or_a_module_in_place_of_a_package_is_one_line(project,
                                                                                                  monkeypatch):
    """jit.py 113 and 121."""
    monkeypatch.setitem(sys.modules, "jitmod", types.ModuleType("jitmod"))
    with pytest.raises(LaunchError) as e:
        import_checked({"module": "jitmod", "digests": {"jitmod.py": "0" * 64}}, "k")
    assert str(e.value) == f"k: jitmod is already imported, and not from a file; {FIX}"
    monkeypatch.delitem(sys.modules, "jitmod")
    with pytest.raises(LaunchError) as e:
        import_checked({"module": "jitmod.sub", "digests": {"jitmod/sub.py": "0" * 64}}, "k")
    assert str(e.value) == f"k: jitmod is the module {project / 'jitmod.py'}, not a package; {FIX}"
    assert "jitmod" not in sys.modules


@pytest.mark.parametrize("relative", ["../evil.py", "/etc/passwd", "jitpkg/./mod.py", "a\nb.py", 7])
def test_a_recorded_source_path_that_is_not_relative_to_the_project_is_refused(project, relative):
    """jit.py 163: reachable from an altered bundle, never run in the whole suite's coverage. Nothing is read
    from there, nothing imported."""
    source = recipe(project)["source"]
    source["digests"][relative] = "0" * 64
    with pytest.raises(LaunchError) as e:
        import_checked(source, "k")
    assert str(e.value).startswith(f"k: the bundle records the source path {relative!r:.80}, which is not relative "
                                   f"to a project; rebuild the bundle with `doit package`")
    assert "jitpkg.mod" not in sys.modules
