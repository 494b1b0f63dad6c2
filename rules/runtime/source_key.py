"""The digest of a Triton kernel's code that a build stores (meta.json's triton_source_key) and serving matches.

It is Triton's own JITFunction.cache_key, made the same in every process, plus what Triton's leaves out and the code
still takes: a default given by a name, a plain value read as a global's attribute (`cfg.NUM_SMS`), every global a
constexpr function reads, and any other value a global or a closure gives that the code generator takes (a tl.dtype,
a namedtuple). A kernel with none of those has Triton's key exactly. A constexpr holding a function, which Triton
writes with its address (another key in every process: flag_gems's sort kernels were never served), is written as
its module, name and source digest; any other value printed with its address makes a key reproducible() refuses.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import functools
import re
import threading
import types

_lock = threading.RLock()
# id(fn) -> (fn, its source, its key, what the key read): made again when its source or anything it read changes
_known: dict[int, tuple] = {}
_computing: set[int] = set()


def source_key(fn) -> str:
    """The key of a JITCallable (a @jit or constexpr function). Made again once anything it read has changed
    (`cfg.SCALE = 3.0`, a global or a closure's cell rebound, a callee's source): the next compile takes that."""
    with _lock:
        known = _known.get(id(fn))
        if known is not None and known[0] is fn and known[1] is fn.src and not any(map(_changed, known[3])):
            return known[2]
        if id(fn) in _computing:   # a function that calls itself, as Triton's placeholder
            return f"recursion:{fn._fn_name}"
        _computing.add(id(fn))
        try:
            key, reads = _digest(fn)
        finally:
            _computing.discard(id(fn))
        _known[id(fn)] = (fn, fn.src, key, reads)
        return key


_GONE = object()


def _changed(read: tuple) -> bool:
    """Whether a value a key read is another now: (a namespace, a name, the value) or (a called function, its key)."""
    try:
        if len(read) == 2:
            return source_key(read[0]) != read[1]
        now = read[0].get(read[1], _GONE) if isinstance(read[0], dict) else getattr(read[0], read[1], _GONE)
        return now is not read[2] and bool(now != read[2])
    except Exception:   # a value that cannot be compared: made again
        return True


KEY_VERSION = 3   # this module's way of making a key: a record line's key is compared only with one made the same way


def tagged(key: str) -> str:
    """The key as a record line holds it: with the way it was made (KEY_VERSION)."""
    return f"v{KEY_VERSION}:{key}"


def comparable(recorded) -> list[str]:
    """Of the keys record lines hold, those made as this module makes them: an older recorder's compare with none."""
    return [k for k in recorded if k.partition(":")[0] == f"v{KEY_VERSION}"]


def reproducible(key: str) -> bool:
    """Whether another process makes the same key for the same code: not for one holding a value written with its
    memory address, in the kernel or a function it calls."""
    return key not in _unstable


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_unstable: set[str] = set()


def _digest(fn) -> str:
    from triton.language.core import constexpr
    from triton.runtime.jit import ConstexprFunction
    nonlocals = inspect.getclosurevars(fn.fn).nonlocals
    finder = _finder()(name=fn._fn_name, globals=fn.__globals__, nonlocals=nonlocals, src=fn.src)
    tree = fn.parse()
    finder.visit(tree)
    # a constexpr function runs as Python while the kernel compiles: every global it reads is in what it gives
    every = isinstance(fn, ConstexprFunction)
    used = [(name, shown(val)) for (name, _), (val, _) in finder.used_global_vals.items()
            if isinstance(val, constexpr) or every and _value(val)]
    text = finder.ret + str(fn.starting_line_number) + "[" + ", ".join(f"({n!r}, {v})" for n, v in sorted(used)) + "]"
    # what Triton's key leaves out and the code still takes (the module's docstring): with none, Triton's key exactly
    taken = [(name, shown(val)) for (name, _), (val, _) in finder.used_global_vals.items()
             if not isinstance(val, constexpr) and not every and _value(val)]
    beyond = [*_named_defaults(fn, tree), *getattr(finder, "attributes", ()), *taken]
    if beyond:
        text += "+" + repr(sorted(beyond))
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()
    callees = getattr(finder, "callees", ())
    if _ADDRESS.search(text) or not all(reproducible(k) for _, k in callees):
        _unstable.add(key)
    # what the key read, to tell later whether it changed: a closure's value through its cell (the dict
    # getclosurevars gave is a copy)
    cells = dict(zip(fn.fn.__code__.co_freevars, fn.fn.__closure__ or ()))
    reads = [*((cells[name], "cell_contents", val) if d is nonlocals and name in cells else (d, name, val)
               for (name, _), (val, d) in finder.used_global_vals.items()),
             *getattr(finder, "attribute_reads", ()), *callees]
    return key, tuple(reads)


def _value(value) -> bool:
    """A value the code takes as it is: a constexpr, a plain value, a tl.dtype, or a tuple (a namedtuple) of them."""
    from triton.language.core import constexpr, dtype
    return isinstance(value, (constexpr, dtype, bool, int, float, str, type(None))) or \
        isinstance(value, tuple) and all(map(_value, value))


def _named_defaults(fn, tree) -> list[tuple[str, str]]:
    """(parameter, its default's value) for each default that reads a name other than Triton's own (`UNROLL`,
    `cfg.BLOCK`; not `-1` or `tl.float32`, whose text is the value and already in the key)."""
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
    if node is None:
        return []
    positional = node.args.posonlyargs + node.args.args
    pairs = [*zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults),
             *((a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None)]
    named = [a.arg for a, d in pairs
             if {n.id for n in ast.walk(d) if isinstance(n, ast.Name)} - TRITONS_NAMES]
    if not named:
        return []
    values = {name: p.default for name, p in inspect.signature(fn.fn).parameters.items()}   # a constexpr function's too
    return [(a, shown(values.get(a))) for a in named]


TRITONS_NAMES = {"tl", "triton", "constexpr"}   # a default that reads only these is settled by its text


def shown(value) -> str:
    """A constexpr global as the key writes it: repr(value), as Triton does, but for one that holds a function."""
    inner = getattr(value, "value", None)
    if isinstance(inner, types.FunctionType):
        try:
            code = inspect.getsource(inner)
        except (OSError, TypeError):   # no source to read: Triton's own form, which matches no other process
            return repr(value)
        digest = hashlib.sha256(code.encode("utf-8")).hexdigest()
        return f"constexpr[<function {inner.__module__}.{inner.__qualname__} {digest}>]"
    return repr(value)


@functools.cache
def _finder():
    """Triton's DependenciesFinder, with a called function hashed by its source_key. Triton's own merges into the
    caller's globals those found when the callee's key was made: a kernel hashed after another that called the same
    helper got another key than hashed first. Each function's list here holds its own; a callee's are in its key."""
    from triton.runtime.jit import DependenciesFinder

    class Finder(DependenciesFinder):
        def visit_Attribute(self, node):
            # as Triton's, and a plain value read so from a global (`cfg.NSM`) noted with it: Triton records the read
            # without it. A default's is its value at the def (_named_defaults); a local's is no global's (owner None)
            owner = self.visit(node.value)
            while isinstance(owner, ast.Attribute):   # as Triton's visit_Attribute does, whatever it guards
                owner = self.visit(owner.value)
            if owner is None or getattr(owner, "__name__", "") in self.supported_modules:
                return None
            value = getattr(owner, node.attr)
            self.__dict__.setdefault("attribute_reads", []).append((owner, node.attr, value))
            self.record_reference(value)
            if _value(value) and not self.visiting_arg_default_value:
                self.__dict__.setdefault("attributes", []).append((ast.unparse(node), shown(value)))
            return value

        def _update_hash(self, func):
            key = source_key(func)
            self.__dict__.setdefault("callees", []).append((func, key))
            self.hasher.update((key + str(getattr(func, "noinline", False))).encode("utf-8"))
    return Finder
