"""kforge_runtime.source_key: Triton's source key of a kernel, the same in every process."""
import json
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl

from kforge_runtime.source_key import source_key


@tl.constexpr
def wider(bits: tl.constexpr) -> tl.dtype:   # a constexpr holding a function, as flag_gems's sort kernels call one
    bits = bits.value if isinstance(bits, tl.constexpr) else bits
    return tl.core.get_int_dtype(bits * 2, False)


@triton.jit
def widen(x):
    return x.to(wider(x.dtype.primitive_bitwidth))


@triton.jit
def widen_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, widen(tl.load(x_ptr + i)))


SCALE = tl.constexpr(3)


@triton.jit
def scale_kernel(x_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i) * SCALE)


def keys_in_a_fresh_process() -> dict:
    """Both kernels' keys (kforge's, Triton's) in another process, this module imported by the same name."""
    code = ("import importlib, json, sys; sys.path.insert(0, sys.argv[1]); t = importlib.import_module(sys.argv[2]); "
            "from kforge_runtime.source_key import source_key; "
            "print(json.dumps({n: [source_key(getattr(t, n)), getattr(t, n).cache_key] "
            "for n in ('widen_kernel', 'scale_kernel')}))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[2]), __name__], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_a_kernel_reading_a_constexpr_function_has_one_key_in_every_process():
    # Triton writes that constexpr as `<function wider at 0x...>`: its own key moves with the address
    first, second = keys_in_a_fresh_process(), keys_in_a_fresh_process()
    assert first["widen_kernel"][0] == second["widen_kernel"][0] == source_key(widen_kernel)


def test_a_kernel_without_one_keeps_tritons_key_so_earlier_bundles_still_match():
    assert source_key(scale_kernel) == scale_kernel.cache_key == keys_in_a_fresh_process()["scale_kernel"][0]


def test_the_constexpr_functions_source_is_in_the_key(monkeypatch):
    before = source_key(widen_kernel)
    import kforge_runtime.source_key as module
    monkeypatch.setattr(module.inspect, "getsource", lambda fn: "def wider(bits): return tl.int64\n")
    module._known.clear()
    assert source_key(widen_kernel) != before
    monkeypatch.undo()
    module._known.clear()
    assert source_key(widen_kernel) == before


class Opaque:   # printed with its address: a key holding it is another in every process
    pass


OPAQUE = tl.constexpr(Opaque())


@triton.jit
def opaque_helper(x):
    return x * (OPAQUE is not None)


@triton.jit
def opaque_kernel(x_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i) * (OPAQUE is not None))


@triton.jit
def calls_opaque_kernel(x_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, opaque_helper(tl.load(x_ptr + i)))


def test_a_key_written_from_a_memory_address_is_told_apart_and_so_is_its_callers():
    """A build compares a record line's key with its own only where another process would make the same
    (rules/compile/triton_backend.py): not for a kernel, or a caller of a function, reading an object whose
    repr is its address."""
    from kforge_runtime.source_key import reproducible
    assert reproducible(source_key(widen_kernel)) and reproducible(source_key(scale_kernel))
    assert not reproducible(source_key(opaque_kernel))
    assert not reproducible(source_key(calls_opaque_kernel))


BEYOND = '''
import triton
import triton.language as tl

from {pkg} import cfg

UNROLL = {unroll}
PLAIN_SMS = {sms}


@triton.jit
def _unroll(U: tl.constexpr = UNROLL):
    return U


@triton.constexpr_function
def _sms():
    return PLAIN_SMS


@triton.jit
def by_default(out_ptr):
    tl.store(out_ptr + tl.program_id(0), _unroll())


@triton.jit
def by_attribute(out_ptr):
    tl.store(out_ptr + tl.program_id(0), cfg.NSM)


@triton.jit
def by_constexpr_function(out_ptr):
    tl.store(out_ptr + tl.program_id(0), _sms())


@triton.jit
def by_object_attribute(out_ptr):
    tl.store(out_ptr + tl.program_id(0), cfg.settings.NSM)
'''


def _beyond(tmp_path, name, unroll, sms, nsm):
    """A package whose kernels take a value Triton's own key leaves out (an outside review: a binary built with one
    and served where the import gives another, under one key)."""
    import importlib
    import sys
    root = tmp_path / name
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "cfg.py").write_text(f"import types\nimport triton.language as tl\nNSM = tl.constexpr({nsm})\n"
                                        f"settings = types.SimpleNamespace(NSM={nsm})\n")
    (root / name / "k.py").write_text(BEYOND.format(pkg=name, unroll=unroll, sms=sms))
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(f"{name}.k")
    finally:
        sys.path.remove(str(root))


def test_values_triton_leaves_out_of_its_key_are_in_kforges():
    """A helper's default given by a name, a module's constant read as an attribute, a global a constexpr function
    reads: each decides the code and was in no key (an outside review on mamba-ssm-like code: early cutoff kept the
    old binary, serving on a GPU of another SM count ran the build machine's). Each is now in kforge's key; Triton's
    stays the same, so the two kernels tell apart only by kforge's."""
    import pathlib
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        base = _beyond(pathlib.Path(tmp), "beyond_a", 1, 132, 132)
        for name, changes in (("beyond_b", (4, 132, 132)), ("beyond_c", (1, 114, 132)), ("beyond_d", (1, 132, 114))):
            other = _beyond(pathlib.Path(tmp), name, *changes)
            differ = {k for k in ("by_default", "by_constexpr_function", "by_attribute", "by_object_attribute")
                      if source_key(getattr(base, k)) != source_key(getattr(other, k))}
            assert differ == {"beyond_b": {"by_default"}, "beyond_c": {"by_constexpr_function"},
                              "beyond_d": {"by_attribute", "by_object_attribute"}}[name], (name, differ)
            assert all(getattr(base, k).cache_key == getattr(other, k).cache_key
                       for k in ("by_default", "by_attribute"))   # Triton's own: blind to them


def test_a_constexpr_functions_default_given_by_a_name_is_in_the_key_by_its_value():
    import importlib
    import pathlib
    import sys
    import tempfile
    text = ("import triton\nimport triton.language as tl\nWIDTH = {w}\n\n\n@triton.constexpr_function\n"
            "def _w(x=WIDTH):\n    return x\n\n\n@triton.jit\ndef k(out_ptr):\n    tl.store(out_ptr, _w())\n")
    keys = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, w in enumerate((32, 64)):
            (pathlib.Path(tmp) / f"cf_default_{i}.py").write_text(text.format(w=w))
            sys.path.insert(0, tmp)
            try:
                keys.append(source_key(importlib.import_module(f"cf_default_{i}").k))
            finally:
                sys.path.remove(tmp)
    assert keys[0] != keys[1]


@triton.jit
def settled_defaults(x_ptr, PAD: tl.constexpr = -1, DT: tl.constexpr = tl.float32, B: tl.constexpr = 2 * 64,
                     S: tl.constexpr = tl.constexpr(8)):
    tl.store(x_ptr + tl.arange(0, B), tl.full((B,), PAD * S, DT))


def test_defaults_their_text_settles_keep_tritons_key():
    """-1, tl.float32, 2 * 64, tl.constexpr(8): the source's text is the value, already in Triton's key; counted as
    given by a name (8f18930), they changed the key of ordinary kernels and older bundles went unserved."""
    assert source_key(settled_defaults) == settled_defaults.cache_key


TAKEN = '''
import collections
import types
import triton
import triton.language as tl

ACC = tl.{acc}
SCALE = {scale}
Shape = collections.namedtuple("Shape", "rows")
SHAPE = Shape({rows})
cfg = types.SimpleNamespace(ACC=tl.{acc})


@triton.jit
def dtype_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr).to(ACC).to(tl.float32))


@triton.jit
def plain_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * SCALE)


@triton.jit
def namedtuple_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * SHAPE.rows)


@triton.jit
def dtype_attribute(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr).to(cfg.ACC).to(tl.float32))


def make_cast(dt):
    @triton.jit
    def cast_kernel(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr).to(dt).to(tl.float32))
    return cast_kernel


cast = make_cast(tl.{acc})
'''


def test_every_value_a_kernel_reads_from_a_global_or_a_closure_is_in_the_key(tmp_path):
    """Triton's code generator takes a plain tl.dtype global or closure value (a kernel per dtype from one
    factory), a namedtuple, and under TRITON_ALLOW_NON_CONSTEXPR_GLOBALS any plain value (`NUM_SMS` read at
    import), yet hashes only tl.constexpr globals: an outside review served ncast_f16 the bf16 factory kernel's
    binary, and a library that picks ACC at import the other ACC's. Each value is in kforge's key now."""
    import importlib
    import sys
    modules = {}
    for name, acc, scale, rows in (("taken_a", "float16", 2.0, 4), ("taken_b", "bfloat16", 3.0, 8)):
        (tmp_path / f"{name}.py").write_text(TAKEN.format(acc=acc, scale=scale, rows=rows))
        sys.path.insert(0, str(tmp_path))
        try:
            modules[name] = importlib.import_module(name)
        finally:
            sys.path.remove(str(tmp_path))
    a, b = modules["taken_a"], modules["taken_b"]
    for kernel in ("dtype_global", "plain_global", "namedtuple_global", "dtype_attribute", "cast"):
        assert source_key(getattr(a, kernel)) != source_key(getattr(b, kernel)), kernel
    assert a.cast.cache_key == b.cast.cache_key   # Triton's own: blind to the closure's dtype


CHANGING = '''
import types
import triton
import triton.language as tl

cfg = types.SimpleNamespace(SCALE=2.0)
G = tl.constexpr(2.0)


@triton.jit
def _helper(x):
    return x * 2.0


@triton.jit
def by_attribute(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * cfg.SCALE)


@triton.jit
def by_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * G)


@triton.jit
def by_callee(x_ptr):
    tl.store(x_ptr, _helper(tl.load(x_ptr)))


def _make():
    dt = tl.float32

    @triton.jit
    def cast(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr).to(dt))

    def set_dt(value):
        nonlocal dt
        dt = value
    return cast, set_dt


by_closure, set_factor = _make()
'''


def test_a_key_is_made_again_when_a_value_it_holds_changes_in_the_process(tmp_path):
    """A process that sets `cfg.SCALE = 3.0` or rebinds a constexpr global after the first call compiles the next
    specialization with the new value (Triton), but serving kept the key made at the first call and ran the old
    value's binary (an outside review). The key is made again when anything it read has changed."""
    import importlib
    import sys
    (tmp_path / "changing.py").write_text(CHANGING)
    sys.path.insert(0, str(tmp_path))
    try:
        m = importlib.import_module("changing")
    finally:
        sys.path.remove(str(tmp_path))
    before = {k: source_key(getattr(m, k)) for k in ("by_attribute", "by_global", "by_callee", "by_closure")}
    m.cfg.SCALE = 3.0
    m.G = tl.constexpr(3.0)
    m._helper._unsafe_update_src(m._helper.src.replace("2.0", "4.0"))
    m.set_factor(tl.float16)   # a closure's cell rebound
    after = {k: source_key(getattr(m, k)) for k in before}
    assert all(before[k] != after[k] for k in before), (before, after)
    assert after == {k: source_key(getattr(m, k)) for k in before}   # unchanged since: the same key
