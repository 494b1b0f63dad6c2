"""rules/report/reporter.py's Trace and rules/timeline.py: a build writes out/build-trace.json (Chrome trace events,
one row per worker, each target's phases), and kforge renders it as an SVG picture."""
import json
import xml.etree.ElementTree as ET

from kforge import timeline
from tests.support import doit, make_project, spec_text

REQUIRED = {"name", "ph", "ts", "dur", "pid", "tid", "cat", "args"}


def test_a_build_writes_a_trace_of_every_target_and_a_no_op_keeps_it(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": spec_text(dtypes=("fp16", "bf16"), blocks=(128, 256))})
    doit(root, "-n", "2")
    path = root / "out" / "build-trace.json"
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert slices and all(REQUIRED <= set(e) and e["dur"] > 0 and e["ts"] >= 0 for e in slices)
    compiled = {e["name"] for e in slices if e["cat"] == "compile"}
    assert len(compiled) == 4 and all(n.startswith("scale:") for n in compiled)
    assert {e["cat"] for e in slices} >= {"compile", "write", "package"}
    rows = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(name.startswith("worker ") for name in rows.values()) and "package" in rows.values()
    for name in compiled:   # on one row, a target's phases follow each other
        mine = sorted((e for e in slices if e["name"] == name), key=lambda e: e["ts"])
        assert len({e["tid"] for e in mine}) == 1
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1000 for a, b in zip(mine, mine[1:]))
    before = path.read_bytes()
    doit(root, "-n", "2")   # nothing to do: the last build's timeline stays
    assert path.read_bytes() == before


def test_the_timeline_renders_as_svg_with_a_bar_per_slice(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128, 256))})
    doit(root)
    trace = root / "out" / "build-trace.json"
    assert timeline.main([str(trace)]) == 0
    svg = ET.parse(root / "out" / "build-timeline.svg").getroot()
    bars = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.find("{http://www.w3.org/2000/svg}title")
            is not None]
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(bars) == len(slices) and any("scale" in t.text for t in svg.iter("{http://www.w3.org/2000/svg}text"))


def test_a_missing_or_foreign_trace_is_one_clear_error(tmp_path, capsys):
    assert timeline.main([str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "x"}]}))
    assert timeline.main([str(tmp_path / "other.json")]) == 2
    assert "is not a trace kforge wrote" in capsys.readouterr().err
