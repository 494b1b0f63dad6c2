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


def table(dtypes=("bf16",)):
    shapes = []
    for dtype in dtypes:
        for m in (16, 128, 4096):
            ranking = [{"config_id": f"{dtype}-m{b}", "us": round(10 * (1 + abs(b - m) / 4096), 3), "runs": 5}
                       for b in (16, 64, 128) if not (m == 4096 and b == 16)]   # one config not run for one shape
            shapes.append({"shape": [m, 4096, 4096], "where": {"dtype": dtype},
                           "ranking": sorted(ranking, key=lambda r: r["us"])})
    return {"format": "kforge-tune-1", "kernel": "gemm", "arch": "sm_90a", "shape_args": ["M", "N", "K"], "shapes": shapes}


def test_a_tuning_table_becomes_a_config_by_shape_heatmap(tmp_path):
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(table()))
    assert charts.main([str(path)]) == 0
    width, height = png_size(tmp_path / "gemm.png")
    assert width > 300 and height > 200


def test_each_where_value_is_its_own_grid_over_its_own_configs(tmp_path, capsys):
    groups = charts.by_where(table(("bf16", "fp16"))["shapes"])
    assert list(groups) == ["dtype=bf16", "dtype=fp16"]
    configs, labels, grid = charts.heat_grid(groups["dtype=fp16"])
    assert labels == ["16x4096x4096", "128x4096x4096", "4096x4096x4096"]
    assert configs[0] == "fp16-m128" and set(configs) == {"fp16-m16", "fp16-m64", "fp16-m128"}   # best on average first
    best = [min(row[s] for row in grid) for s in range(3)]
    assert best == [1.0, 1.0, 1.0]
    assert grid[configs.index("fp16-m16")][2] != grid[configs.index("fp16-m16")][2]   # NaN: not timed there
    rejected = table()["shapes"][:1]
    rejected[0]["ranking"] = []   # every config rejected on this shape: an empty column, not an error
    configs, labels, grid = charts.heat_grid(rejected + groups["dtype=bf16"][1:])
    assert len(labels) == 3 and grid and all(row[0] != row[0] for row in grid)   # NaN column
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(table(("bf16", "fp16"))))
    assert charts.main([str(path), "-o", str(tmp_path / "both.png")]) == 0
    assert charts.main([str(path), "-o", str(tmp_path / "fp16.png"), "--where", "dtype=fp16"]) == 0
    assert png_size(tmp_path / "both.png")[0] > png_size(tmp_path / "fp16.png")[0]   # two panels, then one
    capsys.readouterr()
    assert charts.main([str(path), "--where", "dtype=fp8"]) == 2
    assert "no shapes with where 'dtype=fp8'; the table has: 'dtype=bf16', 'dtype=fp16'" in capsys.readouterr().err


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
