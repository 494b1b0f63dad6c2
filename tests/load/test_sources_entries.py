"""Every kernel a library holds is reachable as an entry, whatever way the library makes it (rules/load/sources.py's
entry_def reads the source; entry_probe imports the module when only the import can tell): a kernel a factory
returns, one re-exported under another name from another module, one kept on a class, one a module's
`__getattr__` makes lazily. The library (`reachlib`) is written here; tests/load/test_entry_probe.py holds the
guarded kernels and those built by wrapping calls."""
import textwrap

import pytest

from kforge.load import entry_probe, sources
from tests.support import write_files

BODY = '''
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * {factor}, mask=m)
'''


def kernel(name: str, factor: int, decorators: str = "@triton.jit", indent: str = "") -> str:
    text = f"{decorators}\ndef {name}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):" + BODY.format(factor=factor)
    return textwrap.indent(text, indent)


HEAD = "import triton\nimport triton.language as tl\n"
REACHLIB = {
    # the package's public names: a star import and a chain of re-exports
    "reachlib/__init__.py": "from reachlib.klass import *  # noqa: F401,F403\n"
                            "from .public import public_kernel as api_kernel  # noqa: F401\n",
    "reachlib/impl.py": HEAD + kernel("_impl", 2) + "\n\n" + kernel("_tuned", 3, "@triton.autotune(configs=["
                                                                         "triton.Config({'BLOCK': 128})], key=['n'])\n"
                                                                         "@triton.jit"),
    # a factory returning a def of its own (its name is not the module's)
    "reachlib/factory.py": HEAD + "\n\ndef _make():\n" + kernel("_square", 4, indent="    ") + "    return _square\n"
                           "\n\ndef _make_tuned():\n" + kernel("_inner", 5, indent="    ")
                           + "    return triton.heuristics({'BLOCK': lambda args: 128})(_inner)\n"
                           # a factory given what its kernel takes (a @jit helper, a dtype): its def, not the argument
                           "\n\ndef _make_act(act):\n" + kernel("_act", 11, indent="    ") + "    return _act\n"
                           "\n\n@triton.jit\ndef _relu(x):\n    return tl.maximum(x, 0)\n"
                           "\n\nsquare_kernel: triton.JITFunction = _make()\ntuned_square = _make_tuned()\n"
                           "relu_kernel = _make_act(_relu)\nf16_kernel = _make_act(tl.float16)\n",
    # re-exported under other names, absolutely and relatively, and from another top-level package
    "reachlib/public.py": "from reachlib.impl import _impl as public_kernel  # noqa: F401\n"
                          "from .impl import _tuned as public_tuned  # noqa: F401\n"
                          "from reachimpl.kernels import _other as other_kernel  # noqa: F401\n"
                          "from reachlib.defaults import dflt_kernel as public_dflt  # noqa: F401\n",
    "reachimpl/__init__.py": "",
    "reachimpl/kernels.py": HEAD + kernel("_other", 8),
    # wrapped under its own name after its def
    "reachlib/rebound.py": HEAD + kernel("rebound_kernel", 9) + "\n\nrebound_kernel = triton.autotune("
                           "configs=[triton.Config({'BLOCK': 128})], key=['n'])(rebound_kernel)\n",
    # jitted by calls that exempt an argument from specialization
    "reachlib/unspecialized.py": HEAD + kernel("_plain", 10, decorators="") + "\n\n"
                                 "called_kernel = triton.jit(_plain, do_not_specialize=['n'])\n"
                                 "curried_kernel = triton.jit(do_not_specialize=['n'])(_plain)\n"
                                 "jitted_kernel = triton.jit(_plain)\n",
    # reached through a module object
    "reachlib/through.py": "import triton\nimport reachlib.impl as impl_module\nimport reachlib.impl\n"
                           "from reachlib import factory\nfrom . import klass\n\n"
                           "aliased_kernel = impl_module._impl\nfull_kernel = reachlib.impl._impl\n"
                           "made_square = factory.square_kernel\nclass_kernel = klass.Kernels.add_one\n"
                           "tuned_through = triton.heuristics({'BLOCK': lambda args: 128})(impl_module._impl)\n",
    # constexpr defaults given by names: bound once to a literal (here, or in a module of the package), or not
    "reachlib/sizes.py": "DEFAULT_BLOCK = 512\n",
    "reachlib/defaults.py": HEAD + "from reachlib.sizes import DEFAULT_BLOCK\n\nWARPS = tl.constexpr(4)\n"
                            "REBOUND = 1\nREBOUND = 2\nif WARPS:\n    GUARDED = 1\n\n\n"
                            "@triton.jit\ndef dflt_kernel(x_ptr, n, BLOCK: tl.constexpr = DEFAULT_BLOCK, W: "
                            "tl.constexpr = WARPS, R: tl.constexpr = REBOUND, G: tl.constexpr = GUARDED,\n"
                            "                E: tl.constexpr = tl.float32, L: tl.constexpr = 8):\n"
                            "    tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))\n\n\n"
                            "def _make(WARPS):\n    @triton.jit\n"
                            "    def made_kernel(x_ptr, n, BLOCK: tl.constexpr = DEFAULT_BLOCK, W: tl.constexpr = "
                            "WARPS):\n        tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK))\n"
                            "    return made_kernel\n\n\nmade_kernel = _make(8)\n",
    # kept on a class
    "reachlib/klass.py": HEAD + "\n\nclass Kernels:\n" + kernel("add_one", 6, indent="    "),
    # made when first asked for, by a lazy import of triton
    "reachlib/lazy.py": "_MADE = {}\n\n\ndef _build():\n    import triton\n    import triton.language as tl\n\n"
                        + kernel("lazy_kernel", 7, indent="    ") + "    return lazy_kernel\n\n\n"
                        "def __getattr__(name):\n    if name == 'lazy_kernel':\n"
                        "        return _MADE.setdefault(name, _build())\n    raise AttributeError(name)\n",
}

REACHABLE = {   # (module file, entry): (the def the source shows, whether the entry is probed by importing it)
    ("factory.py", "square_kernel"): ("_square", False),
    ("factory.py", "tuned_square"): ("_inner", True),   # the factory wraps it in heuristics
    ("factory.py", "relu_kernel"): ("_act", False),
    ("factory.py", "f16_kernel"): ("_act", False),
    ("public.py", "public_kernel"): ("_impl", False),
    ("public.py", "public_tuned"): ("_tuned", True),
    ("public.py", "other_kernel"): ("_other", True),   # read from a file no closure of reachlib.public holds
    ("klass.py", "Kernels.add_one"): ("add_one", False),
    ("rebound.py", "rebound_kernel"): ("rebound_kernel", True),   # its autotuner is read
    ("through.py", "aliased_kernel"): ("_impl", False),
    ("through.py", "full_kernel"): ("_impl", False),
    ("through.py", "made_square"): ("_square", False),
    ("through.py", "class_kernel"): ("add_one", False),
    ("through.py", "tuned_through"): ("_impl", True),
    ("unspecialized.py", "called_kernel"): ("_plain", True),
    ("unspecialized.py", "curried_kernel"): ("_plain", True),
    ("unspecialized.py", "jitted_kernel"): ("_plain", False),
    ("lazy.py", "lazy_kernel"): ("lazy_kernel", True),   # only the import tells what __getattr__ gives
    ("__init__.py", "Kernels.add_one"): ("add_one", False),
    # the names Triton's JIT gives them (a record's `module:function`)
    ("factory.py", "_make.<locals>._square"): ("_square", False),
    ("lazy.py", "_build.<locals>.lazy_kernel"): ("lazy_kernel", False),
    ("__init__.py", "api_kernel"): ("_impl", False),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("reach") / "site", REACHLIB)


@pytest.mark.parametrize("where, entry", list(REACHABLE))
def test_an_entry_the_library_makes_is_found_in_its_source_and_probed_when_only_the_import_tells(site, where, entry):
    path = site / "reachlib" / where
    node, _ = sources.entry_def(path, entry)
    shown, probed = REACHABLE[where, entry]
    assert node is not None and node.name == shown, (where, entry)
    assert sources.function_params(path, entry) == ("x_ptr", "y_ptr", "n", "BLOCK")
    assert entry_probe.is_wrapped(path, entry) is probed


def test_a_name_the_source_does_not_make_is_still_not_found(site):
    assert sources.entry_def(site / "reachlib" / "factory.py", "_make")[0].name == "_make"   # a plain def
    for where, entry in (("factory.py", "nope"), ("public.py", "missing"), ("klass.py", "Kernels.nope"),
                         ("klass.py", "Other.add_one"), ("__init__.py", "nope"), ("factory.py", "_make._square"),
                         ("factory.py", "_make.<locals>.nope"), ("klass.py", "Kernels.<locals>.add_one")):
        assert sources.entry_def(site / "reachlib" / where, entry) == (None, ()), (where, entry)


def test_the_probe_reads_what_the_module_holds_under_a_dotted_or_lazy_name(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    from triton.runtime.jit import JITFunction
    for module, entry, name in (("reachlib.klass", "Kernels.add_one", "add_one"),
                                ("reachlib.lazy", "lazy_kernel", "lazy_kernel"),
                                ("reachlib.factory", "_make.<locals>._square", "_square"),
                                ("reachlib.factory", "_make_tuned.<locals>._inner", "_inner")):
        found = entry_probe._layers(module, entry)[-1]
        assert isinstance(found, JITFunction) and found.fn.__name__ == name
    with pytest.raises(AttributeError, match="holds no kernel"):
        entry_probe._layers("reachlib.factory", "_make.<locals>.nope")


def test_a_constexpr_default_given_by_a_name_bound_once_to_a_literal_is_the_default(site):
    """`BLOCK: tl.constexpr = DEFAULT_BLOCK` takes the value the module (or its package's module it imports it
    from) binds once, at its top; a name bound twice or under an `if`, or a non-literal, gives none."""
    for where, entry in (("defaults.py", "dflt_kernel"), ("public.py", "public_dflt")):
        assert sources.function_defaults(site / "reachlib" / where, entry) == {"BLOCK": 512, "W": 4, "L": 8}, where
    # a def a factory makes: its defaults' names may be the factory's own (WARPS is its argument, not the global)
    assert sources.function_defaults(site / "reachlib" / "defaults.py", "made_kernel") == {}
