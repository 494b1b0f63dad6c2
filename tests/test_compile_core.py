"""compile_core: what a compile result reports, and compile_into writing a (fake) backend's binary into another
project's out/ through a real compile server. check_and_write's refusals are in tests/test_build.py."""
import dataclasses
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import pytest

from kforge.store import artifact
from kforge.compile import core as compile_core
from kforge.report import reporter as report
from kforge.base import stamps
from kforge.base.layout import Layout
from kforge.edge.dodo_tasks import load_specs
from kforge.plan.targets import build_targets
from tests.support import doit, make_project

# --- CompileResult.values -------------------------------------------------------------------------------------


def test_a_plain_compile_result_reports_only_the_fields_that_are_set():
    assert compile_core.CompileResult(1.25, 0.5, "ab" * 32).values() == {
        "seconds": 1.25, "compile_seconds": 0.5, "sha256": "ab" * 32}


def test_a_cache_hit_reports_from_cache_and_its_warnings_as_a_list_and_no_compile_time():
    values = compile_core.CompileResult(0.3, from_cache=True, cache_warnings=("cache down (GET x)", "slow")).values()
    assert values == {"seconds": 0.3, "from_cache": True, "cache_warnings": ["cache down (GET x)", "slow"]}


def test_a_cluster_compile_reports_where_it_ran():
    values = compile_core.CompileResult(2.0, 1.5, "cd" * 32, compiled_on="tcp://10.0.0.7:4001").values()
    assert values["compiled_on"] == "tcp://10.0.0.7:4001"


def test_compile_result_values_are_plain_json_with_what_the_report_reads():
    values = compile_core.CompileResult(2.0, 1.5, "cd" * 32, True, "tcp://w:1", ("w",)).values()
    assert json.loads(json.dumps(values)) == values
    assert set(report.REPORTED_VALUES) - {"from_local_cache"} | {"cache_warnings"} <= set(values)
    assert {k: v for k, v in values.items() if k in report.REPORTED_VALUES} == {
        "from_cache": True, "compiled_on": "tcp://w:1", "compile_seconds": 1.5}
    local = compile_core.CompileResult(0.1, from_local_cache=True).values()   # one cache or the other
    assert local == {"seconds": 0.1, "from_local_cache": True} and report.origin(local) == "local cache"


def test_a_zero_duration_is_a_set_field_and_is_reported():
    assert compile_core.CompileResult(0.0, 0.0, "ab" * 32).values() == {
        "seconds": 0.0, "compile_seconds": 0.0, "sha256": "ab" * 32}


# --- compile_into ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(project, its one sm_90a target, that target's real binary), compiled once by doit."""
    root = make_project(tmp_path_factory.mktemp("compiled"))
    doit(root, "-n", "1")
    [target] = build_targets(load_specs(root), root, None)
    binary = (Path(target.out_dir) / "scale_kernel.cubin").read_bytes()
    return root, target, binary


@pytest.fixture
def fake_backend(monkeypatch, compiled):
    """A backend whose lower() hands back the real binary and records, in meta.json's toolchain fields, the
    target and scratch directory it was given and the process it ran in."""
    _, _, binary = compiled
    fake = types.ModuleType("fake_compile_core_backend")
    fake.ARCH_PER_PROCESS = False
    fake.IMPORT_IN = "worker"
    fake.warm = lambda root: None
    fake.error = None

    def lower(target, scratch):
        if fake.error:
            raise RuntimeError(fake.error)
        return compile_core.Lowered(binary, "scale_kernel.cubin", "scale_kernel", 4, 32, 0, 0.123456,
                                    fields={"seen_out": target.out, "seen_out_dir": target.out_dir,
                                            "seen_scratch": scratch, "seen_scratch_existed": os.path.isdir(scratch),
                                            "seen_tempdir": tempfile.gettempdir(),
                                            "seen_TMPDIR": os.environ.get("TMPDIR"),
                                            "lowered_in": os.getpid()})
    fake.lower = lower
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(compile_core.BACKENDS, "fake", fake.__name__)
    monkeypatch.setattr(compile_core, "_servers", {})
    yield fake
    for server in compile_core._servers.values():
        server.close()


def into(compiled, private_root):
    root, target, _ = compiled
    return compile_core.compile_into(target._replace(toolchain="fake"), private_root, str(root), 60)


def listing(directory: Path) -> dict[str, list | None]:
    return {str(p.relative_to(directory)): stamps.identity(str(p)) for p in sorted(directory.rglob("*"))}


def test_compile_into_writes_the_artifact_into_the_private_projects_out_and_returns_what_it_wrote(
        compiled, fake_backend, tmp_path):
    root, target, binary = compiled
    private = tmp_path / "worker"
    outcome = into(compiled, private)
    assert outcome.ok, outcome.error
    assert dataclasses.replace(outcome.result, spans=()) == compile_core.Written(0.1235, artifact.sha256(binary))
    assert [phase for phase, _, _ in outcome.result.spans] == ["compile", "write"]   # for the build trace
    directory = Layout(private).artifact_dir(target.arch, target.kernel, target.config_id)
    assert directory == private / "out" / "sm_90a" / "scale" / target.config_id
    meta, on_disk = artifact.load(directory)
    assert on_disk == binary and sorted(p.name for p in directory.iterdir()) == ["meta.json", "scale_kernel.cubin"]
    assert meta["key"] == target.key and meta["target"] == target.name and meta["sha256"] == outcome.result.sha256
    assert artifact.is_current(str(directory / "meta.json"), target.key)
    # the backend was handed the private paths, and lowered in the forked compile server
    assert (meta["seen_out"], meta["seen_out_dir"]) == (str(private / "out"), str(directory))
    assert meta["lowered_in"] != os.getpid()


def test_compile_into_leaves_the_projects_own_out_untouched(compiled, fake_backend, tmp_path):
    root, target, _ = compiled
    before = listing(root / "out")
    assert into(compiled, tmp_path / "worker").ok
    assert listing(root / "out") == before


def test_compile_into_gives_the_backend_a_fresh_scratch_directory_and_removes_it_after(compiled, fake_backend,
                                                                                       tmp_path):
    private = tmp_path / "worker"
    into(compiled, private)
    _, target, _ = compiled
    meta = json.loads((Path(Layout(private).artifact_dir(target.arch, target.kernel, target.config_id))
                       / "meta.json").read_text())
    scratch = Path(meta["seen_scratch"])
    assert meta["seen_scratch_existed"] and scratch.is_relative_to(private / "out")
    assert not scratch.exists()


def test_compile_into_puts_the_scratch_directory_in_the_private_projects_kforge_state(compiled, fake_backend,
                                                                                      tmp_path):
    private = tmp_path / "worker"
    into(compiled, private)
    _, target, _ = compiled
    meta = json.loads((Layout(private).artifact_dir(target.arch, target.kernel, target.config_id)
                       / "meta.json").read_text())
    assert Path(meta["seen_scratch"]).parent == Layout(private).scratch
    assert not (private / "out" / "out").exists()


def test_a_backend_error_in_compile_into_fails_and_writes_no_artifact(compiled, fake_backend, tmp_path):
    fake_backend.error = "LLVM ERROR: out of registers"
    private = tmp_path / "worker"
    outcome = into(compiled, private)
    assert not outcome.ok and "out of registers" in outcome.error and outcome.result is None
    _, target, _ = compiled
    assert not Layout(private).artifact_dir(target.arch, target.kernel, target.config_id).exists()


def test_the_compilers_temp_files_go_to_the_compiles_scratch_folder(compiled, fake_backend, tmp_path):
    """Triton and ptxas write temp files (.ptx, .o, .log) where tempfile and TMPDIR say: the compile's own
    scratch folder under out/.kforge/tmp, removed with it, never the system's temp directory."""
    private = tmp_path / "worker"
    into(compiled, private)
    _, target, _ = compiled
    meta = json.loads((Layout(private).artifact_dir(target.arch, target.kernel, target.config_id)
                       / "meta.json").read_text())
    assert meta["seen_tempdir"] == meta["seen_TMPDIR"] == meta["seen_scratch"]
    assert list(Layout(private).scratch.iterdir()) == []
