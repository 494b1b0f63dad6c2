"""The data contract between the build and the loader: file names, every shipped format (artifact, bundle, record,
tuning table) with its fields and version, and the check a binary passes before it is written, packed or loaded.
Stdlib only: every bundle ships it with the loader.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from .elf import ElfError, check_binary as check_elf

# One artifact: out/<arch>/<kernel>/<config_id>/{<binary>, meta.json} (rules/base/layout.py).
# Bump ARTIFACT_SCHEMA when meta.json's fields or a binary's content rules change: it is part of every
# action key, so every target rebuilds.
ARTIFACT_SCHEMA = 8   # 7: Triton artifacts carry triton_source_key, 8: triton_function (serving matches by both)
META = "meta.json"     # written last, by rename: its presence means "built"
ERROR = "error.txt"    # a failed compile's message ("key: <key>" first), never counts as built
# The file names an artifact may hold (and a cache entry or a bundle may name): no separator, no "..".
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")

# One bundle: a wheel holding the package kforge_kernels_<arch>/ with manifest.json, the binaries under
# <kernel>/<config_id>/, and this runtime. The manifest's "artifacts" are meta.json's fields, with "binary"
# made bundle-relative and the compile "options" added; "failed" lists what was not built, and why.
BUNDLE_FORMAT = "kforge-bundle"
BUNDLE_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# the manifest's sha256 (hex), beside it: a manifest edited after `doit package` (an entry pointed at another of
# the bundle's binaries, its launch fields changed) no longer matches, and the bundle is refused
MANIFEST_DIGEST = "manifest.sha256"

# meta.json's fields, and so a manifest entry's: ENTRY_FIELDS those the loader reads, checked when an entry is picked
# (bundle.py); ARTIFACT_FIELDS every artifact has (rules/store/artifact.py's meta() checks its result against them).
# Some add more ("env", "device_model", the toolchain's own: "divisible_by_16", "kernel_abi", "tensordesc_meta").
ENTRY_FIELDS = {"target": str, "kernel": str, "config_id": str, "config": dict, "arch": str, "binary": str,
                "sha256": str, "symbol": str, "signature": list, "threads_per_block": int, "shared": int,
                "toolchain": str}

# A signature's compile-time kinds, none of them a launch argument: "constexpr" (int, float, bool, str, None), and
# the VALUE_KINDS, whose value names something: "dtype" (X_dtype = "bf16" compiles tl.bfloat16) and "function" (a
# @triton.jit function: ACT = "kernels.acts:relu"). NONE: an argument passed as None, compiled as a constexpr None.
VALUE_KINDS = ("dtype", "function")
# A "dtype" value in kforge's (Triton's signature) spelling where Triton's name of the type differs (str(tl.int32)
# is "int32"): a recorded or served call's dtype is spelled so.
TRITON_DTYPE_NAMES = {"int1": "u1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
                      "uint16": "u16", "uint32": "u32", "uint64": "u64"}
COMPILE_TIME = ("constexpr", *VALUE_KINDS)
NONE = "none"

# One record: a line of a record file, the Triton specializations an application compiled or loaded (written by
# kforge_runtime.record, read into targets by rules/declare/records.py): one JSON object per line, keys sorted.
#   {"format": RECORD_FORMAT, "kernel": "<module>:<function>", "arch": "sm_90a",
#    "signature": [["<arg>", "*bf16" | "i32" | "fp32" | <a COMPILE_TIME kind> | NONE], ...],
#    "constexprs": {"<arg>": value, ...},   "divisible_by_16": ["<arg>", ...],   "options": {<RECORD_OPTIONS>},
#    "autotune": {"key": [...], "config": {...}},   (RECORD_OPTIONAL: only for a config an autotuner picked)
#    "source_key": "<hex>"}   (RECORD_OPTIONAL: the kernel's code, as meta.json's triton_source_key says it)
RECORD_FORMAT = "kforge-record-1"
RECORD_FIELDS = ("format", "kernel", "arch", "signature", "constexprs", "divisible_by_16", "options")
RECORD_OPTIONAL = ("autotune", "source_key")   # source_key: the kernel's code as recorded (source_key.py)
# The Triton compile options a record keeps: every one a launch or Triton's knobs can change a binary by,
# RECORD_ALWAYS always, the rest where they differ from triton 3.6's defaults on the vendor (a line recorded on one
# vendor then builds for the other). A spec may set neither of the last two (rules/declare/triton_options.py): a
# line holding one is refused at build, so such a call is never served.
RECORD_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                  "launch_pdl", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint", "debug",
                  "sanitize_overflow", "enable_reflect_ftz", "default_dot_input_precision", "allow_flush_denorm",
                  "ir_override", "instrumentation_mode")
TRITON_DEFAULTS = {"num_ctas": 1, "maxnreg": None, "enable_fp_fusion": True, "launch_cooperative_grid": False,
                   "launch_pdl": False, "waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1,
                   "schedule_hint": "none", "debug": False, "sanitize_overflow": True, "enable_reflect_ftz": True,
                   "allow_flush_denorm": False, "ir_override": None, "instrumentation_mode": ""}
RECORD_ALWAYS = ("num_warps", "num_stages")
TRITON_VENDOR_DEFAULTS = {"nvidia": {"num_warps": 4, "num_stages": 3, "default_dot_input_precision": "tf32"},
                          "amd": {"num_warps": 4, "num_stages": 2, "default_dot_input_precision": "ieee"}}
_OPTION_DEFAULTS = {vendor: {**TRITON_DEFAULTS, **own} for vendor, own in TRITON_VENDOR_DEFAULTS.items()}


def option_defaults(arch: str) -> dict:
    """Triton's default of every option a record keeps, on the arch's vendor (AMD's arches start with gfx; so is an
    unknown arch from an untrusted record or bundle taken). Read-only."""
    return _OPTION_DEFAULTS["amd" if arch.startswith("gfx") else "nvidia"]

# One tuning table: out/tune/<arch>/<kernel>.json, written by `doit tune` on a GPU (rules/tune/gpu_bench.py), shipped
# in the bundle under tune/, read by the loader's selection (kforge_runtime.select):
#   {"format": TUNE_FORMAT, "kernel", "arch", "key", "gpu", "torch", "method", "seconds" (how it was measured),
#    "shape_args": [<arg>, ...], "where_args": [<arg>, ...],
#    "shapes": [{"shape": [<size per shape_arg>], "where": {<arg>: value}, "copies": n,
#                "ranking": [{"config_id", "us", "runs"}, ...] (fastest first), "rejected": [{"config_id", "why"}]}]}
TUNE_FORMAT = "kforge-tune-1"

ARTIFACT_FIELDS = {**ENTRY_FIELDS, "schema": int, "vendor": str, "size": int, "num_warps": int, "warp_size": int,
                   "constexprs": dict, "source": dict, "toolchain_versions": dict, "key": str}
# the values a launch accepts (launch.py): a block of at most 1024 threads, at most 1 MiB of shared memory
LAUNCH_RANGES = {"threads_per_block": (1, 1024), "shared": (0, 1 << 20)}
# the same, where a manifest entry has them: Triton's global scratch memory a program (a tensor descriptor made on
# the GPU takes 128 bytes) and its alignment
OPTIONAL_LAUNCH_RANGES = {"global_scratch_size": (0, 1 << 20), "global_scratch_align": (1, 4096),
                          "profile_scratch_size": (0, 1 << 20)}
SCRATCH_ALIGN = 128   # where an entry gives no alignment (made before it was recorded): a TMA descriptor's


def wrong_field(record: dict, fields: dict) -> str | None:
    """The first of `fields` (name -> type) that `record` lacks or has of another type, else None."""
    return next((name for name, kind in fields.items() if not isinstance(record.get(name), kind)), None)


def is_signature(value) -> bool:
    """A "signature" field: a list of {name, type} strings, one per runtime argument."""
    return isinstance(value, list) and all(isinstance(a, dict) and isinstance(a.get("name"), str)
                                           and isinstance(a.get("type"), str) for a in value)


SHOWN = 10   # names an error message lists before counting the rest


def few(names, sep: str = ", ") -> str:
    """Names for an error message: the first SHOWN, the rest counted (a million must not make megabytes)."""
    names = list(names)
    more = f"{sep.rstrip()} and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return sep.join(map(str, names[:SHOWN])) + more


def one_line(text: str) -> str:
    """A message as one line whatever it quotes: each character a terminal would act on (a line break in a file
    name or an environment value, an escape) written as Python writes it in a string."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class BinaryRefused(ValueError):
    """A binary that is not the one its record describes, or not real code for its arch."""


def dist_name(arch: str) -> str:
    return f"kforge_kernels_{arch}"


def wheel_name(dist: str, version: str) -> str:
    return f"{dist}-{version}-py3-none-any.whl"


_WHEEL = re.compile(r"kforge_kernels_([A-Za-z0-9_]+?)(-.*\.whl|)$")


def arch_of_bundle_file(name: str) -> str | None:
    """The arch in a bundle's file name as `doit package` writes it, or None for other names."""
    match = _WHEEL.match(name)
    return match.group(1) if match else None


def is_plain_name(name) -> bool:
    return isinstance(name, str) and PLAIN_NAME.fullmatch(name) is not None


def check_binary(data: bytes, sha256, arch: str, symbol) -> None:
    """The binary has the recorded sha256, and is an ELF for `arch` whose kernel `symbol` has real code (checked by
    the build, the packager and the loader alike)."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        shown = sha256 if isinstance(sha256, str) and len(sha256) <= 64 else f"{str(sha256)[:64]!r}..."
        raise BinaryRefused(f"sha256 {digest} does not match the recorded {shown}")   # one line, short
    try:
        check_elf(data, arch, symbol)
    except ElfError as e:
        raise BinaryRefused(str(e)) from None


# The environment variables that change what a compiler emits: every one with these prefixes, and Triton's knobs
# without one (triton 3.6's knobs.py and libtriton's cache-invalidating list); not cache, dump or log settings. A
# target's key holds the build's (meta.json's "env"), and serving compares the process's Triton ones with it.
CODE_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "AMDGCN_", "FLYDSL_")
CODE_ENV_NAMES = {"DISABLE_LLVM_OPT", "DISABLE_MMA_V3", "DISABLE_MMA_V5", "DISABLE_PTXAS_OPT", "PTXAS_OPTIONS",
                  "USE_IR_LOC", "ALLOW_LHS_TMEM_LAYOUT_CONVERSION"}
# TRITON_PTXAS*_PATH: which ptxas runs is in the key by its version line, not by where it lies (machines
# with ptxas elsewhere still share cache entries). TRITON_OVERRIDE_DIR: by its content (_override).
CODE_ENV_IGNORED = {"TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH",
                    "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
                    "TRITON_CACHE_MANAGER", "TRITON_PRINT_AUTOTUNING", "TRITON_ALWAYS_COMPILE",
                    "TRITON_STORE_BINARY_ONLY", "TRITON_KERNEL_DUMP", "TRITON_LIBCUDA_PATH", "MLIR_ENABLE_TIMING",
                    "TRITON_CACHE_AUTOTUNING", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_REDIS_HOST",
                    "TRITON_REDIS_PORT", "TRITON_REDIS_KEY_FORMAT", "FLYDSL_RUNTIME_CACHE_DIR",
                    "FLYDSL_RUNTIME_ENABLE_CACHE", "FLYDSL_DUMP_DIR", "FLYDSL_AUTOTUNE_CACHE_DIR",
                    "FLYDSL_GPU_ARCH"}   # FLYDSL_GPU_ARCH: kforge sets it per target
OVERRIDE_CONTENT = "TRITON_OVERRIDE_DIR content"


def code_environment() -> tuple[tuple[str, str], ...]:
    """This process's variables that change what a compiler emits, sorted, and the override folder's content."""
    found = [(k, v) for k, v in os.environ.items()
             if (k.startswith(CODE_ENV_PREFIXES) or k in CODE_ENV_NAMES) and k not in CODE_ENV_IGNORED]
    override = _override()
    return tuple(sorted(found + ([(OVERRIDE_CONTENT, override)] if override else [])))


def triton_environment(env) -> dict[str, str] | None:
    """Of a code environment (pairs, or meta.json's dict), what a Triton compile reads (no FLYDSL_ one); None for
    anything else (a bundle is untrusted: such an entry matches no process)."""
    try:
        env = dict(env)
    except (TypeError, ValueError):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return {k: v for k, v in env.items() if not k.startswith("FLYDSL_")}


def _override() -> str | None:
    """With TRITON_KERNEL_OVERRIDE on, Triton compiles its override folder's IR files: the sha256 of their names and
    contents (None when it is off)."""
    if os.environ.get("TRITON_KERNEL_OVERRIDE", "").strip().lower() not in ("1", "true", "on", "yes"):
        return None
    folder = Path(os.environ.get("TRITON_OVERRIDE_DIR") or
                  Path(os.environ.get("TRITON_HOME") or Path.home()) / ".triton" / "override")
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else ():
        digest.update(f"{path.relative_to(folder)}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
