"""Run a function once a module's import has run, without importing it (stdlib only: startup.py installs it at
interpreter start)."""
from __future__ import annotations

import sys
import threading


class AfterImport:
    """A sys.meta_path entry that runs `then` once `import <name>` has run, found and loaded by its own finder and
    loader. It stays until the module has run: a lookup that runs nothing (importlib.util.find_spec, which torch
    calls at its first CUDA use) gets a spec, and nothing happens until the spec is executed."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then
        self._asking = threading.local()   # inside our own find_spec call: the finders after this one answer

    def find_spec(self, name, path=None, target=None):
        if name != self.name or getattr(self._asking, "on", False):
            return None
        from importlib.util import find_spec
        self._asking.on = True
        try:
            spec = find_spec(name)   # the finders after this one
        finally:
            self._asking.on = False
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, ThenLoader):
            spec.loader = ThenLoader(spec.loader, self)
        return spec

    def ran(self) -> None:
        """The module has run: leave sys.meta_path, then call `then` (once)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
            self.then()


class ThenLoader:
    """A module's loader (every attribute but exec_module is its own), telling the AfterImport once it has run."""

    def __init__(self, loader, after: AfterImport):
        self.loader, self.after = loader, after

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader   # from now on, the module's own loader
        self.after.ran()
