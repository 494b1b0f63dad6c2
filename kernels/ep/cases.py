"""The verify sweep's case matrix and each case's inputs (the same on every machine for a seed)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernels.ep.config import EpConfig

ROUTINGS = ("random", "same_rank", "sentinels", "local", "remote", "all_to_one", "spread", "hot_rank")


@dataclass(frozen=True)
class Case:
    name: str
    hidden: int = 4096
    topk: int = 8
    experts_per_rank: int = 8
    max_tokens: int = 128
    tokens: int | str = 128          # per rank: an int, or "mixed" (random in [0, M], some ranks at 0)
    routing: str = "random"
    weights: bool = True
    capacity: str = "default"        # "default" W*M | "exact" (the rows that arrive) | "small" (overflow)
    iterations: int = 3              # eager calls back to back with fresh routing, checked afterwards
    graph: bool = False              # capture one dispatch+combine, replay with new contents
    interleaved: bool = False        # two op instances, calls interleaved
    strict: bool = False             # small-integer values: combine must be byte-exact
    dtype: str = "bf16"              # or "fp8_e4m3": rows quantized per 128-element block, scales sent along
    seed: int = 0

    def config(self, world: int, capacity: int | None = None) -> EpConfig:
        return EpConfig(world_size=world, hidden=self.hidden, experts_per_rank=self.experts_per_rank,
                        topk=self.topk, max_tokens_per_rank=self.max_tokens, recv_capacity=capacity,
                        dtype=self.dtype)


def matrix(world: int) -> list[Case]:
    """The sweep for `world` ranks: every axis of the notes' matrix, each case small enough to run in seconds."""
    base = Case("base")
    cases = [
        replace(base, name="bf16-h4096-k8-e8-t128-random"),
        replace(base, name="h128-k1-e1-t3", hidden=128, topk=1, experts_per_rank=1, tokens=3),
        replace(base, name="h7168-k8-e32-t128", hidden=7168, experts_per_rank=32),
        replace(base, name="k2-e8-t1", topk=2, tokens=1),
        replace(base, name="t0-everywhere", tokens=0, max_tokens=16),
        replace(base, name="mixed-tokens-some-ranks-0", tokens="mixed", max_tokens=256),
        replace(base, name="t4096-h7168-k8-e32", hidden=7168, experts_per_rank=32, tokens=4096, max_tokens=4096,
                iterations=2),
        replace(base, name="no-weights", weights=False),
        replace(base, name="strict-identity-byte-exact", strict=True, hidden=256),
        replace(base, name="capacity-exact", capacity="exact"),
        replace(base, name="capacity-too-small-overflow", capacity="small"),
        replace(base, name="five-back-to-back", iterations=5, tokens="mixed"),
        replace(base, name="cuda-graph-replay", graph=True, hidden=1024),
        replace(base, name="fp8-e4m3-block-scales-h7168-e32", dtype="fp8_e4m3", hidden=7168, experts_per_rank=32),
        replace(base, name="fp8-mixed-tokens-sentinels", dtype="fp8_e4m3", hidden=1024, tokens="mixed",
                routing="sentinels"),
        replace(base, name="fp8-cuda-graph-replay", dtype="fp8_e4m3", graph=True, hidden=1024),
        replace(base, name="two-ops-interleaved", interleaved=True, hidden=1024),
    ]
    cases += [replace(base, name=f"routing-{r}", routing=r, hidden=1024, tokens="mixed")
              for r in ROUTINGS if r != "random" and not (r == "remote" and world < 2)]
    return [replace(c, seed=i) for i, c in enumerate(cases)]


def tokens_on(case: Case, rank: int, world: int, iteration: int = 0) -> int:
    if isinstance(case.tokens, int):
        return min(case.tokens, case.max_tokens)
    g = torch.Generator().manual_seed(case.seed * 1000 + iteration)
    counts = torch.randint(0, case.max_tokens + 1, (world,), generator=g)
    counts[torch.randperm(world, generator=g)[: max(1, world // 4)]] = 0   # some ranks send nothing
    return int(counts[rank])


def inputs(case: Case, cfg: EpConfig, rank: int, iteration: int = 0, device="cpu"):
    """(x [T, H], topk_idx [T, K] int32, topk_w [T, K] f32 | None) for this rank and iteration."""
    W, E, K = cfg.world_size, cfg.experts_per_rank, cfg.topk
    T = tokens_on(case, rank, W, iteration)
    g = torch.Generator().manual_seed(((case.seed * 131 + iteration) * 8191 + rank) % 2**62)
    if case.strict:
        x = torch.randint(-4, 5, (T, cfg.hidden), generator=g).to(torch.bfloat16)
    else:
        x = torch.randn(T, cfg.hidden, generator=g).to(torch.bfloat16)
    idx = routing(case.routing, T, K, E, W, rank, g)
    w = torch.rand(T, K, generator=g) if case.weights else None
    return x.to(device), idx.to(device), (w.to(device) if w is not None else None)


def quantize_fp8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (e4m3 rows, f32 scales [T, H / block]): each block scaled so its largest value maps to 448."""
    T, H = x.shape
    blocks = x.float().reshape(T, H // block, block)
    scales = (blocks.abs().amax(-1) / 448.0).clamp(min=1e-12)
    rows = (blocks / scales[..., None]).reshape(T, H).to(torch.float8_e4m3fn)
    return rows.contiguous(), scales.contiguous()


def dequantize_fp8(rows: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """f32 [T, H] from e4m3 rows and their block scales."""
    T, H = rows.shape
    n = scales.shape[1]
    # shapes spelled out: with -1, no rows (a rank that received none) would be an ambiguous reshape
    return (rows.float().reshape(T, n, H // n) * scales[..., None]).reshape(T, H)


def routing(mode: str, T: int, K: int, E: int, W: int, rank: int, g: torch.Generator) -> torch.Tensor:
    n = E * W
    if mode in ("random", "sentinels"):
        idx = torch.stack([torch.randperm(n, generator=g)[:K] for _ in range(T)]) if T else torch.empty(0, K)
        if K > n:
            idx = torch.randint(0, n, (T, K), generator=g)
        if mode == "sentinels" and T:
            idx[torch.rand(T, K, generator=g) < 0.3] = -1
            idx[:: 5] = -1   # whole rows with no expert
    elif mode == "same_rank":   # several of a token's experts on one rank: it must still go there once
        ranks = torch.randint(0, W, (T, 1), generator=g).expand(T, K)
        idx = ranks * E + torch.randint(0, E, (T, K), generator=g)
    elif mode == "local":
        idx = rank * E + torch.randint(0, E, (T, K), generator=g)
    elif mode == "remote":
        other = (rank + 1 + torch.randint(0, W - 1, (T, K), generator=g)) % W
        idx = other * E + torch.randint(0, E, (T, K), generator=g)
    elif mode == "all_to_one":
        idx = torch.randint(0, E, (T, K), generator=g)
    elif mode == "spread":
        t = torch.arange(T)[:, None]
        k = torch.arange(K)[None, :]
        idx = ((t + k) % W) * E + (k % E)
    elif mode == "hot_rank":
        hot = torch.rand(T, K, generator=g) < 0.8
        idx = torch.where(hot, (W - 1) * E + torch.randint(0, E, (T, K), generator=g),
                          torch.randint(0, n, (T, K), generator=g))
    else:
        raise ValueError(f"unknown routing {mode!r}; known: {', '.join(ROUTINGS)}")
    return idx.to(torch.int32).reshape(T, K).contiguous()
