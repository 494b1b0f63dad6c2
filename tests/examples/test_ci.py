"""examples/ci: the recipe's shell steps run in order in a temporary checkout (restore, build, save, edit one
kernel, restore, build): the second build compiles exactly the edited kernel's targets. Also rules/ci_summary.py.
(The runner's cache restore and save are a tar of out/, as actions/cache and GitLab's cache make them.)"""
import json
import os
import shutil
import subprocess
import sys
import tarfile

from kforge import ci_summary
from tests.support import REPO, kernel_text, make_project, spec_text


def step(project, name, **env):
    full = dict(os.environ, PYTHON=sys.executable, **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), full.get("PYTHONPATH"))))
    full.pop("KFORGE_CACHE", None)
    return subprocess.run(["bash", str(REPO / "examples" / "ci" / "kforge-ci.sh"), name], cwd=project, env=full,
                          capture_output=True, text=True, timeout=600)


def save(project, cache):
    with tarfile.open(cache, "w") as tar:
        tar.add(project / "out", arcname="out")


def restore(project, cache):
    shutil.rmtree(project / "out", ignore_errors=True)
    with tarfile.open(cache) as tar:
        tar.extractall(project, filter="tar")


def test_the_second_build_compiles_exactly_the_edited_kernels_targets(tmp_path):
    project = make_project(tmp_path / "checkout", specs={"scale": spec_text(blocks=(128, 256)),
                                                         "twice": spec_text(name="twice", module="twice")},
                           kernels={"scale": kernel_text(), "twice": kernel_text("3")})
    cache = tmp_path / "runner-cache.tar"
    first = step(project, "build")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    save(project, cache)
    (project / "tk" / "twice.py").write_text(kernel_text("4"))   # the pull request edits one kernel
    shutil.rmtree(project / "out")                                 # a fresh runner...
    restore(project, cache)                                        # ...restores the last out/
    second = step(project, "build")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    report = json.loads((project / "out" / "build-report.json").read_text())
    built = sorted(t["name"] for t in report["tasks"] if t["status"] == "built")
    assert built and all(name.startswith("twice:") for name in built)
    assert len(built) == sum(1 for t in report["tasks"] if t["name"].startswith("twice:"))
    assert report["counts"]["up-to-date"] == sum(1 for t in report["tasks"] if t["name"].startswith("scale:")) == 2
    summary = step(project, "summary")
    assert summary.returncode == 0 and f"**{len(built)} built, 2 up to date, 0 failed**" in summary.stdout
    assert (project / "out" / "build-trace.json").exists()   # what the recipe uploads


def test_a_failed_target_fails_the_build_step_and_the_summary_names_it(tmp_path):
    project = make_project(tmp_path / "checkout", kernels={"scale": kernel_text("undefined_name")})
    assert step(project, "build").returncode != 0
    summary = step(project, "summary").stdout
    assert "0 built" in summary and "failed with" in summary and "undefined_name" in summary


def test_the_summary_of_no_report_says_the_build_did_not_run(tmp_path, capsys):
    assert ci_summary.main([str(tmp_path / "none.json")]) == 0
    assert "the build did not get to run" in capsys.readouterr().out


def test_an_unknown_step_is_a_usage_error(tmp_path):
    done = step(tmp_path, "deploy")
    assert done.returncode == 2 and "usage: bash examples/ci/kforge-ci.sh install | build | summary" in done.stderr
