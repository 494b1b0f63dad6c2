"""`doit tune` end to end on a GPU (pytest -m gpu, on an H100/H200 with doit installed): a tiny family is
built, tuned, re-tuned only when something changed, and a config that computes the wrong thing never wins."""
import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

from tests.support import doit, kernel_text, make_project, spec_text  # noqa: E402

TUNE = '\n[tune]\nharness = "tk/scale_tune.py"\nshape_args = ["n"]\nshapes = [[1000], [4000000]]\n'
HARNESS = '''
import torch


def problem(shape, types, device):
    n = shape["n"]
    x = torch.randn(n, device=device).to(types["dtype"])
    y = torch.empty_like(x)
    return {"args": {"x_ptr": x, "y_ptr": y, "n": n}, "output": y, "reference": lambda: x.float() * FACTOR,
            "atol": 1e-2, "rtol": 1e-2}


def grid(shape, config):
    return (-(-shape["n"] // config["BLOCK"]),)
'''


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return {(9, 0): "sm_90a", (8, 0): "sm_80", (10, 0): "sm_100a"}[(major, minor)]


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path, specs={"scale": spec_text(archs=(arch(),), dtypes=("fp16", "bf16"),
                                                            blocks=(128, 1024)) + TUNE},
                        kernels={"scale": kernel_text(), "scale_tune": HARNESS.replace("FACTOR", "2")})


def test_doit_tune_ranks_every_config_per_shape_and_dtype(project):
    doit(project, "-n", "2")
    out = doit(project, "tune")
    table = json.loads((project / "out" / "tune" / arch() / "scale.json").read_text())
    assert table["format"] == "kforge-tune-1" and table["gpu"]["name"] == torch.cuda.get_device_name()
    # the format rules/runtime/schema.py describes (TUNE_FORMAT) and kforge_runtime.select reads
    assert sorted(table) == sorted(["format", "kernel", "arch", "key", "gpu", "torch", "shape_args", "where_args",
                                    "method", "seconds", "shapes"])
    assert len(table["shapes"]) == 4   # 2 shapes x 2 dtypes
    for s in table["shapes"]:
        assert sorted(s) == ["copies", "ranking", "rejected", "shape", "where"]
        assert all(sorted(r) == ["config_id", "runs", "us"] for r in s["ranking"])
        ids = [r["config_id"] for r in s["ranking"]]
        assert sorted(ids) == sorted(f"{s['where']['dtype']}-b{b}-w4" for b in (128, 1024)), s
        best = s["ranking"][0]["us"]
        assert all(r["us"] > 0 and (r["runs"] >= 7 or r["us"] > 3 * best) for r in s["ranking"]) and not s["rejected"]
        assert [r["us"] for r in s["ranking"]] == sorted(r["us"] for r in s["ranking"])
    assert "built 1" in out.stdout + out.stderr
    again = doit(project, "tune")
    assert "up to date" in again.stdout + again.stderr and "built 1" not in again.stdout + again.stderr
    # package ships it; selection by shape and dtype
    doit(project, "package")
    from kforge_runtime import Bundle
    bundle = Bundle(next((project / "out" / "dist").glob(f"*{arch()}*.whl")))
    entry, why = bundle.find_for_shape("scale", {"n": 3000000}, {"dtype": "bf16"})
    assert entry["config"]["dtype"] == "bf16" and "nearest tuned shape [4000000]" in why


def test_a_config_with_a_wrong_result_never_wins(project):
    (project / "tk" / "scale_tune.py").write_text(HARNESS.replace("FACTOR", "3"))   # the kernel computes 2x
    doit(project, "-n", "2")
    doit(project, "tune")
    table = json.loads((project / "out" / "tune" / arch() / "scale.json").read_text())
    for s in table["shapes"]:
        assert s["ranking"] == [] and len(s["rejected"]) == 2
        assert all(r["why"].startswith("wrong result") for r in s["rejected"])


def test_a_batch_the_cpu_could_not_queue_in_time_is_retried_behind_longer_sleeps():
    """Queueing slows down three times over from one batch to the next (as on a host getting busier): a sleep
    sized only from the last batch's queueing never outlasts the next; the batch is redone behind sleeps that
    grow faster than that, not the tuning failed."""
    import time

    from kforge.tune import gpu_bench as tune_gpu
    x = torch.ones(1 << 16, device="cuda")
    calls = []

    def launch(i):
        calls.append(i)
        batch = (len(calls) - 1) // 5
        if batch < tune_gpu.BATCH_TRIES:
            time.sleep(0.0005 * 3 ** batch)
        x.mul_(1.0)
    times = tune_gpu._timed_batch(launch, 1, 0, 5)
    assert len(times) == 5 and all(t > 0 for t in times)
