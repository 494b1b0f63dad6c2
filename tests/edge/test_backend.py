"""rules/edge/backend.py: kforge's doit backend reads doit's sqlite3 file as doit wrote it, in one query; a
damaged file and a full disk are one line each; removals are listed for `doit forget`."""
import sqlite3

from doit.dependency import Dependency, JSONCodec, SqliteDB

from kforge.edge.backend import KforgeSqliteDB


def test_the_dependency_file_is_read_in_one_query_and_forgotten_rows_stay_forgotten(tmp_path):
    path = str(tmp_path / "deps.sqlite3")
    db = KforgeSqliteDB(path, JSONCodec())
    for task in ("a", "b", "c"):
        db.set(task, "_values_:", {"task": task})
    db.dump()

    db = KforgeSqliteDB(path, JSONCodec())
    queries = []
    db._conn.set_trace_callback(queries.append)
    assert db.get("a", "_values_:") == {"task": "a"}
    db.remove("b")               # `doit forget b`: the row read ahead must not come back
    assert db.get("b", "_values_:") is None
    assert db.get("c", "_values_:") == {"task": "c"}
    assert db.get("absent", "_values_:") is None
    assert sum(q.lstrip().lower().startswith("select") for q in queries) == 0   # all read in one, when opened
    assert db.removed == ["b"]
    db.dump()
    fresh = KforgeSqliteDB(path, JSONCodec())
    assert fresh.get("b", "_values_:") is None   # removed for good
    assert fresh.get("a", "_values_:") == {"task": "a"}   # the rest read ahead, not yet looked at
    fresh.remove_all()           # `doit forget --all`
    assert fresh.get("c", "_values_:") is None


def test_a_file_written_by_doits_own_sqlite3_backend_is_read_as_it_is_and_stays_readable_by_it(tmp_path):
    """Upgrading: the file an older kforge (doit's SqliteDB, patched in place) left in out/ is the same format."""
    path = str(tmp_path / "deps.sqlite3")
    old = SqliteDB(path, JSONCodec())
    old.set("scale:b64@sm_90a", "checker:", "MD5Checker")
    old.set("scale:b64@sm_90a", "_values_:", {"key": "k1"})
    old.dump()
    db = KforgeSqliteDB(path, JSONCodec())
    assert db.get("scale:b64@sm_90a", "_values_:") == {"key": "k1"}
    assert db.get("scale:b64@sm_90a", "checker:") == "MD5Checker"
    db.set("package:sm_90a", "_values_:", {"wheel": "w"})
    db.dump()
    back = SqliteDB(path, JSONCodec())   # and the other way: a downgrade reads it too
    assert back.get("package:sm_90a", "_values_:") == {"wheel": "w"}
    assert back.get("scale:b64@sm_90a", "_values_:") == {"key": "k1"}
    with sqlite3.connect(path) as conn:   # doit's one table: (name, type, not null, primary key) per column
        assert [row[1:4] + row[5:] for row in conn.execute("pragma table_info(doit)")] == [
            ("task_id", "TEXT", 1, 1), ("task_data", "json", 0, 0)]
        assert conn.execute("select name from sqlite_master").fetchall() == [("doit",), ("sqlite_autoindex_doit_1",)]


def test_doits_dependency_manager_reaches_the_backends_remove(tmp_path):
    """Forget lists what doit removed through dep_manager.remove: doit binds it to the backend's own."""
    deps = Dependency(KforgeSqliteDB, str(tmp_path / "deps.sqlite3"))
    deps.remove("a")
    deps.remove_all()
    assert deps.backend.removed == ["a"]
    deps.close()


def test_a_damaged_dependency_file_is_moved_aside_with_one_line_and_started_afresh(tmp_path, capsys):
    path = tmp_path / "deps.sqlite3"
    db = KforgeSqliteDB(str(path), JSONCodec())
    for task in range(200):
        db.set(str(task), "_values_:", {"x": "y" * 100})
    db.dump()
    data = path.read_bytes()
    for damaged in (data[:3000], b"garbage\n"):   # a truncated copy, a file that is no database
        path.write_bytes(damaged)
        fresh = KforgeSqliteDB(str(path), JSONCodec())
        assert fresh.get("1", "_values_:") is None
        assert (tmp_path / "deps.sqlite3.damaged").read_bytes() == damaged
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is damaged" in err and "nothing built is lost" in err
        fresh.set("a", "_values_:", {"ok": 1})
        fresh.dump()
        assert KforgeSqliteDB(str(path), JSONCodec()).get("a", "_values_:") == {"ok": 1}


def test_doits_state_not_saved_on_a_full_disk_is_one_line_not_a_traceback(tmp_path, capsys):
    """sqlite3's "database or disk is full" at the end of a run: one line, the file as the last run left it."""
    path = str(tmp_path / "deps.sqlite3")
    db = KforgeSqliteDB(path, JSONCodec())
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
    db = KforgeSqliteDB(path, JSONCodec())
    db._conn = FullDisk(db._conn)
    db.set("b", "_values_:", {"task": "b"})
    db.dump()   # no exception
    said = capsys.readouterr().err
    assert said == (f"kforge: {path}: doit's state was not saved (database or disk is full); nothing built is "
                    f"lost: the next run checks every target by its meta.json\n")
    again = KforgeSqliteDB(path, JSONCodec())
    assert again.get("a", "_values_:") == {"task": "a"} and again.get("b", "_values_:") is None


def test_what_the_backend_overrides_is_what_doits_sqlite3_backend_calls():
    """doit 0.37.0's SqliteDB.get reads a task's row through _get_task_data, and its constructor takes
    (name, codec, *, module_name): a doit that moved either would fail here, not in a build."""
    import inspect
    assert "_get_task_data" in SqliteDB.get.__code__.co_names
    assert list(inspect.signature(SqliteDB.__init__).parameters) == ["self", "name", "codec", "module_name"]
    for method in ("_get_task_data", "remove", "remove_all", "dump"):
        assert method in vars(SqliteDB), method


def test_a_row_that_is_not_a_json_object_is_dropped_with_one_warning(tmp_path, capsys):
    """A row of another shape (`[1, 2]`, text that is not JSON: another tool's file, a hand edit) was an
    AttributeError or JSONDecodeError traceback in every command that looked at its task."""
    path = str(tmp_path / "deps.sqlite3")
    SqliteDB(path, JSONCodec()).dump()   # doit's table
    with sqlite3.connect(path) as conn:
        conn.executemany("insert into doit values (?, ?)", [("a", "[1, 2]"), ("b", "not json"), ("c", "[" * 100_000),
                                                            ("d", '{"checker:": "MD5Checker"}')])
    db = KforgeSqliteDB(path, JSONCodec())
    assert [db.get(task, "checker:") for task in "abcd"] == [None, None, None, "MD5Checker"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kforge: {path}: the row of 'a' is not doit's"), err
