"""Triton's argument specializer, ready for its first call without Triton's code generator.

Every JIT function's binder calls Triton's native specializer (libtriton, specialize.cc), whose first call
imports the classes it tells arguments apart by: Triton's TensorDescriptor (triton.tools.tensor_descriptor, a
light module) and Gluon's for NVIDIA and for AMD's gfx1250 (triton.experimental.gluon.nvidia.hopper,
triton.experimental.gluon.amd.gfx1250; triton 3.6). Imported the usual way, those run the __init__ of Gluon's
packages: the whole Gluon language and, under it, triton.compiler.code_generator (35 ms on the dev CPU;
140-174 ms on the H100 host, which compiles every module from source). A served call site never compiles and
needs none of it: the two descriptor modules need only one more light module (Gluon's layouts).

prime() loads those three from Triton's own files under their own names, without running their packages'
__init__ files, so that the specializer finds them in sys.modules. They are Triton's modules, each executed
once: a later `import triton.experimental.gluon` (an application's Gluon kernel, a compile on a miss) runs the
packages' __init__ files, which take these same modules, so that a Gluon TensorDescriptor is the class the
specializer knows; the package attribute that import would have set for each is set then (after_import.py).
On another Triton (the files elsewhere, or failing to load so) prime() falls back to importing the descriptor
modules the usual way: correct, and as slow as before. (A Triton whose specializer imports still other modules
imports them at the first call, as before: bench/serve_setup.py lists what that call imports.)
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
