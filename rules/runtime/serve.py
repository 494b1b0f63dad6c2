"""Serve prebuilt kernels to unchanged `kernel[grid](...)` call sites: a Triton JIT function whose
specialization a bundle holds launches the bundle's binary, with no compile and nothing written to Triton's
cache.

    from kforge_runtime.serve import serve
    serve("out/dist")                 # or a Library; strict=True: a miss raises instead of compiling

How: Triton's JIT looks a call's specialization up in its per-device kernel cache and compiles on a miss
(JITFunction._do_compile, given the specialization Triton computed: argument types, constexprs, 16-divisible
arguments, options). serve() wraps that one method: on a miss it looks the specialization up in the bundles
(the same canonical form as a record line: rules/runtime/record.py) and, when found, puts a served kernel in
Triton's cache in place of a compiled one, so every later call takes Triton's own fast path to it. A served
kernel launches through kforge's loader (the driver's launch call, on Triton's current stream), which a CUDA
graph captures like any launch. Not yet: entries wrapped in @triton.autotune (the autotuner benchmarks its
configs before the JIT is asked).
"""
from __future__ import annotations

import json
import os
import threading

from .record import DEFAULTS, arch_name, record_line

COMPILE_TIME = ("constexpr", "dtype", "function", "none")


class NotServed(RuntimeError):
    """strict=True: a specialization the bundles do not hold."""


def identity(kernel: str, arch: str, runtime: list, constexprs: dict, divisible: list, options: dict) -> str:
    """What decides a binary, in one canonical string: a recorded specialization and a bundle entry that
    ask for the same compile give the same string."""
    stages = 2 if arch.startswith("gfx") else 3
    options = {k: v for k, v in {**DEFAULTS, "num_warps": 4, "num_stages": stages, **options}.items()
               if v is not None}
    constexprs = {k: v for k, v in constexprs.items() if v is not None}   # None arguments: not given
    return json.dumps([kernel, arch, [list(p) for p in runtime], constexprs, sorted(divisible), options],
                      sort_keys=True)


def entry_identity(entry: dict) -> str | None:
    source = entry.get("source") or {}
    try:
        return identity(f"{source['module']}:{source['entry']}", entry["arch"],
                        [[a["name"], a["type"]] for a in entry["signature"]], dict(entry.get("constexprs") or {}),
                        list(entry.get("divisible_by_16") or []), dict(entry.get("options") or {}))
    except (KeyError, TypeError):
        return None


def record_identity(line: dict) -> str:
    runtime = [[a, t] for a, t in line["signature"] if t not in COMPILE_TIME]
    return identity(line["kernel"], line["arch"], runtime, line["constexprs"], line["divisible_by_16"],
                    line["options"])


def miss_message(line: dict) -> str:
    """strict=True's error: the kernel, the specialization the bundles lack, and how to get it built."""
    shown = {k: line[k] for k in ("signature", "constexprs", "divisible_by_16", "options")}
    return (f"kforge serve (strict): no prebuilt {line['kernel']} for {line['arch']} with {json.dumps(shown)}. "
            f"Record it (python -m kforge_runtime.record --out specs/app.jsonl app.py), build (doit) and package "
            f"(doit package) again, or serve with strict=False to let Triton compile it")


class Served:
    """What Triton's kernel cache holds for a served specialization: Triton's launch path calls run()."""

    def __init__(self, kernel, runtime_positions: list[int]):
        self.kernel, self.positions = kernel, runtime_positions
        self.function = self.packed_metadata = None

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args):
        self.kernel((gx, gy, gz), *(args[i] for i in self.positions), stream=stream)


class Server:
    """The bundles' entries by identity, and Triton's JIT wrapped to use them."""

    def __init__(self, library, strict: bool):
        self.library, self.strict = library, strict
        self.entries: dict[str, tuple] = {}
        for bundle in library.bundles:
            for entry in bundle.artifacts:
                found = entry_identity(entry)
                if found is not None:
                    self.entries.setdefault(found, (bundle, entry))
        self.served = self.compiled = 0
        self.lock = threading.Lock()
        self.arch = None

    def lookup(self, fn, signature, constexprs, attrs, options):
        from triton.runtime import driver
        if self.arch is None:
            self.arch = arch_name(driver.active.get_current_target())
        line = record_line(fn.fn.__module__, fn.fn.__qualname__, list(fn.arg_names), signature, constexprs, attrs,
                           options.__dict__, self.arch)
        found = self.entries.get(record_identity(line))
        if found is None:
            if self.strict:
                raise NotServed(miss_message(line))
            return None
        bundle, entry = found
        names = [a["name"] for a in entry["signature"]]
        positions = [list(fn.arg_names).index(n) for n in names]
        return Served(bundle.kernel(entry), positions)


_active: list[Server] = []


def serve(bundles, strict: bool = False) -> Server:
    """Make every Triton JIT function whose specialization the bundles hold launch the prebuilt binary.
    bundles: a kforge_runtime.Library, or what Library takes (a wheel, a bundle directory, out/dist)."""
    from triton.runtime.jit import JITFunction

    from .library import Library
    server = Server(bundles if isinstance(bundles, Library) else Library(bundles), strict)
    if not getattr(JITFunction._do_compile, "kforge_served", False):
        compile_it = JITFunction._do_compile

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            if _active:
                server = _active[-1]
                served = server.lookup(self, signature, constexprs, attrs, options)
                if served is not None:
                    kernel_cache = self.device_caches[device][0]
                    kernel_cache[key] = served
                    with server.lock:
                        server.served += 1
                    return served
                with server.lock:
                    server.compiled += 1
            return compile_it(self, key, signature, device, constexprs, options, attrs, warmup)
        _do_compile.kforge_served = True
        JITFunction._do_compile = _do_compile
    _active.append(server)
    return server


def stop() -> None:
    """The most recent serve() no longer applies (kernels already served stay in Triton's cache)."""
    if _active:
        _active.pop()


def main(argv: list[str] | None = None) -> int:
    """`python -m kforge_runtime.serve --bundles out/dist [--strict] app.py [args]`: run a script with its
    Triton kernels served, unchanged; with --strict (CI, production) any specialization the bundles lack
    stops it with the message that says what to record. Prints how many were served and compiled."""
    import argparse
    import runpy
    import sys
    ap = argparse.ArgumentParser(prog="python -m kforge_runtime.serve")
    ap.add_argument("--bundles", required=True, action="append", help="a bundle wheel or directory, or out/dist")
    ap.add_argument("--strict", action="store_true", help="a specialization no bundle holds is an error")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    from .library import Library
    server = serve(Library(*a.bundles), strict=a.strict)
    sys.argv = [a.script, *a.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    try:
        runpy.run_path(a.script, run_name="__main__")
    finally:
        sys.stderr.write(f"kforge serve: {server.served} specializations served, {server.compiled} compiled\n")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
