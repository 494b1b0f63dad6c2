"""rules/runtime/serve.py on a GPU, the whole loop as a user runs it: an application recorded (KFORGE_RECORD), its
record built (doit), the application run again served from the bundle (KFORGE_SERVE), every output compared bit
for bit with the JIT's. The cases are those tests/runtime/test_serve.py holds on a CPU with the launch stubbed: an
autotuner's pruner deciding per call, reset_to_zero, a module global changed after the first call, a served
kernel's registers, Triton's launch hooks; and a CPU tensor refused as Triton refuses it, pinned memory run."""
import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

from tests.support import doit, statuses  # noqa: E402

KERNELS = '''
import triton
import triton.language as tl

import cases_cfg as cfg   # a module: the one kind of non-constexpr global Triton lets a kernel read


def keep_covering(configs, named_args, **kwargs):   # a tile must cover the row: decided per call
    return [c for c in configs if c.kwargs["BLOCK"] >= named_args["n_cols"]]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=4)],
                 key=["n_cols"], prune_configs_by={"early_config_prune": keep_covering})
@triton.jit
def row_sum(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))


@triton.jit
def scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * cfg.SCALE, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})], key=["n"],
                 reset_to_zero=["out_ptr"])
@triton.jit
def atomic_total(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


@triton.jit
def softmax(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=offs < n_cols)
'''

APP = '''
import sys

import torch
import triton
from triton import knobs

import cases_kernels as K

out, launches = {}, []
knobs.runtime.launch_enter_hook.add(lambda metadata: launches.append(metadata))
g = torch.Generator(device="cuda").manual_seed(0)
for n_cols in (50, 1000):   # the pruner keeps BLOCK 64 for the short row only
    x = torch.randn(8, n_cols, device="cuda", generator=g)
    y = torch.empty(8, device="cuda")
    K.row_sum[(8,)](x, y, n_cols)
    out[f"row_sum_{n_cols}"], out[f"row_sum_{n_cols}_x"] = y, x
x = torch.randn(4096, device="cuda", generator=g)
y = torch.empty_like(x)
K.scaled[(4,)](x, y, 4096, BLOCK=1024)
out["scaled"] = y
K.cfg.SCALE = triton.language.constexpr(3.0)   # after the first call: the next specialization compiles with 3.0
xh = x.half()
out["scaled_3_fp16"], out["scaled_3_fp16_x"] = torch.empty_like(xh), xh
K.scaled[(4,)](xh, out["scaled_3_fp16"], 4096, BLOCK=1024)
x = torch.randn(5000, device="cuda", generator=g)
out["atomic_total"], out["atomic_total_x"] = torch.full((1,), 123.0, device="cuda"), x
K.atomic_total[lambda m: (triton.cdiv(5000, m["BLOCK"]),)](x, out["atomic_total"], 5000)
x = torch.randn(16, 781, device="cuda", generator=g)
out["softmax"] = torch.empty_like(x)
k = K.softmax[(16,)](out["softmax"], x, 781, BLOCK=1024)
out["softmax_x"], out["softmax_regs"] = x, [k.n_regs, k.n_spills, k.n_max_threads]
torch.cuda.synchronize()
out["launch_hook_calls"] = len(launches)
try:   # a CPU tensor: Triton's launcher refuses it, and so must a served launch
    K.softmax[(16,)](torch.empty(16, 781), x.cpu(), 781, BLOCK=1024)
except ValueError as e:
    out["cpu_tensor"] = str(e)
xp = x.cpu().pin_memory()   # pinned host memory, which the GPU reaches: it runs
out["softmax_pinned"] = torch.empty_like(xp).pin_memory()
K.softmax[(16,)](out["softmax_pinned"], xp, 781, BLOCK=1024)
torch.cuda.synchronize()
torch.save({k: (v.cpu() if torch.is_tensor(v) else v) for k, v in out.items()}, sys.argv[1])
'''


def _arch() -> str:
    return {(9, 0): "sm_90a", (8, 0): "sm_80", (10, 0): "sm_100a"}[torch.cuda.get_device_capability()]


def _run(tmp_path, name: str, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "app.py", str(tmp_path / f"{name}.pt")], cwd=tmp_path / "lib",
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "lib"),
                               "TRITON_CACHE_DIR": str(tmp_path / f"triton-{name}"), **env})
    assert proc.returncode == 0, proc.stderr
    return proc


def test_an_application_recorded_built_and_served_computes_what_the_jit_computes(tmp_path):
    lib, project = tmp_path / "lib", tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    lib.mkdir()
    (lib / "cases_kernels.py").write_text(KERNELS)
    (lib / "cases_cfg.py").write_text("import triton.language as tl\n\nSCALE = tl.constexpr(2.0)\n")
    (lib / "app.py").write_text(APP)
    (project / "dodo.py").write_text("from kforge.dodo import *  # noqa\n")
    (project / "pyproject.toml").write_text('[tool.kforge]\ncatalog = ["specs"]\n')
    record = project / "specs" / "app.jsonl"
    _run(tmp_path, "jit", KFORGE_RECORD=str(record))
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    kernels = sorted(line["kernel"].split(":")[1] for line in lines)
    # row_sum once per autotuning key (each its own pick), scaled once per value of cfg.SCALE
    assert kernels == ["atomic_total", "row_sum", "row_sum", "scaled", "scaled", "softmax"]

    build = doit(project, "-n", "4", f"archs={_arch()}", check=False, env={"PYTHONPATH": str(lib)})
    # the specialization compiled after the application changed cfg.SCALE is not the code the build imports:
    # refused at build, so never served; the five others are built and packaged
    failed = statuses(project, "failed")
    assert len(failed) == 1 and next(iter(failed)).startswith("rec_scaled_"), build.stdout + build.stderr
    assert "is none of the code its record lines were recorded from" in build.stdout + build.stderr

    served = _run(tmp_path, "served", KFORGE_SERVE=f"{project / 'out' / 'dist'},report")
    # each specialization the record holds is served but the refused one, which compiles (the autotuner may pick
    # BLOCK 1024 for both rows: then the two row_sum picks are one specialization)
    specializations = {json.dumps({k: v for k, v in line.items() if k != "autotune"}, sort_keys=True) for line in lines}
    counts = re.search(r"(\d+) specializations served, (\d+) compiled", served.stderr)
    assert counts and counts.groups() == (str(len(specializations) - 1), "1"), served.stderr
    jit, ours = torch.load(tmp_path / "jit.pt"), torch.load(tmp_path / "served.pt")
    for name in ("row_sum_50", "row_sum_1000", "scaled", "scaled_3_fp16", "softmax"):
        assert torch.equal(jit[name], ours[name]), name
    # what each computes, not only that the two agree (the pruner's, reset_to_zero's and the global's cases)
    for n_cols in (50, 1000):
        torch.testing.assert_close(ours[f"row_sum_{n_cols}"], ours[f"row_sum_{n_cols}_x"].sum(1))
    assert torch.equal(ours["scaled_3_fp16"], ours["scaled_3_fp16_x"] * 3)
    total = ours["atomic_total_x"].sum().reshape(1)   # 10 partial sums added by atomics in any order: not torch's
    torch.testing.assert_close(ours["atomic_total"], total, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(ours["softmax"], torch.softmax(ours["softmax_x"], dim=1))
    assert ours["softmax_regs"] == jit["softmax_regs"] and ours["softmax_regs"][0] > 0
    assert ours["launch_hook_calls"] == 6   # one per launch the application made, served or compiled
    assert ours["cpu_tensor"] == jit["cpu_tensor"] and "cpu tensor?" in ours["cpu_tensor"]   # refused alike
    assert torch.equal(ours["softmax_pinned"], ours["softmax"])
