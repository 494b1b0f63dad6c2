"""Element types a spec may name, by one canonical name each.

The canonical name is what goes into keys, ids and meta.json, so "bfloat16" and "bf16" are one type and
bf16 and fp16 are never one key (FlyDSL 0.4.2 and the seed projects shipped keys that ignored the dtype).
"""
from __future__ import annotations

import functools
import re

# canonical name (Triton's signature spelling) -> size in bytes
DTYPES: dict[str, int] = {
    "fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8e4nv": 1, "fp8e4b8": 1, "fp8e5": 1, "fp8e5b16": 1,
    "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u64": 8, "u32": 4, "u16": 2, "u8": 1, "u1": 1,
}

ALIASES: dict[str, str] = {
    "float64": "fp64", "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "float8_e4m3fn": "fp8e4nv", "fp8e4m3": "fp8e4nv", "float8_e5m2": "fp8e5",
    "float8_e4m3fnuz": "fp8e4b8", "fp8e4m3fnuz": "fp8e4b8", "float8_e5m2fnuz": "fp8e5b16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "uint16": "u16", "uint32": "u32",
    "uint64": "u64",
    # Triton spells every boolean u1 (a recorded bool argument is "u1"); "i1" is the LLVM / older spelling
    "bool": "u1", "i1": "u1", "int1": "u1", "uint1": "u1",
}


def canonical_dtype(name: str) -> str | None:
    """The canonical spelling of a dtype name (torch's names accepted, "torch." prefix too), or None."""
    bare = name.removeprefix("torch.")
    return bare if bare in DTYPES else ALIASES.get(bare)


def allowed_dtypes() -> str:
    return ", ".join(DTYPES)


TENSORDESC = re.compile(r"tensordesc<([A-Za-z0-9_.]+)\[\s*([0-9]+(?:\s*,\s*[0-9]+)*)\s*\]>")


@functools.lru_cache(maxsize=1024)   # rules/plan/targets.py asks once per argument per target: few distinct texts
def canonical_arg_type(text: str) -> str | None:
    """A Triton argument type ('*bf16', 'i32', 'fp32', 'tensordesc<bf16[64, 64]>': a host tensor descriptor
    with its block shape) in canonical spelling, or None if unknown. A descriptor may not name a shared-memory
    layout (Triton evaluates that text as Python)."""
    if text.startswith("tensordesc<"):
        found = TENSORDESC.fullmatch(text)
        base = canonical_dtype(found[1]) if found else None
        shape = [int(x) for x in found[2].split(",")] if found else []
        if base is None or not all(0 < x <= 1 << 16 for x in shape):
            return None
        return f"tensordesc<{base}[{', '.join(map(str, shape))}]>"
    pointer = "*" if text.startswith("*") else ""
    base = canonical_dtype(text[len(pointer):])
    return None if base is None else pointer + base
