"""Scratch files (rules/store/scratch.py): under out/.kforge/tmp, named after their run, gone with it."""
import os
import subprocess
import sys
import tempfile

from kforge.store import scratch
from kforge.base.layout import Layout


def test_a_folder_is_made_under_out_kforge_tmp_named_after_the_run(tmp_path):
    folder = scratch.folder(Layout(tmp_path), "sm_90a-scale")
    assert os.path.dirname(folder) == str(Layout(tmp_path).scratch)
    assert os.path.basename(folder).startswith(f"{os.getpid()}-sm_90a-scale-")


def test_a_sweep_removes_what_dead_runs_left_and_keeps_live_ones(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    root = Layout(tmp_path).scratch
    for name in (f"{dead.stdout.strip()}-gfx942-k-abc", f"{os.getpid()}-gfx942-k-def", "gfx942-k-from-an-old-kforge"):
        (root / name).mkdir(parents=True)
        (root / name / "tmp1234.ptx").write_text("left by a killed compile")
    (root / f"{dead.stdout.strip()}-x.log").write_text("a file, too")
    scratch.sweep(Layout(tmp_path))
    assert [p.name for p in root.iterdir()] == [f"{os.getpid()}-gfx942-k-def"]
    scratch.sweep(Layout(tmp_path), os.getpid())   # this run's own, at its end
    assert list(root.iterdir()) == []


def test_as_tmpdir_points_python_and_the_tools_it_starts_there_for_the_block_only(tmp_path):
    before = (os.environ.get("TMPDIR"), tempfile.gettempdir())
    with scratch.as_tmpdir(str(tmp_path)):
        assert tempfile.gettempdir() == str(tmp_path)
        assert subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                              capture_output=True, text=True).stdout.strip() == str(tmp_path)
    assert (os.environ.get("TMPDIR"), tempfile.gettempdir()) == before
