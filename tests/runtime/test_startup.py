"""rules/runtime/startup.py: KFORGE_SERVE and KFORGE_RECORD reach every Python process of an application through
the .pth file installed with kforge. In child processes, on the CPU: Triton's driver answered by a stub (sm_90a)
and kernel binaries stood in for (tests/runtime/test_serve.py), compiles stood in for when recording."""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import REPO, Compiled

PTH = "kforge-runtime-env.pth"


@pytest.fixture(scope="module")
def installed():
    """The .pth is where `pip install -e .` (or a wheel) put it: the site-packages of this Python."""
    if not (Path(sysconfig.get_paths()["purelib"]) / PTH).is_file():
        pytest.fail(f"{PTH} is not in {sysconfig.get_paths()['purelib']}: install kforge (pip install -e .)")


def held_copy(folder: Path) -> Path:
    """A bundle holding tests.runtime.test_serve's copy kernel at BLOCK 128. test_serve (torch and Triton) is
    imported here, not at the top: the children below import this module, and a parent that only starts them
    never imports torch (2 s of CPU each)."""
    from tests.runtime.test_serve import bundle_dir, entry
    return bundle_dir(folder, [entry("copy", 128, 4)])

def python(code: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    """`python -c code` with only these KFORGE_ variables set, the checkout importable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    proc = subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(REPO), **env},
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_a_python_without_the_variables_imports_nothing_of_kforge(installed):
    shown = "import sys; print(sorted(m for m in sys.modules if m.startswith('kforge')))"
    assert python(shown, {}).stdout.split() == ["[]"]
    # set, but Triton never imported (torchrun's launcher, say): the switch alone, nothing else of kforge
    assert python(shown, {"KFORGE_SERVE": "anywhere"}).stdout.split() == [
        "['kforge_runtime',", "'kforge_runtime.after_import',", "'kforge_runtime.startup']"]


def launch(block: int = 128) -> dict:
    """In a served child: one launch of tests.runtime.test_serve.copy; what the child's server counted."""
    from kforge_runtime import serve
    from kforge_runtime.bundle import Bundle
    from tests.runtime.test_serve import Launched, StubDriver, copy, tensors
    from triton.runtime import driver
    driver.set_active(StubDriver())
    Bundle.kernel = lambda self, entry, device=None, binary=None: Launched()
    Bundle.binary = lambda self, entry: b"the binary"
    copy.device_caches[0]
    copy.compile = lambda *a, **k: sys.exit("compiled")
    x, y = tensors()
    copy[(8,)](x, y, 1000, BLOCK=block)
    server = serve._active[-1]
    return {"served": server.served, "compiled": server.compiled, "launches": len(Launched.calls),
            "strict": server.strict, "pid": os.getpid()}


# What ran before `import triton` never turns the switches off: torch's first CUDA use asks
# importlib.util.find_spec("triton") (torch.cuda._register_triton_kernels), and so may any library.
BEFORE = "import importlib.util; importlib.util.find_spec('triton'); importlib.util.find_spec('triton')\n"

# A parent that starts `workers` spawn workers (fn(0), fn(1), ...) and then a subprocess child (fn(workers)) that
# looks Triton up twice before importing it (BEFORE); prints the list of what they returned.
PARENT = """
import json, multiprocessing, subprocess, sys
from tests.runtime.test_startup import {fn}
if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool({workers}) as pool:
        spawned = pool.map({fn}, range({workers}))
    child = subprocess.run([sys.executable, "-c", {before!r} + "import json; from tests.runtime.test_startup import "
                            "{fn}; print(json.dumps({fn}({workers})))"], capture_output=True, text=True, check=True)
    print(json.dumps(spawned + [json.loads(child.stdout)]))
"""


def parent(fn: str, workers: int) -> str:
    return "import sys; sys.argv[0] = 'parent'\n" + PARENT.format(fn=fn, workers=workers, before=BEFORE)


def served_child(_) -> dict:
    return launch()


def test_spawn_workers_and_subprocess_children_are_served_though_triton_was_looked_up_before_its_import(
        installed, tmp_path):
    """One spawn worker (a pool's workers are alike; test_every_process_records... keeps two, whose appends
    meet) and a subprocess child that asks find_spec('triton') before importing it, each a server of its own."""
    held = held_copy(tmp_path / "b")
    runs = json.loads(python(parent("served_child", 1), {"KFORGE_SERVE": f"{held},strict"}).stdout.splitlines()[-1])
    assert [{k: r[k] for k in ("served", "compiled", "launches", "strict")} for r in runs] == [
        {"served": 1, "compiled": 0, "launches": 1, "strict": True}] * 2
    assert len({r["pid"] for r in runs}) == 2


def test_a_hook_run_twice_and_a_bundle_and_flag_named_twice_serve_the_process_once_and_strict_stops_it_at_a_miss(
        installed, tmp_path):
    """The .pth in two site directories runs its line twice: one server, one report (seen on an H100 under
    torchrun: two reports per rank, the second counting 0 served). A value naming its path and a flag twice, a space
    after a comma, is as meant: the bundle serves, and strict stops the process at the launch it lacks."""
    held = held_copy(tmp_path / "b")
    repeated = f"{held}, strict,{held},strict,report"
    proc = python("import kforge_runtime.startup as s; s.start()\n"
                  "import json; from tests.runtime.test_startup import launch; print(json.dumps(launch(128)))\n"
                  "launch(256)", {"KFORGE_SERVE": repeated}, check=False)
    run = json.loads(proc.stdout.splitlines()[-1])
    assert (run["served"], run["compiled"], run["launches"], run["strict"]) == (1, 0, 1, True), run
    assert proc.returncode == 1 and "kforge serve (strict): no prebuilt tests.runtime.test_serve:copy" in proc.stderr
    assert proc.stderr.count("kforge serve (pid") == 1, proc.stderr[-2000:]
    assert "1 specializations served" in proc.stderr or "1 specialization served" in proc.stderr, proc.stderr[-2000:]


def test_a_serve_value_naming_no_bundle_stops_the_process_at_import_triton_and_only_there(installed):
    for value, said in (("nowhere/dist,strict", f"kforge: KFORGE_SERVE names {REPO}/nowhere/dist, which does "
                                                f"not exist"),
                        ("/no/such\ndist", "kforge: KFORGE_SERVE names /no/such\\ndist, which does not exist"),
                        ("strict,preload", "kforge: KFORGE_SERVE='strict,preload' names no bundle")):
        bad = python("import triton", {"KFORGE_SERVE": value}, check=False)
        assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [bad.stderr.strip()]   # one line
        assert said in bad.stderr
        assert python("print('no triton, no check')", {"KFORGE_SERVE": value}).returncode == 0


def recorded_child(i) -> int:
    """In a recorded child: tests.runtime.test_serve.copy compiled (stood in for) with BLOCK 128 in every
    child, and with a BLOCK of its own."""
    from tests.runtime.test_serve import StubDriver, copy, tensors
    from triton.runtime import driver
    driver.set_active(StubDriver())
    copy.device_caches[0]
    copy.compile = lambda *a, **k: Compiled()
    x, y = tensors()
    for block in (128, 256 + 128 * i):
        copy[(8,)](x, y, 1000, BLOCK=block)
    return os.getpid()


def test_every_process_records_into_one_file_each_specialization_once_though_triton_was_looked_up_before_its_import(
        installed, tmp_path):
    """Two spawn workers (their appends meet: one line each) and a subprocess child that asks find_spec('triton')
    before importing it."""
    out = tmp_path / "records" / "app.jsonl"
    out.parent.mkdir()
    subprocess.run([sys.executable, "-c", parent("recorded_child", 2)], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")},
                        "PYTHONPATH": str(REPO), "KFORGE_RECORD": "records/app.jsonl"})   # relative: made absolute
    lines = out.read_text().splitlines()
    blocks = sorted(json.loads(t)["constexprs"]["BLOCK"] for t in lines)
    assert blocks == [128, 256, 384, 512] and len(set(lines)) == len(lines)


@pytest.mark.parametrize("where", ["fifo", "/dev/zero", "/dev/stdout"])
def test_a_record_destination_that_is_no_file_is_one_warning_and_never_blocks(installed, tmp_path, where):
    if where == "fifo":
        where = str(tmp_path / "fifo")
        os.mkfifo(where)
    proc = python("from tests.runtime.test_startup import recorded_child; recorded_child(0); print('ran')",
                  {"KFORGE_RECORD": where})   # /dev/stdout is the pipe subprocess reads: never written to
    assert proc.stdout.strip() == "ran"
    warned = [line for line in proc.stderr.splitlines() if line.startswith("kforge record:")]
    assert len(warned) == 1 and "not a regular file; nothing is recorded" in warned[0], proc.stderr[-2000:]


def test_a_moved_checkout_is_one_line_per_process_not_a_traceback(tmp_path):
    """The .pth's line, run as site.py runs it, where kforge_runtime cannot be imported (an editable install
    whose checkout moved): one line on stderr, and the process runs on."""
    line = (REPO / "rules" / "runtime" / PTH).read_text()
    code = ("import sys\n"
            "class Gone:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.startswith('kforge_runtime'): raise ModuleNotFoundError(f'No module named {name!r}')\n"
            "sys.meta_path.insert(0, Gone())\n"
            f"exec({line!r})\n"
            "print('ran')")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"KFORGE_SERVE": "out/dist", "PATH": os.environ.get("PATH", "")})
    assert proc.stdout.strip() == "ran"
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "kforge: KFORGE_RECORD / KFORGE_SERVE are set, but kforge_runtime cannot be imported here"), proc.stderr


@pytest.mark.parametrize("value", [" ", "app.jsonl,report"])
def test_a_record_value_that_is_no_file_name_is_one_warning_and_records_nothing(installed, tmp_path, value):
    """KFORGE_RECORD=' ' recorded into a file named ' ' in the working directory; 'app.jsonl,report' (an option
    it does not take) into a file of that name."""
    proc = subprocess.run([sys.executable, "-c", "from tests.runtime.test_startup import recorded_child; "
                           "recorded_child(0); print('ran')"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**{k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")},
                                            "PYTHONPATH": str(REPO), "KFORGE_RECORD": value})
    assert proc.stdout.strip() == "ran", proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if line.startswith("kforge record:")]
    assert len(warned) == 1 and "KFORGE_RECORD takes one file name and no options" in warned[0], proc.stderr[-2000:]
    assert os.listdir(tmp_path) == []


def test_a_serve_value_that_cannot_be_applied_is_one_line_at_import_triton(installed, tmp_path):
    held = held_copy(tmp_path / "b")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "manifest.txt").write_text("not a bundle")
    for value, said in ((" ", "kforge: KFORGE_SERVE=' ' names no bundle"),
                        (",,", "kforge: KFORGE_SERVE=',,' names no bundle"),
                        (f"{held},strikt", "kforge: KFORGE_SERVE: 'strikt' is neither a flag (strict, preload, "
                                           "report, verify) nor a bundle that exists"),
                        (f"{held},STRICT", "'STRICT' is neither a flag"),
                        (f"{tmp_path / 'fifo'}", f"kforge: KFORGE_SERVE names {tmp_path / 'fifo'}, which is a FIFO "
                                                 f"or pipe, not a bundle"),
                        ("/dev/null", "kforge: KFORGE_SERVE names /dev/null, which is a terminal or character "
                                      "device, not a bundle"),
                        (f"{tmp_path / 'manifest.txt'}", f"kforge: KFORGE_SERVE names {tmp_path / 'manifest.txt'}, "
                                                         f"which is not a bundle (not a wheel or zip file)")):
        bad = python("import triton", {"KFORGE_SERVE": value}, check=False)
        assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [bad.stderr.strip()], (value, bad.stderr)
        assert said in bad.stderr, (value, bad.stderr)


def test_kforge_serve_naming_a_folder_without_a_bundle_stops_the_process_in_one_line(tmp_path, monkeypatch, capsys):
    """startup.py 67-68 (a folder passes not_a_bundle's check; Library finds no manifest.json and no wheel in it):
    reachable by KFORGE_SERVE=<an empty out/dist>, never run in the whole suite's coverage. Nothing is installed."""
    from kforge_runtime import startup
    monkeypatch.setenv("KFORGE_SERVE", str(tmp_path))
    monkeypatch.delenv("KFORGE_RECORD", raising=False)
    with pytest.raises(SystemExit) as e:
        startup.apply()
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"kforge: KFORGE_SERVE: {tmp_path}: no bundle here (no manifest.json, no "
                                       f"*.whl); run `doit package`\n")


def test_kforge_serve_naming_a_file_that_cannot_be_read_says_so(tmp_path):
    """startup.py 110-111: a regular file whose read fails (/proc/self/mem: EIO at offset 0; root opens any file,
    so no mode 000 file stands in)."""
    from kforge_runtime import startup
    assert startup.not_a_bundle("/proc/self/mem") == " names /proc/self/mem, which cannot be read (Input/output error)"
