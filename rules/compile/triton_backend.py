"""Triton ahead-of-time compile of one Target. Imported only by processes that compile."""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import time
import types

from kforge.compile import amdgpu_metadata, lowering
from kforge.base.archs import ARCHS
from kforge.compile.lowering import Lowered
from kforge_runtime.schema import COMPILE_TIME, NONE, SCRATCH_ALIGN, VALUE_KINDS
from kforge_runtime.source_key import comparable, reproducible, source_key as source_key_of, tagged

_root = ""
_folders: tuple = ()   # observe.Base: the project and the module path: no binary may name them


def warm(root: str) -> None:
    """Once per process, before forking the compile server: import Triton and pay its toolchain hash (triton_key)."""
    global _root
    if _root == root:
        return
    if root not in sys.path:
        sys.path.insert(0, root)
    import triton.compiler  # noqa: F401  (the import itself is part of the warm-up)
    _private_cache_key()
    _canonical_file_names(root)
    _root = root


def _private_cache_key() -> None:
    """Triton names its cache entries by triton_key(), a sha256 of its sources and libtriton (415 MB: 0.3 s in
    every doit worker). A compile here never shares that cache (TRITON_CACHE_DIR is its scratch folder) and the
    toolchain is in the target's key, so Triton's version and libtriton's stat name them instead."""
    import sysconfig

    import triton
    from triton.runtime import cache
    library = os.path.join(os.path.dirname(triton.__file__), "_C",
                           f"libtriton.{sysconfig.get_config_var('EXT_SUFFIX').split('.')[-1]}")
    try:
        st = os.stat(library)
        named = f"{triton.__version__}-kforge-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"
    except OSError:   # laid out otherwise: Triton's own key, hashed
        named = cache.triton_key()
    cache.triton_key = lambda: named   # what get_cache_key calls


def _canonical_file_names(root: str) -> None:
    """Make every binary independent of where things lie and when they were written (once per compile server).
    Triton takes every file name it writes into line info from get_jit_fn_file_line: wrapped, each is relative to
    the project or module path entry it lies in, as rules/load/observe.py names inputs (one outside all keeps only
    its name). ptxas writes the mtime of the file a PTX `.file` directive names into .debug_line
    (triton-lang/triton#11091), so each directive gets an explicit timestamp and size; measured with triton 3.6's
    ptxas, `, 0, 0` reads as "unknown" and the file is still looked up, `, 1, 0` is taken as is."""
    import triton.compiler.code_generator as code_generator
    from triton.backends.nvidia.compiler import CUDABackend

    from kforge.load import observe
    global _folders
    path = tuple(sys.path)   # as inputs are named (rules/compile/core.py): the module path at start-up ...
    _folders = observe.bases(root, path)
    file_line = code_generator.get_jit_fn_file_line
    seen = [len(sys.modules)]

    def canonical_file_line(fn):
        global _folders
        if seen[0] != len(sys.modules):   # ... and the packages import finders map, once imported
            seen[0], _folders = len(sys.modules), observe.bases(root, path)
        name, line = file_line(fn)
        name = observe.name_of(name, _folders)
        return (os.path.basename(name) if os.path.isabs(name) else name), line
    code_generator.get_jit_fn_file_line = canonical_file_line

    make_cubin = CUDABackend.make_cubin

    def make_cubin_without_mtimes(self, src, *args):
        return make_cubin(self, _PTX_FILE.sub(r'\g<0>, 1, 0', src), *args)
    CUDABackend.make_cubin = make_cubin_without_mtimes
    _ptxas_in_a_room_of_its_own()


def _ptxas_in_a_room_of_its_own() -> None:
    """ptxas for sm_100a (triton 3.6's, CUDA 12.9) gives one of two cubins of one PTX, by where its memory lands:
    the compile server turns address randomization off (compile/core.py), and what is left is what lies before
    its heap: its file names, its environment. Triton runs it on a temp file in the compile's scratch folder, whose
    path holds the project's, with the server's environment, so four of the example's sm_100a targets came out
    one way in one checkout and the other in another (measured: the same PTX, the same cubin from every folder
    once the names and the environment are fixed). So ptxas runs in a folder of its own, through a link there (the
    length of the path it is started by counts too: the virtualenv's), on kernel.ptx into kernel.o, with TMPDIR=.
    as its whole environment (its temp files stay in that folder, under out/)."""
    import shutil
    import subprocess
    import tempfile
    import types

    import triton.backends.nvidia.compiler as nvidia

    def run(cmd, **kwargs):
        if "-o" not in cmd:   # `ptxas --version`
            return subprocess.run(cmd, **kwargs)
        source, output = next(a for a in cmd if a.endswith(".ptx")), cmd[cmd.index("-o") + 1]
        room = tempfile.mkdtemp(prefix="ptxas-", dir=os.path.dirname(output))
        try:
            shutil.copyfile(source, os.path.join(room, "kernel.ptx"))
            tool = os.path.basename(cmd[0])   # its name goes into the cubin's .note.nv.tkinfo: kept
            # as Triton would start it: TRITON_PTXAS_PATH may be a name on PATH or relative to here
            os.symlink(os.path.abspath(shutil.which(cmd[0]) or cmd[0]), os.path.join(room, tool))
            fixed = ["./" + tool, *("kernel.ptx" if a == source else "kernel.o" if a == output else a
                                    for a in cmd[1:])]
            done = subprocess.run(fixed, cwd=room, env={"TMPDIR": "."}, **kwargs)
            os.replace(os.path.join(room, "kernel.o"), output)
            return done
        finally:
            shutil.rmtree(room, ignore_errors=True)

    shim = types.ModuleType("subprocess")   # Triton's nvidia compiler reaches ptxas through its `subprocess`
    shim.__dict__.update(subprocess.__dict__)
    shim.run = run
    nvidia.subprocess = shim


_PTX_FILE = re.compile(r'^\s*\.file\s+\d+\s+"[^"\n]*"(?=\s*$)', re.MULTILINE)   # no timestamp given


def lower(target, scratch: str):
    """In the compile server: compile the target with Triton into a Lowered (checked and written by the core)."""
    os.environ["TRITON_CACHE_DIR"] = scratch   # private: a compile never reads another's cache
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    arch = ARCHS[target.arch]
    fn = _entry(target)
    names = [a for a, _ in target.signature]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in target.divisible_by_16}
    kinds = dict(target.signature)   # "dtype" and "function" arguments are constexprs of another kind of value
    signature = {a: "constexpr" if t in VALUE_KINDS else t for a, t in target.signature}
    constexprs = {a: triton.language.str_to_ty(v, None) if kinds[a] == "dtype" else
                  _function(v) if kinds[a] == "function" else v for a, v in target.constexprs}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    start = time.monotonic()
    try:
        kernel = triton.compile(src, target=GPUTarget(arch.backend, arch.target_arch, arch.warp_size),
                                options=dict(target.options))
    except triton.CompilationError as e:
        _located(e, fn)
        raise
    seconds = time.monotonic() - start
    binary = kernel.asm[arch.binary_ext]
    named = next((b.folder for b in _folders if len(b.folder) > 1 and b.folder.encode() in binary), None)
    if named is not None:   # a file name _canonical_file_names did not see: never ship it
        raise RuntimeError(f"the binary holds the absolute path {named}; kforge ships no machine's paths "
                           f"(report it with the kernel's source)")
    md = kernel.metadata
    code_key = source_key_of(fn)
    fields = {"num_stages": md.num_stages, "global_scratch_size": getattr(md, "global_scratch_size", 0),
              "global_scratch_align": getattr(md, "global_scratch_align", SCRATCH_ALIGN),
              "profile_scratch_size": getattr(md, "profile_scratch_size", 0),
              "divisible_by_16": list(target.divisible_by_16),
              # Triton's digest of the kernel with what it leaves out (runtime/source_key.py): serving launches
              # this binary only for a function with the same key
              "triton_source_key": code_key,
              # a key holding a memory address, which no other process makes: record lines are not checked against it
              **({} if reproducible(code_key) else {"source_key_unstable": True}),
              # as Triton's JIT names a call's (a spec may name a re-export): serving matches a call by this
              "triton_function": f"{fn.fn.__module__}:{fn.fn.__qualname__}"}
    if any(t.startswith("tensordesc") for _, t in target.signature):
        # how each host descriptor is passed (a TMA map and its box, or base/shape/strides): the loader
        # builds the same kernel parameters as Triton's launcher from it (rules/runtime/tensordesc.py)
        fields["tensordesc_meta"] = [dict(m, block_size=list(m["block_size"])) for m in md.tensordesc_meta or []]
    if arch.vendor == "amd":
        fields["kernel_abi"] = amdgpu_metadata.kernel_abi(binary, md.name)
    return Lowered(binary, f"{md.name}.{arch.binary_ext}", md.name, md.num_warps, md.warp_size, md.shared,
                   seconds, fields)


def _located(error, fn) -> None:
    """Triton's CompilationError says "at 39:8:", a line of the failing @jit function's own source: each such error
    of the chain is made to name the library's file and line (`lmdeploy/.../w8a8.py:123`), found among the entry
    and the @jit functions its module and theirs hold."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.jit import JITCallable
    from kforge.load.shared_env import shown_line
    functions, seen = [fn], {id(fn)}
    for f in functions:   # breadth first, through each module's globals and the modules they hold: only on a failure
        found = list(getattr(f.fn, "__globals__", {}).values())
        for value in [*found, *(v for m in found if isinstance(m, types.ModuleType) for v in vars(m).values())]:
            if isinstance(value, JITCallable) and id(value) not in seen:
                seen.add(id(value))
                functions.append(value)
    while isinstance(error, CompilationError):
        line, column = getattr(error.node, "lineno", None), getattr(error.node, "col_offset", None)
        owner = next((f for f in functions if getattr(f, "src", None) is error.src), None)   # the very text
        said = f"at {line}:{column}:"
        if owner is not None and error.message.startswith(said):
            start = owner.starting_line_number + next(
                (i for i, text in enumerate(owner.raw_src) if text.strip().startswith("def ")), 0)
            where = shown_line(owner.fn.__code__.co_filename, start + line - 1)
            error.message = f"at {where}, column {column} (line {line} of {owner.fn.__name__}):" + \
                error.message[len(said):]
        error = error.__cause__


def _entry(target):
    from kforge.load.entry_probe import entry_object, layers
    module = importlib.import_module(target.module)
    # the @triton.jit function under its wrappers is compiled (the config gives what they would choose at launch),
    # found as the probe found it: Class.kernel, a lazily made one, a factory's by its name
    try:
        held = entry_object(module, target.entry)
    except AttributeError:
        held = None
    wrapped = layers(held)
    fn = _jit(wrapped[-1], f"{target.module}.{target.entry}",
              f"; name the @triton.jit kernel in [kernel] entry ({target.spec_path})")
    _as_imported(target, wrapped)
    return fn


def _as_imported(target, wrapped: list) -> None:
    """What the load read from the entry's source, checked against the import (`wrapped`: entry_probe.layers):
    its parameters' defaults (a name one reads may be rebound at import), the @triton.heuristics around it, and for
    a record line the code it was recorded from (its source key). Where they differ, Triton would launch another
    binary than the one the load asked for: none is built."""
    from triton.language import constexpr
    from triton.runtime.autotuner import Heuristics

    name, fn = f"{target.module}.{target.entry}", wrapped[-1]
    if target.heuristics is not None:
        unseen = [n for layer in wrapped if isinstance(layer, Heuristics) for n in layer.values
                  if n not in target.heuristics]
        if unseen:
            raise ValueError(f"{name} is wrapped by @triton.heuristics computing {', '.join(unseen)} when imported, "
                             f"which the def kforge read in its source does not show, so the load never ran it; "
                             f"put the decorators on that def (or name the def that carries them) and load again")
    key = source_key_of(fn)
    recorded = comparable(target.recorded_code)   # none (an older recorder's, or no key): not checked
    if recorded and tagged(key) not in recorded and reproducible(key):
        raise ValueError(f"{name}: the code found here (kforge's source key {key[:12]}...) is none of the code its "
                         f"record lines were recorded from ({', '.join(k[:15] + '...' for k in recorded[:3])}): "
                         f"another version of the library, a kernel made at run time from other source than its "
                         f"def (generated and exec'd), a global the application set after the import "
                         f"(`config.SCALE = 3.0`), or a value its import reads from the GPU (its SM count, say) "
                         f"that kforge's model of the arch's reference GPU gives otherwise than the recording GPU "
                         f"did (docs/device_model.md); such a binary is never served: record again with the library "
                         f"built here, or drop its lines ({target.spec_path.split(': ', 1)[0]})")
    declared = dict(target.signature)
    for p in fn.params:   # Triton launches an annotated argument as its annotation's type, whatever the value
        if p.is_constexpr and declared.get(p.name, "constexpr") not in (*COMPILE_TIME, NONE):
            raise ValueError(f"{name}: argument {p.name} is declared {declared[p.name]!r} but its def annotates it "
                             f"tl.constexpr, which Triton passes as a compile-time value: a binary built so is never "
                             f"served; declare it \"constexpr\" in [signature] ({target.spec_path})")
        kind = p.annotation_type
        if kind and not kind.startswith("*k") and declared.get(p.name, kind) not in (kind, NONE):
            raise ValueError(f"{name}: argument {p.name} is declared {declared[p.name]!r} but its def annotates it "
                             f"as {kind!r}, which Triton launches it as: a binary built so is never served; "
                             f"declare it {kind!r} in [signature] ({target.spec_path})")
    defaults = {p.name: p.default for p in fn.params}
    values = dict(target.constexprs)
    for arg in target.defaulted:
        theirs = defaults.get(arg, inspect.Parameter.empty)
        if theirs is inspect.Parameter.empty:
            raise ValueError(f"{name}: constexpr {arg}: the source's def gives it a default ({values.get(arg)!r}), "
                             f"but the imported function has none (a kernel the library makes at import from other "
                             f"source); give {arg} in [constants] or [sweep] ({target.spec_path})")
        theirs = theirs.value if isinstance(theirs, constexpr) else theirs
        ours = values.get(arg)
        if type(theirs) is not type(ours) or theirs != ours:
            raise ValueError(f"{name}: constexpr {arg}: the source's default gives {ours!r} but the imported "
                             f"function's default is {theirs!r} (a name it reads is rebound as the library is "
                             f"imported); give {arg} in [constants] or [sweep] ({target.spec_path})")


def _function(ref: str):
    """The @triton.jit function a "function" argument names ("module:name")."""
    module, name = ref.split(":")
    return _jit(getattr(importlib.import_module(module), name, None), ref)


def _jit(fn, name: str, fix: str = ""):
    from triton.runtime.jit import JITFunction
    if not isinstance(fn, JITFunction):
        raise TypeError(f"{name} is not a @triton.jit function (got {type(fn).__name__}){fix}")
    return fn


def source_key(target) -> str:
    """The digest of the entry's code that meta.json's triton_source_key holds and serving matches
    (kforge_runtime/source_key.py)."""
    return source_key_of(_entry(target))


lowering.BACKENDS["triton"] = lowering.Backend(
    lower, warm,
    arch_per_process=False,   # the arch is an argument of each compile: one warm server serves them all
    imports_module=True,
    source_key=source_key)
