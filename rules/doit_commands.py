"""doit commands kforge adjusts (registered in pyproject.toml under [tool.doit.plugins.command])."""
from __future__ import annotations

import os

from doit.cmd_forget import Forget as DoitForget

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
