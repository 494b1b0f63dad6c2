"""The device model (rules/load/device_model.py): torch and Triton answer as each arch's reference GPU in the processes
that import a family's module, nothing needing a real GPU runs, set-up hooks run first, and a family may switch
the model off. The library is tests/device_library.py (it asserts a GPU at import), on PYTHONPATH from a tmp site."""
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kforge.base.archs import ARCHS
from kforge.load.device_model import DEVICES
from tests import device_library
from tests.support import REPO, computed_once, doit, make_project, statuses

SCALE_TARGETS = {   # DEVLIB_BLOCKS per arch, less what the reference GPU's shared memory drops (2048 on gfx942)
    "devlib_scale:fp32-block512-num_warps8-num_stages3@sm_90a", "devlib_scale:fp32-block2048-num_warps8-num_stages3@sm_90a",
    "devlib_scale:fp32-block256-num_warps4-num_stages3@gfx942", "devlib_scale:fp32-block1024-num_warps4-num_stages3@gfx942"}
HOOKED_TARGETS = {"devlib_hooked:block128@sm_90a", "devlib_hooked:block128@gfx942"}
TABLES_TARGETS = {"devlib_tables:block128@sm_90a", "devlib_tables:block128@gfx942"}


def test_every_arch_has_a_reference_gpu_that_agrees_with_the_arch_table():
    assert set(DEVICES) == set(ARCHS)
    for name, d in DEVICES.items():
        a = ARCHS[name]
        assert (d.warp_size, d.shared_memory_per_block_optin) == (a.warp_size, a.max_shared)
        assert d.shared_memory_per_block <= d.shared_memory_per_block_optin <= d.shared_memory_per_multiprocessor
        if a.vendor == "nvidia":
            assert d.capability[0] * 10 + d.capability[1] == a.target_arch and d.gcn_arch_name == ""
        else:
            assert d.gcn_arch_name.split(":")[0] == a.target_arch and d.capability == (9, int(a.target_arch[4], 16))


def test_the_documented_table_is_the_models_table():
    text = (REPO / "docs" / "device_model.md").read_text()
    rows = {cells[0]: cells for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
        if line.startswith("| sm_") or line.startswith("| gfx"))}
    kib = lambda n: f"{n // 1024} KiB"
    for name, d in DEVICES.items():
        assert rows[name] == [name, d.name, f"{d.capability[0]}.{d.capability[1]}", d.gcn_arch_name,
                              f"{d.total_memory >> 30} GiB", str(d.multi_processor_count), str(d.warp_size),
                              f"{kib(d.shared_memory_per_block)} ({kib(d.shared_memory_per_block_optin)})",
                              kib(d.shared_memory_per_multiprocessor), str(d.regs_per_multiprocessor)], name


ANSWERS = '''
import json, sys
from kforge.load import device_model
answers = {}
for arch in sys.argv[2:]:
    device_model.install(arch)
    import torch, triton   # the first install patches torch when it is imported
    from triton.runtime import driver
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    with torch.cuda.device(0):
        pass
    answers[arch] = {
        "torch": [torch.cuda.is_available(), torch.cuda.device_count(), list(torch.cuda.get_device_capability()),
                  torch.cuda.get_device_name(), torch.version.cuda is not None, torch.version.hip is not None,
                  # gemlite asks at import: a CPU torch raised its "dummy base class" error, naming no fix
                  torch.cuda.is_current_stream_capturing(), torch.cuda.graphs.is_current_stream_capturing(),
                  # torch's device-generic API (bitsandbytes asks `current_accelerator().type` at import)
                  torch.accelerator.is_available(), str(torch.accelerator.current_accelerator()),
                  torch.accelerator.device_count(), torch.accelerator.current_device_index()],
        "properties": [p.name, p.major, p.minor, p.gcnArchName, p.total_memory, p.multi_processor_count, p.warp_size,
                       p.shared_memory_per_block, p.shared_memory_per_block_optin, p.shared_memory_per_multiprocessor,
                       p.regs_per_multiprocessor, hasattr(p, "L2_cache_size")],
        "target": [(t := driver.active.get_current_target()).backend, t.arch, t.warp_size],
        "triton": driver.active.utils.get_device_properties(0),
        "meta": str(torch.empty(4, device="meta").device),
    }
# then prepare(), for an arch other than the last one installed above: the hooks see it only if it installs first
sys.path.insert(0, sys.argv[1])
device_model.prepare("sm_100a", True, ("hooks_a:with_arch", "hooks_a:without"))
import hooks_a
prepared = [repr(hooks_a.SEEN)]
try:
    device_model.prepare("sm_100a", True, ("hooks_a:broken",))
except device_model.SetupFailed as e:
    prepared.append(str(e))
print(json.dumps({"answers": answers, "prepared": prepared}))
'''
HOOKS_A = '''
import torch
SEEN = []
def with_arch(arch):
    SEEN.append((arch, torch.cuda.get_device_name()))
def without():
    SEEN.append("no argument")
def broken(arch):
    raise ValueError("no such\\nthing")
'''


def _python(code: str, *args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def modelled(tmp_path_factory) -> dict:
    """What ANSWERS printed: the model installed before torch was imported (each arch in turn), then prepare()
    with set-up hooks. One child for both tests (each import of torch is about 2 s of CPU), once for the run."""
    return computed_once(tmp_path_factory, "device-model-modelled", _modelled)


def _modelled(folder: Path) -> dict:
    (folder / "hooks_a.py").write_text(HOOKS_A)
    assert list(DEVICES)[-1] != "sm_100a"
    proc = _python(ANSWERS, str(folder), *DEVICES, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_torch_and_tritons_driver_answer_as_each_archs_reference_gpu(modelled):
    answers = modelled["answers"]
    for name, d in DEVICES.items():
        a, vendor = answers[name], ARCHS[name].vendor
        assert a["torch"] == [True, 1, list(d.capability), d.name, vendor == "nvidia", vendor == "amd", False, False,
                              True, "cuda", 1, 0]
        assert a["properties"] == [d.name, *d.capability, d.gcn_arch_name, d.total_memory, d.multi_processor_count,
                                   d.warp_size, d.shared_memory_per_block, d.shared_memory_per_block_optin,
                                   d.shared_memory_per_multiprocessor, d.regs_per_multiprocessor, False]
        assert a["target"] == [ARCHS[name].backend, ARCHS[name].target_arch, d.warp_size]
        assert {k: a["triton"][k] for k in ("max_shared_mem", "multiprocessor_count", "warpSize")} == {
            "max_shared_mem": d.shared_memory_per_block_optin, "multiprocessor_count": d.multi_processor_count,
            "warpSize": d.warp_size}
        assert a["triton"].get("arch") == (d.gcn_arch_name if vendor == "amd" else None)
        assert a["meta"] == "meta"


NEEDS_GPU = '''
import importlib, os, sys, traceback
from kforge.load import device_model
device_model.install("gfx942")
import torch, triton   # what each module imports first: once here, then a process of its own per module
# no tensor made here: each module's first tensor on the modelled GPU starts the model's fake tensors from cold, as
# a library's import does in a probe or a compile server
sys.path.insert(0, sys.argv[1])
for module in sys.argv[2:]:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
            print(module, "|", module, "imported")
        except device_model.NeedsGPU as e:
            print(module, "|", e)
        except BaseException:
            print(module, "|", traceback.format_exc().replace(chr(10), " / "))
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
'''
GPU_WORK = {   # a module doing something only a real GPU can do at import, and the call the error names
    "reads": ('import torch\nx = torch.zeros(4, device="cuda")\nn = int(x.sum())\n',
              "reading a tensor's values on the GPU"),
    "synchronizes": ("import torch\ntorch.cuda.synchronize()\n", "torch.cuda.synchronize()"),
    "launches": ("import torch, triton, triton.language as tl\n\n@triton.jit\ndef k(x_ptr):\n    pass\n\n"
                 'k[(1,)](torch.empty(4, device="meta"))\n', "a Triton kernel launch"),
    "benchmarks": ("import triton\ntriton.runtime.driver.active.get_benchmarker()\n", "benchmarking"),
    # made without the lazy init a CPU torch never runs: torch's own stand-ins would fail in its words
    # a stream or event made at import is a handle (below); using one is GPU work
    "streams": ("import torch\nS = torch.cuda.Stream()\nS.synchronize()\n",
                "a CUDA stream (torch.cuda.Stream)'s synchronize()"),
    "events": ("import torch\nE = torch.cuda.Event(enable_timing=True)\nE.record()\n",
               "a CUDA event (torch.cuda.Event)'s record()"),
    "graphs": ("import torch\nclass G(torch.cuda.CUDAGraph):\n    pass\nG()\n", "a CUDA graph"),
    "seeds": ("import torch\nstate = torch.cuda.get_rng_state()\n", "the GPU's random state"),
    # a CUDA backend: CUDA-only torch functions and the CUDA runtime's library, by name (a CPU torch has neither)
    "raw_stream": ("from torch._C import _cuda_getCurrentRawStream as raw_stream\nraw_stream(0)\n",
                   "torch._C._cuda_getCurrentRawStream"),
    "cudart": ('import ctypes\nrt = ctypes.CDLL("libcudart.so.12")\nrt.cudaGetDeviceCount.restype = ctypes.c_int\n'
               "rt.cudaGetDeviceCount(ctypes.byref(ctypes.c_int()))\n", "libcudart.so.12's cudaGetDeviceCount"),
}


# modules made by a library at import, each imported under the model (gfx942) by NEEDS_GPU
STREAMS_AT_IMPORT = (
    "import torch\n"
    "class SideStream(torch.cuda.Stream):\n"
    "    pass\n"
    "S = torch.cuda.Stream(priority=-1)\n"
    "SIDE = SideStream(device=torch.cuda.current_device())\n"
    "E = torch.cuda.Event(enable_timing=False)\n"
    "assert isinstance(SIDE, torch.cuda.Stream) and S.device == torch.device('cuda', 0), S.device\n"
    "assert E.device == torch.device('cuda', 0) and S != SIDE and S == S\n"
    "with torch.cuda.stream(SIDE):\n"
    "    WORK = torch.empty(4, device='cuda')\n"
    "MAIN = torch.cuda.current_stream()\n"
    "MAIN.device, torch.cuda.default_stream(0).device\n")
PINNED_AT_IMPORT = (
    "import torch\n"
    "STAGING = torch.empty(1024, dtype=torch.uint8, pin_memory=True)\n"
    "HOST = torch.zeros(4).pin_memory()\n"
    "ON_GPU = HOST.to('cuda', non_blocking=True)\n"
    "assert STAGING.device.type == 'cpu' and ON_GPU.device == torch.device('cuda', 0)\n")
CUDA_BACKEND = (
    "import ctypes\n"
    "import torch\n"
    "from torch._C import _cuda_getCurrentRawStream as get_raw_stream  # noqa: F401\n"
    "RT = ctypes.CDLL('libcudart.so.12')\n"
    "RT.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]\n"
    "HAS = hasattr(torch._C, '_cuda_getDevice') and not hasattr(torch._C, 'no_such_thing')\n")
AT_IMPORT = {**{f"gpu_{work}": source for work, (source, _) in GPU_WORK.items()},
             "streams_at_import": STREAMS_AT_IMPORT,
             "raw_stream_at_import": "import torch\nRAW = torch.cuda.Stream().cuda_stream\n",
             "pinned_at_import": PINNED_AT_IMPORT, "cuda_backend": CUDA_BACKEND}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, str]:
    """AT_IMPORT's modules, each imported in a process of its own under the model: module -> the line its import
    printed. The processes are forked from one that imported torch (2 s of CPU) and made a first tensor on the
    GPU (1 s) once for all of them, and once for the run: the xdist workers that run this module's tests share
    it (computed_once)."""
    return computed_once(tmp_path_factory, "device-model-at-import", _imported)


def _imported(folder: Path) -> dict[str, str]:
    for name, source in AT_IMPORT.items():
        (folder / f"{name}.py").write_text(source)
    proc = _python(NEEDS_GPU, str(folder), *AT_IMPORT, cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert list(said) == list(AT_IMPORT), proc.stdout + proc.stderr
    return said


# torch imported before the model: first prepare() with the model off (it only runs the hooks), then install()
TORCH_FIRST = '''
import sys; sys.path.insert(0, sys.argv[1])
from kforge.load import device_model
device_model.prepare('gfx950', False, ('hooks_b:hook',))
import hooks_b, torch
print(hooks_b.SEEN, device_model.current(), torch.cuda.is_available())
import triton
device_model.install("sm_90a")
for read in (lambda: torch.cuda.get_device_properties(0).L2_cache_size,
             lambda: triton.runtime.driver.active.utils.get_device_properties(0)["mem_clock_rate"]):
    try:
        read()
    except (AttributeError, KeyError) as e:
        print(f"{type(e).__name__}: {e}")
print(hasattr(torch.cuda.get_device_properties(0), "L2_cache_size"))
'''


@pytest.fixture(scope="module")
def torch_first(tmp_path_factory) -> dict:
    """TORCH_FIRST's exit status and output: one child for the two tests of a process that imported torch before
    any model was installed, once for the run."""
    return computed_once(tmp_path_factory, "device-model-torch-first", _torch_first)


def _torch_first(folder: Path) -> dict:
    (folder / "hooks_b.py").write_text("import torch\nSEEN = []\ndef hook(arch):\n"
                                       "    SEEN.append((arch, torch.cuda.is_available()))\n")
    proc = _python(TORCH_FIRST, str(folder), cwd=folder)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def test_a_property_the_model_lacks_says_so_and_the_fix_and_hasattr_is_false(torch_first):
    lines = torch_first["stdout"].strip().splitlines()[1:]   # the first is the test below's
    assert torch_first["rc"] == 0 and len(lines) == 3, torch_first["stdout"] + torch_first["stderr"]
    assert lines[0].startswith("NotModelled: torch.cuda.get_device_properties().L2_cache_size: kforge's device model")
    assert lines[1].startswith("KeyError: \"'mem_clock_rate': kforge's device model of sm_90a does not give it")
    assert all("read it with a default" in line and "device_model = false" in line for line in lines[:2]), lines
    assert lines[2] == "False"


def test_what_needs_a_real_gpu_fails_in_one_line_naming_the_call_and_where(imported):
    for work, (_, call) in GPU_WORK.items():
        line = imported[f"gpu_{work}"]
        assert call in line and f"gpu_{work}.py:" in line and "needs a real GPU: " in line, line
        assert "gfx942" in line and "AMD Instinct MI300X" in line and "device_model = false" in line


def test_streams_and_events_made_at_import_are_handles_that_answer_as_the_gpus(imported):
    """A library that keeps a side stream and an event from its import (torch.cuda.Stream(), torch.cuda.Event(),
    its own subclass of Stream, the current stream) or allocates under `with torch.cuda.stream(side):` imports
    under the model: they launch nothing until used (STREAMS_AT_IMPORT); using one is GPU work."""
    assert imported["streams_at_import"] == "streams_at_import imported"
    raw = imported["raw_stream_at_import"]
    assert raw.startswith("a CUDA stream (torch.cuda.Stream)'s cuda_stream at raw_stream_at_import.py:2"), raw


def test_pinned_host_memory_made_at_import_is_host_memory_under_the_model(imported):
    """A staging buffer in page-locked host memory made at import (pin_memory=True, .pin_memory():
    PINNED_AT_IMPORT): a CPU torch has no pinned allocator and raised its own RuntimeError; pinning only changes
    how fast copies go."""
    assert imported["pinned_at_import"] == "pinned_at_import imported"


def test_a_cuda_backend_imports_under_the_model_where_it_only_names_what_it_would_call(imported):
    """A library whose __init__ picks its CUDA backend (torch.cuda.is_available() is True under the model): the
    backend names CUDA-only torch functions and loads the CUDA runtime at import (CUDA_BACKEND); on a CPU torch
    that was a raw AttributeError (and OSError: libcudart.so.12). Naming them works; calling one is the one-line
    NeedsGPU."""
    assert imported["cuda_backend"] == "cuda_backend imported"
    proc = _python("import ctypes\ntry:\n    ctypes.CDLL('libcudart.so.12')\nexcept OSError:\n    print('absent')\n")
    assert proc.stdout.strip() in ("absent", ""), proc.stdout   # without the model: ctypes' own OSError


VENDOR_TOOLS = '''
import subprocess
from kforge.load import device_model

def ask(command, shell=False):
    try:
        done = subprocess.run(command, shell=shell, capture_output=True, text=True)
        return f"{done.returncode} {done.stdout.strip()}".strip()
    except FileNotFoundError:
        return "not found"

for arch in ("sm_90a", "gfx942"):
    device_model.install(arch)
    print(ask(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"]))
    print(ask("nvidia-smi -L", shell=True))
    print(ask(["rocm-smi", "--showproductname"]))
    print(ask("rocm-smi", shell=True))
'''


def test_the_vendors_gpu_tool_answers_as_the_reference_gpu_and_the_other_vendors_is_not_there(tmp_path):
    """flag_gems runs each vendor's tool at import (`nvidia-smi`, `rocm-smi`, ...) and takes the one that exits 0:
    on a CPU none did, and its import failed for every target ("No device were detected")."""
    proc = _python(VENDOR_TOOLS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    h100, mi300x = DEVICES["sm_90a"], DEVICES["gfx942"]
    assert proc.stdout.splitlines() == [
        f"0 {h100.name}, 9.0, {h100.total_memory >> 20} MiB",
        f"0 GPU 0: {h100.name} (UUID: GPU-00000000-0000-0000-0000-000000000000)",
        "not found", "127",
        "not found", "127",
        f"0 GPU[0]\t\t: Card Series: \t\t{mi300x.name}", f"0 GPU[0]\t\t: Card Series: \t\t{mi300x.name}"]


SETUP_TOOLS = '''
import os, subprocess
from kforge.load import device_model

def run(argv):
    try:
        return subprocess.run(argv).returncode
    except FileNotFoundError:
        return "not found"

def run_all():
    return [os.system("ldconfig /usr/local/cuda-13.0") >> 8, run(["ldconfig", "/usr/local/cuda-13.0"]),
            run(["ldconfig", "-p"]), os.system("modprobe nvidia") >> 8, os.system("echo plain > /dev/null") >> 8,
            os.system("ldconfig /usr/local/cuda-13.0 2>/dev/null") >> 8,
            os.system("env FOO=1 ldconfig /no-such-folder/cuda-*") >> 8, run(["sh", "-c", "ldconfig /y"]),
            os.system("ldconfig.real /x") >> 8, os.system("ldconfig -p | head -1 > /dev/null") >> 8,
            os.system("2>/dev/null timeout 5 ldconfig /t") >> 8, run(["sh", "-ec", "L=ldconfig; $L /v"]),
            os.system("ldconfig /d -- -p") >> 8, subprocess.run(["ldconfig /s"], shell=True).returncode,
            os.system("echo 'unclosed") >> 8]

print(run_all())
device_model.install("sm_90a")
print(run_all())
'''


def test_tools_that_set_a_gpu_machine_up_are_not_found_under_the_model_and_queries_still_run(tmp_path):
    """unsloth, as root, runs `os.system("ldconfig /usr/local/cuda-X")` at import when libcuda is not found and
    torch says a GPU is there: under the model that rewrote the builder's /etc/ld.so.cache. Stand-ins on PATH record
    what runs: without the model all of it; under it only `ldconfig -p` (ctypes.util.find_library's query)."""
    import os
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ldconfig", "modprobe", "ldconfig.real"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {tmp_path}/ran\n")
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = _python(SETUP_TOOLS, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]",
                                        "[127, 'not found', 0, 127, 0, 127, 127, 'not found', 127, 0, 127, "
                                        "'not found', 127, 127, 2]"], proc.stdout
    assert (tmp_path / "ran").read_text().splitlines() == [
        "ldconfig /usr/local/cuda-13.0", "ldconfig /usr/local/cuda-13.0", "ldconfig -p", "modprobe nvidia",
        "ldconfig /usr/local/cuda-13.0", "ldconfig /no-such-folder/cuda-*", "ldconfig /y", "ldconfig.real /x",
        "ldconfig -p", "ldconfig /t", "ldconfig /v", "ldconfig /d -- -p", "ldconfig /s",
        "ldconfig -p", "ldconfig -p"]   # under the model: the queries alone


def test_prepare_installs_the_model_then_runs_the_set_up_hooks_in_order_with_the_arch(modelled):
    assert modelled["prepared"] == ["[('sm_100a', 'NVIDIA B200'), 'no argument']",
                                    "setup hook hooks_a:broken failed for sm_100a: ValueError: no such"]


def test_without_the_model_prepare_only_runs_the_hooks(torch_first):
    assert torch_first["rc"] == 0, torch_first["stderr"]
    import torch
    here = torch.cuda.is_available()   # this machine, as it is
    assert torch_first["stdout"].splitlines()[0] == f"[('gfx950', {here})] None {here}"


# ---- the library built with kforge ----------------------------------------------------------------------

@pytest.fixture
def devlib(tmp_path):
    site = device_library.write(tmp_path / "site")
    return site, {"PYTHONPATH": str(site)}


def _meta(root: Path, target: str) -> dict:
    kernel, rest = target.split(":")
    config, arch = rest.split("@")
    return json.loads((root / "out" / arch / kernel / config / "meta.json").read_text())


@pytest.mark.slow
def test_a_library_that_asserts_a_gpu_and_makes_tensors_on_it_at_import_builds_on_a_cpu_with_each_archs_own_configs(
        tmp_path, devlib):
    """devlib_scale builds with each arch's own autotune configs and heuristics, devlib_hooked after its set-up
    hook ran with the arch, and devlib_tables, whose module makes a lookup table per GPU and a scratch buffer at
    import: under the model they are tensors that answer as the GPU's (device, dtype, shape) and hold no memory.
    The three in one build: a build of each started the compile servers and imported torch and the library again."""
    site, env = devlib
    root = make_project(tmp_path / "p", specs={"devlib_scale": device_library.scale_spec(),
                                               "devlib_hooked": device_library.HOOKED,
                                               "devlib_tables": device_library.TABLES},
                        kernels={"hooks": device_library.HOOKS})
    doit(root, "-n", "1", env=env)   # one worker: each more imports torch and the library again
    # listed after the build: the catalog it saved, not a second load of every family's module per arch
    listed = {t for t in doit(root, "list", "--all", "--quiet", env=env).stdout.split() if "@" in t}
    assert listed == SCALE_TARGETS | HOOKED_TARGETS | TABLES_TARGETS
    assert statuses(root, "built") == listed
    for target in SCALE_TARGETS:   # the heuristic's value is the reference GPU's SM / CU count
        arch = target.split("@")[1]
        meta = _meta(root, target)
        assert meta["constexprs"]["NUM_SMS"] == DEVICES[arch].multi_processor_count == {"sm_90a": 132,
                                                                                        "gfx942": 304}[arch]
        assert meta["num_warps"] == (8 if arch == "sm_90a" else 4)   # the library's choice per vendor
    for target in HOOKED_TARGETS:   # the set-up hook ran with the arch, before the module was imported
        assert _meta(root, target)["constexprs"]["WIDE"] == target.endswith("gfx942")

    hooks = root / "tk" / "hooks.py"   # the hook's module is in the key: editing it rebuilds its family only
    hooks.write_text(hooks.read_text() + "\n# edited\n")
    doit(root, "-n", "1", env=env)
    assert statuses(root, "built") == HOOKED_TARGETS and statuses(root, "up-to-date") == SCALE_TARGETS | TABLES_TARGETS


def test_gpu_memory_read_at_import_a_missing_set_up_hook_and_a_broken_one_each_break_one_family_in_one_line(
        tmp_path, devlib):
    """Three families of devlib that cannot load, listed together (rules/plan/catalog.py keeps going at load): one
    whose module reads GPU memory at import (devlib_alloc), one without the set-up hook its module needs
    (devlib_hooked) and one whose hook raises (devlib_badhook). Each is BROKEN with its cause in one line. On
    sm_90a alone: what is asserted is one arch's message (each more arch is one more import of torch)."""
    site, env = devlib
    hooked = device_library.HOOKED.replace('archs = ["sm_90a", "gfx942"]', 'archs = ["sm_90a"]')
    without = hooked.replace('setup = "tk.hooks:configure"\n', "")
    bad_hook = hooked.replace('name = "devlib_hooked"', 'name = "devlib_badhook"')
    root = make_project(tmp_path / "p", specs={"devlib_alloc": device_library.ALLOC, "devlib_hooked": without,
                                               "devlib_badhook": bad_hook},
                        kernels={"hooks": "def configure(arch):\n    raise OSError('no licence file')\n"})
    proc = doit(root, "list", env=env, check=False)
    broken = [line for line in proc.stderr.splitlines() if "did not load" in line]
    assert proc.returncode == 0 and len(broken) == 3, proc.stderr
    for family in ("devlib_alloc", "devlib_hooked", "devlib_badhook"):
        assert len([line for line in broken if f"family {family} did not load" in line]) == 1, proc.stderr
        assert any(line.startswith(f"{family} ") and "BROKEN" in line for line in proc.stdout.splitlines()), \
            proc.stdout
    assert re.search(r"specs/devlib_alloc\.toml: .*NeedsGPU: reading a tensor's values on the GPU \(\w+\) at "
                     r"devlib/alloc\.py:6 \(`LIMIT = int\(SCRATCH\.sum\(\)\)`\) needs a real GPU: ", proc.stderr), \
        proc.stderr
    assert "ImportError: call devlib.configure(arch)" in proc.stderr
    assert "setup hook tk.hooks:configure failed for sm_90a: OSError: no licence file" in proc.stderr


def test_a_family_with_device_model_false_imports_as_this_machine_is(tmp_path, devlib):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the library would import with the model off too")
    site, env = devlib
    # on sm_90a alone: what is asserted is the message (each more arch is one more import of torch)
    spec = device_library.scale_spec("device_model = false").replace('archs = ["sm_90a", "gfx942"]',
                                                                      'archs = ["sm_90a"]')
    root = make_project(tmp_path / "p", specs={"devlib_scale": spec}, kernels={})
    proc = doit(root, "list", env=env, check=False)
    assert "BROKEN" in proc.stdout and "AssertionError: devlib needs a GPU" in proc.stderr, proc.stderr


@pytest.mark.gpu
def test_on_a_machine_with_a_gpu_the_model_answers_for_the_target_arch_not_the_local_gpu():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    code = textwrap.dedent('''
        from kforge.load import device_model
        device_model.install("gfx942")
        import torch
        from triton.runtime import driver
        print(torch.cuda.get_device_name(), torch.version.hip is not None, torch.version.cuda,
              driver.active.get_current_target().arch)
        try:
            torch.empty(1, device="cuda")
        except device_model.NeedsGPU:
            print("nothing allocated")
        ''')
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["AMD Instinct MI300X True None gfx942", "nothing allocated"]


def test_a_set_up_tool_is_refused_by_name_not_for_a_path_that_only_holds_its_name():
    from kforge.load.device_model import _setup_tool
    assert _setup_tool("cat /etc/modprobe.d/nvidia.conf") == ""   # a configuration folder, no tool run
    assert _setup_tool("ldconfig --print") == "" and _setup_tool(["/sbin/ldconfig", "-p"]) == ""   # queries
    assert _setup_tool(["sudo", "-E", "ldconfig"]) == "ldconfig" and _setup_tool("ldconfig -p; ldconfig /x")
