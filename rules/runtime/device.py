"""The GPU in front of us, in kforge's arch names, and which bundle archs can run on it."""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

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
    _, _, (major, minor) = _cuda(device, "no GPU runtime found (neither torch with a GPU nor libcuda.so.1); pass "
                                         "arch= to choose a bundle explicitly")
    return f"CUDA device {device} (sm_{major}{minor})", cuda_archs(major, minor)


def cuda_archs(major: int, minor: int) -> list[str]:
    """A cubin runs on the SM it was built for and on later minors of the same major; an arch-specific
    build ("a": sm_90a's wgmma, setmaxnreg) runs only on exactly its SM."""
    return [f"sm_{major}{minor}a"] + [f"sm_{major}{m}" for m in range(minor, -1, -1)]


def _cuda(device: int, missing: str) -> tuple:
    """(libcuda, the device's handle, its compute capability); DeviceError `missing` without libcuda."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise DeviceError(missing) from None
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if (cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), device)
            or cu.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
            or cu.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)):
        raise DeviceError(f"CUDA device {device} is not usable (cuInit/cuDeviceGet failed)")
    return cu, dev, (major.value, minor.value)


def identity(device: int = 0) -> dict:
    """What a tuning result depends on: the GPU's vendor, name, arch and driver version (no torch, no compiler); a
    process that must not make a GPU context before it forks runs `python -m kforge_runtime.device`."""
    if os.path.exists("/dev/kfd") and not os.path.exists("/dev/nvidiactl"):
        return _amd_identity(device)
    cu, dev, (major, minor) = _cuda(device, "no GPU here: neither libcuda.so.1 nor /dev/kfd (tuning needs a GPU of "
                                            "the arch)")
    version, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    if cu.cuDeviceGetName(name, 256, dev) or cu.cuDriverGetVersion(ctypes.byref(version)):
        raise DeviceError(f"CUDA device {device}: cannot read its name or the driver version")
    return {"vendor": "nvidia", "name": name.value.decode(), "archs": cuda_archs(major, minor),
            # the kernel driver's release (580.159.04): finer than cuDriverGetVersion's CUDA API level
            "driver": _read("/sys/module/nvidia/version") or str(version.value)}


def _amd_identity(device: int) -> dict:
    """From the KFD topology in sysfs: GPU nodes have a non-zero gfx_target_version (e.g. 90402 = gfx942)."""
    gpus = []
    for node in sorted(Path("/sys/class/kfd/kfd/topology/nodes").glob("*"), key=lambda p: int(p.name)):
        props = dict(line.split(" ", 1) for line in (node / "properties").read_text().splitlines() if " " in line)
        version = int(props.get("gfx_target_version", "0"))
        if version:
            name = (node / "name").read_text().strip() if (node / "name").exists() else "AMD GPU"
            gfx = f"gfx{version // 10000}{(version // 100) % 100:x}{version % 100:x}"
            gpus.append({"vendor": "amd", "name": name, "archs": [gfx],
                         "driver": _read("/sys/module/amdgpu/version") or "unknown"})
    if device >= len(gpus):
        raise DeviceError(f"AMD GPU {device} not found in the KFD topology ({len(gpus)} GPUs)")
    return gpus[device]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    try:
        print(json.dumps(identity(int(sys.argv[1]) if len(sys.argv) > 1 else 0), sort_keys=True))
    except DeviceError as e:
        sys.stderr.write(f"kforge: {e}\n")
        raise SystemExit(1)
