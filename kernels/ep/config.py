"""The static configuration of a dispatch/combine op (named after mori's EpDispatchCombineConfig)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp8_e4m3": 1}
FP8 = "fp8_e4m3"


@dataclass(frozen=True)
class EpConfig:
    world_size: int
    hidden: int                  # H: elements per token row
    experts_per_rank: int        # E: global expert id e lives on rank e // E
    topk: int                    # K: expert ids per token (-1 = none)
    max_tokens_per_rank: int     # M: the most tokens one rank dispatches in a call
    dtype: str = "bf16"          # what dispatch moves; fp8_e4m3 rows travel with block scales
    recv_capacity: int | None = None   # R: rows a rank can receive; default world_size * M
    scale_block: int = 128       # fp8: one f32 scale per this many elements of a row (x_scales [T, H / 128])

    def __post_init__(self):
        for name in ("world_size", "hidden", "experts_per_rank", "topk", "max_tokens_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EpConfig.{name} must be a positive int, got {value!r}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"EpConfig.dtype {self.dtype!r}: allowed {', '.join(ELEMENT_BYTES)}")
        if self.hidden % 16:   # the kernels move rows in 16-byte vectors; their binaries assume it
            raise ValueError(f"EpConfig.hidden={self.hidden} must be a multiple of 16")
        if self.dtype == FP8 and (self.scale_block < 1 or self.hidden % self.scale_block):
            raise ValueError(f"EpConfig.hidden={self.hidden} must be a multiple of scale_block={self.scale_block}")
        if self.recv_capacity is not None and self.recv_capacity < 1:
            raise ValueError(f"EpConfig.recv_capacity must be >= 1, got {self.recv_capacity}")

    @property
    def capacity(self) -> int:
        return self.recv_capacity or self.world_size * self.max_tokens_per_rank

    @property
    def num_experts(self) -> int:
        return self.world_size * self.experts_per_rank

    @property
    def num_scales(self) -> int:
        """f32 scales per dispatched row (fp8), 0 otherwise."""
        return self.hidden // self.scale_block if self.dtype == FP8 else 0

    @property
    def scale_stride(self) -> int:
        """Floats per row of the received-scales buffer: num_scales rounded up to 16 bytes, since the dispatch
        kernel stores scale rows as aligned vectors."""
        return -(-max(self.num_scales, 1) // 4) * 4

    def peer_buffers(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The buffers each rank's peers write into, name -> (shape, element type), in allocation order: the
        one table that the op on GPUs (kernels/ep/op.py) and the CPU simulation (simulate.py) both allocate."""
        R, H, K, W, M = self.capacity, self.hidden, self.topk, self.world_size, self.max_tokens_per_rank
        return {"x": ((R, H), self.dtype), "scales": ((R, self.scale_stride), "f32"), "idx": ((R, K), "i32"),
                "w": ((R, K), "f32"), "src": ((R,), "i32"), "back": ((M, W, H), self.combine_dtype),
                "arrived": ((M, W), "i64"), "matrix": ((W, W), "i64"), "flags": ((W,), "i64")}

    # the peer buffers whose contents a kernel waits on (flags, arrival flags, epoch-tagged counts): they must start
    # zeroed, or a leftover word could pass for a signal of a call still to come (symmetric memory is not cleared)
    POLLED = ("arrived", "matrix", "flags")

    @property
    def combine_dtype(self) -> str:
        """Expert outputs and combine results: bf16 when dispatch moves fp8 (as DeepEP and mori do)."""
        return "bf16" if self.dtype == FP8 else self.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes dispatch moves per row: the elements and, for fp8, their scales."""
        return self.hidden * ELEMENT_BYTES[self.dtype] + 4 * self.num_scales

    @property
    def combine_row_bytes(self) -> int:
        return self.hidden * ELEMENT_BYTES[self.combine_dtype]


def built_worlds() -> set[int]:
    """The world sizes the specs build kernels for (every ep_* family sweeps the same W list): other worlds
    run on Triton's JIT."""
    spec = Path(__file__).resolve().parents[2] / "specs" / "ep_barrier.toml"
    return set(tomllib.loads(spec.read_text())["sweep"]["W"])
