"""What an entry wrapped in @triton.autotune or @triton.heuristics chooses, asked of the kernel's own module.

Those choices are Python values computed when the module is imported (autotune config lists are often built by
comprehensions or helper functions) or per launch (heuristics are functions of the launch's arguments), so
they cannot be read from the source. The module is imported in a child process (`python -m
kforge.entry_probe`), never in the process that loads the catalog: importing a library runs its code and
usually torch. The child lives while the catalog loads and imports each module once; only entries whose
source shows such a decorator are asked about, and only when the catalog is loaded from the specs.

Protocol: one JSON request per line on the child's stdin, one JSON reply per line on its stdout:
  {"describe": [module, entry]} -> {"autotune": [config, ...] | null, "heuristics": [name, ...]}
      a config: the autotuner's kwargs plus num_warps, num_stages, and num_ctas / maxnreg where set
  {"heuristics": [module, entry], "args": [{name: value}, ...], "pointers": [{name: element type}, ...]}
      -> {"values": [{name: value}, ...]}
      each heuristic evaluated on each argument dict, in the order Triton applies them; each pointer argument
      is an empty tensor of its element type on torch's "meta" device (a heuristic may test `is not None`,
      isinstance(..., torch.Tensor) or read .dtype, as it would of the tensor passed at launch)
  any failure -> {"error": "one line"}
  every reply also carries "read": the files the child read for it beyond the toolchain and the folders it
  listed (rules/observe.py): the catalog's stamp holds them by identity, so a changed heuristic or config file,
  or a file added to or removed from a listed folder (its mtime changes), loads the catalog again
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from kforge import load_guard
from kforge.errors import SpecError
from kforge.sources import parse

def is_wrapped(path: Path, entry: str) -> bool:
    """Whether the source shows a decorator other than @triton.jit on the entry (read, not imported): Triton's
    @autotune or @heuristics, or a library's own wrapper of them (a caching autotuner, a subclass)."""
    for node in parse(path).body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name != "jit":
                    return True
    return False


class Probe:
    """The parent's side: one child per project root, started on the first question."""
    _open: dict[str, "Probe"] = {}
    read: set[str] = set()   # every file the children read, for the catalog's stamp

    @classmethod
    def of(cls, root: Path, env: tuple = ()) -> "Probe":
        """The child for this project and family environment ([env]: a library may read it at import)."""
        key = (str(root), env)
        if key not in cls._open:
            cls._open[key] = cls(root, env)
        return cls._open[key]

    def __init__(self, root: Path, env: tuple = ()):
        self.root, self.env = root, env
        self.child: subprocess.Popen | None = None
        self.described: dict[tuple[str, str], dict] = {}

    def describe(self, module: str, entry: str, where: str) -> dict:
        if (module, entry) not in self.described:
            self.described[(module, entry)] = self._ask({"describe": [module, entry]}, where)
        return self.described[(module, entry)]

    def heuristics(self, module: str, entry: str, args: list[dict], pointers: list[dict], where: str) -> list[dict]:
        return self._ask({"heuristics": [module, entry], "args": args, "pointers": pointers}, where)["values"]

    def _ask(self, request: dict, where: str) -> dict:
        if self.child is None or self.child.poll() is not None:
            env = dict(os.environ, **dict(self.env),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(self.root), *sys.path])))
            # rules/load_guard.py: catalog_memory, and a process group killed with it (close())
            self.child = load_guard.popen([sys.executable, "-m", "kforge.entry_probe"], cwd=self.root, env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True)
        try:
            self.child.stdin.write(json.dumps(request) + "\n")
            self.child.stdin.flush()
            named = (request.get("describe") or request.get("heuristics"))[0]
            load_guard.await_reply(self.child.stdout, where, f"importing {named} to read the entry's autotune / "
                                   f"heuristics", f"python -c 'import {named}'")   # TooLong past catalog_timeout
            line = self.child.stdout.readline()
            reply = json.loads(line)
            if "error" in reply:   # a MemoryError names the setting to raise
                reply["error"] = load_guard.memory_hint(reply["error"])
        except load_guard.TooLong:
            self.close()
            raise
        except (OSError, ValueError):   # the child died (a crash in the module's import): no reply
            self.close()
            module = (request.get("describe") or request.get("heuristics"))[0]
            raise SpecError(f"{where}: importing {module} to read the entry's autotune / heuristics crashed the "
                            f"probe process; run `python -c 'import {module}'` to see why") from None
        Probe.read.update(reply.pop("read", ()))
        if "error" in reply:
            raise SpecError(f"{where}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.child is not None:
            load_guard.stop(self.child)   # and whatever the modules it imported started
            self.child = None

    @classmethod
    def close_all(cls) -> None:
        for probe in cls._open.values():
            probe.close()
        cls._open.clear()
        cls.read = set()


# ---- the child's side ------------------------------------------------------------------------------------

SCALARS = (bool, int, float, str)


def layers(fn) -> list:
    """A kernel object's wrappers, outermost first, then the @triton.jit function it wraps (last; the list ends
    at the first object that is neither a JITFunction nor a wrapper). Triton's Autotuner and Heuristics and
    libraries' own kernel wrappers keep what they wrap in `.fn`."""
    from triton.runtime.jit import JITFunction
    found = [fn]
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn") and len(found) < 16:
        fn = fn.fn
        found.append(fn)
    return found


def _layers(module: str, entry: str) -> list:
    import importlib
    return layers(getattr(importlib.import_module(module), entry))


def _describe(module: str, entry: str) -> dict:
    from triton.runtime.autotuner import Autotuner, Heuristics
    layers = _layers(module, entry)
    tuner = next((x for x in layers if isinstance(x, Autotuner)), None)
    configs = None
    if tuner is not None:
        configs = []
        for c in tuner.configs:
            found = dict(c.kwargs)
            found.update(num_warps=c.num_warps, num_stages=c.num_stages)
            if getattr(c, "num_ctas", 1) != 1:
                found["num_ctas"] = c.num_ctas
            if getattr(c, "maxnreg", None) is not None:
                found["maxnreg"] = c.maxnreg
            bad = [k for k, v in found.items() if not isinstance(v, SCALARS)]
            if bad:
                return {"error": f"autotune config {c} of {module}.{entry}: {bad[0]} is not a plain value; kforge "
                                 f"sweeps ints, floats, bools and strings"}
            configs.append(found)
    # Triton applies the innermost @heuristics first: its values are in the args the outer ones see
    names = [n for x in reversed(layers) if isinstance(x, Heuristics) for n in x.values]
    return {"autotune": configs, "heuristics": names}


def _stand_ins(pointers: dict) -> dict:
    """Each pointer argument as an empty tensor of its element type on the "meta" device (no memory)."""
    import torch

    from kforge_runtime.launch import TORCH_DTYPES
    names = {**{t: n.removeprefix("torch.") for t, n in TORCH_DTYPES.items()},
             "i1": "bool", "u16": "uint16", "u32": "uint32", "u64": "uint64"}
    return {a: torch.empty(0, dtype=getattr(torch, names[t]), device="meta")
            for a, t in pointers.items() if hasattr(torch, names.get(t, ""))}


def _heuristics(module: str, entry: str, args: list[dict], pointers: list[dict] | None = None) -> dict:
    from triton.runtime.autotuner import Heuristics
    layers = [x for x in reversed(_layers(module, entry)) if isinstance(x, Heuristics)]
    values = []
    for i, given in enumerate(args):
        seen, found = {**(_stand_ins(pointers[i]) if pointers else {}), **given}, {}
        for layer in layers:
            for name, rule in layer.values.items():
                try:
                    value = rule(seen)
                except KeyError as e:
                    return {"error": f"heuristic {name} of {module}.{entry} reads {e.args[0]!r}, which the spec "
                                     f"does not give; add it to [constants] or [sweep] (a runtime argument "
                                     f"counts as a shape hint there)"}
                except Exception as e:   # the user's lambda: one line naming it
                    return {"error": f"heuristic {name} of {module}.{entry} failed on {given}: "
                                     f"{type(e).__name__}: {e}"}
                if hasattr(value, "item"):   # numpy / torch scalars
                    value = value.item()
                if not isinstance(value, SCALARS):
                    return {"error": f"heuristic {name} of {module}.{entry} gave {value!r}; kforge compiles "
                                     f"ints, floats, bools and strings"}
                seen[name] = found[name] = value
        values.append(found)
    return {"values": values}


def main() -> None:
    replies, sys.stdout = sys.stdout, sys.stderr   # what the user's modules print must not break the protocol
    from kforge import observe
    import triton  # noqa: F401  (the toolchain: imported before recording, never an input)
    recorder = observe.Recorder.install(os.getcwd())
    recorder.start()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "describe" in request:
                reply = _describe(*request["describe"])
            else:
                reply = _heuristics(*request["heuristics"], request["args"], request.get("pointers"))
        except Exception as e:   # importing the module failed, or the entry is not there
            module, entry = request.get("describe") or request["heuristics"]
            reply = {"error": f"reading {module}.{entry}'s autotune / heuristics (the module is imported in a "
                              f"child process): {type(e).__name__}: {e}".splitlines()[0]
                              + ("; install it in the environment that runs doit"
                                 if isinstance(e, ModuleNotFoundError) else "")}
        reply["read"] = sorted(recorder.files() | set(recorder.folders()))   # folders: by identity (mtime)
        recorder.start()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
