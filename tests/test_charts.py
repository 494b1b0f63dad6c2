"""rules/charts.py and bench/ep_bandwidth_chart.py: the pictures are produced and open as images."""
import json
import struct
import subprocess
import sys

from kforge import charts
from tests.support import REPO


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def table():
    shapes = []
    for m in (16, 128, 4096):
        ranking = [{"config_id": f"bf16-m{b}", "us": round(10 * (1 + abs(b - m) / 4096), 3), "runs": 5}
                   for b in (16, 64, 128) if not (m == 4096 and b == 16)]   # one config not run for one shape
        shapes.append({"shape": [m, 4096, 4096], "where": {"dtype": "bf16"}, "ranking": sorted(ranking, key=lambda r: r["us"])})
    return {"format": "kforge-tune-1", "kernel": "gemm", "arch": "sm_90a", "shape_args": ["M", "N", "K"], "shapes": shapes}


def test_a_tuning_table_becomes_a_config_by_shape_heatmap(tmp_path):
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(table()))
    assert charts.main([str(path)]) == 0
    width, height = png_size(tmp_path / "gemm.png")
    assert width > 300 and height > 200


def test_a_table_that_is_not_one_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps({"format": "kforge-tune-1", "shape_args": ["M"], "shapes": [{"shape": [0]}]}))
    assert charts.main([str(path)]) == 2
    assert "shapes[0] needs 'shape': 1 positive integers" in capsys.readouterr().err


def test_the_ep_bandwidth_results_become_a_chart(tmp_path):
    out = tmp_path / "bw.png"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "ep_bandwidth_chart.py"),
                           str(REPO / "docs" / "data" / "ep_bandwidth-4xh200-bf16.json"), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert png_size(out)[0] > 500
