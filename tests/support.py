"""Shared helpers: throw-away kforge projects with tiny kernels, and running doit on them."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ADD_KERNEL = '''
import triton
import triton.language as tl
{imports}

@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, (tl.load(x_ptr + i, mask=m) * {factor}).to(y_ptr.dtype.element_ty), mask=m)
'''

ADD_SPEC = '''
[kernel]
name = "{name}"
source = "tk/{module}.py"
entry = "scale_kernel"
toolchain = "triton"
archs = {archs}
id = "{{dtype}}-b{{BLOCK}}-w{{num_warps}}"

[signature]
x_ptr = "*{{dtype}}"
y_ptr = "*{{dtype}}"
n = "i32"
BLOCK = "constexpr"

[hints]
divisible_by_16 = ["x_ptr", "y_ptr"]

[sweep]
dtype = {dtypes}
BLOCK = {blocks}
num_warps = [4]
'''


def spec_text(name="scale", module="scale", archs=("sm_90a",), dtypes=("fp16",), blocks=(256,)) -> str:
    q = lambda xs: "[" + ", ".join(f'"{x}"' if isinstance(x, str) else str(x) for x in xs) + "]"
    return textwrap.dedent(ADD_SPEC.format(name=name, module=module, archs=q(archs), dtypes=q(dtypes),
                                           blocks=q(blocks)))


def make_project(tmp: Path, specs: dict[str, str] | None = None, kernels: dict[str, str] | None = None) -> Path:
    """A project at tmp: the repo's dodo.py and pyproject.toml, the given specs and tk/ kernel modules."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dodo.py", tmp / "dodo.py")
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    (tmp / "specs").mkdir(exist_ok=True)
    (tmp / "tk").mkdir(exist_ok=True)
    (tmp / "tk" / "__init__.py").write_text("")
    for name, text in (specs if specs is not None else {"scale": spec_text()}).items():
        (tmp / "specs" / f"{name}.toml").write_text(text)
    for name, text in (kernels if kernels is not None else {"scale": kernel_text()}).items():
        (tmp / "tk" / f"{name}.py").write_text(text)
    return tmp


REDIRECT = '''
import importlib.util, os, sys
class Redirect:   # what an editable install (setuptools' flat layout) puts on sys.meta_path: package -> its folder
    MAPPING = {mapping!r}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in cls.MAPPING:
            init = os.path.join(cls.MAPPING[name], "__init__.py")
            return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[cls.MAPPING[name]])
        return None
sys.meta_path.append(Redirect)
'''


def write_manifest(folder: Path, data: bytes | str) -> None:
    """A bundle folder's manifest.json and the digest `doit package` writes beside it (a manifest a test makes or
    edits stands for one whose builder wrote both: what the loader checks past the digest)."""
    data = data.encode() if isinstance(data, str) else data
    (folder / "manifest.json").write_bytes(data)
    (folder / "manifest.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def write_files(folder: Path, files: dict[str, str]) -> Path:
    """Each of `files` ({relative path: text, indented as it sits in the test}) written under folder, dedented."""
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(textwrap.dedent(text))
    return folder


def write_library_files(folder: Path, files: dict[str, str]) -> Path:
    """A test library's files under folder, dedented and with their leading blank lines dropped: a line number
    in a message about them is the line in the text as written."""
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(textwrap.dedent(text).lstrip())
    return folder


def write_site_package(site: Path, dist: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A test library as pip leaves it in site-packages: its files (write_library_files) and its dist-info
    (METADATA with `requires`, top_level.txt)."""
    write_library_files(site, files)
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (info / "top_level.txt").write_text(f"{dist}\n")
    return site


def redirected_package(package: Path, files: dict[str, str]) -> Path:
    """The package `files` at `package` (a folder on no module path entry) and a site folder whose sitecustomize
    maps the package's name to it with an import finder, as an editable install's .pth does at start-up:
    PYTHONPATH=<the returned folder> makes `import <package name>` work in a new process."""
    write_files(package, files)
    site = package.parent / f"{package.name}_redirect_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(REDIRECT.format(mapping={package.name: str(package)}))
    return site


def kernel_text(factor: str = "2", imports: str = "") -> str:
    return ADD_KERNEL.format(factor=factor, imports=imports)


# a kernel whose own parameter is named as a compile option (liger's sparsemax): tk/<name>.py
WARPS_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def warps_kernel(x_ptr, n, BLOCK: tl.constexpr, num_warps: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * num_warps, mask=i < n)
'''


def doit(project: Path, *args: str, timeout: float = 600, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"doit {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def build_report(project: Path) -> dict[str, str]:
    """target name -> status from the last run's out/build-report.json."""
    report = json.loads((project / "out" / "build-report.json").read_text())
    return {t["name"]: t["status"] for t in report["tasks"]}


def statuses(project: Path, status: str) -> set[str]:
    return {n for n, s in build_report(project).items() if s == status}


def wait_until(condition, timeout_s: float, poll_s: float = 0.05) -> None:
    """Poll condition() until it holds or timeout_s passes; the caller's assertions then say what is missing."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(poll_s)


def default_sigint() -> None:
    """Popen's preexec_fn for a build a test interrupts: a shell starts background commands with SIGINT
    ignored, and a Python started so never raises KeyboardInterrupt; the test must not depend on how it
    was launched."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish_or_explain(proc: subprocess.Popen, timeout: float) -> str:
    """proc's output once it exits; if it is still running after timeout s, kill it and its children and fail
    with what each of their threads was waiting in (a hang seen only on CI is then explained by CI's log)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        tree = process_tree(proc.pid)
        for pid in reversed([pid for pid, _ in tree]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output = proc.communicate()[0]
        raise AssertionError(f"still running after {timeout} s; its processes (pid: state, a wchan per thread):\n"
                             + "\n".join(line for _, line in tree) + f"\noutput:\n{output[-3000:]}")


def process_tree(pid: int, depth: int = 0) -> list[tuple[int, str]]:
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        waits = [(t / "wchan").read_text() or "-" for t in sorted((proc / "task").iterdir())]
        children = (proc / "task" / str(pid) / "children").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return []
    rows = [(pid, "  " * depth + f"{pid}: {state} {' '.join(waits)}")]
    for child in children:
        rows += process_tree(int(child), depth + 1)
    return rows


class TimeLimitExceeded(Exception):
    """Raised in a body that ran past its time limit. Not an OSError: code under test must not take it for a
    read error and swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "the body"):
    """Raise TimeLimitExceeded inside the body once it has run `seconds` (a hang becomes a failed case, not a
    stuck run). SIGALRM: main thread only."""
    def expired(*_):
        raise TimeLimitExceeded(f"{what}: still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Compiled:
    """Stands for Triton's compiled kernel (launches do nothing)."""
    function = packed_metadata = None

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        pass


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder that build(folder) filled, made once for the whole pytest run (every xdist worker of it) and
    then only read: tests that change it work on a copy (copy_built). The workers share the run's temporary
    root; a lock file there makes the first worker build while the others wait for it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # gw0, gw1 ... share their parent
    folder, done = shared / f"built-once-{name}", shared / f"built-once-{name}.done"
    with open(shared / f"built-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)   # a worker that failed half way left it
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def computed_once(tmp_path_factory, name: str, compute):
    """compute(folder)'s value (plain JSON: dicts, lists, strings, numbers), computed once for the whole pytest run
    (built_once: the first xdist worker to ask computes it, the others wait for it and read it). For a module-scoped
    fixture whose tests only read what it found: under worksteal a module's tests may run on several workers,
    and each of them paid the fixture again."""
    def build(folder: Path) -> None:
        (folder / "value.json").write_text(json.dumps(compute(folder)))
    return json.loads((built_once(tmp_path_factory, name, build) / "value.json").read_text())


def copy_built(folder: Path, to: Path) -> Path:
    """A copy of a built_once folder for one test to change (copying is far cheaper than compiling again;
    kforge finds a moved project's artifacts up to date, tests/compile/test_action.py holds that)."""
    shutil.copytree(folder, to, symlinks=True)
    return to


@contextlib.contextmanager
def fresh_servers(monkeypatch):
    """Compile servers of the test's own: a hub forked from this process as it is now (with what the test patched
    in, a fake backend say) and no context servers kept from another test; all closed at the end."""
    from kforge.compile import core as compile_core
    from kforge.load import isolate
    monkeypatch.setattr(compile_core, "_private", {})
    monkeypatch.setattr(compile_core, "_hub", isolate.Hub(compile_core._route))
    try:
        yield compile_core
    finally:
        for servers in compile_core._private.values():   # per (thread, build)
            for server in servers.values():
                server.close()
        compile_core._hub.close()
