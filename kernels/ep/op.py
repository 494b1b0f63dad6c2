"""EpDispatchCombine: the dispatch/combine op on symmetric memory (CUDA IPC when ranks share GPUs, on one GPU or
several: kernels/ep/transport.py), Triton kernels, no host sync.

dispatch(x[T,H], topk_idx[T,K] int32, topk_w[T,K] f32 | None, x_scales[T,H/128] f32 for fp8) sends each
token once to every rank that holds one of its experts (rank = id // experts_per_rank); every rank receives
rows ordered by (source rank, source token). combine(y, handle) pushes each received row's expert output back
to its source rank, where each token's rows are summed (bf16 when dispatch moved fp8); it takes the handle of
this op's latest dispatch.
All ranks call both in the same order (also with T = 0). Outputs are views of the op's buffers, valid until
the next call. close() (called by every rank) before the op is dropped. Receiving more than the capacity
drops the tail rows (no write past the buffers) and sets `overflow`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.ep.config import FP8, EpConfig
from kernels.ep.launch import CONSTANTS, EpKernels
from kernels.ep.transport import ipc_buffer, shares_a_gpu, symmetric_buffer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, FP8: torch.float8_e4m3fn, "f32": torch.float32,
          "i32": torch.int32, "i64": torch.int64}
KERNEL_DTYPES = {"bf16": "bf16", "fp16": "fp16", FP8: "u8"}   # the specs' dtype names: fp8 rows move as bytes


def wire(x: torch.Tensor) -> torch.Tensor:
    """What the dispatch kernel is given for rows x: 1-byte (fp8) rows as their bytes, the rest as they are."""
    return x.view(torch.uint8) if x.element_size() == 1 else x


def dispatch_sources(x, topk_idx, topk_w, x_scales, handle, pos, own: dict) -> tuple:
    """dispatch_kernel's (x, topk_idx, topk_w, x_scales, handle) arguments for one rank. A missing topk_w or x_scales
    is replaced by this rank's own receive buffer of it (own: its "x", "idx", "w" and "scales" buffers), which the
    kernel then never reads. At T = 0 the kernel still runs (this rank's zero counts go out, its receive side is
    set) but reads no token, so every source is an own buffer and the handle is pos: never an empty tensor's
    pointer, which may be null."""
    if x.shape[0]:
        return (wire(x), topk_idx, own["w"] if topk_w is None else topk_w,
                own["scales"] if x_scales is None else x_scales, handle)
    return wire(own["x"]), own["idx"], own["w"], own["scales"], pos


@dataclass
class Dispatched:
    x: torch.Tensor          # [R, H] rows received; rows past num_recv are unspecified
    topk_idx: torch.Tensor   # [R, K] int32 global expert ids, verbatim
    topk_w: torch.Tensor     # [R, K] f32 (zeros when none were sent)
    src: torch.Tensor        # [R] int32 source_rank * M + source_token
    x_scales: torch.Tensor | None   # [R, H / scale_block] f32 for fp8 rows (a strided view), else None
    num_recv: torch.Tensor   # int32 scalar on the device: min(rows sent here, capacity) (the op's buffer)
    overflow: torch.Tensor   # bool scalar on the device: more rows were sent here than fit (the op's buffer)
    handle: torch.Tensor     # [T, W] int32: where each of this rank's tokens landed (-1: not sent / dropped)


class EpDispatchCombine:
    """library: a kforge_runtime.Library (e.g. Library("out/dist")) to run the precompiled kernels from; None
    runs them through Triton's JIT. jit_fallback: with a library, JIT what it lacks instead of failing.
    shared_gpu: whether ranks share GPUs (then buffers go through CUDA IPC, not symmetric memory); None: ask
    the group (one all_gather_object)."""

    def __init__(self, cfg: EpConfig, group=None, library=None, jit_fallback: bool = False,
                 shared_gpu: bool | None = None):
        self.cfg = cfg
        self.kernels = EpKernels(library, jit_fallback)
        self.group = group or dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if dist.get_world_size(self.group) != cfg.world_size:
            raise ValueError(f"EpConfig.world_size={cfg.world_size}, but the process group has "
                             f"{dist.get_world_size(self.group)} ranks")
        # ranks that share a GPU: symmetric memory refuses them, so every buffer goes through IPC (transport.py)
        self.shared_gpu = shares_a_gpu(self.group) if shared_gpu is None else shared_gpu
        buffers = {name: self._symmetric(shape, DTYPES[kind]) for name, (shape, kind) in cfg.peer_buffers().items()}
        self.recv_x, self._recv_x_table = buffers["x"]
        self.recv_scales, self._recv_scale_table = buffers["scales"]
        self.recv_idx, self._recv_idx_table = buffers["idx"]
        self.recv_w, self._recv_w_table = buffers["w"]
        self.recv_src, self._recv_src_table = buffers["src"]
        self._back, self._back_table = buffers["back"]
        self._arrived, self._arrived_table = buffers["arrived"]
        self.matrix, self._matrix_table = buffers["matrix"]
        self.flags, self._flag_table = buffers["flags"]
        for name in cfg.POLLED:
            buffers[name][0].zero_()
        # expert outputs stay on this rank: combine pushes them to the peers, no peer reads them
        self.y = torch.empty(cfg.capacity, cfg.hidden, dtype=DTYPES[cfg.combine_dtype], device="cuda")
        self._handle = None   # the latest dispatch's handle: the only one combine can serve
        self._combined = False   # a combine since the latest dispatch: the next one waits for the peers first
        self.epoch = torch.zeros(1, dtype=torch.int64, device="cuda")   # never wraps: 2^63 barriers
        self.num_recv = torch.zeros((), dtype=torch.int32, device="cuda")
        self.overflow = torch.zeros((), dtype=torch.uint8, device="cuda")
        self.recv_start = torch.zeros(cfg.world_size + 1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        dist.barrier(group=self.group)   # every rank's polled buffers are zero before anyone signals

    def _symmetric(self, shape, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shared_gpu:
            return ipc_buffer(shape, dtype, self.group, self.rank, self.cfg.world_size, owner=self)
        return symmetric_buffer(shape, dtype, self.group)

    def close(self) -> None:
        """Before the op's buffers go (collectively, like every call): waits until every rank is done with them."""
        self.barrier()

    def expert_output(self) -> torch.Tensor:
        """[R, H]: a place for expert outputs (row i for received row i): combine(None, handle) reads them here."""
        return self.y

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor | None = None,
                 x_scales: torch.Tensor | None = None) -> Dispatched:
        cfg, W = self.cfg, self.cfg.world_size
        T = self._check_inputs(x, topk_idx, topk_w, x_scales)
        block_t = CONSTANTS["ep_route"]["BLOCK_T"]
        blocks = -(-T // block_t)
        # one row at T = 0, where pos also stands in for the empty handle (dispatch_sources)
        pos = torch.empty(max(T, 1), W, dtype=torch.int32, device="cuda")
        block_counts = torch.empty(max(blocks, 1), W, dtype=torch.int32, device="cuda")
        handle = torch.empty(T, W, dtype=torch.int32, device="cuda")
        if topk_w is None:   # before the route: the chain of dispatch's kernels stays unbroken
            self.recv_w.zero_()
        if T:
            self.kernels("ep_route", {"W": W, "K": cfg.topk}, (blocks,), topk_idx, pos, block_counts, T,
                         cfg.experts_per_rank)
        fp8 = x_scales is not None
        config = {"dtype": KERNEL_DTYPES[cfg.dtype], "W": W, "K": cfg.topk, "HAS_W": topk_w is not None,
                  "HAS_SCALES": fp8}
        own = {"x": self.recv_x, "idx": self.recv_idx, "w": self.recv_w, "scales": self.recv_scales}
        x_, idx_, w_, scales_, handle_ = dispatch_sources(x, topk_idx, topk_w, x_scales, handle, pos, own)
        self.kernels("ep_dispatch", config, (max(T, 1), self._chunks("ep_dispatch")), x_, idx_, w_, scales_,
                     pos, block_counts, blocks, self._matrix_table, self.epoch, self.num_recv, self.overflow,
                     self.recv_start, handle_, self._recv_x_table, self._recv_idx_table,
                     self._recv_w_table, self._recv_scale_table, self._recv_src_table, self.rank, T, cfg.hidden,
                     cfg.max_tokens_per_rank, cfg.capacity, cfg.num_scales, cfg.scale_stride, 3)
        self._combined = False   # every rank's counts of this call came: each had finished its last combine
        self.kernels("ep_dispatch_done", {"W": W}, (1,), self._flag_table, self.epoch, self.rank)
        self._handle = handle
        scales = self.recv_scales[:, :cfg.num_scales] if cfg.num_scales else None
        return Dispatched(self.recv_x, self.recv_idx, self.recv_w, self.recv_src, scales, self.num_recv,
                          self.overflow.view(torch.bool), handle)

    def combine(self, y: torch.Tensor | None, handle: torch.Tensor) -> torch.Tensor:
        """out[T, H] for the tokens of this op's latest dispatch, which returned `handle`; y: [rows, H] expert
        outputs in received-row order (rows past y's end count as zeros), or None for expert_output()."""
        cfg = self.cfg
        if handle is not self._handle:
            raise ValueError("combine: `handle` is not from this op's latest dispatch; combine serves only that one "
                             "(its peers push back the rows of their latest dispatch)")
        y = self.y if y is None else y
        if y.dim() != 2 or y.shape[1] != cfg.hidden or y.shape[0] > cfg.capacity or y.dtype != self.y.dtype \
                or not y.is_contiguous() or y.device != self.y.device:
            raise ValueError(f"combine: y must be a contiguous [<= {cfg.capacity}, {cfg.hidden}] {self.y.dtype} "
                             f"tensor on {self.y.device}, got {list(y.shape)} {y.dtype} on {y.device}")
        if self._combined:   # a second combine of one dispatch: peers may still be summing what the first pushed
            self.barrier()
        T, W = handle.shape[0], cfg.world_size
        out = torch.empty(T, cfg.hidden, dtype=self.y.dtype, device="cuda")
        constants = CONSTANTS["ep_combine"]
        groups = -(-cfg.max_tokens_per_rank // constants["QB"]) + constants["LAG"]
        # one launch, no barrier: the peers' buffers it writes were freed by the barrier of the dispatch before
        self.kernels("ep_combine", {"dtype": KERNEL_DTYPES[cfg.combine_dtype], "W": W},
                     (groups * 2 * constants["QB"],), out, y, y.shape[0], handle, self.recv_src,
                     self.recv_start, self._back_table, self._arrived_table, self.epoch, self.rank, T, cfg.hidden,
                     cfg.max_tokens_per_rank, cfg.capacity, 3)
        self._combined = True
        return out

    def _chunks(self, family: str) -> int:
        """Programs per row: the kernels move BLOCK_H elements of a row each."""
        return -(-self.cfg.hidden // CONSTANTS[family]["BLOCK_H"])

    def barrier(self) -> None:
        """A device-side barrier of the group on the current stream (no host sync): e.g. to line the ranks'
        streams up before timing a call."""
        self.kernels("ep_barrier", {"W": self.cfg.world_size}, (1,), self._flag_table, self.epoch, self.rank)

    def _check_inputs(self, x, topk_idx, topk_w, x_scales) -> int:
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
        if cfg.num_scales and (x_scales is None or x_scales.shape != (max(T, 0), cfg.num_scales)
                               or x_scales.dtype != torch.float32 or not x_scales.is_contiguous()):
            problems.append(f"{cfg.dtype} rows need x_scales: a contiguous [{T}, {cfg.num_scales}] float32 tensor "
                            f"(one scale per {cfg.scale_block} elements)")
        if not cfg.num_scales and x_scales is not None:
            problems.append(f"x_scales are for fp8 rows; this op moves {cfg.dtype}")
        if problems:
            raise ValueError("dispatch: " + "; ".join(problems))
        return T
