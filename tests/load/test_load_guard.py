"""rules/load/load_guard.py: a Python catalog or a family module imported to probe it that never returns, allocates
without end or starts processes: a notice naming the file, a stop at catalog_timeout / catalog_memory with one
line naming the file and the setting, and no process left behind."""
import os
import textwrap
import time
from pathlib import Path

import pytest

from kforge.plan.catalog import Catalog
from kforge.base.errors import SpecError
from kforge.load import load_guard
from kforge.plan.catalog import load_specs
from tests.support import doit, make_project, time_limit
from tests.declare.test_python_catalog import CATALOG, python_project
from tests.load.test_installed import install, spec

# starts a process that would outlive the load, and says which: in a file of its own per importing process, by
# rename (two probes may import one module at once; the load stops them both when one fails, maybe mid-write)
SPAWN = ("import subprocess as _sp, pathlib as _pl, os as _os\n"
         "_p = _pl.Path({pid_file!r} + '.' + str(_os.getpid())); _t = _p.with_name(_p.name + '.tmp')\n"
         "_t.write_text(str(_sp.Popen(['sleep', '600']).pid)); _os.replace(_t, _p)\n")


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap the orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid_file: Path, within_s: float = 5.0) -> bool:
    """Whether every process named in pid_file, or in the files SPAWN writes beside it, is gone in time (a temporary
    one an importer was stopped before renaming counts where it holds a whole number)."""
    written = [p.read_text() for p in [pid_file, *pid_file.parent.glob(pid_file.name + ".*")] if p.exists()]
    pids = [int(text) for text in written if text.isdigit()]
    assert pids, f"no process was named in {pid_file} or beside it"
    deadline = time.monotonic() + within_s
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(running, pids))


def test_a_catalog_in_an_endless_loop_is_named_then_stopped_at_the_limit_and_its_processes_die(tmp_path):
    pid_file = tmp_path / "sleep.pid"
    root = python_project(tmp_path, SPAWN.format(pid_file=str(pid_file)) + "while True:\n    pass\n")
    started = time.monotonic()
    proc = doit(root, "list", env={"KFORGE_CATALOG_TIMEOUT": "2"}, check=False, timeout=60)
    assert proc.returncode == 0 and time.monotonic() - started < 30, proc.stderr   # listed, marked broken
    notice, stop = proc.stderr.strip().splitlines()
    assert notice.startswith("kforge: loading specs/lib.py (the catalog file) for 1 s so far; it is stopped at 2 s")
    assert stop == ("kforge: family lib did not load: specs/lib.py: the catalog file ran past catalog_timeout (2 s) "
                    "and was stopped; see "
                    "where it hangs with `python specs/lib.py`, or raise the limit (catalog_timeout=SECONDS or "
                    "KFORGE_CATALOG_TIMEOUT) if it needs longer")
    assert gone(pid_file)


def test_a_catalog_allocating_without_end_stops_at_the_memory_limit_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CATALOG_MEMORY", "2G")
    root = python_project(tmp_path, "chunks = [bytes(2**28) for _ in range(256)]\n" + CATALOG)   # 64 GiB, untouched
    with pytest.raises(SpecError) as e:
        load_specs(root)
    assert str(e.value) == ("specs/lib.py: ran out of memory at catalog_memory=2G; raise it (catalog_memory=SIZE or "
                            "KFORGE_CATALOG_MEMORY, e.g. 16G) if the file needs more")


def test_a_catalog_that_returns_leaves_no_process_behind_and_its_families_and_reads_come_back(tmp_path):
    pid_file = tmp_path / "sleep.pid"
    root = python_project(tmp_path, SPAWN.format(pid_file=str(pid_file)) + CATALOG)
    read: set[Path] = set()
    from kforge.plan.catalog import load_specs as load_with_reads
    specs = load_with_reads(root, None, read)
    assert [s.name for s in specs] == ["scale_fp16", "scale_bf16"]
    assert (root / "specs" / "blocks.json").resolve() in read   # what the child read reaches the catalog's stamp
    assert gone(pid_file)


def test_a_catalog_value_that_cannot_leave_its_process_is_one_line(tmp_path):
    root = python_project(tmp_path, CATALOG.replace('"num_warps": [4]', '"num_warps": [lambda: 4]'))
    with pytest.raises(SpecError, match=r"^specs/lib.py: a family's arguments must be plain values \(strings, "
                                        r"numbers, booleans, lists and dicts of them\): PicklingError"):
        load_specs(root)


HANGS = '''
{spawn}{body}

import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({{"BLOCK": 128}})], key=["n"])
@triton.jit
def slow_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass
'''


@pytest.mark.parametrize("body, timeout, message", [
    ("while True:\n    pass", "3",
     "specs/lib_slow.toml: importing kforge_testlib.ops.slow for sm_90a to read the entry's autotune / heuristics "
     "ran past catalog_timeout (3 s) and was stopped; see where it hangs with `python -c 'import "
     "kforge_testlib.ops.slow'`, "
     "or raise the limit (catalog_timeout=SECONDS or KFORGE_CATALOG_TIMEOUT) if it needs longer"),
    ("chunks = [bytes(2**28) for _ in range(256)]", "120",
     "specs/lib_slow.toml: reading kforge_testlib.ops.slow.slow_kernel's autotune / heuristics (the module is "
     "imported in a child process): MemoryError (in kforge_testlib/ops/slow.py:5) (at catalog_memory=2G; raise "
     "it: catalog_memory=SIZE or "
     "KFORGE_CATALOG_MEMORY, e.g. 16G)"),
], ids=["endless-loop", "memory"])
def test_a_family_module_the_probe_imports_is_bounded_and_its_processes_die(tmp_path, monkeypatch, body, timeout,
                                                                           message):
    site = install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("KFORGE_CATALOG_TIMEOUT", timeout)
    monkeypatch.setenv("KFORGE_CATALOG_MEMORY", "2G")
    pid_file = tmp_path / "sleep.pid"
    (site / "kforge_testlib" / "ops" / "slow.py").write_text(
        textwrap.dedent(HANGS.format(spawn=SPAWN.format(pid_file=str(pid_file)), body=body)))
    root = make_project(tmp_path / "p", specs={"lib_slow": spec("lib_slow", "kforge_testlib.ops.slow", "slow_kernel")
                                               .replace("[sweep]\nBLOCK = [128, 256]\n", "[sweep]\n")}, kernels={})
    with pytest.raises(SpecError) as e, time_limit(60, "the catalog's load"):
        Catalog(root, None, 50_000).load()
    assert str(e.value) == message
    assert gone(pid_file)


def test_a_child_dies_with_its_parent(tmp_path):
    """A doit killed outright (SIGKILL) takes the catalog's process with it (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "child.pid"
    root = python_project(tmp_path, f"import os, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))"
                                    f"\nwhile True:\n    pass\n")
    parent = os.fork()
    if parent == 0:
        try:
            load_specs(root)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(parent, 9)
        os.waitpid(parent, 0)
    assert int(pid_file.read_text()) != parent   # the catalog runs in a child of the loading process
    assert gone(pid_file)


def test_a_catalog_that_ends_its_process_outright_is_one_line_not_the_end_of_the_build(tmp_path):
    root = python_project(tmp_path, "import os\nos._exit(3)\n")
    with pytest.raises(SpecError, match=r"^specs/lib.py: the process loading it died \(exit code 3\) before it "
                                        r"returned; run `python specs/lib.py` to see why$"):
        load_specs(root)


def test_a_catalog_child_killed_by_a_signal_is_one_line_naming_the_signal_and_how_to_see_why():
    """load_guard.py 169 (a Python catalog whose run is killed, as a segfault in a native extension is): never run
    in the whole suite's coverage. load_guard.run directly: one fork."""
    import signal
    from kforge.load import load_guard
    with pytest.raises(SpecError) as e:
        load_guard.run(lambda: os.kill(os.getpid(), signal.SIGKILL), "specs/cat.py")
    assert str(e.value) == ("specs/cat.py: the process loading it died (signal SIGKILL) before it returned; run "
                            "`python specs/cat.py` to see why")


def test_a_catalog_memory_of_no_whole_kilobytes_is_said_in_bytes(monkeypatch):
    """load_guard.py 177 (catalog_memory=1048577): never run in the whole suite's coverage."""
    from kforge.load import load_guard
    monkeypatch.setenv("KFORGE_CATALOG_MEMORY", "1048577")
    assert load_guard.memory_hint("specs/cat.py: loading it failed: MemoryError: ") == (
        "specs/cat.py: loading it failed: MemoryError (at catalog_memory=1048577; raise it: catalog_memory=SIZE or "
        "KFORGE_CATALOG_MEMORY, e.g. 16G)")


def test_what_a_catalog_prints_goes_to_stderr_not_the_commands_output(capfd):
    """A Python catalog's print() landed in `doit list --all`'s stdout, which scripts read (a hostile-input
    review)."""
    assert load_guard.run(lambda: (print("from the catalog", flush=True), os.write(1, b"raw\n"), 7)[2], "c.py") == 7
    out, err = capfd.readouterr()
    assert out == "" and "from the catalog" in err and "raw" in err
