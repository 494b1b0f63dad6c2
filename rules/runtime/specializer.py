"""Triton's argument specializer, ready for its first call without Triton's code generator.

The native specializer's first call (triton 3.6) imports Gluon's descriptor classes, whose packages' __init__ files
import the Gluon language and the code generator (35 ms here, 140-174 ms on the H100 host), which a served call never
uses. prime() loads those modules from Triton's files without their packages' __init__; a later import of the package
takes the same modules and gets their attributes then (after_import.py). On another Triton it imports them as usual.
"""
from __future__ import annotations

import importlib
import os
import sys

from .after_import import AfterImport

# what the native specializer's first call imports, each after the one it needs: (module, its file under Triton's
# package); the rest of its imports a serving process has imported already
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
