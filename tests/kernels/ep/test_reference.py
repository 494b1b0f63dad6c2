"""The all_to_all_single reference on CPU (gloo, 3 processes) against a brute-force expectation computed
from every rank's seeded inputs: order, -1 ids, T = 0 ranks, capacity cut, combine sums."""
import json
import os
import socket
import time
from dataclasses import replace

import pytest
import torch

from kernels.ep import cases
from kernels.ep.config import EpConfig

WORLD = 3
CASES = [replace(cases.Case("t"), name=n, seed=i, **{"hidden": 32, **kw}) for i, (n, kw) in enumerate([
    ("random", {}), ("sentinels-mixed", {"routing": "sentinels", "tokens": "mixed"}),
    ("k1-e1-no-weights", {"topk": 1, "experts_per_rank": 1, "weights": False, "tokens": 5}),
    ("same-rank", {"routing": "same_rank", "tokens": "mixed"}), ("all-to-one", {"routing": "all_to_one"}),
    ("overflow", {"capacity": "small"}),
    ("fp8-block-scales", {"dtype": "fp8_e4m3", "hidden": 256, "routing": "sentinels", "tokens": "mixed"})])]


def feed(case, cfg, rank):
    """The case's inputs; fp8 cases quantize the rows per block and send the scales along."""
    x, idx, w = cases.inputs(case, cfg, rank)
    if cfg.num_scales:
        x, scales = cases.quantize_fp8(x, cfg.scale_block)
        return x, idx, w, scales
    return x, idx, w, None


def expert(rows, scales, d):
    values = cases.dequantize_fp8(rows, scales) if scales is not None else rows.float()
    return (values * (d + 1)).to(torch.bfloat16)


def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def cfg_for(case):
    cfg = case.config(WORLD)
    if case.capacity == "small":
        cfg = case.config(WORLD, 40)
    return cfg


def expected(case, cfg, rank):
    feeds = [feed(case, cfg, s) for s in range(WORLD)]
    dests = lambda idx: [sorted({int(i) // cfg.experts_per_rank for i in row if 0 <= i < cfg.num_experts})
                         for row in idx.tolist()]
    arrived = {d: [] for d in range(WORLD)}   # per destination, in (source rank, source token) order
    for s, (x, idx, w, _) in enumerate(feeds):
        for t, ds in enumerate(dests(idx)):
            for d in ds:
                arrived[d].append((s, t))
    kept = {d: set(arrived[d][:cfg.capacity]) for d in arrived}
    x, idx, w, scales = feeds[rank]
    out = torch.zeros(x.shape[0], cfg.hidden, dtype=torch.float64)
    for t, ds in enumerate(dests(idx)):
        for d in ds:
            if (rank, t) in kept[d]:
                out[t] += expert(x[t:t + 1], None if scales is None else scales[t:t + 1], d)[0].double()
    mine = arrived[rank][:cfg.capacity]
    rows = torch.cat([feeds[s][0][t:t + 1] for s, t in mine]) if mine else x[:0]
    row_scales = (torch.cat([feeds[s][3][t:t + 1] for s, t in mine]) if mine else scales[:0]) \
        if scales is not None else None
    src = [s * cfg.max_tokens_per_rank + t for s, t in mine]
    return rows, row_scales, src, len(arrived[rank]), out.to(torch.bfloat16)


def run_rank(rank, port, result_dir):
    import torch.distributed as dist
    from kernels.ep import reference
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    verdicts = {}
    for case in CASES:
        cfg = cfg_for(case)
        x, idx, w, scales = feed(case, cfg, rank)
        ref = reference.dispatch(x, idx, w, cfg, x_scales=scales)
        out = reference.combine(expert(ref.x, ref.x_scales, rank), ref, x.shape[0], cfg)
        rows, row_scales, src, total, want = expected(case, cfg, rank)
        scales_ok = ref.x_scales is None if scales is None else same_bytes(ref.x_scales, row_scales)
        verdicts[case.name] = {"rows": same_bytes(ref.x, rows) and scales_ok, "src": ref.src.tolist() == src,
                               "total": ref.total == total, "combine": torch.equal(out, want),
                               "n": ref.num_recv, "arrived": ref.total, "T": x.shape[0]}
    (result_dir / f"rank{rank}.json").write_text(json.dumps(verdicts))
    dist.destroy_process_group()


def test_reference_matches_brute_force_on_three_cpu_ranks(tmp_path):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # not forked from pytest (threads, earlier tests' state can deadlock gloo's start-up): from a fresh Python,
    # the forkserver, which imports torch and this module once for the three ranks (spawn imported them per rank)
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    ctx = mp.start_processes(run_rank, args=(port, tmp_path), nprocs=WORLD, start_method="forkserver", join=False)
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 3-rank gloo reference run hung for 180 s")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, verdicts in enumerate(results):
        for name, v in verdicts.items():
            assert v["rows"] and v["src"] and v["total"] and v["combine"], (r, name, v)
    assert any(v["T"] == 0 for res in results for v in res.values())        # a rank with no tokens ran
    assert any(res["overflow"]["arrived"] > res["overflow"]["n"] == 40 for res in results)   # the cut happened


def test_config_rejects_bad_values_with_the_key():
    with pytest.raises(ValueError, match="hidden=12 must be a multiple of 16"):
        EpConfig(world_size=2, hidden=12, experts_per_rank=1, topk=1, max_tokens_per_rank=1)
    with pytest.raises(ValueError, match="EpConfig.world_size must be a positive int"):
        EpConfig(world_size=0, hidden=64, experts_per_rank=1, topk=1, max_tokens_per_rank=1)
    with pytest.raises(ValueError, match="EpConfig.dtype 'fp8'"):
        EpConfig(world_size=2, hidden=64, experts_per_rank=1, topk=1, max_tokens_per_rank=1, dtype="fp8")
    with pytest.raises(ValueError, match="hidden=64 must be a multiple of scale_block=128"):
        EpConfig(world_size=2, hidden=64, experts_per_rank=1, topk=1, max_tokens_per_rank=1, dtype="fp8_e4m3")
    fp8 = EpConfig(world_size=2, hidden=256, experts_per_rank=1, topk=1, max_tokens_per_rank=1, dtype="fp8_e4m3")
    assert (fp8.num_scales, fp8.row_bytes, fp8.combine_dtype, fp8.combine_row_bytes) == (2, 256 + 8, "bf16", 512)
    assert EpConfig(world_size=4, hidden=64, experts_per_rank=2, topk=1, max_tokens_per_rank=8).capacity == 32


def test_peer_buffers_are_one_table_with_16_byte_scale_rows():
    fp8 = EpConfig(world_size=4, hidden=640, experts_per_rank=1, topk=2, max_tokens_per_rank=3, dtype="fp8_e4m3",
                   scale_block=128)
    assert (fp8.num_scales, fp8.scale_stride) == (5, 8)     # 5 floats padded to 8 (32 bytes)
    table = fp8.peer_buffers()
    assert list(table) == ["x", "scales", "idx", "w", "src", "back", "arrived", "matrix", "flags"]   # allocation order
    assert set(fp8.POLLED) <= set(table)   # what the op zeroes before the first call
    assert table["x"] == ((12, 640), "fp8_e4m3") and table["back"] == ((3, 4, 640), "bf16")   # [M, W, H], combined
    assert table["arrived"] == ((3, 4), "i64") and table["flags"] == ((4,), "i64")   # int64 epochs: no wrap
    assert table["scales"] == ((12, 8), "f32") and table["matrix"] == ((4, 4), "i64")
    bf16 = EpConfig(world_size=2, hidden=64, experts_per_rank=1, topk=1, max_tokens_per_rank=1)
    assert bf16.scale_stride == 4 and bf16.peer_buffers()["scales"] == ((2, 4), "f32")   # never a 0-wide row
    from kernels.ep.op import DTYPES
    assert all(kind in DTYPES for _, kind in table.values())
