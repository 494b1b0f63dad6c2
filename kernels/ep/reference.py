"""The oracle: dispatch and combine in plain PyTorch over torch.distributed.all_to_all_single.

Byte-exact by construction: payloads travel as uint8 views; rows are sent sorted by (destination, token),
so every rank receives them in (source rank, source token) order, the order the op promises.
Works on any backend with all_to_all (NCCL on GPUs, gloo on CPUs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.ep.config import EpConfig
from kernels.ep.routing import destinations


@dataclass
class ReferenceDispatch:
    x: torch.Tensor        # [n, H] the rows kept (n = min(total, capacity))
    topk_idx: torch.Tensor
    topk_w: torch.Tensor
    src: torch.Tensor
    x_scales: torch.Tensor | None   # fp8 rows' block scales, [n, H / scale_block]
    total: int             # rows sent to this rank (before the capacity cut)
    tokens: torch.Tensor   # this rank's sent token ids, in send order (by destination, then token)
    send_splits: list[int]
    recv_splits: list[int]

    @property
    def num_recv(self) -> int:
        return self.x.shape[0]


def _exchange(t: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    width = t.element_size() * math.prod(t.shape[1:])
    rows = t.contiguous().view(torch.uint8).view(t.shape[0], width)
    out = torch.empty(sum(recv), width, dtype=torch.uint8, device=t.device)
    dist.all_to_all_single(out, rows, recv, send, group=group)
    return out.view(t.dtype).view((sum(recv),) + tuple(t.shape[1:]))


def _take(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[index], gathered as bytes: not every backend indexes fp8 tensors directly."""
    return rows.view(torch.uint8)[index].view(rows.dtype) if rows.element_size() == 1 else rows[index]


def dispatch(x, topk_idx, topk_w, cfg: EpConfig, group=None, x_scales=None) -> ReferenceDispatch:
    group = group or dist.group.WORLD
    rank, W = dist.get_rank(group), cfg.world_size
    mask = destinations(topk_idx, cfg.experts_per_rank, W)
    dest, tokens = mask.t().nonzero(as_tuple=True)   # row-major over [W, T]: by destination, then token
    send_counts = mask.sum(0).to(torch.int64)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    weights = topk_w if topk_w is not None else torch.zeros(topk_idx.shape, dtype=torch.float32, device=x.device)
    src = (rank * cfg.max_tokens_per_rank + tokens).to(torch.int32)
    payloads = [_take(x, tokens), topk_idx[tokens], weights[tokens], src]
    if x_scales is not None:
        payloads.append(x_scales[tokens])
    got = [_exchange(t, send, recv, group) for t in payloads]
    n = min(sum(recv), cfg.capacity)
    scales = got[4][:n] if x_scales is not None else None
    return ReferenceDispatch(got[0][:n], got[1][:n], got[2][:n], got[3][:n], scales, sum(recv), tokens, send, recv)


def combine(y: torch.Tensor, ref: ReferenceDispatch, num_tokens: int, cfg: EpConfig, group=None) -> torch.Tensor:
    """y: [ref.num_recv, H], the expert outputs for the kept rows; dropped rows contribute zero."""
    group = group or dist.group.WORLD
    full = torch.zeros(ref.total, cfg.hidden, dtype=y.dtype, device=y.device)
    full[:y.shape[0]] = y
    back = _exchange(full, ref.recv_splits, ref.send_splits, group)   # in this rank's send order
    out = torch.zeros(num_tokens, cfg.hidden, dtype=torch.float64, device=y.device)
    out.index_add_(0, ref.tokens.to(y.device), back.double())
    return out.to(y.dtype)
