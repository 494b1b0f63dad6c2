"""The dispatch's routing kernel run on the CPU by Triton's interpreter, against kernels/ep/routing.py.

The interpreter is chosen when Triton is imported (TRITON_INTERPRET=1), so the kernel runs in a child
process. The kernels that reach peers (pointer tables, flags) need GPUs: the verify sweep covers them.
"""
import os
import subprocess
import sys

from tests.support import REPO

ROUTE_CHECK = """
import torch
from kernels.ep import launch, triton_kernels as tk
from kernels.ep.routing import destinations, positions

BLOCK_T = launch.CONSTANTS["ep_route"]["BLOCK_T"]
g = torch.Generator().manual_seed(0)
for T, K, W, E in [(1, 1, 2, 3), (BLOCK_T, 8, 4, 32), (2 * BLOCK_T + 37, 6, 8, 4), (BLOCK_T - 1, 2, 3, 5)]:
    idx = torch.randint(-1, E * W + 2, (T, K), generator=g, dtype=torch.int32)   # -1 and past-the-end ids too
    blocks = -(-T // BLOCK_T)
    pos = torch.full((T, W), -9, dtype=torch.int32)
    counts = torch.full((blocks, W), -9, dtype=torch.int32)
    tk.route_kernel[(blocks,)](idx, pos, counts, T, E, K=K, W=W, BLOCK_T=BLOCK_T)
    mask = destinations(idx, E, W)
    base = torch.zeros(blocks, W, dtype=torch.int32)   # what exchange_counts_kernel adds to each block
    base[1:] = torch.cumsum(counts, 0)[:-1]
    landed = torch.where(pos >= 0, pos + base.repeat_interleave(BLOCK_T, 0)[:T], -1)
    assert torch.equal(landed, torch.where(mask, positions(mask), -1)), (T, K, W, E)
    assert counts.sum(0).tolist() == mask.sum(0).tolist(), (T, K, W, E)
print("ok")
"""


def test_route_kernel_gives_each_token_its_place_per_destination():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", ROUTE_CHECK], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
