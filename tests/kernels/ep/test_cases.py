"""The verify sweep's case matrix covers the notes' axes, and each routing mode means what it says."""
import torch

from kernels.ep import cases
from kernels.ep.routing import destinations, positions


def test_matrix_covers_every_axis_with_unique_names():
    for world in (2, 4, 8):
        m = cases.matrix(world)
        assert len({c.name for c in m}) == len(m)
        assert {c.routing for c in m} == set(cases.ROUTINGS)
        assert {1, 2, 8} <= {c.topk for c in m} and {1, 8, 32} <= {c.experts_per_rank for c in m}
        assert {128, 4096, 7168} <= {c.hidden for c in m}
        assert {0, 1, 3, 128, 4096, "mixed"} <= {c.tokens for c in m}
        assert {"default", "exact", "small"} == {c.capacity for c in m}
        assert any(c.graph for c in m) and any(c.interleaved for c in m) and any(c.strict for c in m)
        assert any(not c.weights for c in m) and max(c.iterations for c in m) >= 3


def test_inputs_are_seeded_and_within_the_config():
    for case in cases.matrix(4):
        cfg = case.config(4)
        for rank in range(4):
            x, idx, w = cases.inputs(case, cfg, rank)
            again = cases.inputs(case, cfg, rank)
            assert torch.equal(x, again[0]) and torch.equal(idx, again[1])
            assert x.shape == (idx.shape[0], cfg.hidden) and idx.shape[1] == cfg.topk
            assert x.shape[0] <= cfg.max_tokens_per_rank and idx.dtype == torch.int32
            assert (w is None) == (not case.weights)


def test_mixed_tokens_leave_some_rank_empty():
    case = [c for c in cases.matrix(4) if c.tokens == "mixed"][0]
    assert 0 in [cases.tokens_on(case, r, 4) for r in range(4)]


def test_routing_modes_send_where_they_say():
    g = torch.Generator().manual_seed(0)
    W, E, K, T = 4, 8, 4, 64
    dest = lambda mode, rank=1: destinations(cases.routing(mode, T, K, E, W, rank, g), E, W)
    assert dest("local").sum(1).eq(1).all() and dest("local")[:, 1].all()
    assert not dest("remote")[:, 1].any()
    assert dest("all_to_one")[:, 0].all() and dest("all_to_one").sum() == T
    assert dest("same_rank").sum(1).eq(1).all()
    sentinels = cases.routing("sentinels", T, K, E, W, 0, g)
    assert (sentinels[::5] == -1).all() and not destinations(sentinels, E, W)[::5].any()
    assert dest("hot_rank")[:, W - 1].float().mean() > 0.9


def test_positions_keep_source_token_order():
    mask = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 1]], dtype=torch.bool)
    assert positions(mask).tolist() == [[0, 0], [1, 0], [2, 1], [2, 2]]
    ids = torch.tensor([[0, 1, -1], [3, 3, 99], [-1, -1, -1]], dtype=torch.int32)   # E=2, W=2
    assert destinations(ids, 2, 2).tolist() == [[True, False], [False, True], [False, False]]


def test_fp8_rows_round_trip_through_their_block_scales_also_when_there_are_none():
    """A rank that receives no rows dequantizes an empty [0, H] (found by the world-16 simulation)."""
    import torch
    from kernels.ep.cases import dequantize_fp8, quantize_fp8
    x = torch.randn(3, 256)
    rows, scales = quantize_fp8(x, 128)
    assert torch.allclose(dequantize_fp8(rows, scales), x, rtol=0.07, atol=1e-3)
    assert dequantize_fp8(rows[:0], scales[:0]).shape == (0, 256)
