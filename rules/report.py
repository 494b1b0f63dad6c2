"""Progress lines, the end-of-run summary, and out/build-report.json (a doit reporter)."""
from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
import time
from pathlib import Path

from doit.reporter import ConsoleReporter

from rules.artifact import atomic_write
from rules.doit_commands import tasks_to_run

ERROR_LINES = 6
REPORTED_VALUES = ("from_cache", "compiled_on", "compile_seconds")   # copied from a result into its record


class BuildReporter(ConsoleReporter):
    """One line per finished task ([done/total], failures so far); up-to-date tasks are only counted."""
    desc = "kforge progress and summary"
    report_path = "out/build-report.json"   # set per project by rules.project.doit_config()

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.started_at = time.monotonic()
        self.total = 0
        self.records: dict[str, dict] = {}    # compile targets
        self.packages: dict[str, dict] = {}   # `doit package` bundles, reported apart from the targets
        self.warnings: list[str] = []         # e.g. from the remote cache, each shown once
        self.begun: dict[str, float] = {}
        self.failed = 0

    def initialize(self, tasks, selected_tasks):
        self.total = sum(1 for t in tasks_to_run(tasks, selected_tasks) if t.actions and not _is_package(t))
        self.write(f"kforge: {self.total} targets selected\n")

    def execute_task(self, task):
        self.begun[task.name] = time.monotonic()   # when doit hands the task to a worker

    def skip_uptodate(self, task):
        if _is_package(task):
            self.packages[task.name] = {"name": task.name, "status": "up-to-date", "seconds": 0.0}
        elif task.actions:
            self.records[task.name] = {"name": task.name, "status": "up-to-date", "seconds": 0.0}

    def add_success(self, task):
        if task.actions:
            values = getattr(task, "values", None) or {}
            for message in values.get("cache_warnings", ()):
                if message not in self.warnings:
                    self.warnings.append(message)
                    self.write(f"kforge: warning: {message}\n")
            self._finish(task, "built", "", {k: values[k] for k in REPORTED_VALUES if values.get(k)})

    def add_failure(self, task, fail):
        if not task.actions:   # a family group "fails" when one of its targets did: already reported
            return
        self._finish(task, "failed", fail.get_msg() if hasattr(fail, "get_msg") else str(fail))

    def _finish(self, task, status: str, error: str, extra: dict | None = None) -> None:
        begun = self.begun.pop(task.name, time.monotonic())
        seconds = time.monotonic() - begun
        record = {"name": task.name, "status": status, "seconds": round(seconds, 3), **(extra or {}),
                  "start": round(begun - self.started_at, 3)}   # a timeline of the run: when it was handed out
        if error:
            record["error"] = "\n".join(error.strip().splitlines()[:ERROR_LINES])
        if _is_package(task):
            self.packages[task.name] = record
            self.write(f"{task.name} {status} {seconds:.2f}s\n")
            return
        self.records[task.name] = record
        self.failed += status == "failed"
        first = [line.strip() for line in error.splitlines() if line.strip().startswith("error:")][:1]
        detail = f"  {first[0]}" if first else ""
        label = "cached" if record.get("from_cache") else status
        self.write(f"[{len(self.records):>{len(str(self.total))}}/{self.total}] {label:<6} {task.name} "
                   f"{seconds:.2f}s  (failed so far: {self.failed}){detail}\n")

    def complete_run(self):
        records = sorted(self.records.values(), key=lambda r: r["name"])
        counts = {s: sum(1 for r in records if r["status"] == s) for s in ("built", "up-to-date", "failed")}
        wall = time.monotonic() - self.started_at
        slowest = sorted((r for r in records if r["status"] == "built" and not r.get("from_cache")),
                         key=lambda r: -r["seconds"])[:5]
        cached = sum(1 for r in records if r.get("from_cache"))
        self.write(f"\nkforge: built {counts['built']}{f' ({cached} from the remote cache)' if cached else ''}, "
                   f"up to date {counts['up-to-date']}, failed {counts['failed']}, wall {wall:.1f} s\n")
        if slowest:
            self.write("slowest compiles: " + ", ".join(f"{r['name']} {r['seconds']:.2f}s" for r in slowest) + "\n")
        for r in records:
            if r["status"] == "failed":
                self.write(f"\nFAILED {r['name']}:\n{r['error']}\n")
        for r in self.packages.values():
            if r["status"] == "failed":
                self.write(f"\nFAILED {r['name']}:\n{r['error']}\n")
        for msg in self.runtime_errors:
            self.write(f"\ndoit: {msg}\n")
        self._save({"wall_seconds": round(wall, 3), "counts": counts, "warnings": self.warnings,
                    "packages": sorted(self.packages.values(), key=lambda r: r["name"]), "tasks": records})

    def _save(self, report: dict) -> None:
        path = Path(self.report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # one task per line: readable, and json's fast C encoder (indent= falls back to pure Python)
        head = json.dumps({k: v for k, v in report.items() if k != "tasks"})[:-1]
        tasks = ",\n  ".join(map(_record_json, report["tasks"]))
        atomic_write(path, f'{head}, "tasks": [\n  {tasks}\n]}}\n'.encode())


def _record_json(record: dict) -> str:
    """json.dumps(record), written directly for the common error-free record: json.dumps builds a new
    encoder per call, which is most of a no-op run's report time at thousands of targets."""
    if record.keys() - {"start"} != {"name", "status", "seconds"}:
        return json.dumps(record)
    start = f', "start": {float(record["start"])!r}' if "start" in record else ""
    return (f'{{"name": {encode_basestring_ascii(record["name"])}, "status": "{record["status"]}", '
            f'"seconds": {float(record["seconds"])!r}{start}}}')


def _is_package(task) -> bool:
    return task.name.startswith("package:")
