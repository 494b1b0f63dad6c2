"""bench/build_tail.py: a build's head, middle and tail, read from a trace as kforge writes it."""
import json
from types import SimpleNamespace

from bench.build_tail import main, tail
from kforge.report.reporter import Trace


def _result(spans, worker):
    return SimpleNamespace(spans=spans, worker=worker, from_cache=False, from_local_cache=False)


def _trace(tmp_path):
    t = Trace(started=1000.0)
    t.run_phase("load", 1000.0, 1001.0)
    for worker, first in ((11, 1005.0), (12, 1006.0)):   # both wait for an import, then compile one short target
        spans = [("wait", first - 4, first), ("compile", first, first + 0.5)]
        t.target(f"short{worker}@sm_90a", "f", first - 4, first + 0.6, _result(spans, worker))
    # one long compile on worker 11, started last: the tail
    t.target("long@sm_90a", "g", 1006.0, 1016.1, _result([("compile", 1006.0, 1016.0)], 11))
    t.task("package", "package:sm_90a", "package", 1016.2, 1019.2)
    path = tmp_path / "build-trace.json"
    t.write(path)
    return path


def test_the_long_target_and_the_package_are_the_tail(tmp_path, capsys):
    found = tail(json.loads(_trace(tmp_path).read_text()))
    assert found["workers"] == 2 and found["load_end_s"] == 1.0
    assert found["first_compile_s"] == [5.0, 6.0]
    assert found["worker_done_s"] == {"median": 11.35, "last": 16.1}
    assert found["longest_target"] == {"name": "long@sm_90a", "compile_s": 10.0, "started_s": 6.0}
    assert found["packages"] == [{"task": "package:sm_90a", "start_s": 16.2, "seconds": 3.0}]
    assert found["wall_s"] == 19.2
    assert main([str(tmp_path / "build-trace.json")]) == 0 and '"longest_target"' in capsys.readouterr().out
    assert main([]) == 2
