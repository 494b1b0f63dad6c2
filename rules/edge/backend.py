"""kforge's dependency file for doit: doit's own sqlite3 backend (same file, table and rows), registered as NAME in
pyproject.toml's [project.entry-points."doit.BACKEND"]. It reads the file in one query, not one per task (~30 ms of
a 1,152-target no-op run); moves a damaged file aside (each artifact's key is in its meta.json); says a failed
final write in one line; and lists the tasks removed, for `doit forget`. doit imports it in every command of any
project where kforge is installed: it imports nothing beyond doit and sqlite3.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import sys

from doit.dependency import DatabaseException, SqliteDB

NAME = "kforge-sqlite"   # as pyproject.toml registers it; DOIT_CONFIG["backend"] names it

_READ_ALL = "select task_id, cast(task_data as text) as data from doit"   # text: no JSON converter runs on it


class KforgeSqliteDB(SqliteDB):
    desc = "doit's sqlite3 file, read in one query; a damaged file is moved aside (kforge)"

    def __init__(self, name, codec, **kwargs):
        self.removed: list[str] = []   # task names removed from the file, in order (Forget reads it)
        self._warned = False   # a row of another shape said once
        try:
            super().__init__(name, codec, **kwargs)
            self._rows = {r["task_id"]: r["data"] for r in self._conn.execute(_READ_ALL)}
        except (sqlite3.DatabaseError, DatabaseException) as e:
            aside = f"{name}.damaged"
            os.replace(name, aside)
            sys.stderr.write(f"kforge: {name} is damaged ({str(e).splitlines()[0]}); moved to {aside} and "
                             f"started afresh: nothing built is lost (each artifact's key is in its meta.json)\n")
            super().__init__(name, codec, **kwargs)
            self._rows = {}

    def _get_task_data(self, task_id):
        """A task's row, read when the file was opened, decoded now. One that is not a JSON object (another tool's,
        a hand edit) is dropped with one warning for the file: the task is checked afresh, by its meta.json."""
        data = self._rows.pop(task_id, None)
        if data is None:
            return {}
        try:
            decoded = self.codec.decode(data)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            return decoded
        if not self._warned:
            self._warned = True
            sys.stderr.write(f"kforge: {self.name}: the row of {task_id!r} is not doit's (not a JSON object); dropped, "
                             f"with any other such row: those tasks are checked afresh\n")
        return {}

    def remove(self, task_id):
        self._rows.pop(task_id, None)   # a row read ahead must not come back
        self.removed.append(task_id)
        super().remove(task_id)

    def remove_all(self):
        self._rows = {}   # the table is empty now
        super().remove_all()

    def dump(self):
        """At the end of a run; a failed commit is rolled back (the next run checks every target by its meta.json)."""
        try:
            super().dump()
        except (sqlite3.Error, OSError) as e:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            sys.stderr.write(f"kforge: {self.name}: doit's state was not saved ({str(e).splitlines()[0]}); nothing "
                             f"built is lost: the next run checks every target by its meta.json\n")
