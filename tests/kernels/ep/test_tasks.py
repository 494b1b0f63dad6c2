"""The verify sweep's doit task: its arguments and where it writes, checked before any rank starts."""
from doit.exceptions import TaskError

from kernels.ep import tasks


def _action(world=None, gpus=None):
    task = tasks.task_verify_dispatch_combine()
    run, _ = task["actions"][0]
    return run(world, gpus)


def test_a_report_folder_behind_a_link_that_leads_outside_out_is_refused(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "verify").symlink_to(elsewhere)
    monkeypatch.setattr(tasks, "ROOT", tmp_path)
    result = _action("2")
    assert isinstance(result, TaskError) and "leads outside out/" in str(result)
    assert list(elsewhere.iterdir()) == []


def test_a_world_or_gpus_that_is_not_a_number_is_one_line():
    result = _action("eight")
    assert isinstance(result, TaskError) and "world='eight' is not a whole number" in str(result)
    assert "gpus='x'" in str(_action("2", "x"))
