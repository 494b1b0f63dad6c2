"""rules/doit_edge.py: the changes kforge makes to how doit runs that are not the runner's (test_doit_runner.py)."""
import gc

from doit.dependency import JSONCodec, SqliteDB

from kforge import doit_edge


def test_the_dependency_file_is_read_in_one_query_and_forgotten_rows_stay_forgotten(tmp_path):
    doit_edge._read_dependency_file_at_once()
    path = str(tmp_path / "deps.sqlite3")
    db = SqliteDB(path, JSONCodec())
    for task in ("a", "b", "c"):
        db.set(task, "_values_:", {"task": task})
    db.dump()

    db = SqliteDB(path, JSONCodec())
    queries = []
    db._conn.set_trace_callback(queries.append)
    assert db.get("a", "_values_:") == {"task": "a"}
    db.remove("b")               # `doit forget b`: the row read ahead must not come back
    assert db.get("b", "_values_:") is None
    assert db.get("c", "_values_:") == {"task": "c"}
    assert db.get("absent", "_values_:") is None
    assert sum(q.lstrip().lower().startswith("select") for q in queries) == 0   # all read in one, when opened
    db.dump()
    fresh = SqliteDB(path, JSONCodec())
    assert fresh.get("b", "_values_:") is None   # removed for good
    assert fresh.get("a", "_values_:") == {"task": "a"}   # the rest read ahead, not yet looked at
    fresh.remove_all()           # `doit forget --all`
    assert fresh.get("c", "_values_:") is None


def test_a_damaged_dependency_file_is_moved_aside_with_one_line_and_started_afresh(tmp_path, capsys):
    doit_edge._read_dependency_file_at_once()
    path = tmp_path / "deps.sqlite3"
    db = SqliteDB(str(path), JSONCodec())
    for task in range(200):
        db.set(str(task), "_values_:", {"x": "y" * 100})
    db.dump()
    data = path.read_bytes()
    for damaged in (data[:3000], b"garbage\n"):   # a truncated copy, a file that is no database
        path.write_bytes(damaged)
        fresh = SqliteDB(str(path), JSONCodec())
        assert fresh.get("1", "_values_:") is None
        assert (tmp_path / "deps.sqlite3.damaged").read_bytes() == damaged
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is damaged" in err and "nothing built is lost" in err
        fresh.set("a", "_values_:", {"ok": 1})
        fresh.dump()
        assert SqliteDB(str(path), JSONCodec()).get("a", "_values_:") == {"ok": 1}


def test_the_dependency_file_wrapper_is_installed_once():
    doit_edge._read_dependency_file_at_once()
    first = SqliteDB._get_task_data
    doit_edge._read_dependency_file_at_once()
    assert SqliteDB._get_task_data is first


def test_garbage_collection_pauses_while_tasks_load_and_resumes_before_the_first_runs():
    assert gc.isenabled()
    try:
        doit_edge.pause_gc_until_tasks_run()
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]   # what the task graph would be
        doit_edge._resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    finally:
        gc.enable()
        gc.unfreeze()


def test_doits_state_not_saved_on_a_full_disk_is_one_line_not_a_traceback(tmp_path, capsys):
    """sqlite3's "database or disk is full" at the end of a run: one line, the file as the last run left it."""
    import sqlite3
    doit_edge._save_state_when_space_allows()
    path = str(tmp_path / "deps.sqlite3")
    db = SqliteDB(path, JSONCodec())
    db.set("a", "_values_:", {"task": "a"})
    db.dump()

    class FullDisk:   # what sqlite3 does when the disk fills during the commit
        def __init__(self, conn):
            self.conn = conn

        def execute(self, *args):
            return self.conn.execute(*args)

        def commit(self):
            raise sqlite3.OperationalError("database or disk is full")

        def close(self):
            self.conn.close()
    db = SqliteDB(path, JSONCodec())
    db._conn = FullDisk(db._conn)
    db.set("b", "_values_:", {"task": "b"})
    db.dump()   # no exception
    said = capsys.readouterr().err
    assert said == (f"kforge: {path}: doit's state was not saved (database or disk is full); nothing built is "
                    f"lost: the next run checks every target by its meta.json\n")
    again = SqliteDB(path, JSONCodec())
    assert again.get("a", "_values_:") == {"task": "a"} and again.get("b", "_values_:") is None
