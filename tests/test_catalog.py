"""The repository's whole catalog (Triton and FlyDSL, default archs) builds green from a clean out/."""
import json
import shutil

from tests.support import REPO, doit, make_project


def test_the_whole_catalog_builds(tmp_path):
    root = make_project(tmp_path / "catalog", specs={}, kernels={})
    shutil.rmtree(root / "specs")
    for name in ("specs", "kernels"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    doit(root, "-n", "2", timeout=3600)
    report = json.loads((root / "out" / "build-report.json").read_text())
    assert report["counts"]["failed"] == 0
    families = {t["name"].split(":")[0] for t in report["tasks"]}
    assert {"gemm", "rmsnorm", "softmax", "moe_gemm", "fly_gemm", "fly_fp8_gemm", "fly_rmsnorm",
            "fly_softmax"} <= families
    assert report["counts"]["built"] == len(report["tasks"]) > 900
