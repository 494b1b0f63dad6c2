"""Distributed compiles on a Dask LocalCluster of 2 worker processes: byte-identical to a local build,
a worker killed mid-build is replaced and the run stays green, a compile error is still that target's."""
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support import REPO, build_report, doit, kernel_text, make_project, spec_text, wait_until

# found, not imported: every xdist worker collects this module, and importing distributed costs each 0.6 s of CPU
pytestmark = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="could not import 'distributed'")


@pytest.fixture(scope="module")
def cluster():
    import distributed
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            yield c.scheduler_address.replace("tcp://", "dask://"), client


def project(tmp_path, name, blocks=(256,), bad=False, factor="2"):
    specs = {"scale": spec_text(archs=("sm_90a", "gfx942"), dtypes=("fp16", "bf16"), blocks=blocks)}
    kernels = {"scale": kernel_text(factor=factor)}
    if bad:
        specs["bad"], kernels["bad"] = spec_text(name="bad", module="bad"), kernel_text(factor="no_such_name")
    return make_project(tmp_path / name, specs=specs, kernels=kernels)


def artifacts(root):
    return {p.relative_to(root / "out"): p.read_bytes() for p in (root / "out").glob("*/*/*/*")
            if p.suffix in (".cubin", ".hsaco", ".json")}


def records(root):
    return {r["name"]: r for r in json.loads((root / "out" / "build-report.json").read_text())["tasks"]}


def test_a_cluster_build_is_byte_identical_to_a_local_one(cluster, tmp_path):
    address, client = cluster
    local, remote = project(tmp_path, "local", bad=True), project(tmp_path, "remote", bad=True)
    doit(local, "-n", "2", check=False)
    out = doit(remote, "-n", "4", "-P", "thread", f"executor={address}", check=False)
    assert out.returncode != 0 and "CompilationError" in out.stdout   # the bad target failed, and said why
    assert "no_such_name" in (remote / "out" / "sm_90a" / "bad" / "fp16-b256-w4" / "error.txt").read_text()
    workers = set(client.scheduler_info()["workers"])
    built = {n: r for n, r in records(remote).items() if r["status"] == "built"}
    assert len(built) == 4 and {r["compiled_on"] for r in built.values()} <= workers
    assert records(remote)["bad:fp16-b256-w4@sm_90a"]["status"] == "failed"
    assert artifacts(remote) == artifacts(local) and artifacts(local)


def own_cluster():
    """A cluster of one worker, the test's own: a worker keeps its compile servers across builds, and the module's
    cluster has compiled the other tests' tk package."""
    import distributed
    return distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)


def on(cluster, root):
    doit(root, "-n", "2", "-P", "thread", f"executor={cluster.scheduler_address.replace('tcp://', 'dask://')}")
    assert set(build_report(root).values()) == {"built"}


def test_one_worker_compiles_each_build_from_its_own_sources(tmp_path):
    """Builds one after another on one worker (it keeps its compile servers across builds), each compared with a
    local build of the same sources; one cluster for the three, started once:
    - a project whose dodo.py imports its kernels' package (first, on a worker that has imported no tk): doit's
      master had run tk/__init__.py before it forked the hub, the local compile servers inherited it and recorded
      no read of it, where a Dask worker's import read it (meta.json and its seal differed);
    - a rebuild after an edit compiles the edit: the worker's servers had imported tk.scale in the first build,
      and compiled the second with it (the old binary, under a meta.json naming the edited file's digest);
    - a second project with the first's package name compiles its own: its targets were compiled in the servers
      that had imported the first's tk package."""
    dodo_local, dodo_remote = project(tmp_path, "dodo-local"), project(tmp_path, "dodo-remote")
    for root in (dodo_local, dodo_remote):
        (root / "tk" / "__init__.py").write_text("FACTOR = 2\n")
        (root / "dodo.py").write_text((root / "dodo.py").read_text() + "\nimport tk  # noqa: E402,F401\n")
    edited, first, second = project(tmp_path, "edited"), project(tmp_path, "first"), \
        project(tmp_path, "second", factor="3")
    (first / "tk" / "__init__.py").write_text("FIRST = 1\n")
    fresh = project(tmp_path, "fresh", factor="3")   # what edited becomes, and second is
    for root in (dodo_local, fresh):
        doit(root, "-n", "1")
    with own_cluster() as c:
        on(c, dodo_remote)
        on(c, edited)
        before = artifacts(edited)
        (edited / "tk" / "scale.py").write_text(kernel_text(factor="3"))
        on(c, edited)
        on(c, first)   # a package named tk other than second's, imported last before it
        on(c, second)
    meta = dodo_remote / "out" / "sm_90a" / "scale" / "fp16-b256-w4" / "meta.json"
    assert "tk/__init__.py" in dict(json.loads(meta.read_text())["inputs"])   # what the compile's import ran
    assert artifacts(dodo_remote) == artifacts(dodo_local) and len(artifacts(dodo_local)) == 8
    assert artifacts(edited) == artifacts(fresh) != before and len(before) == 8
    assert artifacts(second) == artifacts(fresh) and len(artifacts(fresh)) == 8


def test_a_worker_killed_mid_build_is_replaced_and_the_run_stays_green(cluster, tmp_path):
    address, client = cluster
    root = project(tmp_path, "killed", blocks=(64, 128, 256, 512, 1024))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-n", "4", "-P", "thread", f"executor={address}"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: list((root / "out").glob("*/scale/*/meta.json")), timeout_s=120)
    victim = sorted(client.run(os.getpid).values())[0]
    assert proc.poll() is None, "the build ended before a worker could be killed"
    done_before = len(list((root / "out").glob("*/scale/*/meta.json")))
    os.kill(victim, signal.SIGKILL)   # the nanny starts a new worker; Dask reruns what it was doing
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    assert set(build_report(root).values()) == {"built"} and len(build_report(root)) == 20 > done_before
    client.wait_for_workers(2, timeout=60)
    assert victim not in client.run(os.getpid).values()   # it really died and was replaced


def test_a_malformed_executor_is_a_clear_error(tmp_path):
    out = doit(project(tmp_path, "bad-executor"), "executor=tcp://host", check=False)
    assert out.returncode == 2 and "expected dask://HOST:PORT" in out.stderr


def test_the_scheduler_address_is_the_checked_setting_with_dasks_own_scheme():
    from kforge.share import dask_executor
    from kforge.base import settings
    assert dask_executor.scheduler_address(settings.SETTINGS["executor"].parse("dask://h:8786", "x")) == "tcp://h:8786"


def test_every_doit_worker_process_of_one_build_sends_one_build_id(tmp_path):
    """`doit -n 8 executor=dask://...` without -P thread: each doit worker process imported dask_executor itself and
    made a build id of its own, so one build was several on a worker, each with a hub of its own, evicting each
    other's. The id is made where the tasks are, in doit's process, before it forks its workers."""
    root = make_project(tmp_path / "p")
    script = ("import os, sys, json\n"
              "os.environ['KFORGE_EXECUTOR'] = 'dask://127.0.0.1:8786'\n"
              "from kforge.edge import dodo_tasks\n"
              "root = dodo_tasks.Path(sys.argv[1])\n"
              "list(dodo_tasks.compile_tasks(root, dodo_tasks.load_catalog(root)))\n"
              "r, w = os.pipe()\n"
              "if os.fork() == 0:\n"
              "    from kforge.share import dask_executor\n"
              "    os.write(w, dask_executor.BUILD.encode()); os._exit(0)\n"
              "os.wait()\n"
              "from kforge.share import dask_executor\n"
              "print(json.dumps([dask_executor.BUILD, os.read(r, 64).decode()]))\n")
    out = subprocess.run([sys.executable, "-c", script, str(root)], cwd=root, capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()[-1]
    parent, child = json.loads(out)
    assert parent == child and len(parent) == 32
