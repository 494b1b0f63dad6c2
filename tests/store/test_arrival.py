"""arrival: the one compile result type, from the compile to the report, and the one installer every source's
candidate passes (its checks on the files themselves are in tests/store/test_artifact.py; each cache's lookups in
tests/share/test_local_cache.py and tests/share/test_remote_cache.py)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kforge.store import arrival, artifact
from kforge.report import reporter as report
from kforge.store.arrival import CompileResult
from kforge.base.layout import Layout
from tests.support import REPO

# --- CompileResult.values -------------------------------------------------------------------------------------


def test_a_plain_compile_result_reports_only_the_fields_that_are_set():
    assert CompileResult(1.25, 0.5, "ab" * 32).values() == {
        "seconds": 1.25, "compile_seconds": 0.5, "sha256": "ab" * 32}


def test_a_cache_hit_reports_from_cache_and_its_warnings_as_a_list_and_no_compile_time():
    values = CompileResult(0.3, from_cache=True, cache_warnings=("cache down (GET x)", "slow")).values()
    assert values == {"seconds": 0.3, "from_cache": True, "cache_warnings": ["cache down (GET x)", "slow"]}


def test_a_cluster_compile_reports_where_it_ran():
    values = CompileResult(2.0, 1.5, "cd" * 32, compiled_on="tcp://10.0.0.7:4001").values()
    assert values["compiled_on"] == "tcp://10.0.0.7:4001"


def test_compile_result_values_are_plain_json_with_what_the_report_reads():
    values = CompileResult(2.0, 1.5, "cd" * 32, True, "tcp://w:1", ("w",)).values()
    assert json.loads(json.dumps(values)) == values
    assert set(report.REPORTED_VALUES) - {"from_local_cache"} | {"cache_warnings"} <= set(values)
    assert {k: v for k, v in values.items() if k in report.REPORTED_VALUES} == {
        "from_cache": True, "compiled_on": "tcp://w:1", "compile_seconds": 1.5}
    local = CompileResult(0.1, from_local_cache=True).values()   # one cache or the other
    assert local == {"seconds": 0.1, "from_local_cache": True} and CompileResult.of(local).origin == "local cache"


def test_a_zero_duration_is_a_set_field_and_is_reported():
    assert CompileResult(0.0, 0.0, "ab" * 32).values() == {
        "seconds": 0.0, "compile_seconds": 0.0, "sha256": "ab" * 32}


def test_a_result_read_back_from_its_values_is_the_same_result():
    result = CompileResult(2.0, 1.5, "cd" * 32, False, "tcp://w:1", ("w",), (("compile", 1.0, 2.0),), 7)
    assert CompileResult.of(json.loads(json.dumps(result.values()))) == result
    assert CompileResult.of({"name": "package:sm_90a", "seconds": 1.0}) == CompileResult(1.0)   # a package's values
    assert [CompileResult(1.0, from_cache=True).origin, CompileResult(1.0).origin] == ["remote cache", "compiled"]
    assert CompileResult(1.0, unchanged=True).origin == "unchanged"   # early cutoff
    assert set(report.ORIGINS) == {"compiled", "local cache", "remote cache", "unchanged"}


# --- arrive / install: one installer for every source ---------------------------------------------------------

class FakeSource:
    """A cache offering what it was given: the interface compile/action.py drives every cache through."""

    def __init__(self, offer=None, unreadable=None):
        self.offer, self.unreadable, self.calls = offer, unreadable, []

    def lookup(self, target):
        self.calls.append("lookup")
        if self.unreadable:
            raise ValueError(self.unreadable)
        return self.offer

    def refused(self, target, error):
        self.calls.append("refused")
        return [f"refused: {error}"]

    def took(self, target):
        self.calls.append("took")


def target_for(built, tmp_path, arch="sm_90a"):
    """The scale target of `built` for `arch`, with its artifact directory under tmp_path's out/."""
    meta = json.loads((built / "out" / arch / "scale" / "fp16-b256-w4" / "meta.json").read_text())
    layout = Layout(tmp_path)
    return SimpleNamespace(name=meta["target"], kernel="scale", config_id="fp16-b256-w4", arch=arch,
                           key=meta["key"], config=tuple(meta["config"].items()), layout=layout,
                           out_dir=layout.artifact_path(arch, "scale", "fp16-b256-w4"),
                           meta_path=layout.meta_path(arch, "scale", "fp16-b256-w4"))


def test_a_miss_is_quiet_and_writes_nothing(built, tmp_path):
    source = FakeSource()
    assert arrival.arrive(target_for(built, tmp_path), source) == (None, []) and source.calls == ["lookup"]
    assert not (tmp_path / "out").exists()


def test_an_offered_artifact_is_installed_as_a_build_writes_it(built, tmp_path):
    target = target_for(built, tmp_path)
    built_dir = built / "out/sm_90a/scale/fp16-b256-w4"
    candidate = arrival.Candidate(artifact.files_of(built_dir), CompileResult(from_cache=True))
    source = FakeSource(candidate)
    assert arrival.arrive(target, source) == (candidate, []) and source.calls == ["lookup", "took"]
    assert artifact.is_current(target.meta_path, target.key)
    for name in ("meta.json", "scale_kernel.cubin"):   # byte for byte what the build wrote
        assert (Path(target.out_dir) / name).read_bytes() == (built_dir / name).read_bytes()


@pytest.mark.parametrize("real", ["gfx942", "sm_80"])
def test_another_archs_artifact_offered_for_this_target_is_refused_by_the_installer_whatever_the_source(
        built, tmp_path, real):
    """A cache entry holding another arch's build (its meta.json even rewritten for this target, sealed again)
    never passes as built: the installer checks the binary for the TARGET's arch."""
    target = target_for(built, tmp_path)
    files = artifact.files_of(built / "out" / real / "scale" / "fp16-b256-w4")
    meta = json.loads(files["meta.json"])
    meta.update(target=target.name, arch=target.arch, key=target.key)
    meta["seal"] = artifact.seal({k: v for k, v in meta.items() if k != "seal"})
    files["meta.json"] = json.dumps(meta).encode()
    source = FakeSource(arrival.Candidate(files))
    hit, [warning] = arrival.arrive(target, source)
    assert hit is None and source.calls == ["lookup", "refused"]
    assert warning.startswith("refused: its binary is refused: ") and f"{real}, expected sm_90a" in warning
    assert not (tmp_path / "out").exists()


def test_an_unreadable_entry_is_a_miss_with_the_sources_warning(built, tmp_path):
    source = FakeSource(unreadable="its header is unreadable")
    assert arrival.arrive(target_for(built, tmp_path), source) == (None, ["refused: its header is unreadable"])
    assert not (tmp_path / "out").exists()


def test_only_the_installer_writes_an_artifact():
    """Every source's artifact goes through arrival.install (the checks, then artifact.write): no other module
    of kforge calls artifact.write, nor writes meta.json itself."""
    import ast
    rules = REPO / "rules"
    callers = set()
    for path in rules.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "write"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "artifact"):
                callers.add(path.relative_to(rules).as_posix())
    assert callers == {"store/arrival.py"}
