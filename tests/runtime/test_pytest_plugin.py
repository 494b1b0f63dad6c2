"""rules/runtime/pytest_plugin.py: a suite run against bundles passes when they hold what it launches, and with
--kforge-strict fails listing every specialization they lack (the CI guard)."""
import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.runtime.test_serve import bundle_dir, entry
from tests.support import REPO

pytest_plugins = ["pytester"]

KERNELS = '''
import triton, triton.language as tl


@triton.jit
def copy_app(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''

SUITE = '''
import torch, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from kforge_runtime.bundle import Bundle


class Stub:   # Triton's driver on a CPU: the target is sm_90a
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)


class Launched:
    def launch_trusted(self, *args): pass
    def reaches(self, address): return True   # the harness launches nothing: a CPU tensor stands for GPU memory


driver.set_active(Stub())
Bundle.kernel = lambda self, entry, device=None, binary=None: Launched()
Bundle.binary = lambda self, entry: b"the binary"


from app_kernels import copy

copy.device_caches[0]
copy.compile = lambda *a, **k: None   # Triton's compile on a miss: stands for it (returns no kernel)


def x():
    return torch.zeros(1000, dtype=torch.float16)


def test_held():
    copy[(8,)](x(), x(), 1000, BLOCK=128)


def test_new_block():
    copy[(8,)](x(), x(), 1000, BLOCK=256)


def test_new_block_and_warps():
    copy[(8,)](x(), x(), 1000, BLOCK=512, num_warps=8)
'''


@pytest.fixture
def suite(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(app_kernels=KERNELS, test_app=SUITE.replace("import copy", "import copy_app as copy"))
    held = entry("copy", 128, 4)
    held["source"] = {"module": "app_kernels", "entry": "copy_app"}
    held["triton_source_key"] = source_key(pytester.path / "app_kernels.py", "copy_app")
    return pytester, str(bundle_dir(tmp_path / "bundle", [held]))


def source_key(path, name: str) -> str:
    """Triton's source key of a @jit function in a file (imported under another name: it defines only kernels)."""
    from importlib.util import module_from_spec, spec_from_file_location
    spec = spec_from_file_location(f"kforge_probe_{path.stem}", path)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name).cache_key


STUBS, TESTS = SUITE.replace("import copy", "import copy_app as copy").split("def x():")
TESTS = "import torch\nfrom app_kernels import copy_app as copy\n\n\ndef x():" + TESTS
LAUNCH = ("\ncopy[(8,)](torch.zeros(1000, dtype=torch.float16), torch.zeros(1000, dtype=torch.float16), 1000, "
          "BLOCK=1024)\n")


def launching_conftest(pytester, conftest: str | None = None) -> None:
    """The suite with its stubs in its conftest.py, which launches copy_app with BLOCK 1024 at import (the text of
    `conftest` if given). pytest imports the suite's conftest files before any plugin's pytest_configure: a library a
    conftest imports may compile and launch kernels then, and those were neither recorded nor served (a strict run
    named none)."""
    pytester.makeconftest(STUBS + LAUNCH if conftest is None else conftest)
    pytester.makepyfile(test_app=TESTS)


def test_the_strict_guard_fails_the_run_listing_every_missing_specialization_a_conftests_launch_included(suite):
    """Every miss: the tests' and what the suite's conftest launched at import (launching_conftest)."""
    pytester, bundle = suite
    launching_conftest(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kforge-bundles", bundle, "--kforge-strict")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*kforge: 1 specializations served, 3 compiled, 3 missing from the bundles*",
                                 'missing: app_kernels:copy_app (sm_90a) *"BLOCK": 1024*',
                                 'missing: app_kernels:copy_app (sm_90a) *"BLOCK": 256*',
                                 'missing: app_kernels:copy_app (sm_90a) *"BLOCK": 512*"num_warps": 8*',
                                 "record them (pytest --kforge-record*"])
    result.assert_outcomes(passed=3)   # each test passed: the run fails for what the bundles lack


def test_without_strict_the_misses_are_listed_and_the_run_passes(suite):
    pytester, bundle = suite
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kforge-bundles", bundle)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*2 missing from the bundles*"])


def test_a_suite_the_bundles_cover_passes_the_guard(suite, tmp_path):
    pytester, bundle = suite
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kforge-bundles", bundle, "--kforge-strict",
                                           "-k", "held")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*kforge: 1 specializations served, 0 compiled, 0 missing from the bundles*"])


def test_recording_a_suite_writes_what_its_tests_compile_and_what_its_conftest_launches(suite, tmp_path):
    """What the tests compile and what the suite's conftest launched at import (launching_conftest)."""
    pytester, _ = suite
    launching_conftest(pytester)
    out = tmp_path / "tests.jsonl"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kforge-record", str(out))
    assert result.ret == pytest.ExitCode.OK
    assert sorted(json.loads(t)["constexprs"]["BLOCK"] for t in out.read_text().splitlines()) == [128, 256, 512, 1024]
    assert "nothing new recorded" not in result.stdout.str()
    # a run that compiles nothing new (here: every test deselected; on a CPU: every GPU test skipped) said nothing and
    # left no file (an outside review, recording cut-cross-entropy's suite on a CPU); now one line says so
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kforge-record", str(out), "-k", "nothing_named_so")
    again.stdout.fnmatch_lines([f"kforge: nothing new recorded into {out}: no test compiled a Triton kernel it did not "
                                f"hold (tests that skip without a GPU record nothing; record on one)"])


def test_strict_without_bundles_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--kforge-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kforge-strict and --kforge-verify need --kforge-bundles PATH*"])


def test_under_xdist_the_strict_guard_still_fails_the_run_with_every_workers_misses_and_the_controller_serves_nothing(
        suite, tmp_path):
    """Each worker imports the suite's conftest, which launches BLOCK 1024 there (launching_conftest): compiled in
    each, one miss in the verdict. The controller imports it too, where the launch would import torch and Triton
    itself: it launches only in a process this test did not start (the workers)."""
    # the controller runs no test: serving or recording there imported torch and Triton before the first worker
    # started (seconds of a GPU host's wall time for nothing); its verdict covers every worker's misses
    pytester, bundle = suite
    seen = tmp_path / "controller.json"
    launching_conftest(pytester, f'''
import json, os, sys
if os.getppid() != {os.getpid()}:
{textwrap.indent(STUBS + LAUNCH, "    ")}

def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        open({str(seen)!r}, "w").write(json.dumps(sorted(m for m in ("torch", "triton") if m in sys.modules)))
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--kforge-bundles", bundle,
                                           "--kforge-strict", "--kforge-record", str(tmp_path / "r.jsonl"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*kforge: 1 specializations served, 4 compiled, 3 missing from the bundles*",
                                 'missing: app_kernels:copy_app (sm_90a) *"BLOCK": 1024*'])
    assert json.loads(seen.read_text()) == []


def test_bundles_that_cannot_be_read_are_one_usage_error(pytester, tmp_path):
    (tmp_path / "empty").mkdir()
    result = pytester.runpytest_subprocess("--kforge-bundles", str(tmp_path / "empty"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kforge-bundles: *empty: no bundle here*run `doit package`*"])
