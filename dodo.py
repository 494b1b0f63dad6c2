"""kforge: `doit -n 16` compiles every (kernel, config, arch) declared in specs/. See README.md."""
from pathlib import Path

from kforge.dodo import *  # noqa: F401,F403  (DOIT_CONFIG and the tasks of the project doit runs in)

if Path("kernels/ep/tasks.py").is_file():   # this checkout's example op: `doit verify_dispatch_combine`
    from kernels.ep.tasks import task_verify_dispatch_combine  # noqa: F401
