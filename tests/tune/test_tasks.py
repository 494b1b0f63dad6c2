"""`doit tune`'s CPU side: which tasks exist, when a table is current (its key), and the errors without a GPU.
The benchmark itself runs on a GPU (tests/tune/test_gpu_bench_device.py)."""
import json
import os

import pytest

from kforge.base.layout import Layout
from kforge.tune import tasks as tune
from kforge.plan.catalog import Family
from kforge.declare.spec import load_spec
from kforge.plan.targets import spec_targets
from tests.support import built_once, copy_built, doit, kernel_text, make_project, spec_text

TUNE = '\n[tune]\nharness = "tk/scale_tune.py"\nshape_args = ["n"]\nshapes = [[1000], [1000000]]\n'
HARNESS = "def problem(shape, types, device):\n    pass\n\n\ndef grid(shape, config):\n    return (1,)\n"
H100 = {"vendor": "nvidia", "name": "NVIDIA H100 80GB HBM3", "archs": ["sm_90a", "sm_90"], "driver": "580.159.04"}


def _build_tuned(root):
    make_project(root, specs={"scale": spec_text(archs=("sm_90a", "gfx942"), blocks=(256, 1024)) + TUNE},
                 kernels={"scale": kernel_text(), "scale_tune": HARNESS})
    doit(root, "scale")


@pytest.fixture
def project(tmp_path_factory, tmp_path):
    """The tuned family built once for the run; each test changes a copy of it."""
    return copy_built(built_once(tmp_path_factory, "tune-two-archs", _build_tuned), tmp_path / "p")


def key(root, gpu=H100, arch="sm_90a"):
    spec = load_spec(root / "specs" / "scale.toml", root)
    return tune.tuning_key(spec, arch, spec_targets(spec, root, (arch,)), root, gpu)


def test_the_key_changes_with_the_artifacts_the_shapes_and_the_gpu(project):
    first = key(project)
    assert key(project) == first
    for f in (project / "specs" / "scale.toml", project / "tk" / "scale.py", project / "tk" / "scale_tune.py"):
        os.utime(f, (1, 1))   # touched: nothing changed
    assert key(project) == first
    assert key(project, {**H100, "driver": "590.1"}) != first
    assert key(project, {**H100, "name": "NVIDIA H200"}) != first
    spec_file = project / "specs" / "scale.toml"
    spec_file.write_text(spec_file.read_text().replace("[[1000], [1000000]]", "[[1000], [2000000]]"))
    assert key(project) != first
    spec_file.write_text(spec_file.read_text().replace("[[1000], [2000000]]", "[[1000], [1000000]]"))
    assert key(project) == first
    (project / "tk" / "scale_tune.py").write_text(HARNESS + "# a changed harness\n")
    assert key(project) != first


def test_a_rebuilt_binary_retunes_only_when_its_bytes_change(project):
    first = key(project)
    (project / "tk" / "scale.py").write_text(kernel_text() + "\n# a comment: same binary, new key\n")
    doit(project, "scale")
    assert key(project) == first
    (project / "tk" / "scale.py").write_text(kernel_text(factor="3"))
    doit(project, "scale")
    assert key(project) != first


def test_a_table_with_the_current_key_is_up_to_date(project, monkeypatch):
    monkeypatch.setattr(tune, "gpu_identity", lambda root: H100)
    spec = load_spec(project / "specs" / "scale.toml", project)
    targets = spec_targets(spec, project, ("sm_90a",))
    path = Layout.of(project).tuning_table("sm_90a", "scale")
    assert not tune.is_current(spec.path, "sm_90a", targets, str(project))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key(project)}))
    assert tune.is_current(spec.path, "sm_90a", targets, str(project))
    monkeypatch.setattr(tune, "gpu_identity", lambda root: {**H100, "name": "NVIDIA H200"})
    assert not tune.is_current(spec.path, "sm_90a", targets, str(project))


def test_tasks_only_for_the_local_gpus_vendor_and_never_by_default(project, monkeypatch):
    spec = load_spec(project / "specs" / "scale.toml", project)
    targets = spec_targets(spec, project, None)
    family = Family(spec.name, spec.description, spec.path, tuned=True)
    names = lambda: [t["name"] for t in tune.tune_tasks([family], targets, str(project)) if t["name"]]
    monkeypatch.setattr(tune, "local_vendors", lambda: {"nvidia"})
    assert names() == ["scale@sm_90a"]
    monkeypatch.setattr(tune, "local_vendors", lambda: {"amd"})
    assert names() == ["scale@gfx942"]
    monkeypatch.setattr(tune, "local_vendors", lambda: set())   # no GPU: every arch, each failing clearly
    assert names() == ["scale@gfx942", "scale@sm_90a"]
    listed = doit(project, "list").stdout
    assert "tune " in listed
    out = doit(project, check=False)
    assert "tune:" not in out.stdout + out.stderr   # `doit` alone builds and packages; it never tunes


def test_tuning_where_the_gpu_cannot_run_the_arch_fails_clearly(project, monkeypatch):
    spec = load_spec(project / "specs" / "scale.toml", project)
    targets = spec_targets(spec, project, ("gfx942",))
    monkeypatch.setattr(tune, "gpu_identity", lambda root: H100)
    failed = tune.run_tuning(spec.path, "gfx942", targets, str(project))
    assert "tune:scale@gfx942: this GPU is NVIDIA H100 80GB HBM3 (runs sm_90a, sm_90)" in str(failed)
    assert "`doit tune archs=sm_90a`" in str(failed)


def test_doit_tune_without_a_gpu_names_the_task_and_keeps_the_build(project):
    if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
        pytest.skip("this machine has a GPU")
    out = doit(project, "tune", "archs=sm_90a", check=False)
    assert out.returncode != 0
    assert "tune:scale@sm_90a: kforge: no GPU here" in out.stdout + out.stderr
    assert not Layout.of(project).tuning_table("sm_90a", "scale").exists()
    assert "up to date 2" in out.stdout + out.stderr   # its compile deps ran (and were current)
