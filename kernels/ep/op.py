"""EpDispatchCombine: the dispatch/combine op on symmetric memory, Triton kernels, no host sync.

dispatch(x[T,H], topk_idx[T,K] int32, topk_w[T,K] f32 | None) sends each token once to every rank that holds
one of its experts (rank = id // experts_per_rank); every rank receives rows ordered by (source rank,
source token). combine(y) sums, for each of this rank's tokens, the rows its destinations produced for it.
All ranks call both in the same order (also with T = 0). Outputs are views of the op's buffers, valid until
the next call. Receiving more than the capacity drops the tail rows (no write past the buffers) and sets
`overflow`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

from kernels.ep import triton_kernels as tk
from kernels.ep.config import EpConfig
from kernels.ep.routing import destinations, positions

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BLOCK_H = 1024


@dataclass
class Dispatched:
    x: torch.Tensor          # [R, H] rows received; rows past num_recv are unspecified
    topk_idx: torch.Tensor   # [R, K] int32 global expert ids, verbatim
    topk_w: torch.Tensor     # [R, K] f32 (zeros when none were sent)
    src: torch.Tensor        # [R] int32 source_rank * M + source_token
    num_recv: torch.Tensor   # int32 scalar on the device: min(rows sent here, capacity)
    overflow: torch.Tensor   # bool scalar on the device: more rows were sent here than fit
    handle: torch.Tensor     # [T, W] int32: where each of this rank's tokens landed (-1: not sent / dropped)


class EpDispatchCombine:
    def __init__(self, cfg: EpConfig, group=None):
        self.cfg = cfg
        self.group = group or dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if dist.get_world_size(self.group) != cfg.world_size:
            raise ValueError(f"EpConfig.world_size={cfg.world_size}, but the process group has "
                             f"{dist.get_world_size(self.group)} ranks")
        R, H, K, W = cfg.capacity, cfg.hidden, cfg.topk, cfg.world_size
        dtype = DTYPES[cfg.dtype]
        self.recv_x, self._recv_x_table = self._symmetric((R, H), dtype)
        self.recv_idx, self._recv_idx_table = self._symmetric((R, K), torch.int32)
        self.recv_w, self._recv_w_table = self._symmetric((R, K), torch.float32)
        self.recv_src, self._recv_src_table = self._symmetric((R,), torch.int32)
        self.y, self._y_table = self._symmetric((R, H), dtype)
        self.matrix, self._matrix_table = self._symmetric((W, W), torch.int32)
        self.flags, self._flag_table = self._symmetric((W,), torch.int32)
        self.flags.zero_()
        self.epoch = torch.zeros(1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        dist.barrier(group=self.group)   # every rank's flags are zero before anyone signals

    def _symmetric(self, shape, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        buf = symm_mem.empty(*shape, dtype=dtype, device="cuda")
        handle = symm_mem.rendezvous(buf, self.group.group_name)
        return buf, torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")

    def expert_output(self) -> torch.Tensor:
        """[R, H]: write expert outputs here (row i for received row i) and combine(None) copies nothing."""
        return self.y

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor | None = None) -> Dispatched:
        cfg, W = self.cfg, self.cfg.world_size
        T = self._check_inputs(x, topk_idx, topk_w)
        mask = destinations(topk_idx, cfg.experts_per_rank, W)
        counts = mask.sum(0, dtype=torch.int32)
        tk.exchange_counts_kernel[(1,)](counts, self._matrix_table, self._flag_table, self.epoch, self.rank,
                                        W=W, WP=triton_next_pow2(W))
        before_me = self.matrix[:self.rank].sum(0, dtype=torch.int32)   # rows of lower ranks at each dest
        rows = before_me[None, :] + positions(mask)
        handle = torch.where(mask & (rows < cfg.capacity), rows, -1).to(torch.int32)
        if topk_w is None:
            self.recv_w.zero_()
        if T:
            tk.dispatch_kernel[(T,)](x, topk_idx, topk_w if topk_w is not None else x, handle,
                                     self._recv_x_table, self._recv_idx_table, self._recv_w_table,
                                     self._recv_src_table, self.rank, cfg.hidden, cfg.max_tokens_per_rank,
                                     W=W, K=cfg.topk, KP=triton_next_pow2(cfg.topk), HAS_W=topk_w is not None,
                                     BLOCK_H=BLOCK_H, num_warps=4)
        tk.barrier_kernel[(1,)](self._flag_table, self.epoch, self.rank, W=W)
        total = self.matrix[:, self.rank].sum(dtype=torch.int32)
        return Dispatched(self.recv_x, self.recv_idx, self.recv_w, self.recv_src,
                          torch.clamp(total, max=cfg.capacity), total > cfg.capacity, handle)

    def combine(self, y: torch.Tensor | None, handle: torch.Tensor) -> torch.Tensor:
        """out[T, H] for the tokens of the dispatch that returned `handle`; y: [rows, H] expert outputs in
        received-row order, or None when they were written into expert_output()."""
        if y is not None and y.data_ptr() != self.y.data_ptr():
            if y.dim() != 2 or y.shape[1] != self.cfg.hidden or y.shape[0] > self.cfg.capacity or y.dtype != self.y.dtype:
                raise ValueError(f"combine: y must be [<= {self.cfg.capacity}, {self.cfg.hidden}] {self.y.dtype}, "
                                 f"got {list(y.shape)} {y.dtype}")
            self.y[:y.shape[0]].copy_(y)
        T = handle.shape[0]
        out = torch.empty(T, self.cfg.hidden, dtype=self.y.dtype, device="cuda")
        tk.barrier_kernel[(1,)](self._flag_table, self.epoch, self.rank, W=self.cfg.world_size)   # y ready
        if T:
            tk.combine_kernel[(T,)](out, handle, self._y_table, self.cfg.hidden, W=self.cfg.world_size,
                                    BLOCK_H=BLOCK_H, num_warps=4)
        tk.barrier_kernel[(1,)](self._flag_table, self.epoch, self.rank, W=self.cfg.world_size)   # all read
        return out

    def _check_inputs(self, x, topk_idx, topk_w) -> int:
        cfg = self.cfg
        T = x.shape[0] if x.dim() == 2 else -1
        problems = []
        if x.dim() != 2 or x.shape[1] != cfg.hidden or x.dtype != self.recv_x.dtype or not x.is_contiguous():
            problems.append(f"x must be a contiguous [T, {cfg.hidden}] {self.recv_x.dtype} tensor, got "
                            f"{list(x.shape)} {x.dtype}")
        if T > cfg.max_tokens_per_rank:
            problems.append(f"T={T} tokens > max_tokens_per_rank={cfg.max_tokens_per_rank}")
        if topk_idx.shape != (max(T, 0), cfg.topk) or topk_idx.dtype != torch.int32 or not topk_idx.is_contiguous():
            problems.append(f"topk_idx must be a contiguous [{T}, {cfg.topk}] int32 tensor, got "
                            f"{list(topk_idx.shape)} {topk_idx.dtype}")
        if topk_w is not None and (topk_w.shape != topk_idx.shape or topk_w.dtype != torch.float32
                                   or not topk_w.is_contiguous()):
            problems.append(f"topk_w must be a contiguous [{T}, {cfg.topk}] float32 tensor or None")
        if problems:
            raise ValueError("dispatch: " + "; ".join(problems))
        return T


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
