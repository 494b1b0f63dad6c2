"""Serve prebuilt kernels to unchanged `kernel[grid](...)` call sites: `serve("out/dist")` (strict=True: a miss raises).

serve() wraps JITFunction._do_compile, which Triton calls on a miss in its per-device kernel cache: a specialization
the bundles hold (as a record line, record.py), built from the calling code (source_key.py) under the same compiler
variables, goes into that cache as a Served, so every later call takes Triton's own fast path to it; anything else
compiles (strict: NotServed). It wraps Autotuner.run too: a recorded pick the bundles hold is cached without
benchmarking (Server.choose). A served process imports no compiler it does not use (LightDriver, specializer.prime()).
Guarantees: docs/libraries.md.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time

from . import specializer
from .record import arch_name, autotune_key, check_options, record_line, run_script, tuned_line
from .schema import (COMPILE_TIME, NONE, SCRATCH_ALIGN, code_environment, one_line, option_defaults,
                     triton_environment)
from .source_key import source_key


class NotServed(RuntimeError):
    """strict=True: a specialization the bundles do not hold."""


def identity(kernel: str, arch: str, runtime: list, constexprs: dict, divisible: list, options: dict) -> str:
    """What decides a binary, in one canonical string, the same for a record line and a bundle entry."""
    options = {k: v for k, v in {**option_defaults(arch), **options}.items() if v is not None}
    constexprs = {k: v for k, v in constexprs.items() if v is not None}   # None arguments: not given
    return json.dumps([kernel, arch, [list(p) for p in runtime], constexprs, sorted(divisible), options],
                      sort_keys=True)


def entry_identity(entry: dict) -> str | None:
    """identity() of a bundle entry; None for a malformed one (a bundle is untrusted: it is never served)."""
    try:
        source = entry.get("source") or {}
        if not isinstance(entry["arch"], str):
            return None
        # the function as Triton's JIT names a call's (its def's module and qualified name): a spec may name it
        # where the library re-exports it, or a module-level name a factory's kernel is bound to
        function = entry.get("triton_function")
        kernel = function if isinstance(function, str) else f"{source['module']}:{source['entry']}"
        return identity(kernel, entry["arch"],
                        [[a["name"], a["type"]] for a in entry["signature"]], dict(entry.get("constexprs") or {}),
                        list(entry.get("divisible_by_16") or []), dict(entry.get("options") or {}))
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def record_identity(line: dict) -> str:
    runtime = [[a, t] for a, t in line["signature"] if t not in (*COMPILE_TIME, NONE)]
    return identity(line["kernel"], line["arch"], runtime, line["constexprs"], line["divisible_by_16"],
                    line["options"])


def miss_message(line: dict) -> str:
    shown = {k: line[k] for k in ("signature", "constexprs", "divisible_by_16", "options")}
    return (f"kforge serve (strict): no prebuilt {line['kernel']} for {line['arch']} with {json.dumps(shown)}. "
            f"Record it (python -m kforge_runtime.record --out specs/app.jsonl app.py), build (doit) and package "
            f"(doit package) again, or serve with strict=False to let Triton compile it")


def other_source_message(line: dict, entry: dict) -> str:
    return (f"kforge serve (strict): the bundles' {line['kernel']} for {line['arch']} ({entry.get('target')}) was "
            f"built from other source than the one this process runs (Triton source key "
            f"{str(entry.get('triton_source_key'))[:12]}, this process's {line['source_key'][:12]}): the library or "
            f"kernel changed since the build, or a value its import reads from this GPU (its SM count, say) is "
            f"not the one kforge's model of the arch's reference GPU gave the build (docs/device_model.md). Build "
            f"(doit) and package (doit package) again from this source, or serve with strict=False to let Triton "
            f"compile it")


def ambiguous_message(line: dict) -> str:   # several binaries for the call, all built from the calling code
    return (f"kforge serve (strict): the bundles hold {len(line['ambiguous'])} different binaries of "
            f"{line['kernel']} for {line['arch']} built from this code for this call ({', '.join(line['ambiguous'])}): "
            f"they differ by a value neither the specialization nor kforge's source key holds, so kforge cannot "
            f"tell which one Triton would compile here and serves none. Build the kernel under one target, or "
            f"serve with strict=False to let Triton compile it")


def other_environment_message(line: dict, entry: dict, ours: dict) -> str:
    theirs = triton_environment(entry.get("env") or {})
    shown = lambda env: ("unreadable" if env is None else ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
                         or "none")
    return (f"kforge serve (strict): the bundles' {line['kernel']} for {line['arch']} ({entry.get('target')}) was "
            f"built under other compiler variables than this process's (the build's: {shown(theirs)}; this "
            f"process's: {shown(ours)}), so it is not the binary Triton would compile here. Build (doit) with "
            f"this process's variables, run without them, or serve with strict=False to let Triton compile it")


def tuned_miss_message(line: dict, key: list, held: int, recorded) -> str:
    what = ("has no recorded choice for its autotuning key" if recorded is None else
            f"was recorded with config {_text(recorded)} for its autotuning key")
    return (f"kforge serve (strict): autotuned {line['kernel']} {what} {json.dumps(key)} on {line['arch']} (the "
            f"bundles hold {held} of its configs for this call). Record the application (python -m "
            f"kforge_runtime.record --out specs/app.jsonl app.py), build (doit) and package (doit package) again, "
            f"or serve with strict=False to let Triton autotune")


class Served:
    """A CompiledKernel's stand-in in Triton's kernel cache: Triton's launch path calls run(); a library may launch
    it again (`kernel[grid](*args)`: flag_gems's libentry) or read its name, metadata and n_regs. The binary is
    checked and loaded (`load`) at the first launch."""

    def __init__(self, load, plan: list[tuple[int, bool]], bundle, entry: dict, fn=None):
        self.load, self.kernel = load, None
        self.bundle, self.entry, self.fn = bundle, entry, fn   # the binary's bundle entry; the JIT function served
        self.plan = tuple(plan)   # (argument position, is it a pointer) per runtime argument
        self._pointers = tuple(i for i, pointer in self.plan if pointer)
        self.function = self.packed_metadata = self._loaded_numbers = None
        from triton import knobs   # held: launch_metadata runs on every launch, an import there cost 0.5 us
        self._runtime_knobs = knobs.runtime
        # Triton's launchers skip an empty grid (an empty tensor's): CUDA's whenever x*y*z <= 0, HIP's when it is 0
        self._skips_negative = bundle.vendor != "amd"

    def launch_metadata(self, grid, stream, *args):
        """What Triton's launch hooks (proton, a tracer) are given, as a CompiledKernel gives it; None without one."""
        hook = self._runtime_knobs.launch_enter_hook   # a HookChain in Triton 3.6: empty, it calls nothing
        if hook is None or not getattr(hook, "calls", True):
            return None
        from triton.compiler.compiler import LazyDict
        found = LazyDict({"name": self.name, "function": None, "stream": stream})
        if getattr(self.fn, "launch_metadata", None) is not None:   # the kernel's own @jit(launch_metadata=...)
            found.add(self.fn.launch_metadata, (grid, self.metadata, dict(zip(self.fn.arg_names, args))))
        return found

    def run(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args):
        blocks = gx * gy * gz
        if blocks == 0 or blocks < 0 and self._skips_negative:
            return
        if self.kernel is None:
            self._init_handles()
        for i in self._pointers:   # as Triton's launcher, memory the GPU cannot reach is refused (a CPU tensor,
            # or one in a wrapper with no is_cuda: triton.reinterpret's)
            if getattr(args[i], "is_cuda", None) is not True and not self.kernel.reaches(args[i].data_ptr()):
                raise ValueError(f"Pointer argument (at {i}) cannot be accessed from Triton (cpu tensor?)")
        if launch_metadata is not None and enter_hook is not None:
            enter_hook(launch_metadata)
        # Triton matched these arguments' dtypes and 16-divisibility to the specialization this binary was
        # built for: the loader's own checks would repeat that on every launch
        self.kernel.launch_trusted(gx, gy, gz, stream, [args[i].data_ptr() if pointer else args[i]
                                                        for i, pointer in self.plan])
        if launch_metadata is not None and exit_hook is not None:
            exit_hook(launch_metadata)

    def __getitem__(self, grid):
        """CompiledKernel's launcher: runner(*every argument, constexprs too, stream=None: the current one)."""
        grid = (*grid, 1, 1)

        def runner(*args, stream=None):
            if stream is None:
                from triton.runtime import driver
                stream = driver.active.get_current_stream(driver.active.get_current_device())
            self.run(grid[0], grid[1], grid[2], stream, None, None, None, None, None, *args)
        return runner

    def _init_handles(self) -> None:
        load = self.load   # dropped once used (it holds the checked binary's bytes); read once: another thread may
        if self.kernel is None and load is not None:   # have loaded it since (then it loads twice, harmlessly)
            self.kernel, self.load = load(), None

    @property
    def name(self) -> str:
        return self.entry.get("symbol")

    @property
    def metadata(self):
        """The fields of Triton's metadata a caller reads of a launch."""
        from types import SimpleNamespace
        options = self.entry.get("options") or {}
        return SimpleNamespace(name=self.name, num_warps=options.get("num_warps"),
                               num_stages=options.get("num_stages"), num_ctas=options.get("num_ctas", 1),
                               shared=self.entry.get("shared"))


def _not_served(name: str) -> property:
    def absent(self):
        raise AttributeError(f"kforge serve: a served kernel has no {name!r}: it stands for Triton's CompiledKernel "
                             f"with its launch ([grid](...), run), name and metadata only; serve without a bundle "
                             f"for this kernel to get Triton's own object")
    return property(absent)


# CompiledKernel's other attributes, each an AttributeError that says why (a property: Triton's launch path asks
# hasattr(kernel, "result") on every call, which a __getattr__ would make 20 times slower)
for _name in ("asm", "hash", "src", "module"):
    setattr(Served, _name, _not_served(_name))


def _loaded(position: int) -> property:
    """n_regs, n_spills, n_max_threads as Triton's driver reads them loading the binary (the fused-softmax tutorial
    sizes its grid by n_regs), read once."""
    def read(self):
        if self._loaded_numbers is None:
            from triton.runtime import driver
            device = driver.active.get_current_device()
            self._loaded_numbers = driver.active.utils.load_binary(
                self.name, self.bundle.binary(self.entry), self.entry.get("shared") or 0, device)[2:]
        return self._loaded_numbers[position]
    return property(read)


Served.n_regs, Served.n_spills, Served.n_max_threads = _loaded(0), _loaded(1), _loaded(2)


class LightDriver:
    """Triton's CUDA driver for a served process: the device, stream and target a call asks for, answered by torch as
    Triton's GPUDriver does. Anything else is Triton's own driver's, created at its first use (it compiles its C
    helpers: most of a served process's start)."""

    def __init__(self, config):
        import torch
        from torch._C import _cuda_getCurrentRawStream
        self._config = config
        self.get_current_device = torch.cuda.current_device
        self.set_current_device = torch.cuda.set_device
        self.get_current_stream = _cuda_getCurrentRawStream
        self.get_device_capability = torch.cuda.get_device_capability
        self.get_device_interface = lambda: torch.cuda
        self.get_active_torch_device = lambda: torch.device("cuda", self.get_current_device())

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        major, minor = self.get_device_capability(self.get_current_device())
        return GPUTarget("cuda", major * 10 + minor, 32)

    def __getattr__(self, name):
        return getattr(self._config.default, name)


def light_driver() -> None:
    """Give Triton the LightDriver, on NVIDIA, when no driver is active yet. Whether a GPU is there is not asked:
    that initializes CUDA (0.2 s); without one the first kernel call fails in torch as it would in Triton's driver."""
    try:
        import torch
    except ImportError:   # Triton's own GPU drivers need torch too: nothing to lighten
        return
    from triton.runtime import driver
    if getattr(driver, "_active", True) is None and torch.version.cuda is not None and torch.version.hip is None:
        try:
            light = LightDriver(driver)
        except (ImportError, AttributeError):   # a torch without the CUDA stream accessor: Triton's own driver
            return
        driver.set_active(light)


_uncached_lock = threading.Lock()


@contextlib.contextmanager
def _uncached(fn):
    """verify's compile past Triton's disk cache where Triton keys the code by less than kforge (source_key.py): a
    binary cached under Triton's key may be another kernel's (a factory's other dtype), not the served one's."""
    if source_key(fn) == fn.cache_key:
        yield
        return
    from triton import knobs
    with _uncached_lock:
        before = knobs.compilation.always_compile
        knobs.compilation.always_compile = True
        try:
            yield
        finally:
            knobs.compilation.always_compile = before


DEBUG_SECTIONS = (".debug", ".nv_debug", ".rela.debug", ".rel.debug", ".rela.nv_debug", ".rel.nv_debug")   # line
# info and its relocations: names and times of files


def differences(bundled: bytes, compiled: bytes, entry: dict, metadata) -> list[str]:
    """verify: what differs between the bundle's binary and entry and the JIT's binary and metadata, a phrase each.
    Every section but the debug info must be identical (the JIT writes absolute paths and mtimes into the line info,
    a kforge build does not), and so must what the launch reads."""
    launch = {"symbol": (entry.get("symbol"), getattr(metadata, "name", None)),
              "shared": (entry.get("shared"), getattr(metadata, "shared", None)),
              "threads_per_block": (entry.get("threads_per_block"),
                                    getattr(metadata, "num_warps", 0) * getattr(metadata, "warp_size", 32)),
              "global_scratch_size": (entry.get("global_scratch_size", 0),
                                      getattr(metadata, "global_scratch_size", 0) or 0)}
    if entry.get("global_scratch_size"):   # what a launch asks of the allocator with it
        launch["global_scratch_align"] = (entry.get("global_scratch_align", SCRATCH_ALIGN),
                                          getattr(metadata, "global_scratch_align", SCRATCH_ALIGN))
    found = [f"{field} {ours} in the bundle, {theirs} from the JIT" for field, (ours, theirs) in launch.items()
             if ours != theirs]
    if bundled == compiled:
        return found
    from .elf import SHT_NOBITS, ElfError, parse
    try:
        ours, theirs = ({s.name: b"" if s.type == SHT_NOBITS else data[s.offset:s.offset + s.size]
                         for s in parse(data).sections if s.name} for data in (bundled, compiled))
    except ElfError as e:
        return found + [f"a binary is not a readable ELF file ({e})"]
    code = sorted(n for n in ours.keys() | theirs.keys() if not n.startswith(DEBUG_SECTIONS)
                  and ours.get(n) != theirs.get(n))
    if code:
        shown = ", ".join(code[:6]) + (f" and {len(code) - 6} more" if len(code) > 6 else "")
        same_text = not any(n == ".text" or n.startswith(".text.") for n in code)   # the machine code itself
        found.append(f"sections {shown} differ" + (" (the machine code, .text, is the same)" if same_text else ""))
    return found


def other_ptxas(entry: dict, compiled: bytes) -> str | None:
    """verify: which ptxas made the JIT's binary, where it is not the one that built the entry's (torch.compile points
    TRITON_PTXAS_PATH at torch's own): another ptxas makes other bytes of the same kernel. The JIT binary's
    .note.nv.tkinfo names the ptxas build that wrote it (CUDA 13's do); else the ptxas the JIT runs now."""
    from .archs import ARCHS
    built = entry.get("toolchain_versions")
    built = built.get("ptxas") if isinstance(built, dict) else None
    arch = ARCHS.get(entry.get("arch")) if isinstance(entry.get("arch"), str) else None
    if not (isinstance(built, str) and arch is not None and arch.vendor == "nvidia"):
        return None
    blackwell = arch.target_arch >= 100   # as Triton's get_ptxas picks
    variable = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
    try:
        made_by = _tkinfo_build(compiled)
        if made_by is None:
            from triton import knobs
            path = (knobs.nvidia.ptxas_blackwell if blackwell else knobs.nvidia.ptxas).path
            made_by = f"{_version_line(path, os.stat(path).st_mtime_ns)} at {path}"
    except Exception:   # no ptxas to ask (Triton's cache made the binary): nothing to add to the difference
        return None
    if made_by.startswith(built):
        return None
    return one_line(f"the JIT's binary was made by ptxas {made_by[:200]}, the bundle's by {built[:200]} ({variable} "
                    f"chooses the JIT's; torch.compile sets TRITON_PTXAS_PATH to torch's own ptxas)")


def _tkinfo_build(binary: bytes) -> str | None:
    """The `Build cuda_...` line of the ptxas that wrote a cubin, from its .note.nv.tkinfo, or None."""
    from .elf import ElfError, parse
    try:
        note = next((binary[s.offset:s.offset + s.size] for s in parse(binary).sections
                     if s.name == ".note.nv.tkinfo"), b"")
    except ElfError:
        return None
    return next((w.decode("ascii", "replace") for w in note.split(b"\0") if w.startswith(b"Build cuda_")), None)


@functools.lru_cache(maxsize=8)
def _version_line(path: str, mtime_ns: int) -> str:
    """`path --version`'s last line, as a target's key holds it (rules/plan/keys.py); by the file's mtime too."""
    import subprocess
    out = subprocess.run([path, "--version"], capture_output=True, timeout=60).stdout.decode("utf-8", "replace")
    return next((line.strip() for line in reversed(out.splitlines()) if line.strip()), "no version line")


class Server:
    """The bundles' entries by identity, and Triton's JIT wrapped to use them."""

    def __init__(self, library, strict: bool, verify: bool = False):
        self.library, self.strict, self.verify = library, strict, verify
        self.broken: str | None = None   # why the bundles could not be read (one line), once they were tried
        self.served = self.compiled = self.tuned_configs = self.verified = 0
        self.differences: list[str] = []   # verify: one line per served specialization that differs from the JIT
        self.indexed: list[str] = []   # the arches whose bundles are indexed: each at its first call
        self.entries: dict[str, list[tuple]] = {}   # identity -> every (bundle, entry) held for it, bundles in order
        self.tuned: dict[tuple, list[dict]] = {}   # (kernel, autotuning key) -> its recorded picks, ranked
        self.rechecks: dict[tuple, bool] = {}   # (autotuner, key, its pick) -> rechoose's answer
        self.misses: list[dict] = []   # every specialization the bundles lacked, in order (the CI guard's list)
        self.loaded: dict[int, object] = {}   # id(entry) -> its loaded Kernel (preload)
        self.refused: dict[int, str] = {}   # id(entry) -> why its binary was refused (_proven)
        self.preload_at_first_call = False   # KFORGE_SERVE's preload: the process has picked its GPU by then
        self.lock = threading.Lock()
        self.setup_seconds = self.index_seconds = 0.0   # what serving adds to a process besides the launches

    def summary(self) -> str:
        verified = (f"; verify: {self.verified} checked against Triton's JIT, {len(self.differences)} differ"
                    if self.verify else "")
        return (f"{self.served} specializations served, {self.compiled} compiled, {self.tuned_configs} autotuned "
                f"configs chosen from the record{verified}; set-up {self.setup_seconds * 1000:.0f} ms, bundles "
                f"indexed in {self.index_seconds * 1000:.0f} ms")

    def index(self, arch: str | None = None) -> str:
        """Index the bundles for `arch` (None: the current device's) at its first call. Bundles that cannot be read
        serve nothing: NotServed under strict, else one warning (every call then compiles)."""
        with self.lock:
            if arch is None:
                from triton.runtime import driver
                arch = arch_name(driver.active.get_current_target())
            if arch not in self.indexed:
                started = time.perf_counter()
                from .bundle import BundleError
                try:
                    for bundle in self.library.bundles_for([arch]):   # only this arch's manifests are read
                        for entry in bundle.artifacts:
                            found = entry_identity(entry)
                            if found is not None:
                                self.entries.setdefault(found, []).append((bundle, entry))
                        for t in bundle.autotune:
                            self.tuned.setdefault((t["kernel"], json.dumps(t["key"])), []).append(t)
                    for key, picks in self.tuned.items():
                        self.tuned[key] = _ranked(picks)
                except (BundleError, OSError) as e:
                    self.entries.clear()
                    self.tuned.clear()
                    self.broken = f"kforge serve: cannot serve from the bundles for {arch}: {_one_line(e)}"
                    if not self.strict:
                        sys.stderr.write(f"{self.broken}; every kernel compiles instead\n")
                self.indexed.append(arch)
                self.index_seconds += time.perf_counter() - started
            if self.broken and self.strict:
                raise NotServed(self.broken)
        return arch

    def lookup(self, fn, signature, constexprs, attrs, options, device: int):
        if self.preload_at_first_call:
            self.preload_at_first_call = False
            self.preload()
        _, _, target, backend, _ = fn.device_caches[device]   # the call's device's, as Triton compiles for it
        arch = self.index(arch_name(target))
        try:
            line = record_line(fn.fn.__module__, fn.fn.__qualname__, list(fn.arg_names), signature, constexprs,
                               attrs, options.__dict__, arch)
            check_options(options.__dict__, backend)
        except ValueError as e:   # a call no record line holds (a tuple constexpr, ptx_options): Triton compiles it
            kernel = f"{fn.fn.__module__}:{fn.fn.__qualname__}"
            return self.missed({"kernel": kernel, "arch": arch, "unrecordable": str(e)},
                               f"kforge serve (strict): {kernel} on {arch}: {e}; no build holds such a call: serve "
                               f"with strict=False to let Triton compile it")
        fn.cache_key   # Triton's own key, made as its compile makes it: with it, its check that no global the
        # kernel read has changed since (RuntimeError at the launch) holds for a served kernel as for a compiled one
        found, refused = self._pick(line, self.entries.get(record_identity(line), []), source_key(fn))
        if refused is not None:
            return self.missed(line, refused)
        bundle, entry = found
        preloaded = id(entry) in self.loaded
        binary = None if preloaded else self._proven(bundle, entry, line)
        if binary is None and not preloaded:
            return None
        plan = [(list(fn.arg_names).index(a["name"]), a["type"].startswith("*")) for a in entry["signature"]]
        return Served(lambda: self.loaded.get(id(entry)) or bundle.kernel(entry, device, binary), plan, bundle,
                      entry, fn)

    def _proven(self, bundle, entry: dict, line: dict | None = None) -> bytes | None:
        """The entry's binary once it is proven the manifest's (read and checked before the call counts as served), or
        None: the call is a miss, said once per entry, and Triton compiles it (strict: NotServed). A refused entry
        stays indexed, so that two binaries for one call stay ambiguous (_pick) whether or not one was refused."""
        from .bundle import BundleError
        why = self.refused.get(id(entry))
        if why is None:
            try:
                return bundle.binary(entry)
            except (BundleError, OSError) as e:
                why = self.refused[id(entry)] = _one_line(e)
                if not self.strict:
                    sys.stderr.write(f"kforge serve: {entry.get('target')}: {why}; Triton compiles this kernel "
                                     f"instead\n")
        miss = line if line is not None else {"kernel": entry.get("kernel"), "arch": bundle.arch}
        miss["refused"] = why
        self.missed(miss, f"kforge serve: {entry.get('target')}: {why}")
        return None

    def _pick(self, line: dict, held: list[tuple], code_key: str) -> tuple[tuple | None, str | None]:
        """((bundle, entry) to serve, None), or (None, strict's message). Of the entries held for the call, the one
        built from the calling code (a factory's kernels per dtype share a name); the line notes why none fits."""
        if not held:
            return None, miss_message(line)
        same_code = [h for h in held if h[1].get("triton_source_key") == code_key]
        if not same_code:   # built from other code
            line["source_key"] = code_key
            return None, other_source_message(line, held[0][1])
        if len({str(h[1].get("sha256")) for h in same_code}) > 1:   # str: a hostile value may be a list
            line["ambiguous"] = [h[1].get("target") for h in same_code]
            return None, ambiguous_message(line)
        found = same_code[0]
        from .launch import LaunchError, launch_plan
        try:   # what the loader refuses before its driver sees the binary is a miss before the call counts as
            launch_plan(found[1], found[0].vendor)   # served, and Triton compiles and runs it
        except LaunchError as e:
            line["unlaunchable"] = _one_line(e)
            return None, one_line(f"kforge serve (strict): {line['kernel']} on {line['arch']}: {e}; serve with "
                                  f"strict=False to let Triton compile and run it")
        ours = triton_environment(code_environment())   # read at each call: a process may set one after its first
        if triton_environment(found[1].get("env") or {}) != ours:   # built under other compiler variables
            line["env"] = ours
            return None, other_environment_message(line, found[1], ours)
        return found, None

    def compare(self, served: Served, compiled) -> None:
        """verify: a difference from Triton's own compile is a line on stderr and in differences (strict: NotServed)."""
        entry = served.entry
        binary = next((compiled.asm[k] for k in ("cubin", "hsaco") if k in compiled.asm), b"")
        try:
            bundled = served.bundle.binary(entry)
            found = differences(bundled, binary, entry, compiled.metadata)
            if found and bundled != binary:   # why, where another ptxas made the JIT's
                found += [why for why in [other_ptxas(entry, binary)] if why]
        except Exception as e:   # the bundle's binary cannot be read: that is a difference too
            found = [_one_line(e)]
        with self.lock:
            self.verified += 1
            if found:
                line = f"kforge verify: {entry.get('target')} differs from Triton's JIT: {'; '.join(found)}"
                self.differences.append(line)
        if found:
            sys.stderr.write(line + "\n")
            if self.strict:
                raise NotServed(line)

    def preload(self) -> None:
        """Check and load every binary the device's bundles hold now, not at each kernel's first launch."""
        from .launch import LaunchError
        self.index()
        for bundle, entry in [held for each in self.entries.values() for held in each]:
            if id(entry) not in self.loaded and id(entry) not in self.refused:
                binary = self._proven(bundle, entry)
                if binary is not None:
                    try:
                        self.loaded[id(entry)] = bundle.kernel(entry, binary=binary)
                    except LaunchError as e:   # its calls are misses (_proven), as a refused binary's are
                        self.refused[id(entry)] = _one_line(e)

    def missed(self, line: dict, message: str) -> None:
        """A specialization the bundles lack: on the CI guard's list, and NotServed(message) under strict."""
        with self.lock:
            if line not in self.misses:
                self.misses.append(line)
        if self.strict:
            raise NotServed(message) from None

    def choose(self, tuner, args: tuple, kwargs: dict, current=None):
        """The config an autotuner runs for this call without benchmarking, or None (let it benchmark): of the
        configs its pruner keeps whose specialization the bundles hold, `current` (the process's pick so far), else
        the recorded pick most lines made, else, with nothing recorded for the key, the only one held."""
        self.index()
        if current is not None and self._held(tuner, args, kwargs, current)[2]:
            return current   # the cheap path of a call whose key has picks apart: one specialization computed
        held, line, key, candidates = {}, None, None, tuner.configs
        if len(tuner.configs) > 1:   # as Autotuner.run, which gives the pruner the call's arguments
            tuner.nargs = dict(zip(tuner.arg_names, args))
            candidates = tuner.prune_configs(kwargs)
        for config in candidates:
            line, key, found = self._held(tuner, args, kwargs, config)
            if line is None:
                return None
            if found:
                held[_text(config.all_kwargs())] = config
        if line is None:
            return None
        recorded = [_text(p["config"]) for p in self.tuned.get((line["kernel"], json.dumps(key)), [])]
        picked = next((held[c] for c in recorded if c in held), None)
        if picked is None and not recorded and len(held) == 1:
            picked = next(iter(held.values()))
        if picked is None:
            first = json.loads(recorded[0]) if recorded else None
            line.pop("source_key", None)   # what a record line holds: here it would read "held, other source"
            self.missed({**line, "autotune": {"key": key, "config": first}},
                        tuned_miss_message(line, key, len(held), first))
        return picked

    def _held(self, tuner, args: tuple, kwargs: dict, config) -> tuple:
        """(the record line of this call run with `config`, its autotuning key, whether the bundles hold it);
        (None, None, False) for a kernel kforge does not record (a nested autotuner). The config's own pre_hook is
        applied first (_after_pre_hook), as Autotuner.run runs it before every launch with that config: lmdeploy's
        TMA GEMM makes its descriptors with a (1, 1) block and its pre_hook gives them the config's."""
        args, kwargs = _after_pre_hook(tuner, args, kwargs, config)
        try:
            line = tuned_line(tuner, args, kwargs, config)
        except ValueError as e:
            if self.strict:
                raise NotServed(f"kforge serve (strict): {e}; serve with strict=False to let Triton "
                                f"autotune it") from None
            return None, None, False
        key = line.pop("autotune")["key"]
        code = source_key(_jit_of(tuner))   # held for this code: a bundle of another version's is not
        held = self.entries.get(record_identity(line), ())
        return line, key, any(entry.get("triton_source_key") == code for _, entry in held)

    def rechoose(self, tuner, key: tuple, current) -> bool:
        """Whether a key the autotuner has a pick for must be chosen again: where the record holds several picks for
        it, or one that is not the process's (benchmarked before serve(), or put there by a library's Autotuner
        subclass). Asked once per (autotuner, key, pick), then one lookup per launch."""
        asked = (id(tuner), key, id(current))
        verdict = self.rechecks.get(asked)
        if verdict is None:
            self.index()
            from triton.runtime.jit import JITFunction
            fn = _jit_of(tuner)
            kernel = f"{fn.fn.__module__}:{fn.fn.__qualname__}" if isinstance(fn, JITFunction) else ""
            picks = self.tuned.get((kernel, json.dumps(list(key))), ())
            verdict = len(picks) > 1 or len(picks) == 1 and _text(current.all_kwargs()) != _text(picks[0]["config"])
            self.rechecks[asked] = verdict
        return verdict


def _after_pre_hook(tuner, args: tuple, kwargs: dict, config) -> tuple[tuple, dict]:
    """The call's arguments as a launch with `config` passes them: its pre_hook run on copies of the tensor
    descriptors, the one kind of argument whose specialization it can change (their block_shape), so that the
    caller's are left as made for Autotuner.run, which runs the hook before the launch. A call without descriptors
    is left alone: the hook's other work (zeroing a buffer) is Autotuner.run's alone there."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if config.pre_hook is None or not any(isinstance(a, TensorDescriptor) for a in (*args, *kwargs.values())):
        return args, kwargs
    import dataclasses

    def fresh(a):   # a hook may set block_shape or change it in place (`d.block_shape[0] = BM`)
        return dataclasses.replace(a, block_shape=list(a.block_shape)) if isinstance(a, TensorDescriptor) else a
    args, kwargs = tuple(map(fresh, args)), {k: fresh(v) for k, v in kwargs.items()}
    config.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()})
    return args, kwargs


def _jit_of(tuner):
    """The JIT function an autotuner runs (under @triton.heuristics wrappers); what else it holds, if none."""
    from triton.runtime.jit import JITFunction
    fn = tuner.fn
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def _ranked(picks: list[dict]) -> list[dict]:
    """One per config, its lines summed over the bundles (1 where a bundle has no count), most first, then by the
    config's text: the same bundles rank the same way in every process."""
    merged: dict[str, dict] = {}
    for p in picks:
        lines = p.get("lines") if isinstance(p.get("lines"), int) and p.get("lines") > 0 else 1
        text = _text(p["config"])
        merged[text] = {**p, "lines": merged[text]["lines"] + lines if text in merged else lines}
    return sorted(merged.values(), key=lambda p: (-p["lines"], _text(p["config"])))


def _text(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


_active: list[Server] = []


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 400 else text[:397] + "..."


def serve(bundles, strict: bool = False, preload: bool = False, verify: bool = False) -> Server:
    """Make every Triton JIT function whose specialization the bundles (a Library, or what Library takes) hold launch
    the prebuilt binary. verify: also compile each served specialization once and compare (differences())."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    from .library import Library
    started = time.perf_counter()
    server = Server(bundles if isinstance(bundles, Library) else Library(bundles), strict, verify)
    light_driver()
    specializer.prime()
    if not getattr(Autotuner.run, "kforge_served", False):
        tuner_run = Autotuner.run

        def run(tuner, *args, **kwargs):
            if _active and len(tuner.configs) > 1:
                key, server = autotune_key(tuner, args, kwargs), _active[-1]
                if key not in tuner.cache or server.rechoose(tuner, key, tuner.cache[key]):
                    current = tuner.cache.get(key)
                    config = server.choose(tuner, args, kwargs, current)
                    if config is not None and config is not current:
                        if current is None:   # the call Triton tunes at: it resets reset_to_zero's arguments then
                            tuner.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()},
                                           reset_only=True)
                        tuner.cache[key] = config
                        with server.lock:
                            server.tuned_configs += 1
            return tuner_run(tuner, *args, **kwargs)
        run.kforge_served = True
        Autotuner.run = run
    if not getattr(JITFunction._do_compile, "kforge_served", False):
        compile_it = JITFunction._do_compile

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            if _active:
                server = _active[-1]
                served = server.lookup(self, signature, constexprs, attrs, options, device)
                if served is not None:
                    if server.verify:   # Triton's own compile of the call, then the served kernel in its place
                        with _uncached(self):
                            compiled = compile_it(self, key, signature, device, constexprs, options, attrs, warmup)
                        server.compare(served, compiled)
                    self.device_caches[device][0][key] = served   # Triton's kernel cache
                    with server.lock:
                        server.served += 1
                    return served
                with server.lock:
                    server.compiled += 1
            return compile_it(self, key, signature, device, constexprs, options, attrs, warmup)
        _do_compile.kforge_served = True
        JITFunction._do_compile = _do_compile
    _active.append(server)
    if preload:
        server.preload()
    server.setup_seconds = time.perf_counter() - started
    return server


def stop() -> None:
    """The most recent serve() no longer applies (kernels already served stay in Triton's cache)."""
    if _active:
        _active.pop()


def main(argv: list[str] | None = None) -> int:
    """`python -m kforge_runtime.serve --bundles out/dist [--strict] app.py [args]`: run a script with its Triton
    kernels served; prints how many were served and compiled."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m kforge_runtime.serve")
    ap.add_argument("--bundles", required=True, action="append", help="a bundle wheel or directory, or out/dist")
    ap.add_argument("--strict", action="store_true", help="a specialization no bundle holds is an error")
    ap.add_argument("--preload", action="store_true", help="load every binary for this GPU before the script runs")
    ap.add_argument("--verify", action="store_true",
                    help="also compile each served specialization with Triton once and compare the binaries")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    with contextlib.suppress(ImportError):   # the script imports torch and Triton anyway: not serve()'s time
        import torch  # noqa: F401
    import triton.runtime.jit  # noqa: F401

    from .library import Library
    server = serve(Library(*a.bundles), strict=a.strict, preload=a.preload, verify=a.verify)
    # the script's Python children (worker pools, subprocesses) are served too: kforge_runtime/startup.py
    flags = [f for f in ("strict", "preload", "verify") if getattr(a, f)]
    os.environ.setdefault("KFORGE_SERVE", ",".join([*map(os.path.abspath, a.bundles), *flags]))
    try:
        run_script(a.script, a.args)
    finally:
        sys.stderr.write(f"kforge serve: {server.summary()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
