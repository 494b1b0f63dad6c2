"""Ranks reaching each other's buffers at every placement this machine allows: all ranks on one GPU, one rank
per GPU (symmetric memory), ranks sharing GPUs spread over several (evenly and not). One small case of the
verify sweep each, in real worker processes. On a 2-GPU host this is the bug where ranks sharing GPUs across
two GPUs died with an illegal address (peer access towards the other GPU was never opened)."""
import json
import sys
from pathlib import Path

import pytest

from kernels.ep import verify
from tests.support import REPO

CASE = "h128-k1-e1-t3"


def placements(found: int) -> list[tuple[int, int]]:
    """(world, gpus): for 1, 2 and every GPU found, each GPU a rank, one rank more than GPUs (uneven) and two
    ranks per GPU."""
    out = []
    for gpus in sorted({1, min(2, found), found} - {0}):
        out += [(world, gpus) for world in sorted({max(2, gpus), gpus + 1, 2 * gpus})]
    return out


def test_placements_of_a_four_gpu_host_cover_one_spread_and_uneven():
    assert placements(4) == [(2, 1), (2, 2), (3, 2), (4, 2), (4, 4), (5, 4), (8, 4)]
    assert placements(1) == [(2, 1)]


def _found() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


@pytest.mark.gpu
@pytest.mark.parametrize("world,gpus", placements(max(_found(), 1)))
def test_one_case_passes_at_every_placement(world, gpus, tmp_path):
    if _found() < gpus:
        pytest.skip(f"needs {gpus} GPU(s)")
    dist = REPO / "out" / "dist"
    code = verify.run_sweep(world, str(tmp_path), case_timeout=120, only=CASE, gpus=gpus,
                            dist_dir=str(dist) if list(dist.glob("*.whl")) else None)
    report = json.loads((tmp_path / "report.json").read_text())
    [case] = report["cases"]
    print(f"world {world} on {gpus} GPU(s), GPU of each rank {report['gpu_of_rank']}: "
          f"{'PASS' if case['ok'] else 'FAIL'} {case.get('error', '')[:300]}", file=sys.stderr)
    assert code == 0 and case["ok"], case
