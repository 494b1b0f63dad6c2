"""The Triton compile options a spec may sweep or fix (triton==3.6.0's CUDAOptions and HIPOptions): the vendor
each applies to and the values it takes, checked when a spec loads (the value) and its targets are made (the arch).
Left out on purpose: options that name files or pass text to a tool (ir_override, extern_libs, ptx_options),
and those Triton derives itself (arch, warp_size, backend_name, supported fp8 types).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from kforge_runtime.schema import TRITON_DEFAULTS


class Option(NamedTuple):
    vendor: str | None            # "nvidia" or "amd": only on that vendor's archs; None: both
    check: Callable[[object], bool]
    allowed: str                  # for the message


def _int_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and low <= v <= high


def _flag(v) -> bool:
    return type(v) is bool


def _one_of(*values) -> Callable[[object], bool]:
    return lambda v: type(v) is type(values[0]) and v in values


SCHEDULE_HINTS = ("none", "attention", "memory-bound-attention")
PRECISIONS = {"nvidia": ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6"), "amd": ("ieee", "bf16x3", "bf16x6")}

OPTIONS: dict[str, Option] = {
    "num_warps": Option(None, lambda v: type(v) is int and v > 0 and v & (v - 1) == 0,
                        "a power of two, at most 1024 threads a block (checked per arch)"),
    "num_stages": Option(None, _int_in(0, 8), "integers 0..8"),
    "num_ctas": Option(None, _int_in(1, 16), "integers 1..16 (above 1: NVIDIA sm_90 and later)"),
    "enable_fp_fusion": Option(None, _flag, "true or false"),
    "sanitize_overflow": Option(None, _flag, "true or false"),
    "debug": Option(None, _flag, "true or false"),
    "launch_cooperative_grid": Option(None, _flag, "true or false"),
    "default_dot_input_precision": Option(None, _one_of(*PRECISIONS["nvidia"]), "per arch: " + "; ".join(
        f"{vendor}: {', '.join(p)}" for vendor, p in PRECISIONS.items())),
    # ptxas takes any positive .maxnreg and uses at most 255 registers a thread: mamba-ssm's configs say 256
    "maxnreg": Option("nvidia", lambda v: v is None or _int_in(1, 65535)(v), "integers 1..65535 (None: not set)"),
    "enable_reflect_ftz": Option("nvidia", _flag, "true or false"),
    "launch_pdl": Option("nvidia", _flag, "true or false"),
    "waves_per_eu": Option("amd", _int_in(0, 8), "integers 0..8 (0: the compiler decides)"),
    "matrix_instr_nonkdim": Option("amd", _one_of(0, 4, 16, 32), "0, 4, 16 or 32"),
    "kpack": Option("amd", _one_of(1, 2), "1 or 2"),
    "allow_flush_denorm": Option("amd", _flag, "true or false"),
    "schedule_hint": Option("amd", lambda v: type(v) is str and all(h in SCHEDULE_HINTS for h in v.split(",")),
                            f"comma-separated: {', '.join(SCHEDULE_HINTS)}"),
}


# the options an autotune config may leave unset where another sets them: Triton's default for each holds whatever
# the kernel's @jit or Triton's knobs say (not debug, enable_fp_fusion or sanitize_overflow, which those change)
FILLED_OPTIONS = {o: TRITON_DEFAULTS[o] for o in ("num_ctas", "maxnreg", "waves_per_eu", "matrix_instr_nonkdim",
                                                   "kpack", "schedule_hint", "allow_flush_denorm",
                                                   "enable_reflect_ftz", "launch_pdl")}


def value_problem(name: str, value) -> str | None:
    """What is wrong with the option's value on any arch, or None."""
    option = OPTIONS[name]
    return None if option.check(value) else f"got {value!r}; allowed: {option.allowed}"


def arch_problem(name: str, value, vendor: str, warp_size: int, target_arch) -> str | None:
    """What is wrong with the option's value for one arch (vendor, warp size, SM number or gfx name), or None."""
    option = OPTIONS[name]
    if option.vendor is not None and option.vendor != vendor:
        return f"{name} is an {option.vendor.upper() if option.vendor == 'amd' else 'NVIDIA'} option"
    if name == "num_warps" and value * warp_size > 1024:
        return f"num_warps {value} x {warp_size} threads is more than 1024 threads a block"
    if name == "num_ctas" and value > 1 and (vendor != "nvidia" or target_arch < 90):
        return "num_ctas above 1 needs NVIDIA sm_90 or later"
    if name == "default_dot_input_precision" and value not in PRECISIONS[vendor]:
        return f"{value!r} is not a dot precision of {vendor} archs ({', '.join(PRECISIONS[vendor])})"
    return None
