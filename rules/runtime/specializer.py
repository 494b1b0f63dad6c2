"""Triton's argument specializer, ready for its first call without Triton's code generator.

The native specializer's first call (libtriton's specialize.cc, triton 3.6) imports the classes it tells arguments
apart by: triton.tools.tensor_descriptor's and Gluon's descriptors for NVIDIA and AMD gfx1250, whose packages'
__init__ files import the whole Gluon language and triton.compiler.code_generator (35 ms on the dev CPU, 140-174 ms
on the H100 host). A served call never compiles: prime() loads those two modules (and Gluon's layouts, which they
need) from Triton's own files under their own names, without their packages' __init__, so that the specializer
finds them in sys.modules. A later `import triton.experimental.gluon` runs the __init__ files, which take these same
modules (one TensorDescriptor class); the attribute each import would have set on its package is set then
(after_import.py). On another Triton (other files, or failing to load so) prime() imports them the usual way.
"""
from __future__ import annotations

import importlib
import os
import sys

from .after_import import AfterImport

# what the native specializer's first call imports, in the order a module needs the one before it: (module,
# its file under Triton's package directory); the rest of its imports (triton.language, triton._utils,
# triton.runtime.jit, torch) a process that serves has imported already
LIGHT = (("triton.experimental.gluon.language._layouts", "experimental/gluon/language/_layouts.py"),
         ("triton.experimental.gluon.nvidia.hopper", "experimental/gluon/nvidia/hopper.py"),
         ("triton.experimental.gluon.amd.gfx1250", "experimental/gluon/amd/gfx1250.py"))
DESCRIPTORS = ("triton.experimental.gluon.nvidia.hopper", "triton.experimental.gluon.amd.gfx1250")


def prime() -> str:
    """Make the specializer's first call import nothing heavy; say how: "light", "imported" or "already"."""
    importlib.import_module("triton.tools.tensor_descriptor")
    if all(name in sys.modules for name in DESCRIPTORS):
        return "already"
    import triton
    root = os.path.dirname(triton.__file__)
    if not all(os.path.isfile(os.path.join(root, path)) for _, path in LIGHT):
        return usual()
    from importlib.util import module_from_spec, spec_from_file_location
    loaded = []
    try:
        for name, path in LIGHT:
            if name not in sys.modules:
                module = module_from_spec(spec_from_file_location(name, os.path.join(root, path)))
                sys.modules[name] = module
                loaded.append(name)
                module.__spec__.loader.exec_module(module)
    except Exception:   # not the Triton these files were read from: undo, and import it the usual way
        for name in loaded:
            sys.modules.pop(name, None)
        return usual()
    for name in loaded:   # the attribute a normal import sets on the package, once the package is imported
        parent, _, child = name.rpartition(".")
        sys.meta_path.insert(0, AfterImport(parent, lambda parent=parent, child=child, name=name: setattr(
            sys.modules[parent], child, sys.modules[name])))
    return "light"


def usual() -> str:
    for name in DESCRIPTORS:
        try:
            importlib.import_module(name)
        except ImportError:   # a Triton without it: its specializer does not ask for it either
            pass
    return "imported"
