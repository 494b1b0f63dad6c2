"""What a library's import meets of the virtualenv it shares with kforge (rules/load/shared_env.py): kforge's
FlyDSL kept from imports under the device model, and an import failing on one of kforge's pins named in one line.
The library is tests/env_library.py, on PYTHONPATH from a tmp site."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import env_library
from tests.support import REPO, computed_once, doit, make_project, statuses


@pytest.fixture
def envlib(tmp_path):
    site = env_library.write(tmp_path / "site")
    return {"PYTHONPATH": str(site)}


def _python(code: str, env: dict) -> dict:
    env = dict(os.environ, **env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def under_the_model(tmp_path_factory) -> dict:
    """What one process saw of FlyDSL: before the model, with it off, with it on (and envlib imported there), then
    prepared again with a set-up hook that calls show_flydsl(). One child for the two tests below (each import of
    torch is about 2 s of CPU), once for the run."""
    return computed_once(tmp_path_factory, "shared-env-under-the-model", _under_the_model)


def _under_the_model(folder: Path) -> dict:
    site = env_library.write(folder / "site")
    (folder / "hooks_for_fly.py").write_text("from kforge.load import shared_env\n\n\ndef with_flydsl():\n"
                                            "    shared_env.show_flydsl()\n")
    return _python('''
        import importlib.util, json
        from kforge.load import device_model
        seen = {"before": importlib.util.find_spec("flydsl") is not None}
        device_model.prepare("gfx942", False)
        seen["model off"] = importlib.util.find_spec("flydsl") is not None
        device_model.prepare("gfx942", True)
        seen["model on"] = importlib.util.find_spec("flydsl") is not None
        try:
            import flydsl
            seen["import"] = "imported"
        except ImportError as e:
            seen["import"] = type(e).__name__
        import envlib
        seen["envlib took its path without FlyDSL"] = envlib.fly.HAS_FLYDSL is False
        # then a set-up hook that shows FlyDSL, for another arch (the model is installed again)
        device_model.prepare("sm_90a", True, ("hooks_for_fly:with_flydsl",))
        import torch
        hooked = {"flydsl": importlib.util.find_spec("flydsl") is not None, "model": torch.cuda.get_device_name()}
        print(json.dumps({"seen": seen, "hooked": hooked}))
        ''', {"PYTHONPATH": f"{folder}{os.pathsep}{site}"})


def test_under_the_device_model_flydsl_is_not_importable_and_without_it_it_is(under_the_model):
    assert under_the_model["seen"] == {"before": True, "model off": True, "model on": False,
                                       "import": "ModuleNotFoundError", "envlib took its path without FlyDSL": True}


def test_a_set_up_hook_calling_show_flydsl_makes_it_importable_under_the_model(under_the_model):
    assert under_the_model["hooked"] == {"flydsl": True, "model": "NVIDIA H100 80GB HBM3"}


@pytest.fixture(scope="module")
def flydsl_seen(tmp_path_factory) -> dict:
    """What one process saw with kforge's FlyDSL imported (as in a compile server forked from a worker that built
    FlyDSL targets): hidden and shown again, then envlib imported. One child for the two tests that need FlyDSL
    imported (torch and FlyDSL's native extension: about 2 s of CPU), once for the run."""
    return computed_once(tmp_path_factory, "shared-env-flydsl-seen", _flydsl_seen)


def _flydsl_seen(folder: Path) -> dict:
    site = env_library.write(folder / "site")
    return _python('''
        import importlib.util, json, sys
        import flydsl.expr
        before = sys.modules["flydsl.expr"]
        from kforge.load import shared_env
        shared_env.hide_flydsl()
        hidden = importlib.util.find_spec("flydsl") is None and "flydsl.expr" not in sys.modules
        shared_env.show_flydsl()
        import flydsl.expr
        found = {"shown again": {"hidden": hidden, "same": sys.modules["flydsl.expr"] is before}}
        try:
            import envlib
        except ImportError as e:
            explained = shared_env.explain(e)
            found["envlib"] = {"explained": explained, "message": str(e)}
        print(json.dumps(found))
        ''', {"PYTHONPATH": str(site)})


def test_an_import_failing_on_kforges_flydsl_names_the_librarys_line_and_the_pin(flydsl_seen):
    """Where FlyDSL is seen (a FlyDSL family, `device_model = false`), a library written for another FlyDSL fails
    its import in one line that says both."""
    found = flydsl_seen["envlib"]
    assert found["explained"]
    assert found["message"] == (
        f"envlib/fly.py:6 (`from flydsl.expr import {env_library.ENVLIB_FLY_API}`): cannot import name "
        f"'{env_library.ENVLIB_FLY_API}' from 'flydsl.expr': this environment's flydsl is 0.4.2, the version kforge "
        f"pins (flydsl==0.4.2), and the library was written for another; kforge builds with its pinned flydsl, so "
        f"use a release of the library that works with flydsl 0.4.2 (docs/libraries.md)")


def test_other_import_failures_are_left_as_they_are(envlib):
    found = _python('''
        import json
        from kforge.load import shared_env
        try:
            import envlib_missing_dependency
        except ImportError as e:
            print(json.dumps({"explained": shared_env.explain(e), "message": str(e)}))
        ''', envlib)
    assert found == {"explained": False, "message": "No module named 'envlib_missing_dependency'"}


def test_a_dependency_the_library_imports_and_the_environment_lacks_names_the_librarys_line(tmp_path):
    """A library whose __init__ fails partway on a missing dependency: the one line every target of it shows names
    the library's line and the fix, not only Python's `No module named ...`."""
    (tmp_path / "halfinit").mkdir()
    (tmp_path / "halfinit" / "__init__.py").write_text("from halfinit import kern  # noqa: F401\n"
                                                       "import halfinit_missing_dependency  # noqa: F401\n")
    (tmp_path / "halfinit" / "kern.py").write_text("X = 1\n")
    found = _python('''
        import json
        from kforge.load import shared_env
        try:
            import halfinit.kern
        except ImportError as e:
            print(json.dumps({"explained": shared_env.explain(e), "message": str(e)}))
        ''', {"PYTHONPATH": str(tmp_path)})
    assert found == {"explained": True, "message": (
        "No module named 'halfinit_missing_dependency' (in halfinit/__init__.py:2); install it in the environment "
        "that runs doit")}


def test_a_native_extension_that_cannot_load_here_names_the_librarys_line(tmp_path):
    """A library's compiled extension built for a CUDA torch fails to load on the CPU builder (a missing libcudart,
    a bad ELF): the loader's message alone does not say which import of the library it was."""
    import importlib.machinery
    (tmp_path / "natlib").mkdir()
    (tmp_path / "natlib" / "__init__.py").write_text("import os\nfrom natlib import _C  # noqa: F401\n")
    (tmp_path / "natlib" / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not an ELF file")
    found = _python('''
        import json
        from kforge.load import shared_env
        try:
            import natlib
        except ImportError as e:
            print(json.dumps({"explained": shared_env.explain(e), "message": str(e)}))
        ''', {"PYTHONPATH": str(tmp_path)})
    message = found["message"]   # the dynamic loader's words in between (glibc: "file too short")
    assert found["explained"] and message.startswith(f"natlib/_C{importlib.machinery.EXTENSION_SUFFIXES[0]}: ")
    assert message.endswith(" (in natlib/__init__.py:2)") and str(tmp_path) not in message, message


@pytest.mark.slow
def test_a_library_using_flydsl_whenever_importable_builds_for_both_vendors_and_a_module_failing_on_a_pin_is_named(
        tmp_path, envlib):
    """envlib's __init__ imports its FlyDSL path, written for another FlyDSL than kforge's: under the device model
    it sees no FlyDSL, so its guarded kernels and its autotuned one built by calls (read by the probe) build for
    sm_90a and gfx942, with GPU tables and a torch operator made at import.

    In the same build (a build of their own started the compile servers and imported torch and the library
    again), two families whose module fails on a pin: one needing a Triton name kforge's triton lacks, one
    that cannot import without FlyDSL. Each target's error is one line naming the library's line, the pin and the
    fix."""
    one_config = lambda text: text.replace('dtype = ["fp32", "fp16"]', 'dtype = ["fp32"]').replace(
        'dtype = ["fp32", "bf16"]', 'dtype = ["fp32"]').replace("BLOCK = [128, 1024]", "BLOCK = [128]").replace(
        "n = [4096, 1000]", "n = [4096]")
    on_sm_90a = lambda text: one_config(text).replace('archs = ["sm_90a", "gfx942"]', 'archs = ["sm_90a"]')
    specs = {name: one_config(text) for name, text in env_library.SPECS.items()}
    specs["newer"] = on_sm_90a(env_library.elementwise("newer", "envlib.newer", "copy_kernel"))
    specs["needs_fly"] = on_sm_90a(env_library.elementwise("needs_fly", "envlib.needs_fly", "copy_kernel"))
    root = make_project(tmp_path / "p", specs=specs, kernels={})
    proc = doit(root, "-n", "1", env=envlib, check=False)   # one worker: each more imports torch and the library again
    assert proc.returncode != 0
    built = statuses(root, "built")
    families = {t.split(":")[0] for t in built if "@" in t}
    assert families == {"envlib_add", "envlib_neg", "envlib_scale"}, built
    assert {t.split("@")[1] for t in built if "@" in t} == {"sm_90a", "gfx942"}
    assert statuses(root, "failed") == {"newer:fp32-block128@sm_90a", "needs_fly:fp32-block128@sm_90a"}, proc.stdout

    errors = {t["name"]: next(line.strip().removeprefix("error: ") for line in t["error"].splitlines()
                              if line.strip().startswith("error: "))
              for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"]
              if "@" in t["name"] and t["status"] == "failed"}
    assert errors["newer:fp32-block128@sm_90a"].startswith(
        f"ImportError: envlib/newer.py:3 (`from triton.language import {env_library.TRITON_API}`): cannot import "
        f"name '{env_library.TRITON_API}' from 'triton.language': this environment's triton is 3.6.0, the version "
        f"kforge pins (triton==3.6.0)"), errors
    assert errors["needs_fly:fp32-block128@sm_90a"].startswith(
        "ModuleNotFoundError: envlib/needs_fly.py:1 (`import flydsl`) imports flydsl, which an import under the "
        "device model does not see: kforge's own flydsl (flydsl==0.4.2) is for its FlyDSL families"), errors
    assert "a set-up hook calling kforge.load.shared_env.show_flydsl()" in errors["needs_fly:fp32-block128@sm_90a"]
    assert all("\n" not in e for e in errors.values())


def test_the_probe_names_the_librarys_line_and_the_pin_where_flydsl_is_seen(tmp_path, envlib):
    """With `device_model = false` the import sees this machine as it is, kforge's FlyDSL included: reading the
    autotuned entry fails on envlib's FlyDSL path, in one line naming its line and kforge's pin."""
    spec = env_library.SCALE.replace('toolchain = "triton"', 'toolchain = "triton"\ndevice_model = false')
    root = make_project(tmp_path / "p", specs={"envlib_scale": spec}, kernels={})
    proc = doit(root, "list", env=envlib, check=False)
    assert "BROKEN" in proc.stdout, proc.stdout
    line = next(x for x in proc.stderr.splitlines() if "did not load" in x)
    assert line.endswith(
        f"importing envlib failed: ImportError: envlib/fly.py:6 (`from flydsl.expr import "
        f"{env_library.ENVLIB_FLY_API}`): cannot import name '{env_library.ENVLIB_FLY_API}' from 'flydsl.expr': this "
        f"environment's flydsl is 0.4.2, the version kforge pins (flydsl==0.4.2), and the library was written for "
        f"another; kforge builds with its pinned flydsl, so use a release of the library that works with flydsl "
        f"0.4.2 (docs/libraries.md)"), line


def test_flydsl_imported_before_it_was_hidden_comes_back_as_it_was(flydsl_seen):
    """A compile server forked from a worker that built FlyDSL targets has FlyDSL imported: hidden, and shown again
    by a set-up hook, it is the same module objects (its native extension is not loaded a second time)."""
    assert flydsl_seen["shown again"] == {"hidden": True, "same": True}


def _explained(tmp_path, module: str, body: str) -> dict:
    """A library whose import runs `body` and fails: explain()'s answer, its answer again on the same exception,
    and the exception's message."""
    (tmp_path / f"{module}.py").write_text(f"def down(n):\n    {body}\n\n\ndown(0)\n")
    return _python(f'''
        import json
        from kforge.load import shared_env
        try:
            import {module}
        except Exception as e:
            explained = shared_env.explain(e)
            print(json.dumps({{"explained": explained, "again": shared_env.explain(e), "message": str(e)}}))
        ''', {"PYTHONPATH": str(tmp_path)})


def test_a_librarys_import_that_recurses_without_end_names_the_librarys_line(tmp_path):
    """Infinite recursion at a library's module level: a compile's one line said only `RecursionError: maximum
    recursion depth exceeded`, where an ImportError named the library's line."""
    assert _explained(tmp_path, "recursing_lib", "return down(n + 1)") == {
        "explained": True, "again": True, "message": "maximum recursion depth exceeded (in recursing_lib.py:2)"}


def test_a_librarys_own_error_at_import_names_the_librarys_line(tmp_path):
    """`raise RuntimeError('boom')` at a library's module level: a build's one line said only `RuntimeError: boom`
    (the catalog's probe named the line)."""
    assert _explained(tmp_path, "booming_lib", "raise RuntimeError('boom')") == {
        "explained": True, "again": True, "message": "boom (in booming_lib.py:2)"}
    assert _explained(tmp_path, "silent_lib", "raise RuntimeError()") == {   # no empty message before it
        "explained": True, "again": True, "message": "(in silent_lib.py:2)"}


def test_a_librarys_error_whose_type_words_its_own_message_names_the_librarys_line_where_its_message_can(tmp_path):
    """An AttributeError at import (bitsandbytes' `torch.accelerator.current_accelerator().type` where it answers
    None) was a compile's bare `AttributeError: 'NoneType' object has no attribute 'type'` (an outside review): its
    type has a __str__ of its own, which was taken to ignore the message. One whose message is made otherwise
    (KeyError's repr, OSError's errno) keeps its message as it was."""
    assert _explained(tmp_path, "attr_lib", "return None.type") == {
        "explained": True, "again": True, "message": "'NoneType' object has no attribute 'type' (in attr_lib.py:2)"}
    assert _explained(tmp_path, "key_lib", "return {}['gpu']") == {
        "explained": True, "again": True, "message": "'gpu'"}
    assert _explained(tmp_path, "os_lib", "return open('/nonexistent-kforge/x')") == {
        "explained": True, "again": True,
        "message": "[Errno 2] No such file or directory: '/nonexistent-kforge/x'"}
