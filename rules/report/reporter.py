"""Progress lines, the end-of-run summary, out/build-report.json (a doit reporter), and out/build-trace.json: the
run's timeline in the Chrome trace event format (Trace)."""
from __future__ import annotations

import json
import os
import re
import sys
from json.encoder import encode_basestring_ascii
import time
from pathlib import Path

from doit.reporter import ConsoleReporter

from kforge.store.artifact import CompileResult
from kforge.store.files import write_inside

ERROR_LINES = 7   # of a failure message in build-report.json: through a crash's first output line (isolate._death is two)
# C0 and C1 control characters but newline and tab -> U+FFFD, for str.translate
CONTROL = {c: "\ufffd" for c in [*range(0x20), *range(0x7f, 0xa0)] if chr(c) not in "\n\t"}
ERROR_CHARS = 400   # of an error line in a progress line (the summary and build-report.json keep it whole)
FIRST_SHOWN = 5   # targets named per group of identical failures in the summary
RETRY, COMPILER_OUTPUT = "retry alone:", "compiler output (last lines):"   # rules/compile/action.py, rules/load/isolate.py
REPLAYED = "not compiled again:"   # how rules/compile/action.py says a kept failure is reported again
CACHE_OFF = "remote cache "   # how rules/share/remote_cache.py begins a warning that the cache is off for the run
REPORTED_VALUES = ("from_cache", "from_local_cache", "compiled_on", "compile_seconds")   # result -> its record
# artifact.CompileResult.origin -> the progress label
ORIGINS = {"compiled": "built", "local cache": "local", "remote cache": "remote", "unchanged": "same"}


class BuildReporter(ConsoleReporter):
    """One line per finished task ([done/total], failures so far); up-to-date tasks are only counted."""
    desc = "kforge progress and summary"
    report_path = "out/build-report.json"   # set per project by kforge.edge.config.config()
    find_orphans = None   # () -> artifact dirs in out/ of no target (rules/store/guard.py); set like report_path
    key_index = None      # artifact.KeyIndex: told of each built target, saved at the end of the run
    local_cache = None    # local_cache.LocalCache of this run: trimmed to its limit after a run that stored in it
    saved_at_end = ()     # more state read while tasks were generated, saved at the end of the run
    before_first_task = None   # () -> None, called once the tasks are loaded (rules/edge/config.py)

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.started_at = time.monotonic()
        self.run_started = self.started_at - process_age()   # the wall time a user sees: doit's loading included
        self.total = 0
        self.records: dict[str, dict] = {}    # compile targets
        self.packages: dict[str, dict] = {}   # `doit package` bundles, reported apart from the targets
        self.warnings: list[str] = []         # e.g. from the remote cache, each shown once
        self.warned: set[str] = set()
        self.begun: dict[str, float] = {}
        self.handed: dict[str, float] = {}   # the same moment by the wall clock, for the trace
        self.trace = Trace(time.time() - (self.started_at - self.run_started))   # from the process's start
        self.loaded: float | None = None   # when doit had loaded the tasks (the catalog, its probes)
        self.first_handed: float | None = None
        self.failed = 0

    def write(self, text: str) -> None:
        """Control characters but newline and tab shown as U+FFFD: names and messages come from outside (a spec file
        named with an escape sequence, a compiler's or cache server's message, a restored error.txt). Once the
        output's reader went away (`doit | head -1`), nothing more is written (reader_gone)."""
        if self.output_gone:
            return
        try:
            super().write(text.translate(CONTROL))
            self.outstream.flush()   # a progress line is seen as its target ends, and a closed pipe fails here
        except BrokenPipeError:
            self.output_gone = True
            reader_gone(self.outstream)

    output_gone = False

    def initialize(self, tasks, selected_tasks):
        self.loaded = time.time()
        if self.before_first_task is not None:
            self.before_first_task()
        self.total = sum(1 for t in tasks_to_run(tasks, selected_tasks) if t.actions and not _is_package(t))
        self.write(f"kforge: {plural(self.total, 'target')} selected\n")

    def execute_task(self, task):
        self.begun[task.name] = time.monotonic()   # when doit hands the task to a worker
        self.handed[task.name] = time.time()
        if self.first_handed is None and task.actions:   # a group task is done in the master, with no worker
            self.first_handed = self.handed[task.name]

    def skip_uptodate(self, task):
        if _is_package(task):
            self.packages[task.name] = {"name": task.name, "status": "up-to-date", "seconds": 0.0}
        elif task.actions and "kforge_skipped" in (task.meta or {}):   # skipped before from this key and inputs
            self.records[task.name] = {"name": task.name, "status": "skipped", "seconds": 0.0,
                                       "reason": task.meta["kforge_skipped"]}
        elif task.actions:
            self.records[task.name] = {"name": task.name, "status": "up-to-date", "seconds": 0.0}

    def skip_ignore(self, task):
        """`doit ignore NAME`: not built, and said so in the summary and the report (a run that built nothing else
        exited 0 with "built 0, failed 0", and a CI shipping out/ shipped nothing)."""
        super().skip_ignore(task)
        if task.actions and not _is_package(task):
            self.records[task.name] = {"name": task.name, "status": "ignored", "seconds": 0.0}

    def add_success(self, task):
        if not task.actions:
            return
        self._ran(task)
        values = getattr(task, "values", None) or {}
        if "skipped" in values:   # a library autotuner's config that does not fit its arch (compile/action.py)
            return self._finish(task, "skipped", "", {"reason": values["skipped"]})
        result = CompileResult.of(values)   # a compile's (rules/compile/action.py); of a package, only what it shares
        for message in result.cache_warnings:
            # every worker warns once that a cache is down, each naming its own request in parentheses
            gist = re.sub(r"\(.*\)", "", message)
            if gist not in self.warned:
                self.warned.add(gist)
                self.warnings.append(message)
                self.write(f"kforge: warning: {message}\n")
        extra = {} if _is_package(task) else {"origin": result.origin}
        extra.update((k, getattr(result, k)) for k in REPORTED_VALUES if getattr(result, k))
        self._finish(task, "built", "", extra, result)

    def add_failure(self, task, fail):
        if not task.actions:   # a family group "fails" when one of its targets did: already reported
            return
        self._ran(task)
        self._finish(task, "failed", fail.get_msg() if hasattr(fail, "get_msg") else str(fail))

    def _ran(self, task) -> None:
        """A compile task ran, built or failed: the key index learns what is on disk now."""
        target = (getattr(task, "meta", None) or {}).get("kforge_target")
        if target is not None and self.key_index is not None:
            self.key_index.refresh(target.meta_path)

    def _finish(self, task, status: str, error: str, extra: dict | None = None,
                result: CompileResult | None = None) -> None:
        begun = self.begun.pop(task.name, time.monotonic())
        seconds = time.monotonic() - begun
        self._traced(task, status, result)
        record = {"name": task.name, "status": status, "seconds": round(seconds, 3), **(extra or {}),
                  "start": round(begun - self.started_at, 3)}   # a timeline of the run: when it was handed out
        if error:
            lines = error.strip().splitlines()
            retry = [line for line in lines[ERROR_LINES:] if line.strip().startswith(RETRY)]   # kept: the summary's
            record["error"] = "\n".join(lines[:ERROR_LINES] + retry[:1])
            record["cause"] = error_line(error)   # one line; what the summary groups failures by
        if _is_package(task):
            self.packages[task.name] = record
            self.write(f"{task.name} {status} {seconds:.2f}s\n")
            return
        self.records[task.name] = record
        self.failed += status == "failed"
        cause = record.get("cause", "")
        detail = f"  error: {cause if len(cause) <= ERROR_CHARS else cause[:ERROR_CHARS] + ' ...'}" if error else ""
        label = ORIGINS[record["origin"]] if "origin" in record else status
        self.write(f"[{len(self.records):>{len(str(self.total))}}/{self.total}] {label:<6} {task.name} "
                   f"{seconds:.2f}s  (failed so far: {self.failed}){detail}\n")

    def _traced(self, task, status: str, result: CompileResult | None) -> None:
        now = time.time()
        handed = self.handed.pop(task.name, now)
        target = (getattr(task, "meta", None) or {}).get("kforge_target")
        family = getattr(target, "kernel", "")
        if _is_package(task):
            self.trace.task("package", task.name, "package", handed, now)
        elif target is None:   # not a compile target (a tuning, a verify sweep): a row per kind of task
            kind = task.name.split(":", 1)[0]
            self.trace.task(kind, task.name, "failed" if status == "failed" else kind, handed, now)
        elif status == "failed":
            self.trace.task("failed", task.name, "failed", handed, now, family)
        else:
            self.trace.target(task.name, family, handed, now, result or CompileResult())

    def complete_run(self):
        records = sorted(self.records.values(), key=lambda r: r["name"])
        counts = {s: sum(1 for r in records if r["status"] == s)
                  for s in ("built", "up-to-date", "skipped", "failed", "ignored")}
        wall = time.monotonic() - self.run_started
        # the compiler's own time where reported: a worker's first target also pays for importing the toolchain
        compile_time = lambda r: r["seconds"] if r.get("compile_seconds") is None else r["compile_seconds"]
        slowest = sorted((r for r in records if r.get("origin") == "compiled"), key=lambda r: -compile_time(r))[:5]
        origins = {o: sum(1 for r in records if r.get("origin") == o) for o in ORIGINS}
        for line in failure_groups([r for r in records if r["status"] == "failed"]):
            self.write(line + "\n")
        packages_failed = [r for r in self.packages.values() if r["status"] == "failed"]
        for r in packages_failed:
            self.write(f"\nFAILED {r['name']}:\n{r['error']}\n")
        for msg in self.runtime_errors:
            self.write(f"\ndoit: {msg}\n")
        # the summary comes last: with many failures it is what a terminal still shows
        summary = []
        if slowest:
            summary.append("slowest compiles: " + ", ".join(f"{r['name']} {compile_time(r):.2f}s" for r in slowest))
        before = self._before_first_target()
        if origins["compiled"]:   # where the time went besides compiling
            summary.append(_time_spent(self.trace.totals(), sum(r["seconds"] for r in records), before))
        if self.warnings:   # each was shown as it came; the first again here, where a terminal still shows it
            extra = len(self.warnings) - 1
            more = f" (and {extra} more above and in out/build-report.json)" if extra else ""
            summary.append(f"kforge: {plural(len(self.warnings), 'warning')}: {self.warnings[0]}{more}")
            # and a cache switched off for the rest of the run: it is what made the run slow
            summary += [f"kforge: warning: {w}" for w in self.warnings[1:] if w.startswith(CACHE_OFF)]
        if self.local_cache is not None and origins["compiled"] + origins["remote cache"]:   # it grew
            summary += _trimming(self.local_cache)
        orphans = self.find_orphans() if self.find_orphans else []
        if orphans:
            verb = "belongs" if len(orphans) == 1 else "belong"
            summary.append(f"kforge: {plural(len(orphans), 'artifact')} in out/ {verb} to no target: `doit prune` "
                           f"removes them")
        also = f" ({plural(len(packages_failed), 'package task')})" if packages_failed else ""
        fetched = ", ".join(f"{n} unchanged: early cutoff, not compiled" if o == "unchanged" else f"{n} from the {o}"
                            for o, n in origins.items() if n and o != "compiled")
        skipped = f"skipped {counts['skipped']} (autotune configs their arch cannot run), " if counts["skipped"] else ""
        if counts["ignored"]:
            first = next(r["name"] for r in records if r["status"] == "ignored")
            skipped += f"ignored {counts['ignored']} (`doit ignore`: not built; `doit forget {first}` ends it), "
        last = (f"kforge: built {counts['built']}{f' ({fetched})' if fetched else ''}, "
                f"up to date {counts['up-to-date']}, {skipped}failed {counts['failed'] + len(packages_failed)}{also}, "
                f"wall {wall:.1f} s")
        # what the next run reuses, then the reports: a full disk costs one line each, not the summary
        states = [state for state in (self.key_index, *self.saved_at_end) if state is not None]
        unsaved = [_saving(state.save, getattr(state, "path", "kforge's state")) for state in states]
        unsaved.append(_saving(self._save, Path(self.report_path), {
            "wall_seconds": round(wall, 3), "counts": counts, "origins": origins, "warnings": self.warnings,
            "packages": sorted(self.packages.values(), key=lambda r: r["name"]), "tasks": records}))
        if self.trace.slices:   # a run that ran nothing keeps the last build's timeline
            trace = Path(self.report_path).with_name("build-trace.json")
            unsaved.append(_saving(self.trace.write, trace, trace))
        summary += [line for line in unsaved if line]
        self.write("\n" + "\n".join([*summary, last]) + "\n")

    def _before_first_target(self) -> dict[str, float]:
        """The run's time before its first target: "load" (doit's start, the catalog, its probes), then "up-to-date"
        (the first tasks' checks)."""
        if self.loaded is None or self.first_handed is None or not self.trace.slices:   # nothing ran
            return {}
        phases = {"load": (self.trace.started, self.loaded), "up-to-date": (self.loaded, self.first_handed)}
        for phase, (start, end) in phases.items():
            self.trace.run_phase(phase, start, end)
        return {phase: end - start for phase, (start, end) in phases.items()}

    def _save(self, report: dict) -> None:
        path = Path(self.report_path)
        # one task per line: readable, and json's fast C encoder (indent= falls back to pure Python)
        head = json.dumps({k: v for k, v in report.items() if k != "tasks"})[:-1]
        tasks = ",\n  ".join(map(_record_json, report["tasks"]))
        write_inside(path.parent, path, f'{head}, "tasks": [\n  {tasks}\n]}}\n'.encode())   # out/build-report.json


READER_GONE = ("kforge: the reader of this build's output went away (a closed pipe: `doit | head`?): the build goes "
               "on to its end without progress lines; out/build-report.json has every target's result")


def reader_gone(stream) -> None:
    """The build's output stream is a pipe no one reads any more: what is still written to it (and Python's flush at
    exit) goes to /dev/null, and one line says so on stderr where that is still read. The build itself goes on: its
    compiles, doit's state and out/build-report.json do not depend on its progress lines, and stopping would kill
    the compiles running."""
    to_devnull(stream)
    try:
        sys.stderr.write(READER_GONE + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):   # stderr went to the same reader (`doit 2>&1 | head`)
        to_devnull(sys.stderr)


def to_devnull(stream) -> None:
    """The stream's file descriptor made /dev/null's: a write, or the flush of what is buffered, fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no file descriptor (a StringIO, a closed stream)
        pass


def process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere): a run's wall counts what doit did before
    the reporter existed (a no-op's whole time)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22, starttime, after the command's name
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def _time_spent(phases: dict[str, float], in_tasks: float, before: dict[str, float] | None = None) -> str:
    """One line: the compile targets' seconds per phase (summed over workers) and in none (doit's work in the
    worker), queued, and the run's time before its first target."""
    order = ["compile", "import", "start", "wait", "check", "write", "local cache lookup", "cache lookup",
             "local cache store", "cache upload", "return"]
    shown = [p for p in order if phases.get(p)] + sorted(p for p in phases if p not in order and p != "queue")
    spent = sum(phases.get(p, 0.0) for p in shown)
    parts = [f"{p} {phases[p]:.1f} s" for p in shown]
    parts.append(f"other {max(in_tasks - spent - phases.get('queue', 0.0), 0.0):.1f} s")
    named = {"load": "load (doit, the catalog, its probes)", "up-to-date": "up-to-date checks"}
    first = ", ".join(f"{named.get(p, p)} {s:.1f} s" for p, s in (before or {}).items())
    return (f"kforge: time in targets, summed over workers: {', '.join(parts)}; queued {phases.get('queue', 0.0):.1f} s"
            f"{f'; before the first target: {first}' if first else ''} (out/build-trace.json)")


def _trimming(cache) -> list[str]:
    """Trim the local cache to its limit (least recently used entries first): a summary line if any went."""
    from kforge.share import local_cache
    try:
        left = local_cache.trim(cache)
    except OSError as e:
        return [f"kforge: local cache {cache.root} not trimmed ({e}); make its folder a readable folder of yours "
                f"(or set local_cache= elsewhere), then `doit cache --trim`"]
    if not left.evicted:
        return []
    return [f"kforge: local cache: evicted the {local_cache.entries(left.evicted)} least recently used "
            f"({local_cache.human(left.evicted_size)}) to stay within "
            f"local_cache_limit={local_cache.human(cache.limit)}"]


def _saving(save, path, *args) -> str | None:
    """save(*args); None when it worked, else one line naming the file (a full disk, an unwritable out/)."""
    try:
        save(*args)
        return None
    except (OSError, ValueError) as e:   # ValueError: guard.OutsideOut, a link leading out of out/
        return f"kforge: could not write {path} ({e}); nothing built is lost: free space and run again"


def failure_groups(failed: list[dict], shown: int = FIRST_SHOWN) -> list[str]:
    """Failed targets grouped by their error line, largest group first: one paragraph per distinct error, naming
    how many failed with it and the first few."""
    groups: dict[tuple[str, bool], list[str]] = {}
    retries: dict[tuple[str, bool], str] = {}   # the first target's own retry line (a deterministic one forgets)
    for r in failed:
        error = r.get("cause") or error_line(r.get("error", ""))
        group = (error, REPLAYED in r.get("error", ""))
        groups.setdefault(group, []).append(r["name"])
        retries.setdefault(group, next((line.strip()[len(RETRY):].strip() for line in r.get("error", "").splitlines()
                                        if line.strip().startswith(RETRY)), f"doit {r['name']}"))
    lines = []
    for (error, replayed), names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        head = (f"{plural(len(names), 'target')} failed with" if len(names) > 1 else f"{names[0]} failed with")
        lines += ["", f"kforge: {head}: {error}"]
        if len(names) > 1:
            more = f" (and {len(names) - shown} more)" if len(names) > shown else ""
            lines.append(f"  {'first ' + str(shown) if len(names) > shown else 'they are'}: "
                         f"{', '.join(names[:shown])}{more}")
        if replayed:   # a retry would replay it too
            lines.append(f"  replayed, not compiled: it failed so before from the same key and inputs; "
                         f"`doit forget {names[0]}` compiles it again")
        else:   # a command, or what to do first (a family that did not load: edit its spec)
            hint = retries[error, replayed]
            lines.append(f"  {'retry one alone' if hint.startswith('doit ') else 'to retry'}: {hint}")
    if failed:
        lines.append("Each failed target's full message and traceback is in its error.txt "
                     "(out/<arch>/<kernel>/<config_id>/); every failure is in out/build-report.json.")
    return lines


def error_line(message: str) -> str:
    """What went wrong, in one line, from a target's failure message (`error: ...`, rules/compile/action.py). A
    first line ending in ':' gets its message's last line (Triton's CompilationError quotes the source, then names
    the cause); a crash, the compiler's last output line, else its own last line (isolate._death's likely cause)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
    if start is None:
        return lines[0] if lines else "(no message)"
    found = lines[start][len("error:"):].strip()
    rest = lines[start + 1:]
    retry = next((i for i, line in enumerate(rest) if line.startswith(RETRY)), len(rest))
    output = next((i for i, line in enumerate(rest) if line.startswith(COMPILER_OUTPUT)), retry)
    own, printed = rest[:min(output, retry)], rest[output + 1:retry]
    if found.endswith(":") and own:
        found += " ... " + own[-1]
    elif found.startswith("compiler process") and printed:   # a crash: the compiler's last words
        found += " ... " + printed[-1]
    elif found.startswith("compiler process") and own:   # none: what it was running, and the likely cause
        found += " " + own[-1]
    return found


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _record_json(record: dict) -> str:
    """json.dumps(record), written directly for the common error-free record: json.dumps builds an encoder per
    call, most of a no-op run's report time at thousands of targets."""
    if record.keys() - {"start"} != {"name", "status", "seconds"}:
        return json.dumps(record)
    start = f', "start": {float(record["start"])!r}' if "start" in record else ""
    return (f'{{"name": {encode_basestring_ascii(record["name"])}, "status": "{record["status"]}", '
            f'"seconds": {float(record["seconds"])!r}{start}}}')


def _is_package(task) -> bool:
    return task.name.startswith("package:")


def tasks_to_run(tasks: dict, selected) -> list:
    """The selected tasks and everything they depend on (task_dep, setup), each once."""
    todo, seen = list(selected), {}
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen[name] = tasks[name]
        todo += tasks[name].task_dep + tasks[name].setup_tasks
    return list(seen.values())


class Trace:
    """out/build-trace.json: a run's timeline in the Chrome trace event format (Perfetto, chrome://tracing), a row
    per doit worker. A compile target is a slice per phase: "queue" (handed out to begun), its action's spans
    (rules/compile/action.py), then "return" (until doit's master took its result in). Any other task is one slice
    of the time doit saw it take, on a row of its own. Times: the wall clock (one in every process), in
    microseconds from the run's start.
    """

    def __init__(self, started: float):
        self.started = started     # time.time() at the start of the run
        self.slices: list[dict] = []
        self.rows: dict[str, int] = {}   # row name -> tid, in order of first use

    def slice(self, row: str, name: str, phase: str, start: float, end: float, args: dict) -> None:
        tid = self.rows.setdefault(row, len(self.rows) + 1)
        self.slices.append({"name": name, "cat": phase, "ph": "X", "pid": 1, "tid": tid,
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
            self.slice(row, name, "run", handed, finished, args)
            return
        if spans[0][1] > handed:
            self.slice(row, name, "queue", handed, spans[0][1], args)
        for phase, start, end in spans:
            self.slice(row, name, phase, start, end, args)
        if finished > spans[-1][2]:   # the result on its way to doit's master, and waiting for it to take it in
            self.slice(row, name, "return", spans[-1][2], finished, args)

    def totals(self) -> dict[str, float]:
        """Seconds per phase over the run's compile targets (queue, import, compile, cache lookups, ...)."""
        found: dict[str, float] = {}
        for e in self.slices:
            if "target" in e["args"] and e["cat"] not in ("failed", "package"):
                found[e["cat"]] = found.get(e["cat"], 0.0) + e["dur"] / 1e6
        return found

    def task(self, row: str, name: str, phase: str, handed: float, finished: float, family: str = "") -> None:
        """A task seen only from doit's side (a failed compile, a package): one slice on `row`."""
        self.slice(row, name, phase, handed, finished, {"target": name, "family": family})

    def run_phase(self, phase: str, start: float, end: float) -> None:
        """A phase of the run itself, before any target ran: on the row "doit", in no target's totals."""
        self.slice("doit", phase, phase, start, end, {})

    def write(self, path: Path) -> None:
        names = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": row}}
                 for row, tid in self.rows.items()]
        process = {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "kforge build"}}
        events = [process, *names, *sorted(self.slices, key=lambda e: (e["tid"], e["ts"]))]
        write_inside(path.parent, path,   # out/build-trace.json
                     json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":")).encode())
