"""The op's argument checks that need no GPU: combine refuses what would make it wait forever or read out of
bounds, before anything is launched."""
import pytest
import torch

from kernels.ep.config import EpConfig
from kernels.ep.op import EpDispatchCombine


def _op_after_a_dispatch(handle: torch.Tensor) -> EpDispatchCombine:
    """An op in the state its latest dispatch left (no GPU: combine's checks come before any launch)."""
    op = EpDispatchCombine.__new__(EpDispatchCombine)
    op.cfg = EpConfig(world_size=2, hidden=64, experts_per_rank=2, topk=2, max_tokens_per_rank=4)
    op.y = torch.zeros(op.cfg.capacity, op.cfg.hidden, dtype=torch.bfloat16)
    op._handle, op._combined = handle, False
    return op


def test_combine_refuses_a_handle_of_an_earlier_dispatch():
    latest = torch.zeros(4, 2, dtype=torch.int32)
    op = _op_after_a_dispatch(latest)
    with pytest.raises(ValueError, match="not from this op's latest dispatch"):
        op.combine(None, latest.clone())   # the same routing, but another dispatch's handle


def test_combine_refuses_expert_outputs_of_the_wrong_shape_or_type():
    op = _op_after_a_dispatch(torch.zeros(4, 2, dtype=torch.int32))
    for y in (torch.zeros(8, 32, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.float32),
              torch.zeros(9, 64, dtype=torch.bfloat16), torch.zeros(64, 8, dtype=torch.bfloat16).t()):
        with pytest.raises(ValueError, match="combine: y must be a contiguous"):
            op.combine(y, op._handle)
