"""What kforge adjusts in doit: `forget` (registered in pyproject.toml under [tool.doit.plugins.command]) and
tasks that run after failed dependencies (installed by rules.project.doit_config). The runner: doit_runner.py."""
from __future__ import annotations

import os

from doit.cmd_forget import Forget as DoitForget
from doit.control import ExecNode

from rules.artifact import META


class Forget(DoitForget):
    """doit's forget, plus: a forgotten target's meta.json goes too, so the next run rebuilds it.

    kforge decides "up to date" from the key in meta.json (it survives killed runs and restored caches),
    so forgetting doit's record alone would change nothing.
    """

    def _execute(self, forget_sub, forget_disable_default, forget_all):
        forgotten: list[str] = []
        remove = self.dep_manager.remove

        def remove_and_record(name):
            forgotten.append(name)
            remove(name)
        self.dep_manager.remove = remove_and_record
        result = super()._execute(forget_sub, forget_disable_default, forget_all)
        tasks = {t.name: t for t in self.task_list}
        names = tasks if forget_all else forgotten
        for name in names:
            for target in tasks[name].targets if name in tasks else ():
                if os.path.basename(target) == META and os.path.exists(target):
                    os.unlink(target)
        return result


def run_after_failed_deps() -> None:
    """Let tasks whose meta says after_failed_deps run once their dependencies ended, failed or not.

    doit never runs a task one of whose task_dep failed. `doit package` must run anyway, to ship what
    was built and list what failed; it still waits for every compile, and the run still exits non-zero.
    """
    if getattr(ExecNode.parent_status, "kforge", False):
        return
    doit_parent_status = ExecNode.parent_status

    def parent_status(self, parent_node):
        if parent_node.run_status == "failure" and (self.task.meta or {}).get("after_failed_deps"):
            return
        doit_parent_status(self, parent_node)
    parent_status.kforge = True
    ExecNode.parent_status = parent_status


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
