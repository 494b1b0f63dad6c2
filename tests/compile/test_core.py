"""compile_core: compile_into handing back a (fake) backend's binary as a candidate artifact, compiled with
another project's out/ for its scratch files, through a real compile server; a library imported at most once
in any compile server (one that registers torch operators at import, one whose import fails). checked()'s refusals are in
tests/compile/test_action.py; CompileResult is tested in tests/store/test_artifact.py."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import types
from pathlib import Path

import pytest

from kforge.store import artifact
from kforge.compile import core as compile_core, lowering
from kforge.base import stamps
from kforge.store.artifact import CompileResult
from kforge.base.layout import Layout
from kforge.plan.catalog import load_specs
from kforge.plan.targets import build_targets
from tests.support import doit, fresh_servers, kernel_text, make_project, spec_text, statuses, write_files

# --- the backend table ------------------------------------------------------------------------------------------

def test_each_toolchain_imports_its_own_backend_alone_and_no_compiler():
    """backend_of imports a toolchain's backend module, which registers itself in lowering's table: in a fresh
    process, Triton's adds Triton's alone (a Triton build never imports FlyDSL's), and neither imports its
    compiler (warm() does, in the process that compiles)."""
    code = ("import sys\n"
            "from kforge.compile import core as compile_core, lowering\nfrom kforge.declare import spec\n"
            "for toolchain in spec.TOOLCHAINS:\n"
            "    before = set(lowering.BACKENDS)\n"
            "    assert isinstance(compile_core.backend_of(toolchain), lowering.Backend)\n"
            "    print(toolchain, sorted(set(lowering.BACKENDS) - before),\n"
            "          sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'flydsl', 'torch')\n"
            "                 or m.endswith('_backend') and m.startswith('kforge.')))\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines == ["triton ['triton'] ['kforge.compile.triton_backend']",
                     "flydsl ['flydsl'] ['kforge.compile.flydsl_backend', 'kforge.compile.triton_backend']"]


# --- compile_into ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(project, its one sm_90a target, that target's real binary), compiled once by doit."""
    root = make_project(tmp_path_factory.mktemp("compiled"))
    doit(root, "-n", "1")
    [target] = build_targets(load_specs(root), root, None)
    binary = (Path(target.out_dir) / "scale_kernel.cubin").read_bytes()
    return root, target, binary


@pytest.fixture
def fake_backend(monkeypatch, compiled):
    """A backend whose lower() hands back the real binary and records, in meta.json's toolchain fields, the
    target and scratch directory it was given and the process it ran in."""
    _, _, binary = compiled
    fake = types.SimpleNamespace(error=None)   # what the test sets: the error lower() raises

    def lower(target, scratch):
        if fake.error:
            raise RuntimeError(fake.error)
        return lowering.Lowered(binary, "scale_kernel.cubin", "scale_kernel", 4, 32, 0, 0.123456,
                                fields={"seen_out": str(target.layout.out), "seen_out_dir": target.out_dir,
                                        "seen_scratch": scratch, "seen_scratch_existed": os.path.isdir(scratch),
                                        "seen_tempdir": tempfile.gettempdir(),
                                        "seen_TMPDIR": os.environ.get("TMPDIR"),
                                        "child_personality": subprocess.run(
                                            ["cat", "/proc/self/personality"], capture_output=True,
                                            text=True).stdout.strip(),
                                        "lowered_in": os.getpid()})
    monkeypatch.setitem(lowering.BACKENDS, "fake",
                        lowering.Backend(lower, lambda root: None, arch_per_process=False))
    with fresh_servers(monkeypatch):
        yield fake


def into(compiled, private_root):
    root, target, _ = compiled
    return compile_core.compile_into(target._replace(toolchain="fake"), private_root, str(root), 60)


def listing(directory: Path) -> dict[str, list | None]:
    return {str(p.relative_to(directory)): stamps.identity(str(p)) for p in sorted(directory.rglob("*"))}


def meta_of(outcome) -> dict:
    return json.loads(outcome.result.files[artifact.META])


def test_compile_into_hands_back_the_artifact_as_a_candidate_and_writes_none(compiled, fake_backend, tmp_path):
    root, target, binary = compiled
    private = tmp_path / "worker"
    outcome = into(compiled, private)
    assert outcome.ok, outcome.error
    assert outcome.result.result._replace(spans=()) == CompileResult(compile_seconds=0.1235,
                                                                     sha256=artifact.sha256(binary))
    # for the build trace: a fresh compile server's set-up comes with its first target (a library server's, a
    # context server's fork)
    phases = [phase for phase, _, _ in outcome.result.result.spans]
    assert phases[0] == "start" and set(phases[:-2]) == {"start"} and phases[-2:] == ["compile", "check"], phases
    again = into(compiled, tmp_path / "again")
    assert [phase for phase, _, _ in again.result.result.spans] == ["compile", "check"]
    assert sorted(outcome.result.files) == ["meta.json", "scale_kernel.cubin"]
    meta, _, on_disk, _ = artifact.accept(target, outcome.result.files)   # what the installer checks
    assert on_disk == binary
    assert meta["key"] == target.key and meta["target"] == target.name and meta["sha256"] == outcome.result.result.sha256
    directory = Path(Layout(private).artifact_path(target.arch, target.kernel, target.config_id))
    assert directory == private / "out" / "sm_90a" / "scale" / target.config_id and not directory.exists()
    # the backend was handed the private paths, and lowered in the forked compile server
    assert (meta["seen_out"], meta["seen_out_dir"]) == (str(private / "out"), str(directory))
    assert meta["lowered_in"] != os.getpid()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux personality flag")
def test_what_the_compile_server_runs_starts_with_a_fixed_address_layout(compiled, fake_backend, tmp_path):
    """ptxas for sm_100a gave two different cubins for one PTX under address randomization: the compile server
    turns it off for the programs it starts (as `setarch -R` would), and this process keeps its own."""
    outcome = into(compiled, tmp_path / "worker")
    assert outcome.ok, outcome.error
    assert int(meta_of(outcome)["child_personality"], 16) & compile_core.ADDR_NO_RANDOMIZE
    assert not int(Path("/proc/self/personality").read_text(), 16) & compile_core.ADDR_NO_RANDOMIZE


def test_compile_into_leaves_the_projects_own_out_untouched(compiled, fake_backend, tmp_path):
    root, target, _ = compiled
    before = listing(root / "out")
    assert into(compiled, tmp_path / "worker").ok
    assert listing(root / "out") == before


def test_compile_into_gives_the_backend_a_fresh_scratch_directory_and_removes_it_after(compiled, fake_backend,
                                                                                       tmp_path):
    private = tmp_path / "worker"
    meta = meta_of(into(compiled, private))
    scratch = Path(meta["seen_scratch"])
    assert meta["seen_scratch_existed"] and scratch.is_relative_to(private / "out")
    assert not scratch.exists()


def test_compile_into_puts_the_scratch_directory_in_the_private_projects_kforge_state(compiled, fake_backend,
                                                                                      tmp_path):
    private = tmp_path / "worker"
    meta = meta_of(into(compiled, private))
    assert Path(meta["seen_scratch"]).parent == Layout(private).scratch
    assert not (private / "out" / "out").exists()


def test_a_backend_error_in_compile_into_fails_and_writes_no_artifact(compiled, fake_backend, tmp_path):
    fake_backend.error = "LLVM ERROR: out of registers"
    private = tmp_path / "worker"
    outcome = into(compiled, private)
    assert not outcome.ok and "out of registers" in outcome.error and outcome.result is None
    _, target, _ = compiled
    assert not Path(Layout(private).artifact_path(target.arch, target.kernel, target.config_id)).exists()


def test_the_compilers_temp_files_go_to_the_compiles_scratch_folder(compiled, fake_backend, tmp_path):
    """Triton and ptxas write temp files (.ptx, .o, .log) where tempfile and TMPDIR say: the compile's own
    scratch folder under out/.kforge/tmp, removed with it, never the system's temp directory."""
    private = tmp_path / "worker"
    meta = meta_of(into(compiled, private))
    assert meta["seen_tempdir"] == meta["seen_TMPDIR"] == meta["seen_scratch"]
    assert list(Layout(private).scratch.iterdir()) == []


# --- a library is imported at most once in any compile server (import_context) ---------------------------

REGOPS_KERNEL = '''
import triton
import triton.language as tl

import regops


@triton.jit
def {entry}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * {factor}, mask=i < n)
'''

REGOPS_FILES = {
    # the common pattern: the package defines its torch operators when imported
    "regops/__init__.py": '''
        import os

        import torch

        if os.environ.get("REGOPS_BROKEN_FLAG") and os.path.exists(os.environ["REGOPS_BROKEN_FLAG"]):
            raise ImportError("regops: its native backend cannot load (a missing dependency)")
        LIB = torch.library.Library("kforge_regops", "FRAGMENT")
        LIB.define("twice(Tensor x) -> Tensor")
        ''',
    "regops/one.py": REGOPS_KERNEL.format(entry="one_kernel", factor=2),
    "regops/two.py": REGOPS_KERNEL.format(entry="two_kernel", factor=3),
}

REGOPS_SPEC = '''
[kernel]
name = "{name}"
module = "regops.{module}"
entry = "{module}_kernel"
toolchain = "triton"
archs = ["sm_90a", "gfx942"]
id = "b{{BLOCK}}"

[signature]
x_ptr = "*fp32"
y_ptr = "*fp32"
n = "i32"
BLOCK = "constexpr"

[sweep]
BLOCK = [128, 256]
num_warps = [4]
'''


def regops_project(tmp_path: Path) -> tuple[Path, dict]:
    site = write_files(tmp_path / "site", REGOPS_FILES)
    root = make_project(tmp_path / "p", specs={f"reg_{m}": REGOPS_SPEC.format(name=f"reg_{m}", module=m)
                                               for m in ("one", "two")}, kernels={})
    return root, {"PYTHONPATH": str(site)}


def test_a_failed_import_fails_its_targets_then_a_library_that_registers_torch_operators_builds_in_one_worker(
        tmp_path):
    """While `regops`'s import fails, every target of its context fails and none builds against it. With the cause
    gone, one worker builds both modules for both archs (the failed targets too: nothing is replayed, the failure's
    inputs include the flag's absence): its package server imported `regops` (which registers torch operators)
    once and forked a server per module. Each target's record holds the package and its own module, never its
    sibling (what a fresh process importing that module would read): an edit of one module rebuilds only its
    targets. One project for both: each build imports torch."""
    root, env = regops_project(tmp_path)
    flag = tmp_path / "broken"
    flag.write_text("")
    proc = doit(root, "-n", "1", "reg_one", "archs=sm_90a", env={**env, "REGOPS_BROKEN_FLAG": str(flag)},
                check=False)
    assert proc.returncode != 0
    assert len(statuses(root, "failed")) == 2 and not statuses(root, "built"), proc.stdout[-3000:]
    flag.unlink()   # the cause is gone
    doit(root, "-n", "1", "reg_one", "reg_two", env={**env, "REGOPS_BROKEN_FLAG": str(flag)})   # one worker
    assert len(statuses(root, "built")) == 8   # 2 modules x 2 archs x 2 configs, the 2 that failed among them
    for meta in (root / "out").glob("*/reg_*/*/meta.json"):
        read = dict(json.loads(meta.read_text())["inputs"])
        module = meta.parent.parent.name.removeprefix("reg_")
        sibling = {"one": "two", "two": "one"}[module]
        assert "regops/__init__.py" in read and f"regops/{module}.py" in read and f"regops/{sibling}.py" not in read
    two = tmp_path / "site" / "regops" / "two.py"
    two.write_text(two.read_text().replace("* 3", "* 5"))
    doit(root, "-n", "1", "reg_one", "reg_two", env={**env, "REGOPS_BROKEN_FLAG": str(flag)})
    assert {t.split(":")[0] for t in statuses(root, "built")} == {"reg_two"}
    assert len(statuses(root, "built")) == 4 and len(statuses(root, "up-to-date")) == 4


# --- a library's packages are imported once per worker, each on top of the one above ---------------------------

def counted(package: str, breaks: str = "") -> str:
    """An __init__ that adds its package's name to the file TWOPKG_COUNT names, each time it is imported (and
    then fails to import while the variable `breaks` is set)."""
    return f'''
        import os

        with open(os.environ["TWOPKG_COUNT"], "a") as f:
            f.write("{package}\\n")
        if {breaks!r} and os.environ.get({breaks!r}):
            raise ImportError("{package}: its native backend cannot load (a missing dependency)")
        '''


TWOPKG_KERNEL = REGOPS_KERNEL.replace("import regops", "import twopkg")
TWOPKG_FILES = {
    "twopkg/__init__.py": counted("twopkg"),
    "twopkg/ops/__init__.py": counted("twopkg.ops"),   # the shared part (fla.ops: every op, most of fla)
    "twopkg/ops/a/__init__.py": counted("twopkg.ops.a"),
    "twopkg/ops/a/k.py": TWOPKG_KERNEL.format(entry="k_kernel", factor=2),
    "twopkg/ops/b/__init__.py": counted("twopkg.ops.b", breaks="TWOPKG_B_BROKEN"),
    "twopkg/ops/b/k.py": TWOPKG_KERNEL.format(entry="k_kernel", factor=3),
}


def test_a_librarys_packages_are_imported_once_per_worker_each_on_top_of_the_one_above(tmp_path):
    """fla's families lie in fla.ops.utils and fla.ops.common, whose shared part, fla.ops, was imported once per
    package (4.4 s each). One worker builds the families of twopkg.ops.a and twopkg.ops.b: twopkg and twopkg.ops
    are imported once, each package below once on top of them; each target's record still holds its own package
    and module, never its sibling's. When twopkg.ops.b's import fails, every target of it fails with the same
    error, from one import of twopkg.ops.b (its server, kept, answers the rest with that error: flag_gems's import
    refused on a CPU took 2.5 s a target when each imported again) and twopkg.ops.a's build; with the cause
    gone, b builds."""
    site = write_files(tmp_path / "site", TWOPKG_FILES)
    spec = REGOPS_SPEC.replace('["sm_90a", "gfx942"]', '["sm_90a"]')
    root = make_project(tmp_path / "p", specs={f"two_{m}": spec.replace('"regops.{module}"', f'"twopkg.ops.{m}.k"')
                                               .replace('"{module}_kernel"', '"k_kernel"').format(name=f"two_{m}")
                                               for m in ("a", "b")}, kernels={})
    count = tmp_path / "imports.log"
    env = {"PYTHONPATH": str(site), "TWOPKG_COUNT": str(count), "TWOPKG_B_BROKEN": "1"}
    proc = doit(root, "-n", "1", env=env, check=False)
    assert statuses(root, "built") == {"two_a:b128@sm_90a", "two_a:b256@sm_90a"}, proc.stdout[-3000:]
    assert statuses(root, "failed") == {"two_b:b128@sm_90a", "two_b:b256@sm_90a"}
    errors = {line for p in (root / "out").glob("sm_90a/two_b/*/error.txt") for line in p.read_text().splitlines()
              if line.startswith("  error: ")}
    assert errors == {"  error: ImportError: twopkg.ops.b: its native backend cannot load (a missing dependency)"}
    assert sorted(count.read_text().split()) == ["twopkg", "twopkg.ops", "twopkg.ops.a", "twopkg.ops.b"]
    for meta in (root / "out").glob("sm_90a/two_a/*/meta.json"):
        read = dict(json.loads(meta.read_text())["inputs"])
        assert {"twopkg/__init__.py", "twopkg/ops/__init__.py", "twopkg/ops/a/__init__.py",
                "twopkg/ops/a/k.py"} <= set(read), sorted(read)
        assert not any(name.startswith("twopkg/ops/b/") for name in read), sorted(read)
    count.unlink()
    doit(root, "-n", "1", env={**env, "TWOPKG_B_BROKEN": ""})
    assert statuses(root, "built") == {"two_b:b128@sm_90a", "two_b:b256@sm_90a"}
    assert sorted(count.read_text().split()) == ["twopkg", "twopkg.ops", "twopkg.ops.b"]


def test_workers_share_one_import_of_each_package_per_build(tmp_path):
    """On a 16-CPU GPU host, each of 16 workers importing torch, Triton and the library took 20-28 s before its
    first compile. The build's hub imports each package once for every worker: with two workers building both
    packages' families, twopkg, twopkg.ops, twopkg.ops.a and twopkg.ops.b are each imported once, and every target
    builds with its own package's files in its record."""
    site = write_files(tmp_path / "site", TWOPKG_FILES)
    spec = REGOPS_SPEC.replace('["sm_90a", "gfx942"]', '["sm_90a"]').replace("BLOCK = [128, 256]",
                                                                            "BLOCK = [128, 256, 512, 1024]")
    root = make_project(tmp_path / "p", specs={f"two_{m}": spec.replace('"regops.{module}"', f'"twopkg.ops.{m}.k"')
                                               .replace('"{module}_kernel"', '"k_kernel"').format(name=f"two_{m}")
                                               for m in ("a", "b")}, kernels={})
    count = tmp_path / "imports.log"
    proc = doit(root, "-n", "2", env={"PYTHONPATH": str(site), "TWOPKG_COUNT": str(count)})
    built = statuses(root, "built")
    assert len(built) == 8 and statuses(root, "failed") == set(), proc.stdout[-3000:]
    workers = {e["tid"] for e in json.loads((root / "out" / "build-trace.json").read_text())["traceEvents"]
               if e.get("cat") == "compile"}
    assert len(workers) == 2   # both workers compiled
    assert sorted(count.read_text().split()) == ["twopkg", "twopkg.ops", "twopkg.ops.a", "twopkg.ops.b"]
    for meta in (root / "out").glob("sm_90a/two_b/*/meta.json"):
        read = dict(json.loads(meta.read_text())["inputs"])
        assert "twopkg/ops/b/k.py" in read and not any(n.startswith("twopkg/ops/a/") for n in read), sorted(read)


def test_only_failures_the_same_inputs_give_again_are_kept():
    """A truncated binary (a full disk), a tool killed by a signal (the OOM killer), a write that failed: the
    machine's, not the kernel's; a compiler's error on these inputs is the kernel's (kept and replayed)."""
    def raised_while_handling(cause):
        try:
            try:
                raise cause
            except subprocess.CalledProcessError:
                raise RuntimeError("PTXAS error: `ptxas` failed with error code")
        except RuntimeError as e:
            return e
    assert compile_core.transient(raised_while_handling(subprocess.CalledProcessError(-9, "ptxas")))
    assert compile_core.transient(OSError(28, "No space left on device"))
    assert not compile_core.transient(raised_while_handling(subprocess.CalledProcessError(255, "ptxas")))
    assert not compile_core.transient(RuntimeError("BLOCK too large for this kernel"))


def test_a_tool_killed_behind_a_shell_or_out_of_time_is_not_the_kernels_failure():
    """A shell wrapper reports its child killed by signal N as exit status 128+N (SIGKILL 137, TERM 143, INT 130,
    HUP 129); a tool that ran out of time raises TimeoutExpired: neither is kept and replayed."""
    for status in (137, 143, 130, 129):
        try:
            try:
                raise subprocess.CalledProcessError(status, "ptxas-wrapper.sh")
            except subprocess.CalledProcessError:
                raise RuntimeError("PTXAS error: `ptxas` failed with error code")
        except RuntimeError as e:
            assert compile_core.transient(e), status
    assert compile_core.transient(subprocess.TimeoutExpired("ptxas", 30))
    for status in (1, 2, 128, 255):   # the tool's own verdict
        assert not compile_core.transient(subprocess.CalledProcessError(status, "ptxas")), status


EXITS_IN_COMPILE = '''
import triton
import triton.language as tl


@triton.constexpr_function
def half(x):
    {exits}


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * half(BLOCK) + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
'''


EXITS = {"exits": ("raise SystemExit(3)", "called sys.exit(3)"),
         "interrupts": ("raise KeyboardInterrupt", "raised KeyboardInterrupt")}


def test_code_that_exits_while_a_kernel_compiles_is_said_as_the_compiles_not_the_imports(tmp_path):
    """An exit raised by code the compile runs (a @triton.constexpr_function; sys.exit and KeyboardInterrupt, a
    family each, one build) is the compile's failure, after the import: its line names the compile and the file,
    with no advice about the module's import."""
    root = make_project(tmp_path / "p", specs={name: spec_text(name=name, module=name) for name in EXITS},
                        kernels={name: EXITS_IN_COMPILE.format(exits=exits) for name, (exits, _) in EXITS.items()})
    proc = doit(root, "-n", "1", check=False)
    assert proc.returncode != 0 and statuses(root, "failed") == {f"{name}:fp16-b256-w4@sm_90a" for name in EXITS}
    for name, (_, what) in EXITS.items():
        error = next(line for line in proc.stdout.splitlines() if f"{name}:fp16-b256-w4@sm_90a failed with:" in line)
        assert f"{what} at tk/{name}.py:8" in error and "while compiling" in error, error
        assert "import" not in error.split("failed with:")[1], error


def test_a_worker_names_tritons_private_cache_by_its_version_and_libtritons_identity_without_hashing_it(tmp_path):
    """Triton's own cache key hashes libtriton (415 MB, 0.3 s per doit worker): a compile's Triton cache is its
    own scratch folder, so the name need not be that digest; the toolchain is in the target's key."""
    script = f"""
import os, triton
from triton.runtime import cache
from kforge.compile import triton_backend
triton_backend.warm({str(tmp_path)!r})
library = os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so")
st = os.stat(library)
assert cache.triton_key() == f"{{triton.__version__}}-kforge-{{st.st_ino}}-{{st.st_size}}-{{st.st_mtime_ns}}", cache.triton_key()
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


# --- what a compile read: named and hashed once per server while nothing it depends on changes ---------------

def test_a_servers_targets_share_what_their_reads_were_named_and_hashed_to_until_a_file_or_a_read_changes(
        tmp_path, monkeypatch):
    """The targets of one compile server read the same files (its imports, the compiler's own): _inputs names and
    hashes them once, and again as soon as a file's content or the set of files read changes, so that each
    target's record stays what it would be computed afresh."""
    root, recorder, hashed = inputs_of(tmp_path, monkeypatch)
    monkeypatch.setattr(compile_core, "RACY_S", 0.0)   # these files were written just now
    a, b = root / "tk" / "a.py", root / "tk" / "b.py"
    recorder.seen = {str(a)}
    first = compile_core._inputs(recorder)
    assert first == [["tk/a.py", hashlib.sha256(b"A = 1\n").hexdigest()]]
    assert compile_core._inputs(recorder) == first and len(hashed) == 1   # the next target: nothing hashed again
    scratch = root / "out" / ".kforge" / "tmp" / "sm_90a-k" / "k.ptx"   # each compile's own scratch files
    recorder.seen.add(str(scratch))
    recorder.written.add(str(scratch))
    assert compile_core._inputs(recorder) == first and len(hashed) == 1
    # a file that is no input: a server's own /proc/self/statm after its first call (every context server forked
    # after it hashed every input again: 1 s each with transformers on a GPU host)
    recorder.seen.add("/proc/self/statm")
    assert compile_core._inputs(recorder) == first and len(hashed) == 1
    a.write_text("A = 30\n")   # an input changed (here, after its import read it: its record says its content)
    assert compile_core._inputs(recorder) == [["tk/a.py", hashlib.sha256(b"A = 30\n").hexdigest()]]
    recorder.seen.add(str(b))   # a compile read one more file
    assert [name for name, _ in compile_core._inputs(recorder)] == ["tk/a.py", "tk/b.py"]
    b.unlink()   # an input gone is no input, as computed afresh
    assert [name for name, _ in compile_core._inputs(recorder)] == ["tk/a.py"]
    assert len(hashed) == 4


def test_a_package_the_projects_dodo_imported_is_imported_afresh_and_what_it_read_is_an_input(tmp_path):
    """doit's master runs dodo.py, which may import the project's kernel package, before it forks the build's hub:
    the compile servers imported it again, as a process of their own would (a Dask worker's), so that its
    __init__ and the data file it reads are in the record; the file edited, the target is built again. The
    servers had inherited the master's import, recorded none of it, and left the binary stale."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text()},
                        kernels={"scale": kernel_text(factor="FACTOR", imports="from tk import FACTOR")})
    write_files(root, {"tk/__init__.py": """
        from pathlib import Path

        import triton.language as tl

        FACTOR = tl.constexpr(int((Path(__file__).parent / "factor.txt").read_text()))
        """, "tk/factor.txt": "2\n"})
    (root / "dodo.py").write_text((root / "dodo.py").read_text() + "\nimport tk  # noqa: E402,F401\n")
    doit(root, "-n", "1")
    meta = root / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "meta.json"
    assert {"tk/__init__.py", "tk/factor.txt", "tk/scale.py"} <= set(dict(json.loads(meta.read_text())["inputs"]))
    binary = (meta.parent / "scale_kernel.cubin").read_bytes()
    (root / "tk" / "factor.txt").write_text("3\n")
    doit(root, "-n", "1")
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}
    assert (meta.parent / "scale_kernel.cubin").read_bytes() != binary

def test_what_a_compile_read_is_hashed_again_while_one_of_its_files_changed_too_recently_to_trust_its_stat(
        tmp_path, monkeypatch):
    """A file changed within one tick of the file system's clock may change again with the same size and times:
    its stat cannot tell, so nothing is kept while a file changed less than RACY_S ago."""
    root, recorder, hashed = inputs_of(tmp_path, monkeypatch)
    a = root / "tk" / "a.py"
    recorder.seen = {str(a)}
    compile_core._inputs(recorder)
    a.write_text("A = 2\n")   # the same size, and the same times where the clock's tick is coarse
    assert compile_core._inputs(recorder) == [["tk/a.py", hashlib.sha256(b"A = 2\n").hexdigest()]]
    assert len(hashed) == 2


def inputs_of(tmp_path, monkeypatch):
    """A project with two modules, a recorder reading in it (not installed) and the list of what was hashed."""
    from kforge.load import observe
    root = make_project(tmp_path / "p", specs={}, kernels={"a": "A = 1\n", "b": "B = 2\n"})
    monkeypatch.setattr(compile_core, "_named_from", [str(root), tuple(sys.path)])
    monkeypatch.setattr(compile_core, "_memo", compile_core._InputsMemo())
    hashed = []
    digests = observe.digests
    monkeypatch.setattr(observe, "digests", lambda files, *args: hashed.append(set(files)) or digests(files, *args))
    return root, observe.Recorder(str(root)), hashed


def test_a_server_leaves_what_it_hashed_for_the_index_only_for_files_settled_before_it_looked(tmp_path, monkeypatch):
    """The first no-op after a build stats what the compile servers hashed instead of hashing it again
    (rules/store/inputs.py, learn): each file by its resolved path and stat identity, unless it changed within
    RACY_S of being looked at (its stat might not move on a change in the same clock tick)."""
    root, recorder, _ = inputs_of(tmp_path, monkeypatch)
    monkeypatch.setattr(compile_core, "_hashed", {})
    a = root / "tk" / "a.py"
    recorder.seen = {str(a)}
    compile_core._inputs(recorder)   # a.py was written just now: not settled
    assert compile_core._hashed == {}
    monkeypatch.setattr(compile_core, "_memo", compile_core._InputsMemo())
    import time
    old = time.time_ns() - 10 ** 10
    os.utime(a, ns=(old, old))   # its ctime is now, though: still not settled
    compile_core._inputs(recorder)
    assert compile_core._hashed == {}
    monkeypatch.setattr(compile_core, "RACY_S", 0.0)
    monkeypatch.setattr(compile_core, "_memo", compile_core._InputsMemo())
    compile_core._inputs(recorder)
    st = os.stat(a)
    assert compile_core._hashed == {os.path.realpath(a): [[st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size],
                                                          hashlib.sha256(b"A = 1\n").hexdigest()]}
    compile_core._learn(types.SimpleNamespace(layout=Layout(root)))
    assert compile_core._hashed == {} and len(list((root / "out" / ".kforge" / "hashed").iterdir())) == 1


# --- early cutoff: an input changed that cannot change a target's code compiles nothing -----------------------

ALLOPS_KERNEL = '''
import triton
import triton.language as tl

from allops import SCALE


@triton.jit
def {entry}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * {factor} * SCALE, mask=i < n)
'''

ALLOPS_FILES = {
    # a library whose __init__ imports every op, and reads a setting at import into a constexpr global: a file
    # the kernels' sources never name, which changes their code
    "allops/__init__.py": '''
        import json
        import os

        import triton.language as tl

        SCALE = tl.constexpr(json.load(open(os.path.join(os.path.dirname(__file__), "scale.json")))["scale"])

        from . import one, two  # noqa: E402,F401
        ''',
    "allops/scale.json": '{"scale": 2}\n',
    "allops/one.py": ALLOPS_KERNEL.format(entry="one_kernel", factor=2),
    "allops/two.py": ALLOPS_KERNEL.format(entry="two_kernel", factor=3),
}


def allops_project(tmp_path: Path) -> tuple[Path, dict]:
    site = write_files(tmp_path / "site", ALLOPS_FILES)
    spec = REGOPS_SPEC.replace('"regops.', '"allops.').replace('["sm_90a", "gfx942"]', '["sm_90a"]')
    root = make_project(tmp_path / "p", specs={f"all_{m}": spec.format(name=f"all_{m}", module=m)
                                               for m in ("one", "two")}, kernels={})
    return root, {"PYTHONPATH": str(site), "KFORGE_LOCAL_CACHE": "off"}


def origins(root: Path) -> dict[str, str]:
    return {t["name"]: t.get("origin", t["status"])
            for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"]}


def binaries(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in (root / "out").rglob("*.cubin")}


def test_an_edit_that_cannot_change_a_kernels_code_compiles_nothing_one_through_what_its_import_read_is_never_cut_off(
        tmp_path):
    """First a comment at the end of one.py: one's targets' key changed (their source's digest is in it),
    nothing else in it did, and Triton's digest of one_kernel is the same; two's targets only read it. Every
    target ends `unchanged` (early cutoff), binaries untouched. Then two.py's kernel edited: every target read
    it (the package's __init__ imports every op), but only two's own can change; one's stay `unchanged`, their
    meta.json's inputs renewed: byte for byte what a build from nothing writes. The next run is a no-op.
    Last, scale.json, no source of any kernel: the import reads it into a constexpr global both kernels use.
    Triton's source digest holds the constexpr's value, so every target compiles, and the code differs."""
    root, env = allops_project(tmp_path)
    doit(root, "-n", "1", env=env)
    before = binaries(root)
    one = tmp_path / "site" / "allops" / "one.py"
    one.write_text(one.read_text() + "# a comment\n")
    out = doit(root, "-n", "1", env=env).stdout
    assert set(origins(root).values()) == {"unchanged"}, out
    assert binaries(root) == before
    two = tmp_path / "site" / "allops" / "two.py"
    two.write_text(two.read_text().replace("* 3", "* 5"))
    out = doit(root, "-n", "1", env=env).stdout
    assert origins(root) == {"all_one:b128@sm_90a": "unchanged", "all_one:b256@sm_90a": "unchanged",
                             "all_two:b128@sm_90a": "compiled", "all_two:b256@sm_90a": "compiled"}, out
    assert "built 4 (2 unchanged: early cutoff, not compiled)" in out
    after = binaries(root)
    assert {p for p in after if after[p] != before[p]} == {p for p in after if "all_two" in p}
    meta = json.loads((root / "out/sm_90a/all_one/b128/meta.json").read_text())
    assert dict(meta["inputs"])["allops/two.py"] == hashlib.sha256(two.read_bytes()).hexdigest()
    doit(root, "-n", "1", env=env)
    assert set(origins(root).values()) == {"up-to-date"}
    metas = {p: p.read_bytes() for p in (root / "out").rglob("meta.json")}
    shutil.rmtree(root / "out")
    doit(root, "-n", "1", env=env)
    assert set(origins(root).values()) == {"compiled"}
    assert {p: p.read_bytes() for p in (root / "out").rglob("meta.json")} == metas

    before = binaries(root)
    (tmp_path / "site" / "allops" / "scale.json").write_text('{"scale": 4}\n')
    doit(root, "-n", "1", env=env)
    assert set(origins(root).values()) == {"compiled"}
    after = binaries(root)
    assert len(after) == 4 and all(after[p] != before[p] for p in after)


HIDDEN_FILES = {
    # values that reach the code where Triton's own key does not look: a helper's default given by a name, and a
    # module's constant read as an attribute, both read at import from a file no kernel source names
    "hid/__init__.py": "",
    "hid/scale.json": '{"scale": 2}\n',
    "hid/cfg.py": '''
        import json
        import os

        import triton.language as tl

        _read = json.load(open(os.path.join(os.path.dirname(__file__), "scale.json")))["scale"]
        SCALE = tl.constexpr(_read)
        PLAIN = _read
        ''',
    "hid/k.py": '''
        import triton
        import triton.language as tl

        from hid import cfg

        FACTOR = cfg.PLAIN


        @triton.jit
        def _times(x, F: tl.constexpr = FACTOR):
            return x * F


        @triton.jit
        def by_default_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, _times(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


        @triton.jit
        def by_attribute_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * cfg.SCALE, mask=i < n)
        ''',
}


def test_a_value_triton_leaves_out_of_its_key_is_never_cut_off(tmp_path):
    """scale.json reaches both kernels' code through what Triton's key does not hold (a helper's default by name,
    `cfg.SCALE`): early cutoff, comparing that key, kept the old binaries as `unchanged` (an outside review);
    kforge's key holds those values, so both compile and their code differs."""
    site = write_files(tmp_path / "site", HIDDEN_FILES)
    spec = REGOPS_SPEC.replace('module = "regops.{module}"', 'module = "hid.k"').replace(
        '["sm_90a", "gfx942"]', '["sm_90a"]')
    root = make_project(tmp_path / "p", specs={f"h_{m}": spec.format(name=f"h_{m}", module=m)
                                               for m in ("by_default", "by_attribute")}, kernels={})
    env = {"PYTHONPATH": str(site), "KFORGE_LOCAL_CACHE": "off"}
    doit(root, "-n", "1", env=env)
    before = binaries(root)
    (tmp_path / "site" / "hid" / "scale.json").write_text('{"scale": 4}\n')
    doit(root, "-n", "1", env=env)
    assert set(origins(root).values()) == {"compiled"}, origins(root)
    after = binaries(root)
    assert len(after) == 4 and all(after[p] != before[p] for p in after)


def test_the_hubs_precompile_child_stops_at_a_whole_file_once_told_the_library_is_imported(tmp_path):
    """The child that compiles a library's sources while the hub imports it (_precompile_once) would take a CPU
    from the compiles after the import: told to stop (_stop_precompiling), it ends at once, leaving whole files
    only."""
    site = tmp_path / "site"
    (site / "big").mkdir(parents=True)
    (site / "big" / "__init__.py").write_text("")
    # far more to compile than the child can before it is told to stop; in few files: creating each costs this
    # process more CPU than compiling it costs the child
    body = "".join(f"def f{i}(x):\n    return [x + {i} for _ in range(3)]\n" for i in range(1200))
    for i in range(500):
        (site / "big" / f"m{i:04}.py").write_text(body)
    store = tmp_path / "user-cache" / "kforge" / "bytecode"
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(site)!r})
        from kforge.compile import core
        core._precompile_once("big")
        deadline = time.monotonic() + 60
        while not any(f for _, _, f in os.walk({str(store)!r})) and time.monotonic() < deadline:
            time.sleep(0.01)   # on its way: some files kept
        core._stop_precompiling("big")
        told = time.monotonic()
        os.waitpid(core._precompiling["big"], 0)
        print(time.monotonic() - told)
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user-cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    kept = [p for p in store.rglob("*") if p.is_file()]
    assert float(proc.stdout.split()[-1]) < 2 and 0 < len(kept) < 500   # stopped on its way
    assert not [p for p in kept if p.name.endswith(".tmp")]


@pytest.mark.parametrize("init, imports", [
    ("import os\nimport torch\n", True),
    ("from torch import nn\n", True),
    ("try:\n    import torch.library\nexcept ImportError:\n    torch = None\n", True),
    ("def later():\n    import torch\n", False),
    ("if False:\n    import torch\n", False),
    ("from .torch import x\n", False),
    ("import torchvision\n", False),
])
def test_a_library_whose_init_imports_torch_gets_torch_in_the_hub_though_its_metadata_names_it_only_in_extras(
        tmp_path, monkeypatch, init, imports):
    """flag_gems names torch only under its extras, and its __init__ imports it: each library server imported torch
    itself, after the hub, so a kept hub (rules/load/kept_hub.py) never held it for such a library."""
    import importlib
    from kforge.compile import core
    from tests.support import write_site_package
    name = f"kforge_torchy_{abs(hash(init)) % 10**8}"
    site = write_site_package(tmp_path / "site", name, {f"{name}/__init__.py": init},
                              requires=("torch==2.9; extra == 'gpu'",))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    core._requires_torch.cache_clear()
    try:
        assert core._requires_torch(name) is imports
        assert name not in sys.modules   # read, not imported
    finally:
        core._requires_torch.cache_clear()


def test_a_dask_workers_builds_each_get_a_hub_and_one_with_a_compile_in_flight_is_never_closed(monkeypatch):
    """A Dask worker keeps its servers across builds: each build's come from a hub of its own (_hub_of), those
    of the least recent idle builds beyond MAX_BUILDS are closed with their private servers, and never a build's
    whose compile runs (a concurrent build on the same cluster)."""
    from kforge.load import isolate
    closed = []

    class Hub:
        def __init__(self, handle):
            self.handle = handle

        def close(self):
            closed.append(self)

    private = types.SimpleNamespace(close=lambda: closed.append("b's private server"))
    monkeypatch.setattr(isolate, "Hub", Hub)
    monkeypatch.setattr(compile_core, "_builds", {})
    monkeypatch.setattr(compile_core, "_compiling", {})
    monkeypatch.setattr(compile_core, "_private", {(1, "b"): {("library", ("tk",)): private}})
    monkeypatch.setattr(compile_core, "MAX_BUILDS", 2)
    with compile_core._hub_of("a") as a:
        with compile_core._hub_of("b") as b, compile_core._hub_of("c") as c:
            assert len({id(a), id(b), id(c)}) == 3 and a.handle is compile_core._route and not closed
        with compile_core._hub_of("a") as again:   # b and c idle, a compiling: b, the least recent, goes
            assert again is a and closed == ["b's private server", b] and not compile_core._private
        with compile_core._hub_of("d") as d:
            assert closed[2:] == [c] and d not in (a, b, c)
    assert list(compile_core._builds) == ["a", "d"] and not compile_core._compiling
    with compile_core._hub_of(None) as local:   # outside a worker: this process's hub, as before
        assert local is compile_core._hub and list(compile_core._builds) == ["a", "d"]


def test_only_the_projects_own_sources_are_forgotten_not_a_virtualenv_inside_it(tmp_path, monkeypatch):
    """The compile servers import the project's modules doit's process had imported again; a virtualenv inside the
    project (the checkout's .venv: doit, dask, yaml...) was under its root too, and its modules ran a second time."""
    (tmp_path / "tk").mkdir()
    (tmp_path / "tk" / "__init__.py").write_text("")
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "vendored_lib_for_test.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("tk", "vendored_lib_for_test"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import tk  # noqa: F401
    import vendored_lib_for_test  # noqa: F401
    recorder = types.SimpleNamespace(root=str(tmp_path.resolve()), skip=(), skip_files=set())
    compile_core._forget_project_modules(recorder)
    assert "tk" not in sys.modules and "vendored_lib_for_test" in sys.modules


def test_one_threads_private_server_never_closes_anothers(monkeypatch):
    """The private servers were one list for every thread, MAX_PRIVATE long: a fourth thread taking one closed the
    least recent, another thread's, while it compiled (its call then failed with a TypeError)."""
    closed = []

    class Attached:
        def __init__(self, sock):
            self.connect = None

        def call(self, request, timeout, log_dir=None):   # every thread compiling at once
            everyone.wait(timeout=30)
            return compile_core.isolate.Outcome(False, 0.0, error="no compile server")

        def close(self):
            closed.append(self)

    monkeypatch.setattr(compile_core.isolate, "Attached", Attached)
    monkeypatch.setattr(compile_core, "_private", {})
    monkeypatch.setattr(compile_core, "backend_of", lambda toolchain: None)
    monkeypatch.setattr(compile_core, "_library", lambda target, backend: "library")
    monkeypatch.setattr(compile_core.guard, "scratch_folder", lambda layout, name: "/nonexistent-kforge-scratch")
    target = types.SimpleNamespace(toolchain="triton", module="tk.scale", layout=None, arch="sm_90a", kernel="k")
    threads = [threading.Thread(target=compile_core.compile_here, args=(target, "/", 1.0))
               for _ in range(compile_core.MAX_PRIVATE + 2)]
    everyone = threading.Barrier(len(threads))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert closed == [] and len(compile_core._private) == len(threads)
