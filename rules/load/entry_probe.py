"""What an entry wrapped in @triton.autotune or @triton.heuristics chooses, asked of its own module in a child
process (`python -m kforge.load.entry_probe`): config lists built by code and heuristics run per launch cannot be
read from the source, and importing a library runs its code (and usually torch), never in the catalog's process.
Only entries whose source shows such a decorator are asked about (is_wrapped).

A child imports as a target sees it: its one argument (JSON: arch, model, setup) sets up the device model and the
set-up hooks before any module is imported (rules/load/device_model.py): one child per arch, family environment
and set-up (one for all archs without model or hook). Each module is imported in a process of its own, forked
once the child has imported the module's package: what that process read is the module's.

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout. A request may name its "family"
(for the parent's Probe.used); every reply carries "read": the files and folders its module's process read
beyond the toolchain (rules/load/observe.py), where an import looked for a module in vain (_Misses) and the
environment variables the library's code read (`$NAME`); any failure is {"error": "one line"}.
  {"describe": [module, entry]} -> {"autotune": [config, ...] | null, "heuristics": [name, ...], "around_tuner":
      [name, ...], "tuner": {fact: value}, "unspecialized": {argument: jit option}}; a config is the autotuner's
      kwargs plus num_warps, num_stages, num_ctas / maxnreg where set
  {"heuristics": [module, entry], "args": [{name: value}, ...], "pointers": [{name: element type}, ...],
   "pinned": [name, ...]} -> {"values": [{name: value}, ...]}: each heuristic but the pinned on each argument dict,
      in Triton's order; a pointer is a stand-in tensor whose dtype answers and whose shape, device, address or
      values raise (LaunchOnly: only a launch knows them)
  {"prune": [module, entry], "groups": [{"configs", "args", "kwargs", "pointers"}, ...]} -> {"kept": [[config,
      ...], ...]}: per group, what the autotuner's own prune_configs keeps for such a launch (no perf_model)
"""
from __future__ import annotations

import ast
import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kforge.base import cpus
from kforge.base.layout import Layout
from kforge.load import device_model, isolate, load_guard, observe, shared_env, sources
from kforge.base.errors import SpecError
from kforge.load.sources import UNSPECIALIZED, entry_def, module_level, parse

def is_wrapped(path: Path, entry: str) -> bool:
    """Whether the source shows a decorator other than @triton.jit on the entry (read, not imported): Triton's
    @autotune or @heuristics, or a library's own wrapper of them (a caching autotuner, a subclass); or a
    @triton.jit that exempts arguments from specialization (do_not_specialize: read from the function)."""
    node, calls = entry_def(path, entry)
    if node is None:
        return False
    if any(call != "jit" for call in calls):   # assigned by calls: `kernel = triton.autotune(...)(_kernel)`
        return True
    body = parse(path).body
    if "." not in entry and node not in body and \
            any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in body):
        return True   # a def under an `if`, in a module whose __getattr__ may make the name: the import tells
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name != "jit" or any(k.arg in UNSPECIALIZED for k in getattr(d, "keywords", ())):
            return True
    return False


class ProbeFailed(SpecError):
    """A child's answer that the entry fails (its module's import, a heuristic or the pruner raised): `steady` when
    it follows from what the child read, so that the catalog may replay it while that holds (never a crash, a
    timeout, memory or the OS: unsteady)."""

    def __init__(self, message: str, steady: bool = False):
        super().__init__(message)
        self.steady = steady


class Probe:
    """The parent's side: one child per project root, started on the first question."""
    _open: dict[str, "Probe"] = {}
    used: dict[str, set] = {}   # family -> the (probe, module) pairs it asked about (reads_of)

    @classmethod
    def of(cls, root: Path, env: tuple = (), arch: str | None = None, model: bool = False,
           setup: tuple = ()) -> "Probe":
        """The child for this project, family environment ([env]) and import context (Spec.importing: the arch the
        device model answers as, and the set-up hooks). arch None: no model, no hook, one child for every arch."""
        key = (str(root), env, arch, model, setup)
        if key not in cls._open:
            cls._open[key] = cls(root, env, arch, model, setup)
        return cls._open[key]

    def __init__(self, root: Path, env: tuple = (), arch: str | None = None, model: bool = False,
                 setup: tuple = ()):
        self.root, self.env = root, env
        self.context = {"arch": arch, "model": model, "setup": list(setup)} if arch else None
        self.child: subprocess.Popen | None = None
        self.sent_at = 0.0   # time.monotonic() when the latest request went to the child
        self.described: dict[tuple[str, str], dict] = {}
        self.module_read: dict[str, set[str]] = {}   # module -> all its process read, as its latest reply says

    @classmethod
    def reads_of(cls, family: str) -> set[str]:
        """What the processes of the modules a family asked about read, up to now (call it after the catalog's last
        question: a module's process may run another family's code later, whose reads may shape its answers)."""
        return {f for probe, module in cls.used.get(family, ()) for f in probe.module_read.get(module, ())}

    @staticmethod
    def describe_together(probes, module: str, entry: str, where: str, family: str = "") -> None:
        """describe() on each probe, as many children asked at once as there are CPUs, each batch asked before any
        answer is read: the imports run side by side, and each still has the CPU its catalog_timeout assumes."""
        request = {"describe": [module, entry], "family": family}
        probes = list(dict.fromkeys(probes))
        Probe.used.setdefault(family, set()).update((probe, module) for probe in probes)
        asked = [probe for probe in probes if (module, entry) not in probe.described]
        batch = cpus.available()
        owing: list[Probe] = []
        try:
            for start in range(0, len(asked), batch):
                for probe in asked[start:start + batch]:
                    probe._send(request, where)
                    owing.append(probe)
                while owing:
                    probe = owing.pop(0)   # one that fails to reply is stopped by _reply; an error reply is a reply
                    probe.described[(module, entry)] = probe._reply(request, where)
        except BaseException:   # a child that still owes its reply would give it to the next request: stop it
            for probe in owing:
                probe.close()
            raise

    def heuristics(self, module: str, entry: str, args: list[dict], pointers: list[dict], where: str,
                   pinned: tuple = (), family: str = "") -> list[dict]:
        return self._ask({"heuristics": [module, entry], "args": args, "pointers": pointers,
                          "pinned": list(pinned), "family": family}, where)["values"]

    def prune(self, module: str, entry: str, groups: list[dict], where: str, family: str = "") -> list[list[dict]]:
        """Per group (its configs and the launch's arguments as the spec gives them), the configs kept."""
        return self._ask({"prune": [module, entry], "groups": groups, "family": family}, where)["kept"]

    def _ask(self, request: dict, where: str) -> dict:
        self._send(request, where)
        return self._reply(request, where)

    def _send(self, request: dict, where: str) -> None:
        """The request to the child, started first unless it runs; _reply reads the answer."""
        if self.child is None or self.child.poll() is not None:
            env = dict(os.environ, **dict(self.env),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(self.root), *sys.path])))
            # made by the catalog's load (guard.work_folder): an installed library's imports run there, if it is a
            # folder inside out/ (not a link leading out, which the load warned of)
            out, work = os.path.realpath(Layout(self.root).out), os.path.realpath(Layout(self.root).work)
            inside = work.startswith(out + os.sep) and os.path.isdir(work)
            context = {**(self.context or {}), **({"work": work} if inside else {})}
            # rules/load/load_guard.py: catalog_memory, and a process group killed with it (close())
            self.child = load_guard.popen([sys.executable, "-m", "kforge.load.entry_probe", json.dumps(context)],
                                          cwd=self.root, env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True)
        try:
            self.child.stdin.write(json.dumps(request) + "\n")
            self.child.stdin.flush()
        except OSError:   # the child died before it read the request
            raise self._crashed(request, where) from None
        self.sent_at = time.monotonic()   # catalog_timeout counts from here, however late the reply is read

    def _reply(self, request: dict, where: str) -> dict:
        module = _named(request)[0]
        try:
            for_arch = f" for {self.context['arch']}" if self.context else ""   # a child per arch: which one
            load_guard.Wait(where, f"importing {module}{for_arch} to read the entry's autotune / heuristics",
                            f"python -c 'import {module}'", self.sent_at).readable(self.child.stdout.fileno())
            reply = json.loads(self.child.stdout.readline())
            if "error" in reply:   # a MemoryError names the setting to raise
                reply["error"] = load_guard.memory_hint(reply["error"])
        except load_guard.TooLong:
            self.close()
            raise
        except (OSError, ValueError):   # the child died (a crash in the module's import): no reply
            raise self._crashed(request, where) from None
        # a variable this process set for the child (the family's [env], in its declaration; PYTHONPATH) is not
        # what the catalog's process sees, as a compile's is not (rules/compile/core.py): never an input
        given = {observe.VARIABLE + name for name in (*dict(self.env), "PYTHONPATH")}
        self.module_read.setdefault(module, set()).update(set(reply.pop("read", ())) - given)
        Probe.used.setdefault(request.get("family", ""), set()).add((self, module))
        if "error" in reply:
            raise ProbeFailed(f"{where}: {reply['error']}", steady=not reply.get("unsteady"))
        return reply

    def _crashed(self, request: dict, where: str) -> SpecError:
        """The error to raise for a child that died: it is stopped (a later request starts another)."""
        self.close()
        return SpecError(f"{where}: {_crash_message(_named(request)[0])}")

    def close(self) -> None:
        if self.child is not None:
            load_guard.stop(self.child)   # and whatever the modules it imported started
            self.child = None

    @classmethod
    def close_all(cls) -> None:
        for probe in cls._open.values():
            probe.close()
        cls._open.clear()
        cls.used = {}


def _named(request: dict) -> list:
    """[module, entry] a request is about."""
    return request.get("describe") or request.get("heuristics") or request["prune"]


def describe_per_arch(probes: dict[str, Probe], module: str, entry: str, where: str,
                      family: str = "") -> tuple[dict, list[tuple[dict, list[str]]]]:
    """What the entry chooses on each arch, as one answer: every arch's autotune configs, in the order first
    listed, and the archs each config is not listed for (the spec excludes it there)."""
    Probe.describe_together(probes.values(), module, entry, where, family)
    answers = {arch: probe.described[(module, entry)] for arch, probe in probes.items()}
    (first_arch, first), *rest = answers.items()
    for arch, answer in rest:
        if answer["heuristics"] != first["heuristics"] or (answer["autotune"] is None) != (first["autotune"] is None):
            raise SpecError(f"{where}: {module}.{entry} is wrapped differently on {arch} than on {first_arch} "
                            f"(@triton.autotune, @triton.heuristics {answer['heuristics']} vs {first['heuristics']}); "
                            f"kforge builds one family from one set of decorators: a spec per arch")
    if first["autotune"] is None:
        return first, []
    configs: list[dict] = []
    for answer in answers.values():
        configs += [c for c in answer["autotune"] if c not in configs]
    elsewhere = [(c, [arch for arch, answer in answers.items() if c not in answer["autotune"]]) for c in configs]
    return {**first, "autotune": configs}, [(c, archs) for c, archs in elsewhere if archs]


# ---- the child's side ------------------------------------------------------------------------------------

SCALARS = (bool, int, float, str)


def layers(fn) -> list:
    """A kernel object's wrappers, outermost first, then the @triton.jit function it wraps (last): Triton's and
    libraries' wrappers keep what they wrap in `.fn`."""
    from triton.runtime.jit import JITFunction
    found = [fn]
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn") and len(found) < 16:
        fn = fn.fn
        found.append(fn)
    return found


def entry_object(module, entry: str):
    """What the imported module holds under the entry's name (`Class.kernel`: a module-level class's attribute).
    A qualified name no attribute path reaches (`_make.<locals>._square`, a factory's kernel) is the module's
    kernel whose @triton.jit function has that name (AttributeError if none or several)."""
    found = module
    try:
        for part in entry.split("."):
            found = getattr(found, part)
        return found
    except AttributeError:
        if "." not in entry:
            raise
    from triton.runtime.jit import JITFunction
    named = {id(v): v for v in vars(module).values()
             if isinstance(inner := layers(v)[-1], JITFunction) and inner.fn.__qualname__ == entry}
    if len(named) != 1:
        raise AttributeError(f"module {module.__name__!r} holds {len(named) or 'no'} kernel(s) named {entry!r}")
    return next(iter(named.values()))


def _layers(module: str, entry: str) -> list:
    imported = importlib.import_module(module)
    try:
        return layers(entry_object(imported, entry))
    except AttributeError as e:
        inside = _defined_inside(imported, entry)
        if inside is not None and inside[0] == "class":   # kforge names a class's kernel by both names
            raise AttributeError(f"{e}: its source defines {entry} in class {inside[1]} (line {inside[2]}); name "
                                 f"the entry {inside[1]}.{entry}") from None
        if inside is not None:   # torchao's blockwise_fp8_gemm_kernel, made by a call: no arch would have it
            raise AttributeError(f"{e}: its source defines {entry} inside `{inside[1]}()` (line {inside[2]}), so only "
                                 f"a call makes it, not the import; kforge builds the kernels a module holds once "
                                 f"imported: name one of those (a kernel a call makes is compiled by Triton when the "
                                 f"call runs)") from None
        # a library may define a kernel only on some archs (torchao's to_mxfp8_dim0_kernel: sm_100+ or gfx950): the
        # module imported fine, as the model's GPU, and lacks it there; say which arch that was and the way out
        d = device_model.current()
        if d is None:
            raise
        raise AttributeError(f"{e} when imported as {d.arch} (kforge's model of its reference GPU, {d.name}); a "
                             f"library may define a kernel only on some archs: drop {d.arch} from the spec's archs, "
                             f"or give {d.arch} a spec of its own") from None


def _defined_inside(module, entry: str) -> tuple[str, str, int] | None:
    """("function" or "class", its name, the def's line) when the module's source defines `entry` only inside a
    function's or a class's body."""
    try:
        tree = parse(Path(module.__file__))
    except (AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return None
    if any(isinstance(n, ast.FunctionDef) and n.name == entry for n in module_level(tree.body)):
        return None
    for outer in ast.walk(tree):   # outermost first; a module's __getattr__ makes its kernel at the import's ask
        if isinstance(outer, (ast.FunctionDef, ast.ClassDef)) and outer.name != "__getattr__":
            inner = next((n for n in ast.walk(outer) if n is not outer and isinstance(n, ast.FunctionDef)
                          and n.name == entry), None)
            if inner is not None:
                return "class" if isinstance(outer, ast.ClassDef) else "function", outer.name, inner.lineno
    return None


def _describe(module: str, entry: str) -> dict:
    from triton.runtime.autotuner import Autotuner, Heuristics
    layers = _layers(module, entry)
    tuner = next((x for x in layers if isinstance(x, Autotuner)), None)
    configs = None
    if tuner is not None:
        configs = [_as_dict(c) for c in tuner.configs]
        for c, found in zip(tuner.configs, configs):
            bad = [k for k, v in found.items() if not isinstance(v, SCALARS)]
            if bad:
                return {"error": f"autotune config {c} of {module}.{entry}: {bad[0]} is not a plain value; kforge "
                                 f"sweeps ints, floats, bools and strings"}
    # Triton runs the outermost @heuristics first: an inner one sees the outer ones' values and overwrites a value
    # they set, as it overwrites an autotune config's when the autotuner wraps it
    names = list(dict.fromkeys(n for x in layers if isinstance(x, Heuristics) for n in x.values))
    around = [n for x in layers[:layers.index(tuner)] if isinstance(x, Heuristics) for n in x.values] if tuner else []
    return {"autotune": configs, "heuristics": names, "around_tuner": around,
            "tuner": _tuner_facts(tuner) if tuner else {}, "unspecialized": _unspecialized(layers[-1])}


CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")   # a triton.Config's own; the rest are kwargs


def _as_dict(c) -> dict:
    """A triton.Config as kforge sweeps it: its kwargs plus num_warps, num_stages, and num_ctas / maxnreg if set."""
    found = dict(c.kwargs)
    found.update(num_warps=c.num_warps, num_stages=c.num_stages)
    if getattr(c, "num_ctas", 1) != 1:
        found["num_ctas"] = c.num_ctas
    if getattr(c, "maxnreg", None) is not None:
        found["maxnreg"] = c.maxnreg
    return found


def _as_config(found: dict):
    """_as_dict's inverse."""
    from triton import Config
    return Config({k: v for k, v in found.items() if k not in CONFIG_FIELDS},
                  **{k: v for k, v in found.items() if k in CONFIG_FIELDS})


def _qualified(thing) -> str:
    return f"{getattr(thing, '__module__', '?')}.{getattr(thing, '__qualname__', type(thing).__name__)}"


def _tuner_facts(tuner) -> dict:
    """What the autotuner does beyond its configs: how it prunes them (kforge applies it), its perf_model and
    top_k (noted, not applied), and a library's own Autotuner class with the constructor arguments it adds."""
    import inspect

    from triton.runtime.autotuner import Autotuner
    facts, own = {}, type(tuner)
    if getattr(tuner, "early_config_prune", None) is not None:
        facts["prune"] = _qualified(tuner.early_config_prune)
    elif own.prune_configs is not Autotuner.prune_configs:   # a library's own pruning
        facts["prune"] = f"{_qualified(own)}.prune_configs"
    if getattr(tuner, "perf_model", None) is not None:
        facts["perf_model"] = _qualified(tuner.perf_model)
        top_k = getattr(tuner, "configs_top_k", None)
        facts["top_k"] = top_k if isinstance(top_k, SCALARS) else repr(top_k)
    if own is not Autotuner:
        base = inspect.signature(Autotuner.__init__).parameters
        added = [n for n, p in inspect.signature(own.__init__).parameters.items() if n not in base
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        facts["autotuner"] = _qualified(own) + (f"({', '.join(added)})" if added else "")
    return facts


def _unspecialized(fn) -> dict:
    """{argument: "do_not_specialize" | "do_not_specialize_on_alignment"} of the @triton.jit function (its
    options name arguments or their positions); Triton never marks them 16-divisible at launch."""
    found: dict[str, str] = {}
    names = list(getattr(fn, "arg_names", ()))
    constexprs = {p.name for p in getattr(fn, "params", ()) if getattr(p, "is_constexpr", False)}
    for option in UNSPECIALIZED:   # do_not_specialize first: it covers alignment too
        for a in getattr(fn, option, None) or ():
            name = names[a] if isinstance(a, int) and 0 <= a < len(names) else str(a)
            if name not in constexprs:   # a tl.constexpr is its value whatever the option says
                found.setdefault(name, option)
    return found


def _prune(module: str, entry: str, groups: list[dict]) -> dict:
    """Each group's configs as the entry's autotuner's own prune_configs keeps them for a launch with the group's
    arguments, with no perf_model (noted, not applied)."""
    from triton.runtime.autotuner import Autotuner
    layers = _layers(module, entry)
    tuner = next((x for x in layers if isinstance(x, Autotuner)), None)
    if tuner is None:
        return {"error": f"{module}.{entry} has no autotuner now; load the catalog again", "unsteady": True}
    kept = []
    for group in groups:
        if len(tuner.configs) < 2:   # Triton runs a lone config without pruning it
            kept.append(group["configs"])
            continue
        saved = tuner.configs, getattr(tuner, "perf_model", None), getattr(tuner, "nargs", None)
        tuner.configs = [_as_config(c) for c in group["configs"]]
        # Autotuner.run's nargs are the launch's positional arguments, its kwargs the keyword ones; which way the
        # library's launch passes each, only its code says (gemlite's pruners read nargs["N"], a constexpr, and
        # kwargs["load_scales_as_block"], a runtime argument): the spec's values go in both, the union of what
        # either launch gives (docs/library_loading.md: where a pruner's defaults make that differ)
        tuner.perf_model = None
        tuner.nargs = _Arguments({**group["args"], **group["kwargs"]}, group["pointers"])
        try:
            chosen = tuner.prune_configs(_taken(getattr(tuner, "early_config_prune", None),
                                                {**group["args"], **group["kwargs"]}))
        except KeyError as e:
            if e.args and e.args[0] in getattr(layers[-1], "arg_names", ()):
                return {"error": f"the autotuner of {module}.{entry} prunes its configs by {e.args[0]!r}, which the "
                                 f"spec does not give{_where(e)}; add it to [constants] or [sweep] (a runtime "
                                 f"argument counts as a shape hint there)"}
            return {"error": f"pruning the autotune configs of {module}.{entry} failed on {group['args']}: "
                             f"KeyError: {e}{_where(e)}"}
        except LaunchOnly as e:   # a pointer argument's shape, device, address or values
            return {"error": f"the autotuner of {module}.{entry} prunes its configs by {e.argument}.{e.read}"
                             f"{_where(e)}: a tensor's {e.what} known only at launch, and kforge builds before it "
                             f"(a spec gives a pointer argument its dtype, nothing more; its shape hints are "
                             f"scalar arguments): this pruner needs launch-time tensors, and kforge cannot prune "
                             f"these configs as a launch would"}
        except Exception as e:   # the library's pruner: one line naming where it failed
            return {"error": f"pruning the autotune configs of {module}.{entry} failed on {group['args']}: "
                             f"{type(e).__name__}: {e}".splitlines()[0] + _where(e), "unsteady": unsteady(e)}
        finally:
            tuner.configs, tuner.perf_model, tuner.nargs = saved
        found = [_as_dict(c) for c in chosen or ()]
        for c in found:
            c.update((k, _plain(v)) for k, v in list(c.items()))
            if not all(isinstance(v, SCALARS) for v in c.values()):
                return {"error": f"the autotuner of {module}.{entry} pruned its configs into {c}; kforge sweeps "
                                 f"ints, floats, bools and strings"}
        if not found:
            return {"error": f"the autotuner of {module}.{entry} prunes every config for {group['args']} (Triton "
                             f"would refuse that launch); give the spec shape hints it keeps configs for"}
        kept.append(found)
    return {"kept": kept}


def _taken(pruner, kwargs: dict) -> dict:
    """Of the values a launch may pass by name, those the pruner takes: all where it takes **kwargs, else the ones it
    names (a launch passing another by name fails in Triton, so the library's passes none)."""
    import inspect
    try:
        params = list(inspect.signature(pruner).parameters.values())[2:]   # after (configs, nargs)
    except (TypeError, ValueError):   # none, or a builtin: Triton's call decides
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    return {k: v for k, v in kwargs.items() if any(p.name == k and p.kind is not p.VAR_POSITIONAL for p in params)}


def _plain(value):
    """A numpy / torch scalar as Python's (a stand-in stays: it is refused as no plain value)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, _StandIn or ()) else value


def _where(e: BaseException) -> str:
    """' (in pkg/ops/mod.py:12)': shared_env.library_line; "" when there is none, or when the message names that
    line already (a NeedsGPU's `at pkg/mod.py:12 (...)`)."""
    place = shared_env.library_line(e, code=False)
    return "" if not place or place in str(e) else f" (in {place})"


class _Arguments(dict):
    """The arguments a heuristic or pruner is given: the spec's values, and each pointer argument as a stand-in
    tensor made on first use (a probe that makes none never imports torch: about 1.3 s of CPU)."""

    def __init__(self, given: dict, pointers: dict):
        super().__init__(given)
        self._pointers = {a: t for a, t in pointers.items() if a not in given}

    def _make(self) -> None:
        pointers, self._pointers = self._pointers, {}
        for name, tensor in _stand_ins(pointers).items():
            self.setdefault(name, tensor)

    def __missing__(self, name):
        if name not in self._pointers:
            raise KeyError(name)
        self._make()
        return dict.__getitem__(self, name)   # a KeyError still for an element type torch does not have

    def __contains__(self, name) -> bool:
        if name in self._pointers:
            self._make()
        return dict.__contains__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default

    def _whole(name: str):
        """dict's `name`, a view of the whole: the stand-ins made first (`{**args}` too: it iterates the keys)."""
        def made_first(self, *args):
            self._make()
            return getattr(dict, name)(self, *args)
        return made_first

    __iter__, __len__, keys, items, values, copy = map(_whole, ("__iter__", "__len__", "keys", "items", "values",
                                                                "copy"))


class LaunchOnly(BaseException):
    """A heuristic or pruner read what a pointer argument's tensor has only at launch (its shape, device, values).
    A BaseException: a library's `except Exception` fallback must not turn it into a value built for every launch."""

    def __init__(self, argument: str, read: str, what: str):
        self.argument, self.read, self.what = argument, read, what   # what: "shape is", "device is", ...
        super().__init__(f"reads {argument}.{read}: a tensor's {what} known only at launch")


# what a stand-in answers as the tensor passed at launch would: its dtype and what follows from the dtype alone
DTYPE_ONLY = frozenset({"dtype", "itemsize", "element_size", "is_floating_point", "is_complex", "is_signed"})
_WHAT = {**dict.fromkeys(("shape", "size", "numel", "nelement", "dim", "ndim", "ndimension", "__len__", "stride",
                          "is_contiguous", "nbytes", "T", "mT", "H", "mH", "__iter__"), "shape is"),
         **dict.fromkeys(("device", "is_cuda", "is_cpu", "is_meta", "get_device", "type", "is_pinned"), "device is"),
         **dict.fromkeys(("data_ptr", "storage", "untyped_storage", "storage_offset", "_base"), "address is")}

_StandIn = None   # made with torch, on first use (_stand_in_class)


def _stand_in_class():
    """torch.Tensor's subclass the stand-ins are: every method and property read reaches __torch_function__,
    which answers DTYPE_ONLY and raises LaunchOnly for the rest."""
    global _StandIn
    if _StandIn is not None:
        return _StandIn
    import torch

    class StandIn(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "") or repr(func)
            read = name   # a property's name (its getter is `Tensor.shape.__get__`), a method's with ()
            if name == "__get__" and hasattr(func, "__self__"):
                name = read = getattr(func.__self__, "__name__", name)
            else:
                read = f"{name}()"
            if name in DTYPE_ONLY:
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **(kwargs or {}))
            if name in ("__eq__", "__ne__") and len(args) == 2 and args[1] is None:   # as any tensor answers
                return name == "__ne__"
            given = [*args, *(kwargs or {}).values()]
            given += [x for a in given if isinstance(a, (list, tuple)) for x in a]
            argument = next((x.__dict__.get("argument") for x in given if isinstance(x, cls)), "a pointer argument")
            raise LaunchOnly(argument, read, _WHAT.get(name, "values, shape and device are"))

        def __repr__(self):   # never Tensor's (it reads the shape)
            d = self.__dict__
            return f"<kforge's stand-in for {d.get('argument')}: a {d.get('dtype_name')} tensor>"

        __str__ = __repr__

        def __format__(self, spec):
            return format(repr(self), spec)

    _StandIn = StandIn
    return StandIn


def _stand_ins(pointers: dict) -> dict:
    """Each pointer argument as a stand-in tensor of its element type: an empty tensor on the "meta" device whose
    dtype answers, and whose shape, device, address and values raise LaunchOnly."""
    import torch

    from kforge_runtime.launch import TORCH_DTYPES
    names = {**{t: n.removeprefix("torch.") for t, n in TORCH_DTYPES.items()},
             "u1": "bool", "u16": "uint16", "u32": "uint32", "u64": "uint64"}
    cls = _stand_in_class()
    found = {}
    for a, t in pointers.items():
        if hasattr(torch, names.get(t, "")):
            found[a] = torch.Tensor._make_subclass(cls, torch.empty(0, dtype=getattr(torch, names[t]), device="meta"))
            found[a].__dict__.update(argument=a, dtype_name=f"torch.{names[t]}")
    return found


def _heuristics(module: str, entry: str, args: list[dict], pointers: list[dict], pinned: list) -> dict:
    from triton.runtime.autotuner import Heuristics
    layers = [x for x in _layers(module, entry) if isinstance(x, Heuristics)]   # outermost first, as Triton runs them
    values = []
    for given, types in zip(args, pointers):
        seen, found = _Arguments(given, types), {}
        for layer in layers:
            for name, rule in layer.values.items():
                if name in pinned:   # the spec's value stands (in `given`): the rule is never run
                    continue
                try:
                    value = rule(seen)
                except KeyError as e:
                    read = e.args[0] if e.args else ""
                    # a value the launch passes and a heuristic keeps (`"GRAD": lambda a: a["GRAD"]`) is a
                    # heuristic's name: [constants] and [sweep] refuse those, [override] pins it
                    fix = (f"give it in [override] ({read} = [...]): a heuristic computes it, so [constants] and "
                           f"[sweep] cannot" if any(read in layer.values for layer in layers) else
                           "add it to [constants] or [sweep] (a runtime argument counts as a shape hint there)")
                    return {"error": f"heuristic {name} of {module}.{entry} reads {read!r}, which the spec does not "
                                     f"give; {fix}"}
                except LaunchOnly as e:   # a pointer argument's shape, device, address or values
                    return {"error": f"heuristic {name} of {module}.{entry} reads {e.argument}.{e.read}{_where(e)}: "
                                     f"a tensor's {e.what} known only at launch, and kforge builds before it (a "
                                     f"spec gives a pointer argument its dtype, nothing more); pin the value to "
                                     f"build: [override] {name} = ..."}
                except Exception as e:   # the user's lambda: one line naming it
                    return {"error": f"heuristic {name} of {module}.{entry} failed on {given}: "
                                     f"{type(e).__name__}: {e}".splitlines()[0].rstrip(": ") + _where(e)
                                     + f"; if it needs what the build machine lacks (a GPU), pin its value: "
                                       f"[override] {name} = ...", "unsteady": unsteady(e)}
                value = _plain(value)
                if not isinstance(value, SCALARS):
                    return {"error": f"heuristic {name} of {module}.{entry} gave {value!r}; kforge compiles "
                                     f"ints, floats, bools and strings"}
                seen[name] = found[name] = value
        values.append(found)
    return {"values": values}


def main() -> None:
    # what the user's modules print must not break the protocol, from Python or not (a native extension, a
    # subprocess writing to file descriptor 1): replies go to a copy of stdout, and descriptor 1 to stderr;
    # requests come on a copy of stdin, and what a module reads from stdin is /dev/null's nothing
    sys.stdout.flush()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = os.fdopen(os.dup(0), "r")
    isolate.no_input()
    import triton  # noqa: F401  (the toolchain: imported before recording, never an input)
    recorder = observe.Recorder.install(os.getcwd())
    recorder.start()   # never again: every reply holds all that its module's process read (see _answer)
    misses = _Misses.installed = _Misses(recorder)
    sys.meta_path.append(misses)
    context = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    root, work = os.getcwd(), context.get("work")
    observe.run_in(root)   # the module path's relative entries made absolute: the folder changes per module below
    unusable = ""   # the device model and set-up hooks of the import context, before any family's module
    if "arch" in context:
        try:
            device_model.prepare(context["arch"], context["model"], tuple(context["setup"]))
        except device_model.SetupFailed as e:
            unusable = str(e)
    servers: dict[str, isolate.Server] = {}
    packages: dict[str, tuple[str, bool]] = {}   # a module's package -> why its import failed ("": it did not)
    for line in requests:
        request = json.loads(line)
        module = _named(request)[0]
        package = module.rpartition(".")[0]   # its package (and so each above it): imported here, once
        _enter(work if work and _installed(module, root) else root, root)   # as a compile server imports it
        if package and not unusable and package not in packages:
            packages[package] = _import_package(package)
        if unusable:
            reply = {"error": unusable, "unsteady": True}   # a set-up hook: what it depends on is not watched
        elif package and packages[package][0]:
            reply = {"error": packages[package][0], "unsteady": packages[package][1]}
        else:
            server = servers.pop(module, None)
            if server is None:
                while len(servers) >= MODULE_SERVERS:   # the least recently asked: its families are done with it
                    servers.pop(next(iter(servers))).close()
                recorder.files()   # each path read so far named here, once: the module's process inherits the names
                gc.freeze()   # what is here already is never collected in the module's process: no page copied for it
                server = isolate.Server(_answer, retire_after_mb=float("inf"))   # never retired: see _answer
            servers[module] = server   # now the most recently asked
            outcome = server.call(request, None, log_dir=os.devnull)   # what the module prints: nowhere, no file
            reply = outcome.result
            if not outcome.ok:   # it died (a crash in the module's import): the next request forks another
                servers.pop(module).close()
                reply = {"error": _crash_message(module), "unsteady": True}
        if "read" not in reply:   # what this process read (the device model, set-up hooks, packages)
            reply["read"] = _read(recorder, misses)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _answer(request: dict) -> dict:
    """One request, answered in the module's own process (forked per module: what it read is that module's alone),
    with all that process read so far: a family asked after another of the same module gets the union."""
    try:
        if "describe" in request:
            reply = _describe(*request["describe"])
        elif "prune" in request:
            reply = _prune(*request["prune"], request["groups"])
        else:
            reply = _heuristics(*request["heuristics"], request["args"], request["pointers"], request["pinned"])
    # importing the module failed, or the entry is not there; LaunchOnly too: a stand-in read where _heuristics
    # and _prune do not catch it (`chosen or ()` on a pruner returning a tensor) is an error, not a crash
    except (Exception, LaunchOnly) as e:
        module, entry = _named(request)
        reply = {"error": _failed(f"reading {module}.{entry}'s autotune / heuristics (the module is imported in a "
                                  f"child process)", e, install=True), "unsteady": unsteady(e)}
    reply["read"] = _read(observe.Recorder.installed, _Misses.installed)
    return reply


def _failed(doing: str, e: BaseException, install: bool = False) -> str:
    """One line for an import or a module's code that failed: where the library's line is, or the pin it failed on
    (shared_env.explain_pin names both), and with `install`, the fix for a module not found."""
    pinned = shared_env.explain_pin(e)
    return (f"{doing}: {type(e).__name__}: {e}".splitlines()[0].rstrip(": ") + ("" if pinned else _where(e))
            + ("; install it in the environment that runs doit, or where it cannot be (a GPU extension this build "
               "lacks), stand in for it in a set-up hook (setup = \"module:function\", docs/device_model.md)"
               if install and isinstance(e, ModuleNotFoundError) and not pinned else ""))


def _crash_message(module: str) -> str:
    return (f"importing {module} to read the entry's autotune / heuristics crashed the probe process; run "
            f"`python -c 'import {module}'` to see why")


def _read(recorder, misses: "_Misses") -> list[str]:
    """Every file and folder this process read since it started recording, the paths where an import looked for a
    module in vain (one created there would be found), and `$NAME` for each environment variable the library's code
    read, set or not (mamba-ssm's autotune_configs() keeps one config under MAMBA_DETERMINISTIC=1): the family's
    probe inputs. Paths are absolute, so a `$` starts only a variable."""
    variables = {observe.VARIABLE + name for name in recorder.variables}
    return sorted(recorder.files() | set(recorder.folders()) | misses.paths | variables)


def _enter(folder: str, root: str) -> None:
    """Work in `folder`, made again if a library's import removed it (checked by the parent: inside out/); else in
    the project."""
    try:
        os.makedirs(folder, exist_ok=True)
        os.chdir(folder)
    except OSError:
        os.chdir(root)


def _installed(module: str, root: str) -> bool:
    """Whether a module is an installed library's (imported in out/.kforge/work/), not the project's own source,
    found by its top-level name (nothing is imported)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return True
    where = spec and (spec.origin or next(iter(spec.submodule_search_locations or ()), None))
    return not where or sources.project_source_problem(Path(where), Path(root)) is not None


def _import_package(package: str) -> tuple[str, bool]:
    """Import a family module's package here, once, so that each module's process (forked from here) has it. Why
    it failed, in one line ("" if it did not), and whether that is unsteady: every module of the package answers
    that."""
    try:
        importlib.import_module(package)
    except Exception as e:
        return _failed(f"reading the autotune / heuristics of a module of {package} (imported in a child process): "
                       f"importing {package} failed", e), unsteady(e)
    return "", False


def unsteady(error: BaseException) -> bool:
    """Whether a failure may come from what the probe does not watch, so that the catalog must not replay it:
    memory, the OS (a file, a socket, a library ctypes loads), a native extension that did not load (its own
    libraries are no file the probe read), anywhere in its chain of causes. A name a Python module lacks (`cannot
    import name`, a library built for another Triton) is steady: that module's source is one of what it read."""
    from importlib.machinery import EXTENSION_SUFFIXES
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (MemoryError, OSError)) or (isinstance(error, ImportError) and isinstance(error.path, str)
                                                         and error.path.endswith(tuple(EXTENSION_SUFFIXES))):
            return True
        error = error.__cause__ or error.__context__
    return False


# module processes alive at once per child (each holds tens of MB with torch): the catalog asks about one family
# at a time, and a module asked about after this many others is imported again in a fresh process
MODULE_SERVERS = 4


class _Misses:
    """A module finder placed last on sys.meta_path: asked only about a module no other finder found, it keeps where
    that module would have been, when the library's code imported it: a conditional import (`try: import
    fast_impl`) then has the file it did not find among the probe's inputs, and one created there is a change."""
    installed: "_Misses | None" = None

    def __init__(self, recorder):
        self.recorder = recorder
        self.paths: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if not self.recorder.active or self._by_toolchain():
            return None
        from importlib.machinery import all_suffixes
        tail = name.rpartition(".")[2]
        skip = self.recorder.skip
        for folder in (path if path is not None else sys.path):
            if not isinstance(folder, str):
                continue
            folder = os.path.abspath(folder or ".")
            if (folder + os.sep).startswith(skip) or not os.path.isdir(folder):
                continue
            self.paths.update(os.path.join(folder, tail + suffix) for suffix in all_suffixes())
            self.paths.update((os.path.join(folder, tail, "__init__.py"), os.path.join(folder, tail)))
        return None

    def _by_toolchain(self) -> bool:
        """Whether the import was made by the toolchain's code (torch's optional imports): the first frame
        outside the import system."""
        system = os.path.dirname(importlib.__file__) + os.sep   # import_module, util.find_spec
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith(("<frozen", system))):
            frame = frame.f_back
        if frame is None:
            return True
        real = os.path.realpath(frame.f_code.co_filename)
        return (real + os.sep).startswith(self.recorder.skip)


if __name__ == "__main__":
    main()
