"""Host tensor descriptors (Triton's TensorDescriptor) as kernel arguments, passed as triton 3.6's launcher passes
them (backends/nvidia/driver.py make_tensordesc_arg; AMD's alike). One of rank r is several kernel parameters:
- lowered to TMA (the compile's `tensordesc_meta` has an entry per descriptor: NVIDIA sm_90 and up): a 128-byte
  CUtensorMap by value, then the shape as r i32 and the strides (in elements) as r i64;
- not lowered (`tensordesc_meta` empty): the base address, the shape and the strides as r i64 each, the padding flag
  (i1: "nan"), then the shape as r i32 and the strides as r i64.
The CUtensorMap is encoded at launch by cuTensorMapEncodeTiled as triton's fill_tma_descriptor does (TensorMaps): its
box is the metadata's block_size, which may be narrower than the block (a box row is at most the swizzle width).
"""
from __future__ import annotations

import ctypes
import re

MAP_BYTES, MAP_ALIGN = 128, 128   # sizeof(CUtensorMap); Triton's launcher refuses a map not 128-byte aligned
L2_PROMOTION_128B = 2             # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
OOB_FILL_NAN = 1                  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA (0: NONE, zeros)
INTERLEAVE_NONE = 0
MAPS_KEPT = 16   # encoded maps a descriptor argument keeps, by address, shape, strides and padding
# The compile's element type numbers (Triton's TMA lowering's) as the driver's CUtensorMapDataType: its 8, 9, 10 are
# the driver's 10 (FLOAT32_FTZ), 8 (FLOAT64) and 9 (BFLOAT16), as triton 3.6's launcher translates them
HOST_ELEM_TYPE = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}
TYPE = re.compile(r"tensordesc<([A-Za-z0-9_]+)\[( *[0-9]+ *(?:, *[0-9]+ *)*)\]>")

# cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void* globalAddress,
#   const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
#   const cuuint32_t* elementStrides, interleave, swizzle, l2Promotion, oobFill); enums are C ints
ENCODE_TILED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)


class DescriptorError(ValueError):
    pass


def is_descriptor(kind: str) -> bool:
    return kind.startswith("tensordesc")


def parse(kind: str) -> tuple[str, list[int]] | None:
    """'tensordesc<bf16[64, 64]>' -> ('bf16', [64, 64]); None for anything else."""
    found = TYPE.fullmatch(kind)
    return (found[1], [int(x) for x in found[2].split(",")]) if found else None


class Descriptor:
    """One descriptor argument of a binary: its kernel parameters and how a TensorDescriptor fills them. `meta`: the
    compile's tensordesc_meta entry for it; None where not lowered to TMA."""

    def __init__(self, name: str, kind: str, meta: dict | None):
        self.name, self.kind, self.meta = name, kind, meta
        self.dtype, self.block = parse(kind)
        r = len(self.block)
        # each parameter as launch.py's slots name them: "map" (a CUtensorMap), "*" (an address) or a scalar
        head = ["map"] if meta is not None else ["*", *["i64"] * (2 * r), "i1"]
        self.params = [*head, *["i32"] * r, *["i64"] * r]
        self._encoded: dict[tuple, bytes] = {}   # the last few maps, by what they encode

    def values(self, desc, map_address: int, encode) -> list:
        """The scalar parameters' values for `desc`; a TMA descriptor's map is encoded at `map_address` by `encode`."""
        shape, strides = list(desc.shape), list(desc.strides)
        if len(shape) != len(self.block) or len(strides) != len(self.block):
            raise DescriptorError(f"argument {self.name} is {self.kind}: a rank-{len(self.block)} descriptor, got "
                                  f"shape {shape} and strides {strides}")
        if strides[-1] != 1:
            raise DescriptorError(f"argument {self.name}: the descriptor's last dimension must be contiguous "
                                  f"(stride 1), got strides {strides}")
        base, nan = desc.base, desc.padding == "nan"
        address = base if isinstance(base, int) else base.data_ptr()
        if self.meta is None:
            return [address, *shape, *strides, nan, *shape, *strides]
        if self.meta["fp4_padded"]:   # two fp4 values a byte, padded: Triton doubles the innermost size too
            shape[-1] *= 2
        # A map depends only on these values (and this binary's metadata): a launch with an earlier one's tensors
        # copies its map (tma_matmul's three descriptors: 5 us so, 30 us encoding each through ctypes)
        key = (address, nan, *shape, *strides)
        found = self._encoded.get(key)
        if found is None:
            encode(map_address, self.meta, address, shape, strides, nan)
            if len(self._encoded) >= MAPS_KEPT:
                self._encoded.clear()
            self._encoded[key] = ctypes.string_at(map_address, MAP_BYTES)
        else:
            ctypes.memmove(map_address, found, MAP_BYTES)
        return [*shape, *strides]


def plan(entry: dict, vendor: str) -> dict[int, Descriptor]:
    """The entry's descriptor arguments by position, the compile's metadata checked (a bundle is untrusted)."""
    at = [i for i, a in enumerate(entry["signature"]) if is_descriptor(a["type"])]
    if not at:
        return {}
    name, metas = entry.get("target"), entry.get("tensordesc_meta")
    if not isinstance(metas, list):
        raise DescriptorError(f"{name}: a kernel with tensor descriptor arguments needs the manifest's "
                              f"'tensordesc_meta' (built by kforge before it had it?): rebuild it (doit) and "
                              f"package it again (doit package)")
    if metas and vendor != "nvidia":
        raise DescriptorError(f"{name}: its descriptors were lowered to {vendor} hardware descriptors (Triton's "
                              f"AMD TDM, gfx1250), which this loader does not build")
    if metas and len(metas) != len(at):
        raise DescriptorError(f"{name}: the manifest's 'tensordesc_meta' has {len(metas)} entries for "
                              f"{len(at)} descriptor arguments; rebuild the bundle")
    found = {}
    for n, i in enumerate(at):
        arg = entry["signature"][i]
        parsed = parse(arg["type"])
        if parsed is None or not 1 <= len(parsed[1]) <= 5:
            raise DescriptorError(f"{name}: argument {arg['name']} has type {arg['type']}, not "
                                  f"tensordesc<dtype[block]> of rank 1 to 5; rebuild the bundle")
        meta = metas[n] if metas else None
        if meta is not None:
            check_meta(meta, len(parsed[1]), f"{name}: argument {arg['name']}'s tensordesc_meta")
        found[i] = Descriptor(arg["name"], arg["type"], meta)
    return found


def check_meta(meta, rank: int, where: str) -> None:
    def whole(v, low, high):
        return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
    ok = (isinstance(meta, dict) and whole(meta.get("swizzle"), 0, 6) and meta.get("elem_size") in (1, 2, 4, 8)
          and whole(meta.get("elem_type"), 0, 15) and isinstance(meta.get("fp4_padded"), bool)
          and isinstance(meta.get("block_size"), list) and len(meta["block_size"]) == rank
          and all(whole(b, 1, 256) for b in meta["block_size"]))
    if not ok:
        raise DescriptorError(f"{where} must be {{swizzle: 0-6, elem_size: 1/2/4/8, elem_type: 0-15, block_size: "
                              f"{rank} sizes of 1-256, fp4_padded: bool}}; rebuild the bundle")


class TensorMaps:
    """Encodes CUtensorMaps with `encode_tiled` (an ENCODE_TILED) as triton's fill_tma_descriptor does."""

    def __init__(self, encode_tiled, error_name=str):
        self.encode_tiled, self.error_name = encode_tiled, error_name

    def __call__(self, map_address: int, meta: dict, address: int, shape: list, strides: list, nan: bool) -> None:
        rank, size = len(shape), meta["elem_size"]
        dims = (ctypes.c_uint64 * rank)(*reversed(shape))
        byte_strides = (ctypes.c_uint64 * rank)(*[size * s for s in reversed(strides[:-1])])   # rank - 1 read
        box = (ctypes.c_uint32 * rank)(*reversed(meta["block_size"]))
        ones = (ctypes.c_uint32 * rank)(*[1] * rank)
        code = self.encode_tiled(map_address, HOST_ELEM_TYPE[meta["elem_type"]], rank, address, dims, byte_strides,
                                 box, ones, INTERLEAVE_NONE, meta["swizzle"], L2_PROMOTION_128B,
                                 OOB_FILL_NAN if nan else 0)
        if code != 0:
            raise DescriptorError(f"cuTensorMapEncodeTiled failed: {self.error_name(code)} (address {address:#x}, "
                                  f"shape {shape}, strides {strides}, box {meta['block_size']}, element size "
                                  f"{size}): the base must be 16-byte aligned and each stride but the last a "
                                  f"multiple of 16 bytes")
