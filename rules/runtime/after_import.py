"""Run a function once a module's import has run, without importing it (stdlib only, imports nothing itself:
startup.py installs it at interpreter start)."""
from __future__ import annotations

import sys


class AfterImport:
    """A sys.meta_path entry that runs `then` once `import <name>` has run: the module's own finder finds it
    and its own loader runs it; this entry leaves sys.meta_path at that import."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec
        spec = find_spec(name)   # the finders after this one
        if spec is not None and spec.loader is not None:
            spec.loader = ThenLoader(spec.loader, self.then)
        return spec


class ThenLoader:
    """A module's loader, and `then` called once the module has run; every other attribute is the loader's."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader   # from now on, the module's own loader
        self.then()
