"""How many compiles run at once: CPUs from the affinity mask and cgroup quotas, the knob, and the cap in a build."""
import os

import pytest

from kforge.base import cpus
from tests.support import doit, make_project, spec_text


def _cgroup(tmp_path, proc_line, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "self_cgroup").write_text(proc_line)
    return cpus.cgroup_quota(tmp_path / "fs", tmp_path / "self_cgroup")


def test_cgroup_v2_quota_rounds_up_and_a_parent_binds_too(tmp_path):
    assert _cgroup(tmp_path, "0::/ci/job\n", {"fs/ci/job/cpu.max": "150000 100000\n",
                                              "fs/ci/cpu.max": "max 100000\n"}) == 2
    assert _cgroup(tmp_path, "0::/ci/job\n", {"fs/ci/job/cpu.max": "max 100000\n",
                                              "fs/ci/cpu.max": "100000 100000\n"}) == 1


def test_cgroup_v1_quota_and_no_quota(tmp_path):
    assert _cgroup(tmp_path, "4:cpu,cpuacct:/docker/x\n", {"fs/cpu,cpuacct/docker/x/cpu.cfs_quota_us": "300000\n",
                                                           "fs/cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}) == 3
    assert _cgroup(tmp_path, "1:cpu:/\n", {"fs/cpu/cpu.cfs_quota_us": "-1\n", "fs/cpu/cpu.cfs_period_us": "100000\n"}) is None
    assert cpus.cgroup_quota(tmp_path / "none", tmp_path / "missing") is None


def test_available_respects_the_affinity_mask():
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert cpus.available() == 1
    finally:
        os.sched_setaffinity(0, mask)


def test_the_knob_sets_the_cap_and_a_bad_value_names_where_it_came_from(monkeypatch):
    from doit import doit_cmd
    from kforge.base import settings
    monkeypatch.delenv(cpus.ENV, raising=False)
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {})
    assert settings.get("max_compiles") == cpus.available() and settings.source("max_compiles") is None
    monkeypatch.setenv(cpus.ENV, "5")
    assert settings.get("max_compiles") == 5 and settings.source("max_compiles") == "KFORGE_MAX_COMPILES=5"
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"max_compiles": "3"})
    assert settings.get("max_compiles") == 3 and settings.source("max_compiles") == "max_compiles=3"   # wins
    for bad in ("0", "x", "-1"):
        monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"max_compiles": bad})
        with pytest.raises(ValueError, match=r"max_compiles= on the command line: got"):
            settings.get("max_compiles")


# Each compile server appends its doit worker's pid (its parent) when it imports the kernel module.
COUNTING_KERNEL = "import os\nwith open({log!r}, 'a') as f:\n    f.write(f'{{os.getppid()}}\\n')\n"


def test_n_above_the_cap_runs_no_more_workers_than_the_cap(tmp_path):
    from tests.support import kernel_text
    log = tmp_path / "workers.log"
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(64, 128, 256, 512))},
                        kernels={"scale": COUNTING_KERNEL.format(log=str(log)) + kernel_text()})
    proc = doit(root, "-n", "8", "max_compiles=1")
    assert "kforge: -n 8 is more than max_compiles=1: at most 1 task runs at once" in proc.stderr
    assert "4 targets selected" in proc.stdout
    assert len(set(log.read_text().split())) == 1   # one worker compiled all four
    bad = doit(root, "-n", "2", "max_compiles=many", check=False)
    assert bad.returncode == 2 and "max_compiles= on the command line: got 'many'" in bad.stderr


def test_a_plain_doit_uses_every_available_cpu(tmp_path):
    root = make_project(tmp_path / "p", specs={"scale": spec_text(blocks=(64, 128, 256, 512))})
    (root / "dodo_probe.py").write_text("from dodo import *\nprint('NUM_PROCESS', DOIT_CONFIG['num_process'])\n")
    out = doit(root, "-f", "dodo_probe.py", "list").stdout
    assert f"NUM_PROCESS {cpus.available()}" in out
