import os
import shutil
import tempfile

import pytest

from tests.support import built_once, doit, make_project, spec_text

# The local cache is per user and on by default: the suite's builds must neither fill the user's cache nor hit
# entries an earlier test (or the user's own builds) left there. Tests of the cache name a directory of their own.
os.environ["KFORGE_LOCAL_CACHE"] = "off"
# Nor its kept bytecode (rules/load/observe.py): the test libraries' modules, at paths no later run has again. One
# user cache for the whole run, made by the process that starts it; xdist's workers inherit it.
if "KFORGE_TESTS_USER_CACHE" not in os.environ:
    os.environ["KFORGE_TESTS_USER_CACHE"] = tempfile.mkdtemp(prefix="kforge-tests-user-cache-")
    _MADE_USER_CACHE = True
os.environ["XDG_CACHE_HOME"] = os.environ["KFORGE_TESTS_USER_CACHE"]
# Nor keep a hub after each build (rules/load/kept_hub.py): hundreds of test projects, each a keeper of its own
# holding a toolchain for minutes. The tests of keeping turn it on for their builds.
os.environ["KFORGE_KEEP_HUB"] = "0"


def pytest_configure(config):
    """kforge byte-compiled once, before the workers start: the suite starts hundreds of Python processes (doit,
    probes, compile servers) that import it, and an editable install is not compiled as pip compiles an installed
    package. Under PYTHONDONTWRITEBYTECODE (set on the dev machines) each of them compiled rules/ from source again
    (about 0.1 s of CPU each); so did each child that imports a module of tests/ (the served and recorded children
    of tests/runtime). rules/, kernels/ and tests/ are never edited by a test; the test projects' modules still
    compile as they are written."""
    if not hasattr(config, "workerinput"):
        import compileall
        from tests.support import REPO
        for folder in ("rules", "kernels", "tests"):
            compileall.compile_dir(str(REPO / folder), quiet=1, workers=1)
        _rewritten_once(config, REPO / "tests")


def _rewritten_once(config, tests) -> None:
    """The test modules as pytest's assertion rewriting makes them, written to its cache once, before the workers
    start: under PYTHONDONTWRITEBYTECODE every xdist worker rewrote all of them again while collecting (about 2 s
    of CPU a worker; 1.7 s once here). A worker reads the cache whatever the variable says. These are pytest's
    private helpers: with a pytest that lacks them, each worker rewrites as before."""
    try:
        from _pytest.assertion import rewrite
        state = config.stash[rewrite.assertstate_key]
        for source in sorted(tests.rglob("*.py")):
            if not (source.name.startswith("test_") or source.name == "conftest.py"):
                continue
            pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(source, pyc, state.trace) is None:
                source_hash, code = rewrite._rewrite_test(source, config)
                pyc.parent.mkdir(exist_ok=True)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (ImportError, AttributeError, KeyError, TypeError, OSError):
        pass


def pytest_addoption(parser):
    parser.addoption("--simulate-all", action="store_true",
                     help="run every case of the simulated world's matrix (tests/kernels/ep/test_simulate.py); "
                          "without it, a representative part at each world")


def pytest_collection_modifyitems(config, items):
    items[:] = _slow_first_in_each_share(items, getattr(config, "workerinput", {}).get("workercount", 1))
    if config.getoption("--simulate-all"):
        return
    skip = pytest.mark.skip(reason="a case of the full simulated matrix: run with --simulate-all")
    for item in items:
        if item.get_closest_marker("simulate_all"):
            item.add_marker(skip)


def _slow_first_in_each_share(items, workers: int):
    """The tests marked slow (the longest, 15 s and more on 2 busy CPUs: each builds many kernels) dealt out to the
    front of each xdist worker's share, the rest in file order. worksteal hands worker k the k-th contiguous share
    of this order (each len(left) // workers left) and lets an idle worker take the end of another's queue: a long
    test late in a queue becomes the whole run's tail, one at the front runs while the others share the rest."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    rest = [item for item in items if not item.get_closest_marker("slow")]
    shares, left = [], len(items)
    for k in range(workers):
        shares.append(left // (workers - k))
        left -= shares[-1]
    dealt = [slow[k::workers] for k in range(workers)]
    ordered = []
    for k, size in enumerate(shares):
        take = max(0, size - len(dealt[k]))
        ordered += dealt[k] + rest[:take]
        rest = rest[take:]
    return ordered + rest


ALL_ARCHS = ("sm_80", "sm_90a", "sm_100a", "gfx90a", "gfx942", "gfx950")


def _build_every_arch(root):
    make_project(root, specs={"scale": spec_text(archs=ALL_ARCHS, dtypes=("fp16", "bf16"))})
    doit(root, "-n", "2")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """A project whose scale kernel was really compiled for every arch kforge knows (doit -n 2), once for the
    whole run (every xdist worker): tests only read it, or change a copy of it."""
    return built_once(tmp_path_factory, "every-arch", _build_every_arch)


def pytest_unconfigure(config):
    if globals().get("_MADE_USER_CACHE") and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["KFORGE_TESTS_USER_CACHE"], ignore_errors=True)
