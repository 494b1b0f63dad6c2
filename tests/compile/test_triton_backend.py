"""rules/compile/triton_backend.py: what a Triton compile writes into meta.json beyond the binary."""
import json
import textwrap
from pathlib import Path

import pytest

from tests.support import doit, kernel_text, make_project, spec_text, statuses

ON_CLASS = """
import triton
import triton.language as tl

from tk.scale import scale_kernel as kernel   # re-exported under another name


class Kernels:   # a library that keeps its kernels on a class
    @triton.jit
    def add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)
"""


def test_a_kernel_named_where_it_is_re_exported_or_kept_on_a_class_builds_and_names_its_def(tmp_path):
    """Serving matches a call by the function Triton's JIT names (its def's module and qualified name); a spec
    may name the kernel elsewhere. Class.kernel reached the catalog but failed to compile (no such attribute)."""
    specs = {name: spec_text(name=name, module="public").replace('entry = "scale_kernel"', f'entry = "{entry}"')
             for name, entry in (("reexported", "kernel"), ("on_class", "Kernels.add"))}
    root = make_project(tmp_path / "p", specs=specs, kernels={"scale": kernel_text(), "public": ON_CLASS})
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"})
    assert statuses(root, "built") == {"reexported:fp16-b256-w4@sm_90a", "on_class:fp16-b256-w4@sm_90a"}
    for name, function in (("reexported", "tk.scale:scale_kernel"), ("on_class", "tk.public:Kernels.add")):
        meta = json.loads((root / f"out/sm_90a/{name}/fp16-b256-w4/meta.json").read_text())
        assert meta["triton_function"] == function and meta["source"]["module"] == "tk.public"


DEFAULTED_SPEC = '''
[kernel]
name = "{name}"
source = "tk/{module}.py"
entry = "{entry}"
toolchain = "triton"
archs = ["sm_90a"]
id = "w{{num_warps}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"
{extra}
[sweep]
num_warps = [4]
'''

COPY_BODY = """
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
"""

REBOUND_IN_PACKAGE = """
import triton
import triton.language as tl

from tk.consts import BLOCK_DEFAULT


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr = BLOCK_DEFAULT):""" + COPY_BODY

REBOUND_BY_A_FUNCTION = """
import triton
import triton.language as tl

WIDTH = 256


def _retune():   # a library that sets its defaults for the GPU it finds, as it is imported
    global WIDTH
    WIDTH = 128


_retune()


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr = WIDTH):""" + COPY_BODY


def _failure(root, name) -> str:
    report = json.loads((root / "out" / "build-report.json").read_text())
    return next(t.get("error", "") for t in report["tasks"] if t["name"] == name)


def test_a_default_the_source_reads_from_a_name_rebound_at_import_builds_nothing(tmp_path):
    """The load reads `BLOCK: tl.constexpr = BLOCK_DEFAULT` from the source (256); the import rebinds the name
    (the package's __init__ setting it on its module, or a function the module calls) and Triton launches with
    128. It built BLOCK=256 without a word (found by an outside review); the compile now checks the imported
    function's default against the load's value and builds nothing where they differ, and a name the module's own
    code may rebind (`global` in a function) is not read at load at all."""
    kernels = {"consts": "BLOCK_DEFAULT = 256\n", "__init__": "from tk import consts\nconsts.BLOCK_DEFAULT = 128\n",
               "in_package": REBOUND_IN_PACKAGE, "by_function": REBOUND_BY_A_FUNCTION}
    specs = {name: DEFAULTED_SPEC.format(name=name, module=name, entry="copy_kernel", extra="")
             for name in ("in_package", "by_function")}
    specs["given"] = DEFAULTED_SPEC.format(name="given", module="in_package", entry="copy_kernel",
                                           extra="[constants]\nBLOCK = 128\n")
    root = make_project(tmp_path / "p", specs=specs, kernels=kernels)
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert statuses(root, "built") == {"given:w4@sm_90a"}   # a value the spec gives is the spec's
    error = _failure(root, "in_package:w4@sm_90a")
    assert "constexpr BLOCK: the source's default gives 256 but the imported function's default is 128" in error
    # `global WIDTH` in a function its import may call: no value is read from the source, the family says so
    assert "constexpr BLOCK has no value: its default in the source, 'WIDTH', is not one kforge reads" in \
        _failure(root, "by_function")


def test_an_entry_that_is_no_jit_function_and_an_import_error_of_the_librarys_name_the_spec_and_the_line(tmp_path):
    """A plain function named as the entry passes the load (its source's def gives the signature) and failed at
    compile naming no spec; an AttributeError at the kernel module's import (bitsandbytes' `torch.accelerator.
    current_accelerator().type`) was a bare `AttributeError: ...` naming no line (an outside review)."""
    kernels = {"plain": "def copy_kernel(x_ptr, y_ptr, n, BLOCK=128):\n    return x_ptr\n",
               "attr": "import triton\nimport triton.language as tl\nKIND = None\nKIND.type\n\n\n@triton.jit\n"
                       "def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr = 128):" + COPY_BODY}
    specs = {name: DEFAULTED_SPEC.format(name=name, module=name, entry="copy_kernel", extra="")
             for name in ("plain", "attr")}
    root = make_project(tmp_path / "p", specs=specs, kernels=kernels)
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert (
        "TypeError: tk.plain.copy_kernel is not a @triton.jit function (got function); name the @triton.jit kernel "
        "in [kernel] entry (specs/plain.toml)") in _failure(root, "plain:w4@sm_90a")
    said = "AttributeError: 'NoneType' object has no attribute 'type' (in tk/attr.py:4)"
    assert said in _failure(root, "attr:w4@sm_90a")


EVEN_COPY = """
@triton.jit
def {name}(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    i = tl.arange(0, BLOCK)
    if EVEN:
        tl.store(y_ptr + i, tl.load(x_ptr + i))
    else:
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
"""

LAZY_HEURISTICS = """
import triton
import triton.language as tl


def __getattr__(name):   # the kernel is made when first asked for
    if name == "copy_kernel":
{body}
        return triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(_copy)
    raise AttributeError(name)


if False:   # the signature kforge reads
    def copy_kernel(x_ptr, y_ptr, n, BLOCK, EVEN):
        pass
""".replace("{body}", textwrap.indent(EVEN_COPY.format(name="_copy").strip("\n"), " " * 8))

WRAPPED_AT_IMPORT = """
import triton
import triton.language as tl

{body}

def _wrap():   # wrapped by a function the module calls: the def's source shows no heuristic
    global copy_kernel
    copy_kernel = triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(copy_kernel)


_wrap()
""".replace("{body}", EVEN_COPY.format(name="copy_kernel"))


def test_heuristics_of_a_kernel_made_or_wrapped_at_import_are_run_or_refused_never_skipped(tmp_path):
    """A module __getattr__ that makes a heuristics-wrapped kernel, read from a plain placeholder def: the load
    took the spec's EVEN and built it where Triton computes another (found by an outside review on xformers'
    lazily made kernels). Now the load asks the import what the name holds (its heuristics: refused in
    [constants], as for a decorated def); and a compile of a kernel wrapped at import in a way the load did not
    see builds nothing."""
    extra = "EVEN = \"constexpr\"\n[constants]\nBLOCK = 1024\nEVEN = true\n"
    specs = {name: DEFAULTED_SPEC.format(name=name, module=name, entry="copy_kernel", extra=extra)
             for name in ("lazy", "wrapped")}
    root = make_project(tmp_path / "p", specs=specs, kernels={"lazy": LAZY_HEURISTICS, "wrapped": WRAPPED_AT_IMPORT})
    listed = doit(root, "list", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert "EVEN is computed by the entry's @triton.heuristics" in listed.stderr, listed.stderr
    doit(root, "-n", "1", "wrapped", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert not statuses(root, "built")
    assert "tk.wrapped.copy_kernel is wrapped by @triton.heuristics computing EVEN when imported" in \
        _failure(root, "wrapped:w4@sm_90a")


def test_a_default_an_arch_table_overrides_there_is_not_compared_with_the_functions(tmp_path):
    """[arch.gfx942] BLOCK = 64 over the source's default: gfx942's binary takes 64 by the spec's choice, not as
    a default read, and builds; sm_90a reads the default, which the package rebinds at import: refused there
    (731f55a let it through on every arch)."""
    spec = DEFAULTED_SPEC.format(name="per_arch", module="in_package", entry="copy_kernel", extra="").replace(
        'archs = ["sm_90a"]', 'archs = ["sm_90a", "gfx942"]') + "\n[arch.gfx942]\nBLOCK = 64\n"
    kernels = {"consts": "BLOCK_DEFAULT = 256\n", "__init__": "from tk import consts\nconsts.BLOCK_DEFAULT = 128\n",
               "in_package": REBOUND_IN_PACKAGE}
    root = make_project(tmp_path / "p", specs={"per_arch": spec}, kernels=kernels)
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert statuses(root, "built") == {"per_arch:w4@gfx942"}
    assert json.loads((root / "out/gfx942/per_arch/w4/meta.json").read_text())["constexprs"]["BLOCK"] == 64
    assert "the source's default gives 256 but the imported function's default is 128" in \
        _failure(root, "per_arch:w4@sm_90a")


ANNOTATED = """
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n: tl.int64, BLOCK: tl.constexpr = 128):""" + COPY_BODY + """

@triton.jit
def scaled_kernel(x_ptr, y_ptr, n: tl.int64, BLOCK: tl.constexpr = 128, F: tl.constexpr = 2.0):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * F, mask=i < n)
"""


def test_an_argument_declared_other_than_its_def_annotates_it_builds_nothing(tmp_path):
    """`n: tl.int64` makes Triton launch n as i64 whatever the value; built as the spec's i32 it was a binary no call
    is ever served (an outside review). The compile compares the declared types with Triton's reading of the
    annotations and names the one to declare."""
    specs = {"as_i32": DEFAULTED_SPEC.format(name="as_i32", module="annotated", entry="copy_kernel", extra=""),
             "as_i64": DEFAULTED_SPEC.format(name="as_i64", module="annotated", entry="copy_kernel",
                                             extra="").replace('n = "i32"', 'n = "i64"')}
    # flashinfer's `EPS: tl.constexpr` declared "fp32": built as a runtime float, which no launch passes
    specs["eps"] = DEFAULTED_SPEC.format(name="eps", module="annotated", entry="scaled_kernel",
                                         extra='F = "fp32"\n').replace('n = "i32"', 'n = "i64"')
    root = make_project(tmp_path / "p", specs=specs, kernels={"annotated": ANNOTATED})
    doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    assert statuses(root, "built") == {"as_i64:w4@sm_90a"}
    assert "argument n is declared 'i32' but its def annotates it as 'i64'" in _failure(root, "as_i32:w4@sm_90a")
    assert "argument F is declared 'fp32' but its def annotates it tl.constexpr" in _failure(root, "eps:w4@sm_90a")


INNER = """
import triton
import triton.language as tl


@triton.jit
def scaled(x):
    return x * undefined_name
"""

OUTER = """
import triton
import triton.language as tl

from tk import inner


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr = 128):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, inner.scaled(tl.load(x_ptr + i, mask=i < n)), mask=i < n)
"""


def test_a_compile_error_in_a_callee_reached_through_its_module_names_the_callees_file_and_line(tmp_path):
    """Triton says "at 2:15", a line of the failing function's own source: the message names its file's line, for a
    @jit function the kernel calls as `inner.scaled(...)` too."""
    specs = {"outer": DEFAULTED_SPEC.format(name="outer", module="outer", entry="copy_kernel", extra="")}
    root = make_project(tmp_path / "p", specs=specs, kernels={"outer": OUTER, "inner": INNER})
    proc = doit(root, "-n", "1", env={"KFORGE_LOCAL_CACHE": "off"}, check=False)
    kept = next((root / "out").rglob("error.txt")).read_text()
    assert "CompilationError: at tk/inner.py:8, column 15 (line 2 of scaled): ... NameError(" in kept, kept
    assert "at tk/outer.py:11, column 24 (line 3 of copy_kernel)" in proc.stdout, proc.stdout


PTXAS_WITNESS = """#!/bin/sh
# records how a compile ran it (folder, arguments, environment, personality, files), then runs the real ptxas
case "$*" in *" -o "*) {{ pwd; echo "$0 $@"; env | sort | tr '\\n' ' '; echo; cat /proc/self/personality; ls | tr '\\n' ' '; }} >> {log};; esac
exec {ptxas} "$@"
"""


def test_ptxas_runs_on_fixed_names_in_a_folder_of_its_own_with_a_fixed_environment(tmp_path):
    """ptxas for sm_100a gave one of two cubins of one PTX by where its memory landed: with address randomization
    off, by the length of its file names and its environment, both of which held the checkout's path (four of the
    example's sm_100a targets differed between two checkouts)."""
    import sys
    if not sys.platform.startswith("linux"):
        pytest.skip("a Linux personality flag")
    import triton.backends.nvidia as nvidia
    real = Path(nvidia.__file__).parent / "bin" / "ptxas"
    log = tmp_path / "ptxas.log"
    witness = tmp_path / "ptxas"
    witness.write_text(PTXAS_WITNESS.format(log=log, ptxas=real))
    witness.chmod(0o755)
    logs = []
    for where in ("a", "a-checkout-with-a-much-longer-path"):
        root = make_project(tmp_path / where)
        doit(root, "-n", "1", "local_cache=off", env={"TRITON_PTXAS_PATH": str(witness), "KFORGE_KEEP_HUB": "0"})
        logs.append(log.read_text().splitlines())
        log.unlink()
        binary = next((root / "out" / "sm_90a").rglob("*.cubin")).read_bytes()
        if where == "a":
            first = binary
    assert binary == first
    seen = []
    for folder, args, env, personality, listing in (log[:5] for log in logs):
        assert Path(folder).name.startswith("ptxas-") and "out" in Path(folder).parts
        # PWD is the witness's own shell's
        seen.append((args, [v for v in env.split() if not v.startswith("PWD=")], personality, listing))
    args, env, personality, listing = seen[0]
    assert args.split()[0] == "./ptxas" and args.split()[-3:] == ["kernel.ptx", "-o", "kernel.o"]
    assert env == ["TMPDIR=."]
    assert int(personality, 16) & 0x0040000 and listing.split() == ["kernel.ptx", "ptxas"]
    assert seen[1] == seen[0]


def test_ptxas_named_on_path_or_relative_to_the_project_is_started_as_triton_would(tmp_path):
    """TRITON_PTXAS_PATH as Triton takes it: a name found on PATH, or a path relative to where the build runs
    (the link in ptxas's own folder pointed at that name there, and the compile failed)."""
    import os
    import triton.backends.nvidia as nvidia
    real = Path(nvidia.__file__).parent / "bin" / "ptxas"
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "ptxas").symlink_to(real)
    binaries = []
    for where, named, env in (("default", None, {}),
                              ("on-path", "ptxas", {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}),
                              ("relative", "tools/ptxas", {})):
        root = make_project(tmp_path / where)
        if where == "relative":
            (root / "tools").symlink_to(tools)
        if named:
            env["TRITON_PTXAS_PATH"] = named
        doit(root, "-n", "1", "local_cache=off", env={**env, "KFORGE_KEEP_HUB": "0"})
        binaries.append(next((root / "out" / "sm_90a").rglob("*.cubin")).read_bytes())
    assert binaries[1] == binaries[0] and binaries[2] == binaries[0]
