"""rules/store/files.py: kforge's own files in out/ are replaced whole, by rename."""
from kforge.store.files import JsonState, atomic_write


def test_a_directory_where_kforges_file_belongs_is_replaced_by_the_file(tmp_path):
    """A damaged out/ (out/.kforge/catalog.json made a directory) never stops a build with a traceback."""
    path = tmp_path / "out" / ".kforge" / "built-keys.json"
    (path / "inside").mkdir(parents=True)
    state = JsonState(path)
    assert state.entries == {}   # unreadable: empty
    state.entries["x"], state.changed = 1, True
    state.save()
    assert path.is_file() and JsonState(path).entries == {"x": 1}


def test_an_interrupted_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    import kforge.store.files as files
    path = tmp_path / "report.json"
    atomic_write(path, b"old")

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(files.os, "replace", interrupted)
    try:
        atomic_write(path, b"new")
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]
