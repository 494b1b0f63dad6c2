"""kernels/ep/simulate.py: the verify sweep's case matrix at world 8 and 16 on the CPU (Triton's interpreter,
simulated ranks, the GPU sweep's oracle), a case a test, and planted bugs that it must catch.

By default (CI) a representative part of the matrix runs at each world, DEFAULT below: 9 cases at world 8 and 3 at
world 16, 12 of the 48 (the whole matrix was most of the suite's CPU time). Why they cover the rest:
- the simulation is arch-neutral (Triton's interpreter), so there is no per-arch path to cover;
- what the kernels specialize on is W, K, HAS_W and HAS_SCALES (constexprs; BLOCK_H and BLOCK_T are fixed):
  at world 8 every K of the matrix (8, 1, 2), without weights, and fp8 with scales; at world 16 K 8 and 1 and
  fp8 with scales. Without weights runs at world 8 only: W sets only the bounds of the loops over ranks, and the
  HAS_W branch takes the same code at any W;
- what the kernels' data paths do differently: mixed token counts with ranks at 0 and -1 sentinels
  (fp8-mixed-tokens-sentinels), no tokens anywhere (t0-everywhere at 16; at 8 the command-line test runs it),
  several of a token's experts on one rank (routing-same_rank; random routing at K 8 hits it too), an exact and
  a too-small receive capacity (the overflow flag), and byte-exact combine (strict), these at world 8;
- the cases left out differ from those by what the simulation shrinks away or does not model (H 4096 / 7168
  and 4096 tokens become H 64 and 8 tokens, a CUDA graph runs eagerly, two interleaved ops run as one), by
  the experts per rank (a runtime value), by iterations (capped at 2) or by a routing, which is the input only.
The whole matrix, either way: `pytest tests/kernels/ep/test_simulate.py --simulate-all` (a case a test) or
`python -m kernels.ep.simulate` (world 8 and 16, one process).

The interpreter is chosen when Triton is imported, so the cases run in a child process: one a pytest worker
(`simulate --serve`), which keeps Python, torch and Triton imported from one case to the next.
"""
import json
import os
import select
import subprocess
import sys

import pytest

from kernels.ep.cases import matrix
from tests.support import REPO

KERNELS = REPO / "kernels" / "ep" / "triton_kernels.py"
WORLDS = (8, 16)
# the cases each world runs without --simulate-all (the module's docstring says why these)
DEFAULT = {
    8: ("bf16-h4096-k8-e8-t128-random", "h128-k1-e1-t3", "k2-e8-t1", "no-weights", "strict-identity-byte-exact",
        "capacity-exact", "capacity-too-small-overflow", "fp8-mixed-tokens-sentinels", "routing-same_rank"),
    16: ("t0-everywhere", "h128-k1-e1-t3", "fp8-mixed-tokens-sentinels"),
}

# (what the bug does, the line of kernels/ep/triton_kernels.py it changes, the change)
BUGS = {
    "rank >= 4 sends its rows to the next rank": (
        "bases = tl.multiple_of(tl.load(recv_x_table + ds, mask=live, other=0).to(tl.pointer_type(ty)), 16)",
        "bases = tl.multiple_of(tl.load(recv_x_table + (ds + (rank >= 4).to(tl.int32)) % W, mask=live, other=0)"
        ".to(tl.pointer_type(ty)), 16)"),
    "the eighth source's rows are dropped": (
        "rows = _landing_row(pos, lower + earlier, R)",
        "rows = _landing_row(tl.where(rank != 7, pos, -1), lower + earlier, R)"),
}
PLANTED_CASES = ("routing-all_to_one", "bf16-h4096-k8-e8-t128-random")


def _env():
    return dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))


class Simulator:
    """`python -m kernels.ep.simulate --serve` in a child, started at the first case and again after a crash."""

    def __init__(self):
        self.child = None

    def run(self, world: int, case: str, kernels=None, timeout: float = 600) -> dict:
        if self.child is None or self.child.poll() is not None:
            self.child = subprocess.Popen([sys.executable, "-m", "kernels.ep.simulate", "--serve"], cwd=REPO,
                                          env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.child.stdin.write(json.dumps({"world": world, "case": case, "kernels": kernels and str(kernels)}) + "\n")
        self.child.stdin.flush()
        if not select.select([self.child.stdout], [], [], timeout)[0]:
            self.close()
            pytest.fail(f"simulate --serve: no answer in {timeout} s for world {world} case {case} (a hang?)")
        answer = self.child.stdout.readline()
        assert answer, f"simulate --serve exited with {self.child.wait()} during world {world} case {case}"
        return json.loads(answer)

    def close(self):
        if self.child is not None:
            self.child.stdin.close()
            try:
                self.child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
            self.child = None


@pytest.fixture(scope="session")
def simulator():
    sim = Simulator()
    yield sim
    sim.close()


@pytest.mark.parametrize("world,case", [pytest.param(w, c.name, marks=() if c.name in DEFAULT[w] else
                                                       pytest.mark.simulate_all)
                                        for w in WORLDS for c in matrix(w)], ids=lambda v: str(v))
def test_each_case_of_the_matrix_passes_with_simulated_ranks(simulator, world, case):
    """A case marked simulate_all runs with --simulate-all only (tests/conftest.py)."""
    result = simulator.run(world, case)
    assert result["ok"], result


@pytest.mark.parametrize("world", WORLDS)
def test_the_default_cases_are_cases_of_the_matrix(world):
    """A renamed case cannot drop out of the default run unseen."""
    names = {c.name for c in matrix(world)}
    assert set(DEFAULT[world]) <= names, set(DEFAULT[world]) - names


@pytest.mark.parametrize("world", WORLDS)
def test_the_matrix_is_whole(world):
    """Every axis of the sweep is a case above (the parametrization cannot shrink unseen)."""
    assert len(matrix(world)) >= 24, [c.name for c in matrix(world)]


def test_the_command_line_runs_a_case_and_says_how_many_failed():
    """`python -m kernels.ep.simulate` (no TRITON_INTERPRET: it sets it and starts again)."""
    env = {k: v for k, v in _env().items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "kernels.ep.simulate", "--world", "8", "--only", "t0-everywhere"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("world  8  ok") == 1 and "\n0 failed" in done.stdout, done.stdout


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_fails_the_world_8_sweep(simulator, bug, tmp_path):
    """Each bug hides below world 8 (a rank >= 4 exists from world 5, an eighth source from world 8): a case
    that fails at world 8 passes at world 4."""
    line, planted = BUGS[bug]
    source = KERNELS.read_text()
    assert source.count(line) == 1, f"the line the bug changes is gone from {KERNELS}: update BUGS"
    mutated = tmp_path / "planted_kernels.py"
    mutated.write_text(source.replace(line, planted))
    # the first case that fails at world 8, then the same case at world 4, where the bug cannot show: it passes
    caught = next((case for case in PLANTED_CASES if not simulator.run(8, case, mutated)["ok"]), None)
    assert caught is not None, f"no case of {PLANTED_CASES} fails at world 8 with the bug planted"
    at_4 = simulator.run(4, caught, mutated)
    assert at_4["ok"], at_4


def test_the_interpreter_patches_take_and_change_no_result():
    """simulate.interpreter_patches() replaces Triton 3.6 internals by name: if Triton moves them, this fails
    rather than the patches silently doing nothing (or something else)."""
    done = subprocess.run([sys.executable, "-c", PATCHES], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr[-3000:]


PATCHES = """
import inspect
import triton.language as tl
from triton.language.semantic import TritonSemantic
from triton.runtime import interpreter as I
from kernels.ep import simulate
from kernels.ep.cases import matrix

np_dtype, calls = I._get_np_dtype, {"patch": 0, "launch": 0}
patch, launch = I._patch_lang, I.GridExecutor.__call__
def counted_patch(fn):
    calls["patch"] += 1
    return patch(fn)
def counted_launch(self, *a, **k):
    calls["launch"] += 1
    return launch(self, *a, **k)
I._patch_lang, I.GridExecutor.__call__ = counted_patch, counted_launch
simulate.interpreter_patches()
assert I._patch_lang is not counted_patch and I._get_np_dtype is not np_dtype
# the overflow check is dropped only where its verdict went nowhere
assert not I.interpreter_builder.options.sanitize_overflow and not I.interpreter_builder.options.debug
assert "if not self.builder.options.debug:\\n            return" in inspect.getsource(TritonSemantic.device_assert)
types = [tl.int1, tl.int8, tl.uint8, tl.int32, tl.int64, tl.float16, tl.bfloat16, tl.float32, tl.float8e4nv]
types += [tl.pointer_type(t) for t in types] + [tl.block_type(t, [4, 2]) for t in types]
assert all(I._get_np_dtype(t) == np_dtype(t) for t in types)
# 1 token a rank: dispatch calls its helpers; the language is patched once a launch (twice where a
# reduction's module names triton.language.core), not once a helper call
assert simulate.run_case(next(c for c in matrix(4) if c.name == "k2-e8-t1"), 4)["ok"]
assert calls["launch"] >= 24 and calls["patch"] <= 2 * calls["launch"], calls
print("ok")
"""
