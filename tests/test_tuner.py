"""The tuner's CPU-checkable parts (the measuring itself runs on a GPU: tests/test_tuner_gpu.py)."""
import subprocess
import sys

from rules.tuner import _hold_gpu


def test_one_tuning_at_a_time_per_gpu(tmp_path):
    held = _hold_gpu(tmp_path, 0)
    try_lock = ("import fcntl, sys; f = open(sys.argv[1], 'w')\n"
                "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)")
    lock_file = str(tmp_path / ".gpu0.lock")
    assert subprocess.run([sys.executable, "-c", try_lock, lock_file]).returncode == 3   # held: a second waits
    assert subprocess.run([sys.executable, "-c", try_lock, str(tmp_path / ".gpu1.lock")]).returncode == 0
    held.close()
    assert subprocess.run([sys.executable, "-c", try_lock, lock_file]).returncode == 0   # released
