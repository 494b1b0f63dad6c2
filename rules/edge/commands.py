"""kforge's doit commands `forget`, `info`, `clean`, `prune` and `cache`, registered in pyproject.toml under
[tool.doit.plugins.command] (the rest of kforge's doit integration: edge/config.py)."""
from __future__ import annotations

import difflib
import io
import json
from collections import Counter
import os
import sys
from pathlib import Path

from doit.cmd_base import Command, DoitCmdBase
from doit.cmd_clean import Clean as DoitClean
from doit.cmd_forget import Forget as DoitForget
from doit.action import PythonAction
from doit.exceptions import InvalidCommand

from kforge.store import artifact, files, guard
from kforge.plan import catalog
from kforge.share import local_cache
from kforge.report import reporter as report
from kforge.base import settings, stamps
from kforge.edge.backend import NAME, KforgeSqliteDB
from kforge.store.inputs import InputIndex, listed_inputs
from kforge.store.guard import printable
from kforge.base.layout import Layout
from kforge.share.local_cache import LocalCache


class Forget(DoitForget):
    """doit's forget, and a forgotten target's artifact directory goes too: kforge decides "up to date" from
    meta.json and replays a failure from error.txt, so forgetting doit's record alone would change nothing."""

    def _execute(self, forget_sub, forget_disable_default, forget_all):
        backend = self.dep_manager.backend
        if not isinstance(backend, KforgeSqliteDB):   # it lists what doit removed: doit chooses which tasks
            raise InvalidCommand(f"kforge: doit forget needs the backend {NAME!r} (dodo.py's DOIT_CONFIG), not "
                                 f"{type(backend).__name__}: drop --backend from the command line")
        result = super()._execute(forget_sub, forget_disable_default, forget_all)
        tasks = {t.name: t for t in self.task_list}
        failed = False
        try:   # a family whose load failure is replayed: loaded again
            catalog.forget_unloaded(Path.cwd(), None if forget_all else set(backend.removed))
        except (OSError, ValueError) as e:   # a read-only out/, a link out of it (OutsideOut)
            self.outstream.write(f"kforge: {printable(str(e))}: its broken families' failures are replayed still\n")
            failed = True
        for name in tasks if forget_all else backend.removed:
            target = compile_target_of(tasks[name]) if name in tasks else None
            # the whole artifact directory: a binary left alone would be a folder clean and prune take for a user's
            if target is not None and guard.written_by_kforge(Path(target.out_dir)):
                try:
                    guard.remove_artifact_dir(target.layout.out, Path(target.out_dir))
                except guard.OutsideOut as e:
                    self.outstream.write(f"kforge: refused: {printable(str(e))}\n")
                except guard.NotRemoved as e:   # an unwritable folder: the others go on, the exit code says it
                    self.outstream.write(f"kforge: {e}\n")
                    failed = True
        return 1 if failed else result


def compile_target_of(task):
    return (task.meta or {}).get("kforge_target")


def target_state(target) -> str:
    """up to date | stale (and what changed) | skipped: <why> | failed: <cause> | not built; printable (its names
    come from out/, untrusted)."""
    return printable(_state(target))


def _state(target) -> str:
    index = InputIndex.of(target.layout.observed_inputs)
    if artifact.is_current(target.meta_path, target.key):
        changed = index.changed_input(target.meta_path, stamps.identity(target.meta_path))
        if changed is None:
            return "up to date"
        how = "listed it: a name was added or removed" if changed.endswith("/") else "read it"
        return f"stale: {changed} changed since it was built (its compile {how}); the next build rebuilds it"
    if os.path.exists(target.meta_path):
        return f"stale: built from another key ({_key_change(target)}); the next build rebuilds it"
    failure = artifact.read_error(target)
    if failure is None:
        return "not built"
    if artifact.skipped(target) is not None:
        return failure.without_traceback
    old = "" if failure.key == target.key else " (with other inputs than now)"
    again = ("; reported again without compiling until its key or inputs change (`doit forget "
             f"{target.name}` retries it)") if artifact.saved_failure(target) is not None else ""
    return f"failed{old}: {report.error_line(failure.message)}{again}"


def _key_change(target) -> str:
    """Which of the key's parts differs between the built meta.json and the target now, in words."""
    try:
        meta = json.loads(files.read_bytes(target.meta_path))
        built = meta["source"]["digests"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "its meta.json is unreadable"
    # untrusted (a restored out/, another kforge): each part compared only where it has this kforge's shape
    if not (isinstance(built, dict) and all(isinstance(meta.get(part, {}), dict)
                                            for part in ("constexprs", "toolchain_versions", "env"))):
        return "its meta.json is not of this kforge's shape"
    now = dict(target.source_digests)
    for name in sorted(set(built) | set(now)):
        if built.get(name) != now.get(name):
            return f"{name} {'changed' if name in built and name in now else 'added' if name in now else 'gone'}"
    for field, was, is_now in (("constexpr", meta.get("constexprs", {}), dict(target.constexprs)),
                               ("toolchain", meta.get("toolchain_versions", {}), dict(target.toolchain_versions)),
                               ("env", meta.get("env", {}), dict(target.env))):
        for name in sorted(set(was) | set(is_now)):
            if was.get(name) != is_now.get(name):
                return f"{field} {name}: {was.get(name)!r} then, {is_now.get(name)!r} now"
    return ("its binary is missing or not the one its meta.json names" if meta.get("key") == target.key
            else "an input of its key changed")


NOTES = {   # rules/load/entry_probe.py's facts about the entry, as `doit info` words them
    "prune": "configs pruned by {} (applied: the targets are the configs it keeps)",
    "perf_model": "perf_model {} (noted, not applied: kforge builds every config the pruner keeps)",
    "top_k": "top_k {} (noted, not applied)",
    "autotuner": "the library's own autotuner {}",
    "unspecialized": "never specialized by @triton.jit: {}",
    "tuned": "configs from its @triton.autotune list ({}): one that does not fit the arch is skipped, as Triton's is",
}


def note_lines(target) -> str:
    """What kforge knows of the target's entry beyond its config: its autotuner, the heuristics' values the spec
    pins."""
    notes = dict(target.notes)
    lines = [f"    {NOTES[fact].format(text)}\n" for fact, text in target.notes if fact in NOTES]
    pinned = [n for n in notes.get("overrides", "").split(", ") if n]
    values = dict(target.constexprs)
    override = (f"  overrides: {', '.join(f'{n}={values.get(n)!r}' for n in pinned)} (given by the spec, in place "
                f"of the entry's @triton.heuristics)\n") if pinned else ""
    return override + (f"  entry:\n{''.join(lines)}" if lines else "")


def imported_as(target) -> str:
    """`doit info`'s lines on how the compile imports the module: environment, device model, set-up hooks."""
    from kforge.load.device_model import DEVICES
    lines = [f"  env: {' '.join(f'{k}={v}' for k, v in target.env)}\n"] if target.env else []
    if target.toolchain == "triton":
        lines.append(f"  device model: {DEVICES[target.arch].name}\n" if target.device_model else
                     "  device model: off (imported as this machine is)\n")
    if target.setup:
        lines.append(f"  set-up hooks: {', '.join(target.setup)}\n")
    return "".join(lines)


def observed_lines(target) -> str:
    """The files (and `<folder>/`s) the target's compile read, each with its digest then, marked if changed since."""
    listed = listed_inputs(target.meta_path)
    if listed is None:
        return ""
    index = InputIndex.of(target.layout.observed_inputs)
    rows = [f"    {printable(name)}  {printable(digest[:12])}"
            f"{'  (changed since)' if index.digest(name) != digest else ''}\n" for name, digest in listed]
    return f"  inputs its compile read ({len(rows)}; name, sha256 then):\n" + "".join(rows)


class Info(DoitCmdBase):
    """`doit info TARGET | FAMILY`: what kforge knows of a target, or one line per target of a family."""
    name = "info"
    doc_purpose = "show a target's config, key, artifact and state, or a family's targets"
    doc_usage = "TARGET | FAMILY"
    doc_description = None
    cmd_options = ()

    def _execute(self, pos_args):
        tasks = {t.name: t for t in self.task_list}
        if len(pos_args) != 1 or pos_args[0] not in tasks:
            close = difflib.get_close_matches(pos_args[0], list(tasks), n=3, cutoff=0.6) if len(pos_args) == 1 else []
            families = sorted({t.kernel for t in map(compile_target_of, tasks.values()) if t})
            listed = f"did you mean {' or '.join(close)}?" if close else \
                f"families: {', '.join(families[:20])}{f' and {len(families) - 20} more' if len(families) > 20 else ''}"
            got = f"no target or family named {shown(pos_args[0])}" if len(pos_args) == 1 else "give one name"
            raise InvalidCommand(f"kforge: doit info: {got}; {listed}; `doit list --all` lists every target")
        task = tasks[pos_args[0]]
        target = compile_target_of(task)
        # printable: a spec's file name (a checkout's own) reaches a broken family's error
        write = lambda text: self.outstream.write(printable(text, keep="\n"))
        if target is not None:
            root = target.layout.root
            write(f"{target.name}\n  spec: {target.spec_path}\n  {target.toolchain} entry: {target.module}."
                  f"{target.entry}\n  config: {dict(target.config)}\n{note_lines(target)}{imported_as(target)}"
                  f"  key: {target.key}\n"
                  f"  artifact: {os.path.relpath(target.out_dir, root)}/\n{observed_lines(target)}"
                  f"  state: {target_state(target)}\n")
            return 0
        if "kforge_broken" in (task.meta or {}):
            write(f"{task.name}\n  state: did not load: {task.meta['kforge_broken']}\n")
            return 0
        members = [compile_target_of(tasks[d]) for d in task.task_dep if d in tasks]
        if members and all(members):
            states = [(t.name, target_state(t)) for t in members]
            for name, state in states:
                write(f"{name}  {state}\n")
            counts = Counter(state.split(":")[0] for _, state in states)
            write(f"{task.name}: {report.plural(len(states), 'target')}: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "\n")
            return 0
        write(f"{task.name}\n  {task.doc or ''}\n  after: {', '.join(task.task_dep) or 'nothing'}\n"
              if len(task.task_dep) <= 8 else
              f"{task.name}\n  {task.doc or ''}\n  after {report.plural(len(task.task_dep), 'task')}\n")
        return 0


class Clean(DoitClean):
    """doit's clean, with one summary line instead of a line per action; exit code 1 where something could not be
    deleted (NotRemoved: an unwritable folder)."""
    not_removed: list[str] | tuple = ()   # clean_tasks' list

    def _execute(self, dryrun, cleandep, cleanall, cleanforget, pos_args=None):   # doit passes by these names
        super()._execute(dryrun, cleandep, cleanall, cleanforget, pos_args)   # it drops clean_tasks' result
        return 1 if self.not_removed else 0

    def clean_tasks(self, tasks, dryrun, cleanforget):
        removed, refused, others, self.not_removed = 0, [], 0, []
        for task in {t.name: t for t in tasks}.values():
            target = compile_target_of(task)
            if target is None:
                if task.clean_actions:
                    try:
                        _clean(task, dryrun)   # package: its wheel and manifest (rules/ship/package.py)
                        others += 1
                    except guard.OutsideOut as e:   # out/dist or out/tune is a link out of out/
                        refused.append(str(e))
                    except guard.NotRemoved as e:
                        self.not_removed.append(str(e))
            elif Path(target.out_dir).exists() and not guard.written_by_kforge(Path(target.out_dir)):
                refused.append(f"kept {os.path.relpath(target.out_dir, target.layout.root)}: kforge did not write "
                               f"it (no meta.json or error.txt); delete it yourself if it is not yours")
            elif dryrun:
                removed += Path(target.out_dir).exists()
            else:
                try:
                    removed += guard.remove_artifact_dir(target.layout.out, Path(target.out_dir))
                except guard.OutsideOut as e:
                    refused.append(str(e))
                except guard.NotRemoved as e:
                    self.not_removed.append(str(e))
            if cleanforget and not dryrun:
                self.dep_manager.remove(task.name)
        self.dep_manager.close()
        verb = "would remove" if dryrun else "removed"
        extra = f" and cleaned {report.plural(others, 'other task')}" if others else ""
        self.outstream.write(f"kforge: {verb} {report.plural(removed, 'artifact')} from out/{extra}\n")
        for message in dict.fromkeys(refused):   # each once: every arch's package task meets the same link
            self.outstream.write(f"kforge: refused: {printable(message)}\n")
        for message in dict.fromkeys(self.not_removed):
            self.outstream.write(f"kforge: {message}\n")


def _clean(task, dryrun: bool) -> None:
    """Run a task's clean actions: kforge's own (Python calls) here, so that a refusal (OutsideOut) is one summary
    line, not doit's traceback; others as doit does."""
    if not all(isinstance(a, PythonAction) for a in task.clean_actions):
        task.clean(io.StringIO(), dryrun)
    elif not dryrun:
        for action in task.clean_actions:
            action.py_callable(*action.args, **action.kwargs)


class Prune(DoitCmdBase):
    """`doit prune`: delete the artifact directories in out/ that belong to no target of the catalog."""
    name = "prune"
    doc_purpose = "delete artifacts in out/ that belong to no target (configs dropped from a sweep, deleted specs)"
    doc_usage = ""
    doc_description = None
    cmd_options = ()

    def _execute(self, pos_args=None):
        no_names("prune", pos_args, "it deletes every artifact in out/ that no target owns; `doit clean NAME` "
                                    "deletes one target's or family's")
        broken = [t.name for t in self.task_list if "kforge_broken" in (t.meta or {})]
        if broken:   # its artifacts cannot be told from orphans
            self.outstream.write(f"kforge: nothing pruned: families did not load ({', '.join(broken)}), and their "
                                 f"artifacts cannot be told from orphans; fix them first\n")
            return 1
        current = [t.out_dir for t in map(compile_target_of, self.task_list) if t]
        layout = Layout.of(Path.cwd())   # doit runs in dodo.py's directory
        removed, refused, not_removed = 0, [], []
        orphans, kept = guard.no_targets(layout, current, settings.get("archs"))
        for path in orphans:
            try:
                removed += guard.remove_artifact_dir(layout.out, path)
            except guard.OutsideOut as e:
                refused.append(str(e))
            except guard.NotRemoved as e:   # an unwritable folder: the others go on, the exit code says it
                not_removed.append(str(e))
        if removed or not not_removed:
            self.outstream.write(f"kforge: pruned {report.plural(removed, 'artifact')} that belonged to no target\n"
                                 if removed else "kforge: nothing to prune: every artifact in out/ belongs to a "
                                                 "target\n")
        if kept:
            shown = ", ".join(printable(os.path.relpath(p, layout.root)) for p in kept[:3]) + (" ..." if len(kept) > 3
                                                                                             else "")
            self.outstream.write(f"kforge: kept {local_cache.entries(len(kept))} at artifacts' places "
                                 f"that kforge did not write (no meta.json or error.txt): {shown}\n")
        for message in refused:
            self.outstream.write(f"kforge: refused: {printable(message)}\n")
        for message in not_removed:
            self.outstream.write(f"kforge: {message}\n")
        return 1 if not_removed else 0


def no_names(command: str, names, what: str) -> None:
    """A command that takes no name, given one: refused (`doit prune scale` pruned every family)."""
    if names:
        raise InvalidCommand(f"kforge: doit {command} takes no target or family (given: "
                             f"{', '.join(map(shown, names[:3]))}{' ...' if len(names) > 3 else ''}): {what}")


def shown(name: str) -> str:
    """A name from the command line as a message quotes it: repr'd (one line), at most 80 characters."""
    return repr(name) if len(name) <= 80 else repr(name[:60]) + f" ... ({len(name)} characters)"


class Cache(Command):
    """`doit cache [--trim]`: the local cache's directory, entries, size and limit; --trim evicts as every build's
    end does."""
    name = "cache"
    doc_purpose = "show the local cache (directory, entries, size, limit); --trim: evict down to its limit"
    doc_usage = "[--trim] [local_cache=DIR] [local_cache_limit=SIZE]"
    doc_description = None
    cmd_options = ({"name": "trim", "long": "trim", "type": bool, "default": False,
                    "help": "delete least recently used entries until the cache fits local_cache_limit"},)

    def execute(self, params, args):
        no_names("cache", args, "it shows the local cache; its settings go as name=value (local_cache=DIR)")
        try:
            directory, limit = settings.get("local_cache"), settings.get("local_cache_limit")
        except ValueError as e:   # as a build says it (rules/edge/config.py): one line, exit code 2
            sys.stderr.write(f"kforge: {e}\n")
            return 2
        if directory is None:
            print("kforge: the local cache is off (local_cache=off)")
            return 0
        cache = LocalCache(directory, limit)
        problem = local_cache.problem(cache)
        if problem:
            print(f"kforge: local cache {directory}: {problem}")
            return 2
        found = local_cache.trim(cache) if params["trim"] else local_cache.usage(cache)
        evicted = f"; evicted {found.evicted} ({local_cache.human(found.evicted_size)})" if params["trim"] else ""
        print(f"kforge: local cache {directory}: {local_cache.entries(found.entries)}, "
              f"{local_cache.human(found.size)} of local_cache_limit={local_cache.human(limit)}{evicted}")
        return 0
