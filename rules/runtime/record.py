"""Record the Triton specializations a process compiles or loads, for kforge to build ahead of time:
`python -m kforge_runtime.record --out specs/app.jsonl app.py`, `with recording(path):`, or KFORGE_RECORD (startup.py).

Each one is a line of the record file (schema.py's RECORD_*), appended once for all processes (append_once).
Recording only listens (Triton's jit_post_compile_hook, chained, and around Autotuner.run): it never changes what
runs, and a line it cannot write is a warning. An autotuner is recorded once per key with the config it picked,
never the ones it only benchmarked: serving runs that config without benchmarking (serve.py).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import runpy
import sys
import threading

from .schema import NONE, RECORD_ALWAYS, RECORD_FORMAT, RECORD_OPTIONS, TRITON_DTYPE_NAMES, option_defaults
from .source_key import reproducible, source_key, tagged


def record_line(module: str, name: str, arg_names: list[str], signature: dict, constants: dict, attrs: dict,
                options: dict, arch: str, code: str | None = None) -> dict:
    """One record from what Triton's JIT hook is given (constants and attrs by argument path, a tuple of indices;
    options as a dict); code: the kernel's source key (source_key.py)."""
    values, kinds = {}, dict(signature)
    for path, value in constants.items():
        if len(path) != 1:
            raise ValueError(f"{module}.{name}: a tuple argument's element is specialized ({path}); kforge "
                             f"records plain arguments")
        arg = arg_names[path[0]]
        kind, recorded = _constant(value)
        if kind != "constexpr":
            kinds[arg] = kind
        if kind != NONE:   # passed as None: nothing to give at build time
            values[arg] = recorded
    divisible = sorted(arg_names[path[0]] for path, found in attrs.items()
                       if len(path) == 1 and ["tt.divisibility", 16] in [list(a) for a in found])
    defaults = option_defaults(arch)
    return {"format": RECORD_FORMAT, "kernel": f"{module}:{name}", "arch": arch,
            "signature": [[a, kinds[a]] for a in kinds],
            "constexprs": values, "divisible_by_16": divisible,
            "options": {k: options[k] for k in RECORD_OPTIONS if k in options and options[k] is not None
                        and (k in RECORD_ALWAYS or options[k] != defaults[k])},
            **({"source_key": code} if code else {})}


def check_options(options: dict, backend) -> None:
    """ValueError where the launch sets an option a record line does not hold (ptx_options, extern_libs) to other
    than the backend's default: a build never sets it, so no binary is this call's."""
    defaults = _launch_defaults(backend)
    changed = sorted(k for k, v in _as_json(options).items() if k not in RECORD_OPTIONS and v != defaults.get(k))
    if changed:
        raise ValueError(f"the launch sets {', '.join(changed)}, which kforge does not build with")


@functools.cache
def _launch_defaults(backend) -> dict:
    return _as_json(backend.parse_options({}).__dict__)


def _as_json(options: dict) -> dict:
    return json.loads(json.dumps(options, default=str))


def specialize(jit, args: tuple, kwargs: dict) -> dict:
    """The record line of what Triton's JIT would compile for `jit[grid](*args, **kwargs)`, computed as
    JITFunction.run does, compiling nothing."""
    from triton import knobs
    from triton.runtime import driver
    kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    kwargs["debug"] = kwargs.get("debug", jit.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, _, target, backend, binder = jit.device_caches[driver.active.get_current_device()]
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    check_options(options.__dict__, backend)
    return record_line(jit.fn.__module__, jit.fn.__qualname__, list(jit.arg_names), signature, constexprs, attrs,
                       options.__dict__, arch_name(target), _code(jit))


def _code(jit) -> str | None:
    """The kernel's source key as a line holds it (tagged), or None where it cannot be made or no other process
    would make it the same (a value written with its address): the line is then recorded without it, unchecked."""
    try:
        key = source_key(jit)
    except Exception:
        return None
    return tagged(key) if reproducible(key) else None


def autotune_key(tuner, args: tuple, kwargs: dict) -> tuple:
    """The key Triton's Autotuner.run caches its choice under."""
    given = {**dict(zip(tuner.arg_names, args)), **kwargs}
    given = {k: v for k, v in given.items() if k in tuner.arg_names}
    return tuple([given[k] for k in tuner.keys if k in given] + [str(v.dtype) for v in given.values()
                                                                 if hasattr(v, "dtype")])


def tuned_line(tuner, args: tuple, kwargs: dict, config) -> dict:
    """The record line of the specialization an autotuner runs with `config`, marked with its key."""
    from triton.runtime.autotuner import Heuristics
    from triton.runtime.jit import JITFunction
    key, chosen = list(autotune_key(tuner, args, kwargs)), config.all_kwargs()
    jit, kwargs = tuner.fn, {**kwargs, **chosen}
    while isinstance(jit, Heuristics):   # @triton.heuristics wrappers: the values they add
        for name, heuristic in jit.values.items():
            kwargs[name] = heuristic({**dict(zip(jit.arg_names, args)), **kwargs})
        jit = jit.fn
    if not isinstance(jit, JITFunction):   # a nested autotuner
        raise ValueError(f"{tuner.base_fn.__name__}: an autotuner wrapping {type(tuner.fn).__name__} is not "
                         f"recorded")
    if not all(isinstance(v, (bool, int, float, str)) for v in key):
        raise ValueError(f"autotuning key {key!r} holds a value that is not a number or a string")
    if not all(isinstance(v, (bool, int, float, str, type(None))) for v in chosen.values()):
        raise ValueError(f"config {chosen!r} holds a value that is not a number or a string")
    return {**specialize(jit, args, kwargs), "autotune": {"key": key, "config": chosen}}


def _constant(value) -> tuple[str, object]:
    """(signature kind, JSON value) of a specialized constant."""
    if value is None:
        return NONE, None
    kind = type(value).__name__
    if kind == "constexpr":
        value = value.value
        kind = type(value).__name__
    if kind == "dtype":
        return "dtype", TRITON_DTYPE_NAMES.get(str(value), str(value))
    if kind == "JITFunction":
        return "function", f"{value.fn.__module__}:{value.fn.__qualname__}"
    if isinstance(value, (bool, int, float, str)):
        return "constexpr", value
    raise ValueError(f"a constexpr of type {kind} ({value!r}) cannot be recorded")


def arch_name(target) -> str:
    """kforge's name for Triton's GPUTarget: cuda 90 -> sm_90a, cuda 80 -> sm_80, hip gfx942 -> gfx942."""
    if target.backend == "hip":
        return str(target.arch)
    return f"sm_{target.arch}" + ("a" if target.arch in (90, 100) else "")


class Recorder:
    """Appends each new specialization's line to `path`. While an autotuner runs, only its own kernel's compiles are
    left to its pick: any other kernel compiled meanwhile (a pre_hook zeroing a buffer, flag_gems's zeros_kernel in
    do_bench's cache flush) is recorded as the launch it is, run with every tune."""

    def __init__(self, path: str, arch: str | None = None):
        self.path, self.seen, self.lock = path, set(), threading.Lock()
        self.off = False   # the file turned out unwritable: warned once, records nothing more
        self.arch = arch   # None: the current device's, asked of Triton's driver at the first record
        self.previous = None
        self.tuning = threading.local()   # .kernels: the functions of this thread's running autotuners

    def install(self) -> None:
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
        self.previous = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = self.hook
        self.tuner_run = Autotuner.run

        def run(tuner, *args, **kwargs):
            if len(tuner.configs) <= 1:   # no choice made: the hook records the one config
                return self.tuner_run(tuner, *args, **kwargs)
            tuned = self._tuned()
            tuned.append(tuner.base_fn)   # the Python function under its JITFunction (and any Heuristics)
            try:
                result = self.tuner_run(tuner, *args, **kwargs)
            finally:
                tuned.pop()
            try:
                self.write(tuned_line(tuner, args, kwargs, tuner.best_config))
            except Exception as e:   # recording never changes what runs
                sys.stderr.write(f"kforge record: autotuned {tuner.base_fn.__name__} not recorded: {e}\n")
            return result
        Autotuner.run = run

    def uninstall(self) -> None:
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
        if knobs.runtime.jit_post_compile_hook == self.hook:
            knobs.runtime.jit_post_compile_hook = self.previous
        Autotuner.run = self.tuner_run

    def hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):
        try:
            if not any(getattr(fn.jit_function, "fn", None) is tuned for tuned in self._tuned()):
                self._record(fn, compile)
        except Exception as e:   # recording never changes what runs
            sys.stderr.write(f"kforge record: not recorded ({fn.module}.{fn.name}): {e}\n")
        if self.previous is not None:
            return self.previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                                 already_compiled=already_compiled)
        return None

    def _tuned(self) -> list:
        return self.tuning.__dict__.setdefault("kernels", [])

    def _record(self, fn, compile: dict) -> None:
        if self.arch is None:
            from triton.runtime import driver
            self.arch = arch_name(driver.active.get_current_target())
        data = json.loads(compile["specialization_data"])
        self.write(record_line(fn.module, fn.name, list(fn.jit_function.arg_names), compile["signature"],
                               compile["constants"], compile["configs"][0], data["options"], self.arch,
                               _code(fn.jit_function)))

    def write(self, line: dict) -> None:
        text = json.dumps(line, sort_keys=True)
        with self.lock:
            if text in self.seen or self.off:
                return
            self.seen.add(text)
            try:
                append_once(self.path, text)
            except Unwritable as e:   # said once; the process runs on unrecorded (recording never changes what runs)
                self.off = True
                sys.stderr.write(f"kforge record: {self.path}: {e}; nothing is recorded in this process. Record into "
                                 f"a file (KFORGE_RECORD=specs/app.jsonl)\n")


def record_problem(value: str) -> str | None:
    """Why a KFORGE_RECORD value names no file to record into (None: it does): a blank value would record into a
    file named ' ', `app.jsonl,report` into a file of that name."""
    if not value.strip() or "," in value:
        return (f"KFORGE_RECORD={value!r}: KFORGE_RECORD takes one file name and no options; set it to a file such "
                f"as specs/app.jsonl")
    return None


class Unwritable(OSError):
    """The record file is not a regular file (a FIFO, a pipe, a terminal, a device) or cannot be opened."""


def append_once(path: str, text: str) -> bool:
    """Append the line `text` to the record file unless it holds it; True if appended. Checked and appended under
    an exclusive lock, in one write() on an O_APPEND descriptor: processes at the same time neither interleave nor
    repeat a line. Unwritable for a file that is no regular one (opened without blocking: a FIFO would block,
    /dev/zero never end), for a link (not followed: a checkout's link would carry the appends into any file the user
    can write), and for an error while reading or writing (a full disk)."""
    import errno
    import fcntl
    import stat
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            try:
                mode = os.stat(path).st_mode   # /dev/stdout is a link: what it leads to is said first
            except OSError:
                mode = stat.S_IFREG
            if not stat.S_ISREG(mode):
                from .bundle import file_kind   # only on this error: a recording process imports no loader
                raise Unwritable(f"it is {file_kind(mode)}, not a regular file") from None
            raise Unwritable(f"it is a symbolic link (to {os.readlink(path)}); record into a file of its own") from None
        if e.errno == errno.ENOENT and not os.path.isdir(os.path.dirname(path) or "."):
            raise Unwritable(f"its folder {os.path.dirname(path)} does not exist; create it") from None
        raise Unwritable(f"cannot open it ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            from .bundle import file_kind
            raise Unwritable(f"it is {file_kind(mode)}, not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)   # released when fd is closed
        wanted, tail, last = text.encode(), b"", b"\n"
        while chunk := os.read(fd, 1 << 20):   # the descriptor starts at offset 0; appends go to the end anyway
            lines = (tail + chunk).split(b"\n")
            tail, last = lines.pop(), chunk[-1:]
            if wanted in lines:
                return False
        if tail == wanted:
            return False
        os.write(fd, (b"\n" if last != b"\n" else b"") + wanted + b"\n")
        return True
    except Unwritable:
        raise
    except OSError as e:
        raise Unwritable(f"cannot read or append to it ({e.strerror or e})") from None
    finally:
        os.close(fd)


@contextlib.contextmanager
def recording(path: str):
    """Record every specialization the block compiles or loads into `path` (appended)."""
    recorder = Recorder(path)
    recorder.install()
    try:
        yield recorder
    finally:
        recorder.uninstall()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kforge_runtime.record",
                                 description="run a Python script, recording the Triton specializations it uses")
    ap.add_argument("--out", required=True, help="the record file (JSON lines; new lines appended)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if record_problem(a.out) is not None:   # its Python children would refuse it (KFORGE_RECORD)
        ap.error(record_problem(a.out).replace("KFORGE_RECORD", "--out", 2))
    # the script's Python children (worker pools, subprocesses) record into the same file: startup.py
    os.environ.setdefault("KFORGE_RECORD", os.path.abspath(a.out))
    with recording(os.path.abspath(a.out)):
        run_script(a.script, a.args)
    return 0


def run_script(script: str, args: list[str]) -> None:
    """Run a script as `python script args` does (its folder first on sys.path)."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    sys.exit(main())
