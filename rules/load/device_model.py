"""The device model: in a process that imports a family's module (the probe, a compile server), torch and
Triton answer device queries as the target arch's reference GPU would, on a CPU-only builder or on a machine
whose own GPU is another (building gfx942 on an H100 must not see the H100).

A library asks the device at import or in its heuristics (`torch.cuda.get_device_capability()`, Triton's
`driver.active.get_current_target()`, ...): its config lists and computed constexprs are then the target's own.
Nothing is allocated or launched: what needs a real GPU (a tensor's values, a stream, a launch, a benchmark)
raises NeedsGPU, one line naming the call and where the library made it (the family or target is named
by whoever reports it).

DEVICES is the one table of reference GPUs (docs/device_model.md: where each value comes from). install(arch)
patches Triton's driver at once, torch when it is imported (most of kforge's processes never import it).
"""
from __future__ import annotations

import functools
import importlib
import linecache
import os
import re
import sys
from typing import NamedTuple

from kforge.load import shared_env
from kforge_runtime.after_import import AfterImport
from kforge_runtime.archs import ARCHS

KiB, GiB = 1 << 10, 1 << 30


class Device(NamedTuple):
    """A reference GPU, as torch.cuda.get_device_properties() and Triton's driver report it."""
    arch: str
    name: str                       # get_device_name(), properties.name
    capability: tuple[int, int]     # get_device_capability(); on ROCm torch reports the GFX IP version
    gcn_arch_name: str              # properties.gcnArchName (AMD; "" on NVIDIA)
    total_memory: int               # bytes
    multi_processor_count: int      # SMs / CUs
    warp_size: int
    shared_memory_per_block: int    # without opting in (NVIDIA: 48 KiB)
    shared_memory_per_block_optin: int   # what one block may use (Triton's max_shared_mem)
    shared_memory_per_multiprocessor: int
    regs_per_multiprocessor: int    # 32-bit registers (Triton's max_num_regs: per block, the same here)
    max_threads_per_multi_processor: int
    max_threads_per_block: int


DEVICES: dict[str, Device] = {d.arch: d for d in (
    Device("sm_80", "NVIDIA A100-SXM4-80GB", (8, 0), "", 80 * GiB, 108, 32,
           48 * KiB, 163 * KiB, 164 * KiB, 65536, 2048, 1024),
    Device("sm_90a", "NVIDIA H100 80GB HBM3", (9, 0), "", 80 * GiB, 132, 32,
           48 * KiB, 227 * KiB, 228 * KiB, 65536, 2048, 1024),
    Device("sm_100a", "NVIDIA B200", (10, 0), "", 180 * GiB, 148, 32,
           48 * KiB, 227 * KiB, 228 * KiB, 65536, 2048, 1024),
    # one MI250X is two GCDs, each its own device (what a gfx90a kernel runs on): half the card's CUs and memory
    Device("gfx90a", "AMD Instinct MI250X/MI250", (9, 0), "gfx90a:sramecc+:xnack-", 64 * GiB, 110, 64,
           64 * KiB, 64 * KiB, 64 * KiB, 131072, 2048, 1024),
    Device("gfx942", "AMD Instinct MI300X", (9, 4), "gfx942:sramecc+:xnack-", 192 * GiB, 304, 64,
           64 * KiB, 64 * KiB, 64 * KiB, 131072, 2048, 1024),
    Device("gfx950", "AMD Instinct MI355X", (9, 5), "gfx950:sramecc+:xnack-", 288 * GiB, 256, 64,
           160 * KiB, 160 * KiB, 160 * KiB, 131072, 2048, 1024),
)}

# where each value comes from (datasheets, the CUDA programming guide, ROCm's tables): docs/device_model.md
TORCH_VERSIONS = {"nvidia": ("cuda", "12.8"), "amd": ("hip", "6.4.0")}   # a CUDA / ROCm torch's torch.version


class NeedsGPU(RuntimeError):
    """A call that only a real GPU can answer, made where the device model stands in for one."""


class NotModelled(NeedsGPU, AttributeError):
    """A property the model does not give: hasattr() is False, as for an attribute a torch build lacks."""


READ_WITH_A_DEFAULT = ("read it with a default where the library can, give the value in a set-up hook, or set "
                       "`device_model = false` (docs/device_model.md)")


class _State:
    device: Device | None = None


def install(arch: str) -> None:
    """From now on this process's torch and Triton answer as the reference GPU of `arch` (a second call
    switches the arch). Triton must be importable; torch is patched once it is imported."""
    _State.device = DEVICES[arch]
    _install_triton()
    _install_ctypes()
    _install_vendor_tools()
    if "torch" in sys.modules:
        _install_torch(sys.modules["torch"])
    elif not any(isinstance(f, AfterImport) and f.name == "torch" for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport("torch", lambda: _install_torch(sys.modules["torch"])))


def current() -> Device | None:
    """The device the model answers as, None where it is not installed."""
    return _State.device


def row(arch: str) -> list:
    """The arch's reference GPU as plain values (a target's key holds it: the module imported there saw it)."""
    return list(DEVICES[arch])


# ---- what a real GPU is needed for -----------------------------------------------------------------------

def needs_gpu(call: str) -> NeedsGPU:
    d = _State.device
    return NeedsGPU(f"{call}{_caller()} needs a real GPU: kforge imports the module with a model of "
                    f"{d.arch}'s reference GPU ({d.name}), which answers device queries only; keep device work "
                    f"out of the module's import and heuristics, or set `device_model = false` "
                    f"(docs/device_model.md)")


def _caller() -> str:
    """' at <file>:<line> (`<source line>`)': the innermost frame outside torch, Triton and kforge."""
    skip = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep
                 for m in map(sys.modules.get, ("torch", "triton", "kforge")) if getattr(m, "__file__", None))
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and not os.path.realpath(name).startswith(skip):
            return " at " + shared_env.shown_line(name, frame.f_lineno, linecache.getline(name, frame.f_lineno).strip())
        frame = frame.f_back
    return ""


# ---- Triton ----------------------------------------------------------------------------------------------

class _Properties(dict):
    """Triton's utils.get_device_properties(device): a dict of the driver's attributes."""

    def __missing__(self, key):
        raise KeyError(f"{key!r}: kforge's device model of {_State.device.arch} does not give it "
                       f"(it gives {', '.join(self)}); {READ_WITH_A_DEFAULT}")


class _Utils:
    def get_device_properties(self, device=0) -> dict:
        d = _State.device
        found = _Properties(max_shared_mem=d.shared_memory_per_block_optin, max_num_regs=d.regs_per_multiprocessor,
                            multiprocessor_count=d.multi_processor_count, warpSize=d.warp_size)
        if ARCHS[d.arch].vendor == "amd":   # Triton's HIP driver adds these
            found.update(arch=d.gcn_arch_name, max_threads_per_sm=d.max_threads_per_multi_processor)
        return found

    def __getattr__(self, name):   # load_binary, set_printf_fifo_size, ...: a loaded kernel
        raise needs_gpu(f"triton.runtime.driver.active.utils.{name}")


class ModelDriver:
    """Triton's active driver (runtime/driver.py's DriverConfig) for the modelled device."""
    utils = _Utils()

    @property
    def backend(self) -> str:
        return ARCHS[_State.device.arch].backend

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        a = ARCHS[_State.device.arch]
        return GPUTarget(a.backend, a.target_arch, a.warp_size)

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device) -> None:
        pass

    def get_device_capability(self, device=None) -> tuple[int, int]:
        return _State.device.capability

    def get_active_torch_device(self):
        import torch
        return torch.device("cuda", 0)

    def get_device_interface(self):
        import torch
        return torch.cuda

    def get_current_stream(self, device=None):
        raise needs_gpu("a Triton kernel launch (driver.active.get_current_stream)")

    def get_benchmarker(self):
        raise needs_gpu("benchmarking (driver.active.get_benchmarker)")

    def __getattr__(self, name):   # launcher_cls, get_empty_cache_for_benchmark, ...
        raise needs_gpu(f"triton.runtime.driver.active.{name}")


def _install_triton() -> None:
    from triton.runtime.driver import driver
    model = ModelDriver()
    driver.set_active(model)
    driver._default = model   # reset_active() and .default would otherwise create the real driver (triton 3.6)


# ---- torch -----------------------------------------------------------------------------------------------

class Properties:
    """torch.cuda.get_device_properties(): the attributes torch's _CudaDeviceProperties has, from the table."""

    def __init__(self, d: Device):
        self.name, (self.major, self.minor), self.gcnArchName = d.name, d.capability, d.gcn_arch_name
        for field in Device._fields[Device._fields.index("total_memory"):]:   # named as torch names them
            setattr(self, field, getattr(d, field))
        self.is_integrated, self.is_multi_gpu_board = False, False

    def __getattr__(self, name):   # only for attributes not set above (L2_cache_size, clock_rate, uuid, ...)
        raise NotModelled(f"torch.cuda.get_device_properties().{name}: kforge's device model of "
                          f"{_State.device.arch} does not give it (it gives {', '.join(vars(self))}); "
                          f"{READ_WITH_A_DEFAULT}")

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, "
                f"multi_processor_count={self.multi_processor_count}) (kforge's device model)")


def _install_torch(torch) -> None:
    cuda = torch.cuda
    stream = _handle("Stream", "a CUDA stream (torch.cuda.Stream)", torch.device("cuda", 0))
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_capability": lambda device=None: _State.device.capability,
        "get_device_name": lambda device=None: _State.device.name,
        "get_device_properties": lambda device=None: Properties(_State.device),
        "is_bf16_supported": lambda including_emulation=True: True,   # every modelled GPU has bf16
        "mem_get_info": lambda device=None: (_State.device.total_memory,) * 2,   # an idle device
        # torch.cuda.device(i) switches devices through these: one device, nothing to switch
        "_exchange_device": lambda device: 0,
        "_maybe_exchange_device": lambda device: 0,
        # every allocation, stream, event and synchronize on "cuda" initializes CUDA here first (torch's C++
        # calls torch.cuda._lazy_init too)
        "_lazy_init": functools.partial(_refuse, "initializing CUDA (a tensor or stream on a GPU, a "
                                                 "synchronize)"),
        # the stream work is queued on (`with torch.cuda.stream(side):` at import): a handle; nothing runs there
        "current_stream": lambda device=None: stream(),
        "default_stream": lambda device=None: stream(),
        "set_stream": lambda stream: None,
        "is_current_stream_capturing": lambda: False,   # no CUDA graph is captured: nothing runs here
    }
    for name, fn in answers.items():
        setattr(cuda, name, fn)
    cuda.graphs.is_current_stream_capturing = answers["is_current_stream_capturing"]   # the same, by its home
    # torch's device-generic API (torch 2.6 on), which answers for CUDA and ROCm alike as "cuda": bitsandbytes asks
    # `torch.accelerator.current_accelerator().type` at import
    accelerator = {"is_available": lambda: True,
                   "current_accelerator": lambda check_available=False: torch.device("cuda"),
                   "device_count": lambda: 1, "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
                   "set_device_index": lambda device: None, "set_device_idx": lambda device: None,
                   "current_stream": answers["current_stream"], "set_stream": lambda stream: None,
                   "get_memory_info": answers["mem_get_info"],
                   "synchronize": functools.partial(_refuse, "a synchronize (torch.accelerator.synchronize)")}
    for name, fn in accelerator.items() if hasattr(torch, "accelerator") else ():
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, fn)
    _GpuTensors.install()
    # a stream or event a library keeps from its import (a side stream, a timing event) is a handle until used (a
    # CPU torch's own fail with its words); a stream wrapping a real one, or a graph, is GPU work when made
    cuda.Stream = stream
    cuda.Event = _handle("Event", "a CUDA event (torch.cuda.Event)", torch.device("cuda", 0))
    for name, what in (("ExternalStream", "a CUDA stream (torch.cuda.ExternalStream)"),
                       ("CUDAGraph", "a CUDA graph (torch.cuda.CUDAGraph)")):
        setattr(cuda, name, _refusing(name, what))
    for name in ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all"):
        setattr(cuda, name, functools.partial(_refuse, f"the GPU's random state (torch.cuda.{name})"))
    if not hasattr(torch._C, "_cuda_getCurrentRawStream"):   # a CPU build: CUDA's own functions, by name (a GPU
        torch._C.__getattr__ = _cuda_only                     # build keeps its own)
    vendor = ARCHS[_State.device.arch].vendor
    own, version = TORCH_VERSIONS[vendor]
    other = TORCH_VERSIONS["amd" if vendor == "nvidia" else "nvidia"][0]
    if getattr(torch.version, own, None) is None:   # a CUDA (ROCm) torch keeps its own version string
        setattr(torch.version, own, version)
    setattr(torch.version, other, None)


READS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__", "__complex__", "__array__")


class _GpuTensors:
    """Tensors made on the modelled GPU at import (a lookup table, scratch buffers, `.cuda()`): torch's fake
    tensors, which answer device, dtype, shape and strides and hold no memory; reading their values (`.item()`,
    `if t:`) is NeedsGPU. A torch function mode, installed once per process; other tensors are untouched."""
    mode = None

    @classmethod
    def install(cls) -> None:
        if cls.mode is not None:
            return
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._pytree import tree_map
        from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                                   FakeTensor, FakeTensorMode)
        made: list = []   # the fake mode, made at the first tensor on the GPU (making one costs about 1.2 s)
        unreadable = (DataDependentOutputException, DynamicOutputShapeException)

        def fake_mode():
            if not made:
                made.append(FakeTensorMode(allow_non_fake_inputs=True))
            return made[0]

        def as_fake(value):
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                return fake_mode().from_tensor(value)
            return value

        def one_gpu(device) -> "torch.device":
            """"cuda" as torch.device("cuda", 0): a CPU build of torch cannot ask which device is current."""
            return torch.device("cuda", torch.device(device).index or 0)

        def on_gpu(value) -> bool:
            if isinstance(value, (str, torch.device)):
                return torch.device(value).type == "cuda"
            return isinstance(value, FakeTensor)

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                # page-locked host memory (a staging buffer): a CPU torch has no pinned allocator, and pinning
                # changes only how fast copies to the GPU go, so the tensor stays in ordinary host memory
                if kwargs.get("pin_memory"):
                    kwargs = {**kwargs, "pin_memory": False}
                if name == "pin_memory" and args and isinstance(args[0], torch.Tensor):
                    return args[0]
                if name == "cuda" and args:   # Tensor.cuda(device=None): torch's own needs a CUDA build
                    index = args[1] if len(args) > 1 else kwargs.get("device")
                    func, args, kwargs = type(args[0]).to, (args[0], torch.device("cuda", index or 0)), {}
                    name = "to"
                if isinstance(kwargs.get("device"), (str, torch.device)) and on_gpu(kwargs["device"]):
                    kwargs = {**kwargs, "device": one_gpu(kwargs["device"])}
                if name == "to" and len(args) > 1 and isinstance(args[1], (str, torch.device)) and on_gpu(args[1]):
                    args = (args[0], one_gpu(args[1]), *args[2:])
                wanted = kwargs.get("device")
                to_gpu = (wanted is not None and on_gpu(wanted)) or (name == "to" and len(args) > 1
                                                                      and on_gpu(args[1]))
                if not (to_gpu or any(isinstance(a, FakeTensor) for a in (*args, *kwargs.values()))):
                    return func(*args, **kwargs)
                # real tensors among the arguments (a CPU tensor moved to the GPU) become fake ones first: torch's
                # fake mode would otherwise run small ones for real (its constant propagation), on CUDA
                args, kwargs = tree_map(as_fake, (args, kwargs))
                fake = fake_mode()
                try:
                    with fake:
                        try:
                            return func(*args, **kwargs)
                        except NotImplementedError:   # torch.tensor(data, device="cuda") copies the data on
                            if wanted is None:        # the device itself: made on the CPU, then moved
                                raise
                            on_cpu = func(*args, **{**kwargs, "device": "cpu"})
                    with fake:
                        return as_fake(on_cpu).to(wanted)
                except (*unreadable, RuntimeError) as e:   # RuntimeError: what a CPU torch cannot model on "cuda"
                    if not isinstance(e, unreadable) and "support for cuda" not in str(e):
                        raise
                    raise needs_gpu(f"reading a tensor's values on the GPU ({name})" if isinstance(e, unreadable)
                                    or name in READS else f"{name or func} on a tensor on the GPU") from None
        cls.mode = Mode()
        cls.mode.__enter__()   # for the rest of this process, which serves the model


def _cuda_only(name: str):
    """torch._C's attributes a CUDA build has and a CPU build lacks (`from torch._C import
    _cuda_getCurrentRawStream`): there under the model; calling one is NeedsGPU."""
    if name.startswith(("_cuda", "_nccl")):
        return functools.partial(_refuse, f"torch._C.{name}")
    raise AttributeError(f"module 'torch._C' has no attribute {name!r}")


# ---- the GPU's runtime libraries, loaded by ctypes at import ----------------------------------------------

GPU_RUNTIMES = ("libcuda.", "libcudart.", "libnvrtc.", "libnvJitLink.", "libamdhip64.", "libhiprtc.")


def _install_ctypes() -> None:
    """ctypes.CDLL of a GPU runtime library this machine lacks (libcudart.so.12) loads a stand-in under the
    model; calling one of its functions is NeedsGPU."""
    import ctypes
    if getattr(ctypes.CDLL.__init__, "kforge_model", False):
        return
    real_init, real_getattr = ctypes.CDLL.__init__, ctypes.CDLL.__getattr__

    def init(self, name, *args, **kwargs):
        try:
            real_init(self, name, *args, **kwargs)
        except OSError:
            base = os.path.basename(name) if isinstance(name, str) else ""
            if _State.device is None or not base.startswith(GPU_RUNTIMES):
                raise
            self._name, self._handle, self._kforge_missing = name, 0, base

    def getattr_(self, name):
        missing = self.__dict__.get("_kforge_missing")
        if missing is not None and not name.startswith("__"):   # its ctypes attributes (argtypes) can be set
            return functools.partial(_refuse, f"{missing}'s {name}")
        return real_getattr(self, name)
    init.kforge_model = True
    ctypes.CDLL.__init__, ctypes.CDLL.__getattr__ = init, getattr_


def _refusing(name: str, what: str) -> type:
    """A class standing in for torch.cuda's `name`: subclassing it and isinstance() work, making one is NeedsGPU."""
    def refuse(cls, *args, **kwargs):
        raise needs_gpu(what)
    return type(name, (), {"__new__": refuse, "__module__": "torch.cuda"})


RAW_HANDLES = ("cuda_stream", "stream_id", "cuda_event", "event_id")


def _handle(name: str, what: str, device) -> type:
    """A class standing in for torch.cuda's Stream or Event: making one works and it answers its device; any
    other use (synchronize(), record(), its raw handle) is NeedsGPU naming it."""
    def init(self, *args, **kwargs):
        pass

    def use(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if attribute in RAW_HANDLES:   # the driver's handle, for a C extension
            raise needs_gpu(f"{what}'s {attribute}")
        return functools.partial(_refuse, f"{what}'s {attribute}()")
    return type(name, (), {"__init__": init, "__getattr__": use, "device": device, "__module__": "torch.cuda"})


def _refuse(what: str, *args, **kwargs):
    raise needs_gpu(what)


# ---- before a family's module is imported ----------------------------------------------------------------

class SetupFailed(RuntimeError):
    """A family's set-up hook raised; the message names it."""


# A library may ask the vendor's command-line tool which GPU is there (flag_gems runs `nvidia-smi`, `rocm-smi` and
# others at import and takes the vendor whose tool exits 0): _install_vendor_tools
VENDOR_TOOLS = {"nvidia": ("nvidia-smi",), "amd": ("rocm-smi", "amd-smi")}
# What a library runs to set a GPU machine up once it believes one is there: unsloth, as root, runs `ldconfig
# /usr/local/cuda-X` when libcuda is not found. On the builder that would rewrite the system's linker cache for a GPU
# the model only pretends: these are not found under the model (ldconfig's queries, -p, still run: ctypes'
# find_library reads the cache with them)
SETUP_TOOLS = ("ldconfig", "modprobe", "nvidia-modprobe", "nvidia-persistenced")
_SMI = r"""
import sys
name, cap, mib, tool, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if tool == "nvidia-smi" and query is not None:
    fields = {"name": name, "compute_cap": cap, "memory.total": mib + " MiB", "count": "1", "index": "0"}
    print(", ".join(fields.get(f.strip(), "[N/A]") for f in query.split(",")))
elif tool == "nvidia-smi":
    print(f"GPU 0: {name} (UUID: GPU-00000000-0000-0000-0000-000000000000)")
else:
    print(f"GPU[0]\t\t: Card Series: \t\t{name}")
"""


def _install_vendor_tools() -> None:
    """Under the model, the reference GPU's vendor's tools run a stand-in that answers as it (`nvidia-smi -L`,
    `--query-gpu=...`); the other vendor's, and the set-up tools (SETUP_TOOLS), are not found (FileNotFoundError,
    or a shell's exit 127, as on a machine without them), through subprocess or os.system."""
    import inspect
    import subprocess
    if getattr(subprocess.Popen._execute_child, "kforge_model", False):
        return
    real, real_system = subprocess.Popen._execute_child, os.system
    shell_at = list(inspect.signature(real).parameters).index("shell") - 3   # its place after (args, executable)

    def execute_child(self, args, executable, *rest):
        device, shell = _State.device, rest[shell_at]
        argv = _words(args, shell)
        program = os.path.basename(os.fsdecode(executable or argv[0])) if argv else ""
        program, answer = _answered(program, args, executable)
        if answer:
            rest = (*rest[:shell_at], False, *rest[shell_at + 1:])
            if answer == "model":
                cap = f"{device.capability[0]}.{device.capability[1]}"
                args = [sys.executable, "-c", _SMI, device.name, cap, str(device.total_memory >> 20), program,
                        *map(os.fsdecode, argv[1:])]
            elif shell:   # as a shell says of a command it does not have
                args = [sys.executable, "-c", f"import sys; sys.stderr.write('sh: 1: {program}: not found\\n'); "
                                              f"sys.exit(127)"]
            else:
                raise FileNotFoundError(2, f"No such file or directory: {program!r} (kforge's device model: "
                                           f"{answer})", program)
            executable = None
        return real(self, args, executable, *rest)

    def system(command):   # a shell runs it: what execute_child answers, answered through subprocess
        argv = _words(command, True)
        if not _answered(os.path.basename(os.fsdecode(argv[0])) if argv else "", command)[1]:
            return real_system(command)
        code = subprocess.call(command, shell=True)
        return code << 8 if code >= 0 else -code   # os.system's wait status
    execute_child.kforge_model = True
    subprocess.Popen._execute_child = execute_child
    os.system = system


def _answered(program: str, args, executable=None) -> tuple[str, str]:
    """How the model answers a program run: (the program, "model") for the reference GPU's tool's stand-in, (the
    program, why it is not found) for another vendor's tool or a set-up tool in any of the commands it runs, or
    (program, "") where it runs."""
    device = _State.device
    if device is None:
        return program, ""
    vendor = next((v for v, tools in VENDOR_TOOLS.items() if program in tools), None)
    if vendor is not None:
        return program, "model" if vendor == ARCHS[device.arch].vendor else f"{device.name} is no {vendor} GPU"
    tool = _setup_tool(args, executable)
    return (tool, f"{tool} sets a GPU machine up, which this is not") if tool else (program, "")


# a set-up tool named anywhere in what runs: a shell line's every command, after a redirection or `timeout`, in
# `bash -lc '...'` or a variable (`L=ldconfig; $L /x`), by a path or with a suffix (Debian's ldconfig.real)
SETUP_TOOL = re.compile(r"(?<![\w.-])(?:[\w.-]*/)*(" + "|".join(map(re.escape, SETUP_TOOLS)) + r")(?:\.\w+)?(?![\w./-])")


def _setup_tool(args, executable=None) -> str:
    """The set-up tool (SETUP_TOOLS) a command names anywhere, or "" for none. One exception: a command naming
    ldconfig once, with its query flag (-p, --print-cache or a prefix of it) and no `--`, which ctypes'
    find_library runs: it only reads the cache."""
    words = [os.fsdecode(args)] if isinstance(args, (str, bytes, os.PathLike)) else [os.fsdecode(a) for a in args]
    text = " ".join([*words, *([os.fsdecode(executable)] if executable is not None else [])])
    found = [m[1] for m in SETUP_TOOL.finditer(text)]
    if not found:
        return ""
    flags = text.split()
    query = found == ["ldconfig"] and "--" not in flags and any(
        f == "-p" or (f.startswith("--p") and "--print-cache".startswith(f)) for f in flags)
    return "" if query else found[0]


def _words(args, shell: bool) -> list:
    """A command's words; a shell command's only where it is one plain command (no pipe, redirection, variable)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        if not shell:
            return [args]
        import shlex
        text = os.fsdecode(args)
        try:
            return shlex.split(text) if not any(c in text for c in "|&;<>()$`*?[]{}~\n") else []
        except ValueError:   # an unclosed quote: the shell's to report
            return []
    return list(args)


def prepare(arch: str, model: bool, setup: tuple[str, ...] = ()) -> None:
    """What a process that imports a family's module for `arch` does first: the device model (unless switched
    off), then the set-up hooks ("module:function"), each called with the arch name if it takes an argument."""
    if model:
        install(arch)
        shared_env.hide_flydsl()   # kforge's FlyDSL is no part of the target's environment (shared_env.py)
    for ref in setup:
        module, name = ref.split(":")
        try:
            hook = getattr(importlib.import_module(module), name)
            hook(arch) if _takes_one(hook) else hook()
        except Exception as e:
            raise SetupFailed(f"setup hook {ref} failed for {arch}: {type(e).__name__}: {e}".splitlines()[0]) \
                from None


def _takes_one(fn) -> bool:
    import inspect
    try:
        inspect.signature(fn).bind("arch")
        return True
    except (TypeError, ValueError):
        return False
