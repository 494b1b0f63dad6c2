"""The GPU in front of us, in kforge's arch names, and which bundle archs can run on it."""
from __future__ import annotations

import ctypes
import sys

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class DeviceError(RuntimeError):
    pass


def runnable_archs(device: int = 0) -> tuple[str, list[str]]:
    """(what the device is, the bundle archs whose binaries run on it, best first)."""
    torch = sys.modules.get("torch")   # only if the application already imported it: never imported here
    if torch is not None and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        if getattr(torch.version, "hip", None):
            gfx = props.gcnArchName.split(":")[0]   # "gfx942:sramecc+:xnack-" -> "gfx942"
            return f"{props.name} ({gfx})", [gfx]
        return f"{props.name} (sm_{props.major}{props.minor})", cuda_archs(props.major, props.minor)
    major, minor = _cuda_capability(device)
    return f"CUDA device {device} (sm_{major}{minor})", cuda_archs(major, minor)


def cuda_archs(major: int, minor: int) -> list[str]:
    """A cubin runs on the SM it was built for and on later minors of the same major; an arch-specific
    build ("a": sm_90a's wgmma, setmaxnreg) runs only on exactly its SM."""
    return [f"sm_{major}{minor}a"] + [f"sm_{major}{m}" for m in range(minor, -1, -1)]


def _cuda_capability(device: int) -> tuple[int, int]:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise DeviceError("no GPU runtime found (neither torch with a GPU nor libcuda.so.1); "
                          "pass arch= to choose a bundle explicitly") from None
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if (cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), device)
            or cu.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            or cu.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)):
        raise DeviceError(f"CUDA device {device} is not usable (cuInit/cuDeviceGet failed)")
    return major.value, minor.value
