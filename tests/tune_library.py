"""A small Triton library written for the tests of rules/load/entry_probe.py, rules/plan/catalog.py and rules/compile/action.py: it
prunes its autotune configs with early_config_prune (shared memory it reads from the device, here from
the environment a CPU-only builder gives it), through its own Autotuner subclass that adds a constructor
argument; names a perf_model and top_k; computes a heuristic from torch.cuda.get_device_properties (which a
CPU cannot answer: a spec pins it); and exempts an argument from specialization. Installed as a package in a
test's site folder, as pip would leave it."""
import textwrap

PACKAGE = "kforge_tunelib"

GEMM = '''
import os

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner


def max_shared():
    """Shared memory per block of the device the library runs on."""
    given = os.environ.get("TUNELIB_MAX_SHARED")   # a build machine without the GPU says it
    if given:
        return int(given)
    from triton.runtime import driver
    return driver.active.utils.get_device_properties(torch.cuda.current_device())["max_shared_mem"]


def prune(configs, named_args, **kwargs):
    """No more stages than K has blocks; no config whose tiles need more shared memory than the device has."""
    size, k = named_args["a_ptr"].element_size(), named_args["K"]
    kept = []
    for c in configs:
        m, n, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        stages = max(1, min(c.num_stages, k // bk))
        if (m + n) * bk * size * stages <= max_shared():
            kept.append(triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=stages))
    return kept


def estimate(**kwargs):
    return kwargs["BLOCK_M"] * kwargs["BLOCK_N"]


class LibTuner(Autotuner):
    """The library's own autotuner: it never runs more warps than max_warps."""

    def __init__(self, fn, arg_names, configs, key, max_warps=8, **kwargs):
        super().__init__(fn, arg_names, configs, key, None, None, **kwargs)
        self.max_warps = max_warps

    def prune_configs(self, kwargs):
        return [c for c in super().prune_configs(kwargs) if c.num_warps <= self.max_warps]


def lib_autotune(configs, key, **kwargs):
    return lambda fn: LibTuner(fn, fn.arg_names, configs, key, **kwargs)


CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
           for m, n, k, w, s in ((64, 64, 32, 4, 3), (128, 128, 64, 4, 4), (256, 256, 128, 8, 4), (128, 64, 64, 16, 2))]


@lib_autotune(configs=CONFIGS, key=["M", "N", "K"], max_warps=8,
              prune_configs_by={"early_config_prune": prune, "perf_model": estimate, "top_k": 2})
@triton.heuristics({"NUM_SMS": lambda args: torch.cuda.get_device_properties(0).multi_processor_count,
                    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def gemm_kernel(a_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                NUM_SMS: tl.constexpr, EVEN_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=mask)
    tl.store(c_ptr + rm[:, None] * N + rk[None, :], a * NUM_SMS, mask=mask)
'''

SPEC = '''
[kernel]
name = "{name}"
module = "kforge_tunelib.ops.gemm"
entry = "gemm_kernel"
toolchain = "triton"
archs = ["{arch}"]
id = "m{{BLOCK_M}}n{{BLOCK_N}}k{{BLOCK_K}}-w{{num_warps}}s{{num_stages}}-K{{K}}"

[signature]
a_ptr = "*fp16"
c_ptr = "*fp16"
M = "i32"
N = "i32"
K = "i32"
BLOCK_M = "constexpr"
BLOCK_N = "constexpr"
BLOCK_K = "constexpr"
NUM_SMS = "constexpr"
EVEN_K = "constexpr"

[sweep]
K = [64, 256]

[override]
NUM_SMS = 132

[env]
TUNELIB_MAX_SHARED = "{shared}"
'''

H100_SHARED, MI300X_SHARED = 232448, 65536   # bytes of shared memory (LDS) per block: kforge_runtime/archs.py


def spec(name="tune_gemm", arch="sm_90a", shared=H100_SHARED) -> str:
    return textwrap.dedent(SPEC.format(name=name, arch=arch, shared=shared))


def install(site, modules: dict[str, str] | None = None):
    """The package in site/ with its gemm module and any others given ({module name: source})."""
    ops = site / PACKAGE / "ops"
    ops.mkdir(parents=True, exist_ok=True)
    (site / PACKAGE / "__init__.py").write_text("")
    (ops / "__init__.py").write_text("")
    for name, text in {"gemm": GEMM, **(modules or {})}.items():
        (ops / f"{name}.py").write_text(textwrap.dedent(text))
    return site
