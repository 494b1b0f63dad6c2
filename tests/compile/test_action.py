"""doit runs on throw-away projects: incremental matrix, crash isolation, interruption, commands, report."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.store import artifact
from kforge.base.layout import Layout
from kforge.load import isolate
from tests.support import (REPO, build_report, built_once, copy_built, default_sigint, doit, finish_or_explain,
                           fresh_servers, kernel_text, make_project, process_tree, spec_text, statuses,
                           wait_until)

TWO = ("scale:fp16-b128-w4@sm_90a", "scale:fp16-b256-w4@sm_90a")


def _build_two(root: Path) -> Path:
    make_project(root, specs={"scale": spec_text(blocks=(128, 256))})
    doit(root, "-n", "2")
    assert statuses(root, "built") == set(TWO)
    return root


@pytest.fixture
def cold_project(tmp_path):
    """The two targets built here, from nothing: for the tests whose point is a second run in the same place."""
    return _build_two(tmp_path / "p")


@pytest.fixture
def project(tmp_path_factory, tmp_path):
    """A copy of the two targets' project built once for the whole run (copying is far cheaper than compiling);
    a copy at another path is up to date, test_restored_out_on_another_checkout_rebuilds_nothing holds that."""
    return copy_built(built_once(tmp_path_factory, "two-targets", _build_two), tmp_path / "p")


def test_second_run_builds_nothing_and_an_in_place_edit_keeping_size_and_mtime_is_noticed(cold_project):
    """The saved catalog and the source caches go by file identity: only the ctime tells an in-place edit apart (in
    the project where it was built: in a copy every file's identity differs anyway). The spec's edit, then the
    kernel source's, each on the project as the run before left it."""
    project = cold_project
    doit(project)
    assert statuses(project, "up-to-date") == set(TWO)
    spec = project / "specs" / "scale.toml"
    edited_in_place(spec, "[128, 256]", "[128, 512]")
    doit(project)
    assert statuses(project, "built") == {"scale:fp16-b512-w4@sm_90a"}
    edited_in_place(project / "tk" / "scale.py", "* 2)", "* 3)")
    doit(project)
    assert statuses(project, "built") == {"scale:fp16-b128-w4@sm_90a", "scale:fp16-b512-w4@sm_90a"}   # every target


def edited_in_place(path: Path, old: str, new: str) -> None:
    """old replaced by new (of its length) in the file's own inode, its size and mtime kept: only the ctime moves."""
    st = path.stat()
    time.sleep(0.01)
    with open(path, "r+") as f:
        text = f.read()
        assert old in text and len(old) == len(new)
        f.seek(0)
        f.write(text.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_touch_rebuilds_nothing(project):
    for f in (project / "tk" / "scale.py", project / "specs" / "scale.toml"):
        os.utime(f)
    doit(project)
    assert statuses(project, "built") == set()


def test_config_edit_rebuilds_only_that_config(project):
    spec = project / "specs" / "scale.toml"
    spec.write_text(spec.read_text().replace("BLOCK = [128, 256]", "BLOCK = [128, 512]"))
    doit(project)
    assert statuses(project, "built") == {"scale:fp16-b512-w4@sm_90a"}
    assert statuses(project, "up-to-date") == {TWO[0]}


def test_source_edit_rebuilds_its_targets(project):
    (project / "tk" / "scale.py").write_text(kernel_text(factor="3"))
    doit(project)
    assert statuses(project, "built") == set(TWO)


def test_restored_out_on_another_checkout_rebuilds_nothing(project, tmp_path):
    other = tmp_path / "other-checkout"
    shutil.copytree(project, other)   # fresh mtimes on everything, as a CI cache restore gives
    (other / "out" / ".doit.sqlite3").unlink()   # even without doit's own DB
    now = time.time() + 100
    for f in other.rglob("*"):
        os.utime(f, (now, now))
    doit(other)
    assert statuses(other, "up-to-date") == set(TWO)


def torch_site() -> Path:
    """The folder this interpreter's torch is installed in, found without importing torch (1.4 s of CPU here)."""
    return Path(importlib.util.find_spec("torch").origin).resolve().parents[1]


def test_an_in_tree_virtualenv_is_never_walked_by_a_compile(tmp_path):
    """README's set-up puts .venv inside the checkout. One worker builds a FlyDSL target (it imports torch, here
    from <project>/.venv) and then Triton targets: Triton's compile must not look into torch's modules (their
    module-level __getattr__ raised 'Torch not compiled with CUDA enabled' for every Triton target)."""
    from tests.compile.test_flydsl_backend import fly_kernel, fly_spec
    root = make_project(tmp_path / "p", specs={"copy": fly_spec(), "scale": spec_text(archs=("sm_90a", "gfx942"))},
                        kernels={"copy": fly_kernel(), "scale": kernel_text()})
    venv = root / ".venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.parent.mkdir(parents=True)
    site.symlink_to(torch_site())   # this interpreter's packages, seen in-tree
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    wanted = ("copy:fp16-v8@gfx942", "scale:fp16-b256-w4@sm_90a", "scale:fp16-b256-w4@gfx942")
    proc = doit(root, "-n", "1", *wanted, env={"PYTHONPATH": str(site)}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert statuses(root, "built") == set(wanted)
    meta = json.loads((root / "out/sm_90a/scale/fp16-b256-w4/meta.json").read_text())
    assert list(meta["source"]["digests"]) == ["tk/__init__.py", "tk/scale.py"]   # nothing of the venv


def test_checkouts_at_other_paths_with_their_own_in_tree_virtualenvs_build_identical_binaries(tmp_path):
    """Line info names the kernel's files and Triton's library functions it inlines (tl.sigmoid lives in
    triton/language/standard.py): neither may carry the checkout's or the virtualenv's absolute path."""
    kernel = kernel_text().replace("tl.load(x_ptr + i, mask=m) * 2", "tl.sigmoid(tl.load(x_ptr + i, mask=m).to(tl.float32))")
    assert "tl.sigmoid" in kernel
    built = []
    for name in ("a", "somewhere-else-entirely"):
        root = make_project(tmp_path / name, kernels={"scale": kernel})
        site = root / ".venv" / "lib" / "python3.11" / "site-packages"
        site.parent.mkdir(parents=True)
        site.symlink_to(torch_site())   # this interpreter's packages, seen in-tree
        (root / ".venv" / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
        doit(root, "-n", "1", env={"PYTHONPATH": str(site)})
        binary = next((root / "out/sm_90a/scale/fp16-b256-w4").glob("*.cubin")).read_bytes()
        assert str(tmp_path).encode() not in binary and b"triton/language" in binary
        built.append(binary)
    assert built[0] == built[1]


def test_forget_and_clean(project):
    doit(project, "forget", TWO[0])
    doit(project)
    assert statuses(project, "built") == {TWO[0]}
    doit(project, "clean", TWO[1])
    assert not (project / "out" / "sm_90a" / "scale" / "fp16-b256-w4").exists()
    doit(project)
    assert statuses(project, "built") == {TWO[1]}


def test_list_info_and_family_selection(project):
    assert "scale" in doit(project, "list").stdout
    listing = doit(project, "list", "--all").stdout
    assert all(t in listing for t in TWO)
    assert "state: up to date" in doit(project, "info", TWO[0]).stdout
    doit(project, "forget", "--all")
    doit(project, "scale")
    assert statuses(project, "built") == set(TWO)


def test_arch_selection_from_command_line(tmp_path):
    root = make_project(tmp_path, specs={"scale": spec_text(archs=("sm_90a", "gfx942", "gfx950"))})
    doit(root, "archs=gfx942,sm_90a")
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a", "scale:fp16-b256-w4@gfx942"}
    bad = doit(root, "archs=sm_91", check=False)
    assert bad.returncode != 0 and "unknown arch sm_91" in bad.stderr and "gfx942" in bad.stderr


def test_bad_spec_is_one_clear_line_for_every_command_and_fails_the_build(tmp_path):
    root = make_project(tmp_path, specs={"scale": spec_text().replace('"fp16"', '"fp17"')})
    for args, code in (((), 1), (("list",), 0)):
        proc = doit(root, *args, check=False)
        assert proc.returncode == code
        assert "kforge: family scale did not load: specs/scale.toml: [sweep] dtype: got 'fp17'" in proc.stderr
        assert "Traceback" not in proc.stderr


# A compile error: the same key and inputs give it again. The module counts the compile servers that import it.
ASSERTING = (REPO / "kernels" / "static_assert.py").read_text()


def test_a_deterministic_compile_failure_is_replayed_saying_how_to_retry_it_until_forgotten(tmp_path):
    """Reported again from its record, not compiled (no compile server imports the kernel), in a line that says how
    to compile it again (`doit forget`) and offers no retry, which would only replay it; forgotten, it compiles."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(256, 512))}, kernels={"scale": ASSERTING})
    imports = tmp_path / "imports.txt"
    env = {"COUNT_IMPORTS_IN": str(imports)}
    bad, good = "scale:fp16-b512-w4@sm_90a", "scale:fp16-b256-w4@sm_90a"
    first = doit(root, env=env, check=False)
    assert first.returncode != 0 and statuses(root, "failed") == {bad} and statuses(root, "built") == {good}
    error = root / "out" / "sm_90a" / "scale" / "fp16-b512-w4" / "error.txt"
    assert error.read_text().splitlines()[1].startswith("inputs: [[")   # what the failing compile read
    # a plain retry would replay it: the hint forgets it first (an outside review: `retry alone` replayed)
    assert (f"  retry one alone: doit forget {bad} && doit {bad} (a plain retry replays it: it fails so from these "
            f"inputs)") in first.stdout.splitlines()
    compiled = imports.read_text()

    again = doit(root, env=env, check=False)
    assert again.returncode != 0 and statuses(root, "failed") == {bad} and statuses(root, "up-to-date") == {good}
    assert imports.read_text() == compiled   # no compile server imported the kernel: nothing was compiled
    assert f"kforge: {bad} failed with: " in again.stdout and "BLOCK too large for this kernel" in again.stdout
    assert (f"  replayed, not compiled: it failed so before from the same key and inputs; `doit forget {bad}` "
            "compiles it again") in again.stdout.splitlines()
    assert "retry" not in again.stdout
    record = next(t for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"] if t["name"] == bad)
    assert "not compiled again: it failed so from this key and these inputs" in record["error"]
    assert "retry alone" not in record["error"]
    assert "reported again without compiling" in doit(root, "info", bad, env=env).stdout

    doit(root, "forget", bad, env=env)
    assert not error.exists()
    retried = doit(root, env=env, check=False)
    assert retried.returncode != 0 and imports.read_text() != compiled   # compiled again, and failed again
    assert "not compiled again" not in retried.stdout


# A compile that ends its process as LLVM does on some errors (mamba-ssm's NVIDIA-only inline asm for gfx942: the
# error printed, then exit(1)), in the compile of BLOCK 512 alone. `{die}` says how; `{at_import}` may end it sooner.
DYING = '''
import os
import signal

import triton
import triton.language as tl

if os.environ.get("COUNT_IMPORTS_IN"):
    with open(os.environ["COUNT_IMPORTS_IN"], "a") as f:
        f.write("imported\\n")


def die(said):
    os.write(2, b"loc(callsite(...)): warning: something first\\n" + said + b"\\n")
    {die}


class Lowering:   # a class: the only callable a constexpr_function may name that Triton's hash does not follow
    def __init__(self, block):
        if block > 256:
            die(b"error: couldn't allocate output register for constraint 'f'")


@triton.constexpr_function
def fitting(block):
    Lowering(block)
    return block


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * fitting(BLOCK) + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)
{at_import}
'''
EXITS = "os._exit(1)"


@pytest.mark.parametrize("die, at_import, says", [
    (EXITS, "", "a compiler error for this kernel on sm_90a: if it cannot target sm_90a, an [[exclude]] with "
                'arch = "sm_90a" in specs/scale.toml leaves it out'),
    ("os.write(2, b'LLVM ERROR: out of memory'); os._exit(1)", "", "the next run compiles it again"),
    *[(f"os.write(2, b'error: cannot write /tmp/x.o: {said}'); os._exit(1)", "", "the next run compiles it again")
      for said in ("Disk quota exceeded", "Read-only file system", "Permission denied", "Operation not permitted",
                   "Input/output error", "Too many open files in system")],
    ("os.kill(os.getpid(), signal.SIGKILL)", "", "compiler process killed (out of memory?): SIGKILL"),
    (EXITS, "die(b'error: no GPU')", "a module that calls sys.exit or os._exit at import is a likely cause"),
], ids=["exit", "out-of-memory", "disk-quota", "read-only", "permission", "not-permitted", "io-error",
      "open-files", "killed", "at-import"])
def test_a_compile_that_exits_its_process_printing_an_error_is_said_in_its_words_and_replayed_but_no_other_death(
        tmp_path, die, at_import, says):
    """An exit of its own with an error printed, once the compile began, is the compiler's verdict on the kernel
    for the arch: one line naming the error, and what to do (not the hint for a module exiting at import), kept
    and replayed from its record. One that names the machine's state (memory or disk running out, a quota, a
    read-only or failing disk, a permission), a SIGKILL (the OOM killer's), or an exit before the compile
    (importing) is said so and compiled again by the next run."""
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(256, 512))},
                        kernels={"scale": DYING.format(die=die, at_import=at_import)})
    imports = tmp_path / "imports.txt"
    env = {"COUNT_IMPORTS_IN": str(imports)}
    bad = "scale:fp16-b512-w4@sm_90a"
    first = doit(root, env=env, check=False)
    failed = {bad, "scale:fp16-b256-w4@sm_90a"} if at_import else {bad}
    assert first.returncode != 0 and statuses(root, "failed") == failed, first.stdout[-3000:]
    message = (root / "out" / "sm_90a" / "scale" / "fp16-b512-w4" / "error.txt").read_text()
    assert says in message
    compiled = imports.read_text()
    again = doit(root, env=env, check=False)
    assert again.returncode != 0 and statuses(root, "failed") == failed
    if (die, at_import) != (EXITS, ""):
        assert not message.splitlines()[1].startswith("inputs: ")   # nothing to replay it from
        assert imports.read_text() != compiled and "not compiled again" not in again.stdout   # compiled again
        return
    cause = ("the compiler exited with code 1 while compiling for sm_90a: error: couldn't allocate output register "
             "for constraint 'f'")
    assert f"kforge: {bad} failed with: {cause}" in first.stdout
    assert message.splitlines()[1].startswith("inputs: [[")   # what the compile had read when it died
    assert "sys.exit" not in message
    assert imports.read_text() == compiled   # replayed: no compile server imported the kernel again
    assert f"kforge: {bad} failed with: {cause}" in again.stdout
    assert "replayed, not compiled: it failed so before from the same key and inputs" in again.stdout


def test_a_tool_killed_by_a_signal_is_no_failure_of_the_kernel_and_is_not_replayed(tmp_path):
    """ptxas killed by SIGKILL (what the OOM killer does) says nothing of the kernel's inputs: the failure is
    reported, not kept, and once the cause is gone the next run compiles the target instead of replaying it."""
    from kforge.plan import keys
    real = keys.ptxas_path(90)
    flag = tmp_path / "out-of-memory"
    flag.write_text("")
    ptxas = tmp_path / "bin" / "ptxas"   # the same path (and version) in both runs: the key does not change
    ptxas.parent.mkdir()
    ptxas.write_text(f'#!/bin/sh\nif [ -e "{flag}" ] && [ "$1" != "--version" ]; then kill -9 $$; fi\n'
                     f'exec "{real}" "$@"\n')
    ptxas.chmod(0o755)
    root = make_project(tmp_path / "p", specs={"scale": spec_text()})
    env = {"TRITON_PTXAS_PATH": str(ptxas)}
    first = doit(root, env=env, check=False)
    assert first.returncode != 0 and statuses(root, "failed") == {"scale:fp16-b256-w4@sm_90a"}, first.stdout[-2000:]
    assert "error code -9" in first.stdout
    error = root / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "error.txt"
    assert "inputs: " not in error.read_text()   # nothing to replay it from
    flag.unlink()
    again = doit(root, env=env)
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"} and "not compiled again" not in again.stdout


CRASHING = {
    "abort": "import os\nos.abort()\n",
    "segv": "import ctypes\nctypes.string_at(0)\n",
    "llvm": "import sys, os\nsys.stderr.write('LLVM ERROR: out of registers\\n')\nsys.stderr.flush()\nos._exit(134)\n",
}


def test_compiler_crash_fails_only_that_target(tmp_path):
    specs = {"scale": spec_text(blocks=(128, 256, 512))}
    kernels = {"scale": kernel_text()}
    for name, crash in CRASHING.items():
        specs[name] = spec_text(name=name, module=name)
        kernels[name] = crash + kernel_text()
    root = make_project(tmp_path, specs=specs, kernels=kernels)
    proc = doit(root, "-n", "2", check=False, timeout=300)
    assert proc.returncode != 0
    report = build_report(root)
    assert statuses(root, "built") == {f"scale:fp16-b{b}-w4@sm_90a" for b in (128, 256, 512)}
    assert statuses(root, "failed") == {f"{n}:fp16-b256-w4@sm_90a" for n in CRASHING}
    errors = {t["name"]: t["error"] for t in json.loads((root / "out" / "build-report.json").read_text())["tasks"]
              if t["status"] == "failed"}
    assert "crashed: SIGABRT" in errors["abort:fp16-b256-w4@sm_90a"]
    assert "crashed: SIGSEGV" in errors["segv:fp16-b256-w4@sm_90a"]
    assert "LLVM ERROR: out of registers" in errors["llvm:fp16-b256-w4@sm_90a"]
    assert "config: {'dtype': 'fp16', 'BLOCK': 256, 'num_warps': 4}" in errors["segv:fp16-b256-w4@sm_90a"]
    assert "kforge: abort:fp16-b256-w4@sm_90a failed with: compiler process crashed: SIGABRT" in proc.stdout
    assert ("llvm:fp16-b256-w4@sm_90a failed with: compiler process exited with code 134 and no result ... "
            "LLVM ERROR: out of registers") in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("kforge: built 3, up to date 0, failed 3, wall ")
    assert len(report) == 6
    assert (root / "out" / "sm_90a" / "abort" / "fp16-b256-w4" / "error.txt").exists()


def test_hanging_compile_times_out(tmp_path):
    """12 s: far below the hang, and above what the plain kernel's compile takes on a loaded 2-core machine (3 s
    was not: it timed out too at a load of 7)."""
    kernels = {"scale": kernel_text(), "hang": "import time\ntime.sleep(300)\n" + kernel_text()}
    root = make_project(tmp_path, specs={"scale": spec_text(), "hang": spec_text(name="hang", module="hang")},
                        kernels=kernels)
    proc = doit(root, "timeout=12", check=False, timeout=240)
    assert proc.returncode != 0
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}
    assert "timed out after 12 s" in proc.stdout


SLOW_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)


# A compile server imports a kernel module once, then looks its entry up once per compile: hiding the entry
# behind a module __getattr__ makes every compile slow, not only the first in each server.
SLOW_ENTRY = '''
import time
_scale_kernel = scale_kernel
del scale_kernel

def __getattr__(name):
    if name == "scale_kernel":
        time.sleep(0.7)
        return _scale_kernel
    raise AttributeError(name)
'''


def start_slow_build(tmp_path, finished: int):
    """`doit -n 2` of eight 0.7 s compiles, returned once `finished` of them are built: (process, root, metas)."""
    slow = kernel_text() + SLOW_ENTRY
    root = make_project(tmp_path, specs={"scale": spec_text(blocks=SLOW_BLOCKS)}, kernels={"scale": slow})
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2"], cwd=root, env=env, preexec_fn=default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metas = root / "out" / "sm_90a" / "scale"
    wait_until(lambda: len(list(metas.glob("*/meta.json"))) >= finished, timeout_s=120)
    return proc, root, metas


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_build_keeps_finished_targets(tmp_path, sig):
    proc, root, metas = start_slow_build(tmp_path, finished=3)
    blocks = SLOW_BLOCKS
    proc.send_signal(sig)
    output = finish_or_explain(proc, timeout=60)
    assert proc.returncode == -signal.SIGINT, output   # Python's status for an unhandled KeyboardInterrupt
    assert "kforge: interrupted. Every task finished so far is kept" in output and "Traceback" not in output
    finished = {p.parent.name for p in metas.glob("*/meta.json")}
    assert 3 <= len(finished) < len(blocks)
    assert list((root / "out" / ".kforge" / "tmp").iterdir()) == []   # the compiles in flight left no scratch
    for d in metas.iterdir():   # whatever counts as built is whole and valid
        if (d / "meta.json").exists():
            artifact.load(d)
    doit(root, "-n", "2")
    built = {n.split(":")[1].split("@")[0] for n in statuses(root, "built")}
    assert built == {f"fp16-b{b}-w4" for b in blocks} - finished


def test_a_killed_worker_stops_the_build_with_a_message_and_keeps_what_finished(tmp_path):
    """A doit worker killed from outside (an OOM kill of the worker, not of its compiler): doit's own runner
    waits forever; kforge's stops, names the tasks in flight, saves the report and keeps what finished."""
    proc, root, metas = start_slow_build(tmp_path, finished=2)
    blocks = SLOW_BLOCKS
    master_cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()   # forked workers share it; a helper would not
    workers = [c for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
               if Path(f"/proc/{c}/cmdline").read_bytes() == master_cmdline
               and Path(f"/proc/{c}/comm").read_bytes().strip() != isolate.HUB_NAME]   # the build's hub is one too
    os.kill(int(workers[0]), signal.SIGKILL)
    output = finish_or_explain(proc, timeout=60)
    assert proc.returncode == 2, output
    assert f"a doit worker process died (pid {workers[0]}, exit code -9)" in output
    finished = {p.parent.name for p in metas.glob("*/meta.json")}
    assert 2 <= len(finished) < len(blocks)
    reported = statuses(root, "built")   # the report was written; it lists the results doit took in
    assert reported and reported <= {f"scale:{f}@sm_90a" for f in finished}
    doit(root, "-n", "2")
    built = {n.split(":")[1].split("@")[0] for n in statuses(root, "built")}
    assert built == {f"fp16-b{b}-w4" for b in blocks} - finished


def test_a_hub_killed_from_outside_mid_build_loses_no_target(tmp_path):
    """The build's hub holds every library import, so it is the largest process an OOM killer may pick. Killed
    mid-build, every server below it goes too; each worker asks again (its own hub, then) and every target builds.
    A server of the hub kept the hub's end of the askers' socket: requests were queued and never read, and the
    targets in flight failed."""
    proc, root, metas = start_slow_build(tmp_path, finished=2)
    [hub] = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
             if Path(f"/proc/{c}/comm").read_bytes().strip() == isolate.HUB_NAME]
    os.kill(hub, signal.SIGKILL)
    output = finish_or_explain(proc, timeout=120)
    assert proc.returncode == 0, output
    assert statuses(root, "built") == {f"scale:fp16-b{b}-w4@sm_90a" for b in SLOW_BLOCKS}
    assert statuses(root, "failed") == set()


def test_a_sigkilled_build_leaves_no_worker_or_compile_server_behind(tmp_path):
    """A CI runner cancelling a job SIGKILLs the doit master: its workers and their compile servers go too."""
    proc, _, _ = start_slow_build(tmp_path, finished=2)
    tree = [pid for pid, _ in process_tree(proc.pid)]
    assert len(tree) >= 3, tree   # the master, its workers, at least one compile server
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    def alive():
        return [pid for pid in tree[1:] if Path(f"/proc/{pid}").exists()
                and (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]
    wait_until(lambda: not alive(), timeout_s=15)
    survivors = alive()
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"still running after the master was killed: {survivors}"


def test_compile_here_imports_the_compiler_in_the_hub_and_lowers_in_a_server(monkeypatch, tmp_path):
    import types
    from kforge.compile import core as compile_core, lowering
    fake = types.SimpleNamespace(warmed_in=None)

    def lower(target, scratch):   # reports where it ran through its error: the server's answer
        raise RuntimeError(f"warmed_in={fake.warmed_in} lowered_in={os.getpid()}")
    monkeypatch.setitem(lowering.BACKENDS, "fake", lowering.Backend(
        lower, lambda root: setattr(fake, "warmed_in", os.getpid()), arch_per_process=False))
    target = types.SimpleNamespace(toolchain="fake", arch="sm_90a", kernel="k", layout=Layout(tmp_path),
                                   out_dir=str(tmp_path / "out" / "sm_90a" / "k" / "c"), env=(), module="m",
                                   source=str(tmp_path / "m.py"), constexprs=(), signature=(), device_model=False,
                                   setup=())
    with fresh_servers(monkeypatch):
        outcome = compile_core.compile_here(target, str(tmp_path), timeout=60)
        hub = compile_core._hub.pid
    warmed_in, lowered_in = (int(part.split("=")[1]) for part in outcome.error.split(": ", 1)[1].split())
    assert lowered_in not in (os.getpid(), hub)   # always in a forked compile server
    assert warmed_in == hub   # the build's hub imported it and every server inherited it


def test_a_lowered_binary_that_is_no_code_for_the_arch_is_refused_once_by_the_installer(built, tmp_path,
                                                                                        monkeypatch):
    """A backend only lowers and the core makes the candidate of it; the installer checks its binary, once, as it
    checks a cache entry's: a gfx942 binary lowered for sm_90a fails the target with the compile's one line, and
    nothing of it is written."""
    import dataclasses
    from kforge.compile import action, core as compile_core, lowering
    from kforge.plan.catalog import load_specs
    from kforge.load import isolate
    from kforge.plan.targets import build_targets
    targets = {t.name: t for t in build_targets(load_specs(built), built, None)}
    amd = targets["scale:fp16-b256-w4@gfx942"]
    nvidia = targets["scale:fp16-b256-w4@sm_90a"]._replace(layout=Layout(tmp_path))   # out/ of its own
    amd_binary = next(Path(amd.out_dir).glob("*.hsaco")).read_bytes()
    lowered = lowering.Lowered(amd_binary, "scale_kernel.cubin", "scale_kernel", 4, 32, 0, 0.1)
    candidate = compile_core.checked(nvidia, lowered)   # the compile server's answer
    monkeypatch.setattr(action, "compile_here", lambda *args: isolate.Outcome(True, 0.1, candidate))
    failed = action.compile_target(nvidia, str(built))
    assert "\n  error: bad binary from triton: the binary is for gfx942, expected sm_90a\n" in failed.message
    assert sorted(p.name for p in Path(nvidia.out_dir).iterdir()) == ["error.txt"]
    for bad_name in ("../x.cubin", "/tmp/x.cubin", ".hidden"):
        with pytest.raises(RuntimeError, match="named the binary"):
            compile_core.checked(nvidia, dataclasses.replace(lowered, binary_name=bad_name))


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_corrupt_or_missing_binary_beside_its_meta_is_rebuilt(project, damage):
    """meta.json intact, its binary changed or gone: not up to date (the next build rebuilds it), and never
    packaged (a stale key index must not hide it)."""
    doit(project)   # the key index now remembers both files
    binary = next((project / "out/sm_90a/scale/fp16-b256-w4").glob("*.cubin"))
    if damage == "flip":
        data = bytearray(binary.read_bytes())
        data[-1] ^= 0xFF
        binary.write_bytes(bytes(data))
    else:
        binary.unlink()
    proc = doit(project)
    assert statuses(project, "built") == {TWO[1]} and statuses(project, "up-to-date") == {TWO[0]}
    assert "failed 0" in proc.stdout
    assert artifact.load(project / "out/sm_90a/scale/fp16-b256-w4")   # whole again


def test_a_package_task_that_finds_a_bad_binary_fails_naming_it_and_counts_as_failed(project, capsys):
    """A binary that changed after its compile task ran (between the up-to-date check and packaging), while a
    wheel is written: the package task fails naming the target and the fix, and the summary counts it as failed.
    (A wheel that already holds this manifest is used as it is: it holds the binaries as they were checked.)"""
    import io
    from types import SimpleNamespace
    from kforge.ship import package
    from kforge.report import reporter as report
    from kforge.edge.dodo_tasks import load_catalog
    for wheel in (project / "out/dist").glob("*.whl"):
        wheel.unlink()
    binary = next((project / "out/sm_90a/scale/fp16-b256-w4").glob("*.cubin"))
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))
    failed = package.build_bundle("sm_90a", load_catalog(project).targets, str(project))
    assert f"package:sm_90a: {TWO[1]}: " in str(failed) and "does not match" in str(failed)
    assert "doit forget" in str(failed)   # the fix
    out = io.StringIO()
    reporter = type("R", (report.BuildReporter,), {"report_path": str(project / "out" / "r.json")})(out, {})
    task = SimpleNamespace(name="package:sm_90a", actions=[1])
    reporter.execute_task(task)
    reporter.add_failure(task, failed)
    reporter.complete_run()
    assert out.getvalue().rstrip().splitlines()[-1].startswith("kforge: built 0, up to date 0, failed 1 (1 package task)")


# A full disk: simulated in the build's processes by a sitecustomize that fails every write into an artifact
# directory with ENOSPC and doit's final sqlite3 commit with "database or disk is full".
FULL_DISK = '''
import builtins, errno, os, sqlite3
from doit.dependency import SqliteDB

_open = builtins.open


def _open_full(file, mode="r", *args, **kwargs):
    if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and "/out/sm_90a/" in os.fspath(file):
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(file))
    return _open(file, mode, *args, **kwargs)


def _dump_full(self):
    raise sqlite3.OperationalError("database or disk is full")


builtins.open = _open_full
SqliteDB.dump = _dump_full
'''


def test_a_full_disk_fails_each_target_in_one_line_and_ends_with_the_summary_and_report(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(128, 256))})
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FULL_DISK)
    proc = doit(root, "-n", "2", check=False, env={"PYTHONPATH": str(tmp_path / "site")})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in said, said   # as any run with a failed target
    assert proc.stdout.rstrip().splitlines()[-1].startswith("kforge: built 0, up to date 0, failed 2")
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(progress) == 2 and all("No space left on device" in line for line in progress), progress
    assert "doit's state was not saved (database or disk is full)" in proc.stderr
    assert statuses(root, "failed") == set(TWO)   # build-report.json, written once space allowed


def test_scratch_files_stay_in_out_and_none_outlives_the_run(tmp_path):
    """A kernel whose import leaves a temp file (as Triton's and ptxas's do when a compile is killed) leaves
    nothing in the system's temp directory; what a killed run left in out/.kforge/tmp goes at the next start."""
    leaves = kernel_text(imports="import tempfile\ntempfile.NamedTemporaryFile(suffix='.ptx', delete=False).close()")
    root = make_project(tmp_path / "p", kernels={"scale": leaves})
    left = root / "out" / ".kforge" / "tmp" / "999999999-sm_90a-scale-killed"   # no such pid
    left.mkdir(parents=True)
    (left / "tmpabc.ptx").write_text("from a run killed outright")
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    doit(root, "-n", "2", env={"TMPDIR": str(system_tmp)})
    assert statuses(root, "built") == {"scale:fp16-b256-w4@sm_90a"}
    assert list(system_tmp.iterdir()) == [] and list((root / "out" / ".kforge" / "tmp").iterdir()) == []


def test_an_arch_folder_linked_out_of_out_fails_its_targets_naming_the_link_and_one_fix(tmp_path):
    """The guard's message names the link and says to remove it; "free space (or fix out/)" was added to it too."""
    root = make_project(tmp_path / "p")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "out").mkdir()
    (root / "out" / "sm_90a").symlink_to(outside)
    proc = doit(root, "-n", "1", "archs=sm_90a", check=False)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert "remove the link and run again" in said and "free space" not in said
    assert not list(outside.iterdir())


TILES = '''
import triton
import triton.language as tl

{autotune}
@triton.jit
def dot_kernel(a_ptr, c_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.load(a_ptr + BLOCK * BLOCK + r[:, None] * BLOCK + r[None, :])
    tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))
'''
# a 256 x 256 fp16 tile of each operand goes through LDS: 131,072 bytes, where gfx942 has 65,536
AUTOTUNE = ('@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=4), '
            'triton.Config({"BLOCK": 256}, num_warps=8)], key=["n"])')
TILES_SPEC = '''
[kernel]
name = "tiles"
source = "tk/tiles.py"
entry = "dot_kernel"
toolchain = "triton"
archs = ["gfx942"]

[signature]
a_ptr = "*fp16"
c_ptr = "*fp16"
n = "i32"
BLOCK = "constexpr"

[sweep]
{sweep}
'''


def test_a_library_autotune_config_that_does_not_fit_its_arch_is_skipped_as_triton_skips_it_until_it_changes(
        tmp_path):
    """xformers lists autotune configs needing more LDS than gfx942 has: Triton's autotuner skips such a config on
    the GPU (OutOfResources, timed inf), so the build skips it: counted and shown, left out of the bundle, up to date
    while its inputs are, and the build green. It failed the build (and every build after it) before."""
    root = make_project(tmp_path / "p", specs={"tiles": TILES_SPEC.format(sweep="")},
                        kernels={"tiles": TILES.format(autotune=AUTOTUNE)})
    first = doit(root)   # exits 0
    report = json.loads((root / "out" / "build-report.json").read_text())
    [big] = statuses(root, "skipped")
    [small] = statuses(root, "built")
    assert "256" in big and "32" in small and report["counts"]["skipped"] == 1 and report["counts"]["failed"] == 0
    assert next(t for t in report["tasks"] if t["name"] == big)["reason"] == (
        "does not fit gfx942: needs 131072 bytes of shared memory (LDS), the arch has 65536; Triton's autotuner "
        "skips this config there too")
    assert f"] skipped {big}" in first.stdout and ", skipped 1 (autotune configs their arch cannot run), failed 0" \
        in first.stdout

    again = doit(root)   # up to date as it is: not compiled, still counted
    assert statuses(root, "skipped") == {big} and statuses(root, "up-to-date") == {small}
    assert f"] skipped {big}" not in again.stdout and "built 0, up to date 1, skipped 1 (" in again.stdout
    assert "skipped: does not fit gfx942" in doit(root, "info", big).stdout

    doit(root, "package")
    manifest = json.loads(Layout(root).manifest_copy("gfx942").read_text())
    assert [a["target"] for a in manifest["artifacts"]] == [small] and manifest["failed"] == []

    (root / "tk" / "tiles.py").write_text(TILES.format(autotune=AUTOTUNE) + "# edited\n")   # its inputs changed
    edited = doit(root)
    assert f"] skipped {big}" in edited.stdout and statuses(root, "skipped") == {big}


def test_a_value_the_user_swept_that_does_not_fit_its_arch_still_fails_naming_the_exclude(tmp_path):
    """The same tile as the user's own [sweep] value, no autotuner: the user's mistake, which fails the build."""
    root = make_project(tmp_path / "p", specs={"tiles": TILES_SPEC.format(sweep="BLOCK = [256]\nnum_warps = [8]")},
                        kernels={"tiles": TILES.format(autotune="")})
    run = doit(root, check=False)
    assert run.returncode != 0 and len(statuses(root, "failed")) == 1 and not statuses(root, "skipped")
    assert "needs 131072 bytes of shared memory (LDS); gfx942 has 65536" in run.stdout and "[[exclude]]" in run.stdout
