"""Where each rank of a world runs: round-robin on the GPUs it may use (no torch here: the sweep's parent
process and its tests import this without a GPU)."""


def placement(rank: int, gpus: int) -> int:
    """The GPU of `rank` when the ranks go round-robin on `gpus` GPUs (uneven when gpus does not divide W)."""
    return rank % gpus


def ranks_per_gpu(world: int, gpus: int) -> list[int]:
    return [len(range(g, world, gpus)) for g in range(min(world, gpus))]
