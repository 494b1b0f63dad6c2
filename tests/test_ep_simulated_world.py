"""kernels/ep/simulate.py: the verify sweep's whole case matrix at world 8 and 16 on the CPU (Triton's
interpreter, simulated ranks, the GPU sweep's oracle), and planted bugs that it must catch.

The interpreter is chosen when Triton is imported, so each sweep runs in a child process.
"""
import os
import subprocess
import sys

import pytest

from tests.support import REPO

KERNELS = REPO / "kernels" / "ep" / "triton_kernels.py"

# (what the bug does, the line of kernels/ep/triton_kernels.py it changes, the change)
BUGS = {
    "rank >= 4 sends its rows to the next rank": (
        "tl.store(_peer(recv_x_table, d, x_ptr.dtype.element_ty) + row * H + hs, v, mask=hs < H)",
        "tl.store(_peer(recv_x_table, (d + (rank >= 4)) % W, x_ptr.dtype.element_ty) + row * H + hs, v, "
        "mask=hs < H)"),
    "the eighth source's rows are dropped": (
        "return tl.where((pos >= 0) & (row < R), row, -1).to(tl.int64)",
        "return tl.where((pos >= 0) & (row < R) & (rank != 7), row, -1).to(tl.int64)"),
}

PLANTED = """
import importlib.util, sys
from kernels.ep import simulate
from kernels.ep.cases import matrix
spec = importlib.util.spec_from_file_location("planted_kernels", sys.argv[1])
tk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tk)
for world in (4, 8):
    for case in [c for c in matrix(world) if c.name in ("routing-all_to_one", "bf16-h4096-k8-e8-t128-random")]:
        print(world, case.name, simulate.run_case(case, world, tk)["ok"])
"""


def _run(args, timeout):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("world", [8, 16])
def test_the_whole_case_matrix_passes_with_simulated_ranks(world):
    done = _run(["-m", "kernels.ep.simulate", "--world", str(world)], timeout=1800)
    assert done.returncode == 0 and done.stdout.strip().endswith("0 failed"), done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(f"world {world:>2}  ok") >= 20   # the matrix ran, case by case


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_fails_the_world_8_sweep(bug, tmp_path):
    """Each bug hides below world 8 (a rank >= 4 exists from world 5, an eighth source from world 8): the
    world-4 runs pass, the world-8 ones fail."""
    line, planted = BUGS[bug]
    source = KERNELS.read_text()
    assert source.count(line) == 1, f"the line the bug changes is gone from {KERNELS}: update BUGS"
    mutated = tmp_path / "planted_kernels.py"
    mutated.write_text(source.replace(line, planted))
    done = _run(["-c", PLANTED, str(mutated)], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = {tuple(row.split()[:2]): row.split()[2] == "True" for row in done.stdout.splitlines()}
    assert all(ok for (world, _), ok in verdicts.items() if world == "4"), verdicts
    assert not all(ok for (world, _), ok in verdicts.items() if world == "8"), verdicts
