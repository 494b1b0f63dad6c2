"""rules/edge/config.py's runner: `doit -n N` on small dodo files of plain Python tasks, with and without kforge's runner."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import REPO, default_sigint, finish_or_explain, wait_until

DODO = '''
import os, signal, time
from pathlib import Path
from doit.reporter import ConsoleReporter
from doit.tools import run_once
{install}
LOG = Path(__file__).parent / "log"

def record(name, fail=False):
    with open(LOG, "a") as f:
        f.write(f"{{name}} {{os.getpid()}}\\n")
    return not fail

class Reporter(ConsoleReporter):
    def add_success(self, task):
        super().add_success(task)
        {on_success}

WAIT_S = {wait_s}
DOIT_CONFIG = {{"continue": True, "reporter": Reporter, "verbosity": 0}}
{tasks}
'''

CHAIN_AND_FAN = '''
def task_fan():
    for i in range(25):
        yield {"name": f"t{i}", "actions": [(record, [f"fan:t{i}", i == 7])], "uptodate": [run_once]}

def task_after():
    """tasks that depend on fan tasks; "blocked" depends on fan:t7, which fails"""
    yield {"name": "one", "actions": [(record, ["after:one"])], "task_dep": ["fan:t3", "fan:t4"],
           "uptodate": [run_once]}
    yield {"name": "two", "actions": [(record, ["after:two"])], "task_dep": ["after:one", "fan:t20"],
           "uptodate": [run_once]}
    yield {"name": "blocked", "actions": [(record, ["after:blocked"])], "task_dep": ["fan:t7"]}
'''


ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def run_doit(tmp_path, *args, install: str | None = "", on_success="pass", tasks=CHAIN_AND_FAN, timeout=60,
             wait_s=20):
    """install: None runs doit's own runner, else the arguments to doit_edge.install_runner()."""
    write_dodo(tmp_path, install, on_success, tasks, wait_s)
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def write_dodo(tmp_path, install: str | None = "", on_success="pass", tasks=CHAIN_AND_FAN, wait_s=20) -> None:
    setup = "" if install is None else f"from kforge.edge import config as doit_edge; doit_edge.install_runner({install})"
    text = DODO.format(install=setup, on_success=on_success, tasks=textwrap.dedent(tasks), wait_s=wait_s)
    (tmp_path / "dodo.py").write_text(text)


def log_lines(tmp_path) -> list[str]:
    return [line.split()[0] for line in (tmp_path / "log").read_text().splitlines()]


@pytest.mark.parametrize("workers", ["1", "3"])
@pytest.mark.parametrize("install", ["", None], ids=["kforge", "doit"])
def test_every_task_runs_once_and_after_its_dependencies(tmp_path, workers, install):
    proc = run_doit(tmp_path, "-n", workers, install=install)
    assert proc.returncode == 2, proc.stderr   # fan:t7 fails; doit says 2 as after:blocked cannot run
    ran = log_lines(tmp_path)
    assert sorted(ran) == sorted([f"fan:t{i}" for i in range(25)] + ["after:one", "after:two"])
    for dependent, deps in {"after:one": ["fan:t3", "fan:t4"], "after:two": ["after:one", "fan:t20"]}.items():
        assert all(ran.index(d) < ran.index(dependent) for d in deps)
    assert "after:blocked" not in ran and "fan:t7" in proc.stdout + proc.stderr
    second = run_doit(tmp_path, "-n", workers, install=install)   # doit's state: only the failed one reruns
    assert second.returncode == 2
    assert log_lines(tmp_path)[len(ran):] == ["fan:t7"]


# The master takes in t0's result only once t1 has run. With -n 1 that can only happen when t1 was queued
# before the master took in t0's result: doit's own runner never does, so its master waits out the deadline.
WAIT_FOR_T1 = '''if task.name == "seq:t0":
            deadline = time.monotonic() + WAIT_S
            while "seq:t1" not in LOG.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
            LOG.open("a").write(("t1 ran first" if "seq:t1" in LOG.read_text() else "t1 waited") + " 0\\n")'''

SEQUENCE = '''
def task_seq():
    for i in range(3):
        yield {"name": f"t{i}", "actions": [(record, [f"seq:t{i}"])]}
'''


def test_next_task_is_queued_before_the_master_takes_in_the_last_result(tmp_path):
    proc = run_doit(tmp_path, "-n", "1", on_success=WAIT_FOR_T1, tasks=SEQUENCE)
    assert proc.returncode == 0, proc.stderr
    assert log_lines(tmp_path) == ["seq:t0", "seq:t1", "t1", "seq:t2"]   # "t1 ran first"


@pytest.mark.parametrize("install", [None, "prefetch=0"], ids=["doit", "kforge-prefetch=0"])
def test_doits_own_scheduling_waits_for_the_master(tmp_path, install):
    """The test above can fail: doit's runner, and kforge's queueing nothing ahead, time out of the wait."""
    proc = run_doit(tmp_path, "-n", "1", install=install, on_success=WAIT_FOR_T1, tasks=SEQUENCE,
                    wait_s=1)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "log").read_text().splitlines()[1] == "t1 waited 0"


KILLS_ITS_WORKER = '''
def task_die():
    for i in range(4):
        yield {"name": f"t{i}", "actions": [(record, [f"die:t{i}"])], "uptodate": [run_once]}
    yield {"name": "self", "actions": [lambda: os.kill(os.getpid(), signal.SIGKILL)], "task_dep": ["die:t3"]}
'''


def test_a_dead_worker_ends_the_run_with_an_error_instead_of_a_hang(tmp_path):
    proc = run_doit(tmp_path, "-n", "2", tasks=KILLS_ITS_WORKER, timeout=60)
    assert proc.returncode == 2   # doit's "error" exit, after saving what finished
    said = proc.stdout + proc.stderr   # doit's console reporter prints its runtime errors on stdout
    assert "a doit worker process died" in said and "exit code -9" in said
    assert "running: die:self." in said   # the only task unfinished when its worker died
    assert sorted(log_lines(tmp_path)) == [f"die:t{i}" for i in range(4)]
    again = run_doit(tmp_path, "-n", "2", tasks=KILLS_ITS_WORKER, timeout=60)
    assert again.returncode == 2 and sorted(log_lines(tmp_path)) == [f"die:t{i}" for i in range(4)]


KILLS_ITS_WORKER_WHILE_OTHERS_WORK = '''
def task_die():
    yield {"name": "self", "actions": [lambda: os.kill(os.getpid(), signal.SIGKILL)]}

def task_busy():
    for i in range(40):
        yield {"name": f"t{i}", "actions": [(lambda name: time.sleep(0.3) or record(name), [f"busy:t{i}"])]}
'''


def test_a_dead_worker_stops_the_run_while_the_others_keep_finishing_tasks(tmp_path):
    """The surviving worker sends a result every 0.3 s: a master that looked for dead workers only when no
    result came for a second would run all 40 tasks (12 s) before it stopped."""
    proc = run_doit(tmp_path, "-n", "2", tasks=KILLS_ITS_WORKER_WHILE_OTHERS_WORK, timeout=60)
    assert proc.returncode == 2
    assert "a doit worker process died" in proc.stdout + proc.stderr
    assert 1 <= len(log_lines(tmp_path)) <= 15


def test_no_more_workers_than_tasks(tmp_path):
    proc = run_doit(tmp_path, "-n", "8", tasks=SEQUENCE.replace("range(3)", "range(2)"))
    assert proc.returncode == 0, proc.stderr
    assert len({line.split()[1] for line in (tmp_path / "log").read_text().splitlines()}) <= 2


IGNORES_SIGTERM = '''
def deaf():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a worker that outlives the master's SIGTERM
    record("deaf:t0")
    time.sleep(600)

def task_deaf():
    yield {"name": "t0", "actions": [deaf]}
'''


def test_an_interrupted_run_ends_even_when_a_worker_ignores_sigterm(tmp_path):
    """Multiprocessing joins a master's workers before it exits: a master that only sent SIGTERM would wait
    out this worker's 600 s sleep, then wait forever for a job."""
    write_dodo(tmp_path, tasks=IGNORES_SIGTERM)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2"], cwd=tmp_path, env=ENV, text=True,
                            preexec_fn=default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = tmp_path / "log"
    wait_until(lambda: log.exists() and log.read_text().endswith("\n"), timeout_s=60)
    worker = int(log.read_text().split()[1])
    proc.send_signal(signal.SIGINT)
    output = finish_or_explain(proc, timeout=30)
    assert proc.returncode != 0, output
    stat = Path(f"/proc/{worker}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"   # gone, or a zombie


# A worker records its start, via the process class the runner forks: the dodo wraps it.
COUNT_WORKERS = '''
from kforge.edge import config as _runner
class _Counted(_runner.PrefetchRunner.Child):
    def start(self):
        with open(LOG, "a") as f:
            f.write(f"worker-started {os.getpid()}\\n")
        super().start()
_runner.PrefetchRunner.Child = _Counted

def task_fam():
    for i in range(5):
        yield {"name": f"t{i}", "actions": [(record, [f"fam:t{i}"])], "uptodate": [run_once]}
'''


def test_a_run_with_nothing_to_build_forks_no_worker_and_group_tasks_finish_in_the_master(tmp_path):
    """Group tasks have no action: a round trip through a worker per group (and two forked workers on a
    no-op) cost a no-op run more than its up-to-date checks."""
    first = run_doit(tmp_path, "-n", "2", tasks=COUNT_WORKERS)
    assert first.returncode == 0, first.stderr
    assert sorted(log_lines(tmp_path)).count("worker-started") == 2 and "fam:t4" in log_lines(tmp_path)
    (tmp_path / "log").write_text("")
    second = run_doit(tmp_path, "-n", "2", tasks=COUNT_WORKERS)   # every fam:t* is up to date; fam runs
    assert second.returncode == 0, second.stderr
    assert log_lines(tmp_path) == []
