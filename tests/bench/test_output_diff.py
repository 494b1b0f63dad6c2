"""bench/output_diff.py (run as zero_jit.py and serve_setup.py use it): a served run's differences are told
apart from a kernel's own nondeterminism. The script runs as __main__ in this process (runpy): a Python start
importing torch per run was most of the file's CPU time."""
import contextlib
import io
import json
import runpy
import sys
from unittest import mock

import pytest
import torch

from tests.support import REPO


def run(grad_bits: float, y_nan: bool = False, **extra) -> dict:
    y = torch.tensor([1.0, float("nan") if y_nan else 2.0])
    return {"group_norm@3": [y, torch.tensor([grad_bits])], "rms_norm@3": [torch.ones(2, dtype=torch.bfloat16)],
            **extra}


def classify(tmp_path, jit: list, served: list) -> tuple[int, dict]:
    paths = {}
    for kind, runs in (("jit", jit), ("served", served)):
        paths[kind] = [str(tmp_path / f"{kind}{i}.pt") for i in range(len(runs))]
        for path, outputs in zip(paths[kind], runs):
            torch.save(outputs, path)
    script = str(REPO / "bench" / "output_diff.py")
    printed = io.StringIO()
    with mock.patch.object(sys, "argv", [script, "--jit", *paths["jit"], "--served", *paths["served"]]), \
            contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    return exited.value.code, json.loads(printed.getvalue())


def test_a_tensor_that_differs_between_two_jit_runs_is_the_kernels_own_nondeterminism(tmp_path):
    jit = [run(0.1), run(0.1 + 1e-7)]   # atomics: the gradient's last bits change from run to run
    assert classify(tmp_path, jit, [run(0.1 + 2e-7), run(0.1)]) == (0, {
        "tensors": 3, "jit_runs": 2, "served_runs": 2, "identical": 2, "kernel_nondeterminism": ["group_norm@3[1]"],
        "serving_differences": []})


def test_a_difference_on_which_every_jit_run_agrees_is_serving_s(tmp_path):
    jit = [run(0.1, y_nan=True), run(0.1, y_nan=True)]   # NaNs compare by their bits
    served = run(0.1, y_nan=True)
    served["rms_norm@3"] = [torch.ones(2, dtype=torch.float16)]   # another dtype, same values
    code, result = classify(tmp_path, jit, [run(0.1, y_nan=True), served, {"group_norm@3": jit[0]["group_norm@3"]}])
    assert code == 1 and result["serving_differences"] == ["rms_norm@3[0]"] and result["identical"] == 2
    code, more = classify(tmp_path, jit, [run(0.1, y_nan=True, extra_op=[torch.zeros(1)])])
    assert code == 1 and more["serving_differences"] == ["extra_op[0]"]


def test_one_jit_run_cannot_tell_them_apart(tmp_path):
    with pytest.raises(ValueError, match="two JIT runs at least"):   # uncaught: the script exits 1 with it
        classify(tmp_path, [run(0.1)], [run(0.1)])
