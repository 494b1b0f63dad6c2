"""Where each token goes, in plain torch ops (no host sync): the reference and the case matrix use it; the op
computes the same on the GPU (route_kernel per block of tokens, dispatch_kernel adding up the blocks before),
which the verify sweep checks against it and tests/kernels/ep/test_triton_kernels.py checks on the CPU."""
from __future__ import annotations

import torch


def destinations(topk_idx: torch.Tensor, experts_per_rank: int, world_size: int) -> torch.Tensor:
    """mask[T, W]: token t goes to rank d (once, however many of its experts live there). Ids < 0 or past
    the last expert are dropped."""
    valid = (topk_idx >= 0) & (topk_idx < experts_per_rank * world_size)
    dest = torch.where(valid, topk_idx // experts_per_rank, world_size).long()   # column W: the dropped
    onehot = torch.zeros(topk_idx.shape[0], world_size + 1, dtype=torch.bool, device=topk_idx.device)
    onehot.scatter_(1, dest, True)
    return onehot[:, :world_size]


def positions(mask: torch.Tensor) -> torch.Tensor:
    """pos[t, d]: how many earlier tokens of this rank go to d (int32): the (source token) order."""
    m = mask.to(torch.int32)
    return (torch.cumsum(m, 0, dtype=torch.int32) - m)
