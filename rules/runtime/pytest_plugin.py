"""pytest plugin (installed with kforge): run a test suite with its Triton kernels served from kforge bundles.

    pytest --kforge-bundles out/dist                  # served where the bundles hold the specialization
    pytest --kforge-bundles out/dist --kforge-strict  # CI guard: fail the run, listing every specialization
                                                      # the bundles lack, so none reaches production unbuilt
    pytest --kforge-record specs/tests.jsonl          # record what the suite compiles (kforge_runtime.record)

A miss compiles as usual (the test keeps running, so one run lists every miss); with --kforge-strict the
session then fails, the summary naming each missing kernel and specialization and how to record them.
"""
from __future__ import annotations

import json

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("kforge", "serving Triton kernels from kforge bundles")
    group.addoption("--kforge-bundles", action="append", default=[], metavar="PATH",
                    help="a kforge bundle (wheel or directory) or out/dist; repeatable")
    group.addoption("--kforge-strict", action="store_true",
                    help="fail the session listing every Triton specialization the bundles lack")
    group.addoption("--kforge-record", metavar="FILE",
                    help="append every Triton specialization the suite compiles or loads to FILE (JSON lines)")


def pytest_configure(config):
    bundles = config.getoption("kforge_bundles")
    if config.getoption("kforge_strict") and not bundles:
        raise pytest.UsageError("--kforge-strict needs --kforge-bundles PATH (the bundles to check against)")
    if config.getoption("kforge_record"):
        import os

        from .record import Recorder
        recorder = Recorder(os.path.abspath(config.getoption("kforge_record")))
        recorder.install()
        config.add_cleanup(recorder.uninstall)
    if bundles:
        from .library import Library
        from .serve import serve
        config.stash[SERVER] = serve(Library(*bundles), strict=False)


def pytest_sessionfinish(session, exitstatus):
    server = session.config.stash.get(SERVER, None)
    if server is not None and server.misses and session.config.getoption("kforge_strict"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    server = config.stash.get(SERVER, None)
    if server is None:
        return
    terminalreporter.write_sep("-", f"kforge: {server.served} specializations served, {server.compiled} compiled, "
                                    f"{len(server.misses)} missing from the bundles")
    for line in server.misses:
        shown = {k: line[k] for k in ("signature", "constexprs", "divisible_by_16", "options", "autotune")
                 if k in line}
        terminalreporter.write_line(f"missing: {line['kernel']} ({line['arch']}) {json.dumps(shown)}")
    if server.misses:
        terminalreporter.write_line("record them (pytest --kforge-record specs/tests.jsonl, or python -m "
                                    "kforge_runtime.record --out specs/app.jsonl app.py), then build (doit) and "
                                    "package (doit package) again")


SERVER = pytest.StashKey()
