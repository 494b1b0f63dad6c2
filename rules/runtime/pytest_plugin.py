"""pytest plugin (installed with kforge): `pytest --kforge-bundles out/dist [--kforge-strict] [--kforge-verify]`
serves a suite's Triton kernels from kforge bundles, `pytest --kforge-record FILE` records what it compiles.

A miss compiles as usual, so one run lists every miss; --kforge-strict (the CI guard) then fails the session. Under
pytest-xdist each worker hands its counts, misses and differences to the controller, which judges the run.
"""
from __future__ import annotations

import json
import os

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("kforge", "serving Triton kernels from kforge bundles")
    group.addoption("--kforge-bundles", action="append", default=[], metavar="PATH",
                    help="a kforge bundle (wheel or directory) or out/dist; repeatable")
    group.addoption("--kforge-strict", action="store_true",
                    help="fail the session listing every Triton specialization the bundles lack")
    group.addoption("--kforge-verify", action="store_true",
                    help="compile each served specialization with Triton once too, and fail the session if a "
                         "bundle's binary differs from Triton's")
    group.addoption("--kforge-record", metavar="FILE",
                    help="append every Triton specialization the suite compiles or loads to FILE (JSON lines)")


def _check_values(record: str | None, bundles: list[str]) -> None:
    """--kforge-record and --kforge-bundles as KFORGE_RECORD and KFORGE_SERVE check them: one usage error line."""
    if record is not None:
        from .record import record_problem
        if record_problem(record):
            raise pytest.UsageError(record_problem(record).replace("KFORGE_RECORD", "--kforge-record", 2))
    if bundles:
        from .startup import not_a_bundle
        problem = next(filter(None, (not_a_bundle(path or ".", flags=False) for path in bundles)), None)
        if problem is not None:   # before any test runs, not a warning at the first kernel
            raise pytest.UsageError(f"--kforge-bundles{problem}")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Record and serve from before the suite's conftest files are imported (pytest_configure runs after them): a
    library a conftest imports may compile and launch kernels there."""
    options = early_config.known_args_namespace
    if not _controller(early_config, options):
        _start(early_config, options)


def pytest_configure(config):
    bundles = config.getoption("kforge_bundles")
    if (config.getoption("kforge_strict") or config.getoption("kforge_verify")) and not bundles:
        raise pytest.UsageError("--kforge-strict and --kforge-verify need --kforge-bundles PATH (the bundles to "
                                "serve and check)")
    if not _controller(config, config.option):
        _start(config, config.option)   # the values checked there
    else:   # checked here too: one usage error, not one from each worker
        _check_values(config.getoption("kforge_record"), bundles)
        if bundles:
            _library(bundles)
    if bundles:
        config.stash[TOTALS] = {k: 0 if k in COUNTS else [] for k in COUNTS + LISTS}
    record = config.getoption("kforge_record")
    if record and not hasattr(config, "workerinput"):   # what it held before: the summary says if the run added none
        config.stash[RECORD_SIZE] = os.path.getsize(record) if os.path.isfile(record) else 0


def _controller(config, options) -> bool:
    """Whether this is pytest-xdist's controller, which runs no test (serving there would only import torch and
    Triton: seconds on a GPU host). A worker parses the controller's `-n` too: told apart by _xdist_worker (early) or
    its workerinput (from configure on)."""
    if hasattr(config, "workerinput") or _xdist_worker():
        return False
    return getattr(options, "dist", "no") != "no" or getattr(options, "numprocesses", None) not in (None, 0)


def _xdist_worker() -> bool:
    """An xdist worker sets PYTEST_XDIST_TESTRUNUID in its own process, so the environment it was started with
    (/proc/self/environ) lacks it or holds another run's; a pytest a test starts inherits it unchanged."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return False
    try:
        with open("/proc/self/environ", "rb") as f:
            started = f.read().split(b"\0")
    except OSError:
        return False
    return f"PYTEST_XDIST_TESTRUNUID={run}".encode() not in started


def _start(config, options) -> None:
    """The recorder and the server of this process, once (at the first of the two hooks that can)."""
    if config.stash.get(STARTED, False):
        return
    record, bundles = getattr(options, "kforge_record", None), getattr(options, "kforge_bundles", None) or []
    _check_values(record, bundles)
    config.stash[STARTED] = True
    if record:
        from .record import Recorder
        recorder = Recorder(os.path.abspath(record))
        recorder.install()
        config.add_cleanup(recorder.uninstall)
    if bundles:
        from .serve import serve
        config.stash[SERVER] = serve(_library(bundles), strict=False,
                                     verify=bool(getattr(options, "kforge_verify", False)))


def _library(bundles: list[str]):
    from .bundle import BundleError
    from .library import Library
    try:
        return Library(*bundles)
    except BundleError as e:
        raise pytest.UsageError(f"--kforge-bundles: {e}") from None


COUNTS, LISTS = ("served", "compiled", "verified"), ("misses", "differences", "broken")


def _own(server) -> dict:
    return {**{k: getattr(server, k) for k in COUNTS + ("misses", "differences")},
            "broken": [server.broken] if server.broken else []}


def _add(totals: dict, part: dict) -> None:
    for k in COUNTS + LISTS:
        totals[k] += part.get(k, 0) if k in COUNTS else [x for x in part.get(k, []) if x not in totals[k]]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker finished; add what it served."""
    totals = node.config.stash.get(TOTALS, None)
    output = getattr(node, "workeroutput", None) or {}
    if totals is not None and "kforge" in output:
        _add(totals, json.loads(output["kforge"]))


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    totals, server = config.stash.get(TOTALS, None), config.stash.get(SERVER, None)
    if totals is None:
        return
    if hasattr(config, "workeroutput"):   # an xdist worker: the controller judges and reports
        config.workeroutput["kforge"] = json.dumps(_own(server))
        return
    if server is not None:   # not xdist's controller, which holds only its workers' counts
        _add(totals, _own(server))
    failed = (config.getoption("kforge_strict") and (totals["misses"] or totals["broken"])) or \
        (config.getoption("kforge_verify") and (totals["differences"] or totals["broken"]))
    if failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    record, before = config.getoption("kforge_record"), config.stash.get(RECORD_SIZE, None)
    if before is not None and (os.path.getsize(record) if os.path.isfile(record) else 0) == before:
        terminalreporter.write_line(f"kforge: nothing new recorded into {record}: no test compiled a Triton kernel it "
                                    f"did not hold (tests that skip without a GPU record nothing; record on one)")
    totals = config.stash.get(TOTALS, None)
    if totals is None or hasattr(config, "workeroutput"):
        return
    verified = (f", {totals['verified']} verified against Triton's JIT ({len(totals['differences'])} differ)"
                if config.getoption("kforge_verify") else "")
    terminalreporter.write_sep("-", f"kforge: {totals['served']} specializations served, {totals['compiled']} "
                                    f"compiled, {len(totals['misses'])} missing from the bundles{verified}")
    for line in totals["broken"] + totals["differences"]:
        terminalreporter.write_line(line)
    for line in totals["misses"]:
        shown = {k: line[k] for k in ("signature", "constexprs", "divisible_by_16", "options", "autotune")
                 if k in line}
        why = (" (held, but built from other source)" if "source_key" in line else
               " (held, but built under other compiler variables)" if "env" in line else
               " (held twice, as two different binaries)" if "ambiguous" in line else
               f" ({line['unrecordable']})" if "unrecordable" in line else
               f" (held, but {line['unlaunchable']})" if "unlaunchable" in line else
               f" (held, but its binary was refused: {line['refused']})" if "refused" in line else "")
        terminalreporter.write_line(f"missing: {line['kernel']} ({line['arch']}){why} {json.dumps(shown)}")
    if totals["misses"]:
        terminalreporter.write_line("record them (pytest --kforge-record specs/tests.jsonl, or python -m "
                                    "kforge_runtime.record --out specs/app.jsonl app.py), then build (doit) and "
                                    "package (doit package) again")


SERVER = pytest.StashKey()
TOTALS = pytest.StashKey()
RECORD_SIZE = pytest.StashKey()
STARTED = pytest.StashKey()
