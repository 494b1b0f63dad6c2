"""bench/output_diff.py: a served run's differences are told apart from a kernel's own nondeterminism."""
import pytest
import torch

from bench.output_diff import classify


def run(grad_bits: float, y_nan: bool = False, **extra) -> dict:
    y = torch.tensor([1.0, float("nan") if y_nan else 2.0])
    return {"group_norm@3": [y, torch.tensor([grad_bits])], "rms_norm@3": [torch.ones(2, dtype=torch.bfloat16)],
            **extra}


def test_a_tensor_that_differs_between_two_jit_runs_is_the_kernels_own_nondeterminism():
    jit = [run(0.1), run(0.1 + 1e-7)]   # atomics: the gradient's last bits change from run to run
    result = classify(jit, [run(0.1 + 2e-7), run(0.1)])
    assert result == {"tensors": 3, "jit_runs": 2, "served_runs": 2, "identical": 2,
                      "kernel_nondeterminism": ["group_norm@3[1]"], "serving_differences": []}


def test_a_difference_on_which_every_jit_run_agrees_is_serving_s():
    jit = [run(0.1, y_nan=True), run(0.1, y_nan=True)]   # NaNs compare by their bits
    served = run(0.1, y_nan=True)
    served["rms_norm@3"] = [torch.ones(2, dtype=torch.float16)]   # another dtype, same values
    result = classify(jit, [run(0.1, y_nan=True), served, {"group_norm@3": jit[0]["group_norm@3"]}])
    assert result["serving_differences"] == ["rms_norm@3[0]"] and result["identical"] == 2
    more = classify(jit, [run(0.1, y_nan=True, extra_op=[torch.zeros(1)])])
    assert more["serving_differences"] == ["extra_op[0]"]


def test_one_jit_run_cannot_tell_them_apart():
    with pytest.raises(ValueError, match="two JIT runs at least"):
        classify([run(0.1)], [run(0.1)])
