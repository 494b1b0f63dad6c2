"""How a rank reaches its peers' buffers: PyTorch symmetric memory when every rank has a GPU of its own, CUDA
(or HIP) IPC when some ranks share one, on one GPU or spread over several.

Symmetric memory refuses ranks that share a device (its rendezvous sees overlapping allocations), so any
placement with W > G ranks on G GPUs goes through IPC for every pair. Each rank opens its peers' handles
itself, in its own GPU's context, asking the driver to enable peer access to the owner's GPU on the way
(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as NCCL's P2P transport does). torch's own rebuild of a shared tensor
opens the handle in the owner GPU's context instead: a kernel on another GPU then faults on its first store
into it, even after cuCtxEnablePeerAccess between the two (seen on 2 x H100, driver 580, world 3, 4 and 8).
"""
from __future__ import annotations

import contextlib
import ctypes
import socket
import weakref

import torch
import torch.distributed as dist

class PeerAccessError(RuntimeError):
    pass


def shares_a_gpu(group) -> bool:
    """Whether two ranks of the group run on the same GPU (same host, same device)."""
    where = [None] * dist.get_world_size(group)
    dist.all_gather_object(where, (socket.gethostname(), torch.cuda.current_device()), group=group)
    return len(set(where)) < len(where)


def symmetric_buffer(shape, dtype, group) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's buffer, an int64 table of every rank's pointer to its copy) through symmetric memory."""
    import torch.distributed._symmetric_memory as symm_mem
    buf = symm_mem.empty(*shape, dtype=dtype, device="cuda")
    handle = symm_mem.rendezvous(buf, group.group_name)
    return buf, torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")


def ipc_buffer(shape, dtype, group, rank: int, world: int, owner) -> tuple[torch.Tensor, torch.Tensor]:
    """The same through IPC: allocated here, (handle of its allocation, offset in it) sent to every rank, each
    peer's opened in this GPU's context. The mappings are closed when `owner` (the op) is collected: the op
    lives as long as any kernel that reaches the peers."""
    buf = torch.zeros(shape, dtype=dtype, device="cuda")
    api = _driver()
    exported: list = [None] * world
    mine = torch.cuda.current_device()
    dist.all_gather_object(exported, (*api.export(buf.data_ptr()), mine), group=group)
    pointers, opened = [], []
    for peer, (handle, offset, device) in enumerate(exported):
        if peer == rank:
            pointers.append(buf.data_ptr())
        else:
            if device != mine and not torch.cuda.can_device_access_peer(mine, device):
                raise PeerAccessError(f"GPU {mine} cannot reach GPU {device} (no peer access between them: no "
                                      f"NVLink or PCIe P2P): place the ranks on GPUs that reach each other "
                                      f"(CUDA_VISIBLE_DEVICES, verify's gpus=)")
            base = api.open(handle)
            opened.append(handle)
            pointers.append(base + offset)
    weakref.finalize(owner, api.close_all, opened)
    return buf, torch.tensor(pointers, dtype=torch.int64, device="cuda")


class IpcMemHandle(ctypes.Structure):   # CUipcMemHandle / hipIpcMemHandle_t: 64 opaque bytes, passed by value
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]   # not c_char: its value stops at the first zero byte


class _Ipc:
    """IPC through the CUDA driver (NVIDIA) or the HIP runtime (AMD): export an allocation, open a peer's in
    this GPU's context once per process (a handle may be opened once per context; buffers of one peer often
    share an allocation of torch's caching allocator), close it when no op uses it."""

    LAZY_ENABLE_PEER_ACCESS = 1   # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == hipIpcMemLazyEnablePeerAccess

    def __init__(self):
        self.hip = bool(getattr(torch.version, "hip", None))
        self.lib = ctypes.CDLL("libamdhip64.so" if self.hip else "libcuda.so.1")
        self.names = ({"range": "hipMemGetAddressRange", "get": "hipIpcGetMemHandle", "open": "hipIpcOpenMemHandle",
                       "close": "hipIpcCloseMemHandle"} if self.hip else
                      {"range": "cuMemGetAddressRange_v2", "get": "cuIpcGetMemHandle", "open": "cuIpcOpenMemHandle_v2",
                       "close": "cuIpcCloseMemHandle"})
        getattr(self.lib, self.names["open"]).argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcMemHandle, ctypes.c_uint]
        self.open_handles: dict[bytes, list] = {}   # handle -> [base pointer, ops using it]

    def _call(self, what: str, *args) -> None:
        rc = getattr(self.lib, self.names[what])(*args)
        if rc:
            raise PeerAccessError(f"{self.names[what]} failed with error {rc} on GPU {torch.cuda.current_device()}"
                                  + ("; IPC cannot share torch's expandable segments: unset "
                                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments" if what == "get" else ""))

    def export(self, pointer: int) -> tuple[bytes, int]:
        """(the IPC handle of the allocation holding `pointer`, pointer's offset in it)."""
        base, size, handle = ctypes.c_uint64(), ctypes.c_size_t(), IpcMemHandle()
        with self._context():
            self._call("range", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
            self._call("get", ctypes.byref(handle), ctypes.c_uint64(base.value))
        return bytes(handle), pointer - base.value

    def open(self, handle: bytes) -> int:
        entry = self.open_handles.get(handle)
        if entry is None:
            base = ctypes.c_uint64()
            with self._context():
                self._call("open", ctypes.byref(base), IpcMemHandle.from_buffer_copy(handle),
                           self.LAZY_ENABLE_PEER_ACCESS)
            entry = self.open_handles[handle] = [base.value, 0]
        entry[1] += 1
        return entry[0]

    def close_all(self, handles: list[bytes]) -> None:
        if handles:
            torch.cuda.synchronize()   # no kernel still in flight reaches into what is closed
        for handle in handles:
            entry = self.open_handles[handle]
            entry[1] -= 1
            if entry[1] == 0:
                del self.open_handles[handle]
                with self._context():
                    getattr(self.lib, self.names["close"])(ctypes.c_uint64(entry[0]))   # best effort at teardown

    def _context(self):
        """HIP's runtime calls act on the current device (torch's); the CUDA driver's on the current context:
        this GPU's primary context (torch's) is made current around them."""
        if self.hip:
            return contextlib.nullcontext()
        return _primary_context(self.lib, torch.cuda.current_device())


class _primary_context:
    def __init__(self, cu, ordinal: int):
        self.cu, self.ordinal = cu, ordinal

    def __enter__(self):
        torch.cuda.init()
        self.dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = self.cu.cuDeviceGet(ctypes.byref(self.dev), self.ordinal) or \
            self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev) or self.cu.cuCtxPushCurrent_v2(ctx)
        if rc:
            raise PeerAccessError(f"cannot make GPU {self.ordinal}'s primary context current (CUDA error {rc})")

    def __exit__(self, *exc):
        self.cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        self.cu.cuDevicePrimaryCtxRelease_v2(self.dev)


_api: _Ipc | None = None


def _driver() -> _Ipc:
    global _api
    if _api is None:
        _api = _Ipc()
    return _api
