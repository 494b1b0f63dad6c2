"""out/build-trace.json: a run's timeline in the Chrome trace event format (Perfetto and chrome://tracing
open it as it is), one row per doit worker process.

Each compile target is a slice per phase: "queue" (from when doit handed it out to when its worker began it),
then what its action reports (rules/compile/action.py): "local cache lookup", "cache lookup", "start" (a worker's
import of the toolchain, a compile server's set-up: the first target of each), "import" (a compile server's one
import of the kernel's package or module: its first target), "compile", "check", "write", "local cache store",
"cache upload", "wait" (a request to the build's hub queued behind others': the imports they asked for), then
"return" (from the action's end to doit's master taking its result in: a master that cannot keep up with its
workers shows there). The run's own time before its first target is on the row "doit": "load" (doit's start, the
catalog and its probes), "up-to-date" (the first up-to-date checks). A target
whose action failed, a package task and any other task (a tuning, a verify sweep) is one slice of the time
doit saw it take, on a row of its own (failed, package, tune, ...).
Times are the wall clock (time.time(), the same in every process on the machine), in microseconds from the
run's start (its process's).
"""
from __future__ import annotations

import json
from pathlib import Path

from kforge.store.files import write_inside


class Trace:
    def __init__(self, started: float):
        self.started = started     # time.time() at the start of the run
        self.slices: list[dict] = []
        self.rows: dict[str, int] = {}   # row name -> tid, in order of first use

    def _row(self, name: str) -> int:
        return self.rows.setdefault(name, len(self.rows) + 1)

    def _slice(self, row: str, name: str, phase: str, start: float, end: float, args: dict) -> None:
        self.slices.append({"name": name, "cat": phase, "ph": "X", "pid": 1, "tid": self._row(row),
                            "ts": round((start - self.started) * 1e6), "dur": max(round((end - start) * 1e6), 1),
                            "args": {"phase": phase, **args}})

    def target(self, name: str, family: str, handed: float, finished: float, result) -> None:
        """A compile target that ran (its artifact.CompileResult): its queue time, then its action's spans, on its
        worker's row."""
        spans, worker = result.spans, result.worker
        row = f"worker {worker}" if worker else "targets"
        args = {"target": name, "family": family,
                **{k: True for k in ("from_cache", "from_local_cache") if getattr(result, k)}}
        if not spans:   # an action that reported no phases: the time doit saw it take
            self._slice(row, name, "run", handed, finished, args)
            return
        if spans[0][1] > handed:
            self._slice(row, name, "queue", handed, spans[0][1], args)
        for phase, start, end in spans:
            self._slice(row, name, phase, start, end, args)
        if finished > spans[-1][2]:   # the result on its way to doit's master, and waiting for it to take it in
            self._slice(row, name, "return", spans[-1][2], finished, args)

    def totals(self) -> dict[str, float]:
        """Seconds per phase over the run's compile targets (queue, import, compile, cache lookups, ...)."""
        found: dict[str, float] = {}
        for e in self.slices:
            if "target" in e["args"] and e["cat"] not in ("failed", "package"):
                found[e["cat"]] = found.get(e["cat"], 0.0) + e["dur"] / 1e6
        return found

    def task(self, row: str, name: str, phase: str, handed: float, finished: float, family: str = "") -> None:
        """A task seen only from doit's side (a failed compile, a package): one slice on `row`."""
        self._slice(row, name, phase, handed, finished, {"target": name, "family": family})

    def run_phase(self, phase: str, start: float, end: float) -> None:
        """A phase of the run itself, before any target ran (doit's start and the catalog, up-to-date checks):
        a slice on the row "doit", counted in no target's totals."""
        self._slice("doit", phase, phase, start, end, {})

    def write(self, path: Path) -> None:
        names = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": row}}
                 for row, tid in self.rows.items()]
        process = {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "kforge build"}}
        events = [process, *names, *sorted(self.slices, key=lambda e: (e["tid"], e["ts"]))]
        write_inside(path.parent, path,   # out/build-trace.json
                     json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":")).encode())
