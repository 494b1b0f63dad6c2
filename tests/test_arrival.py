"""arrival: the one compile result type, from the compile to the report, and the one installer every source's
candidate passes (its checks on the files themselves are in tests/test_artifact.py; each cache's lookups in
tests/test_local_cache.py and tests/test_remote_cache.py)."""
import json

from kforge import report
from kforge.arrival import CompileResult

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
