"""rules/runtime/tensordesc.py and the loader's descriptor arguments on the CPU, checked against triton 3.6's
own launcher: the kernel parameters its generated C launcher declares (make_launcher), the values its Python
wrapper expands a TensorDescriptor into (wrap_handle_tensordesc / make_tensordesc_arg), and what its C helper
fill_tma_descriptor hands cuTensorMapEncodeTiled (backends/nvidia/driver.c, read: its transformation is
written out below as `driver_c_encode`). No GPU: the driver's encode function is a ctypes callback."""
import ctypes
import re
import struct
import types

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from kforge_runtime import tensordesc
from kforge_runtime.launch import Arguments, LaunchError

# what triton 3.6 compiled for sm_90a (kernels/tma.py, tma_matmul bf16 128x128x64): b's box is narrower than
# its block (a 128-byte swizzled row holds 64 bf16)
META_A = {"block_size": [128, 64], "elem_size": 2, "elem_type": 10, "fp4_padded": False, "swizzle": 3}
META_B = {"block_size": [64, 64], "elem_size": 2, "elem_type": 10, "fp4_padded": False, "swizzle": 3}
META_3D = {"block_size": [1, 16, 32], "elem_size": 4, "elem_type": 7, "fp4_padded": False, "swizzle": 2}
SIGNATURE = [("a_desc", "tensordesc<bf16[128, 64]>"), ("scale", "fp32"), ("p", "*fp16"),
             ("b_desc", "tensordesc<bf16[64, 128]>"), ("K", "i32"), ("c_desc", "tensordesc<fp32[1, 16, 32]>")]
C_TYPES = {"CUdeviceptr": "Q", "hipDeviceptr_t": "Q", "int8_t": "b", "int32_t": "i", "int64_t": "q",
           "uint32_t": "I"}   # a fp32 scalar is passed as its bits (uint32_t storage)
# the loader's name for each parameter (Arguments.layout) by the C type Triton's launcher declares it as
KINDS = {"CUtensorMap": "map", "CUdeviceptr": "*", "hipDeviceptr_t": "*", "int8_t": "i1", "int32_t": "i32",
         "int64_t": "i64", "uint32_t": "fp32"}


class DeviceTensor:
    """A GPU tensor as the launch sees it: an address and a dtype."""
    is_cuda = True

    def __init__(self, address, dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self):
        return self.address


def descriptors(padding="zero"):
    a = TensorDescriptor(DeviceTensor(0x7f0000001000, torch.bfloat16), [300, 208], [208, 1], [128, 64], padding)
    b = TensorDescriptor(DeviceTensor(0x7f0000100000, torch.bfloat16), [208, 520], [528, 1], [64, 128], padding)
    c = TensorDescriptor(DeviceTensor(0x7f0000200000, torch.float32), [3, 40, 72], [3200, 80, 1], [1, 16, 32],
                         padding)
    return a, b, c


def entry(metas, arch="sm_90a"):
    return {"target": f"t:x@{arch}", "arch": arch, "threads_per_block": 128, "shared": 0, "divisible_by_16": ["K"],
            "signature": [{"name": n, "type": t} for n, t in SIGNATURE], "tensordesc_meta": metas}


def triton_launch(vendor, metas, args, monkeypatch):
    """(the C type of every kernel parameter, the values Triton's launcher passes them, fill_tma_descriptor's
    calls) for `args`, from triton 3.6's own launcher code."""
    if vendor == "nvidia":
        from triton.backends.nvidia import driver as backend
    else:
        from triton.backends.amd import driver as backend
        monkeypatch.setattr(backend, "_get_path_to_hip_runtime_dylib", lambda: "/no/libamdhip64.so")
    from triton.runtime import driver
    filled = []

    def fill_tma_descriptor(*call):
        filled.append(call)
        return f"map{len(filled)}"
    monkeypatch.setattr(driver, "_active", types.SimpleNamespace(utils=types.SimpleNamespace(
        fill_tma_descriptor=fill_tma_descriptor)))
    signature = dict(SIGNATURE)
    src = (backend.make_launcher({}, signature, metas) if vendor == "nvidia" else
           backend.make_launcher({}, signature, 64, metas))
    declared = re.search(r"static void _launch\(.*?(?:profile_scratch), (.*?)\) \{", src)[1]
    c_types = [d.rsplit(" ", 1)[0] for d in declared.split(", ")]
    passed = []
    base = ["base"] * (13 if vendor == "nvidia" else 11)   # the launcher's own leading arguments (grid, stream, ...)
    if vendor == "amd":
        base[7] = (4, 1, 0)   # kernel metadata (num_warps first): AMD's TDM path would read it
    backend.wrap_handle_tensordesc(lambda *a: passed.extend(a[len(base):]), signature, metas)(*base, *args)
    return c_types, passed, filled


def ours(metas, args, vendor="nvidia"):
    """(the loader's kernelParams, the calls its encode function got, the maps' slots) for `args`."""
    calls = []

    def encode_tiled(tensor_map, elem_type, rank, address, dims, strides, box, element_strides, interleave,
                     swizzle, l2, fill):
        calls.append((elem_type, rank, address, dims[:rank], strides[:rank - 1], box[:rank],
                      element_strides[:rank], interleave, swizzle, l2, fill))
        ctypes.memset(tensor_map, len(calls), tensordesc.MAP_BYTES)   # a map the test can tell apart
        return 0
    arguments = Arguments(entry(metas), vendor)
    arguments.encode = tensordesc.TensorMaps(tensordesc.ENCODE_TILED(encode_tiled))
    return arguments.pack_trusted(list(args)), calls, arguments


def driver_c_encode(address, swizzle, elem_size, elem_type, block_size, shape, strides, padding):
    """What triton 3.6's fillTMADescriptor (driver.c) passes cuTensorMapEncodeTiled for fill_tma_descriptor's
    arguments: sizes innermost first, byte strides of all dimensions but the innermost, element strides 1,
    CU_TENSOR_MAP_INTERLEAVE_NONE, L2_PROMOTION_L2_128B (2), OOB fill NAN_REQUEST_ZERO_FMA (1) for padding 1."""
    rank = len(shape)
    return (elem_type, rank, address, list(reversed(shape)), [elem_size * s for s in reversed(strides[:-1])],
            list(reversed(block_size)), [1] * rank, 0, swizzle, 2, 1 if padding == 1 else 0)


@pytest.mark.parametrize("padding", ["zero", "nan"])
def test_tma_descriptors_fill_the_parameters_triton_s_launcher_declares_with_the_values_it_passes(padding,
                                                                                                   monkeypatch):
    metas = [META_A, META_B, META_3D]
    a, b, c = descriptors(padding)
    args = (a, 0.5, 0x7f0000300000, b, 208, c)
    c_types, passed, filled = triton_launch("nvidia", metas, args, monkeypatch)
    params, calls, arguments = ours(metas, args)
    assert arguments.layout == [KINDS[c] for c in c_types] and len(params) == len(c_types) + 2   # + scratch
    assert [ctypes.c_void_p.from_address(params[-i]).value for i in (1, 2)] == [None, None]
    maps = 0
    for param, c_type, value in zip(params, c_types, passed):
        if c_type == "CUtensorMap":   # by value: 128 bytes at a 128-aligned address, as encoded (below)
            maps += 1
            assert value == f"map{maps}" and param % tensordesc.MAP_ALIGN == 0
            assert ctypes.string_at(param, tensordesc.MAP_BYTES) == bytes([maps]) * tensordesc.MAP_BYTES
        elif c_type == "uint32_t":   # Triton's fp32 storage: the float's bits
            assert ctypes.c_uint32.from_address(param).value == struct.unpack("<I", struct.pack("<f", value))[0]
        else:
            code = C_TYPES[c_type]
            assert struct.unpack("<" + code, ctypes.string_at(param, struct.calcsize(code)))[0] == value, c_type
    assert maps == 3 and arguments.maps == 3
    assert [list(call) for call in calls] == [list(driver_c_encode(*f)) for f in filled]
    assert [f[3] for f in filled] == [9, 9, 7]   # Triton's device numbering translated: bf16 is the driver's 9


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_descriptors_not_lowered_to_tma_are_passed_as_base_shape_strides_and_padding(vendor, monkeypatch):
    """sm_80, gfx90a/gfx942/gfx950: the compile's tensordesc_meta is empty and the descriptor is decomposed."""
    a, b, c = descriptors("nan")
    args = (a, 2.0, 0x7f0000300000, b, 208, c)
    c_types, passed, filled = triton_launch(vendor, [], args, monkeypatch)
    params, calls, arguments = ours([], args, vendor)
    assert filled == [] and calls == [] and arguments.maps == 0 and len(params) == len(c_types) + 2
    assert arguments.layout == [KINDS[c] for c in c_types]
    for param, c_type, value in zip(params, c_types, passed):
        if c_type == "uint32_t":
            assert ctypes.c_uint32.from_address(param).value == struct.unpack("<I", struct.pack("<f", value))[0]
        else:
            code = C_TYPES[c_type]
            got = struct.unpack("<" + code, ctypes.string_at(param, struct.calcsize(code)))[0]
            assert got == (value.data_ptr() if hasattr(value, "data_ptr") else value), c_type


def test_the_encoder_passes_libcuda_s_signature_through_ctypes():
    """A callback typed as cuTensorMapEncodeTiled receives the arrays and enums the driver would."""
    got = []

    def encode_tiled(tensor_map, elem_type, rank, address, dims, strides, box, element_strides, *enums):
        got.append((tensor_map, elem_type, rank, address, dims[:rank], strides[:rank - 1], box[:rank],
                    element_strides[:rank], enums))
        return 0
    slot = ctypes.create_string_buffer(128)
    maps = tensordesc.TensorMaps(tensordesc.ENCODE_TILED(encode_tiled))
    maps(ctypes.addressof(slot), META_3D, 0x7f0000200000, [3, 40, 72], [3200, 80, 1], True)
    assert got == [(ctypes.addressof(slot), 7, 3, 0x7f0000200000, [72, 40, 3], [320, 12800], [32, 16, 1],
                    [1, 1, 1], (0, 2, 2, 1))]


def test_a_map_is_encoded_once_for_the_same_tensor_and_copied_into_its_slot_after():
    encoded = []

    def encode(slot, meta, address, shape, strides, nan):
        encoded.append(address)
        ctypes.memset(slot, len(encoded), tensordesc.MAP_BYTES)
    descriptor = tensordesc.Descriptor("a", "tensordesc<bf16[128, 64]>", META_A)
    slot = ctypes.create_string_buffer(tensordesc.MAP_BYTES)
    a, b, _ = descriptors()
    for desc, expected in ((a, b"\1"), (a, b"\1"), (TensorDescriptor(b.base, [300, 208], [208, 1], [128, 64]), b"\2"),
                           (a, b"\1"), (TensorDescriptor(a.base, [300, 208], [208, 1], [128, 64], "nan"), b"\3")):
        ctypes.memset(slot, 0, tensordesc.MAP_BYTES)   # whatever another launch left there
        assert descriptor.values(desc, ctypes.addressof(slot), encode) == [300, 208, 208, 1]
        assert slot.raw == expected * tensordesc.MAP_BYTES
    assert encoded == [a.base.address, b.base.address, a.base.address]


def test_a_failed_encode_is_a_clear_error():
    maps = tensordesc.TensorMaps(tensordesc.ENCODE_TILED(lambda *a: 1), lambda code: "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(tensordesc.DescriptorError, match=r"cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE "
                                                         r"\(address 0x10, shape \[8, 8\].*16-byte aligned"):
        maps(0, {**META_B, "block_size": [8, 8]}, 0x10, [8, 8], [8, 1], False)


def test_an_fp4_padded_descriptor_doubles_its_innermost_size_as_triton_does(monkeypatch):
    meta = {"block_size": [64, 64], "elem_size": 1, "elem_type": 0, "fp4_padded": True, "swizzle": 3}
    desc = TensorDescriptor(DeviceTensor(0x7f0000001000, torch.uint8), [128, 32], [64, 1], [64, 64])
    filled, encoded = [], []
    from triton.backends.nvidia import driver as nv
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", types.SimpleNamespace(utils=types.SimpleNamespace(
        fill_tma_descriptor=lambda *call: filled.append(call))))
    expected_values = nv.make_tensordesc_arg(desc, meta)[1:]
    values = tensordesc.Descriptor("d", "tensordesc<u8[64, 64]>", meta).values(
        desc, 0, lambda *call: encoded.append(call))
    assert values == expected_values == [128, 64, 64, 1]
    assert encoded[0][3:5] == (filled[0][5], filled[0][6]) == ([128, 64], [64, 1])


def test_a_descriptor_call_is_checked_against_the_binary():
    arguments = Arguments(entry([META_A, META_B, META_3D]))
    a, b, c = descriptors()
    arguments.encode = lambda *call: None
    arguments.pack((a, 1.0, DeviceTensor(0x7f0000300000, torch.float16), b, 208, c))
    wrong_block = TensorDescriptor(a.base, a.shape, a.strides, [64, 64])
    for bad, error in (
            ((wrong_block, 1.0, 0, b, 208, c), r"a_desc is tensordesc<bf16\[128, 64\]>, got a descriptor with block "
                                               r"shape \[64, 64\]"),
            ((b, 1.0, 0, a, 208, c), r"a_desc is tensordesc<bf16\[128, 64\]>, got a descriptor with block"),
            ((a.base, 1.0, 0, b, 208, c), r"a_desc is tensordesc<bf16\[128, 64\]>: pass a triton.tools."
                                          r"tensor_descriptor.TensorDescriptor, got DeviceTensor"),
            ((TensorDescriptor(DeviceTensor(0x7f0000001000, torch.float16), [300, 208], [208, 1], [128, 64]), 1.0, 0,
              b, 208, c), r"a_desc is tensordesc<bf16\[128, 64\]>, got a descriptor of a torch.float16 tensor"),
            ((TensorDescriptor.from_tensor(torch.zeros(128, 64, dtype=torch.bfloat16), [128, 64]), 1.0, 0, b, 208, c),
             r"a_desc describes a CPU tensor")):
        with pytest.raises(TypeError, match=error):
            arguments.pack(bad)
    a.strides = [1, 300]   # mutated after its checks: Triton refuses it at every launch too
    with pytest.raises(ValueError, match=r"a_desc: the descriptor's last dimension must be contiguous"):
        arguments.pack_trusted([a, 1.0, 0, b, 208, c])


@pytest.mark.parametrize("metas, vendor, error", [
    (None, "nvidia", r"needs the manifest's 'tensordesc_meta' \(built by kforge before it had it\?\): rebuild it"),
    ([META_A, META_B], "nvidia", "'tensordesc_meta' has 2 entries for 3 descriptor arguments"),
    ([META_A, META_B, {**META_3D, "block_size": [16, 32]}], "nvidia", r"c_desc's tensordesc_meta must be .*3 sizes"),
    ([META_A, {**META_B, "swizzle": 9}], "nvidia", "tensordesc_meta"),
    ([META_A, {**META_B, "elem_size": 3}, META_3D], "nvidia", "b_desc's tensordesc_meta"),
    ([META_A, META_B, META_3D], "amd", r"lowered to amd hardware descriptors \(Triton's AMD TDM, gfx1250\)")])
def test_a_bundle_s_descriptor_metadata_is_checked_before_the_driver(metas, vendor, error):
    with pytest.raises(LaunchError, match=error):
        Arguments(entry(metas), vendor)


def test_a_lowered_descriptor_needs_the_driver_s_encoder():
    arguments = Arguments(entry([META_A, META_B, META_3D]))
    with pytest.raises(LaunchError, match="no driver loaded to encode its tensor maps"):
        arguments.pack_trusted([*descriptors()[:1], 1.0, 0, *descriptors()[1:2], 208, descriptors()[2]])


def test_the_type_grammar_is_the_one_triton_s_specializer_writes():
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl
    desc = TensorDescriptor.from_tensor(torch.zeros(4, 64, 64, dtype=torch.float16), [1, 32, 64])
    kind = native_specialize_impl(BaseBackend, desc, False, True, True)[0]
    assert tensordesc.parse(kind) == ("fp16", [1, 32, 64])
    assert tensordesc.parse("tensordesc<fp16[32, 32],NVMMASharedLayout()>") is None   # a Gluon layout: refused


@pytest.mark.parametrize("kind", ["tensordesc<fp16[1, 1, 1, 1, 1, 1]>", "tensordesc<fp16>", "tensordesc<fp16[]>"])
def test_a_descriptor_type_of_no_rank_1_to_5_is_one_line_naming_the_target_and_argument(kind):
    """tensordesc.py 111: reachable from an altered bundle's signature, never run in the whole suite's coverage."""
    entry = {"target": "k:c@sm_90a", "signature": [{"name": "d", "type": kind}], "tensordesc_meta": []}
    with pytest.raises(tensordesc.DescriptorError) as e:
        tensordesc.plan(entry, "nvidia")
    assert str(e.value) == (f"k:c@sm_90a: argument d has type {kind}, not tensordesc<dtype[block]> of rank 1 to 5; "
                            f"rebuild the bundle")


def test_a_descriptor_of_another_rank_than_the_kernels_is_one_line_naming_the_argument():
    """tensordesc.py 65: a caller's rank-1 descriptor for a rank-2 argument (launch.py prefixes the target);
    never run in the whole suite's coverage. No map is encoded."""
    descriptor = tensordesc.Descriptor("a", "tensordesc<fp16[64, 64]>", None)
    given = types.SimpleNamespace(shape=[64], strides=[1], base=0, padding="zero")
    with pytest.raises(tensordesc.DescriptorError) as e:
        descriptor.values(given, 0, None)
    assert str(e.value) == ("argument a is tensordesc<fp16[64, 64]>: a rank-2 descriptor, got shape [64] and "
                            "strides [1]")
