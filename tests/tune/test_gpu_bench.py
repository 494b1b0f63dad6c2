"""The tuner's CPU-checkable parts (the measuring itself runs on a GPU: tests/tune/test_gpu_bench_device.py)."""
import subprocess
import sys

from kforge.tune.gpu_bench import _hold_gpu


def test_one_tuning_at_a_time_per_gpu(tmp_path):
    held = _hold_gpu(tmp_path, 0)
    try_lock = ("import fcntl, sys; f = open(sys.argv[1], 'w')\n"
                "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)")
    lock_file = str(tmp_path / ".gpu0.lock")
    assert subprocess.run([sys.executable, "-c", try_lock, lock_file]).returncode == 3   # held: a second waits
    assert subprocess.run([sys.executable, "-c", try_lock, str(tmp_path / ".gpu1.lock")]).returncode == 0
    held.close()
    assert subprocess.run([sys.executable, "-c", try_lock, lock_file]).returncode == 0   # released


def test_a_config_is_timed_only_after_it_reproduced_torchs_result(monkeypatch):
    """The check-then-time step on CPU tensors (the GPU's sync and timing stubbed): a right result is timed,
    a wrong one and a failed launch are reasons, never times."""
    import types

    import torch

    from kforge.tune import gpu_bench as tuner
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(tuner, "copies_needed", lambda problem: 2)
    monkeypatch.setattr(tuner, "median_us", lambda launch, copies, give_up=None: (5.0, 7))
    harness = types.SimpleNamespace(problem=lambda shape, types, device: {
        "args": {"x": torch.arange(4.0)}, "output": torch.empty(4), "reference": lambda: torch.arange(4.0) * 2,
        "atol": 1e-3, "rtol": 1e-3})
    problems, expected = tuner.make_problems(harness, {"n": 4}, {}, "cpu")
    assert len(problems) == 2 and torch.equal(expected, torch.arange(4.0) * 2)

    def right(i):
        problems[i]["output"].copy_(problems[i]["args"]["x"] * 2)

    def wrong(i):
        problems[i]["output"].copy_(problems[i]["args"]["x"] * 3)

    def refused(i):
        raise RuntimeError("too many resources requested for launch")
    assert tuner.checked_time(right, problems, expected) == (5.0, 7)
    assert tuner.checked_time(wrong, problems, expected).startswith("wrong result: max abs error 3")
    assert tuner.checked_time(refused, problems, expected) == "launch failed: too many resources requested for launch"


def test_a_config_the_cpu_was_too_busy_to_time_is_timed_again_and_then_listed_never_failing_the_run(monkeypatch):
    from kforge.tune import gpu_bench as tune_gpu
    monkeypatch.setattr(tune_gpu.time, "sleep", lambda s: None)
    tries = []

    def settles_on_third_try():
        tries.append(1)
        if len(tries) < 3:
            raise tune_gpu.TimingUnsettled("the GPU woke early")
        return (4.0, 9)
    assert tune_gpu._settled(settles_on_third_try) == (4.0, 9) and len(tries) == 3

    def never_settles():
        raise tune_gpu.TimingUnsettled("the GPU woke early")
    assert tune_gpu._settled(never_settles) == "not timed: the GPU woke early"


def test_finished_rankings_are_kept_for_a_rerun_of_the_same_tuning_only(tmp_path):
    from kforge.tune import gpu_bench as tune_gpu
    from kforge.base.layout import Layout
    path = tune_gpu.progress_path(Layout.of(tmp_path).tuning_table("sm_90a", "gemm"))
    path.parent.mkdir(parents=True)
    sid = tune_gpu.shape_id({"M": 1, "N": 2}, {"dtype": "bf16"})
    tune_gpu.save_progress(path, "key-1", {sid: {"ranking": [{"config_id": "a", "us": 1.0}]}})
    assert tune_gpu.load_progress(path, "key-1") == {sid: {"ranking": [{"config_id": "a", "us": 1.0}]}}
    assert tune_gpu.load_progress(path, "key-2") == {}   # another tuning (a rebuilt binary, another GPU)
    path.write_text("{garbage")
    assert tune_gpu.load_progress(path, "key-1") == {}
