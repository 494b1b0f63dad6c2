"""The verify sweep's driver on CPU: too few GPUs, the watchdog turning a hang into a failed case and
restarting after it, verdicts and metrics in report.json / report.md, and the exit code."""
import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

from kernels.ep import verify
from kernels.ep.cases import Case

FAKE_WORKER = textwrap.dedent('''
    import json, sys, time
    rank, start, out, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    def put(name, record):
        with open(f"{out}/progress/{name}", "a") as f:
            f.write(json.dumps(record) + "\\n")
    for i in range(start, n):
        put(f"rank{rank}.jsonl", {"case": i, "stage": "start"})
        if i == 2 and rank == 1:
            time.sleep(120)                       # a hang inside case 2, on rank 1 only
        put(f"rank{rank}.jsonl", {"case": i, "stage": "verdict"})
        if rank == 0:
            time.sleep(0.2)
            put("results.jsonl", {"index": i, "case": f"c{i}", "ok": i != 4, "max_diff": 0.0, "error": "",
                                  "ranks": [{"ok": True, "max_diff": 0.0}, {"ok": i != 4, "max_diff": 0.0}],
                                  "note": "", "metrics": {"dispatch_us": 10.0, "combine_us": 5.0,
                                  "dispatch_logical_gbs": 1.0, "dispatch_remote_gbs": 0.5,
                                  "combine_logical_gbs": 2.0, "combine_remote_gbs": 1.0}})
''')


def fake_launch(world, start, out, only, dist_dir, gpus):
    return [subprocess.Popen([sys.executable, "-c", FAKE_WORKER, str(r), str(start), str(out), "6"])
            for r in range(world)]


def test_a_hang_fails_its_case_names_the_ranks_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "_gpu_count", lambda: 2)
    monkeypatch.setattr(verify, "matrix", lambda world: [Case(f"c{i}") for i in range(6)])
    monkeypatch.setattr(verify, "_launch", fake_launch)
    code = verify.run_sweep(None, str(tmp_path), case_timeout=3)
    assert code == 1
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {c["case"]: c["ok"] for c in report["cases"]}
    assert verdicts == {"c0": True, "c1": True, "c2": False, "c3": True, "c4": False, "c5": True}
    hang = report["cases"][2]["error"]
    assert "hang" in hang and "rank 1 at case 2 start" in hang and "rank 0 at case" in hang
    md = (tmp_path / "report.md").read_text()
    assert "| c2 | FAIL |" in md and "| c3 | PASS |" in md and "10.0" in md
    assert "4/6 cases passed; FAILED: c2, c4" in capsys.readouterr().out
    page = ET.parse(tmp_path / "report.html").getroot()   # well-formed: an XML parser reads it
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    rows = {r.find("h:th", ns).text: [td.text for td in r.findall("h:td", ns)]
            for r in page.iter("{http://www.w3.org/1999/xhtml}tr") if r.find("h:th", ns) is not None
            and r.find("h:td", ns) is not None}
    assert rows["c4"][:3] == ["FAIL", "PASS", "FAIL"]   # the case, then rank 0 and rank 1
    assert rows["c2"][:3] == ["FAIL", "-", "-"]         # the hang: no rank reported a verdict
    assert "4/6 cases passed" in page.find("h:body/h:h1", ns).text


def test_no_gpu_or_one_rank_is_a_clear_message_and_exit_code_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "_gpu_count", lambda: 0)
    assert verify.run_sweep(None, str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "found 0 GPU(s) and world=0: it needs a GPU and world >= 2" in err and "kernels.ep.simulate" in err
    monkeypatch.setattr(verify, "_gpu_count", lambda: 1)
    assert verify.run_sweep(None, str(tmp_path)) == 2   # one GPU, no world given: one rank
    assert not (tmp_path / "report.json").exists()


def test_more_ranks_than_gpus_share_them_round_robin_and_report_no_times(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "_gpu_count", lambda: 2)
    monkeypatch.setattr(verify, "matrix", lambda world: [Case(f"c{i}") for i in range(6)])
    monkeypatch.setattr(verify, "_launch", fake_launch)
    verify.run_sweep(5, str(tmp_path), case_timeout=3)
    assert "5 ranks on 2 GPU(s), round-robin ([3, 2] ranks per GPU)" in capsys.readouterr().err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ranks_per_gpu"] == [3, 2] and report["gpu_of_rank"] == [0, 1, 0, 1, 0]
    md = (tmp_path / "report.md").read_text()
    assert "Ranks share GPUs: [3, 2] ranks per GPU" in md and "| case | verdict | max diff | case seconds |" in md


def test_metrics_take_the_slowest_rank_and_average_bandwidth():
    per_rank = [{"dispatch_us": 10.0, "combine_us": 4.0, "dispatch_logical_bytes": 1e4, "dispatch_remote_bytes": 5e3,
                 "combine_logical_bytes": 1e4, "combine_remote_bytes": 5e3},
                {"dispatch_us": 20.0, "combine_us": 2.0, "dispatch_logical_bytes": 4e4, "dispatch_remote_bytes": 0.0,
                 "combine_logical_bytes": 4e4, "combine_remote_bytes": 0.0}, {}]
    m = verify._merge(per_rank)
    assert m["dispatch_us"] == 20.0 and m["combine_us"] == 4.0
    assert m["dispatch_logical_gbs"] == (1e4 / 1e4 + 4e4 / 2e4) / 2


def test_gpus_picks_the_first_g_gpus_and_an_impossible_count_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "_gpu_count", lambda: 2)
    monkeypatch.setattr(verify, "matrix", lambda world: [Case(f"c{i}") for i in range(6)])
    launched = []
    monkeypatch.setattr(verify, "_launch", lambda *a: launched.append(a) or fake_launch(*a))
    verify.run_sweep(3, str(tmp_path), case_timeout=3, gpus=1)   # all three ranks on GPU 0
    assert launched[0][0] == 3 and launched[0][-1] == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gpus"] == 1 and report["gpu_of_rank"] == [0, 0, 0] and report["ranks_per_gpu"] == [3]
    assert verify.run_sweep(2, str(tmp_path), gpus=3) == 2
    assert "gpus=3, but this machine has 2 GPU(s): choose gpus=1..2" in capsys.readouterr().err


def test_placement_is_round_robin_and_uneven_when_gpus_do_not_divide_the_world():
    from kernels.ep.placement import placement, ranks_per_gpu
    assert [placement(r, 2) for r in range(3)] == [0, 1, 0]
    assert ranks_per_gpu(3, 2) == [2, 1] and ranks_per_gpu(6, 4) == [2, 2, 1, 1] and ranks_per_gpu(2, 4) == [1, 1]
